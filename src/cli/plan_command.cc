// `zoe plan`: measures what it needs (bench/plan_calibration.h, cached), predicts every
// configuration of the knobs (plan/plan_search.h), prints the fastest few that fit with their
// predicted step, memory per tier and bound, and writes the best as a config file.
#include <sys/statvfs.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "comm/comm.h"
#include "train/backend.h"
#include "common/config.h"
#include "model/gpt2_model.h"
#include "nvme/nvme_store.h"
#include "plan/described_model.h"
#include "plan/plan_search.h"
#include "plan_calibration.h"

namespace zoe::cli {

namespace {

// Free bytes of the file system that holds `path` (or its nearest existing parent).
uint64_t free_bytes(const std::string& path) {
  std::filesystem::path p = std::filesystem::absolute(path);
  while (!p.empty() && !std::filesystem::exists(p)) p = p.parent_path();
  struct statvfs s {};
  if (p.empty() || ::statvfs(p.c_str(), &s) != 0) return 0;
  return uint64_t{s.f_bavail} * s.f_frsize;
}

const char* home_name(OffloadDevice d) { return d == OffloadDevice::kNvme ? "nvme" : d == OffloadDevice::kCpu ? "cpu" : "-"; }

std::string home_text(OffloadDevice d, double ratio) {
  if (d == OffloadDevice::kNone) return "-";
  return ratio == 1.0 ? home_name(d) : fmt::format("{} {:.2g}", home_name(d), ratio);
}

// The job's config with a plan's knobs in place.
Config planned(Config c, const PlanKnobs& k, const std::string& nvme_path) {
  c.stage = k.stage;
  c.offload_optimizer.device = k.optimizer;
  c.offload_optimizer.ratio = k.optimizer_ratio;
  c.offload_param.device = k.param;
  c.offload_param.ratio = k.param_ratio;
  for (OffloadConfig* o : {&c.offload_optimizer, &c.offload_param})
    if (o->device == OffloadDevice::kNvme) o->nvme_path = nvme_path;
  c.sub_group_size = k.sub_group_size;
  c.prefetch_bucket_size = k.prefetch.bucket_elems;
  c.max_live_parameters = k.prefetch.max_live_elems;
  c.max_reuse_distance = k.prefetch.max_reuse_distance;
  c.micro_batch = k.micro_batch;
  c.grad_accum = k.accumulation;
  c.train_batch.reset();
  c.activation_checkpointing = k.activation_checkpointing;
  c.update_in_backward = k.update_in_backward;
  c.aio_block_size = k.aio_block_size;
  c.aio_queue_depth = static_cast<int>(k.aio_queue_depth);
  return c;
}

nlohmann::json choice_json(const PlanChoice& c) {
  const PlanKnobs& k = c.knobs;
  const StepPrediction& p = c.prediction;
  return {{"stage", k.stage},
          {"offload_optimizer", home_name(k.optimizer)}, {"optimizer_ratio", k.optimizer_ratio},
          {"offload_param", home_name(k.param)}, {"param_ratio", k.param_ratio},
          {"sub_group_size", k.sub_group_size}, {"prefetch_bucket_size", k.prefetch.bucket_elems},
          {"max_reuse_distance", k.prefetch.max_reuse_distance}, {"micro_batch", k.micro_batch},
          {"accumulation", k.accumulation}, {"activation_checkpointing", k.activation_checkpointing},
          {"update_in_backward", k.update_in_backward},
          {"step_s", p.step_s}, {"tokens_per_s", p.tokens_per_s}, {"compute_s", p.compute_s},
          {"optimizer_s", p.optimizer_s}, {"disk_s", p.disk_s}, {"bound", p.bound},
          {"device_bytes", p.bytes[0]}, {"host_bytes", p.bytes[1]}, {"nvme_bytes", p.bytes[2]},
          {"why", p.why}};
}

void print_header(std::FILE* f) {
  fmt::print(f, "{:>2} {:>5} {:>11} {:>9} {:>8} {:>8} {:>5} {:>4} | {:>8} {:>9} {:>8} {:>8} {:>8}  {}\n", "#", "stage",
             "optimizer", "params", "subgroup", "prefetch", "BxAcc", "ckpt", "step s", "tokens/s", "dev GB", "host GB",
             "nvme GB", "bound");
}

void print_row(std::FILE* f, const PlanChoice& c, int rank) {
  const PlanKnobs& k = c.knobs;
  const StepPrediction& p = c.prediction;
  fmt::print(f, "{:>2} {:>5} {:>11} {:>9} {:>8.0e} {:>8} {:>5} {:>4} | {:>8.3f} {:>9.0f} {:>8.2f} {:>8.2f} {:>8.2f}  {}\n", rank,
             k.stage, home_text(k.optimizer, k.optimizer_ratio) + (k.update_in_backward ? " bw" : ""),
             home_text(k.param, k.param_ratio),
             double(k.sub_group_size), k.stage < 3 ? "-" : k.prefetch.bucket_elems ? "on" : "off",
             fmt::format("{}x{}", k.micro_batch, k.accumulation), k.activation_checkpointing ? "yes" : "no", p.step_s,
             p.tokens_per_s, p.bytes[0] / 1e9, p.bytes[1] / 1e9, p.bytes[2] / 1e9, p.bound);
}

// Of the refused, the one that misses its budgets by the least (relative): the smallest change.
const PlanChoice* closest(const std::vector<PlanChoice>& refused, const PlanJob& job) {
  const PlanChoice* best = nullptr;
  double least = 1e300;
  for (const PlanChoice& c : refused) {
    double over = double(c.prediction.bytes[0]) / std::max<double>(1, job.device_budget);
    if (job.host_budget) over = std::max(over, double(c.prediction.bytes[1]) / job.host_budget);
    if (over < least) least = over, best = &c;
  }
  return best;
}

// A budget as the config takes it, rounded up to whole MiB.
std::string mib(uint64_t bytes) { return fmt::format("\"{}MiB\"", (bytes + (uint64_t{1} << 20) - 1) >> 20); }

// One smallest change, as the config key or the command line that makes it, and what then fits.
std::string change_text(const PlanChange& ch, const PlanJob& job) {
  const PlanKnobs& k = ch.choice.knobs;
  std::string what;
  switch (ch.kind) {
    case PlanChange::Kind::kDeviceBudget: what = "zoe.device_memory_budget " + mib(ch.value); break;
    case PlanChange::Kind::kHostBudget: what = "zoe.host_memory_budget " + mib(ch.value); break;
    case PlanChange::Kind::kNvme:
      what = job.nvme_free ? fmt::format("{:.1f} GB free on the NVMe path (now {:.1f} GB)", ch.value / 1e9, job.nvme_free / 1e9)
                           : fmt::format("an NVMe path (offload_optimizer.nvme_path) with {:.1f} GB free", ch.value / 1e9);
      break;
    case PlanChange::Kind::kRanks: what = fmt::format("{} ranks (mpirun -np {}; now {})", ch.value, ch.value, job.ranks); break;
  }
  return fmt::format("{}: stage {}, optimizer {}, parameters {}, micro-batch {}{}", what, k.stage,
                     home_text(k.optimizer, k.optimizer_ratio), home_text(k.param, k.param_ratio), k.micro_batch,
                     k.activation_checkpointing ? " checkpointed" : "");
}

// A described model's (micro-batch, checkpointing) pairs that divide the job's sequences a step
// per rank, into space; none is an error naming what the file offers.
Status offer_described(const DescribedModel& d, const std::string& file, int sequences, PlanSpace* space) {
  std::string offered;
  for (const DescribedStep& s : d.steps) {
    offered += fmt::format("{}{}{}", offered.empty() ? "" : ", ", s.micro_batch, s.checkpointing ? " checkpointed" : "");
    if (sequences % s.micro_batch == 0) space->micro_steps.emplace_back(s.micro_batch, s.checkpointing);
  }
  if (!space->micro_steps.empty()) return Status::Ok();
  return Status::Invalid(fmt::format(
      "the model description {} has micro-steps at micro-batch {}; none divides this job's {} sequences a step per "
      "rank (train_micro_batch_size_per_gpu x gradient_accumulation_steps): describe one that does",
      file, offered, sequences));
}

// The job's plan: its units, the measured rates and the ranked configurations.
struct PlanRun {
  PlanJob job;
  std::string nvme_path;
  PlanResult result;
};

// Every rank measures (at once, sharing the machine as in training); the search runs on each
// rank's own figures, and a caller that needs one choice takes rank 0's.
// `model_work`: a described model's file (zoe.torch.describe), planned in place of the config's
// GPT-2: its units and measured micro-steps; the machine's rates are measured as for GPT-2.
Result<PlanRun> run_plan(const Config& job_config, const std::string& cache, bool recalibrate, std::FILE* human,
                         Comm& comm, const std::string& model_work = {}) {
  Config c = job_config;
  ZOE_RETURN_IF_ERROR(resolve_device_budget(c, comm));  // the budget the job will get, planned within
  PlanRun run;
  PlanJob& job = run.job;
  std::optional<DescribedModel> described;
  // A described model too: the stage-3 fetch's cost is measured on two blocks of this shape.
  gpt2::Gpt2Shape shape{c.n_layer, c.n_head, c.n_embd, c.vocab_size, c.n_positions};
  if (Status s = gpt2::validate_shape(shape); !s.ok()) return Status::Invalid("config key 'zoe.model': " + s.message());
  if (!model_work.empty()) {
    ZOE_ASSIGN_OR_RETURN(DescribedModel d, read_described_model(model_work));
    described = std::move(d);
    job.unit_elems = described->unit_elems;
  } else {
    if (c.model_type != "gpt2")
      return Status::Invalid("zoe plan plans the built-in GPT-2 (zoe.model.type \"gpt2\") or a model described by "
                             "zoe.torch.describe (--model-work); this job is \"" + c.model_type + "\"");
    for (const UnitSpec& u : Gpt2Model(shape, false).units()) job.unit_elems.push_back(u.numel);
  }
  job.ranks = comm.size();
  job.dtype = c.dtype;
  job.overlap_comm = c.overlap_comm;
  if (c.device == "cuda") job.staging = c.nccl_reduce_scatter ? std::nullopt : std::optional<Tier>(Tier::kDevice);
  job.device_budget = c.device_memory_budget;
  job.host_budget = c.host_memory_budget;
  run.nvme_path = c.offload_optimizer.nvme_path.empty() ? c.offload_param.nvme_path : c.offload_optimizer.nvme_path;
  // What dead jobs left there is free space to a job: opening its store removes them first.
  if (!run.nvme_path.empty()) {
    Result<uint64_t> left = NvmeStore::dead_jobs_bytes(run.nvme_path);
    job.nvme_free = free_bytes(run.nvme_path) + (left.ok() ? *left : 0);
  }
  const int sequences = c.micro_batch * c.grad_accum;
  if (human) {
    const std::string what =
        described ? fmt::format("the model described by {} ({} units)", model_work, job.unit_elems.size())
                  : fmt::format("GPT-2 L{} C{} V{} T{}", c.n_layer, c.n_embd, c.vocab_size, c.seq_len);
    fmt::print(human, "zoe plan: {}, {:.1f} M parameters, {} sequences a step per rank, {} rank{}\nmeasured on {}:\n",
               what, (described ? described->total_elems() : gpt2::total_numel(shape)) / 1e6, sequences, job.ranks,
               job.ranks > 1 ? "s" : "", PlanCalibration::machine_key(job.ranks, c.device));
  }
  PlanSpace space;
  space.sequences_per_rank = sequences;
  if (described) ZOE_RETURN_IF_ERROR(offer_described(*described, model_work, sequences, &space));
  PlanCalibration cal(c, {cache, recalibrate, human, &comm, described ? described->total_elems() : 0});
  ZOE_ASSIGN_OR_RETURN(PlanRates rates, cal.rates());
  space.nvme = !run.nvme_path.empty();
  space.aio_queue_depth = rates.aio_queue_depth;
  // A GPU's backward can hide the CPU's pass, begun on the speculation that the norm will not clip
  // and the loss scale hold; a job that clips, or scales an fp16 loss, may see its steps taken back,
  // which no plan can foresee: it is not offered there.
  if (!rates.compute_on_host_cores && c.grad_clip == 0 && c.dtype != DType::kF16) space.update_in_backward = {false, true};
  const MicroStepFor work = [&](int b, bool ck) { return described ? described->step(b, ck) : cal.micro_step(b, ck); };
  ZOE_ASSIGN_OR_RETURN(run.result, search_plans(job, space, work, rates));
  ZOE_RETURN_IF_ERROR(cal.save());
  const PlanResult& r = run.result;
  if (!r.fitting.empty()) return run;
  const PlanChoice* near = closest(r.refused, job);
  ZOE_ASSIGN_OR_RETURN(std::vector<PlanChange> changes, smallest_changes(job, space, work, rates, r));
  std::string fixes;
  for (const PlanChange& ch : changes) fixes += "\n  " + change_text(ch, job);
  return Status::Invalid(fmt::format(
      "no configuration of this job fits its budgets (zoe.device_memory_budget {}, zoe.host_memory_budget {}{}); "
      "the closest: stage {}, optimizer {}, parameters {}, micro-batch {}{}: {}. {}{}",
      c.device_memory_budget, c.host_memory_budget, run.nvme_path.empty() ? ", no NVMe path" : "",
      near ? near->knobs.stage : 0, near ? home_name(near->knobs.optimizer) : "-",
      near ? home_name(near->knobs.param) : "-", near ? near->knobs.micro_batch : 0,
      near && near->knobs.activation_checkpointing ? " checkpointed" : "", near ? near->prediction.why : "none",
      changes.empty() ? "No single change of a budget, the NVMe tier or the rank count makes it fit"
                      : "The smallest change of each kind that fits, alone:",
      fixes));
}

}  // namespace

Result<Config> plan_config(const Config& c, const std::string& cache, std::FILE* human, Comm& comm) {
  const bool root = comm.rank() == 0;
  auto run = run_plan(c, cache, false, root ? human : nullptr, comm);
  // Rank 0's choice, as a config, to every rank (an empty one: rank 0 could not plan).
  std::string text;
  if (root && run.ok()) {
    const PlanChoice& best = run->result.fitting.front();
    if (human) {
      fmt::print(human, "the plan (predicted {:.3f} s a step, {:.0f} tokens/s, bound: {}):\n", best.prediction.step_s,
                 best.prediction.tokens_per_s, best.prediction.bound);
      print_row(human, best, 1);
    }
    text = config_to_json(planned(c, best.knobs, run->nvme_path)).dump();
  }
  if (comm.size() == 1) return run.ok() ? parse_config(text, {}, "the plan") : Result<Config>(run.status());
  uint64_t n = text.size();
  ZOE_RETURN_IF_ERROR(comm.broadcast(&n, sizeof n, 0));
  text.resize(n);
  if (n) ZOE_RETURN_IF_ERROR(comm.broadcast(text.data(), n, 0));
  if (!run.ok()) return run.status();
  if (!n) return Status::Invalid("rank 0 could not plan this job (it says why)");
  return parse_config(text, {}, "rank 0's plan");
}

namespace {
int plan_ranks(const PlanArgs& a, const Config& cfg, Comm& comm);
}  // namespace

int plan_command(const PlanArgs& a) {
  auto cfg = a.config.empty() ? parse_config(default_config_json(), a.sets, "the embedded default job")
                              : load_config_file(a.config, a.sets);
  if (!cfg.ok()) return report_error(cfg.status());
  auto made = make_comm();  // under mpirun every rank measures beside the others; rank 0 reports
  if (!made.ok()) return report_error(made.status());
  std::unique_ptr<Comm> comm = std::move(made).value();
  const int code = plan_ranks(a, *cfg, *comm);
  comm.reset();
  finalize_mpi();
  return code;
}

namespace {

int plan_ranks(const PlanArgs& a, const Config& cfg, Comm& comm) {
  const bool root = comm.rank() == 0;
  auto run = run_plan(cfg, a.cache, a.recalibrate, a.json || !root ? nullptr : stdout, comm, a.model_work);
  if (!root) return run.ok() ? 0 : exit_code(run.status());
  if (!run.ok()) return report_error(run.status());
  const PlanResult& r = run->result;
  const Config best = planned(cfg, r.fitting.front().knobs, run->nvme_path);
  std::error_code ec;
  if (auto dir = std::filesystem::path(a.out).parent_path(); !dir.empty()) std::filesystem::create_directories(dir, ec);
  {
    std::ofstream f(a.out);
    f << config_to_json(best).dump(2) << "\n";
    if (!f) return report_error(Status::Io("cannot write the plan to " + a.out));
  }
  if (a.json) {
    nlohmann::json out = {{"machine", PlanCalibration::machine_key(comm.size(), cfg.device)}, {"config", a.out}, {"ranks", comm.size()},
                          {"fitting", r.fitting.size()}, {"refused", r.refused.size()}};
    for (size_t i = 0; i < r.fitting.size() && int(i) < a.top; ++i) out["plans"].push_back(choice_json(r.fitting[i]));
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  fmt::print("{} configurations fit, {} do not; the fastest {}:\n", r.fitting.size(), r.refused.size(),
             std::min<size_t>(a.top, r.fitting.size()));
  print_header(stdout);
  for (size_t i = 0; i < r.fitting.size() && int(i) < a.top; ++i) print_row(stdout, r.fitting[i], int(i) + 1);
  fmt::print("the best written to {}: zoe train --config {}\n", a.out, a.out);
  return 0;
}

}  // namespace

}  // namespace zoe::cli

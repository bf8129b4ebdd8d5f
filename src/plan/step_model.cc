#include "plan/step_model.h"

#include <algorithm>
#include <fmt/format.h>

#include "nvme/io_error.h"
#include "plan/virtual_step.h"
#include "sched/memory_estimate.h"
#include "sched/shard_layout.h"
#include "sched/state_array.h"
#include "sched/stage_plan.h"

namespace zoe {
namespace {


ShardLayout layout_of(const PlanJob& job) {
  std::vector<UnitSpec> units;
  for (size_t u = 0; u < job.unit_elems.size(); ++u)
    units.push_back(make_unit("u" + std::to_string(u), {{"w", {job.unit_elems[u]}}}));
  return ShardLayout(units, job.ranks);
}

int tier_of(OffloadDevice d) { return d == OffloadDevice::kNvme ? 2 : d == OffloadDevice::kCpu ? 1 : 0; }

// Elements of an array of n that `ratio` of an offload home puts there (StateArray's split: the
// last ones), and the rest on the device.
struct Split {
  int64_t device = 0, offloaded = 0;
  int tier = 0;
};
Split split(OffloadDevice home, double ratio, int64_t n) {
  if (home == OffloadDevice::kNone) return {n, 0, 0};
  const int64_t off = offloaded_elems(tier_of(home) == 2 ? Tier::kNvme : Tier::kHost, ratio, n);
  return {n - off, off, tier_of(home)};
}

bool mixed(DType d) { return d != DType::kF32; }

// The optimizer's elements per rank (sharded from stage 1) and the parameters' (from stage 3).
int64_t optimizer_elems(const ShardLayout& l, int stage) { return stage >= 1 ? l.shard_size() : l.padded_params(); }

}  // namespace

namespace {

// state_bytes and pinned_pool_bytes on a layout made once (predict_step makes one for all).
std::array<uint64_t, kNumTiers> state_bytes_of(const ShardLayout& l, const PlanJob& job, const PlanKnobs& k) {
  const StageMemory m = exact_stage(l.padded_params(), l.shard_size(), k.stage, job.dtype, k.optimizer, k.param,
                                    k.optimizer_ratio, k.param_ratio);
  std::array<uint64_t, kNumTiers> b{};
  for (int t = 0; t < kNumTiers; ++t) b[t] = static_cast<uint64_t>(m.by_tier[t]);
  return b;
}

PinnedPoolSize pool_of(const ShardLayout& l, const PlanJob& job, const PlanKnobs& k) {
  const bool opt = k.optimizer == OffloadDevice::kNvme, par = k.stage >= 3 && k.param == OffloadDevice::kNvme;
  if (!opt && !par) return {};
  const uint64_t w = dtype_size(job.dtype);
  const uint64_t per_elem = (opt ? (mixed(job.dtype) ? 12 : 8) : 0) + (par ? w : 0);
  const int64_t most = std::max(opt ? split(k.optimizer, k.optimizer_ratio, optimizer_elems(l, k.stage)).offloaded : 0,
                                par ? split(k.param, k.param_ratio, l.shard_size()).offloaded : 0);
  return pinned_pool_size({1, uint64_t{k.aio_queue_depth} * k.aio_block_size, per_elem, par ? w : 0, most,
                           k.sub_group_size, job.host_budget});
}

// Elements of the optimizer pass's first sub-group on NVMe, whose read nothing hides
// (OptimizerPass::groups): sub-groups end where a unit ends and where the ratio split's NVMe part
// begins, and hold at most what the pool's windows fit; the pass goes up the units.
int64_t first_nvme_group(const ShardLayout& l, const PlanJob& job, const PlanKnobs& k, int64_t offloaded) {
  const PinnedPoolSize pool = pool_of(l, job, k);  // the stores' buffers and slack (io) are not the windows'
  const int64_t fit = pool.per_group ? int64_t((pool.bytes - std::min(pool.bytes, pool.io)) / pool.per_group) : k.sub_group_size;
  const int64_t limit = std::max<int64_t>(1024, std::min(k.sub_group_size, fit));
  const int64_t nvme_begin = optimizer_elems(l, k.stage) - offloaded;
  int64_t at = 0;
  for (int u = 0; u < l.num_units(); ++u) {
    const int64_t end = at + (k.stage >= 1 ? l.slot(u).chunk : l.slot(u).full_size);
    const int64_t begin = std::max(at, nvme_begin);
    at = end;
    if (end > begin) return std::min(end - begin, limit);
  }
  return std::min(offloaded, limit);
}

}  // namespace

std::array<uint64_t, kNumTiers> state_bytes(const PlanJob& job, const PlanKnobs& k) {
  return state_bytes_of(layout_of(job), job, k);
}

uint64_t pinned_pool_bytes(const PlanJob& job, const PlanKnobs& k) { return pool_of(layout_of(job), job, k).bytes; }

namespace {

double param_read_rate(const PlanRates& r) { return r.param_read_Bps > 0 ? r.param_read_Bps : r.nvme_read_Bps; }

// A device's own rate where measured, else the CPU device's.
double or_host(double rate, double host) { return rate > 0 ? rate : host; }

// Each unit's chunk load: its NVMe part at the read rate, which runs beside the compute; its
// parts in host or device memory and its all-gather are copies, which on the host's cores take
// turns with the compute (copy_s) and else run beside it too: on a GPU, the host part over the
// link and the device part within its memory.
void unit_loads(const ShardLayout& l, const PlanJob& job, const PlanKnobs& k, const PlanRates& r, VirtualStepInput* v,
                std::vector<double>* copy_s) {
  const double w = static_cast<double>(dtype_size(job.dtype));
  const Split p = split(k.param, k.param_ratio, l.shard_size());
  const int64_t first_off = l.shard_size() - p.offloaded;  // [first_off, S): the offload tier
  for (int u = 0; u < l.num_units(); ++u) {
    const int64_t a = l.slot(u).shard_offset, c = l.slot(u).chunk;
    const int64_t off = std::clamp<int64_t>(a + c - first_off, 0, c);
    const double nvme = p.tier == 2 ? off : 0, memory = c - nvme;
    double beside = nvme * w / param_read_rate(r), copy = memory * w / r.host_copy_Bps;
    if (!r.compute_on_host_cores) {
      const double host = p.tier == 1 ? off : 0;
      copy = host * w / or_host(r.h2d_Bps, r.host_copy_Bps) + (memory - host) * w / or_host(r.device_copy_Bps, r.host_copy_Bps);
    }
    // The all-gather: on CPU ranks the ranks' processes copy each other's chunks on the same
    // cores the compute runs on, so it takes turns with it as a copy does.
    if (job.ranks > 1 && !r.fetch_overhead_has_collectives)
      copy += double(l.slot(u).full_size - c) * w / r.gather_busbw_Bps;
    if (!r.compute_on_host_cores) beside += copy, copy = 0;
    v->load_s.push_back(beside);
    copy_s->push_back(copy);
    v->memory_parts.push_back(memory > 0);
    v->unit_elems.push_back(l.slot(u).full_size);
  }
}

}  // namespace

StepPrediction predict_step(const PlanJob& job, const PlanKnobs& k, const MicroStepWork& work, const PlanRates& r) {
  StepPrediction out;
  const ShardLayout l = layout_of(job);
  const StagePlan plan = StagePlan::for_stage(k.stage);
  const size_t w = dtype_size(job.dtype), g = w;
  // Memory: the ledger's state, the engine's in-flight reserve, the model's activations.
  std::array<uint64_t, kNumTiers> st = state_bytes_of(l, job, k);
  uint64_t in_flight = 0;
  int64_t chunk = 0, largest = 0;
  for (int u = 0; u < l.num_units(); ++u) {
    in_flight = std::max(in_flight, unit_in_flight_bytes(l.slot(u).full_size, k.stage, w, g));
    chunk = std::max(chunk, l.slot(u).chunk);
    largest = std::max(largest, l.slot(u).full_size);
  }
  // The reduction's staging is held from start-up, as the state is (MPI rounds it to 64 bytes).
  if (job.ranks > 1 && job.staging) {
    const uint64_t staging = static_cast<uint64_t>(chunk) * job.ranks * g;
    st[static_cast<int>(*job.staging)] += *job.staging == Tier::kHost ? (staging + 63) / 64 * 64 : staging;
  }
  // The communication thread's buffer joins the reserve (ZeroEngine::start_comm_worker) where the
  // device holds it beside everything else; else the engine reduces without the thread. (Its own
  // check runs before the activations exist, so within them of the line it may still start.)
  if (job.overlap_comm && plan.shard_grads) {
    const uint64_t thread = comm_thread_bytes(largest, g);
    if (st[0] + in_flight + thread + work.activation_bytes <= job.device_budget) in_flight += thread;
  }
  out.bytes = st;
  out.bytes[0] += in_flight + work.activation_bytes;
  out.bytes[1] += pool_of(l, job, k).bytes;
  std::vector<std::string> over;
  if (out.bytes[0] > job.device_budget)
    over.push_back(fmt::format("device {} > budget {}", bytes_text(out.bytes[0]), bytes_text(job.device_budget)));
  if (job.host_budget && out.bytes[1] > job.host_budget)
    over.push_back(fmt::format("host {} > budget {}", bytes_text(out.bytes[1]), bytes_text(job.host_budget)));
  if (out.bytes[2] > 0 && out.bytes[2] > job.nvme_free)
    over.push_back(job.nvme_free ? fmt::format("nvme {} > {} free", bytes_text(out.bytes[2]), bytes_text(job.nvme_free))
                                 : std::string("nvme: no nvme_path"));
  for (const std::string& o : over) out.why += (out.why.empty() ? "" : "; ") + o;
  out.fits = over.empty();

  // The micro-step: compute, stage 3's loads on the virtual clock, the gradients' hand-over.
  double fwd = 0, bwd = 0;
  for (const PlanFetch& f : work.fetches) (f.backward ? bwd : fwd) += f.compute_s;
  out.compute_s = (fwd + bwd) * k.accumulation;
  double micro = fwd + bwd, micro_fwd = fwd, param_reads = 0;
  if (plan.shard_params && out.fits) {
    VirtualStepInput v;
    v.wsize = w;
    std::vector<double> copy_s;
    unit_loads(l, job, k, r, &v, &copy_s);
    v.limits = k.prefetch;
    v.budget = job.device_budget;
    v.state_bytes = st[0];
    v.activation_bytes = work.activation_bytes;
    v.reserve = in_flight;
    v.fetches = work.fetches;
    v.fetch_overhead_s = r.fetch_overhead_s;
    auto run = run_virtual_step(v);
    if (!run.ok()) {
      out.fits = false;
      out.why = "stage 3's units do not fit beside the state: " + run.status().message();
    } else {
      micro = run->step_s, micro_fwd = run->forward_s;
      for (int u : run->loaded) micro += copy_s[u];  // the copies' turns on the cores
      const Split p = split(k.param, k.param_ratio, l.shard_size());
      if (p.tier == 2)
        for (int u : run->loaded) {
          const int64_t a = l.slot(u).shard_offset, c = l.slot(u).chunk;
          param_reads += double(std::clamp<int64_t>(a + c - (l.shard_size() - p.offloaded), 0, c)) * w;
        }
    }
  }
  // Hand-over: on one rank the gradients' conversion into their chunk (or their accumulation)
  // is in the measured micro-step; on more, sharded gradients reduce-scatter on the communication
  // thread: beside the backward on a device of its own, taking turns with it on the host's cores.
  double reduce = 0;
  if (job.ranks > 1 && plan.shard_grads && !(plan.shard_params && r.fetch_overhead_has_collectives))
    for (int u = 0; u < l.num_units(); ++u)
      reduce += double(l.slot(u).full_size - l.slot(u).chunk) * g / r.reduce_busbw_Bps;
  // On a GPU an offloaded optimizer's sharded gradients go down to their pinned chunk at each
  // hand-over (RankState::grads_on_host), beside the backward too.
  const double d2h = or_host(r.d2h_Bps, r.host_copy_Bps), h2d = or_host(r.h2d_Bps, r.host_copy_Bps);
  const double handover = !r.compute_on_host_cores && plan.shard_grads && k.optimizer != OffloadDevice::kNone
                              ? double(l.shard_size()) * g / d2h : 0;
  micro += r.compute_on_host_cores ? reduce : std::max(0.0, reduce + handover - bwd);

  // The optimizer: Adam over this rank's state, NVMe parts streamed through three windows.
  const Split o = split(k.optimizer, k.optimizer_ratio, optimizer_elems(l, k.stage));
  const double per = mixed(job.dtype) ? 12 : 8;
  double adam = double(o.device + o.offloaded) / r.adam_elems_per_s;
  if (!r.compute_on_host_cores) {
    // A GPU steps its own part; the CPU the rest, sub-group by sub-group in turn with the link
    // (OptimizerPass::run_host_group): gradients still in device memory (stages 0-1) and fp32
    // weights come down first, the stepped weights that live on the device go back up.
    const Split p = split(k.param, k.param_ratio, l.shard_size());
    const double on_device = plan.shard_params ? double(p.device) / double(std::max<int64_t>(1, l.shard_size())) : 1;
    const double down = ((plan.shard_grads ? 0 : g) + (mixed(job.dtype) ? 0 : w) * on_device) / d2h;
    const double up = double(w) * on_device / h2d;
    adam = double(o.device) / or_host(r.device_adam_elems_per_s, r.adam_elems_per_s) +
           double(o.offloaded) * (1 / r.adam_elems_per_s + down + up) + l.num_units() * work.step_overhead_per_unit_s;
  }
  double opt_disk = 0;
  if (o.tier == 2)
    opt_disk = r.nvme_pass_s_per_elem > 0 ? double(o.offloaded) * r.nvme_pass_s_per_elem
                                          : double(o.offloaded) * per * (1 / r.nvme_read_Bps + 1 / r.nvme_write_Bps);
  const double first_window = o.tier == 2 ? double(first_nvme_group(l, job, k, o.offloaded)) * per / r.nvme_read_Bps : 0;
  out.optimizer_s = std::max(adam, opt_disk) + first_window;
  double step_comm = 0;  // stages 0-2 on more than one rank: replicated gradients and parameters
  if (job.ranks > 1) {
    const double frac = double(job.ranks - 1) / job.ranks, P = double(l.padded_params());
    if (!plan.shard_grads) step_comm += P * g * frac / r.reduce_busbw_Bps;
    if (!plan.shard_params) step_comm += P * w * frac / r.gather_busbw_Bps;
  }
  out.micro_s = micro * k.accumulation;
  if (plan.shard_params) {
    // The pass runs beside the next step's first forward, unit by unit. On the host's cores the
    // forward and Adam take turns; only the pass's disk time runs beside them.
    const double beside = r.compute_on_host_cores ? std::max(opt_disk + first_window, micro_fwd + adam)
                                                  : std::max(out.optimizer_s, micro_fwd);
    out.step_s = beside + (micro - micro_fwd) + micro * (k.accumulation - 1);
  } else if (k.update_in_backward && !r.compute_on_host_cores) {
    // zoe.update_in_backward: the pass starts at the last micro-step's first hand-over and runs
    // beside its backward (the unclipped step: a clipped one is taken back and redone).
    out.step_s = out.micro_s - bwd + std::max(bwd, out.optimizer_s) + step_comm;
  } else {
    out.step_s = out.micro_s + out.optimizer_s + step_comm;
  }
  out.disk_s = param_reads * k.accumulation / std::max(param_read_rate(r), 1.0) + opt_disk;
  out.step_s = std::max(out.step_s, out.disk_s);
  out.tokens_per_s = out.step_s > 0 ? double(work.tokens) * k.accumulation * job.ranks / out.step_s : 0;
  // What the step waits on most.
  const std::pair<double, const char*> parts[] = {{out.compute_s, "compute"},
                                                  {out.micro_s - out.compute_s, "loads"},
                                                  {adam, "optimizer"},
                                                  {out.disk_s, "disk"},
                                                  {step_comm + reduce * k.accumulation, "comm"}};
  out.bound = std::max_element(std::begin(parts), std::end(parts))->second;
  return out;
}

}  // namespace zoe

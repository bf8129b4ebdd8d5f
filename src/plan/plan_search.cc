#include "plan/plan_search.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <tuple>

namespace zoe {

namespace {

std::vector<OffloadDevice> homes(bool nvme) {
  std::vector<OffloadDevice> h = {OffloadDevice::kNone, OffloadDevice::kCpu};
  if (nvme) h.push_back(OffloadDevice::kNvme);
  return h;
}

// The ratios an offload home takes: none for the device itself.
std::vector<double> ratios_for(OffloadDevice d, const PlanSpace& s) {
  return d == OffloadDevice::kNone ? std::vector<double>{1.0} : s.ratios;
}

}  // namespace

std::vector<PlanKnobs> plan_grid(const PlanSpace& space) {
  std::vector<PlanKnobs> out;
  std::vector<std::pair<int, bool>> micro_steps;
  for (int b = 1; b <= std::min(space.sequences_per_rank, space.most_micro_batch); ++b)
    if (space.sequences_per_rank % b == 0)
      for (bool ckpt : space.checkpointing)
        if (space.micro_steps.empty() || std::find(space.micro_steps.begin(), space.micro_steps.end(),
                                                   std::make_pair(b, ckpt)) != space.micro_steps.end())
          micro_steps.emplace_back(b, ckpt);
  for (int stage : space.stages)
    for (OffloadDevice opt : homes(space.nvme))
      for (double orat : ratios_for(opt, space))
        for (OffloadDevice par : stage >= 3 ? homes(space.nvme) : std::vector<OffloadDevice>{OffloadDevice::kNone})
          for (double prat : ratios_for(par, space))
            for (int64_t sub : opt == OffloadDevice::kNone ? std::vector<int64_t>{space.sub_group_sizes.back()}
                                                           : space.sub_group_sizes)
              for (size_t pf = 0; pf < (stage >= 3 ? space.prefetch.size() : 1); ++pf)
                for (auto [b, ckpt] : micro_steps)
                  for (bool early : stage < 3 && opt != OffloadDevice::kNone ? space.update_in_backward
                                                                              : std::vector<bool>{false}) {
                    PlanKnobs k;
                    k.stage = stage;
                    k.optimizer = opt;
                    k.optimizer_ratio = orat;
                    k.param = par;
                    k.param_ratio = prat;
                    k.sub_group_size = sub;
                    k.prefetch = space.prefetch[pf];
                    k.micro_batch = b;
                    k.accumulation = space.sequences_per_rank / b;
                    k.activation_checkpointing = ckpt;
                    k.update_in_backward = early;
                    k.aio_block_size = space.aio_block_size;
                    k.aio_queue_depth = space.aio_queue_depth;
                    out.push_back(k);
                  }
  return out;
}

Result<PlanResult> search_plans(const PlanJob& job, const PlanSpace& space, const MicroStepFor& work,
                                const PlanRates& rates) {
  PlanResult r;
  // Each micro-step measured once; one the device had no memory for when measured is refused.
  std::map<std::pair<int, bool>, Result<MicroStepWork>> measured;
  for (const PlanKnobs& k : plan_grid(space)) {
    auto key = std::make_pair(k.micro_batch, k.activation_checkpointing);
    auto it = measured.find(key);
    if (it == measured.end()) {
      Result<MicroStepWork> w = work(k.micro_batch, k.activation_checkpointing);
      if (!w.ok() && w.status().code() != Code::kOutOfMemory) return w.status();
      it = measured.emplace(key, std::move(w)).first;
    }
    if (!it->second.ok()) {
      PlanChoice c{k, {}};
      c.prediction.why = "its micro-step ran out of device memory when measured: " + it->second.status().message();
      c.prediction.bytes = state_bytes(job, k);
      c.prediction.bytes[0] = UINT64_MAX / 2;  // more than any budget: never the closest miss
      r.refused.push_back(std::move(c));
      continue;
    }
    PlanChoice c{k, predict_step(job, k, *it->second, rates)};
    (c.prediction.fits ? r.fitting : r.refused).push_back(std::move(c));
  }
  // Fastest first. Those within 1 % of the fastest are told apart by the model's noise, not by
  // their speed: among them the plainest goes first (lower stage, fewer bytes off the device).
  auto faster = [](const PlanChoice& a, const PlanChoice& b) { return a.prediction.step_s < b.prediction.step_s; };
  std::stable_sort(r.fitting.begin(), r.fitting.end(), faster);
  if (!r.fitting.empty()) {
    const double best = r.fitting.front().prediction.step_s;
    auto tied = std::find_if(r.fitting.begin(), r.fitting.end(),
                             [&](const PlanChoice& c) { return c.prediction.step_s > 1.01 * best; });
    auto plainer = [](const PlanChoice& a, const PlanChoice& b) {
      auto key = [](const PlanChoice& c) {
        return std::make_tuple(c.knobs.stage, c.prediction.bytes[1] + c.prediction.bytes[2],
                               c.knobs.update_in_backward, c.prediction.step_s);
      };
      return key(a) < key(b);
    };
    std::stable_sort(r.fitting.begin(), tied, plainer);
  }
  return r;
}

namespace {

// The least value of one budget (a tier's bytes) at which a refused configuration fits, all else
// as the job has it: each configuration's need in that tier is a candidate, checked by
// predicting again with it (stage 3's units must also fit beside the state on its clock).
std::optional<PlanChange> least_budget(const PlanJob& job, const PlanSpace& space, const MicroStepFor& work,
                                       const PlanRates& rates, const PlanResult& refused, PlanChange::Kind kind) {
  const int tier = kind == PlanChange::Kind::kDeviceBudget ? 0 : kind == PlanChange::Kind::kHostBudget ? 1 : 2;
  std::vector<uint64_t> needs;
  for (const PlanChoice& c : refused.refused) needs.push_back(c.prediction.bytes[tier]);
  std::sort(needs.begin(), needs.end());
  needs.erase(std::unique(needs.begin(), needs.end()), needs.end());
  for (uint64_t need : needs) {
    PlanJob j = job;
    uint64_t& budget = tier == 0 ? j.device_budget : tier == 1 ? j.host_budget : j.nvme_free;
    if (need <= budget) continue;  // not this tier's shortage
    budget = need;
    PlanSpace sp = space;
    if (tier == 2) sp.nvme = true;
    auto r = search_plans(j, sp, work, rates);
    if (!r.ok()) return std::nullopt;
    if (!r->fitting.empty()) return PlanChange{kind, need, r->fitting.front()};
  }
  return std::nullopt;
}

}  // namespace

Result<std::vector<PlanChange>> smallest_changes(const PlanJob& job, const PlanSpace& space, const MicroStepFor& work,
                                                 const PlanRates& rates, const PlanResult& now) {
  std::vector<PlanChange> out;
  if (!now.fitting.empty()) return out;
  for (auto kind : {PlanChange::Kind::kDeviceBudget, PlanChange::Kind::kHostBudget}) {
    if (kind == PlanChange::Kind::kHostBudget && job.host_budget == 0) continue;  // no host budget: nothing to raise
    if (auto c = least_budget(job, space, work, rates, now, kind)) out.push_back(*c);
  }
  // An NVMe tier: the refusals with every configuration the disk would add, the disk unbounded.
  PlanJob roomy_disk = job;
  roomy_disk.nvme_free = UINT64_MAX;
  PlanSpace with_disk = space;
  with_disk.nvme = true;
  ZOE_ASSIGN_OR_RETURN(PlanResult disk, search_plans(roomy_disk, with_disk, work, rates));
  if (!disk.fitting.empty()) {
    PlanResult candidates;
    for (const PlanChoice& c : disk.fitting) candidates.refused.push_back(c);
    PlanJob no_room = job;
    no_room.nvme_free = 0;
    if (auto c = least_budget(no_room, space, work, rates, candidates, PlanChange::Kind::kNvme)) out.push_back(*c);
  }
  for (int ranks = job.ranks * 2; ranks <= job.ranks * 4096; ranks *= 2) {
    PlanJob j = job;
    j.ranks = ranks;
    ZOE_ASSIGN_OR_RETURN(PlanResult r, search_plans(j, space, work, rates));
    if (r.fitting.empty()) continue;
    out.push_back({PlanChange::Kind::kRanks, uint64_t(ranks), r.fitting.front()});
    break;
  }
  return out;
}

}  // namespace zoe

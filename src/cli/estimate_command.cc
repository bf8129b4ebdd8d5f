// `zoe estimate`: the seed's per-rank memory table for stages 0-3.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "common/config.h"
#include "sched/memory_estimate.h"

namespace zoe::cli {

int estimate_command(const EstimateArgs& a) {
  Config c;
  c.dtype = DType::kBF16;  // the seed's table: 2-byte weights and gradients
  if (!a.config.empty()) {
    auto r = load_config_file(a.config, {});
    if (!r.ok()) return report_error(r.status());
    c = r.value();
  }
  std::vector<StageMemory> rows;
  for (int s = 0; s <= 3; ++s)
    rows.push_back(estimate_stage(a.params, a.ranks, s, c.dtype, c.offload_optimizer.device, c.offload_param.device));
  if (a.json) {
    nlohmann::json out = {{"params", a.params}, {"ranks", a.ranks}, {"dtype", dtype_name(c.dtype)}};
    for (auto& m : rows) {
      nlohmann::json kinds, tiers;
      for (int k = 0; k < kNumPersistentKinds; ++k) kinds[std::string(kind_name(static_cast<Kind>(k)))] = m.by_kind[k];
      for (int t = 0; t < kNumTiers; ++t) tiers[std::string(tier_name(static_cast<Tier>(t)))] = m.by_tier[t];
      out["stages"].push_back({{"stage", m.stage}, {"bytes_per_rank", m.total()}, {"by_kind", kinds}, {"by_tier", tiers}});
    }
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  static const char* kNames[] = {"0 (full copies)", "1 (optimizer)", "2 (+gradients)", "3 (+parameters)"};
  fmt::print("model states per rank: P = {:.4g} parameters, N = {} ranks, {} weights and gradients\n", a.params,
             a.ranks, dtype_name(c.dtype));
  fmt::print("{:<17} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11} | {:>10} {:>10} {:>10}\n", "stage", "param", "grad",
             "master", "exp_avg", "exp_avg_sq", "total", "device", "host", "nvme");
  for (auto& m : rows) {
    fmt::print("{:<17}", kNames[m.stage]);
    for (double b : m.by_kind) fmt::print(" {:>7.3f} GB", b / 1e9);
    fmt::print(" {:>8.3f} GB |", m.total() / 1e9);
    for (double b : m.by_tier) fmt::print(" {:>7.3f} GB", b / 1e9);
    fmt::print("\n");
  }
  fmt::print("Activations, communication buffers and transiently gathered parameters come on top.\n");
  if (a.ranks > 1)
    fmt::print("Unsharded remainder per rank: stage 1 keeps {:.3f} GB of weights+gradients, stage 2 {:.3f} GB of "
               "weights, whatever N is.\n",
               (rows[1].by_kind[0] + rows[1].by_kind[1]) / 1e9, rows[2].by_kind[0] / 1e9);
  return 0;
}

}  // namespace zoe::cli

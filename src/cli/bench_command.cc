// `zoe bench <what>`: dispatch to the benchmarks in bench/.
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "comm_bench.h"
#include "step_bench.h"

namespace zoe::cli {

int bench_command(const BenchArgs& a) {
  nlohmann::json out;
  Status st;
  std::FILE* human = a.json ? nullptr : stdout;
  if (a.what == "comm") {
    CommBenchOptions o;
    for (auto& s : a.sizes) o.sizes.push_back(std::stoull(s));
    if (a.iters > 0) o.iters = a.iters;
    st = bench_comm(o, &out, human);
  } else if (a.what == "step") {
    StepBenchOptions o;
    o.threads = a.threads;
    if (a.iters > 0) o.iters = a.iters;
    o.torch = !a.no_torch;
    o.python = a.python;
    st = bench_step(o, &out, human);
  } else if (a.what == "adam" || a.what == "nvme" || a.what == "copy") {
    st = Status::Unsupported(fmt::format("bench '{}' is not available in this build yet", a.what));
  } else {
    st = Status::Invalid(fmt::format("bench '{}': expected one of adam, comm, nvme, copy, step", a.what));
  }
  if (!st.ok()) return report_error(st);
  if (a.json && !out.is_null()) fmt::print("{}\n", out.dump(2));
  return 0;
}

}  // namespace zoe::cli

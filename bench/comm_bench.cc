#include "comm_bench.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "comm/comm.h"
#include "bench_stats.h"

namespace zoe {
namespace {

// Seconds of one call of fn(), all ranks in step (a barrier first): the mean over ranks.
Result<double> time_once(Comm& comm, const std::function<Status()>& fn) {
  ZOE_RETURN_IF_ERROR(comm.barrier());
  auto t0 = std::chrono::steady_clock::now();
  ZOE_RETURN_IF_ERROR(fn());
  double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ZOE_RETURN_IF_ERROR(comm.all_reduce_sum(&t, 1));
  return t / comm.size();
}

struct PairTimes {
  double zoe_s, base_s;  // medians
  double ratio;          // median over repetitions of base time / zoe time (higher: zoe faster)
};

// zoe's call and the baseline, interleaved (the order flips every repetition) so both see the
// same machine: load here drifts within seconds, and with more ranks than cores one call can
// be 15 % off the next. The median of adjacent pairs' ratios is what that noise moves least.
Result<PairTimes> time_pair(Comm& comm, int iters, const std::function<Status()>& zoe,
                            const std::function<Status()>& base) {
  ZOE_RETURN_IF_ERROR(zoe());  // warm-up: buffers and MPI's connections
  ZOE_RETURN_IF_ERROR(base());
  std::vector<double> tz, tb;
  for (int i = 0; i < iters; ++i) {
    double t[2] = {0, 0};
    for (int k = 0; k < 2; ++k) {
      bool z = (i + k) % 2 == 0;
      ZOE_ASSIGN_OR_RETURN(t[z ? 0 : 1], time_once(comm, z ? zoe : base));
    }
    tz.push_back(t[0]), tb.push_back(t[1]);
  }
  return PairTimes{median(tz), median(tb), paired_ratio(tb, tz)};
}

Status mpi(int rc) { return rc == MPI_SUCCESS ? Status::Ok() : Status::CommError("MPI call failed"); }

}  // namespace

Status bench_comm(const CommBenchOptions& o, nlohmann::json* out, std::FILE* human) {
  ZOE_ASSIGN_OR_RETURN(auto comm, make_mpi_comm());
  const int n = comm->size();
  std::vector<size_t> sizes = o.sizes;
  if (sizes.empty()) sizes = {size_t{1} << 20, size_t{16} << 20, size_t{64} << 20, size_t{256} << 20};
  size_t max_bytes = *std::max_element(sizes.begin(), sizes.end());
  std::vector<float> send(max_bytes / 4 + n), recv(max_bytes / 4 + n);  // touched once, reused
  for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<float>(i % 97) * 0.25f;
  nlohmann::json results = nlohmann::json::array();
  bool root = comm->rank() == 0;
  if (root && human)
    std::fprintf(human, "# ranks %d; busbw = algbw * (N-1)/N; baseline = OpenMPI's own collective\n"
                        "%12s %16s %10s %10s %10s %12s %7s\n", n, "size(B)", "op", "time(us)", "algbw", "busbw",
                 "base busbw", "ratio");
  for (size_t bytes : sizes) {
    size_t count = bytes / 4 / n;  // fp32 elements per rank chunk
    size_t total = count * n * 4;
    struct Case {
      const char* name;
      std::function<Status()> zoe, base;
    };
    std::vector<Case> cases = {
        {"reduce_scatter",
         [&] { return comm->reduce_scatter(send.data(), recv.data(), count, DType::kF32); },
         [&] {
           return mpi(MPI_Reduce_scatter_block(send.data(), recv.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                                               MPI_COMM_WORLD));
         }},
        {"all_gather",
         [&] { return comm->all_gather(send.data(), recv.data(), count * 4); },
         [&] {
           return mpi(MPI_Allgather(send.data(), static_cast<int>(count), MPI_FLOAT, recv.data(),
                                    static_cast<int>(count), MPI_FLOAT, MPI_COMM_WORLD));
         }},
    };
    for (auto& c : cases) {
      // Small calls are the noisiest and the cheapest: up to 10x the repetitions below 16 MiB.
      int reps = o.iters * static_cast<int>(std::clamp<size_t>((size_t{16} << 20) / std::max<size_t>(total, 1), 1, 10));
      ZOE_ASSIGN_OR_RETURN(PairTimes pt, time_pair(*comm, reps, c.zoe, c.base));
      double tz = pt.zoe_s, tb = pt.base_s;
      double algz = total / tz / 1e9, algb = total / tb / 1e9, f = double(n - 1) / n;
      double ratio = pt.ratio;
      results.push_back({{"case", fmt::format("{} {} B", c.name, total)}, {"op", c.name}, {"bytes", total},
                         {"measured", algz * f}, {"baseline", algb * f}, {"ratio", ratio}, {"unit", "GB/s busbw"},
                         {"time_us", tz * 1e6}, {"baseline_time_us", tb * 1e6}});
      if (root && human)
        std::fprintf(human, "%12zu %16s %10.1f %10.3f %10.3f %12.3f %7.2f\n", total, c.name, tz * 1e6, algz, algz * f,
                     algb * f, ratio);
    }
  }
  if (out && root) *out = {{"bench", "comm"}, {"ranks", n}, {"results", results}};
  comm.reset();
  finalize_mpi();
  return Status::Ok();
}

}  // namespace zoe

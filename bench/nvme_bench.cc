// `zoe bench nvme`: see nvme_bench.h. GB/s are 1e9 bytes per second. zoe's figure is the file's
// bytes over the time from the first transfer submitted to the last one waited for; fio's is its
// own bw_bytes (bytes over its run time, which leaves out its setup just as zoe's leaves out
// opening the store).
#include "nvme_bench.h"

#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "nvme/io_error.h"
#include "nvme/nvme_store.h"
#include "nvme/pinned_pool.h"
#include "bench_process.h"
#include "bench_stats.h"

namespace zoe {
namespace {

// Ratios are paired_ratio(zoe, fio): each pair ran back to back, so the ratio is far steadier
// than either figure on a disk that swings 2x.

std::atomic<uint64_t> consumed_sink{0};

// fio's output and its errors, for the messages.
Result<std::string> run_fio(const std::string& cmd, int* exit_code) { return run_capture(cmd + " 2>&1", exit_code); }

// The whole file once, as transfers of `window` bytes all submitted up front: the store keeps
// queue_depth block requests in flight across them, as fio keeps iodepth. `consume`: the caller
// reads each read window once after its wait, as a training step reads the state it loads.
Result<double> zoe_pass(NvmeStore& st, IoOp op, uint8_t* buf, uint64_t window, uint64_t bytes,
                        bool consume = false) {
  std::vector<Ticket> tickets;
  tickets.reserve(bytes / window + 1);
  const double t0 = now_s();
  for (uint64_t off = 0; off < bytes; off += window) {
    const uint64_t n = std::min(window, bytes - off);
    tickets.push_back(op == IoOp::kRead ? st.read_async(0, off, buf, n) : st.write_async(0, off, buf, n));
  }
  Status first;
  uint64_t sum = 0;
  for (size_t i = 0; i < tickets.size(); ++i) {
    Status s = st.wait(tickets[i]);
    if (first.ok() && !s.ok()) first = s;
    if (consume && op == IoOp::kRead && s.ok()) {
      const uint64_t n = std::min(window, bytes - i * window) / 8;
      const auto* w = reinterpret_cast<const uint64_t*>(buf);
      for (uint64_t k = 0; k < n; ++k) sum += w[k];
    }
  }
  const double dt = now_s() - t0;
  if (consume) consumed_sink.fetch_add(sum, std::memory_order_relaxed);  // keeps the reads
  if (!first.ok()) return first;
  return static_cast<double>(bytes) / dt / 1e9;
}

// The job zoe runs: the store's own (preallocated, already written) file, O_DIRECT, io_uring
// with registered buffers and files, one job, sequential, the same size, block size and depth;
// fio neither lays the file out again nor fsyncs. `huge`: its buffers on 2 MiB pages like the
// pinned pool's (glibc's malloc asks for transparent huge pages, the buffers start on a 2 MiB
// boundary); without, fio's default 4 KiB pages, where a 1 MiB request is 256 memory segments.
std::string fio_command(const NvmeBenchOptions& o, const std::string& file, IoOp op, uint32_t bs, unsigned qd,
                        bool huge) {
  return fmt::format("{}{} --name=zoe-referee --filename={} --ioengine=io_uring --direct=1 --rw={} --bs={} "
                     "--iodepth={} --size={} --numjobs=1 --fixedbufs=1 --registerfiles=1 --fallocate=none "
                     "--allow_file_create=0 --end_fsync=0 {}--output-format=json",
                     huge ? "GLIBC_TUNABLES=glibc.malloc.hugetlb=1 " : "", shell_quote(o.fio), shell_quote(file),
                     op == IoOp::kRead ? "read" : "write", bs, qd, o.file_bytes, huge ? "--iomem_align=2m " : "");
}

Result<double> fio_pass(const NvmeBenchOptions& o, const std::string& file, IoOp op, uint32_t bs, unsigned qd,
                        bool huge) {
  int code = 0;
  const std::string cmd = fio_command(o, file, op, bs, qd, huge);
  ZOE_ASSIGN_OR_RETURN(std::string output, run_fio(cmd, &code));
  const size_t brace = output.find('{');
  const nlohmann::json j =
      brace == std::string::npos ? nlohmann::json() : nlohmann::json::parse(output.substr(brace), nullptr, false);
  const char* key = op == IoOp::kRead ? "read" : "write";
  if (code != 0 || !j.is_object() || !j.contains("jobs") || j["jobs"].empty() || !j["jobs"][0].contains(key))
    return Status::Runtime(fmt::format("fio exited with code {}: {}\ncommand: {}", code, output.substr(0, 400), cmd));
  const auto& r = j["jobs"][0][key];
  if (r.value("io_bytes", uint64_t{0}) != o.file_bytes)
    return Status::Runtime(fmt::format("fio moved {} bytes, not {}: {}", r.value("io_bytes", uint64_t{0}),
                                       o.file_bytes, cmd));
  return r["bw_bytes"].get<double>() / 1e9;
}

std::string size_name(uint64_t b) {
  return b % (1 << 20) == 0 ? fmt::format("{}MiB", b >> 20) : fmt::format("{}KiB", b >> 10);
}

struct NvmeCase {
  IoOp op;
  uint32_t bs;
  unsigned qd;
  std::vector<double> zoe, fio, fio_4k;
};

// Bytes of [p, p + n) that the kernel backs with transparent huge pages (/proc/self/smaps).
uint64_t huge_page_bytes(const void* p, uint64_t n) {
  std::FILE* f = std::fopen("/proc/self/smaps", "r");
  if (!f) return 0;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p), hi = lo + n;
  char line[512];
  bool inside = false;
  uint64_t total = 0;
  while (std::fgets(line, sizeof line, f)) {
    unsigned long a, b;
    unsigned long long kb;
    if (std::sscanf(line, "%lx-%lx ", &a, &b) == 2 && std::strchr(line, '-') < std::strchr(line, ' '))
      inside = a < hi && b > lo;
    else if (inside && std::sscanf(line, "AnonHugePages: %llu kB", &kb) == 1)
      total += kb << 10;
  }
  std::fclose(f);
  return total;
}

Result<std::unique_ptr<NvmeStore>> open_store(const NvmeBenchOptions& o, PinnedPool* pool, const std::string& job,
                                              uint32_t bs, unsigned qd, bool checksums) {
  NvmeStoreOptions so;
  so.nvme_path = o.dir;
  so.job = job;
  so.block_size = bs;
  so.queue_depth = qd;
  so.checksums = checksums;
  so.pool = pool;
  so.bounce_buffers = 1;  // every transfer here is aligned, in the pool: no bouncing
  const RegionSpec region{"bench", o.file_bytes};
  return NvmeStore::open(so, std::span<const RegionSpec>(&region, 1));
}

// What checksums cost at one setting: three stores side by side, plain, checksummed and plain
// again (the control), taking turns in an order that rotates each rep; rows appended to *sums.
// Reads are consumed (each window read once after its wait) by all three: what checksums add for
// a caller that uses its data. On this virtio disk, reading just-landed data slows the disk in
// some periods (minutes): plain 1 MiB x 8 reads that a consumer read ran at 1.7-1.8 GB/s in one
// (3.4-3.8 outside), and the checksummed store's, which its hashing reads, at the same; against
// a plain store that nobody reads, checksums looked like 0.55 of its rate in those periods and
// 1.05 outside. Three times the cases' reps: a round is three passes of the file without fio
// (about a second at 1 GiB), and the cost sought (a tenth) is within what this disk swings
// between two plain stores: the control's ratio to the plain one is this measurement's noise
// (0.95-1.20 in medians of seven pairs here), to read the checksums' ratio against.
Status checksum_cost(const NvmeBenchOptions& o, PinnedPool* pool, uint8_t* window, uint32_t bs, unsigned qd,
                     nlohmann::json* sums, std::FILE* human) {
  std::unique_ptr<NvmeStore> st[3];
  const char* jobs[3] = {"bench", "bench-sums", "bench-control"};
  for (int i = 0; i < 3; ++i) {
    ZOE_ASSIGN_OR_RETURN(st[i], open_store(o, pool, jobs[i], bs, qd, i == 1));
  }
  const uint64_t w = uint64_t{bs} * qd;
  for (auto& x : st) ZOE_RETURN_IF_ERROR(zoe_pass(*x, IoOp::kWrite, window, w, o.file_bytes).status());
  const int reps = 3 * o.reps;
  if (human)
    std::fprintf(human, "# checksums (xxh3-64 per block, verified on read) at block %u, depth %u, medians of %d "
                 "rounds;\n# control: a second plain store against the first (the noise); reads: each window read once "
                 "by the caller after its wait, in all three\n"
                 "# %6s %10s %10s %7s %10s\n", bs, qd, reps, "op", "plain GB/s", "sums GB/s", "ratio", "control");
  for (IoOp op : {IoOp::kWrite, IoOp::kRead}) {
    std::vector<double> v[3];
    for (int rep = 0; rep < reps; ++rep)
      for (int k = 0; k < 3; ++k) {
        const int i = (rep + k) % 3;
        ZOE_ASSIGN_OR_RETURN(double g, zoe_pass(*st[i], op, window, w, o.file_bytes, /*consume=*/true));
        v[i].push_back(g);
      }
    const double ratio = paired_ratio(v[1], v[0]), control = paired_ratio(v[2], v[0]);
    sums->push_back({{"case", fmt::format("checksums/{}/bs={}/qd={}", io_op_name(op), size_name(bs), qd)},
                     {"op", io_op_name(op)}, {"block_bytes", bs}, {"queue_depth", qd},
                     {"plain_GBps", median(v[0])}, {"checksums_GBps", median(v[1])}, {"ratio", ratio},
                     {"control_ratio", control}, {"rounds", reps}, {"consumed", op == IoOp::kRead},
                     {"plain_GBps_reps", v[0]},
                     {"checksums_GBps_reps", v[1]}, {"control_GBps_reps", v[2]}});
    if (human) {
      std::fprintf(human, "  %6s %10.3f %10.3f %7.3f %10.3f\n", io_op_name(op), median(v[0]), median(v[1]), ratio,
                   control);
      std::fflush(human);
    }
  }
  Status first;
  for (auto& x : st)
    if (Status c = x->close(); first.ok() && !c.ok()) first = c;
  return first;
}

}  // namespace

Status bench_nvme(const NvmeBenchOptions& o, nlohmann::json* out, std::FILE* human) {
  if (o.block_sizes.empty() || o.queue_depths.empty() || o.reps < 1)
    return Status::Invalid("bench nvme: block sizes and queue depths must be non-empty and --iters >= 1");
  const uint32_t max_bs = *std::max_element(o.block_sizes.begin(), o.block_sizes.end());
  const unsigned max_qd = *std::max_element(o.queue_depths.begin(), o.queue_depths.end());
  if (o.file_bytes < max_bs || o.file_bytes % max_bs != 0)
    return Status::Invalid(fmt::format("bench nvme: --size {} must be a multiple of the largest block size {}",
                                       o.file_bytes, max_bs));
  std::error_code ec;
  std::filesystem::create_directories(o.dir, ec);
  if (ec) return Status::Invalid(fmt::format("bench nvme: --dir {}: {}", o.dir, ec.message()));

  int code = 0;
  auto version = run_fio(shell_quote(o.fio) + " --version", &code);
  const bool have_fio = version.ok() && code == 0;
  std::string fio_version = have_fio ? version.value() : "";
  while (!fio_version.empty() && fio_version.back() == '\n') fio_version.pop_back();

  // One pinned pool for every case, allocated (and touched) once: the largest window of
  // block_size x queue_depth bytes that transfers move through, plus a bounce buffer for each of
  // the three stores of the checksum rows.
  PinnedPoolOptions po;
  po.bytes = uint64_t{max_bs} * max_qd + 3 * uint64_t{max_bs};
  ZOE_ASSIGN_OR_RETURN(std::unique_ptr<PinnedPool> pool, PinnedPool::create(po));
  ZOE_ASSIGN_OR_RETURN(PinnedPool::Lease window, pool->acquire(uint64_t{max_bs} * max_qd));
  std::mt19937_64 rng(42);
  for (size_t i = 0; i + 8 <= window.size(); i += 8) {
    const uint64_t x = rng();
    std::memcpy(window.data() + i, &x, 8);
  }

  const uint64_t pool_huge = huge_page_bytes(pool->pieces()[0].iov_base, pool->capacity());
  if (human) {
    std::fprintf(human, "# zoe bench nvme: %s per pass, O_DIRECT, sequential, in %s; GB/s = 1e9 B/s\n",
                 bytes_text(o.file_bytes).c_str(), o.dir.c_str());
    std::fprintf(human, "# medians of %d reps; each rep runs zoe and fio back to back (alternating who goes first),\n"
                 "# then fio-4k; ratio = median of the reps' zoe/fio; referee: %s, io_uring, "
                 "fixedbufs, registerfiles,\n# buffers on 2 MiB pages like zoe's pool (%s of %s huge here); "
                 "fio-4k: fio's default 4 KiB pages\n", o.reps,
                 have_fio ? fio_version.c_str() : "none (fio not found)",
                 bytes_text(pool_huge).c_str(), bytes_text(pool->capacity()).c_str());
    std::fprintf(human, "# %6s %10s %6s %10s %10s %7s %11s\n", "op", "block", "depth", "zoe GB/s", "fio GB/s", "ratio",
                 "fio-4k GB/s");
  }
  std::vector<NvmeCase> cases;
  std::string file;
  for (uint32_t bs : o.block_sizes) {
    for (unsigned qd : o.queue_depths) {
      ZOE_ASSIGN_OR_RETURN(std::unique_ptr<NvmeStore> st, open_store(o, pool.get(), "bench", bs, qd, false));
      file = st->region_path(0);
      const uint64_t w = uint64_t{bs} * qd;
      // Written once untimed: reads then read real blocks, and every timed write overwrites.
      ZOE_RETURN_IF_ERROR(zoe_pass(*st, IoOp::kWrite, window.data(), w, o.file_bytes).status());
      NvmeCase wr{IoOp::kWrite, bs, qd, {}, {}, {}}, rd{IoOp::kRead, bs, qd, {}, {}, {}};
      for (int rep = 0; rep < o.reps; ++rep) {
        for (NvmeCase* c : {&wr, &rd}) {
          // zoe and fio run back to back, zoe first on even reps and second on odd ones, so that
          // drift of the disk and what one pass leaves behind (its writes still being flushed by
          // the host) fall on both alike.
          const bool zoe_first = rep % 2 == 0;
          if (zoe_first || !have_fio) {
            ZOE_ASSIGN_OR_RETURN(double z, zoe_pass(*st, c->op, window.data(), w, o.file_bytes));
            c->zoe.push_back(z);
          }
          if (have_fio) {
            ZOE_ASSIGN_OR_RETURN(double f, fio_pass(o, file, c->op, bs, qd, true));
            c->fio.push_back(f);
            if (!zoe_first) {
              ZOE_ASSIGN_OR_RETURN(double z, zoe_pass(*st, c->op, window.data(), w, o.file_bytes));
              c->zoe.push_back(z);
            }
            ZOE_ASSIGN_OR_RETURN(double f4, fio_pass(o, file, c->op, bs, qd, false));
            c->fio_4k.push_back(f4);
          }
        }
      }
      ZOE_RETURN_IF_ERROR(st->close());
      for (NvmeCase* c : {&wr, &rd}) {
        if (human) {
          const double z = median(c->zoe), f = median(c->fio);
          std::fprintf(human, "  %6s %10u %6u %10.3f %10s %7s %11s\n", io_op_name(c->op), bs, qd, z,
                       have_fio ? fmt::format("{:.3f}", f).c_str() : "-",
                       have_fio ? fmt::format("{:.3f}", paired_ratio(c->zoe, c->fio)).c_str() : "-",
                       have_fio ? fmt::format("{:.3f}", median(c->fio_4k)).c_str() : "-");
          std::fflush(human);
        }
        cases.push_back(*c);
      }
    }
  }

  nlohmann::json results = nlohmann::json::array();
  for (const NvmeCase& c : cases) {
    const double z = median(c.zoe);
    nlohmann::json r = {{"case", fmt::format("{}/bs={}/qd={}", io_op_name(c.op), size_name(c.bs), c.qd)},
                        {"op", io_op_name(c.op)}, {"block_bytes", c.bs}, {"queue_depth", c.qd},
                        {"zoe_GBps", z}, {"zoe_GBps_reps", c.zoe}, {"fio_GBps", nullptr}, {"ratio", nullptr}};
    if (have_fio) {
      const double f = median(c.fio);
      r["fio_GBps"] = f;
      r["fio_GBps_reps"] = c.fio;
      r["fio_4k_GBps"] = median(c.fio_4k);
      r["fio_4k_GBps_reps"] = c.fio_4k;
      r["ratio"] = paired_ratio(c.zoe, c.fio);
    }
    results.push_back(r);
  }

  // Every pair of every case pooled, per op: with 3 reps a case's median cannot resolve a few
  // percent on a disk that swings 2x between passes; the pool of all pairs can.
  nlohmann::json pooled = nlohmann::json::object();
  if (have_fio) {
    for (IoOp op : {IoOp::kWrite, IoOp::kRead}) {
      std::vector<double> r;
      for (const NvmeCase& c : cases)
        for (size_t i = 0; c.op == op && i < c.zoe.size() && i < c.fio.size(); ++i)
          if (c.fio[i] > 0) r.push_back(c.zoe[i] / c.fio[i]);
      pooled[io_op_name(op)] = {{"median_ratio", median(r)}, {"pairs", r.size()}};
      if (human)
        std::fprintf(human, "# %s, all cases pooled: median zoe/fio %.3f over %zu pairs\n", io_op_name(op), median(r),
                     r.size());
    }
  }

  // The best settings for this disk: the highest of min(read, write) of zoe's medians.
  uint32_t best_bs = o.block_sizes[0];
  unsigned best_qd = o.queue_depths[0];
  double best = -1;
  for (size_t i = 0; i + 1 < cases.size(); i += 2) {
    const double m = std::min(median(cases[i].zoe), median(cases[i + 1].zoe));
    if (m > best) {
      best = m;
      best_bs = cases[i].bs;
      best_qd = cases[i].qd;
    }
  }
  const nlohmann::json best_aio = {{"aio", {{"block_size", best_bs}, {"queue_depth", best_qd}}}};
  if (human) {
    std::fprintf(human, "# best aio settings here (highest min(read, write)); paste into the config:\n%s\n",
                 best_aio.dump().c_str());
    std::fflush(human);
  }

  nlohmann::json sums = nlohmann::json::array();
  if (o.checksum_rows) {
    // At the best settings and at aio's default block (1 MiB) where it is a case and not the best.
    ZOE_RETURN_IF_ERROR(checksum_cost(o, pool.get(), window.data(), best_bs, best_qd, &sums, human));
    if (best_bs != 1u << 20 && std::count(o.block_sizes.begin(), o.block_sizes.end(), 1u << 20))
      ZOE_RETURN_IF_ERROR(checksum_cost(o, pool.get(), window.data(), 1u << 20, best_qd, &sums, human));
  }

  if (out) {
    *out = {{"bench", "nvme"}, {"dir", o.dir}, {"file_bytes", o.file_bytes}, {"reps", o.reps},
            {"fio", have_fio ? nlohmann::json(fio_version) : nlohmann::json(nullptr)},
            {"fio_command", fio_command(o, file, IoOp::kRead, o.block_sizes[0], o.queue_depths[0], true)},
            {"fio_4k_command", fio_command(o, file, IoOp::kRead, o.block_sizes[0], o.queue_depths[0], false)},
            {"pool_bytes", pool->capacity()}, {"pool_huge_page_bytes", pool_huge},
            {"results", results}, {"pooled", pooled}, {"checksum_cost", sums}, {"best_aio", best_aio["aio"]}};
    if (!have_fio) (*out)["fio_missing"] = "fio not found (" + o.fio + "): apt-get install fio";
  }
  return Status::Ok();
}

}  // namespace zoe

#include "train/trace_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ckpt/atomic_file.h"
#include "common/posix_io.h"
#include "common/profiler.h"

namespace zoe {

Status write_trace(Comm& comm, const std::string& path) {
  nlohmann::json mine = nlohmann::json::array();
  for (const TraceEvent& e : Profiler::get().events())
    mine.push_back({{"name", e.name}, {"cat", e.cat}, {"ph", "X"}, {"ts", e.ts_us}, {"dur", e.dur_us},
                    {"pid", comm.rank()}, {"tid", e.tid}});
  // Perfetto's row labels: one metadata event per named thread (the rank is the process).
  for (const auto& [tid, name] : Profiler::get().thread_names())
    mine.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", comm.rank()}, {"tid", tid},
                    {"args", {{"name", name}}}});
  mine.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", comm.rank()},
                  {"args", {{"name", fmt::format("rank {}", comm.rank())}}}});
  std::string text = mine.dump();
  // Two gathers of fixed size: the lengths, then every rank's text padded to the longest.
  uint64_t len = text.size();
  std::vector<uint64_t> lens(comm.size());
  ZOE_RETURN_IF_ERROR(comm.gather_to_root(&len, lens.data(), sizeof(len)));
  uint64_t max_len = len;
  if (comm.rank() == 0) max_len = *std::max_element(lens.begin(), lens.end());
  ZOE_RETURN_IF_ERROR(comm.broadcast(&max_len, sizeof(max_len), 0));
  text.resize(max_len, ' ');
  std::vector<char> all(comm.rank() == 0 ? max_len * comm.size() : 1);
  ZOE_RETURN_IF_ERROR(comm.gather_to_root(text.data(), all.data(), max_len));
  if (comm.rank() != 0) return Status::Ok();
  nlohmann::json events = nlohmann::json::array();
  for (int r = 0; r < comm.size(); ++r) {
    auto part = nlohmann::json::parse(all.begin() + r * max_len, all.begin() + r * max_len + lens[r]);
    for (auto& e : part) events.push_back(std::move(e));
  }
  std::string out = nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() + "\n";
  return write_file_atomic(path, out);
}

Status check_trace_path(const std::string& path) {
  if (path.empty()) return Status::Ok();
  // Written at the end through an AtomicFile: here, only whether it could be.
  const std::string dir = parent_dir(path);
  UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!d.valid() || ::faccessat(d.get(), ".", W_OK, AT_EACCESS) != 0)
    return Status::Invalid(fmt::format("--trace '{}': cannot be written: {}", path, errno_string(errno)));
  Status s = check_replaceable(d.get(), base_name(path), path);
  if (!s.ok()) return Status::Invalid("--trace " + s.message());
  return Status::Ok();
}

}  // namespace zoe

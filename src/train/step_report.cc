#include "train/step_report.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/posix_io.h"

namespace zoe {

RankStepFacts RankStepFacts::collect(const LedgerSnapshot& l, const CommBytes& c, const Engine::NvmeBytes& nvme) {
  RankStepFacts f{};
  for (int t = 0; t < kNumTiers; ++t)
    for (int k = 0; k < kNumPersistentKinds; ++k) f.persistent[t][k] = l.bytes[t][k];
  f.peak_device = l.peak[static_cast<int>(Tier::kDevice)];
  f.peak_host = l.peak[static_cast<int>(Tier::kHost)];
  f.all_gather = c.all_gather;
  f.reduce_scatter = c.reduce_scatter;
  f.all_reduce = c.all_reduce;
  f.broadcast = c.broadcast;
  f.nvme_read = nvme.read;
  f.nvme_written = nvme.written;
  // The process's peak resident memory so far (Linux reports KiB), beside the ledger's peaks.
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  f.peak_rss = static_cast<uint64_t>(ru.ru_maxrss) * 1024;
  return f;
}

Result<std::vector<RankStepFacts>> gather_facts(Comm& comm, const RankStepFacts& mine) {
  std::vector<RankStepFacts> all(comm.rank() == 0 ? comm.size() : 1);
  ZOE_RETURN_IF_ERROR(comm.gather_to_root(&mine, all.data(), sizeof(RankStepFacts)));
  if (comm.rank() != 0) all.clear();
  return all;
}

nlohmann::json ledger_json(const std::vector<RankStepFacts>& ranks) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t r = 0; r < ranks.size(); ++r) {
    nlohmann::json e;
    e["rank"] = r;
    for (int t = 0; t < kNumTiers; ++t) {
      nlohmann::json kinds;
      for (int k = 0; k < kNumPersistentKinds; ++k)
        kinds[std::string(kind_name(static_cast<Kind>(k)))] = ranks[r].persistent[t][k];
      e[std::string(tier_name(static_cast<Tier>(t)))] = kinds;
    }
    e["peak_device_bytes"] = ranks[r].peak_device;
    e["peak_host_bytes"] = ranks[r].peak_host;
    e["peak_rss_bytes"] = ranks[r].peak_rss;
    out.push_back(e);
  }
  return out;
}

nlohmann::json comm_json(const std::vector<RankStepFacts>& ranks) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t r = 0; r < ranks.size(); ++r)
    out.push_back({{"rank", r}, {"all_gather", ranks[r].all_gather}, {"reduce_scatter", ranks[r].reduce_scatter},
                   {"all_reduce", ranks[r].all_reduce}, {"broadcast", ranks[r].broadcast}});
  return out;
}

nlohmann::json nvme_json(const std::vector<RankStepFacts>& ranks) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t r = 0; r < ranks.size(); ++r)
    out.push_back({{"rank", r}, {"read", ranks[r].nvme_read}, {"written", ranks[r].nvme_written}});
  return out;
}

ReportWriter::~ReportWriter() {
  if (f_) std::fclose(f_);
}

Status ReportWriter::open(const std::string& path, bool append) {
  if (path.empty()) return Status::Ok();
  path_ = path;
  // Created by zoe, 0600 whatever the umask; an existing one may only be a regular file, and is
  // emptied only when the first line is written: a typo in another input leaves it as it was.
  // O_NOFOLLOW: never through a planted link; O_NONBLOCK: a FIFO there is refused, not waited on.
  const int flags = O_WRONLY | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
  bool created = true;
  int fd = ::open(path.c_str(), flags | O_CREAT | O_EXCL, 0600);
  if (fd < 0 && errno == EEXIST) {
    created = false;
    fd = ::open(path.c_str(), flags);
  }
  if (fd < 0) {
    int e = errno;
    return Status::Invalid(fmt::format("--report '{}': cannot be written: {}", path,
                                       e == ELOOP ? "it is a symbolic link, which zoe does not follow" : std::strerror(e)));
  }
  struct stat st = {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (created && ::fchmod(fd, 0600) != 0)) {
    std::string kind = file_kind(st.st_mode);
    ::close(fd);
    return Status::Invalid(fmt::format("--report '{}': is {}; zoe writes its report only to a regular file", path, kind));
  }
  f_ = ::fdopen(fd, "a");
  if (!f_) {
    ::close(fd);
    return Status::Io(fmt::format("--report '{}': fdopen: {}", path, std::strerror(errno)));
  }
  truncate_at_first_line_ = !append && !created;
  return Status::Ok();
}

Status ReportWriter::write(const nlohmann::json& line) {
  if (!f_) return Status::Ok();
  if (truncate_at_first_line_) {
    truncate_at_first_line_ = false;
    if (::ftruncate(::fileno(f_), 0) != 0)
      return Status::Io(fmt::format("report '{}': cannot truncate: {}", path_, std::strerror(errno)));
  }
  std::string s = line.dump() + "\n";
  if (std::fwrite(s.data(), 1, s.size(), f_) != s.size() || std::fflush(f_) != 0)
    return Status::Io(fmt::format("report '{}': write failed: {}", path_, std::strerror(errno)));
  return Status::Ok();
}

}  // namespace zoe

// The per-step report line (contracts.md "Report"): rank 0 gathers every rank's ledger and
// communication counters and writes one JSON object per optimizer step, flushed each step.
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "comm/comm.h"
#include "zoe/engine.h"
#include "zoe/ledger.h"
#include "zoe/status.h"

namespace zoe {

// What one rank contributes to a step's report, packed for a fixed-size gather.
struct RankStepFacts {
  uint64_t persistent[kNumTiers][kNumPersistentKinds];
  uint64_t peak_device, peak_host;
  uint64_t peak_rss;  // the process's peak resident set (getrusage), for checking the ledger
  uint64_t all_gather, reduce_scatter, all_reduce, broadcast;
  uint64_t nvme_read, nvme_written;  // what this rank's NVMe tier moved since the previous line

  static RankStepFacts collect(const LedgerSnapshot& l, const CommBytes& c, const Engine::NvmeBytes& nvme);
};

// Gathers every rank's facts to rank 0 (others get an empty vector).
Result<std::vector<RankStepFacts>> gather_facts(Comm& comm, const RankStepFacts& mine);

nlohmann::json ledger_json(const std::vector<RankStepFacts>& ranks);
nlohmann::json comm_json(const std::vector<RankStepFacts>& ranks);
nlohmann::json nvme_json(const std::vector<RankStepFacts>& ranks);

class ReportWriter {
 public:
  ReportWriter() = default;
  ~ReportWriter();
  // Empty path: no report. append: a resumed run continues the file instead of truncating it.
  // A new file is 0600; an existing one must be a regular file (not a link, FIFO or device) and
  // is emptied only when the first line is written.
  Status open(const std::string& path, bool append = false);
  Status write(const nlohmann::json& line);
  bool active() const { return f_ != nullptr; }

 private:
  std::FILE* f_ = nullptr;
  std::string path_;
  bool truncate_at_first_line_ = false;
};

}  // namespace zoe

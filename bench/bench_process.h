// What the benchmarks share to time themselves and to run their referees (fio, PyTorch scripts)
// as child processes.
#pragma once
#include <functional>
#include <string>

#include "zoe/status.h"

namespace zoe {

// The embedded corpus the training benches learn (bytes).
inline const std::string kBenchCorpus = std::string(ZOE_SOURCE_DIR) + "/data/corpus.txt";

// Seconds on the steady clock.
double now_s();
// The fastest of `iters` timings of fn after one untimed warm-up, seconds (fn's first error ends
// it).
Result<double> best_seconds(int iters, const std::function<Status()>& fn);
// s as one single-quoted shell word.
std::string shell_quote(const std::string& s);
// Runs `cmd` through the shell and returns its stdout (add " 2>&1" for stderr too); *exit_code
// is its exit status, 128 + the signal when a signal ended it.
Result<std::string> run_capture(const std::string& cmd, int* exit_code);

}  // namespace zoe

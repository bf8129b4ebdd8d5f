#include "bench_process.h"

#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace zoe {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Result<double> best_seconds(int iters, const std::function<Status()>& fn) {
  ZOE_RETURN_IF_ERROR(fn());  // warm-up
  double best = 1e30;
  for (int i = 0; i < iters; ++i) {
    const double t0 = now_s();
    ZOE_RETURN_IF_ERROR(fn());
    best = std::min(best, now_s() - t0);
  }
  return best;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

Result<std::string> run_capture(const std::string& cmd, int* exit_code) {
  std::FILE* f = popen(cmd.c_str(), "r");
  if (!f) return Status::Runtime("cannot run: " + cmd);
  std::string output;
  char buf[4096];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) output.append(buf, got);
  const int st = pclose(f);
  *exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return output;
}

}  // namespace zoe

#include "train/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

#include <fmt/format.h>

namespace zoe {

std::string human_bytes(uint64_t b) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  double v = static_cast<double>(b);
  int i = 0;
  while (v >= 1000 && i < 4) v /= 1000, ++i;
  return i == 0 ? fmt::format("{} B", b) : fmt::format("{:.2f} {}", v, units[i]);
}

Progress::Progress(int64_t total, bool enabled, int every)
    : total_(total), enabled_(enabled), tty_(isatty(STDOUT_FILENO)), every_(every > 0 ? every : 10),
      start_(std::chrono::steady_clock::now()) {}

void Progress::update(int64_t step, double loss, double tps, double step_s, const RankStepFacts& f) {
  if (!enabled_) return;
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double eta = step > 0 ? elapsed / step * (total_ - step) : 0;
  uint64_t dev = 0, host = 0, nvme = 0;
  for (int k = 0; k < kNumPersistentKinds; ++k)
    dev += f.persistent[0][k], host += f.persistent[1][k], nvme += f.persistent[2][k];
  std::string line = fmt::format("step {:>5}/{} | loss {:.4f} | {:.0f} tok/s | {:.2f} s/step | ETA {:.0f}m{:02.0f}s | "
                                 "rank0 state: device {} (peak {}) host {} nvme {}",
                                 step, total_, loss, tps, step_s, std::floor(eta / 60), std::fmod(eta, 60.0),
                                 human_bytes(dev), human_bytes(f.peak_device), human_bytes(host), human_bytes(nvme));
  if (f.nvme_read || f.nvme_written)  // what the step moved: against the disk's rates, how far from its bound
    line += fmt::format(" | nvme read {} written {}", human_bytes(f.nvme_read), human_bytes(f.nvme_written));
  if (tty_) {
    std::printf("\r\033[K%s", line.c_str());
    dirty_ = true;
  } else if (step == 1 || step == total_ || step % every_ == 0) {
    std::printf("%s\n", line.c_str());
  }
  std::fflush(stdout);
}

void Progress::finish() {
  if (enabled_ && tty_ && dirty_) std::printf("\n");
  std::fflush(stdout);
}

}  // namespace zoe

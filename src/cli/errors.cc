#include <cstdio>

#include "cli/commands.h"
#include "common/signal_exit.h"

namespace zoe::cli {

int exit_code(const Status& s) {
  if (s.ok()) return 0;
  // A corrupt checkpoint or data file is bad input too: the user must point at another one.
  bool input = s.code() == Code::kInvalidInput || s.code() == Code::kUnsupported || s.code() == Code::kCorrupt;
  return input ? 2 : 1;
}

int report_error(const Status& s) {
  SignalExit::ending();
  std::fprintf(stderr, "zoe: %s\n", s.message().c_str());
  return exit_code(s);
}

}  // namespace zoe::cli

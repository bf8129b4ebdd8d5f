// Fault injection: CUDA_EMU_FAIL=<call>:<n>[,<call>:<n>...] makes the n-th call (from 1) of that
// kind fail as the real call reports a failure (an error code, a cuBLASLt or NCCL status, a
// launch error for cudaGetLastError), without doing its work. <call> is the function's name
// (cudaMalloc, cublasLtMatmul, ncclAllGather, ...), "launch" for kernel launches, or "any" for
// the n-th of every call that can fail here; <call>@<text> counts only the calls whose detail
// holds <text> (launch@gelu_forward:1 fails the first launch of a kernel named so). Every call is
// counted (cuda_emu_calls); CUDA_EMU_COUNT=1 prints each kind's count at exit, so that a sweep
// knows how many calls a run makes. An injected failure is said on stderr
// ("cuda_emu: injected a failure into ...") so that a test can tell it happened.
#include "cuda_emu_internal.h"  // first: cuda_emu.h defines the CUDA qualifiers before the CUDA headers do

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

namespace {

struct Faults {
  std::mutex mu;
  std::map<std::string, unsigned long long> fail_at;  // kind -> the call that fails (from 1)
  std::map<std::string, unsigned long long> count;    // kind -> calls so far ("any": all kinds)
  bool report = false;

  Faults() {
    report = std::getenv("CUDA_EMU_COUNT") != nullptr;
    const char* e = std::getenv("CUDA_EMU_FAIL");
    std::string spec = e ? e : "";
    for (size_t at = 0; at < spec.size();) {
      size_t end = spec.find(',', at);
      if (end == std::string::npos) end = spec.size();
      const std::string item = spec.substr(at, end - at);
      const size_t colon = item.rfind(':');
      char* rest = nullptr;
      const unsigned long long n =
          colon == std::string::npos ? 0 : std::strtoull(item.c_str() + colon + 1, &rest, 10);
      if (colon == std::string::npos || colon == 0 || n == 0 || !rest || *rest)
        emu::die("CUDA_EMU_FAIL must be <call>:<n>[,<call>:<n>...] with n >= 1, not \"" + spec + "\"");
      fail_at[item.substr(0, colon)] = n;
      at = end + 1;
    }
  }
};

// Never destroyed: threads may still call while the process exits.
Faults& faults() {
  static Faults& f = *[] {
    auto* made = new Faults;
    if (made->report)
      std::atexit([] {
        Faults& g = faults();
        std::lock_guard<std::mutex> lock(g.mu);
        for (const auto& [kind, n] : g.count) std::fprintf(stderr, "cuda_emu: calls %s %llu\n", kind.c_str(), n);
      });
    return made;
  }();
  return f;
}

}  // namespace

namespace emu {

bool injected(const char* call, const char* detail) {
  Faults& f = faults();
  std::lock_guard<std::mutex> lock(f.mu);
  const unsigned long long mine = ++f.count[call], all = ++f.count["any"];
  bool fail = false;
  for (const auto& [kind, n] : f.fail_at) {
    const size_t at = kind.find('@');
    if (at == std::string::npos) {
      fail |= (kind == call && n == mine) || (kind == "any" && n == all);
    } else if (kind.compare(0, at, call) == 0 && at == std::strlen(call) && detail &&
               std::strstr(detail, kind.c_str() + at + 1)) {
      fail |= ++f.count[kind] == n;
    }
  }
  if (!fail) return false;
  std::fprintf(stderr, "cuda_emu: injected a failure into %s%s%s (call %llu of its kind, %llu of all)\n", call,
               detail ? " " : "", detail ? detail : "", mine, all);
  return true;
}

}  // namespace emu

void cuda_emu_fail_next(const char* kind) {
  Faults& f = faults();
  std::lock_guard<std::mutex> lock(f.mu);
  f.fail_at[kind] = f.count[kind] + 1;
}

unsigned long long cuda_emu_calls(const char* kind) {
  Faults& f = faults();
  std::lock_guard<std::mutex> lock(f.mu);
  auto it = f.count.find(kind);
  return it == f.count.end() ? 0 : it->second;
}

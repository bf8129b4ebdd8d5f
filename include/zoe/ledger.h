// The memory ledger: bytes per tier and kind, current and peak. Model states (param, grad,
// master, exp_avg, exp_avg_sq) are "persistent"; everything else (gathers, activations, comm
// buffers, staging) is transient and shows only in the peaks.
#pragma once
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace zoe {

enum class Tier : uint8_t { kDevice = 0, kHost = 1, kNvme = 2 };
inline constexpr int kNumTiers = 3;
enum class Kind : uint8_t {
  kParam = 0, kGrad, kMaster, kExpAvg, kExpAvgSq,       // persistent model states
  kGather, kActivation, kComm, kStaging                // transient
};
inline constexpr int kNumKinds = 9;
inline constexpr int kNumPersistentKinds = 5;

std::string_view tier_name(Tier t);
std::string_view kind_name(Kind k);  // "param", "grad", "master", "exp_avg", "exp_avg_sq", ...

struct LedgerSnapshot {
  std::array<std::array<uint64_t, kNumKinds>, kNumTiers> bytes{};  // [tier][kind], now
  std::array<uint64_t, kNumTiers> peak{};                           // peak of all kinds per tier
  uint64_t persistent(Tier t) const;
};

class Ledger {
 public:
  void add(Tier t, Kind k, uint64_t bytes);
  void sub(Tier t, Kind k, uint64_t bytes);
  LedgerSnapshot snapshot() const;
  void reset_peaks();  // peaks restart from the current totals

 private:
  std::array<std::array<std::atomic<uint64_t>, kNumKinds>, kNumTiers> bytes_{};
  std::array<std::atomic<uint64_t>, kNumTiers> total_{};
  std::array<std::atomic<uint64_t>, kNumTiers> peak_{};
};

}  // namespace zoe

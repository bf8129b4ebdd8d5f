#include "zoe/ledger.h"

namespace zoe {

std::string_view tier_name(Tier t) {
  static constexpr std::string_view kNames[] = {"device", "host", "nvme"};
  return kNames[static_cast<int>(t)];
}

std::string_view kind_name(Kind k) {
  static constexpr std::string_view kNames[] = {"param",  "grad",       "master", "exp_avg", "exp_avg_sq",
                                                "gather", "activation", "comm",   "staging"};
  return kNames[static_cast<int>(k)];
}

uint64_t LedgerSnapshot::persistent(Tier t) const {
  uint64_t s = 0;
  for (int k = 0; k < kNumPersistentKinds; ++k) s += bytes[static_cast<int>(t)][k];
  return s;
}

void Ledger::add(Tier t, Kind k, uint64_t n) {
  int ti = static_cast<int>(t);
  bytes_[ti][static_cast<int>(k)] += n;
  uint64_t now = total_[ti] += n;
  uint64_t p = peak_[ti].load();
  while (now > p && !peak_[ti].compare_exchange_weak(p, now)) {
  }
}

void Ledger::sub(Tier t, Kind k, uint64_t n) {
  int ti = static_cast<int>(t);
  bytes_[ti][static_cast<int>(k)] -= n;
  total_[ti] -= n;
}

LedgerSnapshot Ledger::snapshot() const {
  LedgerSnapshot s;
  for (int t = 0; t < kNumTiers; ++t) {
    for (int k = 0; k < kNumKinds; ++k) s.bytes[t][k] = bytes_[t][k].load();
    s.peak[t] = peak_[t].load();
  }
  return s;
}

void Ledger::reset_peaks() {
  for (int t = 0; t < kNumTiers; ++t) peak_[t] = total_[t].load();
}

}  // namespace zoe

// Counter-based random numbers: value i of stream (seed, stream) is a pure function of the three,
// so initialisation and synthetic data do not depend on which rank computes them or in what order.
#pragma once
#include <cmath>
#include <cstdint>

namespace zoe {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline uint64_t counter_hash(uint64_t seed, uint64_t stream, uint64_t i) {
  return splitmix64(splitmix64(seed ^ splitmix64(stream + 0x632be59bd9b4e019ull)) + i);
}

// Uniform in [0, 1) with 53 random bits.
inline double counter_uniform(uint64_t seed, uint64_t stream, uint64_t i) {
  return static_cast<double>(counter_hash(seed, stream, i) >> 11) * 0x1.0p-53;
}

// Standard normal (Box-Muller on two counter values).
inline double counter_normal(uint64_t seed, uint64_t stream, uint64_t i) {
  double u1 = counter_uniform(seed, stream, 2 * i), u2 = counter_uniform(seed, stream, 2 * i + 1);
  return std::sqrt(-2.0 * std::log1p(-u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace zoe

// round_up: the multiple of `to` at or above `v`: sizes, offsets and addresses rounded up to an
// alignment, a block or a tile. One definition for the storage code, the allocators and kernels.
#pragma once
#include <concepts>

namespace zoe {

template <std::integral T>
constexpr T round_up(T v, T to) {
  return (v + to - 1) / to * to;
}

}  // namespace zoe

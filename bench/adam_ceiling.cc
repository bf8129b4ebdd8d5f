// Adam's memory traffic with no arithmetic. Each ISA's loop moves exactly what the Adam kernel
// of that ISA moves: the same loads and stores, of the same widths, in the same order, with
// streaming stores for the weight copy exactly where the Adam kernel streams it. An empty
// asm statement makes the compiler treat the loaded values as changed, so no load or store
// can be optimised away, without adding a single instruction.
#include "adam_ceiling.h"

// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined_*() (GCC
// bug 105593); the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/adam_kernels.h"
#include "kernels/parallel_chunks.h"

namespace zoe {
namespace {

// Element by element, for the scalar ISA and for tails.
void traffic_scalar(const AdamRange& r, size_t begin, size_t end) {
  const size_t gw = dtype_size(r.grad_dtype), ow = r.param_out ? dtype_size(r.param_dtype) : 0;
  for (size_t i = begin; i < end; ++i) {
    uint32_t g = 0;
    std::memcpy(&g, static_cast<const uint8_t*>(r.grad) + i * gw, gw);
    float p = r.master[i], m = r.exp_avg[i], v = r.exp_avg_sq[i];
    asm volatile("" : "+r"(g), "+x"(p), "+x"(m), "+x"(v));
    r.master[i] = p;
    r.exp_avg[i] = m;
    r.exp_avg_sq[i] = v;
    if (ow) std::memcpy(static_cast<uint8_t*>(r.param_out) + i * ow, &p, ow);
  }
}

template <bool kWideGrad, size_t kOut>
__attribute__((target("avx2"))) void traffic_avx2(const AdamRange& r, size_t begin, size_t end) {
  const size_t body_end = begin + (end - begin) / 8 * 8;
  const bool stream = kOut != 0 && body_end - begin >= kStreamCopyMinElems &&
                      (reinterpret_cast<uintptr_t>(static_cast<uint8_t*>(r.param_out) + begin * kOut) & 63) == 0;
  for (size_t i = begin; i < body_end; i += 8) {
    __m256 p = _mm256_loadu_ps(r.master + i);
    __m256 m = _mm256_loadu_ps(r.exp_avg + i);
    __m256 v = _mm256_loadu_ps(r.exp_avg_sq + i);
    if constexpr (kWideGrad) {
      __m256 g = _mm256_loadu_ps(static_cast<const float*>(r.grad) + i);
      asm volatile("" : "+x"(g), "+x"(p), "+x"(m), "+x"(v));
    } else {
      __m128i g = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(r.grad) + i));
      asm volatile("" : "+x"(g), "+x"(p), "+x"(m), "+x"(v));
    }
    _mm256_storeu_ps(r.master + i, p);
    _mm256_storeu_ps(r.exp_avg + i, m);
    _mm256_storeu_ps(r.exp_avg_sq + i, v);
    if constexpr (kOut == 4) {
      float* dst = static_cast<float*>(r.param_out) + i;
      if (stream) _mm256_stream_ps(dst, p);
      else _mm256_storeu_ps(dst, p);
    }
    if constexpr (kOut == 2) {
      __m128i* dst = reinterpret_cast<__m128i*>(static_cast<uint16_t*>(r.param_out) + i);
      if (stream) _mm_stream_si128(dst, _mm256_castsi256_si128(_mm256_castps_si256(p)));
      else _mm_storeu_si128(dst, _mm256_castsi256_si128(_mm256_castps_si256(p)));
    }
  }
  if (stream) _mm_sfence();
  traffic_scalar(r, body_end, end);
}

template <bool kWideGrad, size_t kOut>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void traffic_avx512(const AdamRange& r, size_t begin,
                                                                           size_t end) {
  const size_t body_end = begin + (end - begin) / 16 * 16;
  const bool stream = kOut != 0 && body_end - begin >= kStreamCopyMinElems &&
                      (reinterpret_cast<uintptr_t>(static_cast<uint8_t*>(r.param_out) + begin * kOut) & 63) == 0;
  for (size_t i = begin; i < body_end; i += 16) {
    __m512 p = _mm512_loadu_ps(r.master + i);
    __m512 m = _mm512_loadu_ps(r.exp_avg + i);
    __m512 v = _mm512_loadu_ps(r.exp_avg_sq + i);
    if constexpr (kWideGrad) {
      __m512 g = _mm512_loadu_ps(static_cast<const float*>(r.grad) + i);
      asm volatile("" : "+v"(g), "+v"(p), "+v"(m), "+v"(v));
    } else {
      __m256i g = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(r.grad) + i));
      asm volatile("" : "+v"(g), "+v"(p), "+v"(m), "+v"(v));
    }
    _mm512_storeu_ps(r.master + i, p);
    _mm512_storeu_ps(r.exp_avg + i, m);
    _mm512_storeu_ps(r.exp_avg_sq + i, v);
    if constexpr (kOut == 4) {
      float* dst = static_cast<float*>(r.param_out) + i;
      if (stream) _mm512_stream_ps(dst, p);
      else _mm512_storeu_ps(dst, p);
    }
    if constexpr (kOut == 2) {
      __m256i* dst = reinterpret_cast<__m256i*>(static_cast<uint16_t*>(r.param_out) + i);
      if (stream) _mm256_stream_si256(dst, _mm512_castsi512_si256(_mm512_castps_si512(p)));
      else _mm256_storeu_si256(dst, _mm512_castsi512_si256(_mm512_castps_si512(p)));
    }
  }
  if (stream) _mm_sfence();
  traffic_scalar(r, body_end, end);
}

using TrafficFn = void (*)(const AdamRange&, size_t, size_t);

// The loop for this ISA, grad width and weight-copy width, picked once per call.
template <bool kWideGrad>
TrafficFn pick_out(Isa isa, size_t out_bytes) {
  if (isa == Isa::kAvx512)
    return out_bytes == 4 ? traffic_avx512<kWideGrad, 4> : out_bytes == 2 ? traffic_avx512<kWideGrad, 2>
                                                                          : traffic_avx512<kWideGrad, 0>;
  if (isa == Isa::kAvx2)
    return out_bytes == 4 ? traffic_avx2<kWideGrad, 4> : out_bytes == 2 ? traffic_avx2<kWideGrad, 2>
                                                                        : traffic_avx2<kWideGrad, 0>;
  return traffic_scalar;
}

}  // namespace

void adam_traffic(const AdamRange& r, Isa isa, int threads) {
  if (r.n == 0) return;
  if (!isa_supported(isa)) isa = Isa::kScalar;
  const size_t out_bytes = r.param_out ? dtype_size(r.param_dtype) : 0;
  const TrafficFn fn = r.grad_dtype == DType::kF32 ? pick_out<true>(isa, out_bytes) : pick_out<false>(isa, out_bytes);
  (void)parallel_chunks(r.n, threads, [&](size_t begin, size_t end) -> size_t {
    fn(r, begin, end);
    return 0;
  });
}

}  // namespace zoe

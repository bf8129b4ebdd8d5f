// Gemm: the host's matrix products. Row-major C[M, N] = op(A)[M, K] · op(B)[K, N] + beta · C, out
// in fp32, inputs fp32 or bf16 (products accumulated in fp32). gemm() runs on the calling thread
// only; gemm_sliced() cuts a product into slices for oneTBB's workers, so no library's own threads
// compete with them, and a result does not depend on the thread count.
//
// Three paths, chosen at run time per dtype (gemm_path):
//   reference  plain loops, fp32 dot products in k order: what the others are tested against;
//   openblas   cblas_sgemm; bf16 inputs are widened to fp32 first (Debian's OpenBLAS has no bf16
//              product): what a CPU without bf16 units does anyway;
//   onednn     dnnl::matmul (primitives cached per shape and thread); bf16 only where oneDNN finds
//              AVX512-BF16 or AMX (on other CPUs it has no bf16 kernel).
// The default is the fastest path measured on each kind of machine (bench/RESULTS.md, "gemm"):
// fp32 through OpenBLAS (on Zen 3 oneDNN is within 10 % of it alone, either way by shape, and at
// half its speed in a process where OpenBLAS's products ran before oneDNN's first large one; the
// cause inside the libraries is not found), bf16 through oneDNN where it can, else OpenBLAS. ZOE_GEMM_F32 / ZOE_GEMM_BF16 (reference | openblas |
// onednn) choose another; a path that cannot run here is an error naming the variable.
#pragma once
#include <cstdint>
#include <string>

#include "zoe/status.h"

namespace zoe {

enum class GemmPath : uint8_t { kReference = 0, kOpenBlas = 1, kOneDnn = 2 };
enum class GemmType : uint8_t { kF32 = 0, kBF16 = 1 };

struct GemmShape {
  bool ta = false, tb = false;  // op(A) = A^T: A is [K, M]; op(B) = B^T: B is [N, K]
  int M = 0, N = 0, K = 0;
  int lda = 0, ldb = 0, ldc = 0;  // row strides, in elements
};

const char* gemm_path_name(GemmPath p);
const char* gemm_type_name(GemmType t);
bool gemm_supported(GemmPath p, GemmType t);  // in this build, on this CPU
// The path this process uses for t: the default or the environment's choice.
Result<GemmPath> gemm_path(GemmType t);
// What oneDNN finds on this CPU ("avx2", "avx512_core_bf16", "avx512_core_amx", ...; "absent"
// when the build has no oneDNN).
std::string gemm_onednn_isa();

// A and B hold fp32 (kF32) or bf16 bit patterns (kBF16, as uint16_t). bias (N floats, or null) is
// added to every row of C: oneDNN's bias argument, a seeding of C on the other paths. An
// unsupported path is kUnsupported; nothing else fails but an allocation inside oneDNN.
Status gemm(GemmPath p, GemmType t, const GemmShape& s, const void* A, const void* B, float beta, float* C,
            const float* bias = nullptr);

// The same product with C in bf16 (bit patterns): each element is the fp32 result, bias included,
// rounded to nearest even (f32_to_bf16); C is written, never read. oneDNN writes it so itself
// from bf16 operands; the other cases round their fp32 result.
Status gemm(GemmPath p, GemmType t, const GemmShape& s, const void* A, const void* B, uint16_t* C,
            const float* bias = nullptr);

// The same product in slices of about 256 rows (oneDNN), or 256 columns or rows, whichever side of
// C is longer (the other paths), in an even count of equal widths, that oneTBB's workers take as they come free, each one single-threaded
// gemm(). A BLAS's own threads would split a product once, in equal parts, and spin after it:
// where an I/O or optimizer thread takes a core for a while (offload on a few cores), one part
// waited for the other and the spinning took CPU from both. The slices depend on the shape
// alone: each element of C is one dot product over all of K whatever the thread count. A slice
// whose path fails (oneDNN out of memory) is computed by OpenBLAS instead; the first such error
// is returned, the product whole.
Status gemm_sliced(GemmPath p, GemmType t, const GemmShape& s, const void* A, const void* B, float beta, float* C,
                   const float* bias = nullptr);
Status gemm_sliced(GemmPath p, GemmType t, const GemmShape& s, const void* A, const void* B, uint16_t* C,
                   const float* bias = nullptr);

// The whole product on the library's own `threads` threads (oneDNN's OpenMP team, OpenBLAS's
// pthreads; other paths and OpenBLAS's widened bf16: gemm() on the calling thread): what the
// library does with the shape alone, for `zoe bench gemm` to hold the slices against. A result
// may depend on the thread count; the model never calls it.
Status gemm_threaded(GemmPath p, GemmType t, const GemmShape& s, const void* A, const void* B, float beta, float* C,
                     int threads);

}  // namespace zoe

#include "model/model.h"

#include <tbb/parallel_for.h>

namespace zoe {

void weights_to_f32(const void* src, DType dtype, int64_t n, float* dst) {
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, 1 << 15), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t i = r.begin(); i < r.end(); ++i) dst[i] = load_as_f32(src, dtype, i);
  });
}

}  // namespace zoe

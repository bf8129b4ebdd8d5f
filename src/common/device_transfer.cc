// Transfers between device memory and the host built from Device's own calls.
#include "zoe/device.h"

namespace zoe {

Status download_f32(Device& d, float* host_dst, const void* src, DType dtype, size_t n) {
  if (dtype == DType::kF32) return d.download(host_dst, src, n * 4);
  ZOE_ASSIGN_OR_RETURN(Buffer staging, d.alloc(n * 4, Tier::kDevice, Kind::kStaging));
  Status st = d.accumulate(staging.data, DType::kF32, src, dtype, n, false);
  if (st.ok()) st = d.download(host_dst, staging.data, n * 4);
  d.free(staging);
  return st;
}

}  // namespace zoe

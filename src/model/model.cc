#include "model/model.h"

#include "zoe/device.h"

namespace zoe {

Status fetch_to_host(Engine& e, int u, float* dst) {
  Device& d = e.device();
  ZOE_ASSIGN_OR_RETURN(ParamView p, e.fetch(u));
  Result<Buffer> staging = d.alloc(p.numel * 4, Tier::kDevice, Kind::kStaging);
  Status st = staging.status();
  if (st.ok()) st = d.accumulate(staging->data, DType::kF32, p.data, p.dtype, p.numel, false);
  if (st.ok()) st = d.download(dst, staging->data, p.numel * 4);
  if (staging.ok()) d.free(*staging);
  Status rel = e.release(u);
  return st.ok() ? rel : st;
}

Status grads_from_host(Engine& e, int u, const float* grad) {
  Device& d = e.device();
  const int64_t n = e.unit(u).numel;
  ZOE_ASSIGN_OR_RETURN(Buffer g, d.alloc(n * 4, Tier::kDevice, Kind::kStaging));
  Status st = d.upload(g.data, grad, n * 4);
  if (st.ok()) st = e.grads_ready(u, g.as<float>());
  d.free(g);
  return st;
}

}  // namespace zoe

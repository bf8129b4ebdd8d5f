#include "model/model.h"

#include <vector>

#include <fmt/format.h>

#include "zoe/device.h"

namespace zoe {

Status fetch_to_host(Engine& e, int u, float* dst) {
  ZOE_ASSIGN_OR_RETURN(ParamView p, e.fetch(u));
  Status st = download_f32(e.device(), dst, p.data, p.dtype, p.numel);
  Status rel = e.release(u);
  return st.ok() ? rel : st;
}

Status init_params(Engine& e, const Model& model, uint64_t seed) {
  std::vector<float> buf;
  for (int u = 0; u < e.num_units(); ++u) {
    buf.resize(e.unit(u).numel);
    model.init_unit(u, seed, buf.data());
    ZOE_RETURN_IF_ERROR(e.set_params(u, buf.data()));
  }
  return Status::Ok();
}

Status grads_from_host(Engine& e, int u, const float* grad) {
  Device& d = e.device();
  const int64_t n = e.unit(u).numel;
  Result<Buffer> got = d.alloc(n * 4, Tier::kDevice, Kind::kStaging);
  if (!got.ok())
    return got.status().prefixed(
        fmt::format("unit '{}': the device buffer its gradient is handed over from ({} bytes): ", e.unit(u).name, n * 4));
  Buffer g = *got;
  Status st = d.upload(g.data, grad, n * 4);
  if (st.ok()) st = e.grads_ready(u, g.as<float>());
  d.free(g);
  return st;
}

}  // namespace zoe

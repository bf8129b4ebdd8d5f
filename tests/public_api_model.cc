#include "public_api_model.h"

#include <vector>

#include "zoe/device.h"

namespace public_api {

std::vector<zoe::UnitSpec> quadratic_units(int64_t n) { return {zoe::make_unit("w", {{"w", {n}}})}; }

zoe::Result<double> quadratic_step(zoe::Engine& e, double lr) {
  zoe::Device& dev = e.device();
  ZOE_ASSIGN_OR_RETURN(zoe::ParamView w, e.fetch(0));
  std::vector<float> host(static_cast<size_t>(w.numel));
  ZOE_RETURN_IF_ERROR(zoe::download_f32(dev, host.data(), w.data, w.dtype, host.size()));
  double loss = 0;
  for (float x : host) loss += 0.5 * double{x} * x;
  const size_t bytes = host.size() * sizeof(float);
  ZOE_ASSIGN_OR_RETURN(zoe::Buffer grad, dev.alloc(bytes, zoe::Tier::kDevice, zoe::Kind::kActivation));
  zoe::Status st = dev.upload(grad.data, host.data(), bytes);  // d loss / d w = w
  if (st.ok()) st = e.grads_ready(0, grad.as<float>());
  if (st.ok()) st = e.release(0);
  zoe::Result<zoe::StepResult> r = st.ok() ? e.step(lr) : zoe::Result<zoe::StepResult>(st);
  if (r.ok()) r = e.flush();
  dev.free(grad);  // after the step: the engine may read a handed-over gradient until then
  ZOE_RETURN_IF_ERROR(r.status());
  return loss;
}

}  // namespace public_api

// GPT-2 unit layout and default initialization.
#include "model/gpt2_config.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "ops/gpt2_ops_util.h"

namespace zoe::gpt2 {

Status validate_shape(const Gpt2Shape& s) {
  if (s.n_layer < 1 || s.n_head < 1 || s.n_embd < 1 || s.vocab_size < 1 || s.n_positions < 1)
    return Status::Invalid("gpt2 shape: every size must be positive");
  if (s.n_embd % s.n_head != 0)
    return Status::Invalid("gpt2 shape: n_embd " + std::to_string(s.n_embd) +
                           " is not divisible by n_head " + std::to_string(s.n_head));
  return Status::Ok();
}

int num_units(const Gpt2Shape& s) { return s.n_layer + 2; }

std::string unit_name(const Gpt2Shape& s, int unit) {
  if (unit < 0 || unit >= num_units(s)) return "";
  if (unit == 0) return "embed";
  if (unit == s.n_layer + 1) return "ln_f";
  return "h." + std::to_string(unit - 1);
}

std::vector<TensorSpec> unit_tensors(const Gpt2Shape& s, int unit) {
  if (unit < 0 || unit >= num_units(s)) return {};
  const int64_t C = s.n_embd;
  std::vector<std::pair<std::string, std::vector<int64_t>>> list;
  if (unit == 0) {
    list = {{"wte.weight", {s.vocab_size, C}}, {"wpe.weight", {s.n_positions, C}}};
  } else if (unit == s.n_layer + 1) {
    list = {{"ln_f.weight", {C}}, {"ln_f.bias", {C}}};
  } else {
    const std::string p = unit_name(s, unit) + ".";
    list = {{p + "ln_1.weight", {C}},           {p + "ln_1.bias", {C}},
            {p + "attn.c_attn.weight", {C, 3 * C}}, {p + "attn.c_attn.bias", {3 * C}},
            {p + "attn.c_proj.weight", {C, C}},  {p + "attn.c_proj.bias", {C}},
            {p + "ln_2.weight", {C}},           {p + "ln_2.bias", {C}},
            {p + "mlp.c_fc.weight", {C, 4 * C}},  {p + "mlp.c_fc.bias", {4 * C}},
            {p + "mlp.c_proj.weight", {4 * C, C}}, {p + "mlp.c_proj.bias", {C}}};
  }
  std::vector<TensorSpec> out;
  int64_t offset = 0;
  for (auto& [name, shape] : list) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    out.push_back({name, shape, n, offset, shape.size() >= 2});
    offset += n;
  }
  return out;
}

int64_t unit_numel(const Gpt2Shape& s, int unit) {
  const auto t = unit_tensors(s, unit);
  return t.empty() ? 0 : t.back().offset + t.back().numel;
}

int64_t total_numel(const Gpt2Shape& s) {
  int64_t n = 0;
  for (int u = 0; u < num_units(s); u++) n += unit_numel(s, u);
  return n;
}

namespace {

// splitmix64's output function; applied to state + k*gamma it gives splitmix64's k-th number.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ull;

enum class Fill { kNormal, kZero, kOne };

Fill fill_of(const std::string& name) {
  auto ends = [&](const char* suf) { return name.ends_with(suf); };
  if (ends(".bias")) return Fill::kZero;
  if (name.find("ln_") != std::string::npos) return Fill::kOne;  // ln_1/ln_2/ln_f .weight
  return Fill::kNormal;
}

}  // namespace

double init_normal(uint64_t seed, int unit, int64_t e) {
  // The (seed, unit) pair picks a stream; element e takes its numbers 2e+1 and 2e+2.
  const uint64_t stream = mix64(mix64(seed + kGamma) ^ (static_cast<uint64_t>(unit) * kGamma));
  const uint64_t a = mix64(stream + (2 * static_cast<uint64_t>(e) + 1) * kGamma);
  const uint64_t b = mix64(stream + (2 * static_cast<uint64_t>(e) + 2) * kGamma);
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]: log is finite
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;          // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

void init_unit(const Gpt2Shape& s, int unit, uint64_t seed, float* buf) {
  for (const TensorSpec& t : unit_tensors(s, unit)) {
    float* p = buf + t.offset;
    const Fill f = fill_of(t.name);
    if (f != Fill::kNormal) {
      std::fill(p, p + t.numel, f == Fill::kOne ? 1.f : 0.f);
      continue;
    }
    const bool residual_proj = t.name.ends_with("c_proj.weight");
    const double std = residual_proj ? 0.02 / std::sqrt(2.0 * s.n_layer) : 0.02;
    detail::parallel_range(t.numel, 4096, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; i++)
        p[i] = static_cast<float>(std * init_normal(seed, unit, t.offset + i));
    });
  }
}

}  // namespace zoe::gpt2

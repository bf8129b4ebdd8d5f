// GPT-2 shape, the parameter layout of each engine unit, and the default initialization.
//
// Units, in model order (a unit is what the engine stores, shards and streams as one flat fp32
// buffer; its tensors lie in the order below, contiguous, no padding):
//   unit 0       "embed": wte.weight [V,C], wpe.weight [maxT,C]
//   unit 1..L    "h.{i}" (i = unit-1): h.{i}.ln_1.weight [C], .ln_1.bias [C],
//                .attn.c_attn.weight [C,3C], .attn.c_attn.bias [3C],
//                .attn.c_proj.weight [C,C], .attn.c_proj.bias [C], .ln_2.weight [C], .ln_2.bias [C],
//                .mlp.c_fc.weight [C,4C], .mlp.c_fc.bias [4C], .mlp.c_proj.weight [4C,C],
//                .mlp.c_proj.bias [C]
//   unit L+1     "ln_f":  ln_f.weight [C], ln_f.bias [C]
// Names and shapes are Hugging Face's (Conv1D weights are [in, out]); the LM head is wte.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "zoe/status.h"

namespace zoe::gpt2 {

struct Gpt2Shape {  // defaults: GPT-2 small (124M)
  int n_layer = 12;
  int n_head = 12;
  int n_embd = 768;
  int vocab_size = 50257;
  int n_positions = 1024;
};

// Ok, or why the shape is unusable (non-positive sizes, n_embd not divisible by n_head).
Status validate_shape(const Gpt2Shape& s);

struct TensorSpec {
  std::string name;            // HF name, e.g. "h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;  // row-major
  int64_t numel = 0;
  int64_t offset = 0;          // in elements, within the unit's flat buffer
  bool weight_decay = false;   // true for tensors with 2+ dims (matrices and embeddings)
};

// Units are numbered [0, num_units); for a unit outside that range unit_name is "",
// unit_tensors is empty and unit_numel is 0.
int num_units(const Gpt2Shape& s);                    // n_layer + 2
std::string unit_name(const Gpt2Shape& s, int unit);  // "embed", "h.{i}", "ln_f"
std::vector<TensorSpec> unit_tensors(const Gpt2Shape& s, int unit);
int64_t unit_numel(const Gpt2Shape& s, int unit);
int64_t total_numel(const Gpt2Shape& s);          // 124,439,808 for GPT-2 small

// Fills the unit's flat fp32 buffer (unit_numel floats) with GPT-2's default init:
// normal(0, 0.02); attn.c_proj.weight and mlp.c_proj.weight normal(0, 0.02/sqrt(2*n_layer));
// biases 0; LayerNorm weights 1.
// Element e of the unit draws from a counter-based stream: splitmix64 keyed by
// (seed, unit, e) then Box-Muller. No state is carried between elements, so the result depends
// only on (seed, unit, e): any rank, thread count or order of units gives the same weights.
void init_unit(const Gpt2Shape& s, int unit, uint64_t seed, float* buf);

// The standard normal number that init_unit scales for element e of `unit` (exposed for tests).
double init_normal(uint64_t seed, int unit, int64_t e);

}  // namespace zoe::gpt2

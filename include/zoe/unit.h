// Units: what a model uses together (an embedding, one transformer block). A model describes its
// parameters as units of named tensors; the engine shards and streams them unit by unit.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace zoe {

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;   // element offset inside the unit's flat buffer
  int64_t numel = 0;
  bool decay = false;   // weight decay applies (tensors of two or more dimensions)
};

struct UnitSpec {
  std::string name;
  std::vector<TensorSpec> tensors;  // contiguous, in order
  int64_t numel = 0;
};

// Builds a unit from (name, shape) pairs: offsets packed in order, decay = (rank >= 2).
UnitSpec make_unit(std::string name, const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors);

}  // namespace zoe

// Writes a safetensors file (format in ckpt/safetensors.h) crash-safely through AtomicFile.
// Tensors are laid out in the order added; the header is padded with spaces to a multiple of
// 8 bytes, so the data buffer starts 8-byte aligned.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_set>
#include <vector>

#include "ckpt/safetensors.h"
#include "zoe/dtype.h"
#include "zoe/status.h"

namespace zoe {

class AtomicFile;

class SafetensorsWriter {
 public:
  // Records a tensor; its numel * element-size bytes at `data` are not copied and must stay
  // valid until write() returns. Invalid for an empty, reserved ("__metadata__") or repeated
  // name, a negative dim, or null data for a non-empty tensor.
  Status add(std::string name, StDType dtype, std::vector<int64_t> shape, const void* data);
  Status add(std::string name, DType dtype, std::vector<int64_t> shape, const void* data) {
    return add(std::move(name), st_dtype_of(dtype), std::move(shape), data);
  }
  // Records a tensor whose bytes `fill` appends to the file at write() time, so that a large one
  // streams from where it lives instead of sitting whole in memory; fill must append exactly
  // numel * element-size bytes.
  using Fill = std::function<Status(AtomicFile&)>;
  Status add_streamed(std::string name, DType dtype, std::vector<int64_t> shape, Fill fill);
  void set_metadata(std::string key, std::string value);  // replaces an earlier value of key

  // Writes the file atomically; on success stores the file's xxh3-64 hex in *checksum if given.
  Status write(const std::string& path, std::string* checksum = nullptr) const;

  size_t num_tensors() const { return tensors_.size(); }

 private:
  struct Entry {
    StTensorInfo info;
    const void* data;
    Fill fill;  // set instead of data for add_streamed
  };
  std::vector<Entry> tensors_;
  std::unordered_set<std::string> names_;  // a model's many tensors: the duplicate check stays linear
  std::vector<std::pair<std::string, std::string>> metadata_;
  uint64_t buffer_bytes_ = 0;

  Status add_entry(std::string name, StDType dtype, std::vector<int64_t> shape, const void* data, Fill fill);
};

}  // namespace zoe

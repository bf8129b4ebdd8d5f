// Writes a safetensors file (format in ckpt/safetensors.h) crash-safely through AtomicFile.
// Tensors are laid out in the order added; the header is padded with spaces to a multiple of
// 8 bytes, so the data buffer starts 8-byte aligned.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/safetensors.h"
#include "zoe/dtype.h"
#include "zoe/status.h"

namespace zoe {

class SafetensorsWriter {
 public:
  // Records a tensor; its numel * element-size bytes at `data` are not copied and must stay
  // valid until write() returns. Invalid for an empty, reserved ("__metadata__") or repeated
  // name, a negative dim, or null data for a non-empty tensor.
  Status add(std::string name, StDType dtype, std::vector<int64_t> shape, const void* data);
  Status add(std::string name, DType dtype, std::vector<int64_t> shape, const void* data) {
    return add(std::move(name), st_dtype_of(dtype), std::move(shape), data);
  }
  void set_metadata(std::string key, std::string value);  // replaces an earlier value of key

  // Writes the file atomically; on success stores the file's xxh3-64 hex in *checksum if given.
  Status write(const std::string& path, std::string* checksum = nullptr) const;

  size_t num_tensors() const { return tensors_.size(); }

 private:
  struct Entry {
    StTensorInfo info;
    const void* data;
  };
  std::vector<Entry> tensors_;
  std::vector<std::pair<std::string, std::string>> metadata_;
  uint64_t buffer_bytes_ = 0;
};

}  // namespace zoe

// LazyLibrary: a shared library opened at its first use, not when the program starts.
//
// Linked normally, cuBLASLt (half a gigabyte) is loaded and relocated by every process that links
// the CUDA backend: ~55 ms of CPU at each start of `zoe`, of a test, of a Python rank, whether or
// not it touches a GPU. Its entry points are instead defined by zoe (cublaslt_library.cc), and
// each resolves the library's own on its first call through one of these.
#pragma once

#include <mutex>
#include <string>
#include <vector>

namespace zoe::gpu {

class LazyLibrary {
 public:
  // `paths` are tried in order (an absolute path, or a name the loader searches for).
  explicit LazyLibrary(std::vector<std::string> paths);
  ~LazyLibrary();
  LazyLibrary(const LazyLibrary&) = delete;
  LazyLibrary& operator=(const LazyLibrary&) = delete;

  // The library's `name`, opening the library first if needed; nullptr when it or the name is
  // missing (error() then says why).
  void* symbol(const char* name);
  // Whether the library is open now (without opening it).
  bool loaded() const;
  // What the last failure was: every path tried and the loader's reason ("" if none failed).
  std::string error() const;

 private:
  void open();

  const std::vector<std::string> paths_;
  std::once_flag opened_;
  void* handle_ = nullptr;
  mutable std::mutex mu_;
  std::string error_;
};

}  // namespace zoe::gpu

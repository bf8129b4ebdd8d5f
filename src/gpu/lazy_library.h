// LazyLibrary: a shared library opened at its first use, not when the program starts.
//
// Linked normally, cuBLASLt (half a gigabyte) is loaded and relocated by every process that links
// the CUDA backend: ~55 ms of CPU at each start of `zoe`, of a test, of a Python rank, whether or
// not it touches a GPU; NCCL, cuDNN and NVRTC add ~4 ms, and a binary linked to them does not
// start at all where one is missing (a single GPU needs no NCCL; zoe's own kernels replace
// cuDNN's). Their entry points are instead defined by zoe (cublaslt_library.cc, nccl_library.cc,
// cudnn_library.cc, nvrtc_library.cc), and each resolves the library's own on its first call
// through one of these; where the library cannot load, the call fails with the library's own
// error code and its error-string function names the file and the loader's reason.
#pragma once

#include <mutex>
#include <string>
#include <vector>

namespace zoe::gpu {

class LazyLibrary {
 public:
  // `paths` are tried in order (an absolute path, or a name the loader searches for); a copy one
  // of them names that the process has already loaded (another library's dependency: PyTorch's
  // NCCL in a Python rank) is used before any is opened.
  explicit LazyLibrary(std::vector<std::string> paths);
  // The paths for a library: $`env` alone where it is set (a file elsewhere); else the file the
  // build found (`built`), then whatever the loader finds by `soname`.
  static std::vector<std::string> candidates(const char* env, const char* built, const char* soname);
  ~LazyLibrary();
  LazyLibrary(const LazyLibrary&) = delete;
  LazyLibrary& operator=(const LazyLibrary&) = delete;

  // The library's `name`, opening the library first if needed; nullptr when it or the name is
  // missing (error() then says why).
  void* symbol(const char* name);
  // symbol() as a pointer to a function of type F.
  template <typename F>
  F* function(const char* name) {
    return reinterpret_cast<F*>(symbol(name));
  }
  // Whether the library is open now (without opening it).
  bool loaded() const;
  // The file the loader opened ("" while not loaded).
  std::string path() const;
  // For `zoe info`: "<name> <major>.<minor>.<patch> (<path>)" from a version code of the NVIDIA
  // libraries' form (major * 10000 + minor * 100 + patch; 0: not loaded), else "<name> not loaded:
  // <error()>".
  std::string describe(const char* name, long version) const;
  // What the last failure was: every path tried and the loader's reason ("" if none failed).
  std::string error() const;
  // error() for a C API's error-string function: valid until the library's next failure.
  const char* error_text() const;

 private:
  void open();

  const std::vector<std::string> paths_;
  std::once_flag opened_;
  void* handle_ = nullptr;
  mutable std::mutex mu_;
  std::string error_;
};

}  // namespace zoe::gpu

// The body of zoe's definition of the library function `name` (declared by the library's header, so
// a signature that differs does not compile): resolves the library's own `name` in the LazyLibrary
// `lib` at the first call and forwards the arguments to it; returns `failed` where it cannot.
#define ZOE_LAZY_FORWARD(lib, failed, name, ...)                 \
  static auto* const real = (lib).function<decltype(name)>(#name); \
  if (real == nullptr) return failed;                           \
  return real(__VA_ARGS__)

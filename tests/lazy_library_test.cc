// LazyLibrary, and the GPU's libraries (cuBLASLt, NCCL, cuDNN, NVRTC) loaded at their first call
// rather than with the process (CUDA builds).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#if defined(ZOE_HAVE_CUDA) && !defined(ZOE_CUDA_EMU)
#include <cublasLt.h>
#include <link.h>
#include <nccl.h>

#include "gpu/cublaslt_library.h"
#include "gpu/lazy_library.h"
#include "gpu/nccl_library.h"
#ifdef ZOE_HAVE_CUDNN
#include <cudnn.h>
#include <nvrtc.h>

#include "gpu/cudnn_attention.h"
#include "gpu/cudnn_library.h"
#endif

namespace zoe::gpu {
namespace {

// Whether a library whose file name contains `name` is mapped into this process.
bool mapped(const std::string& name) {
  struct Find {
    std::string name;
    bool found = false;
  } find{name};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* f = static_cast<Find*>(data);
        if (info->dlpi_name && std::string(info->dlpi_name).find(f->name) != std::string::npos) f->found = true;
        return 0;
      },
      &find);
  return find.found;
}

// The libraries a death test's child (a fresh run of this binary) finds mapped before any call.
std::string mapped_at_start() {
  std::string found;
  for (const char* name : {"libcublasLt", "libnccl", "libcudnn", "libnvrtc"})
    if (mapped(name)) found += std::string(found.empty() ? "" : " ") + name;
  return found;
}

// None of them is linked: a process that never calls one never loads it, and a job on one GPU
// starts where NCCL or cuDNN is not installed.
TEST(GpuLibrariesDeathTest, NoneIsLoadedWithTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the child runs this binary afresh
  auto child = [] {
    const std::string found = mapped_at_start();
    std::fprintf(stderr, "mapped at start: [%s]\n", found.c_str());
    std::exit(found.empty() ? 0 : 1);
  };
  EXPECT_EXIT(child(), ::testing::ExitedWithCode(0), "mapped at start: \\[\\]");
}

TEST(LazyLibrary, OpensAtTheFirstSymbolTryingEachPathInTurn) {
  LazyLibrary lib({"/nonexistent/libzoe-none.so", "libz.so.1"});
  EXPECT_FALSE(lib.loaded());
  EXPECT_NE(lib.symbol("zlibVersion"), nullptr) << lib.error();
  EXPECT_TRUE(lib.loaded());
  EXPECT_EQ(lib.symbol("zoe_no_such_function"), nullptr);
  EXPECT_NE(lib.error().find("zoe_no_such_function"), std::string::npos) << lib.error();
}

TEST(LazyLibrary, ALibraryThatCannotLoadNamesEveryPathTried) {
  LazyLibrary lib({"/nonexistent/libzoe-a.so", "libzoe-b-nowhere.so.7"});
  EXPECT_EQ(lib.symbol("anything"), nullptr);
  EXPECT_FALSE(lib.loaded());
  EXPECT_NE(lib.error().find("/nonexistent/libzoe-a.so"), std::string::npos) << lib.error();
  EXPECT_NE(lib.error().find("libzoe-b-nowhere.so.7"), std::string::npos) << lib.error();
}

// A process that links the CUDA backend but never calls cuBLASLt never maps it (~55 ms of CPU at
// every start); its first call loads the library this build was made against.
TEST(CublasLtLibrary, LoadsAtItsFirstCallNotWithTheProcess) {
  EXPECT_FALSE(mapped("libcublasLt")) << "cuBLASLt was loaded before any call";
  EXPECT_FALSE(cublaslt_loaded());
  const size_t version = cublasLtGetVersion();
  EXPECT_TRUE(cublaslt_loaded());
  EXPECT_TRUE(mapped("libcublasLt"));
  EXPECT_EQ(version / 10000, size_t{CUBLAS_VER_MAJOR}) << version;
  EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_SUCCESS), "CUBLAS_STATUS_SUCCESS");
}

// A cuBLASLt that cannot load: every call is NOT_INITIALIZED and the status text names the file
// (what the ops' status, and so the step's line, says). In a child process: the library is
// resolved once per process.
TEST(CublasLtLibraryDeathTest, ALibraryThatCannotLoadIsAStatusNamingTheFile) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto child = [] {
    setenv("ZOE_CUBLASLT_LIBRARY", "/nonexistent/libcublasLt.so.13", 1);
    cublasLtHandle_t handle = nullptr;
    const cublasStatus_t s = cublasLtCreate(&handle);
    std::fprintf(stderr, "status %s: %s\n", cublasLtGetStatusName(s), cublasLtGetStatusString(s));
    std::exit(s == CUBLAS_STATUS_NOT_INITIALIZED && !cublaslt_loaded() && cublasLtGetVersion() == 0 ? 0 : 1);
  };
  EXPECT_EXIT(child(), ::testing::ExitedWithCode(0),
              "status CUBLAS_STATUS_NOT_INITIALIZED: could not load /nonexistent/libcublasLt.so.13: "
              "/nonexistent/libcublasLt.so.13: cannot open shared object file");
}

// A copy of the library already in the process (as PyTorch's NCCL is in a Python rank) is the one
// used, not a second copy from another path.
TEST(LazyLibrary, UsesACopyTheProcessHasAlreadyLoaded) {
  ASSERT_TRUE(mapped("libz.so"));  // (a dependency of this binary's libraries)
  LazyLibrary lib({"/nonexistent/elsewhere/libz.so.1", "libz.so.1"});
  EXPECT_NE(lib.symbol("zlibVersion"), nullptr) << lib.error();
  EXPECT_EQ(lib.error(), "");  // the first path was never tried
}

// NCCL loads at its first call, the one this build found.
TEST(NcclLibrary, LoadsAtItsFirstCall) {
  EXPECT_FALSE(nccl_loaded());
  EXPECT_STREQ(ncclGetErrorString(ncclSuccess), "no error");
  EXPECT_TRUE(nccl_loaded());
  EXPECT_TRUE(mapped("libnccl"));
}

// An NCCL that cannot load: a call is ncclSystemError and the error strings, which NcclComm's
// status carries to the job's error line, name the file.
TEST(NcclLibraryDeathTest, ALibraryThatCannotLoadIsAnErrorNamingTheFile) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto child = [] {
    setenv("ZOE_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
    ncclUniqueId id;
    const ncclResult_t r = ncclGetUniqueId(&id);
    std::fprintf(stderr, "result %d: %s | last: %s\n", int(r), ncclGetErrorString(r), ncclGetLastError(nullptr));
    std::exit(r == ncclSystemError && !nccl_loaded() ? 0 : 1);
  };
  EXPECT_EXIT(child(), ::testing::ExitedWithCode(0),
              "result 2: could not load /nonexistent/libnccl.so.2: /nonexistent/libnccl.so.2: cannot open shared "
              "object file.* \\| last: could not load /nonexistent/libnccl.so.2");
}

#ifdef ZOE_HAVE_CUDNN
// cuDNN loads at its first call (the one the build found, so its version is the header's major).
TEST(CudnnLibrary, LoadsAtItsFirstCall) {
  EXPECT_FALSE(cudnn_loaded());
  const size_t version = cudnnGetVersion();
  EXPECT_TRUE(cudnn_loaded());
  EXPECT_EQ(version / 10000, size_t{CUDNN_MAJOR}) << version;
  EXPECT_EQ(cudnn_load_error(), "");
}

// A cuDNN that cannot load: `zoe info` and the attention's create() name the file, and create()'s
// failure is what CudaModelOps answers by running zoe's own kernels.
TEST(CudnnLibraryDeathTest, ALibraryThatCannotLoadIsNamedAndRefusesTheAttention) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto child = [] {
    setenv("ZOE_CUDNN_LIBRARY", "/nonexistent/libcudnn.so.9", 1);
    std::unique_ptr<CudnnAttention> attention;
    const Status s = CudnnAttention::create(nullptr, cuda_raw_memory(), &attention);
    char last[64];
    cudnnGetLastErrorString(last, sizeof last);
    std::fprintf(stderr, "version: %s | create: %s | last: %s\n", CudnnAttention::version_text().c_str(),
                 s.message().c_str(), last);
    std::exit(s.code() == Code::kUnsupported && !attention && !cudnn_loaded() && std::strlen(last) == 63 ? 0 : 1);
  };
  EXPECT_EXIT(child(), ::testing::ExitedWithCode(0),
              "version: cuDNN not loaded \\(built against [0-9.]+; frontend [0-9.]+\\): could not load "
              "/nonexistent/libcudnn.so.9: .* \\| create: cudnnCreate: could not load /nonexistent/libcudnn.so.9: .*"
              "\\(1008\\) \\| last: could not load /nonexistent/libcudnn.so.9: /nonexistent/libcudn\n");
}

// NVRTC (cuDNN's frontend's run-time-compiled engines) loads at its first call, and every entry
// point the frontend calls forwards to it: a kernel compiled for Hopper without a GPU.
TEST(NvrtcLibrary, CompilesAKernelThroughItsEntryPoints) {
  EXPECT_FALSE(mapped("libnvrtc"));
  nvrtcProgram prog = nullptr;
  ASSERT_EQ(nvrtcCreateProgram(&prog, "extern \"C\" __global__ void k(float* x) { x[0] = 1.f; }", "k.cu", 0,
                               nullptr, nullptr),
            NVRTC_SUCCESS);
  EXPECT_TRUE(mapped("libnvrtc"));
  const char* options[] = {"--gpu-architecture=sm_90"};
  const nvrtcResult compiled = nvrtcCompileProgram(prog, 1, options);
  size_t log_size = 0;
  ASSERT_EQ(nvrtcGetProgramLogSize(prog, &log_size), NVRTC_SUCCESS);
  std::string log(log_size, '\0');
  ASSERT_EQ(nvrtcGetProgramLog(prog, log.data()), NVRTC_SUCCESS);
  ASSERT_EQ(compiled, NVRTC_SUCCESS) << log;
  size_t cubin_size = 0;
  ASSERT_EQ(nvrtcGetCUBINSize(prog, &cubin_size), NVRTC_SUCCESS);
  ASSERT_GT(cubin_size, 0u);
  std::string cubin(cubin_size, '\0');
  ASSERT_EQ(nvrtcGetCUBIN(prog, cubin.data()), NVRTC_SUCCESS);
  EXPECT_EQ(cubin.substr(1, 3), "ELF");
  EXPECT_EQ(nvrtcDestroyProgram(&prog), NVRTC_SUCCESS);
}

TEST(NvrtcLibraryDeathTest, ALibraryThatCannotLoadIsAnError) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto child = [] {
    setenv("ZOE_NVRTC_LIBRARY", "/nonexistent/libnvrtc.so.13", 1);
    nvrtcProgram prog = nullptr;
    const nvrtcResult r = nvrtcCreateProgram(&prog, "", "k.cu", 0, nullptr, nullptr);
    std::fprintf(stderr, "result %d\n", int(r));
    std::exit(r == NVRTC_ERROR_INTERNAL_ERROR && !mapped("libnvrtc") ? 0 : 1);
  };
  EXPECT_EXIT(child(), ::testing::ExitedWithCode(0), "result 11");
}
#endif

}  // namespace
}  // namespace zoe::gpu

#else
TEST(LazyLibrary, OnlyInACudaBuild) { GTEST_SKIP() << "no CUDA backend in this build (or its emulation)"; }
#endif

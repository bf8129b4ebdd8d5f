// LazyLibrary, and cuBLASLt loaded at its first call rather than with the process (CUDA builds).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#if defined(ZOE_HAVE_CUDA) && !defined(ZOE_CUDA_EMU)
#include <cublasLt.h>
#include <link.h>

#include "gpu/cublaslt_library.h"
#include "gpu/lazy_library.h"

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

}  // namespace
}  // namespace zoe::gpu

#else
TEST(LazyLibrary, OnlyInACudaBuild) { GTEST_SKIP() << "no CUDA backend in this build (or its emulation)"; }
#endif

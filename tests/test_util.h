// Small helpers shared by the tests.
#pragma once
#include <cstdlib>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace zoe::test {

// The zoe binary under test (ZOE_TEST_BINARY when set: zoe_emu for the *_emu tests), and mpirun
// as root on a 2-core machine (prefix "-np N <cmd>").
inline const std::string kZoe = std::getenv("ZOE_TEST_BINARY") ? std::getenv("ZOE_TEST_BINARY") : ZOE_BINARY;
// The device the tests run the engine on: ZOE_TEST_DEVICE ("cpu-strict" when unset; the *_emu
// tests set "cuda", which tools/cuda_emu emulates).
inline std::string test_device_name() {
  const char* e = std::getenv("ZOE_TEST_DEVICE");
  return e && *e ? e : "cpu-strict";
}
// A JSON config with zoe.device set to ZOE_TEST_DEVICE where that is set (the C API's tests keep
// the config's own device otherwise). Defined in test_util.cc.
std::string on_test_device(const std::string& config_json);

std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f);
// A fresh empty directory under the system temp dir ($TMPDIR), unique per call, removed with
// what it holds when the process that made it exits (ZOE_KEEP_TEST_DIRS=1 keeps it, to look at
// a failure's files): a suite leaves nothing behind.
std::string make_temp_dir(const std::string& tag);
// A whole file's bytes ("" when it cannot be read).
std::string slurp(const std::string& path);
// AddressSanitizer reserves terabytes of address space for its shadow: `ulimit -v` cannot be used.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
inline constexpr bool kAddressSanitizer = __has_feature(address_sanitizer);  // clang
#else
inline constexpr bool kAddressSanitizer = false;
#endif
// Under AddressSanitizer the ranks get its slow unwinder, which alone reaches the frames of
// OpenMPI's leaks for tools/lsan.supp (CMakeLists.txt's ZOE_MPI_TEST_ENV).
inline const std::string kMpirun =
    std::string("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader ") +
    (kAddressSanitizer ? "ASAN_OPTIONS=\"$ASAN_OPTIONS:fast_unwind_on_malloc=0\" " : "") + "mpirun --oversubscribe ";
// "ulimit -v KB; " for a shell command line that must run in bounded memory ("" under ASan).
inline std::string limit_memory_kb(long kb) {
  return kAddressSanitizer ? std::string() : "ulimit -v " + std::to_string(kb) + "; ";
}
// A character device of our own for tests that check zoe never replaces one: `dir`/null, the
// null device's numbers (1, 3), made with mknod (root only; "" where that is not allowed). Never
// the system's /dev/null: a regression must not destroy the machine's.
std::string make_device_node(const std::string& dir);
// Runs a shell command, returns its exit status and captures stdout+stderr into *out. It runs in
// a working directory of its own, removed after it: ctest runs tests side by side, and a job left
// to its relative defaults (out/checkpoints) would otherwise meet another test's lock or resume
// from its checkpoints.
int run_command(const std::string& cmd, std::string* out);

}  // namespace zoe::test

#include "test_util.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <sys/wait.h>

#include <nlohmann/json.hpp>

namespace zoe::test {

std::vector<float> random_floats(size_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

namespace {

// The directories make_temp_dir made, each with its maker's pid: a death test's forked child
// inherits the list and must remove none of its parent's. Never destroyed: read at exit.
struct MadeDirs {
  std::mutex mu;
  std::vector<std::pair<pid_t, std::string>> dirs;
};
MadeDirs& made_dirs() {
  static auto* m = new MadeDirs;
  return *m;
}

void remove_made_dirs() {
  const char* keep = std::getenv("ZOE_KEEP_TEST_DIRS");
  if (keep && std::string(keep) == "1") return;
  MadeDirs& m = made_dirs();
  std::lock_guard l(m.mu);
  for (const auto& [pid, dir] : m.dirs) {
    std::error_code ec;
    if (pid == ::getpid()) std::filesystem::remove_all(dir, ec);
  }
}

}  // namespace

std::string make_temp_dir(const std::string& tag) {
  static std::once_flag at_exit;
  std::call_once(at_exit, [] { std::atexit(remove_made_dirs); });
  std::string tmpl = (std::filesystem::temp_directory_path() / ("zoe-" + tag + "-XXXXXX")).string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  char* p = mkdtemp(buf.data());
  if (!p) return std::string();
  MadeDirs& m = made_dirs();
  std::lock_guard l(m.mu);
  m.dirs.emplace_back(::getpid(), p);
  return p;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int run_command(const std::string& cmd, std::string* out) {
  std::string cwd = make_temp_dir("cwd");
  if (cwd.empty()) return -1;
  std::string full = "cd '" + cwd + "' && { " + cmd + "\n} 2>&1";
  FILE* f = popen(full.c_str(), "r");
  if (!f) return -1;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), f)) > 0)
    if (out) out->append(buf.data(), n);
  int st = pclose(f);
  std::error_code ec;
  std::filesystem::remove_all(cwd, ec);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

std::string on_test_device(const std::string& config_json) {
  const char* d = std::getenv("ZOE_TEST_DEVICE");
  if (!d || !*d) return config_json;
  nlohmann::json j = nlohmann::json::parse(config_json);
  j["zoe"]["device"] = d;
  return j.dump();
}

std::string make_device_node(const std::string& dir) {
  std::string p = dir + "/null";
  return ::mknod(p.c_str(), S_IFCHR | 0600, makedev(1, 3)) == 0 ? p : std::string();
}

}  // namespace zoe::test

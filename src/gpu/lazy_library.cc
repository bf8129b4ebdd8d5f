#include "gpu/lazy_library.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>
#include <utility>

namespace zoe::gpu {

LazyLibrary::LazyLibrary(std::vector<std::string> paths) : paths_(std::move(paths)) {}

std::vector<std::string> LazyLibrary::candidates(const char* env, const char* built, const char* soname) {
  if (const char* p = std::getenv(env); p && *p) return {p};
  return {built, soname};
}

// Not closed: its functions may be called until the process ends (another static's destructor).
LazyLibrary::~LazyLibrary() = default;

void LazyLibrary::open() {
  // A copy already in the process first: a second copy of the same library (NCCL's, cuDNN's)
  // beside it would keep its own state.
  for (const std::string& p : paths_) {
    if (void* h = p.empty() ? nullptr : dlopen(p.c_str(), RTLD_NOW | RTLD_NOLOAD)) {
      std::lock_guard lock(mu_);
      handle_ = h;
      return;
    }
  }
  std::string why;
  for (const std::string& p : paths_) {
    if (p.empty()) continue;
    if (void* h = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      std::lock_guard lock(mu_);
      handle_ = h;
      return;
    }
    const char* e = dlerror();
    why += (why.empty() ? "" : "; ") + std::string(e ? e : p + ": cannot open");
  }
  std::lock_guard lock(mu_);
  error_ = "could not load " + (paths_.empty() ? std::string("(no path)") : paths_.back()) + ": " + why;
}

void* LazyLibrary::symbol(const char* name) {
  std::call_once(opened_, [this] { open(); });
  std::lock_guard lock(mu_);
  if (!handle_) return nullptr;
  dlerror();
  if (void* s = dlsym(handle_, name)) return s;
  const char* e = dlerror();
  error_ = std::string("no ") + name + " in the library: " + (e ? e : "dlsym found nothing");
  return nullptr;
}

bool LazyLibrary::loaded() const {
  std::lock_guard lock(mu_);
  return handle_ != nullptr;
}

std::string LazyLibrary::path() const {
  std::lock_guard lock(mu_);
  link_map* map = nullptr;
  if (!handle_ || dlinfo(handle_, RTLD_DI_LINKMAP, &map) != 0 || !map || !map->l_name) return "";
  return map->l_name;
}

std::string LazyLibrary::describe(const char* name, long version) const {
  if (version <= 0 || !loaded()) return std::string(name) + " not loaded: " + error();
  return std::string(name) + " " + std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
         std::to_string(version % 100) + " (" + path() + ")";
}

std::string LazyLibrary::error() const {
  std::lock_guard lock(mu_);
  return error_;
}

const char* LazyLibrary::error_text() const {
  std::lock_guard lock(mu_);
  return error_.c_str();
}

}  // namespace zoe::gpu

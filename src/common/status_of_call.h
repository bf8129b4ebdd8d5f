// status_of_call: runs a Status-returning function on a worker thread and turns an exception into
// a Status. An exception that leaves a std::thread's function calls std::terminate, so a worker
// (the optimizer's pass, the communication thread) would end the whole process, other ranks
// hanging, instead of failing the call that waits for it.
#pragma once
#include <exception>
#include <new>
#include <string>
#include <utility>

#include "zoe/status.h"

namespace zoe {

template <class F>
Status status_of_call(const std::string& what, F&& f) noexcept {
  try {
    return std::forward<F>(f)();
  } catch (const std::bad_alloc&) {
    return Status::OutOfMemory(what + ": out of host memory");
  } catch (const std::exception& e) {
    return Status::Runtime(what + ": " + e.what());
  } catch (...) {
    return Status::Runtime(what + ": unknown exception");
  }
}

}  // namespace zoe

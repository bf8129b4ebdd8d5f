// The C ABI (include/zoe/zoe.h) over CEngine: every entry point catches what C++ may throw, turns
// a Status into a code, and leaves its message in zoe_last_error() for the calling thread.
#include "zoe/zoe.h"

#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "capi/c_engine.h"

struct zoe_engine {
  std::unique_ptr<zoe::capi::CEngine> impl;
};

namespace {

thread_local std::string t_last_error;

zoe_status code_of(zoe::Code c) {
  switch (c) {
    case zoe::Code::kOk: return ZOE_OK;
    case zoe::Code::kInvalidInput: return ZOE_ERR_INVALID;
    case zoe::Code::kIo: return ZOE_ERR_IO;
    case zoe::Code::kOutOfMemory: return ZOE_ERR_OUT_OF_MEMORY;
    case zoe::Code::kCorrupt: return ZOE_ERR_CORRUPT;
    case zoe::Code::kComm: return ZOE_ERR_COMM;
    case zoe::Code::kUnsupported: return ZOE_ERR_UNSUPPORTED;
    default: return ZOE_ERR_RUNTIME;
  }
}

zoe_status fail(zoe_status code, std::string msg) {
  t_last_error = std::move(msg);
  return code;
}

zoe_status report(const zoe::Status& s) {
  if (s.ok()) {
    t_last_error.clear();
    return ZOE_OK;
  }
  return fail(code_of(s.code()), s.message());
}

// Runs fn(engine) under the engine's lock after the null and thread checks; exceptions become
// ZOE_ERR_RUNTIME (ZOE_ERR_OUT_OF_MEMORY for bad_alloc).
template <typename Fn>
zoe_status call(zoe_engine* e, const char* op, Fn&& fn) {
  if (!e || !e->impl) return fail(ZOE_ERR_INVALID, std::string(op) + ": the engine is a null pointer");
  try {
    auto lock = e->impl->lock();
    zoe::Status th = e->impl->check_thread();
    if (!th.ok()) return fail(ZOE_ERR_UNSUPPORTED, std::string(op) + ": " + th.message());
    return report(fn(*e->impl));
  } catch (const std::bad_alloc&) {
    return fail(ZOE_ERR_OUT_OF_MEMORY, std::string(op) + ": out of host memory");
  } catch (const std::exception& x) {
    return fail(ZOE_ERR_RUNTIME, std::string(op) + ": " + x.what());
  } catch (...) {
    return fail(ZOE_ERR_RUNTIME, std::string(op) + ": unknown exception");
  }
}

zoe_status null_arg(const char* op, const char* arg) {
  return fail(ZOE_ERR_INVALID, std::string(op) + ": " + arg + " is a null pointer");
}

}  // namespace

extern "C" {

const char* zoe_last_error(void) { return t_last_error.c_str(); }

const char* zoe_version(void) { return ZOE_VERSION_STRING; }

zoe_status zoe_engine_new(const char* config_json, zoe_engine** out) {
  if (!out) return null_arg("zoe_engine_new", "out");
  *out = nullptr;
  if (!config_json) return null_arg("zoe_engine_new", "config_json");
  try {
    auto r = zoe::capi::CEngine::create(config_json);
    if (!r.ok()) return report(r.status());
    *out = new zoe_engine{std::move(r).value()};
    return report(zoe::Status::Ok());
  } catch (const std::exception& x) {
    return fail(ZOE_ERR_RUNTIME, std::string("zoe_engine_new: ") + x.what());
  }
}

zoe_status zoe_engine_close(zoe_engine* e) {
  if (!e) return report(zoe::Status::Ok());
  // The last update's outcome, then the engine is freed whatever it was.
  zoe_status st = call(e, "zoe_engine_close", [](zoe::capi::CEngine& c) { return c.flush(); });
  try {
    delete e;
  } catch (...) {  // a destructor should not throw; if one does, the update's error still comes first
    if (st == ZOE_OK) st = fail(ZOE_ERR_RUNTIME, "zoe_engine_close: freeing the engine threw an exception");
  }
  return st;
}

void zoe_engine_free(zoe_engine* e) {
  // No caller hears of an error here: it is logged, not dropped without a trace.
  if (zoe_engine_close(e) != ZOE_OK)
    std::fprintf(stderr, "zoe_engine_free: %s (zoe_engine_close returns this error)\n", zoe_last_error());
}

int zoe_rank(const zoe_engine* e) { return e && e->impl ? e->impl->rank() : -1; }
int zoe_world_size(const zoe_engine* e) { return e && e->impl ? e->impl->world() : -1; }
int zoe_num_units(const zoe_engine* e) { return e && e->impl ? e->impl->num_units() : -1; }
int64_t zoe_num_params(const zoe_engine* e) { return e && e->impl ? e->impl->num_params() : -1; }
double zoe_loss_scale(const zoe_engine* e) { return e && e->impl ? e->impl->loss_scale() : 1.0; }

int zoe_unit_index(const zoe_engine* e, const char* name) {
  return e && e->impl && name ? e->impl->unit_index(name) : -1;
}

zoe_status zoe_param_info(const zoe_engine* e, const char* name, int* unit, int64_t* offset, int64_t* numel) {
  if (!name) return null_arg("zoe_param_info", "name");
  return call(const_cast<zoe_engine*>(e), "zoe_param_info",
              [&](zoe::capi::CEngine& c) { return c.param_info(name, unit, offset, numel); });
}

zoe_status zoe_register_param(zoe_engine* e, const char* unit, const char* name, int ndim, const int64_t* shape,
                              DLDataType dtype, int weight_decay) {
  if (!unit) return null_arg("zoe_register_param", "unit");
  if (!name) return null_arg("zoe_register_param", "name");
  if (ndim < 0 || ndim > 16) return fail(ZOE_ERR_INVALID, "zoe_register_param: ndim must be 0..16");
  if (ndim > 0 && !shape) return null_arg("zoe_register_param", "shape");
  return call(e, "zoe_register_param", [&](zoe::capi::CEngine& c) {
    return c.register_param(unit, name, std::vector<int64_t>(shape, shape + ndim), dtype, weight_decay != 0);
  });
}

zoe_status zoe_start(zoe_engine* e) {
  return call(e, "zoe_start", [](zoe::capi::CEngine& c) { return c.start(); });
}

zoe_status zoe_set_param(zoe_engine* e, const char* name, const DLTensor* value) {
  if (!name) return null_arg("zoe_set_param", "name");
  return call(e, "zoe_set_param", [&](zoe::capi::CEngine& c) { return c.set_param(name, value); });
}

zoe_status zoe_load_safetensors(zoe_engine* e, const char* path) {
  if (!path) return null_arg("zoe_load_safetensors", "path");
  return call(e, "zoe_load_safetensors", [&](zoe::capi::CEngine& c) { return c.load_safetensors(path); });
}

zoe_status zoe_fetch(zoe_engine* e, int unit, DLManagedTensor** out) {
  if (!out) return null_arg("zoe_fetch", "out");
  *out = nullptr;
  return call(e, "zoe_fetch", [&](zoe::capi::CEngine& c) {
    auto r = c.fetch(unit);
    if (r.ok()) *out = r.value();
    return r.status();
  });
}

zoe_status zoe_wait_stream(zoe_engine* e, void* stream) {
  return call(e, "zoe_wait_stream", [&](zoe::capi::CEngine& c) { return c.wait_stream(stream); });
}

zoe_status zoe_device(zoe_engine* e, DLDevice* out) {
  if (!out) return null_arg("zoe_device", "out");
  return call(e, "zoe_device", [&](zoe::capi::CEngine& c) {
    auto r = c.device();
    if (r.ok()) *out = r.value();
    return r.status();
  });
}

zoe_status zoe_set_stream(zoe_engine* e, void* stream) {
  return call(e, "zoe_set_stream", [&](zoe::capi::CEngine& c) { return c.set_stream(stream); });
}

zoe_status zoe_set_activation_bytes(zoe_engine* e, uint64_t bytes) {
  return call(e, "zoe_set_activation_bytes", [&](zoe::capi::CEngine& c) { return c.set_activation_bytes(bytes); });
}

zoe_status zoe_release(zoe_engine* e, int unit) {
  return call(e, "zoe_release", [&](zoe::capi::CEngine& c) { return c.release(unit); });
}

zoe_status zoe_grad_param(zoe_engine* e, const char* name, const DLTensor* grad) {
  if (!name) return null_arg("zoe_grad_param", "name");
  return call(e, "zoe_grad_param", [&](zoe::capi::CEngine& c) { return c.grad_param(name, grad); });
}

zoe_status zoe_grads_ready(zoe_engine* e, int unit, const DLTensor* grad) {
  return call(e, "zoe_grads_ready", [&](zoe::capi::CEngine& c) { return c.grads_ready(unit, grad); });
}

zoe_status zoe_step(zoe_engine* e, double lr, zoe_step_result* out) {
  return call(e, "zoe_step", [&](zoe::capi::CEngine& c) {
    auto r = c.step(lr);
    if (r.ok() && out) *out = zoe_step_result{r->applied, r->grad_norm, r->loss_scale, r->lr, r->step};
    return r.status();
  });
}

zoe_status zoe_update_during_backward(zoe_engine* e, double lr) {
  return call(e, "zoe_update_during_backward", [&](zoe::capi::CEngine& c) { return c.update_during_backward(lr); });
}

zoe_status zoe_save(zoe_engine* e, const char* dir) {
  if (!dir) return null_arg("zoe_save", "dir");
  return call(e, "zoe_save", [&](zoe::capi::CEngine& c) { return c.save(dir); });
}

zoe_status zoe_load(zoe_engine* e, const char* path) {
  if (!path) return null_arg("zoe_load", "path");
  return call(e, "zoe_load", [&](zoe::capi::CEngine& c) { return c.load(path); });
}

zoe_status zoe_export(zoe_engine* e, const char* path) {
  if (!path) return null_arg("zoe_export", "path");
  return call(e, "zoe_export", [&](zoe::capi::CEngine& c) { return c.export_weights(path); });
}

zoe_status zoe_stats_json(zoe_engine* e, char** out) {
  if (!out) return null_arg("zoe_stats_json", "out");
  *out = nullptr;
  return call(e, "zoe_stats_json", [&](zoe::capi::CEngine& c) {
    std::string s = c.stats_json();
    *out = static_cast<char*>(std::malloc(s.size() + 1));
    if (!*out) return zoe::Status::OutOfMemory("zoe_stats_json: out of host memory");
    std::memcpy(*out, s.c_str(), s.size() + 1);
    return zoe::Status::Ok();
  });
}

void zoe_free_string(char* s) { std::free(s); }

}  // extern "C"

// zoe._zoe: the Python binding, a thin layer over the C API (include/zoe/zoe.h). Tensors cross as
// DLPack capsules ("dltensor"); every failure becomes zoe.Error carrying zoe_last_error().
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "zoe/zoe.h"

namespace py = pybind11;

namespace {

struct ZoeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check(zoe_status s) {
  if (s != ZOE_OK) throw ZoeError(zoe_last_error());
}

DLDataType weight_dtype(const std::string& name) {
  if (name == "float32") return {kDLFloat, 32, 1};
  if (name == "bfloat16") return {kDLBfloat, 16, 1};
  if (name == "float16") return {kDLFloat, 16, 1};
  throw ZoeError("dtype '" + name + "': zoe's weight dtypes are float32, bfloat16 and float16");
}

// A borrowed DLTensor from a producer's capsule (torch.utils.dlpack.to_dlpack): the capsule
// keeps ownership and frees the tensor when it is collected.
const DLTensor* borrow(const py::object& capsule, const char* what) {
  if (capsule.is_none()) return nullptr;
  if (!PyCapsule_IsValid(capsule.ptr(), "dltensor"))
    throw ZoeError(std::string(what) + ": expected a DLPack capsule (torch.utils.dlpack.to_dlpack(t))");
  return &static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"))->dl_tensor;
}

// A capsule a consumer (torch.utils.dlpack.from_dlpack) takes over; unconsumed, it frees itself.
py::capsule to_capsule(DLManagedTensor* t) {
  return py::capsule(t, "dltensor", [](PyObject* cap) {
    if (PyCapsule_IsValid(cap, "dltensor")) {
      auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
      if (m && m->deleter) m->deleter(m);
    }
  });
}

class Engine {
 public:
  explicit Engine(const std::string& config_json) { check(zoe_engine_new(config_json.c_str(), &e_)); }
  // No call is in progress (it would hold a reference to this object); an update's error that
  // nobody can hear of now is logged by zoe_engine_free.
  ~Engine() { zoe_engine_free(e_); }
  // Waits for a call in progress on another thread (mu_), then for the last update; raises that
  // update's error. The engine is freed either way, and later calls raise "the engine is closed".
  void close() {
    zoe_status s = ZOE_OK;
    {
      py::gil_scoped_release nogil;
      std::lock_guard<std::mutex> hold(mu_);
      s = zoe_engine_close(e_);
      e_ = nullptr;
    }
    check(s);
  }

  void register_param(const std::string& unit, const std::string& name, const std::vector<int64_t>& shape,
                      const std::string& dtype, bool decay) {
    const DLDataType dt = weight_dtype(dtype);
    call([&](zoe_engine* e) {
      return zoe_register_param(e, unit.c_str(), name.c_str(), static_cast<int>(shape.size()), shape.data(), dt,
                                decay);
    });
  }
  void start() { call([&](zoe_engine* e) { return zoe_start(e); }); }
  py::tuple param_info(const std::string& name) {
    int u = 0;
    int64_t off = 0, n = 0;
    call([&](zoe_engine* e) { return zoe_param_info(e, name.c_str(), &u, &off, &n); });
    return py::make_tuple(u, off, n);
  }
  void set_param(const std::string& name, const py::object& cap) {
    const DLTensor* t = borrow(cap, "set_param");
    call([&](zoe_engine* e) { return zoe_set_param(e, name.c_str(), t); });
  }
  py::capsule fetch(int u) {
    DLManagedTensor* t = nullptr;
    call([&](zoe_engine* e) { return zoe_fetch(e, u, &t); });
    return to_capsule(t);
  }
  void release(int u) { call([&](zoe_engine* e) { return zoe_release(e, u); }); }
  // (DLPack's device type, the GPU's ordinal): (1, 0) for the CPU device, (2, n) for GPU n.
  py::tuple device() {
    DLDevice d{};
    call([&](zoe_engine* e) { return zoe_device(e, &d); });
    return py::make_tuple(static_cast<int>(d.device_type), d.device_id);
  }
  // stream: a cudaStream_t as an integer (torch.cuda.Stream.cuda_stream).
  void wait_stream(uintptr_t stream) {
    call([&](zoe_engine* e) { return zoe_wait_stream(e, reinterpret_cast<void*>(stream)); });
  }
  void set_activation_bytes(uint64_t bytes) {
    call([&](zoe_engine* e) { return zoe_set_activation_bytes(e, bytes); });
  }
  void set_stream(uintptr_t stream) {
    call([&](zoe_engine* e) { return zoe_set_stream(e, reinterpret_cast<void*>(stream)); });
  }
  void grad_param(const std::string& name, const py::object& cap) {
    const DLTensor* t = borrow(cap, "grad_param");
    call([&](zoe_engine* e) { return zoe_grad_param(e, name.c_str(), t); });
  }
  void grads_ready(int u, const py::object& cap) {
    const DLTensor* t = borrow(cap, "grads_ready");
    call([&](zoe_engine* e) { return zoe_grads_ready(e, u, t); });
  }
  py::dict step(double lr) {
    zoe_step_result r{};
    call([&](zoe_engine* e) { return zoe_step(e, lr, &r); });
    py::dict d;
    d["applied"] = r.applied != 0;
    d["grad_norm"] = r.grad_norm;
    d["loss_scale"] = r.loss_scale;
    d["lr"] = r.lr;
    d["step"] = r.step;
    return d;
  }
  std::string stats_json() {
    char* s = nullptr;
    call([&](zoe_engine* e) { return zoe_stats_json(e, &s); });
    std::string out(s);
    zoe_free_string(s);
    return out;
  }
  void call_path(zoe_status (*fn)(zoe_engine*, const char*), const std::string& path) {
    call([&](zoe_engine* e) { return fn(e, path.c_str()); });
  }

  // fn(engine) under mu_, without the GIL: calls from several Python threads are serialised, other
  // Python threads go on meanwhile (collective and long calls), and close() cannot free the
  // engine under a call.
  template <typename Fn>
  auto locked(Fn&& fn) {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> hold(mu_);
    if (!e_) throw ZoeError("the engine is closed");
    return fn(e_);
  }
  template <typename Fn>
  void call(Fn&& fn) {
    check(locked(std::forward<Fn>(fn)));
  }

 private:
  std::mutex mu_;
  zoe_engine* e_ = nullptr;
};

}  // namespace

PYBIND11_MODULE(_zoe, m) {
  m.doc() = "zoe's C API for Python (use zoe.Engine and zoe.torch.wrap)";
  // zoe.Error, a RuntimeError, carries what() (pybind11's own translator: the one form every version
  // from Debian's 2.10 to 3.x has without deprecation).
  py::register_exception<ZoeError>(m, "Error", PyExc_RuntimeError);
  m.def("version", [] { return std::string(zoe_version()); });
  py::class_<Engine>(m, "Engine")
      .def(py::init<const std::string&>())
      .def("close", &Engine::close)
      .def_property_readonly("rank", [](Engine& x) { return x.locked(zoe_rank); })
      .def_property_readonly("world_size", [](Engine& x) { return x.locked(zoe_world_size); })
      .def_property_readonly("num_units", [](Engine& x) { return x.locked(zoe_num_units); })
      .def_property_readonly("num_params", [](Engine& x) { return x.locked(zoe_num_params); })
      .def_property_readonly("loss_scale", [](Engine& x) { return x.locked(zoe_loss_scale); })
      .def("unit_index",
           [](Engine& x, const std::string& n) {
             return x.locked([&](zoe_engine* e) { return zoe_unit_index(e, n.c_str()); });
           })
      .def("register_param", &Engine::register_param)
      .def("start", &Engine::start)
      .def("param_info", &Engine::param_info)
      .def("set_param", &Engine::set_param)
      .def("load_safetensors", [](Engine& x, const std::string& p) { x.call_path(zoe_load_safetensors, p); })
      .def("fetch", &Engine::fetch)
      .def("release", &Engine::release)
      .def("wait_stream", &Engine::wait_stream)
      .def("set_stream", &Engine::set_stream)
      .def("set_activation_bytes", &Engine::set_activation_bytes)
      .def("device", &Engine::device)
      .def("grad_param", &Engine::grad_param)
      .def("grads_ready", &Engine::grads_ready)
      .def("step", &Engine::step)
      .def("save", [](Engine& x, const std::string& d) { x.call_path(zoe_save, d); })
      .def("load", [](Engine& x, const std::string& d) { x.call_path(zoe_load, d); })
      .def("export", [](Engine& x, const std::string& p) { x.call_path(zoe_export, p); })
      .def("stats_json", &Engine::stats_json);
}

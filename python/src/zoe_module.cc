// zoe._zoe: the Python binding, a thin layer over the C API (include/zoe/zoe.h). Tensors cross as
// DLPack capsules ("dltensor"); every failure becomes zoe.Error carrying zoe_last_error().
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
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
  ~Engine() { close(); }
  void close() {
    zoe_engine_free(e_);
    e_ = nullptr;
  }
  zoe_engine* e() {
    if (!e_) throw ZoeError("the engine is closed");
    return e_;
  }

  void register_param(const std::string& unit, const std::string& name, const std::vector<int64_t>& shape,
                      const std::string& dtype, bool decay) {
    check(zoe_register_param(e(), unit.c_str(), name.c_str(), static_cast<int>(shape.size()), shape.data(),
                             weight_dtype(dtype), decay));
  }
  void start() { call([&] { return zoe_start(e()); }); }
  py::tuple param_info(const std::string& name) {
    int u = 0;
    int64_t off = 0, n = 0;
    check(zoe_param_info(e(), name.c_str(), &u, &off, &n));
    return py::make_tuple(u, off, n);
  }
  void set_param(const std::string& name, const py::object& cap) {
    const DLTensor* t = borrow(cap, "set_param");
    call([&] { return zoe_set_param(e(), name.c_str(), t); });
  }
  py::capsule fetch(int u) {
    DLManagedTensor* t = nullptr;
    call([&] { return zoe_fetch(e(), u, &t); });
    return to_capsule(t);
  }
  void release(int u) { call([&] { return zoe_release(e(), u); }); }
  void grad_param(const std::string& name, const py::object& cap) {
    const DLTensor* t = borrow(cap, "grad_param");
    call([&] { return zoe_grad_param(e(), name.c_str(), t); });
  }
  void grads_ready(int u, const py::object& cap) {
    const DLTensor* t = borrow(cap, "grads_ready");
    call([&] { return zoe_grads_ready(e(), u, t); });
  }
  py::dict step(double lr) {
    zoe_step_result r{};
    call([&] { return zoe_step(e(), lr, &r); });
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
    check(zoe_stats_json(e(), &s));
    std::string out(s);
    zoe_free_string(s);
    return out;
  }
  // Collective or long calls run without the GIL: other Python threads go on meanwhile.
  template <typename Fn>
  void call(Fn&& fn) {
    zoe_status s;
    {
      py::gil_scoped_release nogil;
      s = fn();
    }
    check(s);
  }

 private:
  zoe_engine* e_ = nullptr;
};

}  // namespace

PYBIND11_MODULE(_zoe, m) {
  m.doc() = "zoe's C API for Python (use zoe.Engine and zoe.torch.wrap)";
  static py::exception<ZoeError> error(m, "Error", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ZoeError& x) {
      error(x.what());
    }
  });
  m.def("version", [] { return std::string(zoe_version()); });
  py::class_<Engine>(m, "Engine")
      .def(py::init<const std::string&>())
      .def("close", &Engine::close)
      .def_property_readonly("rank", [](Engine& x) { return zoe_rank(x.e()); })
      .def_property_readonly("world_size", [](Engine& x) { return zoe_world_size(x.e()); })
      .def_property_readonly("num_units", [](Engine& x) { return zoe_num_units(x.e()); })
      .def_property_readonly("num_params", [](Engine& x) { return zoe_num_params(x.e()); })
      .def_property_readonly("loss_scale", [](Engine& x) { return zoe_loss_scale(x.e()); })
      .def("unit_index", [](Engine& x, const std::string& n) { return zoe_unit_index(x.e(), n.c_str()); })
      .def("register_param", &Engine::register_param)
      .def("start", &Engine::start)
      .def("param_info", &Engine::param_info)
      .def("set_param", &Engine::set_param)
      .def("load_safetensors", [](Engine& x, const std::string& p) { x.call([&] { return zoe_load_safetensors(x.e(), p.c_str()); }); })
      .def("fetch", &Engine::fetch)
      .def("release", &Engine::release)
      .def("grad_param", &Engine::grad_param)
      .def("grads_ready", &Engine::grads_ready)
      .def("step", &Engine::step)
      .def("save", [](Engine& x, const std::string& d) { x.call([&] { return zoe_save(x.e(), d.c_str()); }); })
      .def("load", [](Engine& x, const std::string& d) { x.call([&] { return zoe_load(x.e(), d.c_str()); }); })
      .def("export", [](Engine& x, const std::string& p) { x.call([&] { return zoe_export(x.e(), p.c_str()); }); })
      .def("stats_json", &Engine::stats_json);
}

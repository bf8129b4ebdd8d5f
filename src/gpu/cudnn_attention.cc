// CudnnAttention through cuDNN's C++ frontend (cudnn_frontend.h): one SDPA graph for the forward,
// one for the backward, per shape. See cudnn_attention.h for the contract.
#include "gpu/cudnn_attention.h"

#include <cudnn.h>
// The frontend's JSON (its graphs' serialization, errata files) is not used: its bundled
// nlohmann/json stays out of a program that links Debian's.
#define CUDNN_FRONTEND_SKIP_JSON_LIB 1
#include <cudnn_frontend.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gpu/cudnn_library.h"

namespace zoe::gpu {

namespace fe = cudnn_frontend;

namespace {

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;
using GraphPtr = std::shared_ptr<fe::graph::Graph>;

// The graphs' tensors, named by uid in the variant pack at execution.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDout, kDq, kDk, kDv };

struct Shape {
  int B, T, C, NH;
  auto operator<=>(const Shape&) const = default;
  int hs() const { return C / NH; }
  std::string text() const { return fmt::format("B {}, T {}, C {}, NH {}", B, T, C, NH); }
};

// [B, NH, T, hs] over rows of `ld` elements (qkv: 3C, out: C), head h at column h * hs.
std::vector<int64_t> heads_dim(const Shape& s) { return {s.B, s.NH, s.T, s.hs()}; }
std::vector<int64_t> heads_stride(const Shape& s, int ld) { return {int64_t{s.T} * ld, s.hs(), ld, 1}; }

TensorPtr heads(fe::graph::Graph& g, const char* name, Uid uid, const Shape& s, int ld) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim(heads_dim(s))
                      .set_stride(heads_stride(s, ld))
                      .set_data_type(fe::DataType_t::BFLOAT16));
}

// lse [B, NH, T] as cuDNN's Stats [B, NH, T, 1], fp32.
void as_stats(fe::graph::Tensor_attributes& t, const Shape& s) {
  t.set_uid(kStats)
      .set_dim({s.B, s.NH, s.T, 1})
      .set_stride({int64_t{s.NH} * s.T, s.T, 1, 1})
      .set_data_type(fe::DataType_t::FLOAT);
}

void set_output(const TensorPtr& t, Uid uid, const Shape& s, int ld) {
  t->set_output(true).set_uid(uid).set_dim(heads_dim(s)).set_stride(heads_stride(s, ld));
}

// sm_version: the GPU generation the checks assume (validate(), with no GPU); 0: the current GPU's.
// (Set first: each node copies the graph's settings when it is added.)
GraphPtr new_graph(int sm_version) {
  auto g = std::make_shared<fe::graph::Graph>();
  if (sm_version > 0) g->set_sm_version(sm_version);
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

float scale_of(const Shape& s) { return 1.f / std::sqrt(static_cast<float>(s.hs())); }

GraphPtr forward_graph(const Shape& s, int sm_version = 0) {
  GraphPtr g = new_graph(sm_version);
  TensorPtr q = heads(*g, "q", kQ, s, 3 * s.C), k = heads(*g, "k", kK, s, 3 * s.C), v = heads(*g, "v", kV, s, 3 * s.C);
  auto outs = g->sdpa(q, k, v,
                      fe::graph::SDPA_attributes()
                          .set_name("attention")
                          .set_generate_stats(true)
                          .set_causal_mask(true)
                          .set_attn_scale(scale_of(s)));
  set_output(outs[0], kO, s, s.C);
  outs[1]->set_output(true);
  as_stats(*outs[1], s);
  return g;
}

GraphPtr backward_graph(const Shape& s, int sm_version = 0) {
  GraphPtr g = new_graph(sm_version);
  TensorPtr q = heads(*g, "q", kQ, s, 3 * s.C), k = heads(*g, "k", kK, s, 3 * s.C), v = heads(*g, "v", kV, s, 3 * s.C);
  TensorPtr o = heads(*g, "o", kO, s, s.C), dout = heads(*g, "dout", kDout, s, s.C);
  fe::graph::Tensor_attributes stats_attr;
  stats_attr.set_name("stats");
  as_stats(stats_attr, s);
  TensorPtr stats = g->tensor(stats_attr);
  auto grads = g->sdpa_backward(q, k, v, o, dout, stats,
                                fe::graph::SDPA_backward_attributes()
                                    .set_name("attention_backward")
                                    .set_causal_mask(true)
                                    .set_attn_scale(scale_of(s))
                                    .set_deterministic_algorithm(true));
  set_output(grads[0], kDq, s, 3 * s.C);
  set_output(grads[1], kDk, s, 3 * s.C);
  set_output(grads[2], kDv, s, 3 * s.C);
  return g;
}

Status refusal(const char* which, const Shape& s, const char* step, fe::error_t e) {
  return Status::Unsupported(
      fmt::format("cuDNN's {} attention ({}) at {}: {}", which, s.text(), step, e.get_message()));
}

Status validate_graph(fe::graph::Graph& g, const char* which, const Shape& s) {
  if (fe::error_t e = g.validate(); e.is_bad()) return refusal(which, s, "validate", e);
  return Status::Ok();
}

// Validates the graph and builds its plan (the heuristics' first engine that supports it).
Status build(fe::graph::Graph& g, cudnnHandle_t handle, const char* which, const Shape& s, int64_t* workspace) {
  const auto bad = [&](const char* step, fe::error_t e) { return refusal(which, s, step, std::move(e)); };
  ZOE_RETURN_IF_ERROR(validate_graph(g, which, s));
  if (fe::error_t e = g.build_operation_graph(handle); e.is_bad()) return bad("build_operation_graph", e);
  if (fe::error_t e = g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}); e.is_bad())
    return bad("create_execution_plans", e);
  if (fe::error_t e = g.check_support(handle); e.is_bad()) return bad("check_support", e);
  if (fe::error_t e = g.build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE); e.is_bad())
    return bad("build_plans", e);
  if (fe::error_t e = g.get_workspace_size(*workspace); e.is_bad()) return bad("get_workspace_size", e);
  return Status::Ok();
}

std::string cudnn_text(cudnnStatus_t s) { return fmt::format("{} ({})", cudnnGetErrorString(s), int(s)); }

}  // namespace

struct CudnnAttention::Impl {
  struct Plans {
    GraphPtr forward, backward;
    Status status;  // why cuDNN cannot run the shape, or ok
  };
  cudaStream_t stream = nullptr;
  RawMemory memory;
  cudnnHandle_t handle = nullptr;
  std::map<Shape, Plans> plans;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;

  ~Impl() {
    if (workspace) {
      cudaStreamSynchronize(stream);  // the plans queued may still use it
      memory.free(workspace);
    }
    plans.clear();  // built with the handle: gone before it
    if (handle) cudnnDestroy(handle);
  }

  // The larger buffer is taken before the old one goes: a shape whose workspace does not fit is
  // refused alone, and the shapes built before keep theirs.
  Status grow_workspace(int64_t bytes) {
    if (bytes <= 0 || size_t(bytes) <= workspace_bytes) return Status::Ok();
    void* grown = nullptr;
    ZOE_RETURN_IF_ERROR(take_raw(memory, size_t(bytes), "cuDNN's attention workspace", &grown));
    if (workspace) {
      if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) {
        memory.free(grown);
        return Status::Runtime(std::string("synchronize before growing cuDNN's workspace: ") + cudaGetErrorName(e));
      }
      memory.free(workspace);
    }
    workspace = grown;
    workspace_bytes = size_t(bytes);
    return Status::Ok();
  }

  // The shape's plans, built on first use. Never throws: the frontend's exceptions become statuses.
  const Plans& plans_for(const Shape& s) {
    if (auto it = plans.find(s); it != plans.end()) return it->second;
    Plans p;
    try {
      int64_t ws_forward = 0, ws_backward = 0;
      GraphPtr f = forward_graph(s), b = backward_graph(s);
      p.status = build(*f, handle, "forward", s, &ws_forward);
      if (p.status.ok()) p.status = build(*b, handle, "backward", s, &ws_backward);
      if (p.status.ok()) p.status = grow_workspace(std::max(ws_forward, ws_backward));
      if (p.status.ok()) p.forward = std::move(f), p.backward = std::move(b);
    } catch (const std::exception& e) {
      p.status = Status::Unsupported(fmt::format("cuDNN's attention ({}): {}", s.text(), e.what()));
    }
    return plans.emplace(s, std::move(p)).first->second;
  }

  Status execute(const fe::graph::Graph& g, std::unordered_map<int64_t, void*>& pack, const char* which,
                 const Shape& s) {
    try {
      if (fe::error_t e = g.execute(handle, pack, workspace); e.is_bad())
        return Status::Runtime(fmt::format("cuDNN's {} attention ({}): {}", which, s.text(), e.get_message()));
    } catch (const std::exception& e) {
      return Status::Runtime(fmt::format("cuDNN's {} attention ({}): {}", which, s.text(), e.what()));
    }
    return Status::Ok();
  }
};

CudnnAttention::CudnnAttention(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudnnAttention::~CudnnAttention() = default;

Status CudnnAttention::create(cudaStream_t stream, RawMemory memory, std::unique_ptr<CudnnAttention>* out) {
  auto impl = std::make_unique<Impl>();
  impl->stream = stream;
  impl->memory = std::move(memory);
  if (cudnnStatus_t s = cudnnCreate(&impl->handle); s != CUDNN_STATUS_SUCCESS) {
    impl->handle = nullptr;
    return Status::Unsupported("cudnnCreate: " + cudnn_text(s));
  }
  if (cudnnStatus_t s = cudnnSetStream(impl->handle, stream); s != CUDNN_STATUS_SUCCESS)
    return Status::Runtime("cudnnSetStream: " + cudnn_text(s));
  out->reset(new CudnnAttention(std::move(impl)));
  return Status::Ok();
}

Status CudnnAttention::prepare(int B, int T, int C, int NH) { return impl_->plans_for({B, T, C, NH}).status; }

Status CudnnAttention::forward(uint16_t* out, float* lse, const uint16_t* qkv, int B, int T, int C, int NH) {
  const Shape s{B, T, C, NH};
  const Impl::Plans& p = impl_->plans_for(s);
  if (!p.status.ok()) return p.status;
  auto* in = const_cast<uint16_t*>(qkv);  // (the variant pack takes void*; cuDNN only reads them)
  std::unordered_map<int64_t, void*> pack = {{kQ, in}, {kK, in + C}, {kV, in + 2 * C}, {kO, out}, {kStats, lse}};
  return impl_->execute(*p.forward, pack, "forward", s);
}

Status CudnnAttention::backward(uint16_t* dqkv, const uint16_t* dout, const uint16_t* out, const uint16_t* qkv,
                                const float* lse, int B, int T, int C, int NH) {
  const Shape s{B, T, C, NH};
  const Impl::Plans& p = impl_->plans_for(s);
  if (!p.status.ok()) return p.status;
  auto* in = const_cast<uint16_t*>(qkv);
  std::unordered_map<int64_t, void*> pack = {
      {kQ, in},          {kK, in + C},    {kV, in + 2 * C},
      {kO, const_cast<uint16_t*>(out)}, {kDout, const_cast<uint16_t*>(dout)}, {kStats, const_cast<float*>(lse)},
      {kDq, dqkv},       {kDk, dqkv + C}, {kDv, dqkv + 2 * C}};
  return impl_->execute(*p.backward, pack, "backward", s);
}

size_t CudnnAttention::workspace_bytes() const { return impl_->workspace_bytes; }

Status CudnnAttention::validate(int B, int T, int C, int NH, int sm_version) {
  const Shape s{B, T, C, NH};
  try {
    GraphPtr f = forward_graph(s, sm_version), b = backward_graph(s, sm_version);
    ZOE_RETURN_IF_ERROR(validate_graph(*f, "forward", s));
    return validate_graph(*b, "backward", s);
  } catch (const std::exception& e) {
    return Status::Unsupported(fmt::format("cuDNN's attention ({}): {}", s.text(), e.what()));
  }
}

std::string CudnnAttention::version_text() {
  const size_t v = cudnnGetVersion();  // (0: the library did not load)
  const std::string built =
      fmt::format("built against {}.{}.{}; frontend {}.{}.{}", CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL,
                  CUDNN_FRONTEND_MAJOR_VERSION, CUDNN_FRONTEND_MINOR_VERSION, CUDNN_FRONTEND_PATCH_VERSION);
  if (v == 0) return fmt::format("cuDNN not loaded ({}): {}", built, cudnn_load_error());
  return fmt::format("cuDNN {}.{}.{} ({}; {})", v / 10000, v / 100 % 100, v % 100, built, cudnn_path());
}

}  // namespace zoe::gpu

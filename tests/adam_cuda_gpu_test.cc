// The CUDA Adam kernel against the CPU scalar path, bit for bit, over many ranges in one call:
// every dtype pair, tails, unaligned pointers, non-finite gradients, more ranges than fit one
// launch, several steps, the later ones taken back and stepped again or only taken back
// (AdamHyper::undo). Skips where there is no CUDA build or no GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/adam.h"
#include "test_util.h"

#ifdef ZOE_HAVE_CUDA
#include <cuda_runtime.h>

#include "gpu/adam_cuda.h"
#include "gpu/gpu_info.h"

namespace zoe {
namespace {

// A device allocation freed on scope exit.
struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) p = nullptr;
  }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// One range on the host (the CPU reference steps it) and its copy on the device. `offset`
// elements are skipped at the front of every array to make the pointers unaligned.
struct Range {
  DType grad_dtype;
  bool has_copy;
  DType param_dtype;
  size_t n, offset;
  std::vector<uint8_t> grad, out;
  std::vector<float> master, m, v;
  std::unique_ptr<DeviceBuffer> d_grad, d_master, d_m, d_v, d_out;

  Range(DType g, bool copy, DType p, size_t n_, size_t off, uint64_t seed)
      : grad_dtype(g), has_copy(copy), param_dtype(p), n(n_), offset(off) {
    const size_t total = n + offset;
    grad.resize(total * dtype_size(g));
    out.assign(total * dtype_size(p), 0);
    master = test::random_floats(total, seed, -1.f, 1.f);
    m = test::random_floats(total, seed + 1, -0.01f, 0.01f);
    v = test::random_floats(total, seed + 2, 0.f, 1e-4f);
    d_grad = std::make_unique<DeviceBuffer>(grad.size());
    d_master = std::make_unique<DeviceBuffer>(total * 4);
    d_m = std::make_unique<DeviceBuffer>(total * 4);
    d_v = std::make_unique<DeviceBuffer>(total * 4);
    d_out = std::make_unique<DeviceBuffer>(out.size());
  }
  bool allocated() const { return d_grad->p && d_master->p && d_m->p && d_v->p && d_out->p; }
  void fill_grads(uint64_t seed) {
    std::vector<float> g = test::random_floats(n + offset, seed, -1024.f, 1024.f);
    for (size_t i = 0; i < g.size(); ++i) store_from_f32(grad.data(), grad_dtype, i, g[i]);
    if (n > 3) {
      store_from_f32(grad.data(), grad_dtype, offset + n / 3, std::numeric_limits<float>::infinity());
      store_from_f32(grad.data(), grad_dtype, offset + n - 1, std::numeric_limits<float>::quiet_NaN());
    }
  }
  AdamRange host_range() {
    return range(grad.data(), master.data(), m.data(), v.data(), out.data());
  }
  AdamRange device_range() {
    return range(d_grad->p, static_cast<float*>(d_master->p), static_cast<float*>(d_m->p),
                 static_cast<float*>(d_v->p), d_out->p);
  }
  AdamRange range(void* g, float* p, float* mm, float* vv, void* o) {
    AdamRange r;
    r.grad = static_cast<uint8_t*>(g) + offset * dtype_size(grad_dtype);
    r.grad_dtype = grad_dtype;
    r.master = p + offset;
    r.exp_avg = mm + offset;
    r.exp_avg_sq = vv + offset;
    r.param_out = has_copy ? static_cast<uint8_t*>(o) + offset * dtype_size(param_dtype) : nullptr;
    r.param_dtype = param_dtype;
    r.n = n;
    return r;
  }
  bool copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    return cudaMemcpy(dst, src, bytes, kind) == cudaSuccess;
  }
  bool upload_state() {
    return copy(d_master->p, master.data(), master.size() * 4, cudaMemcpyHostToDevice) &&
           copy(d_m->p, m.data(), m.size() * 4, cudaMemcpyHostToDevice) &&
           copy(d_v->p, v.data(), v.size() * 4, cudaMemcpyHostToDevice) &&
           copy(d_out->p, out.data(), out.size(), cudaMemcpyHostToDevice);
  }
  bool upload_grads() { return copy(d_grad->p, grad.data(), grad.size(), cudaMemcpyHostToDevice); }
  // True when the device's state equals the host's bit for bit.
  ::testing::AssertionResult device_equals_host() {
    std::vector<float> p(master.size()), mm(m.size()), vv(v.size());
    std::vector<uint8_t> o(out.size());
    if (!copy(p.data(), d_master->p, p.size() * 4, cudaMemcpyDeviceToHost) ||
        !copy(mm.data(), d_m->p, mm.size() * 4, cudaMemcpyDeviceToHost) ||
        !copy(vv.data(), d_v->p, vv.size() * 4, cudaMemcpyDeviceToHost) ||
        !copy(o.data(), d_out->p, o.size(), cudaMemcpyDeviceToHost))
      return ::testing::AssertionFailure() << "cudaMemcpy back failed";
    for (size_t i = 0; i < p.size(); ++i) {
      if (std::memcmp(&p[i], &master[i], 4) || std::memcmp(&mm[i], &m[i], 4) || std::memcmp(&vv[i], &v[i], 4))
        return ::testing::AssertionFailure() << "element " << i << ": gpu master/m/v " << p[i] << " " << mm[i]
                                             << " " << vv[i] << ", cpu " << master[i] << " " << m[i] << " " << v[i];
    }
    if (o != out) return ::testing::AssertionFailure() << "weight copies differ";
    return ::testing::AssertionSuccess();
  }
};

void expect_device_equals_host(std::vector<std::unique_ptr<Range>>& ranges) {
  for (size_t i = 0; i < ranges.size(); ++i) {
    const Range& r = *ranges[i];
    EXPECT_TRUE(ranges[i]->device_equals_host())
        << "range " << i << " grad=" << dtype_name(r.grad_dtype)
        << " copy=" << (r.has_copy ? std::string(dtype_name(r.param_dtype)) : std::string("none")) << " n=" << r.n
        << " offset=" << r.offset;
  }
}

TEST(AdamCuda, BitwiseEqualToCpuScalar) {
  std::string why;
  if (gpu::list_gpus(&why).empty()) GTEST_SKIP() << "no usable GPU, CUDA Adam not tested: " << why;

  std::vector<std::unique_ptr<Range>> ranges;
  // The long range spans more tiles than a GPU's launch has blocks (a block walks it more than once).
#ifdef ZOE_CUDA_EMU  // the emulation runs each GPU thread on the CPU, and its 2 blocks walk every
  // range of 3 tiles or more: the long range in 3 of the 12 (gradient, copy) pairs, one per
  // gradient type (it was 3/4 of the elements, and of the emulated suite's time on this test)
  const size_t long_range = (size_t{1} << 16) + 5;
  auto has_long_range = [](int g, int copy) { return (g + copy) % 4 == 0; };
#else
  const size_t long_range = (size_t{1} << 20) + 5;
  auto has_long_range = [](int, int) { return true; };
#endif
  const size_t lengths[] = {0, 1, 7, 8, 9, 4095, 4097, 10003, long_range};
  uint64_t seed = 1;
  const DType grads[] = {DType::kF32, DType::kBF16, DType::kF16};
  for (int gi = 0; gi < 3; ++gi)
    for (int copy = 0; copy < 4; ++copy)  // none, fp32, bf16, fp16
      for (size_t n : lengths) {
        if (n == long_range && !has_long_range(gi, copy)) continue;
        const DType g = grads[gi];
        const size_t offset = (seed % 3 == 0) ? 1 : 0;  // every third range unaligned: scalar path
        const DType p = copy == 1 ? DType::kF32 : copy == 2 ? DType::kBF16 : DType::kF16;
        ranges.push_back(std::make_unique<Range>(g, copy != 0, p, n, offset, seed++));
        ASSERT_TRUE(ranges.back()->allocated()) << "cudaMalloc failed";
        ASSERT_TRUE(ranges.back()->upload_state());
      }
  ASSERT_GT(ranges.size(), 48u);  // more than one launch's worth

  DeviceBuffer d_count(sizeof(unsigned long long));
  ASSERT_NE(d_count.p, nullptr);
  for (int step = 1; step <= 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    AdamHyper h;
    h.lr = 3e-3;
    h.beta1 = 0.85;
    h.beta2 = 0.995;
    h.eps = 1e-8;
    h.weight_decay = 0.05;
    h.decoupled = step != 2;  // Adam (L2) on step 2, AdamW otherwise
    h.step = step;
    h.grad_scale = 1.0f / 1024;
    size_t cpu_bad = 0;
    std::vector<AdamRange> device_ranges;
    for (auto& r : ranges) {
      r->fill_grads(100 * step + r->n);
      ASSERT_TRUE(r->upload_grads());
      cpu_bad += adam_step_range(h, r->host_range(), Isa::kScalar);
      device_ranges.push_back(r->device_range());
    }
    ASSERT_EQ(cudaMemset(d_count.p, 0, sizeof(unsigned long long)), cudaSuccess);
    const Status s = gpu::adam_step_cuda(h, device_ranges.data(), device_ranges.size(), nullptr,
                                         static_cast<unsigned long long*>(d_count.p));
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    unsigned long long gpu_bad = 0;
    ASSERT_EQ(cudaMemcpy(&gpu_bad, d_count.p, sizeof gpu_bad, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(gpu_bad, cpu_bad);
    expect_device_equals_host(ranges);
    if (step == 1) continue;
    // The step taken back and redone at a quarter of its scale (zoe.update_in_backward under
    // clipping); on the last step taken back only (a skipped step): the CPU's bits again.
    AdamHyper again = h;
    again.undo = true;
    again.undo_grad_scale = h.grad_scale;
    again.grad_scale = h.grad_scale / 4;
    again.restore_only = step == 3;
    cpu_bad = 0;
    for (auto& r : ranges) cpu_bad += adam_step_range(again, r->host_range(), Isa::kScalar);
    ASSERT_EQ(cudaMemset(d_count.p, 0, sizeof(unsigned long long)), cudaSuccess);
    const Status redo = gpu::adam_step_cuda(again, device_ranges.data(), device_ranges.size(), nullptr,
                                            static_cast<unsigned long long*>(d_count.p));
    ASSERT_TRUE(redo.ok()) << redo.message();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(&gpu_bad, d_count.p, sizeof gpu_bad, cudaMemcpyDeviceToHost), cudaSuccess);
    if (!again.restore_only) {
      EXPECT_EQ(gpu_bad, cpu_bad);
    }
    SCOPED_TRACE(again.restore_only ? "taken back" : "taken back and redone");
    expect_device_equals_host(ranges);
  }
}

// Bad input is refused before any CUDA call, so this runs without a GPU too.
TEST(AdamCuda, RejectsNullPointers) {
  AdamRange r;
  r.n = 5;
  const Status s = gpu::adam_step_cuda(AdamHyper{}, &r, 1, nullptr, nullptr);
  EXPECT_EQ(s.code(), Code::kInvalidInput);
  EXPECT_NE(s.message().find("range 0"), std::string::npos) << s.message();
  EXPECT_EQ(gpu::adam_step_cuda(AdamHyper{}, nullptr, 3, nullptr, nullptr).code(), Code::kInvalidInput);
}

}  // namespace
}  // namespace zoe

#else  // !ZOE_HAVE_CUDA

TEST(AdamCuda, BitwiseEqualToCpuScalar) { GTEST_SKIP() << "built without CUDA (ZOE_HAVE_CUDA is not defined)"; }

#endif

// `zoe train` on the GPU against the CPU device: the same GPT-2 job (fp32, AdamW, the embedded
// corpus) gives the same loss at every one of 20 steps to 1e-5, at stage 0 and at stage 3.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"

#ifdef ZOE_HAVE_CUDA
#include "gpu/gpu_info.h"
#endif

namespace zoe::test {
namespace {

// The losses of a 20-step fp32 GPT-2 job on `device` at `stage`, from its report.
std::vector<double> losses(const std::string& device, int stage) {
  std::string dir = make_temp_dir("train-gpu");
  std::string out;
  // Under tools/cuda_emu (the *_emu run) a smaller model: its kernels run as fibers on one core.
#ifdef ZOE_CUDA_EMU
  const std::string shape = " --set zoe.model.n_embd=32 --set zoe.model.n_head=2 --set zoe.data.seq_len=32"
                            " --set train_micro_batch_size_per_gpu=2";
#else
  const std::string shape = " --set zoe.model.n_embd=128 --set zoe.model.n_head=4 --set zoe.data.seq_len=64"
                            " --set train_micro_batch_size_per_gpu=4";
#endif
  int rc = run_command(kZoe + " train --quiet --set zoe.device=" + device +
                           " --set zoe.model.type=gpt2 --set zoe.model.n_layer=2" + shape +
                           " --set bf16.enabled=false --set zero_optimization.stage=" + std::to_string(stage) +
                           " --set zoe.steps=20 --set zoe.checkpoint.dir='\"\"' --report " + dir + "/r.jsonl",
                       &out);
  EXPECT_EQ(rc, 0) << device << " stage " << stage << ":\n" << out;
  std::vector<double> l;
  std::ifstream f(dir + "/r.jsonl");
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("step")) l.push_back(j["loss"].get<double>());
  }
  return l;
}

TEST(TrainGpu, TwentyStepsOnTheGpuMatchTheCpuDevicesLosses) {
#ifndef ZOE_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA (ZOE_HAVE_CUDA is not defined)";
#else
  std::string why;
  if (gpu::list_gpus(&why).empty()) GTEST_SKIP() << "no usable GPU, zoe train on cuda not tested: " << why;
  for (int stage : {0, 3}) {
    std::vector<double> cpu = losses("cpu", stage), gpu = losses("cuda", stage);
    ASSERT_EQ(cpu.size(), 20u);
    ASSERT_EQ(gpu.size(), 20u);
    for (size_t s = 0; s < cpu.size(); ++s)
      EXPECT_LE(std::abs(gpu[s] - cpu[s]), 1e-5 * std::abs(cpu[s])) << "stage " << stage << " step " << s + 1;
  }
#endif
}

}  // namespace
}  // namespace zoe::test

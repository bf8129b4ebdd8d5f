// `zoe train` on the GPU against the CPU device: the same GPT-2 job (fp32, AdamW, the embedded
// corpus) gives the same loss at every one of 20 steps to 1e-5, at stage 0 and at stage 3.
// On the emulated GPU (tools/cuda_emu) also: a failed CUDA, cuBLASLt or launch call ends the
// step with exit 1 and a line naming the op, a shape the kernels cannot run is exit 2 before any
// step, and a sweep that fails each call of one step in turn never finishes a wrong step or hangs.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"

#ifdef ZOE_HAVE_CUDA
#include "gpu/gpu_info.h"
#endif

namespace zoe::test {
namespace {

// The benches' and the plan's own logic under the emulation, not their kernels (the model-op and
// training tests check those with the race check inside launches): their runs leave that check
// off, a third to a half of their time. The streams' checks stay on; a GPU ignores the variable.
const std::string kZoeNoLaunchCheck = "CUDA_EMU_RACECHECK=0 " + kZoe;

// The losses of a 20-step GPT-2 job on `device` at `stage`, from its report: fp32, or bf16
// training with bf16 compute.
std::vector<double> losses(const std::string& device, int stage, bool bf16 = false) {
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
                           (bf16 ? " --set bf16.enabled=true --set zoe.compute_dtype='\"bf16\"'"
                                 : " --set bf16.enabled=false") +
                           " --set zero_optimization.stage=" + std::to_string(stage) +
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

// `zoe info` names the GPU libraries a job would load (they load at their first use, so no linker
// listing shows them): needs no GPU. The file where the library is here; else why not.
TEST(ZoeInfo, NamesTheGpuLibrariesAndTheirFiles) {
  std::string out;
  ASSERT_EQ(run_command(kZoe + " info", &out), 0) << out;
#ifdef ZOE_CUDA_EMU
  EXPECT_NE(out.find("gpu libraries: cuBLASLt emulated (tools/cuda_emu); NCCL emulated"), std::string::npos) << out;
  // Each GPU's free memory and the budget "auto" would make of it (the emulated GPU: 16 GiB).
  EXPECT_TRUE(std::regex_search(out, std::regex("gpu 0: cuda_emu .* 16.0 GiB, 1[56]\\.[0-9] GiB free: "
                                                "zoe.device_memory_budget \"auto\" 1[23]\\.[0-9] GiB\n")))
      << out;
#else
  EXPECT_TRUE(std::regex_search(out, std::regex("gpu libraries: cuBLASLt [0-9]+\\.[0-9]+\\.[0-9]+ \\(/[^)]*libcublasLt[^)]*\\); "
                                                "NCCL [0-9]+\\.[0-9]+\\.[0-9]+ \\(/[^)]*libnccl")))
      << out;
  std::string missing;
  ASSERT_EQ(run_command("ZOE_NCCL_LIBRARY=/nonexistent/libnccl.so.2 " + kZoe + " info", &missing), 0) << missing;
  EXPECT_NE(missing.find("NCCL not loaded: could not load /nonexistent/libnccl.so.2"), std::string::npos) << missing;
#endif
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

// bf16 compute on the GPU (cuBLASLt's bf16 products, the attention on tensor cores) against the
// CPU device's bf16 compute (oneDNN): 20 steps within 2e-2 of each other, the bound the CPU's bf16
// path keeps against transformers.
TEST(TrainGpu, Bf16ComputeTwentyStepsMatchTheCpuDevicesWithin2e2) {
#ifndef ZOE_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA (ZOE_HAVE_CUDA is not defined)";
#else
  std::string why;
  if (gpu::list_gpus(&why).empty()) GTEST_SKIP() << "no usable GPU, zoe train on cuda not tested: " << why;
  std::vector<double> cpu = losses("cpu", 3, true), gpu = losses("cuda", 3, true);
  ASSERT_EQ(cpu.size(), 20u);
  ASSERT_EQ(gpu.size(), 20u);
  double worst = 0;
  for (size_t s = 0; s < cpu.size(); ++s) {
    worst = std::max(worst, std::abs(gpu[s] - cpu[s]) / std::abs(cpu[s]));
    EXPECT_LE(std::abs(gpu[s] - cpu[s]), 2e-2 * std::abs(cpu[s])) << "step " << s + 1;
  }
  std::printf("bf16 compute, 20 steps: losses %.4f -> %.4f (cpu), %.4f -> %.4f (cuda), worst %.2e relative\n",
              cpu.front(), cpu.back(), gpu.front(), gpu.back(), worst);
#endif
}

// `zoe bench gpu --smoke`: every row the GPU check will print, on toy sizes (the emulated GPU
// runs it in seconds; on a GPU it is the same code as the real run): the copies, Adam, the bf16
// GEMM against a rate, the LM head at an odd vocabulary against a padded one, the bf16 step's
// model FLOP/s and its split by op group from GPU events.
TEST(BenchGpu, ASmokeRunHasEveryRowAndTheStepsSplit) {
#ifndef ZOE_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA (ZOE_HAVE_CUDA is not defined)";
#else
  std::string why;
  if (gpu::list_gpus(&why).empty()) GTEST_SKIP() << "no usable GPU, zoe bench gpu not tested: " << why;
  std::string dir = make_temp_dir("bench-gpu"), out;
  ASSERT_EQ(
      run_command(kZoeNoLaunchCheck + " bench gpu --smoke --json --dir " + dir + "/nvme > " + dir + "/b.json", &out), 0)
      << out << slurp(dir + "/b.json");
  const nlohmann::json j = nlohmann::json::parse(slurp(dir + "/b.json"));
  std::vector<std::string> cases;
  for (const auto& r : j["results"]) {
    cases.push_back(r["case"].get<std::string>());
    EXPECT_GT(r["measured"].get<double>(), 0) << r.dump();
    EXPECT_GT(r["baseline"].get<double>(), 0) << r.dump();
  }
  for (const char* want : {"bf16 GEMM 256^3 TFLOP/s", "bf16 LM head fwd+bwd, V 257 TFLOP/s", "gpt2 bf16 model TFLOP/s",
                           "gpt2 bf16 tokens/s, attention default vs mma", "gpt2 124M offloaded step s",
                           "gpt2 124M offloaded step vs bound s"})
    EXPECT_NE(std::find(cases.begin(), cases.end(), want), cases.end()) << want << " missing from " << j.dump();
  // The offloaded step's bound: every part measured, and the step moved bytes over the link and
  // the disk (parameters and optimizer state on NVMe).
  for (const auto& r : j["results"]) {
    if (r["case"] != "gpt2 124M offloaded step vs bound s") continue;
    const nlohmann::json& parts = r["parts"];
    for (const char* key : {"compute_s", "link_s", "disk_s", "cpu_adam_s", "h2d_bytes", "d2h_bytes",
                            "nvme_read_bytes", "nvme_written_bytes"})
      EXPECT_GT(parts.value(key, 0.0), 0) << key << ": " << r.dump();
    EXPECT_NEAR(r["baseline"].get<double>(),
                std::max({parts["compute_s"].get<double>(), parts["link_s"].get<double>(),
                          parts["disk_s"].get<double>(), parts["cpu_adam_s"].get<double>()}),
                1e-12)
        << r.dump();
  }
  const nlohmann::json& split = j["bf16_split"];
  for (const char* key : {"step_ms", "products_ms", "attention_forward_ms", "attention_backward_ms", "elementwise_ms"})
    EXPECT_GT(split.value(key, 0.0), 0) << key << ": " << split.dump();
  EXPECT_TRUE(split["ops_ms"].contains("attention_backward_bf16")) << split.dump();
  const double share = split.value("attention_share", -1.0);
  EXPECT_GT(share, 0);
  EXPECT_LT(share, 1);
#endif
}

// `zoe bench offload --device cuda`: the GPU's offloaded step (parameters and optimizer state on
// NVMe, the device a quarter of the state) against its compute-only and I/O-only steps on the same
// GPU, within its budget, the ratio the step over the larger of the two.
TEST(BenchOffloadGpu, TheOffloadedStepOnTheGpuAgainstItsComputeAndIoSteps) {
#ifndef ZOE_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA (ZOE_HAVE_CUDA is not defined)";
#else
  std::string why;
  if (gpu::list_gpus(&why).empty()) GTEST_SKIP() << "no usable GPU: " << why;
  std::string dir = make_temp_dir("bench-offload-gpu"), out;
  ASSERT_EQ(run_command(kZoeNoLaunchCheck + " bench offload --device cuda --smoke --json --dir " + dir + "/swap > " + dir +
                            "/o.json",
                        &out),
            0)
      << out << slurp(dir + "/o.json");
  const nlohmann::json j = nlohmann::json::parse(slurp(dir + "/o.json"));
  ASSERT_EQ(j.at("results").size(), 2u) << j.dump();
  for (const auto& r : j["results"]) {
    EXPECT_NE(r.at("case").get<std::string>().find("on cuda"), std::string::npos) << r.dump();
    const double step = r.at("step_s"), compute = r.at("compute_only_s"), io = r.at("io_only_s");
    EXPECT_GT(step, 0);
    EXPECT_GT(compute, 0);
    EXPECT_GT(io, 0);
    EXPECT_DOUBLE_EQ(r.at("ratio").get<double>(), step / std::max(compute, io));
    EXPECT_LE(r.at("peak_device_bytes").get<uint64_t>(), r.at("device_budget_bytes").get<uint64_t>()) << r.dump();
  }
#endif
}

// `zoe plan` on the GPU: it measures the GPU's Adam and the link each way beside the CPU's
// rates, times the model there, offers zoe.update_in_backward (a GPU's backward can hide the
// CPU's pass), and writes a config that trains on it; `zoe train --plan auto` trains its choice.
TEST(PlanGpu, MeasuresTheGpuAndItsLinkAndWritesAConfigThatTrainsThere) {
#ifndef ZOE_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA (ZOE_HAVE_CUDA is not defined)";
#else
  std::string why;
  const std::vector<gpu::GpuInfo> gpus = gpu::list_gpus(&why);
  if (gpus.empty()) GTEST_SKIP() << "no usable GPU: " << why;
  const std::string dir = make_temp_dir("plan-gpu"), files = " --out " + dir + "/plan.json --cache " + dir + "/cal.json";
  std::string job = " --set zoe.device='\"cuda\"' --set zoe.checkpoint.dir='\"\"' --set zoe.steps=2";
  for (const char* kv : {"zoe.model.n_layer=2", "zoe.model.n_embd=32", "zoe.model.n_head=2", "zoe.model.n_positions=32",
                         "zoe.data.seq_len=32", "train_micro_batch_size_per_gpu=1", "gradient_accumulation_steps=2",
                         "gradient_clipping=0",
                         "zoe.device_memory_budget='\"256MiB\"'", "zoe.host_memory_budget='\"512MiB\"'"})
    job += std::string(" --set ") + kv;
  job += " --set zero_optimization.offload_optimizer.nvme_path='\"" + dir + "/nvme\"'";
  std::string out;
  ASSERT_EQ(run_command(kZoeNoLaunchCheck + " plan" + job + files, &out), 0) << out;
  for (const char* said : {"cpu adam", "gpu", "host to device", gpus.front().name.c_str(), "micro-step", "configurations fit"})
    EXPECT_NE(out.find(said), std::string::npos) << said << " missing from:\n" << out;
  out.clear();
  ASSERT_EQ(run_command(kZoe + " plan --json --top 100000" + job + files, &out), 0) << out;  // from the cache
  const auto j = nlohmann::json::parse(out.substr(out.find('{')), nullptr, false);
  ASSERT_TRUE(j.is_object()) << out;
  int early = 0;
  for (const auto& p : j["plans"]) {
    EXPECT_GT(p["step_s"].get<double>(), 0);
    if (p["update_in_backward"].get<bool>()) {
      ++early;
      EXPECT_LT(p["stage"].get<int>(), 3) << p.dump();
      EXPECT_NE(p["offload_optimizer"], "-") << p.dump();
    }
  }
  EXPECT_GT(early, 0) << "the GPU's plans never run the CPU's pass beside the backward:\n" << out;
  const auto cal = nlohmann::json::parse(slurp(dir + "/cal.json"));
  int gpu_entries = 0;
  for (const auto& [key, m] : cal.items())
    if (m.contains("gpu")) {
      ++gpu_entries;
      int adam = 0;
      for (const auto& [rate, value] : m["gpu"].items()) {
        EXPECT_GT(value.get<double>(), 0) << rate << " in " << m.dump();
        adam += rate.rfind("adam_", 0) == 0;
      }
      EXPECT_EQ(adam, 1) << m.dump();
      EXPECT_EQ(m["gpu"].size(), 4u) << m.dump();
    }
  EXPECT_EQ(gpu_entries, 1) << cal.dump();
  ASSERT_EQ(run_command(kZoe + " train --quiet --config " + dir + "/plan.json --set zoe.steps=2", &out), 0) << out;
  // --plan auto reads its cache where it runs: this one, so it plans without measuring again.
  std::filesystem::create_directories(dir + "/out/plan");
  std::filesystem::copy_file(dir + "/cal.json", dir + "/out/plan/calibration.json");
  ASSERT_EQ(run_command("cd " + dir + " && " + kZoe + " train --plan auto" + job, &out), 0) << out;
  EXPECT_NE(out.find("(cached)"), std::string::npos) << out;
  EXPECT_NE(out.find("the plan (predicted"), std::string::npos) << out;
  EXPECT_NE(out.find("done: 2 steps"), std::string::npos) << out;
#endif
}

#ifdef ZOE_CUDA_EMU
// --- failures on the emulated GPU: tools/cuda_emu fails the call that CUDA_EMU_FAIL names ------

struct Outcome {
  int rc = -1;
  std::string out;
  double loss = NAN;  // step 1's, from the report (NaN without one)
};

// The loss of the last step line of a report (NaN without one).
double last_loss(const std::string& report) {
  double loss = NAN;
  std::ifstream f(report);
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains("step")) loss = j["loss"].get<double>();
  }
  return loss;
}

// A one-block GPT-2 on the emulated GPU, fp32, small enough for its kernels to run as fibers.
const std::string kOneBlockJob =
    " train --quiet --set zoe.device=cuda --set zoe.model.type=gpt2 --set zoe.model.n_layer=1"
    " --set zoe.model.n_embd=32 --set zoe.model.n_head=2 --set zoe.data.seq_len=16"
    " --set train_micro_batch_size_per_gpu=2 --set bf16.enabled=false";

// The one-block GPT-2 job with `args`, in a directory of its own, started as `launch` says
// (environment settings, then a launcher such as mpirun, or nothing); killed after timeout_s
// (exit 137: a hang).
Outcome one_block_job(const std::string& launch, const std::string& args, int timeout_s = 120) {
  const std::string dir = make_temp_dir("gpu-job");
  Outcome o;
  o.rc = run_command("cd " + dir + " && timeout -s KILL " + std::to_string(timeout_s) + " env " + launch + " " + kZoe +
                         kOneBlockJob + args + " --report r.jsonl",
                     &o.out);
  o.loss = last_loss(dir + "/r.jsonl");
  return o;
}

// One step of it at stage 3 on the emulated GPU (the default job's NVMe state too), with `env` set.
Outcome one_step(const std::string& env, const std::string& extra = "") {
  return one_block_job(env, " --set zero_optimization.stage=3 --set zoe.steps=1 --set zoe.checkpoint.dir='\"\"'" + extra);
}

bool has(const std::string& out, const std::string& regex) { return std::regex_search(out, std::regex(regex)); }

// run(i) for i = 0..count-1 on `workers` threads (each run a zoe process or job of its own);
// the outcomes in i's order.
template <class Run>
std::vector<Outcome> run_all(int count, int workers, Run run) {
  std::vector<Outcome> out(count);
  std::atomic<int> next{0};
  std::vector<std::future<void>> done;
  for (int w = 0; w < workers; ++w)
    done.push_back(std::async(std::launch::async, [&] {
      for (int i; (i = next++) < count;) out[i] = run(i);
    }));
  for (auto& f : done) f.get();
  return out;
}

// How many calls of `kind` a run with CUDA_EMU_COUNT=1 made (0 when it did not say).
int calls_of(const Outcome& o, const std::string& kind) {
  std::smatch m;
  return std::regex_search(o.out, m, std::regex("calls " + kind + " ([0-9]+)")) ? std::stoi(m[1]) : 0;
}

// zoe.allow_tf32: the fp32 products round their inputs to TF32, as the emulated cuBLASLt does under
// CUBLAS_COMPUTE_32F_FAST_TF32 (tensor cores): step 1's loss moves off the exact one, by no more
// than TF32's precision; without the key it is the exact one (TwentyStepsOnTheGpu... above).
TEST(GpuTf32, AllowTf32ReachesTheProductsAndStaysNearTheExactLoss) {
  const Outcome exact = one_step(""), tf32 = one_step("", " --set zoe.allow_tf32=true");
  ASSERT_EQ(exact.rc, 0) << exact.out;
  ASSERT_EQ(tf32.rc, 0) << tf32.out;
  EXPECT_NE(tf32.loss, exact.loss) << "zoe.allow_tf32 did not reach the products";
  EXPECT_LE(std::abs(tf32.loss - exact.loss), 1e-2 * std::abs(exact.loss)) << exact.loss << " " << tf32.loss;
}

// What every run with an injected failure must end in: exit 1 or 2 with zoe's line, or (a
// documented retry, such as the caching allocator's after freeing its cache) a finished step
// with the loss of the run without the failure. Never a signal, a hang, or another loss.
void expect_clean(const Outcome& o, double reference, const std::string& what) {
  EXPECT_TRUE(has(o.out, "cuda_emu: injected a failure")) << what << ": the failure was not reached\n" << o.out;
  if (o.rc == 0) {
    EXPECT_EQ(o.loss, reference) << what << ": finished with another loss\n" << o.out;
  } else {
    EXPECT_TRUE(o.rc == 1 || o.rc == 2) << what << ": exit " << o.rc << "\n" << o.out;
    EXPECT_TRUE(has(o.out, "(^|\n)zoe: ")) << what << ": no line from zoe\n" << o.out;
  }
}

TEST(GpuFaults, AFailedGemmEndsTheStepNamingTheOpAndItsSizes) {
  Outcome o = one_step("CUDA_EMU_FAIL=cublasLtMatmul:3");
  EXPECT_EQ(o.rc, 1) << o.out;
  EXPECT_TRUE(has(o.out, "zoe: a device op failed .*: [a-z_0-9]+\\(N [0-9]+, C [0-9]+, [A-Z]+ [0-9]+\\): .*"
                         "CUBLAS_STATUS_EXECUTION_FAILED"))
      << o.out;
  // Heuristic calls 1-4 are the forwards' bias epilogues, which fall back to the bias seeded by a
  // kernel where cuBLASLt has no such algorithm (the fault sweep below checks that those steps
  // end with the same loss); call 8 is the first backward's plain product.
  o = one_step("CUDA_EMU_FAIL=cublasLtMatmulAlgoGetHeuristic:8");
  EXPECT_EQ(o.rc, 1) << o.out;
  EXPECT_TRUE(has(o.out, "zoe: a device op failed .*matmul.*CUBLAS_STATUS_NOT_SUPPORTED")) << o.out;
}

TEST(GpuFaults, AFailedLaunchEndsTheStepNamingTheOp) {
  Outcome o = one_step("CUDA_EMU_FAIL=launch@gelu_forward:1");
  EXPECT_EQ(o.rc, 1) << o.out;
  EXPECT_TRUE(has(o.out, "zoe: a device op failed .*gelu_forward\\(N [0-9]+\\): .*cudaErrorLaunchOutOfResources"))
      << o.out;
  o = one_step("CUDA_EMU_FAIL=launch@attention_dq:1");
  EXPECT_EQ(o.rc, 1) << o.out;
  EXPECT_TRUE(has(o.out, "zoe: a device op failed .*attention_backward\\(B 2, T 16, C 32, NH 2\\)")) << o.out;
}

// Each cudaMalloc of the step in turn. The ops' workspaces and scratch come from the device's
// caching allocator with everything else, which frees its cache and asks once more when the GPU
// says it is full (a documented retry): such a step finishes with the loss of the run without
// the failure; any other ends the job, named.
TEST(GpuFaults, EachFailedCudaMallocOfAStepIsRetriedOrEndsTheStep) {
  const Outcome ref = one_step("CUDA_EMU_COUNT=1");
  ASSERT_EQ(ref.rc, 0) << ref.out;
  const int mallocs = calls_of(ref, "cudaMalloc");
  ASSERT_GT(mallocs, 0) << ref.out;
  int retried = 0;
  for (int n = 1; n <= mallocs; n++) {
    const Outcome o = one_step("CUDA_EMU_FAIL=cudaMalloc:" + std::to_string(n));
    expect_clean(o, ref.loss, "cudaMalloc " + std::to_string(n));
    retried += o.rc == 0;
  }
  EXPECT_GT(retried, 0) << "no failed cudaMalloc of the step was retried";
}

// The ops' workspaces count in zoe.device_memory_budget: a budget without room for cuBLASLt's
// ends the job before any step, naming the workspace and the key (the device-level test
// TheOpsWorkspacesComeFromTheBudgetAndShowInTheLedger has the scratch's, naming its op).
TEST(GpuFaults, ABudgetWithoutRoomForTheOpsWorkspaceEndsTheJobNamingIt) {
  const Outcome o = one_step("", " --set zoe.device_memory_budget='\"16MiB\"'");
  EXPECT_EQ(o.rc, 1) << o.out;
  EXPECT_TRUE(has(o.out, "zoe: .*its compute ops failed to start: the cuBLASLt workspace \\(33554432 bytes\\): device "
                         "memory budget exhausted.*zoe.device_memory_budget"))
      << o.out;
  EXPECT_TRUE(std::isnan(o.loss)) << "a step ran";
}

// zoe.device_memory_budget "auto" on cuda is the GPU's free memory less 3 GiB (the CUDA context's
// and NCCL's room, outside the budget): a GPU with less than 4 GiB free is a bad config naming the
// key and what is free, before anything is allocated; with more the job trains
// (CApi.AnAutoDeviceBudgetIsResolvedAtStart checks the value). CUDA_EMU_MEMORY sizes the GPU.
TEST(TrainGpu, AnAutoBudgetIsTheGpusFreeMemoryLessThreeGiB) {
  const std::string budget = " --set zoe.device_memory_budget='\"auto\"'";
  const Outcome small = one_step("CUDA_EMU_MEMORY=3758096384", budget);  // 3.5 GiB
  EXPECT_EQ(small.rc, 2) << small.out;
  EXPECT_TRUE(has(small.out, "zoe: config key 'zoe.device_memory_budget' \"auto\": rank 0's GPU has "
                             "3758096384 bytes \\(3.5 GiB\\) free, under the 3221225472 bytes"))
      << small.out;
  EXPECT_TRUE(std::isnan(small.loss)) << "a step ran";
  const Outcome fits = one_step("CUDA_EMU_MEMORY=6442450944", budget);  // 6 GiB: a budget of 3
  EXPECT_EQ(fits.rc, 0) << fits.out;
  EXPECT_TRUE(std::isfinite(fits.loss)) << fits.out;
  const Outcome unread = one_step("CUDA_EMU_FAIL=cudaMemGetInfo:1", budget);
  EXPECT_EQ(unread.rc, 2) << unread.out;
  EXPECT_TRUE(has(unread.out, "zoe: config key 'zoe.device_memory_budget' \"auto\": rank 0 cannot read its GPU's "
                              "free memory \\(cudaMemGetInfo of GPU 0: cudaError[A-Za-z]+\\): give a budget in bytes"))
      << unread.out;
}

// zoe.gpu picks one of the visible GPUs (the emulation has one): GPU 0 trains, GPU 1 is a bad
// config naming the key and how many are visible, before anything is allocated.
TEST(TrainGpu, ZoeGpuPicksAVisibleGpuOrNamesTheKey) {
  const Outcome zero = one_step("", " --set zoe.gpu=0");
  EXPECT_EQ(zero.rc, 0) << zero.out;
  EXPECT_TRUE(std::isfinite(zero.loss)) << zero.out;
  for (const char* budget : {"", " --set zoe.device_memory_budget='\"auto\"'"}) {
    const Outcome one = one_step("", std::string(" --set zoe.gpu=1") + budget);
    EXPECT_EQ(one.rc, 2) << one.out;
    EXPECT_TRUE(has(one.out, "zoe: config key 'zoe.gpu': GPU 1, but 1 GPU is visible")) << one.out;
    EXPECT_TRUE(std::isnan(one.loss)) << "a step ran";
  }
}

TEST(GpuFaults, AHeadSizeTheKernelsCannotRunIsABadConfig) {
  const Outcome o = one_step("", " --set zoe.model.n_embd=160 --set zoe.model.n_head=1");
  EXPECT_EQ(o.rc, 2) << o.out;
  EXPECT_TRUE(has(o.out, "zoe: config keys 'zoe.model.n_embd', 'zoe.model.n_head'.*head size 160 > 128")) << o.out;
}

// One rank under mpirun on cuda: its tensors move by the device's own copies and sums, as without
// mpirun (MPI's collectives would read GPU memory from the host: a crash). Stages 0 and 3 with
// two micro-steps (replicated gradients reduced at the step; sharded ones accumulated), the
// losses bitwise those of the same job without mpirun.
TEST(TrainGpu, OneRankUnderMpirunTrainsAsWithout) {
  auto run = [&](int stage, bool mpirun) {
    return one_block_job(mpirun ? kMpirun + "-q -np 1" : "",
                         " --set zoe.steps=2 --set gradient_accumulation_steps=2 --set zoe.checkpoint.dir='\"\"'"
                         " --set zero_optimization.stage=" + std::to_string(stage));
  };
  for (int stage : {0, 3}) {
    const Outcome alone = run(stage, false), under = run(stage, true);
    ASSERT_EQ(alone.rc, 0) << alone.out;
    ASSERT_EQ(under.rc, 0) << "stage " << stage << ": " << under.out;
    EXPECT_EQ(under.loss, alone.loss) << "stage " << stage;
  }
}

// zoe.nccl_reduce_scatter on 3 emulated GPUs: the gradients' reduce-scatter goes through
// ncclReduceScatter (counted by the emulation), and 3 steps give the rank-order sum's losses
// within its rounding (NCCL's ring adds in another order), at stages 2 and 3.
TEST(TrainGpu, NcclsOwnReduceScatterTrainsAsTheRankOrderSum) {
  auto run = [&](int stage, bool nccl) {
    return one_block_job("CUDA_EMU_COUNT=1 " + kMpirun + "-q -np 3",
                         " --set zoe.steps=3 --set zoe.checkpoint.dir='\"\"' --set zero_optimization.stage=" +
                             std::to_string(stage) + " --set zoe.nccl_reduce_scatter=" + (nccl ? "true" : "false"),
                         300);
  };
  for (int stage : {2, 3}) {
    const Outcome ranked = run(stage, false), ring = run(stage, true);
    ASSERT_EQ(ranked.rc, 0) << ranked.out;
    ASSERT_EQ(ring.rc, 0) << ring.out;
    EXPECT_EQ(calls_of(ranked, "ncclReduceScatter"), 0) << ranked.out;
    EXPECT_GT(calls_of(ring, "ncclReduceScatter"), 0) << ring.out;
    EXPECT_NEAR(ring.loss, ranked.loss, 1e-4 * std::fabs(ranked.loss)) << "stage " << stage;
  }
}

// Two ranks (NCCL over MPI in the emulation): each NCCL call of a step failed on rank 1 alone
// ends the job within seconds with rank 1's line, never a hang (the others may be waiting inside
// a collective for it: the job is aborted, as a rank failing alone is).
TEST(GpuFaults, AnNcclCallFailedOnOneRankEndsTheJob) {
  auto run = [&](const std::string& rank1_env) {
    const std::string dir = make_temp_dir("gpu-fault-nccl");
    Outcome o;
    o.rc = run_command("cd " + dir + " && timeout -s KILL 120 env " + kMpirun + "-q -np 2 sh -c '" +
                           "if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then export " + rank1_env + "; fi; exec " + kZoe +
                           kOneBlockJob + " --set zero_optimization.stage=3 --set zoe.steps=1 --set zoe.checkpoint.dir=\"\"'",
                       &o.out);
    return o;
  };
  const Outcome ref = run("CUDA_EMU_COUNT=1");
  ASSERT_EQ(ref.rc, 0) << ref.out;
  std::vector<std::pair<std::string, std::string>> cases;  // (kind, kind:n)
  for (const char* kind : {"ncclCommInitRank", "ncclAllGather", "ncclGroupEnd"})
    for (int n = 1; n <= calls_of(ref, kind); n++) cases.emplace_back(kind, std::string(kind) + ":" + std::to_string(n));
  EXPECT_GE(cases.size(), 5u) << "a step at two ranks makes fewer NCCL calls than expected";
  // Three jobs at a time: each is mostly rank 0's wait (3 s) for the failed rank at the barrier.
  const std::vector<Outcome> got =
      run_all(static_cast<int>(cases.size()), 3, [&](int i) { return run("CUDA_EMU_FAIL=" + cases[i].second); });
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& [kind, what] = cases[i];
    const Outcome& o = got[i];
    EXPECT_TRUE(has(o.out, "cuda_emu: injected a failure")) << what << ": not reached\n" << o.out;
    EXPECT_EQ(o.rc, 1) << what << " (137: a hang)\n" << o.out;
    EXPECT_TRUE(has(o.out, "zoe: rank 1: .*" + kind)) << what << "\n" << o.out;
  }
}

// Every call of one step that the emulation can fail (each n up to the step's count, two runs at
// a time) ends cleanly (expect_clean). The failed runs leave the race check inside launches off
// (the reference run keeps it): a failed call changes no kernel's code, and the check was 40 % of
// each of the 320 runs. The streams' checks (event order, memory still in use) stay on.
TEST(GpuFaults, EveryCallOfAStepFailedInTurnEndsCleanly) {
  const Outcome ref = one_step("CUDA_EMU_COUNT=1");
  ASSERT_EQ(ref.rc, 0) << ref.out;
  const int total = calls_of(ref, "any");
  EXPECT_GT(total, 200) << "a step makes fewer calls than the sweep expects";
  const std::vector<Outcome> got =
      run_all(total, 2, [&](int i) {
        return one_step("CUDA_EMU_RACECHECK=0 CUDA_EMU_FAIL=any:" + std::to_string(i + 1));
      });
  for (int i = 0; i < total; ++i)
    expect_clean(got[i], ref.loss, "call " + std::to_string(i + 1) + " of " + std::to_string(total));
  std::printf("fault sweep: %d calls failed in turn, each ended cleanly or was reported above\n", total);
}
#endif

}  // namespace
}  // namespace zoe::test

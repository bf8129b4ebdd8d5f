// Drives the engine with the MLP test model directly (no CLI), for the ZeRO tests.
#pragma once
#include <memory>
#include <vector>

#include "comm/comm.h"
#include "common/config.h"
#include "cpu/cpu_device.h"
#include "model/mlp_model.h"
#include "sched/zero_engine.h"
#include "train/batch_source.h"
#include "zoe/engine.h"
#include "test_util.h"

namespace zoe::test {

struct MlpRun {
  std::vector<float> params;      // every unit's full parameters after training, fp32
  std::vector<double> losses;     // this rank's micro-batch loss sum per step
  std::vector<double> grad_norms;  // the global gradient norm of each step (before clipping)
  std::vector<CommBytes> comm;    // bytes this rank sent, per step
  LedgerSnapshot ledger;
  LedgerSnapshot at_start;        // right after the engine's allocate()
  int64_t padded = 0, shard = 0;
  int64_t largest_chunk = 0;      // elements of the largest unit each rank owns
  int64_t host_stepped = 0;       // optimizer elements the CPU Adam stepped on the host, last step
  int64_t owned = 0;              // optimizer elements this rank owns (real, no padding)
  int skipped = 0;                // steps not applied (overflow)
  int taken_back = 0;             // steps whose update in the backward was taken back (StepResult)
  ZeroEngine::SchedStats sched;   // what stage 3's scheduler did
};

// The device the engine tests run on (test_util.h's test_device_name(): ZOE_TEST_DEVICE), with the
// communicator its tensor traffic takes: NCCL beside `control` on cuda at several ranks, else
// `control` itself.
struct TestDevice {
  std::unique_ptr<Device> device;
  std::unique_ptr<Comm> tensor_comm;
  Comm* comm = nullptr;
};
Result<TestDevice> make_test_device(size_t device_budget, size_t host_budget, Comm& control);

inline Config mlp_config(int stage, DType dtype, int layers = 5, int width = 36) {
  Config c;
  c.stage = stage;
  c.dtype = dtype;
  c.n_layer = layers;
  c.n_embd = width;  // 36*36+36+1 = 1333 = 31*43 per unit, P = 5*1333: no N in 2..4 divides either
  c.micro_batch = 4;
  c.lr = 1e-2;
  c.weight_decay = 0.1;
  c.grad_clip = 1.0;
  c.device_memory_budget = 64 << 20;
  c.host_memory_budget = 64 << 20;
  return c;
}


// Every unit's full parameters, fp32, back to back in unit order.
Result<std::vector<float>> all_params(Engine& e);

// Trains `steps` optimizer steps of any model from its default init; on failure returns the Status.
// flush_each_step: wait for every step's update before the next forward (stage 3 otherwise
// overlaps it with that forward, and how far prefetching gets depends on the threads' timing).
Result<MlpRun> run_model(const Config& c, Comm& comm, int steps, Model& model, BatchSource& source,
                         bool flush_each_step = false);
Result<MlpRun> run_mlp(const Config& c, Comm& comm, int steps, bool flush_each_step = false);

// Stage 3's scheduler off (no prefetch, no reuse: every fetch loads and gathers), and on with
// room for about one of the MLP's units ahead and two live.
Config scheduler_off(Config c);
Config scheduler_tight(Config c);

// Homes the optimizer state (and at stage 3 the parameters) on NVMe under `dir` with `ratio`
// of each kind there; small aio blocks so that a small model still spans many of them.
Config with_nvme_offload(Config c, const std::string& dir, double ratio);
// Checks that training with state on NVMe (ratio 1 and 0.5) or in host memory (0.5 and 1) gives
// bitwise the in-memory weights at stages 1-3 with the scheduler off, on and tight, and that the ledger moved exactly the offloaded
// bytes off the device tier.
// Returns "" or what differed.
std::string check_nvme_matches_memory(Comm& comm);

// Drives fetch / grads_ready / step by hand, one unit order per step (gradients are a function
// of what each fetch returned); the final weights.
Result<std::vector<float>> run_orders(const Config& c, Comm& comm, const std::vector<std::vector<int>>& orders,
                                      ZeroEngine::SchedStats* stats, bool flush_each_step);
// Steps that leave the recorded unit order (another order, an early stop) give bitwise the
// weights of the same steps without the scheduler. Returns "" or what differed.
std::string check_reordered_steps_match(Comm& comm);
// Stage 3 with a device budget of a quarter of its persistent footprint (state offloaded to
// host memory, then to NVMe) trains to the same weights with the ledger's device peak within the
// budget, with gradient reductions in flight beside the backward; on NVMe, chunks are read
// ahead into pinned memory while the device has no room.
std::string check_quarter_budget(Comm& comm);
// The communicator that reduces holds its staging (host memory for MPI, device memory for
// NCCL's rank-order sum) from allocate() on, one largest reduction's worth, booked as kind comm:
// the ledger shows the same bytes then and after training, at stages 0-3 with and without the
// communication thread. Returns "" or what differed.
std::string check_staging_booked_at_start(Comm& comm);
// Gradient reductions on the engine's communication thread (overlap_comm) give bitwise the
// weights and the same traffic as reductions at the hand-over: stages 2 and 3, fp32 and bf16,
// with and without accumulation micro-steps; and they did run there.
std::string check_overlapped_reductions(Comm& comm);
// zoe.update_in_backward (no clipping) gives the weights and norms of the update after the
// backward bit for bit, at stages 0-3, fp32 and bf16, with accumulation, state in device memory,
// host memory and on NVMe; at stages 2-3 units are released to the update during the backward,
// at 0-1 (gradients reduced at step()) none are. Returns "" or what differed.
std::string check_update_in_backward(Comm& comm);
// zoe.update_in_backward beside clipping and fp16's loss scaling, where the update begun in the
// backward is speculative: a clip that never bites gives the update after the backward's weights
// bit for bit, nothing taken back; one that bites every step (fp32, bf16) and overflowing fp16
// steps are taken back and redone (or skipped), within roundings of the update after the backward.
// Stages 0 and 3, state in device memory, host memory and (stage 3) on NVMe; on more ranks and on
// cuda stage 3's fp32 and fp16 cases in memory and on NVMe. "" or what differed.
std::string check_speculative_update(Comm& comm);

}  // namespace zoe::test

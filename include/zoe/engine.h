// The engine's unit API: all a model (built-in, or a foreign framework through the C API, zoe.h)
// needs to train under ZeRO. Per micro-step: for each unit, fetch -> compute -> release; in
// backward, fetch -> compute gradients -> grads_ready -> release. Then step() once per
// optimizer step (after gradient_accumulation_steps micro-steps). A model is handed an Engine;
// the job that runs it makes one from its configuration (the training job, the C API).
//
// The ZeRO stage only decides what is sharded; the pipeline is the same for every stage:
//   stage >= 1: optimizer state (fp32 master, exp_avg, exp_avg_sq) covers this rank's shard
//   stage >= 2: reduced gradients are kept for this rank's shard only
//   stage >= 3: parameters are kept for this rank's shard only and gathered by fetch()
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "zoe/dtype.h"
#include "zoe/ledger.h"
#include "zoe/status.h"
#include "zoe/unit.h"

namespace zoe {

class Device;

struct ParamView {
  const void* data = nullptr;  // device memory: numel elements of `dtype`, the unit's full parameters
  DType dtype = DType::kF32;
  int64_t numel = 0;
};

struct StepResult {
  bool applied = false;      // false: skipped because a gradient was not finite
  double grad_norm = 0;      // global L2 norm of the averaged, unscaled gradient (before clipping)
  double loss_scale = 1;     // the scale the step's gradients carried
  double lr = 0;
  int64_t step = 0;          // optimizer steps applied so far
  bool update_taken_back = false;  // zoe.update_in_backward: clipping or overflow made it take back what it stepped
  // Known once the update is done (Engine::flush; step() fills them where it waited for it):
  uint64_t nonfinite = 0;    // non-finite gradient elements met by the kernel (0 when skipped early)
  int64_t host_stepped = 0;  // optimizer elements the CPU Adam stepped on the host (ZeRO-Offload)
};

// Optimizer-owned state a checkpoint moves: fp32 master (the weights themselves in fp32 training),
// exp_avg, exp_avg_sq.
enum class OwnedKind : uint8_t { kMaster = 0, kExpAvg = 1, kExpAvgSq = 2 };

// This rank's optimizer-owned elements of a unit: [begin, end), unit-relative, real elements only.
struct OwnedRange {
  int64_t begin = 0, end = 0;
};

class Engine {
 public:
  virtual ~Engine() = default;
  // The device the engine keeps its state on: a model allocates its buffers there and runs its
  // kernels through device().ops(); ParamView::data and grads_ready's gradient are its memory.
  virtual Device& device() = 0;
  virtual int num_units() const = 0;
  virtual const UnitSpec& unit(int u) const = 0;
  virtual int64_t params() const = 0;  // P, unpadded

  // Sets unit u's parameters from its full fp32 values (every rank passes the same values).
  virtual Status set_params(int u, const float* values) = 0;
  // Makes unit u's full parameters available (gathering them if sharded). Nested calls nest.
  virtual Result<ParamView> fetch(int u) = 0;
  virtual Status release(int u) = 0;
  // Hands over this micro-step's gradient of unit u (numel fp32 values in device memory, of the
  // loss multiplied by loss_scale()). Call at most once per unit per micro-step.
  virtual Status grads_ready(int u, const float* grad) = 0;
  // Reduces, clips and applies the accumulated gradients with learning rate `lr`; an error (on
  // every rank) when no rank handed over a gradient since the last step. Stage 3
  // returns before the update is applied: it runs on, overlapped with the next forward, and each
  // fetch waits only for its own unit's update (results are those of the serial order).
  virtual Result<StepResult> step(double lr) = 0;
  // With zoe.update_in_backward, called before a step's last micro-step: each unit's update
  // begins as soon as its gradient is final, beside the rest of the backward, in lr, assuming the
  // step is neither clipped nor skipped; step() must then pass the same lr, and where the global
  // norm clips or overflows it takes the update back and redoes or skips it (within roundings of
  // the update after the backward). Without the key: nothing.
  virtual Status update_during_backward(double lr) = 0;
  // A unit's gradient handed over by some ranks only is reduced with zeros from the others (as
  // DDP's find_unused_parameters). With `on`, step() instead checks that every rank handed over
  // the same units since the last step; if not it fails on every rank, naming a unit and the
  // ranks, and drops the step's gradients (the C API turns this on: a foreign framework that
  // forgets a unit on one rank hears of it).
  virtual void require_matching_grads(bool on) = 0;
  // Waits for the last step's update and returns that step's result complete (nonfinite and
  // host_stepped are known only then); an error of the update, if it failed.
  virtual Result<StepResult> flush() = 0;

  // The model's activation memory on this rank right now (bytes): booked in the ledger as
  // transient device memory, so peak_device_bytes covers it.
  virtual void set_activation_bytes(uint64_t bytes) = 0;

  virtual double loss_scale() const = 0;
  virtual int64_t steps_applied() const = 0;
  virtual OwnedRange owned_range(int u) const = 0;
  // Copies owned elements [begin, end) (unit-relative, inside owned_range(u)) of one kind to or
  // from host memory as fp32, wherever that state lives (device, host or NVMe). Checkpoints move
  // state through these in pieces, never as a whole-state host copy.
  virtual Status read_owned(int u, OwnedKind k, int64_t begin, int64_t end, float* dst) = 0;
  virtual Status write_owned(int u, OwnedKind k, int64_t begin, int64_t end, const float* src) = 0;
  // After write_owned() (checkpoint load): refresh the low-precision weights from the masters and
  // gather them where they are replicated. Collective.
  virtual Status commit_owned_state() = 0;

  // Bytes the NVMe tier's devices have moved since the engine was made: whole requests, so
  // padding and read-modify-write reads count (zero without state on NVMe). A transfer counts
  // once it completes; after wait_nvme_idle() every transfer submitted so far has.
  struct NvmeBytes {
    uint64_t read = 0, written = 0;
  };
  virtual NvmeBytes nvme_bytes() const = 0;
  virtual void wait_nvme_idle() = 0;
};

}  // namespace zoe

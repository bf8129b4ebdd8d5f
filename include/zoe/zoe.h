/* zoe's C API: ZeRO training with NVMe offload as a backend of another framework (C99).
 *
 * Opaque handles, error codes, and a thread-local message (zoe_last_error) for the last failure;
 * no C++ type or exception crosses this header. Tensors cross it as DLPack (dlpack/dlpack.h).
 *
 * One engine's life, on every rank (ranks come from mpirun; without it there is one rank):
 *   zoe_engine_new(config_json)            the same keys as `zoe train`'s config file
 *   zoe_register_param(...) for every parameter, unit by unit
 *   zoe_start()                            collective: shards the state, opens the NVMe files
 *   zoe_set_param() / zoe_load_safetensors()   initial values
 *   per micro-step, per unit: zoe_fetch -> compute -> zoe_release;
 *                   in backward: zoe_fetch -> gradients -> zoe_grad_param/zoe_grads_ready -> zoe_release
 *   zoe_step()                             collective: reduce, clip, Adam
 *   zoe_engine_close()                     the last update's error, then the engine is freed
 * Calls that are collective must be made by every rank in the same order. zoe serialises calls on
 * one engine; calls may come from any thread where MPI allows it (zoe asks MPI for
 * MPI_THREAD_MULTIPLE; SERIALIZED suffices), else only from the thread that created the engine.
 */
#ifndef ZOE_ZOE_H_
#define ZOE_ZOE_H_

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ZOE_API __attribute__((visibility("default")))

typedef enum zoe_status {
  ZOE_OK = 0,
  ZOE_ERR_INVALID = 1,       /* bad argument, config, shape, dtype, file */
  ZOE_ERR_IO = 2,            /* a read or write failed (disk full, device error) */
  ZOE_ERR_OUT_OF_MEMORY = 3, /* a memory budget is exhausted */
  ZOE_ERR_CORRUPT = 4,       /* a checkpoint or state file fails its checks */
  ZOE_ERR_COMM = 5,          /* MPI or NCCL failed */
  ZOE_ERR_RUNTIME = 6,       /* a call out of order (before zoe_start, ...), ranks out of step, ... */
  ZOE_ERR_UNSUPPORTED = 7    /* valid, but not possible with this build or device */
} zoe_status;

typedef struct zoe_engine zoe_engine;

typedef struct zoe_step_result {
  int applied;          /* 0: skipped because a gradient was not finite */
  double grad_norm;     /* global L2 norm of the averaged gradient, before clipping */
  double loss_scale;    /* the scale the step's gradients carried (multiply the loss by zoe_loss_scale) */
  double lr;
  int64_t step;         /* optimizer steps applied so far */
} zoe_step_result;

/* The message of this thread's last failed call ("" if none). Valid until this thread's next call. */
ZOE_API const char* zoe_last_error(void);
ZOE_API const char* zoe_version(void);

/* Creates an engine from a JSON config text (keys as in `zoe train`; zoe.model and zoe.data are
 * ignored). Starts MPI when launched by mpirun; WORLD_SIZE > 1 without MPI (torchrun, accelerate
 * launch) is ZOE_ERR_INVALID, since each process would train alone. *out is NULL on failure. */
ZOE_API zoe_status zoe_engine_new(const char* config_json, zoe_engine** out);
/* Waits for the last update (at stage 3 it runs on after zoe_step returns), then frees the engine
 * (removes its NVMe files) whatever the update's outcome; returns that update's error, if it
 * failed. No call on e may be in progress or follow. NULL is a no-op (ZOE_OK). */
ZOE_API zoe_status zoe_engine_close(zoe_engine* e);
/* zoe_engine_close without a result: an update's error is written to stderr, not returned. */
ZOE_API void zoe_engine_free(zoe_engine* e);
ZOE_API int zoe_rank(const zoe_engine* e);
ZOE_API int zoe_world_size(const zoe_engine* e);

/* Registers parameter `name` (unique) of shape shape[0..ndim) in unit `unit` (units are numbered
 * in order of first registration, tensors within a unit in order of registration). dtype must be
 * the engine's weight dtype (float32, or bfloat16/float16 when the config enables them). Before
 * zoe_start only. */
ZOE_API zoe_status zoe_register_param(zoe_engine* e, const char* unit, const char* name, int ndim,
                                      const int64_t* shape, DLDataType dtype, int weight_decay);
/* Builds the engine over the registered units (collective). */
ZOE_API zoe_status zoe_start(zoe_engine* e);

ZOE_API int zoe_num_units(const zoe_engine* e);
ZOE_API int64_t zoe_num_params(const zoe_engine* e);
/* Unit of a registered unit name or parameter name, or -1. */
ZOE_API int zoe_unit_index(const zoe_engine* e, const char* unit_or_param);
/* Parameter `name`'s place: its unit, element offset in the unit's flat buffer, and element count. */
ZOE_API zoe_status zoe_param_info(const zoe_engine* e, const char* name, int* unit, int64_t* offset, int64_t* numel);

/* Tensors handed in (initial values, gradients) are checked before zoe reads a byte: a float dtype,
 * at most 64 dimensions, non-negative strides, counts that do not overflow, and every byte they span
 * (data + byte_offset + the strides' reach) below 2^56, the top of the largest user address space
 * (x86-64 with 5-level paging; aarch64's is 2^52 at most): else ZOE_ERR_INVALID naming the call and
 * the field (a byte_offset of 2^62 on a valid pointer is refused, not read). */
/* Initial values. zoe_set_param takes host memory of any float dtype and any strides; a unit's
 * values are applied when all its parameters are set, and then rank 0's count (collective: every
 * rank sets the same parameters in the same order). */
ZOE_API zoe_status zoe_set_param(zoe_engine* e, const char* name, const DLTensor* value);
/* Every registered parameter from a safetensors file (float32/bfloat16/float16 tensors of the same
 * names and shapes). */
ZOE_API zoe_status zoe_load_safetensors(zoe_engine* e, const char* path);

/* Unit u's full parameters (gathered if sharded: collective at stage 3), as a 1-D tensor of the
 * unit's elements in the engine's weight dtype, in the engine device's memory (kDLCPU for the CPU
 * device, kDLCUDA for the GPU). Zero-copy: valid until the matching zoe_release. The caller calls
 * (*out)->deleter(*out) when done with the handle (it frees the handle, never the memory). A
 * fetched unit must be released before zoe_step (which refuses otherwise). The memory holds the
 * parameters when this returns, or, with zoe_set_stream, for work then queued on that stream. */
ZOE_API zoe_status zoe_fetch(zoe_engine* e, int unit, DLManagedTensor** out);
/* Where zoe's memory is, after zoe_start: what zoe_fetch's tensors carry, kDLCPU for the CPU device
 * or kDLCUDA and the GPU's ordinal, so that a framework can place what zoe does not hold (buffers,
 * inputs) beside it. */
ZOE_API zoe_status zoe_device(zoe_engine* e, DLDevice* out);
ZOE_API zoe_status zoe_release(zoe_engine* e, int unit);

/* The framework's own memory on zoe's device right now, in bytes (on a GPU: what its allocator
 * holds, torch.cuda.memory_reserved): booked in zoe's ledger as activations, so that stage 3 keeps
 * and prefetches units only in what it leaves of zoe.device_memory_budget, and the peak device
 * bytes zoe reports cover it. Call it before each zoe_fetch, as it grows. After zoe_start. */
ZOE_API zoe_status zoe_set_activation_bytes(zoe_engine* e, uint64_t bytes);

/* zoe's later device work waits for what `stream` (a cudaStream_t of zoe's GPU) has queued so far:
 * call it before zoe_release and before handing gradients over when a framework's kernels on that
 * stream may still read a unit's buffer or write a gradient (an event, not a host wait). Nothing to
 * wait for on the CPU device (any value is accepted there). */
ZOE_API zoe_status zoe_wait_stream(zoe_engine* e, void* stream);

/* The other direction: names the caller's stream (a cudaStream_t of zoe's GPU, NULL being CUDA's
 * default stream, as for zoe_wait_stream) that reads what zoe_fetch returns and writes the
 * gradients zoe_grad_param / zoe_grads_ready read. Once a stream is set, those calls return
 * without waiting on the host: work the caller queues on that stream afterwards waits for the
 * gather, and for zoe's read of a gradient (events), so the host runs ahead of the GPU as it does
 * with the framework's own kernels. Until the first call, they return once the device has done
 * that work. Each call replaces the stream. No effect on the CPU device. */
ZOE_API zoe_status zoe_set_stream(zoe_engine* e, void* stream);

/* Gradients of the loss multiplied by zoe_loss_scale(), any float dtype and strides, in host memory
 * or (CUDA device) in the GPU's memory. zoe_grad_param stages one parameter's gradient;
 * zoe_grads_ready hands over unit u's gradient for this micro-step: `grad` is the whole unit
 * (numel elements), or NULL for what zoe_grad_param staged (a parameter without one counts as
 * zeros). Every rank hands over the same units in a step (zeros where it has no gradient): at
 * stages 2-3 the hand-over is collective, and zoe_step fails on every rank, dropping the step's
 * gradients, when a unit was handed over on some ranks only. Both return once `grad` has been read:
 * the caller may free or reuse its memory at once (call zoe_wait_stream first when kernels on a
 * stream of the caller's may still be writing it). */
ZOE_API zoe_status zoe_grad_param(zoe_engine* e, const char* name, const DLTensor* grad);
ZOE_API zoe_status zoe_grads_ready(zoe_engine* e, int unit, const DLTensor* grad);

/* One optimizer step with learning rate lr. Collective. lr is a finite number in [0, 1e30], the
 * bounds the config file sets for optimizer.params.lr, or a finite lr < 0 for the config's
 * optimizer/scheduler value; NaN, +-inf and lr > 1e30 are ZOE_ERR_INVALID naming the value (the
 * optimizer's other hyperparameters come from the config only). Gradients still staged by
 * zoe_grad_param are handed over first. Refused, stepping nothing and keeping the gradients,
 * while a unit is fetched and not released (ZOE_ERR_RUNTIME "zoe_step: unit 3 ('h.3') is still
 * held (fetched and not released); release it before stepping", or "N units are still held:
 * ..."): an error, not a wait, as the caller holds the unit and the update would move the weights
 * under its view; and with a bad lr. Both are found before the step's first collective, on the
 * rank concerned: other ranks wait in their zoe_step until it calls zoe_step again. Errors on
 * every rank, dropping the step's gradients, when no rank handed over any gradient since the last
 * step, or ranks handed over different units. */
ZOE_API zoe_status zoe_step(zoe_engine* e, double lr, zoe_step_result* out);
/* With the config key zoe.update_in_backward (gradient_clipping 0, no fp16): announces the next
 * step's lr (checked as zoe_step checks it; lr < 0: the config's value) before that step's last
 * micro-step, so that each unit's update begins as soon as its gradient is final, during the
 * backward; zoe_step must then get the same lr (or < 0), and a step with non-finite gradients
 * fails instead of being skipped. Without the key it does nothing. Collective only as far as the
 * hand-overs it precedes are. */
ZOE_API zoe_status zoe_update_during_backward(zoe_engine* e, double lr);
ZOE_API double zoe_loss_scale(const zoe_engine* e);

/* Checkpoints (collective): zoe_save writes <dir>/step_<N> (crash-safe, keeps the newest
 * checkpoint_keep); zoe_load reads a checkpoint directory, or the newest under a root. zoe_export
 * writes the consolidated weights as one fp32 safetensors file of the registered names, from rank 0
 * (the gathered weights: in bf16/fp16 training those values widened, not the fp32 masters, which
 * zoe_save keeps and `zoe export --checkpoint` consolidates), streamed a unit at a time (rank 0
 * holds one unit's copy, not the model's), with the {"format": "pt"} metadata transformers' loaders
 * require. The path may name only a new or a regular file (a link, device or FIFO: ZOE_ERR_INVALID). */
ZOE_API zoe_status zoe_save(zoe_engine* e, const char* dir);
ZOE_API zoe_status zoe_load(zoe_engine* e, const char* path);
ZOE_API zoe_status zoe_export(zoe_engine* e, const char* safetensors_path);

/* This rank's memory ledger (bytes per tier and kind, now and peak) and counters as JSON. The
 * string is the caller's: free it with zoe_free_string. */
ZOE_API zoe_status zoe_stats_json(zoe_engine* e, char** out);
ZOE_API void zoe_free_string(char* s);

#ifdef __cplusplus
}
#endif

#endif /* ZOE_ZOE_H_ */

#!/usr/bin/env bash
# Mutation checks of the emulated GPU (tools/cuda_emu): each mutation breaks src/gpu, the engine or
# the model the way GPU code breaks (a missing barrier or event wait, a lost atomic, a race between
# blocks, shared memory without its opt-in, an error dropped on its way to the step), and a test
# under the emulation must catch it: fail, printing EXPECT (the emulation's message where it has
# one). A mutation whose text is no longer in its file stops the script with exit 1, naming it.
# Files are put back after each (and on exit), then the build is rebuilt.
#   tools/cuda_emu/mutations.sh      (BUILD_DIR: default build, a build with ZOE_CUDA_EMU)
# tools/test.sh runs it beside the sanitizer passes; about 5 minutes alone on 2 cores (a rebuild of
# the mutated target each: one TU and its links; each line says its build and test seconds).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
export ZOE_TEST_DEVICE=cuda ZOE_TEST_BINARY=$build/zoe_emu CUDA_EMU_DELAY=30
backup=$(mktemp)
current=""
restore() { [[ -n $current ]] && cp "$backup" "$root/$current"; current=""; }
finish() {
  restore
  rm -f "$backup"
  echo "mutations.sh: rebuilding the unmutated targets"
  cmake --build "$build" >/dev/null
}
trap finish EXIT

# mutate FILE OLD NEW: OLD (exactly once in FILE, may span lines) becomes NEW.
mutate() {
  current=$1
  cp "$root/$1" "$backup"
  python3 - "$root/$1" "$2" "$3" <<'PY'
import sys
path, old, new = sys.argv[1:]
s = open(path).read()
if s.count(old) != 1:
    sys.exit(f"mutations.sh: the mutation's text {old!r} is not in {path} exactly once: update the mutation")
open(path, "w").write(s.replace(old, new))
PY
}

caught=0 missed=0
# check NAME TARGET EXPECT COMMAND...: builds TARGET, runs COMMAND; it must fail and print EXPECT
# (an extended regular expression).
check() {
  local name=$1 target=$2 expect=$3 t0=$SECONDS; shift 3
  cmake --build "$build" --target "$target" >/dev/null
  local out rc=0 t1=$SECONDS
  out=$(cd "$build" && "$@" 2>&1) || rc=$?
  if [[ $rc -ne 0 ]] && grep -Eq -- "$expect" <<<"$out"; then
    echo "caught    $name (build $((t1 - t0)) s, test $((SECONDS - t1)) s): $(grep -Em1 -- "$expect" <<<"$out" | cut -c1-220)"
    caught=$((caught + 1))
  else
    echo "MISSED    $name (exit $rc; expected: $expect)"
    { grep -E "cuda_emu|Failure|zoe:" <<<"$out" || true; } | head -5 | sed 's/^/          /'
    missed=$((missed + 1))
  fi
  restore
}
ops_test() { echo tests/cuda_model_ops_gpu_test_emu --gtest_filter="$1"; }

# --- a dropped event wait: the streams' race check ---
mutate src/gpu/cuda_device.cc "  ZOE_RETURN_IF_ERROR(wait_on(copy_stream, record(Stream::kCompute)));" ""
check "no event wait between the compute and copy streams (CudaDevice::upload/download)" cuda_device_gpu_test_emu \
  "cuda_emu: race on" tests/cuda_device_gpu_test_emu --gtest_filter='*UploadAndDownloadWait*'

mutate src/gpu/cuda_device.cc "  return check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), ev, 0), \"cudaStreamWaitEvent on the caller's stream\");" \
  "  return ev ? Status::Ok() : Status::Ok();  // mutation: the caller's stream does not wait"
check "a framework's stream not waiting for a fetch or a gradient's read (CudaDevice::external_wait_on)" \
  capi_test_emu "cuda_emu: race on" tests/capi_test_emu --gtest_filter='CApiEmu.*'

mutate src/sched/stage3/chunk_load.cc "  ZOE_RETURN_IF_ERROR(dev_.wait_on(Stream::kH2D, dev_.record(Stream::kCompute)));
  h2d_ordered_ = true;" "  h2d_ordered_ = true;"
check "a gather buffer reused by the next unit's load before its last reader ran (ChunkLoad)" zero_test_emu \
  "cuda_emu: race on" tests/zero_test_emu --gtest_filter='*AQuarterOfTheFootprint*'

mutate src/sched/stage3/window_retirement.cc "      if (dev_.done(it->read_by)) {" \
  "      if (true) {  // mutation: the windows go back before their copies ran"
# (The streams' check sees it first where the load's gather buffer is reused before its copy ran;
# tests/pinned_guard_emu.cc checks the pinned guard alone.)
check "pinned NVMe windows handed to new reads before their queued copies ran (WindowRetirement::reclaim)" \
  cuda_device_gpu_test_emu "cuda_emu: race on|pinned host memory changed between" tests/cuda_device_gpu_test_emu \
  --gtest_filter='*AFetchFromNvmeRetiresItsWindowsInsteadOfWaiting*'
mutate src/sched/stage3/chunk_load.cc "  st = dev_.wait_on(Stream::kCompute, copied_);" \
  "  st = Status::Ok();  // mutation: the compute stream does not wait for the upload"
check "a fetch from memory that neither the host nor the compute stream waits for (finish_for_compute)" \
  cuda_device_gpu_test_emu "cuda_emu: race on" tests/cuda_device_gpu_test_emu --gtest_filter='*AFetchFromHostMemory*'

# --- host code and copies ---
mutate src/gpu/cuda_device.cc "  ZOE_RETURN_IF_ERROR(make_current());
  return gpu::accumulate_cuda(" "  ZOE_RETURN_IF_ERROR(make_current());
  if (n > 0) *static_cast<volatile char*>(dst) = 0;  // mutation: host code writes device memory
  return gpu::accumulate_cuda("
check "host code reading or writing a device buffer (CudaDevice::accumulate)" cuda_device_gpu_test_emu \
  "cuda_emu: host code touched device memory" tests/cuda_device_gpu_test_emu --gtest_filter='*AccumulateIsBitwise*'

mutate src/gpu/cuda_device.cc "  ZOE_RETURN_IF_ERROR(check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s)," \
  "  ZOE_RETURN_IF_ERROR(check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s),"
check "cudaMemcpyHostToDevice for a device-to-host copy (CudaDevice::download)" cuda_device_gpu_test_emu \
  "cudaMemcpyHostToDevice copies from device memory to host memory" tests/cuda_device_gpu_test_emu \
  --gtest_filter='*UploadAndDownloadWait*'

check "two ranks issue their NCCL calls in another order" nccl_order_emu \
  "NCCL call order differs between ranks" mpirun --oversubscribe -np 2 tests/nccl_order_emu --swapped

# --- the communication thread's event order (CommWorker, NcclComm's duplicate) ---
# (Before the kernels' mutations: zero_mpi_test_emu's build also builds the real zero_mpi_test
# and zoe, which would recompile every restored kernel file with nvcc here, and again at the end.)
mutate src/sched/comm_worker.cc "  const Event ready = by_events_ ? dev_.record(Stream::kCompute) : Event{};" \
  "  const Event ready{};  // mutation: a job does not wait for the compute that made its inputs"
check "a reduction that starts before its gradient is in its buffer (CommWorker::submit)" zero_mpi_test_emu \
  "cuda_emu: race on" mpirun --oversubscribe -np 2 tests/zero_mpi_test_emu --gtest_filter='*Fp32StagesAreBitwise*'

mutate src/sched/comm_worker.cc "  Status ordered = by_events_ ? dev_.wait_on(Stream::kCompute, d.finished) : Status::Ok();" \
  "  Status ordered = Status::Ok();  // mutation: compute after wait() does not wait for the job"
check "a reduction buffer reused while the collective still reads it (CommWorker::wait)" zero_mpi_test_emu \
  "cuda_emu: race on" mpirun --oversubscribe -np 2 tests/zero_mpi_test_emu --gtest_filter='*Fp32StagesAreBitwise*'

mutate src/gpu/nccl_comm.cc "Status NcclComm::end() { return by_events() ? Status::Ok() : cuda_.wait_on(Stream::kCompute, cuda_.record(stream_)); }" \
  "Status NcclComm::end() { return cuda_.wait_on(Stream::kCompute, cuda_.record(stream_)); }  // mutation"
check "compute made to wait for the duplicate's collectives (NcclComm::end)" nccl_comm_mpi_test_emu \
  "compute waited for the duplicate's collective" \
  mpirun --oversubscribe -np 2 tests/nccl_comm_mpi_test_emu --gtest_filter='*ADuplicate*'

# --- inside a launch: the race check on the kernels' instrumented accesses (cuda_emu_race.cc) ---
mutate src/gpu/cuda_kernel_util.cuh "  if (lane == 0) red[warp] = v;
  __syncthreads();" "  if (lane == 0) red[warp] = v;"
# A missing barrier shows as a race, or (when the schedule runs the reader first) as a read of
# shared memory no thread of the block has written yet.
unordered="race inside kernel|no thread of the block has written yet"
check "a block reduction without the barrier between its writes and reads (block_reduce)" cuda_model_ops_gpu_test_emu \
  "$unordered" $(ops_test '*CrossEntropy*')

mutate src/gpu/cuda_attention.cuh "    load_rows<HSP>(Vs, q + 2 * C, ld, k0, T, hs, 1.f);
    __syncthreads();
    float s[G::R][G::R] = {};" "    load_rows<HSP>(Vs, q + 2 * C, ld, k0, T, hs, 1.f);
    float s[G::R][G::R] = {};"
check "one __syncthreads removed from the attention forward (K read before every warp loaded it)" \
  cuda_model_ops_gpu_test_emu "race inside kernel k::attention_forward_kernel|kernel k::attention_forward_kernel.*has written yet" $(ops_test '*.Attention')

mutate src/gpu/adam_cuda.cu "atomicAdd(nonfinite, static_cast<unsigned long long>(bad));" \
  "*nonfinite += static_cast<unsigned long long>(bad);"
check "atomicAdd replaced by += (the fused Adam's non-finite count)" adam_cuda_gpu_test_emu \
  "race inside kernel adam_kernel" tests/adam_cuda_gpu_test_emu --gtest_filter='*BitwiseEqualToCpuScalar*'

mutate src/gpu/cuda_model_kernels.cuh "    float* dst = out + static_cast<int64_t>(blockIdx.y) * ncols + c;" \
  "    float* dst = out + c;"
check "a column sum's chunks all added into one row, without the second pass (a race between blocks)" \
  cuda_model_ops_gpu_test_emu "race inside kernel k::column_partial_kernel.*another block" $(ops_test '*LayerNorm*')

mutate src/gpu/cuda_kernel_util.cuh "  Tv r = lane < nw ? red[lane] : identity;" "  Tv r = red[lane];"
check "a static __shared__ array read where no thread wrote it (block_reduce, fewer than 32 warps)" \
  cuda_model_ops_gpu_test_emu "reads .* of its block's shared memory that no thread of the block has written" \
  $(ops_test '*CrossEntropy*')

mutate src/gpu/cuda_kernel_util.cuh "  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
  __syncthreads();" "  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
  if (warp == 0) __syncthreads();"
check "a __syncthreads that only some threads reach (block_reduce)" cuda_model_ops_gpu_test_emu \
  "divergent __syncthreads|deadlock" $(ops_test '*CrossEntropy*')

mutate src/gpu/adam_cuda.cu "    ZOE_KERNEL_SPAN(r.grad, r.n * dtype_size(DType(r.grad_dtype)), false);" ""
check "a struct argument's range left undeclared (the fused Adam's gradients)" adam_cuda_gpu_test_emu \
  "outside what its launch declared" tests/adam_cuda_gpu_test_emu --gtest_filter='*BitwiseEqualToCpuScalar*'

# --- launch limits ---
mutate src/gpu/cuda_model_ops_attention.cu "  return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize," \
  "  if (kernel) return cudaSuccess;  // mutation: no opt-in
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,"
check "dynamic shared memory above 48 KiB without its opt-in (allow_smem)" cuda_model_ops_gpu_test_emu \
  "launch refused: .*above the 49152 allowed" $(ops_test '*.Attention')

# --- errors on their way to the step ---
mutate src/gpu/cuda_model_ops.cu "bool CudaModelOps::check_launch(const char* what) { return check(cudaGetLastError(), what); }" \
  "bool CudaModelOps::check_launch(const char*) { return cudaGetLastError(), true; }"
check "a failed launch not recorded by the ops (check_launch)" train_gpu_test_emu \
  "Failure" tests/train_gpu_test_emu --gtest_filter='GpuFaults.AFailedLaunch*'

mutate src/model/gpt2_model.cc "  const Status s = dev_->ops().status();" "  const Status s = Status::Ok();"
check "the ops' error dropped before the step goes on (Gpt2Model::ops_ok)" train_gpu_test_emu \
  "Failure" tests/train_gpu_test_emu --gtest_filter='GpuFaults.AFailedGemm*'

# --- the paths made since the last GPU lease (issue 47, 48) ---
mutate src/gpu/cuda_attention.cuh "    Dg[i] = acc;" "    Dg[i] = 0.f;"
check "the attention backward's row term D left out (attention_rowdot_kernel)" cuda_model_ops_gpu_test_emu \
  "Failure" $(ops_test '*.Attention')

mutate src/gpu/cuda_model_ops.cu "      s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);" \
  "      s = CUBLAS_STATUS_SUCCESS;  // mutation: the bias pointer not given to the heuristic"
check "the bias epilogue's heuristic asked without its vector (CudaModelOps::plan_for)" cuda_model_ops_gpu_test_emu \
  "the epilogue's bias pointer is unset" $(ops_test '*.Matmul')

mutate src/gpu/cuda_model_ops.cu "    s = cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);" \
  "    s = CUBLAS_STATUS_SUCCESS;  // mutation: the bias of the plan's first call kept"
check "a bias epilogue reading or writing the vector of the plan's first call (CudaModelOps::run)" \
  cuda_model_ops_gpu_test_emu "Failure" $(ops_test '*GeluInTheProductsEpilogue*')

mutate src/gpu/cuda_model_ops.cu "  if (fused && s == CUBLAS_STATUS_NOT_SUPPORTED) {" \
  "  if (false) {  // mutation: a refused epilogue is an error"
check "an epilogue the library refuses at the call ending the op, not run as passes (CudaModelOps::run)" \
  cuda_model_ops_gpu_test_emu "NOT_SUPPORTED" $(ops_test '*AnEpilogueTheLibraryRefuses*')

# --- GELU in the products' epilogues (GELU_AUX_BIAS, DGELU_BGRAD) ---
mutate src/gpu/cuda_model_ops.cu "    s = cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux);" \
  "    s = CUBLAS_STATUS_SUCCESS;  // mutation: the aux matrix of the plan's first call kept"
check "a GELU epilogue writing or reading the aux matrix of the plan's first call (CudaModelOps::run)" \
  cuda_model_ops_gpu_test_emu "Failure" $(ops_test '*GeluInTheProductsEpilogue*')

# --- the attention on tensor cores (cuda_attention_mma.cuh, cuda_mma.cuh) ---
mutate src/gpu/cuda_attention_mma.cuh "    __syncthreads();  // the last tile's Ks and Vt are read
    load_tile<HSP>(Ks, nullptr, q + C, ld, k0, T, hs);" "    load_tile<HSP>(Ks, nullptr, q + C, ld, k0, T, hs);"
check "a key tile loaded while other warps still read the last one (attention_forward_mma_kernel)" \
  cuda_model_ops_gpu_test_emu "race inside kernel k::attention_forward_mma_kernel" $(ops_test '*Bf16AttentionOnTensorCores*')

mutate src/gpu/cuda_mma.cuh "  a[1] = load_pair(bottom);
  a[2] = load_pair(top + 8);" "  a[1] = load_pair(top + 8);
  a[2] = load_pair(bottom);  // mutation: A's registers 1 and 2 swapped"
check "A's fragment in the wrong registers (load_a: rows 8-15 for columns 8-15)" cuda_model_ops_gpu_test_emu \
  "bf16 attention.*Failure|Failure" $(ops_test '*Bf16AttentionOnTensorCores*')

mutate src/gpu/cuda_attention_mma.cuh "    const float total = quad_sum(l[half]);
    const int row = q0 + r0 + acc_row(2 * half);
    if (row >= T) continue;" "    const int row = q0 + r0 + acc_row(2 * half);
    if (row >= T) continue;
    const float total = quad_sum(l[half]);  // mutation: rows past T leave the quad's shuffle"
check "a shuffle that the lanes of rows past T skip (attention_forward_mma_kernel)" cuda_model_ops_gpu_test_emu \
  "shuffle|warp is split|mma.sync" $(ops_test '*Bf16AttentionOnTensorCores*')

# --- the device budget holds the ops' workspaces ---
mutate src/gpu/cuda_device.cc "    if (make_current().ok()) ops_ = gpu::make_cuda_model_ops(stream(Stream::kCompute), allow_tf32_, std::move(memory));" \
  "    if (make_current().ok()) ops_ = gpu::make_cuda_model_ops(stream(Stream::kCompute), allow_tf32_);  // mutation: cudaMalloc"
check "the ops' workspaces taken outside the device budget (CudaDevice::ops)" cuda_device_gpu_test_emu \
  "Failure" tests/cuda_device_gpu_test_emu --gtest_filter='*TheOpsWorkspacesComeFromTheBudget*'

# --- Adam taken back (AdamHyper::undo) ---
mutate src/gpu/adam_cuda.cu "  master = __fdiv_rn(p, c.decay);" "  master = p;  // mutation: AdamW's decay not undone"
check "a speculative step taken back without undoing the decoupled decay (adam_cuda.cu)" adam_cuda_gpu_test_emu \
  "gpu master/m/v" tests/adam_cuda_gpu_test_emu --gtest_filter='*BitwiseEqualToCpuScalar*'

echo "mutations.sh: $caught caught, $missed missed"
[[ $missed -eq 0 ]]

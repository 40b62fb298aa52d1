#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: build the real CUDA backend for this GPU,
# run the whole test suite (the op harness then runs every op on cuda:0 as
# well as on the CPU; the CUDA-only tests stop skipping), then the
# benchmarks that mean something on a GPU. Everything goes to
# gpu-check-<date>.log as well as the terminal; paste its summary into
# docs/cuda.md.
#   scripts/gpu-check.sh            build in build-gpu/, run everything
#   KILN_GPU_ARCH=90 scripts/gpu-check.sh   build for that architecture
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
log="$top/gpu-check-$(date -u +%Y%m%dT%H%M%SZ).log"
exec > >(tee "$log") 2>&1

if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU or driver here (nvidia-smi -L fails); run it on a machine with one"
  exit 77
fi
nvidia-smi -L
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x "$nvcc" ] || { echo "gpu-check: nvcc not found (install the CUDA toolkit)"; exit 1; }

d="$top/build-gpu"
start=$(date +%s)
cmake -S "$top" -B "$d" -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_CUDA=ON -DKILN_WERROR=ON \
  -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES="${KILN_GPU_ARCH:-native}"
cmake --build "$d" -j"$(nproc)"
"$d/bin/kiln" info
# The CUDA module loaded from the build tree, with its reasons for each
# KILN_CUDA setting (docs/cuda.md).
sh "$top/scripts/cuda-module-check.sh" "$d" || status=1

echo "=== tests (CPU and cuda:0)"
ctest --test-dir "$d" -LE slow --output-on-failure --timeout 900 -j2 || status=$?
echo "=== CUDA-only tests, verbose"
ctest --test-dir "$d" --output-on-failure -R "cuda|counters_cuda|loader_cuda|fused_optim|nn_cuda|stream_destroy" -V \
  | grep -E "passed|failed|SKIPPED|cuda:0" || true

echo "=== CUDA library fast paths (cuBLASLt, cuDNN) vs the hand-written kernels: forward and backward,"
echo "=== f32/f16/bf16, every autotuner mode; then the autotuner's picks and the cache file read back"
ctest --test-dir "$d" --output-on-failure -R "cuda_fast_paths" -V | grep -vE "^(UpdateCTestConfiguration|Test project|Constructing|Checking|Parse|Updating|Add test|Test command|Environment variables|    [A-Z_]+=)" \
  || status=1

echo "=== benchmarks"
"$d/bin/kiln" bench alloc || true
"$d/bin/kiln" bench loader || true
"$d/bin/kiln" bench cnn --profile-rows 20 || true
echo "=== GPU benchmarks: the CNN on cuda:0 (f32 with cuDNN autotuning off, then on; AMP f16 + grad scaler; both as CUDA graphs), H2D copies, cuBLASLt GEMM"
"$d/bin/kiln" bench cnn --device cuda:0 || true
# PyTorch on the same GPU, where its python3 has CUDA (exits 77 otherwise).
python3 "$top/bench/peer/torch_cnn_gpu.py" --device cuda:0 || true
echo "=== CUDA graphs: eager against the traced program replayed as one graph (inference and training step)"
"$d/bin/kiln" bench trace --device cuda:0 --no-peer || true
"$d/bin/kiln" bench copy --device cuda:0 || true
"$d/bin/kiln" bench gemm --device cuda:0 || true
if [ -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  "$d/bin/kiln" train --out "$d/gpu-check-run" || true
  "$d/bin/kiln" report "$d/gpu-check-run" || true
  "$d/bin/kiln" train --amp off --out "$d/gpu-check-run-f32" | tail -n 1 || true
  python3 "$top/bench/peer/fmnist_train.py" --device cuda:0 --amp f16 || true
  python3 "$top/bench/peer/fmnist_train.py" --device cuda:0 || true
  # Two GPUs in one process (docs/multi-device.md): the main job with
  # DataParallel and with its layers split over cuda:0 and cuda:1, each
  # printing its summary's JSON line (test accuracy, img/s, the devices), and
  # the shortened two-device test against the CPU.
  n_gpus=$(nvidia-smi -L | grep -c '^GPU ' || true)
  if [ "$n_gpus" -ge 2 ]; then
    echo "=== two GPUs: kiln train --devices cuda:0,cuda:1 (DataParallel), then --split 0:cuda:0,6:cuda:1 --micro-batches 4"
    "$d/bin/kiln" train --devices cuda:0,cuda:1 --out "$d/gpu-check-dp" | tail -n 1 || status=1
    "$d/bin/kiln" train --split 0:cuda:0,6:cuda:1 --micro-batches 4 --out "$d/gpu-check-split" | tail -n 1 || status=1
    sh "$top/tests/tools/train_multi_device.sh" "$d/bin/kiln" 1024 || status=1
    # DataParallel's load on the output device, with real device times
    # (docs/multi-device.md, "The main device's load"): its JSON line.
    "$d/bin/kiln" bench dataparallel --classes 20000 | tail -n 1 || status=1
    # DDP on two GPUs through the real NCCL (docs/distributed.md): the
    # collectives and DDP against one process, a rank killed mid-step, and
    # kiln train under mpirun on cuda:0 and cuda:1.
    echo "=== two GPUs: NCCL (test_dist_cuda, rank death on CUDA, mpirun -np 2 kiln train --device cuda)"
    ctest --test-dir "$d" --output-on-failure -R "dist/test_dist_cuda_np2|rank_death|train_ddp" || status=1
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 2 "$d/bin/kiln" train --device cuda \
      --out "$d/gpu-check-ddp" | tail -n 1 || status=1
  else
    echo "=== two GPUs: SKIPPED: $n_gpus GPU visible; kiln train --devices and --split need cuda:0 and cuda:1"
  fi
fi
echo "=== gpu-check done in $(( $(date +%s) - start ))s; log: $log"
exit "${status:-0}"

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
echo "=== GPU benchmarks: the CNN on cuda:0 (cuDNN autotuning off, then on), H2D copies, cuBLASLt GEMM"
"$d/bin/kiln" bench cnn --device cuda:0 || true
"$d/bin/kiln" bench copy --device cuda:0 || true
"$d/bin/kiln" bench gemm --device cuda:0 || true
if [ -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  "$d/bin/kiln" train --out "$d/gpu-check-run" || true
fi
echo "=== gpu-check done in $(( $(date +%s) - start ))s; log: $log"
exit "${status:-0}"

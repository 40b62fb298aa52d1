#!/usr/bin/env bash
# scripts/gpu-check.sh for a lent GPU machine with minutes, not hours: the
# build is made beforehand on the CPU machine and carried, so the device's
# time goes to running, not compiling. The carried build has no oneDNN, no
# MPI and no OpenBLAS (a lent machine has none of them installed and the
# lease's 64 MiB would not hold oneDNN); its CPU side is the reference
# kernels, which is what the op harness holds cuda:0 against anyway.
#
# On the CPU machine (once per source change):
#   scripts/gpu-lease.sh --prepare        # build-gpu/ for sm_90, slimmed into .gpu/build,
#                                         # Fashion-MNIST copied into .gpu/fmnist
# On the GPU machine, from the repository's root (.gpu carried along):
#   scripts/gpu-lease.sh [SECONDS]        # in this order, inside SECONDS (default 420):
#     kiln info and the module check; the tests that touch cuda:0; the GPU
#     benchmarks (kiln bench cnn/trace --device cuda:0) and the PyTorch
#     peer of the CNN benchmark on the same GPU; the main job (kiln train on
#     cuda:0, amp auto and f32, its report page) and its PyTorch peer; the profiler
#     over 20 steps in f32 and AMP; kiln bench gemm and copy; the rest of the suite last.
# Output: $OUT/lease.log (or gpu-lease-out/ here) and the main job's summary files.
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
gpu=$top/.gpu

if [ "${1:-}" = "--prepare" ]; then
  set -e
  b=$top/build-gpu
  cmake -S "$top" -B "$b" -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_CUDA=ON -DKILN_WERROR=ON \
    -DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" \
    -DCMAKE_CUDA_ARCHITECTURES="${KILN_GPU_ARCH:-90}" \
    -DKILN_WITH_ONEDNN=OFF -DKILN_WITH_MPI=OFF -DKILN_WITH_OPENBLAS=OFF > /dev/null
  cmake --build "$b" -j"$(nproc)"
  rm -rf "$gpu/build"
  mkdir -p "$gpu/build" "$gpu/fmnist"
  # Everything but the objects: binaries, libraries, CTest files, generated headers.
  (cd "$b" && find . ! -type d ! -name '*.o' ! -name '*.a' ! -name '*.d' ! -path '*/CMakeFiles/*' ! -name 'Makefile' \
     ! -name '*.make' ! -name '*.log' ! -name '*.safetensors' ! -path '*/Testing/*' -print0 | tar --null -T - -cf - | tar -xf - -C "$gpu/build")
  cp -p /usr/share/datasets/fashion-mnist/*-ubyte.gz "$gpu/fmnist/"
  # The Debian libraries the kiln command needs that a lent machine lacks.
  mkdir -p "$gpu/lib"
  cp -L /lib/x86_64-linux-gnu/libcjson.so.1 /lib/x86_64-linux-gnu/libgomp.so.1 "$gpu/lib/"
  grep -qx "/.gpu/" "$top/.git/info/exclude" 2>/dev/null || echo "/.gpu/" >> "$top/.git/info/exclude"
  du -sh "$gpu"
  exit 0
fi

budget=${1:-420}
t_start=$(date +%s)
left() { echo $(( budget - ($(date +%s) - t_start) )); }
out=${OUT:-$top/gpu-lease-out}
mkdir -p "$out"
exec > >(tee "$out/lease.log") 2>&1
step() { echo; echo "=== [$(( $(date +%s) - t_start ))s] $*"; }
# run SECONDS CMD...: CMD with a limit that also fits what is left of the budget.
run() {
  local s=$1; shift
  local l; l=$(left)
  [ "$l" -lt "$s" ] && s=$l
  if [ "$s" -le 5 ]; then echo "(skipped: budget spent) $*"; return 0; fi
  timeout -k 5 "$s" "$@"
  local rc=$?
  [ $rc -eq 124 ] && echo "(stopped after ${s}s: $*)"
  return $rc
}

[ -d "$gpu/build" ] || { echo "gpu-lease: $gpu/build is missing: run scripts/gpu-lease.sh --prepare here first"; exit 1; }
# The CTest files name the build by its absolute path on the machine that built it.
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$gpu/build/CMakeCache.txt")
if [ -n "$src" ] && [ "$src" != "$top" ] && [ ! -e "$src" ]; then
  mkdir -p "$(dirname "$src")" && ln -s "$top" "$src"
fi
[ -e "$top/build-gpu" ] || ln -s "$gpu/build" "$top/build-gpu"
b=$src/build-gpu
kiln=$b/bin/kiln
# CUDA's libraries as the machine has them: the toolkit's, then the pip wheels PyTorch uses.
libs=/usr/local/cuda/lib64
wheels=$(python3 -c 'import nvidia, os
for p in nvidia.__path__:
    for d in sorted(os.listdir(p)):
        if os.path.isdir(os.path.join(p, d, "lib")): print(os.path.join(p, d, "lib"))' 2>/dev/null | tr '\n' ':')
export LD_LIBRARY_PATH=$gpu/lib:$libs:$wheels${LD_LIBRARY_PATH:-}

# The tests and kiln train look for Fashion-MNIST where the Debian package puts it.
fm=/usr/share/datasets/fashion-mnist
if [ ! -e "$fm/train-images-idx3-ubyte.gz" ] && [ -w / ]; then mkdir -p "$fm" && cp "$gpu"/fmnist/*.gz "$fm/"; fi

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
nproc; grep -m1 "model name" /proc/cpuinfo
run 30 "$kiln" info
ldd "$b/libkiln_cuda.so" | grep -E "cudart|cublas|cudnn|nccl"
run 60 sh "$top/scripts/cuda-module-check.sh" "$b"

step "tests that run on cuda:0 (the op harness holds every op on cuda:0 against the CPU)"
cuda_tests="cuda|fast_paths|ops/test_ops_|trace/|amp|optim/|runtime/|autotune|loader|monitor|counters|plan|parity|autograd/|nn/|tensor/|examples/"
run 170 ctest --test-dir "$b" -R "$cuda_tests" -j 14 --timeout 150 --output-on-failure 2>&1 | tail -n 60
cp "$b/Testing/Temporary/LastTest.log" "$out/ctest-cuda.log" 2>/dev/null
grep -E "cuda:0|algo|pick" "$out/ctest-cuda.log" | grep -iE "fast|cudnn|cublas|algo" | head -n 30

step "kiln bench cnn --device cuda:0"
run 90 "$kiln" bench cnn --device cuda:0
step "kiln bench trace --device cuda:0 (eager against the CUDA graph, batch 1 to 128)"
run 90 "$kiln" bench trace --device cuda:0 --no-peer
step "PyTorch on the same GPU (bench/peer/torch_cnn_gpu.py)"
run 90 python3 "$top/bench/peer/torch_cnn_gpu.py" --device cuda:0

step "the main job on cuda:0: kiln train (defaults: amp auto), its report page"
rm -rf /tmp/kiln-lease-run /tmp/kiln-lease-f32
run 120 "$kiln" train --device cuda:0 --out /tmp/kiln-lease-run 2>&1 | grep -v "^epoch .* step " | tail -n 8
run 30 "$kiln" report /tmp/kiln-lease-run | tail -n 2
for f in metrics.jsonl report.html; do [ -f "/tmp/kiln-lease-run/$f" ] && cp "/tmp/kiln-lease-run/$f" "$out/train-$f"; done
step "the main job on cuda:0 in f32 (--amp off), then with cuDNN autotuning (--benchmark), AMP and f32"
run 120 "$kiln" train --device cuda:0 --amp off --out /tmp/kiln-lease-f32 | tail -n 1
run 120 "$kiln" train --device cuda:0 --benchmark --out /tmp/kiln-lease-bench16 | tail -n 1
run 120 "$kiln" train --device cuda:0 --benchmark --amp off --out /tmp/kiln-lease-bench32 | tail -n 1
step "the main job's PyTorch peer on cuda:0 (f16 AMP, then f32)"
run 90 python3 "$top/bench/peer/fmnist_train.py" --device cuda:0 --amp f16
run 90 python3 "$top/bench/peer/fmnist_train.py" --device cuda:0

step "where a step's time goes on cuda:0: the profiler over 20 steps, f32 then AMP f16"
for amp in off f16; do
  run 60 "$kiln" train --device cuda:0 --amp $amp --limit 12800 --epochs 1 --profile 20 --progress lines \
    --out /tmp/kiln-lease-prof-$amp 2>&1 | sed -n '/profile of/,/last profiled step/p' | cut -c1-56,71-84,127-168,197-210 | head -n 32
done
step "kiln bench gemm / copy"
run 30 "$kiln" bench gemm --device cuda:0
run 30 "$kiln" bench copy --device cuda:0

step "the rest of the test suite"
run 120 ctest --test-dir "$b" -E "$cuda_tests" -LE slow -j 14 --timeout 100 --output-on-failure 2>&1 | grep -E "^FAIL|tests passed|Failed|\*\*\*|Total Test" | tail -n 40
cp "$b/Testing/Temporary/LastTest.log" "$out/ctest-rest.log" 2>/dev/null

step "gpu-lease done in $(( $(date +%s) - t_start ))s"

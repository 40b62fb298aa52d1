#!/bin/sh
# The CUDA module of a real CUDA build (docs/cuda.md, "The CUDA module"),
# checked on a machine with or without a GPU (scripts/test.sh's nvcc tier
# runs it on the CPU-only CI machine):
#   - libkiln and the kiln command link no CUDA library; libkiln_cuda.so
#     links cudart and cuBLASLt (and cuDNN, NCCL when the build has them);
#   - without a driver, kiln info says the module is not loaded and why;
#     with a driver that sees a device, that it is loaded;
#   - KILN_CUDA=force loads and binds the module even without a driver,
#     KILN_CUDA=off keeps it out, another value is refused;
#   - a module whose libraries are missing leaves CUDA absent with the
#     loader's reason, and kiln train still runs on the CPU;
#   - a CPU-only process of this build is as small as one of a CPU-only
#     build (peak resident set of kiln version; the CPU build's binary is
#     the second argument, when given).
# usage: cuda-module-check.sh CUDA_BUILD_DIR [CPU_ONLY_KILN_BINARY]
set -eu
d=$1
cpu_kiln=${2:-}
kiln=$d/bin/kiln
fail() { echo "cuda-module-check: FAILED: $*"; exit 1; }
grep -q "cuda=module" "$d/generated/kiln_config.h" || fail "$d is not a CUDA build with the module (cuda=module)"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kiln_cuda_module.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# What links what. ldd's output is read whole before it is searched (see
# tier_nvcc: grep -q on a pipe can SIGPIPE ldd under pipefail).
for f in "$d/libkiln.so" "$kiln"; do
  needed=$(ldd "$f") || fail "ldd $f"
  if echo "$needed" | grep -E "libcudart|libcublas|libcudnn|libnccl|libcuda\.so" > "$tmp/cuda_libs"; then
    fail "$f needs CUDA libraries, which only the module may: $(cat "$tmp/cuda_libs")"
  fi
done
needed=$(ldd "$d/libkiln_cuda.so") || fail "ldd $d/libkiln_cuda.so"
for lib in libcudart libcublasLt; do
  echo "$needed" | grep -q "$lib" || fail "libkiln_cuda.so does not link $lib: $needed"
done
if grep -q "cudnn=on" "$d/generated/kiln_config.h"; then
  echo "$needed" | grep -q libcudnn || fail "libkiln_cuda.so does not link cuDNN: $needed"
fi
# CUDA tensors' collectives (src/dist/nccl_cuda.c) are the module's too.
if grep -q "nccl=on" "$d/generated/kiln_config.h"; then
  echo "$needed" | grep -q libnccl || fail "libkiln_cuda.so does not link NCCL: $needed"
fi

# kiln info, as the loader decided.
"$kiln" info > "$tmp/info" 2>&1 || fail "kiln info: $(cat "$tmp/info")"
if [ -e /proc/driver/nvidia/version ] && grep -q "cuda    module /" "$tmp/info"; then
  echo "cuda-module-check: a driver is present and the module loaded: $(grep 'cuda    module' "$tmp/info")"
else
  grep -q "cuda    module not loaded: " "$tmp/info" || fail "kiln info does not say why the module is not loaded: $(cat "$tmp/info")"
fi
KILN_CUDA=force "$kiln" info > "$tmp/force" 2>&1 || fail "KILN_CUDA=force kiln info: $(cat "$tmp/force")"
grep -q "cuda    module .*libkiln_cuda.so" "$tmp/force" || fail "KILN_CUDA=force did not load the module: $(cat "$tmp/force")"
KILN_CUDA=off "$kiln" info > "$tmp/off" 2>&1 || fail "KILN_CUDA=off kiln info: $(cat "$tmp/off")"
grep -q "cuda    module not loaded: turned off by KILN_CUDA=off" "$tmp/off" || fail "KILN_CUDA=off: $(cat "$tmp/off")"
grep -q "^  cuda    0 devices" "$tmp/off" || fail "KILN_CUDA=off still lists CUDA devices: $(cat "$tmp/off")"
if KILN_CUDA=maybe "$kiln" info > "$tmp/bad" 2>&1; then fail "KILN_CUDA=maybe was accepted"; fi
grep -q "KILN_CUDA='maybe' is not a choice" "$tmp/bad" || fail "KILN_CUDA=maybe: $(cat "$tmp/bad")"

# A module whose own libraries cannot be found (as on a machine without
# the CUDA runtime): built here as a library needing one that is gone.
cc_=${CC:-cc}
printf 'int kiln_gone_dep(void) { return 1; }\n' > "$tmp/dep.c"
printf 'int kiln_gone_dep(void);\nint kiln_cudamod_same_core(void *p) { (void)p; return kiln_gone_dep(); }\n' > "$tmp/mod.c"
"$cc_" -shared -fPIC -o "$tmp/libkiln_gone_dep.so" "$tmp/dep.c"
"$cc_" -shared -fPIC -o "$tmp/libkiln_cuda_broken.so" "$tmp/mod.c" -L"$tmp" -lkiln_gone_dep
rm "$tmp/libkiln_gone_dep.so"
KILN_CUDA=force KILN_CUDA_MODULE="$tmp/libkiln_cuda_broken.so" "$kiln" info > "$tmp/broken" 2>&1 ||
  fail "kiln info with a broken module: $(cat "$tmp/broken")"
grep -q "cuda    module not loaded: the CUDA module did not load: libkiln_gone_dep.so" "$tmp/broken" ||
  fail "the broken module's reason: $(cat "$tmp/broken")"
data=/usr/share/datasets/fashion-mnist
if [ -e "$data/train-images-idx3-ubyte.gz" ] || [ -e "$data/train-images-idx3-ubyte" ]; then
  KILN_CUDA=force KILN_CUDA_MODULE="$tmp/libkiln_cuda_broken.so" "$kiln" train --limit 256 --epochs 1 --batch 64 \
    --workers 0 --progress lines --out "$tmp/run" > "$tmp/train" 2>&1 || fail "kiln train without its CUDA module: $(cat "$tmp/train")"
  grep -q "on cpu" "$tmp/train" || fail "kiln train did not run on the CPU: $(cat "$tmp/train")"
else
  echo "cuda-module-check: Fashion-MNIST not installed: the CPU training run is skipped"
fi

# The footprint: peak resident set of kiln version, in MiB.
rss() { python3 -c 'import resource, subprocess, sys
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)' "$@"; }
cuda_rss=$(KILN_CUDA=off rss "$kiln" version) || fail "measuring kiln version"
forced_rss=$(KILN_CUDA=force rss "$kiln" info) || fail "measuring kiln info with the module"
line="kiln version: $cuda_rss MiB resident in this CUDA build without the module; kiln info with it loaded: $forced_rss MiB"
if [ -n "$cpu_kiln" ]; then
  cpu_rss=$(rss "$cpu_kiln" version) || fail "measuring $cpu_kiln version"
  line="$line; a CPU-only build: $cpu_rss MiB"
  # The same process: within 10% and 4 MiB (libkiln's own size differs a little).
  [ "$cuda_rss" -le $((cpu_rss + cpu_rss / 10 + 4)) ] || fail "$line: the CUDA build without its module is larger"
fi
echo "cuda-module-check: ok; $line"

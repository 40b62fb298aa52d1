#!/usr/bin/env bash
# Build and run the whole test suite, in the CI tiers of docs/ci.md. Each
# tier has its own build directory under build-ci/ and prints its time.
#   scripts/test.sh               all tiers
#   scripts/test.sh release asan  only those tiers
# Tests labelled `slow` run only in scripts/full-check.sh.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/scripts/setup.sh" --tests

jobs=$(nproc)
ctest_args=(--output-on-failure --timeout 300 -j"$jobs" ${KILN_CTEST_ARGS:-})
tiers=("$@")
[ ${#tiers[@]} -gt 0 ] || tiers=(release asan tsan nvcc emu fuzz)
summary=()
total_start=$(date +%s)
# Test counts over every tier, for the closing line CI reads.
counts_file=$(mktemp)
trap 'rm -f "$counts_file"' EXIT

# run_ctest ARGS...: ctest, its output shown as it comes and its closing
# counts (passed, failed, skipped) added to the run's totals. A tier may
# run it under a wrapper command: ctest_wrap=(CMD...); run_ctest ARGS...
ctest_wrap=()
run_ctest() {
  local log rc=0
  log=$(mktemp)
  "${ctest_wrap[@]}" ctest "$@" 2>&1 | tee "$log" || rc=$?
  awk '/tests passed, [0-9]+ tests? failed out of/ {
         for (i = 1; i <= NF; i++) { if ($i == "failed") f = $(i - 2); if ($i == "of") t = $(i + 1) } }
       /\(Skipped\)$/ { s++ }
       END { printf "%d %d %d\n", t - f - s, f, s }' "$log" >>"$counts_file"
  rm -f "$log"
  return $rc
}

# The closing line: "tests: N passed, N failed, N skipped" over all tiers
# run so far (fuzz targets that ran clean count as passed tests).
print_counts() {
  awk '{ p += $1; f += $2; s += $3 } END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, s }' "$counts_file"
}

# ceiling_s NAME: the tier's ceiling from docs/ci.md, in seconds.
ceiling_s() {
  case "$1" in
    release) echo 480 ;; asan) echo 660 ;; tsan) echo 120 ;; nvcc) echo 420 ;; emu) echo 480 ;; fuzz) echo 540 ;;
    *) echo 600 ;;
  esac
}

configure_build() { # DIR ARGS...
  local dir=$1; shift
  cmake -S "$top" -B "$dir" "$@" >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; return 1; }
  cmake --build "$dir" -j"$jobs" || return 1
}

# The release tier's configure, build and tests run traced by strace
# (scripts/check-packages.sh --record), then every file they opened or ran
# is mapped to its Debian package: one used but not installed by
# scripts/setup.sh (nor a dependency of what it installs, nor Essential)
# fails the tier. No ccache there: a cache hit reads no headers.
tier_release() {
  local d="$top/build-ci/release" traces="$top/build-ci/release.traces"
  mkdir -p "$top/build-ci"
  rm -rf "$traces"
  local rec=("$top/scripts/check-packages.sh" --record "$traces" --)
  CCACHE_DISABLE=1 "${rec[@]}" cmake -S "$top" -B "$d" -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_CUDA=OFF \
    -DKILN_WERROR=ON >"$d.configure.log" 2>&1 || { cat "$d.configure.log"; return 1; }
  CCACHE_DISABLE=1 "${rec[@]}" cmake --build "$d" -j"$jobs" || return 1
  ctest_wrap=("${rec[@]}")
  run_ctest --test-dir "$d" -LE slow "${ctest_args[@]}" || { ctest_wrap=(); return 1; }
  ctest_wrap=()
  "$top/scripts/check-packages.sh" --traces "$traces" || return 1
  rm -rf "$traces"
  "$top/scripts/check-install.sh" "$d" || return 1
}

tier_asan() {
  local d="$top/build-ci/asan"
  mkdir -p "$top/build-ci"
  configure_build "$d" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_WITH_CUDA=OFF -DKILN_WERROR=ON \
    -DKILN_SANITIZE=address,undefined || return 1
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    run_ctest --test-dir "$d" -LE slow "${ctest_args[@]}" || return 1
}

# ThreadSanitizer over what runs threads: the data layer (loader workers,
# their shutdown, the pinned pool) and the scopes. Only those tests (and
# no tools) are built, to keep the tier near 3 minutes on 2 cores.
tier_tsan() {
  local d="$top/build-ci/tsan"
  mkdir -p "$top/build-ci"
  cmake -S "$top" -B "$d" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_WITH_CUDA=OFF -DKILN_WERROR=ON \
    -DKILN_SANITIZE=thread -DKILN_BUILD_TOOLS=OFF >"$d.configure.log" 2>&1 || { cat "$d.configure.log"; return 1; }
  local targets=(test_tensor_scope) f
  for f in "$top"/tests/data/test_*.c; do targets+=("$(basename "$f" .c)"); done
  cmake --build "$d" -j"$jobs" --target "${targets[@]}" || return 1
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 run_ctest --test-dir "$d" -L data "${ctest_args[@]}" || return 1
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 run_ctest --test-dir "$d" -R scope "${ctest_args[@]}" || return 1
}

tier_nvcc() {
  local nvcc
  nvcc=$(command -v nvcc || true)
  [ -n "$nvcc" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || nvcc=/usr/local/cuda/bin/nvcc
  if [ -z "$nvcc" ]; then
    echo "tier nvcc: SKIPPED: nvcc not found (install the CUDA toolkit to build the CUDA backend)"
    return 0
  fi
  local d="$top/build-ci/cuda"
  mkdir -p "$top/build-ci"
  # Compile and link only, one architecture: no GPU here to run it on.
  cmake -S "$top" -B "$d" -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_CUDA=ON -DKILN_WERROR=ON \
    -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES=80 -DKILN_BUILD_TESTS=ON >"$d.configure.log" 2>&1 \
    || { cat "$d.configure.log"; return 1; }
  cmake --build "$d" -j"$jobs" --target kiln kiln_cuda kiln_cli test_cuda_device test_cuda_fast_paths \
    test_cublaslt_geometry test_dist_cuda || return 1
  grep -q "cuda=module" "$d/generated/kiln_config.h" ||
    { echo "tier nvcc: the CUDA backend was not built as a module (cuda=module; docs/cuda.md)"; return 1; }
  # The CUDA module (docs/cuda.md): libkiln_cuda.so links cudart and cuBLASLt,
  # and cuDNN and NCCL when the build found them; libkiln and kiln link none
  # of them; kiln info gives the loader's reason for each KILN_CUDA setting; a
  # module whose libraries are missing leaves CUDA absent and kiln train runs
  # on the CPU; a CPU-only process is as small as the release tier's.
  local cpu_kiln=""
  [ ! -x "$top/build-ci/release/bin/kiln" ] || cpu_kiln="$top/build-ci/release/bin/kiln"
  sh "$top/scripts/cuda-module-check.sh" "$d" $cpu_kiln || return 1
  # Without a driver the CUDA build must still run and list zero CUDA devices,
  # and the real-GPU tests must report themselves skipped (CTest's code 77):
  # the device test and the cuBLASLt/cuDNN fast-path comparison (docs/cuda.md);
  # the cuBLASLt GEMM mapping is checked on the host (test_cublaslt_geometry),
  # and the PTX of the kernels that promise the CPU's bits for FMA
  # contraction (cuda_contraction, docs/cuda.md).
  "$d/bin/kiln" info || return 1
  run_ctest --test-dir "$d" -R "test_cuda_device|test_cuda_fast_paths|test_cublaslt_geometry|cuda_contraction" \
    --no-tests=error \
    "${ctest_args[@]}" || return 1
}

# The CUDA emulation build (docs/cuda.md): the CUDA backend and every .cu
# kernel compiled as C++ and run on the CPU, emulated cuda:0 and cuda:1.
# Runs the emulator's own tests (label emu), the runtime tests (streams,
# events, the allocator's stream rule, pinned and peer copies) and the op
# harness, whose cases run on cpu and on the emulated cuda:0, the data,
# diag and optim tests (prefetch, counters, fused updates on cuda:0), and
# nn/test_amp_cnn (the tutorial CNN under f16 autocast on cuda:0), and the
# main job shortened on cuda:0 (tools/train_device) and on cuda:0 and cuda:1
# (tools/train_multi_device: --devices and --split). A release build: with
# ASan+UBSan the build and the harness do not fit
# the ceiling on 2 cores; docs/cuda.md gives the sanitizer configuration to
# run by hand (the emulator allocates device memory at its exact size, so a
# kernel's overrun is an ASan report there).
tier_emu() {
  local d="$top/build-ci/emu"
  mkdir -p "$top/build-ci"
  configure_build "$d" -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA_EMULATION=ON -DKILN_WITH_CUDA=OFF \
    -DKILN_WERROR=ON || return 1
  grep -q "cuda=emulated" "$d/generated/kiln_config.h" || { echo "tier emu: the emulation build was not enabled"; return 1; }
  run_ctest --test-dir "$d" -L "emu|runtime|tensor|ops|data|diag|optim|plan" -LE slow --no-tests=error "${ctest_args[@]}" || return 1
  # The tutorial CNN with f16 autocast and the grad scaler on emulated
  # cuda:0 (the nn layer's one device test; the others are CPU-only).
  run_ctest --test-dir "$d" -R '^nn/test_amp_cnn$' --no-tests=error "${ctest_args[@]}" || return 1
  # The main job, shortened, on the emulated cuda:0 in f32 and f16 against
  # the CPU (tests/tools/train_device.sh), and on cuda:0 and cuda:1 with
  # --devices and --split (tests/tools/train_multi_device.sh).
  # And the out-of-memory recovery on the emulated cuda:0 under a device
  # limit (tests/tools/train_auto_batch.sh).
  run_ctest --test-dir "$d" -R '^tools/train_((multi_)?device|auto_batch_cuda)$' --no-tests=error "${ctest_args[@]}" ||
    return 1
}

# libFuzzer over the file parsers (tests/fuzz/): each target runs
# KILN_FUZZ_SECONDS (45: eight targets and the build fit the ceiling) on a
# copy of its seed corpus; a crash fails the tier.
tier_fuzz() {
  local clang
  clang=$(command -v clang || true)
  if [ -z "$clang" ]; then
    echo "tier fuzz: SKIPPED: clang not found (install the Debian packages clang and libclang-rt-14-dev)"
    return 0
  fi
  local d="$top/build-ci/fuzz"
  mkdir -p "$top/build-ci"
  # The library and the fuzz targets only: libFuzzer brings its own main.
  CC="$clang" configure_build "$d" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_SANITIZE=fuzzer \
    -DKILN_BUILD_TESTS=OFF -DKILN_BUILD_TOOLS=OFF -DKILN_WITH_CUDA=OFF -DKILN_WERROR=ON || return 1
  # KILN_FUZZ_RUNS=N (scripts/full-check.sh: 10^7) runs each target N
  # executions instead of KILN_FUZZ_SECONDS, and KILN_FUZZ_MERGE=1 merges
  # the inputs that add coverage back into tests/fuzz/corpus/NAME. The
  # forward target (model_spec: builds and runs each model, some hundred
  # executions a second) cannot reach 10^7 in a day: with KILN_FUZZ_RUNS
  # it runs KILN_FUZZ_FORWARD_SECONDS (1800) instead.
  local targets=0 secs=${KILN_FUZZ_SECONDS:-45} f name work budget dict
  for f in "$d"/tests/fuzz/fuzz_*; do
    [ -x "$f" ] || continue
    targets=$((targets + 1))
    name=$(basename "$f"); name=${name#fuzz_}
    # A copy of the seed corpus: libFuzzer adds what it finds to it.
    work="$d/corpus-$name"
    rm -rf "$work" && mkdir -p "$work"
    cp "$top/tests/fuzz/corpus/$name"/* "$work/"
    budget=(-max_total_time="$secs")
    [ -z "${KILN_FUZZ_RUNS:-}" ] || budget=(-runs="$KILN_FUZZ_RUNS")
    [ -z "${KILN_FUZZ_RUNS:-}" ] || [ "$name" != model_spec ] ||
      budget=(-max_total_time="${KILN_FUZZ_FORWARD_SECONDS:-1800}")
    # The grammar's tokens (tests/fuzz/dict/), where the target has them.
    dict=()
    [ ! -f "$top/tests/fuzz/dict/$name.dict" ] || dict=(-dict="$top/tests/fuzz/dict/$name.dict")
    echo "tier fuzz: $name for ${budget[*]#-} ${dict[*]:+with its dictionary}"
    # A crash, a sanitizer report or a leak exits non-zero and leaves the
    # input as crash-*/leak-* in $d for reproduction.
    (cd "$d" && "$f" "${budget[@]}" "${dict[@]}" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      "$work" 2>&1 | tail -n 25) || { echo "0 1 0" >>"$counts_file"; return 1; }
    if [ "${KILN_FUZZ_MERGE:-0}" = 1 ]; then
      (cd "$d" && "$f" -merge=1 "${dict[@]}" "$top/tests/fuzz/corpus/$name" "$work" 2>&1 | tail -n 2) || return 1
    fi
    echo "1 0 0" >>"$counts_file"
  done
  [ "$targets" -gt 0 ] || { echo "tier fuzz: no fuzz target was built"; return 1; }
}

# A tier runs as `tier_X || status=$?`, where bash ignores set -e inside
# the function: every step of a tier ends in `|| return 1`.
for t in "${tiers[@]}"; do
  echo "=== tier $t: start $(date -u +%H:%M:%S)"
  start=$(date +%s)
  status=0
  "tier_$t" || status=$?
  secs=$(( $(date +%s) - start ))
  ceiling=$(ceiling_s "$t")
  note=""
  [ "$secs" -le "$ceiling" ] || note=" OVER ITS CEILING: move its slowest tests to the slow label (docs/ci.md)"
  line=$(printf 'tier %-8s %4ds (ceiling %ds) %s%s' "$t" "$secs" "$ceiling" "$([ $status -eq 0 ] && echo ok || echo FAILED)" "$note")
  echo "=== $line"
  summary+=("$line")
  if [ $status -ne 0 ]; then
    printf '%s\n' "${summary[@]}"
    print_counts
    exit $status
  fi
done

echo "=== summary"
printf '%s\n' "${summary[@]}"
echo "total $(( $(date +%s) - total_start ))s (budget 2700s)"
print_counts

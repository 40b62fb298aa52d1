#!/usr/bin/env bash
# Build and run the whole test suite, in the CI tiers of docs/ci.md. Each
# tier has its own build directory under build-ci/ and prints its time.
#   scripts/test.sh               all tiers
#   scripts/test.sh release asan  only those tiers
# Tests labelled `slow` run only in scripts/full-check.sh.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/scripts/setup.sh"

jobs=$(nproc)
ctest_args=(--output-on-failure --timeout 300 -j"$jobs" ${KILN_CTEST_ARGS:-})
tiers=("$@")
[ ${#tiers[@]} -gt 0 ] || tiers=(release asan nvcc)
summary=()
total_start=$(date +%s)

# ceiling_s NAME: the tier's ceiling from docs/ci.md, in seconds.
ceiling_s() {
  case "$1" in
    release) echo 600 ;; asan) echo 720 ;; nvcc) echo 480 ;; *) echo 600 ;;
  esac
}

configure_build() { # DIR ARGS...
  local dir=$1; shift
  cmake -S "$top" -B "$dir" "$@" >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; return 1; }
  cmake --build "$dir" -j"$jobs"
}

tier_release() {
  local d="$top/build-ci/release"
  mkdir -p "$top/build-ci"
  configure_build "$d" -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_CUDA=OFF -DKILN_WERROR=ON
  ctest --test-dir "$d" -LE slow "${ctest_args[@]}"
  "$top/scripts/check-install.sh" "$d"
}

tier_asan() {
  local d="$top/build-ci/asan"
  mkdir -p "$top/build-ci"
  configure_build "$d" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_WITH_CUDA=OFF -DKILN_WERROR=ON \
    -DKILN_SANITIZE=address,undefined
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$d" -LE slow "${ctest_args[@]}"
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
  configure_build "$d" -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_CUDA=ON -DKILN_WERROR=ON \
    -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES=80 -DKILN_BUILD_TESTS=OFF
  grep -q "cuda=on" "$d/generated/kiln_config.h" || { echo "tier nvcc: CUDA backend was not enabled"; return 1; }
  # Without a driver the CUDA build must still run and list zero CUDA devices.
  "$d/bin/kiln" info
}

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
    exit $status
  fi
done

echo "=== summary"
printf '%s\n' "${summary[@]}"
echo "total $(( $(date +%s) - total_start ))s (budget 2700s)"

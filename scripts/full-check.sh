#!/usr/bin/env bash
# Everything, slow tests included: the tiers of scripts/test.sh, then the
# tests labelled `slow` in the release and sanitizer builds, then every
# parser's fuzz target for 10^7 executions and the model-spec forward
# target for 30 minutes (hours on 2 cores: docs/ci.md has the measured
# rates; KILN_SKIP_LONG_FUZZ=1 leaves that out, KILN_FUZZ_RUNS=N and
# KILN_FUZZ_FORWARD_SECONDS=S change it). For contributors before a large
# change; CI runs scripts/test.sh only.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/scripts/test.sh" "$@"
for d in release asan; do
  if [ -d "$top/build-ci/$d" ]; then
    echo "=== slow tests in build-ci/$d"
    ctest --test-dir "$top/build-ci/$d" -L slow --output-on-failure --timeout 1800 || exit 1
  fi
done
# Long fuzzing: every parser's target for 10^7 executions (KILN_FUZZ_RUNS)
# with its dictionary, the forward target (fuzz_model_spec, which builds
# and runs each model) for KILN_FUZZ_FORWARD_SECONDS (1800), the inputs
# that add coverage merged back into tests/fuzz/corpus/ (commit them: the
# corpus grows in the repository).
if [ "${KILN_SKIP_LONG_FUZZ:-0}" != 1 ]; then
  echo "=== long fuzzing: ${KILN_FUZZ_RUNS:-10000000} executions per target"
  KILN_FUZZ_RUNS=${KILN_FUZZ_RUNS:-10000000} KILN_FUZZ_MERGE=1 "$top/scripts/test.sh" fuzz || exit 1
fi

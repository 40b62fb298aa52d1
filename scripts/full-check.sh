#!/usr/bin/env bash
# Everything, slow tests included: the tiers of scripts/test.sh, then the
# tests labelled `slow` in the release and sanitizer builds. For
# contributors before a large change; CI runs scripts/test.sh only.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/scripts/test.sh" "$@"
for d in release asan; do
  if [ -d "$top/build-ci/$d" ]; then
    echo "=== slow tests in build-ci/$d"
    ctest --test-dir "$top/build-ci/$d" -L slow --output-on-failure --timeout 1800 || exit 1
  fi
done

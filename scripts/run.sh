#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: install what is missing,
# build, then run `kiln ARGS` (default: `kiln train`, the tutorial CNN on
# Fashion-MNIST; `scripts/run.sh info` shows the build and devices).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/scripts/setup.sh"
"$top/scripts/build.sh"
if [ $# -eq 0 ]; then set -- train; fi
exec "$top/build/bin/kiln" "$@"

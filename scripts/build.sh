#!/usr/bin/env bash
# Configure and build Kiln into build/ (release, CUDA backend when nvcc is
# present). Used by scripts/run.sh; safe to run again (incremental).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cmake -S "$top" -B "$top/build" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$top/build" -j"$(nproc)"

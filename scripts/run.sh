#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: install what is missing,
# build, then run `kiln ARGS` (default: `kiln info`; becomes `kiln train`
# once the trainer exists).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/scripts/setup.sh"
"$top/scripts/build.sh"
if [ $# -eq 0 ]; then set -- info; fi
exec "$top/build/bin/kiln" "$@"

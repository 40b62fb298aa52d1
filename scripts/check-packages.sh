#!/usr/bin/env bash
# Prove that scripts/setup.sh's package list is closed, without a fresh
# machine: trace a configure (+ build + tests) with strace, map every file
# under /usr (and /lib, /bin, /sbin, /etc) that was opened or executed to its
# Debian package, and name any package that is none of
#   - in setup.sh's list,
#   - in the Depends/Pre-Depends closure of a listed package (Recommends and
#     Suggests do not count: setup installs with --no-install-recommends),
#   - Essential, or in the Depends closure of an Essential package.
# A package used but not accounted for is a step a fresh machine would miss.
#
#   scripts/check-packages.sh --quick         configure only (under a minute)
#   scripts/check-packages.sh                 configure + build + tests (-LE slow)
#   scripts/check-packages.sh --traces DIR    check traces already recorded
#                                             (strace -ff -o DIR/t ...: scripts/test.sh's release tier)
#   scripts/check-packages.sh --record DIR -- CMD...   run CMD under the same strace, traces into DIR
# Exit 0 when the list is closed, 1 when a package is missing from it, 2 on
# a usage or tool error. Needs strace and python3 (both installed by setup).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

# record DIR CMD...: CMD under strace, one trace file per process/thread,
# successful open/openat/execve calls only (seccomp-bpf keeps the rest cheap).
record() {
  local dir=$1; shift
  command -v strace >/dev/null || { echo "check-packages: strace not found (Debian package strace; scripts/setup.sh installs it)" >&2; exit 2; }
  mkdir -p "$dir"
  strace -f -ff --seccomp-bpf -z -qq -e trace=open,openat,execve -o "$dir/t" -- "$@"
}

mode=full traces=""
case "${1:-}" in
  --quick) mode=quick ;;
  --traces) mode=traces; traces=${2:?--traces needs a directory} ;;
  --record) shift; dir=${1:?--record needs a directory}; shift; [ "${1:-}" = "--" ] && shift
            [ $# -gt 0 ] || usage; record "$dir" "$@"; exit $? ;;
  "") ;;
  *) usage ;;
esac

command -v python3 >/dev/null || { echo "check-packages: python3 not found (Debian package python3; scripts/setup.sh installs it)" >&2; exit 2; }

if [ "$mode" != traces ]; then
  work=$(mktemp -d -t kiln-check-packages.XXXX)
  trap 'rm -rf "$work"' EXIT
  traces="$work/traces"
  # No ccache: a cache hit would hide the headers a compile reads.
  export CCACHE_DISABLE=1
  if [ "$mode" = quick ]; then
    record "$traces" cmake -S "$top" -B "$work/build" -DCMAKE_BUILD_TYPE=Release >"$work/configure.log" 2>&1 ||
      { cat "$work/configure.log"; echo "check-packages: the configure failed" >&2; exit 1; }
  else
    record "$traces" bash -c 'cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_CUDA=OFF &&
        cmake --build "$2" -j"$(nproc)" && ctest --test-dir "$2" -LE slow -j"$(nproc)" --timeout 300' \
      _ "$top" "$work/build" >"$work/run.log" 2>&1 ||
      { tail -n 40 "$work/run.log"; echo "check-packages: the traced run failed (log above)" >&2; exit 1; }
  fi
fi

[ -d "$traces" ] || { echo "check-packages: no trace directory $traces" >&2; exit 2; }

# The package list, from setup.sh itself (the array between 'packages=(' and ')').
listed=$(sed -n '/^packages=(/,/^)/p' "$top/scripts/setup.sh" | sed '1d;$d' | sed 's/#.*//' | tr -s ' \t' '\n' | sed '/^$/d')
[ -n "$listed" ] || { echo "check-packages: no package list found in scripts/setup.sh" >&2; exit 2; }

exec python3 "$top/scripts/check_packages.py" "$traces" $listed

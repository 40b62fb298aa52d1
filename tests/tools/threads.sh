#!/bin/sh
# The compute threads (docs/training.md, "Threads"): --threads N and
# KILN_NUM_THREADS reach kiln info, kiln train's setup line and summary
# record, and a benchmark's JSON; --threads wins over the variable; bad
# values are refused with the flag or variable named.
# usage: threads.sh KILN_BINARY. The training part exits 77 (skipped)
# without the dataset, after the rest has run.
set -eu
kiln=$1
out=$(mktemp -d "${TMPDIR:-/tmp}/kiln_threads.XXXXXX")
trap 'rm -rf "$out"' EXIT
info_threads() { sed -n 's/^threads: \([0-9]*\) compute.*/\1/p' "$1"; }

"$kiln" info --threads 1 > "$out/info1"
test "$(info_threads "$out/info1")" = 1
grep -q '^threads: 1 compute, [0-9]* loader worker' "$out/info1"
KILN_NUM_THREADS=1 "$kiln" info > "$out/env1"
test "$(info_threads "$out/env1")" = 1
KILN_NUM_THREADS=1 "$kiln" info --threads 3 > "$out/both"
test "$(info_threads "$out/both")" = 3
KILN_NUM_THREADS= "$kiln" info > "$out/empty"   # empty: unset
test "$(info_threads "$out/empty")" -ge 1
# The default: every core computes, and a loader on auto starts no worker.
cores=$(getconf _NPROCESSORS_ONLN)
env -u KILN_NUM_THREADS -u OMP_NUM_THREADS "$kiln" info > "$out/default"
grep -q "^threads: $cores compute, 0 loader workers" "$out/default" || { cat "$out/default"; exit 1; }
# OMP_NUM_THREADS is the user's too, below KILN_NUM_THREADS.
env -u KILN_NUM_THREADS OMP_NUM_THREADS=3 "$kiln" info | grep -q '^threads: 3 compute'
KILN_NUM_THREADS=2 OMP_NUM_THREADS=3 "$kiln" info | grep -q '^threads: 2 compute'
# Loader workers on auto take what the compute threads leave.
"$kiln" info --threads "$cores" | grep -q "^threads: $cores compute, 0 loader workers on auto"

# Bad values: usage errors (exit 2) naming --threads, init errors (exit 1)
# naming KILN_NUM_THREADS.
for bad in 0 -1 abc 1025 2x ""; do
  set +e
  "$kiln" info --threads "$bad" > /dev/null 2> "$out/err"
  rc=$?
  set -e
  test "$rc" -eq 2 || { echo "--threads '$bad': exit $rc, expected 2"; exit 1; }
  grep -q "^kiln info: --threads '$bad' is not a thread count (give a whole number from 1 to 1024)" "$out/err" ||
    { echo "--threads '$bad':"; cat "$out/err"; exit 1; }
  [ -z "$bad" ] && continue
  set +e
  KILN_NUM_THREADS="$bad" "$kiln" train --limit 64 > /dev/null 2> "$out/err"
  rc=$?
  set -e
  test "$rc" -eq 1 || { echo "KILN_NUM_THREADS='$bad': exit $rc, expected 1"; exit 1; }
  grep -q "KILN_NUM_THREADS '$bad' is not a thread count" "$out/err" || { cat "$out/err"; exit 1; }
done
set +e
"$kiln" bench profiler --threads 2> "$out/err"
rc=$?
set -e
test "$rc" -eq 2
grep -q -- "--threads needs a value" "$out/err"
# kiln train: an option it does not know, last on the line, is named as
# unknown (it used to be told it "needs a value"); a known one without its
# value is told so.
set +e
"$kiln" train --no-checkpoint 2> "$out/err"
rc=$?
set -e
test "$rc" -eq 2
grep -q -- "^kiln train: unknown option '--no-checkpoint'" "$out/err" || { cat "$out/err"; exit 1; }
set +e
"$kiln" train --batch 2> "$out/err"
rc=$?
set -e
test "$rc" -eq 2
grep -q -- "^kiln train: --batch needs a value" "$out/err" || { cat "$out/err"; exit 1; }

# A benchmark's JSON carries the threads.
"$kiln" bench profiler --n 1000 --threads 1 | tail -n 1 | grep -q '^{"bench":"profiler","threads":1,'
KILN_NUM_THREADS=2 "$kiln" bench profiler --n 1000 | tail -n 1 | grep -q '^{"bench":"profiler","threads":2,'

data=/usr/share/datasets/fashion-mnist
if [ ! -e "$data/train-images-idx3-ubyte.gz" ] && [ ! -e "$data/train-images-idx3-ubyte" ]; then
  echo "SKIPPED: Fashion-MNIST not installed (Debian package dataset-fashion-mnist)"
  exit 77
fi
# kiln train: the setup line and the summary record.
"$kiln" train --limit 128 --batch 64 --epochs 1 --schedule constant --threads 1 --workers 0 --out "$out/t1" > "$out/t1.out" 2> "$out/t1.err"
grep -q "on cpu (1 compute thread, 0 loader workers)" "$out/t1.err"
grep -q '"event":"summary".*"threads":1,"loader_workers":0,' "$out/t1/metrics.jsonl"
KILN_NUM_THREADS=1 "$kiln" train --limit 128 --batch 64 --epochs 1 --schedule constant --out "$out/e1" > "$out/e1.out" 2> "$out/e1.err"
tail -n 1 "$out/e1.out" | grep -q '"threads":1,'
echo "threads: ok"

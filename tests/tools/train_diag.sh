#!/bin/sh
# kiln train's diagnostics switches on a slice of Fashion-MNIST: --profile
# prints the op table and the efficiency counters and writes trace.json
# next to metrics.jsonl; --monitor logs "event":"monitor" records;
# --detect-leaks reports (here: no graph kept across steps);
# --detect-anomaly checks every op and reports none; --memory-history
# writes memory_snapshot.json, which kiln report draws as the memory
# timeline.
# usage: train_diag.sh KILN_BINARY. Exit 77 (skipped) without the dataset.
set -eu
kiln=$1
data=/usr/share/datasets/fashion-mnist
if [ ! -e "$data/train-images-idx3-ubyte.gz" ] && [ ! -e "$data/train-images-idx3-ubyte" ]; then
  echo "FAILED: Fashion-MNIST not installed (Debian package dataset-fashion-mnist; scripts/setup.sh installs it)"
  exit 1
fi
out=$(mktemp -d "${TMPDIR:-/tmp}/kiln_train_diag.XXXXXX")
trap 'rm -rf "$out"' EXIT
"$kiln" train --limit 128 --batch 32 --log-every 1 --profile 2 --monitor --detect-leaks --out "$out/run" \
  > "$out/stdout" 2> "$out/stderr"
cat "$out/stderr"
grep -q "profile of 2 steps" "$out/stderr"
grep -q "Self CPU" "$out/stderr"
grep -q "conv2d" "$out/stderr"
grep -q "kernel launches, .* host syncs, .* raw allocations, .* pageable copies" "$out/stderr"
test -s "$out/run/trace.json"
grep -q '"ph":"X"' "$out/run/trace.json"
grep -q '"event":"monitor"' "$out/run/metrics.jsonl"
grep -q "leak check: no autograd graph kept across steps" "$out/stderr"
tail -n 1 "$out/stdout" | grep -q '^{"event":"summary"'
"$kiln" train --limit 64 --batch 32 --detect-anomaly --out "$out/anomaly" > /dev/null 2> "$out/anomaly.err"
grep -q "anomaly detection on" "$out/anomaly.err"
grep -q "anomaly check: no NaN or infinity" "$out/anomaly.err"
"$kiln" train --limit 64 --batch 32 --memory-history --out "$out/mem" > /dev/null 2> "$out/mem.err"
grep -q "memory history on" "$out/mem.err"
test -s "$out/mem/memory_snapshot.json"
grep -q '"segments"' "$out/mem/memory_snapshot.json"
grep -q '"conv2d_relu_max_pool2d"' "$out/mem/memory_snapshot.json"
"$kiln" report "$out/mem" > /dev/null
grep -q "memory timeline\|Memory timeline" "$out/mem/report.html"
echo "train diag: ok"

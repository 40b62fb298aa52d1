#!/bin/sh
# `kiln bench checkpoint` end to end on a tiny residual model (one step of
# each configuration, both placements) and tools/memory_peak.py on the
# snapshots it writes: a smoke test of the code paths, never of timings.
# The plain step's activation memory (the allocator's, not a timing) must
# be positive, and the script must find the peak and name the ops there.
# usage: bench_checkpoint_smoke.sh KILN_BINARY REPO_DIR
set -eu
kiln=$1
repo=$2
out=$(mktemp -d "${TMPDIR:-/tmp}/kiln_bench_ckpt.XXXXXX")
trap 'rm -rf "$out"' EXIT
cat > "$out/model.txt" <<'SPEC'
conv 16 k3 p1 nobias
batchnorm
relu
residual {
  conv 16 k3 p1 nobias
  batchnorm
  relu
  conv 16 k3 p1 nobias
  batchnorm
}
adaptiveavgpool 1
flatten
linear 10
SPEC
for placement in memory layers; do
  "$kiln" bench checkpoint --model "$out/model.txt" --input 3x16x16 --batch 8 --segments 2,3 --steps 1 \
    --warmup 0 --placement "$placement" --snapshot "$out/snap" > "$out/bench.txt"
  grep -q '^segments 2: layers \[0, ' "$out/bench.txt"
  tail -n 1 "$out/bench.txt" | grep -q '"bench":"checkpoint"'
done
# the activation memory of the plain step (last run), in bytes, from the JSON line
act=$(tail -n 1 "$out/bench.txt" | sed 's/.*"segments":0,"activation_bytes":\([0-9]*\).*/\1/')
test "$act" -gt 0
command -v python3 > /dev/null || { echo "FAILED: python3 not found (scripts/setup.sh installs it)"; exit 1; }
python3 "$repo/tools/memory_peak.py" "$out/snap-0.json" > "$out/peak.txt"
grep -q "^peak inside the trace: " "$out/peak.txt"
grep -q "live at the peak, by the allocating op:" "$out/peak.txt"
grep -q "conv2d" "$out/peak.txt"
echo "bench checkpoint smoke: ok"

#!/bin/sh
# `mpirun -np 2 kiln train --device cuda` (DDP through NCCL, each rank on
# cuda:<local rank>; in the emulation build NCCL's shared-memory emulation
# and emulated cuda:0 and cuda:1) against one process on cuda:0 with the same
# global batch: 256 Fashion-MNIST images, batch 64, 4 steps, f32 (--amp off).
# Each step's loss within 1e-5 relative (only the order of f32 additions
# differs), the same test accuracy, and rank 0 saying the gradients go
# through nccl. Skipped (77) where the build sees no CUDA device.
# usage: train_ddp_cuda.sh KILN_BINARY MPIRUN
set -eu
kiln=$1
mpirun="$2 --oversubscribe --bind-to none"
data=/usr/share/datasets/fashion-mnist
if [ ! -e "$data/train-images-idx3-ubyte.gz" ] && [ ! -e "$data/train-images-idx3-ubyte" ]; then
  echo "FAILED: Fashion-MNIST not installed (Debian package dataset-fashion-mnist; scripts/setup.sh installs it)"
  exit 1
fi
"$kiln" info 2>/dev/null | grep -q "cuda:0" || { echo "SKIPPED: no CUDA device"; exit 77; }
out=$(mktemp -d "${TMPDIR:-/tmp}/kiln_train_ddp_cuda.XXXXXX")
trap 'rm -rf "$out"' EXIT
fail() { echo "FAILED: $*"; exit 1; }
steps() { grep '"event":"step"' "$1/metrics.jsonl" | sed 's/.*"step":\([0-9]*\),"epoch":[0-9]*,"loss":\([^,]*\),.*/\1 \2/'; }
field() { grep "\"event\":\"$1\"" "$2" | tail -n 1 | sed "s/.*\"$3\":\([^,}]*\).*/\1/"; }
args="--limit 256 --epochs 1 --log-every 1 --deterministic --workers 0 --threads 1 --batch 64 --amp off --device cuda"
"$kiln" train $args --out "$out/one" > /dev/null 2> "$out/one.err" || { cat "$out/one.err"; fail "one process"; }
timeout -k 5 240 $mpirun -np 2 "$kiln" train $args --out "$out/two" > /dev/null 2> "$out/two.err" ||
  { cat "$out/two.err"; fail "mpirun -np 2"; }
cat "$out/two.err"
grep -q "2 ranks on CUDA: each rank on cuda:(its local rank mod [0-9]*), gradients through nccl" "$out/two.err" ||
  fail "rank 0 did not say the gradients go through nccl"
steps "$out/one" > "$out/a"
steps "$out/two" > "$out/b"
test "$(wc -l < "$out/a")" -eq 4 || fail "$(wc -l < "$out/a") step records from one process, not 4"
test "$(wc -l < "$out/b")" -eq 4 || fail "$(wc -l < "$out/b") step records from 2 ranks, not 4"
paste "$out/a" "$out/b" | awk '{
    d = $2 - $4; if (d < 0) d = -d; s = $2 < 0 ? -$2 : $2; if (s < 1) s = 1
    printf "step %d: one process %s, 2 ranks %s, relative %.2g\n", $1, $2, $4, d / s
    if (d / s > 1e-5) bad = 1 } END { exit bad }' || fail "a step's loss differs by more than 1e-5"
a1=$(field epoch "$out/one/metrics.jsonl" test_acc)
a2=$(field epoch "$out/two/metrics.jsonl" test_acc)
[ "$a1" = "$a2" ] || fail "test accuracy $a2 with 2 ranks, $a1 with one process"
echo "PASS: 2 ranks on CUDA through NCCL match one process (test accuracy $a1)"

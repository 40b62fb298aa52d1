#!/bin/sh
# kiln train --device on the CUDA path: the main job, shortened (--limit,
# one epoch), on cuda:0 in f32 (--amp off) and with --amp f16, against the
# same run on the CPU: each lands within 1 point of the CPU's test accuracy
# and its summary names the device; kiln eval --device cuda:0 of the CPU
# run's checkpoint gives the CPU's accuracy. Meant for the emulation build (the
# emulation tier runs it on the emulated cuda:0) and for GPUs
# (scripts/gpu-check.sh). Exit 77 (skipped, with the reason) where the
# build sees no CUDA device.
# usage: train_device.sh KILN_BINARY LIMIT
set -eu
kiln=$1
limit=$2
if ! "$kiln" info 2>/dev/null | grep -q "cuda:0"; then
  echo "SKIPPED: no CUDA device in this build (the emulation tier runs this on the emulated cuda:0)"
  exit 77
fi
out=$(mktemp -d "${TMPDIR:-/tmp}/kiln_train_device.XXXXXX")
trap 'rm -rf "$out"' EXIT
args="--limit $limit --epochs 1 --batch 64 --schedule constant --lr 2e-3 --seed 3 --workers 0 --progress lines"
acc() { tail -n 1 "$1" | sed 's/.*"test_acc":\([^,]*\),.*/\1/'; }
run() { # NAME ARGS...
  name=$1; shift
  "$kiln" train $args --out "$out/$name" "$@" > "$out/$name.out" 2> "$out/$name.err" || {
    echo "FAILED: kiln train $args $*:"; cat "$out/$name.err"; exit 1; }
}
run cpu --device cpu --amp off
run f32 --device cuda:0 --amp off
run f16 --device cuda:0 --amp f16
grep -q '"device":"cpu"' "$out/cpu.out"
for name in f32 f16; do
  if ! tail -n 1 "$out/$name.out" | grep -q '"device":"cuda:0"'; then
    echo "FAILED: the $name run's summary does not name cuda:0:"; tail -n 1 "$out/$name.out"; exit 1
  fi
  a=$(acc "$out/cpu.out") b=$(acc "$out/$name.out")
  if ! awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.01) }'; then
    echo "FAILED: cuda:0 $name test accuracy $b is more than 1 point from the CPU's $a"; exit 1
  fi
  echo "cuda:0 $name: test accuracy $b (cpu $a)"
done
grep -q '"amp":"f16"' "$out/f16.out"
# kiln eval --device cuda:0 of the CPU run's checkpoint: the CPU run's accuracy.
"$kiln" eval --checkpoint "$out/cpu/checkpoint.safetensors" --limit "$limit" --device cuda:0 > "$out/eval.out"
e=$(tail -n 1 "$out/eval.out" | sed 's/.*"test_acc":\([^,]*\),.*/\1/') a=$(acc "$out/cpu.out")
if ! awk -v a="$a" -v b="$e" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.01) }'; then
  echo "FAILED: kiln eval --device cuda:0 gives $e for the CPU run's checkpoint, which reached $a"; exit 1
fi
echo "kiln eval --device cuda:0 of the CPU checkpoint: $e (cpu $a)"

#!/bin/sh
# kiln train on two devices in one process: the main job, shortened (--limit,
# one epoch, f32), with --devices cuda:0,cuda:1 (DataParallel) and with
# --split 0:cuda:0,6:cuda:1 --micro-batches 4 (the tutorial CNN's three
# conv/relu/pool blocks: layers 0-5, its first two, on cuda:0; the third and
# the classifier, 6-12, on cuda:1), against the same run on the CPU: each
# lands within 1 point of the CPU's test accuracy and its summary names its
# devices (and the split as the model holds it) and each device's peak
# memory, which must not be 0 (a device the work never reached); the
# --devices run's checkpoint is the plain model's (no "module." names), so
# kiln eval --device cpu of it gives that run's accuracy. Meant for the emulation build (the emulation tier runs it
# on the emulated cuda:0 and cuda:1) and for GPUs (scripts/gpu-check.sh).
# Exit 77 (skipped, with the reason) where the build sees fewer than two
# CUDA devices.
# usage: train_multi_device.sh KILN_BINARY LIMIT
set -eu
kiln=$1
limit=$2
if ! "$kiln" info 2>/dev/null | grep -q "cuda:1 "; then
  echo "SKIPPED: fewer than two CUDA devices in this build ($("$kiln" info 2>/dev/null | grep -c '^  cuda:') listed;" \
    "the emulation tier runs this on the emulated cuda:0 and cuda:1)"
  exit 77
fi
out=$(mktemp -d "${TMPDIR:-/tmp}/kiln_train_multi.XXXXXX")
trap 'rm -rf "$out"' EXIT
args="--limit $limit --epochs 1 --batch 64 --schedule constant --lr 2e-3 --seed 3 --workers 0 --progress lines --amp off"
acc() { tail -n 1 "$1" | sed 's/.*"test_acc":\([^,]*\),.*/\1/'; }
near() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.01) }'; }
run() { # NAME ARGS...
  name=$1; shift
  "$kiln" train $args --out "$out/$name" "$@" > "$out/$name.out" 2> "$out/$name.err" || {
    echo "FAILED: kiln train $args $*:"; cat "$out/$name.err"; exit 1; }
}
has() { # NAME TEXT: the run's summary (its last stdout line) holds TEXT
  if ! tail -n 1 "$out/$1.out" | grep -qF "$2"; then
    echo "FAILED: the $1 run's summary does not hold $2:"; tail -n 1 "$out/$1.out"; exit 1
  fi
}
run cpu --device cpu
run dp --devices cuda:0,cuda:1
run split --split 0:cuda:0,6:cuda:1 --micro-batches 4
has dp '"device":"cuda:0"'
has dp '"devices":["cuda:0","cuda:1"],"device_peak_bytes":['
has dp '],"parallel":"data"'
has split '"device":"cuda:0"'
has split '"devices":["cuda:0","cuda:1"],"device_peak_bytes":['
has split '],"parallel":"pipeline","split":[{"layer":0,"device":"cuda:0"},{"layer":6,"device":"cuda:1"}],"micro_batches":4'
# Each device did work: its allocator's peak over the run is not 0.
for name in dp split; do
  peaks=$(tail -n 1 "$out/$name.out" | sed -n 's/.*"device_peak_bytes":\[\([0-9]*,[0-9]*\)\].*/\1/p')
  case "$peaks" in
    ""|0,*|*,0) echo "FAILED: the $name run's device_peak_bytes are '$peaks': a device did no work:"
                tail -n 1 "$out/$name.out"; exit 1 ;;
  esac
  echo "$name: peak bytes per device $peaks"
done
grep -q 'on cuda:0, cuda:1 by DataParallel' "$out/dp.err" || { echo "FAILED: the dp run's start line:"; cat "$out/dp.err"; exit 1; }
grep -q 'on cuda:0 (layers 0-5), cuda:1 (layers 6-12) in 4 micro-batches' "$out/split.err" ||
  { echo "FAILED: the split run's start line:"; cat "$out/split.err"; exit 1; }
a=$(acc "$out/cpu.out")
for name in dp split; do
  b=$(acc "$out/$name.out")
  near "$a" "$b" || { echo "FAILED: the $name run's test accuracy $b is more than 1 point from the CPU's $a"; exit 1; }
  echo "$name: test accuracy $b (cpu $a)"
done
# The --devices run's checkpoint is the plain model's: kiln eval on the CPU
# builds the plain model and loads it (a "module."-prefixed file fails to
# load), and gives the run's own accuracy.
d=$(acc "$out/dp.out")
"$kiln" eval --checkpoint "$out/dp/checkpoint.safetensors" --limit "$limit" --device cpu > "$out/eval.out" 2> "$out/eval.err" ||
  { echo "FAILED: kiln eval --device cpu of the --devices run's checkpoint:"; cat "$out/eval.err"; exit 1; }
e=$(acc "$out/eval.out")
near "$d" "$e" || { echo "FAILED: kiln eval --device cpu gives $e for the --devices run's checkpoint, which reached $d"; exit 1; }
echo "kiln eval --device cpu of the --devices checkpoint: $e (the run: $d)"

#!/bin/sh
# kiln train survives running out of memory (tools/train_oom.c): under an
# allocator limit (KILN_ALLOC_CONF=limit_mb:LIMIT) where a step at batch 128
# does not fit and one at 64 does, the run halves its micro-batch once, at
# the first step, says so once (stderr and an auto_batch record), and
# completes. Its per-step losses and test loss equal, to f32 tolerance, those
# of a run started with --batch 128 --accum 2 and no limit. The model has
# BatchNorm and dropout: with --accum 2 BatchNorm normalises each micro-batch
# of 64 with its own statistics, and the retried step does the same after
# the snapshot put back the running statistics and the generators, so the
# two runs compute the same thing (measured: equal to the last digit). Then:
# --no-auto-batch under the same limit stops with the out-of-memory error,
# and a model whose one-sample step cannot fit stops saying nothing is left
# to halve, with the limit. The ASan tier runs this too (LeakSanitizer at
# each exit: nothing leaks).
# usage: train_auto_batch.sh KILN_BINARY DEVICE LIMIT_MB
# (exit 77, with the reason, for a CUDA device this build does not see)
set -eu
kiln=$1
device=$2
limit=$3
case $device in
  cuda*)
    if ! "$kiln" info 2>/dev/null | grep -q "cuda:0"; then
      echo "SKIPPED: no CUDA device in this build (the emulation tier runs this on the emulated cuda:0)"
      exit 77
    fi ;;
esac
out=$(mktemp -d "${TMPDIR:-/tmp}/kiln_auto_batch.XXXXXX")
trap 'rm -rf "$out"' EXIT
cat > "$out/bn.txt" <<'EOF'
conv 16 k3 p1
batchnorm
relu
maxpool 2
conv 32 k3 p1
batchnorm
relu
maxpool 2
flatten
dropout 0.25
linear 64
relu
linear 10
EOF
args="--model $out/bn.txt --device $device --limit 512 --epochs 1 --batch 128 --amp off --seed 3 --workers 0
      --progress lines --log-every 1"
# The reference: --accum 2 and no limit.
"$kiln" train $args --accum 2 --out "$out/ref" > "$out/ref.out" 2> "$out/ref.err" || {
  echo "FAILED: the --accum 2 reference run:"; cat "$out/ref.err"; exit 1; }
# Under the limit: one halving at step 0.
if ! KILN_ALLOC_CONF=limit_mb:$limit "$kiln" train $args --out "$out/auto" > "$out/auto.out" 2> "$out/auto.err"; then
  echo "FAILED: the run under limit_mb:$limit did not complete:"; cat "$out/auto.err"; exit 1
fi
n=$(grep -c "retrying the step with micro-batches of 64 (accumulation 2, the batch of 128 unchanged)" "$out/auto.err" || true)
if [ "$n" != 1 ]; then
  echo "FAILED: expected one halving to micro-batches of 64 under limit_mb:$limit, stderr says:"; cat "$out/auto.err"; exit 1
fi
if [ "$(grep -c '"event":"auto_batch"' "$out/auto/metrics.jsonl")" != 1 ] ||
   ! grep -q '{"event":"auto_batch","step":0,"micro_batch":64,"accum":2}' "$out/auto/metrics.jsonl"; then
  echo "FAILED: metrics.jsonl should hold one auto_batch record at step 0:"; grep auto_batch "$out/auto/metrics.jsonl"; exit 1
fi
losses() { grep -o '"loss":[^,]*\|"test_loss":[^,]*' "$1" | sed 's/.*://'; }
losses "$out/ref/metrics.jsonl" > "$out/ref.losses"
losses "$out/auto/metrics.jsonl" > "$out/auto.losses"
if [ "$(wc -l < "$out/ref.losses")" -lt 5 ] || [ "$(wc -l < "$out/ref.losses")" != "$(wc -l < "$out/auto.losses")" ]; then
  echo "FAILED: the runs logged different numbers of losses"; exit 1
fi
if ! paste "$out/ref.losses" "$out/auto.losses" | awk '{ d = $1 - $2; if (d < 0) d = -d; m = $1 < 0 ? -$1 : $1;
     if (d > 1e-5 * m + 1e-7) { print "loss " NR ": " $2 " under the limit, " $1 " with --accum 2"; bad = 1 } }
     END { exit bad }'; then
  echo "FAILED: the halved run's losses differ from --accum 2's"; exit 1
fi
echo "$device, limit_mb:$limit: one halving to micro-batches of 64; $(wc -l < "$out/auto.losses") losses equal to --accum 2's"
# --no-auto-batch: the out-of-memory ends the run.
if KILN_ALLOC_CONF=limit_mb:$limit "$kiln" train $args --no-auto-batch --out "$out/off" > /dev/null 2> "$out/off.err"; then
  echo "FAILED: --no-auto-batch under limit_mb:$limit completed"; exit 1
fi
grep -q "out of memory" "$out/off.err" || { echo "FAILED: --no-auto-batch's error:"; cat "$out/off.err"; exit 1; }
if grep -q "retrying" "$out/off.err"; then echo "FAILED: --no-auto-batch retried"; exit 1; fi
# A model whose one-sample training step does not fit: nothing to halve.
# Its evaluation of one image fits (no activations kept for a backward).
printf 'conv 96 k3 p1\nrelu\nconv 96 k3 p1\nrelu\nadaptiveavgpool 1\nflatten\nlinear 10\n' > "$out/wide.txt"
if KILN_ALLOC_CONF=limit_mb:3 "$kiln" train --model "$out/wide.txt" --device "$device" --limit 64 --epochs 1 \
     --batch 4 --amp off --workers 0 --progress lines --out "$out/wide" > /dev/null 2> "$out/wide.err"; then
  echo "FAILED: a model that cannot take one sample under limit_mb:3 completed"; exit 1
fi
if ! grep -q "out of memory with a micro-batch of 1 sample (batch 4, accumulation 4), nothing left to halve: .*limit of 3.0 MiB" "$out/wide.err"; then
  echo "FAILED: the last out-of-memory does not say nothing is left to halve, with the limit:"; cat "$out/wide.err"; exit 1
fi
echo "$device: --no-auto-batch stops at the out-of-memory; one sample that does not fit stops with the limit"

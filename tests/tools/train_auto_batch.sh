#!/bin/sh
# kiln train plans its step and survives running out of memory
# (tools/train_plan.c, tools/train_oom.c), under an allocator limit
# (KILN_ALLOC_CONF=limit_mb:LIMIT) where a step at batch 128 does not fit
# and one at 64 does:
#   - with the plan (the default), the run says before its first step that
#     micro-batches of 64 fit, records it (a plan record), never runs out of
#     memory, and after two steps holds the measured peaks against the plan
#     (a plan_check record: within 5%, reserved and allocated, here and in
#     the reference run without a limit);
#   - with --no-plan, the first step runs out of memory, the run halves its
#     micro-batch once, says so once (stderr and an auto_batch record), and
#     completes.
# Both runs' per-step losses and test loss equal, to f32 tolerance, those
# of a run started with --batch 128 --accum 2 and no limit. The model has
# BatchNorm and dropout: with --accum 2 BatchNorm normalises each micro-batch
# of 64 with its own statistics, and the retried step does the same after
# the snapshot put back the running statistics and the generators, so the
# runs compute the same thing (measured: equal to the last digit). Then:
# --no-auto-batch under the same limit is warned by the plan and stops with
# the out-of-memory error, and a model whose one-sample step cannot fit
# stops before its first step with the plan's peak and the limit (and, with
# --no-plan, at its first step saying nothing is left to halve). The ASan
# tier runs this too (LeakSanitizer at each exit: nothing leaks).
# usage: train_auto_batch.sh KILN_BINARY DEVICE LIMIT_MB|plan
# (exit 77, with the reason, for a CUDA device this build does not see).
# plan: the limit is halfway between kiln plan's reserved peak for
# micro-batches of 64 and its allocated peak for the step at batch 128 on
# DEVICE, so the test holds on any device: on an H100 cuBLASLt's 32 MiB
# workspace alone is more than the emulated device's whole step.
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
if [ "$limit" = plan ]; then
  cp "$out/bn.txt" "$out/bn_28x28x1.txt" # kiln plan reads the input size from the name
  plan() { # ACCUM KEY: a planned peak (bytes, two steps) of the step at batch 128
    "$kiln" plan --model "$out/bn_28x28x1.txt" --device "$device" --batch 128 --accum "$1" --amp off --steps 2 |
      tail -n 1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["plan"]["memories"][0][sys.argv[1]])' "$2"
  }
  # Batch 128 must fail: under a limit the allocator frees its cache and
  # retries, so what it cannot do without is the allocated peak. 64 must
  # fit, fragmentation included: its reserved peak.
  a128=$(plan 1 allocated_peak) && r64=$(plan 2 reserved_peak) || { echo "FAILED: kiln plan on $device"; exit 1; }
  limit=$(( (a128 + r64) / 2 / 1048576 ))
  if [ $((limit * 1048576)) -le "$r64" ] || [ $((limit * 1048576)) -ge "$a128" ]; then
    echo "FAILED: no whole MiB between the planned reserved peak of micro-batches of 64 ($r64 bytes) and the allocated peak at batch 128 ($a128 bytes)"; exit 1
  fi
  echo "$device: planned allocated peak at batch 128 $a128 bytes, reserved at micro-batches of 64 $r64 bytes: limit_mb:$limit"
fi
# The reference: --accum 2 and no limit.
"$kiln" train $args --accum 2 --out "$out/ref" > "$out/ref.out" 2> "$out/ref.err" || {
  echo "FAILED: the --accum 2 reference run:"; cat "$out/ref.err"; exit 1; }
# The plan's prediction held against the first two steps: within 5%.
plan_check() { # RUN_DIR
  rec=$(grep '"event":"plan_check"' "$1/metrics.jsonl") || { echo "FAILED: no plan_check record in $1"; exit 1; }
  echo "$rec" | tr ',{}' '\n\n\n' | awk -F: '{ v[$1] = $2 }
    END { for (k = 0; k < 2; k++) { m = k ? v["\"allocated_peak\""] : v["\"reserved_peak\""];
            p = k ? v["\"planned_allocated_peak\""] : v["\"planned_reserved_peak\""];
            if (m <= 0 || p <= 0 || (p - m) / m > 0.05 || (m - p) / m > 0.05) { print "off by more than 5%: " $0; bad = 1 } }
          exit bad }' || { echo "FAILED: the plan misses the measured peaks in $1: $rec"; exit 1; }
}
plan_check "$out/ref"
# Under the limit, planned: micro-batches of 64 from the first step.
if ! KILN_ALLOC_CONF=limit_mb:$limit "$kiln" train $args --out "$out/plan" > "$out/plan.out" 2> "$out/plan.err"; then
  echo "FAILED: the planned run under limit_mb:$limit did not complete:"; cat "$out/plan.err"; exit 1
fi
if [ "$(grep -c "plan: micro-batches of 64 (accumulation 2, the batch of 128 unchanged)" "$out/plan.err")" != 1 ] ||
   grep -q "retrying" "$out/plan.err"; then
  echo "FAILED: the plan should choose micro-batches of 64 once, and nothing should run out of memory:"; cat "$out/plan.err"; exit 1
fi
grep -q '"event":"plan",.*"limit":'$((limit * 1048576))',"micro_batch":64,"accum":2}' "$out/plan/metrics.jsonl" ||
  { echo "FAILED: no plan record with micro-batches of 64:"; grep plan "$out/plan/metrics.jsonl"; exit 1; }
plan_check "$out/plan"
# Under the limit without the plan: one halving at step 0.
if ! KILN_ALLOC_CONF=limit_mb:$limit "$kiln" train $args --no-plan --out "$out/auto" > "$out/auto.out" 2> "$out/auto.err"; then
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
for run in auto plan; do
  losses "$out/$run/metrics.jsonl" > "$out/$run.losses"
  if [ "$(wc -l < "$out/ref.losses")" -lt 5 ] || [ "$(wc -l < "$out/ref.losses")" != "$(wc -l < "$out/$run.losses")" ]; then
    echo "FAILED: the $run run and the reference logged different numbers of losses"; exit 1
  fi
  if ! paste "$out/ref.losses" "$out/$run.losses" | awk '{ d = $1 - $2; if (d < 0) d = -d; m = $1 < 0 ? -$1 : $1;
       if (d > 1e-5 * m + 1e-7) { print "loss " NR ": " $2 " under the limit, " $1 " with --accum 2"; bad = 1 } }
       END { exit bad }'; then
    echo "FAILED: the $run run's losses differ from --accum 2's"; exit 1
  fi
done
echo "$device, limit_mb:$limit: planned micro-batches of 64, and one halving without the plan; $(wc -l < "$out/auto.losses") losses equal to --accum 2's in both"
# --no-auto-batch: the out-of-memory ends the run.
if KILN_ALLOC_CONF=limit_mb:$limit "$kiln" train $args --no-auto-batch --out "$out/off" > /dev/null 2> "$out/off.err"; then
  echo "FAILED: --no-auto-batch under limit_mb:$limit completed"; exit 1
fi
grep -q "out of memory" "$out/off.err" || { echo "FAILED: --no-auto-batch's error:"; cat "$out/off.err"; exit 1; }
grep -q "plan: the first steps will run out of memory; --no-auto-batch" "$out/off.err" ||
  { echo "FAILED: the plan did not warn --no-auto-batch:"; cat "$out/off.err"; exit 1; }
if grep -q "retrying" "$out/off.err"; then echo "FAILED: --no-auto-batch retried"; exit 1; fi
# A model whose one-sample training step does not fit: nothing to halve.
# Its evaluation of one image fits (no activations kept for a backward).
printf 'conv 96 k3 p1\nrelu\nconv 96 k3 p1\nrelu\nadaptiveavgpool 1\nflatten\nlinear 10\n' > "$out/wide.txt"
wide="--model $out/wide.txt --device $device --limit 64 --epochs 1 --batch 4 --amp off --workers 0 --progress lines"
if KILN_ALLOC_CONF=limit_mb:3 "$kiln" train $wide --out "$out/wide_plan" > /dev/null 2> "$out/wide_plan.err"; then
  echo "FAILED: a model that cannot take one sample under limit_mb:3 completed"; exit 1
fi
if ! grep -q "plan: even micro-batches of one sample need .* MiB reserved on $device, more than the 3.0 MiB" "$out/wide_plan.err" ||
   grep -q "retrying\|out of memory at" "$out/wide_plan.err"; then
  echo "FAILED: the plan should stop the run before its first step, with the peak and the limit:"; cat "$out/wide_plan.err"; exit 1
fi
if KILN_ALLOC_CONF=limit_mb:3 "$kiln" train $wide --no-plan --out "$out/wide" > /dev/null 2> "$out/wide.err"; then
  echo "FAILED: a model that cannot take one sample under limit_mb:3 completed"; exit 1
fi
if ! grep -q "out of memory with a micro-batch of 1 sample (batch 4, accumulation 4), nothing left to halve: .*limit of 3.0 MiB" "$out/wide.err"; then
  echo "FAILED: the last out-of-memory does not say nothing is left to halve, with the limit:"; cat "$out/wide.err"; exit 1
fi
echo "$device: --no-auto-batch is warned and stops at the out-of-memory; one sample that does not fit stops before the first step (planned) or at it (--no-plan), with the limit"

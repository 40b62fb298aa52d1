#!/bin/sh
# `mpirun -np 2 kiln train` (DDP across processes, docs/distributed.md,
# "kiln train under mpirun") on 256 Fashion-MNIST images, one epoch, on the
# CPU, against one process with the same global batch:
#  1. per-step losses: the same samples form each global batch (rank r
#     trains positions r, r + 2, ... of it), the gradient is the global
#     batch's (sample-weighted), so Adam takes the same steps; only the order
#     of f32 additions differs (two means of 32 combined instead of one mean
#     of 64). Each step's loss must agree within 1e-5 relative (measured
#     ~1e-7), for batch 64 (32 + 32) and 63 (32 + 31, and a last batch of
#     4 = 2 + 2);
#  2. only rank 0 wrote: one record per step, one summary; rank 1 printed
#     nothing; the start says the per-rank batch and the effective lr;
#     --checkpoint 2 gives the 2-rank losses bit for bit, --amp bf16 trains,
#     --accum 2 gives the one process's losses (within 1e-5);
#  3. the test accuracy (the test set split across the ranks, sums
#     all-reduced) is kiln eval's of the checkpoint, to the image, and the
#     test loss within 1e-5 relative; with a BatchNorm model too (the ranks
#     evaluate rank 0's running statistics);
#  4. --resume with 2 ranks (--deterministic) repeats the uninterrupted
#     2-rank run's losses bit for bit; another rank count is refused naming
#     both;
#  5. --world 2 without mpirun (or with another count) says how to launch;
#  6. one rank out of memory: the job ends non-zero within 60 s, the
#     failed rank's error naming it (the recovery is off under DDP);
#  7. SIGINT to one rank: every rank stops at the same step, rank 0 writes
#     the checkpoint, the job exits 130.
# usage: train_ddp.sh KILN_BINARY MPIRUN. Needs the Debian package
# dataset-fashion-mnist (scripts/setup.sh installs it).
set -eu
kiln=$1
mpirun="$2 --oversubscribe --bind-to none"
data=/usr/share/datasets/fashion-mnist
if [ ! -e "$data/train-images-idx3-ubyte.gz" ] && [ ! -e "$data/train-images-idx3-ubyte" ]; then
  echo "FAILED: Fashion-MNIST not installed (Debian package dataset-fashion-mnist; scripts/setup.sh installs it)"
  exit 1
fi
out=$(mktemp -d "${TMPDIR:-/tmp}/kiln_train_ddp.XXXXXX")
trap 'rm -rf "$out"' EXIT
fail() { echo "FAILED: $*"; exit 1; }
steps() { grep '"event":"step"' "$1/metrics.jsonl" | sed 's/.*"step":\([0-9]*\),"epoch":[0-9]*,"loss":\([^,]*\),.*/\1 \2/'; }
field() { grep "\"event\":\"$1\"" "$2" | tail -n 1 | sed "s/.*\"$3\":\([^,}]*\).*/\1/"; }
# --device cpu: DDP runs on the CPU, and so must the one process it is held
# to (the emulation build's default device is an emulated GPU).
# --amp off: the losses are compared at f32's tolerance (auto picks bf16 on a CPU with native bf16).
args="--limit 256 --epochs 1 --log-every 1 --deterministic --workers 0 --threads 1 --device cpu --amp off"
np2() { timeout -k 5 120 $mpirun -np 2 "$kiln" train "$@"; }

# 1, 2. One process against two ranks, the same global batch.
for batch in 64 63; do
  "$kiln" train $args --batch $batch --out "$out/one$batch" > /dev/null 2> "$out/one$batch.err" ||
    { cat "$out/one$batch.err"; fail "one process, batch $batch"; }
  np2 $args --batch $batch --out "$out/two$batch" > "$out/two$batch.out" 2> "$out/two$batch.err" ||
    { cat "$out/two$batch.err"; fail "mpirun -np 2, batch $batch"; }
  steps "$out/one$batch" > "$out/a"
  steps "$out/two$batch" > "$out/b"
  n=$(wc -l < "$out/a")
  test "$n" -ge 4 || fail "batch $batch: only $n step records from one process"
  test "$(wc -l < "$out/b")" -eq "$n" || fail "batch $batch: $(wc -l < "$out/b") step records from 2 ranks, $n from one process (rank 1 wrote too, or steps are missing)"
  paste "$out/a" "$out/b" | awk -v b=$batch '{
      d = $2 - $4; if (d < 0) d = -d; s = $2 < 0 ? -$2 : $2; if (s < 1) s = 1
      if ($1 != $3 || d > 1e-5 * s) { print "FAILED: batch " b ", step " $1 ": loss " $2 " (one process) vs " $4 " (2 ranks)"; bad = 1 }
      if (d / s > worst) worst = d / s }
    END { if (bad) exit 1; printf "batch %d: %d step losses of 2 ranks within %.1e relative of one process\n", b, NR, worst }'
  test "$(grep -c '"event":"summary"' "$out/two$batch/metrics.jsonl")" -eq 1 || fail "batch $batch: not one summary record"
  test "$(grep -c '"event":"epoch"' "$out/two$batch/metrics.jsonl")" -eq 1 || fail "batch $batch: not one epoch record"
  test "$(grep -c '^kiln train: model' "$out/two$batch.err")" -eq 1 || fail "batch $batch: the start line is not printed once"
  test "$(grep -c '^epoch 1/1:' "$out/two$batch.err")" -eq 1 || fail "batch $batch: the epoch line is not printed once"
  if grep -q "rank 1" "$out/two$batch.err"; then cat "$out/two$batch.err"; fail "rank 1 printed"; fi
  test "$(grep -c '"event":"summary"' "$out/two$batch.out")" -eq 1 || fail "batch $batch: not one summary line on stdout"
done
grep -q "2 ranks (DDP over MPI): global batch 64 = 32 per rank.*effective learning rate is --lr 0.003" "$out/two64.err" ||
  { cat "$out/two64.err"; fail "the start does not state the per-rank batch and the effective learning rate"; }
grep -q "global batch 63 = 32 on rank 0, 31 on the others" "$out/two63.err" || fail "the uneven shares are not stated"

# 1b. Gradient checkpointing under DDP recomputes, the gradients are the
# same: the plain 2-rank run's losses bit for bit. bf16 autocast trains.
np2 $args --batch 64 --checkpoint 2 --out "$out/ckpt" > /dev/null 2> "$out/ckpt.err" || { cat "$out/ckpt.err"; fail "--checkpoint 2 under 2 ranks"; }
steps "$out/two64" > "$out/a"
steps "$out/ckpt" > "$out/b"
cmp -s "$out/a" "$out/b" || { diff "$out/a" "$out/b"; fail "--checkpoint 2 under 2 ranks changed the losses"; }
np2 $args --batch 64 --amp bf16 --out "$out/bf16" > /dev/null 2> "$out/bf16.err" || { cat "$out/bf16.err"; fail "--amp bf16 under 2 ranks"; }
test "$(grep -c '"event":"step"' "$out/bf16/metrics.jsonl")" -eq 4 || fail "--amp bf16 under 2 ranks: not 4 step records"
echo "--checkpoint 2: the 2-rank losses bit for bit; --amp bf16 trains"
# --accum 2 under 2 ranks (micro-batches of 16 per rank, no_sync, reduced once)
# against one process's batch of 64, within 1e-5 as above.
np2 $args --batch 64 --accum 2 --out "$out/accum" > /dev/null 2> "$out/accum.err" || { cat "$out/accum.err"; fail "--accum 2 under 2 ranks"; }
steps "$out/one64" > "$out/a"
steps "$out/accum" > "$out/b"
test "$(wc -l < "$out/b")" -eq "$(wc -l < "$out/a")" || fail "--accum 2 under 2 ranks: $(wc -l < "$out/b") step records"
paste "$out/a" "$out/b" | awk '{ d = $2 - $4; if (d < 0) d = -d
    if ($1 != $3 || d > 1e-5 * ($2 < 1 ? 1 : $2)) { print "FAILED: --accum 2, step " $1 ": " $2 " vs " $4; bad = 1 } }
  END { if (bad) exit 1; print "--accum 2 under 2 ranks: the one process'"'"'s losses within 1e-5" }'

# 3. The test accuracy is the whole test set's: kiln eval of the checkpoint.
# The test loss too, within 1e-5 relative (the sum's order differs; measured
# ~1e-7): a rank evaluating with its own BatchNorm statistics moves it.
eval_line() { "$kiln" eval --checkpoint "$1/checkpoint.safetensors" --limit 256 --threads 1 --device cpu | tail -n 1; }
same_eval() { # RUN: accuracy equal, loss within 1e-5 relative
  line=$(eval_line "$out/$1")
  run_acc=$(field summary "$out/$1/metrics.jsonl" test_acc)
  test "$run_acc" = "$(echo "$line" | sed 's/.*"test_acc":\([^,]*\),.*/\1/')" || fail "$1: test accuracy $run_acc of 2 ranks, kiln eval: $line"
  loss=$(field epoch "$out/$1/metrics.jsonl" test_loss)
  awk -v a="$loss" -v b="$(echo "$line" | sed 's/.*"test_loss":\([^,]*\),.*/\1/')" -v run="$1" 'BEGIN {
      d = a - b; if (d < 0) d = -d
      if (d > 1e-5 * b) { print "FAILED: " run ": test loss " a " of 2 ranks, kiln eval " b; exit 1 } }'
}
same_eval two64
acc=$(field summary "$out/two64/metrics.jsonl" test_acc)
cat > "$out/bn.txt" <<'SPEC'
conv 8 k3 p1 nobias
batchnorm
relu
maxpool 4
flatten
linear 10
SPEC
np2 $args --batch 64 --model "$out/bn.txt" --out "$out/bn" > /dev/null 2> "$out/bn.err" || { cat "$out/bn.err"; fail "BatchNorm model under 2 ranks"; }
same_eval bn
echo "test accuracy and loss of 2 ranks = kiln eval's: $acc (tutorial CNN), $(field summary "$out/bn/metrics.jsonl" test_acc) (BatchNorm model)"

# 4. Resume with 2 ranks: stop at step 2, resume, the uninterrupted losses bit for bit.
np2 $args --batch 64 --out "$out/part" --max-steps 2 > /dev/null 2> "$out/part.err" || { cat "$out/part.err"; fail "stopping at step 2"; }
grep -q "stopped (--max-steps) at step 2" "$out/part.err" || fail "no stop at step 2"
np2 --resume "$out/part" --out "$out/part" > /dev/null 2> "$out/resumed.err" || { cat "$out/resumed.err"; fail "resume with 2 ranks"; }
steps "$out/two64" > "$out/a"
steps "$out/part" > "$out/b"
cmp -s "$out/a" "$out/b" || { diff "$out/a" "$out/b"; fail "the resumed 2-rank losses differ from the uninterrupted 2-rank run"; }
rc=0
"$kiln" train --resume "$out/part" --out "$out/other" > /dev/null 2> "$out/other.err" || rc=$?
test $rc -eq 2 || fail "resuming a 2-rank checkpoint in one process exited $rc, not 2"
grep -q "written by a run of 2 processes, this run has 1.*mpirun -np 2" "$out/other.err" || { cat "$out/other.err"; fail "the refusal does not name both counts"; }
echo "resume with 2 ranks: $(wc -l < "$out/a") losses bit-identical; one process refused"

# 5. --world 2 without mpirun, or under another count.
rc=0
"$kiln" train --world 2 --limit 256 --out "$out/w" > /dev/null 2> "$out/w.err" || rc=$?
test $rc -eq 2 || fail "--world 2 without mpirun exited $rc, not 2"
grep -q "start it as: mpirun -np 2 .*kiln train --world 2 --limit 256" "$out/w.err" || { cat "$out/w.err"; fail "--world 2 does not say how to launch"; }
test ! -e "$out/w" || fail "--world 2 without mpirun created its output directory"
rc=0
timeout -k 5 120 $mpirun -np 2 "$kiln" train --world 3 --limit 256 --out "$out/w3" > /dev/null 2> "$out/w3.err" || rc=$?
test $rc -ne 0 || fail "--world 3 under mpirun -np 2 succeeded"
grep -q "the launcher started 2; start it as: mpirun -np 3" "$out/w3.err" || { cat "$out/w3.err"; fail "--world 3 under 2 ranks does not say how to launch"; }
echo "--world: says how to launch"


# 6. Rank 1 alone runs out of memory (an allocator limit only it has).
start=$(date +%s)
rc=0
timeout -k 5 90 $mpirun -np 1 "$kiln" train $args --batch 64 --out "$out/oom" : \
  -np 1 env KILN_ALLOC_CONF=limit_mb:10 "$kiln" train $args --batch 64 --out "$out/oom" > /dev/null 2> "$out/oom.err" || rc=$?
took=$(( $(date +%s) - start ))
test $rc -ne 0 || fail "rank 1 out of memory: the job exited 0"
test $rc -ne 124 && test $rc -ne 137 || { cat "$out/oom.err"; fail "rank 1 out of memory: the job hung until timeout"; }
test $took -le 60 || fail "rank 1 out of memory: the job took $took s"
grep -q "rank 1 of 2 failed" "$out/oom.err" && grep -q "rank 1: kiln train: training: cpu out of memory" "$out/oom.err" ||
  { cat "$out/oom.err"; fail "rank 1's out-of-memory error is not printed naming the rank"; }
grep -q "out-of-memory recovery is off with 2 ranks" "$out/oom.err" || fail "the recovery being off is not said"
echo "rank 1 out of memory: the job ended with status $rc in $took s, naming rank 1"

# 7. SIGINT to rank 1 alone (kill -INT its pid): the stop is all-reduced after
# each step, so both ranks stop at one step, rank 0 writes the checkpoint
# there and says so, and the job exits 130.
timeout -k 5 120 $mpirun -np 2 "$kiln" train $args --limit 2048 --batch 16 --out "$out/int" > /dev/null 2> "$out/int.err" &
job=$!
n=0
while [ "$n" -lt 3 ]; do
  kill -0 $job 2> /dev/null || { cat "$out/int.err"; fail "the run to interrupt ended before 3 steps"; }
  n=$(grep -c '"event":"step"' "$out/int/metrics.jsonl" 2> /dev/null || true)
  n=${n:-0}
  sleep 0.1
done
rank1=
for d in /proc/[0-9]*; do
  tr '\0' ' ' < "$d/cmdline" 2> /dev/null | grep -q "train .*--out $out/int" || continue
  tr '\0' '\n' < "$d/environ" 2> /dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1' && rank1=${d#/proc/}
done
test -n "$rank1" || fail "rank 1's process not found"
kill -INT "$rank1"
rc=0
wait $job || rc=$?
test $rc -eq 130 || { cat "$out/int.err"; fail "SIGINT to rank 1: the job exited $rc, not 130"; }
at=$(sed -n 's/^kiln train: interrupted at step \([0-9]*\); checkpoint.*/\1/p' "$out/int.err")
test -n "$at" || { cat "$out/int.err"; fail "rank 0 does not say it was interrupted"; }
test "$(field checkpoint "$out/int/metrics.jsonl" step)" = "$at" || fail "the checkpoint is not at step $at"
test "$(grep -c '"event":"step"' "$out/int/metrics.jsonl")" -eq "$at" || fail "step records past the interrupt at $at"
echo "SIGINT to rank 1: both ranks stopped at step $at, checkpoint written, exit 130"
echo PASS

#!/bin/sh
# Crash safety, proven by killing the writer: kiln train runs short epochs
# (each ends with a checkpoint write) while KILN_CHECKPOINT_PAUSE_MS makes
# every write pause after the header, after the data's fsync and after the
# rename; it gets SIGKILL at ROUNDS random moments. After every kill:
#   - checkpoint.safetensors is a whole checkpoint: kiln eval loads it;
#   - kiln train --resume continues from it (the next round kills that run);
# and at the end a resumed run finishes with exit 0.
# usage: checkpoint_kill.sh KILN_BINARY ROUNDS [SEED]
set -eu
kiln=$1
rounds=$2
seed=${3:-1}
data=/usr/share/datasets/fashion-mnist
if [ ! -e "$data/train-images-idx3-ubyte.gz" ] && [ ! -e "$data/train-images-idx3-ubyte" ]; then
  echo "FAILED: Fashion-MNIST not installed (Debian package dataset-fashion-mnist; scripts/setup.sh installs it)"
  exit 1
fi
out=$(mktemp -d "${TMPDIR:-/tmp}/kiln_ckpt_kill.XXXXXX")
pid=""
cleanup() { [ -z "$pid" ] || kill -9 "$pid" 2> /dev/null || true; rm -rf "$out"; }
trap cleanup EXIT
run="$out/run"
args="--limit 320 --batch 64 --epochs 10000 --log-every 1000 --workers 0 --threads 1 --seed 5 --out $run"
export KILN_CHECKPOINT_PAUSE_MS=150

# The i-th random delay in [0, 0.45) s, reproducible from the seed.
delay() { awk -v s="$seed" -v i="$1" 'BEGIN { srand(s * 1000 + i); printf "%.3f", rand() * 0.45 }'; }

# Wait (at most 60 s) for the run to have written a checkpoint after `since`.
checkpoints() { c=$(grep -c '"event":"checkpoint"' "$run/metrics.jsonl" 2> /dev/null || true); echo "${c:-0}"; }
wait_checkpoint() {
  n=0
  while [ "$(checkpoints)" -le "$1" ]; do
    n=$((n + 1))
    if [ "$n" -gt 600 ] || ! kill -0 "$pid" 2> /dev/null; then
      echo "FAILED: no checkpoint written within 60 s (round $2):"; tail -n 5 "$out/train.err"; exit 1
    fi
    sleep 0.1
  done
}

# What identifies the checkpoint on disk now (inode, size, change time).
signature() { stat -c '%i %s %Z' "$run/checkpoint.safetensors" 2> /dev/null || echo none; }
# Wait (at most 60 s) until a checkpoint write has begun: a temporary file
# beside it, or the file itself changed since `was`.
wait_write() {
  n=0
  while :; do
    for f in "$run"/checkpoint.safetensors.tmp.*; do [ -e "$f" ] && return 0; done
    [ "$(signature)" = "$1" ] || return 0
    n=$((n + 1))
    if [ "$n" -gt 6000 ] || ! kill -0 "$pid" 2> /dev/null; then
      echo "FAILED: no checkpoint write began within 60 s (round $2):"; tail -n 5 "$out/train.err"; exit 1
    fi
    sleep 0.01
  done
}

"$kiln" train $args > "$out/train.out" 2> "$out/train.err" &
pid=$!
wait_checkpoint 0 0
i=1
while [ "$i" -le "$rounds" ]; do
  # Inside a write: it pauses 3 x KILN_CHECKPOINT_PAUSE_MS, so a delay in
  # [0, 0.45) s lands before, between or after its steps.
  wait_write "$(signature)" "$i"
  sleep "$(delay "$i")"
  kill -9 "$pid" 2> /dev/null || { echo "FAILED: round $i: the run had already exited:"; tail -n 5 "$out/train.err"; exit 1; }
  wait "$pid" 2> /dev/null || true
  pid=""
  # The checkpoint on disk is whole: it loads and evaluates.
  if ! "$kiln" eval --checkpoint "$run/checkpoint.safetensors" --data "$data" --limit 64 --threads 1 \
      > "$out/eval.out" 2> "$out/eval.err"; then
    echo "FAILED: round $i: the checkpoint left by SIGKILL does not load:"; cat "$out/eval.err"; exit 1
  fi
  # And training resumes from it.
  before=$(checkpoints)
  "$kiln" train $args --resume "$run" > "$out/train.out" 2> "$out/train.err" &
  pid=$!
  # It says where it resumes once the checkpoint and the dataset are read
  # (seconds under load): wait for that, or for it to fail.
  n=0
  until grep -q "resuming from" "$out/train.err"; do
    if ! kill -0 "$pid" 2> /dev/null; then
      wait "$pid" || true
      echo "FAILED: round $i: --resume after SIGKILL failed:"; tail -n 5 "$out/train.err"; exit 1
    fi
    n=$((n + 1))
    [ "$n" -le 600 ] || { echo "FAILED: round $i: the resumed run did not say where it resumed within 60 s:"; tail -n 5 "$out/train.err"; exit 1; }
    sleep 0.1
  done
  # Let it write at least once more before the next kill (not in every
  # round: some kills should land before its first write).
  [ $((i % 2)) -eq 0 ] || wait_checkpoint "$before" "$i"
  i=$((i + 1))
done
kill -9 "$pid" 2> /dev/null || true
wait "$pid" 2> /dev/null || true
pid=""
# The last run resumes and stops cleanly.
step=$(grep '"event":"checkpoint"' "$run/metrics.jsonl" | tail -n 1 | sed 's/.*"step":\([0-9]*\).*/\1/')
"$kiln" train $args --resume "$run" --max-steps $((step + 7)) > "$out/final.out" 2> "$out/final.err" ||
  { echo "FAILED: the final resume did not finish:"; tail -n 5 "$out/final.err"; exit 1; }
echo "checkpoint kill: $rounds SIGKILLs during checkpoint writes, each left a checkpoint that loads and resumes"

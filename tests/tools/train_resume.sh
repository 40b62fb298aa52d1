#!/bin/sh
# kiln train's checkpoints end to end on a slice of Fashion-MNIST:
#  1. resume: N steps uninterrupted vs k steps, stop (--max-steps), resume,
#     N-k steps: every step's loss and the test accuracy bit-identical
#     (--deterministic, same device);
#     the progress text after a resume counts only the resumed run's work;
#  2. Ctrl-C: SIGINT finishes the step, writes a checkpoint, exits 130, and
#     the run resumes from it to the end;
#  3. kiln eval / kiln export on the checkpoint; a checkpoint whose stored
#     spec asks for more parameters than the file can hold is refused;
#  4. a missing dataset names the Debian package and the path.
# usage: train_resume.sh KILN_BINARY LIMIT. Exit 77 (skipped) without the dataset.
set -eu
kiln=$1
limit=$2
data=/usr/share/datasets/fashion-mnist
if [ ! -e "$data/train-images-idx3-ubyte.gz" ] && [ ! -e "$data/train-images-idx3-ubyte" ]; then
  echo "FAILED: Fashion-MNIST not installed (Debian package dataset-fashion-mnist; scripts/setup.sh installs it)"
  exit 1
fi
out=$(mktemp -d "${TMPDIR:-/tmp}/kiln_train_resume.XXXXXX")
trap 'rm -rf "$out"' EXIT
steps() { grep '"event":"step"' "$1/metrics.jsonl" | sed 's/.*"step":\([0-9]*\),"epoch":[0-9]*,"loss":\([^,]*\),.*/\1 \2/'; }
accs() { grep '"event":"epoch"' "$1/metrics.jsonl" | sed 's/.*"test_acc":\([^,]*\),.*/\1/'; }

# 1. Two epochs of limit/64 steps each; stop mid-epoch 1 at step 3.
args="--limit $limit --batch 64 --log-every 1 --epochs 2 --deterministic --workers 1"
"$kiln" train $args --out "$out/full" > "$out/full.out" 2> "$out/full.err"
"$kiln" train $args --out "$out/part" --max-steps 3 > /dev/null 2> "$out/part.err"
grep -q "stopped (--max-steps) at step 3" "$out/part.err"
test -s "$out/part/checkpoint.safetensors"
"$kiln" train $args --resume "$out/part" --out "$out/part" > "$out/resumed.out" 2> "$out/resumed.err"
grep -q "resuming from .*step 3, 3 batches into the epoch" "$out/resumed.err"
steps "$out/full" > "$out/a"
steps "$out/part" > "$out/b"
test "$(wc -l < "$out/a")" -ge 6
if ! cmp -s "$out/a" "$out/b"; then
  echo "resumed losses differ from the uninterrupted run:"; diff "$out/a" "$out/b"; exit 1
fi
test "$(accs "$out/full")" = "$(accs "$out/part")"
tail -n 1 "$out/resumed.out" | grep -q '^{"event":"summary","test_acc":'
echo "resume: $(wc -l < "$out/a") step losses and the test accuracy bit-identical"

# 1b. After a resume the progress text counts this run's work only: the
# first window's img/s is its record's (not raised by the images trained
# before the stop) and its ETA is that pace times the batches left (not
# lowered by the batches skipped). 8 batches; stop after 2; the resumed
# run's first window is batch 3 alone, so its ETA is 5 window times.
args="--limit 256 --batch 32 --log-every 1 --epochs 1 --workers 0"
"$kiln" train $args --out "$out/pace" --max-steps 2 > /dev/null 2> "$out/pace0.err"
"$kiln" train $args --resume "$out/pace" --out "$out/pace" > /dev/null 2> "$out/pace.err"
shown=$(sed -n 's|^epoch 1/1 step 3/8 loss [0-9.]* \([0-9]*\) img/s .*|\1|p' "$out/pace.err")
rec=$(grep '"event":"step","step":3,' "$out/pace/metrics.jsonl")
field() { echo "$rec" | sed "s/.*\"$1\":\([^,}]*\).*/\1/"; }
test -n "$shown" || { echo "no progress line for step 3/8:"; cat "$out/pace.err"; exit 1; }
echo "$shown $(field img_s) $(field window_s) $(field eta_s)" | awk '
  { d = $1 - $2; if (d < 0) d = -d; if (d > 1) { print "resumed img/s " $1 " but the window ran at " $2; bad = 1 }
    e = $4 - 5 * $3; if (e < 0) e = -e; if (e > 0.002 + 0.001 * $4) { print "resumed eta_s " $4 ", expected 5 x " $3; bad = 1 } }
  END { exit bad }' || { cat "$out/pace.err"; exit 1; }
echo "resume: img/s and ETA count this run's batches"
# A checkpoint record edited to a huge image count (past int64) is refused
# with the file, line and field named, before anything trains.
"$kiln" train $args --out "$out/huge" --max-steps 2 > /dev/null 2>&1
n=$(grep -n '"event":"checkpoint"' "$out/huge/metrics.jsonl" | tail -n 1 | cut -d: -f1)
sed -i "${n}s/\"epoch_images\":[0-9]*/\"epoch_images\":99999999999999999999999/" "$out/huge/metrics.jsonl"
if "$kiln" train $args --resume "$out/huge" --out "$out/huge" > /dev/null 2> "$out/huge.err"; then
  echo "a huge epoch_images was accepted"; exit 1
fi
grep -q "cannot resume: $out/huge/metrics.jsonl:$n: checkpoint record's epoch_images is 1e+23, outside 0..256" "$out/huge.err" ||
  { cat "$out/huge.err"; exit 1; }

# 2. Ctrl-C: wait for the first step record, interrupt, expect 130 and a checkpoint.
"$kiln" train --limit 2048 --batch 32 --log-every 1 --workers 1 --out "$out/int" > /dev/null 2> "$out/int.err" &
pid=$!
i=0
until grep -q '"event":"step"' "$out/int/metrics.jsonl" 2> /dev/null; do
  i=$((i + 1)); [ $i -lt 600 ] || { echo "no step record after 60 s"; kill "$pid"; exit 1; }
  sleep 0.1
done
kill -INT "$pid"
set +e
wait "$pid"
rc=$?
set -e
if [ "$rc" -ne 130 ]; then echo "SIGINT: exit code $rc, expected 130"; cat "$out/int.err"; exit 1; fi
grep -q "interrupted at step" "$out/int.err"
grep -q '"event":"checkpoint"' "$out/int/metrics.jsonl"
test -s "$out/int/checkpoint.safetensors"
ls "$out/int" | grep -q tmp && { echo "a temporary checkpoint was left behind"; exit 1; }
echo "Ctrl-C: exit 130 with a checkpoint"

# 3. eval and export on the finished run's checkpoint.
"$kiln" eval --checkpoint "$out/full/checkpoint.safetensors" --limit "$limit" --batch 64 > "$out/eval.out"
cat "$out/eval.out"
acc=$(sed -n 's/.*"test_acc":\([^,]*\),.*/\1/p' "$out/eval.out")
test "$acc" = "$(accs "$out/full" | tail -n 1)"
"$kiln" export --checkpoint "$out/full/checkpoint.safetensors" --out "$out/exp" > /dev/null
test -s "$out/exp/model.safetensors"
test -s "$out/exp/model.txt"
# The export is weights only: smaller than the checkpoint, and it evaluates the same.
test "$(wc -c < "$out/exp/model.safetensors")" -lt "$(wc -c < "$out/full/checkpoint.safetensors")"
"$kiln" eval --checkpoint "$out/exp/model.safetensors" --model "$out/exp/model.txt" --limit "$limit" --batch 64 > "$out/eval2.out"
test "$(sed -n 's/.*"test_acc":\([^,]*\),.*/\1/p' "$out/eval2.out")" = "$acc"
# A checkpoint of another model lists the mismatched names.
printf 'conv 8 k3 p1\nrelu\nflatten\nlinear 10\n' > "$out/other.txt"
if "$kiln" eval --checkpoint "$out/full/checkpoint.safetensors" --model "$out/other.txt" --limit 64 2> "$out/mis.err"; then
  echo "another model's checkpoint was accepted"; exit 1
fi
grep -q "missing" "$out/mis.err"
grep -q "unexpected" "$out/mis.err"
# A checkpoint whose stored spec was edited to a model it cannot hold (fc1
# 512 -> 51200 outputs: 59M parameters in an 8 MB file) is refused before
# the model is allocated, naming the line and the file.
python3 - "$out/full/checkpoint.safetensors" "$out/edited.safetensors" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
spec = head["__metadata__"]["kiln.model_spec"]
assert "linear 512" in spec, spec
head["__metadata__"]["kiln.model_spec"] = spec.replace("linear 512", "linear 51200", 1)
text = json.dumps(head, separators=(",", ":")).encode()
text += b" " * (-len(text) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + raw[8 + n:])
PY
if "$kiln" eval --checkpoint "$out/edited.safetensors" --limit 64 2> "$out/edit.err"; then
  echo "an edited checkpoint spec was accepted"; exit 1
fi
cat "$out/edit.err"
grep -q "edited.safetensors:[0-9]*: 'linear 51200' adds 59033600 parameters" "$out/edit.err"
grep -q "room for at most [0-9]* parameters: the model spec stored in it was edited" "$out/edit.err"
echo "eval/export: ok"

# 3b. Weights that are not finite: eval refuses them, and training from
# them stops at its first window naming the step and --detect-anomaly.
"$kiln" train $args --out "$out/nanbase" --max-steps 3 > /dev/null 2>&1
mkdir -p "$out/nan"
cp "$out/nanbase/metrics.jsonl" "$out/nan/"
python3 - "$out/nanbase/checkpoint.safetensors" "$out/nan/checkpoint.safetensors" <<'PY'
import json, struct, sys
raw = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
name = next(k for k, v in head.items() if k != "__metadata__" and v["dtype"] == "F32" and k.endswith("weight"))
begin, end = head[name]["data_offsets"]
raw[8 + n + begin:8 + n + end] = struct.pack("<f", float("nan")) * ((end - begin) // 4)
open(sys.argv[2], "wb").write(raw)
PY
if "$kiln" eval --checkpoint "$out/nan/checkpoint.safetensors" --limit 64 > /dev/null 2> "$out/nan.err"; then
  echo "eval of a checkpoint with NaN weights exited 0"; exit 1
fi
grep -q "the checkpoint's weights are not finite" "$out/nan.err" || { cat "$out/nan.err"; exit 1; }
if "$kiln" train $args --resume "$out/nan" --out "$out/nan" > /dev/null 2> "$out/nan_train.err"; then
  echo "training from NaN weights exited 0"; exit 1
fi
grep -q "the training loss became nan in the window ending at step [0-9]" "$out/nan_train.err" ||
  { cat "$out/nan_train.err"; exit 1; }
grep -q "detect-anomaly" "$out/nan_train.err"
# Absurd hyper-parameters are refused before anything runs.
for lr in inf 1e308 nan 0 11; do
  if "$kiln" train --lr "$lr" --limit 64 --out "$out/lr" 2> "$out/lr.err"; then echo "--lr $lr was accepted"; exit 1; fi
  grep -q -- "--lr $lr: give a finite learning rate in (0, 10]" "$out/lr.err" || { cat "$out/lr.err"; exit 1; }
done
echo "non-finite weights and hyper-parameters: refused"

# 4. A missing dataset names the package and the path.
if "$kiln" train --data "$out/no_such_dir" --out "$out/nodata" 2> "$out/nodata.err"; then
  echo "a missing dataset was accepted"; exit 1
fi
grep -q "dataset-fashion-mnist" "$out/nodata.err"
grep -q "$out/no_such_dir" "$out/nodata.err"
echo "train resume: ok"

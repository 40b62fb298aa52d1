#!/bin/sh
# kiln train's checkpoints end to end on a slice of Fashion-MNIST:
#  1. resume: N steps uninterrupted vs k steps, stop (--max-steps), resume,
#     N-k steps: every step's loss and the test accuracy bit-identical
#     (--deterministic, same device);
#     the progress text after a resume counts only the resumed run's work;
#  1c. the run configuration and the running sums are in the checkpoint:
#     `--resume DIR --out NEW` alone, with the stopped run's metrics.jsonl
#     deleted, gives the uninterrupted run's step, window (the ones that
#     straddle the stops included) and epoch records; a flag that
#     contradicts the checkpoint is refused naming both values; more
#     --epochs is said; edited metadata is refused naming the field; a
#     FIFO as metrics.jsonl is refused at once;
#  2. Ctrl-C: SIGINT finishes the step, writes a checkpoint, exits 130, and
#     the run resumes from it to the end;
#  3. kiln eval / kiln export on the checkpoint; a checkpoint whose stored
#     spec asks for more parameters than the file can hold is refused;
#  4. a missing dataset names the Debian package and the path;
#  5. careless input on a 16-image dataset: --batch past the dataset is
#     clamped with a message, train and test images of different sizes are
#     refused naming both files, the one-cycle schedule too short for its
#     warm-up suggests --schedule constant, a model whose output is not one
#     score per class is refused naming its spec, and a failed run leaves no
#     output directory (and an earlier metrics.jsonl as it was).
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

# 1c. The issue's run (--limit --epochs 2 --batch 96 --lr 2e-3 --seed 11),
# 4 batches per epoch, windows of 3 steps: stopped at step 2 (inside the
# window 1-3), resumed with --resume and --out alone into a new directory
# after the stopped run's metrics.jsonl was deleted, stopped again at step
# 6 (inside the window 5-7), resumed the same way: the records of the three
# pieces are the uninterrupted run's. (Each process plans its first step
# and holds its first two steps against the plan: the plan and plan_check
# records describe the process, not the run's math, and are left out.)
cfg="--limit 384 --epochs 2 --batch 96 --lr 2e-3 --seed 11 --log-every 3 --deterministic"
records() { grep -h -v '"event":"checkpoint"\|"event":"summary"\|"event":"plan' "$@" | sed 's/,"img_s".*//; s/,"train_s".*//'; }
"$kiln" train $cfg --workers 1 --out "$out/cfull" > /dev/null 2> "$out/cfull.err"
"$kiln" train $cfg --workers 1 --out "$out/c1" --max-steps 2 > /dev/null 2> "$out/c1.err"
mv "$out/c1/metrics.jsonl" "$out/c1.jsonl"
"$kiln" train --resume "$out/c1" --out "$out/c2" --max-steps 6 > /dev/null 2> "$out/c2.err" ||
  { cat "$out/c2.err"; exit 1; }
grep -q "resuming from .*step 2, 2 batches into the epoch" "$out/c2.err"
mv "$out/c2/metrics.jsonl" "$out/c2.jsonl"
"$kiln" train --resume "$out/c2" --out "$out/c3" > /dev/null 2> "$out/c3.err" || { cat "$out/c3.err"; exit 1; }
records "$out/cfull/metrics.jsonl" > "$out/a"
records "$out/c1.jsonl" "$out/c2.jsonl" "$out/c3/metrics.jsonl" > "$out/b"
grep -q '"event":"step","step":3,' "$out/a"
grep -q '"event":"step","step":7,' "$out/a"
test "$(grep -c '"event":"epoch"' "$out/a")" -eq 2
if ! cmp -s "$out/a" "$out/b"; then
  echo "records after two resumes differ from the uninterrupted run's:"; diff "$out/a" "$out/b"; exit 1
fi
echo "resume: --resume DIR alone into a new --out: $(wc -l < "$out/a") step and epoch records identical"
# A flag that contradicts the checkpoint is refused, naming both values,
# before any output directory is made.
if "$kiln" train --resume "$out/c1" --out "$out/cx" --batch 64 --lr 1e-3 > /dev/null 2> "$out/cx.err"; then
  echo "a contradicting --batch was accepted"; exit 1
fi
grep -q -- "--resume $out/c1: --batch 64 contradicts the checkpoint's --batch 96; drop the flag" "$out/cx.err" ||
  { cat "$out/cx.err"; exit 1; }
grep -q -- "--lr 0.001 contradicts the checkpoint's --lr 0.002" "$out/cx.err" || { cat "$out/cx.err"; exit 1; }
test ! -e "$out/cx"
# The same values, and the flags that may change, are taken; more epochs is said.
"$kiln" train --resume "$out/c1" --out "$out/cm" --batch 96 --epochs 3 --max-steps 3 --workers 0 > /dev/null 2> "$out/cm.err" ||
  { cat "$out/cm.err"; exit 1; }
grep -q "continuing for 3 epochs instead of 2" "$out/cm.err"
# Edited metadata is refused naming the file and the field.
python3 - "$out/c1/checkpoint.safetensors" "$out/ce/checkpoint.safetensors" "$out/cc/checkpoint.safetensors" <<'PY'
import json, os, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
def write(path, edit):
    head = json.loads(raw[8:8 + n])
    edit(head["__metadata__"])
    text = json.dumps(head, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    os.makedirs(os.path.dirname(path))
    open(path, "wb").write(struct.pack("<Q", len(text)) + text + raw[8 + n:])
write(sys.argv[2], lambda m: m.update({"kiln.epoch": "-4"}))
def bad_batch(m):
    config = json.loads(m["kiln.run_config"])
    config["batch"] = -3
    m["kiln.run_config"] = json.dumps(config)
write(sys.argv[3], bad_batch)
PY
if "$kiln" train --resume "$out/cc" --out "$out/cc" > /dev/null 2> "$out/cc.err"; then
  echo "a run configuration with --batch -3 was accepted"; exit 1
fi
grep -q -- "--resume $out/cc/checkpoint.safetensors: the checkpoint's run configuration (metadata kiln.run_config) has batch -3, outside 1" "$out/cc.err" ||
  { cat "$out/cc.err"; exit 1; }
if "$kiln" train --resume "$out/ce" --out "$out/ce" > /dev/null 2> "$out/ce.err"; then
  echo "a negative epoch was accepted"; exit 1
fi
grep -q "$out/ce/checkpoint.safetensors: metadata 'kiln.epoch' is -4, outside 0..1000000" "$out/ce.err" ||
  { cat "$out/ce.err"; exit 1; }
# A FIFO where metrics.jsonl goes is refused at once, not waited on.
mkdir "$out/fifo"
mkfifo "$out/fifo/metrics.jsonl"
if timeout 60 "$kiln" train --resume "$out/c1" --out "$out/fifo" > /dev/null 2> "$out/fifo.err"; then
  echo "a FIFO as metrics.jsonl was accepted"; exit 1
fi
grep -q "fifo/metrics.jsonl is not a regular file" "$out/fifo.err" || { cat "$out/fifo.err"; exit 1; }
echo "resume: contradictions, edited metadata and a FIFO refused"

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

# 5. Careless input on a 16-image dataset (and a test split of 14x14 images).
python3 - "$out/tiny" "$out/mixed" <<'PY'
import os, struct, sys
def images(path, n, h, w):
    with open(path, "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, h, w) + bytes((i * 7) % 256 for i in range(n * h * w)))
def labels(path, n):
    with open(path, "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + bytes(i % 10 for i in range(n)))
for d, side in ((sys.argv[1], 28), (sys.argv[2], 14)):
    os.makedirs(d)
    images(d + "/train-images-idx3-ubyte", 16, 28, 28)
    labels(d + "/train-labels-idx1-ubyte", 16)
    images(d + "/t10k-images-idx3-ubyte", 8, side, side)
    labels(d + "/t10k-labels-idx1-ubyte", 8)
PY
tiny="--data $out/tiny --workers 0 --epochs 1"
# A batch past the dataset is clamped before any pinned memory is asked for.
"$kiln" train $tiny --schedule constant --batch 1000000000 --out "$out/t1" > /dev/null 2> "$out/t1.err" ||
  { cat "$out/t1.err"; exit 1; }
grep -q -- "--batch 1000000000 is more than the 16 training images: one batch of 16 per epoch" "$out/t1.err"
# The one-cycle schedule needs 4 steps; a shorter run is told what to pass.
fails() { # expected-text out-dir args...: exits non-zero, says the text, leaves no out-dir
  want=$1; dir=$2; shift 2
  if "$kiln" train "$@" --out "$dir" > /dev/null 2> "$out/fails.err"; then echo "accepted: $*"; exit 1; fi
  grep -q -- "$want" "$out/fails.err" || { echo "expected '$want':"; cat "$out/fails.err"; exit 1; }
  if [ -e "$dir" ]; then echo "a failed run left $dir:"; ls -la "$dir"; exit 1; fi
}
fails "needs at least 4 optimizer steps .* this run has 3 (1 batch of 16 per epoch x 3 epochs); pass --schedule constant" \
  "$out/t2/new/dirs" $tiny --epochs 3
# Train and test images of different sizes: refused when the dataset is opened.
fails "the training images ($out/mixed/train-images-idx3-ubyte) are 1x28x28 but the test images ($out/mixed/t10k-images-idx3-ubyte) are 1x14x14" \
  "$out/t3" --data "$out/mixed" --workers 0 --schedule constant
# A model whose output is not one score per class: refused naming the spec.
printf 'conv 4 k3 p1\nrelu\nflatten\nlinear 7\n' > "$out/seven.txt"
fails "the model ($out/seven.txt) gives (1, 7) for one 1x28x28 image, but the data has 10 classes" \
  "$out/t5" $tiny --schedule constant --model "$out/seven.txt"
# A failed run into an existing directory leaves its files as they were.
mkdir "$out/t4"
echo '{"event":"step","step":1}' > "$out/t4/metrics.jsonl"
if "$kiln" train --data "$out/mixed" --workers 0 --out "$out/t4" > /dev/null 2>&1; then echo "mixed sizes accepted"; exit 1; fi
test "$(cat "$out/t4/metrics.jsonl")" = '{"event":"step","step":1}'
echo "careless input: clamped batch, mixed image sizes, a short one-cycle schedule; no empty output left"
echo "train resume: ok"

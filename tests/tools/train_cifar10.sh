#!/bin/sh
# kiln train --dataset cifar10 on a synthetic CIFAR-10 directory written
# here (the standard binary layout: data_batch_1..5.bin of 60 records and
# test_batch.bin of 100, each record 1 label byte + 3072 image bytes):
#  1. a missing dataset says where CIFAR-10 comes from and the layout;
#  2. one short epoch trains (models/tutorial_cnn_32x32x3.txt, crop-flip
#     augmentation by default), the dataset and augmentation are in the
#     run configuration, kiln eval finds the run's dataset by itself;
#  3. augmentation under --deterministic: two runs give identical losses,
#     --augment none gives others (the augmentation really runs);
#  4. resume: --max-steps 3 then --resume gives the uninterrupted run's
#     losses bit for bit; a --dataset that contradicts the checkpoint is
#     refused naming both;
#  4b. --benchmark: the checkpoint records the cuDNN autotuner on;
#  5. the small ResNet (models/resnet_small_cifar10.txt) takes the data.
# usage: train_cifar10.sh KILN_BINARY SOURCE_DIR
set -eu
kiln=$1
src=$2
out=$(mktemp -d "${TMPDIR:-/tmp}/kiln_train_cifar10.XXXXXX")
trap 'rm -rf "$out"' EXIT
data=$out/cifar
mkdir -p "$data"
# Class c's images are a noisy colour of their own, so a few steps learn.
python3 - "$data" <<'EOF'
import os, random, sys
random.seed(7)
d = sys.argv[1]
k = 0
for name, n in [("data_batch_%d.bin" % j, 60) for j in range(1, 6)] + [("test_batch.bin", 100)]:
    with open(os.path.join(d, name), "wb") as f:
        for _ in range(n):
            label = k % 10
            rec = bytearray([label])
            for c in range(3):
                base = (label * 25 + c * 40) % 256
                rec += bytes((base + random.randrange(64)) % 256 for _ in range(1024))
            f.write(rec)
            k += 1
EOF
steps() { grep '"event":"step"' "$1/metrics.jsonl" | sed 's/.*"step":\([0-9]*\),"epoch":[0-9]*,"loss":\([^,]*\),.*/\1 \2/'; }
args="--dataset cifar10 --data $data --batch 64 --log-every 1 --deterministic --workers 1"

# 1. Missing dataset: where it comes from and what layout.
if "$kiln" train --dataset cifar10 --data "$out/none" --out "$out/x" > /dev/null 2> "$out/missing.err"; then
  echo "FAILED: a missing CIFAR-10 directory trained"; exit 1
fi
grep -q "$out/none/data_batch_1.bin: not found" "$out/missing.err"
grep -q "cifar-10-binary.tar.gz" "$out/missing.err"
grep -q "data_batch_5.bin and test_batch.bin" "$out/missing.err"
if "$kiln" train --dataset cifar10 --out "$out/x" > /dev/null 2> "$out/nodata.err"; then
  echo "FAILED: --dataset cifar10 without --data trained"; exit 1
fi
grep -q "needs --data DIR" "$out/nodata.err"
grep -q "cifar-10-binary.tar.gz" "$out/nodata.err"
test ! -e "$out/x"
"$kiln" train --dataset cifar100 > /dev/null 2> "$out/bad.err" && exit 1
grep -q "give fashion-mnist (the default) or cifar10" "$out/bad.err"
echo "missing dataset: the message names the file, the download and the layout"

# 2. One short epoch.
"$kiln" train $args --epochs 1 --out "$out/a" > "$out/a.out" 2> "$out/a.err"
grep -q "300 training and 100 test images" "$out/a.err"
grep -q "dataset cifar10, augmentation crop-flip" "$out/a.err"
test "$(steps "$out/a" | wc -l)" -eq 5
tail -n 1 "$out/a.out" | grep -q '"images":300'
"$kiln" eval --checkpoint "$out/a/checkpoint.safetensors" > "$out/eval.out" 2> "$out/eval.err"
grep -q '"images":100,"dataset":"cifar10"' "$out/eval.out"
echo "one epoch: 5 steps, kiln eval on the run's CIFAR-10 test split"

# 3. Augmentation determinism.
"$kiln" train $args --epochs 1 --out "$out/b" > /dev/null 2> /dev/null
steps "$out/a" > "$out/a.steps"
steps "$out/b" > "$out/b.steps"
cmp -s "$out/a.steps" "$out/b.steps" || { echo "FAILED: two deterministic runs differ:"; diff "$out/a.steps" "$out/b.steps"; exit 1; }
"$kiln" train $args --epochs 1 --augment none --out "$out/c" > /dev/null 2> "$out/c.err"
grep -q "augmentation none" "$out/c.err"
steps "$out/c" > "$out/c.steps"
# The first step's loss may agree (the initial weights are the same); the rest may not.
if cmp -s "$out/a.steps" "$out/c.steps"; then
  echo "FAILED: --augment none gave the crop-flip run's losses"; exit 1
fi
echo "augmentation: identical losses twice under --deterministic, others with --augment none"

# 4. Resume.
"$kiln" train $args --epochs 2 --out "$out/full" > /dev/null 2> /dev/null
"$kiln" train $args --epochs 2 --out "$out/part" --max-steps 3 > /dev/null 2> /dev/null
"$kiln" train --resume "$out/part" --out "$out/part" > /dev/null 2> "$out/resumed.err"
grep -q "resuming from .*step 3" "$out/resumed.err"
grep -q "dataset cifar10, augmentation crop-flip" "$out/resumed.err"
steps "$out/full" > "$out/full.steps"
steps "$out/part" > "$out/part.steps"
test "$(wc -l < "$out/full.steps")" -eq 10
cmp -s "$out/full.steps" "$out/part.steps" || { echo "FAILED: resumed losses differ:"; diff "$out/full.steps" "$out/part.steps"; exit 1; }
if "$kiln" train --resume "$out/part" --dataset fashion-mnist --out "$out/y" > /dev/null 2> "$out/contra.err"; then
  echo "FAILED: --dataset fashion-mnist resumed a CIFAR-10 checkpoint"; exit 1
fi
grep -q -- "--dataset fashion-mnist contradicts the checkpoint's --dataset cifar10" "$out/contra.err"
if "$kiln" train --resume "$out/part" --augment flip --out "$out/y" > /dev/null 2> "$out/contra2.err"; then
  echo "FAILED: --augment flip resumed a crop-flip checkpoint"; exit 1
fi
grep -q -- "--augment flip contradicts the checkpoint's --augment crop-flip" "$out/contra2.err"
echo "resume: 10 step losses bit-identical; a contradicting --dataset or --augment is refused"

# 4b. --benchmark turns the cuDNN autotuner on (kiln_set_cudnn_benchmark), as the
# checkpoint's metadata records; without it the run's is off.
meta() {
  python3 -c 'import json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]
print(json.loads(f.read(n))["__metadata__"][sys.argv[2]])' "$1" "$2"
}
"$kiln" train $args --epochs 1 --max-steps 1 --benchmark --out "$out/bm" > /dev/null 2> /dev/null
test "$(meta "$out/bm/checkpoint.safetensors" kiln.cudnn_benchmark)" = true
test "$(meta "$out/part/checkpoint.safetensors" kiln.cudnn_benchmark)" = false
echo "--benchmark: kiln.cudnn_benchmark true in the checkpoint (false without)"

# 5. The small ResNet.
"$kiln" train $args --epochs 1 --max-steps 1 --model "$src/models/resnet_small_cifar10.txt" --out "$out/r" \
  > /dev/null 2> "$out/r.err"
test "$(steps "$out/r" | wc -l)" -eq 1
echo "resnet_small_cifar10: one step"
echo "train_cifar10: passed"

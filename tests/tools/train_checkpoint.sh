#!/bin/sh
# kiln train --checkpoint: the same losses with and without gradient
# checkpointing (a spec with BatchNorm and dropout; one with a residual
# block, whose body is split too), --checkpoint auto
# choosing from planned peaks (kiln plan; the measured step held against
# the plan), and the usage errors.
# usage: train_checkpoint.sh KILN_BINARY. Exit 77 (skipped) without the dataset.
set -eu
kiln=$1
data=/usr/share/datasets/fashion-mnist
if [ ! -e "$data/train-images-idx3-ubyte.gz" ] && [ ! -e "$data/train-images-idx3-ubyte" ]; then
  echo "FAILED: Fashion-MNIST not installed (Debian package dataset-fashion-mnist; scripts/setup.sh installs it)"
  exit 1
fi
out=$(mktemp -d "${TMPDIR:-/tmp}/kiln_train_ckpt.XXXXXX")
trap 'rm -rf "$out"' EXIT
cat > "$out/model.txt" <<'SPEC'
conv 8 k3 p1
batchnorm
relu
dropout 0.2
maxpool 2
conv 16 k3 p1
batchnorm
relu
maxpool 2
flatten
linear 10
SPEC
common="--model $out/model.txt --limit 256 --batch 64 --max-steps 3 --log-every 1 --seed 5 --workers 0"
losses() { grep '"event":"step"' "$1/metrics.jsonl" | sed 's/.*"loss":\([^,]*\),.*/\1/'; }
"$kiln" train $common --out "$out/plain" > /dev/null 2> "$out/plain.err"
"$kiln" train $common --checkpoint 3 --out "$out/ckpt" > /dev/null 2> "$out/ckpt.err"
grep -q "gradient checkpointing: 3 segments of the model's 11 layers, placed by measured memory" "$out/ckpt.err"
losses "$out/plain" > "$out/plain.loss"
losses "$out/ckpt" > "$out/ckpt.loss"
test "$(wc -l < "$out/plain.loss")" -eq 3
if ! cmp -s "$out/plain.loss" "$out/ckpt.loss"; then
  echo "losses differ with --checkpoint 3:"; paste "$out/plain.loss" "$out/ckpt.loss"; exit 1
fi
# A residual block alone in a segment has its body split as well; the
# losses stay those of the plain run.
cat > "$out/res.txt" <<'SPEC'
conv 8 k3 p1
batchnorm
relu
residual {
  conv 8 k3 p1 nobias
  batchnorm
  relu
  conv 8 k3 p1 nobias
  batchnorm
}
maxpool 2
conv 16 k3 p1
batchnorm
relu
maxpool 2
flatten
linear 10
SPEC
rescommon=$(echo "$common" | sed "s|$out/model.txt|$out/res.txt|")
"$kiln" train $rescommon --out "$out/resplain" > /dev/null 2> "$out/resplain.err"
"$kiln" train $rescommon --checkpoint 3 --out "$out/resckpt" > /dev/null 2> "$out/resckpt.err"
grep -q "starting at layers 0 (Conv2d), 3 (Residual, its body in 2 segments), 4 " "$out/resckpt.err" ||
  { echo "unexpected residual plan:"; cat "$out/resckpt.err"; exit 1; }
losses "$out/resplain" > "$out/resplain.loss"
losses "$out/resckpt" > "$out/resckpt.loss"
if ! cmp -s "$out/resplain.loss" "$out/resckpt.loss"; then
  echo "residual model: losses differ with --checkpoint 3:"; paste "$out/resplain.loss" "$out/resckpt.loss"; exit 1
fi
# auto: a generous budget needs no checkpointing; a budget between the
# measured peaks picks segments; an impossible one is an error.
"$kiln" train $common --checkpoint auto --memory-budget 1TiB --out "$out/auto1" > /dev/null 2> "$out/auto1.err"
grep -q "checkpoint auto: step peak .*none [0-9.]* MiB.*no checkpointing needed" "$out/auto1.err"
# Below the planned peak without checkpointing (the residual model at batch
# 512; measured 126 MiB reserved with nChw8c activations, 142 MiB strided):
# the fewest segments that fit, and the step measured after two steps
# within 5% of the plan.
big=$(echo "$rescommon" | sed 's/--limit 256 --batch 64/--limit 2048 --batch 512/')
"$kiln" train $big --max-steps 1 --checkpoint auto --memory-budget 1TiB --out "$out/auto0" > /dev/null 2> "$out/auto0.err"
none=$(sed -n 's/.*checkpoint auto: step peak (planned, [^)]*): none \([0-9]*\) MiB.*/\1/p' "$out/auto0.err")
test -n "$none" || { echo "no planned peak without checkpointing:"; cat "$out/auto0.err"; exit 1; }
"$kiln" train $big --checkpoint auto --memory-budget $((none - 1))MiB --out "$out/auto3" > /dev/null 2> "$out/auto3.err"
grep -q "checkpoint auto: step peak (planned, .*none $none MiB, 2 segments [0-9.]* MiB.*; budget $((none - 1)) MiB: checkpointing in the fewest" "$out/auto3.err" ||
  { echo "auto under $((none - 1))MiB:"; cat "$out/auto3.err"; exit 1; }
grep -q "plan against the first two steps: [0-9.]* MiB reserved measured (plan [+-][0-4]\.[0-9]%), [0-9.]* MiB allocated (plan [+-][0-4]\.[0-9]%)" "$out/auto3.err" ||
  { echo "the checkpointed step's plan misses the measured peaks by 5% or more:"; cat "$out/auto3.err"; exit 1; }
set +e
"$kiln" train $common --checkpoint auto --memory-budget 64KiB --out "$out/auto2" > /dev/null 2> "$out/auto2.err"
rc=$?
set -e
test "$rc" -eq 1
grep -q "no segment count keeps the step under --memory-budget" "$out/auto2.err"
# Usage errors exit 2; a segment count above the model's layers names both.
for args in "--checkpoint auto" "--memory-budget 2GiB" "--checkpoint -1" "--checkpoint x" \
            "--checkpoint auto --memory-budget 2XB" "--checkpoint auto --memory-budget 0"; do
  set +e
  "$kiln" train $common $args --out "$out/bad" > /dev/null 2> "$out/bad.err"
  rc=$?
  set -e
  if [ "$rc" -ne 2 ]; then echo "'$args' exited $rc, not 2"; cat "$out/bad.err"; exit 1; fi
done
set +e
"$kiln" train $common --checkpoint 20 --out "$out/bad" > /dev/null 2> "$out/bad.err"
rc=$?
set -e
test "$rc" -eq 1
grep -q "20 segments for a Sequential of 11 layers" "$out/bad.err"
echo "train checkpoint: ok"

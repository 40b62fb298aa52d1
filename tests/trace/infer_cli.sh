# kiln export --traced and kiln infer end to end: a short kiln train run's
# checkpoint exported as a traced program at batch 2, run on random input
# (twice: the same seed gives the same output), its output written and
# then refused as an input of the wrong shape (the guard names it), a
# weights file refused as a program, and the export's flag errors.
# Usage: infer_cli.sh KILN
set -eu
kiln=$1
data=/usr/share/datasets/fashion-mnist
if [ ! -e "$data/train-images-idx3-ubyte.gz" ] && [ ! -e "$data/train-images-idx3-ubyte" ]; then
  echo "FAILED: Fashion-MNIST not installed (Debian package dataset-fashion-mnist; scripts/setup.sh installs it)"
  exit 1
fi
out=$(mktemp -d "${TMPDIR:-/tmp}/kiln_infer_cli.XXXXXX")
trap 'rm -rf "$out"' EXIT
"$kiln" train --limit 128 --epochs 1 --batch 32 --out "$out/run" > "$out/train.log" 2>&1 || { cat "$out/train.log"; exit 1; }
ckpt=$out/run/checkpoint.safetensors
"$kiln" export --checkpoint "$ckpt" --out "$out/exp" --traced --example 2x1x28x28
test -s "$out/exp/model.kiln"
"$kiln" infer --program "$out/exp/model.kiln" --random --seed 3 --out "$out/y.safetensors" > "$out/a"
cat "$out/a"
grep -q '^row 1: argmax ' "$out/a"
grep -q '"output_shape":\[2,10\]' "$out/a"
"$kiln" infer --program "$out/exp/model.kiln" --random --seed 3 > "$out/b"
cmp "$out/a" "$out/b"
expect_fail() { # RC NEEDLE COMMAND...
  want=$1 needle=$2
  shift 2
  set +e
  "$@" > "$out/o" 2> "$out/e"
  rc=$?
  set -e
  if [ "$rc" != "$want" ] || ! grep -q -- "$needle" "$out/e"; then
    echo "FAILED: '$*' exited $rc (wanted $want) with:"; cat "$out/e"; exit 1
  fi
}
expect_fail 1 'input 0 has shape \[2, 10\], traced with \[2, 1, 28, 28\]' \
  "$kiln" infer --program "$out/exp/model.kiln" --input "$out/y.safetensors"
expect_fail 1 'not a Kiln program' "$kiln" infer --program "$ckpt" --random
expect_fail 2 'one of --input FILE or --random' "$kiln" infer --program "$out/exp/model.kiln"
expect_fail 2 '--traced and --example SHAPE go together' \
  "$kiln" export --checkpoint "$ckpt" --out "$out/x" --traced
expect_fail 2 'takes 1x28x28 images' \
  "$kiln" export --checkpoint "$ckpt" --out "$out/x" --traced --example 1x3x32x32
echo "infer_cli: ok"

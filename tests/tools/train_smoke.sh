#!/bin/sh
# kiln train end to end on a slice of Fashion-MNIST: it must exit 0 and
# leave metrics.jsonl (step, epoch and summary records), progress lines
# that show each window's own loss, and a model.safetensors.
# usage: train_smoke.sh KILN_BINARY LIMIT. Exit 77 (skipped) without the dataset.
set -eu
kiln=$1
limit=$2
data=/usr/share/datasets/fashion-mnist
if [ ! -e "$data/train-images-idx3-ubyte.gz" ] && [ ! -e "$data/train-images-idx3-ubyte" ]; then
  echo "FAILED: Fashion-MNIST not installed (Debian package dataset-fashion-mnist; scripts/setup.sh installs it)"
  exit 1
fi
out=$(mktemp -d "${TMPDIR:-/tmp}/kiln_train_smoke.XXXXXX")
trap 'rm -rf "$out"' EXIT
"$kiln" train --limit "$limit" --epochs 1 --batch 64 --log-every 2 --out "$out/run" > "$out/stdout" 2> "$out/stderr"
cat "$out/stdout"
# The progress text (stderr is not a TTY: one line per window): each line
# shows its own window's loss at that window's step, the mean loss of the
# step record with the same step, never the previous window's and never a
# placeholder 0.0000 before a loss has landed.
grep '^epoch 1/1 step ' "$out/stderr" | sed 's|^epoch 1/1 step \([0-9]*\)/[0-9]* loss \([^ ]*\) .*|\1 \2|' > "$out/shown"
grep '"event":"step"' "$out/run/metrics.jsonl" | sed 's/.*"step":\([0-9]*\),"epoch":[0-9]*,"loss":\([^,]*\),.*/\1 \2/' > "$out/logged"
test "$(wc -l < "$out/shown")" -ge 2
test "$(wc -l < "$out/shown")" -eq "$(wc -l < "$out/logged")"
if grep -q ' 0\.0000$' "$out/shown"; then echo "a progress line shows loss 0.0000:"; cat "$out/stderr"; exit 1; fi
paste -d' ' "$out/shown" "$out/logged" | awk '
  $1 != $3 { print "progress line of step " $1 " next to the record of step " $3; bad = 1 }
  { d = $2 - $4; if (d < 0) d = -d; if (d > 0.00006) { print "step " $1 ": progress loss " $2 ", record " $4; bad = 1 } }
  END { exit bad }' || { cat "$out/stderr"; exit 1; }
grep -q '"event":"step"' "$out/run/metrics.jsonl"
grep -q '"event":"epoch".*"test_acc"' "$out/run/metrics.jsonl"
grep -q '"event":"summary"' "$out/run/metrics.jsonl"
grep -q '^kiln train: test accuracy' "$out/stdout"
# The summary record is the last stdout line; step records carry the
# window's data-wait time and memory; a full checkpoint is left too.
tail -n 1 "$out/stdout" | grep -q '^{"event":"summary","test_acc":[0-9.]*,"wall_s":[0-9.]*,"train_img_s":[0-9.]*,"train_s":[0-9.]*,"images":[0-9]*,"peak_bytes":[0-9]*'
grep '"event":"step"' "$out/run/metrics.jsonl" | head -n 1 | grep -q '"data_wait_s":.*"mem_allocated":.*"mem_reserved":.*"mem_peak":'
grep -q '"event":"epoch".*"train_acc".*"test_loss"' "$out/run/metrics.jsonl"
# The bar (what a terminal gets; --progress bar forces it, so no
# pseudo-terminal is needed): "–" until the epoch's first window has landed
# (always so at batch 1 with --log-every 3), then the latest landed window's
# loss with its batch, loss X@N, X the record's.
"$kiln" train --limit 256 --batch 32 --epochs 1 --log-every 3 --progress bar --out "$out/tty" 2>&1 \
  | tr '\r' '\n' | grep '^epoch 1/1 \[' > "$out/bar"
head -n 1 "$out/bar" | grep -q ' 1/8 loss – ' || { echo "the first bar shows no dash:"; cat "$out/bar"; exit 1; }
if grep -q 'loss 0\.0000' "$out/bar"; then echo "the bar shows loss 0.0000:"; cat "$out/bar"; exit 1; fi
sed -n 's|.* loss \([0-9.]*\)@\([0-9]*\) .*|\2 \1|p' "$out/bar" | sort -u > "$out/bar_losses"
test -s "$out/bar_losses"
grep '"event":"step"' "$out/tty/metrics.jsonl" | sed 's/.*"step":\([0-9]*\),"epoch":[0-9]*,"loss":\([^,]*\),.*/\1 \2/' > "$out/tty_logged"
while read -r n shown; do
  logged=$(awk -v n="$n" '$1 == n { print $2 }' "$out/tty_logged")
  awk -v a="$shown" -v b="$logged" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(b != "" && d <= 0.00006) }' ||
    { echo "the bar shows loss $shown@$n, the record of step $n has '$logged'"; cat "$out/bar"; exit 1; }
done < "$out/bar_losses"
test -s "$out/run/checkpoint.safetensors"
test -s "$out/run/model.safetensors"
ls "$out/run" | grep -q tmp && { echo "a temporary checkpoint was left behind"; exit 1; }
# An unwritable output directory is reported before training starts.
if "$kiln" train --limit 64 --out /proc/kiln_no_such_dir 2> "$out/err"; then
  echo "an unwritable --out was accepted"; exit 1
fi
grep -q "cannot write to output directory" "$out/err"
# Usage errors exit 2.
set +e
"$kiln" train --epochs zero 2> /dev/null
rc=$?
set -e
test "$rc" -eq 2
# A --model that is not a spec file is named for what it is, before reading.
bad_model() { # PATH PHRASE
  if "$kiln" train --limit 64 --model "$1" --out "$out/bad" 2> "$out/err"; then
    echo "--model $1 was accepted"; exit 1
  fi
  grep -q -- "$2" "$out/err" || { echo "--model $1:"; cat "$out/err"; exit 1; }
}
bad_model "$out" "is a directory"
bad_model /dev/zero "not a regular file"
printf 'conv 4 k3 p1\nrelu\000linear 10\n' > "$out/nul.txt"
bad_model "$out/nul.txt" "nul.txt:2: a NUL byte at column 5"
head -c 1572864 /dev/zero | tr '\000' '#' > "$out/big.txt"
bad_model "$out/big.txt" "is 1572864 bytes, more than the 1 MiB"
echo "train smoke: ok"

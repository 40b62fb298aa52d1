#!/bin/sh
# kiln train end to end on a slice of Fashion-MNIST: it must exit 0 and
# leave metrics.jsonl (step, epoch and summary records) and a
# model.safetensors that starts with a sane header length.
# usage: train_smoke.sh KILN_BINARY LIMIT. Exit 77 (skipped) without the dataset.
set -eu
kiln=$1
limit=$2
data=/usr/share/datasets/fashion-mnist
if [ ! -e "$data/train-images-idx3-ubyte.gz" ] && [ ! -e "$data/train-images-idx3-ubyte" ]; then
  echo "SKIPPED: Fashion-MNIST not installed (Debian package dataset-fashion-mnist)"
  exit 77
fi
out=$(mktemp -d "${TMPDIR:-/tmp}/kiln_train_smoke.XXXXXX")
trap 'rm -rf "$out"' EXIT
"$kiln" train --limit "$limit" --epochs 1 --batch 64 --log-every 2 --out "$out/run" > "$out/stdout"
cat "$out/stdout"
grep -q '"event":"step"' "$out/run/metrics.jsonl"
grep -q '"event":"epoch".*"test_acc"' "$out/run/metrics.jsonl"
grep -q '"event":"summary"' "$out/run/metrics.jsonl"
grep -q '^kiln train: test accuracy' "$out/stdout"
# The summary record is the last stdout line; step records carry the
# window's data-wait time and memory; a full checkpoint is left too.
tail -n 1 "$out/stdout" | grep -q '^{"event":"summary","test_acc":[0-9.]*,"wall_s":[0-9.]*,"train_img_s":[0-9.]*,"peak_bytes":[0-9]*'
grep '"event":"step"' "$out/run/metrics.jsonl" | head -n 1 | grep -q '"data_wait_s":.*"mem_allocated":.*"mem_reserved":.*"mem_peak":'
grep -q '"event":"epoch".*"train_acc".*"test_loss"' "$out/run/metrics.jsonl"
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
echo "train smoke: ok"

#!/bin/sh
# The hostile-input suite (issue 20; docs/report.md, "Hostile input"):
# kiln train, eval, export and report on truncated, mistyped, absurd and
# mismatched files and flags. Each case must end within a timeout with exit
# 1 or 2 (or the documented 0), name the file or flag, stay under a memory
# bound and leave no sanitizer report. The cases live in hostile_cli.py.
# usage: hostile_cli.sh KILN_BINARY [CASE_SUBSTRING]
set -eu
kiln=$1
data=/usr/share/datasets/fashion-mnist
if [ ! -e "$data/train-images-idx3-ubyte.gz" ] && [ ! -e "$data/train-images-idx3-ubyte" ]; then
  echo "FAILED: Fashion-MNIST not installed (Debian package dataset-fashion-mnist; scripts/setup.sh installs it)"
  exit 1
fi
command -v python3 > /dev/null || { echo "FAILED: python3 not found (scripts/setup.sh installs it)"; exit 1; }
exec python3 "$(dirname "$0")/hostile_cli.py" "$@"

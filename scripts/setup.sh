#!/usr/bin/env bash
# Install the Debian packages Kiln's build, tests and main job need.
# Idempotent: installs only what is missing. As root it runs apt-get; as
# anyone else it prints the exact command to run and fails.
#
# The CUDA toolkit (nvcc, cuBLAS, cuDNN, NCCL) is not a Debian 12 package
# of the version Kiln needs; when nvcc is absent the CUDA backend is simply
# not built (CMake says so) and the nvcc CI tier is skipped with a message.
set -euo pipefail

# The reference safetensors reader (PyPI), for tests/io/test_safetensors_python
# (skipped when it cannot be imported). No network when already installed.
if command -v python3 > /dev/null && ! python3 -c 'import safetensors' 2> /dev/null; then
  python3 -m pip install --user --quiet safetensors 2> /dev/null ||
    python3 -m pip install --user --quiet --break-system-packages safetensors ||
    echo "setup: could not install the Python package safetensors; its test will be skipped" >&2
fi

packages=(
  build-essential cmake ccache pkg-config git
  zlib1g-dev libcjson-dev
  clang libclang-rt-14-dev
  libopenblas-dev libdnnl-dev
  libopenmpi-dev openmpi-bin
  dataset-fashion-mnist chromium
)

missing=()
for p in "${packages[@]}"; do
  # Read whole, then matched: no 'cmd | grep -q' under pipefail (SIGPIPE race).
  state=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  if [ "$state" != "install ok installed" ]; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} Debian packages present"
  exit 0
fi

cmd="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "setup: missing Debian packages: ${missing[*]}" >&2
  echo "setup: run as root:  sudo sh -c '$cmd'" >&2
  exit 1
fi
echo "setup: installing ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"

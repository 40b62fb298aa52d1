#!/usr/bin/env bash
# Install the Debian packages Kiln's build, tests and main job need.
# Idempotent: installs only what is missing. As root it runs apt-get; as
# anyone else it prints the exact command to run and fails.
#   scripts/setup.sh          the Debian packages (scripts/run.sh)
#   scripts/setup.sh --tests  and the Python package the tests need from
#                             PyPI (scripts/test.sh): the main job does not
#                             depend on reaching PyPI
#   scripts/setup.sh --peer   and PyTorch for the benchmarks' peers
#                             (python3-torch, python3-numpy: kiln bench cnn,
#                             ddp, checkpoint compare against it; 160 more
#                             packages, so neither the tests nor CI take it)
#
# The CUDA toolkit (nvcc, cuBLAS, cuDNN, NCCL) is not a Debian 12 package
# of the version Kiln needs; when nvcc is absent the CUDA backend is simply
# not built (CMake says so) and the nvcc CI tier is skipped with a message.
set -euo pipefail
for_tests=0
for_peer=0
case "${1:-}" in
  --tests) for_tests=1 ;;
  --peer) for_peer=1 ;;
  "") ;;
  *) echo "usage: scripts/setup.sh [--tests | --peer]" >&2; exit 2 ;;
esac

# Every package the build, the tests and the main job use. The list is
# closed: scripts/check-packages.sh traces a configure, build and test run
# and names any package used that is neither here, nor in the Depends of
# one of these, nor Essential (CI's release tier runs it).
#   libdnnl-dev is found by cmake/FindDNNL.cmake, not by its own config,
#     which needs OpenCL's files (ocl-icd-opencl-dev, only recommended).
#   python3, python3-pip: the Python reference checks (grad scaler,
#     safetensors reader, memory_peak.py, train_resume.sh's edits).
#   strace: scripts/check-packages.sh.
#   mawk: awk, in the test scripts (Priority required, so on every Debian,
#     but not Essential: listed so the list is closed).
packages=(
  build-essential cmake ccache pkg-config git
  zlib1g-dev libcjson-dev
  clang libclang-rt-14-dev
  libopenblas-dev libdnnl-dev
  libopenmpi-dev openmpi-bin
  dataset-fashion-mnist chromium
  python3 python3-pip strace mawk
)
# The benchmarks' PyTorch peers run /usr/bin/python3 with Debian's torch.
if [ "$for_peer" = 1 ]; then
  packages+=(python3-torch python3-numpy)
fi

missing=()
for p in "${packages[@]}"; do
  # Read whole, then matched: no 'cmd | grep -q' under pipefail (SIGPIPE race).
  state=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  if [ "$state" != "install ok installed" ]; then
    missing+=("$p")
  fi
done

# The reference safetensors reader (PyPI: Debian has no package), for
# tests/io/test_safetensors_python. Installed after the Debian packages
# (python3 and pip come from them); a failure is a failure.
install_python_packages() {
  [ "$for_tests" = 1 ] || return 0
  if python3 -c 'import safetensors' 2> /dev/null; then return 0; fi
  if [ "$(id -u)" -ne 0 ] && ! python3 -m pip --version > /dev/null 2>&1; then
    echo "setup: the Python package safetensors is missing: run  python3 -m pip install --user safetensors" >&2
    return 1
  fi
  echo "setup: installing the Python package safetensors (pip)"
  python3 -m pip install --quiet --disable-pip-version-check safetensors 2> /dev/null ||
    python3 -m pip install --quiet --disable-pip-version-check --break-system-packages safetensors || {
    echo "setup: pip could not install the Python package safetensors (tests/io/test_safetensors_python needs it):" \
      "check that this machine reaches PyPI (behind a TLS proxy, its CA belongs in /usr/local/share/ca-certificates)" >&2
    return 1
  }
}

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} Debian packages present"
  install_python_packages
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
install_python_packages

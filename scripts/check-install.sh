#!/usr/bin/env bash
# Install a build into a temporary prefix and build the README's example
# against it twice: through the CMake package and through pkg-config.
#   scripts/check-install.sh BUILD_DIR
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:?usage: check-install.sh BUILD_DIR}" && pwd)
prefix="$build/install-check/prefix"
rm -rf "$build/install-check"
cmake --install "$build" --prefix "$prefix" >/dev/null
for f in include/kiln/kiln.h lib/libkiln.so lib/libkiln.a lib/cmake/kiln/kilnConfig.cmake lib/pkgconfig/kiln.pc bin/kiln; do
  [ -e "$prefix/$f" ] || { echo "check-install: $f was not installed" >&2; exit 1; }
done
cmake -S "$top/tests/install" -B "$build/install-check/cmake" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$build/install-check/cmake" -j2 >/dev/null
LD_LIBRARY_PATH="$prefix/lib" "$build/install-check/cmake/consumer_shared" >/dev/null
"$build/install-check/cmake/consumer_static" >/dev/null
PKG_CONFIG_PATH="$prefix/lib/pkgconfig" cc "$top/examples/first.c" -o "$build/install-check/first_pc" \
  $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs kiln)
LD_LIBRARY_PATH="$prefix/lib" "$build/install-check/first_pc" >/dev/null
echo "check-install: CMake package and pkg-config consumers build and run"

#!/bin/sh
# The CUDA kernels that promise the CPU kernels' bits must not let nvcc
# contract a * b + c into an fma (docs/cuda.md, "What the emulator cannot
# catch"). Runs without a GPU: compiles each listed .cu file to PTX with the
# real build's flags (nvcc's default --fmad=true) and fails if any of its
# functions holds
#   - fma.rn.f32/f64 or mad.f32/f64 (contracted by nvcc's front end), or
#   - a floating-point mul without a rounding modifier (ptxas may still fuse
#     it with an add: PTX ISA, "add"); kiln_cuda::mul_rn gives mul.rn.
# The listed files call no libdevice math (exp, log, pow carry fmas of
# their own), so every fma there would be a contraction.
#
# usage: cuda_contraction.sh NVCC SOURCE_DIR GENERATED_DIR [ARCH]   (exit 77: no NVCC)
#   ARCH: a compute capability as in CMAKE_CUDA_ARCHITECTURES (90, 80-real);
#   default 90. KILN_CONTRACTION_FILES overrides the file list (paths under
#   SOURCE_DIR), e.g. to see the check fail on another file.
set -u
nvcc=${1:?usage: cuda_contraction.sh NVCC SOURCE_DIR GENERATED_DIR [ARCH]}
src=${2:?source dir}
gen=${3:?generated include dir, the generated/ folder of the build}
arch=$(printf '%s' "${4:-90}" | sed 's/[;,].*//; s/-.*//')
files=${KILN_CONTRACTION_FILES:-"src/kernels/cuda/optim_kernels.cu src/kernels/cuda/ops_pool.cu src/kernels/cuda/ops_index.cu"}

if ! command -v "$nvcc" >/dev/null 2>&1; then
    echo "cuda_contraction: SKIPPED: no nvcc at $nvcc (the check compiles the kernels to PTX)"
    exit 77
fi
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
demangle() { if command -v c++filt >/dev/null 2>&1; then c++filt; else cat; fi; }

fail=0
for f in $files; do
    out="$tmp/$(basename "$f").ptx"
    if ! "$nvcc" -ptx -O3 -DNDEBUG -DKILN_WITH_CUDA=1 -DKILN_NO_SITE_MACROS -arch="compute_$arch" \
        -I"$src/include" -I"$src/src" -I"$gen" -x cu "$src/$f" -o "$out" 2>"$tmp/err"; then
        echo "cuda_contraction: nvcc could not compile $f:"
        cat "$tmp/err"
        fail=1
        continue
    fi
    if ! grep -q '\.entry' "$out"; then
        echo "cuda_contraction: $f compiled to no kernel (.entry): nothing was checked"
        fail=1
        continue
    fi
    # One line per function with contracted or fusable products: name, fmas, unrounded muls.
    awk '
        /^[ \t]*(\.visible[ \t]+|\.weak[ \t]+)?\.(entry|func)[ \t]/ {
            name = $0
            sub(/\(.*/, "", name)
            sub(/.*[ \t]/, "", name)
        }
        /^[ \t]*(@%p[0-9]+[ \t]+)?(fma\.rn|mad)(\.rn)?(\.ftz)?(\.sat)?\.f(32|64)[ \t]/ { fma[name]++ }
        /^[ \t]*(@%p[0-9]+[ \t]+)?mul(\.ftz)?(\.sat)?\.f(32|64)[ \t]/ { mul[name]++ }
        END {
            for (n in fma) printf "%s %d %d\n", n, fma[n], mul[n] + 0
            for (n in mul) if (!(n in fma)) printf "%s 0 %d\n", n, mul[n]
        }' "$out" >"$tmp/hits"
    if [ -s "$tmp/hits" ]; then
        fail=1
        while read -r name nfma nmul; do
            printf '%s: %s: %s fma and %s unrounded mul instructions (use kiln_cuda::mul_rn)\n' "$f" \
                "$(printf '%s\n' "$name" | demangle)" "$nfma" "$nmul"
        done <"$tmp/hits"
    else
        echo "cuda_contraction: $f: no contracted or fusable products"
    fi
done
if [ "$fail" -ne 0 ]; then
    echo "cuda_contraction: FAILED: kernels that must give the CPU's bits let nvcc fuse a * b + c"
    echo "  (docs/cuda.md, \"What the emulator cannot catch\": write the products with kiln_cuda::mul_rn)"
fi
exit "$fail"

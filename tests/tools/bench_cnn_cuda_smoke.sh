#!/bin/sh
# `kiln bench cnn --device cuda:0` on the emulator, tiny (batch 4, one timed
# step): the GPU benchmark's code path, never its timings. Every setup
# issue 22's gpu-check asks for must give a rate: f32 with cuDNN autotuning
# off and on, f32 with TF32 allowed, AMP (f16 autocast + grad scaler), and
# each of the three replayed as one CUDA graph; and the steady-state training step must make no CUDA
# runtime call other than launches and their checks.
# usage: bench_cnn_cuda_smoke.sh KILN_BINARY
set -eu
kiln=$1
out=$(mktemp -d "${TMPDIR:-/tmp}/kiln_bench_cnn_cuda.XXXXXX")
trap 'rm -rf "$out"' EXIT
rc=0
timeout -k 5 280 "$kiln" bench cnn --device cuda:0 --batch 4 --steps 1 --warmup 1 --repeats 1 \
    > "$out/bench.txt" 2> "$out/err.txt" || rc=$?
cat "$out/bench.txt" "$out/err.txt"
if [ "$rc" -ne 0 ]; then
    echo "FAIL: kiln bench cnn --device cuda:0 exited with status $rc"
    exit 1
fi
tail -n 1 "$out/bench.txt" > "$out/result.json"
python3 - "$out/result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["bench"] == "cnn" and r["device"] == "cuda:0" and r["batch"] == 4, r
for k in ("train_ips", "infer_ips", "train_ips_autotune", "infer_ips_autotune", "train_ips_tf32", "infer_ips_tf32",
          "train_ips_amp", "infer_ips_amp", "train_ips_graph", "infer_ips_graph", "train_ips_amp_graph",
          "infer_ips_amp_graph", "train_ips_tf32_graph", "infer_ips_tf32_graph"):
    assert isinstance(r.get(k), (int, float)) and r[k] > 0, ("no rate for " + k, r)
assert r["host_calls_other"] == 0, r
assert r["host_calls_per_step"]["kernel_launch"] > 0, r
print("PASS: every setup ran on cuda:0 (graphs included), %d launches per training step and no other call"
      % r["host_calls_per_step"]["kernel_launch"])
PY

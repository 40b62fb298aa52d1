#!/bin/sh
# `kiln bench trace --device cuda:0` on the emulator, batch 1 only: the
# benchmark's CUDA path (model, inputs and labels on the device, rounds
# synchronised) and the replay really being one CUDA graph per call. Its
# JSON must say, per call, one graph launch for the replay and as many
# kernel launches replayed as eager (the graph's kernels are the eager
# step's). Timings are the emulator's and never checked.
# usage: bench_trace_cuda.sh KILN_BINARY
set -eu
kiln=$1
out=$(mktemp -d "${TMPDIR:-/tmp}/kiln_bench_trace_cuda.XXXXXX")
trap 'rm -rf "$out"' EXIT
rc=0
timeout -k 5 280 "$kiln" bench trace --device cuda:0 --quick --no-peer --rounds 1 --round-ms 1 --max-batch 1 \
    > "$out/bench.txt" 2> "$out/err.txt" || rc=$?
cat "$out/bench.txt" "$out/err.txt"
if [ "$rc" -ne 0 ]; then
    echo "FAIL: kiln bench trace --device cuda:0 exited with status $rc"
    exit 1
fi
tail -n 1 "$out/bench.txt" > "$out/result.json"
python3 - "$out/result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["bench"] == "trace" and r["device"] == "cuda:0", r
assert [x["batch"] for x in r["infer"]] == [1] and [x["batch"] for x in r["train"]] == [1], r
for row in r["infer"] + r["train"]:
    l = row["launches"]
    assert l is not None, ("no launch counts in the emulation build", row)
    assert l["replay_graphs"] == 1.0, ("the replay is not one graph launch per call", row)
    assert l["eager"] > 0 and l["replay"] == l["eager"], ("replayed kernels differ from eager's", row)
print("PASS: inference %.0f and training %.0f kernels per call, replayed as one CUDA graph"
      % (r["infer"][0]["launches"]["eager"], r["train"][0]["launches"]["eager"]))
PY

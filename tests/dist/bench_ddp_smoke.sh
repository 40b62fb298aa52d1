#!/bin/sh
# `kiln bench ddp` end to end, tiny (batch 4, one timed step, one round, no
# PyTorch peer): a smoke test of its code path -- the 1-process run, the
# mpirun job it starts itself, the profile read on rank 0 -- never of its
# timings. The JSON line must hold positive rates, an efficiency, and a
# hidden share in [0, 1] (the profiler saw the all-reduces and backward).
# usage: bench_ddp_smoke.sh KILN_BINARY
set -eu
kiln=$1
out=$(mktemp -d "${TMPDIR:-/tmp}/kiln_bench_ddp.XXXXXX")
trap 'rm -rf "$out"' EXIT
rc=0
timeout -k 5 240 "$kiln" bench ddp --no-peer --batch 4 --steps 1 --warmup 1 --rounds 1 --profile-steps 1 \
    --threads 1 > "$out/bench.txt" 2> "$out/err.txt" || rc=$?
cat "$out/bench.txt" "$out/err.txt"
if [ "$rc" -ne 0 ]; then
    echo "FAIL: kiln bench ddp exited with status $rc"
    exit 1
fi
grep -q "peer: skipped (--no-peer)" "$out/bench.txt" || { echo "FAIL: the table does not say the peer was skipped"; exit 1; }
tail -n 1 "$out/bench.txt" > "$out/result.json"
python3 - "$out/result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
k = r["kiln"]
assert r["bench"] == "ddp" and r["threads"] == 1 and r["ranks"] == 2 and r["batch_per_rank"] == 4, r
assert k["img_s_1"] > 0 and k["img_s_n"] > 0 and k["efficiency"] > 0, k
assert 0.0 <= k["allreduce_hidden"] <= 1.0 and k["allreduce_ms"] > 0 and k["backward_ms"] > 0, k
assert r["peer"] is None and r["peer_skipped"] == "--no-peer", r
print("PASS: efficiency %.3f, %.0f%% of the all-reduce time hidden behind backward"
      % (k["efficiency"], 100 * k["allreduce_hidden"]))
PY

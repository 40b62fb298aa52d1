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
# No --threads and no thread variable: each rank takes its share of the
# cores (2 ranks here), not every core (which oversubscribes the host).
(unset KILN_NUM_THREADS OMP_NUM_THREADS
 timeout -k 5 240 "$kiln" bench ddp --no-peer --batch 4 --steps 1 --warmup 1 --rounds 1 --profile-steps 1 \
    > "$out/bench.txt" 2> "$out/err.txt") || rc=$?
cat "$out/bench.txt" "$out/err.txt"
if [ "$rc" -ne 0 ]; then
    echo "FAIL: kiln bench ddp exited with status $rc"
    exit 1
fi
grep -q "peer: skipped (--no-peer)" "$out/bench.txt" || { echo "FAIL: the table does not say the peer was skipped"; exit 1; }
tail -n 1 "$out/bench.txt" > "$out/result.json"
python3 - "$out/result.json" <<'PY'
import json, os, sys
r = json.load(open(sys.argv[1]))
k = r["kiln"]
share = max(1, os.sysconf("SC_NPROCESSORS_ONLN") // 2)
assert r["bench"] == "ddp" and r["threads"] == share and r["ranks"] == 2 and r["batch_per_rank"] == 4, (share, r)
assert k["img_s_1"] > 0 and k["img_s_n"] > 0 and k["efficiency"] > 0, k
assert 0.0 <= k["allreduce_hidden"] <= 1.0 and k["allreduce_ms"] > 0 and k["backward_ms"] > 0, k
assert r["peer"] is None and r["peer_skipped"] == "--no-peer", r
print("PASS: efficiency %.3f, %.0f%% of the all-reduce time hidden behind backward"
      % (k["efficiency"], 100 * k["allreduce_hidden"]))
PY

# The peer's path without torch: a stand-in interpreter that answers the
# import check and prints the peer's RESULT line (500 img/s alone, 900 for
# 2 ranks). The ratios must be computed from it, and a peer that ran on
# another thread count must be refused.
cat > "$out/fakepy" <<'SH'
#!/bin/sh
if [ "$1" = "-c" ]; then echo "RESULT {}"; exit 0; fi
world=1; threads=0
while [ $# -gt 0 ]; do
    case "$1" in --world) world=$2; shift ;; --threads) threads=$2; shift ;; esac
    shift
done
[ -z "${FAKE_THREADS:-}" ] || threads=$FAKE_THREADS
if [ "$world" = 1 ]; then rate=500; else rate=900; fi
echo "RESULT {\"world\": $world, \"threads_per_rank\": $threads, \"img_s_median\": $rate, \"torch\": \"stand-in\"}"
SH
chmod +x "$out/fakepy"
"$kiln" bench ddp --python "$out/fakepy" --batch 4 --steps 1 --warmup 0 --rounds 1 --profile-steps 0 \
    --threads 1 > "$out/peer.txt" 2>&1 || { cat "$out/peer.txt"; echo "FAIL: the run with the stand-in peer"; exit 1; }
cat "$out/peer.txt"
tail -n 1 "$out/peer.txt" > "$out/peer.json"
python3 - "$out/peer.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
k, p, v = r["kiln"], r["peer"], r["kiln_vs_peer"]
assert p["img_s_1"] == 500 and p["img_s_n"] == 900 and abs(p["efficiency"] - 0.9) < 1e-9, p
assert abs(v["img_s_n"] - k["img_s_n"] / 900) < 1e-9, v
assert abs(v["efficiency"] - k["efficiency"] / 0.9) < 1e-9, v
assert k["allreduce_hidden"] is None, k  # --profile-steps 0
print("PASS: the stand-in peer's figures and the ratios")
PY
FAKE_THREADS=3 "$kiln" bench ddp --python "$out/fakepy" --batch 4 --steps 1 --warmup 0 --rounds 1 \
    --profile-steps 0 --threads 1 > "$out/wrong.txt" 2>&1 || true
grep -q "peer: skipped (.*it ran on 3 threads per rank, not the 1 asked for)" "$out/wrong.txt" ||
    { cat "$out/wrong.txt"; echo "FAIL: a peer on the wrong thread count was not refused"; exit 1; }
echo "PASS: a peer on another thread count is refused"

# --model-scaling, tiny: the ping-pong job, both models timed, the fit and
# the predictions (never their values: a smoke test of the code path). Run
# from the source tree, where models/resnet_small_cifar10.txt is.
cd "$(dirname "$0")/../.."
timeout -k 5 240 "$kiln" bench ddp --no-peer --batch 4 --steps 1 --warmup 1 --rounds 1 --profile-steps 1 \
    --threads 1 --model-scaling > "$out/model.txt" 2>&1 || { cat "$out/model.txt"; echo "FAIL: --model-scaling"; exit 1; }
cat "$out/model.txt"
tail -n 1 "$out/model.txt" > "$out/model.json"
python3 - "$out/model.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["bench"] == "ddp-model-scaling" and r["latency_us"] > 0 and r["bandwidth_gbs"] > 0, r
c = r["check"]
assert 0 < c["efficiency_predicted"] <= 1 and 0 <= c["hidden_predicted"] <= 1, c
p = r["predictions"]
assert len(p) == 14 and {x["model"] for x in p} == {"tutorial CNN", "small ResNet"}, p
for x in p:
    # overlap never hurts, and a quarter of the bytes never costs time
    assert 0 < x["efficiency_no_overlap"] <= x["efficiency"] <= x["efficiency_grads_quarter"] <= 1, x
print("PASS: --model-scaling fitted latency %.2f us, bandwidth %.2f GB/s, %d predictions"
      % (r["latency_us"], r["bandwidth_gbs"], len(p)))
PY

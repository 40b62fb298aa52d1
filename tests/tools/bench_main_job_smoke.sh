#!/bin/sh
# `kiln bench main-job` end to end without torch: kiln train for real on a
# slice of Fashion-MNIST (--limit 512, 1 epoch: the one-cycle schedule's
# minimum of 4 steps), two interleaved rounds against a stand-in for
# bench/peer/fmnist_train.py that reports 4.0 s per epoch and 50% test
# accuracy. The JSON must hold Kiln's own figures from its epoch records,
# the ratio and accuracy difference computed from the stand-in's, no run
# directory left behind, and a stand-in on another thread count refused. A smoke test of the code path, never of timings.
# usage: bench_main_job_smoke.sh KILN_BINARY
set -eu
kiln=$1
data=/usr/share/datasets/fashion-mnist
if [ ! -e "$data/train-images-idx3-ubyte.gz" ] && [ ! -e "$data/train-images-idx3-ubyte" ]; then
    echo "FAILED: Fashion-MNIST not installed (Debian package dataset-fashion-mnist; scripts/setup.sh installs it)"
    exit 1
fi
out=$(mktemp -d "${TMPDIR:-/tmp}/kiln_bench_main_job.XXXXXX")
trap 'rm -rf "$out"' EXIT

cat > "$out/fakepy" <<'SH'
#!/bin/sh
echo peer >> "${0%/*}/order.log"
epochs=3; threads=2; limit=0; recipe=
while [ $# -gt 0 ]; do
    case "$1" in
        --epochs) epochs=$2; shift ;;
        --threads) threads=$2; shift ;;
        --limit) limit=$2; shift ;;
        --recipe) recipe=$2; shift ;;
        --seed) echo "$2" >> "${0%/*}/seeds.log"; shift ;;
    esac
    shift
done
[ "$recipe" = onecycle ] || { echo "stand-in: --recipe onecycle expected, got '$recipe'"; exit 2; }
[ "$limit" = 512 ] || { echo "stand-in: --limit 512 expected, got '$limit'"; exit 2; }
[ -z "${FAKE_THREADS:-}" ] || threads=$FAKE_THREADS
list=
i=1
while [ "$i" -le "$epochs" ]; do
    list="$list${list:+, }{\"epoch\": $i, \"train_s\": 4.0, \"eval_s\": 0.5, \"test_acc\": 0.5}"
    i=$((i + 1))
done
echo "RESULT {\"threads\": $threads, \"epochs\": [$list]}"
SH
chmod +x "$out/fakepy"

rc=0
TMPDIR=$out timeout -k 5 120 "$kiln" bench main-job --python "$out/fakepy" --epochs 1 --rounds 2 --limit 512 \
    --threads 1 > "$out/bench.txt" 2> "$out/err.txt" || rc=$?
cat "$out/bench.txt"
if [ "$rc" -ne 0 ]; then
    cat "$out/err.txt"
    echo "FAIL: kiln bench main-job exited with status $rc"
    exit 1
fi
grep -q "^bar: training-loop time per epoch kiln / pytorch .*bar <= 0.25x" "$out/bench.txt" ||
    { echo "FAIL: no bar line"; exit 1; }
# round r seeds both sides with r
[ "$(tr '\n' ' ' < "$out/seeds.log")" = "0 1 " ] || { echo "FAIL: the seeds the peer got were '$(cat "$out/seeds.log")', not 0 1"; exit 1; }
grep -q "^round 2 (seed 1): kiln" "$out/err.txt" || { cat "$out/err.txt"; echo "FAIL: Kiln's round 2 ran without seed 1"; exit 1; }
# kiln train's temporary run directories are gone.
if ls -d "$out"/kiln_main_job.* > /dev/null 2>&1; then echo "FAIL: a kiln train run directory was left behind"; exit 1; fi
tail -n 1 "$out/bench.txt" > "$out/result.json"
python3 - "$out/result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
k, p = r["kiln"], r["peer"]
assert r["bench"] == "main-job" and r["threads"] == 1 and r["epochs"] == 1 and r["rounds"] == 2 and r["limit"] == 512, r
assert len(k["rounds"]) == 2 and all(x and x["s_per_epoch"] > 0 for x in k["rounds"]), k
assert 0.0 <= k["test_acc"] <= 1.0 and k["eval_s_per_epoch"] >= 0, k
assert p["s_per_epoch"] == 4.0 and p["test_acc"] == 0.5 and len(p["rounds"]) == 2, p
assert abs(r["ratio_s_per_epoch"] - k["s_per_epoch"] / 4.0) < 1e-3, r
assert abs(r["acc_delta"] - (k["test_acc"] - 0.5)) < 1e-4 and r["bar_ratio"] == 0.25, r
assert r["kiln_reason"] is None and r["peer_reason"] is None, r
print("PASS: kiln's figures from its epoch records, the stand-in's, the ratio and the accuracy difference")
PY
# The peer ran once per round.
test "$(wc -l < "$out/order.log")" -eq 2 || { cat "$out/order.log"; echo "FAIL: the peer did not run twice"; exit 1; }

FAKE_THREADS=3 TMPDIR=$out "$kiln" bench main-job --python "$out/fakepy" --epochs 1 --rounds 1 --limit 512 \
    --threads 1 > "$out/wrong.txt" 2>&1 || { cat "$out/wrong.txt"; echo "FAIL: the run with a wrong-thread peer"; exit 1; }
grep -q "peer figures missing: .*it ran on 3 threads, not the 1 asked for" "$out/wrong.txt" ||
    { cat "$out/wrong.txt"; echo "FAIL: a peer on another thread count was not refused"; exit 1; }
tail -n 1 "$out/wrong.txt" | python3 -c 'import json,sys; r=json.load(sys.stdin); assert r["peer"] is None and r["ratio_s_per_epoch"] is None, r'
echo "PASS: a peer on another thread count is refused"

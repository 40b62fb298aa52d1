#!/bin/sh
# `kiln bench cnn`'s peer columns without torch: a stand-in interpreter
# answers for bench/peer/torch_cnn_bench.py with fixed images/s per setup
# and precision, and the benchmark must run each setup every round
# (eager and best, train and infer, f32 and bf16), put each figure in its
# place, compute the ratios to eager and to best from them, name the CPU
# and its flags, measure an FMA peak, count the step's FLOPs from the
# layer shapes, and say why bf16 went missing when the peer declines it.
# A smoke test of the code path, never of timings.
# usage: bench_cnn_peers_smoke.sh KILN_BINARY
set -eu
kiln=$1
out=$(mktemp -d "${TMPDIR:-/tmp}/kiln_bench_cnn_peers.XXXXXX")
trap 'rm -rf "$out"' EXIT

# img/s: f32 train eager 100, best 200; f32 infer eager 300, best 400;
# bf16 adds 50 to each. FAKE_DECLINE_BF16=1: exit 3 on --bf16 with a reason.
cat > "$out/fakepy" <<'SH'
#!/bin/sh
log=${0%/*}/calls.log
echo "$*" >> "$log"
mode=train; setup=eager; bf16=0; threads=0
while [ $# -gt 0 ]; do
    case "$1" in
        --mode) mode=$2; shift ;;
        --setup) setup=$2; shift ;;
        --threads) threads=$2; shift ;;
        --bf16) bf16=1 ;;
    esac
    shift
done
if [ "$bf16" = 1 ] && [ -n "${FAKE_DECLINE_BF16:-}" ]; then
    echo "stand-in: no native bf16 here; skipped"
    exit 3
fi
rate=100
[ "$mode" = infer ] && rate=300
[ "$setup" = best ] && rate=$((rate + 100))
[ "$bf16" = 1 ] && rate=$((rate + 50))
echo "RESULT {\"threads\": $threads, \"img_s_median\": $rate, \"torch\": \"stand-in\"}"
SH
chmod +x "$out/fakepy"

"$kiln" bench cnn --python "$out/fakepy" --steps 1 --repeats 3 --warmup 0 --batch 8 --threads 1 \
    --profile-rows 0 --precision both > "$out/both.txt" 2> "$out/err.txt" ||
    { cat "$out/both.txt" "$out/err.txt"; echo "FAIL: kiln bench cnn with the stand-in peer"; exit 1; }
cat "$out/both.txt"
for want in "--mode train --setup eager" "--mode train --setup best" "--mode infer --setup eager" \
    "--mode infer --setup best"; do
    n=$(grep -c -- "$want .*--threads 1\$" "$out/calls.log" || true)
    nb=$(grep -c -- "$want .*--threads 1 --bf16" "$out/calls.log" || true)
    [ "$n" -eq 3 ] && [ "$nb" -eq 3 ] ||
        { cat "$out/calls.log"; echo "FAIL: '$want' ran $n times in f32 and $nb in bf16, not 3 and 3"; exit 1; }
done
grep -q "vs eager.*vs best" "$out/both.txt" || { echo "FAIL: the table has no 'vs eager' and 'vs best' columns"; exit 1; }
grep -q "^bar: f32 train kiln / torch best .*bar >= 4.0x" "$out/both.txt" || { echo "FAIL: no f32 training bar line"; exit 1; }
grep -q "^machine: .*flags: .*1 threads (kiln and peer)" "$out/both.txt" || { echo "FAIL: the machine line is missing"; exit 1; }
tail -n 1 "$out/both.txt" > "$out/both.json"
python3 - "$out/both.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
want = {("f32", "train"): (100, 200), ("f32", "infer"): (300, 400),
        ("bf16", "train"): (150, 250), ("bf16", "infer"): (350, 450)}
for (prec, mode), (eager, best) in want.items():
    m = r["precisions"][prec][mode]
    assert m["eager"] == eager and m["best"] == best, (prec, mode, m)
    assert m["kiln"] > 0 and abs(m["vs_eager"] - m["kiln"] / eager) < 2e-3 * m["vs_eager"] + 1e-3, m
    assert abs(m["vs_best"] - m["kiln"] / best) < 2e-3 * m["vs_best"] + 1e-3, m
    assert m["ranges"]["best"] == [best, best], m
assert r["precisions"]["f32"]["train"]["bar_vs_best"] == 4.0 and r["precisions"]["bf16"]["infer"]["bar_vs_best"] == 2.0
assert r["peer_train_img_s"] == 100 and r["peer_infer_img_s"] == 300, r  # the f32 eager figures, old names
cpu = r["cpu"]
assert cpu["model"] and cpu["cores"] >= 1, cpu
if cpu["avx2"] or cpu["avx512f"]:
    assert cpu["fma_peak_gflop_s"] > 0 and cpu["fma_peak_threads"] == 1, cpu
    share = r["precisions"]["f32"]["train"]["peak_share"]
    assert abs(share - r["precisions"]["f32"]["train"]["kiln_gflop_s"] / cpu["fma_peak_gflop_s"]) < 1e-2 * share + 1e-3
# Direct-convolution FLOPs of the tutorial CNN at batch 8, from its layer shapes:
# forward 2.912 GFLOP at batch 128; training 3x that less conv1's data gradient.
c = r["config"]
assert abs(c["gflop_forward"] - 0.182) < 1e-3 and abs(c["gflop_train_step"] - 0.532) < 1e-3, c
print("PASS: every setup ran each round; figures, ratios, machine, peak and FLOPs in place")
PY

FAKE_DECLINE_BF16=1 "$kiln" bench cnn --python "$out/fakepy" --steps 1 --repeats 1 --warmup 0 --batch 8 \
    --threads 1 --profile-rows 0 --precision both --mode infer > "$out/decline.txt" 2>&1 ||
    { cat "$out/decline.txt"; echo "FAIL: kiln bench cnn with a peer that declines bf16"; exit 1; }
grep -q "^bf16: " "$out/decline.txt" || { cat "$out/decline.txt"; echo "FAIL: no line says why bf16 is missing"; exit 1; }
tail -n 1 "$out/decline.txt" > "$out/decline.json"
python3 - "$out/decline.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
b = r["precisions"]["bf16"]["infer"]
assert b["kiln"] > 0 and b["eager"] is None and b["best"] is None and b["vs_best"] is None, b
assert r["bf16_reason"], r
assert r["precisions"]["f32"]["infer"]["best"] == 400 and r["peer_reason"] is None, r
print("PASS: a peer that declines bf16 leaves its figures out, with the reason")
PY

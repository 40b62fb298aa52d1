#!/bin/sh
# kiln bench exercises --quick: the page and the JSON of the tutorial's
# five exercises (small sizes, one round: a smoke test, not a measurement).
#  1. exercises.json parses, holds the five exercises, each with its
#     command and an answer, the figures finite where they must be; an
#     exercise that could not run here (exercise 5 in a build without MPI
#     or without mpirun: `kiln bench ddp` exits 77) has null figures and
#     must say why ("skipped"); one that failed otherwise ("failed") fails;
#  2. exercises.html has five sections, each with a table and an SVG plot
#     holding a polyline (a skipped one: its table and "not measured");
#  3. headless Chromium loads the page without a console message and its
#     script counts the complete sections (body data-sections="5", less
#     the skipped ones).
# usage: bench_exercises_smoke.sh KILN_BINARY
set -eu
kiln=$1
out=$(mktemp -d "${TMPDIR:-/tmp}/kiln_bench_exercises.XXXXXX")
trap 'rm -rf "$out"' EXIT
"$kiln" bench exercises --quick --out "$out/ex" > "$out/stdout" 2> "$out/stderr" || {
  echo "FAILED: kiln bench exercises exited $?"; tail -n 20 "$out/stderr"; exit 1; }
tail -n 2 "$out/stdout" | head -n 1

# 1. The JSON.
# Exercise 5 must run where kiln bench ddp can: an MPI build with mpirun on PATH.
ddp_can_run=0
if "$kiln" info 2>/dev/null | grep -q '^build:.* mpi=on' && command -v mpirun > /dev/null 2>&1; then
  ddp_can_run=1
fi
python3 - "$out/ex/exercises.json" "$out/stdout" "$out/skipped" "$ddp_can_run" <<'EOF'
import json, math, sys
d = json.load(open(sys.argv[1]))
last = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
assert last == d, "the last stdout line is not exercises.json"
assert d["bench"] == "exercises" and d["quick"] is True, d
ex = {x["id"]: x for x in d["exercises"]}
assert sorted(ex) == [1, 2, 3, 4, 5], sorted(ex)
for i, x in ex.items():
    assert x["command"].startswith("kiln "), x
    assert x["answer"] and "nan" not in x["answer"], x["answer"]
    assert "failed" not in x, "exercise %d failed: %s" % (i, x["failed"])
# A null figure needs its reason: only an exercise that says why it was skipped may have one.
skipped = {i: x["skipped"] for i, x in ex.items() if "skipped" in x}
for i, why in skipped.items():
    assert isinstance(why, str) and why.strip(), "exercise %d skipped without a reason: %r" % (i, why)
    assert ex[i]["answer"].startswith("not measured: "), ex[i]["answer"]
    print("json: exercise %d not measured here: %s" % (i, why))
assert set(skipped) <= {5}, "only exercise 5 (kiln bench ddp, MPI) may be skipped: %s" % sorted(skipped)
assert not (sys.argv[4] == "1" and skipped), "MPI is built and mpirun is on PATH, yet exercise 5 was skipped"
assert len(ex[1]["top_ops"]) == 3 and all(o["self_ms_per_step"]["median"] > 0 for o in ex[1]["top_ops"])
assert all(m["img_s"]["median"] > 0 for m in ex[2]["modes"]), ex[2]
assert ex[2]["amp_auto"].startswith("kiln train: mixed precision")
assert all(b["loader_img_s"]["median"] > 0 for b in ex[3]["buffers"]), ex[3]
for c in ex[4]["configs"]:
    assert c["peak_bytes"]["median"] > 0 and c["planned_bytes"] > 0, c
if 5 in skipped:
    assert all(ex[5][k]["median"] is None for k in ("img_s_1", "img_s_n", "efficiency")), ex[5]
else:
    assert ex[5]["efficiency"]["median"] > 0, ex[5]
open(sys.argv[3], "w").write("".join("%d\n" % i for i in sorted(skipped)))
print("json: five exercises, figures present%s" % ("" if not skipped else " (or a skip's reason)"))
EOF

# 2. The page.
page=$out/ex/exercises.html
test "$(grep -c '<section id="ex[1-5]">' "$page")" -eq 5
python3 - "$page" "$out/skipped" <<'EOF'
import re, sys
html = open(sys.argv[1]).read()
skipped = open(sys.argv[2]).read().split()
secs = re.findall(r'<section id="ex(\d)">(.*?)</section>', html, re.S)
assert [s[0] for s in secs] == list("12345"), [s[0] for s in secs]
for n, body in secs:
    assert "<table" in body, "section %s has no table" % n
    if n in skipped:
        assert "not measured: " in body and "<polyline" not in body, "skipped section %s" % n
        continue
    assert re.search(r'<svg[^>]*class="plot"', body) and "<polyline" in body, "section %s has no plot" % n
    for what in ("The tutorial asks:", "The command that answers it alone:", "Answer:", "What it means:"):
        assert what in body, "section %s lacks %s" % (n, what)
assert "http://" not in html.replace("http://www.w3.org/2000/svg", "") and "https://" not in html, "external resource"
print("html: five sections, each with its table and plot%s" % (" (a skipped one: its table and why)" if skipped else ""))
EOF

# 3. Headless Chromium.
chromium=
for c in "${KILN_CHROMIUM:-}" /usr/bin/chromium /usr/bin/chromium-browser /usr/bin/google-chrome; do
  if [ -n "$c" ] && [ -x "$c" ]; then chromium=$c; break; fi
done
if [ -z "$chromium" ]; then
  echo "FAILED: chromium is not installed (Debian package chromium; scripts/setup.sh installs it)"; exit 1
fi
timeout 120 "$chromium" --headless --disable-gpu --no-sandbox --no-first-run --user-data-dir="$out/profile" \
  --enable-logging=stderr --v=0 --dump-dom "file://$page" > "$out/dom" 2> "$out/chromium.log" || {
  echo "FAILED: chromium exited $?"; tail -n 20 "$out/chromium.log"; exit 1; }
if grep -q ':CONSOLE\|Uncaught' "$out/chromium.log"; then
  echo "FAILED: console messages:"; grep ':CONSOLE\|Uncaught' "$out/chromium.log"; exit 1
fi
complete=$((5 - $(wc -l < "$out/skipped")))
grep -q "data-sections=\"$complete\"" "$out/dom" || {
  echo "FAILED: the page's script did not count $complete complete sections"; exit 1; }
echo "chromium: loads without console messages, $complete complete sections"
echo "bench_exercises_smoke: passed"

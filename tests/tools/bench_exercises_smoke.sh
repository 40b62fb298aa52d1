#!/bin/sh
# kiln bench exercises --quick: the page and the JSON of the tutorial's
# five exercises (small sizes, one round: a smoke test, not a measurement).
#  1. exercises.json parses, holds the five exercises, each with its
#     command and an answer, the figures finite where they must be;
#  2. exercises.html has five sections, each with a table and an SVG plot
#     holding a polyline;
#  3. headless Chromium loads the page without a console message and its
#     script counts five complete sections (body data-sections="5").
# usage: bench_exercises_smoke.sh KILN_BINARY
set -eu
kiln=$1
out=$(mktemp -d "${TMPDIR:-/tmp}/kiln_bench_exercises.XXXXXX")
trap 'rm -rf "$out"' EXIT
"$kiln" bench exercises --quick --out "$out/ex" > "$out/stdout" 2> "$out/stderr" || {
  echo "FAILED: kiln bench exercises exited $?"; tail -n 20 "$out/stderr"; exit 1; }
tail -n 2 "$out/stdout" | head -n 1

# 1. The JSON.
python3 - "$out/ex/exercises.json" "$out/stdout" <<'EOF'
import json, math, sys
d = json.load(open(sys.argv[1]))
last = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
assert last == d, "the last stdout line is not exercises.json"
assert d["bench"] == "exercises" and d["quick"] is True, d
ex = {x["id"]: x for x in d["exercises"]}
assert sorted(ex) == [1, 2, 3, 4, 5], sorted(ex)
for x in ex.values():
    assert x["command"].startswith("kiln "), x
    assert x["answer"] and "nan" not in x["answer"], x["answer"]
assert len(ex[1]["top_ops"]) == 3 and all(o["self_ms_per_step"]["median"] > 0 for o in ex[1]["top_ops"])
assert all(m["img_s"]["median"] > 0 for m in ex[2]["modes"]), ex[2]
assert ex[2]["amp_auto"].startswith("kiln train: mixed precision")
assert all(b["loader_img_s"]["median"] > 0 for b in ex[3]["buffers"]), ex[3]
for c in ex[4]["configs"]:
    assert c["peak_bytes"]["median"] > 0 and c["planned_bytes"] > 0, c
assert ex[5]["efficiency"]["median"] > 0, ex[5]
print("json: five exercises, figures present")
EOF

# 2. The page.
page=$out/ex/exercises.html
test "$(grep -c '<section id="ex[1-5]">' "$page")" -eq 5
python3 - "$page" <<'EOF'
import re, sys
html = open(sys.argv[1]).read()
secs = re.findall(r'<section id="ex(\d)">(.*?)</section>', html, re.S)
assert [s[0] for s in secs] == list("12345"), [s[0] for s in secs]
for n, body in secs:
    assert "<table" in body, "section %s has no table" % n
    assert re.search(r'<svg[^>]*class="plot"', body) and "<polyline" in body, "section %s has no plot" % n
    for what in ("The tutorial asks:", "The command that answers it alone:", "Answer:", "What it means:"):
        assert what in body, "section %s lacks %s" % (n, what)
assert "http://" not in html.replace("http://www.w3.org/2000/svg", "") and "https://" not in html, "external resource"
print("html: five sections, each with its table and plot")
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
grep -q 'data-sections="5"' "$out/dom" || { echo "FAILED: the page's script did not count 5 complete sections"; exit 1; }
echo "chromium: loads without console messages, 5 complete sections"
echo "bench_exercises_smoke: passed"

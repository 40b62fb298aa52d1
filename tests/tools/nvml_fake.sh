#!/bin/sh
# Kiln's NVML code path on a machine without a driver: KILN_NVML_LIBRARY
# points the GPU monitor at the fake NVML (tests/diag/fake_nvml.c: two
# scripted GPUs, two processes on GPU 0), and
#  1. kiln smi prints both GPUs' scripted values and the process list
#     (a process whose memory NVML does not report says so);
#  2. kiln train --monitor records each GPU's sample in metrics.jsonl;
#  3. an NVML whose init fails, and a library that is not there, are said
#     (kiln smi falls back to the host table, naming why).
# usage: nvml_fake.sh KILN_BINARY FAKE_NVML_LIBRARY
set -eu
kiln=$1
lib=$2
out=$(mktemp -d "${TMPDIR:-/tmp}/kiln_nvml_fake.XXXXXX")
trap 'rm -rf "$out"' EXIT

# 1. kiln smi.
KILN_NVML_LIBRARY=$lib "$kiln" smi > "$out/smi.txt" 2>&1
cat "$out/smi.txt"
row() { grep "^| *$1 | Fake GPU $1 (scripted)" "$out/smi.txt"; }
row 0 | grep -q "|    87 |    45 | 40.00 GiB / 80.00 GiB |   312 W |  61 C |   1755 |    2619 | power cap$"
row 1 | grep -q "|     3 |     0 | 1024.00 MiB / 80.00 GiB |    70 W |  35 C |    210 |     405 | idle$"
grep -q "^  gpu 0  pid 4242     12.00 GiB" "$out/smi.txt"
grep -q "^  gpu 0  pid 4343     (memory not reported)" "$out/smi.txt"
test "$(grep -c "^  gpu " "$out/smi.txt")" -eq 2
echo "smi: two GPUs and two processes, as scripted"

# 2. kiln train --monitor: the sampler's first sample comes at once, one
# record per GPU (CIFAR-10-format data written here: no dataset needed).
mkdir -p "$out/data"
python3 - "$out/data" <<'EOF'
import os, sys
for name, n in [("data_batch_%d.bin" % j, 8) for j in range(1, 6)] + [("test_batch.bin", 8)]:
    with open(os.path.join(sys.argv[1], name), "wb") as f:
        for i in range(n):
            f.write(bytes([i % 10]) + bytes((i * 7 + k) % 256 for k in range(3072)))
EOF
KILN_NVML_LIBRARY=$lib "$kiln" train --dataset cifar10 --data "$out/data" --epochs 1 --batch 20 --workers 0 --schedule constant \
  --monitor --out "$out/run" > /dev/null 2> "$out/train.err"
grep '"event":"monitor"' "$out/run/metrics.jsonl" > "$out/mon.txt" || true
cat "$out/mon.txt"
grep -q '"gpu":0,"util_gpu":87,"util_memory":45,"memory_used":42949672960,"memory_total":85899345920,"power_w":312.5,"temperature_c":61}' "$out/mon.txt"
grep -q '"gpu":1,"util_gpu":3,"util_memory":0,"memory_used":1073741824,"memory_total":85899345920,"power_w":70.0,"temperature_c":35}' "$out/mon.txt"
echo "train --monitor: each GPU's sample recorded"

# 3. Failures are said.
FAKE_NVML_FAIL=init KILN_NVML_LIBRARY=$lib "$kiln" smi > "$out/fail.txt" 2>&1
grep -q "nvmlInit_v2 failed: Driver Not Loaded (fake NVML, FAKE_NVML_FAIL=init) (error 9); showing host CPU" "$out/fail.txt"
KILN_NVML_LIBRARY=$out/none.so "$kiln" smi > "$out/none.txt" 2>&1
grep -q "KILN_NVML_LIBRARY=$out/none.so cannot be loaded" "$out/none.txt"
echo "failures: a failing init and a missing library are named"
echo "nvml_fake: passed"

"""Check a Kiln safetensors file with the reference reader (the Python
package `safetensors`, whose parser is the format's Rust implementation).

usage: check_safetensors.py FILE EXPECTED.json
EXPECTED.json (written by tests/io/test_safetensors_python.c from Kiln's
tensors in memory): {"tensors": [{"name", "dtype", "shape", "hex"}],
"metadata": {key: value}}. Every tensor in the file must be expected and
every expected tensor must be in the file with the same dtype, shape and
bytes; every expected metadata pair must be in the header."""
import json
import struct
import sys

from safetensors import deserialize


def main():
    path, expected_path = sys.argv[1], sys.argv[2]
    with open(path, "rb") as f:
        blob = f.read()
    with open(expected_path) as f:
        expected = json.load(f)
    got = {name: t for name, t in deserialize(blob)}
    want = {t["name"]: t for t in expected["tensors"]}
    errors = []
    for name in sorted(set(got) - set(want)):
        errors.append(f"unexpected tensor {name}")
    for name in sorted(set(want) - set(got)):
        errors.append(f"missing tensor {name}")
    for name in sorted(set(got) & set(want)):
        g, w = got[name], want[name]
        if g["dtype"] != w["dtype"]:
            errors.append(f"{name}: dtype {g['dtype']} != {w['dtype']}")
        if list(g["shape"]) != list(w["shape"]):
            errors.append(f"{name}: shape {g['shape']} != {w['shape']}")
        if bytes(g["data"]).hex() != w["hex"]:
            errors.append(f"{name}: values differ")
    # The metadata: the header's own JSON (the reference deserialize does
    # not return it; safe_open needs numpy or torch to open).
    (n,) = struct.unpack("<Q", blob[:8])
    meta = json.loads(blob[8:8 + n]).get("__metadata__", {})
    for key, value in expected.get("metadata", {}).items():
        if meta.get(key) != value:
            errors.append(f"metadata {key}: {meta.get(key)!r} != {value!r}")
    for e in errors:
        print("MISMATCH:", e)
    print(f"{len(got)} tensors read by safetensors, {len(want)} expected, {len(errors)} mismatches")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

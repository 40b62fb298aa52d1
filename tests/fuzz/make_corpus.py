#!/usr/bin/env python3
"""Write the seed corpora of the fuzz targets (tests/fuzz/corpus/{idx,cifar}).

A few small valid inputs and a few near misses (one field wrong), so the
fuzzers start from inputs that reach deep into the parsers. The layout of
an input is described at the top of each fuzz_*.c. Rerun after changing a
layout; the files are committed so CI needs no Python."""
import gzip
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def idx_images(count, rows, cols):
    data = bytes((i * 7 + p) % 251 for i in range(count) for p in range(rows * cols))
    return struct.pack(">IIII", 0x803, count, rows, cols) + data


def idx_labels(count, classes):
    return struct.pack(">II", 0x801, count) + bytes(i % classes for i in range(count))


def idx_input(images, labels, check10=True):
    return bytes([1 if check10 else 0]) + struct.pack(">H", len(images)) + images + labels


def cifar_input(records, classes, gz=False):
    label_bytes = 1 if classes == 10 else 2
    body = b""
    for i in range(records):
        labels = bytes([i % 10]) if classes == 10 else bytes([i % 100 // 5, i % 100])
        body += labels + bytes((i * 7 + p) % 251 for p in range(3072))
    assert len(body) == records * (label_bytes + 3072)
    if gz:
        body = gzip.compress(body, mtime=0)
    return bytes([0 if classes == 10 else 1]) + body


def write(kind, name, data):
    path = os.path.join(HERE, "corpus", kind, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def main():
    im, lb = idx_images(3, 4, 5), idx_labels(3, 10)
    write("idx", "valid-raw", idx_input(im, lb))
    write("idx", "valid-infer-classes", idx_input(idx_images(2, 2, 2), idx_labels(2, 2), check10=False))
    write("idx", "valid-gzip-images", idx_input(gzip.compress(im, mtime=0), lb))
    write("idx", "gzip-whole", bytes([1, 0, 0]) + gzip.compress(im + lb, mtime=0))
    write("idx", "bad-magic", idx_input(b"\x12\x34" + im[2:], lb))
    write("idx", "truncated-images", idx_input(im[:-1], lb))
    write("idx", "count-mismatch", idx_input(im, idx_labels(4, 10)))
    write("idx", "label-out-of-range", idx_input(im, lb[:-1] + b"\x0c"))
    write("idx", "absurd-dims", idx_input(struct.pack(">IIII", 0x803, 0x7FFFFFFF, 0x7FFFFFFF, 0x7FFFFFFF), lb))
    write("idx", "swapped", idx_input(lb, im))
    write("cifar", "cifar10-one", cifar_input(1, 10))
    write("cifar", "cifar100-one", cifar_input(1, 100))
    write("cifar", "cifar10-gzip", cifar_input(2, 10, gz=True))
    write("cifar", "cifar10-truncated", cifar_input(1, 10)[:-5])
    write("cifar", "cifar10-bad-label", bytes([0, 10]) + cifar_input(1, 10)[2:])
    write("cifar", "cifar100-bad-fine", bytes([1, 3, 100]) + cifar_input(1, 100)[3:])


if __name__ == "__main__":
    main()

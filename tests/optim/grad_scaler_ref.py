#!/usr/bin/env python3
"""A re-implementation of torch.amp.GradScaler's algorithm (grad_scaler.py
and the _amp_update_scale_ / _amp_foreach_non_finite_check_and_unscale_
kernels) driving SGD with momentum, gradient accumulation and
clip_grad_norm_, in plain Python with f32 rounding emulated, used as the
oracle for tests/optim/test_grad_scaler.c (the CPU PyTorch build here
disables its own GradScaler, so it cannot be).

Usage: grad_scaler_ref.py RUN_FILE. The file (written by the C test):
  config init_scale growth_factor backoff_factor growth_interval accum max_norm lr momentum n
  init p_0 .. p_{n-1}
  grad STEP MICRO c_0 .. c_{n-1}     micro-batch gradient of loss = sum(p * c)
  result STEP SCALE TRACKER STEPPED  what kiln reported after update()
  final p_0 .. p_{n-1}
Exits 0 when kiln's scales, growth trackers and skipped steps equal the
reference exactly and its parameters agree to 1e-5 relative; else prints
the first differences and exits 1."""
import math
import struct
import sys


def f32(x):
    """Round a Python float to the nearest f32 (inf past the range)."""
    if math.isnan(x) or math.isinf(x):
        return x
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def parse(path):
    cfg, init, grads, results, final = None, None, {}, [], None
    with open(path) as fh:
        for line in fh:
            w = line.split()
            if not w:
                continue
            if w[0] == "config":
                cfg = dict(zip(["init_scale", "growth", "backoff", "interval", "accum", "max_norm", "lr",
                                "momentum", "n"], [float(v) for v in w[1:]]))
            elif w[0] == "init":
                init = [float(v) for v in w[1:]]
            elif w[0] == "grad":
                grads.setdefault(int(w[1]), []).append([float(v) for v in w[3:]])
            elif w[0] == "result":
                results.append((int(w[1]), float(w[2]), int(w[3]), int(w[4])))
            elif w[0] == "final":
                final = [float(v) for v in w[1:]]
    return cfg, init, grads, results, final


def simulate(cfg, init, grads):
    n = int(cfg["n"])
    p = list(init)
    buf = None
    scale, tracker = f32(cfg["init_scale"]), 0
    out = []
    for step in sorted(grads):
        # scale(loss / accum).backward() per micro-batch: the scalar's
        # gradient is scale * (1/accum), then times c, accumulated in f32.
        g = [0.0] * n
        w = f32(scale * f32(1.0 / cfg["accum"]))
        for c in grads[step]:
            g = [f32(g[i] + f32(w * c[i])) for i in range(n)]
        # unscale_: inv = 1/scale (f64, narrowed to f32); found_inf on any inf/NaN.
        inv = f32(1.0 / scale)
        g = [f32(v * inv) for v in g]
        found = any(math.isinf(v) or math.isnan(v) for v in g)
        # clip_grad_norm_(max_norm): coef = max_norm / (total + 1e-6), applied when < 1.
        total = math.sqrt(sum(v * v for v in g)) if not found else math.inf
        coef = cfg["max_norm"] / (total + 1e-6)
        if coef < 1.0 and not found:
            g = [f32(v * coef) for v in g]
        # step(): skipped on inf/NaN; SGD with momentum (buffer = first gradient).
        if not found:
            if buf is None:
                buf = list(g)
            else:
                buf = [f32(f32(cfg["momentum"] * buf[i]) + g[i]) for i in range(n)]
            p = [f32(p[i] - f32(cfg["lr"] * buf[i])) for i in range(n)]
        # update(): _amp_update_scale_.
        if found:
            scale = f32(scale * cfg["backoff"])
            tracker = 0
        else:
            t = tracker + 1
            if t == int(cfg["interval"]):
                grown = f32(scale * cfg["growth"])
                if not math.isinf(grown):
                    scale = grown
                tracker = 0
            else:
                tracker = t
        out.append((step, scale, tracker, 0 if found else 1))
    return out, p


def main():
    cfg, init, grads, results, final = parse(sys.argv[1])
    ref, p = simulate(cfg, init, grads)
    bad = 0
    if len(ref) != len(results):
        print(f"kiln reported {len(results)} steps, the reference ran {len(ref)}")
        return 1
    for (s, sc, tr, st), (rs, rsc, rtr, rst) in zip(results, ref):
        if (s, sc, tr, st) != (rs, rsc, rtr, rst):
            print(f"step {s}: kiln scale {sc!r} tracker {tr} stepped {st}; "
                  f"reference scale {rsc!r} tracker {rtr} stepped {rst}")
            bad += 1
    for i, (a, b) in enumerate(zip(final, p)):
        if not abs(a - b) <= 1e-5 * max(1.0, abs(b)):
            print(f"parameter {i}: kiln {a!r}, reference {b!r}")
            bad += 1
    skipped = sum(1 for r in ref if r[3] == 0)
    print(f"grad scaler reference: {len(ref)} steps, {skipped} skipped, final scale {ref[-1][1]!r}, "
          f"{bad} differences")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""Make tests/ops/oracle/oracle.txt: PyTorch's float64 outputs and input
gradients for every op-harness case torch has an op for.

Usage (Debian's python3-torch, a test-time tool only):
    /usr/bin/python3 tests/ops/oracle/make_oracle.py BUILD/tests/test_ops_oracle

It runs the test binary with KILN_OPS_DUMP=<tmp> to get each eligible
case's inputs (exactly the values the harness generates), attributes and R,
evaluates the op with torch in float64, and writes for each case:
    case <id>
    check <checksum of the inputs, copied from the dump>
    out <k> <ndim> <dims> | <values>        (k = 0, and 1 for pool indices)
    grad <i> <ndim> <dims> | <values>        (d sum(out0 * R) / d input i)
    end
or `skip <reason>` for cases torch has no op for. test_ops_oracle then
checks Kiln's float64 references against these numbers."""

import math
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

DTYPES = {"f64": torch.float64, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
          "i32": torch.int32, "i64": torch.int64, "u8": torch.uint8, "bool": torch.bool}
# kiln_reduction: NONE 0, MEAN 1, SUM 2
REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def parse_dump(path):
    cases, cur = [], None
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            key, _, rest = line.partition(" ")
            if key == "case":
                cur = {"id": rest, "in": {}}
                continue
            if key == "end":
                cases.append(cur)
                cur = None
                continue
            if key == "in":
                parts = rest.split("|")
                head = parts[0].split()
                i = int(head[0])
                if head[1] == "none":
                    cur["in"][i] = None
                    continue
                nd = int(head[3])
                shape = [int(x) for x in head[4:4 + nd]]
                vals = [float(x) for x in parts[1].split()]
                cur["in"][i] = {"dtype": head[1], "grad": head[2] == "1", "shape": shape, "vals": vals}
            elif key == "out":
                head = rest.split()
                cur["out"] = {"dtype": head[0], "shape": [int(x) for x in head[2:2 + int(head[1])]]}
            elif key == "r":
                cur["r"] = [float(x) for x in rest.split()]
            elif key in ("name", "dtype"):
                cur[key] = rest
            elif key == "check":
                cur[key] = rest
            else:
                vals = [float(x) for x in rest.split()]
                cur[key] = vals if len(vals) != 1 else vals[0]
    return cases


def tensor(spec):
    if spec is None:
        return None
    t = torch.tensor(spec["vals"], dtype=torch.float64).reshape(spec["shape"])
    t = t.to(DTYPES[spec["dtype"]])
    if spec["grad"] and t.is_floating_point():
        t.requires_grad_(True)
    return t


def dims_of(c):
    n = int(c["dims"][0])
    return [int(d) for d in c["dims"][1:1 + n]]


def ints_of(c, n=None):
    if n is None:
        n = int(c["ints"][0])
    return [int(v) for v in c["ints"][1:1 + n]]


def reduce_dims(c, x):
    d = dims_of(c)
    return d if d else list(range(x.dim()))


def pair(v, default):
    return [int(a) if a else default for a in v]


def evaluate(c, x):
    """(outputs, skip reason) for case c with inputs x (torch tensors)."""
    name = c["name"]
    s = c["scalar"]
    flag = int(c["flag"])
    keep = bool(c["keepdim"])
    unary = {"neg": torch.neg, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
             "abs": torch.abs, "relu": torch.relu, "relu_": torch.relu, "sigmoid": torch.sigmoid,
             "tanh": torch.tanh, "silu": F.silu, "copy": torch.clone, "isfinite": torch.isfinite}
    binary = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
              "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
              "mm": torch.mm, "bmm": torch.bmm, "matmul": torch.matmul}
    if name in unary:
        return [unary[name](x[0])], None
    if name in binary:
        return [binary[name](x[0], x[1])], None
    if name in ("add_", "mul_"):
        y = x[0].clone()
        return [y.add_(x[1]) if name == "add_" else y.mul_(x[1])], None
    if name == "add_scalar":
        return [x[0] + s[0]], None
    if name == "mul_scalar":
        return [x[0] * s[0]], None
    if name == "pow_scalar":
        return [torch.pow(x[0], s[0])], None
    if name == "clamp":
        return [torch.clamp(x[0], min=s[0] if flag & 1 else None, max=s[1] if flag & 2 else None)], None
    if name == "leaky_relu":
        return [F.leaky_relu(x[0], s[0])], None
    if name == "gelu":
        return [F.gelu(x[0], approximate="tanh" if flag else "none")], None
    if name == "where":
        return [torch.where(x[0].bool(), x[1], x[2])], None
    if name == "cast":
        return [x[0].to(DTYPES[c["dtype"]])], None
    if name == "reshape":
        return [x[0].reshape(ints_of(c))], None
    if name == "permute":
        return [x[0].permute(dims_of(c))], None
    if name == "narrow":
        i = ints_of(c, 2)
        return [x[0].narrow(int(c["dims"][1]), i[0], i[1])], None
    if name == "expand":
        return [x[0].expand(ints_of(c))], None
    if name in ("sum", "mean"):
        fn = torch.sum if name == "sum" else torch.mean
        return [fn(x[0], dim=reduce_dims(c, x[0]), keepdim=keep)], None
    if name in ("max", "min"):
        fn = torch.amax if name == "max" else torch.amin
        return [fn(x[0], dim=reduce_dims(c, x[0]), keepdim=keep)], None
    if name == "argmax":
        return [torch.argmax(x[0], dim=int(c["dims"][1]), keepdim=keep)], None
    if name == "norm":
        d = dims_of(c)
        return [torch.linalg.vector_norm(x[0], ord=s[0], dim=d if d else None, keepdim=keep)], None
    if name in ("softmax", "log_softmax"):
        fn = torch.softmax if name == "softmax" else torch.log_softmax
        return [fn(x[0], dim=int(c["dims"][1]))], None
    red = REDUCTIONS[int(c["reduction"])]
    if name == "nll_loss":
        if c["label_smoothing"]:
            return None, "torch's nll_loss has no label smoothing (cross_entropy's cases check it)"
        return [F.nll_loss(x[0], x[1], weight=x[2], ignore_index=int(c["ignore_index"]), reduction=red)], None
    if name == "cross_entropy":
        return [F.cross_entropy(x[0], x[1], weight=x[2], ignore_index=int(c["ignore_index"]), reduction=red,
                                label_smoothing=c["label_smoothing"])], None
    if name == "mse_loss":
        return [F.mse_loss(x[0], x[1], reduction=red)], None
    if name == "linear":
        return [F.linear(x[0], x[1], x[2])], None
    if name == "conv2d":
        return [F.conv2d(x[0], x[1], x[2], stride=pair(c["stride"], 1), padding=pair(c["padding"], 0),
                         dilation=pair(c["dilation"], 1), groups=int(c["groups"]) or 1)], None
    if name in ("conv2d_grad_input", "conv2d_grad_weight"):  # (grad_out, weight or input), ints = shape
        conv = dict(stride=pair(c["stride"], 1), padding=pair(c["padding"], 0), dilation=pair(c["dilation"], 1),
                    groups=int(c["groups"]) or 1)
        if name == "conv2d_grad_input":
            return [torch.nn.grad.conv2d_input(ints_of(c, 4), x[1], x[0], **conv)], None
        return [torch.nn.grad.conv2d_weight(x[1], ints_of(c, 4), x[0], **conv)], None
    if name in ("max_pool2d", "avg_pool2d"):
        k = pair(c["kernel"], 1)
        st = [int(a) if a else b for a, b in zip(c["stride"], k)]
        if name == "max_pool2d":
            y, idx = F.max_pool2d(x[0], k, st, pair(c["padding"], 0), ceil_mode=bool(c["ceil_mode"]),
                                  return_indices=True)
            return [y, idx], None
        return [F.avg_pool2d(x[0], k, st, pair(c["padding"], 0), ceil_mode=bool(c["ceil_mode"]),
                             count_include_pad=bool(c["count_include_pad"]))], None
    if name == "adaptive_avg_pool2d":
        return [F.adaptive_avg_pool2d(x[0], ints_of(c, 2))], None
    if name == "batch_norm":
        rm = x[3].detach().clone().to(x[0].dtype) if x[3] is not None else None
        rv = x[4].detach().clone().to(x[0].dtype) if x[4] is not None else None
        return [F.batch_norm(x[0], rm, rv, x[1], x[2], training=bool(c["training"]), momentum=c["momentum"],
                             eps=c["eps"])], None
    if name in ("cat", "stack"):
        fn = torch.cat if name == "cat" else torch.stack
        return [fn([t for t in x if t is not None], dim=int(c["dims"][1]))], None
    if name == "flatten":
        return [torch.flatten(x[0], int(c["dims"][1]), int(c["dims"][2]))], None
    if name == "gather":
        return [torch.gather(x[0], int(c["dims"][1]), x[1])], None
    if name == "pad":
        return [F.pad(x[0], ints_of(c), value=s[0])], None
    if name == "flip":
        return [torch.flip(x[0], dims_of(c))], None
    if name == "embedding":
        return [F.embedding(x[1], x[0])], None
    if name == "dropout":
        return None, "random mask (Kiln's counter-based RNG, not torch's)"
    if name.endswith("_backward"):
        return None, "backward-only op: its formula is checked through the forward op's gradient"
    return None, "no torch op mapped in make_oracle.py"


def fmt(values):
    return " ".join(repr(float(v)) for v in values)


def shape_text(t):
    return "%d%s" % (t.dim(), "".join(" %d" % d for d in t.shape))


def run_case(c):
    n_in = max(c["in"].keys()) + 1 if c["in"] else 0
    x = [tensor(c["in"].get(i)) for i in range(n_in)]
    lines = ["case " + c["id"], "check " + c["check"]]
    try:
        outs, skip = evaluate(c, x)
    except Exception as e:  # noqa: BLE001 - an op torch rejects is reported, not fatal
        outs, skip = None, "torch raised: %s" % str(e).splitlines()[0]
    if outs is None:
        return lines + ["skip " + skip, "end"]
    for k, y in enumerate(outs):
        lines.append("out %d %s | %s" % (k, shape_text(y), fmt(y.detach().double().reshape(-1).tolist())))
    y = outs[0]
    grads = [i for i, t in enumerate(x) if t is not None and t.requires_grad]
    if grads and y.is_floating_point() and y.requires_grad:
        r = torch.tensor(c["r"], dtype=torch.float64).reshape(y.shape).to(y.dtype)
        g = torch.autograd.grad((y * r).sum(), [x[i] for i in grads], allow_unused=True)
        for i, gi in zip(grads, g):
            if gi is None:
                gi = torch.zeros_like(x[i])
            lines.append("grad %d %s | %s" % (i, shape_text(gi), fmt(gi.double().reshape(-1).tolist())))
    return lines + ["end"]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    torch.set_default_dtype(torch.float64)
    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "dump.txt")
        subprocess.run([sys.argv[1]], env=dict(os.environ, KILN_OPS_DUMP=dump), check=True)
        cases = parse_dump(dump)
    out = ["# PyTorch %s float64 oracle for the op harness; made by make_oracle.py, do not edit." % torch.__version__]
    skipped = 0
    for c in cases:
        lines = run_case(c)
        skipped += any(l.startswith("skip ") for l in lines)
        out.extend(lines)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "oracle.txt")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    print("%s: %d cases, %d without a torch op" % (path, len(cases), skipped))


if __name__ == "__main__":
    main()

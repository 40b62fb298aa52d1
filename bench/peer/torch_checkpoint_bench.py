#!/usr/bin/python3
"""Peer for `kiln bench checkpoint`: PyTorch CPU step time of the small
ResNet (models/resnet_small_cifar10.txt) with and without
torch.utils.checkpoint.checkpoint_sequential.

The model is the spec's: a stem (conv 64 3x3 no bias, BatchNorm, ReLU),
three BasicBlocks (64, 128 stride 2, 256 stride 2; 1x1 conv + BatchNorm
shortcut where the shape changes), global average pooling, flatten and a
linear classifier, as one nn.Sequential of 9 layers (checkpoint_sequential
splits it by layer count). A step is zero_grad(set_to_none), forward,
CrossEntropyLoss, backward and an Adam step on one fixed randn batch. Each
round runs one step of every configuration, the order rotated per round, as
kiln's bench does. Step times are medians over the rounds after one
warm-up round. PyTorch's CPU allocator keeps no statistics, so no memory
figures; the last line is `RESULT {json}`.

  /usr/bin/python3 bench/peer/torch_checkpoint_bench.py --batch 512 --segments 2,3,4 --steps 5
"""
import argparse
import json
import statistics
import time

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential


class Residual(nn.Module):
    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(),
            nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False), nn.BatchNorm2d(c_out))
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        return torch.relu(self.body(x) + self.shortcut(x))


def small_resnet():
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
        Residual(64, 64, 1), Residual(64, 128, 2), Residual(128, 256, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--segments", default="2,3,4")
    ap.add_argument("--steps", type=int, default=5, help="timed rounds")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: the machine's cores)")
    a = ap.parse_args()
    import os
    torch.set_num_threads(a.threads or os.cpu_count() or 1)
    torch.manual_seed(0)
    model = small_resnet()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(a.batch, 3, 32, 32)
    y = torch.zeros(a.batch, dtype=torch.long)
    configs = [0] + [int(s) for s in a.segments.split(",") if s]
    loss_fn = nn.CrossEntropyLoss()

    def step(segments):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if segments:
            x.requires_grad_(True)  # checkpoint_sequential's reentrant form needs an input that requires grad
            out = checkpoint_sequential(model, segments, x)
        else:
            x.requires_grad_(False)
            out = model(x)
        loss_fn(out, y).backward()
        opt.step()
        return time.perf_counter() - t0

    times = {c: [] for c in configs}
    for r in range(a.steps + 1):
        for k in range(len(configs)):
            c = configs[(k + r) % len(configs)]
            t = step(c)
            if r > 0:
                times[c].append(t)
    base = statistics.median(times[0])
    rows = []
    for c in configs:
        med = statistics.median(times[c])
        rows.append({"segments": c, "step_s": round(med, 4), "cost": round(med / base - 1, 4),
                     "min_s": round(min(times[c]), 4), "max_s": round(max(times[c]), 4)})
        print(f"{'none' if c == 0 else c:>6}  step {med:.3f} s (median of {a.steps})  cost {100 * (med / base - 1):+.1f}%  "
              f"[{min(times[c]):.3f}-{max(times[c]):.3f} s]")
    print("RESULT " + json.dumps({"bench": "torch_checkpoint", "batch": a.batch, "threads": torch.get_num_threads(),
                                  "configs": rows}))


if __name__ == "__main__":
    main()

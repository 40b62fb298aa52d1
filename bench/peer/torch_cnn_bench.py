#!/usr/bin/python3
"""Peer for `kiln bench cnn`: PyTorch CPU images/s of the tutorial CNN.

The network is the guide's OptimizedCNN for 3x32x32 inputs: three stages of
Conv2d(3x3, padding 1) + ReLU + MaxPool2d(2) with 32, 64 and 128 channels
(32 -> 16 -> 8 -> 4), then Linear(2048, 512) + ReLU + Linear(512, 10).
Training steps are zero_grad(set_to_none) + forward + CrossEntropyLoss +
backward + Adam(lr 1e-3); inference steps are a forward under no_grad in
eval mode. Inputs are one fixed random batch (randn images, random labels).

Measurement: `--warmup` untimed steps once, then `--repeats` repeats of
`--steps` timed steps; images/s = batch * steps / wall seconds of a repeat.
One line per repeat, then `RESULT {json}` with the median, min and max.
`--steps 0` builds the model and the data and exits (a baseline for RSS).

Run with Debian's interpreter, which has torch:
  /usr/bin/python3 bench/peer/torch_cnn_bench.py --mode train --steps 5 --threads 2
Extra options: --checkpoint (torch.utils.checkpoint around each conv stage)
and --bf16 (CPU autocast to bfloat16), as in the reference measurements.
"""
import argparse
import json
import statistics
import time

import torch
from torch import nn
from torch.utils import checkpoint as torch_checkpoint


def conv_stage(c_in, c_out):
    return nn.Sequential(nn.Conv2d(c_in, c_out, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2))


class OptimizedCNN(nn.Module):
    def __init__(self, in_ch=3, side=32, use_checkpoint=False):
        super().__init__()
        self.use_checkpoint = use_checkpoint
        self.block1 = conv_stage(in_ch, 32)
        self.block2 = conv_stage(32, 64)
        self.block3 = conv_stage(64, 128)
        final_side = side // 8
        self.fc1 = nn.Linear(128 * final_side * final_side, 512)
        self.fc2 = nn.Linear(512, 10)

    def forward(self, x):
        recompute = self.use_checkpoint and self.training and torch.is_grad_enabled()
        for stage in (self.block1, self.block2, self.block3):
            # use_reentrant=False: the input batch does not require grad
            x = torch_checkpoint.checkpoint(stage, x, use_reentrant=False) if recompute else stage(x)
        x = torch.flatten(x, 1)
        x = torch.relu(self.fc1(x))
        return self.fc2(x)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["train", "infer"], default="train")
    p.add_argument("--threads", type=int, required=True,
                   help="torch.set_num_threads: kiln bench cnn passes Kiln's own thread count")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--checkpoint", action="store_true")
    p.add_argument("--bf16", action="store_true")
    return p.parse_args()


def make_step(args, model, x, y):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    cast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if args.bf16 else (
        lambda: torch.autocast("cpu", enabled=False))

    def train_step():
        opt.zero_grad(set_to_none=True)
        with cast():
            loss = criterion(model(x), y)
        loss.backward()
        opt.step()
        return loss

    def infer_step():
        with torch.no_grad(), cast():
            return model(x)

    if args.mode == "train":
        model.train()
        return train_step
    model.eval()
    return infer_step


def main():
    args = parse_args()
    # The same intra-op threads as Kiln's side (Debian's torch would
    # otherwise pick its own default).
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = OptimizedCNN(use_checkpoint=args.checkpoint)
    x = torch.randn(args.batch, 3, 32, 32)
    y = torch.randint(0, 10, (args.batch,))
    step = make_step(args, model, x, y)

    for _ in range(args.warmup):
        step()
    if args.steps == 0:
        print("RESULT {}", flush=True)
        return
    rates, ms_per_step = [], []
    for r in range(args.repeats):
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        elapsed = time.perf_counter() - start
        rates.append(args.batch * args.steps / elapsed)
        ms_per_step.append(1e3 * elapsed / args.steps)
        print(f"repeat {r}: {rates[-1]:.1f} img/s, {ms_per_step[-1]:.2f} ms/step", flush=True)
    result = {
        "mode": args.mode,
        "threads": torch.get_num_threads(),
        "batch": args.batch,
        "checkpoint": args.checkpoint,
        "bf16": args.bf16,
        "steps": args.steps,
        "img_s_median": statistics.median(rates),
        "img_s_min": min(rates),
        "img_s_max": max(rates),
        "ms_step_median": statistics.median(ms_per_step),
        "torch": torch.__version__,
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

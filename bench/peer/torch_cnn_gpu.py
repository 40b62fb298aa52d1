#!/usr/bin/python3
"""GPU peer for `kiln bench cnn --device cuda:N`: PyTorch images/s of the tutorial CNN on a GPU.

The network, batch, loss and optimizer are torch_cnn_bench.py's (3x32x32
inputs, batch 128, cross-entropy, Adam lr 1e-3); one fixed random batch
lives on the device. Each setup is timed as `--repeats` repeats of `--steps`
steps after `--warmup` untimed ones, with torch.cuda.synchronize() before
each clock read; images/s = batch * steps / seconds.

Setups, train and infer each:
  f32        NCHW, cuDNN autotuning off (PyTorch's default; cuDNN's own
             TF32 for convolutions stays at PyTorch's default, on).
  f32_tuned  channels_last and torch.backends.cudnn.benchmark = True.
  amp        f16 autocast + channels_last + cudnn.benchmark; training with
             GradScaler and the fused Adam (fused=True), PyTorch's fastest
             eager AMP step.
  f32_graph / amp_graph
             the whole step captured once as a CUDA graph and replayed
             (torch.cuda.graph): training with Adam(capturable=True); the
             AMP training graph uses a fixed loss scale of 2^16 with the
             unscale folded into the learning rate, since GradScaler's
             inf check reads back to the host and cannot be captured.
torch.compile is left out: its compile time (a minute or more) does not
fit a lease's minutes, and its CUDA-graph mode is what *_graph measures.

Prints one line per setup and then `RESULT {json}`:
  /usr/bin/python3 bench/peer/torch_cnn_gpu.py --device cuda:0
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_cnn_bench import OptimizedCNN  # noqa: E402  the same network as the CPU peer

LOSS_SCALE = 65536.0


def timed(step, args, batch):
    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    rates = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
        rates.append(batch * args.steps / (time.perf_counter() - t0))
    return statistics.median(rates), min(rates), max(rates)


def captured(fn):
    """fn warmed up on a side stream (as torch.cuda.graph asks), captured
    once, and the graph's replay returned."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def build(args, setup, mode):
    torch.manual_seed(0)
    dev = torch.device(args.device)
    torch.backends.cudnn.benchmark = setup != "f32"
    cl = setup != "f32"
    amp = setup.startswith("amp")
    model = OptimizedCNN().to(dev)
    x = torch.randn(args.batch, 3, 32, 32, device=dev)
    y = torch.randint(0, 10, (args.batch,), device=dev)
    if cl:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    crit = nn.CrossEntropyLoss()
    graph = setup.endswith("_graph")
    if mode == "infer":
        model.eval()

        def infer():
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16, enabled=amp):
                return model(x)

        return captured(infer) if graph else infer
    model.train()
    if not graph:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True) if amp else \
            torch.optim.Adam(model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cuda", enabled=amp)

        def train():
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
                loss = crit(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()

        return train
    # Whole-step capture: Adam's step count lives on the device.
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)
    scale = LOSS_SCALE if amp else 1.0

    def train_g():
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp, cache_enabled=False):
            loss = crit(model(x), y)
        (loss * scale).backward()
        if amp:
            for p in model.parameters():
                p.grad.mul_(1.0 / scale)
        opt.step()

    return captured(train_g)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--setups", default="f32,f32_tuned,amp,f32_graph,amp_graph")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch_cnn_gpu: no CUDA device visible to PyTorch; skipped", flush=True)
        sys.exit(77)
    out = {"device": torch.cuda.get_device_name(args.device), "torch": torch.__version__,
           "cudnn": torch.backends.cudnn.version(), "batch": args.batch}
    for mode in ("train", "infer"):
        for setup in args.setups.split(","):
            try:
                med, lo, hi = timed(build(args, setup, mode), args, args.batch)
            except Exception as e:  # a setup this PyTorch cannot run: say so, keep the rest
                print(f"{mode} {setup}: failed: {e}", flush=True)
                out[f"{mode}_{setup}_img_s"] = None
                continue
            out[f"{mode}_{setup}_img_s"] = med
            print(f"{mode:5s} {setup:10s} {med:12.0f} img/s  (min {lo:.0f}, max {hi:.0f})"
                  f"  {1e3 * args.batch / med:.3f} ms/step", flush=True)
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

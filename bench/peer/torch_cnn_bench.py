#!/usr/bin/python3
"""Peer for `kiln bench cnn`: PyTorch CPU images/s of the tutorial CNN.

The network is the guide's OptimizedCNN for 3x32x32 inputs: three stages of
Conv2d(3x3, padding 1) + ReLU + MaxPool2d(2) with 32, 64 and 128 channels
(32 -> 16 -> 8 -> 4), then Linear(2048, 512) + ReLU + Linear(512, 10).
Training steps are zero_grad(set_to_none) + forward + CrossEntropyLoss +
backward + Adam(lr 1e-3); inference steps are a forward in eval mode.
Inputs are one fixed random batch (randn images, random labels).

Setups (--setup), so that Kiln is held against PyTorch at its best and not
only at its plainest:
  eager  NCHW tensors; inference under no_grad (the default, PyTorch as
         most people run it).
  best   PyTorch's fastest CPU setup for the mode. Training: model and
         input in channels_last (oneDNN then keeps NHWC blocked layouts
         and skips reorders). Inference: channels_last, inference_mode,
         torch.jit.trace, then torch.jit.freeze (weights folded in as
         constants, conv + ReLU fused by the oneDNN graph passes).
--bf16 runs either setup under torch.autocast('cpu', dtype=torch.bfloat16);
for `best` inference the model is traced and frozen inside the autocast
region so that the casts are part of the frozen graph. bf16 is only timed
on CPUs with native bf16 arithmetic (AVX512_BF16 or AMX-BF16 in
/proc/cpuinfo's flags): elsewhere autocast emulates it, slower than f32,
and the comparison says nothing, so the script says why and exits 3
(--allow-emulated-bf16 times it anyway, for testing the path).

Measurement: `--warmup` untimed steps once, then `--repeats` repeats of
`--steps` timed steps; images/s = batch * steps / wall seconds of a repeat.
One line per repeat, then `RESULT {json}` with the median, min and max.
`--steps 0` builds the model and the data and exits (a baseline for RSS).

Run with Debian's interpreter, which has torch:
  /usr/bin/python3 bench/peer/torch_cnn_bench.py --mode train --steps 5 --threads 2
  /usr/bin/python3 bench/peer/torch_cnn_bench.py --mode infer --setup best --threads 2
Extra option: --checkpoint (torch.utils.checkpoint around each conv stage).
"""
import argparse
import json
import statistics
import sys
import time

import torch
from torch import nn
from torch.utils import checkpoint as torch_checkpoint

EXIT_NO_NATIVE_BF16 = 3


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


def native_bf16_flags():
    """The native-bf16 flags of this CPU (a list, empty when none or unknown)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return [f for f in ("avx512_bf16", "amx_bf16") if f in flags]
    except OSError:
        pass
    return []


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["train", "infer"], default="train")
    p.add_argument("--threads", type=int, required=True,
                   help="torch.set_num_threads: kiln bench cnn passes Kiln's own thread count")
    p.add_argument("--setup", choices=["eager", "best"], default="eager")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--checkpoint", action="store_true")
    p.add_argument("--bf16", action="store_true", help="torch.autocast('cpu', dtype=torch.bfloat16)")
    p.add_argument("--allow-emulated-bf16", action="store_true",
                   help="time --bf16 even where the CPU has no native bf16")
    args = p.parse_args()
    if args.checkpoint and args.setup == "best":
        p.error("--checkpoint is an eager-mode measurement; drop --setup best")
    return args


def autocast_ctx(bf16):
    if bf16:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def make_train_step(args, model, x, y):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    model.train()

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast_ctx(args.bf16):
            loss = criterion(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def make_infer_step(args, model, x):
    model.eval()
    if args.setup == "eager":
        def eager_step():
            with torch.no_grad(), autocast_ctx(args.bf16):
                return model(x)

        return eager_step
    # Trace and freeze under the same autocast state the steps run in; the
    # frozen module's first calls run the profiling executor's passes, which
    # the warm-up absorbs. Under autocast the trace checker's second run
    # finds autocast's cached bf16 weight copies where the first found
    # fresh casts and reports "graphs differed", so bf16 skips the check
    # (the frozen graph is the same either way).
    with torch.inference_mode(), autocast_ctx(args.bf16):
        frozen = torch.jit.freeze(torch.jit.trace(model, x, check_trace=not args.bf16))

    def frozen_step():
        with torch.inference_mode(), autocast_ctx(args.bf16):
            return frozen(x)

    return frozen_step


def main():
    args = parse_args()
    native = native_bf16_flags()
    if args.bf16 and not native and not args.allow_emulated_bf16:
        print("this CPU has no native bf16 (neither avx512_bf16 nor amx_bf16 in /proc/cpuinfo's flags): "
              "autocast would emulate bf16, slower than f32; skipped (--allow-emulated-bf16 times it anyway)",
              flush=True)
        sys.exit(EXIT_NO_NATIVE_BF16)
    # The same intra-op threads as Kiln's side (Debian's torch would
    # otherwise pick its own default).
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = OptimizedCNN(use_checkpoint=args.checkpoint)
    x = torch.randn(args.batch, 3, 32, 32)
    y = torch.randint(0, 10, (args.batch,))
    if args.setup == "best":
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    step = make_train_step(args, model, x, y) if args.mode == "train" else make_infer_step(args, model, x)

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
        "setup": args.setup,
        "channels_last": args.setup == "best",
        "frozen": args.setup == "best" and args.mode == "infer",
        "threads": torch.get_num_threads(),
        "batch": args.batch,
        "checkpoint": args.checkpoint,
        "bf16": args.bf16,
        "native_bf16": native,
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

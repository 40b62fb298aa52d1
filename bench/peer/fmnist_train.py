#!/usr/bin/python3
"""Peer for `kiln bench main-job`: Kiln's main job, `kiln train` with its
defaults, as the same recipe in PyTorch on the CPU.

What `kiln train` does with no arguments (tools/train_args.c, tools/train.c,
tools/train_data.c, tools/train_window.c, models/tutorial_cnn_28x28x1.txt),
and how this script matches it:
  model     the tutorial CNN for 1x28x28: three Conv2d(3x3, padding 1) + ReLU
            + MaxPool2d(2) stages, 32/64/128 channels (28 -> 14 -> 7 -> 3),
            flatten, Linear(1152, 512) + ReLU, Linear(512, 10). Same.
  data      Fashion-MNIST from the Debian package dataset-fashion-mnist
            (/usr/share/datasets/fashion-mnist, gzipped IDX or plain), pixels
            / 255 then (x - 0.2860) / 0.3530. Same; the whole dataset is
            normalised once up front (Kiln's loader does it per batch).
  batches   128, reshuffled every epoch, the last partial batch kept (469
            steps an epoch). Same size and count; the shuffle order differs
            (each side has its own generator, both seeded with --seed, 0
            by default; kiln bench main-job passes round r's seed r).
  optimizer Adam (betas 0.9/0.999, eps 1e-8, no weight decay) under a
            one-cycle schedule over all the run's steps: warm-up over 30% of
            them from 3e-3/25 to 3e-3, cosine down to 3e-3/25/1e4, stepped
            after every batch. Same: OneCycleLR(max_lr=3e-3, pct_start=0.3,
            div_factor=25, final_div_factor=1e4, anneal cos) with momentum
            cycling off (Kiln does not cycle Adam's beta1).
  loss      cross-entropy with label smoothing 0.1. Same.
  epochs    3. Same default here (the reference script's default was 2).
  eval      the 10,000 test images after every epoch, timed apart from the
            training loop (Kiln's epoch records' train_s is the loop alone).
            Same; this side evaluates in chunks of 1000, Kiln in batches.
  --limit N the first N training AND test images, as kiln train's --limit
            (the reference script limited the training images only).
  init      PyTorch's default initialisation; Kiln's mirrors it, but its
            random numbers differ, so accuracies differ by seed noise.
`--recipe tutorial` keeps the original tutorial's recipe (Adam 1e-3,
constant, no smoothing) for comparison with older figures.

Prints one line per epoch (training-loop seconds, images/s, mean loss, test
accuracy, evaluation seconds), then `RESULT {json}` with every epoch.

  /usr/bin/python3 bench/peer/fmnist_train.py --threads 2            # 3 epochs, onecycle
  /usr/bin/python3 bench/peer/fmnist_train.py --threads 2 --limit 1024 --epochs 1
On a GPU (the peer of `kiln train --device cuda`; data and model on the device,
one loss.item() per step as here on the CPU):
  python3 bench/peer/fmnist_train.py --device cuda:0 --amp f16
"""
import argparse
import contextlib
import gzip
import json
import os
import time

import numpy as np
import torch
from torch import nn

DATA = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530


def read_idx(path):
    """An unsigned-byte IDX file (gzipped or not) as a numpy array."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise SystemExit(f"{path}: not an unsigned-byte IDX file (a damaged download? reinstall "
                         "dataset-fashion-mnist)")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def split_file(data, prefix, kind):
    base = os.path.join(data, f"{prefix}-{kind}-idx{3 if kind == 'images' else 1}-ubyte")
    if os.path.exists(base + ".gz"):
        return base + ".gz"
    if os.path.exists(base):
        return base
    raise SystemExit(f"{base}(.gz) not found: install the Debian package dataset-fashion-mnist, "
                     "or pass --data DIR")


def load_split(data, prefix, limit):
    x = read_idx(split_file(data, prefix, "images"))
    y = read_idx(split_file(data, prefix, "labels"))
    if limit:
        x, y = x[:limit], y[:limit]
    x = (x.astype(np.float32) / 255.0 - MEAN) / STD
    return torch.from_numpy(x).unsqueeze(1).contiguous(), torch.from_numpy(y.astype(np.int64))


class TutorialCNN(nn.Module):
    def __init__(self):
        super().__init__()
        stages = []
        for c_in, c_out in ((1, 32), (32, 64), (64, 128)):
            stages += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
        self.features = nn.Sequential(*stages)
        self.fc1 = nn.Linear(128 * 3 * 3, 512)
        self.fc2 = nn.Linear(512, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(torch.flatten(self.features(x), 1))))


def make_recipe(args, model, steps):
    """Optimizer, per-step scheduler (or None) and loss of --recipe."""
    if args.recipe == "tutorial":
        return torch.optim.Adam(model.parameters(), lr=1e-3), None, nn.CrossEntropyLoss()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps, pct_start=0.3,
                                                div_factor=25.0, final_div_factor=1e4, anneal_strategy="cos",
                                                cycle_momentum=False)
    return opt, sched, nn.CrossEntropyLoss(label_smoothing=0.1)


def evaluate(model, x, y):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, x.shape[0], 1000):
            correct += (model(x[i: i + 1000]).argmax(1) == y[i: i + 1000]).sum().item()
    return correct / x.shape[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (kiln bench main-job passes Kiln's)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--limit", type=int, default=0, help="the first N training and test images (0: all)")
    ap.add_argument("--recipe", choices=["onecycle", "tutorial"], default="onecycle")
    ap.add_argument("--seed", type=int, default=0,
                    help="initialisation and shuffling (kiln bench main-job passes round r's, as kiln train --seed)")
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N] (the GPU peer of kiln train --device cuda)")
    ap.add_argument("--amp", choices=["off", "f16"], default="off",
                    help="f16: autocast + GradScaler (kiln train --amp auto on a GPU with tensor cores)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    amp = args.amp == "f16"
    if amp and dev.type != "cuda":
        ap.error("--amp f16 needs --device cuda")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    t0 = time.perf_counter()
    xtr, ytr = load_split(args.data, "train", args.limit)
    xte, yte = load_split(args.data, "t10k", args.limit)
    print(f"loaded train {tuple(xtr.shape)} test {tuple(xte.shape)} in {time.perf_counter() - t0:.2f}s", flush=True)

    xtr, ytr, xte, yte = xtr.to(dev), ytr.to(dev), xte.to(dev), yte.to(dev)
    model = TutorialCNN().to(dev)
    scaler = torch.amp.GradScaler("cuda", enabled=amp) if dev.type == "cuda" else None
    n = xtr.shape[0]
    steps_per_epoch = (n + args.batch - 1) // args.batch
    opt, sched, loss_fn = make_recipe(args, model, args.epochs * steps_per_epoch)
    gen = torch.Generator().manual_seed(args.seed)
    epochs = []
    for ep in range(1, args.epochs + 1):
        model.train()
        order = torch.randperm(n, generator=gen).to(dev)
        t0 = time.perf_counter()
        total = 0.0
        for i in range(0, n, args.batch):
            idx = order[i: i + args.batch]
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.float16) if amp else contextlib.nullcontext():
                loss = loss_fn(model(xtr[idx]), ytr[idx])
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            if sched is not None:
                sched.step()
            total += loss.item()
        train_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        acc = evaluate(model, xte, yte)
        eval_s = time.perf_counter() - t1
        rec = {"epoch": ep, "train_s": train_s, "img_s": n / train_s, "loss": total / steps_per_epoch,
               "test_acc": acc, "eval_s": eval_s}
        epochs.append(rec)
        print(f"epoch {ep}: train {train_s:.1f}s ({n / train_s:.0f} img/s), loss {rec['loss']:.4f}, "
              f"test acc {acc * 100:.2f}% (eval {eval_s:.1f}s)", flush=True)
    print("RESULT " + json.dumps({"threads": torch.get_num_threads(), "batch": args.batch, "recipe": args.recipe,
                                  "n_train": n, "n_test": xte.shape[0], "epochs": epochs,
                                  "device": str(dev), "amp": args.amp, "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()

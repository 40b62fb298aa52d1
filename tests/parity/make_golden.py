#!/usr/bin/python3
"""Make the PyTorch parity golden files tests/parity/golden/*.bin.

Usage (Debian's python3-torch, a test-time tool only; the test itself reads
the committed files and never needs torch):
    /usr/bin/python3 tests/parity/make_golden.py

Two fixed-seed networks:
  tutorial_cnn  the OptimizedCNN of the PyTorch CUDA optimisation guide on
                1x28x28 inputs (tests/nn/tutorial_cnn.c), batch 4
  bn_resnet     conv-bn-relu, two CIFAR BasicBlocks (identity and projection
                shortcuts), adaptive avg pool, flatten, linear; 3x12x12, batch 4

Parameters come from PyTorch's default initialisation (torch.manual_seed),
rounded to bfloat16 values so that they are stored in 2 bytes each (the
networks are then exactly the same in f32 and f64 on both sides). Each file
holds, as named tensors:
  param.<key>        the state dict (parameters and buffers) to load
  input, target      the batch (f32) and its class indices (i64)
  logits, loss       forward in train mode, cross-entropy (mean)
  grad.<name>        every parameter's gradient
  after.<key>        the buffers (BatchNorm running statistics) after that forward
  sgd.<key>          parameters and buffers after three SGD steps (lr 0.05,
                     momentum 0.9, nesterov, weight decay 1e-4) in float64
  adam.<key>         the same after three Adam steps (lr 1e-3) in float64
The forward/backward values are computed in float64 from the stored
parameters and stored as f32 (Kiln runs them in f32 and must match to a
normwise relative error of 1e-5); the optimizer results are stored in f64
(Kiln runs in f64, 1e-10). Large f64 results (more than 32768 elements) are
stored sampled: every 97th element of the flattened tensor.

File format (little-endian): the magic b"KILNGLD1", a u32 count, then per
tensor: u16 name length, the name (UTF-8, no NUL), u8 dtype (0 f32, 1 f64,
2 i64, 3 bf16 as the high 16 bits of an f32), u8 ndim, i64 dims[ndim] (the
full tensor's shape), i64 sample stride (1: every element), then
ceil(numel / stride) elements."""

import math
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE_ABOVE = 32768
SAMPLE_STRIDE = 97
DT_CODE = {torch.float32: 0, torch.float64: 1, torch.int64: 2, torch.bfloat16: 3}


class Writer:
    def __init__(self):
        self.items = []

    def add(self, name, t, dtype=None, sample=False):
        t = t.detach().cpu()
        if dtype is not None:
            t = t.to(dtype)
        t = t.contiguous()
        stride = SAMPLE_STRIDE if sample and t.numel() > SAMPLE_ABOVE else 1
        flat = t.reshape(-1)[::stride].contiguous()
        if t.dtype == torch.bfloat16:
            raw = (flat.view(torch.int16).numpy().astype("<i2")).tobytes()
        else:
            raw = flat.numpy().astype(flat.numpy().dtype.newbyteorder("<")).tobytes()
        nb = name.encode()
        head = struct.pack("<H", len(nb)) + nb + struct.pack("<BB", DT_CODE[t.dtype], t.dim())
        head += struct.pack("<%dq" % t.dim(), *t.shape) + struct.pack("<q", stride)
        self.items.append(head + raw)

    def save(self, path):
        with open(path, "wb") as f:
            f.write(b"KILNGLD1" + struct.pack("<I", len(self.items)))
            for it in self.items:
                f.write(it)
        print("wrote %s (%d tensors, %d bytes)" % (path, len(self.items), os.path.getsize(path)))


class OptimizedCNN(nn.Module):
    """The guide's OptimizedCNN with 1x28x28 inputs (28 -> 14 -> 7 -> 3)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3, padding=1)
        self.conv3 = nn.Conv2d(64, 128, kernel_size=3, padding=1)
        self.pool = nn.MaxPool2d(2, 2)
        self.fc1 = nn.Linear(128 * 3 * 3, 512)
        self.fc2 = nn.Linear(512, 10)
        self.relu = nn.ReLU()

    def forward(self, x):
        x = self.pool(self.relu(self.conv1(x)))
        x = self.pool(self.relu(self.conv2(x)))
        x = self.pool(self.relu(self.conv3(x)))
        x = x.view(-1, 128 * 3 * 3)
        x = self.relu(self.fc1(x))
        return self.fc2(x)


class BasicBlock(nn.Module):
    """kiln_nn_basic_block: PyTorch's CIFAR BasicBlock."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


def bn_resnet():
    return nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                         BasicBlock(8, 8, 1), BasicBlock(8, 16, 2), nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(),
                         nn.Linear(16, 10))


def round_params_bf16(model):
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
        if isinstance(model, nn.Sequential):
            # Non-trivial BatchNorm affine parameters (not just 1 and 0).
            for m in model.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.weight.copy_((1 + 0.2 * torch.randn_like(m.weight)).to(torch.bfloat16).float())
                    m.bias.copy_((0.1 * torch.randn_like(m.bias)).to(torch.bfloat16).float())


def fresh(build, state):
    m = build().double()
    m.load_state_dict({k: v.double() if v.is_floating_point() else v for k, v in state.items()})
    m.train()
    return m


def run_optimizer(build, state, x, y, make_opt):
    m = fresh(build, state)
    opt = make_opt(m.parameters())
    for _ in range(3):
        opt.zero_grad()
        F.cross_entropy(m(x), y).backward()
        opt.step()
    return m.state_dict()


# A fully connected layer followed by ReLU has few units per sample, so a
# pre-activation within rounding of zero decides a whole unit's gradient:
# an f32 kernel that sums in another order (oneDNN's, cuBLAS's) may flip its
# sign and move the layer's gradients by percents. The input batch is
# redrawn until every such pre-activation is at least this fraction of the
# layer's largest one away from zero (f32 sums of these sizes are good to
# about 1e-6 of it). Convolutions have thousands of units per channel, where
# a flip moves a gradient by far less than the tolerance.
RELU_MARGIN = 1e-4


def fc_relu_margin(build, state, x):
    """min |v| / max |v| over the inputs of ReLU that come from nn.Linear."""
    rng = torch.get_rng_state()  # building the model draws; the batch must not see it
    m = fresh(build, state)
    torch.set_rng_state(rng)
    ratios = []
    for mod in m.modules():
        if isinstance(mod, nn.Linear):
            mod.register_forward_hook(lambda _m, _i, out: ratios.append(
                (out.abs().min() / out.abs().max()).item()))
    with torch.no_grad():
        m(x.double())
    # The last Linear gives the logits (no ReLU after it).
    return min(ratios[:-1]) if len(ratios) > 1 else 1.0


def make(name, build, in_shape, seed):
    torch.manual_seed(seed)
    model = build()
    round_params_bf16(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for attempt in range(100):
        x = torch.randn(4, *in_shape)
        if fc_relu_margin(build, state, x) >= RELU_MARGIN:
            break
    else:
        raise SystemExit("%s: no input batch with a ReLU margin of %g in 100 draws" % (name, RELU_MARGIN))
    y = torch.randint(0, 10, (4,))
    w = Writer()
    for k, v in state.items():
        w.add("param." + k, v, torch.bfloat16 if v.is_floating_point() else None)
    w.add("input", x, torch.float32)
    w.add("target", y)

    # Forward and backward in float64 from the same values, stored as f32.
    xd = x.double()
    m = fresh(build, state)
    logits = m(xd)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    w.add("logits", logits, torch.float32)
    w.add("loss", loss, torch.float32)
    for k, p in m.named_parameters():
        w.add("grad." + k, p.grad, torch.float32)
    for k, b in m.named_buffers():
        w.add("after." + k, b, torch.float32 if b.is_floating_point() else None)

    sgd = run_optimizer(build, state, xd, y,
                        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4))
    adam = run_optimizer(build, state, xd, y, lambda ps: torch.optim.Adam(ps, lr=1e-3))
    for prefix, sd in (("sgd.", sgd), ("adam.", adam)):
        for k, v in sd.items():
            w.add(prefix + k, v, sample=True)
    print("%s: loss %.6f, %d parameters, input draw %d" % (name, loss.item(),
                                                         sum(p.numel() for p in model.parameters()), attempt))
    w.save(os.path.join(HERE, "golden", name + ".bin"))


def main():
    torch.set_num_threads(1)
    os.makedirs(os.path.join(HERE, "golden"), exist_ok=True)
    make("tutorial_cnn", OptimizedCNN, (1, 28, 28), 20240601)
    make("bn_resnet", bn_resnet, (3, 12, 12), 20240602)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Kiln's hostile-input suite (issue 20): every CLI command that reads a
user file -- kiln train (--model, --data, --resume), kiln eval, kiln export,
kiln report -- runs on generated bad inputs:

  * truncated at every section boundary: IDX header fields and data,
    safetensors' 8-byte length, JSON header and data, a model spec mid-line,
    metrics.jsonl mid-record;
  * wrong types: a directory, a FIFO, /dev/zero, a symbolic link loop, no
    read permission (as root, where permission bits do not stop reads, the
    case runs as user nobody (uid 65534, set before exec), or is skipped visibly);
  * absurd sizes and counts, non-finite values, mismatched models.

For each case: the exit code is the expected one (1 or 2 for a refusal, never
a signal, never 0 for bad input), stderr names the file or flag, there is no
sanitizer report, peak resident memory stays under RSS_LIMIT_MIB, and the
command ends within TIMEOUT_S. One line per case; the exit status is 1 when
any case fails.

The inputs are built here from small real files: a 64-image IDX pair cut
from the Fashion-MNIST package and two tiny training runs (a checkpoint and
metrics.jsonl each).

usage: hostile_cli.py KILN_BINARY [CASE_SUBSTRING]
"""
import gzip
import json
import os
import re
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time

TIMEOUT_S = float(os.environ.get("KILN_HOSTILE_TIMEOUT", "20"))
RSS_LIMIT_MIB = 512
DATASET = "/usr/share/datasets/fashion-mnist"
SANITIZER = re.compile(r"AddressSanitizer|LeakSanitizer|runtime error:|UndefinedBehaviorSanitizer|ThreadSanitizer")
N_SAMPLES = 64
INFO_LINE = re.compile(r"^kiln train: .* parameters\) on |^kiln train: mixed precision|^epoch \d+/\d+ step ")

KILN = os.path.abspath(sys.argv[1])
ONLY = sys.argv[2] if len(sys.argv) > 2 else ""
WORK = tempfile.mkdtemp(prefix="kiln_hostile.")
os.chmod(WORK, 0o755)  # the permission cases run as nobody, who must reach the files
SHARED = os.path.join(WORK, "shared")  # world-writable: outputs of the cases run as nobody
os.mkdir(SHARED)
os.chmod(SHARED, 0o1777)

results = []  # (name, ok, line)


# ---- Running one command -----------------------------------------------------------------


def run(argv, timeout=TIMEOUT_S, as_nobody=False):
    """Run argv; returns (rc, stdout, stderr, wall_s, maxrss_mib, timed_out).
    rc < 0 is a signal. The peak resident set comes from wait4's rusage of
    this child alone (ASan's reserved shadow is virtual and not counted)."""
    # As nobody (uid/gid 65534, set by Popen in the child): numeric ids,
    # no user-database lookup (setpriv loaded the NSS modules that
    # /etc/nsswitch.conf names, which the package check counted as used).
    drop = {"user": 65534, "group": 65534, "extra_groups": []} if as_nobody else {}
    out_path = os.path.join(WORK, "last.out")
    err_path = os.path.join(WORK, "last.err")
    t0 = time.monotonic()
    with open(out_path, "wb") as fo, open(err_path, "wb") as fe:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fo, stderr=fe, cwd=WORK,
                             start_new_session=True, **drop)
    fired = []

    def kill():
        fired.append(True)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    timer = threading.Timer(timeout, kill)
    timer.start()
    _, status, usage = os.wait4(p.pid, 0)
    timer.cancel()
    p.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    wall = time.monotonic() - t0
    with open(out_path, "rb") as f:
        out = f.read().decode("utf-8", "replace")
    with open(err_path, "rb") as f:
        err = f.read().decode("utf-8", "replace")
    return p.returncode, out, err, wall, usage.ru_maxrss / 1024.0, bool(fired)


def case(name, argv, rc=(1, 2), names=(), owner="", check=None, as_nobody=False):
    """One case. rc: the exit codes accepted; names: strings stderr must
    hold (the file or the flag); check(out, err): a further problem or None;
    owner: whose code the case tests (shown on failure)."""
    if ONLY and ONLY not in name:
        return
    got, out, err, wall, rss, timed_out = run(argv, as_nobody=as_nobody)
    problems = []
    if timed_out:
        problems.append("still running after %g s (killed): a hang or runaway work" % TIMEOUT_S)
    elif got < 0:
        problems.append("killed by signal %d" % -got)
    elif got not in rc:
        problems.append("exit %d, expected %s" % (got, " or ".join(str(c) for c in rc)))
    # The file or flag must be named where the refusal is, not merely in the
    # start-up banner ("kiln train: SPEC (N parameters) on cpu ...") or a
    # progress line.
    told = "\n".join(l for l in err.splitlines() if not INFO_LINE.search(l))
    for n in names if got != 0 else ():  # a case that may end well (rc 0) names nothing then
        if n not in told:
            problems.append("stderr does not name %r" % n)
    m = SANITIZER.search(err)
    if m:
        problems.append("sanitizer report (%s)" % m.group(0))
    if rss > RSS_LIMIT_MIB:
        problems.append("peak resident memory %.0f MiB > %d MiB" % (rss, RSS_LIMIT_MIB))
    if check and not timed_out:
        extra = check(out, err)
        if extra:
            problems.append(extra)
    stats = "exit %s, %.2f s, %.0f MiB" % (got, wall, rss)
    if problems:
        line = "FAIL %s [%s]: %s (%s)" % (name, owner or "-", "; ".join(problems), stats)
        tail = (err.strip().splitlines() or ["(empty)"])[-4:]
        line += "\n       command: %s\n       stderr: %s" % (" ".join(argv), "\n               ".join(tail))
    else:
        lines = err.splitlines()
        first = next((l for l in lines if any(n in l for n in names)), next(iter(lines), ""))
        line = "ok   %s (%s) %s" % (name, stats, first[:150])
    print(line, flush=True)
    results.append((name, not problems, line))


def skip(name, why):
    if ONLY and ONLY not in name:
        return
    print("skip %s: %s" % (name, why), flush=True)


def no_long_number(out, err):
    """A number printed from an absurd value must not run to 300 digits."""
    m = re.search(r"[0-9]{40,}", out + err)
    return "a %d-digit number in the output" % len(m.group(0)) if m else None


def wrote(out, err):
    return None if "wrote" in out else "no 'wrote' line on stdout"


# ---- Building the inputs -----------------------------------------------------------------


def path(*parts):
    return os.path.join(WORK, *parts)


def write(p, data, mode=0o644):
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "wb") as f:
        f.write(data)
    os.chmod(p, mode)
    return p


def read(p):
    with open(p, "rb") as f:
        return f.read()


def idx_prefix(name, n_bytes):
    """The first n_bytes of the decoded IDX file `name` of the package."""
    for suffix, opener in ((".gz", gzip.open), ("", open)):
        p = os.path.join(DATASET, name + suffix)
        if os.path.exists(p):
            with opener(p, "rb") as f:
                return f.read(n_bytes)
    raise SystemExit("FAILED: %s not found in %s (Debian package dataset-fashion-mnist; scripts/setup.sh "
                     "installs it)" % (name, DATASET))


def small_split(prefix, n):
    """A real IDX pair of n samples: header with count n, then the data."""
    im = idx_prefix(prefix + "-images-idx3-ubyte", 16 + n * 784)
    lb = idx_prefix(prefix + "-labels-idx1-ubyte", 8 + n)
    im = im[:4] + struct.pack(">I", n) + im[8:]
    lb = lb[:4] + struct.pack(">I", n) + lb[8:]
    return im, lb


IMAGES = {"train": "train-images-idx3-ubyte", "test": "t10k-images-idx3-ubyte"}
LABELS = {"train": "train-labels-idx1-ubyte", "test": "t10k-labels-idx1-ubyte"}


def data_dir(name, replace=None):
    """A copy of the small dataset, with files replaced: {file name: bytes,
    or a callable that makes the entry at the path}."""
    d = path("data", name)
    os.makedirs(d)
    for split in ("train", "test"):
        for f in (IMAGES[split], LABELS[split]):
            shutil.copy(path("data", "good", f), os.path.join(d, f))
    for f, content in (replace or {}).items():
        p = os.path.join(d, f)
        for q in (p, p[:-3] if p.endswith(".gz") else p + ".gz"):
            if os.path.lexists(q):
                os.unlink(q)
        if callable(content):
            content(p)
        else:
            write(p, content)
    return d


def safetensors_parts(p):
    b = read(p)
    n = struct.unpack("<Q", b[:8])[0]
    return b, n, json.loads(b[8:8 + n])


def safetensors_with(header, data):
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def checkpoint_with_meta(src, **meta):
    b, n, h = safetensors_parts(src)
    h["__metadata__"].update(meta)
    return safetensors_with(h, b[8 + n:])


def checkpoint_nan(src):
    """Every F32 weight of the model (not the optimizer state) set to NaN."""
    b, n, h = safetensors_parts(src)
    data = bytearray(b[8 + n:])
    for k, v in h.items():
        if k != "__metadata__" and not k.startswith("optimizer.") and v["dtype"] == "F32":
            lo, hi = v["data_offsets"]
            data[lo:hi] = struct.pack("<f", float("nan")) * ((hi - lo) // 4)
    return b[:8 + n] + bytes(data)


def fifo(p):
    os.mkfifo(p)


def directory(p):
    os.mkdir(p)


def devzero(p):
    os.symlink("/dev/zero", p)


def loop(p):
    os.symlink(os.path.basename(p), p)


def locked_dir(p):
    os.mkdir(p)
    os.chmod(p, 0)


WRONG_TYPES = (("a directory", directory), ("a FIFO", fifo), ("/dev/zero", devzero),
               ("a symlink loop", loop))


def setup():
    im, lb = small_split("train", N_SAMPLES)
    write(path("data", "good", IMAGES["train"]), im)
    write(path("data", "good", LABELS["train"]), lb)
    im, lb = small_split("t10k", N_SAMPLES)
    write(path("data", "good", IMAGES["test"]), im)
    write(path("data", "good", LABELS["test"]), lb)
    write(path("tiny.txt"), b"# 7,850 parameters\nflatten\nlinear 10\n")
    write(path("tiny2.txt"), b"flatten\nlinear 16\nrelu\nlinear 10\n")
    for name, spec in (("base", "tiny.txt"), ("other", "tiny2.txt")):
        rc, out, err, _, _, _ = run(train_argv(name, spec=path(spec), max_steps=2))
        ck = path("runs", name, "checkpoint.safetensors")
        if rc != 0 or not os.path.exists(ck):
            raise SystemExit("FAILED: the set-up run %s did not leave a checkpoint (exit %d):\n%s" % (name, rc, err))


def train_argv(out, spec=None, data=None, resume=None, max_steps=None, extra=()):
    """kiln train on the small dataset; the tiny model unless resuming (the
    checkpoint's spec) or told otherwise."""
    if spec is None and resume is None:
        spec = path("tiny.txt")
    argv = [KILN, "train", "--data", data or path("data", "good"), "--batch", "16", "--epochs", "2",
            "--schedule", "constant", "--workers", "0", "--log-every", "1",
            "--out", out if os.path.isabs(out) else path("runs", out)]
    if spec:
        argv += ["--model", spec]
    if resume:
        argv += ["--resume", resume]
    if max_steps:
        argv += ["--max-steps", str(max_steps)]
    return argv + list(extra)


def eval_argv(ck, spec=None, data=None, extra=()):
    argv = [KILN, "eval", "--checkpoint", ck, "--data", data or path("data", "good")]
    return argv + (["--model", spec] if spec else []) + list(extra)


def export_argv(ck, out, spec=None):
    return [KILN, "export", "--checkpoint", ck, "--out", path("exports", out)] + (["--model", spec] if spec else [])


# ---- The cases -----------------------------------------------------------------------------


def idx_cases():
    good = path("data", "good")
    im, lb = read(os.path.join(good, IMAGES["train"])), read(os.path.join(good, LABELS["train"]))
    # Truncated at every header field boundary, inside the data, one byte short.
    for at in (0, 2, 4, 8, 12, 16, 16 + 784 * 10 + 100, len(im) - 1):
        d = data_dir("im_cut%d" % at, {IMAGES["train"]: im[:at]})
        case("train --data: train images cut at byte %d" % at, train_argv("cut_im%d" % at, data=d),
             names=[IMAGES["train"]], owner="H3 data")
    for at in (0, 4, 8, 8 + 10, len(lb) - 1):
        d = data_dir("lb_cut%d" % at, {LABELS["train"]: lb[:at]})
        case("train --data: train labels cut at byte %d" % at, train_argv("cut_lb%d" % at, data=d),
             names=[LABELS["train"]], owner="H3 data")
    tim = read(os.path.join(good, IMAGES["test"]))
    for at in (8, 16, len(tim) - 1):
        d = data_dir("tim_cut%d" % at, {IMAGES["test"]: tim[:at]})
        case("eval --data: test images cut at byte %d" % at,
             eval_argv(path("runs", "base", "checkpoint.safetensors"), data=d), names=[IMAGES["test"]],
             owner="H3 data")
    # A gzip stream cut in the middle.
    gz = gzip.compress(im)
    d = data_dir("gz_cut", {IMAGES["train"] + ".gz": gz[:len(gz) // 2]})
    case("train --data: train images .gz cut mid-stream", train_argv("gz_cut", data=d),
         names=[IMAGES["train"] + ".gz"], owner="H3 data")
    # Absurd counts and sizes in the headers.
    big = struct.pack(">I", 2**31 - 1)
    for field, at in (("image count", 4), ("rows", 8), ("columns", 12)):
        d = data_dir("im_" + field.replace(" ", "_"), {IMAGES["train"]: im[:at] + big + im[at + 4:]})
        case("train --data: images header %s 2^31-1" % field, train_argv("big_" + field[:3], data=d),
             names=[IMAGES["train"]], owner="H3 data")
    d = data_dir("lb_count", {LABELS["train"]: lb[:4] + big + lb[8:]})
    case("train --data: labels count 2^31-1", train_argv("big_lb", data=d), names=[LABELS["train"]],
         owner="H3 data")
    d = data_dir("magic", {IMAGES["train"]: b"\x00\x00\x08\x01" + im[4:]})
    case("train --data: images file with the labels' magic", train_argv("magic", data=d),
         names=[IMAGES["train"]], owner="H3 data")
    # A decompression bomb: a header that announces 700000 images (549 MB) of
    # zeros in 0.5 MB of gzip, against 64 labels. The headers alone disagree.
    # gzip members concatenate into one stream (as `cat a.gz b.gz`): the
    # header's member, then one 1 MiB member of zeros repeated, compressed once.
    n = 700000
    zeros = gzip.compress(bytes(1 << 20), compresslevel=9)
    bomb = gzip.compress(b"\x00\x00\x08\x03" + struct.pack(">III", n, 28, 28)) + zeros * (n * 784 >> 20)
    d = data_dir("bomb", {IMAGES["train"] + ".gz": bomb})
    case("train --data: gzip bomb (700000 images announced, 64 labels)", train_argv("bomb", data=d),
         names=[IMAGES["train"]], owner="H3 data")
    # Train and test images of different sizes (the model's input comes from train).
    tim32 = tim[:8] + struct.pack(">II", 32, 32) + bytes(N_SAMPLES * 32 * 32)
    d = data_dir("test32", {IMAGES["test"]: tim32})
    case("train --data: test images 32x32, train 28x28", train_argv("test32", data=d, spec=path("tiny.txt")),
         names=[IMAGES["test"]], owner="H1 (split shape mismatch)")
    # Wrong types, as the data directory and as a file in it.
    for what, make in WRONG_TYPES:
        tag = what.replace(" ", "_").replace("/", "")
        d = data_dir("type_" + tag, {IMAGES["train"]: make})
        case("train --data: train images file is %s" % what, train_argv("type_" + tag, data=d),
             names=[IMAGES["train"]], owner="H3 data")
    p = path("data", "not_a_dir")
    write(p, b"x")
    case("train --data: a regular file", train_argv("data_file", data=p), names=[p], owner="H3 data")
    for what, make in WRONG_TYPES[1:]:
        p = path("data", "as_" + what.replace(" ", "_").replace("/", ""))
        make(p)
        case("eval --data: %s as the directory" % what,
             eval_argv(path("runs", "base", "checkpoint.safetensors"), data=p), names=[p], owner="H3 data")
    d = data_dir("locked")
    os.chmod(d, 0)
    permission_case("eval --data: directory without permission",
                    eval_argv(path("runs", "base", "checkpoint.safetensors"), data=d), [d, "Permission denied"],
                    "H3 data")
    # Test images of another size than the checkpoint's model was trained on:
    # refused before the model is built, naming the checkpoint and both shapes.
    with open(path("data", "good", LABELS["test"]), "rb") as f:
        n_test = struct.unpack(">II", f.read(8))[1]
    d = data_dir("size20", {IMAGES["test"]: struct.pack(">IIII", 0x803, n_test, 20, 20) + bytes(n_test * 400)})
    ck = path("runs", "base", "checkpoint.safetensors")
    case("eval --data: test images of another size than the checkpoint's", eval_argv(ck, data=d),
         names=[ck, "1x20x20"], owner="eval")


NOBODY = []  # [why not], once probed


def nobody_unusable():
    """Why the permission cases cannot run as nobody here, or None."""
    if not NOBODY:
        try:
            rc, _, err, _, _, _ = run([KILN, "report", "--help"], as_nobody=True)
            NOBODY.append(None if rc == 0 else "user nobody cannot run %s (exit %d: %s)" % (KILN, rc, err.strip()))
        except (OSError, subprocess.SubprocessError) as e:
            NOBODY.append("cannot switch to user nobody (%s)" % e)
    return NOBODY[0]


def permission_case(name, argv, names, owner):
    """Permission bits do not stop root: run as nobody when root, if we can."""
    if os.geteuid() != 0:
        case(name, argv, names=names, owner=owner)
    elif not nobody_unusable():
        case(name + " (as nobody)", argv, names=names, owner=owner, as_nobody=True)
    else:
        skip(name, "running as root, where permission bits do not stop reads, and %s" % nobody_unusable())


def spec_cases():
    ck = path("runs", "base", "checkpoint.safetensors")
    text = b"flatten\nlinear 10\n"
    cuts = {"mid-keyword": b"flatten\nlin", "after the keyword": b"flatten\nlinear", "mid-number": b"flatten\nlinear 1",
            "empty": b"", "comment only": b"# nothing\n"}
    for what, spec in cuts.items():
        p = write(path("specs", "cut_" + what.replace(" ", "_") + ".txt"), spec)
        # "linear 1" parses but has 1 output for 10 classes: refused, naming the spec.
        case("train --model: spec cut %s" % what, train_argv("spec_" + what.replace(" ", "_"), spec=p, max_steps=1),
             names=[p], owner="H1/H2 (model does not fit the data)" if what == "mid-number" else "H2 spec")
    for what, spec, owner in (
            ("unknown layer", b"flatten\nlinaer 10\n", "H2 spec"),
            ("linear 5120000 (over the parameter budget)", b"flatten\nlinear 5120000\nlinear 10\n",
             "H2 (parameter budget for --model)"),
            ("a NUL byte", b"flatten\nlinear 10\x00\nrelu\n", "H2 (NUL in a spec)"),
            ("kernel larger than the input", b"conv 4 k40\nflatten\nlinear 10\n", "H2 spec"),
            ("1.5 MiB of comments", b"#" + b"x" * (3 << 19) + b"\nflatten\nlinear 10\n", "H2 (spec size cap)"),
            ("200000 layers", b"flatten\n" + b"relu\n" * 200000 + b"linear 10\n", "H2 (layer bound, name check)"),
            ("output not 10 classes", b"flatten\nlinear 7\n", "H1/H2 (model does not fit the data)")):
        tag = re.sub(r"[^a-z0-9]+", "_", what.lower())
        p = write(path("specs", tag + ".txt"), spec)
        case("train --model: %s" % what, train_argv("spec_" + tag, spec=p, max_steps=1), names=[p], owner=owner)
    p = write(path("specs", "eval_mismatch.txt"), b"flatten\nlinear 16\nrelu\nlinear 10\n")
    case("eval --model: a spec the checkpoint's tensors do not fit", eval_argv(ck, spec=p), names=[ck],
         owner="H3 eval")
    case("export --model: a spec the checkpoint's tensors do not fit", export_argv(ck, "mismatch", spec=p),
         names=[ck], owner="H3 export")
    for what, make in WRONG_TYPES:
        tag = what.replace(" ", "_").replace("/", "")
        p = path("specs", "type_" + tag)
        make(p)
        case("train --model: %s" % what, train_argv("spec_type_" + tag, spec=p, max_steps=1), names=[p],
             owner="H2 (train_spec.c)", check=(lambda o, e: None if "directory" in e else
                                               "does not say it is a directory") if what == "a directory" else None)
        case("eval --model: %s" % what, eval_argv(ck, spec=p), names=[p], owner="H2 (train_spec.c)")
    p = write(path("specs", "locked.txt"), text, mode=0)
    permission_case("eval --model: no read permission", eval_argv(ck, spec=p), [p], "H2 (train_spec.c)")


def checkpoint_variants():
    """(what, bytes or maker, owner) for a broken checkpoint."""
    src = path("runs", "base", "checkpoint.safetensors")
    b, n, h = safetensors_parts(src)
    v = []
    for what, at in (("empty", 0), ("mid length", 4), ("mid length", 7), ("after the length", 8),
                     ("mid header", 8 + n // 2), ("after the header", 8 + n), ("mid data", 8 + n + (len(b) - 8 - n) // 2),
                     ("one byte short", len(b) - 1)):
        v.append(("cut %s (byte %d)" % (what, at), b[:at], "io (safetensors)"))
    for what, length in (("2^63", 2**63), ("2^64-1", 2**64 - 1), ("the file size", len(b)), ("0", 0)):
        v.append(("header length %s" % what, struct.pack("<Q", length) + b[8:], "io (safetensors)"))
    v.append(("bytes after the data", b + b"\x00" * 16, "H1 (checkpoint ranges)"))
    v.append(("NaN weights", checkpoint_nan(src), "eval: H3; resume: H1 (non-finite loss)"))
    for what, meta, owner in (
            ("negative epoch", {"kiln.epoch": "-4"}, "H1 (checkpoint ranges)"),
            ("INT_MAX epochs done", {"kiln.epochs_done": "2147483647"}, "H1 (checkpoint ranges)"),
            ("negative step", {"kiln.step": "-1"}, "H1 (checkpoint ranges)"),
            ("negative optimizer step count", {"kiln.optimizer.step_count": "-5"}, "H1 (checkpoint ranges)"),
            ("unknown format version", {"kiln.checkpoint": "999"}, "H1 (checkpoint ranges)"),
            ("input 9223372036854775807x1x1", {"kiln.input": "9223372036854775807x1x1"}, "H2 (window_out)"),
            ("stored spec of 200000 layers", {"kiln.model_spec": "flatten\n" + "relu\n" * 200000 + "linear 10\n"},
             "H2 (layer bound, name check)"),
            ("stored spec linear 5120000", {"kiln.model_spec": "flatten\nlinear 5120000\nlinear 10\n"}, "H2 spec")):
        v.append((what, checkpoint_with_meta(src, **meta), owner))
    return v


def checkpoint_cases():
    for what, data, owner in checkpoint_variants():
        tag = re.sub(r"[^a-z0-9]+", "_", what.lower())
        ck = write(path("ckpt", tag, "checkpoint.safetensors"), data)
        nan = what == "NaN weights"
        meta_only = owner.startswith("H1") and not nan
        # eval reads neither the training state nor kiln.input (the data gives the shape).
        eval_may_pass = meta_only or what.startswith("input ")
        case("eval --checkpoint: %s" % what, eval_argv(ck), names=[ck], owner="H3 eval" if nan else owner,
             rc=(0, 1, 2) if eval_may_pass else (1, 2), check=no_long_number)
        if not nan:
            case("export --checkpoint: %s" % what, export_argv(ck, tag), names=[ck], owner=owner,
                 rc=(0, 1, 2) if meta_only else (1, 2), check=no_long_number)
        case("train --resume: %s" % what, train_argv("resume_" + tag, resume=ck), owner=owner,
             names=["--detect-anomaly"] if nan else [ck], check=no_long_number)
    # A checkpoint of another model, with --model naming the spec it was not trained with.
    other = path("runs", "other", "checkpoint.safetensors")
    case("eval --checkpoint: trained with another spec than --model", eval_argv(other, spec=path("tiny.txt")),
         names=[other], owner="H3 eval")
    case("train --resume: --model contradicts the checkpoint's spec",
         train_argv("resume_other", resume=other, spec=path("tiny.txt")), names=[other, "--model"],
         owner="H1 (run config in the checkpoint)")
    # A sparse 3 GB file: the header is checked before anything is read.
    p = path("ckpt", "sparse", "checkpoint.safetensors")
    write(p, struct.pack("<Q", 100) + b"{not json" + b" " * 91)
    os.truncate(p, 3 << 30)
    for name, argv in (("eval", eval_argv(p)), ("export", export_argv(p, "sparse")),
                       ("train --resume", train_argv("resume_sparse", resume=p))):
        case("%s: a sparse 3 GB checkpoint with a bad header" % name, argv, names=[p], owner="io (safetensors)")
    for what, make in WRONG_TYPES:
        tag = what.replace(" ", "_").replace("/", "")
        p = path("ckpt", "type_" + tag)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        make(p)
        for name, argv in (("eval", eval_argv(p)), ("export", export_argv(p, "type_" + tag)),
                           ("train --resume", train_argv("resume_type_" + tag, resume=p))):
            case("%s: checkpoint is %s" % (name, what), argv, names=[p], owner="io/H1 (checkpoint type)",
                 check=(lambda o, e: None if "directory" in e else "does not say it is a directory")
                 if what == "a directory" else None)
    p = write(path("ckpt", "locked.safetensors"), read(path("runs", "base", "checkpoint.safetensors")), mode=0)
    permission_case("eval --checkpoint: no read permission", eval_argv(p), [p], "io")


def flag_cases():
    for flag, value, owner in (("--lr", "inf", "H1"), ("--lr", "nan", "H1"), ("--lr", "1e308", "H1"),
                               ("--lr", "-1", "H1"), ("--label-smoothing", "nan", "H1"),
                               ("--epochs", "-1", "H1"), ("--limit", "99999999999999999999", "H1"),
                               ("--log-every", "0", "H1"), ("--max-steps", "x", "H1")):
        case("train %s %s" % (flag, value), train_argv("flag_%s_%s" % (flag[2:], value), extra=(flag, value)),
             names=[flag], owner=owner)
    # Clamped to the dataset (exit 0) or refused naming the flag (2); never terabytes.
    case("train --batch 1000000000", train_argv("flag_batch", max_steps=1, extra=("--batch", "1000000000")),
         rc=(0, 2), owner="H1 (--batch clamp)",
         check=lambda o, e: None if "--batch" in e or "batch" in e else "says nothing about the batch")
    ck = path("runs", "base", "checkpoint.safetensors")
    case("eval --batch 1000000000", eval_argv(ck, extra=("--batch", "1000000000")), rc=(0,), owner="H3 eval")
    case("eval --limit 99999999999999999999", eval_argv(ck, extra=("--limit", "99999999999999999999")),
         names=["--limit"], owner="H3 eval")
    case("eval --batch -3", eval_argv(ck, extra=("--batch", "-3")), names=["--batch"], owner="H3 eval")
    for value in ("0", "99999999999", "-1", "inf"):
        case("eval --threads %s" % value, eval_argv(ck, extra=("--threads", value)), rc=(2,), names=["--threads"],
             owner="kiln.c")
    device_cases(ck)
    case("export without --out", [KILN, "export", "--checkpoint", ck], names=["--out DIR are required"],
         owner="H3 export")
    p = path("exports", "file")
    write(p, b"x")
    case("export --out under a regular file", export_argv(ck, "file/sub"), names=[p, "Not a directory"],
         owner="H3 export")
    case("export --out with missing parents", export_argv(ck, "a/b/c"), rc=(0,), owner="H3 export",
         check=lambda o, e: None if os.path.exists(path("exports", "a", "b", "c", "model.safetensors"))
         else "no a/b/c/model.safetensors")


def device_cases(ck):
    """--devices, --split, --micro-batches (tools/train_devices.c) and bench/export --device: each bad
    value and forbidden combination exits 2 naming the flag, the value and the fix. The tiny model has
    2 layers (flatten, linear 10). Runs in any build: cuda:5 is never there (the emulator has 2)."""
    owner = "H1 (train_devices.c)"
    for flag, value, told in (
            ("--devices", "cpu,cpu", "cpu is listed twice"),
            ("--devices", "cuda:5", "device 'cuda:5'"),
            ("--devices", "meta", "device 'meta' holds no data"),
            ("--devices", "cpu,", "entry 2 is empty"),
            ("--devices", "", "entry 1 is empty"),
            ("--devices", "cpu;cuda:0", "device 'cpu;cuda:0'"),
            ("--devices", ",".join(["cpu"] * 17), "more than 16 devices"),
            ("--split", "0:cpu,5:cpu", "layer 5 is out of range: the model has 2 layers (0..1)"),
            ("--split", "1:cpu", "it must start at layer 0"),
            ("--split", "0:cpu,0:cpu", "not after the previous stage's layer 0"),
            ("--split", "0:cpu,1:nope", "device 'nope'"),
            ("--split", "0:cpu,1:cuda:5", "device 'cuda:5'"),
            ("--split", "0:meta", "device 'meta' holds no data"),
            ("--split", "0cpu", "is not LAYER:DEVICE"),
            ("--split", "x:cpu", "is not LAYER:DEVICE"),
            ("--split", "-1:cpu", "is not LAYER:DEVICE"),
            ("--split", "99999999999999999999:cpu", "is not LAYER:DEVICE"),
            ("--split", "0:cpu,,1:cpu", "entry 2 is empty"),
            ("--micro-batches", "0", "1..16"),
            ("--micro-batches", "17", "1..16"),
            ("--micro-batches", "x", "1..16")):
        extra = (flag, value) if flag != "--micro-batches" else ("--split", "0:cpu", flag, value)
        case("train %s %r" % (flag, value), train_argv("dev_%s" % len(results), extra=extra), rc=(2,),
             names=[flag, told], owner=owner)
    for what, extra, told in (
            ("--devices with --device", ("--devices", "cpu", "--device", "cpu"), ["--device cpu and --devices cpu",
                                                                                   "give one of them"]),
            ("--split with --device", ("--split", "0:cpu", "--device", "cpu"), ["--device cpu and --split 0:cpu"]),
            ("--devices with --split", ("--devices", "cpu", "--split", "0:cpu"),
             ["--devices cpu and --split 0:cpu cannot be combined"]),
            ("--split with --checkpoint 2", ("--split", "0:cpu,1:cpu", "--checkpoint", "2"),
             ["--split 0:cpu,1:cpu cannot be combined with --checkpoint 2"]),
            ("--split with --checkpoint auto", ("--split", "0:cpu", "--checkpoint", "auto", "--memory-budget", "1GiB"),
             ["--split 0:cpu cannot be combined with --checkpoint auto"]),
            ("--devices with --checkpoint 2", ("--devices", "cpu", "--checkpoint", "2"),
             ["--devices cpu cannot be combined with --checkpoint 2"]),
            ("--micro-batches without --split", ("--micro-batches", "4"), ["--micro-batches 4 needs --split"])):
        case("train %s" % what, train_argv("dev_%s" % len(results), extra=extra), rc=(2,), names=told, owner=owner)
    # A resumed run that used --checkpoint 2: --split must turn it off by name.
    base = path("runs", "ckpt2")
    rc, _, err, _, _, _ = run(train_argv("ckpt2", max_steps=1, extra=("--checkpoint", "2")))
    if rc != 0:
        results.append(("train --resume (--checkpoint 2) --split", False, "FAIL set-up run: exit %d: %s" % (rc, err)))
        print(results[-1][2], flush=True)
    else:
        case("train --resume of a --checkpoint 2 run with --split", train_argv(base, resume=base, extra=(
            "--split", "0:cpu,1:cpu")), rc=(2,), names=["--split 0:cpu,1:cpu", "add --checkpoint 0"], owner=owner)
    # The good cases on the CPU (any build): one-device DataParallel and a two-stage split train, say
    # their devices in the summary, and leave checkpoints of the plain model (eval loads them).
    for tag, extra, told in (("devices", ("--devices", "cpu"), '"devices":["cpu"],"device_peak_bytes":['),
                             ("split", ("--split", "0:cpu,1:cpu", "--micro-batches", "3"),
                              '"split":[{"layer":0,"device":"cpu"},{"layer":1,"device":"cpu"}],"micro_batches":3')):
        case("train %s (good: exit 0, summary names them)" % " ".join(extra),
             train_argv("dev_good_" + tag, extra=extra), rc=(0,), owner=owner,
             check=lambda o, e, t=told: None if t in o else "the summary lacks %s" % t)
        case("eval of the %s run's checkpoint (the plain model's)" % tag,
             eval_argv(path("runs", "dev_good_" + tag, "checkpoint.safetensors")), rc=(0,), owner=owner)
    # A run stopped under --devices resumes under --split (and the reverse would too): the flags are not part
    # of the run configuration, and the checkpoint is the plain model's.
    rc, _, err, _, _, _ = run(train_argv("dev_stop", max_steps=2, extra=("--devices", "cpu")))
    stopped = path("runs", "dev_stop")
    case("train --resume of a --devices run with --split (good: exit 0)", train_argv(stopped, resume=stopped, extra=(
        "--split", "0:cpu,1:cpu")), rc=(0,), owner=owner,
         check=lambda o, e: "the set-up run with --devices failed (exit %d)" % rc if rc else
         None if "resuming from" in e and '"parallel":"pipeline"' in o else "no resume, or no split in the summary")
    for bench in ("alloc", "loader", "profiler"):
        case("bench %s --device cpu (no device choice)" % bench, [KILN, "bench", bench, "--device", "cpu"], rc=(2,),
             names=["kiln bench %s: --device cpu" % bench, "no device choice", "drop --device"], owner="kiln.c")
    case("bench checkpoint --device meta", [KILN, "bench", "checkpoint", "--device", "meta"], rc=(2,),
         names=["kiln bench checkpoint: --device meta"], owner="bench/checkpoint.c")
    case("export --device cpu (runs no model)", [KILN, "export", "--checkpoint", ck, "--out", path("exports", "dev"),
                                                  "--device", "cpu"], rc=(2,),
         names=["--device cpu", "export runs no model", "drop --device"], owner="H3 export")


def run_dir(name, metrics=None, snapshot=None, checkpoint=True):
    """A copy of the base run's directory with metrics.jsonl (bytes or a
    maker) and memory_snapshot.json (idem) replaced."""
    d = path("rundirs", name)
    os.makedirs(d)
    if checkpoint:
        shutil.copy(path("runs", "base", "checkpoint.safetensors"), d)
    for fname, content in (("metrics.jsonl", metrics), ("memory_snapshot.json", snapshot)):
        p = os.path.join(d, fname)
        if content is None:
            if fname == "metrics.jsonl":
                shutil.copy(path("runs", "base", "metrics.jsonl"), p)
        elif callable(content):
            content(p)
        else:
            write(p, content)
    return d


def metrics_cases():
    good = read(path("runs", "base", "metrics.jsonl"))
    lines = good.splitlines(keepends=True)
    # Cut mid-record: after each line's first brace, mid-key, mid-number.
    cuts = sorted({len(lines[0]) // 2, len(lines[0]) - 2, len(good) - 1, 1})
    for at in cuts:
        d = run_dir("cut%d" % at, metrics=good[:at])
        case("report: metrics.jsonl cut at byte %d" % at, [KILN, "report", d], rc=(0,), check=wrote,
             owner="H3 report")
        case("train --resume: metrics.jsonl cut at byte %d" % at,
             train_argv(d, resume=d), rc=(0,), owner="H1 (resume state)")
    for what, make in WRONG_TYPES:
        tag = what.replace(" ", "_").replace("/", "")
        d = run_dir("type_" + tag, metrics=make)
        m = os.path.join(d, "metrics.jsonl")
        case("report: metrics.jsonl is %s" % what, [KILN, "report", d], rc=(1,), names=[m], owner="H3 report")
        case("train --resume --out same dir: metrics.jsonl is %s" % what,
             train_argv(d, resume=d), names=[m], owner="H1 (metrics.jsonl type)")
        s = run_dir("snap_" + tag, snapshot=make)
        case("report: memory_snapshot.json is %s" % what, [KILN, "report", s], rc=(1,),
             names=[os.path.join(s, "memory_snapshot.json")], owner="H3 report")
    d = run_dir("huge", metrics=lambda p: (write(p, b""), os.truncate(p, 300 << 20)))
    case("report: a sparse 300 MiB metrics.jsonl", [KILN, "report", d], rc=(1,),
         names=[os.path.join(d, "metrics.jsonl"), "256"], owner="H3 report")
    d = run_dir("longline", metrics=good + b'{"event":"step","x":"' + b"a" * (2 << 20) + b'"}\n')
    case("report: a 2 MiB line", [KILN, "report", d], rc=(0,), check=wrote, owner="H3 report")
    huge = (b'{"event":"step","step":1e300,"epoch":1e300,"loss":1e300,"mem_allocated":1e308,"img_s":-1e300}\n'
            b'{"event":"epoch","epoch":1e300,"test_acc":1e300,"epoch_images":1e300,"train_loss":1e300}\n'
            b'{"event":"checkpoint","path":"checkpoint.safetensors","epoch":1,"step":2,"batch_in_epoch":2,'
            b'"epoch_loss_sum":1e308,"epoch_images":1e300}\n')
    d = run_dir("hugenum", metrics=huge)
    case("report: numbers of 1e300", [KILN, "report", d], rc=(0,), owner="H3 report",
         check=lambda o, e: wrote(o, e) or no_long_number(read(os.path.join(d, "report.html")).decode(), ""))
    d = run_dir("resume_hugenum", metrics=good + huge)
    case("train --resume: metrics.jsonl with epoch_images 1e300", train_argv(d, resume=d),
         rc=(0, 1, 2), owner="H1 (resume state)", check=no_long_number)
    d = run_dir("snapcut", snapshot=b'{"format":"kiln memory snapshot 1","segments":[{"blocks":[')
    case("report: memory_snapshot.json cut mid-array", [KILN, "report", d], rc=(0,), owner="H3 report",
         check=lambda o, e: wrote(o, e) or (None if "not valid JSON" in read(os.path.join(d, "report.html")).decode()
                                            else "no note about the snapshot"))
    case("report: a run directory that does not exist", [KILN, "report", path("rundirs", "absent")], rc=(1,),
         names=[path("rundirs", "absent")], owner="H3 report")
    base = path("runs", "base")
    p = path("rundirs", "snapshot_fifo")
    fifo(p)
    case("report --snapshot: a FIFO", [KILN, "report", base, "--snapshot", p, "--out", path("rundirs", "s.html")],
         rc=(1,), names=[p], owner="H3 report")
    case("report --out: a directory", [KILN, "report", base, "--out", path("rundirs")], rc=(1,),
         names=[path("rundirs")], owner="H3 report")
    case("report --out: under a missing directory", [KILN, "report", base, "--out", path("absent", "r.html")],
         rc=(1,), names=[path("absent", "r.html")], owner="H3 report")
    d = run_dir("locked", metrics=lambda p: write(p, good, mode=0))
    permission_case("report: metrics.jsonl without read permission",
                    [KILN, "report", d, "--out", os.path.join(SHARED, "locked.html")],
                    [os.path.join(d, "metrics.jsonl"), "Permission denied"], "H3 report")


def plan_cases():
    """kiln plan's flags: each bad value refused with exit 2 (1 for a spec
    that does not parse) and a message naming the flag or the file."""
    model = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models",
                         "tutorial_cnn_28x28x1.txt")
    plan = [KILN, "plan", "--model", model]
    for flag, value in (("--batch", "0"), ("--batch", "-5"), ("--batch", "x"), ("--batch", "99999999999"),
                        ("--batch", "1e3"), ("--budget", "0"), ("--budget", "-1"), ("--budget", "12Q"),
                        ("--budget", "nan"), ("--budget", "inf"), ("--budget", "1e30"), ("--checkpoint", "1"),
                        ("--checkpoint", "65"), ("--accum", "0"), ("--amp", "fp8"), ("--input", "0x28x28"),
                        ("--input", "1x28"), ("--device", "meta"), ("--device", "cuda:99"), ("--device", "gpu")):
        case("plan %s %s" % (flag, value), plan + [flag, value], rc=(2,), names=[flag], owner="kiln plan")
    case("plan --batch without a value", plan + ["--batch"], rc=(2,), names=["--batch"], owner="kiln plan")
    case("plan --accum above --batch", plan + ["--batch", "4", "--accum", "8"], rc=(2,), names=["--accum"],
         owner="kiln plan")
    missing = path("plan", "missing_28x28x1.txt")
    case("plan --model: a missing file", [KILN, "plan", "--model", missing], rc=(2,), names=[missing],
         owner="kiln plan")
    d = path("plan", "dir_28x28x1.txt")
    os.makedirs(d, exist_ok=True)
    case("plan --model: a directory", [KILN, "plan", "--model", d], rc=(1, 2), names=[d], owner="kiln plan")
    case("plan --model: /dev/zero", [KILN, "plan", "--model", "/dev/zero"], rc=(1, 2), names=["/dev/zero"],
         owner="kiln plan")
    nosize = path("plan", "model.txt")
    write(nosize, read(model))
    case("plan --model: no input size in the name", [KILN, "plan", "--model", nosize], rc=(2,),
         names=[nosize, "--input"], owner="kiln plan")
    bad = path("plan", "garbage_28x28x1.txt")
    write(bad, b"conv 32 k3 p1\nwarp 9\n")
    case("plan --model: a spec that does not parse", [KILN, "plan", "--model", bad], rc=(1,), names=[bad],
         owner="kiln plan")
    huge = path("plan", "huge_28x28x1.txt")
    write(huge, b"flatten\nlinear 1000000000\n")
    case("plan --model: a spec too large to build", [KILN, "plan", "--model", huge], rc=(1,), names=[huge],
         owner="kiln plan")


def main():
    t0 = time.monotonic()
    try:
        setup()
        for group in (idx_cases, spec_cases, checkpoint_cases, flag_cases, metrics_cases, plan_cases):
            group()
    finally:
        for root, dirs, _ in os.walk(WORK):  # the locked directories, so rmtree can enter them
            for d in dirs:
                p = os.path.join(root, d)
                if not os.path.islink(p):
                    os.chmod(p, 0o755)
        failed = [r for r in results if not r[1]]
        if "KILN_HOSTILE_KEEP" not in os.environ and not failed:
            shutil.rmtree(WORK, ignore_errors=True)
        elif failed:
            print("inputs kept in %s" % WORK)
    print("hostile_cli: %d cases, %d failed, %.1f s" % (len(results), len(failed), time.monotonic() - t0))
    if failed:
        print("failed:\n" + "\n".join("  " + r[0] for r in failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

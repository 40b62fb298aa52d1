/* kiln train's command line: the usage text and the options into
 * train_args, each range-checked with the flag named (train_run.h). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"
#include "train.h"
#include "train_run.h"

static void usage(FILE *f) {
    fprintf(f, "usage: kiln train [options]\n"
               "  --model FILE       model spec (default: models/" DEFAULT_MODEL "; with --resume: the spec\n"
               "                     stored in the checkpoint)\n"
               "  --dataset D        fashion-mnist (default) or cifar10 (the binary version: --data DIR holds\n"
               "                     data_batch_1..5.bin and test_batch.bin; model default models/" CIFAR10_MODEL ")\n"
               "  --data DIR         the dataset's directory (Fashion-MNIST default: " FMNIST_DIR ",\n"
               "                     the Debian package dataset-fashion-mnist; CIFAR-10 has no default)\n"
               "  --augment A        training-set augmentation: none, flip (horizontal, p 0.5) or crop-flip\n"
               "                     (random crop of the image zero-padded by 4, then flip); default: crop-flip\n"
               "                     for cifar10, none for fashion-mnist. Normalisation is the dataset's\n"
               "                     per-channel mean/std\n"
               "  --epochs N         epochs in total (default 3)\n"
               "  --batch B          batch size (default 128)\n"
               "  --accum N          split each batch into N micro-batches, one optimizer step (default 1)\n"
               "  --lr LR            Adam learning rate; with --schedule onecycle its peak (default 3e-3)\n"
               "  --schedule S       onecycle (default: warm-up over 30%% of the steps, cosine down) or constant\n"
               "  --label-smoothing E  cross-entropy label smoothing (default 0.1; 0 turns it off)\n"
               "  --limit N          use only the first N training and test samples (quick runs)\n"
               "  --seed S           seed for initialisation, shuffling and dropout (default 0)\n"
               "  --workers N        loader threads (default -1: auto, the cores --threads leaves)\n"
               "  --threads N        CPU compute threads (default: KILN_NUM_THREADS, else every core)\n"
               "  --device D         cpu, cuda or cuda:N (default: KILN_DEVICE, else the first GPU, else cpu)\n"
               "  --devices LIST     DataParallel over the listed devices (e.g. cuda:0,cuda:1): each batch is\n"
               "                     split among them; batches, gather and loss on the first; checkpoints are\n"
               "                     the plain model's (kiln eval, --resume on any device)\n"
               "  --split L:D,...    model parallelism: the model's layers from L up to the next entry's on\n"
               "                     device D (e.g. 0:cuda:0,6:cuda:1; the first entry is layer 0); batches\n"
               "                     arrive on the first stage's device, the loss is on the last one's\n"
               "  --micro-batches K  with --split: pipeline each batch in K micro-batches, 1..16 (default 1;\n"
               "                     more lets the stages overlap; BatchNorm then sees each micro-batch alone)\n"
               "  --log-every N      steps per metrics record and progress line (default 50)\n"
               "  --progress P       auto (default: a bar redrawn in place when stderr is a terminal,\n"
               "                     else one line per window), bar or lines\n"
               "  --out DIR          output directory (default runs/<timestamp>)\n"
               "  --resume PATH      continue from a checkpoint (a file, or a run directory holding\n"
               "                     checkpoint.safetensors)\n"
               "  --benchmark        kiln_set_cudnn_benchmark(true) (torch.backends.cudnn.benchmark): time the\n"
               "                     convolution algorithms once per shape and keep the fastest (CUDA; the CPU's\n"
               "                     autotuner is KILN_CONV_AUTOTUNE=1); --deterministic overrides it\n"
               "  --deterministic    kiln_set_deterministic(true): resumed runs repeat losses bit for bit\n"
               "  --max-steps N      stop after optimizer step N with a checkpoint (exit 0)\n"
               "  --profile N        profile N steps (after one warm-up step): table, counters, trace.json\n"
               "  --monitor          sample GPU (or host CPU/memory) use each second into metrics.jsonl\n"
               "  --detect-leaks     check for autograd graphs kept across steps at each step boundary\n"
               "  --detect-anomaly   check every op's outputs for NaN/inf (slow: a debugging switch)\n"
               "  --memory-history   record every allocator event; memory_snapshot.json at the end\n"
               "                     (kiln report draws the memory timeline from it)\n"
               "  --amp MODE         mixed precision: auto (default: on for CUDA with tensor cores, off on\n"
               "                     CPUs without native bf16), off, f16 (with loss scaling) or bf16\n"
               "  --checkpoint N|auto  gradient checkpointing: recompute the model's activations in backward,\n"
               "                     in N segments of its layers placed by measured memory; auto: the fewest\n"
               "                     segments whose planned step peak (kiln plan) fits --memory-budget\n"
               "  --memory-budget SIZE  the step's memory budget for --checkpoint auto (2GiB, 512MiB, bytes)\n"
               "  --no-auto-batch    stop at an out-of-memory in a step; by default the step runs again with\n"
               "                     half the micro-batch (twice --accum: the same batch and math), said once\n"
               "  --no-plan          do not plan the step's memory before the first step; by default kiln plan's\n"
               "                     prediction is said, and under a memory limit the micro-batch is halved\n"
               "                     until the plan fits\n"
               "  --world N          N processes, data-parallel (DDP): start it as mpirun -np N kiln train ...\n"
               "                     (started otherwise, it says how); under mpirun it is implied. --batch\n"
               "                     stays the global batch; rank 0 alone prints and writes\n"
               "Ctrl-C finishes the step, writes a checkpoint and exits 130.\n");
}

static bool parse_i64(const char *s, int64_t min, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < min) return false;
    *out = v;
    return true;
}

/* 0 ok, 2 usage error (printed), -1 help printed. */
int train_parse_args(int argc, char **argv, train_args *a) {
    /* The default recipe (docs/training.md, "The default recipe"): 3 epochs,
     * Adam with a one-cycle schedule peaking at 3e-3, label smoothing 0.1. */
    *a = (train_args){.epochs = 3, .accum = 1, .log_every = 50, .workers = -1, .batch = 128, .lr = 3e-3,
                      .onecycle = true, .label_smoothing = 0.1, .progress = -1};
    for (int i = 0; i < argc; i++) {
        const char *o = argv[i];
        if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
            usage(stdout);
            return -1;
        }
        if (!strcmp(o, "--deterministic")) a->deterministic = true, a->given |= TRAIN_GIVEN_DETERMINISTIC;
        else if (!strcmp(o, "--monitor")) a->monitor = true;
        else if (!strcmp(o, "--detect-leaks")) a->detect_leaks = true;
        else if (!strcmp(o, "--detect-anomaly")) a->detect_anomaly = true;
        else if (!strcmp(o, "--memory-history")) a->memory_history = true;
        else if (!strcmp(o, "--no-auto-batch")) a->no_auto_batch = true;
        else if (!strcmp(o, "--no-plan")) a->no_plan = true;
        else if (!strcmp(o, "--benchmark")) a->benchmark = true;
        else if (strncmp(o, "--", 2) != 0) {
            fprintf(stderr, "kiln train: unexpected argument '%s' (kiln train --help)\n", o);
            return 2;
        } else {
            if (i + 1 >= argc) {
                /* the options below that take a value */
                static const char *const valued[] = {
                    "--model", "--data", "--dataset", "--augment", "--out", "--device", "--devices",
                    "--split", "--micro-batches", "--resume", "--epochs", "--accum", "--log-every",
                    "--profile", "--workers", "--batch", "--limit", "--max-steps", "--world", "--amp",
                    "--checkpoint", "--memory-budget", "--seed", "--progress", "--schedule",
                    "--label-smoothing", "--lr"};
                bool known = false;
                for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++) known |= !strcmp(o, valued[k]);
                if (known) fprintf(stderr, "kiln train: %s needs a value (kiln train --help)\n", o);
                else fprintf(stderr, "kiln train: unknown option '%s' (kiln train --help)\n", o);
                return 2;
            }
            const char *v = argv[++i];
            int64_t n = 0;
            bool ok = true;
            if (strcmp(o, "--model") == 0) a->model = v;
            else if (strcmp(o, "--data") == 0) a->data = v, a->given |= TRAIN_GIVEN_DATA;
            else if (strcmp(o, "--dataset") == 0) {
                a->given |= TRAIN_GIVEN_DATASET;
                if (!train_dataset_parse(v, &a->dataset)) {
                    fprintf(stderr, "kiln train: --dataset %s: give fashion-mnist (the default) or cifar10\n", v);
                    return 2;
                }
            } else if (strcmp(o, "--augment") == 0) {
                a->given |= TRAIN_GIVEN_AUGMENT;
                if (!train_augment_parse(v, &a->augment) || a->augment == TRAIN_AUGMENT_AUTO) {
                    fprintf(stderr, "kiln train: --augment %s: give none, flip or crop-flip (the default is the "
                                    "dataset's: crop-flip for cifar10, none for fashion-mnist)\n", v);
                    return 2;
                }
            }
            else if (strcmp(o, "--out") == 0) a->out = v;
            else if (strcmp(o, "--device") == 0) a->device = v;
            else if (strcmp(o, "--devices") == 0) a->devices = v;
            else if (strcmp(o, "--split") == 0) a->split = v;
            else if (strcmp(o, "--micro-batches") == 0) {
                if (!parse_i64(v, 1, &n) || n > 16) {
                    fprintf(stderr, "kiln train: --micro-batches %s: give a whole number in 1..16 (the default is 1)\n",
                            v);
                    return 2;
                }
                a->micro_batches = (int)n;
            }
            else if (strcmp(o, "--resume") == 0) a->resume = v;
            else if (strcmp(o, "--epochs") == 0) {
                ok = parse_i64(v, 1, &n) && n <= TRAIN_MAX_EPOCHS && (a->epochs = (int)n);
                a->given |= TRAIN_GIVEN_EPOCHS;
                if (!ok) {
                    fprintf(stderr, "kiln train: --epochs %s: give a whole number of epochs in 1..%d\n", v,
                            TRAIN_MAX_EPOCHS);
                    return 2;
                }
            } else if (strcmp(o, "--accum") == 0)
                ok = parse_i64(v, 1, &n) && n < INT_MAX && (a->accum = (int)n), a->given |= TRAIN_GIVEN_ACCUM;
            else if (strcmp(o, "--log-every") == 0)
                ok = parse_i64(v, 1, &n) && n < INT_MAX && (a->log_every = (int)n), a->given |= TRAIN_GIVEN_LOG_EVERY;
            else if (strcmp(o, "--profile") == 0)
                ok = parse_i64(v, 1, &n) && n < 100000 && (a->profile_steps = (int)n);
            else if (strcmp(o, "--workers") == 0) ok = parse_i64(v, -1, &n) && n < 256 && ((a->workers = (int)n), 1);
            else if (strcmp(o, "--batch") == 0) ok = parse_i64(v, 1, &a->batch), a->given |= TRAIN_GIVEN_BATCH;
            else if (strcmp(o, "--limit") == 0) ok = parse_i64(v, 1, &a->limit), a->given |= TRAIN_GIVEN_LIMIT;
            else if (strcmp(o, "--max-steps") == 0) ok = parse_i64(v, 1, &a->max_steps);
            else if (strcmp(o, "--world") == 0) ok = parse_i64(v, 1, &n) && n <= 65536 && ((a->world = (int)n), 1);
            else if (strcmp(o, "--amp") == 0) ok = train_amp_parse(v, &a->amp), a->given |= TRAIN_GIVEN_AMP;
            else if (strcmp(o, "--checkpoint") == 0)
                ok = !strcmp(v, "auto") ? (a->checkpoint_auto = true)
                                        : parse_i64(v, 0, &n) && n <= KILN_NN_MAX_CHECKPOINT_SEGMENTS &&
                                              ((a->checkpoint = (int)n), 1),
                a->given |= TRAIN_GIVEN_CHECKPOINT;
            else if (strcmp(o, "--memory-budget") == 0)
                ok = train_parse_size(v, &a->memory_budget), a->given |= TRAIN_GIVEN_CHECKPOINT;
            else if (strcmp(o, "--seed") == 0)
                ok = parse_i64(v, 0, &n) && ((a->seed = (uint64_t)n), a->seed_given = 1), a->given |= TRAIN_GIVEN_SEED;
            else if (strcmp(o, "--progress") == 0)
                ok = !strcmp(v, "auto") ? (a->progress = -1, true)
                     : !strcmp(v, "bar") ? (a->progress = 1, true)
                     : !strcmp(v, "lines") ? (a->progress = 0, true)
                                          : false;
            else if (strcmp(o, "--schedule") == 0)
                ok = !strcmp(v, "onecycle") ? (a->onecycle = true) : !strcmp(v, "constant") ? !(a->onecycle = false) : false,
                a->given |= TRAIN_GIVEN_SCHEDULE;
            else if (strcmp(o, "--label-smoothing") == 0) {
                char *end;
                a->given |= TRAIN_GIVEN_SMOOTHING;
                a->label_smoothing = strtod(v, &end);
                ok = *v && !*end && a->label_smoothing >= 0 && a->label_smoothing < 1;
            } else if (strcmp(o, "--lr") == 0) {
                char *end;
                a->given |= TRAIN_GIVEN_LR;
                a->lr = strtod(v, &end);
                /* Adam's step is lr-sized: above 10 every weight is noise
                 * after one step (1e308 and inf trained NaN and exited 0). */
                ok = *v && !*end && isfinite(a->lr) && a->lr > 0 && a->lr <= 10;
                if (!ok) {
                    fprintf(stderr, "kiln train: --lr %s: give a finite learning rate in (0, 10] (the default is 3e-3)\n", v);
                    return 2;
                }
            } else {
                fprintf(stderr, "kiln train: unknown option '%s' (kiln train --help)\n", o);
                return 2;
            }
            if (!ok) {
                fprintf(stderr, "kiln train: bad value '%s' for %s (kiln train --help)\n", v, o);
                return 2;
            }
        }
    }
    if (a->checkpoint_auto != (a->memory_budget > 0)) {
        fprintf(stderr, a->checkpoint_auto ? "kiln train: --checkpoint auto needs --memory-budget SIZE (e.g. 2GiB)\n"
                                           : "kiln train: --memory-budget is for --checkpoint auto\n");
        return 2;
    }
    if (a->accum > a->batch) {
        fprintf(stderr, "kiln train: --accum %d is larger than --batch %lld\n", a->accum, (long long)a->batch);
        return 2;
    }
    return 0;
}


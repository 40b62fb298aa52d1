/* `kiln bench cnn`: training and inference images/s of the tutorial CNN
 * (OptimizedCNN of the PyTorch CUDA optimisation guide) on 3x32x32 inputs,
 * interleaved with the PyTorch peer bench/peer/torch_cnn_bench.py.
 *
 * Network: three stages conv(3x3, padding 1) + relu + maxpool(2) with 32,
 * 64 and 128 channels (32 -> 16 -> 8 -> 4), fc1 2048 -> 512, relu, fc2
 * 512 -> 10. Training step: zero_grad(set_to_none), forward, cross-entropy,
 * backward, Adam(lr 1e-3). Inference step: forward in eval mode under
 * no_grad. Inputs: one fixed randn batch and random labels, as the peer's;
 * with --data, batches come from a kiln_loader instead (below).
 *
 * Measurement: `warmup` untimed steps of each precision and mode once,
 * then `repeats` rounds; each round, per precision (f32; bf16 where the CPU
 * has native bf16, or when --precision asks) and mode, times `steps` Kiln
 * steps, then runs the peer for the same precision, mode and step count
 * twice: PyTorch eager and PyTorch's best setup (a fresh python process
 * each: it pays its own import and warm-up, untimed), so all three see the
 * same minutes of a shared machine. Kiln's bf16 is autocast around the
 * forward (kiln_autocast_begin), as the peer's torch.autocast. Reported
 * (cnn_report.c): the machine (CPU model, flags, threads) and the f32 FMA
 * peak measured on the benchmark's threads (cpu_peak.c), median [min-max]
 * images/s over the rounds, GFLOP/s in direct-convolution FLOP
 * equivalents counted from the model's layer shapes (cnn_flops), the
 * kiln/eager and kiln/best ratios of the medians against the bars,
 * and the f32 share of the peak. Then one training step under the
 * profiler, its top rows by self CPU time, and a last stdout line of JSON.
 *
 * --data [host|device] trains from a kiln_loader over a synthetic
 * CIFAR-sized u8 dataset (reflect-pad-4 crop, flip, normalise): `host` (the
 * default) with pinned batches made by `workers` threads, `device` with the
 * dataset on the device and batches made by ops (dataset-on-device mode).
 * Each round then times the same number of training steps twice, from the
 * loader and on the preloaded fixed batch, in alternating order, and the
 * table reports both, their ratio and the fraction of the loader steps'
 * time spent waiting in kiln_loader_next.
 *
 *   kiln bench cnn [--steps N] [--repeats N] [--warmup N] [--batch N]
 *                  [--mode train|infer|both] [--no-peer] [--data [host|device]]
 *                  [--workers N] [--profile-rows N] [--python PATH] [--peer-script PATH]
 *                  [--device cpu|cuda:N]   (cuda:N: bench/gpu.c, autotuning off and on)
 *                  [--precision auto|f32|bf16|both]
 *
 * Threads: Kiln computes on kiln_num_threads() (kiln --threads N,
 * KILN_NUM_THREADS) and the peer is given the same count; a peer that
 * reports another is left out. --workers defaults to
 * kiln_num_loader_workers(). Both are in the JSON. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "cnn_bench.h"
#include "cnn_peer.h"
#include "kiln/data.h"
#include "kiln/kiln.h"

#define CNN_FLAT     (128 * 4 * 4)
#define DATA_BATCHES 16 /* batches per epoch of the synthetic dataset */

typedef struct cnn_bench {
    kiln_module *model;
    kiln_optimizer *opt;
    kiln_tensor *x, *y;    /* (B, 3, 32, 32) f32, (B) i64 */
    kiln_dataset *dataset; /* --data: (N, 3, 32, 32) u8 */
    kiln_loader *loader;
    int64_t epoch;
    bool from_loader; /* training steps take loader batches (else the fixed batch) */
    bool bf16;        /* forwards under kiln_autocast_begin(CPU, bf16), as torch.autocast('cpu') */
    double wait_s;    /* time spent in kiln_loader_next */
} cnn_bench;

/* ---- The model ----------------------------------------------------------------------- */

/* x = pool(relu(conv_i(x))) three times; view(-1, 2048); relu(fc1); fc2.
 * With layer fusion on (kiln_nn_set_fusion, the default) it calls what the
 * Sequential fuses the same chain into: conv2d_relu_max_pool2d on the CPU,
 * conv2d then relu_max_pool2d elsewhere; the flatten, fc1 and its ReLU as
 * one linear_act. */
static kiln_tensor *fused_forward(kiln_module *m, kiln_tensor *x) {
    static const char *const convs_w[3] = {"conv1.weight", "conv2.weight", "conv3.weight"};
    static const char *const convs_b[3] = {"conv1.bias", "conv2.bias", "conv3.bias"};
    kiln_conv2d_opts co = {.padding = {CNN_PAD, CNN_PAD}};
    kiln_pool2d_opts po = kiln_pool2d_defaults(2);
    bool cpu = kiln_get_device(x).type == KILN_DEVICE_CPU;
    kiln_tensor *h = kiln_retain(x);
    for (int i = 0; i < 3 && h; i++) {
        kiln_tensor *w = kiln_module_state_get(m, convs_w[i]), *b = kiln_module_state_get(m, convs_b[i]), *y = NULL;
        if (w && b && cpu) {
            y = kiln_conv2d_relu_max_pool2d(h, w, b, &co, 2, NULL);
        } else if (w && b) {
            kiln_tensor *c = kiln_conv2d(h, w, b, &co);
            y = c ? kiln_relu_max_pool2d(c, &po, NULL) : NULL;
            kiln_release(c);
        }
        kiln_release(w), kiln_release(b), kiln_release(h);
        h = y;
    }
    if (!h) return NULL;
    kiln_tensor *w = kiln_module_state_get(m, "fc1.weight"), *b = kiln_module_state_get(m, "fc1.bias");
    kiln_tensor *r1 = w && b ? kiln_linear_act(h, w, b, KILN_ACT_RELU) : NULL;
    kiln_release(h), kiln_release(w), kiln_release(b);
    kiln_tensor *out = r1 ? kiln_module_forward(kiln_module_child(m, "fc2"), r1) : NULL;
    kiln_release(r1);
    return out;
}

static kiln_tensor *cnn_forward(kiln_module *m, kiln_tensor *x, void *user) {
    (void)user;
    if (kiln_nn_fusion_enabled()) return fused_forward(m, x);
    static const char *const convs[3] = {"conv1", "conv2", "conv3"};
    kiln_module *pool = kiln_module_child(m, "pool"), *relu = kiln_module_child(m, "relu");
    kiln_tensor *h = kiln_retain(x);
    for (int i = 0; i < 3 && h; i++) {
        kiln_tensor *c = kiln_module_forward(kiln_module_child(m, convs[i]), h);
        kiln_release(h);
        kiln_tensor *r = c ? kiln_module_forward(relu, c) : NULL;
        kiln_release(c);
        h = r ? kiln_module_forward(pool, r) : NULL;
        kiln_release(r);
    }
    if (!h) return NULL;
    kiln_tensor *flat = kiln_view(h, KILN_SHAPE(-1, CNN_FLAT));
    kiln_release(h);
    kiln_tensor *f1 = flat ? kiln_module_forward(kiln_module_child(m, "fc1"), flat) : NULL;
    kiln_release(flat);
    kiln_tensor *r1 = f1 ? kiln_module_forward(relu, f1) : NULL;
    kiln_release(f1);
    kiln_tensor *out = r1 ? kiln_module_forward(kiln_module_child(m, "fc2"), r1) : NULL;
    kiln_release(r1);
    return out;
}

/* Children in OptimizedCNN's order, so parameter names and order are PyTorch's. */
kiln_module *kiln_bench_cnn_model(void) {
    kiln_module *m = kiln_nn_custom("OptimizedCNN", cnn_forward, NULL);
    if (!m) return NULL;
    kiln_status st = kiln_module_add_child(m, "conv1", kiln_nn_conv2d(3, 32, 3, 1, CNN_PAD, 1, 1, true));
    if (!st) st = kiln_module_add_child(m, "conv2", kiln_nn_conv2d(32, 64, 3, 1, CNN_PAD, 1, 1, true));
    if (!st) st = kiln_module_add_child(m, "conv3", kiln_nn_conv2d(64, 128, 3, 1, CNN_PAD, 1, 1, true));
    if (!st) st = kiln_module_add_child(m, "pool", kiln_nn_max_pool2d(2, 2, 0));
    if (!st) st = kiln_module_add_child(m, "fc1", kiln_nn_linear(CNN_FLAT, 512, true));
    if (!st) st = kiln_module_add_child(m, "fc2", kiln_nn_linear(512, 10, true));
    if (!st) st = kiln_module_add_child(m, "relu", kiln_nn_relu());
    if (st) {
        kiln_module_free(m);
        return NULL;
    }
    return m;
}

/* ---- Inputs -------------------------------------------------------------------------- */

/* The CIFAR-10 recipe of `kiln bench loader`, batches pinned, last partial batch dropped. */
static kiln_status open_loader(cnn_bench *b, const cnn_config *cfg) {
    b->dataset = kiln_bench_synthetic_cifar((int64_t)cfg->batch * DATA_BATCHES);
    if (!b->dataset) return kiln_error_last()->status;
    kiln_loader_opts o = kiln_loader_opts_default();
    o.batch_size = cfg->batch;
    o.shuffle = true;
    o.seed = 1;
    o.drop_last = true;
    o.num_workers = cfg->workers;
    o.pin_memory = true;
    if (cfg->data == CNN_DATA_DEVICE) {
        o.on_device = KILN_DATA_ON_DEVICE_ON;
        o.num_workers = 0;
        o.pin_memory = false;
    }
    o.transforms.normalize = true;
    const float mean[3] = {0.4914f, 0.4822f, 0.4465f}, sd[3] = {0.2470f, 0.2435f, 0.2616f};
    for (int c = 0; c < 3; c++) o.transforms.mean[c] = mean[c], o.transforms.std[c] = sd[c];
    o.transforms.crop_padding = 4;
    o.transforms.pad_mode = KILN_PAD_REFLECT;
    o.transforms.flip_p = 0.5f;
    kiln_status st = kiln_loader_create(b->dataset, &o, &b->loader);
    return st ? st : kiln_loader_epoch_begin(b->loader, b->epoch);
}

/* The next loader batch (registered with the open scope), starting a new
 * epoch when one ends; the time spent waiting goes to b->wait_s. */
static kiln_status next_batch(cnn_bench *b, kiln_tensor **x, kiln_tensor **y) {
    double t0 = tool_now_s();
    kiln_status st = kiln_loader_next(b->loader, x, y);
    if (!st && !*x) {
        st = kiln_loader_epoch_begin(b->loader, ++b->epoch);
        if (!st) st = kiln_loader_next(b->loader, x, y);
    }
    b->wait_s += tool_now_s() - t0;
    return st;
}

static kiln_status cnn_setup(cnn_bench *b, const cnn_config *cfg) {
    kiln_manual_seed(0);
    b->model = kiln_bench_cnn_model();
    if (!b->model) return kiln_error_last()->status;
    kiln_tensor **params = NULL;
    int n = 0;
    kiln_status st = kiln_module_parameters(b->model, &params, &n);
    if (!st) b->opt = kiln_adam(params, n, NULL);
    free(params);
    if (st || !b->opt) return st ? st : kiln_error_last()->status;
    b->x = kiln_randn(KILN_SHAPE(cfg->batch, 3, CNN_SIDE, CNN_SIDE), KILN_F32, KILN_CPU);
    b->y = kiln_empty(KILN_SHAPE(cfg->batch), KILN_I64, KILN_CPU);
    if (!b->x || !b->y) return kiln_error_last()->status;
    int64_t *labels = kiln_data_ptr(b->y);
    uint64_t s = 88172645463325252ull;
    for (int i = 0; i < cfg->batch; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        labels[i] = (int64_t)(s % 10);
    }
    return cfg->data ? open_loader(b, cfg) : KILN_OK;
}

static void cnn_teardown(cnn_bench *b) {
    kiln_loader_free(b->loader);
    kiln_dataset_free(b->dataset);
    kiln_optimizer_free(b->opt);
    kiln_module_free(b->model);
    kiln_release(b->x);
    kiln_release(b->y);
}

/* ---- Steps --------------------------------------------------------------------------- */

/* With b->bf16 the forward and the loss run in an autocast region and
 * backward outside it, as PyTorch's bf16 recipe does (no loss scaling:
 * bf16 has f32's range). */
static kiln_status train_step(cnn_bench *b) {
    kiln_scope_begin();
    kiln_tensor *x = b->x, *y = b->y;
    kiln_status st = b->from_loader ? next_batch(b, &x, &y) : KILN_OK;
    if (!st && b->bf16) st = kiln_autocast_begin(KILN_DEVICE_CPU, KILN_BF16);
    kiln_tensor *logits = st ? NULL : kiln_module_forward(b->model, x);
    kiln_loss_opts lo = kiln_loss_defaults();
    kiln_tensor *loss = logits ? kiln_cross_entropy(logits, y, &lo) : NULL;
    if (!st && !loss) st = kiln_error_last()->status;
    if (b->bf16 && kiln_autocast_enabled(KILN_DEVICE_CPU)) {
        kiln_status end = kiln_autocast_end();
        if (!st) st = end;
    }
    if (!st) st = kiln_optimizer_zero_grad(b->opt, true);
    if (!st) st = kiln_backward(loss, NULL, false);
    if (!st) st = kiln_optimizer_step(b->opt);
    kiln_status end = kiln_scope_end();
    return st ? st : end;
}

static kiln_status infer_step(cnn_bench *b) {
    kiln_scope_begin();
    kiln_no_grad_begin();
    kiln_status st = b->bf16 ? kiln_autocast_begin(KILN_DEVICE_CPU, KILN_BF16) : KILN_OK;
    kiln_tensor *out = st ? NULL : kiln_module_forward(b->model, b->x);
    if (!st && !out) st = kiln_error_last()->status;
    if (b->bf16 && kiln_autocast_enabled(KILN_DEVICE_CPU)) {
        kiln_status end = kiln_autocast_end();
        if (!st) st = end;
    }
    kiln_status mode = kiln_grad_mode_end();
    kiln_status end = kiln_scope_end();
    return st ? st : mode ? mode : end;
}

/* n steps of one mode; *secs gets their wall time (the device is synchronised at the end). */
static kiln_status run_steps(cnn_bench *b, bool train, int n, double *secs) {
    kiln_module_train(b->model, train);
    double t0 = tool_now_s();
    kiln_status st = KILN_OK;
    for (int i = 0; i < n && !st; i++) st = train ? train_step(b) : infer_step(b);
    if (!st) st = kiln_device_synchronize(KILN_CPU);
    *secs = tool_now_s() - t0;
    kiln_module_train(b->model, true);
    return st;
}

/* One training step under the profiler; prints the top `rows` by self CPU
 * time, then each pass's GFLOP/s against the FMA peak (r->pass_gflop_s). */
static kiln_status profile_step(cnn_bench *b, int rows, cnn_results *r) {
    kiln_module_train(b->model, true);
    kiln_status st = kiln_profiler_start(NULL);
    if (st) return st;
    st = train_step(b);
    if (!st) st = kiln_device_synchronize(KILN_CPU);
    kiln_status stop = kiln_profiler_stop();
    if (st || stop) return st ? st : stop;
    char *table = kiln_profiler_table(KILN_SORT_SELF_CPU, rows);
    if (!table) return kiln_error_last()->status;
    printf("\nper-op breakdown of one training step (kiln profiler, top %d by self CPU):\n%s", rows, table);
    free(table);
    static const char *const passes[] = CNN_PASS_NAMES;
    printf("passes of that step against the FMA peak (%.1f GFLOP/s):", r->peak.gflop_s);
    for (int i = 0; i < CNN_PASSES; i++) {
        double g = 0, s = 0;
        if (!kiln_profiler_op_flops(passes[i], &g, &s) || s <= 0) continue;
        r->pass_gflop_s[i] = g / s;
        printf(" %s %.1f GFLOP/s", passes[i], g / s);
        if (r->peak.gflop_s > 0) printf(" (%.1f%%)", 100.0 * g / s / r->peak.gflop_s);
        printf(";");
    }
    printf("\n");
    return KILN_OK;
}

/* ---- Driver -------------------------------------------------------------------------------- */

static void usage(void) {
    fprintf(
        stderr,
        "usage: kiln bench cnn [--steps N] [--repeats N] [--warmup N] [--batch N]\n"
        "                      [--mode train|infer|both] [--no-peer] [--data [host|device]]\n"
        "                      [--workers N] [--profile-rows N] [--python PATH] [--peer-script PATH]\n"
        "                      [--device cpu|cuda:N] [--threads N] [--precision auto|f32|bf16|both]\n"
        "--threads N: Kiln's compute threads, and the PyTorch peer's (default: KILN_NUM_THREADS,\n"
        "else the cores less one)\n"
        "--precision: auto (default) runs f32, and bf16 too where the CPU has native bf16\n"
        "(avx512_bf16 or amx_bf16); bf16 or both on another CPU time emulated bf16 (a test of the path)\n");
}

/* 0 on success, 2 on a usage error. *precision: --precision's value. */
static int parse_args(int argc, char **argv, cnn_config *c, const char **precision) {
    *precision = "auto";
    *c = (cnn_config){.batch = 128,
                      .steps = 5,
                      .repeats = 3,
                      .warmup = 3,
                      .workers = kiln_num_loader_workers(),
                      .profile_rows = 15,
                      .mode = {true, true},
                      .peer = true,
                      .python = "/usr/bin/python3"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_value = i + 1 < argc;
        if (strcmp(a, "--steps") == 0 && has_value)
            c->steps = atoi(argv[++i]);
        else if (strcmp(a, "--repeats") == 0 && has_value)
            c->repeats = atoi(argv[++i]);
        else if (strcmp(a, "--warmup") == 0 && has_value)
            c->warmup = atoi(argv[++i]);
        else if (strcmp(a, "--batch") == 0 && has_value)
            c->batch = atoi(argv[++i]);
        else if (strcmp(a, "--workers") == 0 && has_value)
            c->workers = atoi(argv[++i]);
        else if (strcmp(a, "--profile-rows") == 0 && has_value)
            c->profile_rows = atoi(argv[++i]);
        else if (strcmp(a, "--python") == 0 && has_value)
            c->python = argv[++i];
        else if (strcmp(a, "--peer-script") == 0 && has_value)
            c->peer_script = argv[++i];
        else if (strcmp(a, "--device") == 0 && has_value)
            i++; /* cpu: any other device went to kiln_bench_cnn_device */
        else if (strcmp(a, "--precision") == 0 && has_value)
            *precision = argv[++i];
        else if (strcmp(a, "--no-peer") == 0)
            c->peer = false;
        else if (strcmp(a, "--data") == 0) {
            c->data = CNN_DATA_HOST;
            if (has_value && strcmp(argv[i + 1], "host") == 0)
                i++;
            else if (has_value && strcmp(argv[i + 1], "device") == 0)
                c->data = CNN_DATA_DEVICE, i++;
        } else if (strcmp(a, "--mode") == 0 && has_value) {
            const char *m = argv[++i];
            c->mode[CNN_TRAIN] = strcmp(m, "train") == 0 || strcmp(m, "both") == 0;
            c->mode[CNN_INFER] = strcmp(m, "infer") == 0 || strcmp(m, "both") == 0;
            if (!c->mode[CNN_TRAIN] && !c->mode[CNN_INFER]) {
                fprintf(stderr, "kiln bench cnn: --mode %s: use train, infer or both\n", m);
                return 2;
            }
        } else {
            usage();
            return 2;
        }
    }
    if (c->steps < 1 || c->repeats < 1 || c->repeats > CNN_MAX_REPEATS || c->warmup < 0 || c->batch < 1 ||
        c->workers < 0 || c->profile_rows < 0) {
        fprintf(stderr,
                "kiln bench cnn: need --steps >= 1, 1 <= --repeats <= %d, --warmup >= 0, --batch >= 1, "
                "--workers >= 0, --profile-rows >= 0\n",
                CNN_MAX_REPEATS);
        return 2;
    }
    if (strcmp(*precision, "auto") && strcmp(*precision, "f32") && strcmp(*precision, "bf16") &&
        strcmp(*precision, "both")) {
        fprintf(stderr, "kiln bench cnn: --precision %s: use auto, f32, bf16 or both\n", *precision);
        return 2;
    }
    return 0;
}

static double load_1m(void) {
    double l[1] = {-1};
    return getloadavg(l, 1) == 1 ? l[0] : -1;
}

/* --data: the round's f32 training steps from the loader and on the
 * preloaded batch, loader first on even rounds; the loader steps' time
 * goes to *train_secs (the denominator of the wait fraction). */
static kiln_status data_round(cnn_bench *b, const cnn_config *cfg, int round, cnn_series *k, cnn_results *r,
                              double *train_secs) {
    kiln_status st = KILN_OK;
    for (int i = 0; i < 2 && !st; i++) {
        bool loader = (i == 0) == (round % 2 == 0);
        b->from_loader = loader;
        double secs;
        st = run_steps(b, true, cfg->steps, &secs);
        if (st) break;
        cnn_series *s = loader ? k : &r->train_pre;
        s->v[s->n++] = (double)cfg->batch * cfg->steps / secs;
        if (loader) *train_secs += secs;
    }
    b->from_loader = false;
    return st;
}

/* One peer run into series p; a failure or a skip marks it missing with the reason. */
static void peer_round(const cnn_config *cfg, const char *script, int prec, int mode, int who,
                       cnn_results *r) {
    cnn_series *p = &r->s[prec][mode][who];
    bench_cnn_peer_result pr;
    bench_cnn_peer_run(cfg->python, script, mode == CNN_TRAIN ? "train" : "infer",
                       who == CNN_BEST ? "best" : "eager", prec == CNN_BF16, cfg->bf16_emulated, cfg->batch,
                       cfg->steps, cfg->warmup, kiln_num_threads(), &pr);
    if (!pr.ok) {
        p->missing = true;
        char *why = pr.skipped ? r->bf16_reason : r->peer_reason;
        size_t n = pr.skipped ? sizeof r->bf16_reason : sizeof r->peer_reason;
        if (!why[0]) snprintf(why, n, "%s", pr.reason);
        return;
    }
    p->v[p->n++] = pr.img_s;
    if (pr.rss_kib > r->peer_rss_kib[prec][mode][who]) r->peer_rss_kib[prec][mode][who] = pr.rss_kib;
    snprintf(r->torch_version, sizeof r->torch_version, "%s", pr.torch_version);
}

/* One round of one precision and mode: Kiln's timed steps, then PyTorch
 * eager's and PyTorch best's (each a fresh process). */
static kiln_status run_round(cnn_bench *b, const cnn_config *cfg, int round, int prec, int mode,
                             const char *script, cnn_results *r, double *train_secs) {
    cnn_series *k = &r->s[prec][mode][CNN_KILN];
    double secs;
    kiln_status st;
    b->bf16 = prec == CNN_BF16;
    if (mode == CNN_TRAIN && prec == CNN_F32 && cfg->data) {
        st = data_round(b, cfg, round, k, r, train_secs);
    } else {
        st = run_steps(b, mode == CNN_TRAIN, cfg->steps, &secs);
        if (!st) k->v[k->n++] = (double)cfg->batch * cfg->steps / secs;
    }
    b->bf16 = false;
    if (st || !script) return st;
    peer_round(cfg, script, prec, mode, CNN_EAGER, r);
    peer_round(cfg, script, prec, mode, CNN_BEST, r);
    return KILN_OK;
}

static kiln_status warm_up(cnn_bench *b, const cnn_config *cfg) {
    double secs;
    kiln_status st = KILN_OK;
    for (int p = 0; p < CNN_PRECISIONS && !st && cfg->warmup; p++) {
        if (!cfg->precision[p]) continue;
        b->bf16 = p == CNN_BF16;
        for (int m = 0; m < CNN_MODES && !st; m++)
            if (cfg->mode[m]) st = run_steps(b, m == CNN_TRAIN, cfg->warmup, &secs);
    }
    b->bf16 = false;
    if (!st && cfg->mode[CNN_TRAIN] && cfg->precision[CNN_F32] && cfg->data && cfg->warmup) {
        b->from_loader = true;
        st = run_steps(b, true, cfg->warmup, &secs);
        b->from_loader = false;
    }
    return st;
}

static kiln_status run_all(cnn_bench *b, const cnn_config *cfg, const char *script, cnn_results *r) {
    double train_secs = 0;
    kiln_status st = warm_up(b, cfg);
    b->wait_s = 0;
    double busy0 = bench_cpu_busy_s(), own0 = bench_cpu_own_s(), t0 = tool_now_s();
    for (int i = 0; i < cfg->repeats && !st; i++) {
        for (int p = 0; p < CNN_PRECISIONS && !st; p++)
            for (int m = 0; m < CNN_MODES && !st; m++)
                if (cfg->precision[p] && cfg->mode[m])
                    st = run_round(b, cfg, i, p, m, script, r, &train_secs);
        fprintf(stderr, "round %d/%d done\n", i + 1, cfg->repeats);
    }
    r->wait_frac = cfg->data && train_secs > 0 ? b->wait_s / train_secs : -1;
    double busy1 = bench_cpu_busy_s(), wall = tool_now_s() - t0;
    r->foreign_cores =
        busy0 >= 0 && busy1 >= 0 && wall > 0 ? (busy1 - busy0 - (bench_cpu_own_s() - own0)) / wall : -1;
    if (r->foreign_cores < 0 && busy0 >= 0 && busy1 >= 0) r->foreign_cores = 0; /* clock-tick rounding */
    return st;
}

/* Which precisions run (--precision), and why bf16 does not or runs emulated. */
static void choose_precisions(cnn_config *cfg, const char *precision, cnn_results *r) {
    bool f32 = strcmp(precision, "bf16") != 0, bf16 = strcmp(precision, "f32") != 0;
    bool native = r->cpu.native_bf16, asked = strcmp(precision, "auto") != 0;
    cfg->precision[CNN_F32] = f32;
    cfg->precision[CNN_BF16] = bf16 && (native || asked);
    cfg->bf16_emulated = cfg->precision[CNN_BF16] && !native;
    if (bf16 && !native)
        snprintf(
            r->bf16_reason, sizeof r->bf16_reason,
            "this CPU has no native bf16 (neither avx512_bf16 nor amx_bf16 in /proc/cpuinfo): %s",
            asked ? "--precision asked for it, so both sides time emulated bf16, a test of the path and not "
                    "a measure of speed"
                  : "bf16 skipped on both sides (--precision bf16 or both times the emulation anyway)");
    else if (cfg->precision[CNN_BF16] && !r->kiln_bf16_fast)
        snprintf(r->bf16_reason, sizeof r->bf16_reason,
                 "the CPU has native bf16, but this build's fast CPU kernels run no bf16 conv/matmul (built "
                 "without oneDNN): Kiln's bf16 takes the reference kernels");
}

int kiln_bench_cnn(int argc, char **argv) {
    /* --device cuda:N: the GPU variant (bench/gpu.c); --device cpu is this one. */
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--device") == 0 && strcmp(argv[i + 1], "cpu") != 0)
            return kiln_bench_cnn_device(argc, argv);
    cnn_config cfg;
    const char *precision;
    int rc = parse_args(argc, argv, &cfg, &precision);
    if (rc) return rc;
    /* A CPU benchmark: its model is built on the current device, which is
     * the first GPU where there is one (kiln_default_device). */
    if (kiln_init() || kiln_set_device(KILN_CPU)) {
        fprintf(stderr, "kiln bench cnn: %s\n", kiln_error_message());
        return 1;
    }
    cnn_results r;
    memset(&r, 0, sizeof r);
    r.wait_frac = -1;
    bench_cpu_info_get(&r.cpu);
    r.kiln_bf16_fast = kiln_kernels_fast_covers(KILN_DEVICE_CPU, "conv2d", KILN_BF16) &&
                       kiln_kernels_fast_covers(KILN_DEVICE_CPU, "mm", KILN_BF16);
    choose_precisions(&cfg, precision, &r);
    char script_buf[4096];
    const char *script = NULL;
    if (cfg.peer)
        script = bench_cnn_peer_find(cfg.peer_script, script_buf, sizeof script_buf, r.peer_reason,
                                     sizeof r.peer_reason);
    if (cfg.peer && !script) {
        for (int p = 0; p < CNN_PRECISIONS; p++)
            for (int m = 0; m < CNN_MODES; m++)
                r.s[p][m][CNN_EAGER].missing = r.s[p][m][CNN_BEST].missing = true;
    } else if (!cfg.peer) {
        snprintf(r.peer_reason, sizeof r.peer_reason, "--no-peer");
    }
    r.load_before = load_1m();
    printf("kiln bench cnn: OptimizedCNN 3x32x32, batch %d, Adam 1e-3, cross-entropy; %d warm-up, %d rounds "
           "of %d steps; %d threads (kiln and peer); precisions %s%s; inputs %s; peer %s%s\n",
           cfg.batch, cfg.warmup, cfg.repeats, cfg.steps, kiln_num_threads(),
           cfg.precision[CNN_F32] ? "f32" : "",
           cfg.precision[CNN_BF16] ? (cfg.precision[CNN_F32] ? " bf16" : "bf16") : "",
           cfg.data == CNN_DATA_HOST ? "from the loader (synthetic CIFAR, host path) and fixed randn"
           : cfg.data == CNN_DATA_DEVICE
               ? "from the loader (synthetic CIFAR, dataset on the device) and fixed randn"
               : "fixed randn",
           script ? script : "off", script ? " (eager and best setups)" : "");
    fflush(stdout);
    /* The peak first, on the benchmark's own thread count, before anything else runs. */
    bench_fma_peak_measure(kiln_num_threads(), 0.5, &r.peak);
    cnn_bench b;
    memset(&b, 0, sizeof b);
    kiln_status st = cnn_setup(&b, &cfg);
    if (!st) st = cnn_flops(b.model, cfg.batch, &r.gflop_fwd, &r.gflop_train);
    if (!st) st = run_all(&b, &cfg, script, &r);
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) r.kiln_rss_kib = ru.ru_maxrss;
    r.load_after = load_1m();
    if (!st) cnn_print_table(&cfg, &r);
    if (!st && cfg.profile_rows > 0) st = profile_step(&b, cfg.profile_rows, &r);
    if (st)
        fprintf(stderr, "kiln bench cnn: %s\n", kiln_error_message());
    else
        cnn_print_json(&cfg, &r);
    cnn_teardown(&b);
    return st ? 1 : 0;
}

/* kiln bench trace: what tracing removes, on the CPU.
 *
 *   1. the tutorial CNN (3x32x32) inference at batch 1, 8 and 128: eager
 *      forward (eval, grad off) against kiln_program_run of its trace,
 *      calls per second;
 *   2. the training step (zero_grad, forward, cross entropy, backward,
 *      Adam) at batch 1, 8, 32 and 128: eager against the replayed trace;
 *   3. the host overhead per op: a chain of 256 ReLUs on one element
 *      (the kernel is a few ns, so the time is the framework's), eager and
 *      replayed, ns per op;
 *   4. beside it, PyTorch eager and its best inference setup
 *      (torch.jit.trace + torch.jit.freeze) at batch 1, by
 *      bench/peer/torch_cnn_bench.py --mode infer, when python3 with torch
 *      is there; otherwise the table says why it has no peer row.
 *
 * Each figure is the median of --rounds interleaved rounds (eager, traced,
 * eager, traced, ...), each round long enough (about --round-ms) to be
 * timed well, the device synchronised at the end of each. --device cuda:N
 * runs the model there: the replay is then one CUDA graph per call
 * (docs/trace.md), and the emulation build adds each side's kernel
 * launches and graph launches per call (on the emulator the times are the
 * emulator's, not a GPU's; the PyTorch row is the CPU's only). The last
 * line is JSON. Usage:
 *   kiln bench trace [--rounds N] [--round-ms MS] [--quick] [--no-peer]
 *                    [--python PATH] [--peer-script PATH] [--device D] [--max-batch N]
 * --max-batch N leaves out the larger batches (a short run on the emulator). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cnn_peer.h"
#if defined(KILN_CUDA_EMULATION)
#include "emu/kiln_emu_api.h"
#endif

typedef struct trace_cfg {
    int rounds;
    double round_s;
    bool quick, peer;
    const char *python, *peer_script;
    kiln_device device;
    int64_t max_batch; /* --max-batch: leave out larger batches (0: none left out) */
} trace_cfg;

typedef struct pair {
    double eager_s, traced_s; /* median seconds per call */
    /* emulation build, CUDA device: per call, kernel launches and graph
     * launches of each side (-1: not counted) */
    double eager_launches, traced_launches, traced_graphs;
} pair;

/* ---- What is timed ------------------------------------------------------------------ */

typedef struct train_ctx {
    kiln_module *m;
    kiln_optimizer *opt;
} train_ctx;

static kiln_status infer_fn(void *user, kiln_tensor *const *in, kiln_tensor **out) {
    out[0] = kiln_module_forward((kiln_module *)user, in[0]);
    return out[0] ? KILN_OK : kiln_error_last()->status;
}

static kiln_status train_fn(void *user, kiln_tensor *const *in, kiln_tensor **out) {
    train_ctx *t = user;
    kiln_status st = kiln_optimizer_zero_grad(t->opt, true);
    if (st) return st;
    kiln_tensor *y = kiln_module_forward(t->m, in[0]);
    kiln_tensor *loss = y ? kiln_cross_entropy(y, in[1], NULL) : NULL;
    kiln_release(y);
    if (!loss) return kiln_error_last()->status;
    st = kiln_backward(loss, NULL, false);
    if (!st) st = kiln_optimizer_step(t->opt);
    if (st) {
        kiln_release(loss);
        return st;
    }
    out[0] = loss;
    return KILN_OK;
}

#define RELU_CHAIN 256

static kiln_status relu_chain_fn(void *user, kiln_tensor *const *in, kiln_tensor **out) {
    (void)user;
    kiln_tensor *x = kiln_relu(in[0]);
    for (int i = 1; x && i < RELU_CHAIN; i++) {
        kiln_tensor *y = kiln_relu(x);
        kiln_release(x);
        x = y;
    }
    out[0] = x;
    return x ? KILN_OK : kiln_error_last()->status;
}

/* One call of either side: eager runs fn, traced runs the program. */
typedef struct side {
    kiln_trace_fn fn;
    void *user;
    kiln_program *p;
    int n_in;
    kiln_tensor **in;
    kiln_device device;
} side;

static kiln_status call(const side *s, bool traced) {
    kiln_tensor *out = NULL;
    kiln_status st = traced ? kiln_program_run(s->p, s->n_in, s->in, 1, &out) : s->fn(s->user, s->in, &out);
    kiln_release(out);
    return st;
}

/* Calls per round so a round lasts about round_s (from one timed call). */
static int calls_per_round(const side *s, double round_s) {
    double t0 = tool_now_s();
    if (call(s, false)) return -1;
    double dt = tool_now_s() - t0;
    int n = dt > 0 ? (int)(round_s / dt) : 1000;
    return n < 1 ? 1 : n > 5000 ? 5000 : n;
}

/* The emulator's launch counts per call of each side (CUDA devices in the
 * emulation build; -1 elsewhere). */
static void count_launches(const side *s, pair *out) {
    out->eager_launches = out->traced_launches = out->traced_graphs = -1;
#if defined(KILN_CUDA_EMULATION)
    if (s->device.type != KILN_DEVICE_CUDA) return;
    enum { CALLS = 2 };
    for (int k = 0; k < 2; k++) {
        kiln_emu_stats a, b;
        if (kiln_device_synchronize(s->device)) return;
        kiln_emu_get_stats(&a);
        for (int i = 0; i < CALLS; i++)
            if (call(s, k == 1)) return;
        if (kiln_device_synchronize(s->device)) return;
        kiln_emu_get_stats(&b);
        double launches = (double)(b.launches - a.launches) / CALLS;
        if (k == 0) out->eager_launches = launches;
        else out->traced_launches = launches, out->traced_graphs = (double)(b.graph_launches - a.graph_launches) / CALLS;
    }
#else
    (void)s;
#endif
}

static int measure(const side *s, const trace_cfg *cfg, pair *out) {
    int n = calls_per_round(s, cfg->round_s);
    if (n < 0 || call(s, true) || call(s, true)) return -1; /* the first replay allocates */
    if (kiln_device_synchronize(s->device)) return -1;
    double *e = calloc((size_t)cfg->rounds, sizeof *e), *t = calloc((size_t)cfg->rounds, sizeof *t);
    if (!e || !t) {
        free(e), free(t);
        return -1;
    }
    int rc = 0;
    for (int r = 0; r < cfg->rounds && !rc; r++) {
        for (int k = 0; k < 2 && !rc; k++) {
            bool traced = k == 1;
            double t0 = tool_now_s();
            for (int i = 0; i < n && !rc; i++) rc = call(s, traced) ? -1 : 0;
            if (!rc && kiln_device_synchronize(s->device)) rc = -1;
            (traced ? t : e)[r] = (tool_now_s() - t0) / n;
        }
    }
    if (!rc) *out = (pair){tool_median(e, cfg->rounds), tool_median(t, cfg->rounds), -1, -1, -1};
    if (!rc) count_launches(s, out);
    free(e), free(t);
    return rc;
}

static int fail(const char *what) {
    fprintf(stderr, "kiln bench trace: %s: %s\n", what, kiln_error_message());
    return 1;
}

/* ---- The three measurements ---------------------------------------------------------- */

static int bench_infer(const trace_cfg *cfg, int64_t batch, pair *out) {
    kiln_module *m = kiln_bench_cnn_model();
    if (!m || kiln_module_to(m, cfg->device)) {
        kiln_module_free(m);
        return fail("the tutorial CNN");
    }
    kiln_module_train(m, false);
    kiln_no_grad_begin();
    kiln_tensor *x = kiln_randn(KILN_SHAPE(batch, 3, 32, 32), KILN_F32, cfg->device);
    side s = {.fn = infer_fn, .user = m, .n_in = 1, .in = &x, .device = cfg->device};
    int rc = x && !kiln_trace(infer_fn, m, 1, &x, 1, NULL, &s.p) ? measure(&s, cfg, out) : -1;
    if (rc) fail("inference");
    kiln_program_free(s.p);
    kiln_release(x);
    kiln_grad_mode_end();
    kiln_module_free(m);
    return rc;
}

static int bench_train(const trace_cfg *cfg, int64_t batch, pair *out) {
    train_ctx t = {.m = kiln_bench_cnn_model()};
    if (!t.m || kiln_module_to(t.m, cfg->device)) {
        kiln_module_free(t.m);
        return fail("the tutorial CNN");
    }
    kiln_tensor **params = NULL;
    int n = 0;
    kiln_adam_opts o = kiln_adam_defaults();
    if (!kiln_module_parameters(t.m, &params, &n)) t.opt = kiln_adam(params, n, &o);
    free(params);
    kiln_tensor *in[2] = {kiln_randn(KILN_SHAPE(batch, 3, 32, 32), KILN_F32, cfg->device), NULL};
    int64_t *labels = calloc((size_t)batch, sizeof *labels);
    for (int64_t i = 0; labels && i < batch; i++) labels[i] = i % 10;
    kiln_tensor *host = labels ? kiln_from_data(KILN_SHAPE(batch), KILN_I64, KILN_CPU, labels) : NULL;
    in[1] = host ? kiln_to(host, cfg->device, KILN_I64, 0) : NULL;
    kiln_release(host);
    free(labels);
    side s = {.fn = train_fn, .user = &t, .n_in = 2, .in = in, .device = cfg->device};
    kiln_tensor *warm = NULL;
    int rc = t.opt && in[0] && in[1] && !train_fn(&t, in, &warm) ? 0 : -1; /* Adam's state before the trace */
    kiln_release(warm);
    if (!rc) rc = kiln_trace(train_fn, &t, 2, in, 1, NULL, &s.p) ? -1 : measure(&s, cfg, out);
    if (rc) fail("training step");
    kiln_program_free(s.p);
    kiln_release(in[0]), kiln_release(in[1]);
    kiln_optimizer_free(t.opt);
    kiln_module_free(t.m);
    return rc;
}

static int bench_overhead(const trace_cfg *cfg, pair *out) {
    kiln_no_grad_begin();
    kiln_tensor *x = kiln_randn(KILN_SHAPE(1), KILN_F32, cfg->device);
    side s = {.fn = relu_chain_fn, .n_in = 1, .in = &x, .device = cfg->device};
    int rc = x && !kiln_trace(relu_chain_fn, NULL, 1, &x, 1, NULL, &s.p) ? measure(&s, cfg, out) : -1;
    if (rc) fail("per-op overhead");
    out->eager_s /= RELU_CHAIN, out->traced_s /= RELU_CHAIN;
    kiln_program_free(s.p);
    kiln_release(x);
    kiln_grad_mode_end();
    return rc;
}

/* ---- Report ---------------------------------------------------------------------------- */

static int parse(int argc, char **argv, trace_cfg *c) {
    *c = (trace_cfg){.rounds = 7, .round_s = 0.25, .peer = true, .python = "/usr/bin/python3", .device = KILN_CPU};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool v = i + 1 < argc;
        if (!strcmp(a, "--rounds") && v)
            c->rounds = atoi(argv[++i]);
        else if (!strcmp(a, "--round-ms") && v)
            c->round_s = atof(argv[++i]) / 1000.0;
        else if (!strcmp(a, "--quick"))
            c->quick = true, c->rounds = 3, c->round_s = 0.02;
        else if (!strcmp(a, "--no-peer"))
            c->peer = false;
        else if (!strcmp(a, "--python") && v)
            c->python = argv[++i];
        else if (!strcmp(a, "--peer-script") && v)
            c->peer_script = argv[++i];
        else if (!strcmp(a, "--max-batch") && v)
            c->max_batch = atoll(argv[++i]);
        else if (!strcmp(a, "--device") && v) {
            const char *d = argv[++i];
            if (kiln_device_parse(d, &c->device) != KILN_OK || c->device.type == KILN_DEVICE_META) {
                fprintf(stderr, "kiln bench trace: --device %s: %s (give cpu or cuda:N as kiln info lists them)\n", d,
                        c->device.type == KILN_DEVICE_META ? "meta tensors hold no data" : kiln_error_message());
                return 2;
            }
        } else {
            fprintf(stderr, "usage: kiln bench trace [--rounds N] [--round-ms MS] [--quick] [--no-peer] "
                            "[--python PATH] [--peer-script PATH] [--device D] [--max-batch N]\n");
            return 2;
        }
    }
    if (c->rounds < 1 || c->rounds > 101 || !(c->round_s > 0) || c->max_batch < 0) {
        fprintf(stderr, "kiln bench trace: --rounds takes 1..101, --round-ms a positive number and --max-batch a "
                        "batch size\n");
        return 2;
    }
    return 0;
}

/* PyTorch at batch 1: eager and frozen TorchScript, ms per call; *why
 * says why not when there is no figure. */
static void peer_row(const trace_cfg *cfg, const char *setup, double *ms, char *why, size_t n) {
    *ms = 0;
    char path[1024], tried[512];
    const char *script = bench_cnn_peer_find(cfg->peer_script, path, sizeof path, tried, sizeof tried);
    if (!script) {
        snprintf(why, n, "no peer script (%s)", tried);
        return;
    }
    bench_cnn_peer_result r;
    bench_cnn_peer_run(cfg->python, script, "infer", setup, false, false, 1, cfg->quick ? 20 : 500, 20,
                       kiln_num_threads(), &r);
    if (r.ok && r.img_s > 0)
        *ms = 1000.0 / r.img_s;
    else
        snprintf(why, n, "%s", r.reason[0] ? r.reason : "the peer gave no result");
}

/* The launch counts of a row ("launches": null where not counted), closing it. */
static void json_launches(const pair *p) {
    if (p->eager_launches < 0)
        printf(",\"launches\":null}");
    else
        printf(",\"launches\":{\"eager\":%.1f,\"replay\":%.1f,\"replay_graphs\":%.1f}}", p->eager_launches,
               p->traced_launches, p->traced_graphs);
}

/* A figure, or null where there is none. */
static void json_ms(double ms) {
    if (ms > 0)
        printf("%.4f", ms);
    else
        printf("null");
}

int kiln_bench_trace(int argc, char **argv) {
    trace_cfg cfg;
    int rc = parse(argc, argv, &cfg);
    if (rc) return rc;
    static const int64_t infer_all[] = {1, 8, 128}, train_all[] = {1, 8, 32, 128};
    int64_t infer_b[3], train_b[4];
    int n_inf = 0, n_tr = 0;
    for (int i = 0; i < 3; i++) {
        int64_t b = cfg.quick ? 1 + i : infer_all[i];
        if (!cfg.max_batch || b <= cfg.max_batch) infer_b[n_inf++] = b;
    }
    for (int i = 0; i < 4; i++) {
        int64_t b = cfg.quick ? 1 + i : train_all[i];
        if (!cfg.max_batch || b <= cfg.max_batch) train_b[n_tr++] = b;
    }
    pair inf[3], tr[4], op;
    for (int i = 0; i < n_inf; i++)
        if (bench_infer(&cfg, infer_b[i], &inf[i])) return 1;
    for (int i = 0; i < n_tr; i++)
        if (bench_train(&cfg, train_b[i], &tr[i])) return 1;
    if (bench_overhead(&cfg, &op)) return 1;
    double peer_eager = 0, peer_frozen = 0;
    char why_e[600] = "not asked for (--no-peer)", why_f[600] = "not asked for (--no-peer)";
    bool on_cpu = cfg.device.type == KILN_DEVICE_CPU;
    if (!on_cpu) {
        snprintf(why_e, sizeof why_e, "the peer row is the CPU's (run without --device)");
        snprintf(why_f, sizeof why_f, "%s", why_e);
    } else if (cfg.peer) {
        peer_row(&cfg, "eager", &peer_eager, why_e, sizeof why_e);
        peer_row(&cfg, "best", &peer_frozen, why_f, sizeof why_f);
    }
    char dev[32];
    kiln_device_str(cfg.device, dev, sizeof dev);
    printf("kiln bench trace: tutorial CNN 3x32x32 on %s%s, %d threads, median of %d interleaved rounds\n",
           on_cpu ? "the CPU" : dev, on_cpu ? "" : " (the replay is one CUDA graph per call)", kiln_num_threads(),
           cfg.rounds);
    printf("\ninference      eager calls/s  traced calls/s  eager ms  traced ms  traced/eager\n");
    for (int i = 0; i < n_inf; i++)
        printf("  batch %-5lld %14.1f %15.1f %9.3f %10.3f %12.2fx\n",
               (long long)infer_b[i], 1 / inf[i].eager_s, 1 / inf[i].traced_s,
               inf[i].eager_s * 1e3, inf[i].traced_s * 1e3, inf[i].traced_s / inf[i].eager_s);
    printf("\ntraining step  eager steps/s  replay steps/s  eager ms  replay ms  speed-up\n");
    for (int i = 0; i < n_tr; i++)
        printf("  batch %-5lld %14.1f %15.1f %9.3f %10.3f %9.2fx\n",
               (long long)train_b[i], 1 / tr[i].eager_s, 1 / tr[i].traced_s,
               tr[i].eager_s * 1e3, tr[i].traced_s * 1e3, tr[i].eager_s / tr[i].traced_s);
    printf("\nhost overhead per op (relu on 1 element, %d in a chain): eager %.0f ns, replay %.0f ns\n",
           RELU_CHAIN, op.eager_s * 1e9, op.traced_s * 1e9);
    if (n_tr && tr[0].eager_launches >= 0) {
        printf("\nper call on %s (the emulator's counts): kernel launches eager / replayed, graph launches replayed\n",
               dev);
        for (int i = 0; i < n_inf; i++)
            printf("  inference batch %-5lld %6.1f / %6.1f, %4.1f\n", (long long)infer_b[i],
                   inf[i].eager_launches, inf[i].traced_launches, inf[i].traced_graphs);
        for (int i = 0; i < n_tr; i++)
            printf("  training  batch %-5lld %6.1f / %6.1f, %4.1f\n", (long long)train_b[i],
                   tr[i].eager_launches, tr[i].traced_launches, tr[i].traced_graphs);
    }
    printf("\nPyTorch at batch 1 (bench/peer/torch_cnn_bench.py --mode infer):\n");
    if (peer_eager > 0)
        printf("  eager                     %.3f ms\n", peer_eager);
    else
        printf("  eager                     no figure: %s\n", why_e);
    if (peer_frozen > 0)
        printf("  jit.trace + jit.freeze    %.3f ms\n", peer_frozen);
    else
        printf("  jit.trace + jit.freeze    no figure: %s\n", why_f);
    printf("{\"bench\":\"trace\",\"threads\":%d,\"rounds\":%d,\"device\":\"%s\",\"infer\":[", kiln_num_threads(),
           cfg.rounds, dev);
    for (int i = 0; i < n_inf; i++) {
        printf("%s{\"batch\":%lld,\"eager_ms\":%.4f,\"traced_ms\":%.4f", i ? "," : "",
               (long long)infer_b[i], inf[i].eager_s * 1e3, inf[i].traced_s * 1e3);
        json_launches(&inf[i]);
    }
    printf("],\"train\":[");
    for (int i = 0; i < n_tr; i++) {
        printf("%s{\"batch\":%lld,\"eager_ms\":%.4f,\"replay_ms\":%.4f", i ? "," : "",
               (long long)train_b[i], tr[i].eager_s * 1e3, tr[i].traced_s * 1e3);
        json_launches(&tr[i]);
    }
    printf("],\"op_ns\":{\"eager\":%.1f,\"replay\":%.1f},\"peer\":{\"eager_ms\":", op.eager_s * 1e9,
           op.traced_s * 1e9);
    json_ms(peer_eager);
    printf(",\"frozen_ms\":");
    json_ms(peer_frozen);
    printf("}}\n");
    return 0;
}

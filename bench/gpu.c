/* GPU benchmarks (docs/cuda.md, "Fast paths"; run by scripts/gpu-check.sh).
 * Each needs a CUDA device and exits 77 with the reason when there is none.
 *
 *   kiln bench cnn --device cuda:N [--batch N] [--steps N] [--warmup N] [--repeats N]
 *       the tutorial CNN (bench/cnn_step.c's model) on the device: train and
 *       infer images/s with cuDNN autotuning off, then on
 *       (kiln_set_cudnn_benchmark; the first, untimed, steps of that round
 *       do the timing); then, autotuning on, f32 with TF32 allowed
 *       (kiln_set_allow_tf32: PyTorch's default for convolutions), under f16
 *       autocast with the grad scaler (AMP), and each of f32, AMP and TF32
 *       replayed as one CUDA graph
 *       (kiln_trace + kiln_program_run: the step captured once, then one
 *       graph launch per step; a setup that cannot be traced gets null and
 *       the reason); in the emulation build
 *       also Kiln's CUDA runtime calls per steady-state training step
 *       (docs/cuda.md, "Host calls per step"; null elsewhere);
 *   kiln bench copy [--device cuda:N] [--mb N] [--repeats N]
 *       host-to-device GB/s from pageable and from pinned memory;
 *   kiln bench gemm [--device cuda:N] [--size N] [--repeats N]
 *       square mm TFLOP/s (cuBLASLt through the fast table) in f32, f32
 *       with TF32, f16 and bf16, against the device's dense peak where the
 *       device is one the table below knows.
 * Each prints a table, then one JSON line with the figures. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "kiln/kiln.h"
#if defined(KILN_CUDA_EMULATION)
#include "emu/count/emu_call_counts.h"
#endif

typedef struct gpu_args {
    kiln_device device;
    int batch, steps, warmup, repeats, mb, size;
} gpu_args;

/* Common options; 2 on a usage error. */
static int parse(const char *bench, int argc, char **argv, gpu_args *g) {
    g->device = KILN_CUDA(0);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool v = i + 1 < argc;
        if (!strcmp(a, "--device") && v) {
            const char *d = argv[++i];
            /* cuda:N by hand: kiln_device_parse rejects a device that is not
             * there, and an absent GPU is a skip (77), not a usage error. */
            if (!strncmp(d, "cuda", 4) && (!d[4] || (d[4] == ':' && d[5] >= '0' && d[5] <= '9'))) {
                g->device = KILN_CUDA(d[4] ? atoi(d + 5) : 0);
            } else if (kiln_device_parse(d, &g->device) != KILN_OK) {
                fprintf(stderr, "kiln bench %s: %s\n", bench, kiln_error_message());
                return 2;
            }
        } else if (!strcmp(a, "--batch") && v) {
            g->batch = atoi(argv[++i]);
        } else if (!strcmp(a, "--steps") && v) {
            g->steps = atoi(argv[++i]);
        } else if (!strcmp(a, "--warmup") && v) {
            g->warmup = atoi(argv[++i]);
        } else if (!strcmp(a, "--repeats") && v) {
            g->repeats = atoi(argv[++i]);
        } else if (!strcmp(a, "--mb") && v) {
            g->mb = atoi(argv[++i]);
        } else if (!strcmp(a, "--size") && v) {
            g->size = atoi(argv[++i]);
        } else if (!strcmp(a, "--no-peer") || !strcmp(a, "--mode") || !strcmp(a, "--profile-rows")) {
            if (strcmp(a, "--no-peer")) i++; /* cnn's CPU options: no meaning on the device */
        } else {
            fprintf(stderr, "kiln bench %s: unknown option '%s'\n", bench, a);
            return 2;
        }
    }
    if (g->device.type != KILN_DEVICE_CUDA) {
        fprintf(stderr,
                "kiln bench %s: --device must be cuda:N (the CPU benchmarks are kiln bench cnn/alloc)\n",
                bench);
        return 2;
    }
    if (g->batch < 0 || g->steps < 0 || g->warmup < 0 || g->repeats < 0 || g->mb < 0 || g->size < 0) {
        fprintf(stderr, "kiln bench %s: counts and sizes must be positive\n", bench);
        return 2;
    }
    return 0;
}

/* 0 when the device is there; else prints why and returns 77. */
static int need_device(const char *bench, kiln_device d) {
    if (kiln_init() != KILN_OK) {
        fprintf(stderr, "kiln bench %s: %s\n", bench, kiln_error_message());
        return 1;
    }
    int n = kiln_device_count(KILN_DEVICE_CUDA);
    if (d.index < n) return 0;
    printf(
        "kiln bench %s: SKIPPED: cuda:%d is not there (%d CUDA device%s visible: no GPU or no driver, or a "
        "build without CUDA: %s)\n",
        bench, d.index, n, n == 1 ? "" : "s", kiln_build_options());
    return 77;
}

/* ---- cnn --device -------------------------------------------------------------------------- */

typedef struct cnn_dev {
    kiln_module *model;
    kiln_optimizer *opt;
    kiln_tensor *x, *y;
    kiln_device device;
    kiln_grad_scaler *scaler; /* AMP: forward and loss under f16 autocast, the loss scaled */
    kiln_program *program;    /* replay this instead of the eager step (CUDA graph) */
} cnn_dev;

/* The step as a traceable call: inputs (x, y), one output (the loss, or
 * the logits). train: zero_grad, forward, cross-entropy, backward, Adam
 * (with the scaler's scale, step and update under AMP); else the forward
 * under no_grad. */
typedef struct cnn_call {
    cnn_dev *b;
    bool train;
} cnn_call;

static kiln_status cnn_fn(void *user, kiln_tensor *const *in, kiln_tensor **out) {
    const cnn_call *c = user;
    cnn_dev *b = c->b;
    kiln_status st = KILN_OK;
    if (!c->train) kiln_no_grad_begin();
    if (b->scaler) st = kiln_autocast_begin(KILN_DEVICE_CUDA, KILN_F16);
    kiln_tensor *logits = st ? NULL : kiln_module_forward(b->model, in[0]);
    kiln_tensor *loss = NULL;
    if (c->train && logits) {
        kiln_loss_opts lo = kiln_loss_defaults();
        loss = kiln_cross_entropy(logits, in[1], &lo);
        kiln_release(logits);
        logits = NULL;
    }
    if (!st && !logits && !loss) st = kiln_error_last()->status;
    if (b->scaler) {
        kiln_status e = kiln_autocast_end();
        if (!st) st = e;
    }
    if (!c->train) {
        kiln_status m = kiln_grad_mode_end();
        if (!st) st = m;
        if (st) kiln_release(logits);
        else out[0] = logits;
        return st;
    }
    if (!st) st = kiln_optimizer_zero_grad(b->opt, true);
    if (!st && b->scaler) {
        kiln_tensor *scaled = kiln_grad_scaler_scale(b->scaler, loss);
        st = scaled ? kiln_backward(scaled, NULL, false) : kiln_error_last()->status;
        if (!st) st = kiln_grad_scaler_step(b->scaler, b->opt, NULL);
        if (!st) st = kiln_grad_scaler_update(b->scaler);
    } else if (!st) {
        st = kiln_backward(loss, NULL, false);
        if (!st) st = kiln_optimizer_step(b->opt);
    }
    if (st) kiln_release(loss);
    else out[0] = loss;
    return st;
}

static kiln_status cnn_step(cnn_dev *b, bool train) {
    kiln_scope_begin();
    cnn_call c = {b, train};
    kiln_tensor *in[2] = {b->x, b->y}, *out = NULL;
    kiln_status st = b->program ? kiln_program_run(b->program, train ? 2 : 1, in, 1, &out) : cnn_fn(&c, in, &out);
    kiln_release(out);
    kiln_status end = kiln_scope_end();
    return st ? st : end;
}

/* Best images/s over `repeats` rounds of `steps` (after `warmup` untimed steps). */
static kiln_status cnn_rate(cnn_dev *b, bool train, const gpu_args *g, double *ips) {
    kiln_module_train(b->model, train);
    kiln_status st = KILN_OK;
    for (int i = 0; i < g->warmup && !st; i++) st = cnn_step(b, train);
    if (!st) st = kiln_device_synchronize(b->device);
    *ips = 0;
    for (int r = 0; r < g->repeats && !st; r++) {
        double t0 = tool_now_s();
        for (int i = 0; i < g->steps && !st; i++) st = cnn_step(b, train);
        if (!st) st = kiln_device_synchronize(b->device);
        double v = (double)g->batch * g->steps / (tool_now_s() - t0);
        if (v > *ips) *ips = v;
    }
    kiln_module_train(b->model, true);
    return st;
}

/* Kiln's CUDA runtime calls per training step in the steady state, as JSON
 * members written into out: counted on the emulator (src/emu/count/) over
 * two steps after one more warm step: every call the steps made, by name
 * ("kernel_launch", "cudaGetLastError", ...) and host_calls_other, the
 * calls that are neither launches nor their launch checks. Elsewhere the
 * runtime is not wrapped: null and why. The table line goes to stdout. */
static kiln_status cnn_host_calls(cnn_dev *b, char *out, size_t size) {
#if defined(KILN_CUDA_EMULATION)
    enum { STEPS = 2 };
    kiln_module_train(b->model, true);
    kiln_status st = cnn_step(b, true);
    if (!st) st = kiln_device_synchronize(b->device);
    kiln_emu_call_counts_reset();
    for (int i = 0; i < STEPS && !st; i++) st = cnn_step(b, true);
    unsigned long long n[KILN_EMU_CALL_COUNT];
    kiln_emu_call_counts_get(n); /* before the synchronisation, which is not the steps' */
    if (!st) st = kiln_device_synchronize(b->device);
    if (st) return st;
    size_t used = (size_t)snprintf(out, size, "\"host_calls_per_step\":{");
    double other = 0;
    printf("host calls per training step (emulated runtime, %d steps):", STEPS);
    for (int i = 0, first = 1; i < KILN_EMU_CALL_COUNT; i++) {
        if (!n[i]) continue;
        double v = (double)n[i] / STEPS;
        if (i != KILN_EMU_CALL_kernel_launch && i != KILN_EMU_CALL_cudaGetLastError) other += v;
        printf(" %s %g", kiln_emu_call_name(i), v);
        if (used < size)
            used += (size_t)snprintf(out + used, size - used, "%s\"%s\":%g", first ? "" : ",",
                                     kiln_emu_call_name(i), v);
        first = 0;
    }
    printf("; other than launches and their checks: %g\n", other);
    if (used < size) snprintf(out + used, size - used, "},\"host_calls_other\":%g", other);
    return KILN_OK;
#else
    (void)b;
    snprintf(out, size,
             "\"host_calls_per_step\":null,\"host_calls_reason\":\"counted only in the emulation build "
             "(KILN_CUDA_EMULATION): the real CUDA runtime is not wrapped\"");
    return KILN_OK;
#endif
}

int kiln_bench_cnn_device(int argc, char **argv) {
    gpu_args g = {.batch = 128, .steps = 20, .warmup = 5, .repeats = 3};
    int rc = parse("cnn", argc, argv, &g);
    if (rc) return rc;
    if (!g.batch || !g.steps || !g.repeats) {
        fprintf(stderr, "kiln bench cnn: need --batch, --steps and --repeats >= 1\n");
        return 2;
    }
    rc = need_device("cnn", g.device);
    if (rc) return rc;
    char dev[32];
    kiln_device_str(g.device, dev, sizeof dev);
    cnn_dev b = {.device = g.device};
    kiln_status st = (b.model = kiln_bench_cnn_model()) ? KILN_OK : kiln_error_last()->status;
    if (!st) st = kiln_module_to(b.model, g.device);
    kiln_tensor **params = NULL;
    int n = 0;
    if (!st) st = kiln_module_parameters(b.model, &params, &n);
    if (!st && !(b.opt = kiln_adam(params, n, NULL))) st = kiln_error_last()->status;
    free(params);
    if (!st) {
        b.x = kiln_randn(KILN_SHAPE(g.batch, 3, 32, 32), KILN_F32, g.device);
        kiln_tensor *labels = kiln_empty(KILN_SHAPE(g.batch), KILN_I64, KILN_CPU);
        if (labels) {
            int64_t *l = kiln_data_ptr(labels);
            for (int i = 0; i < g.batch; i++) l[i] = (i * 7) % 10;
            b.y = kiln_to(labels, g.device, KILN_I64, 0);
            kiln_release(labels);
        }
        if (!b.x || !b.y) st = kiln_error_last()->status;
    }
    double rate[2][2] = {{0}}; /* [autotune][train] */
    bool saved_bench = kiln_is_cudnn_benchmark();
    printf("kiln bench cnn on %s: OptimizedCNN 3x32x32, batch %d, Adam; %d warm-up steps, best of %d rounds "
           "of %d "
           "steps; %s\n",
           dev, g.batch, g.warmup, g.repeats, g.steps, kiln_build_options());
    for (int tune = 0; tune < 2 && !st; tune++) {
        kiln_set_cudnn_benchmark(tune == 1);
        for (int train = 1; train >= 0 && !st; train--) st = cnn_rate(&b, train, &g, &rate[tune][train]);
    }
    /* Autotuning on from here: f32 with TF32 allowed (PyTorch's default for
     * convolutions) and AMP eager, then each as a CUDA graph. */
    double tf32[2] = {0}, amp[2] = {0}, graph[3][2] = {{0}}; /* graph: [f32, AMP, TF32][train] */
    char graph_why[3][2][300] = {{"", ""}, {"", ""}, {"", ""}};
    kiln_set_cudnn_benchmark(true);
    bool saved_tf32 = kiln_allow_tf32();
    kiln_set_allow_tf32(true);
    for (int train = 1; train >= 0 && !st; train--) st = cnn_rate(&b, train, &g, &tf32[train]);
    kiln_set_allow_tf32(saved_tf32);
    if (!st && !(b.scaler = kiln_grad_scaler_create(NULL))) st = kiln_error_last()->status;
    for (int train = 1; train >= 0 && !st; train--) st = cnn_rate(&b, train, &g, &amp[train]);
    for (int a = 0; a < 3 && !st; a++) {
        kiln_grad_scaler *scaler = b.scaler;
        if (a != 1) b.scaler = NULL;
        kiln_set_allow_tf32(a == 2 ? true : saved_tf32);
        for (int train = 1; train >= 0 && !st; train--) {
            cnn_call c = {&b, train};
            kiln_tensor *in[2] = {b.x, b.y};
            kiln_module_train(b.model, train);
            kiln_scope_begin();
            kiln_status tr = kiln_trace(cnn_fn, &c, train ? 2 : 1, in, 1, NULL, &b.program);
            kiln_status end = kiln_scope_end();
            if (tr || end) {
                snprintf(graph_why[a][train], sizeof graph_why[a][train], "%s", kiln_error_message());
                kiln_error_clear();
                continue;
            }
            st = cnn_rate(&b, train, &g, &graph[a][train]);
            kiln_program_free(b.program);
            b.program = NULL;
        }
        b.scaler = scaler;
    }
    kiln_set_allow_tf32(saved_tf32);
    kiln_grad_scaler_free(b.scaler);
    b.scaler = NULL;
    kiln_set_cudnn_benchmark(saved_bench);
    char calls[4096];
    if (!st) st = cnn_host_calls(&b, calls, sizeof calls);
    if (!st) {
        printf("%-34s %14s %14s\n", "setup", "train img/s", "infer img/s");
        printf("%-34s %14.0f %14.0f\n", "f32, cuDNN autotuning off", rate[0][1], rate[0][0]);
        printf("%-34s %14.0f %14.0f\n", "f32, autotuning on (timed, cached)", rate[1][1], rate[1][0]);
        printf("%-34s %14.0f %14.0f\n", "f32 + TF32 allowed, autotuning", tf32[1], tf32[0]);
        printf("%-34s %14.0f %14.0f\n", "AMP f16 + grad scaler, autotuning", amp[1], amp[0]);
        printf("%-34s %14.0f %14.0f\n", "f32, CUDA graph replay", graph[0][1], graph[0][0]);
        printf("%-34s %14.0f %14.0f\n", "AMP, CUDA graph replay", graph[1][1], graph[1][0]);
        printf("%-34s %14.0f %14.0f\n", "f32 + TF32, CUDA graph replay", graph[2][1], graph[2][0]);
        static const char *const setup[3] = {"f32", "AMP", "f32 + TF32"};
        for (int a = 0; a < 3; a++)
            for (int train = 0; train < 2; train++)
                if (graph_why[a][train][0])
                    printf("  %s %s as a graph: not traced: %s\n", setup[a], train ? "training" : "inference",
                           graph_why[a][train]);
        printf("{\"bench\":\"cnn\",\"threads\":%d,\"device\":\"%s\",\"batch\":%d,\"train_ips\":%.1f,\"infer_ips\":%.1f,"
               "\"train_ips_autotune\":%.1f,\"infer_ips_autotune\":%.1f,\"train_ips_tf32\":%.1f,\"infer_ips_tf32\":%.1f,"
               "\"train_ips_amp\":%.1f,\"infer_ips_amp\":%.1f,",
               kiln_num_threads(), dev, g.batch, rate[0][1], rate[0][0], rate[1][1], rate[1][0], tf32[1], tf32[0],
               amp[1], amp[0]);
        static const char *const names[3][2] = {{"infer_ips_graph", "train_ips_graph"},
                                                {"infer_ips_amp_graph", "train_ips_amp_graph"},
                                                {"infer_ips_tf32_graph", "train_ips_tf32_graph"}};
        for (int a = 0; a < 3; a++)
            for (int train = 1; train >= 0; train--) {
                if (graph[a][train] > 0) printf("\"%s\":%.1f,", names[a][train], graph[a][train]);
                else printf("\"%s\":null,", names[a][train]);
            }
        printf("%s}\n", calls);
    } else {
        fprintf(stderr, "kiln bench cnn: %s\n", kiln_error_message());
    }
    kiln_program_free(b.program);
    kiln_grad_scaler_free(b.scaler);
    kiln_optimizer_free(b.opt);
    kiln_module_free(b.model);
    kiln_release(b.x);
    kiln_release(b.y);
    return st ? 1 : 0;
}

/* ---- copy ------------------------------------------------------------------------------------ */

static kiln_status copy_rate(kiln_tensor *dst, kiln_tensor *src, unsigned flags, int repeats, kiln_device d,
                             double *gbs) {
    kiln_status st = kiln_copy_(dst, src, flags); /* warm-up */
    if (!st) st = kiln_device_synchronize(d);
    double bytes = (double)kiln_numel(src) * 4;
    *gbs = 0;
    for (int r = 0; r < repeats && !st; r++) {
        double t0 = tool_now_s();
        st = kiln_copy_(dst, src, flags);
        if (!st) st = kiln_device_synchronize(d);
        double v = bytes / (tool_now_s() - t0) / 1e9;
        if (v > *gbs) *gbs = v;
    }
    return st;
}

int kiln_bench_copy(int argc, char **argv) {
    gpu_args g = {.mb = 256, .repeats = 10};
    int rc = parse("copy", argc, argv, &g);
    if (rc) return rc;
    if (!g.mb || !g.repeats) {
        fprintf(stderr, "kiln bench copy: need --mb and --repeats >= 1\n");
        return 2;
    }
    rc = need_device("copy", g.device);
    if (rc) return rc;
    int64_t n = (int64_t)g.mb << 18; /* f32 elements */
    kiln_tensor *pageable = kiln_zeros(KILN_SHAPE(n), KILN_F32, KILN_CPU);
    kiln_tensor *pinned = kiln_empty_pinned(KILN_SHAPE(n), KILN_F32);
    kiln_tensor *dst = kiln_empty(KILN_SHAPE(n), KILN_F32, g.device);
    kiln_status st = pageable && pinned && dst ? KILN_OK : kiln_error_last()->status;
    if (!st) memset(kiln_data_ptr(pinned), 0, (size_t)n * 4);
    double gb[2] = {0, 0};
    if (!st) st = copy_rate(dst, pageable, 0, g.repeats, g.device, &gb[0]);
    if (!st) st = copy_rate(dst, pinned, KILN_NON_BLOCKING, g.repeats, g.device, &gb[1]);
    char dev[32];
    kiln_device_str(g.device, dev, sizeof dev);
    if (!st) {
        printf("kiln bench copy: host -> %s, %d MiB, best of %d\n", dev, g.mb, g.repeats);
        printf("%-10s %8.2f GB/s\n%-10s %8.2f GB/s (%.2fx)\n", "pageable", gb[0], "pinned", gb[1],
               gb[0] > 0 ? gb[1] / gb[0] : 0.0);
        printf("{\"bench\":\"copy\",\"threads\":%d,\"device\":\"%s\",\"mb\":%d,\"pageable_gbs\":%.2f,\"pinned_gbs\":%.2f}\n", kiln_num_threads(),
               dev, g.mb, gb[0], gb[1]);
    } else {
        fprintf(stderr, "kiln bench copy: %s\n", kiln_error_message());
    }
    kiln_release(pageable);
    kiln_release(pinned);
    kiln_release(dst);
    return st ? 1 : 0;
}

/* ---- gemm ---------------------------------------------------------------------------------- */

/* Dense peak TFLOP/s by device name: f32 (FMA), tf32, f16/bf16 tensor cores
 * (NVIDIA's data sheets, without sparsity). 0: unknown. */
typedef struct peak_row {
    const char *name_part;
    double f32, tf32, half;
} peak_row;
#if defined(KILN_WITH_CUDA) && !defined(KILN_CUDA_EMULATION)
static const peak_row peaks[] = {
    {"H200", 66.9, 494.7, 989.4}, {"H100 PCIe", 51.2, 378.0, 756.0}, {"H100 NVL", 60.0, 417.5, 835.0},
    {"H100", 66.9, 494.7, 989.4}, {"A100", 19.5, 156.0, 312.0},      {"L40S", 91.6, 183.0, 362.0},
    {"A10", 31.2, 62.5, 125.0},   {"V100", 15.7, 0, 125.0},
};
#endif

static const peak_row *peak_of(int device, char *name, size_t size) {
    snprintf(name, size, "unknown");
#if defined(KILN_WITH_CUDA) && !defined(KILN_CUDA_EMULATION)
    /* The runtime's name, through the backend: this file links no CUDA
     * library (the CUDA module does; docs/cuda.md). */
    char got[256];
    if (kiln_device_name(KILN_CUDA(device), got, sizeof got) == KILN_OK) {
        snprintf(name, size, "%s", got);
        for (size_t i = 0; i < sizeof peaks / sizeof peaks[0]; i++)
            if (strstr(got, peaks[i].name_part)) return &peaks[i];
    } else {
        kiln_error_clear();
    }
#else
    (void)device;
#endif
    return NULL;
}

int kiln_bench_gemm(int argc, char **argv) {
    gpu_args g = {.size = 8192, .repeats = 10};
    int rc = parse("gemm", argc, argv, &g);
    if (rc) return rc;
    if (!g.size || !g.repeats) {
        fprintf(stderr, "kiln bench gemm: need --size and --repeats >= 1\n");
        return 2;
    }
    rc = need_device("gemm", g.device);
    if (rc) return rc;
    char name[256], dev[32];
    kiln_device_str(g.device, dev, sizeof dev);
    const peak_row *peak = peak_of(g.device.index, name, sizeof name);
    static const struct {
        const char *label;
        kiln_dtype dt;
        bool tf32;
    } runs[] = {{"f32", KILN_F32, false},
                {"f32 tf32", KILN_F32, true},
                {"f16", KILN_F16, false},
                {"bf16", KILN_BF16, false}};
    double tflops[4] = {0};
    bool saved_tf32 = kiln_allow_tf32();
    kiln_status st = KILN_OK;
    int64_t s = g.size;
    for (int r = 0; r < 4 && !st; r++) {
        kiln_set_allow_tf32(runs[r].tf32);
        kiln_tensor *a = kiln_randn(KILN_SHAPE(s, s), runs[r].dt, g.device);
        kiln_tensor *b = kiln_randn(KILN_SHAPE(s, s), runs[r].dt, g.device);
        if (!a || !b) st = kiln_error_last()->status;
        for (int w = 0; w < 2 && !st; w++) { /* warm-up: plan, workspace */
            kiln_tensor *c = kiln_mm(a, b);
            if (!c) st = kiln_error_last()->status;
            kiln_release(c);
        }
        if (!st) st = kiln_device_synchronize(g.device);
        for (int k = 0; k < g.repeats && !st; k++) {
            double t0 = tool_now_s();
            kiln_tensor *c = kiln_mm(a, b);
            if (!c) st = kiln_error_last()->status;
            if (!st) st = kiln_device_synchronize(g.device);
            double v = 2.0 * (double)s * (double)s * (double)s / (tool_now_s() - t0) / 1e12;
            if (v > tflops[r]) tflops[r] = v;
            kiln_release(c);
        }
        kiln_release(a);
        kiln_release(b);
    }
    kiln_set_allow_tf32(saved_tf32);
    if (st) {
        fprintf(stderr, "kiln bench gemm: %s\n", kiln_error_message());
        return 1;
    }
    printf("kiln bench gemm: %lld x %lld x %lld mm on %s (%s), best of %d; %s\n", (long long)s, (long long)s,
           (long long)s, dev, name, g.repeats, kiln_build_options());
    printf("%-10s %10s %12s %8s\n", "dtype", "TFLOP/s", "peak", "of peak");
    for (int r = 0; r < 4; r++) {
        double pk = !peak ? 0 : runs[r].dt != KILN_F32 ? peak->half : runs[r].tf32 ? peak->tf32 : peak->f32;
        if (pk > 0)
            printf("%-10s %10.1f %12.1f %7.0f%%\n", runs[r].label, tflops[r], pk, 100 * tflops[r] / pk);
        else
            printf("%-10s %10.1f %12s %8s\n", runs[r].label, tflops[r], "unknown", "-");
    }
    printf("{\"bench\":\"gemm\",\"threads\":%d,\"device\":\"%s\",\"gpu\":\"%s\",\"size\":%lld,\"f32\":%.2f,\"tf32\":%.2f,"
           "\"f16\":%.2f,\"bf16\":%.2f}\n", kiln_num_threads(),
           dev, name, (long long)s, tflops[0], tflops[1], tflops[2], tflops[3]);
    return 0;
}

/* The oneDNN convolution algorithms the CPU autotuner chooses between
 * (src/kernels/cpu/onednn/onednn_conv.c), and the tuner wired into the
 * fast conv kernels.
 *
 * Numerics: each algorithm runs forward, input gradient and weight
 * gradient (forced with kiln_onednn_conv_force_algorithm, kernels called
 * directly) against a double-precision reference on the same f32 inputs;
 * the error is normwise, ||got - ref||_2 / ||ref||_2. Tolerances:
 *   - direct, direct_plain: 1e-5 (the op harness's f32 threshold);
 *   - small_c (Kiln's, AVX2, 1-4 input channels; forward and weight
 *     gradient only): 1e-5, tests/kernels/test_smallc_conv.c has the rest;
 *   - winograd (oneDNN's), winograd_2x2, winograd_4x4, winograd_6x6 and
 *     winograd_4x4_6x6 (Kiln's, AVX2): 2e-5. F(4x4, 3x3) transforms the tiles with matrices
 *     whose entries reach 8 (and fractions down to 1/24 in the inverse),
 *     so rounding in the transformed domain is amplified: measured
 *     3.7e-7..1.1e-6 on these shapes on the 2-core Cascade Lake (2-4x the
 *     direct algorithm's 0.9e-7..7.9e-7); the bound leaves a factor of ~20
 *     for other inputs and CPUs.
 * Winograd exists only for 3x3 stride-1 kernels: on a 5x5 stride-2 shape it
 * must decline (supports false), so the reference kernel runs.
 *
 * Wiring: with kiln_set_conv_autotune(true) a convolution and its backward
 * pass time the candidates once per configuration and write three entries
 * (fwd, bwd_data, bwd_weight) to the cache file (KILN_AUTOTUNE_CACHE, set
 * here to a temporary file); after kiln_shutdown + kiln_init the picks come
 * from the file without timing. Autotuning off, and deterministic mode,
 * pick "direct" without timing. Skips (77) without oneDNN. */
#include <unistd.h>

#include "test_util.h"

#ifdef KILN_WITH_ONEDNN
#include "kernels/autotune.h"
#include "kernels/cpu/onednn/onednn_kernels.h"
#include "kernels/cpu/fast/gemm_avx2.h"
#include "kernels/cpu/onednn/onednn_winograd.h"
#include "ops/op_registry.h"

typedef struct shape {
    const char *name;
    int64_t n, c, h, w, o, k, stride, pad;
    bool winograd; /* oneDNN implements Winograd for it */
} shape;

static const shape shapes[] = {
    {"conv1 3->32 32x32", 4, 3, 32, 32, 32, 3, 1, 1, true},
    {"conv1 1->32 28x28", 4, 1, 28, 28, 32, 3, 1, 1, true},
    {"conv2 32->64 16x16", 4, 32, 16, 16, 64, 3, 1, 1, true},
    {"conv3 64->128 8x8", 2, 64, 8, 8, 128, 3, 1, 1, true},
    {"5x5 stride 2", 2, 16, 15, 15, 32, 5, 2, 2, false},
};

static int64_t out_size(const shape *s, int64_t in) { return (in + 2 * s->pad - s->k) / s->stride + 1; }

static kiln_strided view4(float *data, int64_t a, int64_t b, int64_t c, int64_t d) {
    kiln_strided v = {.data = data, .dtype = KILN_F32, .ndim = 4};
    int64_t sh[4] = {a, b, c, d};
    int64_t st = 1;
    for (int i = 3; i >= 0; i--) {
        v.shape[i] = sh[i];
        v.strides[i] = st;
        st *= sh[i];
    }
    return v;
}

static void fill(float *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)((seed >> 8) * (1.0 / 16777216.0) * 2.0 - 1.0);
    }
}

/* The three passes in double, accumulated straight from the definition. */
static void reference(const shape *s, const float *x, const float *w, const float *b, const float *gy,
                      double *y, double *gx, double *gw) {
    int64_t OH = out_size(s, s->h), OW = out_size(s, s->w);
    memset(gx, 0, sizeof(double) * (size_t)(s->n * s->c * s->h * s->w));
    memset(gw, 0, sizeof(double) * (size_t)(s->o * s->c * s->k * s->k));
    for (int64_t n = 0; n < s->n; n++)
        for (int64_t o = 0; o < s->o; o++)
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    int64_t yi = ((n * s->o + o) * OH + oh) * OW + ow;
                    double acc = b[o];
                    for (int64_t c = 0; c < s->c; c++)
                        for (int64_t i = 0; i < s->k; i++)
                            for (int64_t j = 0; j < s->k; j++) {
                                int64_t ih = oh * s->stride - s->pad + i, iw = ow * s->stride - s->pad + j;
                                if (ih < 0 || ih >= s->h || iw < 0 || iw >= s->w) continue;
                                int64_t xi = ((n * s->c + c) * s->h + ih) * s->w + iw;
                                int64_t wi = ((o * s->c + c) * s->k + i) * s->k + j;
                                acc += (double)x[xi] * w[wi];
                                gx[xi] += (double)gy[yi] * w[wi];
                                gw[wi] += (double)gy[yi] * x[xi];
                            }
                    y[yi] = acc;
                }
}

static double rel_err(const float *got, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = got[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static bool cpu_has_avx512_core(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

typedef kiln_status (*run_fn)(const kiln_op_args *);
typedef size_t (*ws_fn)(const kiln_op_args *);
typedef bool (*supports_fn)(const kiln_op_args *);

/* Runs one pass through the oneDNN kernel; false when it declines. */
static bool run_pass(run_fn run, ws_fn ws, supports_fn supports, kiln_op_args *a) {
    if (!supports(a)) return false;
    a->workspace_bytes = ws(a);
    a->workspace = a->workspace_bytes ? aligned_alloc(64, (a->workspace_bytes + 63) / 64 * 64) : NULL;
    CHECK_OK(run(a));
    free(a->workspace);
    a->workspace = NULL;
    return true;
}

static void check_algorithm(const char *alg, double tol) {
    CHECK_OK(kiln_onednn_conv_force_algorithm(alg));
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const shape *s = &shapes[si];
        int64_t OH = out_size(s, s->h), OW = out_size(s, s->w);
        size_t nx = (size_t)(s->n * s->c * s->h * s->w), nw = (size_t)(s->o * s->c * s->k * s->k),
               ny = (size_t)(s->n * s->o * OH * OW);
        float *x = malloc(nx * 4), *w = malloc(nw * 4), *b = malloc((size_t)s->o * 4), *gy = malloc(ny * 4);
        float *y = malloc(ny * 4), *gx = malloc(nx * 4), *gw = malloc(nw * 4);
        double *ry = malloc(ny * 8), *rgx = malloc(nx * 8), *rgw = malloc(nw * 8);
        fill(x, nx, 1), fill(w, nw, 2), fill(b, (size_t)s->o, 3), fill(gy, ny, 4);
        reference(s, x, w, b, gy, ry, rgx, rgw);

        kiln_op_attrs at = {
            .stride = {s->stride, s->stride}, .padding = {s->pad, s->pad}, .dilation = {1, 1}, .groups = 1};
        kiln_strided vx = view4(x, s->n, s->c, s->h, s->w), vw = view4(w, s->o, s->c, s->k, s->k);
        kiln_strided vy = view4(y, s->n, s->o, OH, OW), vgy = view4(gy, s->n, s->o, OH, OW);
        kiln_strided vgx = view4(gx, s->n, s->c, s->h, s->w), vgw = view4(gw, s->o, s->c, s->k, s->k);
        kiln_strided vb = {.data = b, .dtype = KILN_F32, .ndim = 1, .shape = {s->o}, .strides = {1}};

        kiln_op_args fwd = {.n_in = 3, .n_out = 1, .in = {vx, vw, vb}, .out = {vy}, .attrs = &at};
        kiln_op_args bwd_data = {.n_in = 2, .n_out = 1, .in = {vgy, vw}, .out = {vgx}, .attrs = &at};
        kiln_op_args bwd_weight = {.n_in = 2, .n_out = 1, .in = {vgy, vx}, .out = {vgw}, .attrs = &at};
        bool ran[3] = {
            run_pass(kiln_onednn_conv2d, kiln_onednn_conv2d_workspace, kiln_onednn_conv2d_supports, &fwd),
            run_pass(kiln_onednn_conv2d_grad_input, kiln_onednn_conv2d_grad_input_workspace,
                     kiln_onednn_conv2d_grad_input_supports, &bwd_data),
            run_pass(kiln_onednn_conv2d_grad_weight, kiln_onednn_conv2d_grad_weight_workspace,
                     kiln_onednn_conv2d_grad_weight_supports, &bwd_weight),
        };
        /* oneDNN's Winograd exists only for AVX-512 (avx512_core): elsewhere
         * every shape is declined, and the kernel must say so, not fail. */
        bool expect = !strcmp(alg, "winograd")       ? s->winograd && cpu_has_avx512_core()
                      : !strncmp(alg, "winograd_", 9) ? s->c % 8 == 0 && s->o % 8 == 0 && s->k == 3 &&
                                                           s->stride == 1 && s->pad == 1 && kiln_wino_cpu_ok()
                                                     : true;
        /* Kiln's small-channel kernels: the forward and weight gradient of
         * 3x3 convolutions of 1-4 channels, no input gradient. */
        bool small = s->c <= 4 && s->o % 8 == 0 && s->k == 3 && s->stride <= 2 && s->pad <= 2 &&
                     kiln_cpu_gemm_avx2_ok();
        bool expect_pass[3] = {expect, expect, expect};
        if (!strcmp(alg, "small_c")) expect_pass[0] = expect_pass[2] = small, expect_pass[1] = false;
        double err[3] = {ran[0] ? rel_err(y, ry, ny) : -1, ran[1] ? rel_err(gx, rgx, nx) : -1,
                         ran[2] ? rel_err(gw, rgw, nw) : -1};
        printf("%-15s %-20s fwd %.2e  bwd_data %.2e  bwd_weight %.2e%s\n", alg, s->name, err[0], err[1],
               err[2], expect_pass[0] && expect_pass[1] ? "" : !strcmp(alg, "small_c") ? "  (declines what it does not cover)" : s->winograd && !strcmp(alg, "winograd") ? "  (declined: no AVX-512 on this CPU)" : "  (declined, as expected)");
        for (int p = 0; p < 3; p++) {
            CHECK_MSG(ran[p] == expect_pass[p], "%s %s pass %d: ran %d, expected %d", alg, s->name, p, ran[p],
                      expect_pass[p]);
            if (ran[p])
                CHECK_MSG(err[p] <= tol, "%s %s pass %d: error %.3e > %.1e", alg, s->name, p, err[p], tol);
        }
        free(x), free(w), free(b), free(gy), free(y), free(gx), free(gw), free(ry), free(rgx), free(rgw);
    }
    CHECK_OK(kiln_onednn_conv_force_algorithm(NULL));
}

/* One forward + backward of a conv through the public API; the weight
 * gradient's first element (any value: the passes ran through the fast
 * kernels). */
static void conv_step(int64_t batch) {
    kiln_scope_begin();
    kiln_manual_seed(7);
    kiln_tensor *x = kiln_randn(KILN_SHAPE(batch, 16, 12, 12), KILN_F32, KILN_CPU);
    kiln_tensor *w = kiln_randn(KILN_SHAPE(32, 16, 3, 3), KILN_F32, KILN_CPU);
    kiln_tensor *b = kiln_randn(KILN_SHAPE(32), KILN_F32, KILN_CPU);
    CHECK_OK(kiln_set_requires_grad(x, true));
    CHECK_OK(kiln_set_requires_grad(w, true));
    kiln_conv2d_opts o = {.padding = {1, 1}};
    kiln_tensor *y = kiln_conv2d(x, w, b, &o);
    CHECK(y != NULL);
    kiln_tensor *g = kiln_randn(KILN_SHAPE(batch, 32, 12, 12), KILN_F32, KILN_CPU);
    if (y) CHECK_OK(kiln_backward(y, g, false));
    CHECK(kiln_grad(w) != NULL && kiln_grad(x) != NULL);
    CHECK_OK(kiln_scope_end());
}

static int count_lines(const char *path, const char *needle) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[2048];
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, needle)) n++;
    fclose(f);
    return n;
}

static void check_wiring(const char *cache) {
    kiln_autotune_stats s;
    uint64_t fast0 = kiln_ops_fast_runs(KILN_OP_CONV2D);

    /* Autotuning off: the default ("direct"), nothing timed, nothing written. */
    kiln_set_conv_autotune(false);
    conv_step(4);
    kiln_autotune_stats_get(kiln_autotune_global(), &s);
    CHECK_EQ_I(s.tunings, 0);
    CHECK(access(cache, F_OK) != 0);
    CHECK(kiln_ops_fast_runs(KILN_OP_CONV2D) > fast0);

    /* On: the three passes are timed once each and written to the file. */
    kiln_set_conv_autotune(true);
    conv_step(4);
    conv_step(4);
    kiln_autotune_stats_get(kiln_autotune_global(), &s);
    CHECK_EQ_I(s.tunings, 3);
    CHECK(s.timed_runs >= 3 * 2 * 3);        /* direct and direct_plain at least, 3 timed runs each */
    CHECK(s.cache_hits >= 3); /* the second step's passes at least */
    CHECK_EQ_I(count_lines(cache, "onednn\t"), 3);
    CHECK_EQ_I(count_lines(cache, "\tfwd x=4x16x12x12 w=32x16x3x3 y=4x32x12x12"), 1);
    CHECK_EQ_I(count_lines(cache, "\tbwd_data x=4x16x12x12"), 1);
    CHECK_EQ_I(count_lines(cache, "\tbwd_weight x=4x16x12x12"), 1);

    /* Deterministic mode: another batch (a new configuration) is not timed. */
    kiln_set_deterministic(true);
    conv_step(3);
    kiln_autotune_stats_get(kiln_autotune_global(), &s);
    CHECK_EQ_I(s.tunings, 3);
    CHECK_EQ_I(count_lines(cache, "onednn\t"), 3);
    kiln_set_deterministic(false);

    /* A second run (the tuner is freed by kiln_shutdown and reads the
     * file again): the picks come from the file, nothing is timed. */
    kiln_shutdown();
    CHECK_OK(kiln_init());
    conv_step(4);
    kiln_autotune_stats_get(kiln_autotune_global(), &s);
    CHECK_EQ_I(s.loaded, 3);
    CHECK_EQ_I(s.tunings, 0);
    CHECK_EQ_I(s.timed_runs, 0);
    kiln_set_conv_autotune(false);
}

int main(void) {
    char dir[] = "/tmp/kiln_test_conv_alg_XXXXXX";
    if (!mkdtemp(dir)) kt_missing("cannot create a temporary directory under /tmp");
    char cache[128];
    snprintf(cache, sizeof cache, "%s/autotune.txt", dir);
    setenv("KILN_AUTOTUNE_CACHE", cache, 1);
    if (kiln_init() != KILN_OK) {
        fprintf(stderr, "kiln_init: %s\n", kiln_error_message());
        return 1;
    }
    check_algorithm("direct", 1e-5);
    check_algorithm("direct_plain", 1e-5);
    check_algorithm("winograd", 2e-5);
    check_algorithm("winograd_2x2", 2e-5); /* Kiln's, AVX2: tests/kernels/test_winograd_conv.c */
    check_algorithm("winograd_4x4", 2e-5);
    check_algorithm("winograd_6x6", 2e-5);
    check_algorithm("winograd_4x4_6x6", 2e-5); /* F(4x4) and F(6x6) tiles together */
    check_algorithm("small_c", 1e-5);      /* Kiln's, AVX2: tests/kernels/test_smallc_conv.c */
    check_wiring(cache);
    kiln_shutdown();
    remove(cache);
    rmdir(dir);
    return kt_finish();
}
#else
int main(void) { kt_skip("built without oneDNN (KILN_WITH_ONEDNN off)"); }
#endif

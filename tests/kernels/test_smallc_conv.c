/* Kiln's convolutions of inputs with 1-4 channels for AVX2
 * (src/kernels/cpu/onednn/onednn_smallc.c): the forward and the weight
 * gradient against a double-precision reference on the same f32 inputs,
 * normwise (||got - ref||_2 / ||ref||_2 <= 1e-5, the op harness's f32
 * threshold) and elementwise (every element within 1e-5 of the
 * reference's largest magnitude), on:
 *   - 1, 2, 3 and 4 input channels, 8, 16 and 24 output channels;
 *   - odd and even images (7x5, 1x9 with padding 1, 28x28, 9x8), widths
 *     that leave every tail of the 8- and 4-position blocks;
 *   - stride 1 and 2, padding 0, 1 and 2;
 *   - every layout of y: plain NCHW, nChw8c, nChw16c;
 *   - the forward with and without bias and ReLU;
 *   - one image and more images than the weight gradient's 64 chunks;
 *   - one, two and three OpenMP threads: the same bits for every count.
 * A NaN input comes through the fused ReLU as NaN. Shapes the kernels do
 * not cover are refused, and a short workspace is an error, not a write
 * past it. Skips (77) on a CPU without AVX2 and FMA. */
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "test_util.h"

#ifdef KILN_WITH_ONEDNN
#include "kernels/cpu/fast/gemm_avx2.h"
#include "kernels/cpu/onednn/onednn_smallc.h"
#include "kernels/kernels.h"

typedef struct shape {
    int64_t n, c, h, w, k;
    int stride, pad;
} shape;

static const shape shapes[] = {
    {2, 1, 7, 5, 8, 1, 1},   {3, 3, 9, 8, 16, 1, 1}, {1, 2, 1, 9, 8, 1, 1},  {2, 4, 7, 11, 24, 2, 1},
    {2, 3, 9, 9, 16, 2, 0},  {1, 1, 6, 13, 16, 1, 2}, {70, 1, 5, 6, 8, 1, 1}, {2, 1, 28, 28, 32, 1, 1},
    {1, 3, 10, 10, 8, 1, 0},
    /* the forward's position blocks: 32 = 12 + 12 + 8, 20 = 12 + 8, 16 = 8 + 8, 24 = 12 + 12 */
    {1, 3, 4, 32, 16, 1, 1}, {1, 2, 3, 20, 8, 1, 1},   {1, 1, 3, 16, 8, 1, 1},  {1, 4, 2, 24, 8, 1, 1},
};

static void fill(float *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)((seed >> 8) * (1.0 / 16777216.0) * 2.0 - 1.0);
    }
}

static int64_t osize(int64_t in, int stride, int pad) { return (in + 2 * pad - 3) / stride + 1; }

/* y = relu?(conv(x, w) + b) and gw from gy, in double, all plain. */
static void reference(const shape *s, const float *x, const float *w, const float *b, bool relu, const float *gy,
                      double *y, double *gw) {
    int64_t OH = osize(s->h, s->stride, s->pad), OW = osize(s->w, s->stride, s->pad);
    memset(gw, 0, sizeof(double) * (size_t)(s->k * s->c * 9));
    for (int64_t n = 0; n < s->n; n++)
        for (int64_t o = 0; o < s->k; o++)
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    int64_t yi = ((n * s->k + o) * OH + oh) * OW + ow;
                    double acc = b ? b[o] : 0.0;
                    for (int64_t c = 0; c < s->c; c++)
                        for (int64_t i = 0; i < 3; i++)
                            for (int64_t j = 0; j < 3; j++) {
                                int64_t ih = oh * s->stride - s->pad + i, iw = ow * s->stride - s->pad + j;
                                if (ih < 0 || ih >= s->h || iw < 0 || iw >= s->w) continue;
                                int64_t xi = ((n * s->c + c) * s->h + ih) * s->w + iw, wi = ((o * s->c + c) * 3 + i) * 3 + j;
                                acc += (double)x[xi] * w[wi];
                                gw[wi] += (double)gy[yi] * x[xi];
                            }
                    y[yi] = relu && acc < 0 ? 0.0 : acc;
                }
}

static void check_close(const float *got, const double *ref, size_t n, const char *what) {
    double num = 0, den = 0, worst = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double d = got[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
        if (fabs(d) > worst || d != d) worst = d != d ? INFINITY : fabs(d);
        if (fabs(ref[i]) > scale) scale = fabs(ref[i]);
    }
    double e = den > 0 ? sqrt(num / den) : sqrt(num), elem = scale > 0 ? worst / scale : worst;
    CHECK_MSG(e <= 1e-5 && elem <= 1e-5, "%s: error %.3e (elementwise %.3e)", what, e, elem);
}

static void set_threads(int t) {
#ifdef _OPENMP
    omp_set_num_threads(t);
#else
    (void)t;
#endif
}

/* Runs the pass with 1, 2 and 3 threads, each with a fresh NaN-filled
 * workspace: the same bits every time; the 1-thread result stays in out. */
static void run_threads(kiln_smallc_pass pass, const kiln_smallc_shape *ks, const kiln_smallc_buffers *b,
                        float *out, size_t n_out, const char *what) {
    float *first = malloc(n_out * sizeof(float));
    for (int t = 3; t >= 1; t--) {
        set_threads(t);
        size_t bytes = kiln_smallc_workspace(pass, ks);
        void *ws = aligned_alloc(64, (bytes + 63) / 64 * 64);
        memset(ws, 0xff, bytes); /* NaN everywhere: nothing may be read before written */
        memset(out, 0xff, n_out * sizeof(float));
        CHECK_OK(kiln_smallc_run(pass, ks, b, ws, bytes));
        if (t == 3) memcpy(first, out, n_out * sizeof(float));
        else CHECK_MSG(!memcmp(first, out, n_out * sizeof(float)), "%s: %d threads give other bits than 3", what, t);
        if (t == 1) /* a workspace one byte short is refused */
            CHECK_FAILS(kiln_smallc_run(pass, ks, b, ws, bytes - 1), KILN_ERR_INTERNAL, "workspace");
        free(ws);
    }
    free(first);
}

static int checked_cases;

static void check_shape(const shape *s, int yb) {
    if (yb && s->k % yb) return;
    int64_t OH = osize(s->h, s->stride, s->pad), OW = osize(s->w, s->stride, s->pad);
    size_t nx = (size_t)(s->n * s->c * s->h * s->w), ny = (size_t)(s->n * s->k * OH * OW), nw = (size_t)(s->k * s->c * 9);
    float *x = malloc(nx * 4), *w = malloc(nw * 4), *b = malloc((size_t)s->k * 4), *gy = malloc(ny * 4);
    float *yl = malloc(ny * 4), *gyl = malloc(ny * 4), *out = malloc(ny * 4), *gw = malloc(nw * 4);
    double *ry = malloc(ny * 8), *rgw = malloc(nw * 8);
    fill(x, nx, 1), fill(w, nw, 2), fill(b, (size_t)s->k, 3), fill(gy, ny, 4);
    int64_t ysh[4] = {s->n, s->k, OH, OW};
    if (yb) kiln_cpu_reorder_blocked(gyl, gy, sizeof(float), ysh, yb, true);
    else memcpy(gyl, gy, ny * 4);
    kiln_smallc_shape ks = {s->n, s->c, s->h, s->w, s->k, OH, OW, s->stride, s->stride, s->pad, s->pad, yb};
    CHECK(kiln_smallc_shape_ok(&ks));
    char what[160];
    for (int variant = 0; variant < 2; variant++) {
        bool relu = variant == 1;
        const float *bias = variant == 1 ? b : NULL;
        reference(s, x, w, bias, relu, gy, ry, rgw);
        kiln_smallc_buffers fb = {.x = x, .y = yl, .w = w, .bias = bias, .relu = relu};
        snprintf(what, sizeof what, "fwd %lldx%lldx%lldx%lld->%lld s%d p%d y%d %s", (long long)s->n, (long long)s->c,
                 (long long)s->h, (long long)s->w, (long long)s->k, s->stride, s->pad, yb,
                 relu ? "bias+relu" : "plain");
        run_threads(KILN_SMALLC_FWD, &ks, &fb, yl, ny, what);
        if (yb) kiln_cpu_reorder_blocked(out, yl, sizeof(float), ysh, yb, false);
        else memcpy(out, yl, ny * 4);
        check_close(out, ry, ny, what);
        checked_cases++;
    }
    kiln_smallc_buffers wb = {.x = x, .y = gyl, .w_out = gw};
    snprintf(what, sizeof what, "bwd_weight %lldx%lldx%lldx%lld->%lld s%d p%d y%d", (long long)s->n,
             (long long)s->c, (long long)s->h, (long long)s->w, (long long)s->k, s->stride, s->pad, yb);
    run_threads(KILN_SMALLC_BWD_WEIGHTS, &ks, &wb, gw, nw, what);
    check_close(gw, rgw, nw, what);
    checked_cases++;
    free(x), free(w), free(b), free(gy), free(yl), free(gyl), free(out), free(gw), free(ry), free(rgw);
}

/* A NaN in x comes out of the fused ReLU as NaN (PyTorch's relu keeps it). */
static void check_nan(void) {
    kiln_smallc_shape ks = {1, 1, 4, 4, 8, 4, 4, 1, 1, 1, 1, 8};
    float x[16] = {0}, w[72], y[128];
    for (int i = 0; i < 72; i++) w[i] = -1.0f; /* every output would be clamped to 0 */
    x[5] = NAN;
    kiln_smallc_buffers fb = {.x = x, .y = y, .w = w, .relu = true};
    size_t bytes = kiln_smallc_workspace(KILN_SMALLC_FWD, &ks);
    void *ws = aligned_alloc(64, (bytes + 63) / 64 * 64);
    CHECK_OK(kiln_smallc_run(KILN_SMALLC_FWD, &ks, &fb, ws, bytes));
    CHECK_MSG(isnan(y[0]) && isnan(y[5 * 8]) && y[15 * 8] == 0.0f, "relu: NaN at 0 %g, 5 %g; 0 at 15: %g", y[0],
              y[40], y[120]);
    free(ws);
}

int main(void) {
    if (!kiln_cpu_gemm_avx2_ok()) kt_skip("this CPU has no AVX2 and FMA: the small-channel kernels are not used");
    if (kiln_init() != KILN_OK) {
        fprintf(stderr, "kiln_init: %s\n", kiln_error_message());
        return 1;
    }
    static const int blocks[3] = {0, 8, 16};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int yb = 0; yb < 3; yb++) check_shape(&shapes[i], blocks[yb]);
    printf("%d pass checks\n", checked_cases);
    check_nan();
    kiln_smallc_shape bad = {1, 5, 8, 8, 16, 8, 8, 1, 1, 1, 1, 0}; /* 5 channels */
    CHECK(!kiln_smallc_shape_ok(&bad));
    bad.c = 3, bad.k = 12; /* 12 output channels */
    CHECK(!kiln_smallc_shape_ok(&bad));
    bad.k = 16, bad.sh = 3, bad.oh = 3; /* stride 3 */
    CHECK(!kiln_smallc_shape_ok(&bad));
    bad.sh = 1, bad.oh = 7; /* oh not the geometry's */
    CHECK(!kiln_smallc_shape_ok(&bad));
    bad.oh = 8, bad.yb = 16, bad.k = 24; /* 24 channels in nChw16c */
    CHECK(!kiln_smallc_shape_ok(&bad));
    float dummy[1] = {0};
    kiln_smallc_buffers none = {.x = dummy, .y = dummy, .w = dummy, .w_out = dummy};
    CHECK_FAILS(kiln_smallc_run(KILN_SMALLC_FWD, &bad, &none, dummy, sizeof dummy), KILN_ERR_UNSUPPORTED,
                "1-4 input channels");
    kiln_shutdown();
    return kt_finish();
}
#else
int main(void) { kt_skip("built without oneDNN (KILN_WITH_ONEDNN off)"); }
#endif

/* The bf16 first-layer kernels (kernels/cpu/fast/conv_pool_bf16.c):
 * conv2d_relu_max_pool2d and conv2d_relu_max_pool2d_grad_weight for images
 * of few channels, in f32 registers from bf16 values.
 *
 * Each case runs the kernels directly on their AVX-512 rows (where the CPU
 * has them) and on the portable ones, which must give the same bits, and
 * holds them to the float64 reference on the same bf16 values:
 *   - forward: every pooled y within 2^-7 of its window's largest sum of
 *     term magnitudes (|bias| + sum |x w|: bf16's one rounding of the
 *     convolution, which moves a window's maximum by no more than its
 *     values move) of the float64 pooled ReLU, and the value at its index
 *     within the same bound of y (the index names a maximum); NaN where the
 *     float64 window has one;
 *   - weight and bias gradients: the float64 scatter of the pooled
 *     gradients (where y > 0) at the indices, times the taps, within 2^-7
 *     of the sum of the terms' magnitudes; an index outside its window but
 *     inside the plane (the strays path) too, and one outside the plane is
 *     an error naming the fix;
 *   - the same bits with 1 thread and with 2;
 *   - through the dispatcher: the fast table takes the bf16 first layer and
 *     its weight gradient (kiln_ops_fast_runs), forward and backward. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "kernels/cpu/fast/fast_kernels.h"
#include "kiln/kiln.h"
#include "ops/op_registry.h"

static uint64_t rng = 0x2545F4914F6CDD1DULL;
static double uniform(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static float f32_of(uint16_t b) { return kiln_bf16_to_f32(b); }

/* Normal-ish bf16 values, some exact zeros (ties at 0 after the ReLU). */
static void fill(uint16_t *v, int64_t n, double scale) {
    for (int64_t i = 0; i < n; i++) {
        double u = uniform() + uniform() + uniform() - 1.5;
        v[i] = kiln_f32_to_bf16(uniform() < 0.05 ? 0.0f : (float)(u * scale));
    }
}

static kiln_strided strided(void *data, kiln_dtype dt, int ndim, const int64_t *shape) {
    kiln_strided s;
    memset(&s, 0, sizeof s);
    s.data = data, s.dtype = dt, s.ndim = ndim, s.layout = KILN_LAYOUT_STRIDED;
    int64_t st = 1;
    for (int i = ndim - 1; i >= 0; i--) s.shape[i] = shape[i], s.strides[i] = st, st *= shape[i];
    return s;
}

typedef struct sc_case {
    const char *name;
    int64_t N, C, H, W, O, K, pad;
    bool bias, nan;
} sc_case;

typedef struct sc_run {
    uint16_t *y, *dw, *db;
    int64_t *ix;
    kiln_status fwd, bwd;
} sc_run;

static int64_t conv_out(const sc_case *c, int64_t in) { return in + 2 * c->pad - c->K + 1; }

/* The forward and weight gradient of one case on the chosen rows; go and
 * (for the backward) the indices come from the caller when given. */
static sc_run run_kernels(const sc_case *c, const uint16_t *x, const uint16_t *w, const uint16_t *b,
                          const uint16_t *go, const int64_t *ix_in, bool rows) {
    const int64_t OH = conv_out(c, c->H), OW = conv_out(c, c->W), PH = OH / 2, PW = OW / 2;
    const int64_t ny = c->N * c->O * PH * PW;
    sc_run r;
    r.y = malloc(sizeof *r.y * (size_t)ny), r.ix = malloc(sizeof *r.ix * (size_t)ny);
    r.dw = malloc(sizeof *r.dw * (size_t)(c->O * c->C * c->K * c->K)),
    r.db = malloc(sizeof *r.db * (size_t)c->O);
    kiln_op_attrs attrs;
    memset(&attrs, 0, sizeof attrs);
    attrs.padding[0] = attrs.padding[1] = c->pad;
    attrs.kernel[0] = attrs.kernel[1] = 2;
    const int64_t xs[4] = {c->N, c->C, c->H, c->W}, ws[4] = {c->O, c->C, c->K, c->K}, bs[1] = {c->O},
                  ys[4] = {c->N, c->O, PH, PW};
    kiln_op_args a;
    memset(&a, 0, sizeof a);
    a.n_in = 3, a.n_out = 2, a.attrs = &attrs;
    a.in[0] = strided((void *)x, KILN_BF16, 4, xs), a.in[1] = strided((void *)w, KILN_BF16, 4, ws);
    a.in[2] = strided((void *)b, KILN_BF16, 1, bs);
    if (!b) a.in[2].ndim = -1;
    a.out[0] = strided(r.y, KILN_BF16, 4, ys), a.out[1] = strided(r.ix, KILN_I64, 4, ys);
    CHECK_MSG(kiln_bf16_conv_pool_smallc_supports(&a), "%s: the forward kernel declines the case", c->name);
    a.workspace_bytes = kiln_bf16_conv_pool_smallc_workspace(&a);
    a.workspace = malloc(a.workspace_bytes);
    kiln_bf16_pool_test_rows(rows);
    r.fwd = kiln_bf16_conv_pool_smallc(&a);
    free(a.workspace);
    kiln_op_args g;
    memset(&g, 0, sizeof g);
    kiln_op_attrs gattrs = attrs;
    gattrs.n_ints = 4;
    memcpy(gattrs.ints, ws, sizeof ws);
    g.n_in = 4, g.n_out = 2, g.attrs = &gattrs;
    g.in[0] = strided((void *)go, KILN_BF16, 4, ys), g.in[1] = strided(r.y, KILN_BF16, 4, ys);
    g.in[2] = strided(ix_in ? (void *)ix_in : r.ix, KILN_I64, 4, ys), g.in[3] = a.in[0];
    g.out[0] = strided(r.dw, KILN_BF16, 4, ws), g.out[1] = strided(r.db, KILN_BF16, 1, bs);
    CHECK_MSG(kiln_bf16_conv_pool_smallc_grad_weight_supports(&g), "%s: the weight gradient declines",
              c->name);
    g.workspace_bytes = kiln_bf16_conv_pool_smallc_grad_weight_workspace(&g);
    g.workspace = malloc(g.workspace_bytes);
    r.bwd = kiln_bf16_conv_pool_smallc_grad_weight(&g);
    kiln_bf16_pool_test_rows(1);
    free(g.workspace);
    return r;
}

static void free_run(sc_run *r) { free(r->y), free(r->ix), free(r->dw), free(r->db); }

static bool same16(const uint16_t *a, const uint16_t *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (a[i] != b[i] && !(isnan(f32_of(a[i])) && isnan(f32_of(b[i])))) return false;
    return true;
}

static double xat(const sc_case *c, const uint16_t *x, int64_t n, int64_t ci, int64_t h, int64_t w) {
    if (h < 0 || h >= c->H || w < 0 || w >= c->W) return 0.0;
    return f32_of(x[((n * c->C + ci) * c->H + h) * c->W + w]);
}

/* The float64 convolution at (n, o, r, q), and the sum of its terms' magnitudes. */
static double conv64(const sc_case *c, const uint16_t *x, const uint16_t *w, const uint16_t *b, int64_t n,
                     int64_t o, int64_t r, int64_t q, double *mag) {
    double s = b ? f32_of(b[o]) : 0.0;
    *mag = fabs(s);
    for (int64_t ci = 0; ci < c->C; ci++)
        for (int64_t kh = 0; kh < c->K; kh++)
            for (int64_t kw = 0; kw < c->K; kw++) {
                double t = xat(c, x, n, ci, r + kh - c->pad, q + kw - c->pad) *
                           f32_of(w[((o * c->C + ci) * c->K + kh) * c->K + kw]);
                s += t, *mag += fabs(t);
            }
    return s;
}

static double relu(double v) { return v > 0.0 || isnan(v) ? v : 0.0; }

static void check_forward(const sc_case *c, const uint16_t *x, const uint16_t *w, const uint16_t *b,
                          const sc_run *r) {
    const int64_t OW = conv_out(c, c->W), PH = conv_out(c, c->H) / 2, PW = OW / 2;
    int64_t bad_y = 0, bad_ix = 0, first = -1, unrounded = 0, total = 0;
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t o = 0; o < c->O; o++)
            for (int64_t pr = 0; pr < PH; pr++)
                for (int64_t pc = 0; pc < PW; pc++) {
                    const int64_t i = ((n * c->O + o) * PH + pr) * PW + pc;
                    double best = 0.0, bound = 0.0, at_val = NAN;
                    bool nan = false;
                    for (int k = 0; k < 4; k++) {
                        const int64_t rr = 2 * pr + k / 2, qq = 2 * pc + k % 2;
                        double mag, v = conv64(c, x, w, b, n, o, rr, qq, &mag);
                        nan |= isnan(v) != 0;
                        if (relu(v) > best) best = relu(v);
                        if (mag > bound) bound = mag;
                        if (r->ix[i] == rr * OW + qq) at_val = relu(v);
                    }
                    const double y = f32_of(r->y[i]), tol = bound * 0x1p-7 + 1e-30;
                    const bool ok_y = nan ? isnan(y) != 0 : fabs(y - best) <= tol;
                    unrounded += !nan && r->y[i] != kiln_f32_to_bf16((float)best), total++;
                    const bool ok_ix = nan || (!isnan(at_val) && fabs(at_val - y) <= tol);
                    bad_y += !ok_y, bad_ix += !ok_ix;
                    if ((!ok_y || !ok_ix) && first < 0) first = i;
                }
    CHECK_MSG(bad_y == 0 && bad_ix == 0,
              "%s: %lld pooled values and %lld indices off the float64 reference (first at %lld)", c->name,
              (long long)bad_y, (long long)bad_ix, (long long)first);
    /* the f32 chain is 2^16 times finer than bf16: y is the float64 value's bf16 rounding but where that
     * lies within the chain's error of a rounding boundary (a 0.1% error anywhere moves 1 in 8 across) */
    CHECK_MSG(unrounded * 1000 <= total, "%s: %lld of %lld pooled values are not the float64 value's bf16",
              c->name, (long long)unrounded, (long long)total);
    if (getenv("KILN_TEST_VERBOSE"))
        printf("%s: forward %lld/%lld not rounded alike\n", c->name, (long long)unrounded, (long long)total);
}

static void check_grad(const sc_case *c, const uint16_t *x, const uint16_t *go, const int64_t *ix,
                       const sc_run *r) {
    const int64_t OH = conv_out(c, c->H), OW = conv_out(c, c->W), PH = OH / 2, PW = OW / 2;
    const int64_t nw = c->O * c->C * c->K * c->K;
    double *dw = calloc((size_t)nw, sizeof *dw), *mag = calloc((size_t)nw, sizeof *mag);
    double *db = calloc((size_t)c->O, sizeof *db), *dbm = calloc((size_t)c->O, sizeof *dbm);
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t o = 0; o < c->O; o++)
            for (int64_t p = 0; p < PH * PW; p++) {
                const int64_t i = (n * c->O + o) * PH * PW + p;
                if (!(f32_of(r->y[i]) > 0.0f)) continue;
                const double gv = f32_of(go[i]);
                const int64_t rr = ix[i] / OW, qq = ix[i] % OW;
                db[o] += gv, dbm[o] += fabs(gv);
                for (int64_t ci = 0; ci < c->C; ci++)
                    for (int64_t kh = 0; kh < c->K; kh++)
                        for (int64_t kw = 0; kw < c->K; kw++) {
                            const int64_t t = ((o * c->C + ci) * c->K + kh) * c->K + kw;
                            double v = gv * xat(c, x, n, ci, rr + kh - c->pad, qq + kw - c->pad);
                            dw[t] += v, mag[t] += fabs(v);
                        }
            }
    int64_t bad = 0, unrounded = 0;
    for (int64_t t = 0; t < nw; t++) {
        bad += !(fabs(f32_of(r->dw[t]) - dw[t]) <= mag[t] * 0x1p-7 + 1e-30);
        unrounded += r->dw[t] != kiln_f32_to_bf16((float)dw[t]);
    }
    for (int64_t o = 0; o < c->O; o++) {
        bad += !(fabs(f32_of(r->db[o]) - db[o]) <= dbm[o] * 0x1p-7 + 1e-30);
        unrounded += r->db[o] != kiln_f32_to_bf16((float)db[o]);
    }
    CHECK_MSG(bad == 0, "%s: %lld weight or bias gradients off the float64 reference", c->name,
              (long long)bad);
    /* as for y: the float64 sums' bf16 roundings but within the f32 sums' error of a boundary */
    CHECK_MSG(unrounded * 100 <= nw + c->O, "%s: %lld of %lld gradients are not the float64 sums' bf16",
              c->name, (long long)unrounded, (long long)(nw + c->O));
    if (getenv("KILN_TEST_VERBOSE"))
        printf("%s: grads %lld/%lld not rounded alike\n", c->name, (long long)unrounded,
               (long long)(nw + c->O));
    free(dw), free(mag), free(db), free(dbm);
}

static void sc_case_run(const sc_case *c) {
    const int64_t nx = c->N * c->C * c->H * c->W, nw = c->O * c->C * c->K * c->K;
    const int64_t ny = c->N * c->O * (conv_out(c, c->H) / 2) * (conv_out(c, c->W) / 2);
    uint16_t *x = malloc(sizeof *x * (size_t)nx), *w = malloc(sizeof *w * (size_t)nw),
             *b = malloc(sizeof *b * (size_t)c->O), *go = malloc(sizeof *go * (size_t)ny);
    fill(x, nx, 2.0), fill(w, nw, 0.5), fill(b, c->O, 0.5), fill(go, ny, 1.0);
    if (c->nan) x[nx / 3] = 0x7fc0;
    const uint16_t *bias = c->bias ? b : NULL;
    sc_run vec = run_kernels(c, x, w, bias, go, NULL, true),
           port = run_kernels(c, x, w, bias, go, NULL, false);
    CHECK_MSG(vec.fwd == KILN_OK && vec.bwd == KILN_OK && port.fwd == KILN_OK && port.bwd == KILN_OK,
              "%s: a kernel failed: %s", c->name, kiln_error_message());
    bool same_ix = memcmp(vec.ix, port.ix, sizeof *vec.ix * (size_t)ny) == 0;
    CHECK_MSG(same16(vec.y, port.y, ny) && same_ix, "%s: the vector and portable forwards differ", c->name);
    CHECK_MSG(same16(vec.dw, port.dw, nw) && same16(vec.db, port.db, c->O),
              "%s: the vector and portable weight gradients differ", c->name);
    check_forward(c, x, w, bias, &vec);
    if (!c->nan) check_grad(c, x, go, vec.ix, &vec);
    /* one thread: the same bits */
    int threads = kiln_num_threads();
    CHECK_OK(kiln_set_num_threads(1));
    sc_run one = run_kernels(c, x, w, bias, go, NULL, true);
    CHECK_OK(kiln_set_num_threads(threads));
    CHECK_MSG(same16(one.y, vec.y, ny) && same16(one.dw, vec.dw, nw) && same16(one.db, vec.db, c->O),
              "%s: one thread gives other bits than %d", c->name, threads);
    free_run(&vec), free_run(&port), free_run(&one);
    free(x), free(w), free(b), free(go);
}

/* Indices elsewhere: one window's index moved to another position of the
 * plane (the strays path, both rows the same bits and the float64 sum),
 * then one outside the plane: an error naming the fix. */
static void strays_case(void) {
    const sc_case c = {"strays: 2x16 on 12x12", 2, 2, 12, 12, 16, 3, 1, true, false};
    const int64_t nx = c.N * c.C * c.H * c.W, nw = c.O * c.C * 9, ny = c.N * c.O * 36;
    uint16_t *x = malloc(sizeof *x * (size_t)nx), *w = malloc(sizeof *w * (size_t)nw),
             *b = malloc(sizeof *b * 16), *go = malloc(sizeof *go * (size_t)ny);
    fill(x, nx, 2.0), fill(w, nw, 0.5), fill(b, 16, 0.5), fill(go, ny, 1.0);
    sc_run base = run_kernels(&c, x, w, b, go, NULL, true);
    int64_t *ix = malloc(sizeof *ix * (size_t)ny);
    memcpy(ix, base.ix, sizeof *ix * (size_t)ny);
    int64_t moved = 0;
    for (int64_t i = 0; i < ny; i += 7)
        if (f32_of(base.y[i]) > 0.0f) ix[i] = (ix[i] + 29) % 144, moved++;
    sc_run vec = run_kernels(&c, x, w, b, go, ix, true), port = run_kernels(&c, x, w, b, go, ix, false);
    CHECK_MSG(vec.bwd == KILN_OK && port.bwd == KILN_OK && moved > 0, "strays: the weight gradient failed");
    CHECK_MSG(same16(vec.dw, port.dw, nw) && same16(vec.db, port.db, 16),
              "strays: the vector and portable weight gradients differ");
    check_grad(&c, x, go, ix, &vec);
    ix[ny / 2] = 144;
    for (int64_t i = ny / 2; i < ny; i++)
        if (f32_of(base.y[i]) > 0.0f) {
            ix[i] = 144;
            break;
        }
    sc_run out = run_kernels(&c, x, w, b, go, ix, true);
    CHECK_MSG(out.bwd == KILN_ERR_INVALID_ARGUMENT &&
                  strstr(kiln_error_message(), "outside its 144-element plane") &&
                  strstr(kiln_error_last()->hint, "pass the indices"),
              "strays: an index outside the plane gave %d (%s; %s)", out.bwd, kiln_error_message(),
              kiln_error_last()->hint);
    kiln_error_clear();
    free_run(&base), free_run(&vec), free_run(&port), free_run(&out);
    free(ix), free(x), free(w), free(b), free(go);
}

/* Through the dispatcher: autocast's first layer runs on these kernels. */
static void dispatch_case(void) {
    kiln_scope_begin();
    kiln_tensor *x = kiln_cast(kiln_randn(KILN_SHAPE(4, 1, 28, 28), KILN_F32, KILN_CPU), KILN_BF16);
    kiln_tensor *w32 = kiln_randn(KILN_SHAPE(32, 1, 3, 3), KILN_F32, KILN_CPU);
    kiln_tensor *b32 = kiln_randn(KILN_SHAPE(32), KILN_F32, KILN_CPU);
    CHECK_OK(kiln_set_requires_grad(w32, true));
    CHECK_OK(kiln_set_requires_grad(b32, true));
    kiln_tensor *w = kiln_cast(w32, KILN_BF16), *b = kiln_cast(b32, KILN_BF16);
    kiln_conv2d_opts o = {.padding = {1, 1}};
    uint64_t fwd = kiln_ops_fast_runs(KILN_OP_CONV2D_RELU_MAX_POOL2D),
             bwd = kiln_ops_fast_runs(KILN_OP_CONV2D_RELU_MAX_POOL2D_GRAD_WEIGHT);
    kiln_tensor *y = kiln_conv2d_relu_max_pool2d(x, w, b, &o, 2, NULL);
    CHECK(y != NULL);
    CHECK_OK(kiln_backward(kiln_sum(kiln_cast(y, KILN_F32), 0, NULL, false), NULL, false));
    CHECK_MSG(kiln_ops_fast_runs(KILN_OP_CONV2D_RELU_MAX_POOL2D) > fwd &&
                  kiln_ops_fast_runs(KILN_OP_CONV2D_RELU_MAX_POOL2D_GRAD_WEIGHT) > bwd,
              "the bf16 first layer did not run on the fast kernels");
    CHECK(kiln_grad(w32) != NULL && kiln_grad(b32) != NULL);
    CHECK_OK(kiln_scope_end());
}

int main(void) {
    if (kiln_init()) return 1;
    const sc_case cases[] = {
        {"1->32 on 28x28, pad 1 (the main job's first layer; 14-window groups)", 3, 1, 28, 28, 32, 3, 1, true,
         false},
        {"3->32 on 32x32, pad 1 (the bench CNN's; 16-window groups)", 2, 3, 32, 32, 32, 3, 1, true, false},
        {"2->16 on 9x11, pad 1, no bias (a row and a column no window reads)", 3, 2, 9, 11, 16, 3, 1, false,
         false},
        {"2->48 on 12x37, pad 0 (a group of 16 and a tail of 1)", 2, 2, 12, 37, 48, 3, 0, true, false},
        {"5->16 on 7x7, pad 2 (45 taps)", 2, 5, 7, 7, 16, 3, 2, true, false},
        {"1->16 on 10x10, 1x1 kernel", 2, 1, 10, 10, 16, 1, 0, true, false},
        {"3->16 on 10x10 with a NaN", 2, 3, 10, 10, 16, 3, 1, true, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) sc_case_run(&cases[i]);
    strays_case();
    dispatch_case();
    kiln_shutdown();
    return kt_finish();
}

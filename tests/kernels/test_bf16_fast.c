/* bf16 on the fast CPU path (autocast's kernels).
 *
 * Part 1, the bf16 pooling kernels (kernels/cpu/fast/pool_bf16.c), always:
 * relu_max_pool2d and relu_max_pool2d_backward_sum against the reference
 * kernels bit for bit (values, indices, input gradient; the bias sums within
 * one bf16 rounding, being added in another order), on the AVX-512 rows and
 * on the portable ones: 16-wide and wider rows with a tail, narrow rows
 * gathered across rows, planes too small for a vector, odd sizes that leave
 * a row and a column no window reads, ties, zeros, negative values and NaN;
 * an index outside its window (the scatter path), one on its neighbour's
 * maximum (two gradients added there), and one outside its plane
 * (an error naming the fix).
 *
 * Part 2, oneDNN's bf16 convolutions and products through the dispatcher
 * (the fast table's bf16 entries): conv2d with and without bias, strided and
 * padded, a 5x3 kernel, its input and weight gradients, conv2d_relu_max_pool2d, mm and
 * linear with their gradients, each against the float64 reference kernels run
 * on the same bf16 values, element by element within 2^-7 of the sum of the
 * magnitudes of the terms (bf16 rounds each result to 8 bits; the bound is
 * the same computation on |x|, |w| in float64); and the fused op, which pools
 * the convolution's NHWC output itself, against conv2d then relu_max_pool2d
 * bit for bit, on AVX-512 and portable rows. Checks the fast kernels ran.
 * Skips part 2 with a message where oneDNN has no bf16 kernels (a CPU
 * without AVX-512); fails if it has none on a CPU with avx512_bf16 or AMX. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "kernels/cpu/fast/fast_kernels.h"
#include "kernels/cpu/ops_nn_cpu.h"
#include "kiln/kiln.h"
#include "ops/op_registry.h"

static uint16_t bf16_of(float f) { return kiln_f32_to_bf16(f); }
static float f32_of(uint16_t b) { return kiln_bf16_to_f32(b); }

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static double uniform(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* Values with many ties and zeros: small integers and halves in [-4, 4], some NaN. */
static void fill_pool_input(uint16_t *x, int64_t n, bool nans) {
    for (int64_t i = 0; i < n; i++) {
        double u = uniform();
        x[i] = bf16_of((float)(floor(u * 16.0) / 2.0 - 4.0));
        if (nans && uniform() < 0.01) x[i] = 0x7fc0;
    }
}

static kiln_strided strided4(void *data, kiln_dtype dt, int64_t n, int64_t c, int64_t h, int64_t w) {
    kiln_strided s;
    memset(&s, 0, sizeof s);
    s.data = data, s.dtype = dt, s.ndim = 4, s.layout = KILN_LAYOUT_STRIDED;
    s.shape[0] = n, s.shape[1] = c, s.shape[2] = h, s.shape[3] = w;
    s.strides[3] = 1, s.strides[2] = w, s.strides[1] = h * w, s.strides[0] = c * h * w;
    return s;
}

static bool same_bits(const uint16_t *a, const uint16_t *b, int64_t n, int64_t *at) {
    for (int64_t i = 0; i < n; i++)
        if (a[i] != b[i] && !(isnan(f32_of(a[i])) && isnan(f32_of(b[i])))) {
            *at = i;
            return false;
        }
    return true;
}

/* One pooling case: forward and backward, fast (rows on and off) against the reference. */
static void pool_case(const char *name, int64_t N, int64_t C, int64_t H, int64_t W, bool nans, int64_t k) {
    const int64_t OH = H / k, OW = W / k, nx = N * C * H * W, ny = N * C * OH * OW;
    uint16_t *x = malloc(sizeof *x * (size_t)nx), *y[2], *yr = malloc(sizeof *yr * (size_t)ny);
    int64_t *ix[2], *ixr = malloc(sizeof *ixr * (size_t)ny);
    fill_pool_input(x, nx, nans);
    kiln_op_attrs attrs;
    memset(&attrs, 0, sizeof attrs);
    attrs.kernel[0] = attrs.kernel[1] = attrs.stride[0] = attrs.stride[1] = k;
    kiln_op_args a;
    memset(&a, 0, sizeof a);
    a.n_in = 1, a.n_out = 2, a.attrs = &attrs;
    a.in[0] = strided4(x, KILN_BF16, N, C, H, W);
    a.out[0] = strided4(yr, KILN_BF16, N, C, OH, OW);
    a.out[1] = strided4(ixr, KILN_I64, N, C, OH, OW);
    CHECK_MSG(kiln_bf16_relu_max_pool2d_supports(&a), "%s: the bf16 pooling declines", name);
    CHECK_OK(kiln_cpu_relu_max_pool2d(&a));
    for (int r = 0; r < 2; r++) {
        y[r] = malloc(sizeof *y[r] * (size_t)ny), ix[r] = malloc(sizeof *ix[r] * (size_t)ny);
        kiln_bf16_pool_test_rows(r == 0);
        a.out[0].data = y[r], a.out[1].data = ix[r];
        CHECK_OK(kiln_bf16_relu_max_pool2d(&a));
        int64_t at = -1;
        CHECK_MSG(same_bits(y[r], yr, ny, &at), "%s (%s rows): y[%lld] %g, reference %g", name,
                  r ? "portable" : "vector", (long long)at, at >= 0 ? f32_of(y[r][at]) : 0.0,
                  at >= 0 ? f32_of(yr[at]) : 0.0);
        CHECK_MSG(memcmp(ix[r], ixr, sizeof *ixr * (size_t)ny) == 0, "%s (%s rows): the indices differ", name,
                  r ? "portable" : "vector");
    }
    /* the backward with its sums, from the forward's y and indices (one of them moved outside its window,
     * inside the plane, when there is room: the scatter path) */
    uint16_t *go = malloc(sizeof *go * (size_t)ny), *dx[2], *dxr = malloc(sizeof *dxr * (size_t)nx);
    uint16_t sums[2][64], sumsr[64];
    for (int64_t i = 0; i < ny; i++) go[i] = bf16_of((float)(uniform() * 2.0 - 1.0));
    if (ny > 40 && H * W > 8) ixr[ny / 2 + 3] = (ixr[ny / 2 + 3] + 2 * W) % (H * W);
    /* and one onto its right neighbour's maximum: two gradients meet there (added, not overwritten) */
    int64_t j = ny / 4 - (ny / 4) % OW;
    if (ny > 40 && OW >= 2 && yr[j] != 0 && yr[j + 1] != 0) ixr[j] = ixr[j + 1];
    kiln_op_attrs battrs = attrs;
    kiln_op_args b;
    memset(&b, 0, sizeof b);
    b.n_in = 3, b.n_out = 2, b.attrs = &battrs;
    b.in[0] = strided4(go, KILN_BF16, N, C, OH, OW);
    b.in[1] = strided4(yr, KILN_BF16, N, C, OH, OW);
    b.in[2] = strided4(ixr, KILN_I64, N, C, OH, OW);
    b.out[0] = strided4(dxr, KILN_BF16, N, C, H, W);
    memset(&b.out[1], 0, sizeof b.out[1]);
    b.out[1].dtype = KILN_BF16, b.out[1].ndim = 1, b.out[1].shape[0] = C, b.out[1].strides[0] = 1;
    b.out[1].layout = KILN_LAYOUT_STRIDED, b.out[1].data = sumsr;
    CHECK_MSG(kiln_bf16_relu_max_pool2d_backward_sum_supports(&b), "%s: the bf16 backward declines", name);
    size_t ws_ref = kiln_cpu_pool_backward_workspace(&b),
           ws = kiln_bf16_relu_max_pool2d_backward_sum_workspace(&b);
    b.workspace = malloc(ws_ref > ws ? ws_ref : ws), b.workspace_bytes = ws_ref > ws ? ws_ref : ws;
    CHECK_OK(kiln_cpu_relu_max_pool2d_backward_sum(&b));
    for (int r = 0; r < 2; r++) {
        dx[r] = malloc(sizeof *dx[r] * (size_t)nx);
        memset(dx[r], 0xab, sizeof *dx[r] * (size_t)nx); /* every element must be written */
        kiln_bf16_pool_test_rows(r == 0);
        b.out[0].data = dx[r], b.out[1].data = sums[r];
        CHECK_OK(kiln_bf16_relu_max_pool2d_backward_sum(&b));
        int64_t at = -1;
        CHECK_MSG(same_bits(dx[r], dxr, nx, &at), "%s (%s rows): grad x[%lld] %g, reference %g", name,
                  r ? "portable" : "vector", (long long)at, at >= 0 ? f32_of(dx[r][at]) : 0.0,
                  at >= 0 ? f32_of(dxr[at]) : 0.0);
        for (int64_t c = 0; c < C; c++) {
            double s = f32_of(sums[r][c]), sr = f32_of(sumsr[c]);
            CHECK_MSG(fabs(s - sr) <= fabs(sr) * 0x1p-8, "%s (%s rows): bias sum %lld: %g, reference %g",
                      name, r ? "portable" : "vector", (long long)c, s, sr);
        }
    }
    CHECK_MSG(memcmp(sums[0], sums[1], sizeof sums[0][0] * (size_t)C) == 0, "%s: the two rows' sums differ",
              name);
    /* an index outside its plane */
    int64_t keep = ixr[0];
    ixr[0] = H * W;
    kiln_bf16_pool_test_rows(1);
    CHECK_FAILS(kiln_bf16_relu_max_pool2d_backward_sum(&b), KILN_ERR_INVALID_ARGUMENT, "outside its");
    ixr[0] = keep;
    free(b.workspace);
    for (int r = 0; r < 2; r++) free(y[r]), free(ix[r]), free(dx[r]);
    free(x), free(yr), free(ixr), free(go), free(dxr);
}

/* ---- Part 2 ------------------------------------------------------------------------- */

static kiln_tensor *bf16_randn(kiln_shape shape, bool grad) {
    kiln_tensor *f = kiln_randn(shape, KILN_F32, KILN_CPU);
    kiln_tensor *t = kiln_cast(f, KILN_BF16);
    kiln_release(f);
    if (grad) CHECK_OK(kiln_set_requires_grad(t, true));
    return t;
}

/* t (any float dtype) as a new f64 leaf, with grad when asked. */
static kiln_tensor *as_f64(kiln_tensor *t, bool grad, bool absolute) {
    kiln_tensor *d = kiln_cast(kiln_detach(t), KILN_F64);
    if (absolute) {
        kiln_tensor *a = kiln_abs(d);
        kiln_release(d);
        d = a;
    }
    if (grad) CHECK_OK(kiln_set_requires_grad(d, true));
    return d;
}

static double *host_f64(kiln_tensor *t, int64_t *n) {
    kiln_tensor *c = kiln_cast(kiln_contiguous(kiln_detach(t)), KILN_F64);
    *n = kiln_numel(c);
    double *h = malloc(sizeof *h * (size_t)(*n ? *n : 1));
    CHECK(kiln_to_host(c, h, sizeof *h * (size_t)*n) == KILN_OK);
    kiln_release(c);
    return h;
}

/* Element by element: |got - want| <= 2^-7 * bound + 2^-30. */
static void within(const char *name, const char *what, kiln_tensor *got, kiln_tensor *want,
                   kiln_tensor *bound) {
    CHECK_MSG(got && want && bound, "%s: %s missing", name, what);
    if (!got || !want || !bound) return;
    CHECK_MSG(kiln_dtype_of(got) == KILN_BF16, "%s: %s is %s, not bf16", name, what,
              kiln_dtype_name(kiln_dtype_of(got)));
    int64_t n, m, k;
    double *g = host_f64(got, &n), *w = host_f64(want, &m), *b = host_f64(bound, &k);
    CHECK_MSG(n == m && m == k, "%s: %s sizes %lld, %lld, %lld", name, what, (long long)n, (long long)m,
              (long long)k);
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n && n == m && m == k; i++)
        if (!(fabs(g[i] - w[i]) <= 0x1p-7 * b[i] + 0x1p-30)) bad++, first = first < 0 ? i : first;
    CHECK_MSG(bad == 0, "%s: %s: %lld of %lld outside the bound (first [%lld]: %g, float64 %g, bound %g)",
              name, what, (long long)bad, (long long)n, (long long)first, first >= 0 ? g[first] : 0.0,
              first >= 0 ? w[first] : 0.0, first >= 0 ? 0x1p-7 * b[first] : 0.0);
    free(g), free(w), free(b);
}

/* sum(y * r) and its backward; r bf16 (cast for the float64 runs). */
static void backward_of(kiln_tensor *y, kiln_tensor *r) {
    /* no kiln_retain/kiln_release pair on r: in a scope, a release takes the scope's registration */
    kiln_tensor *rr = kiln_dtype_of(y) == kiln_dtype_of(r) ? r : kiln_cast(r, kiln_dtype_of(y));
    kiln_tensor *p = kiln_mul(y, rr), *loss = kiln_sum(p, 0, NULL, false);
    CHECK_OK(kiln_backward(loss, NULL, false));
    kiln_release(loss), kiln_release(p);
    if (rr != r) kiln_release(rr);
}

static void conv_case(const char *name, int64_t N, int64_t C, int64_t H, int64_t W, int64_t O, int64_t kh,
                      int64_t kw, const kiln_conv2d_opts *opts, bool bias) {
    kiln_scope_begin();
    kiln_tensor *x = bf16_randn(KILN_SHAPE(N, C, H, W), true), *w = bf16_randn(KILN_SHAPE(O, C, kh, kw), true);
    kiln_tensor *b = bias ? bf16_randn(KILN_SHAPE(O), true) : NULL;
    uint64_t fwd = kiln_ops_fast_runs(KILN_OP_CONV2D), gi = kiln_ops_fast_runs(KILN_OP_CONV2D_GRAD_INPUT),
             gw = kiln_ops_fast_runs(KILN_OP_CONV2D_GRAD_WEIGHT);
    kiln_tensor *y = kiln_conv2d(x, w, b, opts);
    kiln_tensor *r = bf16_randn(kiln_shape_of(y), false);
    backward_of(y, r);
    CHECK_MSG(kiln_ops_fast_runs(KILN_OP_CONV2D) > fwd &&
                  kiln_ops_fast_runs(KILN_OP_CONV2D_GRAD_INPUT) > gi &&
                  kiln_ops_fast_runs(KILN_OP_CONV2D_GRAD_WEIGHT) > gw,
              "%s: oneDNN's bf16 convolution did not run", name);
    /* float64 on the same values, and on their magnitudes for the bounds */
    kiln_tensor *x64 = as_f64(x, true, false), *w64 = as_f64(w, true, false),
                *b64 = bias ? as_f64(b, true, false) : NULL;
    kiln_tensor *y64 = kiln_conv2d(x64, w64, b64, opts);
    backward_of(y64, r);
    kiln_tensor *xa = as_f64(x, true, true), *wa = as_f64(w, true, true),
                *ba = bias ? as_f64(b, true, true) : NULL;
    kiln_tensor *ra = as_f64(r, false, true), *ya = kiln_conv2d(xa, wa, ba, opts);
    backward_of(ya, ra);
    within(name, "y", y, y64, ya);
    within(name, "grad x", kiln_grad(x), kiln_grad(x64), kiln_grad(xa));
    within(name, "grad w", kiln_grad(w), kiln_grad(w64), kiln_grad(wa));
    if (bias) within(name, "grad b", kiln_grad(b), kiln_grad(b64), kiln_grad(ba));
    CHECK_OK(kiln_scope_end());
}

/* conv2d_relu_max_pool2d: y against the float64 convolution's pooled ReLU, each value within the
 * bound of its window's largest (a window's maximum moves by no more than its values do). */
static void conv_pool_case(const char *name, int64_t N, int64_t C, int64_t H, int64_t W, int64_t O,
                           int64_t k) {
    kiln_scope_begin();
    kiln_tensor *x = bf16_randn(KILN_SHAPE(N, C, H, W), true), *w = bf16_randn(KILN_SHAPE(O, C, 3, 3), true);
    kiln_tensor *b = bf16_randn(KILN_SHAPE(O), true);
    kiln_conv2d_opts o = {.padding = {1, 1}};
    uint64_t fwd = kiln_ops_fast_runs(KILN_OP_CONV2D_RELU_MAX_POOL2D);
    kiln_tensor *y = kiln_conv2d_relu_max_pool2d(x, w, b, &o, k, NULL);
    CHECK_MSG(kiln_ops_fast_runs(KILN_OP_CONV2D_RELU_MAX_POOL2D) > fwd,
              "%s: the fused bf16 kernel did not run", name);
    kiln_tensor *r = bf16_randn(kiln_shape_of(y), false);
    backward_of(y, r);
    kiln_pool2d_opts p = kiln_pool2d_defaults(k);
    kiln_tensor *x64 = as_f64(x, false, false), *w64 = as_f64(w, false, false),
                *b64 = as_f64(b, false, false);
    kiln_tensor *c64 = kiln_conv2d(x64, w64, b64, &o), *y64 = kiln_relu_max_pool2d(c64, &p, NULL);
    kiln_tensor *xa = as_f64(x, false, true), *wa = as_f64(w, false, true), *ba = as_f64(b, false, true);
    kiln_tensor *ca = kiln_conv2d(xa, wa, ba, &o), *ya = kiln_max_pool2d(ca, &p, NULL);
    within(name, "y", y, y64, ya);
    /* against the two ops on the same kernels (the same convolution, reordered to NCHW, then the bf16
     * pooling): the fused op pools the convolution's NHWC output itself, on its AVX-512 rows and on the
     * portable ones, with the same values and indices bit for bit */
    kiln_tensor *ix2 = NULL, *c2 = kiln_conv2d(x, w, b, &o), *y2 = kiln_relu_max_pool2d(c2, &p, &ix2);
    /* (a first layer, C * 9 <= 48 taps, runs on the small-channel kernels instead, in f32 registers:
     * test_bf16_smallc holds them to the float64 reference) */
    const bool smallc = C * 9 <= 48 && O % 16 == 0 && k == 2;
    for (int rows = 1; rows >= 0 && !smallc; rows--) {
        kiln_bf16_pool_test_rows(rows);
        kiln_tensor *ix1 = NULL, *y1 = kiln_conv2d_relu_max_pool2d(x, w, b, &o, k, &ix1);
        kiln_bf16_pool_test_rows(1);
        int64_t n1, n2;
        double *a1 = host_f64(y1, &n1), *a2 = host_f64(y2, &n2), *i1 = host_f64(ix1, &n1),
               *i2 = host_f64(ix2, &n2);
        int64_t diff = 0;
        for (int64_t i = 0; i < n1 && n1 == n2; i++)
            diff += !(a1[i] == a2[i] || (isnan(a1[i]) && isnan(a2[i]))) || i1[i] != i2[i];
        CHECK_MSG(n1 == n2 && diff == 0,
                  "%s (%s rows): %lld values or indices differ from conv2d then relu_max_pool2d", name,
                  rows ? "vector" : "portable", (long long)diff);
        free(a1), free(a2), free(i1), free(i2);
    }
    /* the gradients ran through the fused backward's kernels and are finite */
    int64_t n;
    double *g = host_f64(kiln_grad(w), &n);
    bool finite = true;
    for (int64_t i = 0; i < n; i++) finite &= isfinite(g[i]) != 0;
    CHECK_MSG(finite && kiln_dtype_of(kiln_grad(w)) == KILN_BF16, "%s: the weight gradient", name);
    free(g);
    CHECK_OK(kiln_scope_end());
}

static void linear_case(const char *name, int64_t M, int64_t K, int64_t N, bool use_mm) {
    kiln_scope_begin();
    kiln_tensor *x = bf16_randn(KILN_SHAPE(M, K), true),
                *w = bf16_randn(use_mm ? KILN_SHAPE(K, N) : KILN_SHAPE(N, K), true);
    kiln_tensor *b = use_mm ? NULL : bf16_randn(KILN_SHAPE(N), true);
    kiln_op_id op = use_mm ? KILN_OP_MM : KILN_OP_LINEAR;
    uint64_t runs = kiln_ops_fast_runs(op), mm = kiln_ops_fast_runs(KILN_OP_MM);
    kiln_tensor *y = use_mm ? kiln_mm(x, w) : kiln_linear(x, w, b);
    kiln_tensor *r = bf16_randn(kiln_shape_of(y), false);
    backward_of(y, r);
    CHECK_MSG(kiln_ops_fast_runs(op) > runs && kiln_ops_fast_runs(KILN_OP_MM) > mm,
              "%s: oneDNN's bf16 matmul did not run (forward and backward)", name);
    kiln_tensor *x64 = as_f64(x, true, false), *w64 = as_f64(w, true, false),
                *b64 = b ? as_f64(b, true, false) : NULL;
    kiln_tensor *y64 = use_mm ? kiln_mm(x64, w64) : kiln_linear(x64, w64, b64);
    backward_of(y64, r);
    kiln_tensor *xa = as_f64(x, true, true), *wa = as_f64(w, true, true),
                *ba = b ? as_f64(b, true, true) : NULL;
    kiln_tensor *ra = as_f64(r, false, true), *ya = use_mm ? kiln_mm(xa, wa) : kiln_linear(xa, wa, ba);
    backward_of(ya, ra);
    within(name, "y", y, y64, ya);
    within(name, "grad x", kiln_grad(x), kiln_grad(x64), kiln_grad(xa));
    within(name, "grad w", kiln_grad(w), kiln_grad(w64), kiln_grad(wa));
    CHECK_OK(kiln_scope_end());
}

static bool cpu_has_native_bf16(void) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return false;
    char line[4096];
    bool yes = false;
    while (!yes && fgets(line, sizeof line, f))
        if (!strncmp(line, "flags", 5)) yes = strstr(line, " avx512_bf16") || strstr(line, " amx_bf16");
    fclose(f);
    return yes;
}

int main(void) {
    if (kiln_init()) return 1;
    kiln_manual_seed(5);
    pool_case("32x33: 16-wide rows, odd width", 2, 3, 32, 33, false, 2);
    pool_case("10x40: 20-wide rows, a tail of 4", 1, 4, 10, 40, true, 2);
    pool_case("16x16: 8-wide rows, gathered", 3, 5, 16, 16, false, 2);
    pool_case("9x7: 3-wide rows, a bottom row and a column unread", 2, 3, 9, 7, true, 2);
    pool_case("4x6: too small for a vector", 1, 2, 4, 6, false, 2);
    pool_case("3x3 windows, 11x10: the general loops and the scatter", 2, 3, 11, 10, true, 3);
    kiln_bf16_pool_test_rows(1);
#ifndef KILN_WITH_ONEDNN
    printf("part 2 skipped: this build has no oneDNN\n");
#else
    /* does oneDNN run bf16 convolutions here? */
    uint64_t before = kiln_ops_fast_runs(KILN_OP_CONV2D);
    kiln_scope_begin();
    kiln_tensor *probe = kiln_conv2d(bf16_randn(KILN_SHAPE(1, 8, 6, 6), false),
                                     bf16_randn(KILN_SHAPE(8, 8, 3, 3), false), NULL, NULL);
    CHECK(probe != NULL);
    CHECK_OK(kiln_scope_end());
    if (kiln_ops_fast_runs(KILN_OP_CONV2D) == before) {
        CHECK_MSG(!cpu_has_native_bf16(), "oneDNN runs no bf16 convolution on a CPU with native bf16");
        printf("part 2 skipped: oneDNN has no bf16 convolution on this CPU (it needs AVX-512)\n");
    } else {
        kiln_conv2d_opts pad = {.padding = {1, 1}}, strided = {.stride = {2, 2}, .padding = {1, 0}};
        conv_case("3x3 pad 1, bias, 16->32 on 9x11", 2, 16, 9, 11, 32, 3, 3, &pad, true);
        conv_case("3x3 stride 2, 3->8 on 13x12", 3, 3, 13, 12, 8, 3, 3, &strided, false);
        conv_case("1x1, 5->7 on 4x5", 2, 5, 4, 5, 7, 1, 1, NULL, true);
        /* the input gradient as the forward convolution of the flipped weight (onednn_conv.c, dgrad_fwd)
         * on a kernel flipped differently along its two axes, padded differently */
        kiln_conv2d_opts rect = {.padding = {2, 0}};
        conv_case("5x3 pad (2, 0), 8->16 on 7x9", 2, 8, 7, 9, 16, 5, 3, &rect, false);
        conv_pool_case("conv-relu-pool 3->32 on 32x32 (the bench CNN's first layer)", 4, 3, 32, 32, 32, 2);
        conv_pool_case("conv-relu-pool 32->64 on 16x16", 2, 32, 16, 16, 64, 2);
        conv_pool_case("conv-relu-pool 16->8 on 9x7", 3, 16, 9, 7, 8, 2);
        conv_pool_case("conv-relu-pool 16->32 on 14x14 (7x7 pooled: 3 blocks of 16 and a tail)", 2, 16, 14,
                       14, 32, 2);
        conv_pool_case("conv-relu-pool 8->16 on 7x7 (3x3 pooled: a tail only)", 3, 8, 7, 7, 16, 2);
        conv_pool_case("conv-relu-pool 16->32 on 12x11, 3x3 windows (the general NHWC loop)", 2, 16, 12, 11,
                       32, 3);
        linear_case("linear 37x130 -> 19", 37, 130, 19, false);
        linear_case("mm 33x64 @ 64x17", 33, 64, 17, true);
    }
#endif
    kiln_shutdown();
    return kt_finish();
}

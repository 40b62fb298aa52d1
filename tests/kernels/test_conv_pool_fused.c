/* conv2d_relu_max_pool2d on the fast CPU kernels against conv2d followed
 * by relu_max_pool2d on the same kernels, bit for bit: y, the indices, and
 * the gradients of x, the weight and the bias (the fused op's backward is
 * the two ops' backwards, so equal indices must give equal bits), except
 * where the fused op tiles for its pooling (F(6x6) over the rows and
 * columns the windows read; a weight gradient over those only): there y
 * and the weight gradient within the Winograd kernels' float64 bound, the
 * indices and the other gradients still bit for bit. The
 * shapes reach every way the fused kernel computes
 * (src/kernels/cpu/onednn/onednn_conv_pool.c):
 *   - Kiln's Winograd pooling its own tiles: F(2x2) (fewer than 16 tiles
 *     of 4x4) and F(4x4), on nChw8c and nChw16c outputs, with partial
 *     tiles and a dropped last row and column (odd sizes), an input that
 *     is itself blocked (the output of a first fused op);
 *   - the convolution into the workspace, then the pooling kernels: the
 *     small-channel first layer, a strided oneDNN convolution, a 3x3
 *     window, and NCHW tensors (KILN_CPU_LAYOUTS off);
 * on 1, 2 and 3 threads; and first layers, whose weight and bias gradients
 * are conv2d_relu_max_pool2d_grad_weight (the small-channel weight
 * gradient scattering the pooled gradient where it reads it, or the
 * pooling's backward into the workspace first). Also: the fast kernels ran (kiln_ops_fast_runs),
 * and timed autotuning leaves the fused op on the default pick.
 * Skips (77) where the build has no oneDNN. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "kiln/kiln.h"
#include "kernels/cpu/fast/gemm_avx2.h"
#include "kernels/cpu/onednn/onednn_kernels.h"
#include "ops/op_registry.h"

typedef struct result {
    float *y, *gx, *gw, *gb;
    int64_t *ix;
    int64_t ny, nx, nw, nb;
} result;

static float *host_f32(kiln_tensor *t, int64_t *n) {
    kiln_tensor *c = kiln_contiguous(t);
    *n = c ? kiln_numel(c) : 0;
    float *h = calloc((size_t)(*n ? *n : 1), sizeof(float));
    CHECK(c && h && kiln_to_host(c, h, (size_t)*n * sizeof(float)) == KILN_OK);
    kiln_release(c);
    return h;
}

static int64_t *host_i64(kiln_tensor *t) {
    kiln_tensor *c = kiln_contiguous(t);
    int64_t n = c ? kiln_numel(c) : 0;
    int64_t *h = calloc((size_t)(n ? n : 1), sizeof(int64_t));
    CHECK(c && h && kiln_to_host(c, h, (size_t)n * sizeof(int64_t)) == KILN_OK);
    kiln_release(c);
    return h;
}

static kiln_tensor *grad_copy(kiln_tensor *t) {
    kiln_tensor *g = kiln_grad(t);
    return g ? kiln_detach(g) : NULL;
}

/* A first layer (x needs no gradient): a fused layer top_w on top of the
 * one checked, so its gradient arrives as a network's does (blocked, from
 * the next convolution's input gradient), and the fused op's backward is
 * conv2d_relu_max_pool2d_grad_weight. NULL: the loss reads y directly. */
static kiln_tensor *top_w;

/* One forward and backward, fused or as the two ops; `pre` (optional) is
 * a first fused layer 3 -> c channels, so x reaches the op blocked. */
static void run(bool fused, kiln_tensor *x0, kiln_tensor *pre_w, kiln_tensor *w, kiln_tensor *b,
                const kiln_conv2d_opts *o, int64_t pool, kiln_tensor *r_seed, result *out) {
    kiln_scope_begin();
    kiln_tensor *x = x0;
    kiln_conv2d_opts same = {.padding = {1, 1}};
    if (pre_w) x = kiln_conv2d_relu_max_pool2d(x0, pre_w, NULL, &same, 2, NULL);
    kiln_tensor *ix = NULL, *y;
    if (fused) {
        y = kiln_conv2d_relu_max_pool2d(x, w, b, o, pool, &ix);
    } else {
        kiln_pool2d_opts po = kiln_pool2d_defaults(pool);
        kiln_tensor *c = kiln_conv2d(x, w, b, o);
        y = c ? kiln_relu_max_pool2d(c, &po, &ix) : NULL;
    }
    CHECK_MSG(y && ix, "%s", kiln_error_message());
    if (!y || !ix) {
        kiln_scope_end();
        return;
    }
    kiln_tensor *top = top_w ? kiln_conv2d_relu_max_pool2d(y, top_w, NULL, &same, 2, NULL) : y;
    CHECK_MSG(top != NULL, "%s", kiln_error_message());
    kiln_shape ts = kiln_shape_of(top);
    kiln_tensor *r = kiln_narrow(kiln_view(r_seed, KILN_SHAPE(-1)), 0, 0, kiln_numel(top));
    kiln_tensor *loss = kiln_sum(kiln_mul(top, kiln_view(r, ts)), 0, NULL, false);
    CHECK_OK(kiln_backward(loss, NULL, false));
    out->y = host_f32(y, &out->ny);
    out->ix = host_i64(ix);
    bool first = top_w != NULL;
    kiln_tensor *gx = first ? NULL : grad_copy(pre_w ? pre_w : x0), *gw = grad_copy(w), *gb = b ? grad_copy(b) : NULL;
    CHECK(first != (gx != NULL) && gw && (!b || gb));
    if (gx) out->gx = host_f32(gx, &out->nx);
    if (gw) out->gw = host_f32(gw, &out->nw);
    if (gb) out->gb = host_f32(gb, &out->nb);
    CHECK_OK(kiln_scope_end());
    if (!first) CHECK_OK(kiln_zero_grad(x0, true));
    if (first) CHECK_OK(kiln_zero_grad(top_w, true));
    CHECK_OK(kiln_zero_grad(w, true));
    if (b) CHECK_OK(kiln_zero_grad(b, true));
    if (pre_w) CHECK_OK(kiln_zero_grad(pre_w, true));
}

static void result_free(result *r) {
    free(r->y), free(r->gx), free(r->gw), free(r->gb), free(r->ix);
    memset(r, 0, sizeof *r);
}

static void same_bits(const char *what, const char *name, const void *a, const void *b, int64_t n, size_t elem) {
    CHECK_MSG(a && b && memcmp(a, b, (size_t)n * elem) == 0, "%s: %s differs between the fused op and the two ops",
              what, name);
}

/* Where the fused op computes otherwise than the two ops (see below), each
 * against the other within the Winograd kernels' bound against float64
 * (tests/kernels/test_winograd_conv.c): normwise 2e-5, every element
 * within 1e-4 of the largest magnitude. */
static void close_to(const char *what, const char *name, const float *a, const float *b, int64_t n) {
    double num = 0, den = 0, worst = 0, scale = 0;
    for (int64_t i = 0; a && b && i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d, den += (double)b[i] * b[i];
        if (!(fabs(d) <= worst)) worst = fabs(d);
        if (fabs(b[i]) > scale) scale = fabs(b[i]);
    }
    double e = den > 0 ? sqrt(num / den) : sqrt(num), elem = scale > 0 ? worst / scale : worst;
    CHECK_MSG(a && b && e <= 2e-5 && elem <= 1e-4,
              "%s: %s of the fused op and of the two ops differ by %.3e normwise, %.3e elementwise", what, name, e,
              elem);
}

/* How a case's results compare: bit for bit where the fused op runs the
 * two ops' kernels; otherwise within close_to's bound:
 *   - CLOSE_GRADS: the gradients are tiled for the pooling (only the rows
 *     and columns its windows read, where that drops tiles or picks F(6x6);
 *     kiln_wino_shape.pool), so they differ in rounding;
 *   - CLOSE_ALL: also the forward, tiled otherwise over the pooled rows and
 *     columns than conv2d over all: F(6x6) where conv2d takes F(4x4), or the
 *     mixed tiling cutting an odd side's pooled part otherwise
 *     (onednn_conv.c, wino_default); the indices must still match. */
enum { EXACT, CLOSE_GRADS, CLOSE_ALL };
static int compare_mode = EXACT;

static void compare_f32(const char *what, const char *name, const float *a, const float *b, int64_t n, bool exact) {
    if (exact) same_bits(what, name, a, b, n, sizeof(float));
    else close_to(what, name, a, b, n);
}

static void check_case(const char *what, int64_t n, int64_t c, int64_t h, int64_t w, int64_t k, int64_t stride,
                       int64_t pool, bool bias, bool blocked_input) {
    kiln_manual_seed((uint64_t)(n * 1000 + c * 100 + h * 10 + w));
    int64_t c_in = blocked_input ? 3 : c, h_in = blocked_input ? 2 * h : h, w_in = blocked_input ? 2 * w : w;
    kiln_tensor *x = kiln_randn(KILN_SHAPE(n, c_in, h_in, w_in), KILN_F32, KILN_CPU);
    kiln_tensor *pre = blocked_input ? kiln_randn(KILN_SHAPE(c, 3, 3, 3), KILN_F32, KILN_CPU) : NULL;
    kiln_tensor *wt = kiln_randn(KILN_SHAPE(k, c, 3, 3), KILN_F32, KILN_CPU);
    kiln_tensor *bt = bias ? kiln_randn(KILN_SHAPE(k), KILN_F32, KILN_CPU) : NULL;
    kiln_tensor *rs = kiln_randn(KILN_SHAPE(n * k * h * w), KILN_F32, KILN_CPU);
    if (!top_w) CHECK_OK(kiln_set_requires_grad(blocked_input ? pre : x, true));
    CHECK_OK(kiln_set_requires_grad(wt, true));
    if (bt) CHECK_OK(kiln_set_requires_grad(bt, true));
    kiln_conv2d_opts o = {.stride = {stride, stride}, .padding = {1, 1}};
    for (int threads = 1; threads <= 3; threads++) {
        CHECK_OK(kiln_set_num_threads(threads));
        result f = {0}, u = {0};
        run(true, x, pre, wt, bt, &o, pool, rs, &f);
        run(false, x, pre, wt, bt, &o, pool, rs, &u);
        char tag[160];
        snprintf(tag, sizeof tag, "%s, %d threads", what, threads);
        CHECK_MSG(f.ny == u.ny && f.ny > 0, "%s: y has %lld and %lld elements", tag, (long long)f.ny, (long long)u.ny);
        if (f.ny == u.ny) {
            compare_f32(tag, "y", f.y, u.y, f.ny, compare_mode != CLOSE_ALL);
            /* other tiles ran: other roundings than conv2d's (where Kiln's Winograd is the default: an
             * AVX2 CPU; elsewhere oneDNN's direct convolution serves both) */
            if (compare_mode == CLOSE_ALL && kiln_cpu_avx2_kernels_default())
                CHECK_MSG(memcmp(f.y, u.y, (size_t)f.ny * sizeof(float)) != 0,
                          "%s: y has the two ops' bits: the fused op did not tile for its pooling", tag);
            same_bits(tag, "the indices", f.ix, u.ix, f.ny, sizeof(int64_t));
        }
        /* x's gradient is the input gradient's, from the same pooled
         * gradient and indices (the loss is linear in y): the same bits,
         * but where the gradients are tiled for the pooling (the input
         * gradient's row and column after the pooled ones from their taps) */
        if (!top_w)
            compare_f32(tag, blocked_input ? "the first layer's weight gradient" : "x's gradient", f.gx, u.gx, u.nx,
                        compare_mode == EXACT);
        compare_f32(tag, "the weight gradient", f.gw, u.gw, u.nw, compare_mode == EXACT);
        if (bias) same_bits(tag, "the bias gradient", f.gb, u.gb, u.nb, sizeof(float));
        result_free(&f);
        result_free(&u);
    }
    CHECK_OK(kiln_set_num_threads(2));
    kiln_release(x), kiln_release(pre), kiln_release(wt), kiln_release(bt), kiln_release(rs);
}

/* With timed autotuning on, the fused op still takes the default pick
 * (its workspace is sized before it runs): the same bits before and after
 * conv2d of the same shape has timed and cached its own pick. */
static void check_timed_mode(void) {
    kiln_manual_seed(5);
    kiln_tensor *x = kiln_randn(KILN_SHAPE(2, 8, 14, 11), KILN_F32, KILN_CPU);
    kiln_tensor *w = kiln_randn(KILN_SHAPE(16, 8, 3, 3), KILN_F32, KILN_CPU);
    kiln_conv2d_opts o = {.padding = {1, 1}};
    kiln_scope_begin();
    int64_t n0 = 0, n1 = 0;
    kiln_tensor *y0 = kiln_conv2d_relu_max_pool2d(x, w, NULL, &o, 2, NULL);
    float *a = y0 ? host_f32(y0, &n0) : NULL;
    kiln_set_conv_autotune(true);
    kiln_tensor *c = kiln_conv2d(x, w, NULL, &o); /* times the candidates, caches the pick */
    kiln_tensor *y1 = kiln_conv2d_relu_max_pool2d(x, w, NULL, &o, 2, NULL);
    CHECK_MSG(c && y1, "timed mode: %s", kiln_error_message());
    float *b = y1 ? host_f32(y1, &n1) : NULL;
    kiln_set_conv_autotune(false);
    CHECK_MSG(a && b && n0 == n1 && memcmp(a, b, (size_t)n0 * sizeof(float)) == 0,
              "timed autotuning changed the fused op's bits");
    free(a), free(b);
    CHECK_OK(kiln_scope_end());
    kiln_release(x), kiln_release(w);
}

int main(void) {
#ifndef KILN_WITH_ONEDNN
    printf("skipped: this build has no fast CPU kernels (KILN_WITH_ONEDNN is off)\n");
    return 77;
#else
    setenv("KILN_CPU_KERNELS", "fast", 1);
    if (kiln_init()) return 1;
    /* Winograd pooling its tiles */
    compare_mode = CLOSE_GRADS; /* 7x9: the pooling reads 6x8, fewer tiles for the weight gradient */
    check_case("F(2x2) 8->8 7x9 bias", 1, 8, 7, 9, 8, 1, 2, true, false);
    compare_mode = EXACT; /* 14x10 read of 14x11: the same 4x4 tiles (forced: the default is the mixed tiling) */
    CHECK_OK(kiln_onednn_conv_force_algorithm("winograd_4x4"));
    check_case("F(4x4) 8->16 14x11", 2, 8, 14, 11, 16, 1, 2, false, false);
    CHECK_OK(kiln_onednn_conv_force_algorithm(NULL));
    /* the mixed tiling: 14 = 4 + 4 + 6 both ways, the same regions pooled or not */
    check_case("F(4x4) with F(6x6) 16->32 14x14 bias (the 28x28x1 CNN's conv2)", 2, 16, 14, 14, 32, 1, 2, true, false);
    compare_mode = CLOSE_ALL; /* 14x10 read of 14x11: columns 4 + 6 against conv2d's 6 + 6 */
    check_case("F(4x4) with F(6x6) 8->16 14x11", 2, 8, 14, 11, 16, 1, 2, false, false);
    compare_mode = CLOSE_ALL; /* 12x10 read of 13x10: F(6x6), 4 tiles against F(4x4)'s 9 */
    check_case("F(6x6) 16->32 13x10 bias", 2, 16, 13, 10, 32, 1, 2, true, false);
    check_case("F(6x6) 64->128 7x7 bias (the 28x28x1 CNN's conv3)", 4, 64, 7, 7, 128, 1, 2, true, false);
    compare_mode = EXACT;
    check_case("F(4x4) 8->16 on a blocked input, 8x8 bias", 4, 8, 8, 8, 16, 1, 2, true, true);
    /* the convolution into the workspace, then the pooling kernels */
    check_case("small-channel 3->8 10x12 bias", 2, 3, 10, 12, 8, 1, 2, true, false);
    check_case("strided 8->8 s2 9x9 bias", 2, 8, 9, 9, 8, 2, 2, true, false);
    compare_mode = CLOSE_GRADS; /* a 3x3 pooling's 12x9: the weight gradient in F(6x6) */
    check_case("3x3 window 8->16 12x9", 2, 8, 12, 9, 16, 1, 3, false, false);
    compare_mode = EXACT;
    uint64_t runs = kiln_ops_fast_runs(KILN_OP_CONV2D_RELU_MAX_POOL2D);
    CHECK_MSG(runs > 0, "the fused op's fast kernel never ran");
    kiln_set_cpu_layouts(false);
    /* the gradients' mixed tiling, 14x11 as above (an NCHW y is not pooled by tiles) */
    compare_mode = CLOSE_GRADS;
    check_case("NCHW 8->16 14x11 bias", 2, 8, 14, 11, 16, 1, 2, true, false);
    compare_mode = EXACT;
    kiln_set_cpu_layouts(true);
    CHECK_MSG(kiln_ops_fast_runs(KILN_OP_CONV2D_RELU_MAX_POOL2D) > runs, "the fast kernel did not run on NCHW");
    check_timed_mode();
    /* first layers (x needs no gradient): conv2d_relu_max_pool2d_grad_weight, the small-channel
     * weight gradient scattering the pooled gradient itself (1, 2 and 3 channels; odd sizes
     * leave a row and a column no window covers), and the pooling's backward into the
     * workspace before Kiln's Winograd (8 channels) or oneDNN's strided weight gradient */
    uint64_t wruns = kiln_ops_fast_runs(KILN_OP_CONV2D_RELU_MAX_POOL2D_GRAD_WEIGHT);
    for (int i = 0; i < 2; i++) {
        kiln_manual_seed(11);
        top_w = kiln_randn(KILN_SHAPE(8, i ? 16 : 8, 3, 3), KILN_F32, KILN_CPU);
        CHECK_OK(kiln_set_requires_grad(top_w, true));
        if (i == 0) {
            check_case("first layer, small-channel 1->8 28x28 bias", 4, 1, 28, 28, 8, 1, 2, true, false);
            check_case("first layer, small-channel 2->8 13x11 bias", 3, 2, 13, 11, 8, 1, 2, true, false);
            check_case("first layer, small-channel 3->8 10x12 bias", 2, 3, 10, 12, 8, 1, 2, true, false);
            check_case("first layer, strided 8->8 s2 9x9 bias", 2, 8, 9, 9, 8, 2, 2, true, false);
        } else {
            check_case("first layer, small-channel 1->16 9x15", 2, 1, 9, 15, 16, 1, 2, false, false);
            compare_mode = CLOSE_ALL; /* the mixed tiling over 14x10 against 14x11 */
            check_case("first layer, Winograd 8->16 14x11 bias", 2, 8, 14, 11, 16, 1, 2, true, false);
            compare_mode = EXACT;
        }
        kiln_release(top_w);
        top_w = NULL;
    }
    CHECK_MSG(kiln_ops_fast_runs(KILN_OP_CONV2D_RELU_MAX_POOL2D_GRAD_WEIGHT) > wruns,
              "conv2d_relu_max_pool2d_grad_weight's fast kernel never ran");
    kiln_shutdown();
    return kt_finish();
#endif
}

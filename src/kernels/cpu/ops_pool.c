/* CPU reference kernels of 2-d pooling (max with indices, average,
 * adaptive average, relu_max_pool2d) and their backwards. Inputs are
 * (N, C, H, W) or (C, H, W); a 3-d tensor is read as N = 1. Values are
 * computed in double; the backwards sum each plane into a double
 * workspace plane (H, W) before storing, so f16/bf16 gradients round
 * once. */
#include <math.h>

#include "base/error.h"
#include "kernels/cpu/nn_cpu_util.h"
#include "kernels/cpu/ops_nn_cpu.h"
#include "kernels/nn_geometry.h"

/* A 3-d or 4-d strided tensor seen as (N, C, H, W). */
typedef struct plane4 {
    int64_t shape[4], strides[4];
} plane4;

static plane4 as4(const kiln_strided *t) {
    plane4 p;
    int lead = 4 - t->ndim;
    for (int i = 0; i < 4; i++) {
        p.shape[i] = i < lead ? 1 : t->shape[i - lead];
        p.strides[i] = i < lead ? 0 : t->strides[i - lead];
    }
    return p;
}

static int64_t off4(const plane4 *p, int64_t n, int64_t c, int64_t h, int64_t w) {
    return n * p->strides[0] + c * p->strides[1] + h * p->strides[2] + w * p->strides[3];
}

/* relu: relu_max_pool2d, the windows read through relu (NaN kept, as relu
 * does), so values and indices are max_pool2d's of relu(x). */
static kiln_status max_pool_run(const kiln_op_args *a, bool relu) {
    const kiln_strided *x = &a->in[0], *y = &a->out[0], *ix = &a->out[1];
    kiln_pool_geom g = kiln_pool_geom_of(a->attrs);
    plane4 xp = as4(x), yp = as4(y), ip = as4(ix);
    int64_t H = xp.shape[2], W = xp.shape[3];
    for (int64_t n = 0; n < yp.shape[0]; n++)
        for (int64_t c = 0; c < yp.shape[1]; c++)
            for (int64_t oh = 0; oh < yp.shape[2]; oh++)
                for (int64_t ow = 0; ow < yp.shape[3]; ow++) {
                    int64_t h0 = oh * g.stride[0] - g.padding[0], w0 = ow * g.stride[1] - g.padding[1];
                    int64_t h1 = h0 + g.kernel[0] < H ? h0 + g.kernel[0] : H;
                    int64_t w1 = w0 + g.kernel[1] < W ? w0 + g.kernel[1] : W;
                    if (h0 < 0) h0 = 0;
                    if (w0 < 0) w0 = 0;
                    /* The first maximum wins ties; NaN beats everything, as in PyTorch. */
                    double best = -INFINITY;
                    int64_t best_i = h0 * W + w0;
                    for (int64_t h = h0; h < h1; h++)
                        for (int64_t w = w0; w < w1; w++) {
                            double v = nn_ld(x->data, x->dtype, off4(&xp, n, c, h, w));
                            if (relu && !(v > 0 || isnan(v))) v = 0;
                            if (v > best || isnan(v)) best = v, best_i = h * W + w;
                        }
                    nn_st(y->data, y->dtype, off4(&yp, n, c, oh, ow), best);
                    ((int64_t *)ix->data)[off4(&ip, n, c, oh, ow)] = best_i;
                }
    return KILN_OK;
}

kiln_status kiln_cpu_max_pool2d(const kiln_op_args *a) { return max_pool_run(a, false); }

kiln_status kiln_cpu_relu_max_pool2d(const kiln_op_args *a) { return max_pool_run(a, true); }

size_t kiln_cpu_pool_backward_workspace(const kiln_op_args *a) {
    const kiln_strided *dx = &a->out[0];
    return (size_t)(dx->shape[dx->ndim - 1] * dx->shape[dx->ndim - 2]) * sizeof(double);
}

static void store_plane(const kiln_strided *dx, const plane4 *dp, int64_t n, int64_t c, const double *acc) {
    for (int64_t h = 0; h < dp->shape[2]; h++)
        for (int64_t w = 0; w < dp->shape[3]; w++)
            nn_st(dx->data, dx->dtype, off4(dp, n, c, h, w), acc[h * dp->shape[3] + w]);
}

/* y: relu_max_pool2d's output (its backward: only gradients with y > 0
 * are scattered), or NULL (max_pool2d's). */
static kiln_status max_pool_backward_run(const kiln_op_args *a, const kiln_strided *go, const kiln_strided *y,
                                         const kiln_strided *ix, const char *fn, const char *hint) {
    const kiln_strided *dx = &a->out[0];
    plane4 gp = as4(go), ip = as4(ix), dp = as4(dx), yp = y ? as4(y) : gp;
    int64_t HW = dp.shape[2] * dp.shape[3];
    double *acc = a->workspace; /* (H, W) */
    for (int64_t n = 0; n < dp.shape[0]; n++)
        for (int64_t c = 0; c < dp.shape[1]; c++) {
            for (int64_t i = 0; i < HW; i++) acc[i] = 0;
            for (int64_t oh = 0; oh < gp.shape[2]; oh++)
                for (int64_t ow = 0; ow < gp.shape[3]; ow++) {
                    int64_t k = nn_ldi(ix->data, ix->dtype, off4(&ip, n, c, oh, ow));
                    if (k < 0 || k >= HW)
                        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, hint,
                                          "%s: index %lld is outside the %lld-element plane", fn,
                                          (long long)k, (long long)HW);
                    if (y && !(nn_ld(y->data, y->dtype, off4(&yp, n, c, oh, ow)) > 0)) continue;
                    acc[k] += nn_ld(go->data, go->dtype, off4(&gp, n, c, oh, ow));
                }
            store_plane(dx, &dp, n, c, acc);
        }
    return KILN_OK;
}

kiln_status kiln_cpu_max_pool2d_backward(const kiln_op_args *a) {
    return max_pool_backward_run(a, &a->in[0], NULL, &a->in[1], "kiln_max_pool2d_backward",
                                 "pass the indices kiln_max_pool2d returned");
}

/* (grad_out, y, indices): max_pool2d_backward's scatter of the gradients
 * whose y > 0, relu's backward in the same pass. */
kiln_status kiln_cpu_relu_max_pool2d_backward(const kiln_op_args *a) {
    return max_pool_backward_run(a, &a->in[0], &a->in[1], &a->in[2], "relu_max_pool2d_backward",
                                 "pass the indices kiln_relu_max_pool2d returned");
}

/* relu_max_pool2d_backward (4-d), then out[1][c] = the sum of grad_input
 * over N, H and W, accumulated in double in (n, h, w) order. */
kiln_status kiln_cpu_relu_max_pool2d_backward_sum(const kiln_op_args *a) {
    KILN_TRY(kiln_cpu_relu_max_pool2d_backward(a));
    const kiln_strided *dx = &a->out[0], *sums = &a->out[1];
    plane4 dp = as4(dx);
    for (int64_t c = 0; c < dp.shape[1]; c++) {
        double acc = 0;
        for (int64_t n = 0; n < dp.shape[0]; n++)
            for (int64_t h = 0; h < dp.shape[2]; h++)
                for (int64_t w = 0; w < dp.shape[3]; w++) acc += nn_ld(dx->data, dx->dtype, off4(&dp, n, c, h, w));
        nn_st(sums->data, sums->dtype, c * sums->strides[0], acc);
    }
    return KILN_OK;
}

/* One average-pooling window: clipped bounds and PyTorch's divisor. */
typedef struct avg_window {
    int64_t h0, h1, w0, w1;
    double divisor;
} avg_window;

static avg_window window_of(const kiln_pool_geom *g, int64_t H, int64_t W, int64_t oh, int64_t ow) {
    avg_window r;
    int64_t h0 = oh * g->stride[0] - g->padding[0], w0 = ow * g->stride[1] - g->padding[1];
    int64_t h1 = h0 + g->kernel[0], w1 = w0 + g->kernel[1];
    if (h1 > H + g->padding[0]) h1 = H + g->padding[0];
    if (w1 > W + g->padding[1]) w1 = W + g->padding[1];
    int64_t pool_size = (h1 - h0) * (w1 - w0);
    r.h0 = h0 < 0 ? 0 : h0, r.w0 = w0 < 0 ? 0 : w0;
    r.h1 = h1 > H ? H : h1, r.w1 = w1 > W ? W : w1;
    r.divisor = (double)(g->count_include_pad ? pool_size : (r.h1 - r.h0) * (r.w1 - r.w0));
    return r;
}

kiln_status kiln_cpu_avg_pool2d(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *y = &a->out[0];
    kiln_pool_geom g = kiln_pool_geom_of(a->attrs);
    plane4 xp = as4(x), yp = as4(y);
    for (int64_t n = 0; n < yp.shape[0]; n++)
        for (int64_t c = 0; c < yp.shape[1]; c++)
            for (int64_t oh = 0; oh < yp.shape[2]; oh++)
                for (int64_t ow = 0; ow < yp.shape[3]; ow++) {
                    avg_window r = window_of(&g, xp.shape[2], xp.shape[3], oh, ow);
                    double s = 0;
                    for (int64_t h = r.h0; h < r.h1; h++)
                        for (int64_t w = r.w0; w < r.w1; w++)
                            s += nn_ld(x->data, x->dtype, off4(&xp, n, c, h, w));
                    nn_st(y->data, y->dtype, off4(&yp, n, c, oh, ow), s / r.divisor);
                }
    return KILN_OK;
}

kiln_status kiln_cpu_avg_pool2d_backward(const kiln_op_args *a) {
    const kiln_strided *go = &a->in[0], *dx = &a->out[0];
    kiln_pool_geom g = kiln_pool_geom_of(a->attrs);
    plane4 gp = as4(go), dp = as4(dx);
    int64_t H = dp.shape[2], W = dp.shape[3];
    double *acc = a->workspace; /* (H, W) */
    for (int64_t n = 0; n < dp.shape[0]; n++)
        for (int64_t c = 0; c < dp.shape[1]; c++) {
            for (int64_t i = 0; i < H * W; i++) acc[i] = 0;
            for (int64_t oh = 0; oh < gp.shape[2]; oh++)
                for (int64_t ow = 0; ow < gp.shape[3]; ow++) {
                    avg_window r = window_of(&g, H, W, oh, ow);
                    double v = nn_ld(go->data, go->dtype, off4(&gp, n, c, oh, ow)) / r.divisor;
                    for (int64_t h = r.h0; h < r.h1; h++)
                        for (int64_t w = r.w0; w < r.w1; w++) acc[h * W + w] += v;
                }
            store_plane(dx, &dp, n, c, acc);
        }
    return KILN_OK;
}

kiln_status kiln_cpu_adaptive_avg_pool2d(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *y = &a->out[0];
    plane4 xp = as4(x), yp = as4(y);
    int64_t H = xp.shape[2], W = xp.shape[3], Ho = yp.shape[2], Wo = yp.shape[3];
    for (int64_t n = 0; n < yp.shape[0]; n++)
        for (int64_t c = 0; c < yp.shape[1]; c++)
            for (int64_t oh = 0; oh < Ho; oh++)
                for (int64_t ow = 0; ow < Wo; ow++) {
                    int64_t h0 = kiln_adaptive_start(oh, Ho, H), h1 = kiln_adaptive_end(oh, Ho, H);
                    int64_t w0 = kiln_adaptive_start(ow, Wo, W), w1 = kiln_adaptive_end(ow, Wo, W);
                    double s = 0;
                    for (int64_t h = h0; h < h1; h++)
                        for (int64_t w = w0; w < w1; w++)
                            s += nn_ld(x->data, x->dtype, off4(&xp, n, c, h, w));
                    nn_st(y->data, y->dtype, off4(&yp, n, c, oh, ow), s / (double)((h1 - h0) * (w1 - w0)));
                }
    return KILN_OK;
}

kiln_status kiln_cpu_adaptive_avg_pool2d_backward(const kiln_op_args *a) {
    const kiln_strided *go = &a->in[0], *dx = &a->out[0];
    plane4 gp = as4(go), dp = as4(dx);
    int64_t H = dp.shape[2], W = dp.shape[3], Ho = gp.shape[2], Wo = gp.shape[3];
    double *acc = a->workspace; /* (H, W) */
    for (int64_t n = 0; n < dp.shape[0]; n++)
        for (int64_t c = 0; c < dp.shape[1]; c++) {
            for (int64_t i = 0; i < H * W; i++) acc[i] = 0;
            for (int64_t oh = 0; oh < Ho; oh++)
                for (int64_t ow = 0; ow < Wo; ow++) {
                    int64_t h0 = kiln_adaptive_start(oh, Ho, H), h1 = kiln_adaptive_end(oh, Ho, H);
                    int64_t w0 = kiln_adaptive_start(ow, Wo, W), w1 = kiln_adaptive_end(ow, Wo, W);
                    double v =
                        nn_ld(go->data, go->dtype, off4(&gp, n, c, oh, ow)) / (double)((h1 - h0) * (w1 - w0));
                    for (int64_t h = h0; h < h1; h++)
                        for (int64_t w = w0; w < w1; w++) acc[h * W + w] += v;
                }
            store_plane(dx, &dp, n, c, acc);
        }
    return KILN_OK;
}

/* Fast CPU max pooling for f32 on contiguous (N, C, H, W) tensors: the
 * forward with indices and the backward, one plane at a time, planes
 * shared out over OpenMP threads when the build has OpenMP. Same results
 * as the reference kernels (kernels/cpu/ops_pool.c), bit for bit: the first
 * maximum wins ties, NaN beats everything; the backward adds each window's
 * gradient in the same order the reference does, in f32 instead of double
 * only where no two windows share an input (stride >= kernel), where the
 * sum has one term. Overlapping windows are declined (reference kernel). */
#include <math.h>
#include <string.h>

#include "kernels/cpu/fast/fast_kernels.h"
#include "kernels/nn_geometry.h"

static bool contiguous(const kiln_strided *t) {
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != expect) return false;
        expect *= t->shape[i];
    }
    return true;
}

/* (planes, H, W) of a contiguous 3-d or 4-d tensor. */
static void planes_of(const kiln_strided *t, int64_t *planes, int64_t *h, int64_t *w) {
    *planes = 1;
    for (int i = 0; i < t->ndim - 2; i++) *planes *= t->shape[i];
    *h = t->shape[t->ndim - 2];
    *w = t->shape[t->ndim - 1];
}

bool kiln_fast_max_pool2d_supports(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *y = &a->out[0], *ix = &a->out[1];
    if (x->ndim < 3 || x->ndim > 4 || x->dtype != KILN_F32 || y->dtype != KILN_F32 || a->n_out < 2 ||
        ix->dtype != KILN_I64)
        return false;
    return contiguous(x) && contiguous(y) && contiguous(ix);
}

kiln_status kiln_fast_max_pool2d(const kiln_op_args *a) {
    const float *x = a->in[0].data;
    float *y = a->out[0].data;
    int64_t *ix = a->out[1].data;
    kiln_pool_geom g = kiln_pool_geom_of(a->attrs);
    int64_t P, H, W, OH, OW, unused;
    planes_of(&a->in[0], &P, &H, &W);
    planes_of(&a->out[0], &unused, &OH, &OW);
    const int64_t kh = g.kernel[0], kw = g.kernel[1], sh = g.stride[0], sw = g.stride[1];
    const int64_t ph = g.padding[0], pw = g.padding[1];
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (P * OH * OW > 4096)
#endif
    for (int64_t p = 0; p < P; p++) {
        const float *xp = x + p * H * W;
        float *yp = y + p * OH * OW;
        int64_t *ip = ix + p * OH * OW;
        if (kh == 2 && kw == 2 && sh == 2 && sw == 2 && ph == 0 && pw == 0 && 2 * OH <= H && 2 * OW <= W) {
            /* The common 2x2 window fully inside the input: the same
             * comparisons in the same order as the general loop below
             * (which starts from -inf: the first value is taken unless it is
             * -inf, where the first index is kept all the same). */
            for (int64_t oh = 0; oh < OH; oh++) {
                const float *r0 = xp + 2 * oh * W, *r1 = r0 + W;
                for (int64_t ow = 0; ow < OW; ow++) {
                    /* selects rather than branches, so it vectorises */
                    int64_t w = 2 * ow, base = 2 * oh * W + w;
                    float best = r0[w], c;
                    int64_t bi = base;
                    c = r0[w + 1];
                    bool take = (c > best) | (c != c);
                    best = take ? c : best, bi = take ? base + 1 : bi;
                    c = r1[w];
                    take = (c > best) | (c != c);
                    best = take ? c : best, bi = take ? base + W : bi;
                    c = r1[w + 1];
                    take = (c > best) | (c != c);
                    best = take ? c : best, bi = take ? base + W + 1 : bi;
                    yp[oh * OW + ow] = best;
                    ip[oh * OW + ow] = bi;
                }
            }
            continue;
        }
        for (int64_t oh = 0; oh < OH; oh++) {
            int64_t h0 = oh * sh - ph, h1 = h0 + kh < H ? h0 + kh : H;
            if (h0 < 0) h0 = 0;
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t w0 = ow * sw - pw, w1 = w0 + kw < W ? w0 + kw : W;
                if (w0 < 0) w0 = 0;
                float best = -INFINITY;
                int64_t best_i = h0 * W + w0;
                for (int64_t h = h0; h < h1; h++)
                    for (int64_t w = w0; w < w1; w++) {
                        float v = xp[h * W + w];
                        if (v > best || isnan(v)) best = v, best_i = h * W + w;
                    }
                yp[oh * OW + ow] = best;
                ip[oh * OW + ow] = best_i;
            }
        }
    }
    return KILN_OK;
}

bool kiln_fast_max_pool2d_backward_supports(const kiln_op_args *a) {
    const kiln_strided *go = &a->in[0], *ix = &a->in[1], *dx = &a->out[0];
    kiln_pool_geom g = kiln_pool_geom_of(a->attrs);
    if (go->ndim < 3 || go->ndim > 4 || go->dtype != KILN_F32 || dx->dtype != KILN_F32 || ix->dtype != KILN_I64)
        return false;
    /* Windows that overlap would add several gradients into one input:
     * the reference sums those in double, so leave them to it. */
    if (g.stride[0] < g.kernel[0] || g.stride[1] < g.kernel[1]) return false;
    return contiguous(go) && contiguous(ix) && contiguous(dx);
}

/* The scatter of grad_out into grad_input through the indices; with y
 * (relu_max_pool2d_backward) only the gradients whose y > 0. `op` names
 * the op and `hint` the way out in the error. part (a double per plane)
 * or NULL: each plane's sum of what it scattered, in order. */
static kiln_status scatter_backward(const kiln_op_args *a, const int64_t *ix, const float *yv, const char *op,
                                    const char *hint, double *part) {
    const float *go = a->in[0].data;
    float *dx = a->out[0].data;
    int64_t P, H, W, OH, OW, unused;
    planes_of(&a->out[0], &P, &H, &W);
    planes_of(&a->in[0], &unused, &OH, &OW);
    const int64_t HW = H * W, OHW = OH * OW;
    int bad = 0;
    int64_t bad_index = 0;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (P * HW > 4096)
#endif
    for (int64_t p = 0; p < P; p++) {
        float *dp = dx + p * HW;
        const float *gp = go + p * OHW;
        const int64_t *ip = ix + p * OHW;
        memset(dp, 0, sizeof(float) * (size_t)HW);
        double acc = 0.0;
        for (int64_t i = 0; i < OHW; i++) {
            if (yv && !(yv[p * OHW + i] > 0.0f)) continue;
            int64_t k = ip[i];
            if (k < 0 || k >= HW) {
#ifdef _OPENMP
#pragma omp critical(kiln_fast_pool_bad)
#endif
                {
                    bad = 1;
                    bad_index = k;
                }
                continue;
            }
            dp[k] += gp[i];
            acc += (double)gp[i];
        }
        if (part) part[p] = acc;
    }
    if (bad)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, hint, "%s: index %lld is outside the %lld-element plane", op,
                          (long long)bad_index, (long long)HW);
    return KILN_OK;
}

kiln_status kiln_fast_max_pool2d_backward(const kiln_op_args *a) {
    return scatter_backward(a, a->in[1].data, NULL, "kiln_max_pool2d_backward",
                            "pass the indices kiln_max_pool2d returned", NULL);
}

/* ---- relu_max_pool2d on contiguous NCHW ------------------------------------------------ */

/* max_pool2d, then ReLU on the maxima; where nothing in a window is
 * positive (after relu all zeros) the index is the window's first element,
 * as max pooling of relu(x) gives. */
kiln_status kiln_fast_relu_max_pool2d(const kiln_op_args *a) {
    KILN_TRY(kiln_fast_max_pool2d(a));
    float *y = a->out[0].data;
    int64_t *ix = a->out[1].data;
    kiln_pool_geom g = kiln_pool_geom_of(a->attrs);
    int64_t P, H, W, OH, OW;
    planes_of(&a->in[0], &P, &H, &W);
    planes_of(&a->out[0], &P, &OH, &OW);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (P * OH * OW > 4096)
#endif
    for (int64_t p = 0; p < P; p++)
        for (int64_t oh = 0; oh < OH; oh++) {
            int64_t h0 = oh * g.stride[0] - g.padding[0];
            if (h0 < 0) h0 = 0;
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t o = (p * OH + oh) * OW + ow, w0 = ow * g.stride[1] - g.padding[1];
                if (w0 < 0) w0 = 0;
                if (!(y[o] > 0.0f || y[o] != y[o])) y[o] = 0.0f, ix[o] = h0 * W + w0;
            }
        }
    return KILN_OK;
}

/* (grad_out, y, indices): max_pool2d_backward's scatter of the gradients
 * whose y > 0. Non-overlapping windows (as kiln_fast_max_pool2d_backward). */
bool kiln_fast_relu_max_pool2d_backward_supports(const kiln_op_args *a) {
    if (a->n_in < 3 || !contiguous(&a->in[1]) || a->in[1].dtype != KILN_F32) return false;
    kiln_op_args b = *a;
    b.n_in = 2, b.in[1] = a->in[2];
    return kiln_fast_max_pool2d_backward_supports(&b);
}

kiln_status kiln_fast_relu_max_pool2d_backward(const kiln_op_args *a) {
    return scatter_backward(a, a->in[2].data, a->in[1].data, "kiln_relu_max_pool2d_backward",
                            "pass the indices kiln_relu_max_pool2d returned", NULL);
}

kiln_status kiln_plain_relu_max_pool2d_backward_sum(const kiln_op_args *a, double *part) {
    return scatter_backward(a, a->in[2].data, a->in[1].data, "kiln_relu_max_pool2d_backward_sum",
                            "pass the indices kiln_relu_max_pool2d returned", part);
}

/* ---- relu_max_pool2d_backward_sum ------------------------------------------------------- */

/* The backward's kernel (blocked or plain, by the indices' layout) gives
 * each (n, c) plane's sum from the gradients it passes, no second pass
 * over grad_input; the planes are added here in n order, so the bits do
 * not depend on the thread count. Workspace: a double per plane. */
static bool blocked_layout(kiln_layout l) { return kiln_layout_block(l) != 0; }

bool kiln_fast_relu_max_pool2d_backward_sum_supports(const kiln_op_args *a) {
    if (a->n_out >= 1 && a->out[0].dtype == KILN_BF16) return kiln_bf16_relu_max_pool2d_backward_sum_supports(a);
    if (a->n_in < 3 || a->n_out != 2 || a->out[0].ndim != 4 || a->out[1].dtype != KILN_F32 || a->out[1].ndim != 1)
        return false;
    if (blocked_layout(a->in[2].layout)) return kiln_blocked_relu_max_pool2d_backward_supports(a);
    return !blocked_layout(a->in[0].layout) && !blocked_layout(a->in[1].layout) &&
           kiln_fast_relu_max_pool2d_backward_supports(a);
}

size_t kiln_fast_relu_max_pool2d_backward_sum_workspace(const kiln_op_args *a) {
    if (a->out[0].dtype == KILN_BF16) return kiln_bf16_relu_max_pool2d_backward_sum_workspace(a);
    return (size_t)(a->out[0].shape[0] * a->out[0].shape[1]) * sizeof(double);
}

void kiln_fast_relu_max_pool2d_backward_sum_layout(const kiln_op_args *a, kiln_layout *out) {
    out[0] = a->in[2].layout; /* the forward input's layout, which its indices keep */
    out[1] = KILN_LAYOUT_STRIDED;
}

/* out[1][c] = sum over n of part[n * C + c], in n order. */
void kiln_fast_add_planes(const double *part, int64_t n, int64_t c, const kiln_strided *sums) {
    float *s = sums->data;
    for (int64_t j = 0; j < c; j++) {
        double v = 0.0;
        for (int64_t i = 0; i < n; i++) v += part[i * c + j];
        s[j * sums->strides[0]] = (float)v;
    }
}

kiln_status kiln_fast_relu_max_pool2d_backward_sum(const kiln_op_args *a) {
    if (a->out[0].dtype == KILN_BF16) return kiln_bf16_relu_max_pool2d_backward_sum(a);
    double *part = a->workspace;
    KILN_TRY(blocked_layout(a->in[2].layout) ? kiln_blocked_relu_max_pool2d_backward_sum(a, part)
                                             : kiln_plain_relu_max_pool2d_backward_sum(a, part));
    kiln_fast_add_planes(part, a->out[0].shape[0], a->out[0].shape[1], &a->out[1]);
    return KILN_OK;
}

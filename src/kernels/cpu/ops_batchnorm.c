/* CPU reference kernels of batch norm and its backward. x is (N, C, ...)
 * with any strides; each channel's elements are visited through the view
 * that drops dim 1. Statistics are summed in double; the parameters,
 * statistics and their gradients are f32 (C), the activations any float
 * dtype. */
#include <math.h>

#include "kernels/cpu/nn_cpu_util.h"
#include "kernels/cpu/ops_nn_cpu.h"

/* The elements of channel c of t: (ndim - 1) dims, base offset. */
typedef struct channel_view {
    int ndim;
    int64_t shape[KILN_MAX_DIMS], strides[KILN_MAX_DIMS];
    int64_t base;
    int64_t count;
} channel_view;

static channel_view channel_of(const kiln_strided *t, int64_t c) {
    channel_view v = {.ndim = t->ndim - 1, .base = c * t->strides[1], .count = 1};
    for (int i = 0, j = 0; i < t->ndim; i++) {
        if (i == 1) continue;
        v.shape[j] = t->shape[i], v.strides[j] = t->strides[i];
        v.count *= t->shape[i];
        j++;
    }
    return v;
}

/* Element k of the channel (row-major over its dims) for two tensors with
 * the same shape is visited by one counter; these loops keep one. */
#define FOR_CHANNEL(v, idx, ...)                                                                             \
    do {                                                                                                     \
        int64_t idx[KILN_MAX_DIMS] = {0};                                                                    \
        if ((v).count == 0) break;                                                                           \
        do {                                                                                                 \
            __VA_ARGS__;                                                                                     \
        } while (nn_next((v).ndim, (v).shape, idx));                                                         \
    } while (0)

static double param(const kiln_strided *p, int64_t c, double absent) {
    return p->ndim >= 0 ? nn_ld(p->data, p->dtype, c * p->strides[0]) : absent;
}

kiln_status kiln_cpu_batch_norm(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *w = &a->in[1], *b = &a->in[2], *rm = &a->in[3], *rv = &a->in[4];
    const kiln_strided *y = &a->out[0], *mo = &a->out[1], *io = &a->out[2];
    const kiln_op_attrs *at = a->attrs;
    int64_t C = x->shape[1];
    for (int64_t c = 0; c < C; c++) {
        channel_view xv = channel_of(x, c), yv = channel_of(y, c);
        double mean, invstd;
        if (at->training) {
            double s = 0, ss = 0;
            FOR_CHANNEL(xv, idx,
                        s += nn_ld(x->data, x->dtype, xv.base + nn_offset(xv.ndim, xv.strides, idx)));
            mean = xv.count ? s / (double)xv.count : 0.0;
            FOR_CHANNEL(xv, idx, {
                double d = nn_ld(x->data, x->dtype, xv.base + nn_offset(xv.ndim, xv.strides, idx)) - mean;
                ss += d * d;
            });
            double var = xv.count ? ss / (double)xv.count : 0.0;
            invstd = 1.0 / sqrt(var + at->eps);
            if (at->momentum >= 0 && rm->ndim >= 0) {
                double old = param(rm, c, 0);
                nn_st(rm->data, rm->dtype, c * rm->strides[0],
                      (1 - at->momentum) * old + at->momentum * mean);
            }
            if (at->momentum >= 0 && rv->ndim >= 0) {
                double unbiased = xv.count > 1 ? ss / (double)(xv.count - 1) : var;
                double old = param(rv, c, 1);
                nn_st(rv->data, rv->dtype, c * rv->strides[0],
                      (1 - at->momentum) * old + at->momentum * unbiased);
            }
        } else {
            mean = param(rm, c, 0);
            invstd = 1.0 / sqrt(param(rv, c, 1) + at->eps);
        }
        double alpha = invstd * param(w, c, 1), beta = param(b, c, 0) - mean * alpha;
        FOR_CHANNEL(xv, idx, {
            double v = nn_ld(x->data, x->dtype, xv.base + nn_offset(xv.ndim, xv.strides, idx));
            nn_st(y->data, y->dtype, yv.base + nn_offset(yv.ndim, yv.strides, idx), v * alpha + beta);
        });
        nn_st(mo->data, mo->dtype, c * mo->strides[0], mean);
        nn_st(io->data, io->dtype, c * io->strides[0], invstd);
    }
    return KILN_OK;
}

/* training: dx = w invstd (g - mean(g) - xhat mean(g xhat)); eval: dx = g w invstd.
 * Both: dweight = sum(g xhat), dbias = sum(g), xhat = (x - mean) invstd. */
kiln_status kiln_cpu_batch_norm_backward(const kiln_op_args *a) {
    const kiln_strided *go = &a->in[0], *x = &a->in[1], *w = &a->in[2], *mn = &a->in[3], *is = &a->in[4];
    const kiln_strided *dx = &a->out[0], *dw = &a->out[1], *db = &a->out[2];
    int64_t C = x->shape[1];
    for (int64_t c = 0; c < C; c++) {
        channel_view xv = channel_of(x, c), gv = channel_of(go, c), dv = channel_of(dx, c);
        double mean = param(mn, c, 0), invstd = param(is, c, 1), wc = param(w, c, 1);
        double sg = 0, sgx = 0;
        FOR_CHANNEL(xv, idx, {
            double g = nn_ld(go->data, go->dtype, gv.base + nn_offset(gv.ndim, gv.strides, idx));
            double xc = nn_ld(x->data, x->dtype, xv.base + nn_offset(xv.ndim, xv.strides, idx)) - mean;
            sg += g, sgx += g * xc;
        });
        double n = xv.count ? (double)xv.count : 1.0;
        double gmean = sg / n, proj = sgx / n * invstd * invstd;
        FOR_CHANNEL(xv, idx, {
            double g = nn_ld(go->data, go->dtype, gv.base + nn_offset(gv.ndim, gv.strides, idx));
            double r;
            if (a->attrs->training) {
                double xc = nn_ld(x->data, x->dtype, xv.base + nn_offset(xv.ndim, xv.strides, idx)) - mean;
                r = (g - gmean - xc * proj) * invstd * wc;
            } else {
                r = g * invstd * wc;
            }
            nn_st(dx->data, dx->dtype, dv.base + nn_offset(dv.ndim, dv.strides, idx), r);
        });
        nn_st(dw->data, dw->dtype, c * dw->strides[0], sgx * invstd);
        nn_st(db->data, db->dtype, c * db->strides[0], sg);
    }
    return KILN_OK;
}

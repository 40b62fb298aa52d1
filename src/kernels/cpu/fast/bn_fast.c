/* Fast CPU batch norm and its backward for f32 activations (N, C, H, W),
 * contiguous NCHW or nChw16c (kiln/tensor.h), with f32 per-channel
 * parameters and statistics: channels (or blocks of 16 channels) shared
 * out over OpenMP threads, the inner loops vectorised (target clones).
 * The arithmetic is the reference kernel's (kernels/cpu/ops_batchnorm.c):
 * statistics and the affine map in double, stored as f32; the sums run in
 * another order (lanes, then lanes combined), so the last bits of a mean
 * or variance may differ from the reference's sequential sum. The output
 * takes x's layout. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/fast/fast_kernels.h"

#define LMAX 16 /* the largest channel block (nChw16c) */

static bool f32_vec(const kiln_strided *t, int64_t C) {
    return t->ndim == 1 && t->shape[0] == C && t->dtype == KILN_F32 && (C <= 1 || t->strides[0] == 1) &&
           t->layout == KILN_LAYOUT_STRIDED;
}

static bool opt_vec(const kiln_strided *t, int64_t C) { return t->ndim < 0 || f32_vec(t, C); }

/* x's layout: 0 NCHW contiguous, its channel block for nChw16c (16) and
 * nChw8c (8); -1 neither. */
static int act_layout(const kiln_strided *t) {
    if (t->ndim != 4 || t->dtype != KILN_F32) return -1;
    const int block = kiln_layout_block(t->layout);
    if (block) return t->shape[1] % block == 0 ? block : -1;
    if (t->layout != KILN_LAYOUT_STRIDED) return -1;
    int64_t expect = 1;
    for (int i = 3; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != expect) return -1;
        expect *= t->shape[i];
    }
    return 0;
}

/* Element (n, c, i) of a 4-D activation in layout `lay`, i < H*W. */
static inline int64_t at(int lay, int64_t n, int64_t c, int64_t i, int64_t C, int64_t HW) {
    return lay ? ((n * (C / lay) + c / lay) * HW + i) * lay + (c % lay) : (n * C + c) * HW + i;
}

/* The sums over one channel's span of `len` values at stride `step`. */
KILN_SIMD_CLONES static double span_sum(const float *restrict x, int64_t len, int64_t step) {
    double s = 0;
    for (int64_t i = 0; i < len; i++) s += (double)x[i * step];
    return s;
}

KILN_SIMD_CLONES static double span_sq(const float *restrict x, int64_t len, int64_t step, double mean) {
    double s = 0;
    for (int64_t i = 0; i < len; i++) {
        double d = (double)x[i * step] - mean;
        s += d * d;
    }
    return s;
}

KILN_SIMD_CLONES static void span_affine(const float *restrict x, float *restrict y, int64_t len, int64_t step,
                                         double alpha, double beta) {
    for (int64_t i = 0; i < len; i++) y[i * step] = (float)((double)x[i * step] * alpha + beta);
}

/* Blocked layouts: one block of B channels at a time, B lanes side by side
 * (written once, made for B = 16 and B = 8). */
#define BLK_FUNCS(B) \
KILN_SIMD_CLONES static void blk_sum_##B(const float *restrict x, int64_t HW, double *restrict acc) {            \
    for (int64_t i = 0; i < HW; i++)                                                                             \
        for (int l = 0; l < B; l++) acc[l] += (double)x[i * B + l];                                              \
}                                                                                                                \
                                                                                                                 \
KILN_SIMD_CLONES static void blk_sq_##B(const float *restrict x, int64_t HW, const double *restrict mean,        \
                                    double *restrict acc) {                                                      \
    for (int64_t i = 0; i < HW; i++)                                                                             \
        for (int l = 0; l < B; l++) {                                                                            \
            double d = (double)x[i * B + l] - mean[l];                                                           \
            acc[l] += d * d;                                                                                     \
        }                                                                                                        \
}                                                                                                                \
                                                                                                                 \
KILN_SIMD_CLONES static void blk_affine_##B(const float *restrict x, float *restrict y, int64_t HW,              \
                                        const double *restrict alpha, const double *restrict beta) {             \
    for (int64_t i = 0; i < HW; i++)                                                                             \
        for (int l = 0; l < B; l++) y[i * B + l] = (float)((double)x[i * B + l] * alpha[l] + beta[l]);           \
}                                                                                                                \
                                                                                                                 \
KILN_SIMD_CLONES static void blk_gsums_##B(const float *restrict g, const float *restrict x, int64_t HW,         \
                                       const double *restrict mean, double *restrict sg, double *restrict sgx) { \
    for (int64_t i = 0; i < HW; i++)                                                                             \
        for (int l = 0; l < B; l++) {                                                                            \
            double gi = (double)g[i * B + l];                                                                    \
            sg[l] += gi, sgx[l] += gi * ((double)x[i * B + l] - mean[l]);                                        \
        }                                                                                                        \
}                                                                                                                \
                                                                                                                 \
KILN_SIMD_CLONES static void blk_dx_##B(const float *restrict g, const float *restrict x, float *restrict dx, int64_t HW, \
                                    const double *restrict mean, const double *restrict gmean,                   \
                                    const double *restrict proj, const double *restrict scale, bool training) {  \
    for (int64_t i = 0; i < HW; i++)                                                                             \
        for (int l = 0; l < B; l++) {                                                                            \
            double gi = (double)g[i * B + l];                                                                    \
            double r = training ? (gi - gmean[l] - ((double)x[i * B + l] - mean[l]) * proj[l]) : gi;             \
            dx[i * B + l] = (float)(r * scale[l]);                                                               \
        }                                                                                                        \
}                                                                                                                \
    /* end of BLK_FUNCS */
BLK_FUNCS(16)
BLK_FUNCS(8)

bool kiln_fast_batch_norm_supports(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *y = &a->out[0];
    int lay = act_layout(x);
    if (lay < 0 || y->ndim != 4 || y->dtype != KILN_F32 || a->n_out < 3) return false;
    int64_t C = x->shape[1];
    for (int i = 1; i < 5; i++)
        if (!opt_vec(&a->in[i], C)) return false;
    if (!a->attrs->training && (a->in[3].ndim < 0 || a->in[4].ndim < 0)) return false;
    return f32_vec(&a->out[1], C) && f32_vec(&a->out[2], C);
}

void kiln_fast_bn_layout(const kiln_op_args *a, kiln_layout *out) {
    out[0] = a->in[0].layout; /* y as x; the statistics (and gradients of parameters) strided */
}

kiln_status kiln_fast_batch_norm(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0];
    const float *xd = x->data, *w = a->in[1].ndim >= 0 ? a->in[1].data : NULL;
    const float *b = a->in[2].ndim >= 0 ? a->in[2].data : NULL;
    float *rm = a->in[3].ndim >= 0 ? a->in[3].data : NULL, *rv = a->in[4].ndim >= 0 ? a->in[4].data : NULL;
    float *y = a->out[0].data, *mo = a->out[1].data, *io = a->out[2].data;
    const kiln_op_attrs *at_ = a->attrs;
    const int lay = act_layout(x);
    if (lay < 0 || kiln_layout_block(a->out[0].layout) != lay)
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "kiln_batch_norm: the fast kernel was given arguments it declines");
    const int64_t N = x->shape[0], C = x->shape[1], HW = x->shape[2] * x->shape[3];
    const int64_t step = 1, count = N * HW;
    if (lay) {
        const int B = lay;
        const int64_t CB = C / B;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (N * C * HW >= 32768 && CB > 1)
#endif
        for (int64_t cb = 0; cb < CB; cb++) {
            double mean[LMAX], var[LMAX], alpha[LMAX], beta[LMAX], acc[LMAX] = {0};
            if (at_->training) {
                for (int64_t n = 0; n < N; n++) (B == 8 ? blk_sum_8 : blk_sum_16)(xd + (n * CB + cb) * HW * B, HW, acc);
                for (int l = 0; l < B; l++) mean[l] = count ? acc[l] / (double)count : 0.0, acc[l] = 0;
                for (int64_t n = 0; n < N; n++) (B == 8 ? blk_sq_8 : blk_sq_16)(xd + (n * CB + cb) * HW * B, HW, mean, acc);
                for (int l = 0; l < B; l++) var[l] = count ? acc[l] / (double)count : 0.0;
            }
            for (int l = 0; l < B; l++) {
                int64_t c = cb * B + l;
                double invstd;
                if (at_->training) {
                    invstd = 1.0 / sqrt(var[l] + at_->eps);
                    if (at_->momentum >= 0 && rm)
                        rm[c] = (float)((1 - at_->momentum) * (double)rm[c] + at_->momentum * mean[l]);
                    if (at_->momentum >= 0 && rv) {
                        double unbiased = count > 1 ? acc[l] / (double)(count - 1) : var[l];
                        rv[c] = (float)((1 - at_->momentum) * (double)rv[c] + at_->momentum * unbiased);
                    }
                } else {
                    mean[l] = rm[c];
                    invstd = 1.0 / sqrt((double)rv[c] + at_->eps);
                }
                alpha[l] = invstd * (w ? (double)w[c] : 1.0), beta[l] = (b ? (double)b[c] : 0.0) - mean[l] * alpha[l];
                mo[c] = (float)mean[l], io[c] = (float)invstd;
            }
            for (int64_t n = 0; n < N; n++) {
                int64_t o = (n * CB + cb) * HW * B;
                (B == 8 ? blk_affine_8 : blk_affine_16)(xd + o, y + o, HW, alpha, beta);
            }
        }
        return KILN_OK;
    }
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (N * C * HW >= 32768 && C > 1)
#endif
    for (int64_t c = 0; c < C; c++) {
        double mean, invstd;
        if (at_->training) {
            double s = 0, ss = 0;
            for (int64_t n = 0; n < N; n++) s += span_sum(xd + at(lay, n, c, 0, C, HW), HW, step);
            mean = count ? s / (double)count : 0.0;
            for (int64_t n = 0; n < N; n++) ss += span_sq(xd + at(lay, n, c, 0, C, HW), HW, step, mean);
            double var = count ? ss / (double)count : 0.0;
            invstd = 1.0 / sqrt(var + at_->eps);
            if (at_->momentum >= 0 && rm) rm[c] = (float)((1 - at_->momentum) * (double)rm[c] + at_->momentum * mean);
            if (at_->momentum >= 0 && rv) {
                double unbiased = count > 1 ? ss / (double)(count - 1) : var;
                rv[c] = (float)((1 - at_->momentum) * (double)rv[c] + at_->momentum * unbiased);
            }
        } else {
            mean = rm[c];
            invstd = 1.0 / sqrt((double)rv[c] + at_->eps);
        }
        double alpha = invstd * (w ? (double)w[c] : 1.0), beta = (b ? (double)b[c] : 0.0) - mean * alpha;
        for (int64_t n = 0; n < N; n++) {
            int64_t o = at(lay, n, c, 0, C, HW);
            span_affine(xd + o, y + o, HW, step, alpha, beta);
        }
        mo[c] = (float)mean;
        io[c] = (float)invstd;
    }
    return KILN_OK;
}

/* ---- backward: (grad_out, x, weight, mean, invstd) -> (dx, dweight, dbias) ---------- */

KILN_SIMD_CLONES static void span_gsums(const float *restrict g, const float *restrict x, int64_t len, int64_t step,
                                        double mean, double *sg, double *sgx) {
    double a = 0, b = 0;
    for (int64_t i = 0; i < len; i++) {
        double gi = (double)g[i * step];
        a += gi, b += gi * ((double)x[i * step] - mean);
    }
    *sg += a, *sgx += b;
}

KILN_SIMD_CLONES static void span_dx(const float *restrict g, const float *restrict x, float *restrict dx,
                                     int64_t len, int64_t step, double mean, double gmean, double proj, double scale,
                                     bool training) {
    if (training) {
        for (int64_t i = 0; i < len; i++) {
            double xc = (double)x[i * step] - mean;
            dx[i * step] = (float)(((double)g[i * step] - gmean - xc * proj) * scale);
        }
    } else {
        for (int64_t i = 0; i < len; i++) dx[i * step] = (float)((double)g[i * step] * scale);
    }
}

bool kiln_fast_batch_norm_backward_supports(const kiln_op_args *a) {
    const kiln_strided *go = &a->in[0], *x = &a->in[1];
    int lay = act_layout(x);
    if (lay < 0 || act_layout(go) != lay || a->out[0].ndim != 4 || a->out[0].dtype != KILN_F32) return false;
    for (int i = 0; i < 4; i++)
        if (go->shape[i] != x->shape[i]) return false;
    int64_t C = x->shape[1];
    return opt_vec(&a->in[2], C) && f32_vec(&a->in[3], C) && f32_vec(&a->in[4], C) && f32_vec(&a->out[1], C) &&
           f32_vec(&a->out[2], C);
}

void kiln_fast_bn_backward_layout(const kiln_op_args *a, kiln_layout *out) {
    out[0] = a->in[1].layout; /* dx as x */
}

kiln_status kiln_fast_batch_norm_backward(const kiln_op_args *a) {
    const float *go = a->in[0].data, *xd = a->in[1].data, *w = a->in[2].ndim >= 0 ? a->in[2].data : NULL;
    const float *mn = a->in[3].data, *is = a->in[4].data;
    float *dx = a->out[0].data, *dw = a->out[1].data, *db = a->out[2].data;
    const int lay = act_layout(&a->in[1]);
    if (lay < 0 || kiln_layout_block(a->out[0].layout) != lay)
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL,
                          "kiln_batch_norm_backward: the fast kernel was given arguments it declines");
    const int64_t N = a->in[1].shape[0], C = a->in[1].shape[1], HW = a->in[1].shape[2] * a->in[1].shape[3];
    const int64_t step = 1;
    const bool training = a->attrs->training;
    if (lay) {
        const int B = lay;
        const int64_t CB = C / B;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (N * C * HW >= 32768 && CB > 1)
#endif
        for (int64_t cb = 0; cb < CB; cb++) {
            double mean[LMAX], sg[LMAX] = {0}, sgx[LMAX] = {0}, gmean[LMAX], proj[LMAX], scale[LMAX];
            for (int l = 0; l < B; l++) mean[l] = mn[cb * B + l];
            for (int64_t n = 0; n < N; n++) {
                int64_t o = (n * CB + cb) * HW * B;
                (B == 8 ? blk_gsums_8 : blk_gsums_16)(go + o, xd + o, HW, mean, sg, sgx);
            }
            double cnt = N * HW != 0 ? (double)(N * HW) : 1.0;
            for (int l = 0; l < B; l++) {
                int64_t c = cb * B + l;
                double invstd = is[c];
                gmean[l] = sg[l] / cnt, proj[l] = sgx[l] / cnt * invstd * invstd;
                scale[l] = invstd * (w ? (double)w[c] : 1.0);
                dw[c] = (float)(sgx[l] * invstd), db[c] = (float)sg[l];
            }
            for (int64_t n = 0; n < N; n++) {
                int64_t o = (n * CB + cb) * HW * B;
                (B == 8 ? blk_dx_8 : blk_dx_16)(go + o, xd + o, dx + o, HW, mean, gmean, proj, scale, training);
            }
        }
        return KILN_OK;
    }
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (N * C * HW >= 32768 && C > 1)
#endif
    for (int64_t c = 0; c < C; c++) {
        double mean = mn[c], invstd = is[c], wc = w ? (double)w[c] : 1.0;
        double sg = 0, sgx = 0;
        for (int64_t n = 0; n < N; n++) {
            int64_t o = at(lay, n, c, 0, C, HW);
            span_gsums(go + o, xd + o, HW, step, mean, &sg, &sgx);
        }
        double cnt = N * HW != 0 ? (double)(N * HW) : 1.0;
        double gmean = sg / cnt, proj = sgx / cnt * invstd * invstd;
        for (int64_t n = 0; n < N; n++) {
            int64_t o = at(lay, n, c, 0, C, HW);
            span_dx(go + o, xd + o, dx + o, HW, step, mean, gmean, proj, invstd * wc, training);
        }
        dw[c] = (float)(sgx * invstd);
        db[c] = (float)sg;
    }
    return KILN_OK;
}

/* Harness cases of the nn op group: conv2d, pooling, batch norm, and the
 * shape and indexing ops (cat, stack, flatten, gather, pad, flip,
 * embedding). References are plain float64 loops written from PyTorch's
 * definitions; shapes stay small so finite differences stay fast. Every
 * file-scope name starts with nn_ (harness.h's naming rule). */
#include <math.h>
#include <string.h>

#include "ops/harness.h"

/* ---- conv2d ---------------------------------------------------------------------- */

static kiln_tensor *nn_run_conv2d(kh_run *r) {
    const kiln_op_attrs *a = r->attrs;
    kiln_conv2d_opts o = {.stride = {a->stride[0], a->stride[1]},
                          .padding = {a->padding[0], a->padding[1]},
                          .dilation = {a->dilation[0], a->dilation[1]},
                          .groups = a->groups};
    return kiln_conv2d(r->in[0], r->in[1], r->in[2], &o);
}

static void nn_ref_conv2d(kh_ref *r) {
    const kiln_op_attrs *a = r->attrs;
    kiln_shape xs = r->shape[0], ws = r->shape[1];
    int64_t N = xs.d[0], C = xs.d[1], H = xs.d[2], W = xs.d[3];
    int64_t O = ws.d[0], Cg = ws.d[1], kH = ws.d[2], kW = ws.d[3], G = a->groups, Og = O / G;
    int64_t Ho = (H + 2 * a->padding[0] - a->dilation[0] * (kH - 1) - 1) / a->stride[0] + 1;
    int64_t Wo = (W + 2 * a->padding[1] - a->dilation[1] * (kW - 1) - 1) / a->stride[1] + 1;
    double *y = kh_out(r, 0, KILN_SHAPE(N, O, Ho, Wo), 0);
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < O; o++)
            for (int64_t oh = 0; oh < Ho; oh++)
                for (int64_t ow = 0; ow < Wo; ow++) {
                    double s = r->in[2] ? r->in[2][o] : 0.0;
                    for (int64_t c = 0; c < Cg; c++)
                        for (int64_t i = 0; i < kH; i++)
                            for (int64_t j = 0; j < kW; j++) {
                                int64_t h = oh * a->stride[0] - a->padding[0] + i * a->dilation[0];
                                int64_t w = ow * a->stride[1] - a->padding[1] + j * a->dilation[1];
                                if (h < 0 || h >= H || w < 0 || w >= W) continue;
                                int64_t ci = (o / Og) * Cg + c;
                                s += r->in[0][((n * C + ci) * H + h) * W + w] *
                                     r->in[1][((o * Cg + c) * kH + i) * kW + j];
                            }
                    y[((n * O + o) * Ho + oh) * Wo + ow] = s;
                }
}

/* The gradient ops on their own (guard bytes, every dtype): the adjoints
 * of the forward loops above. */
static kiln_tensor *nn_run_direct(kh_run *r, kiln_op_id op) {
    kiln_op_attrs at = *r->attrs;
    kiln_tensor *out[KILN_OP_MAX_OUT] = {NULL};
    if (kiln_dispatch(op, r->n_in, r->in, &at, r->device, out)) return NULL;
    for (int i = 1; i < KILN_OP_MAX_OUT; i++)
        if (out[i]) kiln_release(out[i]);
    return out[0];
}

static kiln_tensor *nn_run_conv_grad_input(kh_run *r) { return nn_run_direct(r, KILN_OP_CONV2D_GRAD_INPUT); }
static kiln_tensor *nn_run_conv_grad_weight(kh_run *r) {
    return nn_run_direct(r, KILN_OP_CONV2D_GRAD_WEIGHT);
}

/* grad_out (N, O, Ho, Wo) with x (N, C, H, W) and w (O, Cg, kH, kW):
 * the input gradient (want_x) or the weight gradient. */
static void nn_ref_conv_grad(kh_ref *r, bool want_x) {
    const kiln_op_attrs *a = r->attrs;
    kiln_shape gs = r->shape[0], other = r->shape[1];
    kiln_shape rs = KILN_SHAPE(a->ints[0], a->ints[1], a->ints[2], a->ints[3]);
    kiln_shape xs = want_x ? rs : other, ws = want_x ? other : rs;
    const double *g = r->in[0], *in = r->in[1];
    int64_t N = xs.d[0], C = xs.d[1], H = xs.d[2], W = xs.d[3];
    int64_t O = ws.d[0], Cg = ws.d[1], kH = ws.d[2], kW = ws.d[3], Og = O / a->groups;
    int64_t Ho = gs.d[2], Wo = gs.d[3];
    double *y = kh_out(r, 0, rs, 0);
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < O; o++)
            for (int64_t oh = 0; oh < Ho; oh++)
                for (int64_t ow = 0; ow < Wo; ow++) {
                    double gv = g[((n * O + o) * Ho + oh) * Wo + ow];
                    for (int64_t c = 0; c < Cg; c++)
                        for (int64_t i = 0; i < kH; i++)
                            for (int64_t j = 0; j < kW; j++) {
                                int64_t h = oh * a->stride[0] - a->padding[0] + i * a->dilation[0];
                                int64_t w = ow * a->stride[1] - a->padding[1] + j * a->dilation[1];
                                if (h < 0 || h >= H || w < 0 || w >= W) continue;
                                int64_t xi = ((n * C + (o / Og) * Cg + c) * H + h) * W + w;
                                int64_t wi = ((o * Cg + c) * kH + i) * kW + j;
                                if (want_x)
                                    y[xi] += gv * in[wi];
                                else
                                    y[wi] += gv * in[xi];
                            }
                }
}

static void nn_ref_conv_grad_input(kh_ref *r) { nn_ref_conv_grad(r, true); }
static void nn_ref_conv_grad_weight(kh_ref *r) { nn_ref_conv_grad(r, false); }

/* ---- pooling ---------------------------------------------------------------------- */

static kiln_pool2d_opts nn_pool_opts(const kiln_op_attrs *a) {
    kiln_pool2d_opts o = {.kernel = {a->kernel[0], a->kernel[1]},
                          .stride = {a->stride[0], a->stride[1]},
                          .padding = {a->padding[0], a->padding[1]},
                          .ceil_mode = a->ceil_mode,
                          .count_include_pad = a->count_include_pad};
    return o;
}

static kiln_tensor *nn_run_max_pool2d(kh_run *r) {
    kiln_pool2d_opts o = nn_pool_opts(r->attrs);
    return kiln_max_pool2d(r->in[0], &o, &r->aux[0]);
}

static kiln_tensor *nn_run_avg_pool2d(kh_run *r) {
    kiln_pool2d_opts o = nn_pool_opts(r->attrs);
    return kiln_avg_pool2d(r->in[0], &o);
}

static kiln_tensor *nn_run_adaptive(kh_run *r) {
    return kiln_adaptive_avg_pool2d(r->in[0], r->attrs->ints[0], r->attrs->ints[1]);
}

/* PyTorch's output size, written out independently of nn_geometry.h. */
static int64_t nn_pool_size(int64_t in, int64_t k, int64_t s, int64_t p, bool ceil_mode) {
    double q = (double)(in + 2 * p - k) / (double)s;
    int64_t out = (int64_t)(ceil_mode ? ceil(q) : floor(q)) + 1;
    if (ceil_mode && (out - 1) * s >= in + p) out--;
    return out;
}

/* The input as planes: P = product of leading dims, then (H, W). */
static void nn_planes(kiln_shape s, int64_t *P, int64_t *H, int64_t *W) {
    *H = s.d[s.ndim - 2], *W = s.d[s.ndim - 1];
    *P = kh_numel(s) / (*H * *W);
}

static kiln_shape nn_with_hw(kiln_shape s, int64_t h, int64_t w) {
    s.d[s.ndim - 2] = h, s.d[s.ndim - 1] = w;
    return s;
}

static void nn_ref_pool(kh_ref *r, bool is_max) {
    const kiln_op_attrs *a = r->attrs;
    int64_t P, H, W;
    nn_planes(r->shape[0], &P, &H, &W);
    int64_t Ho = nn_pool_size(H, a->kernel[0], a->stride[0], a->padding[0], a->ceil_mode);
    int64_t Wo = nn_pool_size(W, a->kernel[1], a->stride[1], a->padding[1], a->ceil_mode);
    kiln_shape os = nn_with_hw(r->shape[0], Ho, Wo);
    double *y = kh_out(r, 0, os, 0);
    double *ix = is_max ? kh_out(r, 1, os, KH_AS(KILN_I64)) : NULL;
    for (int64_t p = 0; p < P; p++)
        for (int64_t oh = 0; oh < Ho; oh++)
            for (int64_t ow = 0; ow < Wo; ow++) {
                int64_t h0 = oh * a->stride[0] - a->padding[0], w0 = ow * a->stride[1] - a->padding[1];
                int64_t he = h0 + a->kernel[0], we = w0 + a->kernel[1];
                /* avg: the divisor counts padding up to H + p, never past it */
                int64_t hp = he < H + a->padding[0] ? he : H + a->padding[0];
                int64_t wp = we < W + a->padding[1] ? we : W + a->padding[1];
                double best = -INFINITY, sum = 0;
                int64_t best_i = -1, count = 0;
                for (int64_t h = h0; h < he; h++)
                    for (int64_t w = w0; w < we; w++) {
                        if (h < 0 || h >= H || w < 0 || w >= W) continue;
                        double v = r->in[0][(p * H + h) * W + w];
                        if (best_i < 0 || v > best) best = v, best_i = h * W + w;
                        sum += v, count++;
                    }
                int64_t o = (p * Ho + oh) * Wo + ow;
                if (is_max) {
                    y[o] = best, ix[o] = (double)best_i;
                } else {
                    double div = a->count_include_pad ? (double)((hp - h0) * (wp - w0)) : (double)count;
                    y[o] = sum / div;
                }
            }
}

static void nn_ref_max_pool2d(kh_ref *r) { nn_ref_pool(r, true); }
static void nn_ref_avg_pool2d(kh_ref *r) { nn_ref_pool(r, false); }

static void nn_ref_adaptive(kh_ref *r) {
    int64_t P, H, W, Ho = r->attrs->ints[0], Wo = r->attrs->ints[1];
    nn_planes(r->shape[0], &P, &H, &W);
    double *y = kh_out(r, 0, nn_with_hw(r->shape[0], Ho, Wo), 0);
    for (int64_t p = 0; p < P; p++)
        for (int64_t i = 0; i < Ho; i++)
            for (int64_t j = 0; j < Wo; j++) {
                int64_t h0 = (int64_t)floor((double)(i * H) / (double)Ho);
                int64_t h1 = (int64_t)ceil((double)((i + 1) * H) / (double)Ho);
                int64_t w0 = (int64_t)floor((double)(j * W) / (double)Wo);
                int64_t w1 = (int64_t)ceil((double)((j + 1) * W) / (double)Wo);
                double s = 0;
                for (int64_t h = h0; h < h1; h++)
                    for (int64_t w = w0; w < w1; w++) s += r->in[0][(p * H + h) * W + w];
                y[(p * Ho + i) * Wo + j] = s / (double)((h1 - h0) * (w1 - w0));
            }
}

/* ---- batch norm --------------------------------------------------------------------- */

static kiln_tensor *nn_run_batch_norm(kh_run *r) {
    const kiln_op_attrs *a = r->attrs;
    return kiln_batch_norm(r->in[0], r->in[1], r->in[2], r->in[3], r->in[4], a->training, a->momentum,
                           a->eps);
}

/* Training with running statistics updates them in place: run on copies
 * and hand the updated copies back as outputs 1 and 2. */
static kiln_tensor *nn_run_batch_norm_running(kh_run *r) {
    const kiln_op_attrs *a = r->attrs;
    kiln_tensor *rm = kiln_to(r->in[3], r->device, kiln_dtype_of(r->in[3]), KILN_COPY);
    kiln_tensor *rv = kiln_to(r->in[4], r->device, kiln_dtype_of(r->in[4]), KILN_COPY);
    kiln_tensor *y = kiln_batch_norm(r->in[0], r->in[1], r->in[2], rm, rv, true, a->momentum, a->eps);
    r->aux[0] = rm, r->aux[1] = rv; /* kept by the harness */
    return y;
}

static void nn_ref_batch_norm(kh_ref *r) {
    const kiln_op_attrs *a = r->attrs;
    kiln_shape s = r->shape[0];
    int64_t N = s.d[0], C = s.d[1], S = kh_numel(s) / (N * C), cnt = N * S;
    double *y = kh_out(r, 0, s, 0);
    bool update = a->training && r->in[3] && a->momentum >= 0;
    double *rm = update ? kh_out(r, 1, r->shape[3], KH_AS(r->in_dtype[3])) : NULL;
    double *rv = update ? kh_out(r, 2, r->shape[4], KH_AS(r->in_dtype[4])) : NULL;
    for (int64_t c = 0; c < C; c++) {
        double mean, var;
        if (a->training) {
            double sum = 0, ss = 0;
            for (int64_t n = 0; n < N; n++)
                for (int64_t i = 0; i < S; i++) sum += r->in[0][(n * C + c) * S + i];
            mean = sum / (double)cnt;
            for (int64_t n = 0; n < N; n++)
                for (int64_t i = 0; i < S; i++) {
                    double d = r->in[0][(n * C + c) * S + i] - mean;
                    ss += d * d;
                }
            var = ss / (double)cnt;
            if (update) {
                rm[c] = (1 - a->momentum) * r->in[3][c] + a->momentum * mean;
                rv[c] = (1 - a->momentum) * r->in[4][c] + a->momentum * ss / (double)(cnt - 1);
            }
        } else {
            mean = r->in[3][c], var = r->in[4][c];
        }
        double w = r->in[1] ? r->in[1][c] : 1.0, b = r->in[2] ? r->in[2][c] : 0.0;
        for (int64_t n = 0; n < N; n++)
            for (int64_t i = 0; i < S; i++) {
                int64_t k = (n * C + c) * S + i;
                y[k] = (r->in[0][k] - mean) / sqrt(var + a->eps) * w + b;
            }
    }
}

/* ---- shape and indexing -------------------------------------------------------------- */

static kiln_tensor *nn_run_cat(kh_run *r) { return kiln_cat(r->n_in, r->in, r->attrs->dims[0]); }
static kiln_tensor *nn_run_stack(kh_run *r) { return kiln_stack(r->n_in, r->in, r->attrs->dims[0]); }

/* cat along dim d of r->n_in inputs (already wrapped, non-negative). */
static void nn_ref_cat(kh_ref *r) {
    int d = r->attrs->dims[0];
    kiln_shape os = r->shape[0];
    if (d < 0) d += os.ndim;
    os.d[d] = 0;
    for (int i = 0; i < r->n_in; i++) os.d[d] += r->shape[i].d[d];
    double *y = kh_out(r, 0, os, 0);
    int64_t at = 0;
    for (int i = 0; i < r->n_in; i++) {
        kiln_shape s = r->shape[i];
        int64_t idx[KILN_MAX_DIMS];
        for (int64_t k = 0; k < kh_numel(s); k++) {
            kh_unravel(s, k, idx);
            idx[d] += at;
            y[kh_ravel(os, idx)] = r->in[i][k];
        }
        at += s.d[d];
    }
}

static void nn_ref_stack(kh_ref *r) {
    int d = r->attrs->dims[0];
    kiln_shape s = r->shape[0], os = {.ndim = s.ndim + 1};
    if (d < 0) d += os.ndim;
    for (int i = 0, j = 0; i < os.ndim; i++) os.d[i] = i == d ? r->n_in : s.d[j++];
    double *y = kh_out(r, 0, os, 0);
    int64_t idx[KILN_MAX_DIMS], oidx[KILN_MAX_DIMS];
    for (int t = 0; t < r->n_in; t++)
        for (int64_t k = 0; k < kh_numel(s); k++) {
            kh_unravel(s, k, idx);
            for (int i = 0, j = 0; i < os.ndim; i++) oidx[i] = i == d ? t : idx[j++];
            y[kh_ravel(os, oidx)] = r->in[t][k];
        }
}

static kiln_tensor *nn_run_flatten(kh_run *r) {
    return kiln_flatten(r->in[0], r->attrs->dims[0], r->attrs->dims[1]);
}

static void nn_ref_flatten(kh_ref *r) {
    kiln_shape s = r->shape[0], os = {.ndim = s.ndim - (r->attrs->dims[1] - r->attrs->dims[0])};
    int a = r->attrs->dims[0], b = r->attrs->dims[1];
    for (int i = 0; i < a; i++) os.d[i] = s.d[i];
    os.d[a] = 1;
    for (int i = a; i <= b; i++) os.d[a] *= s.d[i];
    for (int i = b + 1; i < s.ndim; i++) os.d[i - (b - a)] = s.d[i];
    double *y = kh_out(r, 0, os, 0);
    memcpy(y, r->in[0], sizeof(double) * (size_t)kh_numel(s));
}

static kiln_tensor *nn_run_gather(kh_run *r) { return kiln_gather(r->in[0], r->attrs->dims[0], r->in[1]); }

static void nn_ref_gather(kh_ref *r) {
    int d = r->attrs->dims[0];
    kiln_shape is = r->shape[1];
    double *y = kh_out(r, 0, is, 0);
    int64_t idx[KILN_MAX_DIMS];
    for (int64_t k = 0; k < kh_numel(is); k++) {
        kh_unravel(is, k, idx);
        idx[d] = (int64_t)r->in[1][k];
        y[k] = r->in[0][kh_ravel(r->shape[0], idx)];
    }
}

static kiln_tensor *nn_run_pad(kh_run *r) {
    return kiln_pad(r->in[0], r->attrs->n_ints / 2, r->attrs->ints, r->attrs->scalar[0]);
}

static void nn_ref_pad(kh_ref *r) {
    kiln_shape s = r->shape[0], os = s;
    int64_t left[KILN_MAX_DIMS] = {0};
    for (int p = 0; p < r->attrs->n_ints / 2; p++) {
        int d = s.ndim - 1 - p;
        left[d] = r->attrs->ints[2 * p];
        os.d[d] += r->attrs->ints[2 * p] + r->attrs->ints[2 * p + 1];
    }
    double *y = kh_out(r, 0, os, 0);
    int64_t idx[KILN_MAX_DIMS];
    for (int64_t k = 0; k < kh_numel(os); k++) {
        kh_unravel(os, k, idx);
        bool inside = true;
        for (int d = 0; d < s.ndim; d++) {
            idx[d] -= left[d];
            inside = inside && idx[d] >= 0 && idx[d] < s.d[d];
        }
        y[k] = inside ? r->in[0][kh_ravel(s, idx)] : r->attrs->scalar[0];
    }
}

static kiln_tensor *nn_run_flip(kh_run *r) { return kiln_flip(r->in[0], r->attrs->n_dims, r->attrs->dims); }

static void nn_ref_flip(kh_ref *r) {
    kiln_shape s = r->shape[0];
    double *y = kh_out(r, 0, s, 0);
    int64_t idx[KILN_MAX_DIMS];
    for (int64_t k = 0; k < kh_numel(s); k++) {
        kh_unravel(s, k, idx);
        for (int i = 0; i < r->attrs->n_dims; i++) {
            int d = r->attrs->dims[i] < 0 ? r->attrs->dims[i] + s.ndim : r->attrs->dims[i];
            idx[d] = s.d[d] - 1 - idx[d];
        }
        y[k] = r->in[0][kh_ravel(s, idx)];
    }
}

static kiln_tensor *nn_run_embedding(kh_run *r) { return kiln_embedding(r->in[0], r->in[1]); }

static void nn_ref_embedding(kh_ref *r) {
    kiln_shape is = r->shape[1], os = is;
    int64_t D = r->shape[0].d[1];
    os.d[os.ndim++] = D;
    double *y = kh_out(r, 0, os, 0);
    for (int64_t k = 0; k < kh_numel(is); k++)
        for (int64_t d = 0; d < D; d++) y[k * D + d] = r->in[0][(int64_t)r->in[1][k] * D + d];
}

#include "ops/nn_case_table.inc"

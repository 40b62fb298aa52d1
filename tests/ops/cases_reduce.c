/* Harness cases of the reduce group: sum, mean, max, min, argmax, norm,
 * softmax, log_softmax, nll_loss, cross_entropy, mse_loss, mm, bmm, matmul,
 * linear. References are plain float64 loops over row-major inputs. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/harness.h"

/* ---- reductions ----------------------------------------------------------------------- */

enum { REDUCE_SUM, REDUCE_MEAN, REDUCE_MAX, REDUCE_MIN, REDUCE_ARGMAX, REDUCE_NORM };

/* Output shape and the reduced-dim mask of a reduction's attrs. */
static kiln_shape reduce_out_shape(kiln_shape in, const kiln_op_attrs *at, bool *red) {
    kiln_shape o = {.ndim = 0};
    for (int d = 0; d < in.ndim; d++) red[d] = at->n_dims == 0;
    for (int i = 0; i < at->n_dims && in.ndim > 0; i++) red[((at->dims[i] % in.ndim) + in.ndim) % in.ndim] = true;
    for (int d = 0; d < in.ndim; d++) {
        if (!red[d]) o.d[o.ndim++] = in.d[d];
        else if (at->keepdim) o.d[o.ndim++] = 1;
    }
    return o;
}

static void reduce_reference(kh_ref *r, int kind) {
    kiln_shape in = r->shape[0];
    bool red[KILN_MAX_DIMS];
    kiln_shape os = reduce_out_shape(in, r->attrs, red);
    bool floating = kiln_dtype_is_floating(r->dtype);
    int as = 0;
    if (kind == REDUCE_ARGMAX || (kind == REDUCE_SUM && !floating)) as = KH_AS(KILN_I64);
    double *y = kh_out(r, 0, os, as);
    int64_t no = kh_numel(os), n = kh_numel(in);
    double *cnt = calloc((size_t)(no ? no : 1), sizeof(double));
    double *best = calloc((size_t)(no ? no : 1), sizeof(double));
    double p = r->attrs->scalar[0];
    for (int64_t i = 0; i < n; i++) {
        int64_t idx[KILN_MAX_DIMS], oidx[KILN_MAX_DIMS];
        kh_unravel(in, i, idx);
        int k = 0;
        int64_t rflat = 0;
        for (int d = 0; d < in.ndim; d++) {
            if (!red[d]) oidx[k++] = idx[d];
            else {
                rflat = rflat * in.d[d] + idx[d];
                if (r->attrs->keepdim) oidx[k++] = 0;
            }
        }
        int64_t o = kh_ravel(os, oidx);
        double v = r->in[0][i];
        bool first = cnt[o] == 0;
        cnt[o] += 1;
        switch (kind) {
        case REDUCE_SUM:
        case REDUCE_MEAN: y[o] += v; break;
        case REDUCE_MAX: y[o] = first || v > y[o] ? v : y[o]; break;
        case REDUCE_MIN: y[o] = first || v < y[o] ? v : y[o]; break;
        case REDUCE_ARGMAX:
            if (first || v > best[o]) best[o] = v, y[o] = (double)rflat;
            break;
        case REDUCE_NORM:
            if (isinf(p)) y[o] = first ? fabs(v) : (p > 0 ? fmax(y[o], fabs(v)) : fmin(y[o], fabs(v)));
            else if (p == 0) y[o] += v != 0;
            else y[o] += pow(fabs(v), p);
            break;
        }
    }
    for (int64_t o = 0; o < no; o++) {
        if (kind == REDUCE_MEAN) y[o] /= cnt[o];
        if (kind == REDUCE_NORM && !isinf(p) && p != 0) y[o] = pow(y[o], 1.0 / p);
    }
    free(cnt);
    free(best);
}

static void reduce_ref_sum(kh_ref *r) { reduce_reference(r, REDUCE_SUM); }
static void reduce_ref_mean(kh_ref *r) { reduce_reference(r, REDUCE_MEAN); }
static void reduce_ref_max(kh_ref *r) { reduce_reference(r, REDUCE_MAX); }
static void reduce_ref_min(kh_ref *r) { reduce_reference(r, REDUCE_MIN); }
static void reduce_ref_argmax(kh_ref *r) { reduce_reference(r, REDUCE_ARGMAX); }
static void reduce_ref_norm(kh_ref *r) { reduce_reference(r, REDUCE_NORM); }

static kiln_tensor *reduce_run_sum(kh_run *r) {
    return kiln_sum(r->in[0], r->attrs->n_dims, r->attrs->dims, r->attrs->keepdim);
}
static kiln_tensor *reduce_run_mean(kh_run *r) {
    return kiln_mean(r->in[0], r->attrs->n_dims, r->attrs->dims, r->attrs->keepdim);
}
static kiln_tensor *reduce_run_max(kh_run *r) {
    return kiln_max(r->in[0], r->attrs->n_dims, r->attrs->dims, r->attrs->keepdim);
}
static kiln_tensor *reduce_run_min(kh_run *r) {
    return kiln_min(r->in[0], r->attrs->n_dims, r->attrs->dims, r->attrs->keepdim);
}
static kiln_tensor *reduce_run_argmax(kh_run *r) { return kiln_argmax(r->in[0], r->attrs->dims[0], r->attrs->keepdim); }
static kiln_tensor *reduce_run_norm(kh_run *r) {
    return kiln_norm(r->in[0], r->attrs->scalar[0], r->attrs->n_dims, r->attrs->dims, r->attrs->keepdim);
}

/* ---- softmax ------------------------------------------------------------------------------ */

/* log_softmax (log_form) or softmax of in along dim into y (same shape). */
static void reduce_softmax_into(const double *x, kiln_shape s, int dim, bool log_form, double *y) {
    int nd = s.ndim;
    if (nd == 0) {
        y[0] = log_form ? 0 : 1;
        return;
    }
    dim = ((dim % nd) + nd) % nd;
    int64_t len = s.d[dim], inner = 1, outer = 1;
    for (int d = dim + 1; d < nd; d++) inner *= s.d[d];
    for (int d = 0; d < dim; d++) outer *= s.d[d];
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            const double *xr = x + o * len * inner + i;
            double *yr = y + o * len * inner + i;
            double m = -INFINITY, sum = 0;
            for (int64_t j = 0; j < len; j++) m = fmax(m, xr[j * inner]);
            for (int64_t j = 0; j < len; j++) sum += exp(xr[j * inner] - m);
            for (int64_t j = 0; j < len; j++)
                yr[j * inner] = log_form ? xr[j * inner] - m - log(sum) : exp(xr[j * inner] - m) / sum;
        }
}

static void reduce_ref_softmax(kh_ref *r) {
    reduce_softmax_into(r->in[0], r->shape[0], r->attrs->dims[0], false, kh_out(r, 0, r->shape[0], 0));
}
static void reduce_ref_log_softmax(kh_ref *r) {
    reduce_softmax_into(r->in[0], r->shape[0], r->attrs->dims[0], true, kh_out(r, 0, r->shape[0], 0));
}
static kiln_tensor *reduce_run_softmax(kh_run *r) { return kiln_softmax(r->in[0], r->attrs->dims[0]); }
static kiln_tensor *reduce_run_log_softmax(kh_run *r) { return kiln_log_softmax(r->in[0], r->attrs->dims[0]); }

/* ---- losses --------------------------------------------------------------------------------- */

/* PyTorch's nll_loss with cross_entropy's label smoothing, from log probs
 * lp (N, C, d...) or (C); in[1] target, in[2] weight or NULL. */
static void reduce_nll_from(kh_ref *r, const double *lp, kiln_shape ls) {
    const kiln_op_attrs *at = r->attrs;
    kiln_shape ts = r->shape[1];
    const double *t = r->in[1], *w = r->in[2];
    int cdim = ls.ndim == 1 ? 0 : 1;
    int64_t C = ls.d[cdim], inner = 1, npos = kh_numel(ts);
    for (int d = cdim + 1; d < ls.ndim; d++) inner *= ls.d[d];
    bool none = at->reduction == KILN_REDUCTION_NONE;
    double *y = kh_out(r, 0, none ? ts : KILN_SHAPE(), 0);
    double sum = 0, wsum = 0, eps = at->label_smoothing;
    for (int64_t i = 0; i < npos; i++) {
        int64_t n = i / inner, rest = i % inner, ti = (int64_t)t[i];
        if (ti == at->ignore_index) continue;
        double wt = w ? w[ti] : 1, smooth = 0;
        for (int64_t c = 0; c < C; c++) smooth -= (w ? w[c] : 1) * lp[(n * C + c) * inner + rest];
        double li = (1 - eps) * -wt * lp[(n * C + ti) * inner + rest] + eps / (double)C * smooth;
        if (none) y[i] = li;
        sum += li;
        wsum += wt;
    }
    if (!none) y[0] = at->reduction == KILN_REDUCTION_MEAN ? sum / wsum : sum;
}

static void reduce_ref_nll_loss(kh_ref *r) { reduce_nll_from(r, r->in[0], r->shape[0]); }

static void reduce_ref_cross_entropy(kh_ref *r) {
    kiln_shape s = r->shape[0];
    double *lp = malloc(sizeof(double) * (size_t)kh_numel(s));
    reduce_softmax_into(r->in[0], s, s.ndim == 1 ? 0 : 1, true, lp);
    reduce_nll_from(r, lp, s);
    free(lp);
}

static kiln_loss_opts reduce_opts_of(kh_run *r) {
    kiln_loss_opts o = kiln_loss_defaults();
    switch (r->attrs->reduction) {
    case KILN_REDUCTION_NONE: o.reduction = KILN_LOSS_NONE; break;
    case KILN_REDUCTION_SUM: o.reduction = KILN_LOSS_SUM; break;
    case KILN_REDUCTION_MEAN: o.reduction = KILN_LOSS_MEAN; break;
    }
    o.ignore_index = r->attrs->ignore_index;
    o.label_smoothing = r->attrs->label_smoothing;
    o.weight = r->in[2];
    return o;
}

static kiln_tensor *reduce_run_nll_loss(kh_run *r) {
    kiln_loss_opts o = reduce_opts_of(r);
    return kiln_nll_loss(r->in[0], r->in[1], &o);
}
static kiln_tensor *reduce_run_cross_entropy(kh_run *r) {
    kiln_loss_opts o = reduce_opts_of(r);
    return kiln_cross_entropy(r->in[0], r->in[1], &o);
}

static void reduce_ref_mse_loss(kh_ref *r) {
    bool none = r->attrs->reduction == KILN_REDUCTION_NONE;
    int64_t n = kh_numel(r->shape[0]);
    double *y = kh_out(r, 0, none ? r->shape[0] : KILN_SHAPE(), 0), sum = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = r->in[0][i] - r->in[1][i];
        if (none) y[i] = d * d;
        sum += d * d;
    }
    if (!none) y[0] = r->attrs->reduction == KILN_REDUCTION_MEAN ? sum / (double)n : sum;
}
static kiln_tensor *reduce_run_mse_loss(kh_run *r) {
    kiln_loss_reduction red = r->attrs->reduction == KILN_REDUCTION_NONE  ? KILN_LOSS_NONE
                              : r->attrs->reduction == KILN_REDUCTION_SUM ? KILN_LOSS_SUM
                                                                          : KILN_LOSS_MEAN;
    return kiln_mse_loss(r->in[0], r->in[1], red);
}

/* ---- linear algebra -------------------------------------------------------------------------- */

/* NumPy matmul of row-major a and b (any ranks >= 1). */
static void reduce_ref_matmul(kh_ref *r) {
    kiln_shape a = r->shape[0], b = r->shape[1];
    kiln_shape a2 = a, b2 = b;
    if (a.ndim == 1) a2 = KILN_SHAPE(1, a.d[0]);
    if (b.ndim == 1) b2 = KILN_SHAPE(b.d[0], 1);
    int64_t n = a2.d[a2.ndim - 2], k = a2.d[a2.ndim - 1], m = b2.d[b2.ndim - 1];
    kiln_shape ba = {.ndim = a2.ndim - 2}, bb = {.ndim = b2.ndim - 2}, bo;
    memcpy(ba.d, a2.d, sizeof(int64_t) * (size_t)ba.ndim);
    memcpy(bb.d, b2.d, sizeof(int64_t) * (size_t)bb.ndim);
    kh_broadcast(ba, bb, &bo);
    kiln_shape os = bo;
    if (a.ndim > 1) os.d[os.ndim++] = n;
    if (b.ndim > 1) os.d[os.ndim++] = m;
    double *y = kh_out(r, 0, os, 0);
    for (int64_t bi = 0; bi < kh_numel(bo); bi++) {
        int64_t ia = kh_bcast_index(bo, bi, ba), ib = kh_bcast_index(bo, bi, bb);
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < m; j++) {
                double s = 0;
                for (int64_t p = 0; p < k; p++) s += r->in[0][ia * n * k + i * k + p] * r->in[1][ib * k * m + p * m + j];
                y[(bi * n + i) * m + j] = s;
            }
    }
}
static kiln_tensor *reduce_run_mm(kh_run *r) { return kiln_mm(r->in[0], r->in[1]); }
static kiln_tensor *reduce_run_bmm(kh_run *r) { return kiln_bmm(r->in[0], r->in[1]); }
static kiln_tensor *reduce_run_matmul(kh_run *r) { return kiln_matmul(r->in[0], r->in[1]); }

static void reduce_ref_linear(kh_ref *r) {
    kiln_shape xs = r->shape[0];
    int64_t in_f = xs.d[xs.ndim - 1], out_f = r->shape[1].d[0], rows = kh_numel(xs) / in_f;
    kiln_shape os = xs;
    os.d[os.ndim - 1] = out_f;
    double *y = kh_out(r, 0, os, 0);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t o = 0; o < out_f; o++) {
            double s = r->in[2] ? r->in[2][o] : 0;
            for (int64_t p = 0; p < in_f; p++) s += r->in[0][i * in_f + p] * r->in[1][o * in_f + p];
            y[i * out_f + o] = s;
        }
}
static kiln_tensor *reduce_run_linear(kh_run *r) { return kiln_linear(r->in[0], r->in[1], r->in[2]); }

/* ---- the table -------------------------------------------------------------------------- */

#define REDUCE_IN(...) {__VA_ARGS__}
#define REDUCE_X(sh, ...) {.shape = sh, .grad = true, __VA_ARGS__}
#define REDUCE_TARGET(sh, lo_, hi_) {.shape = sh, .fill = KH_INDEX, .lo = lo_, .hi = hi_, .as = KH_AS(KILN_I64)}
#define REDUCE_INTS (KILN_DT(KILN_I32) | KILN_DT(KILN_I64) | KILN_DT(KILN_U8))

static const kh_case reduce_cases[] = {
    /* sum: integer and bool inputs sum to i64 */
    {.name = "sum", .params = "3x5 dim1", .dtypes = KH_FLOAT | REDUCE_INTS | KILN_DT(KILN_BOOL), .n_in = 1,
     .in = {REDUCE_X(KILN_SHAPE(3, 5))}, .attrs = {.n_dims = 1, .dims = {1}},
     .op = KH_OP(KILN_OP_SUM), .run = reduce_run_sum, .reference = reduce_ref_sum},
    {.name = "sum", .params = "2x3x5 dims(0,-1) keepdim T", .dtypes = KH_FLOAT | REDUCE_INTS, .n_in = 1,
     .in = {REDUCE_X(KILN_SHAPE(2, 3, 5), .layout = KH_TRANSPOSED)},
     .attrs = {.n_dims = 2, .dims = {0, -1}, .keepdim = true},
     .op = KH_OP(KILN_OP_SUM), .run = reduce_run_sum, .reference = reduce_ref_sum},
    {.name = "sum", .params = "4x3 all S", .dtypes = KH_FLOAT | REDUCE_INTS, .n_in = 1,
     .in = {REDUCE_X(KILN_SHAPE(4, 3), .layout = KH_STRIDED)},
     .op = KH_OP(KILN_OP_SUM), .run = reduce_run_sum, .reference = reduce_ref_sum},
    {.name = "sum", .params = "scalar", .dtypes = KH_FLOAT, .n_in = 1, .in = {REDUCE_X(KILN_SHAPE())},
     .op = KH_OP(KILN_OP_SUM), .run = reduce_run_sum, .reference = reduce_ref_sum},
    {.name = "sum", .params = "0x3 dim0", .dtypes = KH_FLOAT, .n_in = 1, .in = {{.shape = KILN_SHAPE(0, 3)}},
     .attrs = {.n_dims = 1, .dims = {0}}, .op = KH_OP(KILN_OP_SUM), .run = reduce_run_sum, .reference = reduce_ref_sum},
    {.name = "sum", .params = "duplicate dims", .dtypes = KILN_DT(KILN_F32), .n_in = 1,
     .in = {{.shape = KILN_SHAPE(3, 4)}}, .attrs = {.n_dims = 2, .dims = {1, -1}}, .run = reduce_run_sum,
     .expect_error = "appears more than once"},
    /* mean */
    {.name = "mean", .params = "3x5 dim0", .dtypes = KH_FLOAT, .n_in = 1, .in = {REDUCE_X(KILN_SHAPE(3, 5))},
     .attrs = {.n_dims = 1, .dims = {0}}, .op = KH_OP(KILN_OP_MEAN), .run = reduce_run_mean, .reference = reduce_ref_mean},
    {.name = "mean", .params = "2x3x4 dims(2,0) keepdim T", .dtypes = KH_FLOAT, .n_in = 1,
     .in = {REDUCE_X(KILN_SHAPE(2, 3, 4), .layout = KH_TRANSPOSED)}, .attrs = {.n_dims = 2, .dims = {2, 0}, .keepdim = true},
     .op = KH_OP(KILN_OP_MEAN), .run = reduce_run_mean, .reference = reduce_ref_mean},
    {.name = "mean", .params = "3x4 all S", .dtypes = KH_FLOAT, .n_in = 1,
     .in = {REDUCE_X(KILN_SHAPE(3, 4), .layout = KH_STRIDED)},
     .op = KH_OP(KILN_OP_MEAN), .run = reduce_run_mean, .reference = reduce_ref_mean},
    {.name = "mean", .params = "i64 input", .dtypes = KILN_DT(KILN_I64), .n_in = 1, .in = {{.shape = KILN_SHAPE(3)}},
     .run = reduce_run_mean, .expect_error = "floating"},
    /* max / min (amax / amin): distinct values for the gradient; ties below */
    {.name = "max", .params = "3x5 dim1", .dtypes = KH_FLOAT | REDUCE_INTS | KILN_DT(KILN_BOOL), .n_in = 1,
     .in = {REDUCE_X(KILN_SHAPE(3, 5), .fill = KH_DISTINCT)}, .attrs = {.n_dims = 1, .dims = {1}},
     .op = KH_OP(KILN_OP_AMAX), .run = reduce_run_max, .reference = reduce_ref_max},
    {.name = "max", .params = "2x3x4 dims(0,2) keepdim T", .dtypes = KH_FLOAT | REDUCE_INTS, .n_in = 1,
     .in = {REDUCE_X(KILN_SHAPE(2, 3, 4), .fill = KH_DISTINCT, .layout = KH_TRANSPOSED)},
     .attrs = {.n_dims = 2, .dims = {0, 2}, .keepdim = true},
     .op = KH_OP(KILN_OP_AMAX), .run = reduce_run_max, .reference = reduce_ref_max},
    {.name = "max", .params = "ties 4x6 dim1", .dtypes = KH_FLOAT | REDUCE_INTS, .n_in = 1,
     .in = {{.shape = KILN_SHAPE(4, 6), .fill = KH_INDEX, .lo = -2, .hi = 2}}, .attrs = {.n_dims = 1, .dims = {1}},
     .op = KH_OP(KILN_OP_AMAX), .run = reduce_run_max, .reference = reduce_ref_max},
    {.name = "min", .params = "3x5 dim0 S", .dtypes = KH_FLOAT | REDUCE_INTS, .n_in = 1,
     .in = {REDUCE_X(KILN_SHAPE(3, 5), .fill = KH_DISTINCT, .layout = KH_STRIDED)}, .attrs = {.n_dims = 1, .dims = {0}},
     .op = KH_OP(KILN_OP_AMIN), .run = reduce_run_min, .reference = reduce_ref_min},
    {.name = "min", .params = "4x3 all", .dtypes = KH_FLOAT | REDUCE_INTS, .n_in = 1,
     .in = {REDUCE_X(KILN_SHAPE(4, 3), .fill = KH_DISTINCT)},
     .op = KH_OP(KILN_OP_AMIN), .run = reduce_run_min, .reference = reduce_ref_min},
    {.name = "max", .params = "empty dim", .dtypes = KILN_DT(KILN_F32), .n_in = 1, .in = {{.shape = KILN_SHAPE(2, 0)}},
     .attrs = {.n_dims = 1, .dims = {1}}, .run = reduce_run_max, .expect_error = "empty"},
    /* argmax: the first maximum */
    {.name = "argmax", .params = "3x5 dim1", .dtypes = KH_FLOAT | REDUCE_INTS, .n_in = 1,
     .in = {{.shape = KILN_SHAPE(3, 5), .fill = KH_DISTINCT}}, .attrs = {.n_dims = 1, .dims = {1}},
     .op = KH_OP(KILN_OP_ARGMAX), .run = reduce_run_argmax, .reference = reduce_ref_argmax},
    {.name = "argmax", .params = "ties 2x3x4 dim-2 keepdim T", .dtypes = KH_FLOAT | REDUCE_INTS, .n_in = 1,
     .in = {{.shape = KILN_SHAPE(2, 3, 4), .fill = KH_INDEX, .lo = 0, .hi = 2, .layout = KH_TRANSPOSED}},
     .attrs = {.n_dims = 1, .dims = {-2}, .keepdim = true},
     .op = KH_OP(KILN_OP_ARGMAX), .run = reduce_run_argmax, .reference = reduce_ref_argmax},
    /* norm */
    {.name = "norm", .params = "p2 3x5 dim1", .dtypes = KH_FLOAT, .n_in = 1, .in = {REDUCE_X(KILN_SHAPE(3, 5))},
     .attrs = {.scalar = {2}, .n_dims = 1, .dims = {1}}, .op = KH_OP(KILN_OP_NORM), .run = reduce_run_norm,
     .reference = reduce_ref_norm},
    {.name = "norm", .params = "p2 4x3 all T", .dtypes = KH_FLOAT, .n_in = 1,
     .in = {REDUCE_X(KILN_SHAPE(4, 3), .layout = KH_TRANSPOSED)}, .attrs = {.scalar = {2}},
     .op = KH_OP(KILN_OP_NORM), .run = reduce_run_norm, .reference = reduce_ref_norm},
    {.name = "norm", .params = "p1 3x4 dim0 keepdim", .dtypes = KH_FLOAT, .n_in = 1,
     .in = {REDUCE_X(KILN_SHAPE(3, 4), .fill = KH_AWAY)}, .attrs = {.scalar = {1}, .n_dims = 1, .dims = {0}, .keepdim = true},
     .op = KH_OP(KILN_OP_NORM), .run = reduce_run_norm, .reference = reduce_ref_norm},
    {.name = "norm", .params = "p3 2x3x2 dims(1,2) S", .dtypes = KH_FLOAT, .n_in = 1,
     .in = {REDUCE_X(KILN_SHAPE(2, 3, 2), .fill = KH_AWAY, .layout = KH_STRIDED)},
     .attrs = {.scalar = {3}, .n_dims = 2, .dims = {1, 2}}, .op = KH_OP(KILN_OP_NORM), .run = reduce_run_norm,
     .reference = reduce_ref_norm},
    {.name = "norm", .params = "p0.5 3x4 dim1", .dtypes = KH_FLOAT, .n_in = 1,
     .in = {REDUCE_X(KILN_SHAPE(3, 4), .fill = KH_AWAY)}, .attrs = {.scalar = {0.5}, .n_dims = 1, .dims = {1}},
     .op = KH_OP(KILN_OP_NORM), .run = reduce_run_norm, .reference = reduce_ref_norm},
    {.name = "norm", .params = "pinf 3x4 all", .dtypes = KH_FLOAT, .n_in = 1,
     .in = {REDUCE_X(KILN_SHAPE(3, 4), .fill = KH_DISTINCT)}, .attrs = {.scalar = {INFINITY}},
     .op = KH_OP(KILN_OP_NORM), .run = reduce_run_norm, .reference = reduce_ref_norm},
    {.name = "norm", .params = "p0 3x4 dim1", .dtypes = KH_FLOAT, .n_in = 1,
     .in = {REDUCE_X(KILN_SHAPE(3, 4), .fill = KH_INDEX, .lo = -1, .hi = 2)},
     .attrs = {.scalar = {0}, .n_dims = 1, .dims = {1}}, .op = KH_OP(KILN_OP_NORM), .run = reduce_run_norm,
     .reference = reduce_ref_norm},
    /* softmax / log_softmax */
    {.name = "softmax", .params = "3x5 dim1", .dtypes = KH_FLOAT, .n_in = 1, .in = {REDUCE_X(KILN_SHAPE(3, 5))},
     .attrs = {.n_dims = 1, .dims = {1}}, .op = KH_OP(KILN_OP_SOFTMAX), .run = reduce_run_softmax,
     .reference = reduce_ref_softmax},
    {.name = "softmax", .params = "2x3x4 dim0 T", .dtypes = KH_FLOAT, .n_in = 1,
     .in = {REDUCE_X(KILN_SHAPE(2, 3, 4), .layout = KH_TRANSPOSED)}, .attrs = {.n_dims = 1, .dims = {0}},
     .op = KH_OP(KILN_OP_SOFTMAX), .run = reduce_run_softmax, .reference = reduce_ref_softmax},
    {.name = "softmax", .params = "large 2x4 dim-1 S", .dtypes = KH_FLOAT, .n_in = 1,
     .in = {REDUCE_X(KILN_SHAPE(2, 4), .fill = KH_UNIFORM, .lo = 80, .hi = 100, .layout = KH_STRIDED)},
     .attrs = {.n_dims = 1, .dims = {-1}}, .op = KH_OP(KILN_OP_SOFTMAX), .run = reduce_run_softmax,
     .reference = reduce_ref_softmax},
    {.name = "log_softmax", .params = "3x5 dim1", .dtypes = KH_FLOAT, .n_in = 1, .in = {REDUCE_X(KILN_SHAPE(3, 5))},
     .attrs = {.n_dims = 1, .dims = {1}}, .op = KH_OP(KILN_OP_LOG_SOFTMAX), .run = reduce_run_log_softmax,
     .reference = reduce_ref_log_softmax},
    {.name = "log_softmax", .params = "2x3x4 dim-2 T", .dtypes = KH_FLOAT, .n_in = 1,
     .in = {REDUCE_X(KILN_SHAPE(2, 3, 4), .layout = KH_TRANSPOSED)}, .attrs = {.n_dims = 1, .dims = {-2}},
     .op = KH_OP(KILN_OP_LOG_SOFTMAX), .run = reduce_run_log_softmax, .reference = reduce_ref_log_softmax},
    {.name = "log_softmax", .params = "large 3x4 dim0 S", .dtypes = KH_FLOAT, .n_in = 1,
     .in = {REDUCE_X(KILN_SHAPE(3, 4), .fill = KH_UNIFORM, .lo = -100, .hi = 100, .layout = KH_STRIDED)},
     .attrs = {.n_dims = 1, .dims = {0}}, .op = KH_OP(KILN_OP_LOG_SOFTMAX), .run = reduce_run_log_softmax,
     .reference = reduce_ref_log_softmax},
    /* nll_loss: inputs (log_probs, target, weight) as in ops.def */
    {.name = "nll_loss", .params = "5x4 mean", .dtypes = KH_FLOAT, .n_in = 3,
     .in = {REDUCE_X(KILN_SHAPE(5, 4)), REDUCE_TARGET(KILN_SHAPE(5), 0, 4), {.absent = true}},
     .attrs = {.reduction = KILN_REDUCTION_MEAN, .ignore_index = -100}, .op = KH_OP(KILN_OP_NLL_LOSS),
     .run = reduce_run_nll_loss, .reference = reduce_ref_nll_loss},
    {.name = "nll_loss", .params = "6x4 weight ignore-1 sum T", .dtypes = KH_FLOAT, .n_in = 3,
     .in = {REDUCE_X(KILN_SHAPE(6, 4), .layout = KH_TRANSPOSED), REDUCE_TARGET(KILN_SHAPE(6), -1, 4),
            {.shape = KILN_SHAPE(4), .fill = KH_POSITIVE}},
     .attrs = {.reduction = KILN_REDUCTION_SUM, .ignore_index = -1}, .op = KH_OP(KILN_OP_NLL_LOSS),
     .run = reduce_run_nll_loss, .reference = reduce_ref_nll_loss},
    {.name = "nll_loss", .params = "6x4 weight ignore-1 mean", .dtypes = KH_FLOAT, .n_in = 3,
     .in = {REDUCE_X(KILN_SHAPE(6, 4)), REDUCE_TARGET(KILN_SHAPE(6), -1, 4), {.shape = KILN_SHAPE(4), .fill = KH_POSITIVE}},
     .attrs = {.reduction = KILN_REDUCTION_MEAN, .ignore_index = -1}, .op = KH_OP(KILN_OP_NLL_LOSS),
     .run = reduce_run_nll_loss, .reference = reduce_ref_nll_loss},
    {.name = "nll_loss", .params = "2x3x4 none S", .dtypes = KH_FLOAT, .n_in = 3,
     .in = {REDUCE_X(KILN_SHAPE(2, 3, 4), .layout = KH_STRIDED), REDUCE_TARGET(KILN_SHAPE(2, 4), 0, 3), {.absent = true}},
     .attrs = {.reduction = KILN_REDUCTION_NONE, .ignore_index = -100}, .op = KH_OP(KILN_OP_NLL_LOSS),
     .run = reduce_run_nll_loss, .reference = reduce_ref_nll_loss},
    {.name = "nll_loss", .params = "smooth0.2 2x3x2 weight ignore0 mean", .dtypes = KH_FLOAT, .n_in = 3,
     .in = {REDUCE_X(KILN_SHAPE(2, 3, 2)), REDUCE_TARGET(KILN_SHAPE(2, 2), 0, 3),
            {.shape = KILN_SHAPE(3), .fill = KH_POSITIVE}},
     .attrs = {.reduction = KILN_REDUCTION_MEAN, .ignore_index = 0, .label_smoothing = 0.2},
     .op = KH_OP(KILN_OP_NLL_LOSS), .run = reduce_run_nll_loss, .reference = reduce_ref_nll_loss},
    {.name = "nll_loss", .params = "unbatched (4)", .dtypes = KH_FLOAT, .n_in = 3,
     .in = {REDUCE_X(KILN_SHAPE(4)), REDUCE_TARGET(KILN_SHAPE(), 0, 4), {.absent = true}},
     .attrs = {.reduction = KILN_REDUCTION_MEAN, .ignore_index = -100}, .op = KH_OP(KILN_OP_NLL_LOSS),
     .run = reduce_run_nll_loss, .reference = reduce_ref_nll_loss},
    {.name = "nll_loss", .params = "target out of range", .dtypes = KILN_DT(KILN_F32), .n_in = 3,
     .in = {{.shape = KILN_SHAPE(3, 4)}, REDUCE_TARGET(KILN_SHAPE(3), 4, 5), {.absent = true}},
     .attrs = {.reduction = KILN_REDUCTION_MEAN, .ignore_index = -100}, .run = reduce_run_nll_loss,
     .expect_error = "target 4 is out of range", .value_error = true},
    /* cross_entropy = log_softmax over dim 1 + nll_loss */
    {.name = "cross_entropy", .params = "5x4 mean", .dtypes = KH_FLOAT, .n_in = 3,
     .in = {REDUCE_X(KILN_SHAPE(5, 4)), REDUCE_TARGET(KILN_SHAPE(5), 0, 4), {.absent = true}},
     .attrs = {.reduction = KILN_REDUCTION_MEAN, .ignore_index = -100}, .run = reduce_run_cross_entropy,
     .reference = reduce_ref_cross_entropy},
    {.name = "cross_entropy", .params = "smooth0.1 6x5 weight ignore2 mean T", .dtypes = KH_FLOAT, .n_in = 3,
     .in = {REDUCE_X(KILN_SHAPE(6, 5), .layout = KH_TRANSPOSED), REDUCE_TARGET(KILN_SHAPE(6), 0, 5),
            {.shape = KILN_SHAPE(5), .fill = KH_POSITIVE}},
     .attrs = {.reduction = KILN_REDUCTION_MEAN, .ignore_index = 2, .label_smoothing = 0.1},
     .run = reduce_run_cross_entropy, .reference = reduce_ref_cross_entropy},
    {.name = "cross_entropy", .params = "smooth0.3 2x3x4 sum", .dtypes = KH_FLOAT, .n_in = 3,
     .in = {REDUCE_X(KILN_SHAPE(2, 3, 4)), REDUCE_TARGET(KILN_SHAPE(2, 4), 0, 3), {.absent = true}},
     .attrs = {.reduction = KILN_REDUCTION_SUM, .ignore_index = -100, .label_smoothing = 0.3},
     .run = reduce_run_cross_entropy, .reference = reduce_ref_cross_entropy},
    {.name = "cross_entropy", .params = "2x3x2 none S", .dtypes = KH_FLOAT, .n_in = 3,
     .in = {REDUCE_X(KILN_SHAPE(2, 3, 2), .layout = KH_STRIDED), REDUCE_TARGET(KILN_SHAPE(2, 2), 0, 3), {.absent = true}},
     .attrs = {.reduction = KILN_REDUCTION_NONE, .ignore_index = -100}, .run = reduce_run_cross_entropy,
     .reference = reduce_ref_cross_entropy},
    /* mse_loss */
    {.name = "mse_loss", .params = "3x4 mean", .dtypes = KH_FLOAT, .n_in = 2,
     .in = {REDUCE_X(KILN_SHAPE(3, 4)), REDUCE_X(KILN_SHAPE(3, 4))}, .attrs = {.reduction = KILN_REDUCTION_MEAN},
     .op = KH_OP(KILN_OP_MSE_LOSS), .run = reduce_run_mse_loss, .reference = reduce_ref_mse_loss},
    {.name = "mse_loss", .params = "2x3x2 sum T", .dtypes = KH_FLOAT, .n_in = 2,
     .in = {REDUCE_X(KILN_SHAPE(2, 3, 2), .layout = KH_TRANSPOSED), REDUCE_X(KILN_SHAPE(2, 3, 2))},
     .attrs = {.reduction = KILN_REDUCTION_SUM}, .op = KH_OP(KILN_OP_MSE_LOSS), .run = reduce_run_mse_loss,
     .reference = reduce_ref_mse_loss},
    {.name = "mse_loss", .params = "5x3 none S", .dtypes = KH_FLOAT, .n_in = 2,
     .in = {REDUCE_X(KILN_SHAPE(5, 3)), REDUCE_X(KILN_SHAPE(5, 3), .layout = KH_STRIDED)},
     .attrs = {.reduction = KILN_REDUCTION_NONE}, .op = KH_OP(KILN_OP_MSE_LOSS), .run = reduce_run_mse_loss,
     .reference = reduce_ref_mse_loss},
    /* mm, bmm, matmul, linear */
    {.name = "mm", .params = "3x4@4x5", .dtypes = KH_FLOAT, .n_in = 2,
     .in = {REDUCE_X(KILN_SHAPE(3, 4)), REDUCE_X(KILN_SHAPE(4, 5))}, .op = KH_OP(KILN_OP_MM),
     .run = reduce_run_mm, .reference = reduce_ref_matmul},
    {.name = "mm", .params = "5x3T@3x2S", .dtypes = KH_FLOAT, .n_in = 2,
     .in = {REDUCE_X(KILN_SHAPE(5, 3), .layout = KH_TRANSPOSED), REDUCE_X(KILN_SHAPE(3, 2), .layout = KH_STRIDED)},
     .op = KH_OP(KILN_OP_MM), .run = reduce_run_mm, .reference = reduce_ref_matmul},
    {.name = "mm", .params = "shape mismatch", .dtypes = KILN_DT(KILN_F32), .n_in = 2,
     .in = {{.shape = KILN_SHAPE(3, 4)}, {.shape = KILN_SHAPE(5, 2)}}, .run = reduce_run_mm, .expect_error = "do not fit"},
    {.name = "bmm", .params = "2x3x4@2x4x5", .dtypes = KH_FLOAT, .n_in = 2,
     .in = {REDUCE_X(KILN_SHAPE(2, 3, 4)), REDUCE_X(KILN_SHAPE(2, 4, 5))}, .op = KH_OP(KILN_OP_BMM),
     .run = reduce_run_bmm, .reference = reduce_ref_matmul},
    {.name = "bmm", .params = "3x2x3T@3x3x2S", .dtypes = KH_FLOAT, .n_in = 2,
     .in = {REDUCE_X(KILN_SHAPE(3, 2, 3), .layout = KH_TRANSPOSED), REDUCE_X(KILN_SHAPE(3, 3, 2), .layout = KH_STRIDED)},
     .op = KH_OP(KILN_OP_BMM), .run = reduce_run_bmm, .reference = reduce_ref_matmul},
    {.name = "matmul", .params = "4.4", .dtypes = KH_FLOAT, .n_in = 2,
     .in = {REDUCE_X(KILN_SHAPE(4)), REDUCE_X(KILN_SHAPE(4))}, .run = reduce_run_matmul, .reference = reduce_ref_matmul},
    {.name = "matmul", .params = "3@3x4", .dtypes = KH_FLOAT, .n_in = 2,
     .in = {REDUCE_X(KILN_SHAPE(3)), REDUCE_X(KILN_SHAPE(3, 4))}, .run = reduce_run_matmul, .reference = reduce_ref_matmul},
    {.name = "matmul", .params = "2x3x4@4", .dtypes = KH_FLOAT, .n_in = 2,
     .in = {REDUCE_X(KILN_SHAPE(2, 3, 4)), REDUCE_X(KILN_SHAPE(4))}, .run = reduce_run_matmul,
     .reference = reduce_ref_matmul},
    {.name = "matmul", .params = "2x3x4T@4x2", .dtypes = KH_FLOAT, .n_in = 2,
     .in = {REDUCE_X(KILN_SHAPE(2, 3, 4), .layout = KH_TRANSPOSED), REDUCE_X(KILN_SHAPE(4, 2))},
     .run = reduce_run_matmul, .reference = reduce_ref_matmul},
    {.name = "matmul", .params = "2x1x3x4@3x4x2 broadcast", .dtypes = KH_FLOAT, .n_in = 2,
     .in = {REDUCE_X(KILN_SHAPE(2, 1, 3, 4)), REDUCE_X(KILN_SHAPE(3, 4, 2), .layout = KH_STRIDED)},
     .run = reduce_run_matmul, .reference = reduce_ref_matmul},
    {.name = "matmul", .params = "3@2x3x2", .dtypes = KH_FLOAT, .n_in = 2,
     .in = {REDUCE_X(KILN_SHAPE(3)), REDUCE_X(KILN_SHAPE(2, 3, 2))}, .run = reduce_run_matmul,
     .reference = reduce_ref_matmul},
    {.name = "matmul", .params = "4x3@3", .dtypes = KH_FLOAT, .n_in = 2,
     .in = {REDUCE_X(KILN_SHAPE(4, 3)), REDUCE_X(KILN_SHAPE(3))}, .run = reduce_run_matmul, .reference = reduce_ref_matmul},
    {.name = "linear", .params = "2x3x4 W5x4 b5", .dtypes = KH_FLOAT, .n_in = 3,
     .in = {REDUCE_X(KILN_SHAPE(2, 3, 4)), REDUCE_X(KILN_SHAPE(5, 4)), REDUCE_X(KILN_SHAPE(5))},
     .op = KH_OP(KILN_OP_LINEAR), .run = reduce_run_linear, .reference = reduce_ref_linear},
    {.name = "linear", .params = "3x4T W2x4S nobias", .dtypes = KH_FLOAT, .n_in = 3,
     .in = {REDUCE_X(KILN_SHAPE(3, 4), .layout = KH_TRANSPOSED), REDUCE_X(KILN_SHAPE(2, 4), .layout = KH_STRIDED),
            {.absent = true}},
     .op = KH_OP(KILN_OP_LINEAR), .run = reduce_run_linear, .reference = reduce_ref_linear},
    {.name = "linear", .params = "4 W3x4 b3", .dtypes = KH_FLOAT, .n_in = 3,
     .in = {REDUCE_X(KILN_SHAPE(4)), REDUCE_X(KILN_SHAPE(3, 4)), REDUCE_X(KILN_SHAPE(3))},
     .op = KH_OP(KILN_OP_LINEAR), .run = reduce_run_linear, .reference = reduce_ref_linear},
};

/* Shape and dtype inference for nll_loss, its backward and mse_loss. */
#include <string.h>

#include "base/error.h"
#include "ops/op_infer.h"
#include "tensor/tensor_internal.h"

static kiln_status check_reduction(const char *op, const kiln_op_attrs *at) {
    if (at->reduction == KILN_REDUCTION_NONE || at->reduction == KILN_REDUCTION_MEAN ||
        at->reduction == KILN_REDUCTION_SUM)
        return KILN_OK;
    return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use KILN_LOSS_MEAN, KILN_LOSS_SUM or KILN_LOSS_NONE",
                      "%s: unknown reduction %d", op, (int)at->reduction);
}

static kiln_status need_floating(const char *op, const char *what, kiln_dtype dt) {
    if (kiln_dtype_is_floating(dt)) return KILN_OK;
    return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "convert it to a floating dtype with kiln_cast",
                      "%s: %s must be floating, got %s", op, what, kiln_dtype_name(dt));
}

/* Targets are class indices: any integer dtype, run as i64. */
static kiln_status target_dtype(const char *op, const kiln_tensor *t, kiln_dtype *in_dtype) {
    if (kiln_dtype_is_floating(t->dtype) || t->dtype == KILN_BOOL)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass class indices as an i64 tensor",
                          "%s: target must hold class indices (i64), got %s", op, kiln_dtype_name(t->dtype));
    *in_dtype = KILN_I64;
    return KILN_OK;
}

/* log_probs (N, C, d...) with target (N, d...), or (C) with a 0-dim target. */
static kiln_status check_target_shape(const char *op, int nd, const int64_t *lp, const kiln_tensor *t) {
    bool ok = nd >= 1 && t->ndim == (nd == 1 ? 0 : nd - 1);
    for (int d = 0; ok && d < t->ndim; d++) ok = t->shape[d] == lp[d == 0 ? 0 : d + 1];
    if (ok) return KILN_OK;
    char a[96], b[96];
    return KILN_RAISE(
        KILN_ERR_INVALID_ARGUMENT, "log_probs is (N, C) or (N, C, d1, ...) and target (N) or (N, d1, ...)",
        "%s: log_probs %s and target %s do not match", op, kiln_shape_format(nd, lp, a, sizeof a),
        kiln_shape_format(t->ndim, t->shape, b, sizeof b));
}

static kiln_status check_weight(const char *op, const kiln_tensor *w, int64_t classes) {
    if (!w || (w->ndim == 1 && w->shape[0] == classes)) return KILN_OK;
    char b[96];
    return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give one weight per class, shape (C)",
                      "%s: weight %s does not match %lld classes", op,
                      kiln_shape_format(w->ndim, w->shape, b, sizeof b), (long long)classes);
}

static kiln_status check_smoothing(const char *op, const kiln_op_attrs *at) {
    if (at->label_smoothing >= 0 && at->label_smoothing <= 1) return KILN_OK;
    return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use a value in [0, 1]",
                      "%s: label_smoothing %g is out of range", op, at->label_smoothing);
}

/* (log_probs, target, weight?) -> (loss, total weight) */
kiln_status kiln_infer_nll_loss(const char *op, const kiln_op_attrs *attrs, int n_in, kiln_tensor *const *in,
                                kiln_meta *out, kiln_dtype *in_dtype) {
    (void)n_in;
    const kiln_tensor *lp = in[0], *t = in[1], *w = in[2];
    KILN_TRY(check_reduction(op, attrs));
    KILN_TRY(check_smoothing(op, attrs));
    KILN_TRY(need_floating(op, "log_probs", lp->dtype));
    KILN_TRY(target_dtype(op, t, &in_dtype[1]));
    KILN_TRY(check_target_shape(op, lp->ndim, lp->shape, t));
    int64_t classes = lp->shape[lp->ndim == 1 ? 0 : 1];
    KILN_TRY(check_weight(op, w, classes));
    if (w) in_dtype[2] = lp->dtype;
    out[0].dtype = out[1].dtype = lp->dtype;
    out[1].ndim = 0;
    out[0].ndim = 0;
    if (attrs->reduction == KILN_REDUCTION_NONE) {
        out[0].ndim = t->ndim;
        memcpy(out[0].shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    }
    return KILN_OK;
}

/* (grad, target, weight?, total_weight) -> grad of log_probs, whose shape
 * is attrs.ints[0..n_ints). */
kiln_status kiln_infer_nll_loss_backward(const char *op, const kiln_op_attrs *attrs, int n_in,
                                         kiln_tensor *const *in, kiln_meta *out, kiln_dtype *in_dtype) {
    (void)n_in;
    const kiln_tensor *g = in[0], *t = in[1], *w = in[2], *tw = in[3];
    KILN_TRY(check_reduction(op, attrs));
    KILN_TRY(need_floating(op, "grad", g->dtype));
    KILN_TRY(target_dtype(op, t, &in_dtype[1]));
    if (attrs->n_ints < 1 || attrs->n_ints > KILN_MAX_DIMS)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass the log_probs shape in attrs.ints",
                          "%s: %d dims given for the log_probs shape", op, attrs->n_ints);
    KILN_TRY(check_target_shape(op, attrs->n_ints, attrs->ints, t));
    int64_t classes = attrs->ints[attrs->n_ints == 1 ? 0 : 1];
    KILN_TRY(check_weight(op, w, classes));
    bool none = attrs->reduction == KILN_REDUCTION_NONE;
    bool g_ok = none ? g->ndim == t->ndim && !memcmp(g->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim)
                     : g->ndim == 0;
    if (!g_ok || tw->ndim != 0)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "grad has the loss's shape; total_weight is 0-dim",
                          "%s: grad or total_weight has the wrong shape", op);
    if (w) in_dtype[2] = g->dtype;
    in_dtype[3] = g->dtype;
    out[0].dtype = g->dtype;
    out[0].ndim = attrs->n_ints;
    memcpy(out[0].shape, attrs->ints, sizeof(int64_t) * (size_t)attrs->n_ints);
    return KILN_OK;
}

/* (input, target) of one shape; both run in their promoted dtype. */
kiln_status kiln_infer_mse_loss(const char *op, const kiln_op_attrs *attrs, int n_in, kiln_tensor *const *in,
                                kiln_meta *out, kiln_dtype *in_dtype) {
    (void)n_in;
    const kiln_tensor *x = in[0], *t = in[1];
    KILN_TRY(check_reduction(op, attrs));
    kiln_dtype dt = kiln_promote_types(x->dtype, t->dtype);
    KILN_TRY(need_floating(op, "input", dt));
    if (x->ndim != t->ndim || memcmp(x->shape, t->shape, sizeof(int64_t) * (size_t)x->ndim)) {
        char a[96], b[96];
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                          "give input and target one shape (kiln_expand the target)",
                          "%s: input %s and target %s differ in shape", op,
                          kiln_shape_format(x->ndim, x->shape, a, sizeof a),
                          kiln_shape_format(t->ndim, t->shape, b, sizeof b));
    }
    in_dtype[0] = in_dtype[1] = dt;
    out[0].dtype = dt;
    out[0].ndim = 0;
    if (attrs->reduction == KILN_REDUCTION_NONE) {
        out[0].ndim = x->ndim;
        memcpy(out[0].shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    }
    return KILN_OK;
}

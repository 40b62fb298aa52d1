/* Backward formulas of the reductions and of softmax / log_softmax,
 * written with public ops (they run on every backend and on meta).
 *
 *   sum        gx = expand(g)
 *   mean       gx = expand(g) / count
 *   amax/amin  gx = (x == y) * g / (number of ties), as torch.amax
 *   norm       gx = sign(x) |x|^(p-1) g / y^(p-1), 0 where y == 0; p = inf
 *              shares g among the |x| equal to y; p = 0 has no gradient
 *   softmax    the SOFTMAX_BACKWARD / LOG_SOFTMAX_BACKWARD kernels */
#include <math.h>
#include <string.h>

#include "autograd/backward_util.h"
#include "base/error.h"
#include "kiln/ops.h"
#include "ops/op_backward.h"
#include "tensor/tensor_internal.h"

/* The reduced output's shape with the reduced dims kept as size 1. */
static kiln_shape keepdim_shape(const kiln_meta *in, const kiln_op_attrs *at, int64_t *count) {
    kiln_shape s = {.ndim = in->ndim};
    bool red[KILN_MAX_DIMS] = {false};
    for (int d = 0; d < in->ndim; d++) red[d] = at->n_dims == 0;
    for (int i = 0; i < at->n_dims && in->ndim > 0; i++)
        red[((at->dims[i] % in->ndim) + in->ndim) % in->ndim] = true;
    *count = 1;
    for (int d = 0; d < in->ndim; d++) {
        s.d[d] = red[d] ? 1 : in->shape[d];
        if (red[d]) *count *= in->shape[d];
    }
    return s;
}

/* g (or y) reshaped so that its reduced dims are back as size 1. */
static kiln_tensor *keep_dims(kiln_tensor *g, const kiln_backward_ctx *ctx) {
    int64_t count;
    return kiln_reshape(g, keepdim_shape(&ctx->in_meta[0], ctx->attrs, &count));
}

static kiln_tensor *expand_to_input(kiln_tensor *g, const kiln_backward_ctx *ctx) {
    kiln_tensor *k = keep_dims(g, ctx);
    if (!k) return NULL;
    kiln_tensor *e = kiln_expand(k, kiln_meta_shape(&ctx->in_meta[0]));
    kiln_tensor_drop(k);
    return e;
}

static kiln_status result(kiln_tensor *t, kiln_tensor **slot) {
    *slot = t;
    return t ? KILN_OK : kiln_error_last()->status;
}

kiln_status kiln_backward_sum(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                              kiln_tensor **grad_in) {
    if (!grad_out[0] || !ctx->needs_grad[0]) return KILN_OK;
    return result(expand_to_input(grad_out[0], ctx), &grad_in[0]);
}

kiln_status kiln_backward_mean(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                               kiln_tensor **grad_in) {
    if (!grad_out[0] || !ctx->needs_grad[0]) return KILN_OK;
    int64_t count;
    keepdim_shape(&ctx->in_meta[0], ctx->attrs, &count);
    kiln_tensor *s = kiln_mul_scalar(grad_out[0], 1.0 / (double)count);
    if (!s) return kiln_error_last()->status;
    kiln_tensor *e = expand_to_input(s, ctx);
    kiln_tensor_drop(s);
    return result(e, &grad_in[0]);
}

/* mask * gk / sum(mask) over the reduced dims, mask a 0/1 tensor of x's
 * shape and dtype, gk the gradient with kept dims. */
static kiln_tensor *share_among(kiln_tensor *mask, kiln_tensor *gk, const kiln_backward_ctx *ctx) {
    kiln_op_attrs at = *ctx->attrs;
    kiln_tensor *cnt = kiln_sum(mask, at.n_dims, at.dims, true);
    kiln_tensor *each = cnt ? kiln_div(gk, cnt) : NULL;
    kiln_tensor *r = each ? kiln_mul(mask, each) : NULL;
    kiln_tensor *tmp[] = {cnt, each};
    kiln_drop_all(2, tmp);
    return r;
}

kiln_status kiln_backward_amax_amin(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                    kiln_tensor **grad_in) {
    if (!grad_out[0] || !ctx->needs_grad[0]) return KILN_OK;
    kiln_tensor *x = ctx->in[0];
    kiln_tensor *yk = keep_dims(ctx->out[0], ctx);
    kiln_tensor *gk = keep_dims(grad_out[0], ctx);
    kiln_tensor *eq = yk ? kiln_eq(x, yk) : NULL;
    kiln_tensor *mask = eq ? kiln_cast(eq, ctx->in_meta[0].dtype) : NULL;
    kiln_tensor *r = mask && gk ? share_among(mask, gk, ctx) : NULL;
    kiln_tensor *tmp[] = {yk, gk, eq, mask};
    kiln_drop_all(4, tmp);
    return result(r, &grad_in[0]);
}

/* sign(x) as x's dtype: (x > 0) - (x < 0). */
static kiln_tensor *sign_of(kiln_tensor *x, kiln_tensor *zero) {
    kiln_tensor *gt = kiln_gt(x, zero), *lt = kiln_lt(x, zero);
    kiln_tensor *pos = gt ? kiln_cast(gt, x->dtype) : NULL, *neg = lt ? kiln_cast(lt, x->dtype) : NULL;
    kiln_tensor *s = pos && neg ? kiln_sub(pos, neg) : NULL;
    kiln_tensor *tmp[] = {gt, lt, pos, neg};
    kiln_drop_all(4, tmp);
    return s;
}

/* where(t == 0, 0, v) */
static kiln_tensor *zero_where_zero(kiln_tensor *t, kiln_tensor *v, kiln_tensor *zero) {
    kiln_tensor *z = kiln_eq(t, zero);
    kiln_tensor *r = z ? kiln_where(z, zero, v) : NULL;
    if (z) kiln_tensor_drop(z);
    return r;
}

/* d||x||_p / dx for finite p != 0, times gk: sign(x) |x|^(p-1) * gk / y^(p-1). */
static kiln_tensor *norm_grad_finite(kiln_tensor *x, kiln_tensor *yk, kiln_tensor *gk, kiln_tensor *zero,
                                     double p) {
    kiln_tensor *num = NULL, *sgn = NULL, *ax = NULL, *pw = NULL, *pw0 = NULL, *den = NULL, *sc = NULL,
                *sc0 = NULL;
    kiln_tensor *r = NULL;
    if (p == 2) {
        num = kiln_retain(x);
    } else {
        sgn = sign_of(x, zero);
        ax = kiln_abs(x);
        pw = ax ? kiln_pow_scalar(ax, p - 1) : NULL;
        /* |0|^(p-1) is inf for p < 1: those elements have no gradient. */
        pw0 = pw && p < 1 ? zero_where_zero(x, pw, zero) : (pw ? kiln_retain(pw) : NULL);
        num = sgn && pw0 ? kiln_mul(sgn, pw0) : NULL;
    }
    den = p == 2 ? kiln_retain(yk) : kiln_pow_scalar(yk, p - 1);
    sc = den ? kiln_div(gk, den) : NULL;
    sc0 = sc ? zero_where_zero(yk, sc, zero) : NULL;
    if (num && sc0) r = kiln_mul(num, sc0);
    kiln_tensor *tmp[] = {num, sgn, ax, pw, pw0, den, sc, sc0};
    kiln_drop_all(8, tmp);
    return r;
}

/* p = +-inf: g shared among the elements whose |x| equals the norm. */
static kiln_tensor *norm_grad_inf(kiln_tensor *x, kiln_tensor *yk, kiln_tensor *gk, kiln_tensor *zero,
                                  const kiln_backward_ctx *ctx) {
    kiln_tensor *ax = kiln_abs(x);
    kiln_tensor *eq = ax ? kiln_eq(ax, yk) : NULL;
    kiln_tensor *mask = eq ? kiln_cast(eq, x->dtype) : NULL;
    kiln_tensor *shared = mask ? share_among(mask, gk, ctx) : NULL;
    kiln_tensor *sgn = shared ? sign_of(x, zero) : NULL;
    kiln_tensor *r = sgn ? kiln_mul(sgn, shared) : NULL;
    kiln_tensor *tmp[] = {ax, eq, mask, shared, sgn};
    kiln_drop_all(5, tmp);
    return r;
}

kiln_status kiln_backward_norm(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                               kiln_tensor **grad_in) {
    if (!grad_out[0] || !ctx->needs_grad[0]) return KILN_OK;
    double p = ctx->attrs->scalar[0];
    if (p == 0) return result(kiln_grad_zeros(&ctx->in_meta[0], ctx->device), &grad_in[0]);
    kiln_tensor *x = ctx->in[0];
    kiln_tensor *yk = keep_dims(ctx->out[0], ctx);
    kiln_tensor *gk = keep_dims(grad_out[0], ctx);
    kiln_tensor *zero = kiln_new_zeros(x, KILN_SHAPE());
    kiln_tensor *r = NULL;
    if (yk && gk && zero)
        r = isinf(p) ? norm_grad_inf(x, yk, gk, zero, ctx) : norm_grad_finite(x, yk, gk, zero, p);
    kiln_tensor *tmp[] = {yk, gk, zero};
    kiln_drop_all(3, tmp);
    return result(r, &grad_in[0]);
}

static kiln_status softmax_grad(kiln_op_id op, const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                kiln_tensor **grad_in) {
    if (!grad_out[0] || !ctx->needs_grad[0]) return KILN_OK;
    kiln_op_attrs at = {.n_dims = 1, .dims = {ctx->attrs->dims[0]}};
    kiln_tensor *out[KILN_OP_MAX_OUT] = {NULL};
    KILN_TRY(kiln_dispatch(op, 2, (kiln_tensor *[]){grad_out[0], ctx->out[0]}, &at, ctx->device, out));
    grad_in[0] = out[0];
    return KILN_OK;
}

kiln_status kiln_backward_softmax(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                  kiln_tensor **grad_in) {
    return softmax_grad(KILN_OP_SOFTMAX_BACKWARD, ctx, grad_out, grad_in);
}

kiln_status kiln_backward_log_softmax(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                      kiln_tensor **grad_in) {
    return softmax_grad(KILN_OP_LOG_SOFTMAX_BACKWARD, ctx, grad_out, grad_in);
}

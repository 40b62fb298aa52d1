/* Backward formulas of the elementwise group, written with public ops (and
 * the *_BACKWARD ops through the dispatcher), so they run on every backend
 * and on meta. Each returns new references in grad_in[i] with exactly the
 * input's shape and dtype; a NULL grad_out[0] means a zero gradient, which
 * these ops pass on as "no gradient" (NULL). */
#include "autograd/backward_util.h"
#include "base/error.h"
#include "kiln/ops.h"
#include "ops/op_backward.h"
#include "tensor/tensor_internal.h"

/* The result of the last call, or the error status it set. */
static kiln_status check(kiln_tensor *t) { return t ? KILN_OK : kiln_error_last()->status; }

/* *slot = sum_to_shape(g) for input i when it needs a gradient. Takes g. */
static kiln_status give(const kiln_backward_ctx *ctx, kiln_tensor **grad_in, int i, kiln_tensor *g) {
    if (!g) return kiln_error_last()->status;
    if (!ctx->needs_grad[i]) {
        kiln_tensor_drop(g);
        return KILN_OK;
    }
    grad_in[i] = kiln_sum_to_shape(g, &ctx->in_meta[i]);
    kiln_tensor_drop(g);
    return check(grad_in[i]);
}

/* A 0-dim tensor of value v in dtype dt on the node's device. */
static kiln_tensor *scalar_like(const kiln_backward_ctx *ctx, double v, kiln_dtype dt) {
    return kiln_full(KILN_SHAPE(), v, dt, ctx->device);
}

/* Dispatch one of the two-input *_BACKWARD ops with the forward's attrs. */
/* An elementwise gradient op(g, t); it may write into g when the engine
 * holds the only reference to it (kiln_dispatch_donating). */
static kiln_tensor *grad_op(const kiln_backward_ctx *ctx, kiln_op_id op, kiln_tensor *g, kiln_tensor *t) {
    kiln_op_attrs at = *ctx->attrs;
    kiln_tensor *out[KILN_OP_MAX_OUT] = {NULL};
    if (kiln_dispatch_donating(op, 2, (kiln_tensor *[]){g, t}, &at, ctx->device, out, 0)) return NULL;
    return out[0];
}

/* ---- Arithmetic ---------------------------------------------------------------------------- */

kiln_status kiln_backward_add(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                              kiln_tensor **grad_in) {
    kiln_tensor *g = grad_out[0];
    if (!g) return KILN_OK;
    KILN_TRY(give(ctx, grad_in, 0, kiln_retain(g)));
    if (ctx->n_in > 1 && ctx->needs_grad[1]) KILN_TRY(give(ctx, grad_in, 1, kiln_retain(g)));
    return KILN_OK;
}

kiln_status kiln_backward_sub(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                              kiln_tensor **grad_in) {
    kiln_tensor *g = grad_out[0];
    if (!g) return KILN_OK;
    if (ctx->needs_grad[0]) KILN_TRY(give(ctx, grad_in, 0, kiln_retain(g)));
    if (ctx->needs_grad[1]) KILN_TRY(give(ctx, grad_in, 1, kiln_neg(g)));
    return KILN_OK;
}

kiln_status kiln_backward_mul(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                              kiln_tensor **grad_in) {
    kiln_tensor *g = grad_out[0];
    if (!g) return KILN_OK;
    if (ctx->needs_grad[0]) KILN_TRY(give(ctx, grad_in, 0, kiln_mul(g, ctx->in[1])));
    if (ctx->needs_grad[1]) KILN_TRY(give(ctx, grad_in, 1, kiln_mul(g, ctx->in[0])));
    return KILN_OK;
}

/* a *= b: only a's gradient (autograd refuses a b that requires grad). */
kiln_status kiln_backward_mul_inplace(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                      kiln_tensor **grad_in) {
    kiln_tensor *g = grad_out[0];
    if (!g || !ctx->needs_grad[0]) return KILN_OK;
    return give(ctx, grad_in, 0, kiln_mul(g, ctx->in[1]));
}

/* d/da = g / b; d/db = -g a / b^2 = -(g / b) (a / b). */
kiln_status kiln_backward_div(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                              kiln_tensor **grad_in) {
    kiln_tensor *g = grad_out[0];
    if (!g) return KILN_OK;
    kiln_tensor *ga = kiln_div(g, ctx->in[1]);
    KILN_TRY(check(ga));
    if (ctx->needs_grad[1]) {
        kiln_tensor *q = kiln_div(ctx->in[0], ctx->in[1]);
        kiln_tensor *p = q ? kiln_mul(ga, q) : NULL;
        if (q) kiln_tensor_drop(q);
        kiln_status st = give(ctx, grad_in, 1, p ? kiln_neg(p) : NULL);
        if (p) kiln_tensor_drop(p);
        if (st) {
            kiln_tensor_drop(ga);
            return st;
        }
    }
    return give(ctx, grad_in, 0, ga);
}

/* PyTorch's pow_backward_self / pow_backward_exponent:
 *   d/da = g * b * a^(b-1), 0 where b == 0;
 *   d/db = g * out * log(a), 0 where a == 0 and b >= 0. */
kiln_status kiln_backward_pow(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                              kiln_tensor **grad_in) {
    kiln_tensor *g = grad_out[0], *a = ctx->in[0], *b = ctx->in[1];
    if (!g) return KILN_OK;
    kiln_dtype dt = ctx->out_meta[0].dtype;
    kiln_tensor *t[8] = {NULL};
    kiln_status st = KILN_OK;
    kiln_tensor *zero = t[0] = scalar_like(ctx, 0.0, dt);
    if (!zero) return kiln_error_last()->status;
    if (ctx->needs_grad[0]) {
        kiln_tensor *bm1 = t[1] = kiln_add_scalar(b, -1.0);
        kiln_tensor *p = t[2] = bm1 ? kiln_pow(a, bm1) : NULL;
        kiln_tensor *bp = t[3] = p ? kiln_mul(b, p) : NULL;
        kiln_tensor *gbp = t[4] = bp ? kiln_mul(g, bp) : NULL;
        kiln_tensor *b0 = t[5] = gbp ? kiln_eq(b, zero) : NULL;
        st = give(ctx, grad_in, 0, b0 ? kiln_where(b0, zero, gbp) : NULL);
        kiln_drop_all(5, t + 1);
    }
    if (!st && ctx->needs_grad[1]) {
        kiln_tensor *la = t[1] = kiln_log(a);
        kiln_tensor *ol = t[2] = la ? kiln_mul(ctx->out[0], la) : NULL;
        kiln_tensor *a0 = t[3] = ol ? kiln_eq(a, zero) : NULL;
        kiln_tensor *bpos = t[4] = a0 ? kiln_ge(b, zero) : NULL;
        kiln_tensor *both = t[5] = bpos ? kiln_mul(a0, bpos) : NULL; /* bool and */
        kiln_tensor *m = t[6] = both ? kiln_where(both, zero, ol) : NULL;
        st = give(ctx, grad_in, 1, m ? kiln_mul(g, m) : NULL);
        kiln_drop_all(6, t + 1);
    }
    kiln_tensor_drop(zero);
    return st;
}

kiln_status kiln_backward_add_scalar(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                     kiln_tensor **grad_in) {
    if (!grad_out[0] || !ctx->needs_grad[0]) return KILN_OK;
    return give(ctx, grad_in, 0, kiln_retain(grad_out[0]));
}

kiln_status kiln_backward_mul_scalar(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                     kiln_tensor **grad_in) {
    if (!grad_out[0] || !ctx->needs_grad[0]) return KILN_OK;
    return give(ctx, grad_in, 0, kiln_mul_scalar(grad_out[0], ctx->attrs->scalar[0]));
}

/* d/dx x^s = s x^(s-1); zero for s == 0 (PyTorch). */
kiln_status kiln_backward_pow_scalar(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                     kiln_tensor **grad_in) {
    kiln_tensor *g = grad_out[0];
    double s = ctx->attrs->scalar[0];
    if (!g || !ctx->needs_grad[0]) return KILN_OK;
    if (s == 0.0) return give(ctx, grad_in, 0, kiln_mul_scalar(g, 0.0));
    kiln_tensor *p = kiln_pow_scalar(ctx->in[0], s - 1.0);
    KILN_TRY(check(p));
    kiln_tensor *sp = kiln_mul_scalar(p, s);
    kiln_tensor_drop(p);
    KILN_TRY(check(sp));
    kiln_tensor *r = kiln_mul(g, sp);
    kiln_tensor_drop(sp);
    return give(ctx, grad_in, 0, r);
}

kiln_status kiln_backward_neg(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                              kiln_tensor **grad_in) {
    if (!grad_out[0] || !ctx->needs_grad[0]) return KILN_OK;
    return give(ctx, grad_in, 0, kiln_neg(grad_out[0]));
}

kiln_status kiln_backward_exp(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                              kiln_tensor **grad_in) {
    if (!grad_out[0] || !ctx->needs_grad[0]) return KILN_OK;
    return give(ctx, grad_in, 0, kiln_mul(grad_out[0], ctx->out[0]));
}

kiln_status kiln_backward_log(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                              kiln_tensor **grad_in) {
    if (!grad_out[0] || !ctx->needs_grad[0]) return KILN_OK;
    return give(ctx, grad_in, 0, kiln_div(grad_out[0], ctx->in[0]));
}

/* d sqrt(x) = 1 / (2 sqrt(x)) = 1 / (2 out). */
kiln_status kiln_backward_sqrt(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                               kiln_tensor **grad_in) {
    if (!grad_out[0] || !ctx->needs_grad[0]) return KILN_OK;
    kiln_tensor *two = kiln_mul_scalar(ctx->out[0], 2.0);
    KILN_TRY(check(two));
    kiln_tensor *r = kiln_div(grad_out[0], two);
    kiln_tensor_drop(two);
    return give(ctx, grad_in, 0, r);
}

/* d x^(-1/2) = -x^(-3/2) / 2 = -out^3 / 2. */
kiln_status kiln_backward_rsqrt(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                kiln_tensor **grad_in) {
    if (!grad_out[0] || !ctx->needs_grad[0]) return KILN_OK;
    kiln_tensor *c = kiln_pow_scalar(ctx->out[0], 3.0);
    KILN_TRY(check(c));
    kiln_tensor *h = kiln_mul_scalar(c, -0.5);
    kiln_tensor_drop(c);
    KILN_TRY(check(h));
    kiln_tensor *r = kiln_mul(grad_out[0], h);
    kiln_tensor_drop(h);
    return give(ctx, grad_in, 0, r);
}

/* g * sign(x), sign(0) = 0: (x > 0) - (x < 0). */
kiln_status kiln_backward_abs(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                              kiln_tensor **grad_in) {
    if (!grad_out[0] || !ctx->needs_grad[0]) return KILN_OK;
    kiln_tensor *x = ctx->in[0], *t[6] = {NULL};
    kiln_dtype dt = ctx->in_meta[0].dtype;
    kiln_tensor *zero = t[0] = scalar_like(ctx, 0.0, dt);
    kiln_tensor *pos = t[1] = zero ? kiln_gt(x, zero) : NULL;
    kiln_tensor *neg = t[2] = pos ? kiln_lt(x, zero) : NULL;
    kiln_tensor *pf = t[3] = neg ? kiln_cast(pos, dt) : NULL;
    kiln_tensor *nf = t[4] = pf ? kiln_cast(neg, dt) : NULL;
    kiln_tensor *sign = t[5] = nf ? kiln_sub(pf, nf) : NULL;
    kiln_status st = give(ctx, grad_in, 0, sign ? kiln_mul(grad_out[0], sign) : NULL);
    kiln_drop_all(6, t);
    return st;
}

/* The gradient passes where lo <= x <= hi (inclusive, as PyTorch). */
kiln_status kiln_backward_clamp(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                kiln_tensor **grad_in) {
    if (!grad_out[0] || !ctx->needs_grad[0]) return KILN_OK;
    kiln_tensor *x = ctx->in[0];
    kiln_dtype dt = ctx->in_meta[0].dtype;
    kiln_tensor *r = kiln_retain(grad_out[0]);
    kiln_tensor *zero = scalar_like(ctx, 0.0, dt);
    if (!zero) {
        kiln_tensor_drop(r);
        return kiln_error_last()->status;
    }
    for (int side = 0; side < 2 && r; side++) {
        if (!(ctx->attrs->flag & (1 << side))) continue;
        kiln_tensor *bound = scalar_like(ctx, ctx->attrs->scalar[side], dt);
        kiln_tensor *inside = bound ? (side == 0 ? kiln_ge(x, bound) : kiln_le(x, bound)) : NULL;
        kiln_tensor *next = inside ? kiln_where(inside, r, zero) : NULL;
        if (bound) kiln_tensor_drop(bound);
        if (inside) kiln_tensor_drop(inside);
        kiln_tensor_drop(r);
        r = next;
    }
    kiln_tensor_drop(zero);
    return give(ctx, grad_in, 0, r);
}

/* where(cond, a, b): a gets g where cond, b elsewhere. */
kiln_status kiln_backward_where(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                kiln_tensor **grad_in) {
    kiln_tensor *g = grad_out[0], *cond = ctx->in[0];
    if (!g) return KILN_OK;
    kiln_tensor *zero = scalar_like(ctx, 0.0, ctx->out_meta[0].dtype);
    KILN_TRY(check(zero));
    kiln_status st = KILN_OK;
    if (ctx->needs_grad[1]) st = give(ctx, grad_in, 1, kiln_where(cond, g, zero));
    if (!st && ctx->needs_grad[2]) st = give(ctx, grad_in, 2, kiln_where(cond, zero, g));
    kiln_tensor_drop(zero);
    return st;
}

/* The gradient converts back to the input's dtype. */
kiln_status kiln_backward_cast(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                               kiln_tensor **grad_in) {
    if (!grad_out[0] || !ctx->needs_grad[0]) return KILN_OK;
    return give(ctx, grad_in, 0, kiln_cast(grad_out[0], ctx->in_meta[0].dtype));
}

/* ---- Activations -------------------------------------------------------------------------- */

#define ACT_BACKWARD(name, OP, saved)                                                                        \
    kiln_status kiln_backward_##name(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,             \
                                     kiln_tensor **grad_in) {                                                \
        if (!grad_out[0] || !ctx->needs_grad[0]) return KILN_OK;                                             \
        return give(ctx, grad_in, 0, grad_op(ctx, KILN_OP_##OP, grad_out[0], saved));                        \
    }
ACT_BACKWARD(relu, RELU_BACKWARD, ctx->out[0])
ACT_BACKWARD(leaky_relu, LEAKY_RELU_BACKWARD, ctx->in[0])
ACT_BACKWARD(gelu, GELU_BACKWARD, ctx->in[0])
ACT_BACKWARD(sigmoid, SIGMOID_BACKWARD, ctx->out[0])
ACT_BACKWARD(tanh, TANH_BACKWARD, ctx->out[0])
ACT_BACKWARD(silu, SILU_BACKWARD, ctx->in[0])
#undef ACT_BACKWARD

/* The same dropout (same draw, same mask and scale) applied to g. */
kiln_status kiln_backward_dropout(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                  kiln_tensor **grad_in) {
    if (!grad_out[0] || !ctx->needs_grad[0]) return KILN_OK;
    kiln_op_attrs at = *ctx->attrs;
    kiln_tensor *out[KILN_OP_MAX_OUT] = {NULL};
    kiln_status st = kiln_dispatch(KILN_OP_DROPOUT, 1, (kiln_tensor *[]){grad_out[0]}, &at, ctx->device, out);
    if (st) return st;
    return give(ctx, grad_in, 0, out[0]);
}

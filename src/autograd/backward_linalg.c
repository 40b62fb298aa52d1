/* Backward formulas of mm, bmm and linear.
 *
 *   mm / bmm  ga = g b^T, gb = a^T g   (transposes are views)
 *   linear    with x and g as (M, in) / (M, out) rows:
 *             gx = g W, gW = g^T x, gb = sum of g's rows
 *   linear_act  the same with x flattened to (N, K) and, for relu,
 *             g' = relu_backward(g, out) in place of g */
#include "autograd/backward_util.h"
#include "base/error.h"
#include "kiln/ops.h"
#include "ops/op_backward.h"
#include "tensor/tensor_internal.h"

/* op(l, transpose(r)) or op(transpose(l), r) over the last two dims. */
static kiln_tensor *times_t(kiln_tensor *(*op)(kiln_tensor *, kiln_tensor *), kiln_tensor *l, kiln_tensor *r,
                            bool transpose_left) {
    kiln_tensor *t = transpose_left ? l : r;
    kiln_tensor *tt = kiln_transpose(t, -2, -1);
    if (!tt) return NULL;
    kiln_tensor *res = transpose_left ? op(tt, r) : op(l, tt);
    kiln_tensor_drop(tt);
    return res;
}

static kiln_status matmul_grads(kiln_tensor *(*op)(kiln_tensor *, kiln_tensor *),
                                const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                kiln_tensor **grad_in) {
    kiln_tensor *g = grad_out[0];
    if (!g) return KILN_OK;
    if (ctx->needs_grad[0] && !(grad_in[0] = times_t(op, g, ctx->in[1], false)))
        return kiln_error_last()->status;
    if (ctx->needs_grad[1] && !(grad_in[1] = times_t(op, ctx->in[0], g, true)))
        return kiln_error_last()->status;
    return KILN_OK;
}

kiln_status kiln_backward_mm(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                             kiln_tensor **grad_in) {
    return matmul_grads(kiln_mm, ctx, grad_out, grad_in);
}

kiln_status kiln_backward_bmm(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                              kiln_tensor **grad_in) {
    return matmul_grads(kiln_bmm, ctx, grad_out, grad_in);
}

static kiln_tensor *as_rows(kiln_tensor *t, int64_t cols) { return kiln_reshape(t, KILN_SHAPE(-1, cols)); }

kiln_status kiln_backward_linear(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                 kiln_tensor **grad_in) {
    kiln_tensor *g = grad_out[0];
    if (!g) return KILN_OK;
    const kiln_meta *xm = &ctx->in_meta[0], *wm = &ctx->in_meta[1];
    int64_t in_f = wm->shape[1], out_f = wm->shape[0];
    kiln_tensor *g2 = as_rows(g, out_f);
    if (!g2) return kiln_error_last()->status;
    kiln_status st = KILN_OK;
    if (ctx->needs_grad[0]) {
        kiln_tensor *gx = kiln_mm(g2, ctx->in[1]);
        grad_in[0] = gx ? kiln_reshape(gx, kiln_meta_shape(xm)) : NULL;
        if (gx) kiln_tensor_drop(gx);
        if (!grad_in[0]) st = kiln_error_last()->status;
    }
    if (!st && ctx->needs_grad[1]) {
        kiln_tensor *x2 = as_rows(ctx->in[0], in_f);
        grad_in[1] = x2 ? times_t(kiln_mm, g2, x2, true) : NULL;
        if (x2) kiln_tensor_drop(x2);
        if (!grad_in[1]) st = kiln_error_last()->status;
    }
    if (!st && ctx->n_in > 2 && ctx->needs_grad[2]) {
        grad_in[2] = kiln_sum(g2, 1, (int[]){0}, false);
        if (!grad_in[2]) st = kiln_error_last()->status;
    }
    kiln_tensor_drop(g2);
    return st;
}

/* linear_act: g' = relu_backward(g, out) for relu (else g), then linear's
 * gradients with x read as (N, K): gx = g' W reshaped to x's shape,
 * gW = g'^T x_flat, gb = sum(g', 0). */
kiln_status kiln_backward_linear_act(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                     kiln_tensor **grad_in) {
    if (!grad_out[0]) return KILN_OK;
    const kiln_meta *xm = &ctx->in_meta[0];
    int64_t K = ctx->in_meta[1].shape[1];
    kiln_tensor *g = NULL;
    if (ctx->attrs->flag == 1) {
        kiln_op_attrs at = {0};
        kiln_tensor *out[KILN_OP_MAX_OUT] = {NULL};
        if (!kiln_dispatch(KILN_OP_RELU_BACKWARD, 2, (kiln_tensor *[]){grad_out[0], ctx->out[0]}, &at,
                           ctx->device, out))
            g = out[0];
    } else {
        g = kiln_retain(grad_out[0]);
    }
    if (!g) return kiln_error_last()->status;
    kiln_status st = KILN_OK;
    if (ctx->needs_grad[0]) {
        kiln_tensor *gx = kiln_mm(g, ctx->in[1]);
        grad_in[0] = gx ? kiln_reshape(gx, kiln_meta_shape(xm)) : NULL;
        if (gx) kiln_tensor_drop(gx);
        if (!grad_in[0]) st = kiln_error_last()->status;
    }
    if (!st && ctx->needs_grad[1]) {
        kiln_tensor *x2 = as_rows(ctx->in[0], K);
        grad_in[1] = x2 ? times_t(kiln_mm, g, x2, true) : NULL;
        if (x2) kiln_tensor_drop(x2);
        if (!grad_in[1]) st = kiln_error_last()->status;
    }
    if (!st && ctx->n_in > 2 && ctx->needs_grad[2]) {
        grad_in[2] = kiln_sum(g, 1, (int[]){0}, false);
        if (!grad_in[2]) st = kiln_error_last()->status;
    }
    kiln_tensor_drop(g);
    return st;
}

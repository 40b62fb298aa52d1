/* Backward formulas of nll_loss and mse_loss.
 *
 *   nll_loss  the NLL_LOSS_BACKWARD kernel (label smoothing included); the
 *             class weights get no gradient, as in PyTorch
 *   mse_loss  gx = 2 (x - t) g / n (mean) or 2 (x - t) g; gt = -gx */
#include "autograd/backward_util.h"
#include "base/error.h"
#include "kiln/ops.h"
#include "ops/op_backward.h"
#include "tensor/tensor_internal.h"

kiln_status kiln_backward_nll_loss(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                   kiln_tensor **grad_in) {
    if (ctx->n_in > 2 && ctx->needs_grad[2])
        return KILN_RAISE(KILN_ERR_UNSUPPORTED,
                          "detach the class weights (kiln_detach) or clear their requires_grad",
                          "kiln_nll_loss: the class weights have no gradient, but they require one");
    if (!grad_out[0] || !ctx->needs_grad[0]) return KILN_OK;
    kiln_op_attrs at = *ctx->attrs;
    const kiln_meta *lp = &ctx->in_meta[0];
    at.n_ints = lp->ndim;
    for (int d = 0; d < lp->ndim; d++) at.ints[d] = lp->shape[d];
    kiln_tensor *in[] = {grad_out[0], ctx->in[1], ctx->in[2], ctx->out[1]};
    kiln_tensor *out[KILN_OP_MAX_OUT] = {NULL};
    KILN_TRY(kiln_dispatch(KILN_OP_NLL_LOSS_BACKWARD, 4, in, &at, ctx->device, out));
    grad_in[0] = out[0];
    return KILN_OK;
}

kiln_status kiln_backward_mse_loss(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                   kiln_tensor **grad_in) {
    if (!grad_out[0] || !(ctx->needs_grad[0] || ctx->needs_grad[1])) return KILN_OK;
    int64_t n = 1;
    for (int d = 0; d < ctx->in_meta[0].ndim; d++) n *= ctx->in_meta[0].shape[d];
    double factor = ctx->attrs->reduction == KILN_REDUCTION_MEAN ? 2.0 / (double)n : 2.0;
    kiln_tensor *diff = kiln_sub(ctx->in[0], ctx->in[1]);
    kiln_tensor *scaled = diff ? kiln_mul_scalar(diff, factor) : NULL;
    kiln_tensor *gx = scaled ? kiln_mul(scaled, grad_out[0]) : NULL;
    kiln_tensor *tmp[] = {diff, scaled};
    kiln_drop_all(2, tmp);
    if (!gx) return kiln_error_last()->status;
    if (ctx->needs_grad[1]) {
        grad_in[1] = kiln_neg(gx);
        if (!grad_in[1]) {
            kiln_tensor_drop(gx);
            return kiln_error_last()->status;
        }
    }
    if (ctx->needs_grad[0])
        grad_in[0] = gx;
    else
        kiln_tensor_drop(gx);
    return KILN_OK;
}

/* Backward formulas of the view rows and the dense copy. The tensor layer
 * records these through its view hook with the attrs documented beside
 * kiln_view_kind (tensor/tensor_internal.h): VIEW none (the input's shape
 * is in in_meta), PERMUTE dims, NARROW dims[0] and ints[0] (start), EXPAND
 * and COPY none. */
#include "autograd/backward_util.h"
#include "base/error.h"
#include "kiln/ops.h"
#include "ops/op_backward.h"
#include "tensor/scope.h"
#include "tensor/tensor_internal.h"

static kiln_status result(kiln_tensor **slot, kiln_tensor *g) {
    *slot = g;
    return g ? KILN_OK : kiln_error_last()->status;
}

/* The gradient reshaped to the input's shape. */
kiln_status kiln_backward_view(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                               kiln_tensor **grad_in) {
    if (!grad_out[0] || !ctx->needs_grad[0]) return KILN_OK;
    return result(&grad_in[0], kiln_reshape(grad_out[0], kiln_meta_shape(&ctx->in_meta[0])));
}

/* The inverse permutation: inv[dims[i]] = i. */
kiln_status kiln_backward_permute(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                  kiln_tensor **grad_in) {
    if (!grad_out[0] || !ctx->needs_grad[0]) return KILN_OK;
    int nd = ctx->in_meta[0].ndim, inv[KILN_MAX_DIMS];
    for (int i = 0; i < nd; i++) {
        int d;
        if (!kiln_wrap_dim(ctx->attrs->dims[i], nd, &d))
            return KILN_RAISE(KILN_ERR_INTERNAL, "report this", "kiln_permute backward: bad dim %d",
                              ctx->attrs->dims[i]);
        inv[d] = i;
    }
    return result(&grad_in[0], kiln_permute(grad_out[0], nd, inv));
}

/* Zeros of the input's shape with the gradient in the narrowed region
 * (grad mode is off in backward, so the in-place copy records nothing). */
kiln_status kiln_backward_narrow(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                 kiln_tensor **grad_in) {
    if (!grad_out[0] || !ctx->needs_grad[0]) return KILN_OK;
    int d = ctx->attrs->dims[0];
    kiln_tensor *z = kiln_grad_zeros(&ctx->in_meta[0], ctx->device);
    if (!z) return kiln_error_last()->status;
    kiln_tensor *part = kiln_narrow(z, d, ctx->attrs->ints[0], ctx->out_meta[0].shape[d]);
    kiln_status st = part ? kiln_copy_(part, grad_out[0], 0) : kiln_error_last()->status;
    if (part) kiln_tensor_drop(part);
    if (st) {
        kiln_tensor_drop(z);
        return st;
    }
    grad_in[0] = z;
    return KILN_OK;
}

kiln_status kiln_backward_expand(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                 kiln_tensor **grad_in) {
    if (!grad_out[0] || !ctx->needs_grad[0]) return KILN_OK;
    return result(&grad_in[0], kiln_sum_to_shape(grad_out[0], &ctx->in_meta[0]));
}

kiln_status kiln_backward_copy(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                               kiln_tensor **grad_in) {
    if (!grad_out[0] || !ctx->needs_grad[0]) return KILN_OK;
    kiln_tensor *g = kiln_sum_to_shape(grad_out[0], &ctx->in_meta[0]);
    /* kiln_to across devices or dtypes: back to the source's (ctx->device
     * is the input's device). A peer copy is ordered by the runtime against
     * both devices' current streams. */
    if (g && (!kiln_device_equal(kiln_get_device(g), ctx->device) || kiln_dtype_of(g) != ctx->in_meta[0].dtype)) {
        kiln_tensor *moved = kiln_to(g, ctx->device, ctx->in_meta[0].dtype, 0);
        kiln_tensor_drop(g);
        g = moved;
    }
    return result(&grad_in[0], g);
}

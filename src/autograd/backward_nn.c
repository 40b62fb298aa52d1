/* Backward formulas of convolution, pooling and batch norm. Each calls the
 * op's dedicated gradient op through the dispatcher (so it runs on every
 * backend and on meta) and hands back gradients with the inputs' shapes
 * and dtypes. A NULL grad_out means zeros. */
#include "autograd/backward_util.h"
#include "base/error.h"
#include "kernels/nn_geometry.h"
#include "kiln/ops.h"
#include "ops/op_backward.h"
#include "tensor/tensor_internal.h"

/* out[0] of op, the other outputs dropped; NULL with the error set. */
static kiln_tensor *run1(kiln_op_id op, int n_in, kiln_tensor *const *in, kiln_op_attrs *at,
                         kiln_device dev) {
    kiln_tensor *out[KILN_OP_MAX_OUT] = {NULL};
    if (kiln_dispatch(op, n_in, in, at, dev, out)) return NULL;
    const kiln_op_info *info = kiln_op_info_get(op);
    for (int i = 1; i < info->n_out; i++) kiln_tensor_drop(out[i]);
    return out[0];
}

/* Give a result the input's dtype (and check it landed); takes t. */
static kiln_status finish(kiln_tensor *t, const kiln_meta *m, kiln_tensor **slot) {
    if (!t) return kiln_error_last()->status;
    *slot = kiln_sum_to_shape(t, m);
    kiln_tensor_drop(t);
    return *slot ? KILN_OK : kiln_error_last()->status;
}

/* Zeros for every input that needs a gradient (grad_out was NULL). */
static kiln_status all_zeros(const kiln_backward_ctx *ctx, kiln_tensor **grad_in) {
    for (int i = 0; i < ctx->n_in; i++) {
        if (!ctx->needs_grad[i]) continue;
        grad_in[i] = kiln_grad_zeros(&ctx->in_meta[i], ctx->device);
        if (!grad_in[i]) return kiln_error_last()->status;
    }
    return KILN_OK;
}

static void set_shape_attr(kiln_op_attrs *at, const kiln_meta *m) {
    for (int i = 0; i < m->ndim; i++) at->ints[i] = m->shape[i];
    at->n_ints = m->ndim;
}

/* conv2d's gradients for grad_out g (not NULL): conv2d_grad_input only
 * when x needs one (the first layer's input usually does not). bias_sum:
 * the bias gradient when the caller has it already, else NULL (the sum of
 * g over N, H and W). */
static kiln_status conv2d_grads(const kiln_backward_ctx *ctx, kiln_tensor *g, kiln_tensor *bias_sum,
                                kiln_tensor **grad_in) {
    kiln_op_attrs at = *ctx->attrs;
    if (ctx->needs_grad[0]) {
        set_shape_attr(&at, &ctx->in_meta[0]);
        kiln_tensor *r =
            run1(KILN_OP_CONV2D_GRAD_INPUT, 2, (kiln_tensor *[]){g, ctx->in[1]}, &at, ctx->device);
        KILN_TRY(finish(r, &ctx->in_meta[0], &grad_in[0]));
    }
    if (ctx->needs_grad[1]) {
        set_shape_attr(&at, &ctx->in_meta[1]);
        kiln_tensor *r =
            run1(KILN_OP_CONV2D_GRAD_WEIGHT, 2, (kiln_tensor *[]){g, ctx->in[0]}, &at, ctx->device);
        KILN_TRY(finish(r, &ctx->in_meta[1], &grad_in[1]));
    }
    if (ctx->n_in > 2 && ctx->needs_grad[2]) {
        static const int dims[3] = {0, 2, 3};
        KILN_TRY(finish(bias_sum ? kiln_retain(bias_sum) : kiln_sum(g, 3, dims, false), &ctx->in_meta[2],
                        &grad_in[2]));
    }
    return KILN_OK;
}

kiln_status kiln_backward_conv2d(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                 kiln_tensor **grad_in) {
    kiln_tensor *g = grad_out[0];
    if (!g) return all_zeros(ctx, grad_in);
    return conv2d_grads(ctx, g, NULL, grad_in);
}

/* relu's backward of g through the saved output out[0]: g where out > 0. */
static kiln_tensor *relu_grad(const kiln_backward_ctx *ctx, kiln_tensor *g) {
    kiln_op_attrs at = {0};
    return run1(KILN_OP_RELU_BACKWARD, 2, (kiln_tensor *[]){g, ctx->out[0]}, &at, ctx->device);
}

/* conv2d_relu: g' = relu_backward(g, out), then exactly conv2d's gradients. */
kiln_status kiln_backward_conv2d_relu(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                      kiln_tensor **grad_in) {
    if (!grad_out[0]) return all_zeros(ctx, grad_in);
    kiln_tensor *g = relu_grad(ctx, grad_out[0]);
    if (!g) return kiln_error_last()->status;
    kiln_status st = conv2d_grads(ctx, g, NULL, grad_in);
    kiln_tensor_drop(g);
    return st;
}

/* conv2d_relu_max_pool2d: the pooling's backward (relu's fused) into the
 * convolution's output shape, then exactly conv2d's gradients; with a bias
 * that needs its gradient, the pooling's backward is
 * relu_max_pool2d_backward_sum, which gives it from the pooled gradients
 * in the same pass. When x needs no gradient (a first layer), the weight
 * and bias gradients are one op, conv2d_relu_max_pool2d_grad_weight. */
kiln_status kiln_backward_conv2d_relu_max_pool2d(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                                 kiln_tensor **grad_in) {
    if (!grad_out[0]) return all_zeros(ctx, grad_in);
    const kiln_meta *x = &ctx->in_meta[0], *w = &ctx->in_meta[1];
    kiln_conv_geom cg = kiln_conv_geom_of(ctx->attrs);
    int64_t p = ctx->attrs->kernel[0];
    kiln_op_attrs at = {.kernel = {p, p}, .stride = {p, p}, .n_ints = 4};
    at.ints[0] = x->shape[0], at.ints[1] = w->shape[0];
    for (int i = 0; i < 2; i++)
        at.ints[2 + i] = kiln_conv_out_size(x->shape[2 + i], w->shape[2 + i], cg.stride[i], cg.padding[i],
                                            cg.dilation[i]);
    kiln_tensor *in[3] = {grad_out[0], ctx->out[0], ctx->out[1]};
    if (!ctx->needs_grad[0] && ctx->needs_grad[1]) { /* a first layer: one op from the pooled gradient */
        kiln_op_attrs wat = *ctx->attrs;
        set_shape_attr(&wat, w);
        kiln_tensor *out[KILN_OP_MAX_OUT] = {NULL};
        kiln_tensor *win[4] = {grad_out[0], ctx->out[0], ctx->out[1], ctx->in[0]};
        if (kiln_dispatch(KILN_OP_CONV2D_RELU_MAX_POOL2D_GRAD_WEIGHT, 4, win, &wat, ctx->device, out))
            return kiln_error_last()->status;
        kiln_status st = finish(out[0], w, &grad_in[1]);
        if (st == KILN_OK && ctx->n_in > 2 && ctx->needs_grad[2])
            st = finish(kiln_retain(out[1]), &ctx->in_meta[2], &grad_in[2]);
        kiln_tensor_drop(out[1]);
        return st;
    }
    if (ctx->n_in > 2 && ctx->needs_grad[2]) {
        kiln_tensor *out[KILN_OP_MAX_OUT] = {NULL};
        if (kiln_dispatch(KILN_OP_RELU_MAX_POOL2D_BACKWARD_SUM, 3, in, &at, ctx->device, out))
            return kiln_error_last()->status;
        kiln_status st = conv2d_grads(ctx, out[0], out[1], grad_in);
        kiln_tensor_drop(out[0]);
        kiln_tensor_drop(out[1]);
        return st;
    }
    kiln_tensor *g = run1(KILN_OP_RELU_MAX_POOL2D_BACKWARD, 3, in, &at, ctx->device);
    if (!g) return kiln_error_last()->status;
    kiln_status st = conv2d_grads(ctx, g, NULL, grad_in);
    kiln_tensor_drop(g);
    return st;
}

/* The three pooling backwards share one shape: grad_input from grad_out
 * (and the indices for max pooling), the input shape in attrs.ints. */
static kiln_status pool_backward(kiln_op_id op, const kiln_backward_ctx *ctx, kiln_tensor *g,
                                 kiln_tensor *indices, kiln_tensor **grad_in) {
    if (!ctx->needs_grad[0]) return KILN_OK;
    if (!g) return all_zeros(ctx, grad_in);
    kiln_op_attrs at = *ctx->attrs;
    set_shape_attr(&at, &ctx->in_meta[0]);
    kiln_tensor *in[2] = {g, indices};
    return finish(run1(op, indices ? 2 : 1, in, &at, ctx->device), &ctx->in_meta[0], &grad_in[0]);
}

kiln_status kiln_backward_max_pool2d(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                     kiln_tensor **grad_in) {
    return pool_backward(KILN_OP_MAX_POOL2D_BACKWARD, ctx, grad_out[0], ctx->out[1], grad_in);
}

/* relu_max_pool2d: one op scatters the gradients whose y > 0 (relu's
 * backward and max pooling's fused), from the saved y and indices. */
kiln_status kiln_backward_relu_max_pool2d(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                          kiln_tensor **grad_in) {
    if (!ctx->needs_grad[0]) return KILN_OK;
    kiln_tensor *g = grad_out[0];
    if (!g) return all_zeros(ctx, grad_in);
    kiln_op_attrs at = *ctx->attrs;
    set_shape_attr(&at, &ctx->in_meta[0]);
    kiln_tensor *in[3] = {g, ctx->out[0], ctx->out[1]};
    return finish(run1(KILN_OP_RELU_MAX_POOL2D_BACKWARD, 3, in, &at, ctx->device), &ctx->in_meta[0],
                  &grad_in[0]);
}

kiln_status kiln_backward_avg_pool2d(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                     kiln_tensor **grad_in) {
    return pool_backward(KILN_OP_AVG_POOL2D_BACKWARD, ctx, grad_out[0], NULL, grad_in);
}

kiln_status kiln_backward_adaptive_avg_pool2d(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                              kiln_tensor **grad_in) {
    return pool_backward(KILN_OP_ADAPTIVE_AVG_POOL2D_BACKWARD, ctx, grad_out[0], NULL, grad_in);
}

/* Gradients flow to x, weight and bias through y only; the statistics
 * outputs (mean, invstd) and the running statistics get none. In eval
 * mode the saved mean/invstd are the running ones, and BATCH_NORM_BACKWARD
 * uses the affine formula (attrs.training false). */
kiln_status kiln_backward_batch_norm(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                     kiln_tensor **grad_in) {
    kiln_tensor *g = grad_out[0];
    if (!g) {
        for (int i = 0; i < 3 && i < ctx->n_in; i++) {
            if (!ctx->needs_grad[i]) continue;
            grad_in[i] = kiln_grad_zeros(&ctx->in_meta[i], ctx->device);
            if (!grad_in[i]) return kiln_error_last()->status;
        }
        return KILN_OK;
    }
    kiln_op_attrs at = *ctx->attrs;
    kiln_tensor *in[5] = {g, ctx->in[0], ctx->in[1], ctx->out[1], ctx->out[2]};
    kiln_tensor *out[KILN_OP_MAX_OUT] = {NULL};
    KILN_TRY(kiln_dispatch(KILN_OP_BATCH_NORM_BACKWARD, 5, in, &at, ctx->device, out));
    kiln_status st = KILN_OK;
    for (int i = 0; i < 3; i++) {
        kiln_tensor *r = out[i];
        out[i] = NULL;
        if (!st && i < ctx->n_in && ctx->needs_grad[i] && ctx->in_meta[i].ndim > 0) {
            st = finish(r, &ctx->in_meta[i], &grad_in[i]);
        } else {
            kiln_tensor_drop(r);
        }
    }
    return st;
}

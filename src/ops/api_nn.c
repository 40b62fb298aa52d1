/* Public API of convolution, pooling and batch norm (include/kiln/ops.h):
 * each call fills the op's attributes and goes through the dispatcher. */
#include <math.h>

#include "base/error.h"
#include "kiln/ops.h"
#include "ops/op_registry.h"
#include "tensor/scope.h"

static kiln_op_attrs conv_attrs(const kiln_conv2d_opts *opts) {
    kiln_op_attrs at = {.stride = {1, 1}, .dilation = {1, 1}, .groups = 1};
    if (opts) {
        for (int i = 0; i < 2; i++) {
            at.stride[i] = opts->stride[i] ? opts->stride[i] : 1;
            at.padding[i] = opts->padding[i];
            at.dilation[i] = opts->dilation[i] ? opts->dilation[i] : 1;
        }
        at.groups = opts->groups ? opts->groups : 1;
    }
    return at;
}

kiln_tensor *(kiln_conv2d)(kiln_tensor *x, kiln_tensor *weight, kiln_tensor *bias,
                           const kiln_conv2d_opts *opts) {
    kiln_op_attrs at = conv_attrs(opts);
    return kiln_dispatch_public(KILN_OP_CONV2D, 3, (kiln_tensor *[]){x, weight, bias}, &at, NULL);
}

kiln_tensor *(kiln_conv2d_relu)(kiln_tensor *x, kiln_tensor *weight, kiln_tensor *bias,
                                const kiln_conv2d_opts *opts) {
    kiln_op_attrs at = conv_attrs(opts);
    return kiln_dispatch_public(KILN_OP_CONV2D_RELU, 3, (kiln_tensor *[]){x, weight, bias}, &at, NULL);
}

kiln_tensor *(kiln_conv2d_relu_max_pool2d)(kiln_tensor *x, kiln_tensor *weight, kiln_tensor *bias,
                                           const kiln_conv2d_opts *opts, int64_t pool, kiln_tensor **indices) {
    kiln_op_attrs at = conv_attrs(opts);
    at.kernel[0] = at.kernel[1] = pool;
    if (indices) *indices = NULL;
    kiln_tensor *aux[1] = {NULL};
    kiln_tensor *y = kiln_dispatch_public(KILN_OP_CONV2D_RELU_MAX_POOL2D, 3, (kiln_tensor *[]){x, weight, bias}, &at,
                                          indices ? aux : NULL);
    if (indices) *indices = aux[0];
    return y;
}

kiln_pool2d_opts kiln_pool2d_defaults(int64_t kernel) {
    kiln_pool2d_opts o = {.kernel = {kernel, kernel}, .stride = {kernel, kernel}, .count_include_pad = true};
    return o;
}

static kiln_status pool_attrs(const char *fn, const kiln_pool2d_opts *opts, kiln_op_attrs *at) {
    if (!opts)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass options, e.g. from kiln_pool2d_defaults(2)",
                          "%s: opts is NULL", fn);
    for (int i = 0; i < 2; i++) {
        at->kernel[i] = opts->kernel[i];
        at->stride[i] = opts->stride[i] ? opts->stride[i] : opts->kernel[i];
        at->padding[i] = opts->padding[i];
    }
    at->ceil_mode = opts->ceil_mode;
    at->count_include_pad = opts->count_include_pad;
    return KILN_OK;
}

kiln_tensor *(kiln_max_pool2d)(kiln_tensor *x, const kiln_pool2d_opts *opts, kiln_tensor **indices) {
    kiln_op_attrs at = {0};
    if (indices) *indices = NULL;
    if (pool_attrs("kiln_max_pool2d", opts, &at)) return NULL;
    kiln_tensor *aux[1] = {NULL};
    kiln_tensor *y = kiln_dispatch_public(KILN_OP_MAX_POOL2D, 1, &x, &at, indices ? aux : NULL);
    if (indices) *indices = aux[0];
    return y;
}

kiln_tensor *(kiln_relu_max_pool2d)(kiln_tensor *x, const kiln_pool2d_opts *opts, kiln_tensor **indices) {
    kiln_op_attrs at = {0};
    if (indices) *indices = NULL;
    if (pool_attrs("kiln_relu_max_pool2d", opts, &at)) return NULL;
    kiln_tensor *aux[1] = {NULL};
    kiln_tensor *y = kiln_dispatch_public(KILN_OP_RELU_MAX_POOL2D, 1, &x, &at, indices ? aux : NULL);
    if (indices) *indices = aux[0];
    return y;
}

kiln_tensor *(kiln_avg_pool2d)(kiln_tensor *x, const kiln_pool2d_opts *opts) {
    kiln_op_attrs at = {0};
    if (pool_attrs("kiln_avg_pool2d", opts, &at)) return NULL;
    return kiln_dispatch_public(KILN_OP_AVG_POOL2D, 1, &x, &at, NULL);
}

kiln_tensor *(kiln_adaptive_avg_pool2d)(kiln_tensor *x, int64_t out_h, int64_t out_w) {
    kiln_op_attrs at = {.ints = {out_h, out_w}, .n_ints = 2};
    return kiln_dispatch_public(KILN_OP_ADAPTIVE_AVG_POOL2D, 1, &x, &at, NULL);
}

kiln_tensor *(kiln_batch_norm)(kiln_tensor *x, kiln_tensor *weight, kiln_tensor *bias,
                               kiln_tensor *running_mean, kiln_tensor *running_var, bool training,
                               double momentum, double eps) {
    if (isnan(momentum)) momentum = -1; /* no update */
    kiln_op_attrs at = {.training = training, .momentum = momentum, .eps = eps};
    return kiln_dispatch_public(KILN_OP_BATCH_NORM, 5,
                                (kiln_tensor *[]){x, weight, bias, running_mean, running_var}, &at, NULL);
}

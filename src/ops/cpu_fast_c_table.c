/* The plain-C fast CPU kernel table (kernels/cpu/fast/): f32 kernels (and
 * bf16 pooling for autocast) on contiguous tensors that need no library,
 * consulted after the oneDNN table and before the reference kernels. Built in every configuration.
 * Pooling, ReLU, addition and the bias-gradient sum also take oneDNN's nChw16c
 * layout (blocked_fast.c): the entries below pick the kernel by the
 * inputs' layout and pass the layout on to their outputs. The bf16 fused
 * convolution-pooling of images with few channels (conv_pool_bf16.c) is here
 * too: the oneDNN table leaves those shapes to it. */
#include <pthread.h>

#include "kernels/cpu/fast/fast_kernels.h"
#include "ops/cpu_tables.h"

#define F32 KILN_DT(KILN_F32)
#define BF16 KILN_DT(KILN_BF16)

static bool blocked_in(const kiln_op_args *a, int i) { return kiln_layout_block(a->in[i].layout) != 0; }

static kiln_status max_pool2d(const kiln_op_args *a) {
    return blocked_in(a, 0) ? kiln_blocked_max_pool2d(a) : kiln_fast_max_pool2d(a);
}
static bool max_pool2d_supports(const kiln_op_args *a) {
    return blocked_in(a, 0) ? kiln_blocked_max_pool2d_supports(a) : kiln_fast_max_pool2d_supports(a);
}
static kiln_status max_pool2d_backward(const kiln_op_args *a) {
    return blocked_in(a, 1) ? kiln_blocked_max_pool2d_backward(a) : kiln_fast_max_pool2d_backward(a);
}
static bool max_pool2d_backward_supports(const kiln_op_args *a) {
    if (blocked_in(a, 1)) return kiln_blocked_max_pool2d_backward_supports(a);
    return !blocked_in(a, 0) && kiln_fast_max_pool2d_backward_supports(a);
}
static kiln_status relu_max_pool2d(const kiln_op_args *a) {
    if (a->in[0].dtype == KILN_BF16) return kiln_bf16_relu_max_pool2d(a);
    return blocked_in(a, 0) ? kiln_blocked_relu_max_pool2d(a) : kiln_fast_relu_max_pool2d(a);
}
static bool relu_max_pool2d_supports(const kiln_op_args *a) {
    return a->in[0].dtype == KILN_BF16 ? kiln_bf16_relu_max_pool2d_supports(a) : max_pool2d_supports(a);
}
static kiln_status relu_max_pool2d_backward(const kiln_op_args *a) {
    return blocked_in(a, 2) ? kiln_blocked_relu_max_pool2d_backward(a) : kiln_fast_relu_max_pool2d_backward(a);
}
static bool relu_max_pool2d_backward_supports(const kiln_op_args *a) {
    if (a->n_in >= 3 && blocked_in(a, 2)) return kiln_blocked_relu_max_pool2d_backward_supports(a);
    return !blocked_in(a, 0) && !blocked_in(a, 1) && kiln_fast_relu_max_pool2d_backward_supports(a);
}
static kiln_status sum(const kiln_op_args *a) { return blocked_in(a, 0) ? kiln_blocked_sum(a) : kiln_fast_sum(a); }
static bool sum_supports(const kiln_op_args *a) {
    return blocked_in(a, 0) ? kiln_blocked_sum_supports(a) : kiln_fast_sum_supports(a);
}
static size_t sum_workspace(const kiln_op_args *a) { return blocked_in(a, 0) ? 0 : kiln_fast_sum_workspace(a); }

static kiln_op_kernel fast_c_table[KILN_OP_COUNT];
static pthread_once_t fast_c_table_once = PTHREAD_ONCE_INIT;

static void build_fast_c_table(void) {
    fast_c_table[KILN_OP_MAX_POOL2D] =
        (kiln_op_kernel){max_pool2d, NULL, F32, max_pool2d_supports, kiln_blocked_same_as_input};
    fast_c_table[KILN_OP_MAX_POOL2D_BACKWARD] = (kiln_op_kernel){
        max_pool2d_backward, NULL, F32, max_pool2d_backward_supports, kiln_blocked_pool_backward_layout};
    fast_c_table[KILN_OP_RELU_MAX_POOL2D] =
        (kiln_op_kernel){relu_max_pool2d, NULL, F32 | BF16, relu_max_pool2d_supports, kiln_blocked_same_as_input};
    fast_c_table[KILN_OP_RELU_MAX_POOL2D_BACKWARD] =
        (kiln_op_kernel){relu_max_pool2d_backward, NULL, F32, relu_max_pool2d_backward_supports,
                         kiln_blocked_relu_pool_backward_layout};
    fast_c_table[KILN_OP_RELU_MAX_POOL2D_BACKWARD_SUM] =
        (kiln_op_kernel){kiln_fast_relu_max_pool2d_backward_sum, kiln_fast_relu_max_pool2d_backward_sum_workspace,
                         F32 | BF16, kiln_fast_relu_max_pool2d_backward_sum_supports,
                         kiln_fast_relu_max_pool2d_backward_sum_layout};
    fast_c_table[KILN_OP_BATCH_NORM] = (kiln_op_kernel){kiln_fast_batch_norm, NULL, F32, kiln_fast_batch_norm_supports,
                                                        kiln_fast_bn_layout};
    fast_c_table[KILN_OP_BATCH_NORM_BACKWARD] =
        (kiln_op_kernel){kiln_fast_batch_norm_backward, NULL, F32, kiln_fast_batch_norm_backward_supports,
                         kiln_fast_bn_backward_layout};
    fast_c_table[KILN_OP_RELU] =
        (kiln_op_kernel){kiln_fast_relu, NULL, F32, kiln_fast_relu_supports, kiln_blocked_relu_layout};
    fast_c_table[KILN_OP_RELU_BACKWARD] = (kiln_op_kernel){kiln_fast_relu_backward, NULL, F32,
                                                           kiln_fast_relu_backward_supports, kiln_blocked_relu_layout};
    fast_c_table[KILN_OP_RELU_] =
        (kiln_op_kernel){kiln_fast_relu, NULL, F32, kiln_fast_relu_supports, kiln_blocked_relu_layout};
    fast_c_table[KILN_OP_ADD] =
        (kiln_op_kernel){kiln_fast_add, NULL, F32, kiln_fast_add_supports, kiln_blocked_relu_layout};
    fast_c_table[KILN_OP_ADD_] =
        (kiln_op_kernel){kiln_fast_add, NULL, F32, kiln_fast_add_supports, kiln_blocked_relu_layout};
    fast_c_table[KILN_OP_SUM] = (kiln_op_kernel){sum, sum_workspace, F32, sum_supports, kiln_blocked_strided_out};
    /* bf16 first layers (few channels); the oneDNN table declines these shapes in bf16 */
    fast_c_table[KILN_OP_CONV2D_RELU_MAX_POOL2D] =
        (kiln_op_kernel){kiln_bf16_conv_pool_smallc, kiln_bf16_conv_pool_smallc_workspace, BF16,
                         kiln_bf16_conv_pool_smallc_supports};
    fast_c_table[KILN_OP_CONV2D_RELU_MAX_POOL2D_GRAD_WEIGHT] =
        (kiln_op_kernel){kiln_bf16_conv_pool_smallc_grad_weight, kiln_bf16_conv_pool_smallc_grad_weight_workspace,
                         BF16, kiln_bf16_conv_pool_smallc_grad_weight_supports};
}

const kiln_op_kernel *kiln_cpu_fast_c_op_kernels(void) {
    pthread_once(&fast_c_table_once, build_fast_c_table);
    return fast_c_table;
}

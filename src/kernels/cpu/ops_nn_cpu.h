/* The CPU kernels of the nn op group (ops_conv.c, ops_pool.c,
 * ops_batchnorm.c, ops_shape.c), registered by src/ops/cpu_table_nn.c.
 * Each has the kiln_op_kernel_fn / kiln_op_workspace_fn signature. */
#ifndef KILN_SRC_KERNELS_CPU_OPS_NN_CPU_H
#define KILN_SRC_KERNELS_CPU_OPS_NN_CPU_H

#include "kernels/op_args.h"

kiln_status kiln_cpu_conv2d(const kiln_op_args *a);
kiln_status kiln_cpu_conv2d_relu(const kiln_op_args *a); /* conv2d's workspace fn */
kiln_status kiln_cpu_conv2d_grad_input(const kiln_op_args *a);
kiln_status kiln_cpu_conv2d_grad_weight(const kiln_op_args *a);
size_t kiln_cpu_conv2d_workspace(const kiln_op_args *a);
size_t kiln_cpu_conv2d_grad_input_workspace(const kiln_op_args *a);
size_t kiln_cpu_conv2d_grad_weight_workspace(const kiln_op_args *a);
/* conv2d, then relu_max_pool2d, the convolution's output in the workspace */
kiln_status kiln_cpu_conv2d_relu_max_pool2d(const kiln_op_args *a);
size_t kiln_cpu_conv2d_relu_max_pool2d_workspace(const kiln_op_args *a);

kiln_status kiln_cpu_max_pool2d(const kiln_op_args *a);
kiln_status kiln_cpu_max_pool2d_backward(const kiln_op_args *a);
kiln_status kiln_cpu_relu_max_pool2d(const kiln_op_args *a);
kiln_status kiln_cpu_relu_max_pool2d_backward(const kiln_op_args *a); /* pool backward workspace */
kiln_status kiln_cpu_relu_max_pool2d_backward_sum(const kiln_op_args *a); /* pool backward workspace */
kiln_status kiln_cpu_conv2d_relu_max_pool2d_grad_weight(const kiln_op_args *a);
size_t kiln_cpu_conv2d_relu_max_pool2d_grad_weight_workspace(const kiln_op_args *a);
kiln_status kiln_cpu_avg_pool2d(const kiln_op_args *a);
kiln_status kiln_cpu_avg_pool2d_backward(const kiln_op_args *a);
kiln_status kiln_cpu_adaptive_avg_pool2d(const kiln_op_args *a);
kiln_status kiln_cpu_adaptive_avg_pool2d_backward(const kiln_op_args *a);
/* One (H, W) plane of doubles: the pooling backwards' accumulator. */
size_t kiln_cpu_pool_backward_workspace(const kiln_op_args *a);

kiln_status kiln_cpu_batch_norm(const kiln_op_args *a);
kiln_status kiln_cpu_batch_norm_backward(const kiln_op_args *a);

kiln_status kiln_cpu_cat(const kiln_op_args *a);
kiln_status kiln_cpu_gather(const kiln_op_args *a);
kiln_status kiln_cpu_scatter_add(const kiln_op_args *a);
size_t kiln_cpu_scatter_add_workspace(const kiln_op_args *a);
kiln_status kiln_cpu_pad(const kiln_op_args *a);
kiln_status kiln_cpu_flip(const kiln_op_args *a);
kiln_status kiln_cpu_embedding(const kiln_op_args *a);
kiln_status kiln_cpu_embedding_backward(const kiln_op_args *a);
size_t kiln_cpu_embedding_backward_workspace(const kiln_op_args *a);
kiln_status kiln_cpu_randperm(const kiln_op_args *a);

#endif

/* The nn group's rows of the CUDA reference kernel table: convolution,
 * pooling, batch norm, shape and indexing ops (kernels/cuda/ops_conv.cu,
 * ops_pool.cu, ops_nn.cu, ops_index.cu). */
#include "kernels/cuda/cuda_ops.h"
#include "ops/cuda_tables.h"

#define FLOAT   KILN_DT_FLOAT
#define ALL     KILN_DT_ALL
#define NUMERIC (KILN_DT_FLOAT | KILN_DT_INT)

void kiln_cuda_fill_nn(kiln_op_kernel *t) {
    t[KILN_OP_CONV2D] = (kiln_op_kernel){kiln_cuda_conv2d, NULL, FLOAT};
    t[KILN_OP_CONV2D_RELU] = (kiln_op_kernel){kiln_cuda_conv2d_relu, NULL, FLOAT};
    t[KILN_OP_CONV2D_GRAD_INPUT] = (kiln_op_kernel){kiln_cuda_conv2d_grad_input, NULL, FLOAT};
    t[KILN_OP_CONV2D_GRAD_WEIGHT] =
        (kiln_op_kernel){kiln_cuda_conv2d_grad_weight, kiln_cuda_conv2d_grad_weight_workspace, FLOAT};
    t[KILN_OP_MAX_POOL2D] = (kiln_op_kernel){kiln_cuda_max_pool2d, NULL, FLOAT};
    t[KILN_OP_MAX_POOL2D_BACKWARD] = (kiln_op_kernel){kiln_cuda_max_pool2d_backward, NULL, FLOAT};
    t[KILN_OP_RELU_MAX_POOL2D] = (kiln_op_kernel){kiln_cuda_relu_max_pool2d, NULL, FLOAT};
    t[KILN_OP_CONV2D_RELU_MAX_POOL2D] =
        (kiln_op_kernel){kiln_cuda_conv2d_relu_max_pool2d, kiln_cuda_conv2d_relu_max_pool2d_workspace, FLOAT};
    t[KILN_OP_RELU_MAX_POOL2D_BACKWARD] = (kiln_op_kernel){kiln_cuda_relu_max_pool2d_backward, NULL, FLOAT};
    t[KILN_OP_CONV2D_RELU_MAX_POOL2D_GRAD_WEIGHT] =
        (kiln_op_kernel){kiln_cuda_conv2d_relu_max_pool2d_grad_weight,
                         kiln_cuda_conv2d_relu_max_pool2d_grad_weight_workspace, FLOAT};
    t[KILN_OP_RELU_MAX_POOL2D_BACKWARD_SUM] =
        (kiln_op_kernel){kiln_cuda_relu_max_pool2d_backward_sum, NULL, FLOAT};
    t[KILN_OP_AVG_POOL2D] = (kiln_op_kernel){kiln_cuda_avg_pool2d, NULL, FLOAT};
    t[KILN_OP_AVG_POOL2D_BACKWARD] = (kiln_op_kernel){kiln_cuda_avg_pool2d_backward, NULL, FLOAT};
    t[KILN_OP_ADAPTIVE_AVG_POOL2D] = (kiln_op_kernel){kiln_cuda_adaptive_avg_pool2d, NULL, FLOAT};
    t[KILN_OP_ADAPTIVE_AVG_POOL2D_BACKWARD] =
        (kiln_op_kernel){kiln_cuda_adaptive_avg_pool2d_backward, NULL, FLOAT};
    t[KILN_OP_BATCH_NORM] = (kiln_op_kernel){kiln_cuda_batch_norm, NULL, FLOAT};
    t[KILN_OP_BATCH_NORM_BACKWARD] = (kiln_op_kernel){kiln_cuda_batch_norm_backward, NULL, FLOAT};
    t[KILN_OP_CAT] = (kiln_op_kernel){kiln_cuda_cat, NULL, ALL};
    t[KILN_OP_GATHER] = (kiln_op_kernel){kiln_cuda_gather, kiln_cuda_index_check_workspace, ALL};
    t[KILN_OP_SCATTER_ADD] =
        (kiln_op_kernel){kiln_cuda_scatter_add, kiln_cuda_index_check_workspace, NUMERIC};
    t[KILN_OP_PAD] = (kiln_op_kernel){kiln_cuda_pad, NULL, ALL};
    t[KILN_OP_FLIP] = (kiln_op_kernel){kiln_cuda_flip, NULL, ALL};
    t[KILN_OP_EMBEDDING] = (kiln_op_kernel){kiln_cuda_embedding, kiln_cuda_index_check_workspace, ALL};
    t[KILN_OP_EMBEDDING_BACKWARD] =
        (kiln_op_kernel){kiln_cuda_embedding_backward, kiln_cuda_embedding_backward_workspace, FLOAT};
    t[KILN_OP_RANDPERM] =
        (kiln_op_kernel){kiln_cuda_randperm, kiln_cuda_randperm_workspace, KILN_DT(KILN_I64)};
}

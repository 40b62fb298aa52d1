/* The nn group's rows of the CPU reference kernel table: convolution,
 * pooling, batch norm, shape and indexing ops (kernels/cpu/ops_*.c). */
#include "kernels/cpu/ops_nn_cpu.h"
#include "ops/cpu_tables.h"

#define FLOAT   KILN_DT_FLOAT
#define ALL     KILN_DT_ALL
#define NUMERIC (KILN_DT_FLOAT | KILN_DT_INT)

void kiln_cpu_fill_nn(kiln_op_kernel *t) {
    t[KILN_OP_CONV2D] = (kiln_op_kernel){kiln_cpu_conv2d, kiln_cpu_conv2d_workspace, FLOAT};
    t[KILN_OP_CONV2D_GRAD_INPUT] =
        (kiln_op_kernel){kiln_cpu_conv2d_grad_input, kiln_cpu_conv2d_grad_input_workspace, FLOAT};
    t[KILN_OP_CONV2D_GRAD_WEIGHT] =
        (kiln_op_kernel){kiln_cpu_conv2d_grad_weight, kiln_cpu_conv2d_grad_weight_workspace, FLOAT};
    t[KILN_OP_CONV2D_RELU] = (kiln_op_kernel){kiln_cpu_conv2d_relu, kiln_cpu_conv2d_workspace, FLOAT};
    t[KILN_OP_MAX_POOL2D] = (kiln_op_kernel){kiln_cpu_max_pool2d, NULL, FLOAT};
    t[KILN_OP_MAX_POOL2D_BACKWARD] =
        (kiln_op_kernel){kiln_cpu_max_pool2d_backward, kiln_cpu_pool_backward_workspace, FLOAT};
    t[KILN_OP_RELU_MAX_POOL2D] = (kiln_op_kernel){kiln_cpu_relu_max_pool2d, NULL, FLOAT};
    t[KILN_OP_CONV2D_RELU_MAX_POOL2D] =
        (kiln_op_kernel){kiln_cpu_conv2d_relu_max_pool2d, kiln_cpu_conv2d_relu_max_pool2d_workspace, FLOAT};
    t[KILN_OP_RELU_MAX_POOL2D_BACKWARD] =
        (kiln_op_kernel){kiln_cpu_relu_max_pool2d_backward, kiln_cpu_pool_backward_workspace, FLOAT};
    t[KILN_OP_CONV2D_RELU_MAX_POOL2D_GRAD_WEIGHT] =
        (kiln_op_kernel){kiln_cpu_conv2d_relu_max_pool2d_grad_weight,
                         kiln_cpu_conv2d_relu_max_pool2d_grad_weight_workspace, FLOAT};
    t[KILN_OP_RELU_MAX_POOL2D_BACKWARD_SUM] =
        (kiln_op_kernel){kiln_cpu_relu_max_pool2d_backward_sum, kiln_cpu_pool_backward_workspace, FLOAT};
    t[KILN_OP_AVG_POOL2D] = (kiln_op_kernel){kiln_cpu_avg_pool2d, NULL, FLOAT};
    t[KILN_OP_AVG_POOL2D_BACKWARD] =
        (kiln_op_kernel){kiln_cpu_avg_pool2d_backward, kiln_cpu_pool_backward_workspace, FLOAT};
    t[KILN_OP_ADAPTIVE_AVG_POOL2D] = (kiln_op_kernel){kiln_cpu_adaptive_avg_pool2d, NULL, FLOAT};
    t[KILN_OP_ADAPTIVE_AVG_POOL2D_BACKWARD] =
        (kiln_op_kernel){kiln_cpu_adaptive_avg_pool2d_backward, kiln_cpu_pool_backward_workspace, FLOAT};
    t[KILN_OP_BATCH_NORM] = (kiln_op_kernel){kiln_cpu_batch_norm, NULL, FLOAT};
    t[KILN_OP_BATCH_NORM_BACKWARD] = (kiln_op_kernel){kiln_cpu_batch_norm_backward, NULL, FLOAT};
    t[KILN_OP_CAT] = (kiln_op_kernel){kiln_cpu_cat, NULL, ALL};
    t[KILN_OP_GATHER] = (kiln_op_kernel){kiln_cpu_gather, NULL, ALL};
    t[KILN_OP_SCATTER_ADD] = (kiln_op_kernel){kiln_cpu_scatter_add, kiln_cpu_scatter_add_workspace, NUMERIC};
    t[KILN_OP_PAD] = (kiln_op_kernel){kiln_cpu_pad, NULL, ALL};
    t[KILN_OP_FLIP] = (kiln_op_kernel){kiln_cpu_flip, NULL, ALL};
    t[KILN_OP_EMBEDDING] = (kiln_op_kernel){kiln_cpu_embedding, NULL, ALL};
    t[KILN_OP_EMBEDDING_BACKWARD] =
        (kiln_op_kernel){kiln_cpu_embedding_backward, kiln_cpu_embedding_backward_workspace, FLOAT};
    t[KILN_OP_RANDPERM] = (kiln_op_kernel){kiln_cpu_randperm, NULL, KILN_DT(KILN_I64)};
}

/* The reduce group's rows of the CUDA reference kernel table: reductions,
 * softmax, losses, linear algebra (kernels/cuda/ops_reduce.cu,
 * ops_softmax.cu, ops_loss.cu, ops_gemm.cu). The dtype masks are those of
 * out[0], the CPU table's (cpu_table_reduce.c). */
#include "kernels/cuda/cuda_ops.h"
#include "ops/cuda_tables.h"

void kiln_cuda_fill_reduce(kiln_op_kernel *t) {
    const uint32_t fl = KILN_DT_FLOAT;
    t[KILN_OP_SUM] = (kiln_op_kernel){kiln_cuda_sum, kiln_cuda_reduce_workspace, fl | KILN_DT(KILN_I64)};
    t[KILN_OP_MEAN] = (kiln_op_kernel){kiln_cuda_mean, kiln_cuda_reduce_workspace, fl};
    t[KILN_OP_AMAX] = (kiln_op_kernel){kiln_cuda_amax, kiln_cuda_reduce_workspace, KILN_DT_ALL};
    t[KILN_OP_AMIN] = (kiln_op_kernel){kiln_cuda_amin, kiln_cuda_reduce_workspace, KILN_DT_ALL};
    t[KILN_OP_ARGMAX] = (kiln_op_kernel){kiln_cuda_argmax, kiln_cuda_reduce_workspace, KILN_DT(KILN_I64)};
    t[KILN_OP_NORM] = (kiln_op_kernel){kiln_cuda_norm, kiln_cuda_reduce_workspace, fl};
    t[KILN_OP_SOFTMAX] = (kiln_op_kernel){kiln_cuda_softmax, NULL, fl};
    t[KILN_OP_LOG_SOFTMAX] = (kiln_op_kernel){kiln_cuda_log_softmax, NULL, fl};
    t[KILN_OP_SOFTMAX_BACKWARD] = (kiln_op_kernel){kiln_cuda_softmax_backward, NULL, fl};
    t[KILN_OP_LOG_SOFTMAX_BACKWARD] = (kiln_op_kernel){kiln_cuda_log_softmax_backward, NULL, fl};
    t[KILN_OP_NLL_LOSS] = (kiln_op_kernel){kiln_cuda_nll_loss, kiln_cuda_nll_loss_workspace, fl};
    t[KILN_OP_NLL_LOSS_BACKWARD] = (kiln_op_kernel){kiln_cuda_nll_loss_backward, NULL, fl};
    t[KILN_OP_MSE_LOSS] = (kiln_op_kernel){kiln_cuda_mse_loss, kiln_cuda_mse_loss_workspace, fl};
    t[KILN_OP_MM] = (kiln_op_kernel){kiln_cuda_mm, NULL, fl};
    t[KILN_OP_BMM] = (kiln_op_kernel){kiln_cuda_bmm, NULL, fl};
    t[KILN_OP_LINEAR] = (kiln_op_kernel){kiln_cuda_linear, NULL, fl};
    t[KILN_OP_LINEAR_ACT] = (kiln_op_kernel){kiln_cuda_linear_act, NULL, fl};
}

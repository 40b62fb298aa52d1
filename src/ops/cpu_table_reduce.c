/* The reduce group's rows of the CPU reference kernel table: reductions,
 * softmax, losses, linear algebra. The dtype masks are those of out[0]. */
#include "kernels/cpu/reduce_kernels.h"
#include "ops/cpu_tables.h"

void kiln_cpu_fill_reduce(kiln_op_kernel *t) {
    const uint32_t fl = KILN_DT_FLOAT;
    t[KILN_OP_SUM] = (kiln_op_kernel){kiln_cpu_sum, NULL, fl | KILN_DT(KILN_I64)};
    t[KILN_OP_MEAN] = (kiln_op_kernel){kiln_cpu_mean, NULL, fl};
    t[KILN_OP_AMAX] = (kiln_op_kernel){kiln_cpu_amax, NULL, KILN_DT_ALL};
    t[KILN_OP_AMIN] = (kiln_op_kernel){kiln_cpu_amin, NULL, KILN_DT_ALL};
    t[KILN_OP_ARGMAX] = (kiln_op_kernel){kiln_cpu_argmax, NULL, KILN_DT(KILN_I64)};
    t[KILN_OP_NORM] = (kiln_op_kernel){kiln_cpu_norm, NULL, fl};
    t[KILN_OP_SOFTMAX] = (kiln_op_kernel){kiln_cpu_softmax, NULL, fl};
    t[KILN_OP_LOG_SOFTMAX] = (kiln_op_kernel){kiln_cpu_log_softmax, NULL, fl};
    t[KILN_OP_SOFTMAX_BACKWARD] = (kiln_op_kernel){kiln_cpu_softmax_backward, NULL, fl};
    t[KILN_OP_LOG_SOFTMAX_BACKWARD] = (kiln_op_kernel){kiln_cpu_log_softmax_backward, NULL, fl};
    t[KILN_OP_NLL_LOSS] = (kiln_op_kernel){kiln_cpu_nll_loss, NULL, fl};
    t[KILN_OP_NLL_LOSS_BACKWARD] = (kiln_op_kernel){kiln_cpu_nll_loss_backward, NULL, fl};
    t[KILN_OP_MSE_LOSS] = (kiln_op_kernel){kiln_cpu_mse_loss, NULL, fl};
    t[KILN_OP_MM] = (kiln_op_kernel){kiln_cpu_mm, kiln_cpu_mm_workspace, fl};
    t[KILN_OP_BMM] = (kiln_op_kernel){kiln_cpu_bmm, kiln_cpu_mm_workspace, fl};
    t[KILN_OP_LINEAR] = (kiln_op_kernel){kiln_cpu_linear, NULL, fl};
    t[KILN_OP_LINEAR_ACT] = (kiln_op_kernel){kiln_cpu_linear_act, kiln_cpu_linear_act_workspace, fl};
}

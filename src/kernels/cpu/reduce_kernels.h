/* The CPU reference kernels of the reduce group: reductions, softmax,
 * losses and linear algebra (ops_reduce.c, ops_softmax.c, ops_loss.c,
 * ops_linalg.c). Each has the kiln_op_kernel_fn signature; the table fill
 * function src/ops/cpu_table_reduce.c maps ops.def rows to them. */
#ifndef KILN_SRC_KERNELS_CPU_REDUCE_KERNELS_H
#define KILN_SRC_KERNELS_CPU_REDUCE_KERNELS_H

#include "kernels/op_args.h"

/* Reductions over attrs.dims (n_dims 0: all), keepdim. */
kiln_status kiln_cpu_sum(const kiln_op_args *a);
kiln_status kiln_cpu_mean(const kiln_op_args *a);
kiln_status kiln_cpu_amax(const kiln_op_args *a);
kiln_status kiln_cpu_amin(const kiln_op_args *a);
kiln_status kiln_cpu_argmax(const kiln_op_args *a);
kiln_status kiln_cpu_norm(const kiln_op_args *a); /* p = attrs.scalar[0] */

/* Along attrs.dims[0]. */
kiln_status kiln_cpu_softmax(const kiln_op_args *a);
kiln_status kiln_cpu_log_softmax(const kiln_op_args *a);
kiln_status kiln_cpu_softmax_backward(const kiln_op_args *a);     /* (grad, out) */
kiln_status kiln_cpu_log_softmax_backward(const kiln_op_args *a); /* (grad, out) */

kiln_status kiln_cpu_nll_loss(const kiln_op_args *a);
kiln_status kiln_cpu_nll_loss_backward(const kiln_op_args *a);
kiln_status kiln_cpu_mse_loss(const kiln_op_args *a);

kiln_status kiln_cpu_mm(const kiln_op_args *a);
kiln_status kiln_cpu_bmm(const kiln_op_args *a);
kiln_status kiln_cpu_linear(const kiln_op_args *a);
kiln_status kiln_cpu_linear_act(const kiln_op_args *a);
size_t kiln_cpu_linear_act_workspace(const kiln_op_args *a);
size_t kiln_cpu_mm_workspace(const kiln_op_args *a);

#endif

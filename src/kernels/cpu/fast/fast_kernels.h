/* Fast CPU kernels in plain C (no oneDNN): f32 on contiguous tensors,
 * parallel over OpenMP threads where the build has OpenMP. Each has a
 * supports fn; what it declines runs the reference kernel. Entries of the
 * fast CPU table (src/ops/cpu_fast_table.c). */
#ifndef KILN_SRC_KERNELS_CPU_FAST_FAST_KERNELS_H
#define KILN_SRC_KERNELS_CPU_FAST_FAST_KERNELS_H

#include "base/error.h"
#include "kernels/op_args.h"

kiln_status kiln_fast_max_pool2d(const kiln_op_args *a);
bool kiln_fast_max_pool2d_supports(const kiln_op_args *a);
kiln_status kiln_fast_max_pool2d_backward(const kiln_op_args *a);
bool kiln_fast_max_pool2d_backward_supports(const kiln_op_args *a);

kiln_status kiln_fast_relu(const kiln_op_args *a);
bool kiln_fast_relu_supports(const kiln_op_args *a);
kiln_status kiln_fast_relu_backward(const kiln_op_args *a);
bool kiln_fast_relu_backward_supports(const kiln_op_args *a);

kiln_status kiln_fast_sum(const kiln_op_args *a);
bool kiln_fast_sum_supports(const kiln_op_args *a);
size_t kiln_fast_sum_workspace(const kiln_op_args *a);

#endif

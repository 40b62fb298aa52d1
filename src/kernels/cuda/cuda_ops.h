/* The CUDA op kernel table: the same kiln_op_kernel entries as the CPU
 * reference table (op_args.h), filled by one function per op group. Each
 * group's kernels live in src/kernels/cuda/ops_*.cu; the table is
 * assembled in src/ops/cuda_kernels_cuda.c and registered by kiln_init for
 * KILN_DEVICE_CUDA. tests/ops/test_op_coverage checks it complete in CUDA
 * builds (real and emulated).
 *
 * Kernel entries are called by the dispatcher with views of device memory
 * and args->stream (a cudaStream_t of the output's device). They enqueue
 * work on that stream and return without waiting for it (they never block
 * the host), allocate nothing (scratch comes from their workspace fn), and
 * check every launch (KILN_LAUNCH_CHECK). */
#ifndef KILN_SRC_KERNELS_CUDA_CUDA_OPS_H
#define KILN_SRC_KERNELS_CUDA_CUDA_OPS_H

#include "kernels/op_args.h"

#ifdef __cplusplus
extern "C" {
#endif

/* elementwise arithmetic, comparisons, where/clamp/cast, activations and
 * their backward ops, dropout, copy and the in-place ops */
void kiln_cuda_fill_elementwise(kiln_op_kernel *table);
/* reductions, softmax/log-softmax (+ backward), losses (+ backward),
 * mm/bmm/linear */
void kiln_cuda_fill_reduce(kiln_op_kernel *table);
/* conv2d (+ grads), pooling (+ backward), batch norm (+ backward), cat,
 * gather, scatter_add, pad, flip, embedding (+ backward), randperm */
void kiln_cuda_fill_nn(kiln_op_kernel *table);

/* The assembled table (src/ops/cuda_kernels_cuda.c). */
const kiln_op_kernel *kiln_cuda_op_kernels(void);

#ifdef __cplusplus
}
#endif
#endif

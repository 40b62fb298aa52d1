/* The CUDA kernel tables, built like the CPU's (cpu_tables.h): the kernels
 * in src/kernels/cuda/ are plain functions (cuda_ops.h, cuda_fast.h) that
 * know nothing of op ids; the rows that point each op at them live here in
 * src/ops/, one fill function per op group, assembled by
 * cuda_kernels_cuda.c. Compiled only with the CUDA backend (real or
 * emulated); the tables are checked complete by tests/ops/test_op_coverage. */
#ifndef KILN_SRC_OPS_CUDA_TABLES_H
#define KILN_SRC_OPS_CUDA_TABLES_H

#include "ops/op_registry.h"

void kiln_cuda_fill_elementwise(kiln_op_kernel *table); /* arithmetic, activations, copy, dropout */
void kiln_cuda_fill_reduce(kiln_op_kernel *table);      /* reductions, softmax, losses, linear algebra */
void kiln_cuda_fill_nn(kiln_op_kernel *table);          /* conv, pooling, batch norm, shape and indexing */

/* The CUDA reference table: the hand-written kernels (cuda_kernels_cuda.c),
 * registered by kiln_init for KILN_DEVICE_CUDA. */
const kiln_op_kernel *kiln_cuda_op_kernels(void);

/* The CUDA fast table (cuda_fast_table_cublas.c, real CUDA build only; the
 * emulation build has neither library and registers none): cuBLASLt and
 * cuDNN (kernels/cuda/cuda_fast.h) in front of the hand-written kernels,
 * registered by kiln_init unless KILN_CUDA_KERNELS=reference. When a
 * library call fails at run time the table's entry runs the hand-written
 * kernel instead, after one warning line per op and process; each entry's
 * workspace is at least the hand-written kernel's, so that fallback always
 * has it. */
const kiln_op_kernel *kiln_cuda_fast_op_kernels(void);
/* Frees the libraries' handles, cached descriptors and persistent
 * workspaces (kiln_shutdown, before the runtime goes). Blocks the host
 * until each device's work is done. */
void kiln_cuda_fast_kernels_shutdown(void);
/* How many times a library path of op fell back to the hand-written kernel
 * since the process started (the comparison test checks the fast path
 * really ran). */
uint64_t kiln_cuda_fast_fallbacks(kiln_op_id op);

#endif

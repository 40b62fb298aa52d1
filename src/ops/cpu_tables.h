/* The CPU reference kernel table is assembled from one fill function per
 * op group; each lives beside its group's kernels' mapping in src/ops/ and
 * sets table[KILN_OP_X] for the ops of its group. Weak, so that a build
 * with a group still missing links and the coverage test names the gap. */
#ifndef KILN_SRC_OPS_CPU_TABLES_H
#define KILN_SRC_OPS_CPU_TABLES_H

#include "ops/op_registry.h"

__attribute__((weak)) void kiln_cpu_fill_elementwise(kiln_op_kernel *table); /* arithmetic, activations, views' copy, dropout */
__attribute__((weak)) void kiln_cpu_fill_reduce(kiln_op_kernel *table);      /* reductions, softmax, losses, linear algebra */
__attribute__((weak)) void kiln_cpu_fill_nn(kiln_op_kernel *table);          /* conv, pooling, batch norm, shape and indexing */

#endif

/* The CPU reference kernel table is assembled from one fill function per
 * op group; each lives beside its group's kernels' mapping in src/ops/ and
 * sets table[KILN_OP_X] for the ops of its group. The table is
 * checked complete by tests/ops/test_op_coverage. */
#ifndef KILN_SRC_OPS_CPU_TABLES_H
#define KILN_SRC_OPS_CPU_TABLES_H

#include "ops/op_registry.h"

void kiln_cpu_fill_elementwise(kiln_op_kernel *table); /* arithmetic, activations, views' copy, dropout */
void kiln_cpu_fill_reduce(kiln_op_kernel *table);      /* reductions, softmax, losses, linear algebra */
void kiln_cpu_fill_nn(kiln_op_kernel *table);          /* conv, pooling, batch norm, shape and indexing */

/* The fast CPU table (cpu_fast_table.c): oneDNN kernels for the ops it
 * covers, consulted before the reference table (kiln_ops_select_kernel).
 * NULL when this build has no fast kernels (KILN_WITH_ONEDNN off). */
const kiln_op_kernel *kiln_cpu_fast_op_kernels(void);
/* The plain-C fast table (cpu_fast_c_table.c, kernels/cpu/fast/): f32
 * kernels needing no library, consulted after the oneDNN table. Never NULL. */
const kiln_op_kernel *kiln_cpu_fast_c_op_kernels(void);
/* Frees what the fast kernels cached (primitives, engine); kiln_shutdown. */
void kiln_cpu_fast_kernels_shutdown(void);

#endif

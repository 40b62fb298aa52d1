/* Helpers shared by the backward formulas (autograd/backward_*.c). They
 * use public ops only, so they run on every backend and on meta, and
 * they return new references the caller drops with kiln_tensor_drop. */
#ifndef KILN_SRC_AUTOGRAD_BACKWARD_UTIL_H
#define KILN_SRC_AUTOGRAD_BACKWARD_UTIL_H

#include "ops/op_registry.h"

/* The gradient of a broadcast input: g summed over the leading dims the
 * broadcast added and over the dims where target has size 1 but g does
 * not, reshaped to target's shape and converted to target's dtype. A g
 * that already matches comes back as a new reference to itself. NULL with
 * the error set on failure. */
kiln_tensor *kiln_sum_to_shape(kiln_tensor *g, const kiln_meta *target);

/* Zeros with m's shape and dtype on device d (a gradient that is known to
 * be zero, e.g. for a NULL grad_out). */
kiln_tensor *kiln_grad_zeros(const kiln_meta *m, kiln_device d);

/* kiln_shape of a meta. */
kiln_shape kiln_meta_shape(const kiln_meta *m);

/* Drop every non-NULL reference of ts[0..n). */
void kiln_drop_all(int n, kiln_tensor **ts);

#endif

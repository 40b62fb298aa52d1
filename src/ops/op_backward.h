/* Backward formulas of the op list (autograd/backward_*.c): each has the
 * kiln_backward_fn signature of op_registry.h. NONE marks ops without one. */
#ifndef KILN_SRC_OPS_OP_BACKWARD_H
#define KILN_SRC_OPS_OP_BACKWARD_H

#include "ops/op_registry.h"

/* Rows without a backward name NONE: their declaration of kiln_NONE is
 * harmless (never defined, never called); tables map it to NULL. */
#define KILN_BACKWARD_DECL(fn)                                                                     \
    kiln_status kiln_##fn(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out, kiln_tensor **grad_in);
#define KILN_OP(ID, name, n_in, n_out, prec, flags, save, infer, backward) KILN_BACKWARD_DECL(backward)
#include "ops/ops.def"
#undef KILN_OP

#endif

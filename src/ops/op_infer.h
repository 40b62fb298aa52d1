/* Inference functions of the op list (ops/infer_*.c). Each has the
 * kiln_infer_fn signature of op_registry.h. */
#ifndef KILN_SRC_OPS_OP_INFER_H
#define KILN_SRC_OPS_OP_INFER_H

#include "ops/op_registry.h"

/* Strong references: a static-library user's link pulls every op's
 * inference in (tests/ops/test_op_coverage checks none is missing). */
#define KILN_INFER_DECL(fn)                                                                        \
    kiln_status kiln_##fn(const char *op, const kiln_op_attrs *attrs, int n_in, kiln_tensor *const *in, \
                          kiln_meta *out, kiln_dtype *in_dtype);
#define KILN_OP(ID, name, n_in, n_out, prec, flags, save, infer, backward) KILN_INFER_DECL(infer)
#include "ops/ops.def"
#undef KILN_OP

/* Shared helpers. */
/* NumPy broadcasting of two shapes into out; error names op and shapes. */
kiln_status kiln_broadcast_shapes(const char *op, int nda, const int64_t *a, int ndb, const int64_t *b,
                                  int *nd_out, int64_t *out);
/* The common dtype of two inputs (PyTorch's type promotion for tensors:
 * bool < u8 < i32 < i64 < f16/bf16 < f32 < f64; f16 with bf16 gives f32). */
kiln_dtype kiln_promote_types(kiln_dtype a, kiln_dtype b);
/* Copy a tensor's dtype and shape into a meta. */
void kiln_meta_of(const kiln_tensor *t, kiln_meta *m);
/* A layer op (linear, conv2d): an error when x's floating dtype differs
 * from the weight's or the bias's (b may be NULL), as in PyTorch. */
kiln_status kiln_infer_layer_dtypes(const char *op, const kiln_tensor *x, const kiln_tensor *w,
                                    const kiln_tensor *b);

#endif

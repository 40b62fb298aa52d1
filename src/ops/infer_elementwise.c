/* Shape and dtype inference of the elementwise group: arithmetic with
 * broadcasting and PyTorch's type promotion, unary ops, comparisons,
 * where, cast, activations' backward ops, in-place ops and the views'
 * rows (the tensor layer makes views itself; these describe them for the
 * meta device and the docs). */
#include <math.h>
#include <string.h>

#include "base/error.h"
#include "ops/op_infer.h"
#include "tensor/tensor_internal.h"

/* ---- Type promotion with PyTorch's dimension categories ------------------------------
 * A 0-dim tensor operand takes part in promotion only when its category
 * (bool < integer < floating) is higher than that of the dimensioned
 * operands: f16 tensor * f32 scalar tensor stays f16, i32 tensor * f64
 * scalar tensor is f64 (torch.result_type). */

static int category(kiln_dtype d) {
    if (d == KILN_BOOL) return 0;
    return kiln_dtype_is_floating(d) ? 2 : 1;
}

static kiln_dtype result_type(const kiln_tensor *a, const kiln_tensor *b) {
    bool za = a->ndim == 0, zb = b->ndim == 0;
    if (za == zb) return kiln_promote_types(a->dtype, b->dtype);
    kiln_dtype dim = za ? b->dtype : a->dtype, zero = za ? a->dtype : b->dtype;
    if (category(zero) > category(dim)) return kiln_promote_types(dim, zero);
    return dim;
}

static void set_meta(kiln_meta *m, kiln_dtype dtype, int ndim, const int64_t *shape) {
    memset(m, 0, sizeof *m);
    m->dtype = dtype;
    m->ndim = ndim;
    memcpy(m->shape, shape, sizeof(int64_t) * (size_t)ndim);
}

static kiln_status need_inputs(const char *op, int n_in, kiln_tensor *const *in, int want) {
    if (n_in != want)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "%s: %d inputs given, expected %d", op, n_in,
                          want);
    for (int i = 0; i < want; i++)
        if (!in[i])
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass a tensor", "%s: input %d is NULL", op, i);
    return KILN_OK;
}

/* ---- Binary -------------------------------------------------------------------------------- */

kiln_status kiln_infer_binary(const char *op, const kiln_op_attrs *attrs, int n_in, kiln_tensor *const *in,
                              kiln_meta *out, kiln_dtype *in_dtype) {
    (void)attrs;
    KILN_TRY(need_inputs(op, n_in, in, 2));
    int nd;
    int64_t shape[KILN_MAX_DIMS];
    KILN_TRY(kiln_broadcast_shapes(op, in[0]->ndim, in[0]->shape, in[1]->ndim, in[1]->shape, &nd, shape));
    kiln_dtype dt = result_type(in[0], in[1]);
    set_meta(&out[0], dt, nd, shape);
    in_dtype[0] = in_dtype[1] = dt;
    return KILN_OK;
}

/* div and pow: integer operands compute in f32, as PyTorch's true division. */
kiln_status kiln_infer_binary_float(const char *op, const kiln_op_attrs *attrs, int n_in,
                                    kiln_tensor *const *in, kiln_meta *out, kiln_dtype *in_dtype) {
    KILN_TRY(kiln_infer_binary(op, attrs, n_in, in, out, in_dtype));
    if (!kiln_dtype_is_floating(out[0].dtype)) out[0].dtype = in_dtype[0] = in_dtype[1] = KILN_F32;
    return KILN_OK;
}

kiln_status kiln_infer_compare(const char *op, const kiln_op_attrs *attrs, int n_in, kiln_tensor *const *in,
                               kiln_meta *out, kiln_dtype *in_dtype) {
    KILN_TRY(kiln_infer_binary(op, attrs, n_in, in, out, in_dtype));
    out[0].dtype = KILN_BOOL;
    return KILN_OK;
}

/* a += b / a *= b: b must broadcast to a's shape, and the promoted type
 * must be castable to a's dtype the way PyTorch allows (no floating result
 * into an integer tensor, nothing but bool into a bool tensor). The
 * arithmetic runs in a's dtype. */
kiln_status kiln_infer_inplace_binary(const char *op, const kiln_op_attrs *attrs, int n_in,
                                      kiln_tensor *const *in, kiln_meta *out, kiln_dtype *in_dtype) {
    (void)attrs;
    KILN_TRY(need_inputs(op, n_in, in, 2));
    const kiln_tensor *a = in[0], *b = in[1];
    int nd;
    int64_t shape[KILN_MAX_DIMS];
    KILN_TRY(kiln_broadcast_shapes(op, a->ndim, a->shape, b->ndim, b->shape, &nd, shape));
    if (nd != a->ndim || memcmp(shape, a->shape, sizeof(int64_t) * (size_t)nd)) {
        char sa[128], sb[128];
        return KILN_RAISE(
            KILN_ERR_INVALID_ARGUMENT, "use the out-of-place op, or expand the tensor written to",
            "%s: the operand of shape %s does not broadcast to the shape %s of the tensor written "
            "in place",
            op, kiln_shape_format(b->ndim, b->shape, sb, sizeof sb),
            kiln_shape_format(a->ndim, a->shape, sa, sizeof sa));
    }
    kiln_dtype r = result_type(a, b);
    bool bad = (kiln_dtype_is_floating(r) && !kiln_dtype_is_floating(a->dtype)) ||
               (a->dtype == KILN_BOOL && r != KILN_BOOL);
    if (bad)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                          "use the out-of-place op, or convert the tensor with kiln_to",
                          "%s: result type %s cannot be written in place into a %s tensor", op,
                          kiln_dtype_name(r), kiln_dtype_name(a->dtype));
    set_meta(&out[0], a->dtype, a->ndim, a->shape);
    in_dtype[0] = in_dtype[1] = a->dtype;
    return KILN_OK;
}

/* ---- Unary ----------------------------------------------------------------------------------- */

static bool is_integral_value(double s) { return isfinite(s) && s == floor(s); }

/* Same shape and dtype. add_scalar/mul_scalar follow PyTorch's scalar
 * promotion: an integer or bool tensor with a non-integral scalar gives
 * f32, a bool tensor with an integral one gives i64. */
kiln_status kiln_infer_unary(const char *op, const kiln_op_attrs *attrs, int n_in, kiln_tensor *const *in,
                             kiln_meta *out, kiln_dtype *in_dtype) {
    KILN_TRY(need_inputs(op, n_in, in, 1));
    kiln_dtype dt = in[0]->dtype;
    bool scalar_op = !strcmp(op, "kiln_add_scalar") || !strcmp(op, "kiln_mul_scalar");
    if (scalar_op && !kiln_dtype_is_floating(dt)) {
        if (!is_integral_value(attrs->scalar[0]))
            dt = KILN_F32;
        else if (dt == KILN_BOOL)
            dt = KILN_I64;
    }
    set_meta(&out[0], dt, in[0]->ndim, in[0]->shape);
    in_dtype[0] = dt;
    return KILN_OK;
}

/* Floating results: integer and bool inputs compute in f32. */
kiln_status kiln_infer_unary_float(const char *op, const kiln_op_attrs *attrs, int n_in,
                                   kiln_tensor *const *in, kiln_meta *out, kiln_dtype *in_dtype) {
    (void)attrs;
    KILN_TRY(need_inputs(op, n_in, in, 1));
    kiln_dtype dt = kiln_dtype_is_floating(in[0]->dtype) ? in[0]->dtype : KILN_F32;
    set_meta(&out[0], dt, in[0]->ndim, in[0]->shape);
    in_dtype[0] = dt;
    return KILN_OK;
}

kiln_status kiln_infer_predicate(const char *op, const kiln_op_attrs *attrs, int n_in, kiln_tensor *const *in,
                                 kiln_meta *out, kiln_dtype *in_dtype) {
    (void)attrs, (void)in_dtype;
    KILN_TRY(need_inputs(op, n_in, in, 1));
    set_meta(&out[0], KILN_BOOL, in[0]->ndim, in[0]->shape);
    return KILN_OK;
}

kiln_status kiln_infer_cast(const char *op, const kiln_op_attrs *attrs, int n_in, kiln_tensor *const *in,
                            kiln_meta *out, kiln_dtype *in_dtype) {
    (void)in_dtype;
    KILN_TRY(need_inputs(op, n_in, in, 1));
    if ((unsigned)attrs->dtype >= KILN_DTYPE_COUNT)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass a kiln_dtype value (KILN_F32, ...)",
                          "%s: invalid target dtype %d", op, (int)attrs->dtype);
    set_meta(&out[0], attrs->dtype, in[0]->ndim, in[0]->shape);
    return KILN_OK;
}

/* where(cond, a, b): the three shapes broadcast; cond is read as bool. */
kiln_status kiln_infer_where(const char *op, const kiln_op_attrs *attrs, int n_in, kiln_tensor *const *in,
                             kiln_meta *out, kiln_dtype *in_dtype) {
    (void)attrs;
    KILN_TRY(need_inputs(op, n_in, in, 3));
    int nd;
    int64_t shape[KILN_MAX_DIMS];
    KILN_TRY(kiln_broadcast_shapes(op, in[0]->ndim, in[0]->shape, in[1]->ndim, in[1]->shape, &nd, shape));
    KILN_TRY(kiln_broadcast_shapes(op, nd, shape, in[2]->ndim, in[2]->shape, &nd, shape));
    kiln_dtype dt = result_type(in[1], in[2]);
    set_meta(&out[0], dt, nd, shape);
    in_dtype[0] = KILN_BOOL;
    in_dtype[1] = in_dtype[2] = dt;
    return KILN_OK;
}

/* (grad, t) -> a tensor like grad; t must have grad's shape and is read in
 * grad's dtype. */
kiln_status kiln_infer_grad_like(const char *op, const kiln_op_attrs *attrs, int n_in, kiln_tensor *const *in,
                                 kiln_meta *out, kiln_dtype *in_dtype) {
    (void)attrs;
    KILN_TRY(need_inputs(op, n_in, in, 2));
    const kiln_tensor *g = in[0], *t = in[1];
    if (g->ndim != t->ndim || memcmp(g->shape, t->shape, sizeof(int64_t) * (size_t)g->ndim)) {
        char sa[128], sb[128];
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass the gradient of the forward's output",
                          "%s: gradient shape %s differs from the saved tensor's shape %s", op,
                          kiln_shape_format(g->ndim, g->shape, sa, sizeof sa),
                          kiln_shape_format(t->ndim, t->shape, sb, sizeof sb));
    }
    kiln_dtype dt = kiln_dtype_is_floating(g->dtype) ? g->dtype : KILN_F32;
    set_meta(&out[0], dt, g->ndim, g->shape);
    in_dtype[0] = in_dtype[1] = dt;
    return KILN_OK;
}

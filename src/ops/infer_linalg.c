/* Shape and dtype inference for mm, bmm and linear. mm and bmm promote
 * their operands to the common floating dtype; linear, a layer, refuses an
 * input whose floating dtype differs from its weight's (as PyTorch does):
 * an f16 model given an f32 batch would otherwise run silently in f32. */
#include <string.h>

#include "base/error.h"
#include "ops/op_infer.h"
#include "tensor/tensor_internal.h"

static kiln_status common_float(const char *op, int n, kiln_tensor *const *in, kiln_dtype *in_dtype,
                                kiln_dtype *dt) {
    kiln_dtype d = in[0]->dtype;
    for (int i = 1; i < n; i++)
        if (in[i]) d = kiln_promote_types(d, in[i]->dtype);
    if (!kiln_dtype_is_floating(d))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                          "convert the operands to a floating dtype with kiln_cast",
                          "%s: needs floating operands, got %s", op, kiln_dtype_name(d));
    for (int i = 0; i < n; i++)
        if (in[i]) in_dtype[i] = d;
    *dt = d;
    return KILN_OK;
}

kiln_status kiln_infer_layer_dtypes(const char *op, const kiln_tensor *x, const kiln_tensor *w,
                                    const kiln_tensor *b) {
    const kiln_tensor *other = w->dtype != x->dtype ? w : b && b->dtype != x->dtype ? b : NULL;
    if (!other || !kiln_dtype_is_floating(x->dtype) || !kiln_dtype_is_floating(other->dtype)) return KILN_OK;
    return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                      "give the input the parameters' dtype: kiln_cast the batch, kiln_module_to the model, or run "
                      "the forward under kiln_autocast_begin",
                      "%s: the input is %s but the %s is %s", op, kiln_dtype_name(x->dtype),
                      other == w ? "weight" : "bias", kiln_dtype_name(other->dtype));
}

static kiln_status shape_error(const char *op, const char *want, const kiln_tensor *a, const kiln_tensor *b) {
    char sa[96], sb[96];
    return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, want, "%s: shapes %s and %s do not fit", op,
                      kiln_shape_format(a->ndim, a->shape, sa, sizeof sa),
                      kiln_shape_format(b->ndim, b->shape, sb, sizeof sb));
}

/* (n, k) x (k, m) -> (n, m) */
kiln_status kiln_infer_mm(const char *op, const kiln_op_attrs *attrs, int n_in, kiln_tensor *const *in,
                          kiln_meta *out, kiln_dtype *in_dtype) {
    (void)attrs, (void)n_in;
    const kiln_tensor *a = in[0], *b = in[1];
    if (a->ndim != 2 || b->ndim != 2 || a->shape[1] != b->shape[0])
        return shape_error(op, "mm takes (n, k) and (k, m); kiln_matmul handles other ranks", a, b);
    KILN_TRY(common_float(op, 2, in, in_dtype, &out[0].dtype));
    out[0].ndim = 2;
    out[0].shape[0] = a->shape[0];
    out[0].shape[1] = b->shape[1];
    return KILN_OK;
}

/* (B, n, k) x (B, k, m) -> (B, n, m) */
kiln_status kiln_infer_bmm(const char *op, const kiln_op_attrs *attrs, int n_in, kiln_tensor *const *in,
                           kiln_meta *out, kiln_dtype *in_dtype) {
    (void)attrs, (void)n_in;
    const kiln_tensor *a = in[0], *b = in[1];
    if (a->ndim != 3 || b->ndim != 3 || a->shape[0] != b->shape[0] || a->shape[2] != b->shape[1])
        return shape_error(op, "bmm takes (B, n, k) and (B, k, m); kiln_matmul broadcasts batch dims", a, b);
    KILN_TRY(common_float(op, 2, in, in_dtype, &out[0].dtype));
    out[0].ndim = 3;
    out[0].shape[0] = a->shape[0];
    out[0].shape[1] = a->shape[1];
    out[0].shape[2] = b->shape[2];
    return KILN_OK;
}

/* x (..., in), weight (out, in), bias (out) or NULL -> (..., out) */
kiln_status kiln_infer_linear(const char *op, const kiln_op_attrs *attrs, int n_in, kiln_tensor *const *in,
                              kiln_meta *out, kiln_dtype *in_dtype) {
    (void)attrs;
    const kiln_tensor *x = in[0], *w = in[1], *b = n_in > 2 ? in[2] : NULL;
    if (x->ndim < 1 || w->ndim != 2 || x->shape[x->ndim - 1] != w->shape[1])
        return shape_error(op, "linear takes x (..., in) and weight (out, in)", x, w);
    if (b && (b->ndim != 1 || b->shape[0] != w->shape[0]))
        return shape_error(op, "the bias has one value per output feature: (out)", w, b);
    KILN_TRY(kiln_infer_layer_dtypes(op, x, w, b));
    KILN_TRY(common_float(op, n_in, in, in_dtype, &out[0].dtype));
    kiln_meta_of(x, &out[0]);
    out[0].dtype = in_dtype[0];
    out[0].shape[x->ndim - 1] = w->shape[0];
    return KILN_OK;
}

/* x (N, d1, ...) read as (N, K) with K = d1 * ..., weight (O, K), bias (O)
 * or NULL -> (N, O); attrs.flag the activation (0 none, 1 relu). */
kiln_status kiln_infer_linear_act(const char *op, const kiln_op_attrs *attrs, int n_in,
                                  kiln_tensor *const *in, kiln_meta *out, kiln_dtype *in_dtype) {
    const kiln_tensor *x = in[0], *w = in[1], *b = n_in > 2 ? in[2] : NULL;
    if (attrs->flag != 0 && attrs->flag != 1)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use activation 0 (none) or 1 (relu)",
                          "%s: activation %d", op, attrs->flag);
    int64_t K = 1;
    for (int d = 1; d < x->ndim; d++) K *= x->shape[d];
    if (x->ndim < 2 || w->ndim != 2 || K != w->shape[1])
        return shape_error(op,
                           "pass x as (N, ...) whose dims after the first multiply to weight's in "
                           "features, and weight as (out, in)",
                           x, w);
    if (b && (b->ndim != 1 || b->shape[0] != w->shape[0]))
        return shape_error(op, "the bias has one value per output feature: (out)", w, b);
    KILN_TRY(kiln_infer_layer_dtypes(op, x, w, b));
    KILN_TRY(common_float(op, n_in, in, in_dtype, &out[0].dtype));
    out[0].ndim = 2;
    out[0].shape[0] = x->shape[0];
    out[0].shape[1] = w->shape[0];
    return KILN_OK;
}

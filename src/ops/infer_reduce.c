/* Shape and dtype inference for reductions (sum, mean, amax, amin, argmax,
 * norm) and softmax / log_softmax.
 *
 * Reductions read attrs.dims[0..n_dims) (n_dims 0: every dim; negative
 * dims count from the end; a dim may appear once) and attrs.keepdim. A
 * 0-dim input accepts dim 0 or -1, as in PyTorch. */
#include <string.h>

#include "base/error.h"
#include "ops/op_infer.h"
#include "tensor/tensor_internal.h"

/* Marks red[d] for each reduced dim of x and fills out's shape. */
static kiln_status reduce_shape(const char *op, const kiln_op_attrs *at, const kiln_tensor *x, bool *red,
                                kiln_meta *out) {
    int nd = x->ndim;
    memset(red, 0, sizeof(bool) * KILN_MAX_DIMS);
    if (at->n_dims < 0 || at->n_dims > KILN_MAX_DIMS)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass 0 (all dims) to 8 dims", "%s: %d reduction dims",
                          op, at->n_dims);
    if (at->n_dims == 0)
        for (int d = 0; d < nd; d++) red[d] = true;
    for (int i = 0; i < at->n_dims; i++) {
        int w;
        if (!kiln_wrap_dim(at->dims[i], nd > 0 ? nd : 1, &w))
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "dims count from 0, or from -1 at the end",
                              "%s: dim %d is out of range for a tensor with %d dims", op, at->dims[i], nd);
        if (nd == 0) continue;
        if (red[w])
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "list each dim once",
                              "%s: dim %d appears more than once in dims", op, at->dims[i]);
        red[w] = true;
    }
    out->dtype = x->dtype;
    out->ndim = 0;
    for (int d = 0; d < nd; d++) {
        if (!red[d])
            out->shape[out->ndim++] = x->shape[d];
        else if (at->keepdim)
            out->shape[out->ndim++] = 1;
    }
    return KILN_OK;
}

/* max/min/argmax of nothing has no value. */
static kiln_status check_not_empty(const char *op, const kiln_tensor *x, const bool *red) {
    bool empty_red = false;
    int64_t n_out = 1;
    for (int d = 0; d < x->ndim; d++) {
        if (red[d] && x->shape[d] == 0) empty_red = true;
        if (!red[d]) n_out *= x->shape[d];
    }
    if (!empty_red || n_out == 0) return KILN_OK;
    char b[96];
    return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "reduce over non-empty dims only",
                      "%s: the input %s is empty along a reduced dim, which has no maximum or minimum", op,
                      kiln_shape_format(x->ndim, x->shape, b, sizeof b));
}

static kiln_status need_floating(const char *op, const kiln_tensor *x) {
    if (kiln_dtype_is_floating(x->dtype)) return KILN_OK;
    return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "convert the input to a floating dtype with kiln_cast",
                      "%s: needs a floating input, got %s", op, kiln_dtype_name(x->dtype));
}

/* sum (integer and bool inputs give i64, as in PyTorch), amax, amin. */
kiln_status kiln_infer_reduce(const char *op, const kiln_op_attrs *attrs, int n_in, kiln_tensor *const *in,
                              kiln_meta *out, kiln_dtype *in_dtype) {
    (void)n_in, (void)in_dtype;
    bool red[KILN_MAX_DIMS];
    KILN_TRY(reduce_shape(op, attrs, in[0], red, &out[0]));
    if (strcmp(op, "kiln_sum") == 0) {
        if (!kiln_dtype_is_floating(in[0]->dtype)) out[0].dtype = KILN_I64;
    } else {
        KILN_TRY(check_not_empty(op, in[0], red));
    }
    return KILN_OK;
}

/* mean and norm: floating inputs only. */
kiln_status kiln_infer_reduce_float(const char *op, const kiln_op_attrs *attrs, int n_in,
                                    kiln_tensor *const *in, kiln_meta *out, kiln_dtype *in_dtype) {
    (void)n_in, (void)in_dtype;
    KILN_TRY(need_floating(op, in[0]));
    bool red[KILN_MAX_DIMS];
    return reduce_shape(op, attrs, in[0], red, &out[0]);
}

/* argmax over attrs.dims[0] (n_dims 1), or over the flattened input
 * (n_dims 0): i64 indices. */
kiln_status kiln_infer_argmax(const char *op, const kiln_op_attrs *attrs, int n_in, kiln_tensor *const *in,
                              kiln_meta *out, kiln_dtype *in_dtype) {
    (void)n_in, (void)in_dtype;
    if (attrs->n_dims > 1)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "call it once per dim, or flatten first",
                          "%s: takes one dim, got %d", op, attrs->n_dims);
    bool red[KILN_MAX_DIMS];
    KILN_TRY(reduce_shape(op, attrs, in[0], red, &out[0]));
    KILN_TRY(check_not_empty(op, in[0], red));
    out[0].dtype = KILN_I64;
    return KILN_OK;
}

/* softmax / log_softmax along attrs.dims[0]: same shape and dtype. */
kiln_status kiln_infer_softmax(const char *op, const kiln_op_attrs *attrs, int n_in, kiln_tensor *const *in,
                               kiln_meta *out, kiln_dtype *in_dtype) {
    (void)n_in, (void)in_dtype;
    const kiln_tensor *x = in[0];
    KILN_TRY(need_floating(op, x));
    int w;
    if (!kiln_wrap_dim(attrs->dims[0], x->ndim > 0 ? x->ndim : 1, &w))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "dims count from 0, or from -1 at the end",
                          "%s: dim %d is out of range for a tensor with %d dims", op, attrs->dims[0],
                          x->ndim);
    kiln_meta_of(x, &out[0]);
    return KILN_OK;
}

/* Shape and dtype inference of the shape and indexing ops: cat, gather,
 * scatter_add, pad, flip, embedding (and its backward), randperm. */
#include <string.h>

#include "base/error.h"
#include "ops/op_infer.h"
#include "tensor/tensor_internal.h"

#define SHAPE_OF(t, buf) kiln_shape_format((t)->ndim, (t)->shape, (buf), sizeof(buf))

static void set_meta(kiln_meta *m, kiln_dtype dt, int ndim, const int64_t *shape) {
    memset(m, 0, sizeof *m);
    m->dtype = dt, m->ndim = ndim;
    memcpy(m->shape, shape, sizeof(int64_t) * (size_t)ndim);
}

static kiln_status wrap_dim(const char *op, int dim, int ndim, int *out) {
    if (kiln_wrap_dim(dim, ndim, out)) return KILN_OK;
    return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use a dim in [-ndim, ndim)",
                      "%s: dim %d is out of range for %d dims", op, dim, ndim);
}

/* Indices must be integers; the kernels read them as i64. */
static kiln_status index_dtype(const char *op, const kiln_tensor *ix, kiln_dtype *in_dtype) {
    if (kiln_dtype_is_floating(ix->dtype) || ix->dtype == KILN_BOOL)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass i64 indices (kiln_cast)",
                          "%s: indices have dtype %s; they must be integers", op, kiln_dtype_name(ix->dtype));
    *in_dtype = KILN_I64;
    return KILN_OK;
}

/* PyTorch still accepts 1-d empty tensors next to tensors of any rank. */
static bool legacy_empty(const kiln_tensor *t) { return t->ndim == 1 && t->shape[0] == 0; }

kiln_status kiln_infer_cat(const char *op, const kiln_op_attrs *attrs, int n_in, kiln_tensor *const *in,
                           kiln_meta *out, kiln_dtype *in_dtype) {
    const kiln_tensor *ref = NULL;
    kiln_dtype dt = in[0]->dtype;
    for (int i = 0; i < n_in; i++) {
        dt = kiln_promote_types(dt, in[i]->dtype);
        if (!ref && !legacy_empty(in[i])) ref = in[i];
    }
    for (int i = 0; i < n_in; i++) in_dtype[i] = dt;
    if (!ref) {
        set_meta(&out[0], dt, 1, (int64_t[]){0});
        return KILN_OK;
    }
    if (ref->ndim == 0)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use kiln_stack, or kiln_unsqueeze the scalars first",
                          "%s: zero-dim tensors cannot be concatenated", op);
    int dim;
    KILN_TRY(wrap_dim(op, attrs->dims[0], ref->ndim, &dim));
    int64_t shape[KILN_MAX_DIMS];
    memcpy(shape, ref->shape, sizeof shape);
    shape[dim] = 0;
    for (int i = 0; i < n_in; i++) {
        const kiln_tensor *t = in[i];
        if (legacy_empty(t) && ref->ndim != 1) continue;
        bool ok = t->ndim == ref->ndim;
        for (int d = 0; ok && d < ref->ndim; d++) ok = d == dim || t->shape[d] == ref->shape[d];
        if (!ok) {
            char s0[96], s1[96];
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "sizes must match except in the cat dim",
                              "%s: tensor %d is %s but tensor 0 is %s (dim %d)", op, i, SHAPE_OF(t, s1),
                              SHAPE_OF(ref, s0), dim);
        }
        shape[dim] += t->shape[dim];
    }
    set_meta(&out[0], dt, ref->ndim, shape);
    return KILN_OK;
}

kiln_status kiln_infer_gather(const char *op, const kiln_op_attrs *attrs, int n_in, kiln_tensor *const *in,
                              kiln_meta *out, kiln_dtype *in_dtype) {
    (void)n_in;
    const kiln_tensor *x = in[0], *ix = in[1];
    char sx[96], si[96];
    KILN_TRY(index_dtype(op, ix, &in_dtype[1]));
    int dim;
    KILN_TRY(wrap_dim(op, attrs->dims[0], x->ndim ? x->ndim : 1, &dim));
    bool ok = ix->ndim == x->ndim;
    for (int d = 0; ok && d < x->ndim; d++) ok = d == dim || ix->shape[d] <= x->shape[d];
    if (!ok)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                          "index needs x's number of dims and sizes no larger than x's outside dim",
                          "%s: index %s does not fit x %s along dim %d", op, SHAPE_OF(ix, si),
                          SHAPE_OF(x, sx), dim);
    set_meta(&out[0], x->dtype, ix->ndim, ix->shape);
    return KILN_OK;
}

/* scatter_add(self, index, src): self + src summed at index along dim. */
kiln_status kiln_infer_scatter_add(const char *op, const kiln_op_attrs *attrs, int n_in,
                                   kiln_tensor *const *in, kiln_meta *out, kiln_dtype *in_dtype) {
    (void)n_in;
    const kiln_tensor *self = in[0], *ix = in[1], *src = in[2];
    char sx[96], si[96], ss[96];
    KILN_TRY(index_dtype(op, ix, &in_dtype[1]));
    in_dtype[2] = self->dtype;
    int dim;
    KILN_TRY(wrap_dim(op, attrs->dims[0], self->ndim ? self->ndim : 1, &dim));
    bool ok = ix->ndim == self->ndim && src->ndim == self->ndim;
    for (int d = 0; ok && d < self->ndim; d++)
        ok = ix->shape[d] <= src->shape[d] && (d == dim || ix->shape[d] <= self->shape[d]);
    if (!ok)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                          "index must have self's dims, fit src, and fit self outside dim",
                          "%s: self %s, index %s, src %s along dim %d", op, SHAPE_OF(self, sx),
                          SHAPE_OF(ix, si), SHAPE_OF(src, ss), dim);
    if (self->dtype == KILN_BOOL)
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "cast to an integer or floating dtype",
                          "%s: bool is not supported", op);
    set_meta(&out[0], self->dtype, self->ndim, self->shape);
    return KILN_OK;
}

kiln_status kiln_infer_pad(const char *op, const kiln_op_attrs *attrs, int n_in, kiln_tensor *const *in,
                           kiln_meta *out, kiln_dtype *in_dtype) {
    (void)n_in, (void)in_dtype;
    const kiln_tensor *x = in[0];
    char sx[96];
    if (attrs->n_ints % 2 || attrs->n_ints / 2 > x->ndim)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give (left, right) pairs for at most ndim dims",
                          "%s: %d pad widths for input %s", op, attrs->n_ints, SHAPE_OF(x, sx));
    int64_t shape[KILN_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    for (int p = 0; p < attrs->n_ints / 2; p++) {
        int d = x->ndim - 1 - p;
        shape[d] += attrs->ints[2 * p] + attrs->ints[2 * p + 1];
        if (shape[d] < 0)
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "crop (negative widths) at most the dim's size",
                              "%s: widths (%lld, %lld) on dim %d of input %s give a negative size", op,
                              (long long)attrs->ints[2 * p], (long long)attrs->ints[2 * p + 1], d,
                              SHAPE_OF(x, sx));
    }
    set_meta(&out[0], x->dtype, x->ndim, shape);
    return KILN_OK;
}

kiln_status kiln_infer_flip(const char *op, const kiln_op_attrs *attrs, int n_in, kiln_tensor *const *in,
                            kiln_meta *out, kiln_dtype *in_dtype) {
    (void)n_in, (void)in_dtype;
    const kiln_tensor *x = in[0];
    bool seen[KILN_MAX_DIMS] = {false};
    for (int i = 0; i < attrs->n_dims; i++) {
        int d;
        KILN_TRY(wrap_dim(op, attrs->dims[i], x->ndim, &d));
        if (seen[d])
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "name each dim once", "%s: dim %d appears twice", op,
                              d);
        seen[d] = true;
    }
    set_meta(&out[0], x->dtype, x->ndim, x->shape);
    return KILN_OK;
}

kiln_status kiln_infer_embedding(const char *op, const kiln_op_attrs *attrs, int n_in, kiln_tensor *const *in,
                                 kiln_meta *out, kiln_dtype *in_dtype) {
    (void)attrs, (void)n_in;
    const kiln_tensor *w = in[0], *ix = in[1];
    char sw[96];
    if (w->ndim != 2)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass a (num_embeddings, dim) table",
                          "%s: weight is %s; it must be 2-d", op, SHAPE_OF(w, sw));
    KILN_TRY(index_dtype(op, ix, &in_dtype[1]));
    if (ix->ndim + 1 > KILN_MAX_DIMS)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use indices of at most 7 dims",
                          "%s: indices have %d dims", op, ix->ndim);
    int64_t shape[KILN_MAX_DIMS];
    memcpy(shape, ix->shape, sizeof(int64_t) * (size_t)ix->ndim);
    shape[ix->ndim] = w->shape[1];
    set_meta(&out[0], w->dtype, ix->ndim + 1, shape);
    return KILN_OK;
}

/* (grad_out (..., D), indices) -> grad_weight (attrs.ints[0], attrs.ints[1]) */
kiln_status kiln_infer_embedding_backward(const char *op, const kiln_op_attrs *attrs, int n_in,
                                          kiln_tensor *const *in, kiln_meta *out, kiln_dtype *in_dtype) {
    (void)n_in;
    const kiln_tensor *go = in[0], *ix = in[1];
    KILN_TRY(index_dtype(op, ix, &in_dtype[1]));
    if (go->ndim != ix->ndim + 1 || go->shape[go->ndim - 1] != attrs->ints[1] || attrs->ints[0] < 0)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                          "pass grad_out shaped (indices..., D) and attrs.ints = (V, D)",
                          "%s: grad_out, indices and table shape (%lld, %lld) do not match", op,
                          (long long)attrs->ints[0], (long long)attrs->ints[1]);
    set_meta(&out[0], go->dtype, 2, attrs->ints);
    return KILN_OK;
}

kiln_status kiln_infer_randperm(const char *op, const kiln_op_attrs *attrs, int n_in, kiln_tensor *const *in,
                                kiln_meta *out, kiln_dtype *in_dtype) {
    (void)n_in, (void)in, (void)in_dtype;
    if (attrs->ints[0] < 0)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use n >= 0", "%s: n is %lld", op,
                          (long long)attrs->ints[0]);
    set_meta(&out[0], KILN_I64, 1, attrs->ints);
    return KILN_OK;
}

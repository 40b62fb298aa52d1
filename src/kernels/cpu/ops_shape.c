/* CPU reference kernels of the shape and indexing ops: cat, gather,
 * scatter_add, constant pad, flip, embedding (and its backward), randperm.
 * Moves copy elements bit for bit (every dtype); sums run in double for
 * floating dtypes and in int64 for integer ones. */
#include "base/error.h"
#include "kernels/cpu/nn_cpu_util.h"
#include "kernels/cpu/ops_nn_cpu.h"

static int wrap(int dim, int ndim) { return dim < 0 ? dim + ndim : dim; }

/* Each input (skipping PyTorch's legacy empty 1-d operands) is copied into
 * its slab of out along dim. */
kiln_status kiln_cpu_cat(const kiln_op_args *a) {
    const kiln_strided *y = &a->out[0];
    int dim = wrap(a->attrs->dims[0], y->ndim);
    size_t es = kiln_dtype_size(y->dtype);
    int64_t at = 0;
    for (int i = 0; i < a->n_in; i++) {
        const kiln_strided *x = &a->in[i];
        if (x->ndim != y->ndim) continue; /* a legacy (0) operand */
        int64_t base = at * y->strides[dim];
        at += x->shape[dim];
        if (nn_numel(x->ndim, x->shape) == 0) continue;
        int64_t idx[KILN_MAX_DIMS] = {0};
        do {
            nn_copy_elem(y->data, base + nn_offset(y->ndim, y->strides, idx), x->data,
                         nn_offset(x->ndim, x->strides, idx), es);
        } while (nn_next(x->ndim, x->shape, idx));
    }
    return KILN_OK;
}

static kiln_status bad_index(const char *op, int64_t v, int dim, int64_t size) {
    return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "indices must lie in [0, size) of the indexed dim",
                      "%s: index %lld is out of bounds for dim %d of size %lld", op, (long long)v, dim,
                      (long long)size);
}

kiln_status kiln_cpu_gather(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *ix = &a->in[1], *y = &a->out[0];
    int dim = wrap(a->attrs->dims[0], x->ndim);
    size_t es = kiln_dtype_size(y->dtype);
    if (nn_numel(y->ndim, y->shape) == 0) return KILN_OK;
    int64_t idx[KILN_MAX_DIMS] = {0};
    do {
        int64_t k = nn_ldi(ix->data, ix->dtype, nn_offset(ix->ndim, ix->strides, idx));
        if (k < 0 || k >= x->shape[dim]) return bad_index("kiln_gather", k, dim, x->shape[dim]);
        int64_t xoff = nn_offset(x->ndim, x->strides, idx) + (k - idx[dim]) * x->strides[dim];
        nn_copy_elem(y->data, nn_offset(y->ndim, y->strides, idx), x->data, xoff, es);
    } while (nn_next(y->ndim, y->shape, idx));
    return KILN_OK;
}

size_t kiln_cpu_scatter_add_workspace(const kiln_op_args *a) {
    const kiln_strided *y = &a->out[0];
    if (!kiln_dtype_is_floating(y->dtype)) return 0;
    return (size_t)nn_numel(y->ndim, y->shape) * sizeof(double);
}

/* out = self, then out[..., index[i], ...] += src[i] along dim. Float sums
 * go through a dense double copy of out (workspace). */
kiln_status kiln_cpu_scatter_add(const kiln_op_args *a) {
    const kiln_strided *self = &a->in[0], *ix = &a->in[1], *src = &a->in[2], *y = &a->out[0];
    int dim = wrap(a->attrs->dims[0], y->ndim);
    bool fl = kiln_dtype_is_floating(y->dtype);
    double *acc = a->workspace; /* y's shape, dense */
    int64_t n = nn_numel(y->ndim, y->shape), dense[KILN_MAX_DIMS];
    nn_dense_strides(y->ndim, y->shape, dense);
    if (n > 0) {
        int64_t idx[KILN_MAX_DIMS] = {0}, i = 0;
        do {
            int64_t so = nn_offset(self->ndim, self->strides, idx), yo = nn_offset(y->ndim, y->strides, idx);
            if (fl)
                acc[i] = nn_ld(self->data, self->dtype, so);
            else
                nn_sti(y->data, y->dtype, yo, nn_ldi(self->data, self->dtype, so));
            i++;
        } while (nn_next(y->ndim, y->shape, idx));
    }
    if (nn_numel(ix->ndim, ix->shape) > 0) {
        int64_t idx[KILN_MAX_DIMS] = {0};
        do {
            int64_t k = nn_ldi(ix->data, ix->dtype, nn_offset(ix->ndim, ix->strides, idx));
            if (k < 0 || k >= y->shape[dim]) return bad_index("kiln_scatter_add", k, dim, y->shape[dim]);
            int64_t so = nn_offset(src->ndim, src->strides, idx);
            int64_t shift = k - idx[dim];
            if (fl) {
                acc[nn_offset(y->ndim, dense, idx) + shift * dense[dim]] += nn_ld(src->data, src->dtype, so);
            } else {
                int64_t yo = nn_offset(y->ndim, y->strides, idx) + shift * y->strides[dim];
                nn_sti(y->data, y->dtype, yo,
                       nn_ldi(y->data, y->dtype, yo) + nn_ldi(src->data, src->dtype, so));
            }
        } while (nn_next(ix->ndim, ix->shape, idx));
    }
    if (fl && n > 0) {
        int64_t idx[KILN_MAX_DIMS] = {0}, i = 0;
        do {
            nn_st(y->data, y->dtype, nn_offset(y->ndim, y->strides, idx), acc[i++]);
        } while (nn_next(y->ndim, y->shape, idx));
    }
    return KILN_OK;
}

/* out[o] = x[o - left] where that is inside x, else the value; negative
 * widths crop. attrs.ints holds (left, right) pairs from the last dim. */
kiln_status kiln_cpu_pad(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *y = &a->out[0];
    int64_t left[KILN_MAX_DIMS] = {0};
    for (int p = 0; p < a->attrs->n_ints / 2; p++) left[y->ndim - 1 - p] = a->attrs->ints[2 * p];
    size_t es = kiln_dtype_size(y->dtype);
    if (nn_numel(y->ndim, y->shape) == 0) return KILN_OK;
    int64_t idx[KILN_MAX_DIMS] = {0};
    do {
        int64_t xoff = 0;
        bool inside = true;
        for (int d = 0; d < y->ndim && inside; d++) {
            int64_t i = idx[d] - left[d];
            inside = i >= 0 && i < x->shape[d];
            xoff += i * x->strides[d];
        }
        int64_t yoff = nn_offset(y->ndim, y->strides, idx);
        if (inside)
            nn_copy_elem(y->data, yoff, x->data, xoff, es);
        else
            nn_st(y->data, y->dtype, yoff, a->attrs->scalar[0]);
    } while (nn_next(y->ndim, y->shape, idx));
    return KILN_OK;
}

kiln_status kiln_cpu_flip(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *y = &a->out[0];
    bool flip[KILN_MAX_DIMS] = {false};
    for (int i = 0; i < a->attrs->n_dims; i++) flip[wrap(a->attrs->dims[i], x->ndim)] = true;
    size_t es = kiln_dtype_size(y->dtype);
    if (nn_numel(y->ndim, y->shape) == 0) return KILN_OK;
    int64_t idx[KILN_MAX_DIMS] = {0};
    do {
        int64_t xoff = 0;
        for (int d = 0; d < x->ndim; d++)
            xoff += (flip[d] ? x->shape[d] - 1 - idx[d] : idx[d]) * x->strides[d];
        nn_copy_elem(y->data, nn_offset(y->ndim, y->strides, idx), x->data, xoff, es);
    } while (nn_next(y->ndim, y->shape, idx));
    return KILN_OK;
}

/* out (..., D) = weight[indices[...], :] */
kiln_status kiln_cpu_embedding(const kiln_op_args *a) {
    const kiln_strided *w = &a->in[0], *ix = &a->in[1], *y = &a->out[0];
    int64_t V = w->shape[0], D = w->shape[1];
    size_t es = kiln_dtype_size(y->dtype);
    if (nn_numel(ix->ndim, ix->shape) == 0) return KILN_OK;
    int64_t idx[KILN_MAX_DIMS] = {0};
    do {
        int64_t k = nn_ldi(ix->data, ix->dtype, nn_offset(ix->ndim, ix->strides, idx));
        if (k < 0 || k >= V)
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "indices must lie in [0, num_embeddings)",
                              "kiln_embedding: index %lld is out of range for a table of %lld rows",
                              (long long)k, (long long)V);
        int64_t yoff = nn_offset(ix->ndim, y->strides, idx);
        for (int64_t d = 0; d < D; d++)
            nn_copy_elem(y->data, yoff + d * y->strides[ix->ndim], w->data,
                         k * w->strides[0] + d * w->strides[1], es);
    } while (nn_next(ix->ndim, ix->shape, idx));
    return KILN_OK;
}

size_t kiln_cpu_embedding_backward_workspace(const kiln_op_args *a) {
    return (size_t)(a->out[0].shape[0] * a->out[0].shape[1]) * sizeof(double);
}

/* grad_weight (V, D): rows of grad_out (..., D) summed at their indices. */
kiln_status kiln_cpu_embedding_backward(const kiln_op_args *a) {
    const kiln_strided *go = &a->in[0], *ix = &a->in[1], *dw = &a->out[0];
    int64_t V = dw->shape[0], D = dw->shape[1];
    double *acc = a->workspace; /* (V, D) */
    for (int64_t i = 0; i < V * D; i++) acc[i] = 0;
    if (nn_numel(ix->ndim, ix->shape) > 0) {
        int64_t idx[KILN_MAX_DIMS] = {0};
        do {
            int64_t k = nn_ldi(ix->data, ix->dtype, nn_offset(ix->ndim, ix->strides, idx));
            if (k < 0 || k >= V)
                return KILN_RAISE(
                    KILN_ERR_INVALID_ARGUMENT, "indices must lie in [0, num_embeddings)",
                    "kiln_embedding_backward: index %lld is out of range for a table of %lld rows",
                    (long long)k, (long long)V);
            int64_t goff = nn_offset(ix->ndim, go->strides, idx);
            for (int64_t d = 0; d < D; d++)
                acc[k * D + d] += nn_ld(go->data, go->dtype, goff + d * go->strides[ix->ndim]);
        } while (nn_next(ix->ndim, ix->shape, idx));
    }
    for (int64_t v = 0; v < V; v++)
        for (int64_t d = 0; d < D; d++)
            nn_st(dw->data, dw->dtype, v * dw->strides[0] + d * dw->strides[1], acc[v * D + d]);
    return KILN_OK;
}

/* Fisher-Yates from the top: step i swaps slot i with slot j drawn
 * uniformly from [0, i] using words 2i and 2i+1 of the draw, so every
 * backend that reads the same words makes the same permutation. */
kiln_status kiln_cpu_randperm(const kiln_op_args *a) {
    const kiln_strided *y = &a->out[0];
    int64_t n = y->shape[0];
    int64_t *p = y->data;
    int64_t st = y->strides[0];
    for (int64_t i = 0; i < n; i++) p[i * st] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        uint64_t r = ((uint64_t)kiln_rng_u32_at(&a->attrs->rng, 2 * (uint64_t)i) << 32) |
                     kiln_rng_u32_at(&a->attrs->rng, 2 * (uint64_t)i + 1);
        int64_t j = (int64_t)(r % (uint64_t)(i + 1));
        int64_t t = p[i * st];
        p[i * st] = p[j * st];
        p[j * st] = t;
    }
    return KILN_OK;
}

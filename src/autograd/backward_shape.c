/* Backward formulas of the shape and indexing ops: cat (slices of the
 * gradient), gather and scatter_add (each other's adjoint), pad (a crop),
 * flip (a flip), embedding (an index-add into the table). */
#include "autograd/backward_util.h"
#include "base/error.h"
#include "kiln/ops.h"
#include "ops/op_backward.h"
#include "tensor/tensor_internal.h"

static kiln_status finish(kiln_tensor *t, const kiln_meta *m, kiln_tensor **slot) {
    if (!t) return kiln_error_last()->status;
    *slot = kiln_sum_to_shape(t, m);
    kiln_tensor_drop(t);
    return *slot ? KILN_OK : kiln_error_last()->status;
}

static kiln_status zeros_for(const kiln_backward_ctx *ctx, int i, kiln_tensor **grad_in) {
    grad_in[i] = kiln_grad_zeros(&ctx->in_meta[i], ctx->device);
    return grad_in[i] ? KILN_OK : kiln_error_last()->status;
}

static int wrap(int dim, int ndim) { return dim < 0 ? dim + ndim : dim; }

/* Each input's gradient is its slab of grad_out along dim, copied out so
 * the input's .grad does not keep the whole of grad_out alive. */
kiln_status kiln_backward_cat(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                              kiln_tensor **grad_in) {
    kiln_tensor *g = grad_out[0];
    int nd = ctx->out_meta[0].ndim;
    int dim = wrap(ctx->attrs->dims[0], nd);
    int64_t at = 0;
    for (int i = 0; i < ctx->n_in; i++) {
        const kiln_meta *m = &ctx->in_meta[i];
        bool legacy = m->ndim != nd; /* a skipped empty 1-d operand */
        int64_t len = legacy ? 0 : m->shape[dim];
        int64_t start = at;
        at += len;
        if (!ctx->needs_grad[i]) continue;
        if (!g || legacy) {
            KILN_TRY(zeros_for(ctx, i, grad_in));
            continue;
        }
        kiln_tensor *slab = kiln_narrow(g, dim, start, len);
        if (!slab) return kiln_error_last()->status;
        kiln_tensor *c = kiln_contiguous(slab);
        kiln_tensor_drop(slab);
        KILN_TRY(finish(c, m, &grad_in[i]));
    }
    return KILN_OK;
}

kiln_status kiln_backward_gather(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                 kiln_tensor **grad_in) {
    if (!ctx->needs_grad[0]) return KILN_OK;
    if (!grad_out[0]) return zeros_for(ctx, 0, grad_in);
    kiln_tensor *z = kiln_grad_zeros(&ctx->in_meta[0], ctx->device);
    if (!z) return kiln_error_last()->status;
    kiln_op_attrs at = *ctx->attrs;
    kiln_tensor *out[KILN_OP_MAX_OUT] = {NULL};
    kiln_status st = kiln_dispatch(KILN_OP_SCATTER_ADD, 3, (kiln_tensor *[]){z, ctx->in[1], grad_out[0]}, &at,
                                   ctx->device, out);
    kiln_tensor_drop(z);
    if (st) return st;
    return finish(out[0], &ctx->in_meta[0], &grad_in[0]);
}

/* self: grad_out itself; src: grad_out gathered at index, zero-padded to
 * src's shape where src is larger than index. */
kiln_status kiln_backward_scatter_add(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                      kiln_tensor **grad_in) {
    kiln_tensor *g = grad_out[0];
    if (ctx->needs_grad[0]) {
        if (!g)
            KILN_TRY(zeros_for(ctx, 0, grad_in));
        else
            KILN_TRY(finish(kiln_retain(g), &ctx->in_meta[0], &grad_in[0]));
    }
    if (!ctx->needs_grad[2]) return KILN_OK;
    if (!g) return zeros_for(ctx, 2, grad_in);
    kiln_tensor *r = kiln_gather(g, ctx->attrs->dims[0], ctx->in[1]);
    if (!r) return kiln_error_last()->status;
    const kiln_meta *ms = &ctx->in_meta[2], *mi = &ctx->in_meta[1];
    int64_t pads[2 * KILN_MAX_DIMS];
    bool need_pad = false;
    for (int p = 0; p < ms->ndim; p++) {
        int d = ms->ndim - 1 - p;
        pads[2 * p] = 0;
        pads[2 * p + 1] = ms->shape[d] - mi->shape[d];
        need_pad |= pads[2 * p + 1] != 0;
    }
    if (need_pad) {
        kiln_tensor *padded = kiln_pad(r, ms->ndim, pads, 0.0);
        kiln_tensor_drop(r);
        r = padded;
    }
    return finish(r, ms, &grad_in[2]);
}

/* The gradient of a constant pad is the crop with the negated widths. */
kiln_status kiln_backward_pad(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                              kiln_tensor **grad_in) {
    if (!ctx->needs_grad[0]) return KILN_OK;
    if (!grad_out[0]) return zeros_for(ctx, 0, grad_in);
    int64_t pads[2 * KILN_MAX_DIMS];
    int n = ctx->attrs->n_ints;
    for (int i = 0; i < n; i++) pads[i] = -ctx->attrs->ints[i];
    return finish(kiln_pad(grad_out[0], n / 2, pads, 0.0), &ctx->in_meta[0], &grad_in[0]);
}

kiln_status kiln_backward_flip(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                               kiln_tensor **grad_in) {
    if (!ctx->needs_grad[0]) return KILN_OK;
    if (!grad_out[0]) return zeros_for(ctx, 0, grad_in);
    return finish(kiln_flip(grad_out[0], ctx->attrs->n_dims, ctx->attrs->dims), &ctx->in_meta[0],
                  &grad_in[0]);
}

kiln_status kiln_backward_embedding(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                    kiln_tensor **grad_in) {
    if (!ctx->needs_grad[0]) return KILN_OK;
    if (!grad_out[0]) return zeros_for(ctx, 0, grad_in);
    const kiln_meta *m = &ctx->in_meta[0];
    kiln_op_attrs at = {.ints = {m->shape[0], m->shape[1]}, .n_ints = 2};
    kiln_tensor *out[KILN_OP_MAX_OUT] = {NULL};
    KILN_TRY(kiln_dispatch(KILN_OP_EMBEDDING_BACKWARD, 2, (kiln_tensor *[]){grad_out[0], ctx->in[1]}, &at,
                           ctx->device, out));
    return finish(out[0], m, &grad_in[0]);
}

/* Inference of the view rows (VIEW, PERMUTE, NARROW, EXPAND). The tensor
 * layer makes views without the dispatcher (tensor/view.c) and records
 * them through its view hook; these functions describe the same results
 * for the meta device and the op docs, from the attributes documented
 * beside kiln_view_kind (tensor/tensor_internal.h):
 *   VIEW     attrs.ints[0..n_ints) the new shape, one entry may be -1
 *   PERMUTE  attrs.dims[0..n_dims) a permutation (negative dims wrap)
 *   NARROW   attrs.dims[0] the dim, ints[0] the start (negative counts from
 *            the end), ints[1] the length when n_ints >= 2 (else the rest)
 *   EXPAND   attrs.ints[0..n_ints) the new shape, -1 keeps a dim */
#include <string.h>

#include "base/error.h"
#include "ops/op_infer.h"
#include "tensor/tensor_internal.h"

static kiln_status one_input(const char *op, int n_in, kiln_tensor *const *in) {
    if (n_in != 1 || !in[0])
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass one tensor", "%s: expected one input tensor", op);
    return KILN_OK;
}

static void meta_from(kiln_meta *m, kiln_dtype dtype, int ndim, const int64_t *shape) {
    memset(m, 0, sizeof *m);
    m->dtype = dtype;
    m->ndim = ndim;
    memcpy(m->shape, shape, sizeof(int64_t) * (size_t)ndim);
}

kiln_status kiln_infer_view(const char *op, const kiln_op_attrs *attrs, int n_in, kiln_tensor *const *in,
                            kiln_meta *out, kiln_dtype *in_dtype) {
    (void)in_dtype;
    KILN_TRY(one_input(op, n_in, in));
    const kiln_tensor *t = in[0];
    int nd = attrs->n_ints, infer_at = -1;
    if (nd < 0 || nd > KILN_MAX_DIMS)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use 0 to 8 dims", "%s: %d dims requested", op, nd);
    int64_t numel = 1, known = 1, shape[KILN_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++) numel *= t->shape[i];
    for (int i = 0; i < nd; i++) {
        shape[i] = attrs->ints[i];
        if (shape[i] == -1 && infer_at < 0)
            infer_at = i;
        else if (shape[i] < 0)
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use sizes >= 0 and at most one -1",
                              "%s: invalid size %lld at dim %d", op, (long long)shape[i], i);
        else
            known *= shape[i];
    }
    if (infer_at >= 0) shape[infer_at] = known ? numel / known : 0;
    int64_t total = 1;
    for (int i = 0; i < nd; i++) total *= shape[i];
    if (total != numel) {
        char a[128];
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "keep the number of elements",
                          "%s: cannot view a tensor of shape %s (%lld elements) with %lld elements", op,
                          kiln_shape_format(t->ndim, t->shape, a, sizeof a), (long long)numel,
                          (long long)total);
    }
    meta_from(out, t->dtype, nd, shape);
    return KILN_OK;
}

kiln_status kiln_infer_permute(const char *op, const kiln_op_attrs *attrs, int n_in, kiln_tensor *const *in,
                               kiln_meta *out, kiln_dtype *in_dtype) {
    (void)in_dtype;
    KILN_TRY(one_input(op, n_in, in));
    const kiln_tensor *t = in[0];
    if (attrs->n_dims != t->ndim)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give one entry per dim",
                          "%s: %d dims given for a tensor with %d dims", op, attrs->n_dims, t->ndim);
    bool seen[KILN_MAX_DIMS] = {false};
    int64_t shape[KILN_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++) {
        int d;
        if (!kiln_wrap_dim(attrs->dims[i], t->ndim, &d) || seen[d])
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give each dim exactly once",
                              "%s: dim %d at position %d is out of range or repeated", op, attrs->dims[i], i);
        seen[d] = true;
        shape[i] = t->shape[d];
    }
    meta_from(out, t->dtype, t->ndim, shape);
    return KILN_OK;
}

kiln_status kiln_infer_narrow(const char *op, const kiln_op_attrs *attrs, int n_in, kiln_tensor *const *in,
                              kiln_meta *out, kiln_dtype *in_dtype) {
    (void)in_dtype;
    KILN_TRY(one_input(op, n_in, in));
    const kiln_tensor *t = in[0];
    int d;
    if (!kiln_wrap_dim(attrs->dims[0], t->ndim, &d))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use a dim in range",
                          "%s: dim %d out of range for %d dims", op, attrs->dims[0], t->ndim);
    int64_t size = t->shape[d], start = attrs->ints[0];
    if (start < 0) start += size;
    int64_t len = attrs->n_ints >= 2 ? attrs->ints[1] : size - start;
    if (start < 0 || start > size || len < 0 || len > size - start)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "keep 0 <= start and start + length <= the dim's size",
                          "%s: start %lld, length %lld out of bounds for dim %d of size %lld", op,
                          (long long)start, (long long)len, d, (long long)size);
    meta_from(out, t->dtype, t->ndim, t->shape);
    out->shape[d] = len;
    return KILN_OK;
}

kiln_status kiln_infer_expand(const char *op, const kiln_op_attrs *attrs, int n_in, kiln_tensor *const *in,
                              kiln_meta *out, kiln_dtype *in_dtype) {
    (void)in_dtype;
    KILN_TRY(one_input(op, n_in, in));
    const kiln_tensor *t = in[0];
    int nd = attrs->n_ints, lead = nd - t->ndim;
    if (nd > KILN_MAX_DIMS || lead < 0)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                          "give at least as many dims as the tensor has (at most 8)",
                          "%s: %d dims given for a tensor with %d dims", op, nd, t->ndim);
    int64_t shape[KILN_MAX_DIMS];
    for (int i = 0; i < nd; i++) {
        int64_t want = attrs->ints[i], have = i >= lead ? t->shape[i - lead] : -2;
        if (want == -1 && have >= 0) want = have;
        bool ok = want >= 0 && (have == -2 || have == want || have == 1);
        if (!ok)
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "only size-1 dims expand; -1 keeps an existing dim",
                              "%s: cannot expand dim %d of size %lld to %lld", op, i, (long long)have,
                              (long long)attrs->ints[i]);
        shape[i] = want;
    }
    meta_from(out, t->dtype, nd, shape);
    return KILN_OK;
}

/* Views: new handles on the same storage with other shapes, strides and
 * offsets. Nothing here touches data except kiln_reshape and
 * kiln_contiguous, which copy when no view can express the result. */
#include <stdatomic.h>
#include <stdio.h>

#include "base/error.h"
#include "tensor/scope.h"
#include "tensor/tensor_internal.h"

#define SHAPE_TEXT 160

static _Atomic(kiln_view_hook) view_hook;

void kiln_tensor_set_view_hook(kiln_view_hook hook) { atomic_store(&view_hook, hook); }

/* Report a view (or copy) to autograd when it is listening. */
static kiln_tensor *recorded(kiln_view_kind kind, kiln_tensor *in, kiln_tensor *out, const kiln_op_attrs *attrs) {
    kiln_view_hook hook = atomic_load(&view_hook);
    if (!out || !hook) return out;
    kiln_op_attrs none = {0};
    return hook(kind, in, out, attrs ? attrs : &none);
}

kiln_tensor *kiln_tensor_recorded_copy(kiln_tensor *in, kiln_tensor *out) {
    return recorded(KILN_VIEW_KIND_COPY, in, out, NULL);
}

static const char *shape_text(const kiln_tensor *t, char *buf) {
    return kiln_shape_format(t->ndim, t->shape, buf, SHAPE_TEXT);
}

static kiln_status bad_dim(const char *fn, const kiln_tensor *t, int dim, int lo, int hi) {
    char a[SHAPE_TEXT];
    return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "negative dims count from the end",
                      "%s: dim %d is out of range for a tensor of shape %s (valid: %d to %d)", fn, dim,
                      shape_text(t, a), lo, hi);
}

/* Resolve a -1 size and check the element count against t's. */
static kiln_status infer_shape(const char *fn, const kiln_tensor *t, kiln_shape *shape) {
    char a[SHAPE_TEXT], b[SHAPE_TEXT];
    if (shape->ndim < 0 || shape->ndim > KILN_MAX_DIMS)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "a shape has at most 8 dims",
                          "%s: ndim = %d is out of range", fn, shape->ndim);
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < shape->ndim; i++) {
        if (shape->d[i] == -1 && infer < 0) {
            infer = i;
        } else if (shape->d[i] < 0) {
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "sizes are >= 0, with at most one -1 to infer",
                              "%s: invalid shape %s", fn,
                              kiln_shape_format(shape->ndim, shape->d, b, sizeof b));
        } else if (__builtin_mul_overflow(known, shape->d[i], &known)) {
            known = -1;
            break;
        }
    }
    int64_t numel = kiln_numel(t);
    if (infer >= 0 && known > 0 && numel % known == 0)
        shape->d[infer] = numel / known;
    else if (infer >= 0 && known == 0 && numel == 0)
        infer = -2; /* ambiguous, reported below */
    if (infer == -2 || (infer < 0 && known != numel) || (infer >= 0 && shape->d[infer] == -1))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "the new shape must have the same number of elements",
                          "%s: shape %s is invalid for a tensor of shape %s (%lld elements)", fn,
                          kiln_shape_format(shape->ndim, shape->d, b, sizeof b), shape_text(t, a),
                          (long long)numel);
    return KILN_OK;
}

/* PyTorch's computeStride (aten/src/ATen/TensorUtils.cpp): walk the old
 * dims from the back, grouping runs that are contiguous with each other
 * ("chunks"); each chunk must be split exactly into a run of new dims,
 * which then get strides that continue the chunk's base stride. A scalar
 * is treated as shape [1], stride [1]. */
static bool compute_view_strides(const kiln_tensor *t, const kiln_shape *shape, int64_t *out) {
    int old_nd = t->ndim ? t->ndim : 1;
    const int64_t one = 1;
    const int64_t *os = t->ndim ? t->shape : &one, *ost = t->ndim ? t->strides : &one;
    int64_t numel = kiln_numel(t);
    if (numel == 0) {
        kiln_contiguous_strides(shape->ndim, shape->d, out);
        return true;
    }
    int view_d = shape->ndim - 1;
    int64_t chunk_base = ost[old_nd - 1], tensor_numel = 1, view_numel = 1;
    for (int td = old_nd - 1; td >= 0; td--) {
        tensor_numel *= os[td];
        if (td == 0 || (os[td - 1] != 1 && ost[td - 1] != tensor_numel * chunk_base)) {
            while (view_d >= 0 && (view_numel < tensor_numel || shape->d[view_d] == 1)) {
                out[view_d] = view_numel * chunk_base;
                view_numel *= shape->d[view_d];
                view_d--;
            }
            if (view_numel != tensor_numel) return false;
            if (td > 0) {
                chunk_base = ost[td - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    return view_d == -1;
}

static kiln_tensor *view_impl(kiln_tensor *t, kiln_shape shape) {
    if (kiln_tensor_check(t, "kiln_view") || infer_shape("kiln_view", t, &shape)) return NULL;
    int64_t strides[KILN_MAX_DIMS];
    if (!compute_view_strides(t, &shape, strides)) {
        char a[SHAPE_TEXT], b[SHAPE_TEXT], c[SHAPE_TEXT];
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use kiln_reshape, which copies when a view is impossible",
                   "kiln_view: cannot view a tensor of shape %s with strides %s as shape %s: its strides are "
                   "not compatible with the new shape (it spans non-contiguous memory)",
                   shape_text(t, a), kiln_shape_format(t->ndim, t->strides, b, sizeof b),
                   kiln_shape_format(shape.ndim, shape.d, c, sizeof c));
        return NULL;
    }
    return kiln_tensor_alias(t, shape.ndim, shape.d, strides, t->offset);
}

kiln_tensor *kiln_view(kiln_tensor *t, kiln_shape shape) {
    kiln_api_enter();
    return kiln_api_return(recorded(KILN_VIEW_KIND_VIEW, t, view_impl(t, shape), NULL));
}

static kiln_tensor *reshape_impl(kiln_tensor *t, kiln_shape shape) {
    if (kiln_tensor_check(t, "kiln_reshape") || infer_shape("kiln_reshape", t, &shape)) return NULL;
    int64_t strides[KILN_MAX_DIMS];
    if (compute_view_strides(t, &shape, strides))
        return recorded(KILN_VIEW_KIND_VIEW, t, kiln_tensor_alias(t, shape.ndim, shape.d, strides, t->offset), NULL);
    kiln_tensor *c = kiln_contiguous(t);
    if (!c) return NULL;
    kiln_tensor *v = recorded(KILN_VIEW_KIND_VIEW, c, view_impl(c, shape), NULL);
    kiln_tensor_drop(c);
    return v;
}

kiln_tensor *kiln_reshape(kiln_tensor *t, kiln_shape shape) {
    kiln_api_enter();
    return kiln_api_return(reshape_impl(t, shape));
}

static kiln_tensor *permute_impl(kiln_tensor *t, int ndim, const int *dims) {
    if (kiln_tensor_check(t, "kiln_permute")) return NULL;
    char a[SHAPE_TEXT];
    if (ndim != t->ndim || (ndim && !dims)) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass one entry per dim of the tensor",
                   "kiln_permute: %d dims given for a tensor of shape %s", ndim, shape_text(t, a));
        return NULL;
    }
    int64_t shape[KILN_MAX_DIMS], strides[KILN_MAX_DIMS];
    bool seen[KILN_MAX_DIMS] = {false};
    for (int i = 0; i < ndim; i++) {
        int d;
        if (!kiln_wrap_dim(dims[i], ndim, &d)) {
            bad_dim("kiln_permute", t, dims[i], -ndim, ndim - 1);
            return NULL;
        }
        if (seen[d]) {
            KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "dims must be a permutation of 0 .. ndim-1",
                       "kiln_permute: dim %d appears twice for a tensor of shape %s", d, shape_text(t, a));
            return NULL;
        }
        seen[d] = true;
        shape[i] = t->shape[d];
        strides[i] = t->strides[d];
    }
    return kiln_tensor_alias(t, ndim, shape, strides, t->offset);
}

kiln_tensor *kiln_permute(kiln_tensor *t, int ndim, const int *dims) {
    kiln_api_enter();
    kiln_op_attrs a = {.n_dims = ndim};
    for (int i = 0; i < ndim && i < KILN_MAX_DIMS; i++) a.dims[i] = dims[i];
    return kiln_api_return(recorded(KILN_VIEW_KIND_PERMUTE, t, permute_impl(t, ndim, dims), &a));
}

static kiln_tensor *transpose_impl(kiln_tensor *t, int dim0, int dim1) {
    if (kiln_tensor_check(t, "kiln_transpose")) return NULL;
    /* A scalar transposes with dims 0/-1, as in PyTorch. */
    int nd = t->ndim ? t->ndim : 1, d0, d1;
    if (!kiln_wrap_dim(dim0, nd, &d0) || !kiln_wrap_dim(dim1, nd, &d1)) {
        bad_dim("kiln_transpose", t, kiln_wrap_dim(dim0, nd, &d0) ? dim1 : dim0, -nd, nd - 1);
        return NULL;
    }
    int64_t shape[KILN_MAX_DIMS], strides[KILN_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++) {
        shape[i] = t->shape[i];
        strides[i] = t->strides[i];
    }
    if (t->ndim) {
        shape[d0] = t->shape[d1], shape[d1] = t->shape[d0];
        strides[d0] = t->strides[d1], strides[d1] = t->strides[d0];
    }
    return kiln_tensor_alias(t, t->ndim, shape, strides, t->offset);
}

kiln_tensor *kiln_transpose(kiln_tensor *t, int dim0, int dim1) {
    kiln_api_enter();
    kiln_tensor *r = transpose_impl(t, dim0, dim1);
    kiln_op_attrs a = {.n_dims = r ? t->ndim : 0};
    for (int i = 0; i < a.n_dims; i++) a.dims[i] = i;
    if (r && t->ndim) {
        int d0, d1;
        kiln_wrap_dim(dim0, t->ndim, &d0);
        kiln_wrap_dim(dim1, t->ndim, &d1);
        a.dims[d0] = d1, a.dims[d1] = d0;
    }
    return kiln_api_return(recorded(KILN_VIEW_KIND_PERMUTE, t, r, &a));
}

static kiln_tensor *narrow_impl(kiln_tensor *t, int dim, int64_t start, int64_t length) {
    if (kiln_tensor_check(t, "kiln_narrow")) return NULL;
    int d;
    if (!kiln_wrap_dim(dim, t->ndim, &d)) {
        bad_dim("kiln_narrow", t, dim, -t->ndim, t->ndim - 1);
        return NULL;
    }
    int64_t size = t->shape[d];
    if (start < 0 && start >= -size) start += size; /* PyTorch: a negative start counts from the end */
    if (start < 0 || start > size || length < 0 || length > size - start) {
        char a[SHAPE_TEXT];
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "keep 0 <= start and start + length <= the dim's size",
                   "kiln_narrow: start %lld, length %lld is out of bounds for dim %d of size %lld (shape %s)",
                   (long long)start, (long long)length, d, (long long)size, shape_text(t, a));
        return NULL;
    }
    int64_t shape[KILN_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++) shape[i] = t->shape[i];
    shape[d] = length;
    return kiln_tensor_alias(t, t->ndim, shape, t->strides, t->offset + start * t->strides[d]);
}

kiln_tensor *kiln_narrow(kiln_tensor *t, int dim, int64_t start, int64_t length) {
    kiln_api_enter();
    kiln_tensor *r = narrow_impl(t, dim, start, length);
    kiln_op_attrs a = {.n_dims = 1, .n_ints = 1};
    if (r) {
        kiln_wrap_dim(dim, t->ndim, &a.dims[0]);
        a.ints[0] = start < 0 ? start + t->shape[a.dims[0]] : start;
    }
    return kiln_api_return(recorded(KILN_VIEW_KIND_NARROW, t, r, &a));
}

static kiln_tensor *expand_impl(kiln_tensor *t, kiln_shape shape) {
    if (kiln_tensor_check(t, "kiln_expand")) return NULL;
    char a[SHAPE_TEXT], b[SHAPE_TEXT];
    if (shape.ndim < t->ndim || shape.ndim > KILN_MAX_DIMS) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "the new shape needs at least as many dims as the tensor",
                   "kiln_expand: cannot expand shape %s to %s", shape_text(t, a),
                   kiln_shape_format(shape.ndim, shape.d, b, sizeof b));
        return NULL;
    }
    int64_t out_shape[KILN_MAX_DIMS], strides[KILN_MAX_DIMS];
    int lead = shape.ndim - t->ndim;
    for (int i = 0; i < shape.ndim; i++) {
        int64_t want = shape.d[i];
        bool ok;
        if (i < lead) { /* a new leading dim broadcasts */
            ok = want >= 0;
            out_shape[i] = want, strides[i] = 0;
        } else {
            int64_t have = t->shape[i - lead];
            if (want == -1) want = have;
            ok = want == have || (have == 1 && want >= 0);
            out_shape[i] = want;
            strides[i] = want == have ? t->strides[i - lead] : 0;
        }
        if (!ok) {
            KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                       "only size-1 dims expand; -1 keeps a dim; new leading dims must be >= 0",
                       "kiln_expand: cannot expand shape %s to %s (dim %d)", shape_text(t, a),
                       kiln_shape_format(shape.ndim, shape.d, b, sizeof b), i);
            return NULL;
        }
    }
    return kiln_tensor_alias(t, shape.ndim, out_shape, strides, t->offset);
}

kiln_tensor *kiln_expand(kiln_tensor *t, kiln_shape shape) {
    kiln_api_enter();
    return kiln_api_return(recorded(KILN_VIEW_KIND_EXPAND, t, expand_impl(t, shape), NULL));
}

static kiln_tensor *squeeze_impl(kiln_tensor *t, int dim) {
    if (kiln_tensor_check(t, "kiln_squeeze")) return NULL;
    int nd = t->ndim ? t->ndim : 1, d;
    if (!kiln_wrap_dim(dim, nd, &d)) {
        bad_dim("kiln_squeeze", t, dim, -nd, nd - 1);
        return NULL;
    }
    if (t->ndim == 0 || t->shape[d] != 1)
        return kiln_tensor_alias(t, t->ndim, t->shape, t->strides, t->offset);
    int64_t shape[KILN_MAX_DIMS], strides[KILN_MAX_DIMS];
    for (int i = 0, j = 0; i < t->ndim; i++) {
        if (i == d) continue;
        shape[j] = t->shape[i], strides[j] = t->strides[i];
        j++;
    }
    return kiln_tensor_alias(t, t->ndim - 1, shape, strides, t->offset);
}

kiln_tensor *kiln_squeeze(kiln_tensor *t, int dim) {
    kiln_api_enter();
    return kiln_api_return(recorded(KILN_VIEW_KIND_VIEW, t, squeeze_impl(t, dim), NULL));
}

static kiln_tensor *unsqueeze_impl(kiln_tensor *t, int dim) {
    if (kiln_tensor_check(t, "kiln_unsqueeze")) return NULL;
    int d;
    if (!kiln_wrap_dim(dim, t->ndim + 1, &d)) {
        bad_dim("kiln_unsqueeze", t, dim, -(t->ndim + 1), t->ndim);
        return NULL;
    }
    if (t->ndim == KILN_MAX_DIMS) {
        char a[SHAPE_TEXT];
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "merge dims with kiln_reshape first",
                   "kiln_unsqueeze: shape %s already has the maximum of %d dims", shape_text(t, a),
                   KILN_MAX_DIMS);
        return NULL;
    }
    int64_t shape[KILN_MAX_DIMS], strides[KILN_MAX_DIMS];
    for (int i = 0, j = 0; i <= t->ndim; i++) {
        if (i == d) {
            /* The stride a contiguous tensor would have there (PyTorch's). */
            shape[i] = 1;
            strides[i] = d < t->ndim ? t->shape[d] * t->strides[d] : 1;
        } else {
            shape[i] = t->shape[j], strides[i] = t->strides[j];
            j++;
        }
    }
    return kiln_tensor_alias(t, t->ndim + 1, shape, strides, t->offset);
}

kiln_tensor *kiln_unsqueeze(kiln_tensor *t, int dim) {
    kiln_api_enter();
    return kiln_api_return(recorded(KILN_VIEW_KIND_VIEW, t, unsqueeze_impl(t, dim), NULL));
}

static kiln_tensor *contiguous_impl(kiln_tensor *t) {
    if (kiln_tensor_check(t, "kiln_contiguous")) return NULL;
    if (kiln_is_contiguous(t)) return kiln_retain(t);
    kiln_tensor *c =
        kiln_tensor_alloc("kiln_contiguous", kiln_shape_of(t), t->dtype, t->storage->device, false);
    if (!c) return NULL;
    if (kiln_copy_(c, t, 0)) {
        kiln_tensor_drop(c);
        return NULL;
    }
    return recorded(KILN_VIEW_KIND_COPY, t, c, NULL);
}

kiln_tensor *kiln_contiguous(kiln_tensor *t) {
    kiln_api_enter();
    return kiln_api_return(contiguous_impl(t));
}

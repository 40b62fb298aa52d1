/* Public API of the shape and indexing ops (include/kiln/ops.h): cat,
 * stack, flatten, gather, pad, flip, embedding, randperm. stack and
 * flatten are composites of other public calls. */
#include <string.h>

#include "base/error.h"
#include "kiln/ops.h"
#include "ops/op_registry.h"
#include "runtime/runtime_internal.h"
#include "tensor/scope.h"
#include "tensor/tensor_internal.h"

#define CAT_MAX 16

kiln_tensor *(kiln_cat)(int n, kiln_tensor *const *tensors, int dim) {
    if (n < 1 || n > CAT_MAX || !tensors) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "concatenate 1 to 16 tensors per call (chain calls for more)",
                   "kiln_cat: %d tensors given", n);
        return NULL;
    }
    kiln_op_attrs at = {.dims = {dim}, .n_dims = 1};
    return kiln_dispatch_public(KILN_OP_CAT, n, tensors, &at, NULL);
}

static kiln_tensor *stack_impl(int n, kiln_tensor *const *tensors, int dim) {
    if (n < 1 || n > CAT_MAX || !tensors) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "stack 1 to 16 tensors per call",
                   "kiln_stack: %d tensors given", n);
        return NULL;
    }
    int nd = 0, d;
    for (int i = 0; i < n; i++) {
        if (kiln_tensor_check(tensors[i], "kiln_stack")) return NULL;
        if (i == 0) nd = kiln_ndim(tensors[0]);
    }
    if (!kiln_wrap_dim(dim, nd + 1, &d)) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use a dim in [-(ndim+1), ndim]",
                   "kiln_stack: dim %d is out of range for %d-d tensors", dim, nd);
        return NULL;
    }
    kiln_tensor *parts[CAT_MAX] = {NULL};
    kiln_tensor *out = NULL;
    for (int i = 0; i < n; i++) {
        if (kiln_ndim(tensors[i]) != nd) {
            KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "stack tensors of one shape",
                       "kiln_stack: tensor %d has %d dims but tensor 0 has %d", i, kiln_ndim(tensors[i]), nd);
            goto done;
        }
        if (!(parts[i] = kiln_unsqueeze(tensors[i], d))) goto done;
    }
    out = kiln_cat(n, parts, d);
done:
    for (int i = 0; i < n; i++)
        if (parts[i]) kiln_tensor_drop(parts[i]);
    return out;
}

kiln_tensor *(kiln_stack)(int n, kiln_tensor *const *tensors, int dim) {
    kiln_api_enter();
    return kiln_api_return(stack_impl(n, tensors, dim));
}

static kiln_tensor *flatten_impl(kiln_tensor *x, int start_dim, int end_dim) {
    if (kiln_tensor_check(x, "kiln_flatten")) return NULL;
    kiln_shape s = kiln_shape_of(x);
    if (s.ndim == 0) return kiln_reshape(x, KILN_SHAPE(1));
    int a, b;
    if (!kiln_wrap_dim(start_dim, s.ndim, &a) || !kiln_wrap_dim(end_dim, s.ndim, &b) || a > b) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use -ndim <= start_dim <= end_dim < ndim",
                   "kiln_flatten: dims %d..%d of a %d-d tensor", start_dim, end_dim, s.ndim);
        return NULL;
    }
    kiln_shape r = {.ndim = s.ndim - (b - a)};
    int64_t merged = 1;
    for (int i = a; i <= b; i++) merged *= s.d[i];
    for (int i = 0; i < a; i++) r.d[i] = s.d[i];
    r.d[a] = merged;
    for (int i = b + 1; i < s.ndim; i++) r.d[i - (b - a)] = s.d[i];
    return kiln_reshape(x, r);
}

kiln_tensor *(kiln_flatten)(kiln_tensor *x, int start_dim, int end_dim) {
    kiln_api_enter();
    return kiln_api_return(flatten_impl(x, start_dim, end_dim));
}

kiln_tensor *(kiln_gather)(kiln_tensor *x, int dim, kiln_tensor *index) {
    kiln_op_attrs at = {.dims = {dim}, .n_dims = 1};
    return kiln_dispatch_public(KILN_OP_GATHER, 2, (kiln_tensor *[]){x, index}, &at, NULL);
}

kiln_tensor *(kiln_pad)(kiln_tensor *x, int n_pairs, const int64_t *pads, double value) {
    if (n_pairs < 0 || n_pairs > KILN_MAX_DIMS || (n_pairs && !pads)) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass up to 8 (left, right) pairs",
                   "kiln_pad: %d pairs (pads %s)", n_pairs, pads ? "given" : "NULL");
        return NULL;
    }
    kiln_op_attrs at = {.n_ints = 2 * n_pairs, .scalar = {value}};
    if (n_pairs) memcpy(at.ints, pads, sizeof(int64_t) * 2 * (size_t)n_pairs);
    return kiln_dispatch_public(KILN_OP_PAD, 1, &x, &at, NULL);
}

kiln_tensor *(kiln_flip)(kiln_tensor *x, int n_dims, const int *dims) {
    if (n_dims < 0 || n_dims > KILN_MAX_DIMS || (n_dims && !dims)) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass up to 8 dims", "kiln_flip: %d dims", n_dims);
        return NULL;
    }
    kiln_op_attrs at = {.n_dims = n_dims};
    if (n_dims) memcpy(at.dims, dims, sizeof(int) * (size_t)n_dims);
    return kiln_dispatch_public(KILN_OP_FLIP, 1, &x, &at, NULL);
}

kiln_tensor *(kiln_embedding)(kiln_tensor *weight, kiln_tensor *indices) {
    kiln_op_attrs at = {0};
    return kiln_dispatch_public(KILN_OP_EMBEDDING, 2, (kiln_tensor *[]){weight, indices}, &at, NULL);
}

/* A creation op: the device comes from the caller, not from an input, so
 * this calls kiln_dispatch directly. Two words of the device's draw per
 * element feed the shuffle (kernels/cpu/ops_shape.c). */
kiln_tensor *(kiln_randperm)(int64_t n, kiln_device device) {
    kiln_api_enter();
    if (n < 0) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use n >= 0", "kiln_randperm: n is %lld", (long long)n);
        return kiln_api_return(NULL);
    }
    kiln_op_attrs at = {.ints = {n}, .n_ints = 1};
    at.rng = kiln_device_rng_reserve(device, 2 * (uint64_t)n);
    kiln_tensor *out[KILN_OP_MAX_OUT] = {NULL};
    if (kiln_dispatch(KILN_OP_RANDPERM, 0, NULL, &at, device, out)) return kiln_api_return(NULL);
    return kiln_api_return(out[0]);
}

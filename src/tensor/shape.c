/* Shape helpers: formatting for error messages, validation of shapes a
 * user passes in, row-major strides, dim wrapping. */
#include <stdio.h>

#include "base/error.h"
#include "tensor/tensor_internal.h"

const char *kiln_shape_format(int ndim, const int64_t *d, char *buf, size_t size) {
    if (ndim > KILN_MAX_DIMS) ndim = KILN_MAX_DIMS; /* a caller's bad ndim must not read past d */
    size_t used = 0;
    int n = snprintf(buf, size, "[");
    used = n > 0 ? (size_t)n : 0;
    for (int i = 0; i < ndim && used < size; i++) {
        n = snprintf(buf + used, size - used, i ? ", %lld" : "%lld", (long long)d[i]);
        if (n < 0) break;
        used += (size_t)n;
    }
    if (used < size) snprintf(buf + used, size - used, "]");
    return buf;
}

kiln_status kiln_shape_check(const char *fn, kiln_shape shape, kiln_dtype dtype, int64_t *numel) {
    if ((unsigned)dtype >= KILN_DTYPE_COUNT)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use one of KILN_F32 ... KILN_BOOL",
                          "%s: invalid dtype %d", fn, (int)dtype);
    if (shape.ndim < 0 || shape.ndim > KILN_MAX_DIMS)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "merge dims with kiln_reshape to stay within 8 dims",
                          "%s: a shape has 0 to %d dims, got ndim = %d", fn, KILN_MAX_DIMS, shape.ndim);
    char text[256];
    int64_t n = 1;
    bool overflow = false;
    for (int i = 0; i < shape.ndim; i++) {
        if (shape.d[i] < 0)
            return KILN_RAISE(
                KILN_ERR_INVALID_ARGUMENT, "sizes must be >= 0 (-1 is only inferred by kiln_view)",
                "%s: invalid shape %s: dim %d has negative size %lld", fn,
                kiln_shape_format(shape.ndim, shape.d, text, sizeof text), i, (long long)shape.d[i]);
        overflow |= __builtin_mul_overflow(n, shape.d[i], &n);
    }
    int64_t bytes;
    if (!overflow) overflow = __builtin_mul_overflow(n, (int64_t)kiln_dtype_size(dtype), &bytes);
    if (overflow)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                          "use smaller sizes (check for a garbage or uninitialised size)",
                          "%s: shape %s of %s needs more than 2^63 bytes", fn,
                          kiln_shape_format(shape.ndim, shape.d, text, sizeof text), kiln_dtype_name(dtype));
    if (numel) *numel = n;
    return KILN_OK;
}

void kiln_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i] > 1 ? shape[i] : 1;
    }
}

bool kiln_wrap_dim(int dim, int ndim, int *out) {
    if (dim < -ndim || dim >= ndim) return false;
    *out = dim < 0 ? dim + ndim : dim;
    return true;
}

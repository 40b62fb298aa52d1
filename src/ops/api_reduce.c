/* Public functions of the reduce group's reductions and softmax
 * (include/kiln/ops.h): each fills the op's attributes and goes through
 * the dispatcher. */
#include <string.h>

#include "base/error.h"
#include "kiln/ops.h"
#include "ops/op_registry.h"

/* attrs.dims from (n_dims, dims); false with the error set when invalid. */
static bool fill_dims(kiln_op_attrs *at, const char *fn, int n_dims, const int *dims, bool keepdim) {
    if (n_dims < 0 || n_dims > KILN_MAX_DIMS || (n_dims > 0 && !dims)) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass n_dims 0 (all dims), or 1 to 8 dims in an array",
                   "%s: n_dims %d with dims %s", fn, n_dims, dims ? "given" : "NULL");
        return false;
    }
    at->n_dims = n_dims;
    if (n_dims) memcpy(at->dims, dims, sizeof(int) * (size_t)n_dims);
    at->keepdim = keepdim;
    return true;
}

static kiln_tensor *reduce(kiln_op_id op, const char *fn, kiln_tensor *a, int n_dims, const int *dims,
                           bool keepdim, double p) {
    kiln_op_attrs at = {.scalar = {p}};
    if (!fill_dims(&at, fn, n_dims, dims, keepdim)) return NULL;
    return kiln_dispatch_public(op, 1, (kiln_tensor *[]){a}, &at, NULL);
}

kiln_tensor *(kiln_sum)(kiln_tensor *a, int n_dims, const int *dims, bool keepdim) {
    return reduce(KILN_OP_SUM, "kiln_sum", a, n_dims, dims, keepdim, 0);
}

kiln_tensor *(kiln_mean)(kiln_tensor *a, int n_dims, const int *dims, bool keepdim) {
    return reduce(KILN_OP_MEAN, "kiln_mean", a, n_dims, dims, keepdim, 0);
}

kiln_tensor *(kiln_max)(kiln_tensor *a, int n_dims, const int *dims, bool keepdim) {
    return reduce(KILN_OP_AMAX, "kiln_max", a, n_dims, dims, keepdim, 0);
}

kiln_tensor *(kiln_min)(kiln_tensor *a, int n_dims, const int *dims, bool keepdim) {
    return reduce(KILN_OP_AMIN, "kiln_min", a, n_dims, dims, keepdim, 0);
}

kiln_tensor *(kiln_norm)(kiln_tensor *a, double p, int n_dims, const int *dims, bool keepdim) {
    return reduce(KILN_OP_NORM, "kiln_norm", a, n_dims, dims, keepdim, p);
}

kiln_tensor *(kiln_argmax)(kiln_tensor *a, int dim, bool keepdim) {
    kiln_op_attrs at = {.n_dims = 1, .dims = {dim}, .keepdim = keepdim};
    return kiln_dispatch_public(KILN_OP_ARGMAX, 1, (kiln_tensor *[]){a}, &at, NULL);
}

kiln_tensor *(kiln_softmax)(kiln_tensor *a, int dim) {
    kiln_op_attrs at = {.n_dims = 1, .dims = {dim}};
    return kiln_dispatch_public(KILN_OP_SOFTMAX, 1, (kiln_tensor *[]){a}, &at, NULL);
}

kiln_tensor *(kiln_log_softmax)(kiln_tensor *a, int dim) {
    kiln_op_attrs at = {.n_dims = 1, .dims = {dim}};
    return kiln_dispatch_public(KILN_OP_LOG_SOFTMAX, 1, (kiln_tensor *[]){a}, &at, NULL);
}

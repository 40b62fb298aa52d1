/* Helpers shared by the backward formulas: see backward_util.h. */
#include "autograd/backward_util.h"

#include <string.h>

#include "base/error.h"
#include "kiln/ops.h"
#include "tensor/tensor_internal.h"

kiln_shape kiln_meta_shape(const kiln_meta *m) {
    kiln_shape s = {.ndim = m->ndim};
    memcpy(s.d, m->shape, sizeof(int64_t) * (size_t)m->ndim);
    return s;
}

void kiln_drop_all(int n, kiln_tensor **ts) {
    for (int i = 0; i < n; i++)
        if (ts[i]) kiln_tensor_drop(ts[i]), ts[i] = NULL;
}

static kiln_tensor *to_dtype(kiln_tensor *t, kiln_dtype dtype) {
    if (t->dtype == dtype) return t;
    kiln_tensor *c = kiln_to(t, kiln_get_device(t), dtype, 0);
    kiln_tensor_drop(t);
    return c;
}

kiln_tensor *kiln_sum_to_shape(kiln_tensor *g, const kiln_meta *target) {
    if (kiln_tensor_check(g, "kiln_sum_to_shape")) return NULL;
    int lead = g->ndim - target->ndim;
    if (lead < 0) {
        char a[128], b[128];
        KILN_RAISE(KILN_ERR_INTERNAL, "report this: a backward formula reduced a gradient to a larger shape",
                   "kiln_sum_to_shape: gradient %s has fewer dims than its target %s",
                   kiln_shape_format(g->ndim, g->shape, a, sizeof a),
                   kiln_shape_format(target->ndim, target->shape, b, sizeof b));
        return NULL;
    }
    int dims[KILN_MAX_DIMS], n = 0;
    for (int i = 0; i < g->ndim; i++)
        if (i < lead || (target->shape[i - lead] == 1 && g->shape[i] != 1)) dims[n++] = i;
    if (n == 0) return to_dtype(kiln_retain(g), target->dtype);
    kiln_tensor *s = kiln_sum(g, n, dims, true); /* size 1 on the summed dims */
    if (!s) return NULL;
    kiln_tensor *r = kiln_reshape(s, kiln_meta_shape(target));
    kiln_tensor_drop(s);
    if (!r) return NULL;
    return to_dtype(r, target->dtype);
}

kiln_tensor *kiln_grad_zeros(const kiln_meta *m, kiln_device d) {
    return kiln_zeros(kiln_meta_shape(m), m->dtype, d);
}

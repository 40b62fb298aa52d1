/* Shared inference helpers (op_infer.h): NumPy broadcasting, PyTorch's type
 * promotion for tensor operands, and tensor -> meta. Every op group builds
 * its inference functions on these. */
#include "ops/op_infer.h"

#include <string.h>

#include "base/error.h"
#include "tensor/tensor_internal.h"

kiln_status kiln_broadcast_shapes(const char *op, int nda, const int64_t *a, int ndb, const int64_t *b,
                                  int *nd_out, int64_t *out) {
    int nd = nda > ndb ? nda : ndb;
    int64_t res[KILN_MAX_DIMS];
    if (nd > KILN_MAX_DIMS) {
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use at most 8 dims",
                          "%s: broadcasting gives %d dims, more than %d", op, nd, KILN_MAX_DIMS);
    }
    /* Align from the right; a missing dim counts as 1. */
    for (int i = 0; i < nd; i++) {
        int ia = nda - nd + i, ib = ndb - nd + i;
        int64_t da = ia >= 0 ? a[ia] : 1;
        int64_t db = ib >= 0 ? b[ib] : 1;
        if (da == db || db == 1) {
            res[i] = da;
        } else if (da == 1) {
            res[i] = db;
        } else {
            char sa[128], sb[128];
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                              "sizes must be equal or 1 in each dim (counted from the last); "
                              "reshape or expand one operand",
                              "%s: shapes %s and %s do not broadcast (dim %d: %lld vs %lld)", op,
                              kiln_shape_format(nda, a, sa, sizeof sa),
                              kiln_shape_format(ndb, b, sb, sizeof sb), i - nd, (long long)da, (long long)db);
        }
    }
    *nd_out = nd;
    memcpy(out, res, (size_t)nd * sizeof(int64_t));
    return KILN_OK;
}

/* Rank in the promotion lattice; f16 and bf16 share a rank. */
static int promote_rank(kiln_dtype d) {
    switch (d) {
    case KILN_BOOL:
        return 0;
    case KILN_U8:
        return 1;
    case KILN_I32:
        return 2;
    case KILN_I64:
        return 3;
    case KILN_F16:
    case KILN_BF16:
        return 4;
    case KILN_F32:
        return 5;
    case KILN_F64:
        return 6;
    default:
        return -1;
    }
}

kiln_dtype kiln_promote_types(kiln_dtype a, kiln_dtype b) {
    if (a == b) return a;
    if ((a == KILN_F16 && b == KILN_BF16) || (a == KILN_BF16 && b == KILN_F16)) return KILN_F32;
    return promote_rank(a) >= promote_rank(b) ? a : b;
}

void kiln_meta_of(const kiln_tensor *t, kiln_meta *m) {
    m->dtype = t->dtype;
    m->ndim = t->ndim;
    memset(m->shape, 0, sizeof m->shape);
    memcpy(m->shape, t->shape, (size_t)t->ndim * sizeof(int64_t));
}

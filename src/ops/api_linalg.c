/* Public linear algebra (include/kiln/ops.h): mm, bmm and linear go
 * through the dispatcher; matmul is built from views, mm and bmm with
 * NumPy's rules (1-D operands gain a dim that is removed afterwards; batch
 * dims broadcast). Gradients flow through the views it makes. */
#include <string.h>

#include "base/error.h"
#include "kiln/ops.h"
#include "ops/op_infer.h"
#include "ops/op_registry.h"
#include "tensor/scope.h"
#include "tensor/tensor_internal.h"

kiln_tensor *(kiln_mm)(kiln_tensor *a, kiln_tensor *b) {
    return kiln_dispatch_public(KILN_OP_MM, 2, (kiln_tensor *[]){a, b}, NULL, NULL);
}

kiln_tensor *(kiln_bmm)(kiln_tensor *a, kiln_tensor *b) {
    return kiln_dispatch_public(KILN_OP_BMM, 2, (kiln_tensor *[]){a, b}, NULL, NULL);
}

kiln_tensor *(kiln_linear)(kiln_tensor *x, kiln_tensor *weight, kiln_tensor *bias) {
    return kiln_dispatch_public(KILN_OP_LINEAR, 3, (kiln_tensor *[]){x, weight, bias}, NULL, NULL);
}

kiln_tensor *(kiln_linear_act)(kiln_tensor *x, kiln_tensor *weight, kiln_tensor *bias,
                               kiln_activation activation) {
    kiln_op_attrs at = {.flag = (int)activation};
    return kiln_dispatch_public(KILN_OP_LINEAR_ACT, 3, (kiln_tensor *[]){x, weight, bias}, &at, NULL);
}

/* Takes the reference to t; returns a new one (or NULL) for `next`. */
static kiln_tensor *then(kiln_tensor *t, kiln_tensor *next) {
    kiln_tensor_drop(t);
    return next;
}

static kiln_tensor *reshape_to(kiln_tensor *t, int ndim, const int64_t *d) {
    kiln_shape s = {.ndim = ndim};
    memcpy(s.d, d, sizeof(int64_t) * (size_t)ndim);
    return kiln_reshape(t, s);
}

/* a (..., n, k) with b (k, m) or (k): fold a's batch into its rows, one mm. */
static kiln_tensor *matmul_folded(kiln_tensor *a, kiln_tensor *b) {
    int nd = a->ndim;
    int64_t rows = 1;
    for (int d = 0; d < nd - 1; d++) rows *= a->shape[d];
    int64_t shape[KILN_MAX_DIMS];
    memcpy(shape, a->shape, sizeof shape);
    kiln_tensor *a2 = reshape_to(a, 2, (int64_t[]){rows, a->shape[nd - 1]});
    kiln_tensor *b2 = b->ndim == 1 ? kiln_unsqueeze(b, 1) : kiln_retain(b);
    kiln_tensor *r = a2 && b2 ? kiln_mm(a2, b2) : NULL;
    if (a2) kiln_tensor_drop(a2);
    if (b2) kiln_tensor_drop(b2);
    if (!r) return NULL;
    int out_nd = b->ndim == 1 ? nd - 1 : nd;
    if (b->ndim == 2) shape[nd - 1] = b->shape[1];
    return then(r, reshape_to(r, out_nd, shape));
}

/* Both at least 2-D (1-D operands already unsqueezed): broadcast the batch
 * dims, run one bmm over (B, n, k) x (B, k, m), view as (batch..., n, m). */
static kiln_tensor *matmul_batched(kiln_tensor *a, kiln_tensor *b) {
    int na = a->ndim, nb = b->ndim, nd;
    int64_t batch[KILN_MAX_DIMS];
    if (kiln_broadcast_shapes("kiln_matmul", na - 2, a->shape, nb - 2, b->shape, &nd, batch)) return NULL;
    int64_t n = a->shape[na - 2], k = a->shape[na - 1], m = b->shape[nb - 1], count = 1;
    for (int d = 0; d < nd; d++) count *= batch[d];
    int64_t sa[KILN_MAX_DIMS], sb[KILN_MAX_DIMS], so[KILN_MAX_DIMS];
    memcpy(sa, batch, sizeof(int64_t) * (size_t)nd);
    memcpy(sb, batch, sizeof(int64_t) * (size_t)nd);
    memcpy(so, batch, sizeof(int64_t) * (size_t)nd);
    sa[nd] = n, sa[nd + 1] = k, sb[nd] = k, sb[nd + 1] = m, so[nd] = n, so[nd + 1] = m;
    kiln_shape ea = {.ndim = nd + 2}, eb = {.ndim = nd + 2};
    memcpy(ea.d, sa, sizeof(int64_t) * (size_t)(nd + 2));
    memcpy(eb.d, sb, sizeof(int64_t) * (size_t)(nd + 2));
    kiln_tensor *a3 = kiln_expand(a, ea), *b3 = kiln_expand(b, eb);
    if (a3) a3 = then(a3, reshape_to(a3, 3, (int64_t[]){count, n, k}));
    if (b3) b3 = then(b3, reshape_to(b3, 3, (int64_t[]){count, k, m}));
    kiln_tensor *r = a3 && b3 ? kiln_bmm(a3, b3) : NULL;
    if (a3) kiln_tensor_drop(a3);
    if (b3) kiln_tensor_drop(b3);
    return r ? then(r, reshape_to(r, nd + 2, so)) : NULL;
}

static kiln_tensor *matmul_impl(kiln_tensor *a, kiln_tensor *b) {
    if (kiln_tensor_check(a, "kiln_matmul") || kiln_tensor_check(b, "kiln_matmul")) return NULL;
    int na = a->ndim, nb = b->ndim;
    char sa[96], sb[96];
    if (na == 0 || nb == 0 || a->shape[na - 1] != b->shape[nb == 1 ? 0 : nb - 2]) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                   "matmul needs operands of at least 1 dim, a's last dim equal to b's "
                   "second to last (its only dim when 1-D)",
                   "kiln_matmul: shapes %s and %s do not fit", kiln_shape_format(na, a->shape, sa, sizeof sa),
                   kiln_shape_format(nb, b->shape, sb, sizeof sb));
        return NULL;
    }
    if (na == 2 && nb == 2) return kiln_mm(a, b);
    if (na >= 2 && nb <= 2) return matmul_folded(a, b);
    /* a 1-D becomes (1, k); b 1-D becomes (k, 1); the added dim goes away. */
    kiln_tensor *a2 = na == 1 ? kiln_unsqueeze(a, 0) : kiln_retain(a);
    kiln_tensor *b2 = nb == 1 ? kiln_unsqueeze(b, 1) : kiln_retain(b);
    kiln_tensor *r = NULL;
    if (a2 && b2) r = (a2->ndim == 2 && b2->ndim == 2) ? kiln_mm(a2, b2) : matmul_batched(a2, b2);
    if (a2) kiln_tensor_drop(a2);
    if (b2) kiln_tensor_drop(b2);
    if (!r) return NULL;
    int keep = r->ndim;
    int64_t shape[KILN_MAX_DIMS];
    memcpy(shape, r->shape, sizeof shape);
    if (nb == 1) shape[--keep] = 0; /* drop the last dim */
    if (na == 1) {                  /* drop the second to last of the original result */
        int at = r->ndim - 2;
        for (int d = at; d < keep - 1; d++) shape[d] = shape[d + 1];
        keep--;
    }
    return then(r, reshape_to(r, keep, shape));
}

kiln_tensor *(kiln_matmul)(kiln_tensor *a, kiln_tensor *b) {
    kiln_api_enter();
    return kiln_api_return(matmul_impl(a, b));
}

/* Fast CPU sum for f32 on a contiguous input whose reduced dims, once
 * adjacent dims of the same kind are merged, surround at most one block of
 * kept dims: x seen as (A, K, B), out[k] = sum over a, b of x[a, k, b]. That
 * covers a full reduction (K = 1), row sums (B reduced), column sums (A
 * reduced) and the per-channel sum of a convolution's bias gradient
 * (N, C, H*W -> C). Accumulates in double like the reference kernel, in a
 * fixed order (eight partial sums along b, combined pairwise; then over
 * a), so results repeat exactly; they may differ from the reference's
 * sequential sum in the last bits of the f32 result. */
#include "kernels/cpu/fast/fast_kernels.h"

typedef struct akb {
    int64_t A, K, B;
} akb;

static bool contiguous_f32(const kiln_strided *t) {
    if (t->dtype != KILN_F32) return false;
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != expect) return false;
        expect *= t->shape[i];
    }
    return true;
}

/* The (A, K, B) view of a sum, or false when the pattern does not fit. */
static bool plan(const kiln_op_args *a, akb *p) {
    const kiln_strided *x = &a->in[0];
    const kiln_op_attrs *at = a->attrs;
    int nd = x->ndim;
    if (!contiguous_f32(x) || !contiguous_f32(&a->out[0])) return false;
    bool red[KILN_MAX_DIMS] = {false};
    if (at->n_dims == 0)
        for (int d = 0; d < nd; d++) red[d] = true;
    else
        for (int i = 0; i < at->n_dims && nd > 0; i++) red[((at->dims[i] % nd) + nd) % nd] = true;
    /* phase 0: leading reduced dims, 1: kept block, 2: trailing reduced */
    int phase = 0;
    p->A = p->K = p->B = 1;
    for (int d = 0; d < nd; d++) {
        int64_t s = x->shape[d];
        if (s == 1) continue; /* either kind: no effect on the order */
        if (red[d]) {
            if (phase == 0) p->A *= s;
            else phase = 2, p->B *= s;
        } else {
            if (phase == 2) return false; /* a second kept block */
            phase = 1, p->K *= s;
        }
    }
    return true;
}

bool kiln_fast_sum_supports(const kiln_op_args *a) {
    akb p;
    return plan(a, &p);
}

/* sum of x[0..n) in double, eight partial sums combined pairwise. */
static double row_sum(const float *x, int64_t n) {
    double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) s[l] += (double)x[i + l];
    for (int l = 0; i < n; i++, l++) s[l] += (double)x[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

kiln_status kiln_fast_sum(const kiln_op_args *a) {
    akb p;
    if (!plan(a, &p))
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "kiln_sum: the fast kernel was given arguments it declines");
    const float *x = a->in[0].data;
    float *y = a->out[0].data;
    const int64_t A = p.A, K = p.K, B = p.B;
    if (B == 1 && K > 1) {
        /* column sums: walk rows in order, K accumulators */
        double *acc = a->workspace;
        for (int64_t k = 0; k < K; k++) acc[k] = 0;
        for (int64_t i = 0; i < A; i++)
            for (int64_t k = 0; k < K; k++) acc[k] += (double)x[i * K + k];
        for (int64_t k = 0; k < K; k++) y[k] = (float)acc[k];
        return KILN_OK;
    }
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (A * K * B >= 65536 && K > 1)
#endif
    for (int64_t k = 0; k < K; k++) {
        double s = 0;
        for (int64_t i = 0; i < A; i++) s += row_sum(x + (i * K + k) * B, B);
        y[k] = (float)s;
    }
    return KILN_OK;
}

size_t kiln_fast_sum_workspace(const kiln_op_args *a) {
    akb p;
    if (!plan(a, &p) || !(p.B == 1 && p.K > 1)) return 0;
    return (size_t)p.K * sizeof(double);
}

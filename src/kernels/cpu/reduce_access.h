/* Element access and index iteration shared by the CPU reference kernels of
 * the reduce group (reductions, softmax, losses, linear algebra).
 *
 * Values are loaded as double (floating dtypes; f16/bf16 widened through
 * f32) or as int64 (integer dtypes, exact), so one loop serves every dtype;
 * accumulation is in double (or int64 for integer sums). Speed is the next
 * issue's business: these kernels are the reference the fast ones are held
 * against. */
#ifndef KILN_SRC_KERNELS_CPU_REDUCE_ACCESS_H
#define KILN_SRC_KERNELS_CPU_REDUCE_ACCESS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/dtype_access.h"
#include "kernels/op_args.h"

/* An odometer over a shape that keeps up to three element offsets (one
 * per operand) in step. After the last position it wraps to all zeros. */
typedef struct rk_iter {
    int n;
    int64_t shape[KILN_MAX_DIMS];
    int64_t idx[KILN_MAX_DIMS];
    int64_t stride[3][KILN_MAX_DIMS];
    int64_t off[3];
} rk_iter;

static inline void rk_iter_next(rk_iter *it) {
    for (int d = it->n - 1; d >= 0; d--) {
        if (++it->idx[d] < it->shape[d]) {
            for (int k = 0; k < 3; k++) it->off[k] += it->stride[k][d];
            return;
        }
        for (int k = 0; k < 3; k++) it->off[k] -= it->stride[k][d] * (it->shape[d] - 1);
        it->idx[d] = 0;
    }
}

static inline int64_t rk_iter_count(const rk_iter *it) {
    int64_t n = 1;
    for (int d = 0; d < it->n; d++) n *= it->shape[d];
    return n;
}

/* The reduction layout of `in` -> `out` for attrs.dims / n_dims / keepdim
 * (n_dims 0: every dim). outer walks the kept dims (off[0] input, off[1]
 * output); inner walks the reduced dims in row-major order (off[0] input),
 * so its step count is the flat index within the reduced block. */
typedef struct rk_plan {
    rk_iter outer, inner;
    int64_t n_out, n_red;
} rk_plan;

static inline void rk_plan_make(rk_plan *p, const kiln_strided *in, const kiln_strided *out,
                                const kiln_op_attrs *at) {
    bool red[KILN_MAX_DIMS] = {false};
    int nd = in->ndim;
    if (at->n_dims == 0) {
        for (int d = 0; d < nd; d++) red[d] = true;
    } else {
        for (int i = 0; i < at->n_dims && nd > 0; i++) red[((at->dims[i] % nd) + nd) % nd] = true;
    }
    memset(p, 0, sizeof *p);
    int j = 0;
    for (int d = 0; d < nd; d++) {
        if (red[d]) {
            int r = p->inner.n++;
            p->inner.shape[r] = in->shape[d];
            p->inner.stride[0][r] = in->strides[d];
            if (at->keepdim) j++;
        } else {
            int k = p->outer.n++;
            p->outer.shape[k] = in->shape[d];
            p->outer.stride[0][k] = in->strides[d];
            p->outer.stride[1][k] = out->strides[j++];
        }
    }
    p->n_out = rk_iter_count(&p->outer);
    p->n_red = rk_iter_count(&p->inner);
}

/* Rows along one dim: outer walks every other dim of up to three tensors of
 * one shape (s0, s1, s2 give their strides; NULL for an unused operand),
 * len and step[k] describe the row. A 0-dim tensor is one row of length 1. */
typedef struct rk_rows {
    rk_iter outer;
    int64_t len;
    int64_t step[3];
} rk_rows;

static inline void rk_rows_make(rk_rows *r, int ndim, const int64_t *shape, int dim, const int64_t *s0,
                                const int64_t *s1, const int64_t *s2) {
    const int64_t *s[3] = {s0, s1, s2};
    memset(r, 0, sizeof *r);
    r->len = 1;
    if (ndim == 0) return;
    dim = ((dim % ndim) + ndim) % ndim;
    for (int d = 0; d < ndim; d++) {
        if (d == dim) {
            r->len = shape[d];
            for (int k = 0; k < 3; k++) r->step[k] = s[k] ? s[k][d] : 0;
            continue;
        }
        int o = r->outer.n++;
        r->outer.shape[o] = shape[d];
        for (int k = 0; k < 3; k++) r->outer.stride[k][o] = s[k] ? s[k][d] : 0;
    }
}

#endif

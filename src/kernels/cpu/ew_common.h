/* Shared machinery of the CPU elementwise kernels (ops_elementwise.c,
 * ops_activation.c): per-dtype loads and stores, and an iterator over any
 * number of operands that all have the output's shape (broadcast inputs
 * arrive with stride-0 dims, see kernels/op_args.h).
 *
 * Floating dtypes are computed in double (f16/bf16 convert per element),
 * integer dtypes in int64 with wrapping arithmetic, so one scalar function
 * per op serves every dtype. Kernels instantiate their loops with a
 * constant dtype (always_inline), so the dtype switches fold away. */
#ifndef KILN_SRC_KERNELS_CPU_EW_COMMON_H
#define KILN_SRC_KERNELS_CPU_EW_COMMON_H

#include <stdint.h>
#include <string.h>

#include "kernels/cpu/dtype_access.h"
#include "kernels/op_args.h"

#define EW_INLINE  static inline __attribute__((always_inline))
#define EW_MAX_OPS 4


EW_INLINE int ew_is_float(kiln_dtype dt) {
    return dt == KILN_F32 || dt == KILN_F64 || dt == KILN_F16 || dt == KILN_BF16;
}

/* ---- Iteration ------------------------------------------------------------------------
 * Size-1 dims are dropped and neighbouring dims merged where every operand
 * is contiguous across them, so dense tensors run as one row. Row-major
 * order is kept: the k-th element visited is the output's flat index k
 * (dropout's draw depends on that). */
typedef struct ew_iter {
    int n;    /* operands */
    int ndim; /* >= 1 after simplification */
    int64_t shape[KILN_MAX_DIMS];
    int64_t st[EW_MAX_OPS][KILN_MAX_DIMS];
    int64_t numel;
} ew_iter;

static inline void ew_init(ew_iter *it, int n, const kiln_strided *const *v) {
    const kiln_strided *o = v[0];
    int nd = 0;
    it->n = n;
    it->numel = 1;
    for (int d = 0; d < o->ndim; d++) {
        it->numel *= o->shape[d];
        if (o->shape[d] == 1) continue;
        it->shape[nd] = o->shape[d];
        for (int k = 0; k < n; k++) it->st[k][nd] = v[k]->strides[d];
        nd++;
    }
    if (nd == 0) {
        it->shape[0] = 1;
        for (int k = 0; k < n; k++) it->st[k][0] = 0;
        nd = 1;
    }
    /* Merge dim j into j-1 when stride[j-1] == stride[j] * shape[j] for all. */
    int w = 0;
    for (int j = 1; j < nd; j++) {
        bool merge = true;
        for (int k = 0; k < n; k++) merge = merge && it->st[k][w] == it->st[k][j] * it->shape[j];
        if (merge) {
            it->shape[w] *= it->shape[j];
            for (int k = 0; k < n; k++) it->st[k][w] = it->st[k][j];
        } else {
            w++;
            it->shape[w] = it->shape[j];
            for (int k = 0; k < n; k++) it->st[k][w] = it->st[k][j];
        }
    }
    it->ndim = w + 1;
}

/* Advance the outer counter (all dims but the last) and the operands'
 * offsets by one row. */
static inline void ew_next_row(const ew_iter *it, int64_t *idx, int64_t *off) {
    for (int d = it->ndim - 2; d >= 0; d--) {
        idx[d]++;
        for (int k = 0; k < it->n; k++) off[k] += it->st[k][d];
        if (idx[d] < it->shape[d]) return;
        for (int k = 0; k < it->n; k++) off[k] -= it->st[k][d] * it->shape[d];
        idx[d] = 0;
    }
}

/* Runs the body (the variadic part) for every element: `o0..o3` are the operands' element offsets,
 * `flat` the output's flat index. */
#define EW_FOR_EACH(it, ...)                                                                                 \
    do {                                                                                                     \
        int64_t ew_idx_[KILN_MAX_DIMS] = {0}, ew_off_[EW_MAX_OPS] = {0};                                     \
        int64_t ew_inner_ = (it).shape[(it).ndim - 1];                                                       \
        int64_t ew_rows_ = ew_inner_ ? (it).numel / ew_inner_ : 0;                                           \
        int64_t s0_ = (it).st[0][(it).ndim - 1], s1_ = (it).n > 1 ? (it).st[1][(it).ndim - 1] : 0;           \
        int64_t s2_ = (it).n > 2 ? (it).st[2][(it).ndim - 1] : 0;                                            \
        int64_t s3_ = (it).n > 3 ? (it).st[3][(it).ndim - 1] : 0;                                            \
        for (int64_t ew_r_ = 0; ew_r_ < ew_rows_; ew_r_++) {                                                 \
            for (int64_t ew_i_ = 0; ew_i_ < ew_inner_; ew_i_++) {                                            \
                int64_t o0 = ew_off_[0] + ew_i_ * s0_, o1 = ew_off_[1] + ew_i_ * s1_;                        \
                int64_t o2 = ew_off_[2] + ew_i_ * s2_, o3 = ew_off_[3] + ew_i_ * s3_;                        \
                int64_t flat = ew_r_ * ew_inner_ + ew_i_;                                                    \
                (void)o0, (void)o1, (void)o2, (void)o3, (void)flat;                                          \
                __VA_ARGS__;                                                                                 \
            }                                                                                                \
            ew_next_row(&(it), ew_idx_, ew_off_);                                                            \
        }                                                                                                    \
    } while (0)

#endif

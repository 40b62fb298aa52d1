/* Shared helpers of the nn group's CUDA kernels (ops_conv.cu, ops_pool.cu,
 * ops_nn.cu, ops_index.cu): per-dtype element loads and stores with the
 * CPU reference kernels' rules (kernels/cpu/nn_cpu_util.h), index checks,
 * and small launch helpers.
 *
 * f16/bf16 conversions are cuda_dtype.h's integer ports of src/base/half.c
 * (not the cuda_fp16 intrinsics), so every value converts to the same bits
 * as on the CPU backend, under nvcc and in the emulator alike. Stores into
 * integer dtypes follow nn_cpu_util.h's nn_st/nn_sti (the nn group's CPU
 * rules), which is why the group keeps its own load/store wrappers.
 *
 * Determinism: no kernel of the group uses floating-point atomics; every
 * sum runs in a fixed order, so results repeat bit for bit. */
#ifndef KILN_SRC_KERNELS_CUDA_NN_COMMON_H
#define KILN_SRC_KERNELS_CUDA_NN_COMMON_H

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_dtype.h"

namespace kiln_nn {

using kiln_cuda::view;

constexpr int kThreads = kiln_cuda::kThreads;

using kiln_cuda::bf16_bits_to_f32;
using kiln_cuda::f16_bits_to_f32;
using kiln_cuda::f32_to_bf16_bits;
using kiln_cuda::f32_to_f16_bits;

/* Element `off` of data with dtype dt, as double (nn_ld). */
KILN_HD inline double ldf(const void *p, int dt, int64_t off) {
    switch (dt) {
    case KILN_F32:
        return ((const float *)p)[off];
    case KILN_F64:
        return ((const double *)p)[off];
    case KILN_F16:
        return f16_bits_to_f32(((const uint16_t *)p)[off]);
    case KILN_BF16:
        return bf16_bits_to_f32(((const uint16_t *)p)[off]);
    case KILN_I32:
        return ((const int32_t *)p)[off];
    case KILN_I64:
        return (double)((const int64_t *)p)[off];
    case KILN_U8:
        return ((const uint8_t *)p)[off];
    case KILN_BOOL:
        return ((const uint8_t *)p)[off] != 0;
    default:
        return 0.0;
    }
}

/* A floating element in the compute type T (float for f32/f16/bf16 data,
 * double for f64), without the round trip through double for float. */
template <typename T> KILN_HD inline T ldc(const void *p, int dt, int64_t off) {
    switch (dt) {
    case KILN_F32:
        return (T)((const float *)p)[off];
    case KILN_F16:
        return (T)f16_bits_to_f32(((const uint16_t *)p)[off]);
    case KILN_BF16:
        return (T)bf16_bits_to_f32(((const uint16_t *)p)[off]);
    default:
        return (T)ldf(p, dt, off);
    }
}

/* Store v into element `off` (nn_st: integers take the value truncated). */
KILN_HD inline void stf(void *p, int dt, int64_t off, double v) {
    switch (dt) {
    case KILN_F32:
        ((float *)p)[off] = (float)v;
        break;
    case KILN_F64:
        ((double *)p)[off] = v;
        break;
    case KILN_F16:
        ((uint16_t *)p)[off] = f32_to_f16_bits((float)v);
        break;
    case KILN_BF16:
        ((uint16_t *)p)[off] = f32_to_bf16_bits((float)v);
        break;
    case KILN_I32:
        ((int32_t *)p)[off] = (int32_t)v;
        break;
    case KILN_I64:
        ((int64_t *)p)[off] = (int64_t)v;
        break;
    case KILN_U8:
        ((uint8_t *)p)[off] = (uint8_t)(int64_t)v;
        break;
    case KILN_BOOL:
        ((uint8_t *)p)[off] = v != 0.0;
        break;
    default:
        break;
    }
}

/* Integer element, exact for i64 (nn_ldi). */
KILN_HD inline int64_t ldi(const void *p, int dt, int64_t off) {
    switch (dt) {
    case KILN_I64:
        return ((const int64_t *)p)[off];
    case KILN_I32:
        return ((const int32_t *)p)[off];
    case KILN_U8:
        return ((const uint8_t *)p)[off];
    case KILN_BOOL:
        return ((const uint8_t *)p)[off] != 0;
    default:
        return (int64_t)ldf(p, dt, off);
    }
}

/* nn_sti: integers wrap modulo 2^bits. */
KILN_HD inline void sti(void *p, int dt, int64_t off, int64_t v) {
    switch (dt) {
    case KILN_I64:
        ((int64_t *)p)[off] = v;
        break;
    case KILN_I32:
        ((int32_t *)p)[off] = (int32_t)(uint32_t)(uint64_t)v;
        break;
    case KILN_U8:
        ((uint8_t *)p)[off] = (uint8_t)(uint64_t)v;
        break;
    case KILN_BOOL:
        ((uint8_t *)p)[off] = v != 0;
        break;
    default:
        stf(p, dt, off, (double)v);
        break;
    }
}

/* Copy one element of `size` bytes bit for bit. */
KILN_HD inline void copy_elem(void *dst, int64_t doff, const void *src, int64_t soff, int size) {
    switch (size) {
    case 8:
        ((uint64_t *)dst)[doff] = ((const uint64_t *)src)[soff];
        break;
    case 4:
        ((uint32_t *)dst)[doff] = ((const uint32_t *)src)[soff];
        break;
    case 2:
        ((uint16_t *)dst)[doff] = ((const uint16_t *)src)[soff];
        break;
    default:
        ((uint8_t *)dst)[doff] = ((const uint8_t *)src)[soff];
        break;
    }
}

/* Row-major coordinates of linear index i of shape (ndim dims). */
KILN_HD inline void coords_of(int ndim, const int64_t *shape, int64_t i, int64_t *c) {
    for (int k = ndim - 1; k >= 0; k--) {
        int64_t d = shape[k];
        c[k] = d ? i % d : 0;
        i = d ? i / d : 0;
    }
}

KILN_HD inline int64_t dot_strides(int ndim, const int64_t *strides, const int64_t *c) {
    int64_t off = 0;
    for (int k = 0; k < ndim; k++) off += c[k] * strides[k];
    return off;
}

/* A view with `shape` and `strides` (first ndim of each). */
inline view make_view(int ndim, const int64_t *shape, const int64_t *strides) {
    view v;
    memset(&v, 0, sizeof v);
    v.ndim = ndim;
    for (int k = 0; k < ndim; k++) {
        v.shape[k] = shape[k];
        v.strides[k] = strides[k];
    }
    return v;
}

/* Whether an optional input was given (the dispatcher passes ndim < 0 for
 * a missing one). */
inline bool present(const kiln_strided *t) { return t->ndim >= 0 && t->data != nullptr; }

/* Blocks for a one-dimensional launch of `work` items with a cap. */
inline unsigned blocks_for(int64_t work) { return kiln_cuda::grid_for(work); }

} // namespace kiln_nn

#endif

/* Element access and strided iteration for the CPU kernels of the nn group
 * (conv, pooling, batch norm, shape and indexing ops). Floating values
 * travel as double, integers as int64; f16/bf16 convert per element. */
#ifndef KILN_SRC_KERNELS_CPU_NN_CPU_UTIL_H
#define KILN_SRC_KERNELS_CPU_NN_CPU_UTIL_H

#include <string.h>

#include "kernels/op_args.h"

/* Element `off` (in elements) of data with dtype dt, as double. */
static inline double nn_ld(const void *data, kiln_dtype dt, int64_t off) {
    switch (dt) {
    case KILN_F32:
        return ((const float *)data)[off];
    case KILN_F64:
        return ((const double *)data)[off];
    case KILN_F16:
        return kiln_f16_to_f32(((const uint16_t *)data)[off]);
    case KILN_BF16:
        return kiln_bf16_to_f32(((const uint16_t *)data)[off]);
    case KILN_I32:
        return ((const int32_t *)data)[off];
    case KILN_I64:
        return (double)((const int64_t *)data)[off];
    case KILN_U8:
        return ((const uint8_t *)data)[off];
    case KILN_BOOL:
        return ((const uint8_t *)data)[off] != 0;
    default:
        return 0.0;
    }
}

/* Store v into element `off`; integer dtypes take the value truncated. */
static inline void nn_st(void *data, kiln_dtype dt, int64_t off, double v) {
    switch (dt) {
    case KILN_F32:
        ((float *)data)[off] = (float)v;
        break;
    case KILN_F64:
        ((double *)data)[off] = v;
        break;
    case KILN_F16:
        ((uint16_t *)data)[off] = kiln_f32_to_f16((float)v);
        break;
    case KILN_BF16:
        ((uint16_t *)data)[off] = kiln_f32_to_bf16((float)v);
        break;
    case KILN_I32:
        ((int32_t *)data)[off] = (int32_t)v;
        break;
    case KILN_I64:
        ((int64_t *)data)[off] = (int64_t)v;
        break;
    case KILN_U8:
        ((uint8_t *)data)[off] = (uint8_t)(int64_t)v;
        break;
    case KILN_BOOL:
        ((uint8_t *)data)[off] = v != 0.0;
        break;
    default:
        break;
    }
}

/* Integer element (indices, integer scatter sums), exact for i64. */
static inline int64_t nn_ldi(const void *data, kiln_dtype dt, int64_t off) {
    switch (dt) {
    case KILN_I64:
        return ((const int64_t *)data)[off];
    case KILN_I32:
        return ((const int32_t *)data)[off];
    case KILN_U8:
        return ((const uint8_t *)data)[off];
    case KILN_BOOL:
        return ((const uint8_t *)data)[off] != 0;
    default:
        return (int64_t)nn_ld(data, dt, off);
    }
}

static inline void nn_sti(void *data, kiln_dtype dt, int64_t off, int64_t v) {
    switch (dt) {
    case KILN_I64:
        ((int64_t *)data)[off] = v;
        break;
    case KILN_I32:
        ((int32_t *)data)[off] = (int32_t)(uint32_t)(uint64_t)v;
        break;
    case KILN_U8:
        ((uint8_t *)data)[off] = (uint8_t)(uint64_t)v;
        break;
    case KILN_BOOL:
        ((uint8_t *)data)[off] = v != 0;
        break;
    default:
        nn_st(data, dt, off, (double)v);
        break;
    }
}

/* Copy one element of `size` bytes (any dtype, bit exact). */
static inline void nn_copy_elem(void *dst, int64_t doff, const void *src, int64_t soff, size_t size) {
    memcpy((char *)dst + doff * (int64_t)size, (const char *)src + soff * (int64_t)size, size);
}

static inline int64_t nn_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

/* Row-major strides of a dense tensor with this shape. */
static inline void nn_dense_strides(int ndim, const int64_t *shape, int64_t *strides) {
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        strides[d] = s;
        s *= shape[d] > 0 ? shape[d] : 1;
    }
}

/* Row-major multi-index counter over a shape: nn_next advances idx and
 * returns false after the last element. */
static inline bool nn_next(int ndim, const int64_t *shape, int64_t *idx) {
    for (int d = ndim - 1; d >= 0; d--) {
        if (++idx[d] < shape[d]) return true;
        idx[d] = 0;
    }
    return false;
}

static inline int64_t nn_offset(int ndim, const int64_t *strides, const int64_t *idx) {
    int64_t off = 0;
    for (int d = 0; d < ndim; d++) off += idx[d] * strides[d];
    return off;
}

#endif

/* Per-dtype element loads and stores shared by the CPU reference kernels.
 *
 * Floating values travel as double (f16/bf16 widened through f32), integer
 * values as int64 (exact), so one scalar loop serves every dtype; callers
 * that instantiate a loop with a constant dtype get the switches folded
 * away (always_inline). Stores of a double into an integer dtype go through
 * a saturating conversion, so an out-of-range value is clamped instead of
 * being undefined behaviour; integer stores wrap modulo 2^bits (GCC and
 * Clang define the narrowing conversion that way); bool stores x != 0. */
#ifndef KILN_SRC_KERNELS_CPU_DTYPE_ACCESS_H
#define KILN_SRC_KERNELS_CPU_DTYPE_ACCESS_H

#include <math.h>
#include <stdint.h>

#include "kernels/op_args.h"

#define KILN_CPU_INLINE static inline __attribute__((always_inline))

KILN_CPU_INLINE bool kiln_cpu_is_float(kiln_dtype dt) {
    return dt == KILN_F32 || dt == KILN_F64 || dt == KILN_F16 || dt == KILN_BF16;
}

KILN_CPU_INLINE size_t kiln_cpu_elem_size(kiln_dtype dt) {
    switch (dt) {
    case KILN_F64:
    case KILN_I64: return 8;
    case KILN_F32:
    case KILN_I32: return 4;
    case KILN_F16:
    case KILN_BF16: return 2;
    default: return 1;
    }
}

KILN_CPU_INLINE double kiln_cpu_ld_f(const void *p, kiln_dtype dt, int64_t i) {
    switch (dt) {
    case KILN_F32: return ((const float *)p)[i];
    case KILN_F64: return ((const double *)p)[i];
    case KILN_F16: return kiln_f16_to_f32(((const uint16_t *)p)[i]);
    case KILN_BF16: return kiln_bf16_to_f32(((const uint16_t *)p)[i]);
    case KILN_I32: return ((const int32_t *)p)[i];
    case KILN_I64: return (double)((const int64_t *)p)[i];
    case KILN_U8: return ((const uint8_t *)p)[i];
    case KILN_BOOL: return ((const uint8_t *)p)[i] != 0;
    default: return 0;
    }
}

/* NaN -> 0; beyond int64's range -> its nearest bound; else truncation. */
KILN_CPU_INLINE int64_t kiln_cpu_f64_to_i64(double v) {
    if (isnan(v)) return 0;
    if (v >= 9223372036854775807.0) return INT64_MAX;
    if (v <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)v;
}

KILN_CPU_INLINE int64_t kiln_cpu_ld_i(const void *p, kiln_dtype dt, int64_t i) {
    switch (dt) {
    case KILN_I32: return ((const int32_t *)p)[i];
    case KILN_I64: return ((const int64_t *)p)[i];
    case KILN_U8: return ((const uint8_t *)p)[i];
    case KILN_BOOL: return ((const uint8_t *)p)[i] != 0;
    default: return kiln_cpu_f64_to_i64(kiln_cpu_ld_f(p, dt, i));
    }
}

KILN_CPU_INLINE void kiln_cpu_st_i(void *p, kiln_dtype dt, int64_t i, int64_t v) {
    switch (dt) {
    case KILN_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case KILN_I64: ((int64_t *)p)[i] = v; break;
    case KILN_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case KILN_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    case KILN_F32: ((float *)p)[i] = (float)v; break;
    case KILN_F64: ((double *)p)[i] = (double)v; break;
    case KILN_F16: ((uint16_t *)p)[i] = kiln_f32_to_f16((float)v); break;
    case KILN_BF16: ((uint16_t *)p)[i] = kiln_f32_to_bf16((float)v); break;
    default: break;
    }
}

KILN_CPU_INLINE void kiln_cpu_st_f(void *p, kiln_dtype dt, int64_t i, double v) {
    switch (dt) {
    case KILN_F32: ((float *)p)[i] = (float)v; break;
    case KILN_F64: ((double *)p)[i] = v; break;
    case KILN_F16: ((uint16_t *)p)[i] = kiln_f32_to_f16((float)v); break;
    case KILN_BF16: ((uint16_t *)p)[i] = kiln_f32_to_bf16((float)v); break;
    case KILN_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    default: kiln_cpu_st_i(p, dt, i, kiln_cpu_f64_to_i64(v)); break;
    }
}

#endif

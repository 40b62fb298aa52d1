/* Device helpers shared by the CUDA op kernels (src/kernels/cuda/ops_*.cu):
 * element loads and stores for every kiln_dtype, the compute type of each
 * dtype, strided index math over merged dimensions, and a deterministic
 * block reduction. Include after cuda_common.h. Everything is
 * __host__ __device__ (KILN_HD) plain C++: no intrinsics, so the same code
 * runs under nvcc and in the emulator (src/emu/).
 *
 * Conversions (the rules of tensor_kernels.cu's header comment, which the
 * CPU kernels also follow, so both backends store the same bits):
 *   - f16/bf16 <-> f32 are integer arithmetic on the bit patterns, a port
 *     of src/base/half.c: round to nearest even, overflow to infinity, NaN
 *     kept quiet with its top payload bits. Values a kernel computes in f32
 *     or f64 reach f16/bf16 through f32 (f64 -> f32 -> f16, as the CPU's
 *     kiln_f32_to_f16((float)v));
 *   - a floating value stored into an integer dtype truncates toward zero,
 *     NaN -> 0, saturating to int64's range, then wraps to the dtype's
 *     width (the CPU's kiln_cpu_st_f); an integer value stored into an
 *     integer dtype wraps (two's complement); bool stores x != 0.
 *
 * Compute types (dt<D>::C): f32, f16 and bf16 compute in float, f64 in
 * double, integer dtypes and bool in int64 (wrapping arithmetic through
 * uint64, as the CPU kernels). Reductions accumulate floating values in
 * double (acc_t), integers in int64. */
#ifndef KILN_SRC_KERNELS_CUDA_CUDA_DTYPE_H
#define KILN_SRC_KERNELS_CUDA_CUDA_DTYPE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cuda/cuda_common.h"

namespace kiln_cuda {

/* ---- Bits ------------------------------------------------------------------------ */

KILN_HD inline uint32_t f32_as_bits(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

KILN_HD inline float bits_as_f32(uint32_t b) {
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* ---- f16 / bf16 (src/base/half.c, bit for bit) ----------------------------------- */

KILN_HD inline uint16_t f32_to_f16_bits(float value) {
    uint32_t bits = f32_as_bits(value);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    uint32_t a = bits & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu)); /* NaN */
    if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);                       /* overflow, inf */
    if (a < 0x38800000u) {                                                         /* subnormal or 0 */
        uint32_t e = a >> 23;
        if (e < 102) return sign;
        uint32_t significand = (a & 0x7FFFFFu) | 0x800000u;
        uint32_t shift = 126 - e;
        uint32_t result = significand >> shift;
        uint32_t rest = significand & ((1u << shift) - 1);
        uint32_t halfway = 1u << (shift - 1);
        if (rest > halfway || (rest == halfway && (result & 1))) result++;
        return (uint16_t)(sign | result);
    }
    uint32_t odd = (a >> 13) & 1u;
    a = a - 0x38000000u + 0xFFFu + odd;
    return (uint16_t)(sign | (a >> 13));
}

KILN_HD inline float f16_bits_to_f32(uint16_t half) {
    uint32_t sign = (uint32_t)(half & 0x8000u) << 16;
    uint32_t exponent = (half >> 10) & 0x1Fu;
    uint32_t mantissa = half & 0x3FFu;
    if (exponent == 0x1F) {
        if (mantissa == 0) return bits_as_f32(sign | 0x7F800000u);
        return bits_as_f32(sign | 0x7FC00000u | (mantissa << 13));
    }
    if (exponent == 0) {
        if (mantissa == 0) return bits_as_f32(sign);
        int lead = 9;
        while (!(mantissa & (1u << lead))) lead--;
        uint32_t e = (uint32_t)(lead + 103);
        uint32_t m = (mantissa << (23 - lead)) & 0x7FFFFFu;
        return bits_as_f32(sign | (e << 23) | m);
    }
    return bits_as_f32(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

KILN_HD inline uint16_t f32_to_bf16_bits(float value) {
    uint32_t bits = f32_as_bits(value);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((bits >> 16) | 0x0040u);
    bits += 0x7FFFu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

KILN_HD inline float bf16_bits_to_f32(uint16_t bits) { return bits_as_f32((uint32_t)bits << 16); }

/* ---- Floating -> integer ---------------------------------------------------------- */

KILN_HD inline bool is_nan(double x) { return x != x; }

/* Truncate toward zero; NaN -> 0; beyond int64 -> its nearest bound. */
KILN_HD inline int64_t f64_to_i64_sat(double v) {
    if (v != v) return 0;
    if (v >= 9223372036854775807.0) return INT64_MAX;
    if (v <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)v;
}

/* ---- Per-dtype traits ---------------------------------------------------------------
 * dt<D>::S the storage type, dt<D>::C the compute type; ld(p, i) reads
 * element i (in elements) as C, st(p, i, v) stores a C; ld_f64 / st_f64
 * go through double (for accumulators and dtype-generic code);
 * is_float tells the floating dtypes apart. */
template <int D> struct dt;

template <> struct dt<KILN_F32> {
    typedef float S;
    typedef float C;
    static const bool is_float = true;
    KILN_HD static C ld(const void *p, int64_t i) { return ((const float *)p)[i]; }
    KILN_HD static void st(void *p, int64_t i, C v) { ((float *)p)[i] = v; }
    KILN_HD static double ld_f64(const void *p, int64_t i) { return ((const float *)p)[i]; }
    KILN_HD static void st_f64(void *p, int64_t i, double v) { ((float *)p)[i] = (float)v; }
};

template <> struct dt<KILN_F64> {
    typedef double S;
    typedef double C;
    static const bool is_float = true;
    KILN_HD static C ld(const void *p, int64_t i) { return ((const double *)p)[i]; }
    KILN_HD static void st(void *p, int64_t i, C v) { ((double *)p)[i] = v; }
    KILN_HD static double ld_f64(const void *p, int64_t i) { return ((const double *)p)[i]; }
    KILN_HD static void st_f64(void *p, int64_t i, double v) { ((double *)p)[i] = v; }
};

template <> struct dt<KILN_F16> {
    typedef uint16_t S;
    typedef float C;
    static const bool is_float = true;
    KILN_HD static C ld(const void *p, int64_t i) { return f16_bits_to_f32(((const uint16_t *)p)[i]); }
    KILN_HD static void st(void *p, int64_t i, C v) { ((uint16_t *)p)[i] = f32_to_f16_bits(v); }
    KILN_HD static double ld_f64(const void *p, int64_t i) { return ld(p, i); }
    KILN_HD static void st_f64(void *p, int64_t i, double v) { st(p, i, (float)v); }
};

template <> struct dt<KILN_BF16> {
    typedef uint16_t S;
    typedef float C;
    static const bool is_float = true;
    KILN_HD static C ld(const void *p, int64_t i) { return bf16_bits_to_f32(((const uint16_t *)p)[i]); }
    KILN_HD static void st(void *p, int64_t i, C v) { ((uint16_t *)p)[i] = f32_to_bf16_bits(v); }
    KILN_HD static double ld_f64(const void *p, int64_t i) { return ld(p, i); }
    KILN_HD static void st_f64(void *p, int64_t i, double v) { st(p, i, (float)v); }
};

template <> struct dt<KILN_I32> {
    typedef int32_t S;
    typedef int64_t C;
    static const bool is_float = false;
    KILN_HD static C ld(const void *p, int64_t i) { return ((const int32_t *)p)[i]; }
    KILN_HD static void st(void *p, int64_t i, C v) { ((int32_t *)p)[i] = (int32_t)(uint32_t)(uint64_t)v; }
    KILN_HD static double ld_f64(const void *p, int64_t i) { return ((const int32_t *)p)[i]; }
    KILN_HD static void st_f64(void *p, int64_t i, double v) { st(p, i, f64_to_i64_sat(v)); }
};

template <> struct dt<KILN_I64> {
    typedef int64_t S;
    typedef int64_t C;
    static const bool is_float = false;
    KILN_HD static C ld(const void *p, int64_t i) { return ((const int64_t *)p)[i]; }
    KILN_HD static void st(void *p, int64_t i, C v) { ((int64_t *)p)[i] = v; }
    KILN_HD static double ld_f64(const void *p, int64_t i) { return (double)((const int64_t *)p)[i]; }
    KILN_HD static void st_f64(void *p, int64_t i, double v) { st(p, i, f64_to_i64_sat(v)); }
};

template <> struct dt<KILN_U8> {
    typedef uint8_t S;
    typedef int64_t C;
    static const bool is_float = false;
    KILN_HD static C ld(const void *p, int64_t i) { return ((const uint8_t *)p)[i]; }
    KILN_HD static void st(void *p, int64_t i, C v) { ((uint8_t *)p)[i] = (uint8_t)(uint64_t)v; }
    KILN_HD static double ld_f64(const void *p, int64_t i) { return ((const uint8_t *)p)[i]; }
    KILN_HD static void st_f64(void *p, int64_t i, double v) { st(p, i, f64_to_i64_sat(v)); }
};

template <> struct dt<KILN_BOOL> {
    typedef uint8_t S;
    typedef int64_t C;
    static const bool is_float = false;
    KILN_HD static C ld(const void *p, int64_t i) { return ((const uint8_t *)p)[i] != 0; }
    KILN_HD static void st(void *p, int64_t i, C v) { ((uint8_t *)p)[i] = v != 0; }
    KILN_HD static double ld_f64(const void *p, int64_t i) { return ((const uint8_t *)p)[i] != 0; }
    KILN_HD static void st_f64(void *p, int64_t i, double v) { ((uint8_t *)p)[i] = v != 0.0; }
};

/* Runtime-dtype forms for scalars and small side tensors (weights, one
 * output element): a switch per element, so not for hot loops. */
KILN_HD inline double load_f64(const void *p, kiln_dtype d, int64_t i) {
    switch (d) {
    case KILN_F32:
        return dt<KILN_F32>::ld_f64(p, i);
    case KILN_F64:
        return dt<KILN_F64>::ld_f64(p, i);
    case KILN_F16:
        return dt<KILN_F16>::ld_f64(p, i);
    case KILN_BF16:
        return dt<KILN_BF16>::ld_f64(p, i);
    case KILN_I32:
        return dt<KILN_I32>::ld_f64(p, i);
    case KILN_I64:
        return dt<KILN_I64>::ld_f64(p, i);
    case KILN_U8:
        return dt<KILN_U8>::ld_f64(p, i);
    case KILN_BOOL:
        return dt<KILN_BOOL>::ld_f64(p, i);
    default:
        return 0;
    }
}

KILN_HD inline void store_f64(void *p, kiln_dtype d, int64_t i, double v) {
    switch (d) {
    case KILN_F32:
        dt<KILN_F32>::st_f64(p, i, v);
        break;
    case KILN_F64:
        dt<KILN_F64>::st_f64(p, i, v);
        break;
    case KILN_F16:
        dt<KILN_F16>::st_f64(p, i, v);
        break;
    case KILN_BF16:
        dt<KILN_BF16>::st_f64(p, i, v);
        break;
    case KILN_I32:
        dt<KILN_I32>::st_f64(p, i, v);
        break;
    case KILN_I64:
        dt<KILN_I64>::st_f64(p, i, v);
        break;
    case KILN_U8:
        dt<KILN_U8>::st_f64(p, i, v);
        break;
    case KILN_BOOL:
        dt<KILN_BOOL>::st_f64(p, i, v);
        break;
    default:
        break;
    }
}

/* An integer value stored into dtype d (wrapping; floats round). */
KILN_HD inline void store_i64(void *p, kiln_dtype d, int64_t i, int64_t v) {
    switch (d) {
    case KILN_F32:
        ((float *)p)[i] = (float)v;
        break;
    case KILN_F64:
        ((double *)p)[i] = (double)v;
        break;
    case KILN_F16:
        dt<KILN_F16>::st(p, i, (float)v);
        break;
    case KILN_BF16:
        dt<KILN_BF16>::st(p, i, (float)v);
        break;
    case KILN_I32:
        dt<KILN_I32>::st(p, i, v);
        break;
    case KILN_I64:
        dt<KILN_I64>::st(p, i, v);
        break;
    case KILN_U8:
        dt<KILN_U8>::st(p, i, v);
        break;
    case KILN_BOOL:
        dt<KILN_BOOL>::st(p, i, v);
        break;
    default:
        break;
    }
}

/* ---- Math on the compute types ------------------------------------------------------
 * Overloads for float (the f32/f16/bf16 compute type) and double, so a
 * templated kernel calls the single-precision function for float. */
KILN_HD inline float m_exp(float x) { return expf(x); }
KILN_HD inline double m_exp(double x) { return exp(x); }
KILN_HD inline float m_log(float x) { return logf(x); }
KILN_HD inline double m_log(double x) { return log(x); }
KILN_HD inline float m_sqrt(float x) { return sqrtf(x); }
KILN_HD inline double m_sqrt(double x) { return sqrt(x); }
KILN_HD inline float m_tanh(float x) { return tanhf(x); }
KILN_HD inline double m_tanh(double x) { return tanh(x); }
KILN_HD inline float m_erf(float x) { return erff(x); }
KILN_HD inline double m_erf(double x) { return erf(x); }
KILN_HD inline float m_pow(float x, float y) { return powf(x, y); }
KILN_HD inline double m_pow(double x, double y) { return pow(x, y); }
KILN_HD inline float m_fabs(float x) { return fabsf(x); }
KILN_HD inline double m_fabs(double x) { return fabs(x); }

/* ---- Strided index math --------------------------------------------------------------
 * Up to four operands of one shape (the output's; broadcast inputs have
 * stride 0), size-1 dims dropped and neighbouring dims merged where every
 * operand steps over them as one, so a dense tensor is one dimension and
 * needs no division. The flat index is the row-major index of the shape. */
constexpr int kMaxOperands = 4;

struct geom {
    int ndim; /* >= 1 */
    int n;    /* operands */
    int64_t numel;
    int64_t shape[KILN_MAX_DIMS];
    int64_t st[kMaxOperands][KILN_MAX_DIMS];

    /* Element offsets of flat index i for every operand. */
    KILN_HD inline void offsets(int64_t i, int64_t *off) const {
        for (int k = 0; k < kMaxOperands; k++) off[k] = 0;
        for (int d = ndim - 1; d > 0; d--) {
            int64_t c = i % shape[d];
            i /= shape[d];
            for (int k = 0; k < n; k++) off[k] += c * st[k][d];
        }
        for (int k = 0; k < n; k++) off[k] += i * st[k][0];
    }
};

/* The geometry of n views that share `shape` (ndim dims), strides given
 * per operand. Host only. */
inline geom make_geom(int ndim, const int64_t *shape, int n, const int64_t *const *strides) {
    geom g;
    memset(&g, 0, sizeof g);
    g.n = n;
    g.numel = 1;
    int nd = 0;
    for (int d = 0; d < ndim; d++) {
        g.numel *= shape[d];
        if (shape[d] == 1) continue;
        if (nd > 0) {
            bool merge = true;
            for (int k = 0; k < n; k++) merge = merge && g.st[k][nd - 1] == strides[k][d] * shape[d];
            if (merge) {
                g.shape[nd - 1] *= shape[d];
                for (int k = 0; k < n; k++) g.st[k][nd - 1] = strides[k][d];
                continue;
            }
        }
        g.shape[nd] = shape[d];
        for (int k = 0; k < n; k++) g.st[k][nd] = strides[k][d];
        nd++;
    }
    if (nd == 0) {
        g.shape[0] = 1;
        nd = 1;
    }
    g.ndim = nd;
    return g;
}

/* The geometry of views[0..n) (views[0] gives the shape). */
inline geom make_geom(int n, const kiln_strided *const *views) {
    const int64_t *strides[kMaxOperands];
    for (int k = 0; k < n; k++) strides[k] = views[k]->strides;
    return make_geom(views[0]->ndim, views[0]->shape, n, strides);
}

/* ---- Thread indexing ------------------------------------------------------------------ */

__device__ inline int64_t global_thread() { return (int64_t)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ inline int64_t global_stride() { return (int64_t)gridDim.x * blockDim.x; }

/* ---- Deterministic block reduction ---------------------------------------------------
 * Combines one value per thread of the block into sh[0] with op(a, b) in a
 * fixed tree (any blockDim, power of two or not): the result depends only
 * on the values and blockDim, never on timing. sh has blockDim.x entries
 * (dynamic shared memory). Every thread of the block must call it; the
 * result is returned to every thread. */
template <class T, class Op> __device__ inline T block_reduce(T *sh, T v, Op op) {
    unsigned t = threadIdx.x, n = blockDim.x;
    sh[t] = v;
    __syncthreads();
    unsigned half = 1;
    while (half < n) half <<= 1;
    for (half >>= 1; half > 0; half >>= 1) {
        if (t < half && t + half < n) sh[t] = op(sh[t], sh[t + half]);
        __syncthreads();
    }
    T r = sh[0];
    __syncthreads(); /* sh may be reused by the caller */
    return r;
}

} // namespace kiln_cuda

#endif /* KILN_SRC_KERNELS_CUDA_CUDA_DTYPE_H */

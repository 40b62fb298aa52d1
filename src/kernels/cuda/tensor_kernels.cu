/* CUDA kernels of the tensor layer's own work (kernels.h): strided copy
 * with dtype conversion, fill, arange, uniform and normal random numbers.
 *
 * Conversion rules (the CPU kernels follow the same ones, so a tensor
 * converted on either backend has the same bits):
 *   - floating sources are read as double (exact for f16, bf16, f32);
 *     integer and bool sources as int64;
 *   - -> f64 from double: as is; from int64: rounded to nearest;
 *   - -> f32 from double or int64: rounded once to nearest even;
 *   - -> f16/bf16: first to f32 as above, then f32 -> f16/bf16 with
 *     kiln_f32_to_f16/bf16's rules (nearest even; NaN stays NaN, quiet,
 *     top payload bits kept; overflow to infinity), so f64 -> f16 rounds
 *     twice, as PyTorch's Half(double) does;
 *   - float -> integer: truncate toward zero; NaN -> 0; i32 and i64
 *     saturate at their limits; u8 takes the truncated value (saturated to
 *     i64) modulo 256, as PyTorch's CPU kernels give (-1.0 -> 255). C
 *     leaves out-of-range conversions undefined, so each is spelled out;
 *   - integer -> integer: two's complement wrap, as C casts;
 *   - -> bool: x != 0 (NaN is true); bool -> anything: 0 or 1;
 *   - a uniform sample that f16/bf16 would round up to 1.0 becomes the
 *     largest value below 1, keeping the range [0, 1).
 * Values agree bit for bit with the CPU kernels; NaN stays NaN, but its
 * payload is not promised to (reading floats through double may quiet a
 * signalling NaN on one backend and not on the other).
 *
 * Every kernel is a grid-stride loop with 256 threads a block. The device a
 * kernel runs on is the device that owns its destination pointer
 * (cudaPointerGetAttributes): the kernel table carries no device index, and
 * launching on a stream of another device would fail, or worse, for the
 * legacy default stream, silently run on the wrong device's queue. */
#include "kernels/cuda/cuda_common.h"

namespace {

using kiln_cuda::device_guard;
using kiln_cuda::element_count;
using kiln_cuda::grid_for;
using kiln_cuda::kThreads;

/* ---- Element conversion ------------------------------------------------------ */

KILN_HD inline uint32_t float_bits(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

KILN_HD inline float bits_float(uint32_t b) {
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* NaNs are handled by hand, as half.c does (the hardware would give one
 * canonical NaN); finite values and infinities go through the
 * round-to-nearest-even conversions of cuda_fp16.h / cuda_bf16.h. These are
 * __host__ __device__ so that fill converts its value on the host with
 * exactly the code the kernels use. */
KILN_HD inline uint16_t f32_to_f16(float f) {
    uint32_t b = float_bits(f);
    if ((b & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)(((b >> 16) & 0x8000u) | 0x7E00u | ((b >> 13) & 0x3FFu));
    return __half_as_ushort(__float2half_rn(f));
}

KILN_HD inline float f16_to_f32(uint16_t h) {
    if ((h & 0x7C00u) == 0x7C00u && (h & 0x3FFu))
        return bits_float(((uint32_t)(h & 0x8000u) << 16) | 0x7FC00000u | ((uint32_t)(h & 0x3FFu) << 13));
    return __half2float(__ushort_as_half(h));
}

KILN_HD inline uint16_t f32_to_bf16(float f) {
    uint32_t b = float_bits(f);
    if ((b & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((b >> 16) | 0x0040u);
    __nv_bfloat16_raw raw = __float2bfloat16_rn(f);
    return raw.x;
}

KILN_HD inline float bf16_to_f32(uint16_t h) { return bits_float((uint32_t)h << 16); }

/* Truncate toward zero and saturate; NaN -> 0. */
KILN_HD inline int32_t double_to_i32(double v) {
    if (!(v == v)) return 0;
    double t = trunc(v);
    if (t >= 2147483647.0) return INT32_MAX;
    if (t <= -2147483648.0) return INT32_MIN;
    return (int32_t)t;
}

/* 2^63 is the first double above INT64_MAX; -2^63 is INT64_MIN exactly. */
KILN_HD inline int64_t double_to_i64(double v) {
    if (!(v == v)) return 0;
    double t = trunc(v);
    if (t >= 9223372036854775808.0) return INT64_MAX;
    if (t <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)t;
}

/* One tag type per dtype selects the load/store overloads below. */
template <int D> struct tag {};

KILN_HD inline double load(tag<KILN_F32>, const void *p, int64_t i) { return ((const float *)p)[i]; }
KILN_HD inline double load(tag<KILN_F16>, const void *p, int64_t i) {
    return f16_to_f32(((const uint16_t *)p)[i]);
}
KILN_HD inline double load(tag<KILN_BF16>, const void *p, int64_t i) {
    return bf16_to_f32(((const uint16_t *)p)[i]);
}
KILN_HD inline double load(tag<KILN_F64>, const void *p, int64_t i) { return ((const double *)p)[i]; }
KILN_HD inline int64_t load(tag<KILN_I32>, const void *p, int64_t i) { return ((const int32_t *)p)[i]; }
KILN_HD inline int64_t load(tag<KILN_I64>, const void *p, int64_t i) { return ((const int64_t *)p)[i]; }
KILN_HD inline int64_t load(tag<KILN_U8>, const void *p, int64_t i) { return ((const uint8_t *)p)[i]; }
KILN_HD inline int64_t load(tag<KILN_BOOL>, const void *p, int64_t i) { return ((const uint8_t *)p)[i] != 0; }

/* Stores of a floating value (double) and of an integer value (int64). */
KILN_HD inline void store(tag<KILN_F32>, void *p, int64_t i, double v) { ((float *)p)[i] = (float)v; }
KILN_HD inline void store(tag<KILN_F32>, void *p, int64_t i, int64_t v) { ((float *)p)[i] = (float)v; }
KILN_HD inline void store(tag<KILN_F16>, void *p, int64_t i, double v) {
    ((uint16_t *)p)[i] = f32_to_f16((float)v);
}
KILN_HD inline void store(tag<KILN_F16>, void *p, int64_t i, int64_t v) {
    ((uint16_t *)p)[i] = f32_to_f16((float)v);
}
KILN_HD inline void store(tag<KILN_BF16>, void *p, int64_t i, double v) {
    ((uint16_t *)p)[i] = f32_to_bf16((float)v);
}
KILN_HD inline void store(tag<KILN_BF16>, void *p, int64_t i, int64_t v) {
    ((uint16_t *)p)[i] = f32_to_bf16((float)v);
}
KILN_HD inline void store(tag<KILN_F64>, void *p, int64_t i, double v) { ((double *)p)[i] = v; }
KILN_HD inline void store(tag<KILN_F64>, void *p, int64_t i, int64_t v) { ((double *)p)[i] = (double)v; }
KILN_HD inline void store(tag<KILN_I32>, void *p, int64_t i, double v) {
    ((int32_t *)p)[i] = double_to_i32(v);
}
KILN_HD inline void store(tag<KILN_I32>, void *p, int64_t i, int64_t v) {
    ((int32_t *)p)[i] = (int32_t)(uint32_t)v;
}
KILN_HD inline void store(tag<KILN_I64>, void *p, int64_t i, double v) {
    ((int64_t *)p)[i] = double_to_i64(v);
}
KILN_HD inline void store(tag<KILN_I64>, void *p, int64_t i, int64_t v) { ((int64_t *)p)[i] = v; }
KILN_HD inline void store(tag<KILN_U8>, void *p, int64_t i, double v) {
    ((uint8_t *)p)[i] = (uint8_t)(uint64_t)double_to_i64(v);
}
KILN_HD inline void store(tag<KILN_U8>, void *p, int64_t i, int64_t v) { ((uint8_t *)p)[i] = (uint8_t)v; }
KILN_HD inline void store(tag<KILN_BOOL>, void *p, int64_t i, double v) { ((uint8_t *)p)[i] = v != 0.0; }
KILN_HD inline void store(tag<KILN_BOOL>, void *p, int64_t i, int64_t v) { ((uint8_t *)p)[i] = v != 0; }

/* ---- Strided index math -------------------------------------------------------- */

/* The shape and the strides of both sides after merging dimensions that
 * are contiguous in both (so a contiguous copy is one dimension and needs
 * no division). Passed to kernels by value. Strides in elements. */
struct copy_geometry {
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    int64_t dst_stride[KILN_MAX_DIMS];
    int64_t src_stride[KILN_MAX_DIMS];
};

/* Offsets of linear element i in both views; dimension 0 takes the rest of
 * the division, so it needs no modulo. */
KILN_HD inline void offsets(const copy_geometry &g, int64_t i, int64_t *dst_off, int64_t *src_off) {
    int64_t d = 0, s = 0;
    for (int k = g.ndim - 1; k > 0; k--) {
        int64_t idx = i % g.shape[k];
        i /= g.shape[k];
        d += idx * g.dst_stride[k];
        s += idx * g.src_stride[k];
    }
    if (g.ndim > 0) {
        d += i * g.dst_stride[0];
        s += i * g.src_stride[0];
    }
    *dst_off = d;
    *src_off = s;
}

/* Drop size-1 dimensions, then merge dimension k into k-1 wherever both
 * views step over k-1 exactly as over a whole row of k. */
copy_geometry collapse(const kiln_strided *dst, const int64_t *src_strides) {
    copy_geometry g;
    g.ndim = 0;
    for (int k = 0; k < dst->ndim; k++) {
        if (dst->shape[k] == 1) continue;
        int n = g.ndim;
        if (n > 0 && g.dst_stride[n - 1] == dst->strides[k] * dst->shape[k] &&
            g.src_stride[n - 1] == src_strides[k] * dst->shape[k]) {
            g.shape[n - 1] *= dst->shape[k];
            g.dst_stride[n - 1] = dst->strides[k];
            g.src_stride[n - 1] = src_strides[k];
            continue;
        }
        g.shape[n] = dst->shape[k];
        g.dst_stride[n] = dst->strides[k];
        g.src_stride[n] = src_strides[k];
        g.ndim++;
    }
    return g;
}

/* ---- Kernels --------------------------------------------------------------------- */

__device__ inline int64_t first_index() { return (int64_t)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ inline int64_t grid_stride() { return (int64_t)gridDim.x * blockDim.x; }

template <int DD, int SD>
__global__ void copy_kernel(void *dst, const void *src, copy_geometry g, int64_t n) {
    for (int64_t i = first_index(); i < n; i += grid_stride()) {
        int64_t od, os;
        offsets(g, i, &od, &os);
        store(tag<DD>(), dst, od, load(tag<SD>(), src, os));
    }
}

/* Same dtype: move the bits (no NaN canonicalisation, no conversion). */
template <typename T> __global__ void copy_bits_kernel(T *dst, const T *src, copy_geometry g, int64_t n) {
    for (int64_t i = first_index(); i < n; i += grid_stride()) {
        int64_t od, os;
        offsets(g, i, &od, &os);
        dst[od] = src[os];
    }
}

template <typename T> __global__ void fill_kernel(T *dst, T value, copy_geometry g, int64_t n) {
    for (int64_t i = first_index(); i < n; i += grid_stride()) {
        int64_t od, os;
        offsets(g, i, &od, &os);
        dst[od] = value;
    }
}

template <int DD> __global__ void arange_kernel(void *dst, int64_t n, double start, double step) {
    for (int64_t i = first_index(); i < n; i += grid_stride()) {
        /* Explicitly rounded multiply and add: a fused multiply-add would
         * round once and differ from the CPU's start + i*step. */
        store(tag<DD>(), dst, i, __dadd_rn(start, __dmul_rn((double)i, step)));
    }
}

/* A uniform sample in dtype DD, kept below 1 where f16/bf16 rounding
 * would reach it. */
template <int DD> KILN_HD inline void store_uniform(void *dst, int64_t i, float u) {
    store(tag<DD>(), dst, i, (double)u);
}
template <> KILN_HD inline void store_uniform<KILN_F16>(void *dst, int64_t i, float u) {
    uint16_t h = f32_to_f16(u);
    ((uint16_t *)dst)[i] = h == 0x3C00 ? (uint16_t)0x3BFF : h;
}
template <> KILN_HD inline void store_uniform<KILN_BF16>(void *dst, int64_t i, float u) {
    uint16_t b = f32_to_bf16(u);
    ((uint16_t *)dst)[i] = b == 0x3F80 ? (uint16_t)0x3F7F : b;
}

/* One Philox block per thread and step: element i is word i of the draw,
 * so block b gives elements 4b .. 4b+3. */
template <int DD>
__global__ void uniform_kernel(void *dst, int64_t n, uint64_t seed, uint64_t subsequence, uint64_t offset) {
    int64_t blocks = (n + 3) / 4;
    for (int64_t b = first_index(); b < blocks; b += grid_stride()) {
        uint32_t words[4];
        kiln_philox_stream_block(seed, subsequence, offset + (uint64_t)b, words);
        for (int k = 0; k < 4; k++) {
            int64_t i = 4 * b + k;
            if (i < n) store_uniform<DD>(dst, i, kiln_philox_uniform(words[k]));
        }
    }
}

/* Normal element i uses words 2i and 2i+1: block b gives elements 2b, 2b+1. */
template <int DD>
__global__ void normal_kernel(void *dst, int64_t n, uint64_t seed, uint64_t subsequence, uint64_t offset) {
    int64_t blocks = (n + 1) / 2;
    for (int64_t b = first_index(); b < blocks; b += grid_stride()) {
        uint32_t words[4];
        kiln_philox_stream_block(seed, subsequence, offset + (uint64_t)b, words);
        store(tag<DD>(), dst, 2 * b, (double)kiln_philox_normal(words[0], words[1]));
        if (2 * b + 1 < n) store(tag<DD>(), dst, 2 * b + 1, (double)kiln_philox_normal(words[2], words[3]));
    }
}

/* ---- Launching ------------------------------------------------------------------- */

bool valid_dtype(kiln_dtype d) { return (unsigned)d < (unsigned)KILN_DTYPE_COUNT; }

kiln_status check_view(const kiln_strided *v, const char *what) {
    if (!v || v->ndim < 0 || v->ndim > KILN_MAX_DIMS || !valid_dtype(v->dtype))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "CUDA kernel: invalid %s view (ndim %d, dtype %d)",
                          what, v ? v->ndim : -1, v ? (int)v->dtype : -1);
    for (int k = 0; k < v->ndim; k++)
        if (v->shape[k] < 0)
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "CUDA kernel: %s dimension %d is %lld", what,
                              k, (long long)v->shape[k]);
    return KILN_OK;
}

template <int DD, int SD>
kiln_status launch_copy(void *dst, const void *src, const copy_geometry &g, int64_t n, cudaStream_t s,
                        int dev) {
    auto *copy_kernel_dd_sd = &copy_kernel<DD, SD>;
    KILN_LAUNCH(copy_kernel_dd_sd, grid_for(n), kThreads, 0, s, dst, src, g, n);
    KILN_LAUNCH_CHECK(dev, "copy_kernel<<<>>>");
    return KILN_OK;
}

template <typename T>
kiln_status launch_copy_bits(void *dst, const void *src, const copy_geometry &g, int64_t n, cudaStream_t s,
                             int dev) {
    KILN_LAUNCH(copy_bits_kernel<T>, grid_for(n), kThreads, 0, s, (T *)dst, (const T *)src, g, n);
    KILN_LAUNCH_CHECK(dev, "copy_bits_kernel<<<>>>");
    return KILN_OK;
}

#define KILN_FOR_EACH_DTYPE(X)                                                                               \
    X(KILN_F32) X(KILN_F16) X(KILN_BF16) X(KILN_F64) X(KILN_I32) X(KILN_I64) X(KILN_U8) X(KILN_BOOL)

template <int DD>
kiln_status copy_from(kiln_dtype sd, void *dst, const void *src, const copy_geometry &g, int64_t n,
                      cudaStream_t s, int dev) {
    switch (sd) {
#define KILN_CASE(SD)                                                                                        \
    case SD:                                                                                                 \
        return launch_copy<DD, SD>(dst, src, g, n, s, dev);
        KILN_FOR_EACH_DTYPE(KILN_CASE)
#undef KILN_CASE
    default:
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "CUDA copy: dtype %d", (int)sd);
    }
}

kiln_status cuda_copy_strided(const kiln_strided *dst, const kiln_strided *src, void *stream) {
    KILN_TRY(check_view(dst, "destination"));
    KILN_TRY(check_view(src, "source"));
    if (src->ndim != dst->ndim)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL,
                          "CUDA copy: source has %d dimensions, destination %d", src->ndim, dst->ndim);
    for (int k = 0; k < dst->ndim; k++)
        if (src->shape[k] != dst->shape[k] && src->strides[k] != 0)
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL,
                              "CUDA copy: dimension %d is %lld in the source and %lld in the destination", k,
                              (long long)src->shape[k], (long long)dst->shape[k]);
    int64_t n = element_count(dst);
    if (n == 0) return KILN_OK;
    copy_geometry g = collapse(dst, src->strides);
    device_guard guard;
    KILN_TRY(guard.enter(dst->data));
    cudaStream_t s = (cudaStream_t)stream;
    if (dst->dtype == src->dtype) {
        switch (kiln_dtype_size(dst->dtype)) {
        case 1:
            return launch_copy_bits<uint8_t>(dst->data, src->data, g, n, s, guard.device);
        case 2:
            return launch_copy_bits<uint16_t>(dst->data, src->data, g, n, s, guard.device);
        case 4:
            return launch_copy_bits<uint32_t>(dst->data, src->data, g, n, s, guard.device);
        default:
            return launch_copy_bits<uint64_t>(dst->data, src->data, g, n, s, guard.device);
        }
    }
    switch (dst->dtype) {
#define KILN_CASE(DD)                                                                                        \
    case DD:                                                                                                 \
        return copy_from<DD>(src->dtype, dst->data, src->data, g, n, s, guard.device);
        KILN_FOR_EACH_DTYPE(KILN_CASE)
#undef KILN_CASE
    default:
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "CUDA copy: dtype %d", (int)dst->dtype);
    }
}

template <typename T>
kiln_status launch_fill(const kiln_strided *dst, const void *value_bits, cudaStream_t s) {
    int64_t n = element_count(dst);
    if (n == 0) return KILN_OK;
    copy_geometry g = collapse(dst, dst->strides);
    T value;
    memcpy(&value, value_bits, sizeof value);
    device_guard guard;
    KILN_TRY(guard.enter(dst->data));
    KILN_LAUNCH(fill_kernel<T>, grid_for(n), kThreads, 0, s, (T *)dst->data, value, g, n);
    KILN_LAUNCH_CHECK(guard.device, "fill_kernel<<<>>>");
    return KILN_OK;
}

/* The value is converted once, on the host, by the same store functions
 * the kernels use; the kernel only writes bits. */
kiln_status cuda_fill(const kiln_strided *dst, double value, void *stream) {
    KILN_TRY(check_view(dst, "destination"));
    unsigned char bits[8] = {0};
    switch (dst->dtype) {
#define KILN_CASE(DD)                                                                                        \
    case DD:                                                                                                 \
        store(tag<DD>(), bits, 0, value);                                                                    \
        break;
        KILN_FOR_EACH_DTYPE(KILN_CASE)
#undef KILN_CASE
    default:
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "CUDA fill: dtype %d", (int)dst->dtype);
    }
    cudaStream_t s = (cudaStream_t)stream;
    switch (kiln_dtype_size(dst->dtype)) {
    case 1:
        return launch_fill<uint8_t>(dst, bits, s);
    case 2:
        return launch_fill<uint16_t>(dst, bits, s);
    case 4:
        return launch_fill<uint32_t>(dst, bits, s);
    default:
        return launch_fill<uint64_t>(dst, bits, s);
    }
}

kiln_status cuda_arange(void *dst, kiln_dtype dtype, int64_t n, double start, double step, void *stream) {
    if (!valid_dtype(dtype) || n < 0)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "CUDA arange: dtype %d, %lld elements", (int)dtype,
                          (long long)n);
    if (n == 0) return KILN_OK;
    device_guard guard;
    KILN_TRY(guard.enter(dst));
    cudaStream_t s = (cudaStream_t)stream;
    switch (dtype) {
#define KILN_CASE(DD)                                                                                        \
    case DD:                                                                                                 \
        KILN_LAUNCH(arange_kernel<DD>, grid_for(n), kThreads, 0, s, dst, n, start, step);                    \
        break;
        KILN_FOR_EACH_DTYPE(KILN_CASE)
#undef KILN_CASE
    default:
        break;
    }
    KILN_LAUNCH_CHECK(guard.device, "arange_kernel<<<>>>");
    return KILN_OK;
}

enum random_kind { RANDOM_UNIFORM, RANDOM_NORMAL };

template <int DD>
void launch_random(random_kind kind, void *dst, int64_t n, const kiln_rng &rng, cudaStream_t s) {
    if (kind == RANDOM_UNIFORM)
        KILN_LAUNCH(uniform_kernel<DD>, grid_for((n + 3) / 4), kThreads, 0, s, dst, n, rng.seed, rng.subsequence,
                    rng.offset);
    else
        KILN_LAUNCH(normal_kernel<DD>, grid_for((n + 1) / 2), kThreads, 0, s, dst, n, rng.seed, rng.subsequence,
                    rng.offset);
}

kiln_status cuda_random(random_kind kind, void *dst, kiln_dtype dtype, int64_t n, kiln_rng rng,
                        void *stream) {
    const char *what = kind == RANDOM_UNIFORM ? "rand_uniform" : "rand_normal";
    if (!valid_dtype(dtype) || !kiln_dtype_is_floating(dtype) || n < 0)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use f32, f16, bf16 or f64",
                          "CUDA %s: dtype %s, %lld elements", what, kiln_dtype_name(dtype), (long long)n);
    if (n == 0) return KILN_OK;
    device_guard guard;
    KILN_TRY(guard.enter(dst));
    cudaStream_t s = (cudaStream_t)stream;
    switch (dtype) {
    case KILN_F32:
        launch_random<KILN_F32>(kind, dst, n, rng, s);
        break;
    case KILN_F16:
        launch_random<KILN_F16>(kind, dst, n, rng, s);
        break;
    case KILN_BF16:
        launch_random<KILN_BF16>(kind, dst, n, rng, s);
        break;
    default:
        launch_random<KILN_F64>(kind, dst, n, rng, s);
        break;
    }
    KILN_LAUNCH_CHECK(guard.device, kind == RANDOM_UNIFORM ? "uniform_kernel<<<>>>" : "normal_kernel<<<>>>");
    return KILN_OK;
}

kiln_status cuda_rand_uniform(void *dst, kiln_dtype dtype, int64_t n, kiln_rng rng, void *stream) {
    return cuda_random(RANDOM_UNIFORM, dst, dtype, n, rng, stream);
}

kiln_status cuda_rand_normal(void *dst, kiln_dtype dtype, int64_t n, kiln_rng rng, void *stream) {
    return cuda_random(RANDOM_NORMAL, dst, dtype, n, rng, stream);
}

const kiln_tensor_kernels cuda_tensor_kernels = {
    cuda_copy_strided, cuda_fill, cuda_arange, cuda_rand_uniform, cuda_rand_normal,
};

} // namespace

extern "C" const kiln_tensor_kernels *kiln_cuda_tensor_kernels(void) { return &cuda_tensor_kernels; }

/* Kiln CUDA emulator, device side: what a .cu file of Kiln sees when it is
 * compiled as C++ in the emulation build (KILN_CUDA_EMULATION). Included by
 * src/kernels/cuda/cuda_common.h before the (shim) CUDA headers.
 *
 * How a kernel runs (docs/cuda.md, "The emulator"):
 *   - KILN_LAUNCH -> kiln_emu_launch: the arguments are captured by value
 *     and the launch is queued on its stream; the stream's worker thread runs
 *     it later, its blocks spread over a small pool of host threads.
 *   - one host thread runs one block at a time; each CUDA thread of the
 *     block is a fiber with a small stack. A fiber runs until it exits or
 *     reaches a barrier (__syncthreads, a warp collective); barriers are
 *     released when every live participant has arrived (exited threads count
 *     as arrived). No progress possible: abort naming the kernel, the block
 *     and the threads ("divergent __syncthreads?").
 *   - __shared__ variables are per host thread (static thread_local), which
 *     is per block since a host thread runs one block at a time.
 *
 * Rules for kernel code (anything else is not emulated): the names declared
 * here and in cuda_fp16.h / cuda_bf16.h; warp collectives with a mask that
 * includes the calling lane; no inline PTX, no cooperative groups, no
 * texture/surface objects, no device-side printf reliance on ordering. */
#ifndef KILN_EMU_KILN_EMU_H
#define KILN_EMU_KILN_EMU_H

#ifndef __cplusplus
#error "kiln_emu.h is the device side of the CUDA emulator: compile .cu files as C++"
#endif

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cmath>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "include/cuda_bf16.h"
#include "include/cuda_fp16.h"
#include "include/cuda_runtime_api.h"

/* ---- Qualifiers ------------------------------------------------------------------ */

#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
/* One host thread runs one block at a time, so per-host-thread storage is
 * per-block storage. Not cleared between blocks (CUDA leaves it undefined). */
#define __shared__ static thread_local

/* ---- Built-in vector types and variables ---------------------------------------- */

struct uint3 {
    unsigned int x, y, z;
};
struct int3 {
    int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};
struct float2 {
    float x, y;
};
struct float4 {
    float x, y, z, w;
};
struct int2 {
    int x, y;
};
struct int4 {
    int x, y, z, w;
};
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline int2 make_int2(int x, int y) { return int2{x, y}; }
inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return uint3{x, y, z}; }

namespace kiln_emu {

/* The block being run by this host thread, and the CUDA thread (fiber)
 * running on it now. Set by the scheduler (exec.cpp). */
struct block_builtins { /* trivial, so thread_local access needs no init check */
    uint3 block_idx;
    uint3 block_dim;
    uint3 grid_dim;
    void *dynamic_smem;
};
extern thread_local block_builtins tls_block;
extern thread_local uint3 tls_thread_idx;

/* ---- Launching ---------------------------------------------------------------- */

/* What a queued launch runs for each CUDA thread: the kernel applied to the
 * captured arguments. */
struct kernel_body {
    virtual ~kernel_body() = default;
    virtual void run() = 0;
};

struct launch_params {
    const char *name; /* the kernel expression as written at KILN_LAUNCH */
    const char *file;
    int line;
    const void *fn; /* the kernel's address (opt-in shared memory attribute) */
    dim3 grid;
    dim3 block;
    size_t shmem;
    cudaStream_t stream;
};

struct pointer_arg {
    int index; /* 0-based kernel argument index */
    const void *ptr;
};

/* Validates the configuration, the stream and the pointer arguments, and
 * queues the launch; errors are left for cudaGetLastError. */
void submit_launch(const launch_params &params, std::unique_ptr<kernel_body> body, const pointer_arg *ptrs,
                   int n_ptrs);

template <typename T> inline void note_pointer(pointer_arg *out, int &n, int index, const T &value) {
    if constexpr (std::is_pointer<T>::value) {
        out[n].index = index;
        out[n].ptr = (const void *)value;
        n++;
    } else {
        (void)out;
        (void)n;
        (void)index;
        (void)value;
    }
}

template <typename Tuple, size_t... I>
inline int note_pointers(pointer_arg *out, const Tuple &t, std::index_sequence<I...>) {
    int n = 0;
    (note_pointer(out, n, (int)I, std::get<I>(t)), ...);
    return n;
}

/* cudaFuncSetAttribute's dynamic shared memory opt-in, by kernel address. */
cudaError_t set_max_dynamic_shared(const void *fn, int bytes);

/* ---- Barriers and warp collectives (exec.cpp) ------------------------------------ */

enum barrier_kind { BAR_SYNC = 0, BAR_COUNT, BAR_AND, BAR_OR };
/* Block barrier; returns the count / and / or of `pred` over the block. */
int block_barrier(barrier_kind kind, int pred, const char *file, int line);

enum warp_kind { WARP_SYNC = 0, WARP_SHFL, WARP_VOTE };
/* One warp collective. For WARP_SHFL, `value` (size <= 16 bytes) is this
 * lane's contribution and `src_lane` the lane whose value it receives (its
 * own lane index for CUDA's out-of-range rule), written to `out`; a source
 * lane that does not take part gives all-ones bytes (NaN for floats, -1 for
 * integers) so a reduction that reads an inactive lane fails loudly. For
 * WARP_VOTE, returns the ballot of `pred` over the participating lanes and,
 * if `out` is not NULL, writes the mask of participating lanes there. */
unsigned warp_collective(warp_kind kind, unsigned mask, const void *value, unsigned size, int src_lane,
                         void *out, int pred, const char *file, int line);
/* The calling CUDA thread's lane (0..31) and the mask of live lanes of its warp. */
unsigned lane_id();
unsigned active_mask();

} // namespace kiln_emu

#if defined(KILN_EMU_SANITIZED)
/* Sanitizer builds read the built-ins through calls into the emulator:
 * UBSan's null check misreports thread_local accesses made on a ucontext
 * fiber stack. */
namespace kiln_emu {
const uint3 &thread_idx();
const block_builtins &block();
} // namespace kiln_emu
#define threadIdx (::kiln_emu::thread_idx())
#define blockIdx (::kiln_emu::block().block_idx)
#define blockDim (::dim3(::kiln_emu::block().block_dim))
#define gridDim (::dim3(::kiln_emu::block().grid_dim))
#else
#define threadIdx (static_cast<const uint3 &>(::kiln_emu::tls_thread_idx))
#define blockIdx (static_cast<const uint3 &>(::kiln_emu::tls_block.block_idx))
#define blockDim (::dim3(::kiln_emu::tls_block.block_dim))
#define gridDim (::dim3(::kiln_emu::tls_block.grid_dim))
#endif
constexpr int warpSize = 32;

/* The emulation branch of KILN_LAUNCH (cuda_common.h). Arguments are
 * converted to the kernel's parameter types and captured by value now, as
 * <<<>>> does; the kernel runs later on the stream's worker. */
template <typename... P, typename... A>
inline void kiln_emu_launch(const char *name, const char *file, int line, void (*kernel)(P...), dim3 grid,
                            dim3 block, size_t shmem, cudaStream_t stream, A &&...args) {
    static_assert(sizeof...(P) == sizeof...(A), "KILN_LAUNCH: wrong number of kernel arguments");
    using args_t = std::tuple<typename std::decay<P>::type...>;
    struct body final : kiln_emu::kernel_body {
        void (*fn)(P...);
        args_t args;
        body(void (*f)(P...), args_t &&a) : fn(f), args(std::move(a)) {}
        void run() override { std::apply(fn, args); }
    };
    std::unique_ptr<body> b(new body(kernel, args_t(std::forward<A>(args)...)));
    kiln_emu::pointer_arg ptrs[sizeof...(P) + 1];
    int n = kiln_emu::note_pointers(ptrs, b->args, std::index_sequence_for<P...>{});
    kiln_emu::launch_params p{name, file, line, (const void *)kernel, grid, block, shmem, stream};
    kiln_emu::submit_launch(p, std::move(b), ptrs, n);
}

/* This block's dynamic shared memory (KILN_DYNAMIC_SHARED). */
void *kiln_emu_dynamic_shared();

template <typename... P>
inline cudaError_t cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attr, int value) {
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize)
        return kiln_emu::set_max_dynamic_shared((const void *)kernel, value);
    return cudaSuccess;
}

/* ---- Synchronisation --------------------------------------------------------------- */

inline void __syncthreads(const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    kiln_emu::block_barrier(kiln_emu::BAR_SYNC, 0, file, line);
}
inline int __syncthreads_count(int pred, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    return kiln_emu::block_barrier(kiln_emu::BAR_COUNT, pred, file, line);
}
inline int __syncthreads_and(int pred, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    return kiln_emu::block_barrier(kiln_emu::BAR_AND, pred, file, line);
}
inline int __syncthreads_or(int pred, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    return kiln_emu::block_barrier(kiln_emu::BAR_OR, pred, file, line);
}
inline void __syncwarp(unsigned mask = 0xFFFFFFFFu, const char *file = __builtin_FILE(),
                       int line = __builtin_LINE()) {
    kiln_emu::warp_collective(kiln_emu::WARP_SYNC, mask, nullptr, 0, 0, nullptr, 0, file, line);
}
inline unsigned __activemask() { return kiln_emu::active_mask(); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

/* ---- Warp shuffles and votes -------------------------------------------------------- */

namespace kiln_emu {
template <typename T>
inline T shfl(unsigned mask, T var, int src, const char *file, int line) {
    static_assert(sizeof(T) <= 16, "warp shuffle of a type wider than 16 bytes");
    static_assert(std::is_trivially_copyable<T>::value, "warp shuffle of a non-trivially-copyable type");
    T out;
    warp_collective(WARP_SHFL, mask, &var, (unsigned)sizeof(T), src, &out, 0, file, line);
    return out;
}
/* CUDA's lane arithmetic: width must be a power of two <= 32; lanes are
 * grouped in segments of `width`. */
inline int segment_base(int lane, int width) { return lane & ~(width - 1); }
} // namespace kiln_emu

template <typename T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize, const char *file = __builtin_FILE(),
                     int line = __builtin_LINE()) {
    int lane = (int)kiln_emu::lane_id();
    int src = kiln_emu::segment_base(lane, width) + (src_lane & (width - 1));
    return kiln_emu::shfl(mask, var, src, file, line);
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                        const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    int lane = (int)kiln_emu::lane_id();
    int src = lane - (int)delta;
    if (src < kiln_emu::segment_base(lane, width)) src = lane;
    return kiln_emu::shfl(mask, var, src, file, line);
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                          const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    int lane = (int)kiln_emu::lane_id();
    int src = lane + (int)delta;
    if (src > kiln_emu::segment_base(lane, width) + width - 1) src = lane;
    return kiln_emu::shfl(mask, var, src, file, line);
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize,
                         const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    int lane = (int)kiln_emu::lane_id();
    int src = lane ^ (lane_mask & 31);
    if (src > kiln_emu::segment_base(lane, width) + width - 1) src = lane;
    return kiln_emu::shfl(mask, var, src, file, line);
}
inline unsigned __ballot_sync(unsigned mask, int pred, const char *file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
    return kiln_emu::warp_collective(kiln_emu::WARP_VOTE, mask, nullptr, 0, 0, nullptr, pred != 0, file, line);
}
inline int __any_sync(unsigned mask, int pred, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    return __ballot_sync(mask, pred, file, line) != 0;
}
inline int __all_sync(unsigned mask, int pred, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    unsigned participants = 0;
    unsigned b = kiln_emu::warp_collective(kiln_emu::WARP_VOTE, mask, nullptr, 0, 0, &participants, pred != 0,
                                           file, line);
    return b == participants;
}

/* ---- Atomics (real ones: blocks run concurrently on host threads) ------------------- */

namespace kiln_emu {
template <typename T, typename U, typename F> inline T atomic_update(T *addr, F f) {
    static_assert(sizeof(T) == sizeof(U), "atomic word size");
    U *w = reinterpret_cast<U *>(addr);
    U old_bits = __atomic_load_n(w, __ATOMIC_RELAXED);
    for (;;) {
        T old_v;
        memcpy(&old_v, &old_bits, sizeof old_v);
        T new_v = f(old_v);
        U new_bits;
        memcpy(&new_bits, &new_v, sizeof new_bits);
        if (__atomic_compare_exchange_n(w, &old_bits, new_bits, true, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
            return old_v;
    }
}
} // namespace kiln_emu

inline int atomicAdd(int *a, int v) { return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicAdd(unsigned *a, unsigned v) { return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); }
inline unsigned long long atomicAdd(unsigned long long *a, unsigned long long v) {
    return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);
}
inline float atomicAdd(float *a, float v) {
    return kiln_emu::atomic_update<float, uint32_t>(a, [v](float o) { return o + v; });
}
inline double atomicAdd(double *a, double v) {
    return kiln_emu::atomic_update<double, uint64_t>(a, [v](double o) { return o + v; });
}
inline __half atomicAdd(__half *a, __half v) {
    return kiln_emu::atomic_update<__half, uint16_t>(a, [v](__half o) { return __hadd(o, v); });
}
inline __nv_bfloat16 atomicAdd(__nv_bfloat16 *a, __nv_bfloat16 v) {
    return kiln_emu::atomic_update<__nv_bfloat16, uint16_t>(a, [v](__nv_bfloat16 o) { return __hadd(o, v); });
}
inline int atomicSub(int *a, int v) { return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicSub(unsigned *a, unsigned v) { return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST); }
inline int atomicExch(int *a, int v) { return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicExch(unsigned *a, unsigned v) { return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST); }
inline unsigned long long atomicExch(unsigned long long *a, unsigned long long v) {
    return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);
}
inline float atomicExch(float *a, float v) {
    return kiln_emu::atomic_update<float, uint32_t>(a, [v](float) { return v; });
}
#define KILN_EMU_ATOMIC_MINMAX(T)                                                                          \
    inline T atomicMax(T *a, T v) {                                                                        \
        return kiln_emu::atomic_update<T, T>(a, [v](T o) { return o > v ? o : v; });                       \
    }                                                                                                      \
    inline T atomicMin(T *a, T v) {                                                                        \
        return kiln_emu::atomic_update<T, T>(a, [v](T o) { return o < v ? o : v; });                       \
    }
KILN_EMU_ATOMIC_MINMAX(int)
KILN_EMU_ATOMIC_MINMAX(unsigned)
KILN_EMU_ATOMIC_MINMAX(long long)
KILN_EMU_ATOMIC_MINMAX(unsigned long long)
#undef KILN_EMU_ATOMIC_MINMAX
#define KILN_EMU_ATOMIC_CAS(T)                                                                             \
    inline T atomicCAS(T *a, T compare, T v) {                                                             \
        __atomic_compare_exchange_n(a, &compare, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);            \
        return compare;                                                                                    \
    }
KILN_EMU_ATOMIC_CAS(int)
KILN_EMU_ATOMIC_CAS(unsigned)
KILN_EMU_ATOMIC_CAS(unsigned long long)
KILN_EMU_ATOMIC_CAS(unsigned short)
#undef KILN_EMU_ATOMIC_CAS
#define KILN_EMU_ATOMIC_BITS(T)                                                                            \
    inline T atomicAnd(T *a, T v) { return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST); }                   \
    inline T atomicOr(T *a, T v) { return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST); }                     \
    inline T atomicXor(T *a, T v) { return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST); }
KILN_EMU_ATOMIC_BITS(int)
KILN_EMU_ATOMIC_BITS(unsigned)
KILN_EMU_ATOMIC_BITS(unsigned long long)
#undef KILN_EMU_ATOMIC_BITS
inline unsigned atomicInc(unsigned *a, unsigned limit) {
    return kiln_emu::atomic_update<unsigned, unsigned>(a, [limit](unsigned o) { return o >= limit ? 0u : o + 1; });
}
inline unsigned atomicDec(unsigned *a, unsigned limit) {
    return kiln_emu::atomic_update<unsigned, unsigned>(
        a, [limit](unsigned o) { return (o == 0 || o > limit) ? limit : o - 1; });
}

/* ---- Loads, bit tricks, math intrinsics ---------------------------------------------- */

template <typename T> inline T __ldg(const T *p) { return *p; }
template <typename T> inline T __ldcs(const T *p) { return *p; }
template <typename T> inline void __stcs(T *p, T v) { *p = v; }

inline int __float_as_int(float f) {
    int i;
    memcpy(&i, &f, 4);
    return i;
}
inline float __int_as_float(int i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned i;
    memcpy(&i, &f, 4);
    return i;
}
inline float __uint_as_float(unsigned i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
inline long long __double_as_longlong(double d) {
    long long i;
    memcpy(&i, &d, 8);
    return i;
}
inline double __longlong_as_double(long long i) {
    double d;
    memcpy(&d, &i, 8);
    return d;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0F0F0F0Fu) | ((x & 0x0F0F0F0Fu) << 4);
    x = ((x >> 8) & 0x00FF00FFu) | ((x & 0x00FF00FFu) << 8);
    return (x >> 16) | (x << 16);
}
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }

/* Fast-math intrinsics: the accurate functions (the GPU's are less exact;
 * tests compare with tolerances that cover both). */
inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return powf(10.0f, x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline void __sincosf(float x, float *s, float *c) {
    *s = sinf(x);
    *c = cosf(x);
}
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __frsqrt_rn(float x) { return 1.0f / sqrtf(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : (x == x ? x : 0.0f)); }
/* Explicitly rounded operations: never fused (the emulation build compiles
 * with -ffp-contract=off). */
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
inline int __float2int_rz(float x) { return (int)x; }
inline int __float2int_rd(float x) { return (int)floorf(x); }
inline int __float2int_ru(float x) { return (int)ceilf(x); }
inline long long __float2ll_rn(float x) { return (long long)nearbyintf(x); }
inline int __double2int_rn(double x) { return (int)nearbyint(x); }

/* CUDA's global min/max overloads (same-type; mixed types are ambiguous,
 * as some are under nvcc: cast first). */
#define KILN_EMU_MINMAX(T)                                                                                 \
    inline T min(T a, T b) { return a < b ? a : b; }                                                       \
    inline T max(T a, T b) { return a > b ? a : b; }
KILN_EMU_MINMAX(int)
KILN_EMU_MINMAX(unsigned)
KILN_EMU_MINMAX(long)
KILN_EMU_MINMAX(unsigned long)
KILN_EMU_MINMAX(long long)
KILN_EMU_MINMAX(unsigned long long)
#undef KILN_EMU_MINMAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

#endif

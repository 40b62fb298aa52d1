/* What every .cu file of the CUDA backend includes first. The same sources
 * build two ways:
 *   - under nvcc (KILN_WITH_CUDA, real GPU): the CUDA runtime headers;
 *   - as C++ in the emulation build (KILN_CUDA_EMULATION): the emulator's
 *     headers (src/emu/), which give the same names (dim3, threadIdx,
 *     __syncthreads, __shfl_down_sync, atomicAdd, cudaStream_t, ...) and
 *     run each kernel on the CPU, CUDA threads as fibers.
 * Kernel code uses only what both provide; src/emu/kiln_emu.h and
 * docs/cuda.md list it.
 *
 * Rules for kernel files (docs/cuda.md):
 *   - launch only through KILN_LAUNCH, followed by KILN_LAUNCH_CHECK;
 *     a kernel with several template arguments is bound to a local first
 *     (`auto *k = &copy_kernel<DD, SD>; KILN_LAUNCH(k, ...)`), since a
 *     macro argument cannot hold a bare comma;
 *   - dynamic shared memory through KILN_DYNAMIC_SHARED;
 *   - the device a kernel runs on is the device owning its output pointer
 *     (kiln_cuda_device_guard), never the calling thread's current one. */
#ifndef KILN_SRC_KERNELS_CUDA_CUDA_COMMON_H
#define KILN_SRC_KERNELS_CUDA_CUDA_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(KILN_CUDA_EMULATION)
#include "emu/count/emu_call_counts.h"
#include "emu/kiln_emu.h"
#endif
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "base/error.h"
#include "base/philox.h"
#include "kernels/cuda/launch_blocking.h"
#include "kernels/kernels.h"
#include "kernels/op_args.h"
#include "runtime/cuda_backend.h"
#include "runtime/cuda_device.h"

/* KILN_LAUNCH(kernel, grid, block, shared_bytes, stream, args...): launch
 * `kernel` on `stream`. Asynchronous: returns before the kernel runs, on a
 * GPU and in the emulator alike (the emulator queues it on the stream's
 * worker thread). The emulation build counts each launch with Kiln's other
 * runtime calls (emu/count/emu_call_counts.h). */
#if defined(KILN_CUDA_EMULATION)
#define KILN_LAUNCH(kernel, grid, block, shmem, stream, ...)                                                 \
    (kiln_emu_call_note(KILN_EMU_CALL_kernel_launch),                                                        \
     kiln_emu_launch(#kernel, __FILE__, __LINE__, (kernel), dim3(grid), dim3(block), (size_t)(shmem),        \
                     (cudaStream_t)(stream), __VA_ARGS__))
/* `extern __shared__ T name[]` of CUDA: this block's dynamic shared memory. */
#define KILN_DYNAMIC_SHARED(T, name) T *name = (T *)kiln_emu_dynamic_shared()
#else
#define KILN_LAUNCH(kernel, grid, block, shmem, stream, ...)                                                 \
    (kernel)<<<(grid), (block), (shmem), (cudaStream_t)(stream)>>>(__VA_ARGS__)
#define KILN_DYNAMIC_SHARED(T, name)                                                                         \
    extern __shared__ __align__(16) unsigned char kiln_dynamic_smem_[];                                       \
    T *name = (T *)kiln_dynamic_smem_
#endif

/* After every KILN_LAUNCH: a bad configuration, or a sticky error from
 * earlier work, returns a Kiln error naming the kernel, device and line;
 * with KILN_LAUNCH_BLOCKING the host then waits for the kernel, and a
 * failure while it ran names the op (launch_blocking.h). */
#define KILN_LAUNCH_CHECK(device, what)                                                                      \
    do {                                                                                                     \
        kiln_status kiln_launch_st_ =                                                                        \
            kiln_cuda_launch_check((int)cudaGetLastError(), (device), (what), __FILE__, __LINE__);           \
        if (kiln_launch_st_ != KILN_OK) return kiln_launch_st_;                                              \
    } while (0)

namespace kiln_cuda {

constexpr int kThreads = 256;
/* Enough blocks to fill any current GPU several times over; grid-stride
 * loops cover the rest. */
constexpr int64_t kMaxBlocks = 8192;

/* Blocks of kThreads for a grid-stride loop over `work_items`. */
inline unsigned grid_for(int64_t work_items) {
    int64_t blocks = (work_items + kThreads - 1) / kThreads;
    if (blocks > kMaxBlocks) blocks = kMaxBlocks;
    return (unsigned)(blocks < 1 ? 1 : blocks);
}

/* Makes the device that owns `ptr` current for a launch and restores the
 * caller's device on destruction. A host pointer is an error. In the steady
 * state this makes no runtime call: the owner comes from the table of
 * Kiln's device segments and the current device from Kiln's per-thread
 * copy (runtime/cuda_device.h); a switch happens only for work on a device
 * other than the thread's current one. */
struct device_guard {
    int previous = -1;
    int device = -1;

    kiln_status enter(const void *ptr) {
        KILN_TRY(kiln_cuda_device_of(ptr, "CUDA kernel", &device));
        return kiln_cuda_device_switch(device, &previous);
    }
    ~device_guard() { kiln_cuda_device_restore(device, previous); }
};

inline int64_t element_count(const kiln_strided *v) {
    int64_t n = 1;
    for (int k = 0; k < v->ndim; k++) n *= v->shape[k];
    return n;
}

/* A strided view passed to a kernel by value (kernels cannot follow host
 * pointers to kiln_strided). Offsets are in elements. */
struct view {
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    int64_t strides[KILN_MAX_DIMS];
};

inline view view_of(const kiln_strided *s) {
    view v;
    memset(&v, 0, sizeof v);
    v.ndim = s->ndim;
    for (int k = 0; k < s->ndim; k++) {
        v.shape[k] = s->shape[k];
        v.strides[k] = s->strides[k];
    }
    return v;
}

/* Element offset of linear (row-major) index i of `shape` in view v. */
KILN_HD inline int64_t offset_of(const view &v, int64_t i) {
    int64_t off = 0;
    for (int k = v.ndim - 1; k >= 0; k--) {
        int64_t d = v.shape[k];
        int64_t c = d ? i % d : 0;
        i = d ? i / d : 0;
        off += c * v.strides[k];
    }
    return off;
}

/* A product rounded on its own, never fused with a neighbouring add into
 * an FMA. nvcc contracts a * b + c into one fma by default (--fmad=true),
 * which rounds once where the CPU kernels (-ffp-contract=off, or an x86-64
 * baseline build without FMA) round twice; a kernel that promises the CPU
 * kernel's bits writes every floating-point product with mul_rn
 * (docs/cuda.md, "Rules for kernel writers"; tests/kernels/
 * cuda_contraction.sh checks the PTX). The price is a separate mul and add
 * where an fma would do: meant for memory-bound kernels (the optimizer
 * updates), not GEMM loops. In the emulator (compiled with
 * -ffp-contract=off) they are plain products. */
__device__ inline float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ inline double mul_rn(double a, double b) { return __dmul_rn(a, b); }

/* Whether a view is contiguous row-major. */
inline bool is_contiguous(const kiln_strided *s) {
    int64_t expect = 1;
    for (int k = s->ndim - 1; k >= 0; k--) {
        if (s->shape[k] != 1 && s->strides[k] != expect) return false;
        expect *= s->shape[k];
    }
    return true;
}

} // namespace kiln_cuda

#endif /* KILN_SRC_KERNELS_CUDA_CUDA_COMMON_H */

/* The kernel interface of the tensor layer's own work (fill, copy/convert,
 * arange, random). Kernels are arithmetic only: raw pointers, shapes,
 * strides, a backend stream handle. They never allocate and never see a
 * kiln_tensor. Each device type provides one table with the same
 * signatures (files in kernels/cpu/ and kernels/cuda/); the op library of a
 * later layer has its own tables. */
#ifndef KILN_SRC_KERNELS_KERNELS_H
#define KILN_SRC_KERNELS_KERNELS_H

#include "kiln/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A strided view of device memory. `data` points at element 0 (offset
 * already applied); strides are in elements; a stride of 0 broadcasts.
 * `layout` is KILN_LAYOUT_STRIDED except for the inputs and outputs of a
 * fast kernel that takes opaque layouts (op_args.h, kiln_op_kernel.layout):
 * then shape is the logical shape, strides are those of a contiguous tensor
 * and mean nothing, and the bytes are in that layout. */
typedef struct kiln_strided {
    void *data;
    kiln_dtype dtype;
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    int64_t strides[KILN_MAX_DIMS];
    kiln_layout layout;
} kiln_strided;

/* Reorders a contiguous 4-D (N, C, H, W) tensor of `elem` bytes per element
 * between NCHW and nChw<block>c (block 16 or 8, C a multiple of it):
 * to_blocked chooses the direction. dst and src do not overlap. CPU
 * (OpenMP); blocks the host. kiln_cpu_reorder_nchw16c is block 16. */
void kiln_cpu_reorder_blocked(void *dst, const void *src, size_t elem, const int64_t *shape, int block,
                              bool to_blocked);
void kiln_cpu_reorder_nchw16c(void *dst, const void *src, size_t elem, const int64_t *shape, bool to_blocked);
/* The channels per block of a blocked layout (16, 8), 0 for strided. */
static inline int kiln_layout_block(kiln_layout layout) {
    return layout == KILN_LAYOUT_NCHW16C ? 16 : layout == KILN_LAYOUT_NCHW8C ? 8 : 0;
}

typedef struct kiln_tensor_kernels {
    /* dst[i] = convert(src[i]) over dst's shape; src has the same shape
     * (strides may be 0 to broadcast). Any dtype pair. Float -> integer
     * truncates toward zero; -> bool is (x != 0). */
    kiln_status (*copy_strided)(const kiln_strided *dst, const kiln_strided *src, void *stream);
    /* dst[i] = value converted to dst's dtype. */
    kiln_status (*fill)(const kiln_strided *dst, double value, void *stream);
    /* Contiguous dst of n elements: dst[i] = start + i*step (computed in f64). */
    kiln_status (*arange)(void *dst, kiln_dtype dtype, int64_t n, double start, double step,
                          void *stream);
    /* Contiguous dst of n elements from the draw at `rng`: uniform [0,1)
     * uses word i; normal uses kiln_rng_normal_at(rng, i). Floating dtypes.
     * Both are computed in f32 and converted with round-to-nearest-even;
     * an f16 uniform that rounds to 1.0 (0x3C00) is stored as 0x3BFF, a
     * bf16 one (0x3F80) as 0x3F7F, so the range stays [0, 1). */
    kiln_status (*rand_uniform)(void *dst, kiln_dtype dtype, int64_t n, kiln_rng rng, void *stream);
    kiln_status (*rand_normal)(void *dst, kiln_dtype dtype, int64_t n, kiln_rng rng, void *stream);
} kiln_tensor_kernels;

const kiln_tensor_kernels *kiln_cpu_tensor_kernels(void);
#ifdef KILN_WITH_CUDA
const kiln_tensor_kernels *kiln_cuda_tensor_kernels(void);
#endif
/* The table for a device type; NULL for meta (no data to touch). */
const kiln_tensor_kernels *kiln_tensor_kernels_for(kiln_device_type type);
/* The device type's own table, whatever override is set (the trace layer
 * records through its override and calls the real kernels with this). */
const kiln_tensor_kernels *kiln_tensor_kernels_builtin(kiln_device_type type);

/* While the trace layer records a call (src/trace), it puts a table of its
 * own in front of the device's on that thread (NULL: none, one predictable
 * branch in kiln_tensor_kernels_for): the tensor layer's fills and copies
 * are then recorded as well. Returns the previous override. */
typedef const kiln_tensor_kernels *(*kiln_tensor_kernels_override)(kiln_device_type type);
kiln_tensor_kernels_override kiln_tensor_kernels_set_override(kiln_tensor_kernels_override fn);

#ifdef __cplusplus
}
#endif
#endif

/* Fast CPU kernels in plain C (no oneDNN): f32 on contiguous tensors,
 * parallel over OpenMP threads where the build has OpenMP. Each has a
 * supports fn; what it declines runs the reference kernel. Entries of the
 * fast CPU table (src/ops/cpu_fast_table.c). */
#ifndef KILN_SRC_KERNELS_CPU_FAST_FAST_KERNELS_H
#define KILN_SRC_KERNELS_CPU_FAST_FAST_KERNELS_H

#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/error.h"
#include "kernels/op_args.h"

/* The threads a CPU kernel's parallel region may take (1 without OpenMP):
 * kernels with buffers per thread size their workspace for this many, and
 * each thread takes the slot of its number in the region. */
static inline int kiln_cpu_threads_max(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

static inline int kiln_cpu_thread_id(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* The hot loops are compiled for AVX-512, AVX2 and the baseline, and the
 * loader picks the widest the CPU has (GCC/Clang target_clones), so a
 * build for any x86-64 still uses the 16-lane units of the machines we
 * train on. */
#if defined(__SANITIZE_THREAD__)
#define KILN_TSAN_BUILD 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KILN_TSAN_BUILD 1
#endif
#endif
/* Not under ThreadSanitizer: target_clones resolve through ifuncs, which
 * run before its runtime is up (the process dies at start-up). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(KILN_NO_TARGET_CLONES) && \
    !defined(KILN_TSAN_BUILD)
#define KILN_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KILN_SIMD_CLONES
#endif

kiln_status kiln_fast_max_pool2d(const kiln_op_args *a);
bool kiln_fast_max_pool2d_supports(const kiln_op_args *a);
kiln_status kiln_fast_max_pool2d_backward(const kiln_op_args *a);
bool kiln_fast_max_pool2d_backward_supports(const kiln_op_args *a);

/* relu_max_pool2d and its backward on contiguous NCHW (supports: the
 * max_pool2d one for the forward). */
kiln_status kiln_fast_relu_max_pool2d(const kiln_op_args *a);
kiln_status kiln_fast_relu_max_pool2d_backward(const kiln_op_args *a);
/* relu_max_pool2d_backward_sum's input gradient, and part[p] (a double
 * per (n, c) plane) the plane's sum; the caller adds the planes up. */
kiln_status kiln_plain_relu_max_pool2d_backward_sum(const kiln_op_args *a, double *part);
/* relu_max_pool2d_backward_sum on either layout (pool_fast.c; bf16: the
 * bf16 kernels below, plain NCHW only); its
 * workspace is a double per (n, c) plane, added up by kiln_fast_add_planes
 * (out[1][c] = the sum over n of part[n * c_count + c], in n order). */
kiln_status kiln_fast_relu_max_pool2d_backward_sum(const kiln_op_args *a);
bool kiln_fast_relu_max_pool2d_backward_sum_supports(const kiln_op_args *a);
size_t kiln_fast_relu_max_pool2d_backward_sum_workspace(const kiln_op_args *a);
void kiln_fast_relu_max_pool2d_backward_sum_layout(const kiln_op_args *a, kiln_layout *out);
void kiln_fast_add_planes(const double *part, int64_t n, int64_t c_count, const kiln_strided *sums);
bool kiln_fast_relu_max_pool2d_backward_supports(const kiln_op_args *a);
/* relu_max_pool2d and relu_max_pool2d_backward_sum for bf16 on contiguous
 * NCHW, windows of kernel = stride without padding (pool_bf16.c): the
 * reference kernels' bits; the backward's workspace is a double per plane. */
bool kiln_bf16_relu_max_pool2d_supports(const kiln_op_args *a);
kiln_status kiln_bf16_relu_max_pool2d(const kiln_op_args *a);
bool kiln_bf16_relu_max_pool2d_backward_sum_supports(const kiln_op_args *a);
size_t kiln_bf16_relu_max_pool2d_backward_sum_workspace(const kiln_op_args *a);
kiln_status kiln_bf16_relu_max_pool2d_backward_sum(const kiln_op_args *a);
/* relu_max_pool2d of an NHWC (N, H, W, C) bf16 x into NCHW y (N, C, OH, OW)
 * and its int64 indices, k x k windows at stride k without padding: the
 * reference kernel's values and indices on the NCHW form of x. Blocks the
 * host; the caller owns every buffer. */
kiln_status kiln_bf16_relu_max_pool2d_from_nhwc(const uint16_t *x, int64_t N, int64_t C, int64_t H, int64_t W,
                                                int64_t k, uint16_t *y, int64_t *ix, int64_t OH, int64_t OW);
/* For tests: 0 keeps those kernels on their portable rows (no AVX-512), 1 (the default) lets them use them. */
void kiln_bf16_pool_test_rows(int on);
/* Whether the bf16 kernels may take their vector rows (kiln_bf16_pool_test_rows). */
bool kiln_bf16_rows_allowed(void);

/* conv2d_relu_max_pool2d and conv2d_relu_max_pool2d_grad_weight for bf16
 * images of few channels (C * KH * KW <= 48), stride 1, 2x2 pooling,
 * 16k output channels, contiguous NCHW (conv_pool_bf16.c): autocast's first
 * layer, in f32 registers, where oneDNN's bf16 kernels want 16 channels. */
bool kiln_bf16_conv_pool_smallc_supports(const kiln_op_args *a);
size_t kiln_bf16_conv_pool_smallc_workspace(const kiln_op_args *a);
kiln_status kiln_bf16_conv_pool_smallc(const kiln_op_args *a);
bool kiln_bf16_conv_pool_smallc_grad_weight_supports(const kiln_op_args *a);
size_t kiln_bf16_conv_pool_smallc_grad_weight_workspace(const kiln_op_args *a);
kiln_status kiln_bf16_conv_pool_smallc_grad_weight(const kiln_op_args *a);

kiln_status kiln_fast_relu(const kiln_op_args *a);
bool kiln_fast_relu_supports(const kiln_op_args *a);
kiln_status kiln_fast_relu_backward(const kiln_op_args *a);
bool kiln_fast_relu_backward_supports(const kiln_op_args *a);

kiln_status kiln_fast_sum(const kiln_op_args *a);
bool kiln_fast_sum_supports(const kiln_op_args *a);
size_t kiln_fast_sum_workspace(const kiln_op_args *a);

/* Batch norm and its backward, f32 NCHW or nChw16c (bn_fast.c); layout
 * fns: y / dx as x. */
kiln_status kiln_fast_batch_norm(const kiln_op_args *a);
bool kiln_fast_batch_norm_supports(const kiln_op_args *a);
void kiln_fast_bn_layout(const kiln_op_args *a, kiln_layout *out);
kiln_status kiln_fast_batch_norm_backward(const kiln_op_args *a);
bool kiln_fast_batch_norm_backward_supports(const kiln_op_args *a);
void kiln_fast_bn_backward_layout(const kiln_op_args *a, kiln_layout *out);

/* On oneDNN's nChw16c layout (blocked_fast.c); entries with a layout fn. */
kiln_status kiln_blocked_max_pool2d(const kiln_op_args *a);
bool kiln_blocked_max_pool2d_supports(const kiln_op_args *a);
kiln_status kiln_blocked_max_pool2d_backward(const kiln_op_args *a);
bool kiln_blocked_max_pool2d_backward_supports(const kiln_op_args *a);
kiln_status kiln_blocked_relu_max_pool2d(const kiln_op_args *a); /* supports: kiln_blocked_max_pool2d_supports */
kiln_status kiln_blocked_relu_max_pool2d_backward(const kiln_op_args *a);
kiln_status kiln_blocked_relu_max_pool2d_backward_sum(const kiln_op_args *a, double *part); /* as the fast one */
/* One plane of relu_max_pool2d_backward's dense 2x2 path on nChw8c, the
 * blocked kernel's own: go, ix, y (oh x ow x 8) into dx (h x w x 8),
 * uncovered rows and columns 0, sums (8 doubles) the plane's sums as
 * relu_max_pool2d_backward_sum takes them. Returns the indices outside
 * their window (dx is then not the scatter's). */
int64_t kiln_blocked_relu_pool_backward_plane_b8(const float *go, const int64_t *ix, const float *y, float *dx, int64_t oh,
                                                 int64_t ow, int64_t h, int64_t w, double *sums);
bool kiln_blocked_relu_max_pool2d_backward_supports(const kiln_op_args *a);
void kiln_blocked_relu_pool_backward_layout(const kiln_op_args *a, kiln_layout *out);
kiln_status kiln_blocked_sum(const kiln_op_args *a);
bool kiln_blocked_sum_supports(const kiln_op_args *a);
/* layout fns: every output as input 0; grad_input as the indices (input
 * 1); every output strided; ReLU's output as its input */
void kiln_blocked_same_as_input(const kiln_op_args *a, kiln_layout *out);
void kiln_blocked_pool_backward_layout(const kiln_op_args *a, kiln_layout *out);
void kiln_blocked_strided_out(const kiln_op_args *a, kiln_layout *out);
void kiln_blocked_relu_layout(const kiln_op_args *a, kiln_layout *out);
/* a + b of one shape and one layout (ew_fast.c); output in place allowed */
kiln_status kiln_fast_add(const kiln_op_args *a);
bool kiln_fast_add_supports(const kiln_op_args *a);

#endif

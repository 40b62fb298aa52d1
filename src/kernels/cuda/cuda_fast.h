/* The CUDA library kernels (docs/cuda.md, "Fast paths"): NVIDIA's libraries
 * in front of the hand-written kernels of cuda_ops.h, in the real CUDA build
 * only (the emulation build has neither library). Plain kernel functions
 * with the op_args.h signatures, like every kernel: the CUDA fast table
 * that points ops at them is src/ops/cuda_fast_table_cublas.c.
 *
 *   cuBLASLt (gemm_cublaslt_cublas.c): mm, bmm, linear (bias epilogue),
 *     linear_act (bias and relu epilogues);
 *     f32 (TF32 when kiln_allow_tf32()), f16 and bf16 with f32 accumulation.
 *   cuDNN 9 (cudnn_ops_cudnn.c, KILN_WITH_CUDNN only): conv2d (and the
 *     fused conv2d_relu) and its two
 *     gradients through the autotuner (kernels/autotune.h) and the cuDNN
 *     provider (cudnn_provider.h), average pooling and its backward, batch
 *     norm (training and inference) and its backward (training).
 *
 * Every entry has a supports fn that declines what its library path does
 * not cover (layouts, dtypes, attributes): the dispatcher then runs the
 * hand-written kernel, and so does the run fn itself if it is handed such
 * args. When a library call fails at run time the run fn returns that
 * status with the thread's error set, and the fast table runs the
 * hand-written kernel instead (after one warning per op and process),
 * except on a stream whose CUDA graph capture the failure invalidated:
 * there the error ends the capture (a kernel queued on an invalidated
 * capture fails too, and would only hide the cause). A
 * workspace fn gives the library path's own need (the table reserves at
 * least the hand-written kernel's, for that fallback); entries without one
 * need none.
 *
 * Unverified on a GPU: compiled and linked in the nvcc tier only, until a
 * scripts/gpu-check.sh run is recorded in docs/cuda.md. */
#ifndef KILN_SRC_KERNELS_CUDA_CUDA_FAST_H
#define KILN_SRC_KERNELS_CUDA_CUDA_FAST_H

#include "kernels/op_args.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The device owning ptr (a CUDA device pointer) made current; *previous
 * receives the caller's device for kiln_cuda_fast_leave (fast_guard_cublas.c). */
kiln_status kiln_cuda_fast_enter(const void *ptr, int *device, int *previous);
/* The same for a device given by index (a planned step on meta has no
 * pointers: kiln_meta_kernels_index names the device it models). */
kiln_status kiln_cuda_fast_enter_index(int index, int *device, int *previous);
void kiln_cuda_fast_leave(int device, int previous);

/* Whether a view is dense row-major (size-1 dims' strides ignored). */
bool kiln_cuda_fast_is_contiguous(const kiln_strided *s);

/* ---- cuBLASLt (gemm_cublaslt_cublas.c) ---- */
kiln_status kiln_cublaslt_mm(const kiln_op_args *a);
kiln_status kiln_cublaslt_bmm(const kiln_op_args *a);
kiln_status kiln_cublaslt_linear(const kiln_op_args *a);
bool kiln_cublaslt_mm_supports(const kiln_op_args *a);
bool kiln_cublaslt_bmm_supports(const kiln_op_args *a);
bool kiln_cublaslt_linear_supports(const kiln_op_args *a);
/* linear_act (the fused flatten + linear + relu of ops.def) */
kiln_status kiln_cublaslt_linear_act(const kiln_op_args *a);
bool kiln_cublaslt_linear_act_supports(const kiln_op_args *a);
/* The GEMMs the cuBLASLt entries compute. */
typedef enum kiln_cublaslt_gemm {
    KILN_CUBLASLT_MM = 0,
    KILN_CUBLASLT_BMM,
    KILN_CUBLASLT_LINEAR,
    KILN_CUBLASLT_LINEAR_ACT,
} kiln_cublaslt_gemm;
/* How a GEMM op's args map onto one cublasLtMatmul, in cuBLASLt's
 * column-major terms: D (m x n, leading dim ldd) = op(A) (m x k) @ op(B)
 * (k x n) (+ bias[i]) (relu), A stored (m x k) or, with trans_a, (k x m)
 * with leading dim lda (B likewise), `batch` matrices `stride_*` elements
 * apart. False when the entry declines the args. Host-only (no cuBLASLt
 * call): tests/kernels/test_cublaslt_geometry.c checks it on the CPU. */
typedef struct kiln_cublaslt_geometry {
    int64_t m, n, k, batch, lda, ldb, ldd, stride_a, stride_b, stride_d;
    int trans_a, trans_b;
    bool relu;
    const void *a, *b, *bias;
    void *d;
} kiln_cublaslt_geometry;
bool kiln_cublaslt_geometry_of(kiln_cublaslt_gemm gemm, const kiln_op_args *a, kiln_cublaslt_geometry *out);
/* cuBLASLt's version (cublasLtGetVersion) for reports. */
size_t kiln_cublaslt_version(void);
void kiln_cublaslt_shutdown(void);
/* The persistent GEMM workspace each stream gets on `device` (bytes). */
size_t kiln_cublaslt_stream_workspace_bytes(int device);
/* Make the handle of `device` and the workspace of `stream` now, if they
 * do not exist (before a graph capture of the stream, where they cannot be
 * made). Blocks while the workspace is allocated; KILN_ERR_OUT_OF_MEMORY
 * when it cannot be. */
kiln_status kiln_cublaslt_prepare(int device, void *stream);
/* The stream is being destroyed: its workspace goes back to the caching
 * allocator, after the device has finished the work queued so far
 * (blocks). */
void kiln_cublaslt_forget_stream(int device, void *stream);

/* The fast table's side of the backend's per-stream entries
 * (src/ops/cuda_fast_table_cublas.c; runtime/backend.h): nothing, and 0
 * bytes, when the fast table is not registered (KILN_CUDA_KERNELS=reference). */
kiln_status kiln_cuda_fast_prepare_stream(int device, void *stream);
void kiln_cuda_fast_forget_stream(int device, void *stream);
size_t kiln_cuda_fast_stream_workspace_bytes(int device);

/* ---- cuDNN (cudnn_ops_cudnn.c, KILN_WITH_CUDNN) ---- */
kiln_status kiln_cudnn_conv2d(const kiln_op_args *a);
kiln_status kiln_cudnn_conv2d_grad_input(const kiln_op_args *a);
kiln_status kiln_cudnn_conv2d_grad_weight(const kiln_op_args *a);
bool kiln_cudnn_conv2d_supports(const kiln_op_args *a);
bool kiln_cudnn_conv2d_grad_input_supports(const kiln_op_args *a);
bool kiln_cudnn_conv2d_grad_weight_supports(const kiln_op_args *a);
size_t kiln_cudnn_conv2d_workspace(const kiln_op_args *a);
size_t kiln_cudnn_conv2d_grad_input_workspace(const kiln_op_args *a);
size_t kiln_cudnn_conv2d_grad_weight_workspace(const kiln_op_args *a);
kiln_status kiln_cudnn_conv2d_relu(const kiln_op_args *a); /* the fused conv2d + relu */
bool kiln_cudnn_conv2d_relu_supports(const kiln_op_args *a);
size_t kiln_cudnn_conv2d_relu_workspace(const kiln_op_args *a);
kiln_status kiln_cudnn_avg_pool2d(const kiln_op_args *a);
kiln_status kiln_cudnn_avg_pool2d_backward(const kiln_op_args *a);
bool kiln_cudnn_avg_pool2d_supports(const kiln_op_args *a);
bool kiln_cudnn_avg_pool2d_backward_supports(const kiln_op_args *a);
kiln_status kiln_cudnn_batch_norm(const kiln_op_args *a);
kiln_status kiln_cudnn_batch_norm_backward(const kiln_op_args *a);
bool kiln_cudnn_batch_norm_supports(const kiln_op_args *a);
bool kiln_cudnn_batch_norm_backward_supports(const kiln_op_args *a);
void kiln_cudnn_ops_shutdown(void);

/* The eval-mode statistics batch norm reports (mean = running mean,
 * invstd = 1 / sqrt(running var + eps)), f32, C channels, contiguous;
 * enqueued on stream (fast_support.cu; the cuDNN batch-norm path uses it). */
kiln_status kiln_cuda_bn_eval_stats(const float *running_mean, const float *running_var, double eps,
                                    float *mean_out, float *invstd_out, int64_t channels, void *stream,
                                    int device);

#ifdef __cplusplus
}
#endif
#endif

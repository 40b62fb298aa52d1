/* The CUDA fast table (docs/cuda.md, "Fast paths"): NVIDIA's libraries in
 * front of the hand-written kernels of cuda_ops.h, in the real CUDA build
 * only (the emulation build has neither library and registers none).
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
 * hand-written kernel. When a library call fails at run time the entry runs
 * the hand-written kernel itself (kiln_cuda_fast_fallback), after one
 * warning line per op and process. Each entry's workspace fn asks for at
 * least the hand-written kernel's workspace, so that fallback always has it.
 *
 * Unverified on a GPU: compiled and linked in the nvcc tier only, until a
 * scripts/gpu-check.sh run is recorded in docs/cuda.md. */
#ifndef KILN_SRC_KERNELS_CUDA_CUDA_FAST_H
#define KILN_SRC_KERNELS_CUDA_CUDA_FAST_H

#include "kernels/op_args.h"
#include "ops/op_registry.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The table (src/ops/cuda_fast_table_cublas.c), registered by kiln_init
 * unless KILN_CUDA_KERNELS=reference. */
const kiln_op_kernel *kiln_cuda_fast_op_kernels(void);
/* Frees the libraries' handles, cached descriptors and the persistent
 * workspaces (kiln_shutdown, before the runtime goes). Blocks the host
 * until each device's work is done. */
void kiln_cuda_fast_kernels_shutdown(void);

/* Runs the hand-written kernel for op after a library path failed with
 * `failed` (the error in the thread's error slot): logs one warning per op
 * and process naming `path` and the error, clears it, and returns the
 * hand-written kernel's status. */
kiln_status kiln_cuda_fast_fallback(kiln_op_id op, const char *path, kiln_status failed,
                                    const kiln_op_args *a);
/* The hand-written kernel's workspace bytes for these args (0: none). */
size_t kiln_cuda_reference_workspace(kiln_op_id op, const kiln_op_args *a);
/* How many times a library path fell back since the process started (the
 * comparison test checks the fast path really ran). */
uint64_t kiln_cuda_fast_fallbacks(kiln_op_id op);

/* The device owning ptr (a CUDA device pointer) made current; *previous
 * receives the caller's device for kiln_cuda_fast_leave. */
kiln_status kiln_cuda_fast_enter(const void *ptr, int *device, int *previous);
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
size_t kiln_cublaslt_mm_workspace(const kiln_op_args *a);
size_t kiln_cublaslt_bmm_workspace(const kiln_op_args *a);
size_t kiln_cublaslt_linear_workspace(const kiln_op_args *a);
/* linear_act (the fused flatten + linear + relu of ops.def) */
kiln_status kiln_cublaslt_linear_act(const kiln_op_args *a);
bool kiln_cublaslt_linear_act_supports(const kiln_op_args *a);
size_t kiln_cublaslt_linear_act_workspace(const kiln_op_args *a);
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
bool kiln_cublaslt_geometry_of(kiln_op_id op, const kiln_op_args *a, kiln_cublaslt_geometry *out);
/* cuBLASLt's version (cublasLtGetVersion) for reports. */
size_t kiln_cublaslt_version(void);
void kiln_cublaslt_shutdown(void);

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
size_t kiln_cudnn_avg_pool2d_workspace(const kiln_op_args *a);
size_t kiln_cudnn_avg_pool2d_backward_workspace(const kiln_op_args *a);
kiln_status kiln_cudnn_batch_norm(const kiln_op_args *a);
kiln_status kiln_cudnn_batch_norm_backward(const kiln_op_args *a);
bool kiln_cudnn_batch_norm_supports(const kiln_op_args *a);
bool kiln_cudnn_batch_norm_backward_supports(const kiln_op_args *a);
size_t kiln_cudnn_batch_norm_workspace(const kiln_op_args *a);
size_t kiln_cudnn_batch_norm_backward_workspace(const kiln_op_args *a);
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

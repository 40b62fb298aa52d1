/* The CUDA fast table (kernels/cuda/cuda_fast.h): cuBLASLt GEMM always in
 * the real CUDA build, cuDNN entries with KILN_WITH_CUDNN; plus the
 * helpers every library path shares (fallback to the hand-written kernel
 * with a one-time warning, the device guard). Real CUDA build only (a
 * *_cublas.c file: the emulation build has no cuBLASLt). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include <cuda_runtime_api.h>

#include "base/error.h"
#include "kernels/cuda/cuda_fast.h"
#include "kernels/cuda/cuda_ops.h"
#include "runtime/cuda_backend.h"

#define FLOAT3 (KILN_DT(KILN_F32) | KILN_DT(KILN_F16) | KILN_DT(KILN_BF16))

static kiln_op_kernel fast_table[KILN_OP_COUNT];
static pthread_once_t fast_table_once = PTHREAD_ONCE_INIT;
static atomic_bool warned[KILN_OP_COUNT];
static atomic_uint_fast64_t fallbacks[KILN_OP_COUNT];

static void build_fast_table(void) {
    fast_table[KILN_OP_MM] =
        (kiln_op_kernel){kiln_cublaslt_mm, kiln_cublaslt_mm_workspace, FLOAT3, kiln_cublaslt_mm_supports};
    fast_table[KILN_OP_BMM] =
        (kiln_op_kernel){kiln_cublaslt_bmm, kiln_cublaslt_bmm_workspace, FLOAT3, kiln_cublaslt_bmm_supports};
    fast_table[KILN_OP_LINEAR] = (kiln_op_kernel){kiln_cublaslt_linear, kiln_cublaslt_linear_workspace,
                                                  FLOAT3, kiln_cublaslt_linear_supports};
    fast_table[KILN_OP_LINEAR_ACT] =
        (kiln_op_kernel){kiln_cublaslt_linear_act, kiln_cublaslt_linear_act_workspace, FLOAT3,
                         kiln_cublaslt_linear_act_supports};
#ifdef KILN_WITH_CUDNN
    fast_table[KILN_OP_CONV2D] =
        (kiln_op_kernel){kiln_cudnn_conv2d, kiln_cudnn_conv2d_workspace, FLOAT3, kiln_cudnn_conv2d_supports};
    fast_table[KILN_OP_CONV2D_RELU] = (kiln_op_kernel){
        kiln_cudnn_conv2d_relu, kiln_cudnn_conv2d_relu_workspace, FLOAT3, kiln_cudnn_conv2d_relu_supports};
    fast_table[KILN_OP_CONV2D_GRAD_INPUT] =
        (kiln_op_kernel){kiln_cudnn_conv2d_grad_input, kiln_cudnn_conv2d_grad_input_workspace, FLOAT3,
                         kiln_cudnn_conv2d_grad_input_supports};
    fast_table[KILN_OP_CONV2D_GRAD_WEIGHT] =
        (kiln_op_kernel){kiln_cudnn_conv2d_grad_weight, kiln_cudnn_conv2d_grad_weight_workspace, FLOAT3,
                         kiln_cudnn_conv2d_grad_weight_supports};
    fast_table[KILN_OP_AVG_POOL2D] = (kiln_op_kernel){kiln_cudnn_avg_pool2d, kiln_cudnn_avg_pool2d_workspace,
                                                      FLOAT3, kiln_cudnn_avg_pool2d_supports};
    fast_table[KILN_OP_AVG_POOL2D_BACKWARD] =
        (kiln_op_kernel){kiln_cudnn_avg_pool2d_backward, kiln_cudnn_avg_pool2d_backward_workspace, FLOAT3,
                         kiln_cudnn_avg_pool2d_backward_supports};
    fast_table[KILN_OP_BATCH_NORM] = (kiln_op_kernel){kiln_cudnn_batch_norm, kiln_cudnn_batch_norm_workspace,
                                                      FLOAT3, kiln_cudnn_batch_norm_supports};
    fast_table[KILN_OP_BATCH_NORM_BACKWARD] =
        (kiln_op_kernel){kiln_cudnn_batch_norm_backward, kiln_cudnn_batch_norm_backward_workspace, FLOAT3,
                         kiln_cudnn_batch_norm_backward_supports};
#endif
}

const kiln_op_kernel *kiln_cuda_fast_op_kernels(void) {
    pthread_once(&fast_table_once, build_fast_table);
    return fast_table;
}

void kiln_cuda_fast_kernels_shutdown(void) {
    kiln_cublaslt_shutdown();
#ifdef KILN_WITH_CUDNN
    kiln_cudnn_ops_shutdown();
#endif
}

kiln_status kiln_cuda_fast_fallback(kiln_op_id op, const char *path, kiln_status failed,
                                    const kiln_op_args *a) {
    atomic_fetch_add(&fallbacks[op], 1);
    bool was = atomic_exchange(&warned[op], true);
    if (!was)
        kiln_log_write(
            KILN_LOG_WARN,
            "%s failed (%s: %s); kiln_%s runs the hand-written CUDA kernel instead (warned once per op)",
            path, kiln_status_name(failed), kiln_error_message(), kiln_op_info_get(op)->name);
    kiln_error_clear();
    const kiln_op_kernel *k = &kiln_cuda_op_kernels()[op];
    if (!k->run)
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "kiln_%s: no hand-written CUDA kernel to fall back to",
                          kiln_op_info_get(op)->name);
    if (k->workspace && a->workspace_bytes < k->workspace(a))
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "kiln_%s: the fallback's workspace was not reserved",
                          kiln_op_info_get(op)->name);
    return k->run(a);
}

uint64_t kiln_cuda_fast_fallbacks(kiln_op_id op) {
    return op >= 0 && op < KILN_OP_COUNT ? (uint64_t)atomic_load(&fallbacks[op]) : 0;
}

size_t kiln_cuda_reference_workspace(kiln_op_id op, const kiln_op_args *a) {
    const kiln_op_kernel *k = &kiln_cuda_op_kernels()[op];
    return k->workspace ? k->workspace(a) : 0;
}

kiln_status kiln_cuda_fast_enter(const void *ptr, int *device, int *previous) {
    struct cudaPointerAttributes attr;
    *device = -1, *previous = -1;
    KILN_CUDA_TRY(-1, cudaPointerGetAttributes(&attr, ptr));
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "allocate the tensor on the cuda device",
                          "CUDA library path given host pointer %p", ptr);
    KILN_CUDA_TRY(attr.device, cudaGetDevice(previous));
    if (*previous != attr.device) KILN_CUDA_TRY(attr.device, cudaSetDevice(attr.device));
    *device = attr.device;
    return KILN_OK;
}

void kiln_cuda_fast_leave(int device, int previous) {
    if (previous >= 0 && previous != device) (void)KILN_CUDA_CHECK(previous, cudaSetDevice(previous));
}

bool kiln_cuda_fast_is_contiguous(const kiln_strided *s) {
    int64_t expect = 1;
    for (int k = s->ndim - 1; k >= 0; k--) {
        if (s->shape[k] != 1 && s->strides[k] != expect) return false;
        expect *= s->shape[k];
    }
    return true;
}

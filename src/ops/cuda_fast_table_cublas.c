/* The CUDA fast table (cuda_tables.h): the library kernels of
 * kernels/cuda/cuda_fast.h — cuBLASLt GEMM always in the real CUDA build,
 * cuDNN with KILN_WITH_CUDNN — in front of the hand-written kernels of the
 * reference table. The policy around a library path lives here, beside its
 * row: when the library call fails, the row's run fn runs the hand-written
 * kernel instead (one warning per op and process), and its workspace fn
 * reserves at least the hand-written kernel's workspace so that fallback
 * always has it (not on a CUDA graph capture the failure invalidated:
 * there the failure ends the capture). Real CUDA build only (a *_cublas.c file: the emulation
 * build has no cuBLASLt). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include <cuda_runtime_api.h>

#include "base/error.h"
#include "kernels/cuda/cuda_fast.h"
#include "kernels/cuda/launch_blocking.h"
#include "kiln/runtime.h"
#include "ops/cuda_tables.h"
#include "ops/op_registry.h"

#define FLOAT3 (KILN_DT(KILN_F32) | KILN_DT(KILN_F16) | KILN_DT(KILN_BF16))

static kiln_op_kernel fast_table[KILN_OP_COUNT];
static pthread_once_t fast_table_once = PTHREAD_ONCE_INIT;
static atomic_bool warned[KILN_OP_COUNT];
static atomic_uint_fast64_t fallbacks[KILN_OP_COUNT];

/* Runs the hand-written kernel for op after the library path `path` failed
 * with `failed` (the error in the thread's error slot): logs one warning
 * per op and process naming the path and the error, clears it, and returns
 * the hand-written kernel's status. */
static kiln_status fallback(kiln_op_id op, const char *path, kiln_status failed, const kiln_op_args *a) {
    /* On a capture the failure invalidated, every later launch fails too:
     * no stand-in, the capture ends with the library's own error. */
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing((cudaStream_t)a->stream, &cs) != cudaSuccess) (void)cudaGetLastError();
    if (cs == cudaStreamCaptureStatusInvalidated) {
        char why[512];
        snprintf(why, sizeof why, "%s", kiln_error_message());
        return KILN_RAISE(failed, NULL,
                          "%s failed during a CUDA graph capture and invalidated it (%s): the hand-written "
                          "kernel cannot stand in on an invalidated capture",
                          path, why);
    }
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

/* The larger of the library path's workspace and the hand-written kernel's. */
static size_t fast_workspace(kiln_op_id op, kiln_op_workspace_fn lib, const kiln_op_args *a) {
    const kiln_op_kernel *k = &kiln_cuda_op_kernels()[op];
    size_t ref = k->workspace ? k->workspace(a) : 0;
    size_t need = lib ? lib(a) : 0;
    return need > ref ? need : ref;
}

/* The run and workspace fns of op ID's row around the library kernel `lib`
 * (its workspace fn `lib_workspace`, or NULL), named `path` in the
 * fallback's warning. */
#define FAST_FNS(ID, lib, lib_workspace, path)                                                               \
    static kiln_status ID##_run(const kiln_op_args *a) {                                                     \
        kiln_status st = lib(a);                                                                             \
        if (st) return fallback(KILN_OP_##ID, path, st, a);                                                  \
        return kiln_cuda_launch_blocking_check(-1, path, __FILE__, __LINE__);                                \
    }                                                                                                        \
    static size_t ID##_workspace(const kiln_op_args *a) {                                                    \
        return fast_workspace(KILN_OP_##ID, lib_workspace, a);                                               \
    }

FAST_FNS(MM, kiln_cublaslt_mm, NULL, "cuBLASLt mm")
FAST_FNS(BMM, kiln_cublaslt_bmm, NULL, "cuBLASLt bmm")
FAST_FNS(LINEAR, kiln_cublaslt_linear, NULL, "cuBLASLt linear")
FAST_FNS(LINEAR_ACT, kiln_cublaslt_linear_act, NULL, "cuBLASLt linear_act")
#ifdef KILN_WITH_CUDNN
FAST_FNS(CONV2D, kiln_cudnn_conv2d, kiln_cudnn_conv2d_workspace, "cuDNN conv2d")
FAST_FNS(CONV2D_RELU, kiln_cudnn_conv2d_relu, kiln_cudnn_conv2d_relu_workspace, "cuDNN conv2d_relu")
FAST_FNS(CONV2D_GRAD_INPUT, kiln_cudnn_conv2d_grad_input, kiln_cudnn_conv2d_grad_input_workspace,
         "cuDNN conv2d backward-data")
FAST_FNS(CONV2D_GRAD_WEIGHT, kiln_cudnn_conv2d_grad_weight, kiln_cudnn_conv2d_grad_weight_workspace,
         "cuDNN conv2d backward-weights")
FAST_FNS(AVG_POOL2D, kiln_cudnn_avg_pool2d, NULL, "cuDNN avg_pool2d")
FAST_FNS(AVG_POOL2D_BACKWARD, kiln_cudnn_avg_pool2d_backward, NULL, "cuDNN avg_pool2d_backward")
FAST_FNS(BATCH_NORM, kiln_cudnn_batch_norm, NULL, "cuDNN batch_norm")
FAST_FNS(BATCH_NORM_BACKWARD, kiln_cudnn_batch_norm_backward, NULL, "cuDNN batch_norm_backward")
/* kiln_set_cudnn_enabled(false) (KILN_CUDNN=0): the cuDNN rows decline
 * every call, and the dispatcher runs the hand-written kernels. */
#define CUDNN_SUPPORTS(ID, supports)                                                                         \
    static bool ID##_supports(const kiln_op_args *a) { return kiln_is_cudnn_enabled() && supports(a); }
CUDNN_SUPPORTS(CONV2D, kiln_cudnn_conv2d_supports)
CUDNN_SUPPORTS(CONV2D_RELU, kiln_cudnn_conv2d_relu_supports)
CUDNN_SUPPORTS(CONV2D_GRAD_INPUT, kiln_cudnn_conv2d_grad_input_supports)
CUDNN_SUPPORTS(CONV2D_GRAD_WEIGHT, kiln_cudnn_conv2d_grad_weight_supports)
CUDNN_SUPPORTS(AVG_POOL2D, kiln_cudnn_avg_pool2d_supports)
CUDNN_SUPPORTS(AVG_POOL2D_BACKWARD, kiln_cudnn_avg_pool2d_backward_supports)
CUDNN_SUPPORTS(BATCH_NORM, kiln_cudnn_batch_norm_supports)
CUDNN_SUPPORTS(BATCH_NORM_BACKWARD, kiln_cudnn_batch_norm_backward_supports)
#undef CUDNN_SUPPORTS
#endif
#undef FAST_FNS

static void build_fast_table(void) {
#define ROW(ID, supports)                                                                                    \
    fast_table[KILN_OP_##ID] = (kiln_op_kernel){ID##_run, ID##_workspace, FLOAT3, supports}
    ROW(MM, kiln_cublaslt_mm_supports);
    ROW(BMM, kiln_cublaslt_bmm_supports);
    ROW(LINEAR, kiln_cublaslt_linear_supports);
    ROW(LINEAR_ACT, kiln_cublaslt_linear_act_supports);
#ifdef KILN_WITH_CUDNN
    ROW(CONV2D, CONV2D_supports);
    ROW(CONV2D_RELU, CONV2D_RELU_supports);
    ROW(CONV2D_GRAD_INPUT, CONV2D_GRAD_INPUT_supports);
    ROW(CONV2D_GRAD_WEIGHT, CONV2D_GRAD_WEIGHT_supports);
    ROW(AVG_POOL2D, AVG_POOL2D_supports);
    ROW(AVG_POOL2D_BACKWARD, AVG_POOL2D_BACKWARD_supports);
    ROW(BATCH_NORM, BATCH_NORM_supports);
    ROW(BATCH_NORM_BACKWARD, BATCH_NORM_BACKWARD_supports);
#endif
#undef ROW
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

/* The fast table is in force for CUDA: kiln_init registered it
 * (KILN_CUDA_KERNELS unset or fast). */
static bool fast_registered(void) { return kiln_ops_fast_table_count(KILN_DEVICE_CUDA) > 0; }

kiln_status kiln_cuda_fast_prepare_stream(int device, void *stream) {
    return fast_registered() ? kiln_cublaslt_prepare(device, stream) : KILN_OK;
}

void kiln_cuda_fast_forget_stream(int device, void *stream) { kiln_cublaslt_forget_stream(device, stream); }

size_t kiln_cuda_fast_stream_workspace_bytes(int device) {
    return fast_registered() ? kiln_cublaslt_stream_workspace_bytes(device) : 0;
}

uint64_t kiln_cuda_fast_fallbacks(kiln_op_id op) {
    return op >= 0 && op < KILN_OP_COUNT ? (uint64_t)atomic_load(&fallbacks[op]) : 0;
}

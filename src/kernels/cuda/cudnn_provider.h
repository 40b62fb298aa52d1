/* The cuDNN 9 convolution provider of the autotuner (kernels/autotune.h),
 * compiled only with KILN_WITH_CUDNN (cudnn_provider_cudnn.c). Used by the
 * CUDA fast table's conv entries (cudnn_ops_cudnn.c), which do this: fill a
 * kiln_cudnn_conv_call, ask kiln_autotune_choose (with this provider, the
 * call as ctx and kiln_autotune_mode_current(KILN_DEVICE_CUDA)) for an
 * algorithm, then run it with kiln_cudnn_conv_run and a workspace of
 * kiln_cudnn_conv_workspace bytes from the caching allocator, falling back
 * to the hand-written kernel when the tuner fails.
 *
 * Candidates are cuDNN's algorithms for the pass in the order of its
 * heuristics (cudnnGetConvolution{Forward,BackwardData,BackwardFilter}
 * Algorithm_v7, the legacy API cuDNN 9 still ships), each with its
 * workspace, its determinism (CUDNN_DETERMINISTIC) and its math type;
 * those cuDNN reports as unsupported fail to build. The default (timing
 * off) is the heuristics' first. Timing uses CUDA events on the call's
 * stream. Unverified on a GPU: it compiles and links in the nvcc build
 * only (docs/performance.md, "Autotuning"). */
#ifndef KILN_SRC_KERNELS_CUDA_CUDNN_PROVIDER_H
#define KILN_SRC_KERNELS_CUDA_CUDNN_PROVIDER_H

#include "kernels/autotune.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_CUDNN_MAX_ALGOS 16

/* One convolution on device buffers, NCHW / OIHW contiguous, in forward
 * names: x (N, C, H, W), w (O, C/groups, kH, kW), y (N, O, OH, OW). The
 * pass reads and writes:
 *   forward:          x, w -> y   (no bias: added by the caller)
 *   backward-data:    y (grad_out), w -> x (grad_input)
 *   backward-weight:  y (grad_out), x -> w (grad_weight)
 * cfg->math: "f32" (FMA only, no TF32), "tf32" (tensor ops allowed), or
 * for f16/bf16 data anything (tensor ops, f32 accumulation). The
 * candidate list is filled in by the provider (`n_algos`, `algos`); the
 * caller zero-initialises the struct and sets the rest. */
typedef struct kiln_cudnn_conv_call {
    kiln_autotune_conv cfg;
    void *x, *w, *y;
    void *stream; /* cudaStream_t of the output's device */
    int device;
    /* filled by the provider */
    int n_algos;
    int algos[KILN_CUDNN_MAX_ALGOS];     /* cudnnConvolution*Algo_t */
    int math[KILN_CUDNN_MAX_ALGOS];      /* cudnnMathType_t */
    int status[KILN_CUDNN_MAX_ALGOS];    /* cudnnStatus_t from the heuristics */
    size_t memory[KILN_CUDNN_MAX_ALGOS]; /* workspace bytes */
    void *timer[2];                      /* cudaEvent_t, created on first timing */
} kiln_cudnn_conv_call;

const kiln_autotune_provider *kiln_cudnn_conv_provider(void);

/* Run candidate `index` of call (the index kiln_autotune_choose gave; the
 * algorithms are listed first if the choice came from the tuner's cache)
 * on call->stream. Asynchronous: does not block the host. */
kiln_status kiln_cudnn_conv_run(kiln_cudnn_conv_call *call, int index, void *workspace,
                                size_t workspace_bytes);
/* Workspace bytes of candidate `index` (0 when listing fails). */
size_t kiln_cudnn_conv_workspace(kiln_cudnn_conv_call *call, int index);
/* Destroys the call's timing events (if any). */
void kiln_cudnn_conv_call_release(kiln_cudnn_conv_call *call);
/* Frees the per-shape plans (descriptors and the heuristics' list, cached
 * by configuration and device) and the cuDNN handles (kiln_shutdown). */
void kiln_cudnn_conv_provider_shutdown(void);

#ifdef __cplusplus
}
#endif
#endif

/* The cuDNN 9 convolution provider (cudnn_provider.h). Compiled only with
 * KILN_WITH_CUDNN. Unverified on a GPU: built and linked in the nvcc tier. */
#include "kernels/cuda/cudnn_provider.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "base/error.h"
#include "runtime/cuda_backend.h"
#include "runtime/cuda_device.h"

/* Every cuDNN call is checked: a failure is a Kiln error naming the call
 * and cuDNN's status, returned from the enclosing function. */
#define CUDNN_TRY(call)                                                                                      \
    do {                                                                                                     \
        cudnnStatus_t cudnn_st_ = (call);                                                                    \
        if (cudnn_st_ != CUDNN_STATUS_SUCCESS)                                                               \
            return KILN_RAISE(cudnn_st_ == CUDNN_STATUS_NOT_SUPPORTED ? KILN_ERR_UNSUPPORTED                 \
                                                                      : KILN_ERR_DEVICE,                     \
                              NULL, "cuDNN: %s failed: %s", #call, cudnnGetErrorString(cudnn_st_));          \
    } while (0)

#define MAX_DEVICES 64

/* One handle per device, created on first use; a handle is used by one
 * thread at a time (cudnnSetStream then the call, under handle_mutex). */
static pthread_mutex_t handle_mutex = PTHREAD_MUTEX_INITIALIZER;
static cudnnHandle_t handles[MAX_DEVICES];

static kiln_status handle_for(int device, cudnnHandle_t *out) {
    if (device < 0 || device >= MAX_DEVICES)
        return KILN_RAISE(KILN_ERR_DEVICE, NULL, "cuDNN: device %d out of range", device);
    if (!handles[device]) {
        int previous = -1;
        KILN_TRY(kiln_cuda_device_switch(device, &previous));
        cudnnStatus_t st = cudnnCreate(&handles[device]);
        kiln_cuda_device_restore(device, previous);
        CUDNN_TRY(st);
    }
    *out = handles[device];
    return KILN_OK;
}

typedef struct descs {
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
} descs;

static void descs_destroy(descs *d) {
    if (d->x) cudnnDestroyTensorDescriptor(d->x);
    if (d->y) cudnnDestroyTensorDescriptor(d->y);
    if (d->w) cudnnDestroyFilterDescriptor(d->w);
    if (d->conv) cudnnDestroyConvolutionDescriptor(d->conv);
    memset(d, 0, sizeof *d);
}

static kiln_status data_type(kiln_dtype t, cudnnDataType_t *out) {
    switch (t) {
    case KILN_F32:
        *out = CUDNN_DATA_FLOAT;
        return KILN_OK;
    case KILN_F16:
        *out = CUDNN_DATA_HALF;
        return KILN_OK;
    case KILN_BF16:
        *out = CUDNN_DATA_BFLOAT16;
        return KILN_OK;
    default:
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "use f32, f16 or bf16", "cuDNN convolution: dtype %d",
                          (int)t);
    }
}

static bool fits_int(const int64_t *v, int n) {
    for (int i = 0; i < n; i++)
        if (v[i] < 0 || v[i] > 0x7fffffff) return false;
    return true;
}

/* Descriptors of cfg; compute in f32 for every data type. */
static kiln_status descs_create(const kiln_autotune_conv *c, descs *d) {
    memset(d, 0, sizeof *d);
    cudnnDataType_t dt = CUDNN_DATA_FLOAT;
    KILN_TRY(data_type(c->x_dtype, &dt));
    if (c->w_dtype != c->x_dtype || c->y_dtype != c->x_dtype)
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "cast the operands to one dtype",
                          "cuDNN convolution: mixed dtypes");
    if (!fits_int(c->x, 4) || !fits_int(c->w, 4) || !fits_int(c->y, 4))
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, NULL, "cuDNN convolution: a dimension exceeds int");
    CUDNN_TRY(cudnnCreateTensorDescriptor(&d->x));
    CUDNN_TRY(cudnnCreateTensorDescriptor(&d->y));
    CUDNN_TRY(cudnnCreateFilterDescriptor(&d->w));
    CUDNN_TRY(cudnnCreateConvolutionDescriptor(&d->conv));
    CUDNN_TRY(cudnnSetTensor4dDescriptor(d->x, CUDNN_TENSOR_NCHW, dt, (int)c->x[0], (int)c->x[1],
                                         (int)c->x[2], (int)c->x[3]));
    CUDNN_TRY(cudnnSetTensor4dDescriptor(d->y, CUDNN_TENSOR_NCHW, dt, (int)c->y[0], (int)c->y[1],
                                         (int)c->y[2], (int)c->y[3]));
    CUDNN_TRY(cudnnSetFilter4dDescriptor(d->w, dt, CUDNN_TENSOR_NCHW, (int)c->w[0], (int)c->w[1],
                                         (int)c->w[2], (int)c->w[3]));
    CUDNN_TRY(cudnnSetConvolution2dDescriptor(
        d->conv, (int)c->padding[0], (int)c->padding[1], (int)c->stride[0], (int)c->stride[1],
        (int)c->dilation[0], (int)c->dilation[1], CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    CUDNN_TRY(cudnnSetConvolutionGroupCount(d->conv, (int)c->groups));
    /* f32 without "tf32" keeps to FMA math: TF32 only when asked for. */
    bool fma_only = c->x_dtype == KILN_F32 && !(c->math && !strcmp(c->math, "tf32"));
    CUDNN_TRY(cudnnSetConvolutionMathType(d->conv,
                                          fma_only ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION));
    return KILN_OK;
}

static const char *algo_name(kiln_autotune_pass pass, int algo) {
    static const char *fwd[] = {
        "implicit_gemm", "implicit_precomp_gemm", "gemm", "direct", "fft", "fft_tiling",
        "winograd",      "winograd_nonfused"};
    static const char *bwd_data[] = {"algo_0",     "algo_1",   "fft",
                                     "fft_tiling", "winograd", "winograd_nonfused"};
    static const char *bwd_filter[] = {
        "algo_0", "algo_1", "fft", "algo_3", "winograd", "winograd_nonfused", "fft_tiling"};
    if (pass == KILN_AUTOTUNE_CONV_FWD) return algo >= 0 && algo < 8 ? fwd[algo] : "unknown";
    if (pass == KILN_AUTOTUNE_CONV_BWD_DATA) return algo >= 0 && algo < 6 ? bwd_data[algo] : "unknown";
    return algo >= 0 && algo < 7 ? bwd_filter[algo] : "unknown";
}

static const char *math_name(int math) {
    return math == CUDNN_TENSOR_OP_MATH                    ? "tensor_op"
           : math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION ? "tensor_op_conv"
           : math == CUDNN_FMA_MATH                        ? "fma"
                                                           : "default";
}

/* Descriptors and the heuristics' list of one configuration on one device,
 * cached by shape (the key of kiln_autotune_key_format), so an op call
 * neither creates descriptors nor queries the heuristics again. Guarded by
 * handle_mutex; a run sets the conv descriptor's math type under it. */
#define MAX_PLANS 1024
typedef struct conv_plan {
    char key[512];
    int device;
    descs d;
    int n_algos;
    int algos[KILN_CUDNN_MAX_ALGOS], math[KILN_CUDNN_MAX_ALGOS], status[KILN_CUDNN_MAX_ALGOS];
    size_t memory[KILN_CUDNN_MAX_ALGOS];
    bool deterministic[KILN_CUDNN_MAX_ALGOS];
    struct conv_plan *next;
} conv_plan;
static conv_plan *plans;
static int n_plans;

/* The heuristics' list for the pass, into a call-shaped scratch. */
static kiln_status list_algos(kiln_cudnn_conv_call *call, cudnnHandle_t h, const descs *d,
                              kiln_autotune_candidate *cand, int max, int *n) {
    const kiln_autotune_conv *c = &call->cfg;
    int got = 0;
    if (c->pass == KILN_AUTOTUNE_CONV_FWD) {
        cudnnConvolutionFwdAlgoPerf_t perf[KILN_CUDNN_MAX_ALGOS];
        CUDNN_TRY(cudnnGetConvolutionForwardAlgorithm_v7(h, d->x, d->w, d->conv, d->y, KILN_CUDNN_MAX_ALGOS,
                                                         &got, perf));
        for (int i = 0; i < got; i++) {
            call->algos[i] = perf[i].algo, call->math[i] = perf[i].mathType, call->status[i] = perf[i].status;
            call->memory[i] = perf[i].memory;
            cand[i].deterministic = perf[i].determinism == CUDNN_DETERMINISTIC;
        }
    } else if (c->pass == KILN_AUTOTUNE_CONV_BWD_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t perf[KILN_CUDNN_MAX_ALGOS];
        CUDNN_TRY(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d->w, d->y, d->conv, d->x,
                                                              KILN_CUDNN_MAX_ALGOS, &got, perf));
        for (int i = 0; i < got; i++) {
            call->algos[i] = perf[i].algo, call->math[i] = perf[i].mathType, call->status[i] = perf[i].status;
            call->memory[i] = perf[i].memory;
            cand[i].deterministic = perf[i].determinism == CUDNN_DETERMINISTIC;
        }
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t perf[KILN_CUDNN_MAX_ALGOS];
        CUDNN_TRY(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d->x, d->y, d->conv, d->w,
                                                                KILN_CUDNN_MAX_ALGOS, &got, perf));
        for (int i = 0; i < got; i++) {
            call->algos[i] = perf[i].algo, call->math[i] = perf[i].mathType, call->status[i] = perf[i].status;
            call->memory[i] = perf[i].memory;
            cand[i].deterministic = perf[i].determinism == CUDNN_DETERMINISTIC;
        }
    }
    if (got > max) got = max;
    call->n_algos = got;
    for (int i = 0; i < got; i++) {
        snprintf(cand[i].name, sizeof cand[i].name, "%s/%s", algo_name(c->pass, call->algos[i]),
                 math_name(call->math[i]));
        cand[i].is_default = i == 0;
    }
    *n = got;
    return KILN_OK;
}

/* The key's device and versions, computed once per device (the tuner asks
 * at every choice; cudaGetDeviceProperties is slow). */
static char identity_device[MAX_DEVICES][160], identity_versions[MAX_DEVICES][64];

static void cudnn_identity(void *self, void *ctx, char *device, size_t device_size, char *versions,
                           size_t versions_size) {
    (void)self;
    int dev = ((kiln_cudnn_conv_call *)ctx)->device;
    bool cacheable = dev >= 0 && dev < MAX_DEVICES;
    pthread_mutex_lock(&handle_mutex);
    if (cacheable && identity_device[dev][0]) {
        snprintf(device, device_size, "%s", identity_device[dev]);
        snprintf(versions, versions_size, "%s", identity_versions[dev]);
        pthread_mutex_unlock(&handle_mutex);
        return;
    }
    pthread_mutex_unlock(&handle_mutex);
    int runtime = 0;
    struct cudaDeviceProp prop;
    bool known = cudaGetDeviceProperties(&prop, dev) == cudaSuccess;
    if (!known) {
        (void)cudaGetLastError();
        snprintf(device, device_size, "unknown GPU");
    } else {
        snprintf(device, device_size, "%s sm_%d%d", prop.name, prop.major, prop.minor);
    }
    if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) (void)cudaGetLastError();
    snprintf(versions, versions_size, "cudnn %zu cudart %d", cudnnGetVersion(), runtime);
    if (known && cacheable) {
        pthread_mutex_lock(&handle_mutex);
        snprintf(identity_device[dev], sizeof identity_device[dev], "%s", device);
        snprintf(identity_versions[dev], sizeof identity_versions[dev], "%s", versions);
        pthread_mutex_unlock(&handle_mutex);
    }
}

static void plan_free(conv_plan *p) {
    descs_destroy(&p->d);
    free(p);
}

/* The cached plan of call's configuration (handle_mutex held); *owned: the
 * cache is full, the caller frees it after use. */
static kiln_status plan_for_locked(kiln_cudnn_conv_call *call, conv_plan **out, bool *owned) {
    char key[512];
    kiln_autotune_key_format(&call->cfg, key, sizeof key);
    for (conv_plan *p = plans; p; p = p->next)
        if (p->device == call->device && !strcmp(p->key, key)) {
            *out = p, *owned = false;
            return KILN_OK;
        }
    conv_plan *p = calloc(1, sizeof *p);
    if (!p) return KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "cuDNN: no host memory for a convolution plan");
    snprintf(p->key, sizeof p->key, "%s", key);
    p->device = call->device;
    cudnnHandle_t h = NULL;
    kiln_status st = descs_create(&call->cfg, &p->d);
    if (!st) st = handle_for(call->device, &h);
    kiln_cudnn_conv_call scratch = *call;
    kiln_autotune_candidate cand[KILN_CUDNN_MAX_ALGOS];
    int n = 0;
    memset(cand, 0, sizeof cand);
    if (!st) st = list_algos(&scratch, h, &p->d, cand, KILN_CUDNN_MAX_ALGOS, &n);
    if (st) {
        plan_free(p);
        return st;
    }
    p->n_algos = n;
    for (int i = 0; i < n; i++) {
        p->algos[i] = scratch.algos[i], p->math[i] = scratch.math[i], p->status[i] = scratch.status[i];
        p->memory[i] = scratch.memory[i], p->deterministic[i] = cand[i].deterministic;
    }
    *owned = n_plans >= MAX_PLANS;
    if (!*owned) p->next = plans, plans = p, n_plans++;
    *out = p;
    return KILN_OK;
}

/* The plan's list into call (and into cand when given). */
static void plan_to_call(const conv_plan *p, kiln_cudnn_conv_call *call, kiln_autotune_candidate *cand,
                         int max, int *n) {
    int got = p->n_algos < max ? p->n_algos : max;
    call->n_algos = got;
    for (int i = 0; i < got; i++) {
        call->algos[i] = p->algos[i], call->math[i] = p->math[i], call->status[i] = p->status[i];
        call->memory[i] = p->memory[i];
        if (cand) {
            memset(&cand[i], 0, sizeof cand[i]);
            snprintf(cand[i].name, sizeof cand[i].name, "%s/%s", algo_name(call->cfg.pass, p->algos[i]),
                     math_name(p->math[i]));
            cand[i].deterministic = p->deterministic[i];
            cand[i].is_default = i == 0;
        }
    }
    if (n) *n = got;
}

static kiln_status cudnn_candidates(void *self, const kiln_autotune_conv *cfg, void *ctx,
                                    kiln_autotune_candidate *out, int max, int *n) {
    (void)self, (void)cfg;
    kiln_cudnn_conv_call *call = ctx;
    *n = 0;
    if (max > KILN_CUDNN_MAX_ALGOS) max = KILN_CUDNN_MAX_ALGOS;
    memset(out, 0, sizeof *out * (size_t)max);
    conv_plan *p = NULL;
    bool owned = false;
    pthread_mutex_lock(&handle_mutex);
    kiln_status st = plan_for_locked(call, &p, &owned);
    if (!st) plan_to_call(p, call, out, max, n);
    if (!st && owned) plan_free(p);
    pthread_mutex_unlock(&handle_mutex);
    return st;
}

static kiln_status cudnn_build(void *self, const kiln_autotune_conv *cfg, void *ctx, int index, size_t *ws) {
    (void)self, (void)cfg;
    kiln_cudnn_conv_call *call = ctx;
    if (index < 0 || index >= call->n_algos)
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "cuDNN: candidate %d of %d", index, call->n_algos);
    if (call->status[index] != CUDNN_STATUS_SUCCESS)
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, NULL, "cuDNN: algorithm %d: %s", call->algos[index],
                          cudnnGetErrorString((cudnnStatus_t)call->status[index]));
    *ws = call->memory[index];
    return KILN_OK;
}

/* A choice the tuner answered from its cache did not list the algorithms
 * into this call: list them now (the heuristics give the same order for
 * the same configuration, so the cached index means the same algorithm). */
static kiln_status ensure_listed(kiln_cudnn_conv_call *call) {
    if (call->n_algos > 0) return KILN_OK;
    conv_plan *p = NULL;
    bool owned = false;
    pthread_mutex_lock(&handle_mutex);
    kiln_status st = plan_for_locked(call, &p, &owned);
    if (!st) plan_to_call(p, call, NULL, KILN_CUDNN_MAX_ALGOS, NULL);
    if (!st && owned) plan_free(p);
    pthread_mutex_unlock(&handle_mutex);
    return st;
}

size_t kiln_cudnn_conv_workspace(kiln_cudnn_conv_call *call, int index) {
    if (ensure_listed(call) != KILN_OK) return 0;
    return index >= 0 && index < call->n_algos ? call->memory[index] : 0;
}

static kiln_status run_locked(kiln_cudnn_conv_call *call, cudnnHandle_t h, const descs *d, int index,
                              void *ws, size_t ws_bytes) {
    const float one = 1.0f, zero = 0.0f; /* f32 scaling factors for every data type (compute type f32) */
    CUDNN_TRY(cudnnSetStream(h, (cudaStream_t)call->stream));
    CUDNN_TRY(cudnnSetConvolutionMathType(d->conv, (cudnnMathType_t)call->math[index]));
    switch (call->cfg.pass) {
    case KILN_AUTOTUNE_CONV_FWD:
        CUDNN_TRY(cudnnConvolutionForward(h, &one, d->x, call->x, d->w, call->w, d->conv,
                                          (cudnnConvolutionFwdAlgo_t)call->algos[index], ws, ws_bytes, &zero,
                                          d->y, call->y));
        break;
    case KILN_AUTOTUNE_CONV_BWD_DATA:
        CUDNN_TRY(cudnnConvolutionBackwardData(h, &one, d->w, call->w, d->y, call->y, d->conv,
                                               (cudnnConvolutionBwdDataAlgo_t)call->algos[index], ws,
                                               ws_bytes, &zero, d->x, call->x));
        break;
    case KILN_AUTOTUNE_CONV_BWD_WEIGHT:
        CUDNN_TRY(cudnnConvolutionBackwardFilter(h, &one, d->x, call->x, d->y, call->y, d->conv,
                                                 (cudnnConvolutionBwdFilterAlgo_t)call->algos[index], ws,
                                                 ws_bytes, &zero, d->w, call->w));
        break;
    }
    return KILN_OK;
}

kiln_status kiln_cudnn_conv_run(kiln_cudnn_conv_call *call, int index, void *workspace,
                                size_t workspace_bytes) {
    KILN_TRY(ensure_listed(call));
    if (index < 0 || index >= call->n_algos)
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "cuDNN: candidate %d of %d", index, call->n_algos);
    if (workspace_bytes < call->memory[index])
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "cuDNN: workspace of %zu bytes, the algorithm needs %zu",
                          workspace_bytes, call->memory[index]);
    conv_plan *p = NULL;
    bool owned = false;
    cudnnHandle_t h = NULL;
    pthread_mutex_lock(&handle_mutex);
    kiln_status st = plan_for_locked(call, &p, &owned);
    if (!st) st = handle_for(call->device, &h);
    if (!st) st = run_locked(call, h, &p->d, index, workspace, workspace_bytes);
    if (p && owned) plan_free(p);
    pthread_mutex_unlock(&handle_mutex);
    return st;
}

void kiln_cudnn_conv_provider_shutdown(void) {
    pthread_mutex_lock(&handle_mutex);
    while (plans) {
        conv_plan *p = plans;
        plans = p->next;
        plan_free(p);
    }
    n_plans = 0;
    for (int d = 0; d < MAX_DEVICES; d++) {
        if (handles[d]) {
            cudnnDestroy(handles[d]);
            handles[d] = NULL;
        }
        identity_device[d][0] = identity_versions[d][0] = 0;
    }
    pthread_mutex_unlock(&handle_mutex);
}

static kiln_status cudnn_run(void *self, const kiln_autotune_conv *cfg, void *ctx, int index, void *ws,
                             size_t ws_bytes) {
    (void)self, (void)cfg;
    return kiln_cudnn_conv_run(ctx, index, ws, ws_bytes);
}

static kiln_status cudnn_timer_start(void *self, void *ctx) {
    (void)self;
    kiln_cudnn_conv_call *call = ctx;
    for (int i = 0; i < 2; i++)
        if (!call->timer[i]) KILN_CUDA_TRY(call->device, cudaEventCreate((cudaEvent_t *)&call->timer[i]));
    KILN_CUDA_TRY(call->device, cudaEventRecord((cudaEvent_t)call->timer[0], (cudaStream_t)call->stream));
    return KILN_OK;
}

static kiln_status cudnn_timer_stop(void *self, void *ctx, double *ms) {
    (void)self;
    kiln_cudnn_conv_call *call = ctx;
    float elapsed = 0;
    KILN_CUDA_TRY(call->device, cudaEventRecord((cudaEvent_t)call->timer[1], (cudaStream_t)call->stream));
    KILN_CUDA_TRY(call->device, cudaEventSynchronize((cudaEvent_t)call->timer[1]));
    KILN_CUDA_TRY(call->device,
                  cudaEventElapsedTime(&elapsed, (cudaEvent_t)call->timer[0], (cudaEvent_t)call->timer[1]));
    *ms = elapsed;
    return KILN_OK;
}

void kiln_cudnn_conv_call_release(kiln_cudnn_conv_call *call) {
    for (int i = 0; i < 2; i++) {
        if (call->timer[i] && cudaEventDestroy((cudaEvent_t)call->timer[i]) != cudaSuccess)
            (void)cudaGetLastError();
        call->timer[i] = NULL;
    }
}

static size_t cudnn_workspace_limit(void *self, void *ctx) {
    (void)self;
    return kiln_autotune_allocator_headroom(KILN_CUDA(((kiln_cudnn_conv_call *)ctx)->device));
}

static kiln_status cudnn_workspace_alloc(void *self, void *ctx, size_t bytes, void **ptr) {
    (void)self;
    return kiln_memory_alloc(KILN_CUDA(((kiln_cudnn_conv_call *)ctx)->device), bytes, NULL, ptr);
}

static void cudnn_workspace_free(void *self, void *ctx, void *ptr) {
    (void)self;
    if (kiln_memory_free(KILN_CUDA(((kiln_cudnn_conv_call *)ctx)->device), ptr) != KILN_OK)
        kiln_error_clear();
}

static const kiln_autotune_provider cudnn_provider = {
    .name = "cudnn",
    .identity = cudnn_identity,
    .candidates = cudnn_candidates,
    .build = cudnn_build,
    .run = cudnn_run,
    .timer_start = cudnn_timer_start,
    .timer_stop = cudnn_timer_stop,
    .workspace_limit = cudnn_workspace_limit,
    .workspace_alloc = cudnn_workspace_alloc,
    .workspace_free = cudnn_workspace_free,
};

const kiln_autotune_provider *kiln_cudnn_conv_provider(void) { return &cudnn_provider; }

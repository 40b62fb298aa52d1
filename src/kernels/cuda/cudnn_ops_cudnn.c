/* cuDNN 9 fast paths of the CUDA fast table (cuda_fast.h). Compiled only
 * with KILN_WITH_CUDNN. First run on a GPU on 2026-11-26 (H100, cuDNN
 * 9.19, tests/ops/test_cuda_fast_paths): convolutions, pooling and the
 * batch-norm forward matched the hand-written kernels; the batch-norm
 * backward was never taken, because its supports fn required the outputs'
 * data pointers, which the dispatcher has not allocated when it asks (the
 * supports contract, kernels/op_args.h: shapes, strides and attributes
 * only). The supports fns here read no data pointer.
 *
 * Convolution (conv2d, conv2d_grad_input, conv2d_grad_weight): the cuDNN
 * provider of the autotuner (cudnn_provider.h). The entry's workspace fn
 * makes the choice (kiln_autotune_choose on the global tuner, in the mode
 * kiln_autotune_mode_current(KILN_DEVICE_CUDA) gives: with
 * kiln_set_cudnn_benchmark(true) it times the candidates there, on the
 * call's real buffers, before the dispatcher allocates the workspace) and
 * asks for the chosen algorithm's workspace (the fast table reserves the
 * hand-written kernel's too, if larger); the run fn asks again (now answered from the tuner's memory)
 * and runs it. conv2d's bias is added after the convolution with
 * cudnnAddTensor; conv2d_relu (the fused op) adds cudnnActivationForward
 * (ReLU, NaN propagated) in place. Math: f32 data uses FMA only unless kiln_allow_tf32();
 * f16/bf16 use tensor ops with f32 accumulation.
 *
 * Average pooling and its backward: cudnnPoolingForward/Backward, mode
 * COUNT_INCLUDE_PADDING or COUNT_EXCLUDE_PADDING as the op's
 * count_include_pad says; ceil_mode shapes that differ from the floor
 * formula are declined (cuDNN's windows differ there). The backward op has
 * only the output gradient: cuDNN's average-pooling backward does not read
 * x or y, so the gradient buffers stand in for them.
 *
 * Max pooling is not here: the op returns the argmax indices (cuDNN's
 * pooling returns none), and its backward receives indices, not the x and y
 * cuDNN's max-pooling backward needs. The hand-written kernels run it.
 *
 * Batch norm: training forward with cudnnBatchNormalizationForwardTraining
 * (the running statistics updated with factor = momentum, cuDNN's unbiased
 * running variance), inference with cudnnBatchNormalizationForwardInference
 * plus a small kernel for the mean/invstd outputs the op reports
 * (fast_support.cu); training backward with cudnnBatchNormalizationBackward
 * from the saved mean and invstd. Per-channel tensors must be f32 and
 * contiguous, weight and bias present; anything else is declined.
 *
 * Every descriptor is cached by shape: pooling, batch norm and bias here
 * (one table, one mutex, which also serialises the per-device handle's
 * cudnnSetStream + call), convolutions in the provider (its plans). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "base/error.h"
#include "kernels/autotune.h"
#include "kernels/cuda/cuda_fast.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cudnn_provider.h"
#include "kiln/runtime.h"
#include "runtime/cuda_backend.h"
#include "runtime/runtime_internal.h"

#define DNN_TRY(call)                                                                                        \
    do {                                                                                                     \
        cudnnStatus_t dnn_st_ = (call);                                                                      \
        if (dnn_st_ != CUDNN_STATUS_SUCCESS)                                                                 \
            return KILN_RAISE(dnn_st_ == CUDNN_STATUS_NOT_SUPPORTED ? KILN_ERR_UNSUPPORTED                   \
                                                                    : KILN_ERR_DEVICE,                       \
                              NULL, "cuDNN: %s failed: %s", #call, cudnnGetErrorString(dnn_st_));            \
    } while (0)

#define MAX_DEVICES 64
#define MAX_ENTRIES 1024
#define FLOAT3(t)   ((t) == KILN_F32 || (t) == KILN_F16 || (t) == KILN_BF16)

static pthread_mutex_t dnn_mutex = PTHREAD_MUTEX_INITIALIZER;
static cudnnHandle_t handles[MAX_DEVICES];

static kiln_status handle_for(int device, cudnnHandle_t *out) {
    if (device < 0 || device >= MAX_DEVICES)
        return KILN_RAISE(KILN_ERR_DEVICE, NULL, "cuDNN: device %d out of range", device);
    if (!handles[device]) DNN_TRY(cudnnCreate(&handles[device]));
    *out = handles[device];
    return KILN_OK;
}

static cudnnDataType_t dnn_type(kiln_dtype t) {
    return t == KILN_F16 ? CUDNN_DATA_HALF : t == KILN_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}

static bool fits_int(int64_t v) { return v > 0 && v <= 0x7fffffff; }

/* ---- Descriptor cache ----------------------------------------------------------------- */

enum { KIND_POOL = 1, KIND_BN, KIND_BIAS, KIND_RELU };

/* A cached set of descriptors; the key is zeroed, then filled (memcmp). */
typedef struct dnn_key {
    int kind, device, dtype, mode;
    int64_t x[4], y[4];
    int64_t window[6]; /* pooling: kernel, padding, stride */
} dnn_key;

typedef struct dnn_entry {
    dnn_key key;
    cudnnTensorDescriptor_t x, y, param;
    cudnnPoolingDescriptor_t pool;
    cudnnActivationDescriptor_t act;
    struct dnn_entry *next;
} dnn_entry;

static dnn_entry *entries;
static int n_entries;

static void entry_destroy(dnn_entry *e) {
    if (e->x) cudnnDestroyTensorDescriptor(e->x);
    if (e->y) cudnnDestroyTensorDescriptor(e->y);
    if (e->param) cudnnDestroyTensorDescriptor(e->param);
    if (e->pool) cudnnDestroyPoolingDescriptor(e->pool);
    if (e->act) cudnnDestroyActivationDescriptor(e->act);
    free(e);
}

static kiln_status tensor4(cudnnTensorDescriptor_t *d, kiln_dtype t, const int64_t s[4]) {
    DNN_TRY(cudnnCreateTensorDescriptor(d));
    DNN_TRY(cudnnSetTensor4dDescriptor(*d, CUDNN_TENSOR_NCHW, dnn_type(t), (int)s[0], (int)s[1], (int)s[2],
                                       (int)s[3]));
    return KILN_OK;
}

static kiln_status entry_build(dnn_entry *e) {
    const dnn_key *k = &e->key;
    kiln_dtype t = (kiln_dtype)k->dtype;
    switch (k->kind) {
    case KIND_POOL:
        KILN_TRY(tensor4(&e->x, t, k->x));
        KILN_TRY(tensor4(&e->y, t, k->y));
        DNN_TRY(cudnnCreatePoolingDescriptor(&e->pool));
        DNN_TRY(cudnnSetPooling2dDescriptor(e->pool, (cudnnPoolingMode_t)k->mode, CUDNN_PROPAGATE_NAN,
                                            (int)k->window[0], (int)k->window[1], (int)k->window[2],
                                            (int)k->window[3], (int)k->window[4], (int)k->window[5]));
        return KILN_OK;
    case KIND_BN:
        KILN_TRY(tensor4(&e->x, t, k->x));
        DNN_TRY(cudnnCreateTensorDescriptor(&e->param));
        DNN_TRY(cudnnDeriveBNTensorDescriptor(e->param, e->x, CUDNN_BATCHNORM_SPATIAL));
        return KILN_OK;
    case KIND_BIAS: /* y (N, O, OH, OW) and the bias as (1, O, 1, 1) */
        KILN_TRY(tensor4(&e->y, t, k->y));
        KILN_TRY(tensor4(&e->param, t, k->x));
        return KILN_OK;
    case KIND_RELU: /* relu over y in place, NaN kept (as the hand-written kernel) */
        KILN_TRY(tensor4(&e->y, t, k->y));
        DNN_TRY(cudnnCreateActivationDescriptor(&e->act));
        DNN_TRY(cudnnSetActivationDescriptor(e->act, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0));
        return KILN_OK;
    }
    return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "cuDNN: descriptor kind %d", k->kind);
}

/* The cached descriptors for key (dnn_mutex held); *owned: the cache is
 * full and the caller destroys them after the call. */
static kiln_status entry_for(const dnn_key *key, dnn_entry **out, bool *owned) {
    for (dnn_entry *e = entries; e; e = e->next)
        if (!memcmp(&e->key, key, sizeof *key)) {
            *out = e, *owned = false;
            return KILN_OK;
        }
    dnn_entry *e = calloc(1, sizeof *e);
    if (!e) return KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "cuDNN: no host memory for descriptors");
    e->key = *key;
    kiln_status st = entry_build(e);
    if (st) {
        entry_destroy(e);
        return st;
    }
    *owned = n_entries >= MAX_ENTRIES;
    if (!*owned) e->next = entries, entries = e, n_entries++;
    *out = e;
    return KILN_OK;
}

/* Runs fn(handle, entry, ctx) for key on the device owning `owner`, on the
 * call's stream, under dnn_mutex. */
typedef kiln_status (*dnn_body)(cudnnHandle_t h, const dnn_entry *e, const kiln_op_args *a, int device);

static kiln_status with_descriptors(const dnn_key *key_in, const void *owner, const kiln_op_args *a,
                                    dnn_body body) {
    int device = -1, previous = -1;
    KILN_TRY(kiln_cuda_fast_enter(owner, &device, &previous));
    dnn_key key = *key_in;
    key.device = device;
    pthread_mutex_lock(&dnn_mutex);
    cudnnHandle_t h = NULL;
    dnn_entry *e = NULL;
    bool owned = false;
    kiln_status st = handle_for(device, &h);
    if (!st) st = entry_for(&key, &e, &owned);
    if (!st) {
        cudnnStatus_t s = cudnnSetStream(h, (cudaStream_t)a->stream);
        st = s == CUDNN_STATUS_SUCCESS ? KILN_OK
                                       : KILN_RAISE(KILN_ERR_DEVICE, NULL, "cuDNN: cudnnSetStream failed: %s",
                                                    cudnnGetErrorString(s));
    }
    if (!st) st = body(h, e, a, device);
    if (owned) entry_destroy(e);
    pthread_mutex_unlock(&dnn_mutex);
    kiln_cuda_fast_leave(device, previous);
    return st;
}

/* ---- Convolution ---------------------------------------------------------------------- */

static bool dense4(const kiln_strided *s) { return s->ndim == 4 && kiln_cuda_fast_is_contiguous(s); }

/* The four convolution entries. */
typedef enum conv_op { CONV_FWD, CONV_FWD_RELU, CONV_BWD_DATA, CONV_BWD_WEIGHT } conv_op;

/* The provider call of a conv op's args (pointers included); false when
 * cuDNN's path does not take them. */
static bool conv_call_of(conv_op op, const kiln_op_args *a, kiln_cudnn_conv_call *c) {
    memset(c, 0, sizeof *c);
    const kiln_op_attrs *at = a->attrs;
    const kiln_strided *x, *w, *y;
    if (op == CONV_FWD || op == CONV_FWD_RELU) {
        x = &a->in[0], w = &a->in[1], y = &a->out[0];
        c->cfg.pass = KILN_AUTOTUNE_CONV_FWD;
        const kiln_strided *b = &a->in[2];
        if (b->ndim >= 0) {
            if (b->ndim != 1 || b->dtype != y->dtype || (b->shape[0] > 1 && b->strides[0] != 1)) return false;
            c->cfg.bias = true;
        }
    } else if (op == CONV_BWD_DATA) {
        y = &a->in[0], w = &a->in[1], x = &a->out[0];
        c->cfg.pass = KILN_AUTOTUNE_CONV_BWD_DATA;
    } else {
        y = &a->in[0], x = &a->in[1], w = &a->out[0];
        c->cfg.pass = KILN_AUTOTUNE_CONV_BWD_WEIGHT;
    }
    if (!dense4(x) || !dense4(w) || !dense4(y)) return false;
    if (!FLOAT3(x->dtype) || w->dtype != x->dtype || y->dtype != x->dtype) return false;
    for (int i = 0; i < 4; i++) {
        if (!fits_int(x->shape[i]) || !fits_int(w->shape[i]) || !fits_int(y->shape[i])) return false;
        c->cfg.x[i] = x->shape[i], c->cfg.w[i] = w->shape[i], c->cfg.y[i] = y->shape[i];
    }
    for (int i = 0; i < 2; i++) {
        if (!fits_int(at->stride[i]) || !fits_int(at->dilation[i]) || at->padding[i] < 0 ||
            at->padding[i] > 0x7fffffff)
            return false;
        c->cfg.stride[i] = at->stride[i], c->cfg.padding[i] = at->padding[i],
        c->cfg.dilation[i] = at->dilation[i];
    }
    if (!fits_int(at->groups) || x->shape[1] != w->shape[1] * at->groups) return false;
    c->cfg.groups = at->groups;
    c->cfg.x_dtype = c->cfg.w_dtype = c->cfg.y_dtype = x->dtype;
    c->cfg.layout = "nchw";
    c->cfg.math = x->dtype == KILN_F32   ? (kiln_allow_tf32() ? "tf32" : "f32")
                  : x->dtype == KILN_F16 ? "f16-acc-f32"
                                         : "bf16-acc-f32";
    c->x = x->data, c->w = w->data, c->y = y->data;
    c->stream = a->stream;
    return true;
}

static bool conv_supports(conv_op op, const kiln_op_args *a) {
    kiln_cudnn_conv_call c;
    return conv_call_of(op, a, &c);
}

/* The tuner's choice for the call (the device owning its output current).
 * can_time: the call has real buffers (not a planned step on meta). */
static kiln_status conv_choose(kiln_cudnn_conv_call *c, bool can_time, kiln_autotune_choice *choice) {
    kiln_autotuner *t = kiln_autotune_global();
    if (!t) return KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "no host memory for the autotuner");
    return kiln_autotune_choose(t, kiln_cudnn_conv_provider(), &c->cfg, c,
                                kiln_autotune_mode_current(KILN_DEVICE_CUDA), can_time, choice);
}

static const void *conv_owner(const kiln_cudnn_conv_call *c) {
    return c->cfg.pass == KILN_AUTOTUNE_CONV_FWD        ? c->y
           : c->cfg.pass == KILN_AUTOTUNE_CONV_BWD_DATA ? c->x
                                                        : c->w;
}

/* The chosen algorithm's workspace. A planned step on meta (no buffers)
 * asks the device it models (kiln_meta_kernels_index) for cuDNN's
 * heuristic order and takes the pick a real step would make without
 * timing: the cached timed pick under kiln_set_cudnn_benchmark, else the
 * default one, whose workspace the plan then holds (on an H100 the f32
 * convolutions of the tutorial CNN's step wanted up to 53 MiB of it, which
 * plans without this missed). */
static size_t conv_workspace(conv_op op, const kiln_op_args *a) {
    kiln_cudnn_conv_call c;
    if (!conv_call_of(op, a, &c)) return 0;
    int device = -1, previous = -1;
    bool planned = conv_owner(&c) == NULL && kiln_meta_kernels() == KILN_DEVICE_CUDA;
    kiln_status en = planned ? kiln_cuda_fast_enter_index(kiln_meta_kernels_index(), &device, &previous)
                             : kiln_cuda_fast_enter(conv_owner(&c), &device, &previous);
    if (en != KILN_OK) {
        kiln_error_clear(); /* the run fn meets it again and falls back */
        return 0;
    }
    c.device = device;
    kiln_autotune_choice choice;
    size_t need = 0;
    if (conv_choose(&c, !planned, &choice) == KILN_OK)
        need = kiln_cudnn_conv_workspace(&c, choice.index);
    else
        kiln_error_clear(); /* likewise: the run fn warns once and falls back */
    kiln_cudnn_conv_call_release(&c);
    kiln_cuda_fast_leave(device, previous);
    return need;
}

static kiln_status conv_bias_body(cudnnHandle_t h, const dnn_entry *e, const kiln_op_args *a, int device) {
    (void)device;
    const float one = 1.0f;
    DNN_TRY(cudnnAddTensor(h, &one, e->param, a->in[2].data, &one, e->y, a->out[0].data));
    return KILN_OK;
}

static kiln_status conv_relu_body(cudnnHandle_t h, const dnn_entry *e, const kiln_op_args *a, int device) {
    (void)device;
    const float one = 1.0f, zero = 0.0f;
    DNN_TRY(cudnnActivationForward(h, e->act, &one, e->y, a->out[0].data, &zero, e->y, a->out[0].data));
    return KILN_OK;
}

static kiln_status conv_run_locked(conv_op op, const kiln_op_args *a, kiln_cudnn_conv_call *c) {
    kiln_autotune_choice choice;
    KILN_TRY(conv_choose(c, true, &choice));
    size_t need = kiln_cudnn_conv_workspace(c, choice.index);
    if (need > a->workspace_bytes)
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL,
                          "cuDNN: the chosen algorithm %s needs %zu workspace bytes, the call has %zu (the "
                          "choice changed after the workspace was sized)",
                          choice.name, need, a->workspace_bytes);
    KILN_TRY(kiln_cudnn_conv_run(c, choice.index, a->workspace, a->workspace_bytes));
    if (c->cfg.pass == KILN_AUTOTUNE_CONV_FWD && c->cfg.bias) {
        dnn_key k;
        memset(&k, 0, sizeof k);
        k.kind = KIND_BIAS, k.dtype = (int)a->out[0].dtype;
        for (int i = 0; i < 4; i++) k.y[i] = a->out[0].shape[i];
        k.x[0] = 1, k.x[1] = a->out[0].shape[1], k.x[2] = 1, k.x[3] = 1;
        KILN_TRY(with_descriptors(&k, a->out[0].data, a, conv_bias_body));
    }
    if (op == CONV_FWD_RELU) {
        dnn_key k;
        memset(&k, 0, sizeof k);
        k.kind = KIND_RELU, k.dtype = (int)a->out[0].dtype;
        for (int i = 0; i < 4; i++) k.y[i] = a->out[0].shape[i];
        KILN_TRY(with_descriptors(&k, a->out[0].data, a, conv_relu_body));
    }
    return KILN_OK;
}

/* The hand-written kernel of each convolution entry, for args it declines. */
static kiln_status conv_reference(conv_op op, const kiln_op_args *a) {
    return op == CONV_FWD        ? kiln_cuda_conv2d(a)
           : op == CONV_FWD_RELU ? kiln_cuda_conv2d_relu(a)
           : op == CONV_BWD_DATA ? kiln_cuda_conv2d_grad_input(a)
                                 : kiln_cuda_conv2d_grad_weight(a);
}

/* A library failure is returned as it is: the fast table falls back. */
static kiln_status conv_run(conv_op op, const kiln_op_args *a) {
    kiln_cudnn_conv_call c;
    if (!conv_call_of(op, a, &c)) return conv_reference(op, a);
    int device = -1, previous = -1;
    kiln_status st = kiln_cuda_fast_enter(conv_owner(&c), &device, &previous);
    if (!st) {
        c.device = device;
        st = conv_run_locked(op, a, &c);
        kiln_cudnn_conv_call_release(&c);
        kiln_cuda_fast_leave(device, previous);
    }
    return st;
}

kiln_status kiln_cudnn_conv2d(const kiln_op_args *a) { return conv_run(CONV_FWD, a); }
kiln_status kiln_cudnn_conv2d_relu(const kiln_op_args *a) { return conv_run(CONV_FWD_RELU, a); }
kiln_status kiln_cudnn_conv2d_grad_input(const kiln_op_args *a) { return conv_run(CONV_BWD_DATA, a); }
kiln_status kiln_cudnn_conv2d_grad_weight(const kiln_op_args *a) { return conv_run(CONV_BWD_WEIGHT, a); }
bool kiln_cudnn_conv2d_supports(const kiln_op_args *a) { return conv_supports(CONV_FWD, a); }
bool kiln_cudnn_conv2d_relu_supports(const kiln_op_args *a) { return conv_supports(CONV_FWD_RELU, a); }
bool kiln_cudnn_conv2d_grad_input_supports(const kiln_op_args *a) { return conv_supports(CONV_BWD_DATA, a); }
bool kiln_cudnn_conv2d_grad_weight_supports(const kiln_op_args *a) {
    return conv_supports(CONV_BWD_WEIGHT, a);
}
size_t kiln_cudnn_conv2d_workspace(const kiln_op_args *a) { return conv_workspace(CONV_FWD, a); }
size_t kiln_cudnn_conv2d_relu_workspace(const kiln_op_args *a) { return conv_workspace(CONV_FWD_RELU, a); }
size_t kiln_cudnn_conv2d_grad_input_workspace(const kiln_op_args *a) {
    return conv_workspace(CONV_BWD_DATA, a);
}
size_t kiln_cudnn_conv2d_grad_weight_workspace(const kiln_op_args *a) {
    return conv_workspace(CONV_BWD_WEIGHT, a);
}

/* ---- Average pooling -------------------------------------------------------------------- */

/* x (N, C, H, W) or (C, H, W) as 4 dims. */
static bool as4(const kiln_strided *s, int64_t out[4]) {
    if (s->ndim != 4 && s->ndim != 3) return false;
    if (!kiln_cuda_fast_is_contiguous(s)) return false;
    int off = 4 - s->ndim;
    out[0] = 1;
    for (int i = 0; i < s->ndim; i++) out[i + off] = s->shape[i];
    for (int i = 0; i < 4; i++)
        if (!fits_int(out[i])) return false;
    return true;
}

/* The pooling key of (x, y) shapes, or false when cuDNN's windows differ. */
static bool pool_key(const kiln_op_attrs *at, const kiln_strided *x, const kiln_strided *y, dnn_key *k) {
    memset(k, 0, sizeof *k);
    if (!FLOAT3(x->dtype) || y->dtype != x->dtype || x->ndim != y->ndim) return false;
    if (!as4(x, k->x) || !as4(y, k->y)) return false;
    for (int i = 0; i < 2; i++) {
        int64_t kk = at->kernel[i], p = at->padding[i], s = at->stride[i];
        if (!fits_int(kk) || !fits_int(s) || p < 0 || 2 * p > kk) return false;
        int64_t in = k->x[2 + i], floor_out = (in + 2 * p - kk) / s + 1;
        if (in + 2 * p < kk || floor_out != k->y[2 + i]) return false; /* ceil_mode added a window */
        k->window[i] = kk, k->window[2 + i] = p, k->window[4 + i] = s;
    }
    k->kind = KIND_POOL, k->dtype = (int)x->dtype;
    k->mode = at->count_include_pad ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                                    : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
    return k->x[0] == k->y[0] && k->x[1] == k->y[1];
}

/* avg_pool2d_backward: grad_out (the pooled shape) -> grad_input (attrs.ints). */
static bool pool_bwd_key(const kiln_op_args *a, dnn_key *k) {
    return pool_key(a->attrs, &a->out[0], &a->in[0], k);
}

static kiln_status pool_fwd_body(cudnnHandle_t h, const dnn_entry *e, const kiln_op_args *a, int device) {
    (void)device;
    const float one = 1.0f, zero = 0.0f;
    DNN_TRY(cudnnPoolingForward(h, e->pool, &one, e->x, a->in[0].data, &zero, e->y, a->out[0].data));
    return KILN_OK;
}

static kiln_status pool_bwd_body(cudnnHandle_t h, const dnn_entry *e, const kiln_op_args *a, int device) {
    (void)device;
    const float one = 1.0f, zero = 0.0f;
    /* Average pooling's backward reads neither y nor x: dy and dx stand in. */
    DNN_TRY(cudnnPoolingBackward(h, e->pool, &one, e->y, a->in[0].data, e->y, a->in[0].data, e->x,
                                 a->out[0].data, &zero, e->x, a->out[0].data));
    return KILN_OK;
}

bool kiln_cudnn_avg_pool2d_supports(const kiln_op_args *a) {
    dnn_key k;
    return pool_key(a->attrs, &a->in[0], &a->out[0], &k);
}
bool kiln_cudnn_avg_pool2d_backward_supports(const kiln_op_args *a) {
    dnn_key k;
    return pool_bwd_key(a, &k);
}

kiln_status kiln_cudnn_avg_pool2d(const kiln_op_args *a) {
    dnn_key k;
    if (!pool_key(a->attrs, &a->in[0], &a->out[0], &k)) return kiln_cuda_avg_pool2d(a);
    return with_descriptors(&k, a->out[0].data, a, pool_fwd_body);
}

kiln_status kiln_cudnn_avg_pool2d_backward(const kiln_op_args *a) {
    dnn_key k;
    if (!pool_bwd_key(a, &k)) return kiln_cuda_avg_pool2d_backward(a);
    return with_descriptors(&k, a->out[0].data, a, pool_bwd_body);
}

/* ---- Batch norm ------------------------------------------------------------------------------ */

/* Input i is given. Shapes only: the dispatcher asks the supports fns
 * before it allocates the outputs, and on meta no input has data either
 * (dispatch.c, build_args), so no data pointer is looked at here. */
static bool present(const kiln_op_args *a, int i) { return i < a->n_in && a->in[i].ndim >= 0; }

/* A per-channel f32 vector of C elements, dense. */
static bool channel_f32(const kiln_strided *s, int64_t C) {
    return s->ndim == 1 && s->dtype == KILN_F32 && s->shape[0] == C && (C == 1 || s->strides[0] == 1);
}

/* x (N, C, d...) dense as (N, C, prod(d), 1). */
static bool bn_shape(const kiln_strided *x, int64_t s[4]) {
    if (x->ndim < 2 || !kiln_cuda_fast_is_contiguous(x) || !FLOAT3(x->dtype)) return false;
    s[0] = x->shape[0], s[1] = x->shape[1], s[2] = 1, s[3] = 1;
    for (int i = 2; i < x->ndim; i++) s[2] *= x->shape[i];
    for (int i = 0; i < 4; i++)
        if (!fits_int(s[i])) return false;
    return true;
}

static bool bn_key(const kiln_op_args *a, dnn_key *k) {
    memset(k, 0, sizeof *k);
    const kiln_strided *x = &a->in[0], *y = &a->out[0];
    if (!bn_shape(x, k->x) || y->dtype != x->dtype || !kiln_cuda_fast_is_contiguous(y)) return false;
    int64_t C = k->x[1];
    if (!present(a, 1) || !present(a, 2) || !channel_f32(&a->in[1], C) || !channel_f32(&a->in[2], C))
        return false;
    bool rm = present(a, 3), rv = present(a, 4);
    if (rm != rv) return false;
    if (rm && (!channel_f32(&a->in[3], C) || !channel_f32(&a->in[4], C))) return false;
    if (!a->attrs->training && !rm) return false;
    if (!channel_f32(&a->out[1], C) || !channel_f32(&a->out[2], C)) return false;
    if (!(a->attrs->eps >= CUDNN_BN_MIN_EPSILON)) return false;
    k->kind = KIND_BN, k->dtype = (int)x->dtype;
    return true;
}

static kiln_status bn_fwd_body(cudnnHandle_t h, const dnn_entry *e, const kiln_op_args *a, int device) {
    const float one = 1.0f, zero = 0.0f;
    const kiln_op_attrs *at = a->attrs;
    if (at->training) {
        bool update = present(a, 3) && at->momentum >= 0;
        DNN_TRY(cudnnBatchNormalizationForwardTraining(
            h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, e->x, a->in[0].data, e->x, a->out[0].data, e->param,
            a->in[1].data, a->in[2].data, update ? at->momentum : 0.0, update ? a->in[3].data : NULL,
            update ? a->in[4].data : NULL, at->eps, a->out[1].data, a->out[2].data));
        return KILN_OK;
    }
    DNN_TRY(cudnnBatchNormalizationForwardInference(
        h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, e->x, a->in[0].data, e->x, a->out[0].data, e->param,
        a->in[1].data, a->in[2].data, a->in[3].data, a->in[4].data, at->eps));
    return kiln_cuda_bn_eval_stats(a->in[3].data, a->in[4].data, at->eps, a->out[1].data, a->out[2].data,
                                   a->in[0].shape[1], a->stream, device);
}

bool kiln_cudnn_batch_norm_supports(const kiln_op_args *a) {
    dnn_key k;
    return bn_key(a, &k);
}

kiln_status kiln_cudnn_batch_norm(const kiln_op_args *a) {
    dnn_key k;
    if (!bn_key(a, &k)) return kiln_cuda_batch_norm(a);
    return with_descriptors(&k, a->out[1].data, a, bn_fwd_body);
}

/* (grad_out, x, weight, mean, invstd) -> (grad_x, grad_weight, grad_bias), training only. */
static bool bn_bwd_key(const kiln_op_args *a, dnn_key *k) {
    memset(k, 0, sizeof *k);
    const kiln_strided *go = &a->in[0], *x = &a->in[1], *dx = &a->out[0];
    if (!a->attrs->training || !bn_shape(x, k->x)) return false;
    int64_t C = k->x[1];
    if (go->dtype != x->dtype || go->ndim != x->ndim || !kiln_cuda_fast_is_contiguous(go)) return false;
    for (int i = 0; i < x->ndim; i++)
        if (go->shape[i] != x->shape[i]) return false;
    if (!present(a, 2) || !channel_f32(&a->in[2], C) || !channel_f32(&a->in[3], C) ||
        !channel_f32(&a->in[4], C))
        return false;
    /* The outputs as the dispatcher describes them; their data pointers are
     * NULL when it asks (it allocates all three after choosing the kernel). */
    if (a->n_out < 3 || dx->ndim < 0 || dx->dtype != x->dtype || !kiln_cuda_fast_is_contiguous(dx))
        return false;
    for (int i = 1; i < 3; i++)
        if (a->out[i].ndim < 0 || !channel_f32(&a->out[i], C)) return false;
    k->kind = KIND_BN, k->dtype = (int)x->dtype;
    return true;
}

static kiln_status bn_bwd_body(cudnnHandle_t h, const dnn_entry *e, const kiln_op_args *a, int device) {
    (void)device;
    const float one = 1.0f, zero = 0.0f;
    DNN_TRY(cudnnBatchNormalizationBackward(h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero, e->x,
                                            a->in[1].data, e->x, a->in[0].data, e->x, a->out[0].data,
                                            e->param, a->in[2].data, a->out[1].data, a->out[2].data,
                                            a->attrs->eps, a->in[3].data, a->in[4].data));
    return KILN_OK;
}

bool kiln_cudnn_batch_norm_backward_supports(const kiln_op_args *a) {
    dnn_key k;
    return bn_bwd_key(a, &k);
}

kiln_status kiln_cudnn_batch_norm_backward(const kiln_op_args *a) {
    dnn_key k;
    if (!bn_bwd_key(a, &k)) return kiln_cuda_batch_norm_backward(a);
    return with_descriptors(&k, a->out[0].data, a, bn_bwd_body);
}

void kiln_cudnn_ops_shutdown(void) {
    kiln_cudnn_conv_provider_shutdown();
    pthread_mutex_lock(&dnn_mutex);
    while (entries) {
        dnn_entry *e = entries;
        entries = e->next;
        entry_destroy(e);
    }
    n_entries = 0;
    for (int d = 0; d < MAX_DEVICES; d++)
        if (handles[d]) {
            cudnnDestroy(handles[d]);
            handles[d] = NULL;
        }
    pthread_mutex_unlock(&dnn_mutex);
}

/* cuBLASLt GEMM for mm, bmm and linear (cuda_fast.h). Real CUDA build only.
 *
 * Row-major C (M x N) = A (M x K) @ B (K x N) is, in cuBLASLt's column-major
 * terms, C^T (N x M) = B^T (N x K) @ A^T (K x M): B is cuBLASLt's "A"
 * operand and A its "B". An operand whose last logical dim has stride 1 is
 * passed as stored (op N, leading dimension = its row stride); one whose
 * first dim has stride 1 (a transposed view) is passed with op T. C must
 * have unit stride along N. Anything else (two non-unit strides, a linear
 * input whose leading dims do not merge into one row stride, f64, a zero
 * dimension) is declined and runs the hand-written kernel.
 *
 * Math: f32 data computes in f32 (CUBLAS_COMPUTE_32F) or, when
 * kiln_allow_tf32(), CUBLAS_COMPUTE_32F_FAST_TF32; f16 and bf16 compute and
 * accumulate in f32. linear's bias is the CUBLASLT_EPILOGUE_BIAS epilogue
 * and linear_act's bias and relu the CUBLASLT_EPILOGUE_{BIAS,RELU,RELU_BIAS}
 * epilogues (cuBLASLt's relu may turn a NaN into 0 where the hand-written
 * kernel keeps it).
 *
 * Caches: one cuBLASLt handle per device; one persistent workspace per
 * (device, stream) from the caching allocator (32 MiB on sm_90 and newer,
 * 4 MiB before, as NVIDIA recommends; counted as allocated, as PyTorch
 * counts cuBLAS's), allocated at the stream's first GEMM or before the
 * stream's graph capture (kiln_cublaslt_prepare: CUDA forbids allocating
 * during one) and kept until the stream is destroyed or kiln_shutdown;
 * the matmul descriptor, the three layouts and the heuristic's algorithm
 * cached per shape (dims, leading dims, ops, batch strides, dtype, math
 * mode, bias, pointer alignments, workspace). One mutex guards the caches
 * and each call's enqueue (the bias pointer is a descriptor attribute).
 * First run on a GPU (an H100) in session 6 (docs/cuda.md). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "base/error.h"
#include "kernels/cuda/cuda_fast.h"
#include "kernels/cuda/cuda_ops.h"
#include "kiln/runtime.h"
#include "runtime/cuda_backend.h"
#include "runtime/cuda_device.h"

#define LT_TRY(call)                                                                                         \
    do {                                                                                                     \
        cublasStatus_t lt_st_ = (call);                                                                      \
        if (lt_st_ != CUBLAS_STATUS_SUCCESS)                                                                 \
            return KILN_RAISE(lt_st_ == CUBLAS_STATUS_NOT_SUPPORTED ? KILN_ERR_UNSUPPORTED                   \
                                                                    : KILN_ERR_DEVICE,                       \
                              NULL, "cuBLASLt: %s failed: status %d", #call, (int)lt_st_);                   \
    } while (0)

#define MAX_DEVICES    64
#define MAX_WORKSPACES 128
#define MAX_PLANS      1024

/* One GEMM in cuBLASLt's terms (column-major): D (m x n) = op(A) (m x k) @
 * op(B) (k x n), batched. Also the plan cache's key (memcmp: zeroed first). */
typedef struct lt_shape {
    int device;
    int dtype; /* kiln_dtype of A, B and D */
    int tf32;
    int bias; /* bias epilogue */
    int relu; /* relu epilogue (linear_act) */
    int64_t m, n, k, batch;
    int64_t lda, ldb, ldd;
    int trans_a, trans_b;
    int64_t stride_a, stride_b, stride_d; /* batch strides (elements) */
    int align_a, align_b, align_d, align_bias;
    size_t workspace;
} lt_shape;

typedef struct lt_plan {
    lt_shape key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
    struct lt_plan *next;
} lt_plan;

typedef struct lt_workspace {
    int device;
    void *stream;
    void *ptr;
    size_t bytes;
} lt_workspace;

static pthread_mutex_t lt_mutex = PTHREAD_MUTEX_INITIALIZER;
static cublasLtHandle_t handles[MAX_DEVICES];
static lt_workspace workspaces[MAX_WORKSPACES];
static int n_workspaces;
static lt_plan *plans;
static int n_plans;

size_t kiln_cublaslt_version(void) { return cublasLtGetVersion(); }

/* ---- Geometry ----------------------------------------------------------------------- */

/* A row-major logical matrix (rows x cols) with strides (rs, cs) as a
 * column-major cuBLASLt operand meaning its transpose (cols x rows). */
static bool operand(int64_t rows, int64_t cols, int64_t rs, int64_t cs, int64_t *ld, int *trans) {
    if (cs == 1 || cols == 1) {
        int64_t l = rows == 1 ? (cols > 1 ? cols : 1) : rs;
        if (l < (cols > 1 ? cols : 1)) return false;
        *ld = l, *trans = 0; /* stored (cols x rows), ld = row stride */
        return true;
    }
    if (rs == 1 || rows == 1) {
        int64_t l = cols == 1 ? (rows > 1 ? rows : 1) : cs;
        if (l < (rows > 1 ? rows : 1)) return false;
        *ld = l, *trans = 1; /* stored (rows x cols) column-major: op T */
        return true;
    }
    return false;
}

static int alignment(const void *p, size_t elem) {
    uintptr_t v = (uintptr_t)p;
    int a = 256;
    while (a > (int)elem && (v % (uintptr_t)a)) a /= 2;
    return a;
}

static bool lt_dtype(kiln_dtype t) { return t == KILN_F32 || t == KILN_F16 || t == KILN_BF16; }

static size_t elem_size(kiln_dtype t) { return t == KILN_F32 ? 4 : 2; }

/* The GEMM of mm/bmm/linear args in row-major terms, then as lt_shape.
 * False when cuBLASLt cannot take it (the hand-written kernel then runs). */
typedef struct gemm_rm {
    int64_t M, N, K, batch;
    int64_t a_rs, a_cs, b_rs, b_cs, c_rs, c_cs; /* row/col strides of A (M x K), B (K x N), C (M x N) */
    int64_t a_bs, b_bs, c_bs;
    const void *A, *B, *bias;
    void *C;
    kiln_dtype dtype;
    bool relu;
} gemm_rm;

static bool same_dtypes(const kiln_op_args *a, int n_in) {
    kiln_dtype d = a->out[0].dtype;
    if (!lt_dtype(d)) return false;
    for (int i = 0; i < n_in; i++)
        if (a->in[i].dtype != d) return false;
    return true;
}

static bool mm_geometry(const kiln_op_args *a, gemm_rm *g) {
    const kiln_strided *x = &a->in[0], *w = &a->in[1], *c = &a->out[0];
    if (x->ndim != 2 || w->ndim != 2 || c->ndim != 2 || !same_dtypes(a, 2)) return false;
    memset(g, 0, sizeof *g);
    g->M = x->shape[0], g->K = x->shape[1], g->N = w->shape[1], g->batch = 1;
    g->a_rs = x->strides[0], g->a_cs = x->strides[1];
    g->b_rs = w->strides[0], g->b_cs = w->strides[1];
    g->c_rs = c->strides[0], g->c_cs = c->strides[1];
    g->A = x->data, g->B = w->data, g->C = c->data, g->dtype = c->dtype;
    return true;
}

static bool bmm_geometry(const kiln_op_args *a, gemm_rm *g) {
    const kiln_strided *x = &a->in[0], *w = &a->in[1], *c = &a->out[0];
    if (x->ndim != 3 || w->ndim != 3 || c->ndim != 3 || !same_dtypes(a, 2)) return false;
    memset(g, 0, sizeof *g);
    g->batch = c->shape[0], g->M = x->shape[1], g->K = x->shape[2], g->N = w->shape[2];
    g->a_rs = x->strides[1], g->a_cs = x->strides[2];
    g->b_rs = w->strides[1], g->b_cs = w->strides[2];
    g->c_rs = c->strides[1], g->c_cs = c->strides[2];
    g->a_bs = x->strides[0], g->b_bs = w->strides[0], g->c_bs = c->strides[0];
    g->A = x->data, g->B = w->data, g->C = c->data, g->dtype = c->dtype;
    return true;
}

/* linear: x (..., in) whose leading dims merge into one row stride (and
 * y's too), W (out, in) as B (K = in, N = out), bias (out) contiguous. */
static bool linear_geometry(const kiln_op_args *a, gemm_rm *g) {
    const kiln_strided *x = &a->in[0], *w = &a->in[1], *b = &a->in[2], *y = &a->out[0];
    if (x->ndim < 1 || w->ndim != 2 || y->ndim != x->ndim || !same_dtypes(a, 2)) return false;
    memset(g, 0, sizeof *g);
    int lead = x->ndim - 1;
    g->K = x->shape[lead], g->N = w->shape[0], g->batch = 1, g->M = 1;
    int64_t xs = 0, ys = 0; /* the merged row strides */
    bool have = false;
    for (int d = lead - 1; d >= 0; d--) { /* innermost leading dim first */
        int64_t n = x->shape[d];
        if (n == 1) continue;
        if (!have) {
            xs = x->strides[d], ys = y->strides[d], have = true;
        } else if (x->strides[d] != xs * g->M || y->strides[d] != ys * g->M) {
            return false;
        }
        g->M *= n;
    }
    g->a_rs = have ? xs : g->K, g->a_cs = x->strides[lead];
    g->c_rs = have ? ys : g->N, g->c_cs = y->strides[lead];
    g->b_rs = w->strides[1], g->b_cs = w->strides[0]; /* B(k, n) = W[n, k] */
    g->A = x->data, g->B = w->data, g->C = y->data, g->dtype = y->dtype;
    if (b->ndim >= 0) {
        if (b->dtype != y->dtype || b->ndim != 1 || (b->shape[0] > 1 && b->strides[0] != 1)) return false;
        g->bias = b->data;
    }
    return true;
}

/* linear_act: x (N, d1, ...) read as (N, K) where dims 1.. merge into one
 * stride, y (N, O), W (O, K), bias (O) or none; attrs.flag 1 = relu. */
static bool linear_act_geometry(const kiln_op_args *a, gemm_rm *g) {
    const kiln_strided *x = &a->in[0], *w = &a->in[1], *b = &a->in[2], *y = &a->out[0];
    if (x->ndim < 2 || w->ndim != 2 || y->ndim != 2 || !same_dtypes(a, 2)) return false;
    if (a->attrs->flag != 0 && a->attrs->flag != 1) return false;
    memset(g, 0, sizeof *g);
    g->M = x->shape[0], g->N = w->shape[0], g->K = 1, g->batch = 1;
    int64_t ks = 1;
    bool have = false;
    for (int d = x->ndim - 1; d >= 1; d--) {
        int64_t n = x->shape[d];
        if (n == 1) continue;
        if (!have) {
            ks = x->strides[d], have = true;
        } else if (x->strides[d] != ks * g->K) {
            return false;
        }
        g->K *= n;
    }
    if (g->K != w->shape[1]) return false;
    g->a_rs = x->strides[0], g->a_cs = ks;
    g->c_rs = y->strides[0], g->c_cs = y->strides[1];
    g->b_rs = w->strides[1], g->b_cs = w->strides[0];
    g->A = x->data, g->B = w->data, g->C = y->data, g->dtype = y->dtype;
    g->relu = a->attrs->flag == 1;
    if (b->ndim >= 0) {
        if (b->dtype != y->dtype || b->ndim != 1 || (b->shape[0] > 1 && b->strides[0] != 1)) return false;
        g->bias = b->data;
    }
    return true;
}

static bool to_shape(const gemm_rm *g, lt_shape *s) {
    memset(s, 0, sizeof *s);
    if (g->M <= 0 || g->N <= 0 || g->K <= 0 || g->batch <= 0) return false;
    if (g->c_cs != 1 && g->N > 1) return false;
    /* cuBLASLt "A" = B^T (N x K): B (K x N) row-major; "B" = A^T (K x M). */
    if (!operand(g->K, g->N, g->b_rs, g->b_cs, &s->lda, &s->trans_a)) return false;
    if (!operand(g->M, g->K, g->a_rs, g->a_cs, &s->ldb, &s->trans_b)) return false;
    s->ldd = g->M == 1 ? g->N : g->c_rs;
    if (s->ldd < g->N) return false;
    s->m = g->N, s->n = g->M, s->k = g->K, s->batch = g->batch;
    s->stride_a = g->b_bs, s->stride_b = g->a_bs, s->stride_d = g->c_bs;
    s->dtype = (int)g->dtype;
    s->tf32 = g->dtype == KILN_F32 && kiln_allow_tf32();
    s->bias = g->bias != NULL;
    s->relu = g->relu;
    size_t es = elem_size(g->dtype);
    s->align_a = alignment(g->B, es), s->align_b = alignment(g->A, es), s->align_d = alignment(g->C, es);
    s->align_bias = g->bias ? alignment(g->bias, es) : 0;
    return true;
}

/* ---- Handles, workspaces, plans ------------------------------------------------------- */

static kiln_status handle_for(int device, cublasLtHandle_t *out) {
    if (device < 0 || device >= MAX_DEVICES)
        return KILN_RAISE(KILN_ERR_DEVICE, NULL, "cuBLASLt: device %d out of range", device);
    if (!handles[device]) LT_TRY(cublasLtCreate(&handles[device]));
    *out = handles[device];
    return KILN_OK;
}

/* The workspace each stream gets: 32 MiB on sm_90 and newer, 4 MiB before
 * (NVIDIA's recommendation, PyTorch's sizes). */
static size_t workspace_size(int device) {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
        (void)cudaGetLastError();
        major = 0;
    }
    return (size_t)(major >= 9 ? 32 : 4) << 20;
}

size_t kiln_cublaslt_stream_workspace_bytes(int device) { return workspace_size(device); }

/* Whether work queued on stream now is recorded into a CUDA graph (or the
 * capture was invalidated) rather than run. */
static bool stream_capturing(void *stream) {
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing((cudaStream_t)stream, &cs) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return cs != cudaStreamCaptureStatusNone;
}

static atomic_bool warned_no_workspace;

/* The stream's persistent workspace into *out (lt_mutex held): made at the
 * stream's first GEMM, or before its graph capture (kiln_cublaslt_prepare
 * from the backend's capture begin), and kept until the stream is
 * destroyed or kiln_shutdown. NULL (GEMMs run without one) when the table
 * is full or the allocation fails; a failed allocation is not remembered,
 * so the next GEMM asks again. Never allocates while the stream is being
 * captured (CUDA forbids it and the capture would be invalidated): a
 * capturing stream without a workspace is an error, since running without
 * one would pick other algorithms than the eager steps did. */
static kiln_status workspace_for(int device, void *stream, lt_workspace **out) {
    *out = NULL;
    for (int i = 0; i < n_workspaces; i++)
        if (workspaces[i].device == device && workspaces[i].stream == stream) {
            *out = &workspaces[i];
            return KILN_OK;
        }
    if (stream_capturing(stream))
        return KILN_RAISE(
            KILN_ERR_STATE,
            "capture through kiln_program_run (its capture begin makes the workspace), or run one "
            "GEMM on the stream before capturing it",
            "cuBLASLt: stream %p of cuda:%d has no GEMM workspace and is being captured into a "
            "CUDA graph, where nothing may be allocated",
            stream, device);
    if (n_workspaces == MAX_WORKSPACES) return KILN_OK;
    size_t want = workspace_size(device);
    void *ptr = NULL;
    if (kiln_memory_alloc(KILN_CUDA(device), want, NULL, &ptr) != KILN_OK) {
        if (!atomic_exchange(&warned_no_workspace, true))
            kiln_log_write(KILN_LOG_WARN,
                           "cuBLASLt: no %zu-byte workspace for stream %p of cuda:%d (%s): its GEMMs run "
                           "without one until one can be allocated (warned once)",
                           want, stream, device, kiln_error_message());
        kiln_error_clear();
        return KILN_OK;
    }
    lt_workspace *w = &workspaces[n_workspaces++];
    w->device = device, w->stream = stream, w->ptr = ptr, w->bytes = want;
    *out = w;
    return KILN_OK;
}

kiln_status kiln_cublaslt_prepare(int device, void *stream) {
    int previous = -1;
    KILN_TRY(kiln_cuda_device_switch(device, &previous));
    pthread_mutex_lock(&lt_mutex);
    cublasLtHandle_t h = NULL;
    lt_workspace *ws = NULL;
    kiln_status st = handle_for(device, &h);
    if (!st) st = workspace_for(device, stream, &ws);
    if (!st && !ws)
        st = KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, "free memory (kiln_empty_cache) or lower the batch size",
                        "cuBLASLt: no %zu-byte GEMM workspace for stream %p of cuda:%d before its CUDA graph "
                        "capture (none can be allocated during it)",
                        workspace_size(device), stream, device);
    pthread_mutex_unlock(&lt_mutex);
    kiln_cuda_device_restore(device, previous);
    return st;
}

/* The workspace's block goes back once the GEMMs using it are done: the
 * device's, not the stream's, since a graph captured on the stream replays
 * its GEMMs on the stream it is launched on. */
static void workspace_release(lt_workspace *w) {
    int previous = -1;
    if (kiln_cuda_device_switch(w->device, &previous) == KILN_OK) {
        if (cudaDeviceSynchronize() != cudaSuccess) (void)cudaGetLastError();
        kiln_cuda_device_restore(w->device, previous);
    }
    kiln_error_clear();
    if (kiln_memory_free(KILN_CUDA(w->device), w->ptr) != KILN_OK) kiln_error_clear();
}

void kiln_cublaslt_forget_stream(int device, void *stream) {
    pthread_mutex_lock(&lt_mutex);
    for (int i = 0; i < n_workspaces; i++)
        if (workspaces[i].device == device && workspaces[i].stream == stream) {
            workspace_release(&workspaces[i]);
            workspaces[i] = workspaces[--n_workspaces];
            break;
        }
    pthread_mutex_unlock(&lt_mutex);
}

static void plan_destroy(lt_plan *p) {
    if (p->desc) cublasLtMatmulDescDestroy(p->desc);
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->d) cublasLtMatrixLayoutDestroy(p->d);
    free(p);
}

static cudaDataType_t cuda_type(int dtype) {
    return dtype == KILN_F16 ? CUDA_R_16F : dtype == KILN_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

static kiln_status layout(cublasLtMatrixLayout_t *out, cudaDataType_t t, int64_t rows, int64_t cols,
                          int64_t ld, int64_t batch, int64_t stride) {
    LT_TRY(cublasLtMatrixLayoutCreate(out, t, (uint64_t)rows, (uint64_t)cols, ld));
    if (batch > 1) {
        int32_t count = (int32_t)batch;
        LT_TRY(
            cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
        LT_TRY(cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                sizeof stride));
    }
    return KILN_OK;
}

static kiln_status plan_build(cublasLtHandle_t h, const lt_shape *s, lt_plan *p) {
    cudaDataType_t t = cuda_type(s->dtype);
    cublasComputeType_t compute = s->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    LT_TRY(cublasLtMatmulDescCreate(&p->desc, compute, CUDA_R_32F));
    cublasOperation_t ta = s->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                      tb = s->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (s->bias || s->relu) {
        cublasLtEpilogue_t ep = s->bias && s->relu ? CUBLASLT_EPILOGUE_RELU_BIAS
                                : s->bias          ? CUBLASLT_EPILOGUE_BIAS
                                                   : CUBLASLT_EPILOGUE_RELU;
        LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
    }
    if (s->bias)
        LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof t));
    /* stored shapes: op(A) is m x k, op(B) k x n */
    KILN_TRY(
        layout(&p->a, t, s->trans_a ? s->k : s->m, s->trans_a ? s->m : s->k, s->lda, s->batch, s->stride_a));
    KILN_TRY(
        layout(&p->b, t, s->trans_b ? s->n : s->k, s->trans_b ? s->k : s->n, s->ldb, s->batch, s->stride_b));
    KILN_TRY(layout(&p->d, t, s->m, s->n, s->ldd, s->batch, s->stride_d));
    cublasLtMatmulPreference_t pref = NULL;
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
    uint32_t al[4] = {(uint32_t)s->align_a, (uint32_t)s->align_b, (uint32_t)s->align_d, (uint32_t)s->align_d};
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &s->workspace, sizeof s->workspace);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0],
                                                  sizeof al[0]);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1],
                                                  sizeof al[1]);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2],
                                                  sizeof al[2]);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[3],
                                                  sizeof al[3]);
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    memset(&result, 0, sizeof result);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(h, p->desc, p->a, p->b, p->d, p->d, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    LT_TRY(st);
    if (found < 1 || result.state != CUBLAS_STATUS_SUCCESS)
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, NULL,
                          "cuBLASLt: no algorithm for a %lld x %lld x %lld GEMM (batch %lld, dtype %s)",
                          (long long)s->m, (long long)s->n, (long long)s->k, (long long)s->batch,
                          kiln_dtype_name((kiln_dtype)s->dtype));
    p->algo = result.algo;
    return KILN_OK;
}

/* The cached plan for s, built on first use (lt_mutex held). */
static kiln_status plan_for(cublasLtHandle_t h, const lt_shape *s, lt_plan **out, bool *owned) {
    for (lt_plan *p = plans; p; p = p->next)
        if (!memcmp(&p->key, s, sizeof *s)) {
            *out = p, *owned = false;
            return KILN_OK;
        }
    lt_plan *p = calloc(1, sizeof *p);
    if (!p) return KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "cuBLASLt: no host memory for a plan");
    p->key = *s;
    kiln_status st = plan_build(h, s, p);
    if (st) {
        plan_destroy(p);
        return st;
    }
    if (n_plans < MAX_PLANS) {
        p->next = plans, plans = p, n_plans++;
        *owned = false;
    } else {
        *owned = true; /* the cache is full: this call's plan only */
    }
    *out = p;
    return KILN_OK;
}

/* ---- Running ---------------------------------------------------------------------------- */

static kiln_status lt_run_locked(const gemm_rm *g, void *stream, int device) {
    cublasLtHandle_t h = NULL;
    KILN_TRY(handle_for(device, &h));
    lt_workspace *ws = NULL;
    KILN_TRY(workspace_for(device, stream, &ws));
    lt_shape s;
    if (!to_shape(g, &s))
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL,
                          "cuBLASLt: a GEMM its supports fn accepted cannot be mapped");
    s.device = device;
    s.workspace = ws ? ws->bytes : 0;
    lt_plan *p = NULL;
    bool owned = false;
    KILN_TRY(plan_for(h, &s, &p, &owned));
    kiln_status st = KILN_OK;
    if (s.bias) {
        cublasStatus_t bs = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                           &g->bias, sizeof g->bias);
        if (bs != CUBLAS_STATUS_SUCCESS)
            st = KILN_RAISE(KILN_ERR_DEVICE, NULL, "cuBLASLt: setting the bias pointer failed: status %d",
                            (int)bs);
    }
    const float one = 1.0f, zero = 0.0f;
    if (!st) {
        cublasStatus_t ms =
            cublasLtMatmul(h, p->desc, &one, g->B, p->a, g->A, p->b, &zero, g->C, p->d, g->C, p->d, &p->algo,
                           s.workspace ? ws->ptr : NULL, s.workspace, (cudaStream_t)stream);
        if (ms != CUBLAS_STATUS_SUCCESS)
            st = KILN_RAISE(ms == CUBLAS_STATUS_NOT_SUPPORTED ? KILN_ERR_UNSUPPORTED : KILN_ERR_DEVICE, NULL,
                            "cuBLASLt: cublasLtMatmul failed: status %d", (int)ms);
    }
    if (owned) plan_destroy(p);
    return st;
}

/* A library failure is returned as it is: the fast table falls back. */
static kiln_status lt_gemm(const kiln_op_args *a, const gemm_rm *g) {
    int device = -1, previous = -1;
    kiln_status st = kiln_cuda_fast_enter(a->out[0].data, &device, &previous);
    if (!st) {
        pthread_mutex_lock(&lt_mutex);
        st = lt_run_locked(g, a->stream, device);
        pthread_mutex_unlock(&lt_mutex);
        kiln_cuda_fast_leave(device, previous);
    }
    return st;
}

bool kiln_cublaslt_geometry_of(kiln_cublaslt_gemm gemm, const kiln_op_args *a, kiln_cublaslt_geometry *out) {
    gemm_rm g;
    lt_shape s;
    bool ok = gemm == KILN_CUBLASLT_MM           ? mm_geometry(a, &g)
              : gemm == KILN_CUBLASLT_BMM        ? bmm_geometry(a, &g)
              : gemm == KILN_CUBLASLT_LINEAR     ? linear_geometry(a, &g)
              : gemm == KILN_CUBLASLT_LINEAR_ACT ? linear_act_geometry(a, &g)
                                                 : false;
    if (!ok || !to_shape(&g, &s)) return false;
    memset(out, 0, sizeof *out);
    out->m = s.m, out->n = s.n, out->k = s.k, out->batch = s.batch;
    out->lda = s.lda, out->ldb = s.ldb, out->ldd = s.ldd;
    out->stride_a = s.stride_a, out->stride_b = s.stride_b, out->stride_d = s.stride_d;
    out->trans_a = s.trans_a, out->trans_b = s.trans_b, out->relu = s.relu;
    out->a = g.B, out->b = g.A, out->bias = g.bias, out->d = g.C;
    return true;
}

/* ---- Table entries ------------------------------------------------------------------------ */

bool kiln_cublaslt_mm_supports(const kiln_op_args *a) {
    gemm_rm g;
    lt_shape s;
    return mm_geometry(a, &g) && to_shape(&g, &s);
}
bool kiln_cublaslt_bmm_supports(const kiln_op_args *a) {
    gemm_rm g;
    lt_shape s;
    return bmm_geometry(a, &g) && to_shape(&g, &s);
}
bool kiln_cublaslt_linear_supports(const kiln_op_args *a) {
    gemm_rm g;
    lt_shape s;
    return linear_geometry(a, &g) && to_shape(&g, &s);
}

bool kiln_cublaslt_linear_act_supports(const kiln_op_args *a) {
    gemm_rm g;
    lt_shape s;
    return linear_act_geometry(a, &g) && to_shape(&g, &s);
}
kiln_status kiln_cublaslt_linear_act(const kiln_op_args *a) {
    gemm_rm g;
    if (!linear_act_geometry(a, &g)) return kiln_cuda_linear_act(a);
    return lt_gemm(a, &g);
}

kiln_status kiln_cublaslt_mm(const kiln_op_args *a) {
    gemm_rm g;
    if (!mm_geometry(a, &g)) return kiln_cuda_mm(a);
    return lt_gemm(a, &g);
}
kiln_status kiln_cublaslt_bmm(const kiln_op_args *a) {
    gemm_rm g;
    if (!bmm_geometry(a, &g)) return kiln_cuda_bmm(a);
    return lt_gemm(a, &g);
}
kiln_status kiln_cublaslt_linear(const kiln_op_args *a) {
    gemm_rm g;
    if (!linear_geometry(a, &g)) return kiln_cuda_linear(a);
    return lt_gemm(a, &g);
}

/* cuBLASLt needs no per-call workspace: the persistent one above serves it
 * (the entries have no workspace fn; the table reserves the hand-written
 * kernel's for a fallback). */

void kiln_cublaslt_shutdown(void) {
    pthread_mutex_lock(&lt_mutex);
    for (int i = 0; i < n_workspaces; i++) workspace_release(&workspaces[i]);
    n_workspaces = 0;
    while (plans) {
        lt_plan *p = plans;
        plans = p->next;
        plan_destroy(p);
    }
    n_plans = 0;
    for (int d = 0; d < MAX_DEVICES; d++)
        if (handles[d]) {
            cublasLtDestroy(handles[d]);
            handles[d] = NULL;
        }
    pthread_mutex_unlock(&lt_mutex);
}

/* CUDA kernels of the nn op group (cuda_ops.h): batch norm and its
 * backward here; convolution in ops_conv.cu, pooling in ops_pool.cu, the
 * shape and indexing ops and randperm in ops_index.cu.
 *
 * Batch norm: one block a channel. The block sums the channel's elements
 * in double (each thread a fixed strided subset, then a tree over the
 * threads in a fixed order: deterministic, no atomics), computes the
 * statistics exactly as kernels/cpu/ops_batchnorm.c defines them (mean,
 * biased variance -> invstd = 1 / sqrt(var + eps); the running variance
 * takes the unbiased one; saved mean/invstd are the batch's in training
 * and the running ones in eval), then writes the channel's outputs. */
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/nn_common.h"

namespace {

using kiln_nn::ldf;
using kiln_nn::stf;
using kiln_nn::view;

/* Threads a channel's block: 256, or 1024 for channels of 16384 elements
 * or more (a block a channel leaves SMs idle when C is small, so each block
 * should fill its SM). A function of the shape only: the summation order,
 * and so the result, does not change from run to run. */
constexpr int kBnMaxThreads = 1024;

unsigned bn_threads(int64_t count) { return count >= 16384 ? kBnMaxThreads : 256; }

/* The elements of one channel: x's dims without dim 1; channel c starts
 * at c * cstride. */
struct channel_view {
    view v;
    int64_t cstride;
    int64_t count;
};

channel_view channel_of(const kiln_strided *t) {
    channel_view r;
    memset(&r, 0, sizeof r);
    r.cstride = t->strides[1];
    r.count = 1;
    int j = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (i == 1) continue;
        r.v.shape[j] = t->shape[i];
        r.v.strides[j] = t->strides[i];
        r.count *= t->shape[i];
        j++;
    }
    r.v.ndim = j;
    return r;
}

/* A per-channel parameter (C) or none. */
struct param {
    const void *data;
    int dt;
    int64_t stride;
    __device__ double get(int64_t c, double absent) const {
        return data ? ldf(data, dt, c * stride) : absent;
    }
};

param param_of(const kiln_strided *p) {
    param r;
    r.data = kiln_nn::present(p) ? p->data : nullptr;
    r.dt = (int)p->dtype;
    r.stride = r.data ? p->strides[0] : 0;
    return r;
}

/* Sum of `v` over the block, in a fixed order; every thread gets it. */
__device__ double block_sum(double v, double *sh) {
    int tid = (int)threadIdx.x, n = (int)blockDim.x;
    sh[tid] = v;
    __syncthreads();
    /* n is a power of two (bn_threads) */
    for (int half = n / 2; half > 0; half /= 2) {
        if (tid < half) sh[tid] += sh[tid + half];
        __syncthreads();
    }
    double r = sh[0];
    __syncthreads();
    return r;
}

struct bn_args {
    channel_view xv, yv;
    const void *x;
    int xdt;
    void *y;
    int ydt;
    param w, b, rm, rv;
    void *rm_out, *rv_out; /* the running statistics, updated in place (or null) */
    void *mean_out, *invstd_out;
    int mean_dt, invstd_dt;
    int64_t mean_stride, invstd_stride;
    bool training;
    double momentum, eps;
};

__global__ void batch_norm_kernel(bn_args p) {
    KILN_DYNAMIC_SHARED(double, sh);
    const int64_t c = blockIdx.x;
    const int tid = (int)threadIdx.x;
    const int64_t xbase = c * p.xv.cstride, ybase = c * p.yv.cstride, n = p.xv.count;
    double mean, invstd;
    if (p.training) {
        double s = 0;
        for (int64_t i = tid; i < n; i += blockDim.x)
            s += ldf(p.x, p.xdt, xbase + kiln_cuda::offset_of(p.xv.v, i));
        s = block_sum(s, sh);
        mean = n ? s / (double)n : 0.0;
        double ss = 0;
        for (int64_t i = tid; i < n; i += blockDim.x) {
            double d = ldf(p.x, p.xdt, xbase + kiln_cuda::offset_of(p.xv.v, i)) - mean;
            ss += d * d;
        }
        ss = block_sum(ss, sh);
        double var = n ? ss / (double)n : 0.0;
        invstd = 1.0 / sqrt(var + p.eps);
        if (tid == 0 && p.momentum >= 0) {
            if (p.rm_out) {
                double old = p.rm.get(c, 0);
                stf(p.rm_out, p.rm.dt, c * p.rm.stride, (1 - p.momentum) * old + p.momentum * mean);
            }
            if (p.rv_out) {
                double unbiased = n > 1 ? ss / (double)(n - 1) : var;
                double old = p.rv.get(c, 1);
                stf(p.rv_out, p.rv.dt, c * p.rv.stride, (1 - p.momentum) * old + p.momentum * unbiased);
            }
        }
    } else {
        mean = p.rm.get(c, 0);
        invstd = 1.0 / sqrt(p.rv.get(c, 1) + p.eps);
    }
    double alpha = invstd * p.w.get(c, 1), beta = p.b.get(c, 0) - mean * alpha;
    for (int64_t i = tid; i < n; i += blockDim.x) {
        double v = ldf(p.x, p.xdt, xbase + kiln_cuda::offset_of(p.xv.v, i));
        stf(p.y, p.ydt, ybase + kiln_cuda::offset_of(p.yv.v, i), v * alpha + beta);
    }
    if (tid == 0) {
        stf(p.mean_out, p.mean_dt, c * p.mean_stride, mean);
        stf(p.invstd_out, p.invstd_dt, c * p.invstd_stride, invstd);
    }
}

struct bn_bwd_args {
    channel_view xv, gv, dv;
    const void *x, *go;
    int xdt, gdt;
    void *dx;
    int ddt;
    param w, mean, invstd;
    void *dw, *db;
    int dw_dt, db_dt;
    int64_t dw_stride, db_stride;
    bool training;
};

__global__ void batch_norm_backward_kernel(bn_bwd_args p) {
    KILN_DYNAMIC_SHARED(double, sh);
    const int64_t c = blockIdx.x;
    const int tid = (int)threadIdx.x;
    const int64_t xb = c * p.xv.cstride, gb = c * p.gv.cstride, db = c * p.dv.cstride, n = p.xv.count;
    double mean = p.mean.get(c, 0), invstd = p.invstd.get(c, 1), wc = p.w.get(c, 1);
    double sg = 0, sgx = 0;
    for (int64_t i = tid; i < n; i += blockDim.x) {
        double g = ldf(p.go, p.gdt, gb + kiln_cuda::offset_of(p.gv.v, i));
        double xc = ldf(p.x, p.xdt, xb + kiln_cuda::offset_of(p.xv.v, i)) - mean;
        sg += g, sgx += g * xc;
    }
    sg = block_sum(sg, sh);
    sgx = block_sum(sgx, sh);
    double cnt = n ? (double)n : 1.0;
    double gmean = sg / cnt, proj = sgx / cnt * invstd * invstd;
    if (p.dx) {
        for (int64_t i = tid; i < n; i += blockDim.x) {
            double g = ldf(p.go, p.gdt, gb + kiln_cuda::offset_of(p.gv.v, i));
            double r;
            if (p.training) {
                double xc = ldf(p.x, p.xdt, xb + kiln_cuda::offset_of(p.xv.v, i)) - mean;
                r = (g - gmean - xc * proj) * invstd * wc;
            } else {
                r = g * invstd * wc;
            }
            stf(p.dx, p.ddt, db + kiln_cuda::offset_of(p.dv.v, i), r);
        }
    }
    if (tid == 0) {
        if (p.dw) stf(p.dw, p.dw_dt, c * p.dw_stride, sgx * invstd);
        if (p.db) stf(p.db, p.db_dt, c * p.db_stride, sg);
    }
}

kiln_status run_batch_norm(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *y = &a->out[0], *mo = &a->out[1], *io = &a->out[2];
    int64_t C = x->shape[1];
    if (C == 0) return KILN_OK;
    if (C > 2147483647)
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "use fewer channels",
                          "batch_norm: %lld channels exceed one CUDA grid", (long long)C);
    kiln_cuda::device_guard guard;
    KILN_TRY(guard.enter(mo->data));
    bn_args p;
    memset(&p, 0, sizeof p);
    p.xv = channel_of(x), p.yv = channel_of(y);
    p.x = x->data, p.xdt = (int)x->dtype, p.y = y->data, p.ydt = (int)y->dtype;
    p.w = param_of(&a->in[1]), p.b = param_of(&a->in[2]);
    p.rm = a->n_in > 3 ? param_of(&a->in[3]) : param{nullptr, 0, 0};
    p.rv = a->n_in > 4 ? param_of(&a->in[4]) : param{nullptr, 0, 0};
    p.rm_out = (void *)p.rm.data, p.rv_out = (void *)p.rv.data;
    p.mean_out = mo->data, p.invstd_out = io->data;
    p.mean_dt = (int)mo->dtype, p.invstd_dt = (int)io->dtype;
    p.mean_stride = mo->strides[0], p.invstd_stride = io->strides[0];
    p.training = a->attrs->training;
    p.momentum = a->attrs->momentum, p.eps = a->attrs->eps;
    unsigned threads = bn_threads(p.xv.count);
    KILN_LAUNCH(batch_norm_kernel, (unsigned)C, threads, threads * sizeof(double), a->stream, p);
    KILN_LAUNCH_CHECK(guard.device, "batch_norm (batch_norm_kernel)");
    return KILN_OK;
}

kiln_status run_batch_norm_backward(const kiln_op_args *a) {
    const kiln_strided *go = &a->in[0], *x = &a->in[1], *dx = &a->out[0];
    int64_t C = x->shape[1];
    if (C == 0) return KILN_OK;
    if (C > 2147483647)
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "use fewer channels",
                          "batch_norm_backward: %lld channels exceed one CUDA grid", (long long)C);
    const kiln_strided *dw = a->n_out > 1 ? &a->out[1] : nullptr, *db = a->n_out > 2 ? &a->out[2] : nullptr;
    bool has_dw = dw && kiln_nn::present(dw), has_db = db && kiln_nn::present(db);
    bool has_dx = kiln_nn::present(dx) && kiln_cuda::element_count(dx) > 0;
    const void *owner = has_dx ? dx->data : has_dw ? dw->data : has_db ? db->data : nullptr;
    if (!owner) return KILN_OK;
    kiln_cuda::device_guard guard;
    KILN_TRY(guard.enter(owner));
    bn_bwd_args p;
    memset(&p, 0, sizeof p);
    p.xv = channel_of(x), p.gv = channel_of(go), p.dv = channel_of(dx);
    p.x = x->data, p.xdt = (int)x->dtype, p.go = go->data, p.gdt = (int)go->dtype;
    p.dx = has_dx ? dx->data : nullptr, p.ddt = (int)dx->dtype;
    p.w = param_of(&a->in[2]), p.mean = param_of(&a->in[3]), p.invstd = param_of(&a->in[4]);
    p.dw = has_dw ? dw->data : nullptr, p.db = has_db ? db->data : nullptr;
    p.dw_dt = has_dw ? (int)dw->dtype : 0, p.db_dt = has_db ? (int)db->dtype : 0;
    p.dw_stride = has_dw ? dw->strides[0] : 0, p.db_stride = has_db ? db->strides[0] : 0;
    p.training = a->attrs->training;
    unsigned threads = bn_threads(p.xv.count);
    KILN_LAUNCH(batch_norm_backward_kernel, (unsigned)C, threads, threads * sizeof(double), a->stream, p);
    KILN_LAUNCH_CHECK(guard.device, "batch_norm_backward (batch_norm_backward_kernel)");
    return KILN_OK;
}

} // namespace

/* The exported kernels (cuda_ops.h); src/ops/cuda_table_nn_cuda.c points
 * the table at them. */
extern "C" kiln_status kiln_cuda_batch_norm(const kiln_op_args *a) { return run_batch_norm(a); }
extern "C" kiln_status kiln_cuda_batch_norm_backward(const kiln_op_args *a) {
    return run_batch_norm_backward(a);
}

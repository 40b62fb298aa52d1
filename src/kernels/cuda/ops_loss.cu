/* CUDA kernels for nll_loss (with label smoothing), its backward, and
 * mse_loss (reduce group; exported through cuda_ops.h). Semantics of the
 * CPU reference (kernels/cpu/ops_loss.c): with w = weight or ones, eps the
 * label smoothing, C classes on dim 1 of log_probs (dim 0 unbatched),
 *
 *   loss_i = (1 - eps) * w[t_i] * (-lp[i, t_i]) + eps / C * sum_c w[c] * (-lp[i, c])
 *   W      = sum of w[t_i] over positions whose target is not ignore_index
 *
 * out[0] is loss_i (none), sum_i loss_i (sum) or sum_i loss_i / W (mean);
 * out[1] is W. All in double, stored in the output dtype.
 *
 * A target outside [0, C) that is not ignore_index cannot raise an error
 * from the device without blocking the host (the CPU kernel raises): its
 * loss and W become NaN (and its gradient row NaN), so the mistake shows in
 * the result instead of reading out of bounds.
 *
 * Sums over positions are deterministic: blocks take fixed chunks of
 * positions and reduce them through a fixed tree; with more than one chunk
 * the partial sums go to the workspace and one thread adds them in chunk
 * order. */
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_dtype.h"
#include "kernels/cuda/cuda_ops.h"

namespace {

using namespace kiln_cuda;

struct pair_sum {
    double a, b;
};

struct pair_add {
    KILN_HD pair_sum operator()(pair_sum x, pair_sum y) const { return pair_sum{x.a + y.a, x.b + y.b}; }
};

constexpr int64_t kChunk = 4096; /* positions per block of the sum */

int64_t chunks_for(int64_t n) { return n <= kChunk ? 1 : (n + kChunk - 1) / kChunk; }

/* Item: pair_sum operator()(i) for position i (it may also store a
 * per-position output), finish(total) stores the reduced outputs. */
template <class Item>
__global__ void chunk_sum_kernel(Item it, int64_t n, int64_t chunks, pair_sum *partials) {
    KILN_DYNAMIC_SHARED(pair_sum, sh);
    for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
        int64_t lo = c * kChunk, hi = lo + kChunk;
        if (hi > n) hi = n;
        pair_sum acc = {0.0, 0.0};
        for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
            pair_sum v = it(i);
            acc.a += v.a;
            acc.b += v.b;
        }
        acc = block_reduce(sh, acc, pair_add());
        if (threadIdx.x == 0) {
            if (chunks == 1)
                it.finish(acc);
            else
                partials[c] = acc;
        }
    }
}

template <class Item> __global__ void chunk_finish_kernel(Item it, int64_t chunks, const pair_sum *partials) {
    if (global_thread() != 0) return;
    pair_sum acc = {0.0, 0.0};
    for (int64_t c = 0; c < chunks; c++) {
        acc.a += partials[c].a;
        acc.b += partials[c].b;
    }
    it.finish(acc);
}

template <class Item>
kiln_status launch_chunk_sum(const Item &it, int64_t n, const kiln_op_args *a, const char *what) {
    int64_t chunks = chunks_for(n);
    pair_sum *partials = NULL;
    if (chunks > 1) {
        partials = (pair_sum *)a->workspace;
        if (!partials || a->workspace_bytes < (size_t)chunks * sizeof(pair_sum))
            return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "CUDA %s: workspace of %zu bytes, %lld needed", what,
                              a->workspace_bytes, (long long)(chunks * (int64_t)sizeof(pair_sum)));
    }
    device_guard guard;
    KILN_TRY(guard.enter(a->out[0].data));
    unsigned threads = (unsigned)kThreads;
    unsigned blocks = (unsigned)(chunks < 65535 ? chunks : 65535);
    auto *k = &chunk_sum_kernel<Item>;
    KILN_LAUNCH(k, blocks, threads, threads * sizeof(pair_sum), a->stream, it, n, chunks, partials);
    KILN_LAUNCH_CHECK(guard.device, what);
    if (chunks > 1) {
        auto *f = &chunk_finish_kernel<Item>;
        KILN_LAUNCH(f, 1, 32, 0, a->stream, it, chunks, (const pair_sum *)partials);
        KILN_LAUNCH_CHECK(guard.device, what);
    }
    return KILN_OK;
}

/* ---- nll_loss ------------------------------------------------------------------------------ */

/* Positions walk the target's shape: operand 0 the target, 1 log_probs
 * (its dims 0, 2, 3, ...), 2 the per-position tensor (loss for reduction
 * none, grad for its backward) or none. */
struct nll_geom {
    geom pos;
    int64_t classes, class_stride;
};

nll_geom make_nll_geom(const kiln_strided *lp, const kiln_strided *target, const int64_t *pos_strides) {
    nll_geom l;
    memset(&l, 0, sizeof l);
    int cdim = lp->ndim == 1 ? 0 : 1;
    l.classes = lp->shape[cdim];
    l.class_stride = lp->strides[cdim];
    int64_t st[3][KILN_MAX_DIMS];
    for (int d = 0; d < target->ndim; d++) {
        st[0][d] = target->strides[d];
        st[1][d] = lp->strides[d == 0 ? 0 : d + 1];
        st[2][d] = pos_strides ? pos_strides[d] : 0;
    }
    const int64_t *sp[3] = {st[0], st[1], st[2]};
    l.pos = make_geom(target->ndim, target->shape, 3, sp);
    return l;
}

struct weight_view {
    const void *data; /* NULL: no weight (ones) */
    kiln_dtype dtype;
    int64_t stride;
    KILN_HD double at(int64_t c) const { return data ? load_f64(data, dtype, c * stride) : 1.0; }
};

weight_view weight_of(const kiln_strided *w) {
    weight_view v = {NULL, KILN_F32, 0};
    if (w->ndim >= 0) {
        v.data = w->data;
        v.dtype = w->dtype;
        v.stride = w->ndim > 0 ? w->strides[0] : 0;
    }
    return v;
}

struct nll_item {
    nll_geom l;
    const void *lp;
    kiln_dtype lp_dt;
    const int64_t *target;
    weight_view w;
    int64_t ignore_index;
    double eps;
    int reduction;
    void *loss;
    kiln_dtype loss_dt;
    void *total;
    kiln_dtype total_dt;

    __device__ pair_sum operator()(int64_t i) const {
        int64_t off[kMaxOperands];
        l.pos.offsets(i, off);
        int64_t t = target[off[0]];
        double li = 0, wi = 0;
        if (t != ignore_index) {
            if (t < 0 || t >= l.classes) {
                li = wi = (double)NAN;
            } else {
                double wt = w.at(t);
                li = -wt * load_f64(lp, lp_dt, off[1] + t * l.class_stride);
                if (eps != 0) {
                    double s = 0;
                    for (int64_t c = 0; c < l.classes; c++)
                        s -= w.at(c) * load_f64(lp, lp_dt, off[1] + c * l.class_stride);
                    li = (1 - eps) * li + eps / (double)l.classes * s;
                }
                wi = wt;
            }
        }
        if (reduction == KILN_REDUCTION_NONE) store_f64(loss, loss_dt, off[2], li);
        return pair_sum{li, wi};
    }
    __device__ void finish(pair_sum s) const {
        if (reduction != KILN_REDUCTION_NONE)
            store_f64(loss, loss_dt, 0, reduction == KILN_REDUCTION_MEAN ? s.a / s.b : s.a);
        store_f64(total, total_dt, 0, s.b);
    }
};

} // namespace

namespace kiln_cuda {

kiln_status nll_loss_op(const kiln_op_args *a) {
    const kiln_strided *lp = &a->in[0], *tg = &a->in[1], *w = &a->in[2];
    const kiln_strided *loss = &a->out[0], *total = &a->out[1];
    const kiln_op_attrs *at = a->attrs;
    bool none = at->reduction == KILN_REDUCTION_NONE;
    if (tg->dtype != KILN_I64)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass i64 class indices", "CUDA nll_loss: target is %s",
                          kiln_dtype_name(tg->dtype));
    nll_item it;
    memset(&it, 0, sizeof it);
    it.l = make_nll_geom(lp, tg, none ? loss->strides : NULL);
    it.lp = lp->data;
    it.lp_dt = lp->dtype;
    it.target = (const int64_t *)tg->data;
    it.w = weight_of(w);
    it.ignore_index = at->ignore_index;
    it.eps = at->label_smoothing;
    it.reduction = (int)at->reduction;
    it.loss = loss->data;
    it.loss_dt = loss->dtype;
    it.total = total->data;
    it.total_dt = total->dtype;
    return launch_chunk_sum(it, it.l.pos.numel, a, "nll_loss kernel");
}

size_t nll_loss_workspace(const kiln_op_args *a) {
    int64_t n = element_count(&a->in[1]);
    int64_t chunks = chunks_for(n);
    return chunks > 1 ? (size_t)chunks * sizeof(pair_sum) : 0;
}

} // namespace kiln_cuda

namespace {

/* gx[i, c] = -scale_i * ((1 - eps) * w[t_i] * [c == t_i] + eps / C * w[c]),
 * scale_i = grad_i (none), grad (sum) or grad / W (mean); 0 where ignored. */
__global__ void nll_backward_kernel(nll_geom l, const void *g, kiln_dtype g_dt, const int64_t *target,
                                    weight_view w, const void *tw, kiln_dtype tw_dt, int64_t ignore_index,
                                    double eps, int reduction, void *gx, kiln_dtype gx_dt) {
    int64_t n = l.pos.numel * l.classes;
    for (int64_t e = global_thread(); e < n; e += global_stride()) {
        int64_t i = e / l.classes, c = e % l.classes;
        int64_t off[kMaxOperands];
        l.pos.offsets(i, off);
        int64_t t = target[off[0]];
        double v = 0;
        if (t != ignore_index) {
            if (t < 0 || t >= l.classes) {
                v = (double)NAN;
            } else {
                double div = reduction == KILN_REDUCTION_MEAN ? load_f64(tw, tw_dt, 0) : 1.0;
                double scale = load_f64(g, g_dt, off[2]) / div;
                v = eps / (double)l.classes * w.at(c);
                if (c == t) v += (1 - eps) * w.at(t);
                v *= -scale;
            }
        }
        store_f64(gx, gx_dt, off[1] + c * l.class_stride, v);
    }
}

/* ---- mse_loss --------------------------------------------------------------------------------- */

struct mse_item {
    geom g; /* operands: input, target, loss (none) */
    const void *x, *t;
    kiln_dtype x_dt, t_dt;
    void *y;
    kiln_dtype y_dt;
    int reduction;

    __device__ pair_sum operator()(int64_t i) const {
        int64_t off[kMaxOperands];
        g.offsets(i, off);
        double d = load_f64(x, x_dt, off[0]) - load_f64(t, t_dt, off[1]);
        if (reduction == KILN_REDUCTION_NONE) store_f64(y, y_dt, off[2], d * d);
        return pair_sum{d * d, 0.0};
    }
    __device__ void finish(pair_sum s) const {
        if (reduction != KILN_REDUCTION_NONE)
            store_f64(y, y_dt, 0, reduction == KILN_REDUCTION_MEAN ? s.a / (double)g.numel : s.a);
    }
};

} // namespace

namespace kiln_cuda {

kiln_status nll_loss_backward_op(const kiln_op_args *a) {
    const kiln_strided *g = &a->in[0], *tg = &a->in[1], *w = &a->in[2], *tw = &a->in[3];
    const kiln_strided *gx = &a->out[0];
    const kiln_op_attrs *at = a->attrs;
    bool none = at->reduction == KILN_REDUCTION_NONE;
    if (tg->dtype != KILN_I64)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass i64 class indices",
                          "CUDA nll_loss_backward: target is %s", kiln_dtype_name(tg->dtype));
    nll_geom l = make_nll_geom(gx, tg, none ? g->strides : NULL);
    int64_t n = l.pos.numel * l.classes;
    if (n == 0) return KILN_OK;
    device_guard guard;
    KILN_TRY(guard.enter(gx->data));
    auto *k = &nll_backward_kernel;
    KILN_LAUNCH(k, grid_for(n), kThreads, 0, a->stream, l, g->data, g->dtype, (const int64_t *)tg->data,
                weight_of(w), tw->data, tw->dtype, at->ignore_index, at->label_smoothing, (int)at->reduction,
                gx->data, gx->dtype);
    KILN_LAUNCH_CHECK(guard.device, "nll_backward_kernel");
    return KILN_OK;
}

kiln_status mse_loss_op(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *t = &a->in[1], *y = &a->out[0];
    bool none = a->attrs->reduction == KILN_REDUCTION_NONE;
    int64_t zeros[KILN_MAX_DIMS] = {0};
    const int64_t *sp[3] = {x->strides, t->strides, none ? y->strides : zeros};
    mse_item it;
    memset(&it, 0, sizeof it);
    it.g = make_geom(x->ndim, x->shape, 3, sp);
    it.x = x->data;
    it.t = t->data;
    it.x_dt = x->dtype;
    it.t_dt = t->dtype;
    it.y = y->data;
    it.y_dt = y->dtype;
    it.reduction = (int)a->attrs->reduction;
    if (none && it.g.numel == 0) return KILN_OK;
    return launch_chunk_sum(it, it.g.numel, a, "mse_loss kernel");
}

size_t mse_loss_workspace(const kiln_op_args *a) {
    int64_t chunks = chunks_for(element_count(&a->in[0]));
    return chunks > 1 ? (size_t)chunks * sizeof(pair_sum) : 0;
}

} // namespace kiln_cuda

/* The exported kernels (cuda_ops.h); src/ops/cuda_table_reduce_cuda.c
 * points the table at them. */
extern "C" kiln_status kiln_cuda_nll_loss(const kiln_op_args *a) { return kiln_cuda::nll_loss_op(a); }
extern "C" size_t kiln_cuda_nll_loss_workspace(const kiln_op_args *a) {
    return kiln_cuda::nll_loss_workspace(a);
}
extern "C" kiln_status kiln_cuda_nll_loss_backward(const kiln_op_args *a) {
    return kiln_cuda::nll_loss_backward_op(a);
}
extern "C" kiln_status kiln_cuda_mse_loss(const kiln_op_args *a) { return kiln_cuda::mse_loss_op(a); }
extern "C" size_t kiln_cuda_mse_loss_workspace(const kiln_op_args *a) {
    return kiln_cuda::mse_loss_workspace(a);
}

/* CUDA kernels of 2-d pooling (max with indices, average, adaptive
 * average) and their backwards. Inputs are (N, C, H, W) or (C, H, W) with
 * any strides. Values are computed in double, as the CPU kernels do, and
 * in the same order, so results match them bit for bit.
 *
 * Forward: one thread an output element. Backward: one thread an input
 * element, which sums, in (oh, ow) order, the contributions of the output
 * windows that contain it (a gather: no atomics, deterministic). Max
 * pooling's backward visits only the windows around its element (the
 * geometry comes from attrs, as kiln's autograd passes it); when attrs
 * carry no kernel size it scans the whole plane. An index outside the
 * plane contributes nothing (the CPU kernel raises; indices from
 * kiln_max_pool2d are always inside). */
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/nn_common.h"
#include "kernels/nn_geometry.h"

namespace {

using kiln_nn::ldf;
using kiln_nn::ldi;
using kiln_nn::stf;

/* A 3-d or 4-d strided tensor seen as (N, C, H, W). */
struct plane4 {
    int64_t shape[4], strides[4];
    KILN_HD int64_t off(int64_t n, int64_t c, int64_t h, int64_t w) const {
        return n * strides[0] + c * strides[1] + h * strides[2] + w * strides[3];
    }
    KILN_HD int64_t count() const { return shape[0] * shape[1] * shape[2] * shape[3]; }
    /* (n, c, h, w) of linear index i. */
    KILN_HD void at(int64_t i, int64_t *n, int64_t *c, int64_t *h, int64_t *w) const {
        *w = i % shape[3];
        i /= shape[3];
        *h = i % shape[2];
        i /= shape[2];
        *c = i % shape[1];
        *n = i / shape[1];
    }
};

plane4 as4(const kiln_strided *t) {
    plane4 p;
    int lead = 4 - t->ndim;
    for (int i = 0; i < 4; i++) {
        p.shape[i] = i < lead ? 1 : t->shape[i - lead];
        p.strides[i] = i < lead ? 0 : t->strides[i - lead];
    }
    return p;
}

struct pool_geom {
    int64_t kh, kw, sh, sw, ph, pw;
    bool count_include_pad;
};

pool_geom geom_of(const kiln_op_attrs *attrs) {
    kiln_pool_geom g = kiln_pool_geom_of(attrs);
    pool_geom r;
    r.kh = g.kernel[0], r.kw = g.kernel[1];
    r.sh = g.stride[0] > 0 ? g.stride[0] : 1, r.sw = g.stride[1] > 0 ? g.stride[1] : 1;
    r.ph = g.padding[0], r.pw = g.padding[1];
    r.count_include_pad = g.count_include_pad;
    return r;
}

#define GRID_STRIDE(i, total)                                                                                \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (total);                            \
         i += (int64_t)gridDim.x * blockDim.x)

/* relu: relu_max_pool2d, the window read through relu (NaN kept), so y
 * and the indices are max_pool2d's of relu(x). */
__global__ void max_pool_fwd(plane4 xp, const void *x, int xdt, plane4 yp, void *y, int ydt, plane4 ip,
                             int64_t *ix, pool_geom g, bool relu) {
    int64_t H = xp.shape[2], W = xp.shape[3];
    GRID_STRIDE(i, yp.count()) {
        int64_t n, c, oh, ow;
        yp.at(i, &n, &c, &oh, &ow);
        int64_t h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
        int64_t h1 = h0 + g.kh < H ? h0 + g.kh : H;
        int64_t w1 = w0 + g.kw < W ? w0 + g.kw : W;
        if (h0 < 0) h0 = 0;
        if (w0 < 0) w0 = 0;
        double best = -INFINITY;
        int64_t best_i = h0 * W + w0;
        for (int64_t h = h0; h < h1; h++)
            for (int64_t w = w0; w < w1; w++) {
                double v = ldf(x, xdt, xp.off(n, c, h, w));
                if (relu && !(v > 0 || v != v)) v = 0;
                if (v > best || v != v) best = v, best_i = h * W + w;
            }
        stf(y, ydt, yp.off(n, c, oh, ow), best);
        ix[ip.off(n, c, oh, ow)] = best_i;
    }
}

/* Output index range [lo, hi] of the windows (start o*s - p, size k) that
 * contain input coordinate h, clipped to [0, out). */
KILN_HD inline void window_range(int64_t h, int64_t k, int64_t s, int64_t p, int64_t out, int64_t *lo,
                                 int64_t *hi) {
    int64_t a = h + p - k + 1; /* o*s >= a */
    int64_t l = a <= 0 ? 0 : (a + s - 1) / s;
    int64_t u = (h + p) < 0 ? -1 : (h + p) / s;
    if (u > out - 1) u = out - 1;
    *lo = l;
    *hi = u;
}

/* y (relu_max_pool2d's backward; NULL for max_pool2d's): only the
 * gradients whose y > 0 are gathered. */
__global__ void max_pool_bwd(plane4 gp, const void *go, int gdt, plane4 ip, const void *ix, int idt,
                             plane4 dp, void *dx, int ddt, pool_geom g, bool windowed, plane4 yp,
                             const void *y, int ydt) {
    int64_t W = dp.shape[3], Ho = gp.shape[2], Wo = gp.shape[3];
    GRID_STRIDE(i, dp.count()) {
        int64_t n, c, h, w;
        dp.at(i, &n, &c, &h, &w);
        int64_t me = h * W + w;
        int64_t oh0 = 0, oh1 = Ho - 1, ow0 = 0, ow1 = Wo - 1;
        if (windowed) {
            window_range(h, g.kh, g.sh, g.ph, Ho, &oh0, &oh1);
            window_range(w, g.kw, g.sw, g.pw, Wo, &ow0, &ow1);
        }
        double acc = 0;
        for (int64_t oh = oh0; oh <= oh1; oh++)
            for (int64_t ow = ow0; ow <= ow1; ow++)
                if (ldi(ix, idt, ip.off(n, c, oh, ow)) == me && (!y || ldf(y, ydt, yp.off(n, c, oh, ow)) > 0))
                    acc += ldf(go, gdt, gp.off(n, c, oh, ow));
        stf(dx, ddt, dp.off(n, c, h, w), acc);
    }
}

/* sums[c] = dx's plane c summed over (n, h, w): one block a channel, each
 * thread a strided share in double, then a tree over shared memory (a
 * fixed order: the same bits every run). */
constexpr int kSumThreads = 256;
__global__ void channel_sum(plane4 dp, const void *dx, int ddt, void *sums, int sdt, int64_t s_stride) {
    __shared__ double part[kSumThreads];
    int64_t c = blockIdx.x, per = dp.shape[0] * dp.shape[2] * dp.shape[3], HW = dp.shape[2] * dp.shape[3];
    double acc = 0;
    for (int64_t i = threadIdx.x; i < per; i += blockDim.x)
        acc += ldf(dx, ddt, dp.off(i / HW, c, i % HW / dp.shape[3], i % dp.shape[3]));
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half /= 2) {
        if ((int)threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) stf(sums, sdt, c * s_stride, part[0]);
}

/* PyTorch's average window: clipped bounds and divisor (ops_pool.c). */
struct avg_window {
    int64_t h0, h1, w0, w1;
    double divisor;
};

KILN_HD inline avg_window window_of(const pool_geom &g, int64_t H, int64_t W, int64_t oh, int64_t ow) {
    avg_window r;
    int64_t h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
    int64_t h1 = h0 + g.kh, w1 = w0 + g.kw;
    if (h1 > H + g.ph) h1 = H + g.ph;
    if (w1 > W + g.pw) w1 = W + g.pw;
    int64_t pool_size = (h1 - h0) * (w1 - w0);
    r.h0 = h0 < 0 ? 0 : h0, r.w0 = w0 < 0 ? 0 : w0;
    r.h1 = h1 > H ? H : h1, r.w1 = w1 > W ? W : w1;
    r.divisor = (double)(g.count_include_pad ? pool_size : (r.h1 - r.h0) * (r.w1 - r.w0));
    return r;
}

__global__ void avg_pool_fwd(plane4 xp, const void *x, int xdt, plane4 yp, void *y, int ydt, pool_geom g) {
    GRID_STRIDE(i, yp.count()) {
        int64_t n, c, oh, ow;
        yp.at(i, &n, &c, &oh, &ow);
        avg_window r = window_of(g, xp.shape[2], xp.shape[3], oh, ow);
        double s = 0;
        for (int64_t h = r.h0; h < r.h1; h++)
            for (int64_t w = r.w0; w < r.w1; w++) s += ldf(x, xdt, xp.off(n, c, h, w));
        stf(y, ydt, yp.off(n, c, oh, ow), s / r.divisor);
    }
}

__global__ void avg_pool_bwd(plane4 gp, const void *go, int gdt, plane4 dp, void *dx, int ddt, pool_geom g) {
    int64_t H = dp.shape[2], W = dp.shape[3], Ho = gp.shape[2], Wo = gp.shape[3];
    GRID_STRIDE(i, dp.count()) {
        int64_t n, c, h, w;
        dp.at(i, &n, &c, &h, &w);
        int64_t oh0, oh1, ow0, ow1;
        window_range(h, g.kh, g.sh, g.ph, Ho, &oh0, &oh1);
        window_range(w, g.kw, g.sw, g.pw, Wo, &ow0, &ow1);
        double acc = 0;
        for (int64_t oh = oh0; oh <= oh1; oh++)
            for (int64_t ow = ow0; ow <= ow1; ow++) {
                avg_window r = window_of(g, H, W, oh, ow);
                if (h < r.h0 || h >= r.h1 || w < r.w0 || w >= r.w1) continue;
                acc += ldf(go, gdt, gp.off(n, c, oh, ow)) / r.divisor;
            }
        stf(dx, ddt, dp.off(n, c, h, w), acc);
    }
}

KILN_HD inline int64_t adaptive_start(int64_t i, int64_t out, int64_t in) { return (i * in) / out; }
KILN_HD inline int64_t adaptive_end(int64_t i, int64_t out, int64_t in) {
    return ((i + 1) * in + out - 1) / out;
}

__global__ void adaptive_fwd(plane4 xp, const void *x, int xdt, plane4 yp, void *y, int ydt) {
    int64_t H = xp.shape[2], W = xp.shape[3], Ho = yp.shape[2], Wo = yp.shape[3];
    GRID_STRIDE(i, yp.count()) {
        int64_t n, c, oh, ow;
        yp.at(i, &n, &c, &oh, &ow);
        int64_t h0 = adaptive_start(oh, Ho, H), h1 = adaptive_end(oh, Ho, H);
        int64_t w0 = adaptive_start(ow, Wo, W), w1 = adaptive_end(ow, Wo, W);
        double s = 0;
        for (int64_t h = h0; h < h1; h++)
            for (int64_t w = w0; w < w1; w++) s += ldf(x, xdt, xp.off(n, c, h, w));
        stf(y, ydt, yp.off(n, c, oh, ow), s / (double)((h1 - h0) * (w1 - w0)));
    }
}

__global__ void adaptive_bwd(plane4 gp, const void *go, int gdt, plane4 dp, void *dx, int ddt) {
    int64_t H = dp.shape[2], W = dp.shape[3], Ho = gp.shape[2], Wo = gp.shape[3];
    GRID_STRIDE(i, dp.count()) {
        int64_t n, c, h, w;
        dp.at(i, &n, &c, &h, &w);
        double acc = 0;
        /* bins containing h: start(oh) <= h < end(oh); start is nondecreasing */
        for (int64_t oh = H ? (h * Ho) / H : 0; oh < Ho && adaptive_start(oh, Ho, H) <= h; oh++) {
            int64_t h0 = adaptive_start(oh, Ho, H), h1 = adaptive_end(oh, Ho, H);
            if (h < h0 || h >= h1) continue;
            for (int64_t ow = W ? (w * Wo) / W : 0; ow < Wo && adaptive_start(ow, Wo, W) <= w; ow++) {
                int64_t w0 = adaptive_start(ow, Wo, W), w1 = adaptive_end(ow, Wo, W);
                if (w < w0 || w >= w1) continue;
                acc += ldf(go, gdt, gp.off(n, c, oh, ow)) / (double)((h1 - h0) * (w1 - w0));
            }
        }
        stf(dx, ddt, dp.off(n, c, h, w), acc);
    }
}

kiln_status max_pool_forward_run(const kiln_op_args *a, bool relu) {
    const kiln_strided *x = &a->in[0], *y = &a->out[0], *ix = &a->out[1];
    plane4 xp = as4(x), yp = as4(y), ip = as4(ix);
    if (yp.count() == 0) return KILN_OK;
    kiln_cuda::device_guard guard;
    KILN_TRY(guard.enter(y->data));
    KILN_LAUNCH(max_pool_fwd, kiln_nn::blocks_for(yp.count()), kiln_nn::kThreads, 0, a->stream, xp,
                (const void *)x->data, (int)x->dtype, yp, y->data, (int)y->dtype, ip, (int64_t *)ix->data,
                geom_of(a->attrs), relu);
    KILN_LAUNCH_CHECK(guard.device, relu ? "relu_max_pool2d (max_pool_fwd)" : "max_pool2d (max_pool_fwd)");
    return KILN_OK;
}

kiln_status run_max_pool2d(const kiln_op_args *a) { return max_pool_forward_run(a, false); }

kiln_status run_relu_max_pool2d(const kiln_op_args *a) { return max_pool_forward_run(a, true); }

/* y: relu_max_pool2d_backward's forward output, or NULL. */
kiln_status max_pool_backward_run(const kiln_op_args *a, const kiln_strided *go, const kiln_strided *y,
                                  const kiln_strided *ix, const char *what) {
    const kiln_strided *dx = &a->out[0];
    plane4 gp = as4(go), ip = as4(ix), dp = as4(dx), yp = y ? as4(y) : gp;
    if (dp.count() == 0) return KILN_OK;
    kiln_cuda::device_guard guard;
    KILN_TRY(guard.enter(dx->data));
    pool_geom g = geom_of(a->attrs);
    bool windowed = g.kh > 0 && g.kw > 0;
    KILN_LAUNCH(max_pool_bwd, kiln_nn::blocks_for(dp.count()), kiln_nn::kThreads, 0, a->stream, gp,
                (const void *)go->data, (int)go->dtype, ip, (const void *)ix->data, (int)ix->dtype, dp,
                dx->data, (int)dx->dtype, g, windowed, yp, y ? (const void *)y->data : (const void *)nullptr,
                y ? (int)y->dtype : 0);
    KILN_LAUNCH_CHECK(guard.device, what);
    return KILN_OK;
}

kiln_status run_max_pool2d_backward(const kiln_op_args *a) {
    return max_pool_backward_run(a, &a->in[0], nullptr, &a->in[1], "max_pool2d_backward (max_pool_bwd)");
}

/* (grad_out, y, indices): relu's backward and max pooling's in one gather. */
kiln_status run_relu_max_pool2d_backward(const kiln_op_args *a) {
    return max_pool_backward_run(a, &a->in[0], &a->in[1], &a->in[2],
                                 "relu_max_pool2d_backward (max_pool_bwd)");
}

/* relu_max_pool2d_backward, then each channel's sum of grad_input. */
kiln_status run_relu_max_pool2d_backward_sum(const kiln_op_args *a) {
    KILN_TRY(run_relu_max_pool2d_backward(a));
    const kiln_strided *dx = &a->out[0], *sums = &a->out[1];
    plane4 dp = as4(dx);
    if (dp.shape[1] == 0) return KILN_OK;
    kiln_cuda::device_guard guard;
    KILN_TRY(guard.enter(dx->data));
    KILN_LAUNCH(channel_sum, (unsigned)dp.shape[1], kSumThreads, 0, a->stream, dp, (const void *)dx->data,
                (int)dx->dtype, sums->data, (int)sums->dtype, sums->strides[0]);
    KILN_LAUNCH_CHECK(guard.device, "relu_max_pool2d_backward_sum (channel_sum)");
    return KILN_OK;
}

kiln_status run_avg_pool2d(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *y = &a->out[0];
    plane4 xp = as4(x), yp = as4(y);
    if (yp.count() == 0) return KILN_OK;
    kiln_cuda::device_guard guard;
    KILN_TRY(guard.enter(y->data));
    KILN_LAUNCH(avg_pool_fwd, kiln_nn::blocks_for(yp.count()), kiln_nn::kThreads, 0, a->stream, xp,
                (const void *)x->data, (int)x->dtype, yp, y->data, (int)y->dtype, geom_of(a->attrs));
    KILN_LAUNCH_CHECK(guard.device, "avg_pool2d (avg_pool_fwd)");
    return KILN_OK;
}

kiln_status run_avg_pool2d_backward(const kiln_op_args *a) {
    const kiln_strided *go = &a->in[0], *dx = &a->out[0];
    plane4 gp = as4(go), dp = as4(dx);
    if (dp.count() == 0) return KILN_OK;
    kiln_cuda::device_guard guard;
    KILN_TRY(guard.enter(dx->data));
    KILN_LAUNCH(avg_pool_bwd, kiln_nn::blocks_for(dp.count()), kiln_nn::kThreads, 0, a->stream, gp,
                (const void *)go->data, (int)go->dtype, dp, dx->data, (int)dx->dtype, geom_of(a->attrs));
    KILN_LAUNCH_CHECK(guard.device, "avg_pool2d_backward (avg_pool_bwd)");
    return KILN_OK;
}

kiln_status run_adaptive_avg_pool2d(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *y = &a->out[0];
    plane4 xp = as4(x), yp = as4(y);
    if (yp.count() == 0) return KILN_OK;
    kiln_cuda::device_guard guard;
    KILN_TRY(guard.enter(y->data));
    KILN_LAUNCH(adaptive_fwd, kiln_nn::blocks_for(yp.count()), kiln_nn::kThreads, 0, a->stream, xp,
                (const void *)x->data, (int)x->dtype, yp, y->data, (int)y->dtype);
    KILN_LAUNCH_CHECK(guard.device, "adaptive_avg_pool2d (adaptive_fwd)");
    return KILN_OK;
}

kiln_status run_adaptive_avg_pool2d_backward(const kiln_op_args *a) {
    const kiln_strided *go = &a->in[0], *dx = &a->out[0];
    plane4 gp = as4(go), dp = as4(dx);
    if (dp.count() == 0) return KILN_OK;
    kiln_cuda::device_guard guard;
    KILN_TRY(guard.enter(dx->data));
    KILN_LAUNCH(adaptive_bwd, kiln_nn::blocks_for(dp.count()), kiln_nn::kThreads, 0, a->stream, gp,
                (const void *)go->data, (int)go->dtype, dp, dx->data, (int)dx->dtype);
    KILN_LAUNCH_CHECK(guard.device, "adaptive_avg_pool2d_backward (adaptive_bwd)");
    return KILN_OK;
}

} // namespace

/* The exported kernels (cuda_ops.h); src/ops/cuda_table_nn_cuda.c points
 * the table at them. */
extern "C" kiln_status kiln_cuda_max_pool2d(const kiln_op_args *a) { return run_max_pool2d(a); }
extern "C" kiln_status kiln_cuda_max_pool2d_backward(const kiln_op_args *a) {
    return run_max_pool2d_backward(a);
}
extern "C" kiln_status kiln_cuda_relu_max_pool2d(const kiln_op_args *a) { return run_relu_max_pool2d(a); }
extern "C" kiln_status kiln_cuda_relu_max_pool2d_backward(const kiln_op_args *a) {
    return run_relu_max_pool2d_backward(a);
}
extern "C" kiln_status kiln_cuda_relu_max_pool2d_backward_sum(const kiln_op_args *a) {
    return run_relu_max_pool2d_backward_sum(a);
}
extern "C" kiln_status kiln_cuda_avg_pool2d(const kiln_op_args *a) { return run_avg_pool2d(a); }
extern "C" kiln_status kiln_cuda_avg_pool2d_backward(const kiln_op_args *a) {
    return run_avg_pool2d_backward(a);
}
extern "C" kiln_status kiln_cuda_adaptive_avg_pool2d(const kiln_op_args *a) {
    return run_adaptive_avg_pool2d(a);
}
extern "C" kiln_status kiln_cuda_adaptive_avg_pool2d_backward(const kiln_op_args *a) {
    return run_adaptive_avg_pool2d_backward(a);
}

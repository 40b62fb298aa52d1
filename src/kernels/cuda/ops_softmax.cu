/* CUDA kernels for softmax and log_softmax along attrs.dims[0] and their
 * backward ops (reduce group; exported through cuda_ops.h). Semantics of
 * the CPU reference (kernels/cpu/ops_softmax.c):
 *
 *   softmax      y = exp(x - m) / s,        m = max x (NaN wins), s = sum exp(x - m)
 *   log_softmax  y = x - m - log(s)
 *   softmax backward      gx = y * (g - sum(g * y))
 *   log_softmax backward  gx = g - exp(y) * sum(g)
 *
 * One block per row (a row = the elements along the dim; any strides, the
 * other dims walked by a merged geometry), as many threads as the row
 * needs up to 256 (a multiple of 32); rows of at most 32 elements take one
 * thread each. Exponentials in the compute type
 * (float for f32/f16/bf16, double for f64); the row sums accumulate in
 * double through a fixed tree (cuda_dtype.h's block_reduce), so results
 * repeat bit for bit. A row of -inf gives NaN, as on the CPU. */
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_dtype.h"
#include "kernels/cuda/cuda_ops.h"

namespace {

using namespace kiln_cuda;

/* A row layout: outer walks every dim but `dim` for up to three tensors of
 * one shape, len and step[k] describe the row. A 0-dim tensor is one row
 * of length 1. */
struct rows {
    geom outer;
    int64_t len;
    int64_t step[3];
};

rows make_rows(const kiln_strided *shape_of, int dim, int n, const kiln_strided *const *v) {
    rows r;
    memset(&r, 0, sizeof r);
    int nd = shape_of->ndim;
    int64_t shape[KILN_MAX_DIMS];
    int64_t st[3][KILN_MAX_DIMS];
    int on = 0;
    r.len = 1;
    if (nd > 0) dim = ((dim % nd) + nd) % nd;
    for (int d = 0; d < nd; d++) {
        if (d == dim) {
            r.len = shape_of->shape[d];
            for (int k = 0; k < n; k++) r.step[k] = v[k]->strides[d];
            continue;
        }
        shape[on] = shape_of->shape[d];
        for (int k = 0; k < n; k++) st[k][on] = v[k]->strides[d];
        on++;
    }
    const int64_t *sp[3] = {st[0], st[1], st[2]};
    r.outer = make_geom(on, shape, n, sp);
    return r;
}

struct add_op {
    KILN_HD double operator()(double a, double b) const { return a + b; }
};
struct max_nan_op {
    KILN_HD double operator()(double a, double b) const {
        if (a != a) return a;
        if (b != b) return b;
        return b > a ? b : a;
    }
};

unsigned row_threads(int64_t len) {
    if (len >= kThreads) return (unsigned)kThreads;
    int64_t t = (len + 31) / 32 * 32;
    return (unsigned)(t < 32 ? 32 : t);
}

template <int D> __global__ void softmax_kernel(const void *x, void *y, rows r, int log_form) {
    typedef dt<D> T;
    typedef typename T::C C;
    KILN_DYNAMIC_SHARED(double, sh);
    for (int64_t row = blockIdx.x; row < r.outer.numel; row += gridDim.x) {
        int64_t off[kMaxOperands];
        r.outer.offsets(row, off);
        int64_t xo = off[0], yo = off[1];
        double m = -INFINITY;
        for (int64_t j = threadIdx.x; j < r.len; j += blockDim.x) {
            double v = T::ld_f64(x, xo + j * r.step[0]);
            if (v > m || v != v) m = v;
        }
        m = block_reduce(sh, m, max_nan_op());
        C mc = (C)m;
        double s = 0;
        for (int64_t j = threadIdx.x; j < r.len; j += blockDim.x)
            s += (double)m_exp(T::ld(x, xo + j * r.step[0]) - mc);
        s = block_reduce(sh, s, add_op());
        double ls = log(s);
        for (int64_t j = threadIdx.x; j < r.len; j += blockDim.x) {
            C v = T::ld(x, xo + j * r.step[0]) - mc;
            T::st_f64(y, yo + j * r.step[1], log_form ? (double)v - ls : (double)m_exp(v) / s);
        }
    }
}

template <int D>
__global__ void softmax_backward_kernel(const void *g, const void *y, void *gx, rows r, int log_form) {
    typedef dt<D> T;
    typedef typename T::C C;
    KILN_DYNAMIC_SHARED(double, sh);
    for (int64_t row = blockIdx.x; row < r.outer.numel; row += gridDim.x) {
        int64_t off[kMaxOperands];
        r.outer.offsets(row, off);
        int64_t go = off[0], yo = off[1], oo = off[2];
        double s = 0;
        for (int64_t j = threadIdx.x; j < r.len; j += blockDim.x) {
            double gv = T::ld_f64(g, go + j * r.step[0]);
            s += log_form ? gv : gv * T::ld_f64(y, yo + j * r.step[1]);
        }
        s = block_reduce(sh, s, add_op());
        for (int64_t j = threadIdx.x; j < r.len; j += blockDim.x) {
            double gv = T::ld_f64(g, go + j * r.step[0]);
            C yc = T::ld(y, yo + j * r.step[1]);
            double v = log_form ? gv - (double)m_exp(yc) * s : (double)yc * (gv - s);
            T::st_f64(gx, oo + j * r.step[2], v);
        }
    }
}

/* Rows of at most kShortRow elements: one thread per row, in order (the
 * same sums as a block would give up to rounding; a block per row would
 * leave most of its threads idle). */
constexpr int64_t kShortRow = 32;

template <int D> __global__ void softmax_short_kernel(const void *x, void *y, rows r, int log_form) {
    typedef dt<D> T;
    typedef typename T::C C;
    for (int64_t row = global_thread(); row < r.outer.numel; row += global_stride()) {
        int64_t off[kMaxOperands];
        r.outer.offsets(row, off);
        int64_t xo = off[0], yo = off[1];
        double m = -INFINITY;
        for (int64_t j = 0; j < r.len; j++) {
            double v = T::ld_f64(x, xo + j * r.step[0]);
            if (v > m || v != v) m = v;
        }
        C mc = (C)m;
        double s = 0;
        for (int64_t j = 0; j < r.len; j++) s += (double)m_exp(T::ld(x, xo + j * r.step[0]) - mc);
        double ls = log(s);
        for (int64_t j = 0; j < r.len; j++) {
            C v = T::ld(x, xo + j * r.step[0]) - mc;
            T::st_f64(y, yo + j * r.step[1], log_form ? (double)v - ls : (double)m_exp(v) / s);
        }
    }
}

template <int D>
__global__ void softmax_backward_short_kernel(const void *g, const void *y, void *gx, rows r, int log_form) {
    typedef dt<D> T;
    typedef typename T::C C;
    for (int64_t row = global_thread(); row < r.outer.numel; row += global_stride()) {
        int64_t off[kMaxOperands];
        r.outer.offsets(row, off);
        int64_t go = off[0], yo = off[1], oo = off[2];
        double s = 0;
        for (int64_t j = 0; j < r.len; j++) {
            double gv = T::ld_f64(g, go + j * r.step[0]);
            s += log_form ? gv : gv * T::ld_f64(y, yo + j * r.step[1]);
        }
        for (int64_t j = 0; j < r.len; j++) {
            double gv = T::ld_f64(g, go + j * r.step[0]);
            C yc = T::ld(y, yo + j * r.step[1]);
            double v = log_form ? gv - (double)m_exp(yc) * s : (double)yc * (gv - s);
            T::st_f64(gx, oo + j * r.step[2], v);
        }
    }
}

template <int D> kiln_status run_softmax(const kiln_op_args *a, int log_form) {
    const kiln_strided *v[2] = {&a->out[0], &a->in[0]};
    const kiln_strided *xy[2] = {&a->in[0], &a->out[0]};
    rows r = make_rows(v[0], a->attrs->dims[0], 2, xy);
    if (r.outer.numel == 0 || r.len == 0) return KILN_OK;
    device_guard guard;
    KILN_TRY(guard.enter(a->out[0].data));
    if (r.len <= kShortRow) {
        auto *k = &softmax_short_kernel<D>;
        KILN_LAUNCH(k, grid_for(r.outer.numel), kThreads, 0, a->stream, a->in[0].data, a->out[0].data, r,
                    log_form);
        KILN_LAUNCH_CHECK(guard.device, "softmax_short_kernel");
        return KILN_OK;
    }
    unsigned threads = row_threads(r.len);
    unsigned blocks = (unsigned)(r.outer.numel < 65535 ? r.outer.numel : 65535);
    auto *k = &softmax_kernel<D>;
    KILN_LAUNCH(k, blocks, threads, threads * sizeof(double), a->stream, a->in[0].data, a->out[0].data, r,
                log_form);
    KILN_LAUNCH_CHECK(guard.device, "softmax_kernel");
    return KILN_OK;
}

template <int D> kiln_status run_softmax_backward(const kiln_op_args *a, int log_form) {
    const kiln_strided *v[3] = {&a->in[0], &a->in[1], &a->out[0]};
    rows r = make_rows(&a->out[0], a->attrs->dims[0], 3, v);
    if (r.outer.numel == 0 || r.len == 0) return KILN_OK;
    device_guard guard;
    KILN_TRY(guard.enter(a->out[0].data));
    if (r.len <= kShortRow) {
        auto *k = &softmax_backward_short_kernel<D>;
        KILN_LAUNCH(k, grid_for(r.outer.numel), kThreads, 0, a->stream, a->in[0].data, a->in[1].data,
                    a->out[0].data, r, log_form);
        KILN_LAUNCH_CHECK(guard.device, "softmax_backward_short_kernel");
        return KILN_OK;
    }
    unsigned threads = row_threads(r.len);
    unsigned blocks = (unsigned)(r.outer.numel < 65535 ? r.outer.numel : 65535);
    auto *k = &softmax_backward_kernel<D>;
    KILN_LAUNCH(k, blocks, threads, threads * sizeof(double), a->stream, a->in[0].data, a->in[1].data,
                a->out[0].data, r, log_form);
    KILN_LAUNCH_CHECK(guard.device, "softmax_backward_kernel");
    return KILN_OK;
}

kiln_status softmax_dispatch(const kiln_op_args *a, int log_form, bool backward) {
    kiln_dtype d = a->out[0].dtype;
    switch (d) {
    case KILN_F32:
        return backward ? run_softmax_backward<KILN_F32>(a, log_form) : run_softmax<KILN_F32>(a, log_form);
    case KILN_F64:
        return backward ? run_softmax_backward<KILN_F64>(a, log_form) : run_softmax<KILN_F64>(a, log_form);
    case KILN_F16:
        return backward ? run_softmax_backward<KILN_F16>(a, log_form) : run_softmax<KILN_F16>(a, log_form);
    case KILN_BF16:
        return backward ? run_softmax_backward<KILN_BF16>(a, log_form) : run_softmax<KILN_BF16>(a, log_form);
    default:
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "use a floating dtype", "CUDA softmax kernel: dtype %s",
                          kiln_dtype_name(d));
    }
}

} // namespace

namespace kiln_cuda {
kiln_status softmax_op(const kiln_op_args *a) { return softmax_dispatch(a, 0, false); }
kiln_status log_softmax_op(const kiln_op_args *a) { return softmax_dispatch(a, 1, false); }
kiln_status softmax_backward_op(const kiln_op_args *a) { return softmax_dispatch(a, 0, true); }
kiln_status log_softmax_backward_op(const kiln_op_args *a) { return softmax_dispatch(a, 1, true); }
} // namespace kiln_cuda

/* The exported kernels (cuda_ops.h); src/ops/cuda_table_reduce_cuda.c
 * points the table at them. */
extern "C" kiln_status kiln_cuda_softmax(const kiln_op_args *a) { return kiln_cuda::softmax_op(a); }
extern "C" kiln_status kiln_cuda_log_softmax(const kiln_op_args *a) { return kiln_cuda::log_softmax_op(a); }
extern "C" kiln_status kiln_cuda_softmax_backward(const kiln_op_args *a) {
    return kiln_cuda::softmax_backward_op(a);
}
extern "C" kiln_status kiln_cuda_log_softmax_backward(const kiln_op_args *a) {
    return kiln_cuda::log_softmax_backward_op(a);
}

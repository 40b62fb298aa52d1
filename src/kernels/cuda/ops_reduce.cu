/* CUDA kernels of the reduce op group (cuda_ops.h): sum, mean, amax, amin,
 * argmax and norm over attrs.dims (n_dims 0: every dim), keepdim, on any
 * strides. Softmax, the losses and the matrix products of the group live
 * in ops_softmax.cu, ops_loss.cu and ops_gemm.cu (all declared in
 * cuda_ops.h).
 *
 * Semantics are those of the CPU reference kernels (kernels/cpu/
 * ops_reduce.c): floating inputs accumulate in double, integer sums in
 * int64 (wrapping); amax/amin propagate NaN; argmax gives the flat
 * row-major index (within the reduced dims) of the first maximum, a NaN
 * counting as the maximum; norm's p = attrs.scalar[0] (inf / -inf: max /
 * min of |x|, 0: count of non-zeros); mean of nothing is NaN.
 *
 * Determinism: no atomics. Each output is reduced in a fixed order that
 * depends only on the shapes: one thread per output for short reductions
 * (or many outputs along a contiguous dim), else one block per (output,
 * chunk) with a fixed tree in shared memory, and when one output is split
 * into chunks (long reductions with few outputs), the chunks' partial
 * results go to the workspace and a second kernel combines them in chunk
 * order. The same inputs give the same bits on every run. */
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_dtype.h"
#include "kernels/cuda/cuda_ops.h"

namespace {

using namespace kiln_cuda;

/* ---- Plan --------------------------------------------------------------------------------- */

/* The reduction layout: outer walks the kept dims (input and output
 * strides), inner the reduced dims (input strides) in row-major order, so
 * the inner flat index is argmax's index. Size-1 dims dropped, mergeable
 * neighbours merged. */
struct red_geom {
    int on, rn;
    int64_t oshape[KILN_MAX_DIMS], o_in[KILN_MAX_DIMS], o_out[KILN_MAX_DIMS];
    int64_t rshape[KILN_MAX_DIMS], r_in[KILN_MAX_DIMS];
    int64_t n_out, n_red;

    KILN_HD void outer(int64_t i, int64_t *in_off, int64_t *out_off) const {
        int64_t a = 0, b = 0;
        for (int d = on - 1; d >= 0; d--) {
            int64_t c = i % oshape[d];
            i /= oshape[d];
            a += c * o_in[d];
            b += c * o_out[d];
        }
        *in_off = a;
        *out_off = b;
    }
    /* The input offset of inner index r (0 <= r < n_red). Called once per
     * element, so its divisions are most of a small reduction's time (64-bit
     * ones cost several times 32-bit ones on GPUs): 32-bit where n_red fits,
     * and none for the outermost reduced dim, whose index is what is left. */
    KILN_HD int64_t inner(int64_t r) const {
        if (rn == 0) return 0;
        int64_t a = 0;
        if (idx32) {
            uint32_t q = (uint32_t)r;
            for (int d = rn - 1; d > 0; d--) {
                uint32_t n = (uint32_t)rshape[d];
                a += (int64_t)(q % n) * r_in[d];
                q /= n;
            }
            return a + (int64_t)q * r_in[0];
        }
        for (int d = rn - 1; d > 0; d--) {
            a += (r % rshape[d]) * r_in[d];
            r /= rshape[d];
        }
        return a + r * r_in[0];
    }
    bool idx32; /* n_red < 2^31: inner's index arithmetic in 32 bits */
};

/* How the work is spread (a function of the shapes only). */
struct red_plan {
    red_geom g;
    bool per_thread;   /* one thread per output */
    unsigned threads;  /* block size of the block path */
    int64_t chunks;    /* chunks per output (block path) */
    int64_t chunk_len; /* reduced elements per chunk */
};

constexpr size_t kPartialBytes = 16; /* room for any accumulator (argmax's value and index) */

red_plan make_plan(const kiln_strided *in, const kiln_strided *out, const kiln_op_attrs *at) {
    red_plan p;
    memset(&p, 0, sizeof p);
    red_geom &g = p.g;
    bool red[KILN_MAX_DIMS] = {false};
    int nd = in->ndim;
    if (at->n_dims == 0) {
        for (int d = 0; d < nd; d++) red[d] = true;
    } else {
        for (int i = 0; i < at->n_dims && nd > 0; i++) red[((at->dims[i] % nd) + nd) % nd] = true;
    }
    g.n_out = 1;
    g.n_red = 1;
    int j = 0; /* output dim */
    for (int d = 0; d < nd; d++) {
        int64_t n = in->shape[d];
        if (red[d]) {
            if (at->keepdim) j++;
            g.n_red *= n;
            if (n == 1) continue;
            if (g.rn > 0 && g.r_in[g.rn - 1] == in->strides[d] * n) {
                g.rshape[g.rn - 1] *= n;
                g.r_in[g.rn - 1] = in->strides[d];
            } else {
                g.rshape[g.rn] = n;
                g.r_in[g.rn] = in->strides[d];
                g.rn++;
            }
        } else {
            int64_t os = out->strides[j++];
            g.n_out *= n;
            if (n == 1) continue;
            if (g.on > 0 && g.o_in[g.on - 1] == in->strides[d] * n && g.o_out[g.on - 1] == os * n) {
                g.oshape[g.on - 1] *= n;
                g.o_in[g.on - 1] = in->strides[d];
                g.o_out[g.on - 1] = os;
            } else {
                g.oshape[g.on] = n;
                g.o_in[g.on] = in->strides[d];
                g.o_out[g.on] = os;
                g.on++;
            }
        }
    }
    g.idx32 = g.n_red < (INT64_C(1) << 31);
    /* Many outputs along an input-contiguous kept dim: a thread per output
     * reads neighbouring elements in step with its neighbours. */
    bool contiguous_outputs = g.on > 0 && g.o_in[g.on - 1] == 1;
    p.per_thread = g.n_red <= 32 || g.n_out == 0 || (contiguous_outputs && g.n_out >= 8192);
    if (p.per_thread) return p;
    p.threads = (unsigned)kThreads;
    if (g.n_red < kThreads) p.threads = (unsigned)((g.n_red + 31) / 32 * 32);
    p.chunks = 1;
    if (g.n_out < 256) {
        int64_t by_len = (g.n_red + 16383) / 16384;
        int64_t by_out = (512 + g.n_out - 1) / g.n_out;
        p.chunks = by_len < by_out ? by_len : by_out;
        if (p.chunks < 1) p.chunks = 1;
    }
    p.chunk_len = (g.n_red + p.chunks - 1) / p.chunks;
    p.chunks = (g.n_red + p.chunk_len - 1) / p.chunk_len;
    return p;
}

size_t reduce_workspace(const kiln_op_args *a) {
    red_plan p = make_plan(&a->in[0], &a->out[0], a->attrs);
    if (p.per_thread || p.chunks <= 1) return 0;
    return (size_t)(p.g.n_out * p.chunks) * kPartialBytes;
}

/* ---- Reducers ----------------------------------------------------------------------------
 * A reducer R has an accumulator type A, identity(), item(value, r) for
 * the value at inner index r, operator()(a, b) combining two accumulators
 * (a before b in reduction order), and finish(out, dtype, offset, acc,
 * n_red) storing the result. V is the value type loaded (double for
 * floating inputs, int64 for integer ones). */

struct sum_f {
    typedef double A;
    KILN_HD A identity() const { return 0.0; }
    KILN_HD A item(double v, int64_t) const { return v; }
    KILN_HD A operator()(A a, A b) const { return a + b; }
    KILN_HD void finish(void *o, kiln_dtype d, int64_t off, A acc, int64_t) const {
        store_f64(o, d, off, acc);
    }
};

struct sum_i {
    typedef int64_t A;
    KILN_HD A identity() const { return 0; }
    KILN_HD A item(int64_t v, int64_t) const { return v; }
    KILN_HD A operator()(A a, A b) const { return (int64_t)((uint64_t)a + (uint64_t)b); }
    KILN_HD void finish(void *o, kiln_dtype d, int64_t off, A acc, int64_t) const {
        store_i64(o, d, off, acc);
    }
};

struct mean_f {
    typedef double A;
    KILN_HD A identity() const { return 0.0; }
    KILN_HD A item(double v, int64_t) const { return v; }
    KILN_HD A operator()(A a, A b) const { return a + b; }
    KILN_HD void finish(void *o, kiln_dtype d, int64_t off, A acc, int64_t n) const {
        store_f64(o, d, off, n ? acc / (double)n : (double)NAN);
    }
};

/* amax (sign 1) / amin (sign -1); NaN wins. */
struct extreme_f {
    int sign;
    typedef double A;
    KILN_HD A identity() const { return sign > 0 ? -INFINITY : INFINITY; }
    KILN_HD A item(double v, int64_t) const { return v; }
    KILN_HD A operator()(A a, A b) const {
        if (a != a) return a;
        if (b != b) return b;
        return (sign > 0 ? b > a : b < a) ? b : a;
    }
    KILN_HD void finish(void *o, kiln_dtype d, int64_t off, A acc, int64_t) const {
        store_f64(o, d, off, acc);
    }
};

struct extreme_i {
    int sign;
    typedef int64_t A;
    KILN_HD A identity() const { return sign > 0 ? INT64_MIN : INT64_MAX; }
    KILN_HD A item(int64_t v, int64_t) const { return v; }
    KILN_HD A operator()(A a, A b) const { return (sign > 0 ? b > a : b < a) ? b : a; }
    KILN_HD void finish(void *o, kiln_dtype d, int64_t off, A acc, int64_t) const {
        store_i64(o, d, off, acc);
    }
};

template <class V> struct arg_acc {
    V v;
    int64_t i;
};

/* The first maximum; a NaN is the maximum (the first NaN wins). The
 * identity has index INT64_MAX, so any element beats it on a tie. */
struct argmax_f {
    typedef arg_acc<double> A;
    KILN_HD A identity() const { return A{-INFINITY, INT64_MAX}; }
    KILN_HD A item(double v, int64_t r) const { return A{v, r}; }
    KILN_HD A operator()(A a, A b) const {
        bool an = a.v != a.v, bn = b.v != b.v;
        if (an || bn) {
            if (an && bn) return a.i <= b.i ? a : b;
            return an ? a : b;
        }
        if (a.v != b.v) return a.v > b.v ? a : b;
        return a.i <= b.i ? a : b;
    }
    KILN_HD void finish(void *o, kiln_dtype, int64_t off, A acc, int64_t) const {
        ((int64_t *)o)[off] = acc.i;
    }
};

struct argmax_i {
    typedef arg_acc<int64_t> A;
    KILN_HD A identity() const { return A{INT64_MIN, INT64_MAX}; }
    KILN_HD A item(int64_t v, int64_t r) const { return A{v, r}; }
    KILN_HD A operator()(A a, A b) const {
        if (a.v != b.v) return a.v > b.v ? a : b;
        return a.i <= b.i ? a : b;
    }
    KILN_HD void finish(void *o, kiln_dtype, int64_t off, A acc, int64_t) const {
        ((int64_t *)o)[off] = acc.i;
    }
};

/* p-norm. mode: 0 sum of |x|^p, 1 |x| (p = 1), 2 |x|^2 (p = 2), 3 count of
 * non-zeros (p = 0), 4 max |x| (p = inf), 5 min |x| (p = -inf). A NaN
 * element makes the result NaN. */
struct norm_f {
    int mode;
    double p;
    typedef double A;
    KILN_HD A identity() const { return mode == 5 ? INFINITY : 0.0; }
    KILN_HD A item(double x, int64_t) const {
        double v = fabs(x);
        if (v != v) return v;
        switch (mode) {
        case 0:
            return pow(v, p);
        case 1:
            return v;
        case 2:
            return v * v;
        case 3:
            return v != 0 ? 1.0 : 0.0;
        default:
            return v;
        }
    }
    KILN_HD A operator()(A a, A b) const {
        if (mode < 4) return a + b;
        if (a != a) return a;
        if (b != b) return b;
        return mode == 4 ? (b > a ? b : a) : (b < a ? b : a);
    }
    KILN_HD void finish(void *o, kiln_dtype d, int64_t off, A acc, int64_t) const {
        double r = acc;
        if (mode == 0)
            r = pow(acc, 1.0 / p);
        else if (mode == 2)
            r = sqrt(acc);
        store_f64(o, d, off, r);
    }
};

/* The value of an input element in the reducer's value type. */
template <int D> KILN_HD inline double red_load(const void *x, int64_t off, double *) {
    return dt<D>::ld_f64(x, off);
}
template <int D> KILN_HD inline int64_t red_load(const void *x, int64_t off, int64_t *) {
    return (int64_t)dt<D>::ld(x, off);
}

/* ---- Kernels ---------------------------------------------------------------------------------- */

/* One thread per output, the reduced elements in order. */
template <class R, int D, class V>
__global__ void reduce_thread_kernel(R rd, red_geom g, const void *x, void *y, kiln_dtype yd) {
    for (int64_t o = global_thread(); o < g.n_out; o += global_stride()) {
        int64_t xo, yo;
        g.outer(o, &xo, &yo);
        typename R::A acc = rd.identity();
        for (int64_t r = 0; r < g.n_red; r++)
            acc = rd(acc, rd.item(red_load<D>(x, xo + g.inner(r), (V *)0), r));
        rd.finish(y, yd, yo, acc, g.n_red);
    }
}

/* One block per (output, chunk): threads stride through the chunk, then a
 * fixed tree. With one chunk the block stores the result, else its
 * partial. */
template <class R, int D, class V>
__global__ void reduce_block_kernel(R rd, red_geom g, const void *x, void *y, kiln_dtype yd, int64_t chunks,
                                    int64_t chunk_len, typename R::A *partials) {
    typedef typename R::A A;
    KILN_DYNAMIC_SHARED(A, sh);
    int64_t total = g.n_out * chunks;
    for (int64_t b = blockIdx.x; b < total; b += gridDim.x) {
        int64_t o = b / chunks, c = b % chunks;
        int64_t lo = c * chunk_len, hi = lo + chunk_len;
        if (hi > g.n_red) hi = g.n_red;
        int64_t xo, yo;
        g.outer(o, &xo, &yo);
        A acc = rd.identity();
        for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x)
            acc = rd(acc, rd.item(red_load<D>(x, xo + g.inner(r), (V *)0), r));
        acc = block_reduce(sh, acc, rd);
        if (threadIdx.x == 0) {
            if (chunks == 1)
                rd.finish(y, yd, yo, acc, g.n_red);
            else
                partials[b] = acc;
        }
    }
}

/* The chunks of each output combined in chunk order. */
template <class R>
__global__ void reduce_finish_kernel(R rd, red_geom g, void *y, kiln_dtype yd, int64_t chunks,
                                     const typename R::A *partials) {
    for (int64_t o = global_thread(); o < g.n_out; o += global_stride()) {
        int64_t xo, yo;
        g.outer(o, &xo, &yo);
        typename R::A acc = rd.identity();
        for (int64_t c = 0; c < chunks; c++) acc = rd(acc, partials[o * chunks + c]);
        rd.finish(y, yd, yo, acc, g.n_red);
    }
}

template <class R, int D, class V> kiln_status launch_reduce(const R &rd, const kiln_op_args *a) {
    typedef typename R::A A;
    const kiln_strided *x = &a->in[0], *y = &a->out[0];
    red_plan p = make_plan(x, y, a->attrs);
    if (p.g.n_out == 0) return KILN_OK;
    device_guard guard;
    KILN_TRY(guard.enter(y->data));
    if (p.per_thread) {
        auto *k = &reduce_thread_kernel<R, D, V>;
        KILN_LAUNCH(k, grid_for(p.g.n_out), kThreads, 0, a->stream, rd, p.g, x->data, y->data, y->dtype);
        KILN_LAUNCH_CHECK(guard.device, "reduce_thread_kernel");
        return KILN_OK;
    }
    int64_t total = p.g.n_out * p.chunks;
    unsigned blocks = (unsigned)(total < 65535 ? total : 65535);
    A *partials = p.chunks > 1 ? (A *)a->workspace : NULL;
    if (p.chunks > 1 && (!partials || a->workspace_bytes < (size_t)total * kPartialBytes))
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "CUDA reduction: workspace of %zu bytes, %lld needed",
                          a->workspace_bytes, (long long)total * (long long)kPartialBytes);
    auto *k = &reduce_block_kernel<R, D, V>;
    KILN_LAUNCH(k, blocks, p.threads, p.threads * sizeof(A), a->stream, rd, p.g, x->data, y->data, y->dtype,
                p.chunks, p.chunk_len, partials);
    KILN_LAUNCH_CHECK(guard.device, "reduce_block_kernel");
    if (p.chunks > 1) {
        auto *f = &reduce_finish_kernel<R>;
        KILN_LAUNCH(f, grid_for(p.g.n_out), kThreads, 0, a->stream, rd, p.g, y->data, y->dtype, p.chunks,
                    (const A *)partials);
        KILN_LAUNCH_CHECK(guard.device, "reduce_finish_kernel");
    }
    return KILN_OK;
}

/* Floating inputs with reducer RF (value double), integer ones with RI
 * (value int64). */
template <class RF, class RI>
kiln_status reduce_by_dtype(const kiln_op_args *a, const RF &rf, const RI &ri, const char *name) {
    kiln_dtype d = a->in[0].dtype;
    switch (d) {
    case KILN_F32:
        return launch_reduce<RF, KILN_F32, double>(rf, a);
    case KILN_F64:
        return launch_reduce<RF, KILN_F64, double>(rf, a);
    case KILN_F16:
        return launch_reduce<RF, KILN_F16, double>(rf, a);
    case KILN_BF16:
        return launch_reduce<RF, KILN_BF16, double>(rf, a);
    case KILN_I32:
        return launch_reduce<RI, KILN_I32, int64_t>(ri, a);
    case KILN_I64:
        return launch_reduce<RI, KILN_I64, int64_t>(ri, a);
    case KILN_U8:
        return launch_reduce<RI, KILN_U8, int64_t>(ri, a);
    case KILN_BOOL:
        return launch_reduce<RI, KILN_BOOL, int64_t>(ri, a);
    default:
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "cast the input with kiln_to to a supported dtype",
                          "CUDA %s kernel: dtype %s is not supported", name, kiln_dtype_name(d));
    }
}

/* Floating-only reductions (mean, norm): an integer input is read as double. */
template <class RF> kiln_status reduce_float(const kiln_op_args *a, const RF &rf, const char *name) {
    kiln_dtype d = a->in[0].dtype;
    switch (d) {
    case KILN_F32:
        return launch_reduce<RF, KILN_F32, double>(rf, a);
    case KILN_F64:
        return launch_reduce<RF, KILN_F64, double>(rf, a);
    case KILN_F16:
        return launch_reduce<RF, KILN_F16, double>(rf, a);
    case KILN_BF16:
        return launch_reduce<RF, KILN_BF16, double>(rf, a);
    case KILN_I32:
        return launch_reduce<RF, KILN_I32, double>(rf, a);
    case KILN_I64:
        return launch_reduce<RF, KILN_I64, double>(rf, a);
    case KILN_U8:
        return launch_reduce<RF, KILN_U8, double>(rf, a);
    case KILN_BOOL:
        return launch_reduce<RF, KILN_BOOL, double>(rf, a);
    default:
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "cast the input with kiln_to to a supported dtype",
                          "CUDA %s kernel: dtype %s is not supported", name, kiln_dtype_name(d));
    }
}

kiln_status cuda_sum(const kiln_op_args *a) { return reduce_by_dtype(a, sum_f(), sum_i(), "sum"); }
kiln_status cuda_mean(const kiln_op_args *a) { return reduce_float(a, mean_f(), "mean"); }
kiln_status cuda_amax(const kiln_op_args *a) {
    return reduce_by_dtype(a, extreme_f{1}, extreme_i{1}, "amax");
}
kiln_status cuda_amin(const kiln_op_args *a) {
    return reduce_by_dtype(a, extreme_f{-1}, extreme_i{-1}, "amin");
}
kiln_status cuda_argmax(const kiln_op_args *a) {
    return reduce_by_dtype(a, argmax_f(), argmax_i(), "argmax");
}

kiln_status cuda_norm(const kiln_op_args *a) {
    double p = a->attrs->scalar[0];
    norm_f r;
    r.p = p;
    if (isinf(p))
        r.mode = p > 0 ? 4 : 5;
    else if (p == 0)
        r.mode = 3;
    else if (p == 1)
        r.mode = 1;
    else if (p == 2)
        r.mode = 2;
    else
        r.mode = 0;
    return reduce_float(a, r, "norm");
}

} // namespace

/* The exported kernels (cuda_ops.h); src/ops/cuda_table_reduce_cuda.c
 * points the table at them. */
extern "C" kiln_status kiln_cuda_sum(const kiln_op_args *a) { return cuda_sum(a); }
extern "C" kiln_status kiln_cuda_mean(const kiln_op_args *a) { return cuda_mean(a); }
extern "C" kiln_status kiln_cuda_amax(const kiln_op_args *a) { return cuda_amax(a); }
extern "C" kiln_status kiln_cuda_amin(const kiln_op_args *a) { return cuda_amin(a); }
extern "C" kiln_status kiln_cuda_argmax(const kiln_op_args *a) { return cuda_argmax(a); }
extern "C" kiln_status kiln_cuda_norm(const kiln_op_args *a) { return cuda_norm(a); }
extern "C" size_t kiln_cuda_reduce_workspace(const kiln_op_args *a) { return reduce_workspace(a); }

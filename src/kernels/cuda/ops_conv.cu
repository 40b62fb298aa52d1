/* CUDA kernels of conv2d (and conv2d_relu: relu in the store) and its two gradients: implicit GEMM (no im2col
 * buffer) on one tiled shared-memory GEMM kernel. Each problem is a small
 * struct that says how to read element (m, k) of A, element (k, n) of B
 * and where result (m, n) goes; blockIdx.z selects the group (and, for the
 * weight gradient, the slice of the reduction).
 *
 *   forward      y (Og, N*Ho*Wo)  = W (Og, Cg*kH*kW) x im2col(x)
 *   grad input   dx (Cg, N*H*W)   = W^T (Cg, Og*kH*kW) x (the taps of grad_out
 *                                   that touch each input pixel; a gather, so
 *                                   every dx element is written once)
 *   grad weight  dW (Og, Cg*kH*kW) = grad_out (Og, N*Ho*Wo) x im2col(x)^T,
 *                                   split along N*Ho*Wo into S slices written
 *                                   to the workspace and summed in slice
 *                                   order in double by a second kernel
 *
 * f32, f16 and bf16 data compute in float, f64 in double (as the CPU
 * kernels). No atomics: each output is summed in a fixed order, so results
 * repeat bit for bit. Inputs may have any strides. */
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/nn_common.h"
#include "kernels/conv_pool.h"
#include "kernels/nn_geometry.h"

namespace {

using kiln_nn::ldc;
using kiln_nn::stf;

constexpr int BM = 64, BN = 64, BK = 16;
constexpr int TM = 4, TN = 4;
constexpr int kGemmThreads = (BM / TM) * (BN / TN); /* 256 */

/* C (M, N) = sum over k in [k_begin(z), k_end(z)) of A(z, m, k) B(z, k, n),
 * stored by p.store(z, m, n, value). One BM x BN tile a block, each thread
 * a TM x TN patch (rows ty + 16 i, columns tx + 16 j), summed over k in
 * order (so a result does not depend on the launch).
 *
 * The index arithmetic is hoisted out of the loads: each thread loads A
 * elements of one column k per step (p.a_key(z, k) once, then
 * p.a(z, m, key) per row) and B elements of one column n throughout
 * (p.b_col(z, n) once a block, then p.b(z, k, col) per row). */
template <typename T, typename P> __global__ void gemm_tiles(P p) {
    static_assert(kGemmThreads % BK == 0 && kGemmThreads % BN == 0, "loader layout");
    KILN_DYNAMIC_SHARED(T, As); /* [BK][BM], then Bs [BK][BN] */
    T *Bs = As + BK * BM;
    const int tid = (int)threadIdx.x;
    const int tx = tid % (BN / TN), ty = tid / (BN / TN);
    const int z = (int)blockIdx.z;
    const int64_t m0 = (int64_t)blockIdx.y * BM, n0 = (int64_t)blockIdx.x * BN;
    const int64_t kb = p.k_begin(z), ke = p.k_end(z);
    /* this thread's loads: A column a_kk, rows a_m0 + i * a_step; B column b_nn, rows b_k0 + j * b_step */
    const int a_kk = tid % BK, a_m0 = tid / BK, a_step = kGemmThreads / BK;
    const int b_nn = tid % BN, b_k0 = tid / BN, b_step = kGemmThreads / BN;
    const bool b_valid = n0 + b_nn < p.N;
    const typename P::b_info bcol = p.b_col(z, n0 + b_nn);
    T acc[TM][TN];
    for (int i = 0; i < TM; i++)
        for (int j = 0; j < TN; j++) acc[i][j] = (T)0;
    for (int64_t k0 = kb; k0 < ke; k0 += BK) {
        {
            int64_t k = k0 + a_kk;
            bool kvalid = k < ke;
            typename P::a_info key = p.a_key(z, kvalid ? k : kb);
            for (int mm = a_m0; mm < BM; mm += a_step) {
                int64_t m = m0 + mm;
                As[a_kk * BM + mm] = (kvalid && m < p.M) ? p.a(z, m, key) : (T)0;
            }
        }
        for (int kk = b_k0; kk < BK; kk += b_step) {
            int64_t k = k0 + kk;
            Bs[kk * BN + b_nn] = (b_valid && k < ke) ? p.b(z, k, bcol) : (T)0;
        }
        __syncthreads();
        for (int kk = 0; kk < BK; kk++) {
            T av[TM], bv[TN];
            for (int i = 0; i < TM; i++) av[i] = As[kk * BM + ty + i * (BM / TM)];
            for (int j = 0; j < TN; j++) bv[j] = Bs[kk * BN + tx + j * (BN / TN)];
            for (int i = 0; i < TM; i++)
                for (int j = 0; j < TN; j++) acc[i][j] += av[i] * bv[j];
        }
        __syncthreads();
    }
    for (int i = 0; i < TM; i++)
        for (int j = 0; j < TN; j++) {
            int64_t m = m0 + ty + i * (BM / TM), n = n0 + tx + j * (BN / TN);
            if (m < p.M && n < p.N) p.store(z, m, n, acc[i][j]);
        }
}

/* Geometry shared by the three problems. Strides in elements. */
struct conv_dims {
    int64_t N, H, W, Ho, Wo, Og, Cg, kH, kW;
    int64_t sh, sw, ph, pw, dh, dw;
};

inline conv_dims dims_of(const kiln_op_attrs *attrs, const kiln_strided *x_like, const kiln_strided *w_like,
                         const kiln_strided *y_like) {
    kiln_conv_geom g = kiln_conv_geom_of(attrs);
    conv_dims d;
    d.N = x_like->shape[0];
    d.H = x_like->shape[2];
    d.W = x_like->shape[3];
    d.Og = w_like->shape[0] / g.groups;
    d.Cg = w_like->shape[1];
    d.kH = w_like->shape[2];
    d.kW = w_like->shape[3];
    d.Ho = y_like->shape[2];
    d.Wo = y_like->shape[3];
    d.sh = g.stride[0], d.sw = g.stride[1];
    d.ph = g.padding[0], d.pw = g.padding[1];
    d.dh = g.dilation[0], d.dw = g.dilation[1];
    return d;
}

struct tensor4 {
    const void *data;
    int dt;
    int64_t s[4];
};

inline tensor4 t4(const kiln_strided *t) {
    tensor4 r;
    r.data = t->data;
    r.dt = (int)t->dtype;
    for (int i = 0; i < 4; i++) r.s[i] = t->strides[i];
    return r;
}

/* y[n, g Og + m, oh, ow] = bias + sum over k = (c, kh, kw) of
 * w[g Og + m, c, kh, kw] x[n, g Cg + c, oh sh - ph + kh dh, ow sw - pw + kw dw]. */
template <typename T> struct conv_fwd {
    conv_dims d;
    tensor4 x, w, bias_t, y;
    bool has_bias;
    bool relu;       /* conv2d_relu: relu (NaN kept) applied before the store */
    int64_t M, N, K; /* M = Og, N = N*Ho*Wo, K = Cg*kH*kW */
    struct a_info {
        int64_t woff; /* w's offset of (c, kh, kw) */
    };
    struct b_info {
        int64_t xbase, ih0, iw0; /* x's offset of (n, g Cg), the window's corner */
    };
    KILN_HD int64_t k_begin(int) const { return 0; }
    KILN_HD int64_t k_end(int) const { return K; }
    __device__ a_info a_key(int, int64_t k) const {
        int64_t taps = d.kH * d.kW, c = k / taps, r = k % taps;
        return a_info{c * w.s[1] + (r / d.kW) * w.s[2] + (r % d.kW) * w.s[3]};
    }
    __device__ T a(int g, int64_t m, const a_info &key) const {
        return ldc<T>(w.data, w.dt, (g * d.Og + m) * w.s[0] + key.woff);
    }
    __device__ b_info b_col(int g, int64_t col) const {
        int64_t P = d.Ho * d.Wo, n = col / P, p = col % P;
        return b_info{n * x.s[0] + g * d.Cg * x.s[1], (p / d.Wo) * d.sh - d.ph, (p % d.Wo) * d.sw - d.pw};
    }
    __device__ T b(int, int64_t k, const b_info &cl) const {
        int64_t taps = d.kH * d.kW, c = k / taps, r = k % taps;
        int64_t ih = cl.ih0 + (r / d.kW) * d.dh, iw = cl.iw0 + (r % d.kW) * d.dw;
        if (ih < 0 || ih >= d.H || iw < 0 || iw >= d.W) return (T)0;
        return ldc<T>(x.data, x.dt, cl.xbase + c * x.s[1] + ih * x.s[2] + iw * x.s[3]);
    }
    __device__ void store(int g, int64_t m, int64_t col, T v) const {
        int64_t oc = g * d.Og + m, P = d.Ho * d.Wo, n = col / P, p = col % P;
        T bias = has_bias ? ldc<T>(bias_t.data, bias_t.dt, oc * bias_t.s[0]) : (T)0;
        T out = v + bias;
        if (relu && !(out > (T)0 || out != out)) out = (T)0;
        stf((void *)y.data, y.dt, n * y.s[0] + oc * y.s[1] + (p / d.Wo) * y.s[2] + (p % d.Wo) * y.s[3],
            (double)out);
    }
};

/* dx[n, g Cg + c, h, w] = sum over k = (o, kh, kw) of w[g Og + o, c, kh, kw]
 * go[n, g Og + o, oh, ow] where oh sh = h + ph - kh dh (and likewise for w)
 * lands on an output position: a gather, each dx element written once. */
template <typename T> struct conv_dgrad {
    conv_dims d;
    tensor4 go, w, dx;
    int64_t M, N, K; /* M = Cg, N = N*H*W, K = Og*kH*kW */
    struct a_info {
        int64_t woff; /* w's offset of (g Og + o, 0, kh, kw) */
    };
    struct b_info {
        int64_t gbase, hp, wp; /* go's offset of (n, g Og); h + ph, w + pw */
    };
    KILN_HD int64_t k_begin(int) const { return 0; }
    KILN_HD int64_t k_end(int) const { return K; }
    __device__ a_info a_key(int g, int64_t k) const {
        int64_t taps = d.kH * d.kW, o = k / taps, r = k % taps;
        return a_info{(g * d.Og + o) * w.s[0] + (r / d.kW) * w.s[2] + (r % d.kW) * w.s[3]};
    }
    __device__ T a(int, int64_t c, const a_info &key) const {
        return ldc<T>(w.data, w.dt, key.woff + c * w.s[1]);
    }
    __device__ b_info b_col(int g, int64_t col) const {
        int64_t HW = d.H * d.W, n = col / HW, p = col % HW;
        return b_info{n * go.s[0] + g * d.Og * go.s[1], p / d.W + d.ph, p % d.W + d.pw};
    }
    __device__ T b(int, int64_t k, const b_info &cl) const {
        int64_t taps = d.kH * d.kW, o = k / taps, r = k % taps;
        int64_t th = cl.hp - (r / d.kW) * d.dh, tw = cl.wp - (r % d.kW) * d.dw;
        if (th < 0 || tw < 0 || th % d.sh || tw % d.sw) return (T)0;
        int64_t oh = th / d.sh, ow = tw / d.sw;
        if (oh >= d.Ho || ow >= d.Wo) return (T)0;
        return ldc<T>(go.data, go.dt, cl.gbase + o * go.s[1] + oh * go.s[2] + ow * go.s[3]);
    }
    __device__ void store(int g, int64_t c, int64_t col, T v) const {
        int64_t HW = d.H * d.W, n = col / HW, p = col % HW;
        stf((void *)dx.data, dx.dt,
            n * dx.s[0] + (g * d.Cg + c) * dx.s[1] + (p / d.W) * dx.s[2] + (p % d.W) * dx.s[3], (double)v);
    }
};

/* dW[g Og + m, kc = (c, kh, kw)] = sum over r = (n, oh, ow) of
 * go[n, g Og + m, oh, ow] x[n, g Cg + c, oh sh - ph + kh dh, ow sw - pw + kw dw].
 * z = group * S + slice; slice s sums r in [s chunk, (s + 1) chunk) into
 * part (S, O, Cg*kH*kW). */
template <typename T> struct conv_wgrad {
    conv_dims d;
    tensor4 go, x;
    T *part;
    int64_t M, N, K; /* M = Og, N = Cg*kH*kW, K = N*Ho*Wo (the reduction) */
    int64_t S, chunk, O;
    struct a_info {
        int64_t goff; /* go's offset of (n, g Og, oh, ow) */
    };
    struct b_info {
        int64_t xoff, hoff, woff; /* x's offset of channel g Cg + c; kh dh - ph, kw dw - pw */
    };
    KILN_HD int64_t k_begin(int z) const { return (z % S) * chunk; }
    KILN_HD int64_t k_end(int z) const {
        int64_t e = (z % S + 1) * chunk;
        return e < K ? e : K;
    }
    __device__ a_info a_key(int z, int64_t r) const {
        int64_t g = z / S, P = d.Ho * d.Wo, n = r / P, p = r % P;
        return a_info{n * go.s[0] + g * d.Og * go.s[1] + (p / d.Wo) * go.s[2] + (p % d.Wo) * go.s[3]};
    }
    __device__ T a(int, int64_t m, const a_info &key) const {
        return ldc<T>(go.data, go.dt, key.goff + m * go.s[1]);
    }
    __device__ b_info b_col(int z, int64_t kc) const {
        int64_t g = z / S, taps = d.kH * d.kW, c = kc / taps, t = kc % taps;
        return b_info{(g * d.Cg + c) * x.s[1], (t / d.kW) * d.dh - d.ph, (t % d.kW) * d.dw - d.pw};
    }
    __device__ T b(int, int64_t r, const b_info &cl) const {
        int64_t P = d.Ho * d.Wo, n = r / P, p = r % P;
        int64_t ih = (p / d.Wo) * d.sh + cl.hoff, iw = (p % d.Wo) * d.sw + cl.woff;
        if (ih < 0 || ih >= d.H || iw < 0 || iw >= d.W) return (T)0;
        return ldc<T>(x.data, x.dt, n * x.s[0] + cl.xoff + ih * x.s[2] + iw * x.s[3]);
    }
    __device__ void store(int z, int64_t m, int64_t kc, T v) const {
        int64_t g = z / S, s = z % S;
        part[(s * O + g * d.Og + m) * N + kc] = v;
    }
};

/* dW (O, Cg, kH, kW) = sum over slices of part, in slice order, in double. */
template <typename T>
__global__ void wgrad_sum(const T *part, int64_t S, int64_t O, int64_t K, int64_t kHW, int64_t kW, void *dw,
                          int dt, int64_t s0, int64_t s1, int64_t s2, int64_t s3) {
    int64_t total = O * K;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        double acc = 0;
        for (int64_t s = 0; s < S; s++) acc += (double)part[s * total + i];
        int64_t o = i / K, k = i % K, c = k / kHW, t = k % kHW;
        stf(dw, dt, o * s0 + c * s1 + (t / kW) * s2 + (t % kW) * s3, acc);
    }
}

template <typename T, typename P>
kiln_status launch_gemm(int device, const P &p, int64_t zcount, void *stream, const char *what) {
    if (p.M <= 0 || p.N <= 0) return KILN_OK;
    int64_t gx = (p.N + BN - 1) / BN, gy = (p.M + BM - 1) / BM;
    if (gy > 65535 || zcount > 65535 || gx > 2147483647)
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "use a smaller batch, fewer groups or fewer channels",
                          "%s: the convolution is too large for one CUDA launch (%lld x %lld x %lld tiles)",
                          what, (long long)gx, (long long)gy, (long long)zcount);
    auto *k = &gemm_tiles<T, P>;
    KILN_LAUNCH(k, dim3((unsigned)gx, (unsigned)gy, (unsigned)zcount), kGemmThreads,
                (size_t)(BK * (BM + BN)) * sizeof(T), stream, p);
    KILN_LAUNCH_CHECK(device, what);
    return KILN_OK;
}

template <typename T> kiln_status conv_forward(const kiln_op_args *a, int device, bool relu) {
    const kiln_strided *x = &a->in[0], *w = &a->in[1], *b = &a->in[2], *y = &a->out[0];
    conv_fwd<T> p;
    p.relu = relu;
    p.d = dims_of(a->attrs, x, w, y);
    p.x = t4(x), p.w = t4(w), p.y = t4(y);
    p.has_bias = kiln_nn::present(b);
    p.bias_t = p.x;
    if (p.has_bias) {
        p.bias_t.data = b->data, p.bias_t.dt = (int)b->dtype, p.bias_t.s[0] = b->strides[0];
    }
    p.M = p.d.Og, p.N = p.d.N * p.d.Ho * p.d.Wo, p.K = p.d.Cg * p.d.kH * p.d.kW;
    int64_t groups = kiln_conv_geom_of(a->attrs).groups;
    return launch_gemm<T>(device, p, groups, a->stream,
                          relu ? "conv2d_relu (gemm_tiles)" : "conv2d (gemm_tiles)");
}

template <typename T> kiln_status conv_grad_input(const kiln_op_args *a, int device) {
    const kiln_strided *go = &a->in[0], *w = &a->in[1], *dx = &a->out[0];
    conv_dgrad<T> p;
    p.d = dims_of(a->attrs, dx, w, go);
    p.go = t4(go), p.w = t4(w), p.dx = t4(dx);
    p.M = p.d.Cg, p.N = p.d.N * p.d.H * p.d.W, p.K = p.d.Og * p.d.kH * p.d.kW;
    int64_t groups = kiln_conv_geom_of(a->attrs).groups;
    return launch_gemm<T>(device, p, groups, a->stream, "conv2d_grad_input (gemm_tiles)");
}

/* The reduction split: slices of at least 512 items (a multiple of BK),
 * at most 64 of them, and no more than a launch's z dimension allows. */
void wgrad_split(int64_t R, int64_t groups, int64_t *S, int64_t *chunk) {
    int64_t s = (R + 511) / 512;
    if (s > 64) s = 64;
    if (s * groups > 65535) s = 65535 / groups;
    if (s < 1) s = 1;
    int64_t c = (R + s - 1) / s;
    c = (c + BK - 1) / BK * BK;
    if (c < BK) c = BK;
    *S = s;
    *chunk = c;
}

size_t wgrad_workspace(const kiln_op_args *a) {
    const kiln_strided *go = &a->in[0], *dw = &a->out[0];
    int64_t groups = kiln_conv_geom_of(a->attrs).groups, S, chunk;
    int64_t R = go->shape[0] * go->shape[2] * go->shape[3];
    wgrad_split(R, groups, &S, &chunk);
    int64_t K = dw->shape[1] * dw->shape[2] * dw->shape[3];
    size_t es = dw->dtype == KILN_F64 ? sizeof(double) : sizeof(float);
    return (size_t)(S * dw->shape[0] * K) * es;
}

template <typename T> kiln_status conv_grad_weight(const kiln_op_args *a, int device) {
    const kiln_strided *go = &a->in[0], *x = &a->in[1], *dw = &a->out[0];
    conv_wgrad<T> p;
    p.d = dims_of(a->attrs, x, dw, go);
    p.go = t4(go), p.x = t4(x);
    int64_t groups = kiln_conv_geom_of(a->attrs).groups;
    p.O = dw->shape[0];
    p.M = p.d.Og, p.N = p.d.Cg * p.d.kH * p.d.kW, p.K = p.d.N * p.d.Ho * p.d.Wo;
    wgrad_split(p.K, groups, &p.S, &p.chunk);
    p.part = (T *)a->workspace;
    int64_t total = p.O * p.N;
    if (total == 0) return KILN_OK;
    if (p.K == 0) { /* no reduction items: the gradient is zero */
        auto *k = &wgrad_sum<T>;
        KILN_LAUNCH(k, kiln_nn::blocks_for(total), kiln_nn::kThreads, 0, a->stream, (const T *)p.part,
                    (int64_t)0, p.O, p.N, p.d.kH * p.d.kW, p.d.kW, dw->data, (int)dw->dtype, dw->strides[0],
                    dw->strides[1], dw->strides[2], dw->strides[3]);
        KILN_LAUNCH_CHECK(device, "conv2d_grad_weight (wgrad_sum)");
        return KILN_OK;
    }
    KILN_TRY(launch_gemm<T>(device, p, groups * p.S, a->stream, "conv2d_grad_weight (gemm_tiles)"));
    auto *k = &wgrad_sum<T>;
    KILN_LAUNCH(k, kiln_nn::blocks_for(total), kiln_nn::kThreads, 0, a->stream, (const T *)p.part, p.S, p.O,
                p.N, p.d.kH * p.d.kW, p.d.kW, dw->data, (int)dw->dtype, dw->strides[0], dw->strides[1],
                dw->strides[2], dw->strides[3]);
    KILN_LAUNCH_CHECK(device, "conv2d_grad_weight (wgrad_sum)");
    return KILN_OK;
}

kiln_status conv2d_forward_run(const kiln_op_args *a, bool relu) {
    if (kiln_cuda::element_count(&a->out[0]) == 0) return KILN_OK;
    kiln_cuda::device_guard guard;
    KILN_TRY(guard.enter(a->out[0].data));
    return a->out[0].dtype == KILN_F64 ? conv_forward<double>(a, guard.device, relu)
                                       : conv_forward<float>(a, guard.device, relu);
}

kiln_status run_conv2d(const kiln_op_args *a) { return conv2d_forward_run(a, false); }

/* conv2d_relu: the forward kernel with relu in its store (one pass). */
kiln_status run_conv2d_relu(const kiln_op_args *a) { return conv2d_forward_run(a, true); }

kiln_status run_conv2d_grad_input(const kiln_op_args *a) {
    if (kiln_cuda::element_count(&a->out[0]) == 0) return KILN_OK;
    kiln_cuda::device_guard guard;
    KILN_TRY(guard.enter(a->out[0].data));
    return a->out[0].dtype == KILN_F64 ? conv_grad_input<double>(a, guard.device)
                                       : conv_grad_input<float>(a, guard.device);
}

kiln_status run_conv2d_grad_weight(const kiln_op_args *a) {
    if (kiln_cuda::element_count(&a->out[0]) == 0) return KILN_OK;
    kiln_cuda::device_guard guard;
    KILN_TRY(guard.enter(a->out[0].data));
    return a->out[0].dtype == KILN_F64 ? conv_grad_weight<double>(a, guard.device)
                                       : conv_grad_weight<float>(a, guard.device);
}

} // namespace

/* The exported kernels (cuda_ops.h); src/ops/cuda_table_nn_cuda.c points
 * the table at them. */
extern "C" kiln_status kiln_cuda_conv2d(const kiln_op_args *a) { return run_conv2d(a); }
extern "C" kiln_status kiln_cuda_conv2d_relu(const kiln_op_args *a) { return run_conv2d_relu(a); }
extern "C" kiln_status kiln_cuda_conv2d_grad_input(const kiln_op_args *a) { return run_conv2d_grad_input(a); }
extern "C" kiln_status kiln_cuda_conv2d_grad_weight(const kiln_op_args *a) {
    return run_conv2d_grad_weight(a);
}
extern "C" size_t kiln_cuda_conv2d_grad_weight_workspace(const kiln_op_args *a) { return wgrad_workspace(a); }

/* conv2d_relu_max_pool2d: the forward into the front of the workspace,
 * then relu_max_pool2d's kernel (kernels/conv_pool.h), both on the op's
 * stream. No gain over the two ops here: Sequential fuses the layers into
 * this op on the CPU only (src/nn/fusion.c). */
extern "C" size_t kiln_cuda_conv2d_relu_max_pool2d_workspace(const kiln_op_args *a) {
    return kiln_conv_pool_conv_bytes(a);
}
extern "C" kiln_status kiln_cuda_conv2d_relu_max_pool2d(const kiln_op_args *a) {
    kiln_conv_pool_split s;
    kiln_conv_pool_split_of(a, KILN_LAYOUT_STRIDED, &s);
    kiln_status st = run_conv2d(&s.conv);
    return st ? st : kiln_cuda_relu_max_pool2d(&s.pool);
}

/* conv2d_relu_max_pool2d_grad_weight: relu_max_pool2d_backward_sum into
 * the front of the workspace (and the bias gradient), then the weight
 * gradient's kernel (kernels/conv_pool.h), on the op's stream. */
extern "C" size_t kiln_cuda_conv2d_relu_max_pool2d_grad_weight_workspace(const kiln_op_args *a) {
    kiln_conv_pool_wgrad_split s;
    kiln_conv_pool_wgrad_split_of(a, KILN_LAYOUT_STRIDED, &s);
    return kiln_conv_pool_wgrad_g_bytes(a) + wgrad_workspace(&s.wgrad);
}
extern "C" kiln_status kiln_cuda_conv2d_relu_max_pool2d_grad_weight(const kiln_op_args *a) {
    kiln_conv_pool_wgrad_split s;
    kiln_conv_pool_wgrad_split_of(a, KILN_LAYOUT_STRIDED, &s);
    kiln_status st = kiln_cuda_relu_max_pool2d_backward_sum(&s.pool);
    return st ? st : run_conv2d_grad_weight(&s.wgrad);
}

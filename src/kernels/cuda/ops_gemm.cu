/* CUDA kernels for mm, bmm, linear and linear_act (reduce group;
 * exported through cuda_ops.h): one tiled shared-memory GEMM on any
 * strides (linear_act: K may span several dims of x, and relu runs in the
 * store).
 *
 *   C[b](M x N) = A[b](M x K) @ B[b](K x N) (+ bias[n])
 *
 * A's rows may span several dims (linear's leading dims (..., in) that do
 * not merge into one stride): a row index is mapped to A's and C's offsets
 * through a small row map, computed once per thread and tile. Tiles of
 * 64 x 64 outputs, K in steps of 16, 256 threads each computing a 4 x 4
 * block (rows ty + 16 i, columns tx + 16 j). Operands are converted to the
 * compute type while loading the tiles: f32, f16 and bf16 multiply and
 * accumulate in float, f64 in double. Each output is one thread's running
 * sum over k in increasing order, so results repeat bit for bit. Tile
 * loads follow whichever of A's (and B's) dims is contiguous, so both
 * plain and transposed operands read coalesced. Bounds are checked
 * everywhere (any M, N, K, including 0). Row tiles run on grid x, column
 * tiles on grid y, batches on grid z (beyond 65535 they loop). */
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_dtype.h"
#include "kernels/cuda/cuda_ops.h"

namespace {

using namespace kiln_cuda;

constexpr int kTileM = 64, kTileN = 64, kTileK = 16;
constexpr int kGemmThreads = 256; /* 16 x 16 */

struct gemm_geom {
    int64_t M, N, K, batch;
    /* rows of A and C: row r -> sum over dims of (r's digit) * stride */
    int rdim;
    int64_t rshape[KILN_MAX_DIMS], a_rs[KILN_MAX_DIMS], c_rs[KILN_MAX_DIMS];
    int64_t a_ks;             /* A's stride along K */
    int64_t b_ks, b_ns;       /* B's strides along K and N */
    int64_t c_ns;             /* C's stride along N */
    int64_t a_bs, b_bs, c_bs; /* batch strides */
    bool a_k_contig;          /* load A tiles along K (else along M) */
    bool b_n_contig;          /* load B tiles along N (else along K) */
    const void *bias;         /* NULL: none */
    kiln_dtype bias_dt;
    int64_t bias_s;
    /* linear_act: K spans several dims of A (x's dims 1.. that do not
     * merge into one stride): k -> sum of (k's digit) * a_kss; kdim <= 1
     * means k * a_ks. relu: linear_act's relu (NaN kept) after the bias. */
    int kdim;
    int64_t kshape[KILN_MAX_DIMS], a_kss[KILN_MAX_DIMS];
    bool relu;

    KILN_HD void row_offsets(int64_t r, int64_t *a_off, int64_t *c_off) const {
        int64_t a = 0, c = 0;
        for (int d = rdim - 1; d >= 0; d--) {
            int64_t q = r % rshape[d];
            r /= rshape[d];
            a += q * a_rs[d];
            c += q * c_rs[d];
        }
        *a_off = a;
        *c_off = c;
    }
    KILN_HD int64_t k_offset(int64_t k) const {
        if (kdim <= 1) return k * a_ks;
        int64_t off = 0;
        for (int d = kdim - 1; d >= 0; d--) {
            off += (k % kshape[d]) * a_kss[d];
            k /= kshape[d];
        }
        return off;
    }
};

template <int D> __global__ void gemm_kernel(const void *A, const void *B, void *C, gemm_geom g) {
    typedef dt<D> T;
    typedef typename T::C acc_t;
    KILN_DYNAMIC_SHARED(acc_t, smem);
    acc_t *As = smem;                   /* [kTileK][kTileM] */
    acc_t *Bs = smem + kTileK * kTileM; /* [kTileK][kTileN] */
    const int tid = (int)threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int64_t m0 = (int64_t)blockIdx.x * kTileM, n0 = (int64_t)blockIdx.y * kTileN;
    constexpr int kLoads = kTileM * kTileK / kGemmThreads; /* 4 per thread for A and for B */

    /* This thread's tile-load slots: A (row, kk) and B (kk, col), fixed
     * over the k steps; A's row offsets computed once. */
    int a_row[kLoads], a_kk[kLoads], b_col[kLoads], b_kk[kLoads];
    int64_t a_roff[kLoads];
    bool a_ok[kLoads];
    for (int q = 0; q < kLoads; q++) {
        int e = tid + q * kGemmThreads;
        if (g.a_k_contig) {
            a_row[q] = e / kTileK;
            a_kk[q] = e % kTileK;
        } else {
            a_kk[q] = e / kTileM;
            a_row[q] = e % kTileM;
        }
        if (g.b_n_contig) {
            b_kk[q] = e / kTileN;
            b_col[q] = e % kTileN;
        } else {
            b_col[q] = e / kTileK;
            b_kk[q] = e % kTileK;
        }
        int64_t r = m0 + a_row[q], coff;
        a_ok[q] = r < g.M;
        a_roff[q] = 0;
        if (a_ok[q]) g.row_offsets(r, &a_roff[q], &coff);
    }

    for (int64_t bi = blockIdx.z; bi < g.batch; bi += gridDim.z) {
        int64_t abase = bi * g.a_bs, bbase = bi * g.b_bs, cbase = bi * g.c_bs;
        acc_t acc[4][4];
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) acc[i][j] = 0;
        for (int64_t k0 = 0; k0 < g.K; k0 += kTileK) {
            for (int q = 0; q < kLoads; q++) {
                int64_t k = k0 + a_kk[q];
                acc_t v = 0;
                if (a_ok[q] && k < g.K) v = T::ld(A, abase + a_roff[q] + g.k_offset(k));
                As[a_kk[q] * kTileM + a_row[q]] = v;
                int64_t kb = k0 + b_kk[q], n = n0 + b_col[q];
                acc_t w = 0;
                if (kb < g.K && n < g.N) w = T::ld(B, bbase + kb * g.b_ks + n * g.b_ns);
                Bs[b_kk[q] * kTileN + b_col[q]] = w;
            }
            __syncthreads();
            for (int kk = 0; kk < kTileK; kk++) {
                acc_t av[4], bv[4];
                for (int i = 0; i < 4; i++) av[i] = As[kk * kTileM + ty + 16 * i];
                for (int j = 0; j < 4; j++) bv[j] = Bs[kk * kTileN + tx + 16 * j];
                for (int i = 0; i < 4; i++)
                    for (int j = 0; j < 4; j++) acc[i][j] += av[i] * bv[j];
            }
            __syncthreads();
        }
        for (int i = 0; i < 4; i++) {
            int64_t r = m0 + ty + 16 * i;
            if (r >= g.M) continue;
            int64_t aoff, coff;
            g.row_offsets(r, &aoff, &coff);
            for (int j = 0; j < 4; j++) {
                int64_t n = n0 + tx + 16 * j;
                if (n >= g.N) continue;
                acc_t v = acc[i][j];
                if (g.bias) v += (acc_t)load_f64(g.bias, g.bias_dt, n * g.bias_s);
                if (g.relu && !(v > (acc_t)0 || v != v)) v = (acc_t)0;
                T::st(C, cbase + coff + n * g.c_ns, v);
            }
        }
    }
}

/* Rows of one 2-D operand pair: a single dim of A rows with stride a_rs,
 * C rows with stride c_rs. */
void one_row_dim(gemm_geom *g, int64_t M, int64_t a_rs, int64_t c_rs) {
    g->rdim = 1;
    g->rshape[0] = M > 0 ? M : 1;
    g->a_rs[0] = a_rs;
    g->c_rs[0] = c_rs;
}

void finish_geom(gemm_geom *g) {
    g->a_k_contig = g->a_ks == 1 || !(g->rdim == 1 && g->a_rs[0] == 1);
    g->b_n_contig = g->b_ns == 1 || g->b_ks != 1;
}

template <int D> kiln_status launch_gemm(const kiln_op_args *a, const gemm_geom &g) {
    if (g.M == 0 || g.N == 0 || g.batch == 0) return KILN_OK;
    typedef typename dt<D>::C acc_t;
    device_guard guard;
    KILN_TRY(guard.enter(a->out[0].data));
    /* Row tiles on x (up to 2^31 - 1), column tiles on y (up to 65535). */
    int64_t gx = (g.M + kTileM - 1) / kTileM, gy = (g.N + kTileN - 1) / kTileN;
    if (gy > 65535 || gx > 2147483647)
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "split the product into smaller ones",
                          "CUDA GEMM: a %lld x %lld output is more than this kernel's grid covers",
                          (long long)g.M, (long long)g.N);
    unsigned gz = (unsigned)(g.batch < 65535 ? g.batch : 65535);
    dim3 grid((unsigned)gx, (unsigned)gy, gz);
    size_t shmem = (size_t)(kTileK * (kTileM + kTileN)) * sizeof(acc_t);
    auto *k = &gemm_kernel<D>;
    KILN_LAUNCH(k, grid, kGemmThreads, shmem, a->stream, a->in[0].data, a->in[1].data, a->out[0].data, g);
    KILN_LAUNCH_CHECK(guard.device, "gemm_kernel");
    return KILN_OK;
}

kiln_status gemm_dispatch(const kiln_op_args *a, const gemm_geom &g, const char *name) {
    kiln_dtype d = a->out[0].dtype;
    switch (d) {
    case KILN_F32:
        return launch_gemm<KILN_F32>(a, g);
    case KILN_F64:
        return launch_gemm<KILN_F64>(a, g);
    case KILN_F16:
        return launch_gemm<KILN_F16>(a, g);
    case KILN_BF16:
        return launch_gemm<KILN_BF16>(a, g);
    default:
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "use a floating dtype", "CUDA %s kernel: dtype %s", name,
                          kiln_dtype_name(d));
    }
}

} // namespace

namespace kiln_cuda {

/* (n, k) @ (k, m) */
kiln_status mm_op(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *w = &a->in[1], *c = &a->out[0];
    gemm_geom g;
    memset(&g, 0, sizeof g);
    g.M = x->shape[0];
    g.K = x->shape[1];
    g.N = w->shape[1];
    g.batch = 1;
    one_row_dim(&g, g.M, x->strides[0], c->strides[0]);
    g.a_ks = x->strides[1];
    g.b_ks = w->strides[0];
    g.b_ns = w->strides[1];
    g.c_ns = c->strides[1];
    finish_geom(&g);
    return gemm_dispatch(a, g, "mm");
}

/* (b, n, k) @ (b, k, m) */
kiln_status bmm_op(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *w = &a->in[1], *c = &a->out[0];
    gemm_geom g;
    memset(&g, 0, sizeof g);
    g.batch = c->shape[0];
    g.M = x->shape[1];
    g.K = x->shape[2];
    g.N = w->shape[2];
    one_row_dim(&g, g.M, x->strides[1], c->strides[1]);
    g.a_ks = x->strides[2];
    g.b_ks = w->strides[1];
    g.b_ns = w->strides[2];
    g.c_ns = c->strides[2];
    g.a_bs = x->strides[0];
    g.b_bs = w->strides[0];
    g.c_bs = c->strides[0];
    finish_geom(&g);
    return gemm_dispatch(a, g, "bmm");
}

/* y[r, o] = sum_i x[r, i] * W[o, i] + b[o] over the leading positions r of
 * x (..., in): B(k = i, n = o) = W[o, i]. */
kiln_status linear_op(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *w = &a->in[1], *b = &a->in[2], *y = &a->out[0];
    gemm_geom g;
    memset(&g, 0, sizeof g);
    int lead = x->ndim - 1;
    g.K = x->shape[lead];
    g.N = w->shape[0];
    g.batch = 1;
    g.M = 1;
    /* leading dims: size-1 dropped, merged where x and y both allow */
    for (int d = 0; d < lead; d++) {
        int64_t n = x->shape[d];
        g.M *= n;
        if (n == 1) continue;
        int r = g.rdim;
        if (r > 0 && g.a_rs[r - 1] == x->strides[d] * n && g.c_rs[r - 1] == y->strides[d] * n) {
            g.rshape[r - 1] *= n;
            g.a_rs[r - 1] = x->strides[d];
            g.c_rs[r - 1] = y->strides[d];
            continue;
        }
        g.rshape[r] = n;
        g.a_rs[r] = x->strides[d];
        g.c_rs[r] = y->strides[d];
        g.rdim++;
    }
    if (g.rdim == 0) one_row_dim(&g, 1, 0, 0);
    g.a_ks = x->strides[lead];
    g.b_ks = w->strides[1];
    g.b_ns = w->strides[0];
    g.c_ns = y->strides[lead];
    if (b->ndim >= 0) {
        g.bias = b->data;
        g.bias_dt = b->dtype;
        g.bias_s = b->ndim > 0 ? b->strides[0] : 0;
    }
    finish_geom(&g);
    return gemm_dispatch(a, g, "linear");
}

/* linear_act: y[n, o] = act(sum_k x_flat[n, k] * W[o, k] + b[o]) with
 * x (N, d1, ...) read as (N, K) through the K digit map (dims 1.. merged
 * where their strides allow): B(k, n = o) = W[o, k]; relu in the store. */
kiln_status linear_act_op(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *w = &a->in[1], *b = &a->in[2], *y = &a->out[0];
    gemm_geom g;
    memset(&g, 0, sizeof g);
    g.M = x->shape[0];
    g.K = w->shape[1];
    g.N = w->shape[0];
    g.batch = 1;
    one_row_dim(&g, g.M, x->strides[0], y->strides[0]);
    for (int d = 1; d < x->ndim; d++) {
        int64_t n = x->shape[d];
        if (n == 1) continue;
        int r = g.kdim;
        if (r > 0 && g.a_kss[r - 1] == x->strides[d] * n) {
            g.kshape[r - 1] *= n;
            g.a_kss[r - 1] = x->strides[d];
            continue;
        }
        g.kshape[r] = n;
        g.a_kss[r] = x->strides[d];
        g.kdim++;
    }
    g.a_ks = g.kdim > 0 ? g.a_kss[g.kdim - 1] : 1;
    g.b_ks = w->strides[1];
    g.b_ns = w->strides[0];
    g.c_ns = y->strides[1];
    if (b->ndim >= 0) {
        g.bias = b->data;
        g.bias_dt = b->dtype;
        g.bias_s = b->ndim > 0 ? b->strides[0] : 0;
    }
    g.relu = a->attrs->flag == 1;
    finish_geom(&g);
    return gemm_dispatch(a, g, "linear_act");
}

} // namespace kiln_cuda

/* The exported kernels (cuda_ops.h); src/ops/cuda_table_reduce_cuda.c
 * points the table at them. */
extern "C" kiln_status kiln_cuda_mm(const kiln_op_args *a) { return kiln_cuda::mm_op(a); }
extern "C" kiln_status kiln_cuda_bmm(const kiln_op_args *a) { return kiln_cuda::bmm_op(a); }
extern "C" kiln_status kiln_cuda_linear(const kiln_op_args *a) { return kiln_cuda::linear_op(a); }
extern "C" kiln_status kiln_cuda_linear_act(const kiln_op_args *a) { return kiln_cuda::linear_act_op(a); }

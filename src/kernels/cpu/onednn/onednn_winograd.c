/* Winograd F(2x2, 3x3), F(4x4, 3x3) and F(6x6, 3x3) convolutions for AVX2
 * CPUs (the first described here; F(4x4) and F(6x6) are the same with 6x6
 * and 8x8 tiles, 36 and 64 planes, their transforms below): the forward (with bias
 * and fused ReLU), the input gradient and the weight gradient of a 3x3,
 * stride-1, padding-1, ungrouped f32 convolution, on activations in
 * Kiln's blocked layouts (nChw8c, nChw16c) or plain NCHW. oneDNN has
 * Winograd only for AVX-512; this is the AVX2 counterpart, one candidate
 * of the oneDNN convolution provider (onednn_conv.c), its 16 matrix
 * products done by Kiln's AVX2 micro-kernel (kernels/cpu/fast/gemm_avx2.c).
 *
 * The method (Lavin and Gray, "Fast Algorithms for Convolutional Neural
 * Networks", 2016): each 2x2 output tile is A^T [U (.) V] A, where
 * V = B^T d B is the transform of the 4x4 input tile d around it and
 * U = G g G^T that of the 3x3 filter g. Summed over the input channels,
 * the 16 element-wise products become 16 matrix products, each with 4/9
 * of the direct convolution's multiply-adds per output:
 *     M[xi] (tiles x K) = V[xi] (tiles x C) . U[xi] (C x K),  xi = 0..15.
 *   - input gradient: the forward of grad_out with the filters flipped
 *     and transposed (w'[c][k] = rot180(w[k][c])), padding 1 again;
 *   - weight gradient: by linearity, dL/dg = G^T [(A dY A^T) (.) V] G
 *     summed over tiles, so S[xi] (C x K) = V[xi]^T . Z[xi] with
 *     Z = A dY A^T the transformed 2x2 output-gradient tiles.
 * The transforms are adds, subtracts and halvings (exact in binary), the
 * rounding differs from the direct algorithm's by the order of the sums:
 * tests/kernels/test_winograd_conv.c holds every pass to a float64
 * reference with a normwise tolerance of 2e-5, oneDNN's Winograd's.
 *
 * Each OpenMP thread takes an equal, contiguous share of the tiles with
 * its own buffers, in chunks sized to keep a chunk's V and M in the L2
 * cache. The forward and the input gradient give the same bits for any
 * thread count (each output is one chain of fused multiply-adds over the
 * channels); the weight gradient's per-thread sums are added in thread
 * order, so a fixed thread count gives the same bits run to run. */
#ifdef KILN_WITH_ONEDNN
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/error.h"
#include "kernels/cpu/fast/gemm_avx2.h"
#include "kernels/cpu/onednn/onednn_winograd.h"
#include "kernels/kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define WINO_X86 1
#include <immintrin.h>
#define AVX2 __attribute__((target("avx2,fma")))
typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4)));
typedef int32_t v8i __attribute__((vector_size(32)));
#else
#define WINO_X86 0
#endif

/* The transforms are AVX2 and the products the AVX2 micro-kernel's. */
bool kiln_wino_cpu_ok(void) { return kiln_cpu_gemm_avx2_ok(); }

bool kiln_wino_shape_ok(const kiln_wino_shape *s) {
    return (s->m == 0 || s->m == 2 || s->m == 4 || s->m == 6) &&
           (s->pool == 0 || (s->pool >= 2 && s->h >= s->pool && s->w >= s->pool)) && s->n >= 1 && s->c >= 8 &&
           s->k >= 8 && s->c % 8 == 0 && s->k % 8 == 0 && s->h >= 2 && s->w >= 2 &&
           (s->xb == 0 || s->xb == 8 || s->xb == 16) && (s->yb == 0 || s->yb == 8 || s->yb == 16) &&
           (s->xb == 0 || s->c % s->xb == 0) && (s->yb == 0 || s->k % s->yb == 0);
}

/* The output tile's side (2, 4 or 6) and the transformed tiles' planes (16, 36, 64). */
static int tile_of(const kiln_wino_shape *s) { return s->m == 4 || s->m == 6 ? s->m : 2; }
static int planes_of(const kiln_wino_shape *s) { return (tile_of(s) + 2) * (tile_of(s) + 2); }

/* The pass's channels: in (transformed as V) and out (the products' columns). */
static void pass_channels(kiln_wino_pass pass, const kiln_wino_shape *s, int64_t *cin, int64_t *cout) {
    /* forward: x (c) -> y (k); input gradient: grad_y (k) -> grad_x (c);
     * weight gradient: x (c) with grad_y (k). */
    *cin = pass == KILN_WINO_BWD_DATA ? s->k : s->c;
    *cout = pass == KILN_WINO_BWD_DATA ? s->c : s->k;
}

/* The rows and columns the tiles cover: all of y's, or those the pooling
 * reads (kiln_wino_shape.pool). */
static int64_t grid_h(const kiln_wino_shape *s) { return s->pool ? s->h / s->pool * s->pool : s->h; }
static int64_t grid_w(const kiln_wino_shape *s) { return s->pool ? s->w / s->pool * s->pool : s->w; }

static int64_t tiles_of(const kiln_wino_shape *s) {
    int64_t m = tile_of(s);
    return s->n * ((grid_h(s) + m - 1) / m) * ((grid_w(s) + m - 1) / m);
}

/* Tiles per chunk: each thread takes an equal share of the tiles (within
 * one) and goes through it in chunks of about equal size, each chunk's V
 * and M (planes x chunk x channels each) in about 768 KiB, a multiple of
 * the micro-kernel's 6 rows (the products' rows are the chunk's tiles).
 * Static chunks over the whole range left one thread up to a chunk and a
 * half behind the other at the end of every pass. The forward and input
 * gradient hand these chunks out as the threads come for them (each tile's
 * result is the same whichever thread makes it), so a thread slowed by
 * another process takes fewer; the weight gradient keeps the even split,
 * whose per-thread sums are added in a fixed order. */
static int64_t chunk_of(int64_t cin, int64_t cout, int64_t planes, int64_t tiles, int threads) {
    int64_t t = 12288 * 16 / planes / (cin + cout);
    t = t < 12 ? 12 : t > 256 ? 256 : t;
    int64_t share = (tiles + threads - 1) / threads;
    int64_t n = (share + t - 1) / t;
    int64_t c = (share + n - 1) / n;
    return (c + 5) / 6 * 6;
}

/* Thread tid's tiles of `threads`: [*lo, *hi). */
static void thread_tiles(int64_t tiles, int tid, int threads, int64_t *lo, int64_t *hi) {
    *lo = tiles * tid / threads;
    *hi = tiles * (tid + 1) / threads;
}

static int threads_max(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* Workspace layout, in floats, 64-byte aligned pieces:
 *   U (16 x cin x cout; forward and input gradient) or the per-thread sums
 *   S (threads x 16 x c x k; weight gradient), then per thread V and M
 *   (16 x chunk x cin, 16 x chunk x cout), then the blocked copies of
 *   plain activations (x and y as nChw8c). */
typedef struct wino_layout {
    int64_t cin, cout, chunk, threads, planes;
    size_t u, per_thread, v, m, xcopy, ycopy, total; /* offsets and sizes in bytes */
} wino_layout;

static size_t up64(size_t n) { return (n + 63) / 64 * 64; }

static wino_layout layout_of(kiln_wino_pass pass, const kiln_wino_shape *s, int threads) {
    wino_layout l;
    pass_channels(pass, s, &l.cin, &l.cout);
    int64_t tiles = tiles_of(s), P = l.planes = planes_of(s);
    l.chunk = chunk_of(l.cin, l.cout, P, tiles, threads < 1 ? 1 : threads);
    l.threads = threads < 1 ? 1 : threads > tiles ? (int)tiles : threads;
    size_t f = sizeof(float);
    size_t u_bytes = pass == KILN_WINO_BWD_WEIGHTS ? (size_t)l.threads * up64((size_t)(P * s->c * s->k) * f)
                                                   : up64((size_t)(P * l.cin * l.cout) * f);
    l.v = up64((size_t)(P * l.chunk * l.cin) * f);
    l.m = up64((size_t)(P * l.chunk * l.cout) * f);
    l.u = 0;
    l.per_thread = u_bytes;
    size_t at = u_bytes + (size_t)l.threads * (l.v + l.m);
    /* The plain activations: copies in nChw8c. x is the transformed input
     * of every pass but the input gradient's, whose transformed input is y. */
    l.xcopy = l.ycopy = 0;
    size_t x_bytes = up64((size_t)(s->n * s->c * s->h * s->w) * f), y_bytes = up64((size_t)(s->n * s->k * s->h * s->w) * f);
    if (s->xb == 0) l.xcopy = at, at += x_bytes;
    if (s->yb == 0) l.ycopy = at, at += y_bytes;
    l.total = at;
    return l;
}

size_t kiln_wino_workspace(kiln_wino_pass pass, const kiln_wino_shape *s) {
    return layout_of(pass, s, threads_max()).total;
}

void kiln_wino_split(kiln_wino_pass pass, const kiln_wino_shape *s, int threads, int tid, int64_t *tiles,
                     int64_t *lo, int64_t *hi, int64_t *chunk) {
    wino_layout l = layout_of(pass, s, threads);
    *tiles = tiles_of(s), *chunk = l.chunk;
    if (tid >= l.threads) *lo = *hi = *tiles; /* fewer tiles than threads: not in the team */
    else thread_tiles(*tiles, tid, (int)l.threads, lo, hi);
}

#if WINO_X86

/* An activation as the kernels address it: channel c, row h, column w of
 * image n in a blocked layout of block b (8 or 16). */
typedef struct act {
    float *p;
    int64_t ch, h, w, b;
} act;

/* (n, c0, 0, 0), c0 a multiple of 8; the block is 8 or 16 (shifts, not
 * divisions: this is called per tile). Element (h, w) of the 8 channels
 * from c0 is at (h * w_size + w) * b from it. */
static inline float *act_base(const act *a, int64_t n, int64_t c0) {
    int sh = a->b == 16 ? 4 : 3;
    return a->p + (n * (a->ch >> sh) + (c0 >> sh)) * a->h * a->w * a->b + (c0 & (a->b - 1));
}

/* The pooled forward's outputs (kiln_wino_buffers.pool_y): 2x2 windows of
 * y at stride 2, oh x ow planes in y's block layout b; y_w is y's width
 * (the indices' row stride). */
typedef struct pooled {
    float *y;
    int64_t *ix;
    int64_t ch, oh, ow, b, y_w;
} pooled;

/* Offset of (n, c0, 0, 0) in the pooled planes, as act_base. */
static inline int64_t pooled_base(const pooled *p, int64_t n, int64_t c0) {
    int sh = p->b == 16 ? 4 : 3;
    return (n * (p->ch >> sh) + (c0 >> sh)) * p->oh * p->ow * p->b + (c0 & (p->b - 1));
}

/* ---- transforms ---------------------------------------------------------------------- */

/* g[i][j]: tap (i, j) of the 3x3 filters from input channel ci to output
 * channels co..co+7 as one vector; flip: the input gradient's (rot180 of
 * w[ci][co], w indexed [k][c] as OIHW). */
AVX2 static void gather_filters(const float *w, int64_t ci, int64_t co, int64_t cin, int64_t cout, bool flip,
                                v8 g[3][3]) {
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) {
            int tap = flip ? (2 - i) * 3 + (2 - j) : i * 3 + j;
            float lane[8];
            for (int e = 0; e < 8; e++)
                lane[e] = flip ? w[(ci * cout + co + e) * 9 + tap] : w[((co + e) * cin + ci) * 9 + tap];
            g[i][j] = *(const v8u *)lane;
        }
}

/* U[xi][ci][co] = (G g G^T)[xi] with g the 3x3 filter from input channel ci
 * to output channel co; flip: the input gradient's filters (rot180 of
 * w[ci][co], w indexed [k][c] as OIHW). Eight output channels at once
 * (cout is a multiple of 8): their 3x3 filters gathered, transformed in
 * vectors, stored contiguous in each of the 16 planes. */
AVX2 static void weights_transform(const float *w, float *u, int64_t cin, int64_t cout, bool flip) {
#pragma omp parallel for schedule(static)
    for (int64_t ci = 0; ci < cin; ci++)
        for (int64_t co = 0; co < cout; co += 8) {
            v8 g[3][3];
            gather_filters(w, ci, co, cin, cout, flip, g);
            const v8 half = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
            v8 t[4][3]; /* G g */
            for (int j = 0; j < 3; j++) {
                t[0][j] = g[0][j];
                t[1][j] = half * (g[0][j] + g[1][j] + g[2][j]);
                t[2][j] = half * (g[0][j] - g[1][j] + g[2][j]);
                t[3][j] = g[2][j];
            }
            for (int i = 0; i < 4; i++) {
                v8 r[4] = {t[i][0], half * (t[i][0] + t[i][1] + t[i][2]), half * (t[i][0] - t[i][1] + t[i][2]), t[i][2]};
                for (int j = 0; j < 4; j++) *(v8u *)(u + ((int64_t)(i * 4 + j) * cin + ci) * cout + co) = r[j];
            }
        }
}

/* dW[k][c] = G^T S[c][k] G, summing the threads' S (in thread order), eight
 * output channels at once. */
AVX2 static void weights_grad_transform(const float *s, int64_t threads, size_t thread_stride, float *dw, int64_t c,
                                        int64_t k) {
#pragma omp parallel for schedule(static)
    for (int64_t ci = 0; ci < c; ci++)
        for (int64_t co = 0; co < k; co += 8) {
            v8 m[4][4];
            for (int xi = 0; xi < 16; xi++) {
                v8 acc = *(const v8u *)(s + ((int64_t)xi * c + ci) * k + co);
                for (int64_t t = 1; t < threads; t++)
                    acc += *(const v8u *)(s + (size_t)t * thread_stride + ((int64_t)xi * c + ci) * k + co);
                m[xi / 4][xi % 4] = acc;
            }
            const v8 half = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
            v8 t[3][4]; /* G^T m */
            for (int j = 0; j < 4; j++) {
                t[0][j] = m[0][j] + half * (m[1][j] + m[2][j]);
                t[1][j] = half * (m[1][j] - m[2][j]);
                t[2][j] = half * (m[1][j] + m[2][j]) + m[3][j];
            }
            v8 o[9];
            for (int i = 0; i < 3; i++) {
                o[i * 3 + 0] = t[i][0] + half * (t[i][1] + t[i][2]);
                o[i * 3 + 1] = half * (t[i][1] - t[i][2]);
                o[i * 3 + 2] = half * (t[i][1] + t[i][2]) + t[i][3];
            }
            for (int e = 0; e < 8; e++) {
                float *out = dw + ((co + e) * c + ci) * 9;
                for (int tap = 0; tap < 9; tap++) out[tap] = o[tap][e];
            }
        }
}

/* V[xi][p][c0..c0+7] = (B^T d B)[xi] for the 4x4 input tile whose top-left
 * is (h0, w0) (zeros outside the image). */
AVX2 static void input_tile(const act *x, const float *base, int64_t h0, int64_t w0, float *v, size_t xi_stride) {
    v8 d[4][4];
    const v8 zero = {0};
    int64_t rs = x->w * x->b, cs = x->b;
    if (h0 >= 0 && w0 >= 0 && h0 + 4 <= x->h && w0 + 4 <= x->w) {
        const float *p = base + h0 * rs + w0 * cs;
        for (int r = 0; r < 4; r++)
            for (int q = 0; q < 4; q++) d[r][q] = *(const v8u *)(p + r * rs + q * cs);
    } else {
        for (int r = 0; r < 4; r++)
            for (int q = 0; q < 4; q++) {
                int64_t h = h0 + r, w = w0 + q;
                d[r][q] = h >= 0 && h < x->h && w >= 0 && w < x->w ? *(const v8u *)(base + h * rs + w * cs) : zero;
            }
    }
    v8 t[4][4]; /* B^T d */
    for (int q = 0; q < 4; q++) {
        t[0][q] = d[0][q] - d[2][q];
        t[1][q] = d[1][q] + d[2][q];
        t[2][q] = d[2][q] - d[1][q];
        t[3][q] = d[1][q] - d[3][q];
    }
    for (int i = 0; i < 4; i++) {
        *(v8u *)(v + (size_t)(i * 4 + 0) * xi_stride) = t[i][0] - t[i][2];
        *(v8u *)(v + (size_t)(i * 4 + 1) * xi_stride) = t[i][1] + t[i][2];
        *(v8u *)(v + (size_t)(i * 4 + 2) * xi_stride) = t[i][2] - t[i][1];
        *(v8u *)(v + (size_t)(i * 4 + 3) * xi_stride) = t[i][1] - t[i][3];
    }
}

/* Z[xi][p][k0..k0+7] = (A e A^T)[xi] for the 2x2 output-gradient tile e at
 * (h0, w0) (zeros outside the image). */
AVX2 static void grad_tile(const act *y, const float *base, int64_t h0, int64_t w0, float *z, size_t xi_stride) {
    v8 e[2][2];
    const v8 zero = {0};
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++)
            e[a][b] = h0 + a < y->h && w0 + b < y->w ? *(const v8u *)(base + ((h0 + a) * y->w + w0 + b) * y->b) : zero;
    v8 u[4][2]; /* A e */
    for (int b = 0; b < 2; b++) {
        u[0][b] = e[0][b];
        u[1][b] = e[0][b] + e[1][b];
        u[2][b] = e[0][b] - e[1][b];
        u[3][b] = -e[1][b];
    }
    for (int i = 0; i < 4; i++) {
        *(v8u *)(z + (size_t)(i * 4 + 0) * xi_stride) = u[i][0];
        *(v8u *)(z + (size_t)(i * 4 + 1) * xi_stride) = u[i][0] + u[i][1];
        *(v8u *)(z + (size_t)(i * 4 + 2) * xi_stride) = u[i][0] - u[i][1];
        *(v8u *)(z + (size_t)(i * 4 + 3) * xi_stride) = -u[i][1];
    }
}

/* A^T m A of the 4x4 tile m (planes xi_stride apart): the 2x2 outputs. */
AVX2 static inline void tile2_out(const float *m, size_t xi_stride, v8 o[2][2]) {
    v8 mm[4][4];
    for (int xi = 0; xi < 16; xi++) mm[xi / 4][xi % 4] = *(const v8u *)(m + (size_t)xi * xi_stride);
    v8 s[2][4]; /* A^T m */
    for (int q = 0; q < 4; q++) {
        s[0][q] = mm[0][q] + mm[1][q] + mm[2][q];
        s[1][q] = mm[1][q] - mm[2][q] - mm[3][q];
    }
    for (int a = 0; a < 2; a++) {
        o[a][0] = s[a][0] + s[a][1] + s[a][2];
        o[a][1] = s[a][1] - s[a][2] - s[a][3];
    }
}

/* y's 2x2 tile at (h0, w0), channels k0..k0+7: A^T m A, plus the bias, ReLU. */
AVX2 static void output_tile(const float *m, size_t xi_stride, const float *bias, bool relu, const act *y, float *base,
                             int64_t h0, int64_t w0) {
    v8 o[2][2];
    tile2_out(m, xi_stride, o);
    const v8 zero = {0};
    v8 bv = bias ? *(const v8u *)bias : zero;
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++) {
            if (h0 + a >= y->h || w0 + b >= y->w) continue;
            v8 r = o[a][b] + bv;
            if (relu) r = (v8)((v8i)r & (r > zero)); /* NaN -> 0, as oneDNN's ReLU post-op */
            *(v8u *)(base + ((h0 + a) * y->w + w0 + b) * y->b) = r;
        }
}

/* F(4x4) and F(6x6): matrices, filter transforms and tile passes */
#include "kernels/cpu/onednn/onednn_winograd_tiles.h"

/* ---- pooled outputs -------------------------------------------------------------------- */

/* relu_max_pool2d's 2x2 window over a (0, 0), b (0, 1), c (1, 0) and d
 * (1, 1) of 8 channels, the window's first element at plane index i0 of
 * y: the pooling rows' comparisons in their order (a later value wins when
 * greater or NaN; nothing positive: 0 and the first index), so the same
 * bits as kiln_blocked_relu_max_pool2d on the stored y. */
AVX2 static inline void pool_store(v8 a, v8 b, v8 c, v8 d, int64_t i0, int64_t w, float *y, int64_t *ix) {
    v8 best = a;
    v8i at = {0}, t;
    t = (b > best) | (b != b);
    best = (v8)(((v8i)b & t) | ((v8i)best & ~t)), at = (t & 1) | (at & ~t);
    t = (c > best) | (c != c);
    best = (v8)(((v8i)c & t) | ((v8i)best & ~t)), at = (t & 2) | (at & ~t);
    t = (d > best) | (d != d);
    best = (v8)(((v8i)d & t) | ((v8i)best & ~t)), at = (t & 3) | (at & ~t);
    const v8 zero = {0};
    v8i keep = (best > zero) | (best != best);
    *(v8u *)y = (v8)((v8i)best & keep);
    /* the window offset (0, 1, w, w + 1) in 32 bits, widened to 64 in registers */
    __m256i off = (__m256i)(((at & keep) & 1) + ((at & keep) >> 1) * (int32_t)w), base = _mm256_set1_epi64x(i0);
    _mm256_storeu_si256((__m256i *)ix, _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(off)), base));
    _mm256_storeu_si256((__m256i *)(ix + 4),
                        _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_extracti128_si256(off, 1)), base));
}

/* The windows of y's 2x2 tile at (h0, w0) (h0, w0 even), channels k0..k0+7
 * of image n: output_tile's values without ReLU, pooled. */
AVX2 static void output_tile_pool(const float *m, size_t xi_stride, const float *bias, const pooled *p, int64_t n,
                                  int64_t k0, int64_t h0, int64_t w0) {
    if (h0 / 2 >= p->oh || w0 / 2 >= p->ow) return;
    v8 r[2][2];
    tile2_out(m, xi_stride, r);
    const v8 zero = {0};
    v8 bv = bias ? *(const v8u *)bias : zero;
    for (int a = 0; a < 2; a++) r[a][0] += bv, r[a][1] += bv;
    int64_t at = pooled_base(p, n, k0) + (h0 / 2 * p->ow + w0 / 2) * p->b;
    pool_store(r[0][0], r[0][1], r[1][0], r[1][1], h0 * p->y_w + w0, p->y_w, p->y + at, p->ix + at);
}

/* The (M / 2)^2 windows of y's M x M tile at (h0, w0) (M 4 or 6), as
 * output_tile_pool: a pair of rows at a time. */
TILE_BODY void output_tile_pool_n(int M, wino_tx at_, const float *m, size_t xi_stride, const float *bias,
                                  const pooled *p, int64_t n, int64_t k0, int64_t h0, int64_t w0) {
    if (h0 / 2 >= p->oh || w0 / 2 >= p->ow) return;
    v8 s[6][8];
    tile_at_m(M, at_, m, xi_stride, s);
    const v8 zero = {0};
    v8 bv = bias ? *(const v8u *)bias : zero;
    int64_t base = pooled_base(p, n, k0);
    for (int i = 0; i < M / 2 && h0 / 2 + i < p->oh; i++) {
        v8 r0[6], r1[6];
        at_(s[2 * i], 1, r0, 1);
        at_(s[2 * i + 1], 1, r1, 1);
        for (int b = 0; b < M; b++) r0[b] += bv, r1[b] += bv;
        for (int j = 0; j < M / 2 && w0 / 2 + j < p->ow; j++) {
            int64_t at = base + ((h0 / 2 + i) * p->ow + w0 / 2 + j) * p->b;
            pool_store(r0[2 * j], r0[2 * j + 1], r1[2 * j], r1[2 * j + 1], (h0 + 2 * i) * p->y_w + w0 + 2 * j,
                       p->y_w, p->y + at, p->ix + at);
        }
    }
}
AVX2 static void output_tile4_pool(const float *m, size_t xi_stride, const float *bias, const pooled *p, int64_t n,
                                   int64_t k0, int64_t h0, int64_t w0) {
    output_tile_pool_n(4, at6, m, xi_stride, bias, p, n, k0, h0, w0);
}
AVX2 static void output_tile6_pool(const float *m, size_t xi_stride, const float *bias, const pooled *p, int64_t n,
                                   int64_t k0, int64_t h0, int64_t w0) {
    output_tile_pool_n(6, at8, m, xi_stride, bias, p, n, k0, h0, w0);
}

/* ---- the passes ---------------------------------------------------------------------- */

typedef struct tile_pos {
    int64_t n, h0, w0;
} tile_pos;

static tile_pos tile_at(const kiln_wino_shape *s, int64_t t) {
    int64_t m = tile_of(s), th = (grid_h(s) + m - 1) / m, tw = (grid_w(s) + m - 1) / m;
    tile_pos p = {t / (th * tw), (t / tw) % th * m, t % tw * m};
    return p;
}

/* The calling thread's transform buffers: V, then M (or Z) after it. */
static float *thread_buffers(const wino_layout *l, char *ws) {
    int tid = 0;
#ifdef _OPENMP
    tid = omp_get_thread_num();
#endif
    return (float *)(ws + l->per_thread + (size_t)tid * (l->v + l->m));
}

/* The calling thread's share of the tiles (thread_tiles); its number in
 * *tid, and how many threads share them in *team. */
static void team_tiles(int64_t tiles, int *tid, int *team, int64_t *lo, int64_t *hi) {
    *tid = 0, *team = 1;
#ifdef _OPENMP
    *tid = omp_get_thread_num(), *team = omp_get_num_threads();
#endif
    thread_tiles(tiles, *tid, *team, lo, hi);
}

/* V for the pc tiles from t0 of `in` (cin channels), rows of a chunk. */
static void input_chunk(const kiln_wino_shape *s, const act *in, int64_t t0, int64_t pc, int64_t cin, int64_t chunk,
                        float *v) {
    for (int64_t p = 0; p < pc; p++) {
        tile_pos tp = tile_at(s, t0 + p);
        for (int64_t c0 = 0; c0 < cin; c0 += 8) {
            const float *base = act_base(in, tp.n, c0);
            (s->m == 6   ? input_tile6
             : s->m == 4 ? input_tile4
                         : input_tile)(in, base, tp.h0 - 1, tp.w0 - 1, v + p * cin + c0, (size_t)(chunk * cin));
        }
    }
}

/* The forward of `in` (cin channels) into `out` (cout channels) with the
 * transformed filters u; the input gradient is this with flipped filters. */
static kiln_status forward_tiles(const kiln_wino_shape *s, const wino_layout *l, const act *in, const float *u,
                                 const float *bias, bool relu, const act *out, const pooled *pool, char *ws) {
    int64_t tiles = tiles_of(s);
    int64_t cin = l->cin, cout = l->cout, chunk = l->chunk;
    /* each thread's share's number of chunks, for every thread: chunks of
     * equal size (within one tile), none larger than the buffers' chunk */
    int64_t share = (tiles + l->threads - 1) / l->threads, n_chunks = l->threads * ((share + chunk - 1) / chunk);
#pragma omp parallel num_threads((int)l->threads)
    {
        float *v = thread_buffers(l, ws), *m = (float *)((char *)v + l->v);
#pragma omp for schedule(dynamic, 1)
        for (int64_t ci = 0; ci < n_chunks; ci++) {
            int64_t t0 = tiles * ci / n_chunks, pc = tiles * (ci + 1) / n_chunks - t0;
            if (pc <= 0) continue;
            input_chunk(s, in, t0, pc, cin, chunk, v);
            for (int xi = 0; xi < l->planes; xi++)
                kiln_cpu_gemm_avx2(pc, cout, cin, v + (size_t)xi * chunk * cin, cin, 1, u + (size_t)xi * cin * cout,
                                   cout, m + (size_t)xi * chunk * cout, cout, false);
            for (int64_t p = 0; p < pc; p++) {
                tile_pos tp = tile_at(s, t0 + p);
                if (pool) {
                    for (int64_t k0 = 0; k0 < cout; k0 += 8)
                        (s->m == 6   ? output_tile6_pool
                         : s->m == 4 ? output_tile4_pool
                                     : output_tile_pool)(m + p * cout + k0, (size_t)(chunk * cout),
                                                         bias ? bias + k0 : NULL, pool, tp.n, k0, tp.h0, tp.w0);
                    continue;
                }
                for (int64_t k0 = 0; k0 < cout; k0 += 8)
                    (s->m == 6   ? output_tile6
                     : s->m == 4 ? output_tile4
                                 : output_tile)(m + p * cout + k0, (size_t)(chunk * cout), bias ? bias + k0 : NULL,
                                                relu, out, act_base(out, tp.n, k0), tp.h0, tp.w0);
            }
        }
    }
    return KILN_OK;
}

static kiln_status weight_grad_tiles(const kiln_wino_shape *s, const wino_layout *l, const act *x, const act *gy,
                                     float *dw, char *ws) {
    int64_t tiles = tiles_of(s);
    int64_t c = s->c, k = s->k, chunk = l->chunk;
    size_t s_stride = up64((size_t)(l->planes * c * k) * sizeof(float)) / sizeof(float);
    float *sums = (float *)ws;
    int team = 1;
#pragma omp parallel num_threads((int)l->threads)
    {
        int64_t lo, hi;
        int tid, n;
        team_tiles(tiles, &tid, &n, &lo, &hi);
        if (tid == 0) team = n;
        float *st = sums + (size_t)tid * s_stride;
        memset(st, 0, (size_t)(l->planes * c * k) * sizeof(float));
        float *v = thread_buffers(l, ws), *z = (float *)((char *)v + l->v);
        for (int64_t t0 = lo; t0 < hi; t0 += chunk) {
            int64_t pc = hi - t0 < chunk ? hi - t0 : chunk;
            input_chunk(s, x, t0, pc, c, chunk, v);
            for (int64_t p = 0; p < pc; p++) {
                tile_pos tp = tile_at(s, t0 + p);
                for (int64_t k0 = 0; k0 < k; k0 += 8)
                    (s->m == 6   ? grad_tile6
                     : s->m == 4 ? grad_tile4
                                 : grad_tile)(gy, act_base(gy, tp.n, k0), tp.h0, tp.w0, z + p * k + k0,
                                              (size_t)(chunk * k));
            }
            for (int xi = 0; xi < l->planes; xi++)
                kiln_cpu_gemm_avx2(c, k, pc, v + (size_t)xi * chunk * c, 1, c, z + (size_t)xi * chunk * k, k,
                                   st + (size_t)xi * c * k, k, true);
        }
    }
    /* the sums of the threads that ran, in thread order */
    (s->m == 6   ? weights_grad_transform6
     : s->m == 4 ? weights_grad_transform4
                 : weights_grad_transform)(sums, team, s_stride, dw, c, k);
    return KILN_OK;
}

/* The plain NCHW tensor t as nChw8c in copy (to_blocked), or back. */
static void blocked_copy(float *copy, float *t, int64_t n, int64_t ch, int64_t h, int64_t w, bool to_blocked) {
    int64_t shape[4] = {n, ch, h, w};
    if (to_blocked) kiln_cpu_reorder_blocked(copy, t, sizeof(float), shape, 8, true);
    else kiln_cpu_reorder_blocked(t, copy, sizeof(float), shape, 8, false);
}

size_t kiln_wino_weights_size(kiln_wino_pass pass, const kiln_wino_shape *s) {
    (void)pass;
    return (size_t)(planes_of(s) * s->c * s->k);
}

typedef void (*filters_fn)(const float *w, float *u, int64_t cin, int64_t cout, bool flip);
static filters_fn filters_transform(const kiln_wino_shape *s) {
    return s->m == 6 ? weights_transform6 : s->m == 4 ? weights_transform4 : weights_transform;
}

void kiln_wino_weights(kiln_wino_pass pass, const kiln_wino_shape *s, const float *w, float *u) {
    int64_t cin, cout;
    pass_channels(pass, s, &cin, &cout);
    filters_transform(s)(w, u, cin, cout, pass == KILN_WINO_BWD_DATA);
}

kiln_status kiln_wino_run(kiln_wino_pass pass, const kiln_wino_shape *s, const kiln_wino_buffers *b, void *workspace,
                          size_t workspace_bytes) {
    if (!kiln_wino_cpu_ok() || !kiln_wino_shape_ok(s))
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "Winograd convolution: unsupported shape or CPU");
    wino_layout l = layout_of(pass, s, threads_max());
    if (workspace_bytes < l.total || !workspace)
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "Winograd convolution: workspace of %zu bytes, it needs %zu",
                          workspace_bytes, l.total);
    if (b->pool_y && (pass != KILN_WINO_FWD || !s->yb || b->relu || !b->pool_ix || s->h < 2 || s->w < 2))
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL,
                          "Winograd convolution: pooling needs the forward, a blocked output, no ReLU post-op, "
                          "indices and a 2x2 output at least");
    if (s->pool && pass != KILN_WINO_BWD_WEIGHTS && !(pass == KILN_WINO_FWD && b->pool_y && s->pool == 2))
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL,
                          "Winograd convolution: a pooled shape is the weight gradient's or a forward that pools "
                          "its 2x2 windows (pool_y), else rows of y would not be written");
    char *ws = workspace;
    act x = {b->x, s->c, s->h, s->w, s->xb ? s->xb : 8}, y = {b->y, s->k, s->h, s->w, s->yb ? s->yb : 8};
    if (!s->xb) x.p = (float *)(ws + l.xcopy);
    if (!s->yb) y.p = (float *)(ws + l.ycopy);
    /* Inputs to the blocked copies: x but in the input gradient, y in the
     * input gradient and the weight gradient. */
    if (!s->xb && pass != KILN_WINO_BWD_DATA) blocked_copy(x.p, b->x, s->n, s->c, s->h, s->w, true);
    if (!s->yb && pass != KILN_WINO_FWD) blocked_copy(y.p, b->y, s->n, s->k, s->h, s->w, true);
    kiln_status st;
    if (pass == KILN_WINO_BWD_WEIGHTS) {
        st = weight_grad_tiles(s, &l, &x, &y, b->w_out, ws);
    } else {
        const float *u = b->u;
        if (!u) {
            filters_transform(s)(b->w, (float *)(ws + l.u), l.cin, l.cout, pass == KILN_WINO_BWD_DATA);
            u = (const float *)(ws + l.u);
        }
        pooled pool = {b->pool_y, b->pool_ix, s->k, s->h / 2, s->w / 2, s->yb, s->w};
        /* pooled, the tiles cover only the rows and columns the 2x2 windows
         * read (7x7: the top-left 6x6); x and y keep their sizes in x, y */
        kiln_wino_shape grid = *s;
        if (b->pool_y) grid.pool = 2;
        st = pass == KILN_WINO_FWD ? forward_tiles(&grid, &l, &x, u, b->bias, b->relu, &y, b->pool_y ? &pool : NULL, ws)
                                   : forward_tiles(s, &l, &y, u, NULL, false, &x, NULL, ws);
    }
    if (st) return st;
    if (!s->yb && pass == KILN_WINO_FWD) blocked_copy(y.p, b->y, s->n, s->k, s->h, s->w, false);
    if (!s->xb && pass == KILN_WINO_BWD_DATA) blocked_copy(x.p, b->x, s->n, s->c, s->h, s->w, false);
    return KILN_OK;
}

#else /* not x86-64 */

size_t kiln_wino_weights_size(kiln_wino_pass pass, const kiln_wino_shape *s) {
    (void)pass;
    return (size_t)(planes_of(s) * s->c * s->k);
}

void kiln_wino_weights(kiln_wino_pass pass, const kiln_wino_shape *s, const float *w, float *u) {
    (void)pass, (void)s, (void)w, (void)u;
}

kiln_status kiln_wino_run(kiln_wino_pass pass, const kiln_wino_shape *s, const kiln_wino_buffers *b, void *workspace,
                          size_t workspace_bytes) {
    (void)pass, (void)s, (void)b, (void)workspace, (void)workspace_bytes;
    return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "Winograd convolution: built for x86-64 only");
}

#endif
#else
typedef int kiln_onednn_winograd_unused; /* ISO C: a translation unit is not empty */
#endif

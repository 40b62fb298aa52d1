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

#include "base/error.h"
#include "kernels/cpu/fast/fast_kernels.h"
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
    return (s->m == 0 || s->m == 2 || s->m == 4 || s->m == 6 || s->m == 46) &&
           (s->pool == 0 || (s->pool >= 2 && s->h >= s->pool && s->w >= s->pool)) && s->n >= 1 && s->c >= 8 &&
           s->k >= 8 && s->c % 8 == 0 && s->k % 8 == 0 && s->h >= 2 && s->w >= 2 &&
           (s->xb == 0 || s->xb == 8 || s->xb == 16) && (s->yb == 0 || s->yb == 8 || s->yb == 16) &&
           (s->xb == 0 || s->c % s->xb == 0) && (s->yb == 0 || s->k % s->yb == 0);
}

/* The square tiles' side (2, 4 or 6; m 0 reads as 2). */
static int tile_of(const kiln_wino_shape *s) { return s->m == 4 || s->m == 6 ? s->m : 2; }

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

/* ---- F(4x4) and F(6x6) together ------------------------------------------------------
 *
 * A side that is not a multiple of 4 wastes F(4x4)'s products: 14 takes
 * four tiles of 4 (16), 6 x 4 = 24 transformed points. The mixed tiling
 * (m 46) cuts each side into a run of 4-tiles then a run of 6-tiles, as
 * many of each as cover it with the fewest points (6 a 4-tile, 8 a
 * 6-tile; fewer 6-tiles on a tie): 14 = 4 + 4 + 6, 20 points, so a 14x14
 * plane takes 400 products an image and channel pair against 576. The
 * plane is then up to four regions, each tiled with one tile: 4x4 rows
 * and columns of 4-tiles, 4x6 (F(4x4)'s rows, F(6x6)'s columns), 6x4 and
 * 6x6, each a pass of its own over its region with its own filters
 * (kiln_wino_weights holds all four: 36 + 48 + 48 + 64 planes). Every tile
 * starts on an even row and column and has an even side, so a pooling
 * pools within tiles as before. Each output is one tile's, so the
 * forward and the input gradient keep their bits for any thread count;
 * the weight gradient adds the regions' gradients in region order. */

/* A region of the output tiled with mr x mc tiles: th tiles down from row
 * r0 and tw across from column c0 in each image (the last ones may reach
 * past the plane: their outputs there are not written, their inputs are
 * zeros). */
typedef struct tile_grid {
    int mr, mc;
    int64_t r0, c0, th, tw;
} tile_grid;

static int grid_planes(const tile_grid *g) { return (g->mr + 2) * (g->mc + 2); }
static int64_t grid_tiles(const kiln_wino_shape *s, const tile_grid *g) { return s->n * g->th * g->tw; }

/* The side `len` as *n4 tiles of 4 then *n6 of 6 (the fewest points). */
static void split_side(int64_t len, int64_t *n4, int64_t *n6) {
    int64_t best = -1;
    *n4 = *n6 = 0;
    for (int64_t b = 0; b <= (len + 5) / 6; b++) {
        int64_t a = len > 6 * b ? (len - 6 * b + 3) / 4 : 0;
        if (best < 0 || 6 * a + 8 * b < best) best = 6 * a + 8 * b, *n4 = a, *n6 = b;
    }
}

/* The regions of the pass, in order: one for a square tile; for the mixed
 * tiling those of 4x4, 4x6, 6x4 and 6x6 tiles that are not empty. */
static int grids_of(const kiln_wino_shape *s, tile_grid g[4]) {
    int64_t h = grid_h(s), w = grid_w(s);
    if (s->m != 46) {
        int m = tile_of(s);
        g[0] = (tile_grid){m, m, 0, 0, (h + m - 1) / m, (w + m - 1) / m};
        return 1;
    }
    int64_t r4, r6, c4, c6, n = 0;
    split_side(h, &r4, &r6);
    split_side(w, &c4, &c6);
    const int64_t rows[2][3] = {{4, 0, r4}, {6, 4 * r4, r6}}, cols[2][3] = {{4, 0, c4}, {6, 4 * c4, c6}};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            if (rows[i][2] && cols[j][2])
                g[n++] = (tile_grid){(int)rows[i][0], (int)cols[j][0], rows[i][1], cols[j][1], rows[i][2], cols[j][2]};
    return (int)n;
}

/* Where a tile's transformed filters start in kiln_wino_weights' planes:
 * the mixed tiling's four tiles one after another (4x4, 4x6, 6x4, 6x6),
 * whichever regions a shape has, so the copy does not depend on the plane. */
static int filters_plane(const kiln_wino_shape *s, const tile_grid *g) {
    if (s->m != 46) return 0;
    return g->mr == 4 ? (g->mc == 4 ? 0 : 36) : (g->mc == 4 ? 84 : 132);
}
static int filters_planes(const kiln_wino_shape *s) {
    int m = tile_of(s);
    return s->m == 46 ? 196 : (m + 2) * (m + 2);
}

/* The pooled input gradient's edge filters after the tiles' (pooled_edges),
 * where the pooling leaves rows or columns: planes of cin x cout, w's taps
 * (2, v) and (u, 2) (6), then their 1D F(6, 3) transforms along the row
 * and along the column (8 each). */
static int edge_planes(kiln_wino_pass pass, const kiln_wino_shape *s) {
    return pass == KILN_WINO_BWD_DATA && s->pool && (s->h % s->pool || s->w % s->pool) ? 22 : 0;
}

/* Per-thread floats of the edges' products: EDGE_ROWS points' A (3k
 * each) and results (c each), or EDGE_ROWS / 2 1D tiles' V and M (8 planes
 * of k and of c each), the larger. */
#define EDGE_ROWS 48
static size_t edge_scratch(const kiln_wino_shape *s) {
    size_t direct = (size_t)EDGE_ROWS * (size_t)(3 * s->k + s->c);
    size_t tiles = (size_t)EDGE_ROWS / 2 * 8 * (size_t)(s->k + s->c);
    return direct > tiles ? direct : tiles;
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

/* Floats from one plane of a chunk's V, M or Z (chunk x ch floats) to the
 * next: padded to a whole, odd number of 64-byte lines. A tile's pass
 * touches the same row of every plane (16 to 64 of them), and with a line
 * count sharing a factor 2^j with the L1's 64 sets those rows fell into
 * 64 / 2^j sets: 4096 bytes apart (a power of two of channels and tiles),
 * all 36 of F(4x4) in one set and the passes took 1.3-1.45x the time;
 * odd, each plane's row its own set. */
static int64_t plane_floats(int64_t chunk, int64_t ch) {
    int64_t f = (chunk * ch + 15) / 16 * 16;
    return (f / 16) % 2 ? f : f + 16;
}

/* Thread tid's tiles of `threads`: [*lo, *hi). */
static void thread_tiles(int64_t tiles, int tid, int threads, int64_t *lo, int64_t *hi) {
    *lo = tiles * tid / threads;
    *hi = tiles * (tid + 1) / threads;
}

/* Workspace layout, in floats, 64-byte aligned pieces:
 *   U (16 x cin x cout; forward and input gradient) or the per-thread sums
 *   S (threads x 16 x c x k; weight gradient), then per thread V and M
 *   (16 x chunk x cin, 16 x chunk x cout), then the blocked copies of
 *   plain activations (x and y as nChw8c). */
typedef struct wino_layout {
    int64_t cin, cout, team; /* team: the threads asked for */
    int64_t chunk, threads, planes; /* a region's (region_layout) */
    size_t u, per_thread, v, m, xcopy, ycopy, edges, total; /* offsets and sizes in bytes, for the largest region */
} wino_layout;

static size_t up64(size_t n) { return (n + 63) / 64 * 64; }

/* Floats from one thread's per-thread sums to the next's in a region
 * (weight_grad_tiles). */
static size_t sums_stride(const tile_grid *g, const kiln_wino_shape *s) {
    return up64((size_t)(grid_planes(g) * s->c * s->k) * sizeof(float)) / sizeof(float);
}

/* The layout for region g: its planes, chunk and threads. */
static wino_layout region_layout(const wino_layout *all, const kiln_wino_shape *s, const tile_grid *g) {
    wino_layout l = *all;
    int64_t tiles = grid_tiles(s, g);
    l.planes = grid_planes(g);
    l.chunk = chunk_of(l.cin, l.cout, l.planes, tiles, (int)l.team);
    l.threads = l.team > tiles ? tiles : l.team;
    return l;
}

static wino_layout layout_of(kiln_wino_pass pass, const kiln_wino_shape *s, int threads) {
    wino_layout l = {0};
    pass_channels(pass, s, &l.cin, &l.cout);
    l.team = threads < 1 ? 1 : threads;
    size_t f = sizeof(float);
    tile_grid g[8];
    int n0 = grids_of(s, g), n = n0;
    size_t u_bytes = pass == KILN_WINO_BWD_WEIGHTS
                         ? 0
                         : up64((size_t)((filters_planes(s) + edge_planes(pass, s)) * l.cin * l.cout) * f);
    l.v = l.m = 0;
    l.threads = 1;
    /* a forward may pool its tiles (kiln_wino_buffers.pool_y), whose regions
     * cover only the rows and columns the windows read: room for those too */
    kiln_wino_shape pooled_s = *s;
    pooled_s.pool = 2;
    if (pass == KILN_WINO_FWD && !s->pool && s->h >= 2 && s->w >= 2) n += grids_of(&pooled_s, g + n);
    for (int i = 0; i < n; i++) {
        wino_layout r = region_layout(&l, i < n0 ? s : &pooled_s, &g[i]);
        if (r.threads > l.threads) l.threads = r.threads;
        /* the weight gradient's per-thread sums, for one region at a time (weight_grad_tiles) */
        size_t sums = (size_t)l.team * sums_stride(&g[i], s) * f;
        if (pass == KILN_WINO_BWD_WEIGHTS && sums > u_bytes) u_bytes = sums;
        size_t v = up64((size_t)(r.planes * plane_floats(r.chunk, l.cin)) * f),
               m = up64((size_t)(r.planes * plane_floats(r.chunk, l.cout)) * f);
        if (v > l.v) l.v = v;
        if (m > l.m) l.m = m;
    }
    l.u = 0;
    l.per_thread = u_bytes;
    size_t at = u_bytes + (size_t)l.threads * (l.v + l.m);
    /* The plain activations: copies in nChw8c. x is the transformed input
     * of every pass but the input gradient's, whose transformed input is y. */
    l.xcopy = l.ycopy = 0;
    size_t x_bytes = up64((size_t)(s->n * s->c * s->h * s->w) * f);
    size_t y_bytes = up64((size_t)(s->n * s->k * s->h * s->w) * f);
    if (s->xb == 0) l.xcopy = at, at += x_bytes;
    if (s->yb == 0) l.ycopy = at, at += y_bytes;
    /* the pooled input gradient's edges: a matrix product's operands per thread */
    l.edges = 0;
    if (edge_planes(pass, s)) l.edges = at, at += up64((size_t)l.team * edge_scratch(s) * f);
    l.total = at;
    return l;
}

size_t kiln_wino_workspace(kiln_wino_pass pass, const kiln_wino_shape *s) {
    return layout_of(pass, s, kiln_cpu_threads_max()).total;
}

int64_t kiln_wino_products(const kiln_wino_shape *s) {
    tile_grid g[4];
    int n = grids_of(s, g);
    int64_t sum = 0;
    for (int i = 0; i < n; i++) sum += g[i].th * g[i].tw * grid_planes(&g[i]);
    return sum;
}

int kiln_wino_regions(const kiln_wino_shape *s) {
    tile_grid g[4];
    return grids_of(s, g);
}

void kiln_wino_split(kiln_wino_pass pass, const kiln_wino_shape *s, int region, int threads, int tid,
                     int64_t *tiles, int64_t *lo, int64_t *hi, int64_t *chunk) {
    tile_grid g[4];
    int n = grids_of(s, g);
    wino_layout all = layout_of(pass, s, threads);
    wino_layout l = region_layout(&all, s, &g[region < 0 ? 0 : region >= n ? n - 1 : region]);
    *tiles = grid_tiles(s, &g[region < 0 ? 0 : region >= n ? n - 1 : region]), *chunk = l.chunk;
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

/* Every tile's transforms and tile passes: F(2x2), F(4x4), F(6x6) and the
 * mixed tiling's 4x6 and 6x4 */
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

/* The (MR / 2) x (MC / 2) windows of y's MR x MC tile at (h0, w0) (MR and
 * MC 4 or 6), as output_tile_pool: a pair of rows at a time. */
TILE_BODY void output_tile_pool_n(int MR, int MC, wino_tx atr, wino_tx atc, const float *m, size_t xi_stride,
                                  const float *bias, const pooled *p, int64_t n, int64_t k0, int64_t h0, int64_t w0) {
    if (h0 / 2 >= p->oh || w0 / 2 >= p->ow) return;
    v8 s[6][8];
    tile_at_m(MR, MC, atr, m, xi_stride, s);
    const v8 zero = {0};
    v8 bv = bias ? *(const v8u *)bias : zero;
    int64_t base = pooled_base(p, n, k0), rows = p->oh - h0 / 2, cols = p->ow - w0 / 2;
#pragma GCC unroll 3
    for (int i = 0; i < MR / 2; i++) {
        if (i >= rows) break;
        v8 r0[6], r1[6];
        atc(s[2 * i], 1, r0, 1);
        atc(s[2 * i + 1], 1, r1, 1);
#pragma GCC unroll 6
        for (int b = 0; b < MC; b++) r0[b] += bv, r1[b] += bv;
#pragma GCC unroll 3
        for (int j = 0; j < MC / 2; j++) {
            if (j >= cols) break;
            int64_t at = base + ((h0 / 2 + i) * p->ow + w0 / 2 + j) * p->b;
            pool_store(r0[2 * j], r0[2 * j + 1], r1[2 * j], r1[2 * j + 1], (h0 + 2 * i) * p->y_w + w0 + 2 * j,
                       p->y_w, p->y + at, p->ix + at);
        }
    }
}
#define WINO_POOL_FUNCTION(NAME, MR, MC, ATR, ATC)                                                               \
    AVX2 static void output_tile##NAME##_pool(const float *m, size_t xi_stride, const float *bias, const pooled *p, \
                                              int64_t n, int64_t k0, int64_t h0, int64_t w0) {                    \
        output_tile_pool_n(MR, MC, ATR, ATC, m, xi_stride, bias, p, n, k0, h0, w0);                               \
    }
WINO_POOL_FUNCTION(4, 4, 4, at6, at6)
WINO_POOL_FUNCTION(6, 6, 6, at8, at8)
WINO_POOL_FUNCTION(46, 4, 6, at6, at8)
WINO_POOL_FUNCTION(64, 6, 4, at8, at6)

/* Each tile's functions, by the region's tile. */
typedef void (*input_fn)(const act *x, const float *base, int64_t h0, int64_t w0, float *v, size_t xi_stride);
typedef void (*grad_fn)(const act *y, const float *base, int64_t h0, int64_t w0, float *z, size_t xi_stride);
typedef void (*output_fn)(const float *m, size_t xi_stride, const float *bias, bool relu, const act *y, float *base,
                          int64_t h0, int64_t w0);
typedef void (*pool_fn)(const float *m, size_t xi_stride, const float *bias, const pooled *p, int64_t n, int64_t k0,
                        int64_t h0, int64_t w0);
typedef void (*filters_fn)(const float *w, float *u, int64_t cin, int64_t cout, bool flip);
typedef void (*filters_grad_fn)(const float *s, int64_t threads, size_t thread_stride, float *dw, int64_t c,
                                int64_t k, bool acc);
typedef struct tile_fns {
    input_fn input;
    grad_fn grad;
    output_fn output;
    pool_fn pool;
    filters_fn filters;
    filters_grad_fn filters_grad;
} tile_fns;

static tile_fns fns_of(const tile_grid *g) {
    if (g->mr == 4 && g->mc == 4)
        return (tile_fns){input_tile4, grad_tile4, output_tile4, output_tile4_pool, weights_transform4,
                          weights_grad_transform4};
    if (g->mr == 6 && g->mc == 6)
        return (tile_fns){input_tile6, grad_tile6, output_tile6, output_tile6_pool, weights_transform6,
                          weights_grad_transform6};
    if (g->mr == 4 && g->mc == 6)
        return (tile_fns){input_tile46, grad_tile46, output_tile46, output_tile46_pool, weights_transform46,
                          weights_grad_transform46};
    if (g->mr == 6 && g->mc == 4)
        return (tile_fns){input_tile64, grad_tile64, output_tile64, output_tile64_pool, weights_transform64,
                          weights_grad_transform64};
    return (tile_fns){input_tile, grad_tile, output_tile, output_tile_pool, weights_transform, weights_grad_transform};
}

/* ---- the passes ---------------------------------------------------------------------- */

typedef struct tile_pos {
    int64_t n, h0, w0;
} tile_pos;

static tile_pos tile_at(const tile_grid *g, int64_t t) {
    tile_pos p = {t / (g->th * g->tw), g->r0 + (t / g->tw) % g->th * g->mr, g->c0 + t % g->tw * g->mc};
    return p;
}

/* The calling thread's transform buffers: V, then M (or Z) after it. */
static float *thread_buffers(const wino_layout *l, char *ws) {
    const int tid = kiln_cpu_thread_id();
    return (float *)(ws + l->per_thread + (size_t)tid * (l->v + l->m));
}

/* V for the pc tiles from t0 of `in` (cin channels), rows of a chunk. */
static void input_chunk(const tile_grid *g, input_fn input, const act *in, int64_t t0, int64_t pc, int64_t cin,
                        int64_t chunk, float *v) {
    size_t vs = (size_t)plane_floats(chunk, cin);
    for (int64_t p = 0; p < pc; p++) {
        tile_pos tp = tile_at(g, t0 + p);
        for (int64_t c0 = 0; c0 < cin; c0 += 8)
            input(in, act_base(in, tp.n, c0), tp.h0 - 1, tp.w0 - 1, v + p * cin + c0, vs);
    }
}

/* The forward of `in` (cin channels) into `out` (cout channels) over
 * region g with its transformed filters u; the input gradient is this with
 * flipped filters. */
static void forward_tiles(const kiln_wino_shape *s, const tile_grid *g, int regions, const wino_layout *all,
                          const act *in, const float *u, const float *bias, bool relu, const act *out,
                          const pooled *pool, char *ws) {
    /* each region's chunks, one list: per region, each thread's share's
     * number of chunks for every thread, chunks of equal size (within one
     * tile), none larger than the buffers' chunk; handed out as the
     * threads come for them, the regions one after another without a
     * barrier between them */
    wino_layout rl[4];
    int64_t first[5] = {0}, team = 1;
    for (int i = 0; i < regions; i++) {
        rl[i] = region_layout(all, s, &g[i]);
        int64_t tiles = grid_tiles(s, &g[i]), share = (tiles + rl[i].threads - 1) / rl[i].threads;
        first[i + 1] = first[i] + rl[i].threads * ((share + rl[i].chunk - 1) / rl[i].chunk);
        if (rl[i].threads > team) team = rl[i].threads;
    }
    int64_t cin = all->cin, cout = all->cout;
#pragma omp parallel num_threads((int)team)
    {
        float *v = thread_buffers(all, ws), *m = (float *)((char *)v + all->v);
#pragma omp for schedule(dynamic, 1)
        for (int64_t ci = 0; ci < first[regions]; ci++) {
            int i = 0;
            while (ci >= first[i + 1]) i++;
            const tile_grid *gi = &g[i];
            const wino_layout *l = &rl[i];
            tile_fns f = fns_of(gi);
            const float *ug = u + (size_t)filters_plane(s, gi) * cin * cout;
            int64_t tiles = grid_tiles(s, gi), n_chunks = first[i + 1] - first[i], chunk = l->chunk;
            int64_t t0 = tiles * (ci - first[i]) / n_chunks, pc = tiles * (ci - first[i] + 1) / n_chunks - t0;
            if (pc <= 0) continue;
            size_t vs = (size_t)plane_floats(chunk, cin), ms = (size_t)plane_floats(chunk, cout);
            input_chunk(gi, f.input, in, t0, pc, cin, chunk, v);
            for (int xi = 0; xi < l->planes; xi++)
                kiln_cpu_gemm_avx2(pc, cout, cin, v + xi * vs, cin, 1, ug + (size_t)xi * cin * cout, cout, m + xi * ms,
                                   cout, false);
            for (int64_t p = 0; p < pc; p++) {
                tile_pos tp = tile_at(gi, t0 + p);
                for (int64_t k0 = 0; k0 < cout; k0 += 8) {
                    const float *mk = m + p * cout + k0, *bk = bias ? bias + k0 : NULL;
                    if (pool) f.pool(mk, ms, bk, pool, tp.n, k0, tp.h0, tp.w0);
                    else f.output(mk, ms, bk, relu, out, act_base(out, tp.n, k0), tp.h0, tp.w0);
                }
            }
        }
    }
}

/* The weight gradient of region g into dw: its tiles split evenly over
 * the threads (the first min(threads, tiles)), each thread summing its
 * tiles' products into its own sums; then the sums, added in thread order
 * and transformed back, written to dw or (acc: a later region of the mixed
 * tiling) added to it. One region's sums are in the workspace at a time
 * (the mixed tiling's four at once held 196 planes a thread against 64,
 * and one parallel region for all four measured no faster). */
static void weight_grad_tiles(const kiln_wino_shape *s, const tile_grid *g, const wino_layout *all, const act *x,
                              const act *gy, float *dw, bool acc, char *ws) {
    int64_t c = s->c, k = s->k;
    wino_layout l = region_layout(all, s, g);
    tile_fns f = fns_of(g);
    float *sums = (float *)ws;
    size_t stride = sums_stride(g, s);
#pragma omp parallel num_threads((int)l.threads)
    {
        const int tid = kiln_cpu_thread_id();
        float *v = thread_buffers(all, ws), *z = (float *)((char *)v + all->v), *st = sums + (size_t)tid * stride;
        int64_t lo, hi, chunk = l.chunk;
        size_t vs = (size_t)plane_floats(chunk, c), zs = (size_t)plane_floats(chunk, k);
        thread_tiles(grid_tiles(s, g), tid, (int)l.threads, &lo, &hi);
        memset(st, 0, (size_t)(l.planes * c * k) * sizeof(float));
        for (int64_t t0 = lo; t0 < hi; t0 += chunk) {
            int64_t pc = hi - t0 < chunk ? hi - t0 : chunk;
            input_chunk(g, f.input, x, t0, pc, c, chunk, v);
            for (int64_t p = 0; p < pc; p++) {
                tile_pos tp = tile_at(g, t0 + p);
                for (int64_t k0 = 0; k0 < k; k0 += 8)
                    f.grad(gy, act_base(gy, tp.n, k0), tp.h0, tp.w0, z + p * k + k0, zs);
            }
            for (int xi = 0; xi < l.planes; xi++)
                kiln_cpu_gemm_avx2(c, k, pc, v + xi * vs, 1, c, z + xi * zs, k, st + (size_t)xi * c * k, k, true);
        }
    }
    /* the sums of the threads that ran, in thread order */
    f.filters_grad(sums, l.threads, stride, dw, c, k, acc);
}

/* The input gradient of a pooled shape (kiln_wino_shape.pool p): grad_out
 * gy is zero outside its first H' = h / p * p rows and W' columns, the
 * regions tile only those, and the rows and columns of x they leave (an
 * odd side's last) take few taps. At row r >= H', the taps (u, v) reach
 * gy's row r + 1 - u < H' only for u = 2 and r = H': row H' is gy's row
 * H' - 1 convolved with w's row 2 along the columns, and every row after it
 * is zero; column W' likewise with w's column 2 (the rows the tiles cover,
 * and row H' beside them), and the columns after it are zero. Each edge is
 * one matrix product, its points' rows by (tap, gy's channel) by x's
 * channels, over the edge filters e (edge_filters: [tap][k][c], 3k x c
 * for each edge), EDGE_ROWS points at a time per thread: A gathered from
 * gy (zero where a tap falls outside gy's H' x W'), then scattered into x. */

/* Edge `col`'s points from `from` to `count` (false: row H', points (H',
 * q); true: column W', points (r, W')) of every image, directly: the
 * corner (H', W'), whose one tap the 1D tiles leave. */
AVX2 static void edge_product(const kiln_wino_shape *s, bool col, int64_t from, int64_t count, const act *x,
                              const act *gy, const float *e, float *scratch) {
    int64_t H = grid_h(s), W = grid_w(s), K = s->k, C = s->c, span = count - from, rows = s->n * span;
    int64_t chunks = (rows + EDGE_ROWS - 1) / EDGE_ROWS;
    const float *b = e + (col ? 3 * K * C : 0);
#pragma omp parallel for schedule(static)
    for (int64_t ci = 0; ci < chunks; ci++) {
        const int tid = kiln_cpu_thread_id();
        float *a = scratch + (size_t)tid * edge_scratch(s), *out = a + EDGE_ROWS * 3 * K;
        int64_t i0 = ci * EDGE_ROWS, m = rows - i0 < EDGE_ROWS ? rows - i0 : EDGE_ROWS;
        for (int64_t i = 0; i < m; i++) {
            int64_t n = (i0 + i) / span, pt = from + (i0 + i) % span;
            for (int t = 0; t < 3; t++) {
                int64_t gr = col ? pt + 1 - t : H - 1, gc = col ? W - 1 : pt + 1 - t;
                bool in = gr >= 0 && gr < H && gc >= 0 && gc < W;
                float *dst = a + (i * 3 + t) * K;
                for (int64_t k0 = 0; k0 < K; k0 += 8) {
                    const float *src = act_base(gy, n, k0) + (gr * gy->w + gc) * gy->b;
                    *(v8u *)(dst + k0) = in ? *(const v8u *)src : (v8){0};
                }
            }
        }
        /* a tap at a time: its K x C filters stay in L1 across the rows */
        for (int t = 0; t < 3; t++)
            kiln_cpu_gemm_avx2(m, C, K, a + t * K, 3 * K, 1, b + (size_t)t * K * C, C, out, C, t > 0);
        for (int64_t i = 0; i < m; i++) {
            int64_t n = (i0 + i) / span, pt = from + (i0 + i) % span, r = col ? pt : H, q = col ? W : pt;
            for (int64_t c0 = 0; c0 < C; c0 += 8)
                *(v8u *)(act_base(x, n, c0) + (r * x->w + q) * x->b) = *(const v8u *)(out + i * C + c0);
        }
    }
}

/* Edge `col`'s points 0 .. len - 1 (row H' along its first W' columns, or
 * column W' along its first H' rows) of every image in 1D F(6, 3) tiles:
 * each tile's 8 points of gy's row H' - 1 (or column W' - 1) through B^T,
 * 8 products over gy's channels with the transformed taps (edge_filters),
 * A^T back to 6 points of x; 8 products for 6 points against 18 taps.
 * The tiles' rows are (image, tile), EDGE_ROWS / 2 at a time per thread. */
AVX2 static void edge_tiles(const kiln_wino_shape *s, bool col, int64_t len, const act *x, const act *gy,
                            const float *e, float *scratch) {
    int64_t H = grid_h(s), W = grid_w(s), K = s->k, C = s->c, per = (len + 5) / 6, rows = s->n * per;
    const int64_t R = EDGE_ROWS / 2;
    int64_t chunks = (rows + R - 1) / R;
    const float *u = e + (size_t)(6 + (col ? 8 : 0)) * K * C;
#pragma omp parallel for schedule(static)
    for (int64_t ci = 0; ci < chunks; ci++) {
        const int tid = kiln_cpu_thread_id();
        float *v = scratch + (size_t)tid * edge_scratch(s), *m = v + 8 * R * K;
        int64_t i0 = ci * R, rn = rows - i0 < R ? rows - i0 : R;
        for (int64_t i = 0; i < rn; i++) {
            int64_t n = (i0 + i) / per, p0 = (i0 + i) % per * 6;
            for (int64_t k0 = 0; k0 < K; k0 += 8) {
                v8 d[8];
                for (int j = 0; j < 8; j++) {
                    int64_t at = p0 - 1 + j, gr = col ? at : H - 1, gc = col ? W - 1 : at;
                    bool in = gr >= 0 && gr < H && gc >= 0 && gc < W;
                    d[j] = in ? *(const v8u *)(act_base(gy, n, k0) + (gr * gy->w + gc) * gy->b) : (v8){0};
                }
                v8 t[8];
                bt8(d, 1, t, 1);
                for (int xi = 0; xi < 8; xi++) *(v8u *)(v + ((size_t)xi * R + i) * K + k0) = t[xi];
            }
        }
        for (int xi = 0; xi < 8; xi++)
            kiln_cpu_gemm_avx2(rn, C, K, v + (size_t)xi * R * K, K, 1, u + (size_t)xi * K * C, C,
                               m + (size_t)xi * R * C, C, false);
        for (int64_t i = 0; i < rn; i++) {
            int64_t n = (i0 + i) / per, p0 = (i0 + i) % per * 6;
            for (int64_t c0 = 0; c0 < C; c0 += 8) {
                v8 mv[8], o[6];
                for (int xi = 0; xi < 8; xi++) mv[xi] = *(const v8u *)(m + ((size_t)xi * R + i) * C + c0);
                at8(mv, 1, o, 1);
                for (int j = 0; j < 6 && p0 + j < len; j++) {
                    int64_t r = col ? p0 + j : H, q = col ? W : p0 + j;
                    *(v8u *)(act_base(x, n, c0) + (r * x->w + q) * x->b) = o[j];
                }
            }
        }
    }
}

/* x's points the regions g leave: zeros, then row H' and column W' (above). */
AVX2 static void pooled_edges(const kiln_wino_shape *s, const tile_grid *g, int regions, const act *x, const act *gy,
                              const float *e, float *scratch) {
    int64_t H = grid_h(s), W = grid_w(s), ch = 0, cw = 0;
    for (int i = 0; i < regions; i++) {
        int64_t r = g[i].r0 + g[i].th * g[i].mr, c = g[i].c0 + g[i].tw * g[i].mc;
        if (r > ch) ch = r < s->h ? r : s->h;
        if (c > cw) cw = c < s->w ? c : s->w;
    }
    if (ch >= s->h && cw >= s->w) return;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < s->n; n++)
        for (int64_t r = 0; r < s->h; r++)
            for (int64_t q = r < ch ? cw : 0; q < s->w; q++)
                for (int64_t c0 = 0; c0 < s->c; c0 += 8)
                    *(v8u *)(act_base(x, n, c0) + (r * x->w + q) * x->b) = (v8){0};
    /* row H' when no tile covers it: its columns up to W' in 1D tiles, the
     * corner (H', W') from its tap; the columns after it stay zero */
    if (ch == H && H < s->h) {
        edge_tiles(s, false, W, x, gy, e, scratch);
        if (W < s->w) edge_product(s, false, W, W + 1, x, gy, e, scratch);
    }
    /* column W' beside the tiles, and the corner when the tiles cover row H' */
    if (cw == W && W < s->w) {
        edge_tiles(s, true, H, x, gy, e, scratch);
        if (H < ch) edge_product(s, true, H, H + 1, x, gy, e, scratch);
    }
}

/* The plain NCHW tensor t as nChw8c in copy (to_blocked), or back. */
static void blocked_copy(float *copy, float *t, int64_t n, int64_t ch, int64_t h, int64_t w, bool to_blocked) {
    int64_t shape[4] = {n, ch, h, w};
    if (to_blocked) kiln_cpu_reorder_blocked(copy, t, sizeof(float), shape, 8, true);
    else kiln_cpu_reorder_blocked(t, copy, sizeof(float), shape, 8, false);
}

size_t kiln_wino_weights_size(kiln_wino_pass pass, const kiln_wino_shape *s) {
    return (size_t)((filters_planes(s) + edge_planes(pass, s)) * s->c * s->k);
}

/* The pooled input gradient's edge filters (edge_planes) into e: plane v
 * holds w's tap (2, v), plane 3 + u its tap (u, 2), each [k][c] (cin x cout
 * in the pass's names, w OIHW as [k][c]). */
AVX2 static void edge_filters(const float *w, float *e, int64_t k, int64_t c) {
    for (int t = 0; t < 3; t++)
        for (int64_t ki = 0; ki < k; ki++)
            for (int64_t ci = 0; ci < c; ci++) {
                const float *f = w + (ki * c + ci) * 9;
                e[((int64_t)t * k + ki) * c + ci] = f[6 + t];
                e[((int64_t)(3 + t) * k + ki) * c + ci] = f[3 * t + 2];
            }
    /* the 1D tiles' filters: G (F(6, 3)) of the taps in correlation order
     * along the edge, tap 2 first (x's point p takes gy's p + 1 - v with
     * w's v): (2, 2), (2, 1), (2, 0) along the row, (2, 2), (1, 2), (0, 2)
     * down the column; 8 output channels at a time */
    for (int edge = 0; edge < 2; edge++)
        for (int64_t ki = 0; ki < k; ki++)
            for (int64_t c0 = 0; c0 < c; c0 += 8) {
                v8 g[3], o[8];
                for (int t = 0; t < 3; t++) {
                    float lane[8];
                    int tap = edge ? 3 * (2 - t) + 2 : 6 + 2 - t;
                    for (int l = 0; l < 8; l++) lane[l] = w[(ki * c + c0 + l) * 9 + tap];
                    g[t] = *(const v8u *)lane;
                }
                g3_8(g, 1, o, 1);
                for (int xi = 0; xi < 8; xi++) *(v8u *)(e + ((size_t)(6 + 8 * edge + xi) * k + ki) * c + c0) = o[xi];
            }
}


void kiln_wino_weights(kiln_wino_pass pass, const kiln_wino_shape *s, const float *w, float *u) {
    int64_t cin, cout;
    pass_channels(pass, s, &cin, &cout);
    bool flip = pass == KILN_WINO_BWD_DATA;
    if (edge_planes(pass, s)) edge_filters(w, u + (size_t)filters_planes(s) * cin * cout, s->k, s->c);
    if (s->m != 46) {
        tile_grid g = {tile_of(s), tile_of(s), 0, 0, 1, 1};
        fns_of(&g).filters(w, u, cin, cout, flip);
        return;
    }
    /* the mixed tiling's four tiles, in filters_plane's order */
    const tile_grid g[4] = {{4, 4, 0, 0, 1, 1}, {4, 6, 0, 0, 1, 1}, {6, 4, 0, 0, 1, 1}, {6, 6, 0, 0, 1, 1}};
    for (int i = 0; i < 4; i++)
        fns_of(&g[i]).filters(w, u + (size_t)filters_plane(s, &g[i]) * cin * cout, cin, cout, flip);
}

kiln_status kiln_wino_run(kiln_wino_pass pass, const kiln_wino_shape *s, const kiln_wino_buffers *b, void *workspace,
                          size_t workspace_bytes) {
    if (!kiln_wino_cpu_ok() || !kiln_wino_shape_ok(s))
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "Winograd convolution: unsupported shape or CPU");
    wino_layout l = layout_of(pass, s, kiln_cpu_threads_max());
    if (workspace_bytes < l.total || !workspace)
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "Winograd convolution: workspace of %zu bytes, it needs %zu",
                          workspace_bytes, l.total);
    if (b->pool_y && (pass != KILN_WINO_FWD || !s->yb || b->relu || !b->pool_ix || s->h < 2 || s->w < 2))
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL,
                          "Winograd convolution: pooling needs the forward, a blocked output, no ReLU post-op, "
                          "indices and a 2x2 output at least");
    if (s->pool && pass == KILN_WINO_FWD && !(b->pool_y && s->pool == 2))
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL,
                          "Winograd convolution: a pooled shape is the gradients' or a forward that pools its 2x2 "
                          "windows (pool_y), else rows of y would not be written");
    char *ws = workspace;
    act x = {b->x, s->c, s->h, s->w, s->xb ? s->xb : 8}, y = {b->y, s->k, s->h, s->w, s->yb ? s->yb : 8};
    if (!s->xb) x.p = (float *)(ws + l.xcopy);
    if (!s->yb) y.p = (float *)(ws + l.ycopy);
    /* Inputs to the blocked copies: x but in the input gradient, y in the
     * input gradient and the weight gradient. */
    if (!s->xb && pass != KILN_WINO_BWD_DATA) blocked_copy(x.p, b->x, s->n, s->c, s->h, s->w, true);
    if (!s->yb && pass != KILN_WINO_FWD) blocked_copy(y.p, b->y, s->n, s->k, s->h, s->w, true);
    /* pooled, the tiles cover only the rows and columns the 2x2 windows
     * read (7x7: the top-left 6x6); x and y keep their sizes in x, y */
    kiln_wino_shape tiled = *s;
    if (b->pool_y) tiled.pool = 2;
    tile_grid g[4];
    int regions = grids_of(&tiled, g);
    if (pass == KILN_WINO_BWD_WEIGHTS) {
        for (int i = 0; i < regions; i++) weight_grad_tiles(s, &g[i], &l, &x, &y, b->w_out, i > 0, ws);
    } else {
        const float *u = b->u;
        if (!u) {
            kiln_wino_weights(pass, s, b->w, (float *)(ws + l.u));
            u = (const float *)(ws + l.u);
        }
        pooled pool = {b->pool_y, b->pool_ix, s->k, s->h / 2, s->w / 2, s->yb, s->w};
        if (pass == KILN_WINO_FWD)
            forward_tiles(&tiled, g, regions, &l, &x, u, b->bias, b->relu, &y, b->pool_y ? &pool : NULL, ws);
        else forward_tiles(s, g, regions, &l, &y, u, NULL, false, &x, NULL, ws);
        if (edge_planes(pass, s))
            pooled_edges(s, g, regions, &x, &y, u + (size_t)filters_planes(s) * l.cin * l.cout,
                         (float *)(ws + l.edges));
    }
    if (!s->yb && pass == KILN_WINO_FWD) blocked_copy(y.p, b->y, s->n, s->k, s->h, s->w, false);
    if (!s->xb && pass == KILN_WINO_BWD_DATA) blocked_copy(x.p, b->x, s->n, s->c, s->h, s->w, false);
    return KILN_OK;
}

#else /* not x86-64 */

size_t kiln_wino_weights_size(kiln_wino_pass pass, const kiln_wino_shape *s) {
    return (size_t)((filters_planes(s) + edge_planes(pass, s)) * s->c * s->k);
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

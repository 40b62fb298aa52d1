/* Convolutions of images with 1 to 4 channels for AVX2 CPUs: the forward
 * (with bias and fused ReLU) and the weight gradient of a 3x3 ungrouped
 * f32 convolution, stride 1 or 2, padding 0 to 2, input plain NCHW,
 * output nChw8c, nChw16c or NCHW. A candidate of the oneDNN convolution
 * provider (onednn_conv.c, "small_c").
 *
 * Why: a network's first layer sees 1 (grey) or 3 (colour) channels, and
 * oneDNN's direct kernels, built around blocks of 8 or 16 input channels,
 * run the weight gradient of 1, 2 or 4 channels at 9-20 GFLOP/s on a 185
 * GFLOP/s AVX2 CPU (the tutorial CNN's conv1 on 28x28x1 at batch 128: 6.6
 * ms of a 56 ms step; docs/performance.md). Here the 8 output channels of
 * a block are the vector lanes:
 *   - forward: y[k..k+8][p] = bias + sum over c, taps t of
 *     w[k..k+8][c][t] * x[c][p + t]; at stride 1 eight positions at once,
 *     each broadcast of x feeding the three sums whose taps read it;
 *   - weight gradient: dW[k..k+8][c][t] = sum over images and positions p
 *     of dY[k..k+8][p] * x[c][p + t], the 9 sums in registers; at stride 1
 *     four positions at once, six broadcasts of x per row of taps.
 * The input is read from a zero-padded copy of one channel plane at a
 * time (per thread, in L1), so no tap tests the border.
 *
 * Bits: every output is one chain of fused multiply-adds in a fixed order
 * (forward: bias, then channel by channel, tap by tap; weight gradient:
 * images of a chunk in order, rows, columns), and the weight gradient's
 * chunks (min(n, 64), fixed by n alone) are added in order, so a shape
 * gives the same bits for any thread count. */
#ifdef KILN_WITH_ONEDNN
#include <string.h>

#include "base/error.h"
#include "kernels/cpu/fast/fast_kernels.h"
#include "kernels/cpu/fast/gemm_avx2.h"
#include "kernels/cpu/fast/pool_avx2.h"
#include "kernels/cpu/onednn/onednn_smallc.h"

#define MAX_CHUNKS 64

static int64_t out_size(int64_t in, int stride, int pad) { return (in + 2 * pad - 3) / stride + 1; }

bool kiln_smallc_shape_ok(const kiln_smallc_shape *s) {
    return s->n >= 1 && s->c >= 1 && s->c <= 4 && s->k >= 8 && s->k % 8 == 0 && (s->sh == 1 || s->sh == 2) &&
           (s->sw == 1 || s->sw == 2) && s->ph >= 0 && s->ph <= 2 && s->pw >= 0 && s->pw <= 2 &&
           s->h + 2 * s->ph >= 3 && s->w + 2 * s->pw >= 3 && s->oh == out_size(s->h, s->sh, s->ph) &&
           s->ow == out_size(s->w, s->sw, s->pw) && (s->yb == 0 || s->yb == 8 || s->yb == 16) &&
           (s->yb == 0 || s->k % s->yb == 0);
}

static size_t up64(size_t n) { return (n + 63) / 64 * 64; }

/* Workspace, in 64-byte aligned pieces: shared (forward: the filters as
 * [k/8][c][9][8]; weight gradient: the chunks' sums [chunk][k/8][c][9][8])
 * then per thread the padded planes (forward: all c, then an image's 8
 * output channels as [oh*ow][8] to pool; weight gradient: one, and dY of
 * an image's 8 channels as [oh*ow][8] when y is plain). */
typedef struct sc_layout {
    int64_t pad_h, pad_w, chunks;
    size_t shared, per_thread, total; /* bytes */
} sc_layout;

static sc_layout layout_of(kiln_smallc_pass pass, const kiln_smallc_shape *s, int threads) {
    sc_layout l;
    l.pad_h = (s->oh - 1) * s->sh + 3, l.pad_w = (s->ow - 1) * s->sw + 3;
    l.chunks = s->n < MAX_CHUNKS ? s->n : MAX_CHUNKS;
    size_t f = sizeof(float), plane = (size_t)(l.pad_h * l.pad_w) * f, filters = (size_t)(s->k * s->c * 9) * f;
    if (pass == KILN_SMALLC_FWD) {
        l.shared = up64(filters);
        /* the padded planes, then one image's 8 output channels for pooling (pool_y) */
        l.per_thread = up64(plane * (size_t)s->c) + up64((size_t)(s->oh * s->ow * 8) * f);
    } else {
        /* dY of an image's 8 channels: gathered from a plain y, or scattered from the pooled gradient */
        l.shared = up64(filters * (size_t)l.chunks);
        l.per_thread = up64(plane) + up64((size_t)(s->oh * s->ow * 8) * f);
    }
    l.total = l.shared + (size_t)(threads < 1 ? 1 : threads) * l.per_thread;
    return l;
}

size_t kiln_smallc_workspace(kiln_smallc_pass pass, const kiln_smallc_shape *s) {
    return layout_of(pass, s, kiln_cpu_threads_max()).total;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define AVX2 __attribute__((target("avx2,fma")))

/* Channel c of image n, zero-padded: rows and columns the taps read. */
static void pad_plane(const kiln_smallc_shape *s, const sc_layout *l, const float *x, int64_t n, int64_t c,
                      float *dst) {
    const float *src = x + (n * s->c + c) * s->h * s->w;
    memset(dst, 0, sizeof(float) * (size_t)(l->pad_h * l->pad_w));
    int64_t cols = s->w < l->pad_w - s->pw ? s->w : l->pad_w - s->pw;
    for (int64_t r = s->ph; r < l->pad_h && r - s->ph < s->h; r++)
        memcpy(dst + r * l->pad_w + s->pw, src + (r - s->ph) * s->w, sizeof(float) * (size_t)cols);
}

/* Where output channels g*8..g*8+7 of position 0 of image n are, and how
 * far apart two positions are (0: plain NCHW, lanes oh*ow apart). */
static float *y_block(const kiln_smallc_shape *s, float *y, int64_t n, int64_t g, int64_t *pos_stride) {
    int64_t hw = s->oh * s->ow;
    if (!s->yb) {
        *pos_stride = 0;
        return y + (n * s->k + g * 8) * hw;
    }
    *pos_stride = s->yb;
    int64_t blk = s->yb == 16 ? g / 2 : g, lane = s->yb == 16 ? (g % 2) * 8 : 0;
    return y + (n * (s->k / s->yb) + blk) * hw * s->yb + lane;
}

/* ---- forward ------------------------------------------------------------------------- */

#define FWD_TAPS(acc, r0, r1, r2, x0)                                                                         \
    acc = _mm256_fmadd_ps(w0, _mm256_broadcast_ss(r0 + (x0)), acc);                                           \
    acc = _mm256_fmadd_ps(w1, _mm256_broadcast_ss(r0 + (x0) + 1), acc);                                       \
    acc = _mm256_fmadd_ps(w2, _mm256_broadcast_ss(r0 + (x0) + 2), acc);                                       \
    acc = _mm256_fmadd_ps(w3, _mm256_broadcast_ss(r1 + (x0)), acc);                                           \
    acc = _mm256_fmadd_ps(w4, _mm256_broadcast_ss(r1 + (x0) + 1), acc);                                       \
    acc = _mm256_fmadd_ps(w5, _mm256_broadcast_ss(r1 + (x0) + 2), acc);                                       \
    acc = _mm256_fmadd_ps(w6, _mm256_broadcast_ss(r2 + (x0)), acc);                                           \
    acc = _mm256_fmadd_ps(w7, _mm256_broadcast_ss(r2 + (x0) + 1), acc);                                       \
    acc = _mm256_fmadd_ps(w8, _mm256_broadcast_ss(r2 + (x0) + 2), acc)

#define LOAD_FILTERS(wc)                                                                                      \
    __m256 w0 = _mm256_loadu_ps((wc)), w1 = _mm256_loadu_ps((wc) + 8), w2 = _mm256_loadu_ps((wc) + 16);       \
    __m256 w3 = _mm256_loadu_ps((wc) + 24), w4 = _mm256_loadu_ps((wc) + 32), w5 = _mm256_loadu_ps((wc) + 40); \
    __m256 w6 = _mm256_loadu_ps((wc) + 48), w7 = _mm256_loadu_ps((wc) + 56), w8 = _mm256_loadu_ps((wc) + 64)

AVX2 static void store8(float *dst, int64_t pos_stride, int64_t lane_stride, __m256 v, bool relu) {
    if (relu) v = _mm256_max_ps(_mm256_setzero_ps(), v); /* a NaN comes through (max returns its second) */
    if (pos_stride) {
        _mm256_storeu_ps(dst, v);
        return;
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, v);
    for (int e = 0; e < 8; e++) dst[e * lane_stride] = lanes[e];
}

/* Stride 1, eight or twelve positions from r (a padded row): each
 * broadcast of the input feeds the up to three sums whose taps read it, so
 * a row of taps costs n + 2 broadcasts for 3n fused multiply-adds (with a
 * broadcast per multiply-add and four sums the forward took 1.4 ms instead
 * of 0.8 on Zen 3). Each sum still adds its taps in order w0, w1, w2.
 * Twelve sums take all but four registers (three filter taps and the
 * broadcast); each sum's chain is 9 fused multiply-adds a channel long,
 * and with eight sums a block was as long as its latency (8 chains x 4
 * cycles against 2 a cycle): Zen 3 ran them at 40% of the FMA peak, and
 * twelve leave the latency slack. */
#define X3(j, A, B, C)                                                                                        \
    x_ = _mm256_broadcast_ss((r) + (j));                                                                      \
    A = _mm256_fmadd_ps(w2, x_, A), B = _mm256_fmadd_ps(w1, x_, B), C = _mm256_fmadd_ps(w0, x_, C)
#define ROW_N(r, n)                                                                                           \
    do {                                                                                                      \
        __m256 x_ = _mm256_broadcast_ss((r));                                                                 \
        a0 = _mm256_fmadd_ps(w0, x_, a0);                                                                     \
        x_ = _mm256_broadcast_ss((r) + 1);                                                                    \
        a0 = _mm256_fmadd_ps(w1, x_, a0), a1 = _mm256_fmadd_ps(w0, x_, a1);                                   \
        X3(2, a0, a1, a2);                                                                                    \
        X3(3, a1, a2, a3);                                                                                    \
        X3(4, a2, a3, a4);                                                                                    \
        X3(5, a3, a4, a5);                                                                                    \
        X3(6, a4, a5, a6);                                                                                    \
        X3(7, a5, a6, a7);                                                                                    \
        if (n == 12) {                                                                                        \
            X3(8, a6, a7, a8);                                                                                \
            X3(9, a7, a8, a9);                                                                                \
            X3(10, a8, a9, a10);                                                                              \
            X3(11, a9, a10, a11);                                                                             \
        }                                                                                                     \
        x_ = _mm256_broadcast_ss((r) + n);                                                                    \
        if (n == 12) a10 = _mm256_fmadd_ps(w2, x_, a10), a11 = _mm256_fmadd_ps(w1, x_, a11);                  \
        else a6 = _mm256_fmadd_ps(w2, x_, a6), a7 = _mm256_fmadd_ps(w1, x_, a7);                              \
        x_ = _mm256_broadcast_ss((r) + n + 1);                                                                \
        if (n == 12) a11 = _mm256_fmadd_ps(w2, x_, a11);                                                      \
        else a7 = _mm256_fmadd_ps(w2, x_, a7);                                                                \
    } while (0)

/* n (8 or 12, a constant where inlined) positions from (oy, ox). */
AVX2 static inline __attribute__((always_inline)) void fwd_block(const int n, const kiln_smallc_shape *s,
                                                                 const sc_layout *l, const float *planes,
                                                                 const float *wg, __m256 b, int64_t oy, int64_t ox,
                                                                 float *out, int64_t ps, int64_t hw, bool relu) {
    __m256 a0 = b, a1 = b, a2 = b, a3 = b, a4 = b, a5 = b, a6 = b, a7 = b, a8 = b, a9 = b, a10 = b, a11 = b;
    int64_t plane = l->pad_h * l->pad_w;
    for (int64_t c = 0; c < s->c; c++) {
        const float *r = planes + c * plane + oy * l->pad_w + ox;
        for (int ky = 0; ky < 3; ky++, r += l->pad_w) {
            const float *wc = wg + c * 72 + ky * 24;
            __m256 w0 = _mm256_loadu_ps(wc), w1 = _mm256_loadu_ps(wc + 8), w2 = _mm256_loadu_ps(wc + 16);
            ROW_N(r, n);
        }
    }
    int64_t step = ps ? ps : 1;
    float *o = out + (oy * s->ow + ox) * step;
    store8(o, ps, hw, a0, relu), store8(o + step, ps, hw, a1, relu), store8(o + 2 * step, ps, hw, a2, relu);
    store8(o + 3 * step, ps, hw, a3, relu), store8(o + 4 * step, ps, hw, a4, relu);
    store8(o + 5 * step, ps, hw, a5, relu), store8(o + 6 * step, ps, hw, a6, relu);
    store8(o + 7 * step, ps, hw, a7, relu);
    if (n == 12) {
        store8(o + 8 * step, ps, hw, a8, relu), store8(o + 9 * step, ps, hw, a9, relu);
        store8(o + 10 * step, ps, hw, a10, relu), store8(o + 11 * step, ps, hw, a11, relu);
    }
}

AVX2 static void fwd_block8(const kiln_smallc_shape *s, const sc_layout *l, const float *planes, const float *wg,
                            __m256 b, int64_t oy, int64_t ox, float *out, int64_t ps, int64_t hw, bool relu) {
    fwd_block(8, s, l, planes, wg, b, oy, ox, out, ps, hw, relu);
}

AVX2 static void fwd_block12(const kiln_smallc_shape *s, const sc_layout *l, const float *planes, const float *wg,
                             __m256 b, int64_t oy, int64_t ox, float *out, int64_t ps, int64_t hw, bool relu) {
    fwd_block(12, s, l, planes, wg, b, oy, ox, out, ps, hw, relu);
}

/* One output row of block g: at stride 1 twelve or eight positions at a
 * time (twelve but where eight leave no remainder: 28 is 12 + 8 + 8), then
 * four, then one by one (the same order of sums every way). planes: the c
 * padded planes. */
AVX2 static void fwd_row(const kiln_smallc_shape *s, const sc_layout *l, const float *planes, const float *wg,
                         const float *bias8, int64_t oy, float *out, int64_t ps, int64_t hw, bool relu) {
    __m256 b = bias8 ? _mm256_loadu_ps(bias8) : _mm256_setzero_ps();
    int64_t plane = l->pad_h * l->pad_w, step = ps ? ps : 1, sw = s->sw, ox = 0;
    if (sw == 1)
        for (int64_t left = s->ow; left >= 8; left = s->ow - ox) {
            if (left >= 12 && left != 16) {
                fwd_block12(s, l, planes, wg, b, oy, ox, out, ps, hw, relu);
                ox += 12;
            } else {
                fwd_block8(s, l, planes, wg, b, oy, ox, out, ps, hw, relu);
                ox += 8;
            }
        }
    for (; ox + 4 <= s->ow; ox += 4) {
        __m256 a0 = b, a1 = b, a2 = b, a3 = b;
        for (int64_t c = 0; c < s->c; c++) {
            LOAD_FILTERS(wg + c * 72);
            const float *r0 = planes + c * plane + oy * s->sh * l->pad_w, *r1 = r0 + l->pad_w, *r2 = r1 + l->pad_w;
            FWD_TAPS(a0, r0, r1, r2, ox * sw);
            FWD_TAPS(a1, r0, r1, r2, (ox + 1) * sw);
            FWD_TAPS(a2, r0, r1, r2, (ox + 2) * sw);
            FWD_TAPS(a3, r0, r1, r2, (ox + 3) * sw);
        }
        store8(out + (oy * s->ow + ox) * step, ps, hw, a0, relu);
        store8(out + (oy * s->ow + ox + 1) * step, ps, hw, a1, relu);
        store8(out + (oy * s->ow + ox + 2) * step, ps, hw, a2, relu);
        store8(out + (oy * s->ow + ox + 3) * step, ps, hw, a3, relu);
    }
    for (; ox < s->ow; ox++) {
        __m256 a0 = b;
        for (int64_t c = 0; c < s->c; c++) {
            LOAD_FILTERS(wg + c * 72);
            const float *r0 = planes + c * plane + oy * s->sh * l->pad_w, *r1 = r0 + l->pad_w, *r2 = r1 + l->pad_w;
            FWD_TAPS(a0, r0, r1, r2, ox * sw);
        }
        store8(out + (oy * s->ow + ox) * step, ps, hw, a0, relu);
    }
}

/* relu_max_pool2d's 2x2 windows of one [oh][ow][8] plane into block p of
 * pool_y and pool_ix (nChw8c), by the pooling kernels' own row. */
static void pool_plane(const kiln_smallc_shape *s, const float *plane, float *y, int64_t *ix, int64_t p) {
    int64_t oh = s->oh / 2, ow = s->ow / 2;
    for (int64_t r = 0; r < oh; r++) {
        int64_t at = (p * oh + r) * ow * 8;
        kiln_pool2x2_row_avx2(plane + 2 * r * s->ow * 8, plane + (2 * r + 1) * s->ow * 8, y + at, ix + at, ow,
                              2 * r * s->ow, s->ow, 8, true, false);
    }
}

AVX2 static void run_fwd(const kiln_smallc_shape *s, const sc_layout *l, const kiln_smallc_buffers *b, char *ws,
                         int threads) {
    float *wp = (float *)ws; /* [g][c][tap][8] */
    int64_t groups = s->k / 8;
    for (int64_t g = 0; g < groups; g++)
        for (int64_t c = 0; c < s->c; c++)
            for (int t = 0; t < 9; t++)
                for (int e = 0; e < 8; e++) wp[((g * s->c + c) * 9 + t) * 8 + e] = b->w[((g * 8 + e) * s->c + c) * 9 + t];
    int64_t items = s->n * groups, hw = s->oh * s->ow;
    /* an image's groups at a time where there are images enough, else single items */
    int grain = items >= 8 * (int64_t)threads * groups ? (int)groups : 1;
#pragma omp parallel num_threads(threads)
    {
        const int tid = kiln_cpu_thread_id();
        float *planes = (float *)(ws + l->shared + (size_t)tid * l->per_thread);
        float *pool_in = (float *)((char *)planes + up64((size_t)(l->pad_h * l->pad_w * s->c) * sizeof(float)));
        int64_t have = -1; /* the image whose planes are padded */
        /* to the thread that comes for them: each item's result is the
         * same whichever thread makes it */
#pragma omp for schedule(dynamic, grain)
        for (int64_t it = 0; it < items; it++) {
            int64_t n = it / groups, g = it % groups;
            if (n != have) {
                for (int64_t c = 0; c < s->c; c++) pad_plane(s, l, b->x, n, c, planes + c * l->pad_h * l->pad_w);
                have = n;
            }
            /* no vector values in this body: clang outlines the parallel
             * region into a function without the AVX2 target */
            const float *bias8 = b->bias ? b->bias + g * 8 : NULL;
            int64_t ps = 8;
            float *out = b->pool_y ? pool_in : y_block(s, b->y, n, g, &ps);
            for (int64_t oy = 0; oy < s->oh; oy++)
                fwd_row(s, l, planes, wp + g * s->c * 72, bias8, oy, out, ps, hw, b->relu);
            if (b->pool_y) pool_plane(s, pool_in, b->pool_y, b->pool_ix, n * groups + g);
        }
    }
}

/* ---- weight gradient ------------------------------------------------------------------ */

/* Stride 1, four positions from r (a padded row) into the row's three
 * sums A, B, C (taps 0, 1, 2): six broadcasts for 12 fused multiply-adds,
 * each sum still taking the positions in order. */
#define WROW4(r, A, B, C)                                                                                     \
    do {                                                                                                      \
        __m256 x_ = _mm256_broadcast_ss((r));                                                                 \
        A = _mm256_fmadd_ps(g0, x_, A);                                                                       \
        x_ = _mm256_broadcast_ss((r) + 1);                                                                    \
        B = _mm256_fmadd_ps(g0, x_, B), A = _mm256_fmadd_ps(g1, x_, A);                                       \
        x_ = _mm256_broadcast_ss((r) + 2);                                                                    \
        C = _mm256_fmadd_ps(g0, x_, C), B = _mm256_fmadd_ps(g1, x_, B), A = _mm256_fmadd_ps(g2, x_, A);       \
        x_ = _mm256_broadcast_ss((r) + 3);                                                                    \
        C = _mm256_fmadd_ps(g1, x_, C), B = _mm256_fmadd_ps(g2, x_, B), A = _mm256_fmadd_ps(g3, x_, A);       \
        x_ = _mm256_broadcast_ss((r) + 4);                                                                    \
        C = _mm256_fmadd_ps(g2, x_, C), B = _mm256_fmadd_ps(g3, x_, B);                                       \
        x_ = _mm256_broadcast_ss((r) + 5);                                                                    \
        C = _mm256_fmadd_ps(g3, x_, C);                                                                       \
    } while (0)

/* acc[tap][8] += sum over positions of dY[p] * plane[p + tap]; dy's
 * positions ps apart. */
AVX2 static void wgrad_plane(const kiln_smallc_shape *s, const sc_layout *l, const float *plane, const float *dy,
                             int64_t ps, float *acc) {
    __m256 a0 = _mm256_loadu_ps(acc), a1 = _mm256_loadu_ps(acc + 8), a2 = _mm256_loadu_ps(acc + 16);
    __m256 a3 = _mm256_loadu_ps(acc + 24), a4 = _mm256_loadu_ps(acc + 32), a5 = _mm256_loadu_ps(acc + 40);
    __m256 a6 = _mm256_loadu_ps(acc + 48), a7 = _mm256_loadu_ps(acc + 56), a8 = _mm256_loadu_ps(acc + 64);
    int64_t sw = s->sw, pw = l->pad_w;
    for (int64_t oy = 0; oy < s->oh; oy++) {
        const float *r0 = plane + oy * s->sh * pw, *r1 = r0 + pw, *r2 = r1 + pw, *d = dy + oy * s->ow * ps;
        int64_t ox = 0;
        if (sw == 1)
            for (; ox + 4 <= s->ow; ox += 4) {
                __m256 g0 = _mm256_loadu_ps(d + ox * ps), g1 = _mm256_loadu_ps(d + (ox + 1) * ps);
                __m256 g2 = _mm256_loadu_ps(d + (ox + 2) * ps), g3 = _mm256_loadu_ps(d + (ox + 3) * ps);
                WROW4(r0 + ox, a0, a1, a2);
                WROW4(r1 + ox, a3, a4, a5);
                WROW4(r2 + ox, a6, a7, a8);
            }
        for (; ox < s->ow; ox++) {
            __m256 g = _mm256_loadu_ps(d + ox * ps);
            int64_t x0 = ox * sw;
            a0 = _mm256_fmadd_ps(g, _mm256_broadcast_ss(r0 + x0), a0);
            a1 = _mm256_fmadd_ps(g, _mm256_broadcast_ss(r0 + x0 + 1), a1);
            a2 = _mm256_fmadd_ps(g, _mm256_broadcast_ss(r0 + x0 + 2), a2);
            a3 = _mm256_fmadd_ps(g, _mm256_broadcast_ss(r1 + x0), a3);
            a4 = _mm256_fmadd_ps(g, _mm256_broadcast_ss(r1 + x0 + 1), a4);
            a5 = _mm256_fmadd_ps(g, _mm256_broadcast_ss(r1 + x0 + 2), a5);
            a6 = _mm256_fmadd_ps(g, _mm256_broadcast_ss(r2 + x0), a6);
            a7 = _mm256_fmadd_ps(g, _mm256_broadcast_ss(r2 + x0 + 1), a7);
            a8 = _mm256_fmadd_ps(g, _mm256_broadcast_ss(r2 + x0 + 2), a8);
        }
    }
    _mm256_storeu_ps(acc, a0), _mm256_storeu_ps(acc + 8, a1), _mm256_storeu_ps(acc + 16, a2);
    _mm256_storeu_ps(acc + 24, a3), _mm256_storeu_ps(acc + 32, a4), _mm256_storeu_ps(acc + 40, a5);
    _mm256_storeu_ps(acc + 48, a6), _mm256_storeu_ps(acc + 56, a7), _mm256_storeu_ps(acc + 64, a8);
}

AVX2 static void run_wgrad(const kiln_smallc_shape *s, const sc_layout *l, const kiln_smallc_buffers *b, char *ws,
                           int threads, int64_t *stray) {
    float *sums = (float *)ws; /* [chunk][g][c][tap][8] */
    int64_t groups = s->k / 8, items = l->chunks * groups, hw = s->oh * s->ow, per_chunk = groups * s->c * 72;
    int64_t bad = 0;
#pragma omp parallel num_threads(threads)
    {
        const int tid = kiln_cpu_thread_id();
        float *plane = (float *)(ws + l->shared + (size_t)tid * l->per_thread);
        float *dyt = (float *)((char *)plane + up64(sizeof(float) * (size_t)(l->pad_h * l->pad_w)));
#pragma omp for schedule(static) reduction(+ : bad)
        for (int64_t it = 0; it < items; it++) {
            int64_t j = it / groups, g = it % groups;
            float *acc = sums + j * per_chunk + g * s->c * 72;
            memset(acc, 0, sizeof(float) * (size_t)(s->c * 72));
            for (int64_t n = j * s->n / l->chunks; n < (j + 1) * s->n / l->chunks; n++) {
                int64_t ps = 8;
                const float *dy = dyt;
                if (b->pool_go) { /* the pooled gradient of image n, channels g*8.., by the pooling's own kernel */
                    int64_t at = (n * (s->k / 8) + g) * (s->oh / 2) * (s->ow / 2) * 8;
                    bad += kiln_blocked_relu_pool_backward_plane_b8(b->pool_go + at, b->pool_ix + at, b->pool_y + at,
                                                                    dyt, s->oh / 2, s->ow / 2, s->oh, s->ow,
                                                                    b->bias_part + n * s->k + g * 8);
                }
                else dy = y_block(s, b->y, n, g, &ps);
                if (!ps) { /* plain: the block's 8 channels gathered as [position][8] */
                    for (int64_t p = 0; p < hw; p++)
                        for (int e = 0; e < 8; e++) dyt[p * 8 + e] = dy[e * hw + p];
                    dy = dyt, ps = 8;
                }
                for (int64_t c = 0; c < s->c; c++) {
                    pad_plane(s, l, b->x, n, c, plane);
                    wgrad_plane(s, l, plane, dy, ps, acc + c * 72);
                }
            }
        }
    }
    /* dW[g*8 + e][c][tap] = the chunks' sums, added in chunk order */
    for (int64_t g = 0; g < groups; g++)
        for (int64_t c = 0; c < s->c; c++)
            for (int t = 0; t < 9; t++)
                for (int e = 0; e < 8; e++) {
                    const float *p = sums + (g * s->c + c) * 72 + t * 8 + e;
                    float v = p[0];
                    for (int64_t j = 1; j < l->chunks; j++) v += p[j * per_chunk];
                    b->w_out[((g * 8 + e) * s->c + c) * 9 + t] = v;
                }
    *stray = bad;
}

kiln_status kiln_smallc_run(kiln_smallc_pass pass, const kiln_smallc_shape *s, const kiln_smallc_buffers *b,
                            void *workspace, size_t workspace_bytes) {
    if (!kiln_cpu_gemm_avx2_ok() || !kiln_smallc_shape_ok(s))
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, NULL,
                          "small-channel convolution: needs AVX2 and FMA, 1-4 input channels, output channels "
                          "divisible by 8, a 3x3 filter, stride 1 or 2, padding 0-2");
    int threads = kiln_cpu_threads_max();
    sc_layout l = layout_of(pass, s, threads);
    if (workspace_bytes < l.total || !workspace)
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "small-channel convolution: workspace of %zu bytes, it needs %zu",
                          workspace_bytes, l.total);
    if (b->pool_y && (s->yb != 8 || b->relu || !b->pool_ix || s->oh < 2 || s->ow < 2 ||
                      (pass == KILN_SMALLC_FWD) == (b->pool_go != NULL) || (b->pool_go && !b->bias_part)))
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL,
                          "small-channel convolution: pooling needs the forward (or the weight gradient with the pooled "
                          "gradient and a plane-sum buffer), an nChw8c output, no ReLU post-op, indices and a 2x2 "
                          "output at least");
    if (pass == KILN_SMALLC_FWD) {
        run_fwd(s, &l, b, workspace, threads);
        return KILN_OK;
    }
    int64_t stray = 0;
    run_wgrad(s, &l, b, workspace, threads, &stray);
    if (stray)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass the indices kiln_conv2d_relu_max_pool2d returned",
                          "kiln_conv2d_relu_max_pool2d's weight gradient: %lld pooling indices lie outside their "
                          "2x2 window",
                          (long long)stray);
    return KILN_OK;
}

#else /* not x86-64: never run (kiln_cpu_gemm_avx2_ok is false) */
kiln_status kiln_smallc_run(kiln_smallc_pass pass, const kiln_smallc_shape *s, const kiln_smallc_buffers *b,
                            void *workspace, size_t workspace_bytes) {
    (void)pass, (void)s, (void)b, (void)workspace, (void)workspace_bytes;
    return KILN_RAISE(KILN_ERR_UNSUPPORTED, NULL, "small-channel convolution: needs an x86-64 CPU with AVX2");
}
#endif
#else
typedef int kiln_smallc_unused; /* ISO C: a translation unit is not empty */
#endif

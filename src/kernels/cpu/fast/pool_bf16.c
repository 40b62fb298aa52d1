/* relu_max_pool2d and relu_max_pool2d_backward_sum for bf16 on contiguous
 * (N, C, H, W) tensors with non-overlapping windows and no padding: the
 * pooling of autocast's conv2d_relu_max_pool2d on the fast CPU path (the
 * convolution is oneDNN's bf16 kernel, onednn_conv_pool.c), and the op
 * itself. Planes are shared out over OpenMP threads.
 *
 * Same results as the reference kernels (kernels/cpu/ops_pool.c), bit for
 * bit: bf16 widens to f32 exactly, so the windows, read in the same order
 * with the same comparisons, give the same maximum and index (the first
 * maximum wins ties, NaN beats everything, a window with nothing above 0
 * gives +0 at its first element); where every index lies in its own window
 * each input gets at most one window's gradient, stored as it came (planes
 * too small for a vector too: plane_dense), and otherwise the plane is
 * scattered into double as the reference does.
 *
 * The bias-gradient sums are each (n, c) plane's input gradient added in
 * double (eight running sums, then pairwise: plane_sum; where the plane was
 * written densely, the same values read from the pooled gradients where
 * y > 0, a quarter of the reads: pooled_sum), the planes then
 * added in n order, as the f32 kernels add planes (pool_fast.c): the bits do
 * not depend on the thread count or on the vector width, and the one
 * rounding is to bf16 at the end (within one bf16 rounding of the reference's
 * single running sum). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/cpu/fast/fast_kernels.h"
#include "kernels/nn_geometry.h"
#include "kiln/base.h"

/* kiln_bf16_pool_test_rows: 0 keeps the kernels on their portable rows. */
static _Atomic int rows_allowed = 1;
void kiln_bf16_pool_test_rows(int on) { atomic_store(&rows_allowed, on); }
bool kiln_bf16_rows_allowed(void) { return atomic_load(&rows_allowed) != 0; }

static float widen(uint16_t b) {
    union {
        uint32_t u;
        float f;
    } v = {.u = (uint32_t)b << 16};
    return v.f;
}

static bool is_nan(float v) { return v != v; }

static float passed(uint16_t go, uint16_t y) { /* go where y > 0 (1 .. +inf as bits), else +0 */
    return (uint16_t)(y - 1u) < 0x7f80u ? widen(go) : 0.0f;
}

static bool contiguous4(const kiln_strided *t) {
    if (t->ndim != 4 || t->layout != KILN_LAYOUT_STRIDED) return false;
    int64_t expect = 1;
    for (int i = 3; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != expect) return false;
        expect *= t->shape[i];
    }
    return true;
}

/* Windows of kernel = stride, no padding, inside the input. */
static bool tiling_windows(const kiln_op_args *a, const kiln_strided *x, const kiln_strided *y) {
    kiln_pool_geom g = kiln_pool_geom_of(a->attrs);
    return g.kernel[0] >= 1 && g.kernel[1] >= 1 && g.stride[0] == g.kernel[0] && g.stride[1] == g.kernel[1] &&
           g.padding[0] == 0 && g.padding[1] == 0 && y->shape[0] == x->shape[0] &&
           y->shape[1] == x->shape[1] && y->shape[2] * g.kernel[0] <= x->shape[2] &&
           y->shape[3] * g.kernel[1] <= x->shape[3];
}

bool kiln_bf16_relu_max_pool2d_supports(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *y = &a->out[0], *ix = &a->out[1];
    if (a->n_in != 1 || a->n_out != 2 || x->dtype != KILN_BF16 || y->dtype != KILN_BF16 ||
        ix->dtype != KILN_I64)
        return false;
    return contiguous4(x) && contiguous4(y) && contiguous4(ix) && ix->shape[2] == y->shape[2] &&
           ix->shape[3] == y->shape[3] && tiling_windows(a, x, y);
}

/* One plane's 2x2 windows, rows oh0 .. OH - 1 from column ow0 (the first
 * of them from column c0): the general loop's comparisons in its order, as
 * selects. The first value is relu'd (>= +0 or NaN), so it is always taken
 * over the start of -inf. */
KILN_SIMD_CLONES static void plane_2x2(const uint16_t *xp, uint16_t *yp, int64_t *ip, int64_t W, int64_t OH,
                                       int64_t OW, int64_t oh0, int64_t c0, int64_t ow0) {
    for (int64_t oh = oh0; oh < OH; oh++) {
        const uint16_t *r0 = xp + 2 * oh * W, *r1 = r0 + W;
        for (int64_t ow = oh == oh0 ? c0 : ow0; ow < OW; ow++) {
            const int64_t w = 2 * ow, base = 2 * oh * W + w;
            uint16_t b = r0[w], c;
            float best = widen(b), v;
            if (!(best > 0.0f || is_nan(best))) best = 0.0f, b = 0;
            int64_t bi = base;
            bool take;
#define KILN_POOL_STEP(src, at)                                                                              \
    c = (src);                                                                                               \
    v = widen(c);                                                                                            \
    if (!(v > 0.0f || is_nan(v))) v = 0.0f, c = 0;                                                           \
    take = (v > best) | is_nan(v);                                                                           \
    best = take ? v : best, b = take ? c : b, bi = take ? (at) : bi;
            KILN_POOL_STEP(r0[w + 1], base + 1)
            KILN_POOL_STEP(r1[w], base + W)
            KILN_POOL_STEP(r1[w + 1], base + W + 1)
#undef KILN_POOL_STEP
            yp[oh * OW + ow] = b;
            ip[oh * OW + ow] = bi;
        }
    }
}

/* AVX-512 rows of the 2x2 windows, 16 windows a vector. A row's 32 bf16
 * values load as 16 32-bit lanes holding a window's left value in the low
 * half and its right one in the high half, so a shift and a mask widen
 * both to f32 without a shuffle. Same comparisons in the same order as
 * plane_2x2 (so its bits); the columns past the last 16 go to it. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define KILN_POOL_AVX512 1
#define AVX512           __attribute__((target("avx512f")))

static bool avx512_ok(void) { return __builtin_cpu_supports("avx512f"); }

AVX512 static __m512 relu16(__m512 v) { /* max(v, +0), NaN kept */
    __mmask16 keep =
        _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm512_maskz_mov_ps(keep, v);
}

/* Windows [0, n16) of one output row (n16 a multiple of 16): r0, r1 the two
 * input rows, base the plane index of the row's first element. */
/* A 2x2 window's four values, 16 windows a vector, relu'd and compared in
 * the reference's order: the maximum, and in *off its offset from the
 * window's first value (0, 1, W or W + 1). */
AVX512 static __m512 pick4(const __m512 v[4], int64_t W, __m512i *off) {
    const int offs[3] = {1, (int)W, (int)W + 1};
    __m512 best = relu16(v[0]);
    *off = _mm512_setzero_si512();
    for (int k = 1; k < 4; k++) {
        __m512 c = relu16(v[k]);
        __mmask16 take = _mm512_cmp_ps_mask(c, best, _CMP_GT_OQ) | _mm512_cmp_ps_mask(c, c, _CMP_UNORD_Q);
        best = _mm512_mask_mov_ps(best, take, c);
        *off = _mm512_mask_mov_epi32(*off, take, _mm512_set1_epi32(offs[k - 1]));
    }
    return best;
}

/* The two rows' pairs (left value in each 32-bit lane's low half, right in
 * its high half) as the window's four values. */
AVX512 static void widen_pairs(__m512i a, __m512i b, __m512 v[4]) {
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    v[0] = _mm512_castsi512_ps(_mm512_slli_epi32(a, 16)), v[1] = _mm512_castsi512_ps(_mm512_and_si512(a, hi));
    v[2] = _mm512_castsi512_ps(_mm512_slli_epi32(b, 16)), v[3] = _mm512_castsi512_ps(_mm512_and_si512(b, hi));
}

/* 16 maxima as bf16 (their bits are the f32's high half, exactly) and their
 * plane indices base + at as int64. */
AVX512 static void store16(uint16_t *y, int64_t *ix, __m512 best, __m512i at, int64_t base) {
    _mm256_storeu_si256((__m256i *)y,
                        _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(best), 16)));
    __m512i b64 = _mm512_set1_epi64(base);
    _mm512_storeu_si512(ix, _mm512_add_epi64(b64, _mm512_cvtepi32_epi64(_mm512_castsi512_si256(at))));
    _mm512_storeu_si512(ix + 8,
                        _mm512_add_epi64(b64, _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(at, 1))));
}

AVX512 static void row_2x2_avx512(const uint16_t *r0, const uint16_t *r1, uint16_t *y, int64_t *ix,
                                  int64_t n16, int64_t base, int64_t W) {
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (int64_t ow = 0; ow < n16; ow += 16) {
        __m512 v[4];
        __m512i off;
        widen_pairs(_mm512_loadu_si512(r0 + 2 * ow), _mm512_loadu_si512(r1 + 2 * ow), v);
        __m512 best = pick4(v, W, &off);
        __m512i at =
            _mm512_add_epi32(_mm512_slli_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32((int)ow)), 1), off);
        store16(y + ow, ix + ow, best, at, base);
    }
}

/* Each window's plane offset (2 oh W + 2 ow) for the next 16 outputs of a
 * plane with OW-wide output rows, from the window (*oh, *ow) on, which it
 * moves past them (no division: it ran per lane and took a third of the
 * narrow rows' time). */
AVX512 static __m512i window_at(int64_t *oh, int64_t *ow, int64_t OW, int64_t W) {
    int at[16];
    for (int l = 0; l < 16; l++) {
        at[l] = (int)(2 * *oh * W + 2 * *ow);
        if (++*ow == OW) *ow = 0, ++*oh;
    }
    return _mm512_loadu_si512(at);
}

/* A whole plane whose output rows are narrower than 16 windows: 16 windows
 * (across rows) a vector, each window's two pairs gathered as 32-bit
 * words; outputs [0, n16) of the plane. Same steps as row_2x2_avx512. */
AVX512 static void plane_2x2_gather_avx512(const uint16_t *xp, uint16_t *y, int64_t *ix, int64_t n16,
                                           int64_t OW, int64_t W) {
    int64_t oh = 0, ow = 0;
    for (int64_t o = 0; o < n16; o += 16) {
        __m512i at = window_at(&oh, &ow, OW, W), bytes = _mm512_slli_epi32(at, 1), off;
        __m512 v[4];
        widen_pairs(_mm512_i32gather_epi32(bytes, (const void *)xp, 1),
                    _mm512_i32gather_epi32(bytes, (const void *)(xp + W), 1), v);
        __m512 best = pick4(v, W, &off);
        store16(y + o, ix + o, best, _mm512_add_epi32(at, off), 0);
    }
}

/* The gradient of 16 windows as the pairs of their two input rows (left in
 * each 32-bit lane's low half, right in its high half): each value gets its
 * window's gradient where the window's index names it and y > 0, else +0.
 * at: each window's plane offset less base. False when an index lies
 * outside its own window or does not narrow to 32 bits. */
AVX512 static bool grad_pairs(const uint16_t *go, const uint16_t *y, const int64_t *ix, int64_t base,
                              __m512i at, int64_t W, __m512i *top, __m512i *bot) {
    __m512i b64 = _mm512_set1_epi64(base);
    __m512i i0 = _mm512_sub_epi64(_mm512_loadu_si512(ix), b64),
            i1 = _mm512_sub_epi64(_mm512_loadu_si512(ix + 8), b64);
    __m256i lo = _mm512_cvtepi64_epi32(i0), hi = _mm512_cvtepi64_epi32(i1);
    if (_mm512_cmpneq_epi64_mask(_mm512_cvtepi32_epi64(lo), i0) ||
        _mm512_cmpneq_epi64_mask(_mm512_cvtepi32_epi64(hi), i1))
        return false;
    __m512i dk = _mm512_sub_epi32(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), at);
    __mmask16 k0 = _mm512_cmpeq_epi32_mask(dk, _mm512_setzero_si512());
    __mmask16 k1 = _mm512_cmpeq_epi32_mask(dk, _mm512_set1_epi32(1));
    __mmask16 k2 = _mm512_cmpeq_epi32_mask(dk, _mm512_set1_epi32((int)W));
    __mmask16 k3 = _mm512_cmpeq_epi32_mask(dk, _mm512_set1_epi32((int)W + 1));
    if ((__mmask16)(k0 | k1 | k2 | k3) != 0xffff) return false;
    __m512i yb = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)y));
    __mmask16 pass =
        _mm512_cmp_ps_mask(_mm512_castsi512_ps(_mm512_slli_epi32(yb, 16)), _mm512_setzero_ps(), _CMP_GT_OQ);
    __m512i g = _mm512_maskz_mov_epi32(pass, _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)go)));
    *top =
        _mm512_or_si512(_mm512_maskz_mov_epi32(k0, g), _mm512_slli_epi32(_mm512_maskz_mov_epi32(k1, g), 16));
    *bot =
        _mm512_or_si512(_mm512_maskz_mov_epi32(k2, g), _mm512_slli_epi32(_mm512_maskz_mov_epi32(k3, g), 16));
    return true;
}

/* The backward of plane_2x2_gather_avx512's windows: each window's two
 * pairs scattered as 32-bit words (the windows tile the plane's first 2 OH
 * rows and 2 OW columns; the rest is the caller's). False as grad_pairs. */
AVX512 static bool plane_2x2_backward_scatter_avx512(const uint16_t *go, const uint16_t *y, const int64_t *ix,
                                                     uint16_t *d, int64_t n16, int64_t OW, int64_t W) {
    int64_t oh = 0, ow = 0;
    for (int64_t o = 0; o < n16; o += 16) {
        __m512i at = window_at(&oh, &ow, OW, W), top, bot;
        if (!grad_pairs(go + o, y + o, ix + o, 0, at, W, &top, &bot)) return false;
        __m512i bytes = _mm512_slli_epi32(at, 1);
        _mm512_i32scatter_epi32((void *)d, bytes, top, 1);
        _mm512_i32scatter_epi32((void *)(d + W), bytes, bot, 1);
    }
    return true;
}

/* The input gradient under windows [0, n16) of one output row, written
 * densely into the two input rows d0 and d1 (base: the row's plane offset).
 * False as grad_pairs (nothing is then trusted: the caller scatters the
 * plane). */
AVX512 static bool row_2x2_backward_avx512(const uint16_t *go, const uint16_t *y, const int64_t *ix,
                                           uint16_t *d0, uint16_t *d1, int64_t n16, int64_t base, int64_t W) {
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (int64_t ow = 0; ow < n16; ow += 16) {
        __m512i at = _mm512_slli_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32((int)ow)), 1), top, bot;
        if (!grad_pairs(go + ow, y + ow, ix + ow, base, at, W, &top, &bot)) return false;
        _mm512_storeu_si512(d0 + 2 * ow, top);
        _mm512_storeu_si512(d1 + 2 * ow, bot);
    }
    return true;
}

/* pooled_sum_portable's eight running sums as the eight lanes of a vector. */
AVX512 static double pooled_sum_avx512(const uint16_t *go, const uint16_t *y, int64_t n) {
    __m512d acc = _mm512_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i yb = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(y + i)));
        __m256i gb = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(go + i)));
        __m256 yv = _mm256_castsi256_ps(_mm256_slli_epi32(yb, 16)),
               gv = _mm256_castsi256_ps(_mm256_slli_epi32(gb, 16));
        __m256 pass = _mm256_and_ps(gv, _mm256_cmp_ps(yv, _mm256_setzero_ps(), _CMP_GT_OQ));
        acc = _mm512_add_pd(acc, _mm512_cvtps_pd(pass));
    }
    double a[8];
    _mm512_storeu_pd(a, acc);
    for (int j = 0; i < n; i++, j++) a[j] += passed(go[i], y[i]);
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}
#endif

kiln_status kiln_bf16_relu_max_pool2d(const kiln_op_args *a) {
    const uint16_t *x = a->in[0].data;
    uint16_t *y = a->out[0].data;
    int64_t *ix = a->out[1].data;
    kiln_pool_geom g = kiln_pool_geom_of(a->attrs);
    const int64_t P = a->in[0].shape[0] * a->in[0].shape[1], H = a->in[0].shape[2], W = a->in[0].shape[3];
    const int64_t OH = a->out[0].shape[2], OW = a->out[0].shape[3], kh = g.kernel[0], kw = g.kernel[1];
#ifdef KILN_POOL_AVX512
    const bool fast = avx512_ok() && H * W < (1 << 28) && kiln_bf16_rows_allowed();
#endif
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (P * OH * OW > 4096)
#endif
    for (int64_t p = 0; p < P; p++) {
        const uint16_t *xp = x + p * H * W;
        if (kh == 2 && kw == 2) {
            int64_t done = 0;
#ifdef KILN_POOL_AVX512
            /* the plane index fits the rows' int32 offsets (2 * OW + W + 1) */
            if (fast && OW >= 16)
                for (int64_t oh = 0; oh < OH; oh++)
                    row_2x2_avx512(xp + 2 * oh * W, xp + (2 * oh + 1) * W, y + (p * OH + oh) * OW,
                                   ix + (p * OH + oh) * OW, OW / 16 * 16, 2 * oh * W, W);
            if (fast && OW >= 16) done = OW / 16 * 16;
            if (fast && OW < 16 && OH * OW >= 16) { /* narrow rows: across rows, the last few portably */
                const int64_t n16 = OH * OW / 16 * 16;
                plane_2x2_gather_avx512(xp, y + p * OH * OW, ix + p * OH * OW, n16, OW, W);
                plane_2x2(xp, y + p * OH * OW, ix + p * OH * OW, W, OH, OW, n16 / OW, n16 % OW, 0);
                continue;
            }
#endif
            plane_2x2(xp, y + p * OH * OW, ix + p * OH * OW, W, OH, OW, 0, done, done);
            continue;
        }
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                const int64_t h0 = oh * kh, w0 = ow * kw;
                float best = -__builtin_inff();
                int64_t best_i = h0 * W + w0;
                for (int64_t h = h0; h < h0 + kh; h++)
                    for (int64_t w = w0; w < w0 + kw; w++) {
                        float v = widen(xp[h * W + w]);
                        if (!(v > 0.0f || is_nan(v))) v = 0.0f;
                        if (v > best || is_nan(v)) best = v, best_i = h * W + w;
                    }
                const int64_t o = (p * OH + oh) * OW + ow;
                /* best is an input's value (exact in bf16), or +0 */
                y[o] = best == 0.0f ? 0 : xp[best_i];
                ix[o] = best_i;
            }
    }
    return KILN_OK;
}

/* (grad_out, y, indices) -> (grad_input, sums): relu_max_pool2d_backward's
 * scatter of the gradients whose y > 0, and sums[c] the sum of grad_input
 * over n, h and w. */
bool kiln_bf16_relu_max_pool2d_backward_sum_supports(const kiln_op_args *a) {
    if (a->n_in < 3 || a->n_out != 2) return false;
    const kiln_strided *go = &a->in[0], *y = &a->in[1], *ix = &a->in[2], *dx = &a->out[0], *s = &a->out[1];
    if (go->dtype != KILN_BF16 || y->dtype != KILN_BF16 || ix->dtype != KILN_I64 || dx->dtype != KILN_BF16 ||
        s->dtype != KILN_BF16 || s->ndim != 1 || s->layout != KILN_LAYOUT_STRIDED ||
        s->shape[0] != dx->shape[1])
        return false;
    if (!contiguous4(go) || !contiguous4(y) || !contiguous4(ix) || !contiguous4(dx)) return false;
    for (int i = 0; i < 4; i++)
        if (y->shape[i] != go->shape[i] || ix->shape[i] != go->shape[i]) return false;
    kiln_op_args f = *a; /* the forward's geometry: x = dx, y = grad_out */
    return tiling_windows(&f, dx, go);
}

size_t kiln_bf16_relu_max_pool2d_backward_sum_workspace(const kiln_op_args *a) {
    return (size_t)(a->out[0].shape[0] * a->out[0].shape[1]) * sizeof(double);
}

/* Sum of a plane's n values in double: eight running sums over the
 * values i = j mod 8, then added pairwise, so the vector and portable
 * builds give the same bits. */
KILN_SIMD_CLONES static double plane_sum(const uint16_t *d, int64_t n) {
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += widen(d[i + j]);
    for (int j = 0; i < n; i++, j++) acc[j] += widen(d[i]);
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* The sum that plane_sum gives for a plane written densely, from its n
 * pooled gradients where y > 0 (a quarter of the reads at 2x2). */
static double pooled_sum_portable(const uint16_t *go, const uint16_t *y, int64_t n) {
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += passed(go[i + j], y[i + j]);
    for (int j = 0; i < n; i++, j++) acc[j] += passed(go[i], y[i]);
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static double pooled_sum(const uint16_t *go, const uint16_t *y, int64_t n) {
#ifdef KILN_POOL_AVX512
    if (avx512_ok() && kiln_bf16_rows_allowed()) return pooled_sum_avx512(go, y, n);
#endif
    return pooled_sum_portable(go, y, n);
}

/* One plane written densely, portably: zeros, then each window's gradient
 * at its index where y > 0. False (nothing trusted) when an index lies
 * outside its own kh x kw window. */
static bool plane_dense(const uint16_t *go, const uint16_t *y, const int64_t *ix, uint16_t *d, int64_t OH,
                        int64_t OW, int64_t W, int64_t HW, int64_t kh, int64_t kw) {
    memset(d, 0, sizeof *d * (size_t)HW);
    for (int64_t oh = 0, o = 0; oh < OH; oh++)
        for (int64_t ow = 0; ow < OW; ow++, o++) {
            const int64_t rel = ix[o] - (oh * kh * W + ow * kw);
            bool inside = false;
            for (int64_t r = 0; r < kh && !inside; r++) inside = rel - r * W >= 0 && rel - r * W < kw;
            if (!inside) return false;
            if (widen(y[o]) > 0.0f) d[ix[o]] = go[o];
        }
    return true;
}

/* One plane, scattered as the reference does: each window's gradient
 * where y > 0 added into a double plane (indices outside their windows may
 * meet), stored with one rounding. 1: an index outside the plane; -1: no
 * memory for the double plane. */
static int plane_scatter(const uint16_t *go, const uint16_t *y, const int64_t *ix, uint16_t *d, int64_t OHW,
                         int64_t HW) {
    double *acc = calloc((size_t)HW, sizeof *acc);
    if (!acc) return -1;
    int bad = 0;
    for (int64_t o = 0; o < OHW; o++) {
        int64_t k = ix[o];
        if (k < 0 || k >= HW) {
            bad = 1;
            continue;
        }
        if (widen(y[o]) > 0.0f) acc[k] += widen(go[o]);
    }
    for (int64_t i = 0; i < HW; i++) d[i] = kiln_f32_to_bf16((float)acc[i]);
    free(acc);
    return bad;
}

kiln_status kiln_bf16_relu_max_pool2d_backward_sum(const kiln_op_args *a) {
    const uint16_t *go = a->in[0].data, *y = a->in[1].data;
    const int64_t *ix = a->in[2].data;
    uint16_t *dx = a->out[0].data;
    const int64_t N = a->out[0].shape[0], C = a->out[0].shape[1], H = a->out[0].shape[2],
                  W = a->out[0].shape[3];
    const int64_t HW = H * W, OH = a->in[0].shape[2], OW = a->in[0].shape[3], OHW = OH * OW;
    double *part = a->workspace;
    if (!part && N * C > 0)
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL,
                          "kiln_relu_max_pool2d_backward_sum: no workspace for the sums");
    kiln_pool_geom g = kiln_pool_geom_of(a->attrs);
#ifdef KILN_POOL_AVX512
    const bool vec =
        g.kernel[0] == 2 && g.kernel[1] == 2 && HW < (1 << 28) && avx512_ok() && kiln_bf16_rows_allowed();
    const bool fast = vec && OW >= 16, fast_narrow = vec && OW < 16 && OHW >= 16;
#else
    (void)g;
#endif
    int bad = 0;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) reduction(| : bad) if (N * C * HW > 4096)
#endif
    for (int64_t p = 0; p < N * C; p++) {
        const uint16_t *gp = go + p * OHW, *yp = y + p * OHW;
        const int64_t *ip = ix + p * OHW;
        uint16_t *d = dx + p * HW;
        bool dense = false;
#ifdef KILN_POOL_AVX512
        if (fast) {
            /* the rows' first 2 * n16 columns densely, the rest (right
             * columns, bottom rows) zeroed and scattered */
            const int64_t n16 = OW / 16 * 16;
            dense = true;
            for (int64_t oh = 0; oh < OH && dense; oh++) {
                uint16_t *d0 = d + 2 * oh * W, *d1 = d0 + W;
                dense = row_2x2_backward_avx512(gp + oh * OW, yp + oh * OW, ip + oh * OW, d0, d1, n16,
                                                2 * oh * W, W);
                memset(d0 + 2 * n16, 0, sizeof *d * (size_t)(W - 2 * n16));
                memset(d1 + 2 * n16, 0, sizeof *d * (size_t)(W - 2 * n16));
                for (int64_t ow = n16; ow < OW && dense; ow++) {
                    int64_t o = oh * OW + ow, k = ip[o] - 2 * oh * W - 2 * ow;
                    if (k != 0 && k != 1 && k != W && k != W + 1)
                        dense = false;
                    else if (widen(yp[o]) > 0.0f)
                        d[ip[o]] = gp[o];
                }
            }
            if (dense) memset(d + 2 * OH * W, 0, sizeof *d * (size_t)(HW - 2 * OH * W));
        } else if (fast_narrow) {
            /* narrow rows: the windows' pairs scattered, the last few and anything no window covers
             * zeroed first and written portably */
            const int64_t n16 = OHW / 16 * 16;
            if (2 * OW != W || 2 * OH != H || n16 != OHW) memset(d, 0, sizeof *d * (size_t)HW);
            dense = plane_2x2_backward_scatter_avx512(gp, yp, ip, d, n16, OW, W);
            for (int64_t o = n16; o < OHW && dense; o++) {
                int64_t k = ip[o] - 2 * (o / OW) * W - 2 * (o % OW);
                if (k != 0 && k != 1 && k != W && k != W + 1)
                    dense = false;
                else if (widen(yp[o]) > 0.0f)
                    d[ip[o]] = gp[o];
            }
        }
#endif
        if (!dense) dense = plane_dense(gp, yp, ip, d, OH, OW, W, HW, g.kernel[0], g.kernel[1]);
        if (dense) {
            part[p] = pooled_sum(gp, yp, OHW);
            continue;
        }
        int st = plane_scatter(gp, yp, ip, d, OHW, HW);
        if (st) bad |= st > 0 ? 1 : 2;
        part[p] = plane_sum(d, HW);
    }
    if (bad & 2)
        return KILN_RAISE(
            KILN_ERR_OUT_OF_MEMORY, "free memory, or use indices that kiln_relu_max_pool2d returned",
            "kiln_relu_max_pool2d_backward_sum: no memory for a %lld-element plane (an index outside "
            "its window took the scatter path)",
            (long long)HW);
    if (bad)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass the indices kiln_relu_max_pool2d returned",
                          "kiln_relu_max_pool2d_backward_sum: an index is outside its %lld-element plane",
                          (long long)HW);
    const kiln_strided *s = &a->out[1];
    uint16_t *sums = s->data;
    for (int64_t c = 0; c < C; c++) {
        double v = 0.0;
        for (int64_t n = 0; n < N; n++) v += part[n * C + c];
        sums[c * s->strides[0]] = kiln_f32_to_bf16((float)v);
    }
    return KILN_OK;
}

/* ---- relu_max_pool2d from an NHWC input ----------------------------------------------- */

/* 16 channels of 16 windows at a time (flat output positions within a
 * plane), transposed in registers and written as NCHW runs of 16. */

/* The window (oh, ow) of image n for channels c .. c + cn - 1, portably. */
static void nhwc_window(const uint16_t *xn, int64_t C, int64_t W, int64_t k, int64_t oh, int64_t ow,
                        int64_t c, int cn, uint16_t *yv, int64_t *iv) {
    for (int l = 0; l < cn; l++) {
        float best = -__builtin_inff();
        int64_t best_i = oh * k * W + ow * k;
        uint16_t b = 0;
        for (int64_t h = oh * k; h < oh * k + k; h++)
            for (int64_t w = ow * k; w < ow * k + k; w++) {
                uint16_t u = xn[(h * W + w) * C + c + l];
                float v = widen(u);
                if (!(v > 0.0f || is_nan(v))) v = 0.0f, u = 0;
                if (v > best || is_nan(v)) best = v, best_i = h * W + w, b = u;
            }
        yv[l] = b, iv[l] = best_i;
    }
}

#ifdef KILN_POOL_AVX512
/* r[i] lane j -> r[j] lane i, 32-bit lanes. */
AVX512 static void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    /* r[4q + k] holds rows 4q..4q+3's column k, 4q'+k for each 128-bit block q' */
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);     /* blocks 0, 2 of each */
        t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd); /* blocks 1, 3 */
        t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
        r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
        r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xdd);
    }
}

/* The 2x2 window at plane offset `at` of an NHWC image, 16 channels from
 * c: its four positions' channel vectors through pick4. */
AVX512 static __m512 nhwc_pick4(const uint16_t *xn, int64_t C, int64_t W, int64_t at, int64_t c,
                                __m512i *off) {
    const uint16_t *p = xn + at * C + c;
    const uint16_t *q[4] = {p, p + C, p + W * C, p + W * C + C};
    __m512 v[4];
    for (int k = 0; k < 4; k++)
        v[k] = _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)q[k])), 16));
    return pick4(v, W, off);
}

/* 16 flat outputs o0 .. o0 + 15 of image n's planes (o = oh OW + ow) for
 * 16 channels from c: each window's 16 channels as one vector with
 * plane_2x2's steps, then transposed to 16 outputs per channel. */
AVX512 static void nhwc_block_2x2_avx512(const uint16_t *xn, int64_t C, int64_t W, int64_t OW, int64_t o0,
                                         int64_t c, uint16_t *y, int64_t *ix, int64_t plane) {
    __m512i bits[16], code[16];
    int at[16];
    for (int j = 0; j < 16; j++) {
        const int64_t oh = (o0 + j) / OW, ow = (o0 + j) % OW;
        at[j] = (int)(2 * oh * W + 2 * ow);
        __m512i off;
        __m512 best = nhwc_pick4(xn, C, W, at[j], c, &off);
        bits[j] = _mm512_srli_epi32(_mm512_castps_si512(best), 16);
        code[j] = off;
    }
    transpose16(bits);
    transpose16(code);
    const __m512i base = _mm512_loadu_si512(at);
    for (int l = 0; l < 16; l++) {
        uint16_t *yc = y + (c + l) * plane + o0;
        int64_t *ic = ix + (c + l) * plane + o0;
        _mm256_storeu_si256((__m256i *)yc, _mm512_cvtepi32_epi16(bits[l]));
        __m512i i32 = _mm512_add_epi32(code[l], base);
        _mm512_storeu_si512(ic, _mm512_cvtepi32_epi64(_mm512_castsi512_si256(i32)));
        _mm512_storeu_si512(ic + 8, _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(i32, 1)));
    }
}

/* One window (oh, ow) of image n for 16 channels from c: the tail of a
 * plane's outputs after its blocks of 16. */
AVX512 static void nhwc_window_2x2_avx512(const uint16_t *xn, int64_t C, int64_t W, int64_t oh, int64_t ow,
                                          int64_t c, uint16_t *yv, int64_t *iv) {
    const int64_t at = 2 * oh * W + 2 * ow;
    __m512i off;
    __m512 best = nhwc_pick4(xn, C, W, at, c, &off);
    store16(yv, iv, best, off, at);
}
#endif

kiln_status kiln_bf16_relu_max_pool2d_from_nhwc(const uint16_t *x, int64_t N, int64_t C, int64_t H, int64_t W,
                                                int64_t k, uint16_t *y, int64_t *ix, int64_t OH, int64_t OW) {
    if (k < 1 || OH * k > H || OW * k > W)
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL,
                          "relu_max_pool2d from NHWC: %lldx%lld windows of %lld over %lldx%lld",
                          (long long)OH, (long long)OW, (long long)k, (long long)H, (long long)W);
#ifdef KILN_POOL_AVX512
    const bool fast = k == 2 && C % 16 == 0 && H * W < (1 << 28) && avx512_ok() && kiln_bf16_rows_allowed();
#endif
    const int64_t plane = OH * OW, blocks = plane / 16;
#ifdef _OPENMP
#pragma omp parallel for collapse(2) schedule(static) if (N * C * plane > 4096)
#endif
    for (int64_t n = 0; n < N; n++)
        for (int64_t b = 0; b <= blocks; b++) { /* 16 flat outputs each, the last the rest */
            const uint16_t *xn = x + n * H * W * C;
            const int64_t o0 = b * 16, on = b < blocks ? 16 : plane - o0;
            if (on == 0) continue;
            for (int64_t c = 0; c < C; c += 16) {
                const int cn = C - c < 16 ? (int)(C - c) : 16;
#ifdef KILN_POOL_AVX512
                if (fast && on == 16) {
                    nhwc_block_2x2_avx512(xn, C, W, OW, o0, c, y + n * C * plane, ix + n * C * plane, plane);
                    continue;
                }
#endif
                for (int64_t o = o0; o < o0 + on; o++) {
                    uint16_t yv[16];
                    int64_t iv[16];
#ifdef KILN_POOL_AVX512
                    if (fast)
                        nhwc_window_2x2_avx512(xn, C, W, o / OW, o % OW, c, yv, iv);
                    else
#endif
                        nhwc_window(xn, C, W, k, o / OW, o % OW, c, cn, yv, iv);
                    for (int l = 0; l < cn; l++) {
                        y[(n * C + c + l) * plane + o] = yv[l];
                        ix[(n * C + c + l) * plane + o] = iv[l];
                    }
                }
            }
        }
    return KILN_OK;
}

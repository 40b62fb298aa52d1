/* conv2d_relu_max_pool2d and its first-layer weight gradient for bf16
 * images with few channels (C * KH * KW <= 48 taps: a 3x3 convolution of
 * 1 to 5 channels), stride 1, 2x2 pooling: autocast's first layer of the
 * tutorial CNN (1x28x28 and 3x32x32) on the fast CPU path.
 *
 * Why: oneDNN's bf16 kernels are built around blocks of 16 input channels.
 * For one or three channels its forward ran at 4.3-4.6 ms and its weight
 * gradient (after the pooling's backward wrote the convolution-sized
 * gradient and a reorder to NHWC) at 5-6 ms a step at batch 128, where
 * Kiln's f32 small-channel kernels take 1.6 and 1.4 ms: the first layer
 * made bf16 training slower than f32 (docs/performance.md). The work is
 * small (the 1x28x28 layer: 29 MFLOP forward) and here it is done in f32
 * registers from the bf16 values:
 *   - each image is widened once into zero-bordered f32 planes, so a tap
 *     is a load at a fixed offset; a group of up to 16 neighbouring pooling
 *     windows of one pooled row are the vector lanes, and the taps of their
 *     four positions (top left, top right, bottom left, bottom right) are
 *     gathered once for every output channel (group_taps_*).
 *   - forward: per output channel, each position is one chain of fused
 *     multiply-adds (bias, then tap by tap), rounded to bf16 as a bf16
 *     convolution's output is, then ReLU'd and pooled in registers and
 *     stored as 16 values and 16 indices: the convolution's output is never
 *     written.
 *   - weight gradient: a window's gradient reaches one of its positions
 *     (its index), so per output channel four gradient vectors (the
 *     window's gradient where its index names that position and y > 0,
 *     else 0) times the four positions' taps are the group's share of dW,
 *     kept by lane and added up at the end of a chunk of images: the
 *     convolution-sized gradient is never written either. The bias
 *     gradient sums the same gradients.
 *
 * Results: y is bf16(bias + sum of w x) with one rounding, its window's
 * maximum picked as relu_max_pool2d picks it (kernels/cpu/ops_pool.c: ReLU
 * first, the first maximum wins ties, NaN beats everything), so the
 * indices are the pooling's of these values. The weight and bias
 * gradients are added in f32 by lane within a chunk of images (min(N, 64)
 * chunks, fixed by N; the bias in double), the lanes and then the chunks
 * in double in order, then rounded to bf16 once: the bits do not depend on
 * the thread count. The AVX-512 rows and the
 * portable ones (fmaf, same order) give the same bits; tests/kernels/
 * test_bf16_smallc.c holds both to the float64 reference. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/error.h"
#include "kernels/cpu/fast/fast_kernels.h"
#include "kernels/nn_geometry.h"
#include "kiln/base.h"

#define MAX_TAPS   48
#define MAX_CHUNKS 64

typedef struct sc_geom {
    int64_t N, C, H, W, O, KH, KW, ph, pw; /* x, weight, padding */
    int64_t OH, OW, PH, PW;                /* the convolution's output, the pooled output */
    int64_t Hp, Wp;                        /* x's planes with the padding around */
    int64_t T;                             /* taps: C * KH * KW */
} sc_geom;

static bool contiguous(const kiln_strided *t, int ndim) {
    if (t->ndim != ndim || t->layout != KILN_LAYOUT_STRIDED) return false;
    int64_t expect = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != expect) return false;
        expect *= t->shape[i];
    }
    return true;
}

/* x (N, C, H, W), the weight's shape w[4], the op's attrs (the convolution's
 * geometry, pooling window attrs->kernel[0]) and the pooled output's shape. */
static bool geom_of(const kiln_strided *x, const int64_t w[4], const kiln_op_attrs *attrs, const int64_t y[4],
                    sc_geom *g) {
    kiln_conv_geom cg = kiln_conv_geom_of(attrs);
    if (cg.stride[0] != 1 || cg.stride[1] != 1 || cg.dilation[0] != 1 || cg.dilation[1] != 1 ||
        cg.groups != 1)
        return false;
    if (attrs->kernel[0] != 2 || attrs->kernel[1] != 2) return false;
    *g = (sc_geom){.N = x->shape[0],
                   .C = x->shape[1],
                   .H = x->shape[2],
                   .W = x->shape[3],
                   .O = w[0],
                   .KH = w[2],
                   .KW = w[3],
                   .ph = cg.padding[0],
                   .pw = cg.padding[1]};
    if (w[1] != g->C || g->O < 16 || g->O % 16 || g->KH < 1 || g->KW < 1 || g->ph < 0 || g->pw < 0 ||
        g->ph >= g->KH || g->pw >= g->KW)
        return false;
    g->T = g->C * g->KH * g->KW;
    g->Hp = g->H + 2 * g->ph, g->Wp = g->W + 2 * g->pw;
    if (g->T > MAX_TAPS) return false;
    g->OH = kiln_conv_out_size(g->H, g->KH, 1, g->ph, 1),
    g->OW = kiln_conv_out_size(g->W, g->KW, 1, g->pw, 1);
    g->PH = g->OH / 2, g->PW = g->OW / 2;
    if (g->OH < 2 || g->OW < 2 || g->OH * g->OW >= ((int64_t)1 << 30)) return false;
    return g->N >= 1 && y[0] == g->N && y[1] == g->O && y[2] == g->PH && y[3] == g->PW;
}

static size_t up64(size_t n) { return (n + 63) / 64 * 64; }

/* The threads a call's workspace has room for: `fixed` shared bytes, then
 * `slot` bytes a thread (at most the compute threads). */
static kiln_status slots_of(const kiln_op_args *a, const char *op, size_t fixed, size_t slot, int *slots) {
    if (!a->workspace || a->workspace_bytes < fixed + slot)
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL,
                          "%s: bf16 small-channel kernel given %zu workspace bytes, needs at least %zu", op,
                          a->workspace_bytes, fixed + slot);
    size_t n = (a->workspace_bytes - fixed) / slot;
    *slots = n < (size_t)kiln_cpu_threads_max() ? (int)n : kiln_cpu_threads_max();
    return KILN_OK;
}

static float widen(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static bool is_nan(float v) { return v != v; }

/* Image xn widened into zero-bordered f32 planes (C x Hp x Wp, and 32
 * zeros after, which the last group's unaligned loads may touch): tap t of
 * convolution position (r, c) is xp[r * Wp + c + offs[t]]. */
static void pad_image(const uint16_t *xn, const sc_geom *g, float *xp) {
    memset(xp, 0, sizeof *xp * (size_t)(g->C * g->Hp * g->Wp + 32));
    for (int64_t ci = 0; ci < g->C; ci++)
        for (int64_t h = 0; h < g->H; h++)
            kiln_bf16_to_f32_n(xn + (ci * g->H + h) * g->W, xp + (ci * g->Hp + h + g->ph) * g->Wp + g->pw,
                               (size_t)g->W);
}

static size_t pad_bytes(const sc_geom *g) {
    return up64((size_t)(g->C * g->Hp * g->Wp + 32) * sizeof(float));
}

/* offs[t] for t = (ci, kh, kw) in the weight's order. */
static void tap_offsets(const sc_geom *g, int64_t *offs) {
    int t = 0;
    for (int64_t ci = 0; ci < g->C; ci++)
        for (int64_t kh = 0; kh < g->KH; kh++)
            for (int64_t kw = 0; kw < g->KW; kw++) offs[t++] = (ci * g->Hp + kh) * g->Wp + kw;
}

/* A group: m <= 16 neighbouring windows of one pooled row, a lane each.
 * xg[(t * 4 + k) * 16 + w] is tap t of window w's position k (0: top left,
 * 1: top right, 2: bottom left, 3: bottom right), 0 in lanes w >= m; x0 is
 * the padded planes at the group's first top-left position. Every output
 * channel reads these. */
static void group_taps_portable(const sc_geom *g, const float *x0, const int64_t *offs, int64_t m,
                                float *xg) {
    for (int64_t t = 0; t < g->T; t++)
        for (int k = 0; k < 4; k++) {
            const float *r = x0 + offs[t] + (k >> 1) * g->Wp + (k & 1);
            for (int64_t w = 0; w < 16; w++) xg[(t * 4 + k) * 16 + w] = w < m ? r[2 * w] : 0.0f;
        }
}

/* bf16 rounding kept as f32 (kiln_f32_to_bf16's bits in the high half). */
static float round_bf16(float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        u = (u & 0xFFFF0000u) | 0x00400000u;
    else
        u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* ---- forward ------------------------------------------------------------------------ */

bool kiln_bf16_conv_pool_smallc_supports(const kiln_op_args *a) {
    if (a->n_in < 2 || a->n_out != 2) return false;
    const kiln_strided *x = &a->in[0], *w = &a->in[1], *y = &a->out[0], *ix = &a->out[1];
    const kiln_strided *b = a->n_in > 2 && a->in[2].ndim >= 0 ? &a->in[2] : NULL;
    if (x->dtype != KILN_BF16 || w->dtype != KILN_BF16 || y->dtype != KILN_BF16 || ix->dtype != KILN_I64)
        return false;
    if (!contiguous(x, 4) || !contiguous(w, 4) || !contiguous(y, 4) || !contiguous(ix, 4)) return false;
    if (b && (b->dtype != KILN_BF16 || !contiguous(b, 1) || b->shape[0] != w->shape[0])) return false;
    for (int i = 0; i < 4; i++)
        if (ix->shape[i] != y->shape[i]) return false;
    sc_geom g;
    return geom_of(x, w->shape, a->attrs, y->shape, &g);
}

/* Per thread: an image's padded planes and a group's taps. */
static size_t slot_bytes(const sc_geom *g) {
    return pad_bytes(g) + up64((size_t)(g->T * 64) * sizeof(float));
}

/* The weight [O][T] and the bias [O] in f32. */
static size_t fwd_fixed_bytes(const sc_geom *g) {
    return up64((size_t)(g->O * g->T) * sizeof(float)) + up64((size_t)g->O * sizeof(float));
}

size_t kiln_bf16_conv_pool_smallc_workspace(const kiln_op_args *a) {
    sc_geom g;
    if (!geom_of(&a->in[0], a->in[1].shape, a->attrs, a->out[0].shape, &g)) return 0;
    return fwd_fixed_bytes(&g) + (size_t)kiln_cpu_threads_max() * slot_bytes(&g);
}

/* Output channel o of a group: each window's four positions as chains of
 * fused multiply-adds (bias, then tap by tap), rounded to bf16, ReLU'd and
 * picked as relu_max_pool2d picks; y, ix: the group's first outputs in
 * channel o's plane; at0: the plane index of its first window's top left. */
static void fwd_channel_portable(const sc_geom *g, const float *xg, const float *wo, float bias, int64_t m,
                                 int64_t at0, uint16_t *y, int64_t *ix) {
    const int64_t at4[4] = {0, 1, g->OW, g->OW + 1};
    for (int64_t w = 0; w < m; w++) {
        float best = 0.0f;
        int64_t at = 0;
        for (int k = 0; k < 4; k++) {
            float acc = bias;
            for (int64_t t = 0; t < g->T; t++) acc = fmaf(xg[(t * 4 + k) * 16 + w], wo[t], acc);
            float v = round_bf16(acc);
            if (!(v > 0.0f || is_nan(v))) v = 0.0f;
            if (k == 0 || v > best || is_nan(v)) best = v, at = at4[k];
        }
        uint32_t u;
        memcpy(&u, &best, sizeof u);
        y[w] = (uint16_t)(u >> 16);
        ix[w] = at0 + 2 * w + at;
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define KILN_SC_AVX512 1
#define AVX512         __attribute__((target("avx512f,avx512bw,avx512vl")))

static bool avx512_ok(void) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
}

static __mmask16 lanes(int64_t m) { return m >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << m) - 1u); }

AVX512 static void group_taps_avx512(const sc_geom *g, const float *x0, const int64_t *offs, int64_t m,
                                     float *xg) {
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    const __mmask16 lo = lanes(2 * m), hi = lanes(2 * m - 16 > 0 ? 2 * m - 16 : 0);
    for (int64_t t = 0; t < g->T; t++)
        for (int row = 0; row < 2; row++) {
            const float *r = x0 + offs[t] + row * g->Wp;
            __m512 a = _mm512_maskz_loadu_ps(lo, r), b = _mm512_maskz_loadu_ps(hi, r + 16);
            _mm512_storeu_ps(xg + (t * 4 + 2 * row) * 16, _mm512_permutex2var_ps(a, even, b));
            _mm512_storeu_ps(xg + (t * 4 + 2 * row + 1) * 16, _mm512_permutex2var_ps(a, odd, b));
        }
}

AVX512 static __m512 round16(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    __m512i one = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), one));
    r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x00400000));
    return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xFFFF0000u)));
}

AVX512 static __m512 relu16(__m512 v) { /* max(v, +0), NaN kept */
    __mmask16 keep =
        _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm512_maskz_mov_ps(keep, v);
}

AVX512 static void fwd_channel_avx512(const sc_geom *g, const float *xg, const float *wo, float bias,
                                      int64_t m, int64_t at0, uint16_t *y, int64_t *ix) {
    __m512 a0 = _mm512_set1_ps(bias), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t t = 0; t < g->T; t++) {
        const __m512 wv = _mm512_set1_ps(wo[t]);
        const float *xt = xg + t * 64;
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(xt), wv, a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(xt + 16), wv, a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(xt + 32), wv, a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(xt + 48), wv, a3);
    }
    const __m512 v[4] = {relu16(round16(a0)), relu16(round16(a1)), relu16(round16(a2)), relu16(round16(a3))};
    const int at3[3] = {1, (int)g->OW, (int)g->OW + 1};
    __m512 best = v[0];
    __m512i off = _mm512_setzero_si512();
    for (int k = 1; k < 4; k++) {
        __mmask16 take =
            _mm512_cmp_ps_mask(v[k], best, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v[k], v[k], _CMP_UNORD_Q);
        best = _mm512_mask_mov_ps(best, take, v[k]);
        off = _mm512_mask_mov_epi32(off, take, _mm512_set1_epi32(at3[k - 1]));
    }
    const __mmask16 mk = lanes(m);
    _mm256_mask_storeu_epi16(y, mk, _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(best), 16)));
    const __m512i two_w = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i rel = _mm512_add_epi32(two_w, off);
    const __m512i b64 = _mm512_set1_epi64(at0);
    _mm512_mask_storeu_epi64(ix, (__mmask8)(mk & 0xFF),
                             _mm512_add_epi64(b64, _mm512_cvtepi32_epi64(_mm512_castsi512_si256(rel))));
    _mm512_mask_storeu_epi64(ix + 8, (__mmask8)(mk >> 8),
                             _mm512_add_epi64(b64, _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(rel, 1))));
}
#endif

/* The AVX-512 rows, unless the CPU lacks them or a test asks for the portable ones. */
static bool use_vector(void) {
#ifdef KILN_SC_AVX512
    return avx512_ok() && kiln_bf16_rows_allowed();
#else
    return false;
#endif
}

static void group_taps(const sc_geom *g, const float *x0, const int64_t *offs, int64_t m, float *xg,
                       bool vec) {
#ifdef KILN_SC_AVX512
    if (vec) {
        group_taps_avx512(g, x0, offs, m, xg);
        return;
    }
#endif
    (void)vec;
    group_taps_portable(g, x0, offs, m, xg);
}

kiln_status kiln_bf16_conv_pool_smallc(const kiln_op_args *a) {
    sc_geom g;
    if (!geom_of(&a->in[0], a->in[1].shape, a->attrs, a->out[0].shape, &g))
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL,
                          "kiln_conv2d_relu_max_pool2d: bf16 small-channel kernel called on a shape it does "
                          "not support");
    const size_t fixed = fwd_fixed_bytes(&g), slot = slot_bytes(&g);
    int slots = 1;
    KILN_TRY(slots_of(a, "kiln_conv2d_relu_max_pool2d", fixed, slot, &slots));
    const uint16_t *x = a->in[0].data, *w = a->in[1].data;
    const uint16_t *bias = a->n_in > 2 && a->in[2].ndim >= 0 ? a->in[2].data : NULL;
    uint16_t *y = a->out[0].data;
    int64_t *ix = a->out[1].data;
    float *wf = a->workspace,
          *bf = (float *)((char *)a->workspace + up64((size_t)(g.O * g.T) * sizeof(float)));
    char *slots_base = (char *)a->workspace + fixed;
    kiln_bf16_to_f32_n(w, wf, (size_t)(g.O * g.T));
    for (int64_t o = 0; o < g.O; o++) bf[o] = bias ? widen(bias[o]) : 0.0f;
    int64_t offs[MAX_TAPS];
    tap_offsets(&g, offs);
    const bool vec = use_vector();
    const int64_t plane = g.PH * g.PW;
#ifdef _OPENMP
#pragma omp parallel num_threads(slots) if (slots > 1 && g.N > 1)
#endif
    {
        char *s = slots_base + (size_t)kiln_cpu_thread_id() * slot;
        float *xp = (float *)s, *xg = (float *)(s + pad_bytes(&g));
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t n = 0; n < g.N; n++) {
            pad_image(x + n * g.C * g.H * g.W, &g, xp);
            for (int64_t pr = 0; pr < g.PH; pr++)
                for (int64_t pc = 0; pc < g.PW; pc += 16) {
                    const int64_t m = g.PW - pc < 16 ? g.PW - pc : 16, at0 = 2 * pr * g.OW + 2 * pc;
                    group_taps(&g, xp + 2 * pr * g.Wp + 2 * pc, offs, m, xg, vec);
                    for (int64_t o = 0; o < g.O; o++) {
                        const int64_t out = (n * g.O + o) * plane + pr * g.PW + pc;
#ifdef KILN_SC_AVX512
                        if (vec)
                            fwd_channel_avx512(&g, xg, wf + o * g.T, bf[o], m, at0, y + out, ix + out);
                        else
#endif
                            fwd_channel_portable(&g, xg, wf + o * g.T, bf[o], m, at0, y + out, ix + out);
                    }
                }
        }
    }
    return KILN_OK;
}

/* ---- weight gradient ---------------------------------------------------------------- */

/* conv2d_relu_max_pool2d_grad_weight's args: (grad_out, y, indices, x) ->
 * (grad_weight, grad_bias), attrs.ints the weight's shape. */
bool kiln_bf16_conv_pool_smallc_grad_weight_supports(const kiln_op_args *a) {
    if (a->n_in != 4 || a->n_out != 2 || a->attrs->n_ints < 4) return false;
    const kiln_strided *go = &a->in[0], *y = &a->in[1], *ix = &a->in[2], *x = &a->in[3];
    const kiln_strided *dw = &a->out[0], *db = &a->out[1];
    if (go->dtype != KILN_BF16 || y->dtype != KILN_BF16 || ix->dtype != KILN_I64 || x->dtype != KILN_BF16 ||
        dw->dtype != KILN_BF16 || db->dtype != KILN_BF16)
        return false;
    if (!contiguous(go, 4) || !contiguous(y, 4) || !contiguous(ix, 4) || !contiguous(x, 4) ||
        !contiguous(dw, 4))
        return false;
    if (db->ndim != 1 || db->layout != KILN_LAYOUT_STRIDED || db->shape[0] != a->attrs->ints[0]) return false;
    for (int i = 0; i < 4; i++)
        if (y->shape[i] != go->shape[i] || ix->shape[i] != go->shape[i] || dw->shape[i] != a->attrs->ints[i])
            return false;
    sc_geom g;
    return geom_of(x, a->attrs->ints, a->attrs, go->shape, &g);
}

static int64_t chunks_of(int64_t n) { return n < MAX_CHUNKS ? n : MAX_CHUNKS; }

/* The chunks' sums in double: [chunk][O][T] for the weight, [chunk][O] for the bias. */
static size_t wgrad_fixed_bytes(const sc_geom *g) {
    int64_t ch = chunks_of(g->N);
    return up64((size_t)(ch * g->O * (g->T + 1)) * sizeof(double));
}

/* Per thread, besides slot_bytes: a chunk's running sums by lane, f32
 * [O][T][16] for the weight and double [O][16] for the bias. */
static size_t wgrad_lane_bytes(const sc_geom *g) {
    return up64((size_t)(g->O * g->T * 16) * sizeof(float)) + up64((size_t)(g->O * 16) * sizeof(double));
}

size_t kiln_bf16_conv_pool_smallc_grad_weight_workspace(const kiln_op_args *a) {
    sc_geom g;
    if (!geom_of(&a->in[3], a->attrs->ints, a->attrs, a->in[0].shape, &g)) return 0;
    return wgrad_fixed_bytes(&g) + (size_t)kiln_cpu_threads_max() * (slot_bytes(&g) + wgrad_lane_bytes(&g));
}

/* Which of a window's positions its index names: 0..3 (top left, top
 * right, bottom left, bottom right), or -1. */
static int position_of(int64_t d, int64_t OW) {
    return d == 0 ? 0 : d == 1 ? 1 : d == OW ? 2 : d == OW + 1 ? 3 : -1;
}

/* Output channel o of a group (go, y, ix: its first windows in o's plane;
 * at0: the first window's top left): acc[t][w] += each of window w's four
 * positions' tap t times the gradient that position gets (the window's
 * where its index names it and y > 0, else 0), position by position;
 * bacc[w] += the window's gradient where y > 0. True when a window with
 * y > 0 has its index elsewhere (wgrad_channel_strays). Portable form. */
static bool wgrad_channel_portable(const sc_geom *g, const float *xg, const uint16_t *go, const uint16_t *y,
                                   const int64_t *ix, int64_t m, int64_t at0, float *acc, double *bacc) {
    float gk[4][16];
    memset(gk, 0, sizeof gk);
    bool strays = false;
    for (int64_t w = 0; w < m; w++) {
        if (!(widen(y[w]) > 0.0f)) continue;
        const float gv = widen(go[w]);
        const int k = position_of(ix[w] - (at0 + 2 * w), g->OW);
        if (k >= 0)
            gk[k][w] = gv;
        else
            strays = true;
    }
    for (int64_t t = 0; t < g->T; t++)
        for (int w = 0; w < 16; w++) {
            float s = acc[t * 16 + w];
            for (int k = 0; k < 4; k++) s = fmaf(xg[(t * 4 + k) * 16 + w], gk[k][w], s);
            acc[t * 16 + w] = s;
        }
    for (int w = 0; w < 16; w++) bacc[w] += w < m && widen(y[w]) > 0.0f ? (double)widen(go[w]) : 0.0;
    return strays;
}

#ifdef KILN_SC_AVX512
AVX512 static bool wgrad_channel_avx512(const sc_geom *g, const float *xg, const uint16_t *go,
                                        const uint16_t *y, const int64_t *ix, int64_t m, int64_t at0,
                                        float *acc, double *bacc) {
    const __mmask16 mk = lanes(m);
    const __m512 yv =
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, y)), 16));
    const __m512 gv =
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, go)), 16));
    const __mmask16 pass = _mm512_mask_cmp_ps_mask(mk, yv, _mm512_setzero_ps(), _CMP_GT_OQ);
    /* d = index - (at0 + 2 w), narrowed to 32 bits where it fits (else it names no position) */
    const __m512i b64 = _mm512_set1_epi64(at0);
    const __m512i two_w = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i i0 = _mm512_sub_epi64(_mm512_maskz_loadu_epi64((__mmask8)(mk & 0xFF), ix), b64),
                  i1 = _mm512_sub_epi64(_mm512_maskz_loadu_epi64((__mmask8)(mk >> 8), ix + 8), b64);
    const __m256i lo = _mm512_cvtepi64_epi32(i0), hi = _mm512_cvtepi64_epi32(i1);
    const __mmask16 fits = (__mmask16)(_mm512_cmpeq_epi64_mask(_mm512_cvtepi32_epi64(lo), i0) |
                                       (_mm512_cmpeq_epi64_mask(_mm512_cvtepi32_epi64(hi), i1) << 8));
    const __m512i d = _mm512_sub_epi32(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), two_w);
    const int OW = (int)g->OW;
    const __mmask16 ok = pass & fits;
    const __mmask16 k0 = ok & _mm512_cmpeq_epi32_mask(d, _mm512_setzero_si512()),
                    k1 = ok & _mm512_cmpeq_epi32_mask(d, _mm512_set1_epi32(1)),
                    k2 = ok & _mm512_cmpeq_epi32_mask(d, _mm512_set1_epi32(OW)),
                    k3 = ok & _mm512_cmpeq_epi32_mask(d, _mm512_set1_epi32(OW + 1));
    const __m512 g0 = _mm512_maskz_mov_ps(k0, gv), g1 = _mm512_maskz_mov_ps(k1, gv),
                 g2 = _mm512_maskz_mov_ps(k2, gv), g3 = _mm512_maskz_mov_ps(k3, gv);
    for (int64_t t = 0; t < g->T; t++) {
        const float *xt = xg + t * 64;
        __m512 s = _mm512_loadu_ps(acc + t * 16);
        s = _mm512_fmadd_ps(_mm512_loadu_ps(xt), g0, s);
        s = _mm512_fmadd_ps(_mm512_loadu_ps(xt + 16), g1, s);
        s = _mm512_fmadd_ps(_mm512_loadu_ps(xt + 32), g2, s);
        s = _mm512_fmadd_ps(_mm512_loadu_ps(xt + 48), g3, s);
        _mm512_storeu_ps(acc + t * 16, s);
    }
    const __m512 gp = _mm512_maskz_mov_ps(pass, gv);
    _mm512_storeu_pd(bacc, _mm512_add_pd(_mm512_loadu_pd(bacc), _mm512_cvtps_pd(_mm512_castps512_ps256(gp))));
    _mm512_storeu_pd(
        bacc + 8,
        _mm512_add_pd(_mm512_loadu_pd(bacc + 8),
                      _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(gp), 1)))));
    return (pass & (__mmask16) ~(k0 | k1 | k2 | k3)) != 0;
}
#endif

/* Windows whose index names a position outside the window (never from
 * kiln_conv2d_relu_max_pool2d, but a valid input): their gradient times
 * that position's taps, after the group's, in both forms. 1: an index
 * outside the plane. */
static int wgrad_channel_strays(const sc_geom *g, const float *xp, const int64_t *offs, const uint16_t *go,
                                const uint16_t *y, const int64_t *ix, int64_t m, int64_t at0, float *acc) {
    int bad = 0;
    for (int64_t w = 0; w < m; w++) {
        if (!(widen(y[w]) > 0.0f) || position_of(ix[w] - (at0 + 2 * w), g->OW) >= 0) continue;
        if (ix[w] < 0 || ix[w] >= g->OH * g->OW) {
            bad = 1;
            continue;
        }
        const float gv = widen(go[w]), *p = xp + (ix[w] / g->OW) * g->Wp + ix[w] % g->OW;
        for (int64_t t = 0; t < g->T; t++) acc[t * 16 + w] = fmaf(p[offs[t]], gv, acc[t * 16 + w]);
    }
    return bad;
}

kiln_status kiln_bf16_conv_pool_smallc_grad_weight(const kiln_op_args *a) {
    sc_geom g;
    if (!geom_of(&a->in[3], a->attrs->ints, a->attrs, a->in[0].shape, &g))
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL,
                          "kiln_conv2d_relu_max_pool2d_grad_weight: bf16 small-channel kernel called on a "
                          "shape it does not support");
    const size_t fixed = wgrad_fixed_bytes(&g), slot = slot_bytes(&g) + wgrad_lane_bytes(&g);
    int slots = 1;
    KILN_TRY(slots_of(a, "kiln_conv2d_relu_max_pool2d_grad_weight", fixed, slot, &slots));
    const uint16_t *go = a->in[0].data, *y = a->in[1].data, *x = a->in[3].data;
    const int64_t *ix = a->in[2].data;
    const int64_t ch = chunks_of(g.N), plane = g.PH * g.PW, OT = g.O * g.T;
    double *sums = a->workspace; /* [chunk][O][T], then [chunk][O] */
    char *slots_base = (char *)a->workspace + fixed;
    int64_t offs[MAX_TAPS];
    tap_offsets(&g, offs);
    const bool vec = use_vector();
    int bad = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(slots) if (slots > 1 && ch > 1) reduction(| : bad)
#endif
    {
        char *s = slots_base + (size_t)kiln_cpu_thread_id() * slot;
        float *xp = (float *)s, *xg = (float *)(s + pad_bytes(&g));
        float *lane = (float *)(s + slot_bytes(&g));
        double *blane = (double *)((char *)lane + up64((size_t)(OT * 16) * sizeof(float)));
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t c = 0; c < ch; c++) {
            memset(lane, 0, sizeof *lane * (size_t)(OT * 16));
            memset(blane, 0, sizeof *blane * (size_t)(g.O * 16));
            for (int64_t n = c * g.N / ch; n < (c + 1) * g.N / ch; n++) {
                pad_image(x + n * g.C * g.H * g.W, &g, xp);
                for (int64_t pr = 0; pr < g.PH; pr++)
                    for (int64_t pc = 0; pc < g.PW; pc += 16) {
                        const int64_t m = g.PW - pc < 16 ? g.PW - pc : 16, at0 = 2 * pr * g.OW + 2 * pc;
                        group_taps(&g, xp + 2 * pr * g.Wp + 2 * pc, offs, m, xg, vec);
                        for (int64_t o = 0; o < g.O; o++) {
                            const int64_t in = (n * g.O + o) * plane + pr * g.PW + pc;
                            float *acc = lane + o * g.T * 16;
                            bool strays;
#ifdef KILN_SC_AVX512
                            if (vec)
                                strays = wgrad_channel_avx512(&g, xg, go + in, y + in, ix + in, m, at0, acc,
                                                              blane + o * 16);
                            else
#endif
                                strays = wgrad_channel_portable(&g, xg, go + in, y + in, ix + in, m, at0, acc,
                                                                blane + o * 16);
                            if (strays)
                                bad |=
                                    wgrad_channel_strays(&g, xp, offs, go + in, y + in, ix + in, m, at0, acc);
                        }
                    }
            }
            /* the chunk's lanes added in order */
            double *wc = sums + c * OT, *bc = sums + ch * OT + c * g.O;
            for (int64_t i = 0; i < OT; i++) {
                double v = 0.0;
                for (int w = 0; w < 16; w++) v += lane[i * 16 + w];
                wc[i] = v;
            }
            for (int64_t o = 0; o < g.O; o++) {
                double v = 0.0;
                for (int w = 0; w < 16; w++) v += blane[o * 16 + w];
                bc[o] = v;
            }
        }
    }
    if (bad)
        return KILN_RAISE(
            KILN_ERR_INVALID_ARGUMENT, "pass the indices kiln_conv2d_relu_max_pool2d returned",
            "kiln_conv2d_relu_max_pool2d_grad_weight: an index is outside its %lld-element plane",
            (long long)(g.OH * g.OW));
    uint16_t *dw = a->out[0].data, *db = a->out[1].data;
    for (int64_t i = 0; i < OT; i++) {
        double v = 0.0;
        for (int64_t c = 0; c < ch; c++) v += sums[c * OT + i];
        dw[i] = kiln_f32_to_bf16((float)v);
    }
    for (int64_t o = 0; o < g.O; o++) {
        double v = 0.0;
        for (int64_t c = 0; c < ch; c++) v += sums[ch * OT + c * g.O + o];
        db[o * a->out[1].strides[0]] = kiln_f32_to_bf16((float)v);
    }
    return KILN_OK;
}

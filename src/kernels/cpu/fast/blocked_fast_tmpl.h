/* The blocked kernels of blocked_fast.c, for one block size: included
 * with L (channels per block), SFX(name) (the names of this instance) and
 * BLOCK_LAYOUT (its kiln_layout) defined. Uses plain4 from the includer. */
KILN_SIMD_CLONES static void SFX(reorder_block_f32)(float *restrict d, const float *restrict s, int64_t HW, bool to_blocked) {
    if (to_blocked) {
        for (int64_t i = 0; i < HW; i++)
            for (int l = 0; l < L; l++) d[i * L + l] = s[l * HW + i];
    } else {
        for (int l = 0; l < L; l++)
            for (int64_t i = 0; i < HW; i++) d[l * HW + i] = s[i * L + l];
    }
}

static void SFX(kiln_cpu_reorder_nchw16c)(void *dst, const void *src, size_t elem, const int64_t *shape, bool to_blocked) {
    const int64_t N = shape[0], CB = shape[1] / L, HW = shape[2] * shape[3];
    const char *s = src;
    char *d = dst;
#ifdef _OPENMP
#pragma omp parallel for collapse(2) schedule(static) if (N * CB * HW * L >= 32768)
#endif
    for (int64_t n = 0; n < N; n++)
        for (int64_t cb = 0; cb < CB; cb++) {
            /* plain: ((n * C + cb * 16 + l) * HW + i); blocked: (((n * CB + cb) * HW + i) * 16 + l) */
            const int64_t plain0 = (n * CB + cb) * L * HW, blocked0 = (n * CB + cb) * HW * L;
            if (elem == 4) {
                const float *sf = (const float *)s;
                float *df = (float *)d;
                if (to_blocked) SFX(reorder_block_f32)(df + blocked0, sf + plain0, HW, true);
                else SFX(reorder_block_f32)(df + plain0, sf + blocked0, HW, false);
                continue;
            }
            for (int64_t i = 0; i < HW; i++)
                for (int l = 0; l < L; l++) {
                    int64_t b = (blocked0 + i * L + l) * (int64_t)elem, p = (plain0 + l * HW + i) * (int64_t)elem;
                    if (to_blocked) memcpy(d + b, s + p, elem);
                    else memcpy(d + p, s + b, elem);
                }
        }
}

static bool SFX(blocked4)(const kiln_strided *t, kiln_dtype dtype) {
    return t->layout == BLOCK_LAYOUT && t->ndim == 4 && t->dtype == dtype && t->shape[1] % L == 0;
}


/* ---- max pooling -------------------------------------------------------------------- */

static bool SFX(kiln_blocked_max_pool2d_supports)(const kiln_op_args *a) {
    return a->n_out >= 2 && SFX(blocked4)(&a->in[0], KILN_F32) && a->out[0].ndim == 4 && a->out[0].dtype == KILN_F32 &&
           a->out[1].dtype == KILN_I64;
}


/* One output row of a 2x2, stride-2, unpadded window: r0, r1 the two
 * input rows (blocked), index0 the plane index of the row's first window.
 * The comparisons are the general loop's, in its order. */
KILN_SIMD_CLONES static void SFX(pool_row_2x2)(const float *restrict r0, const float *restrict r1, float *restrict y,
                                          int64_t *restrict ix, int64_t OW, int64_t index0, int64_t W, bool relu) {
    for (int64_t ow = 0; ow < OW; ow++) {
        const float *a = r0 + 2 * ow * L, *b = a + L, *c = r1 + 2 * ow * L, *d = c + L;
        const int64_t i0 = index0 + 2 * ow;
        for (int l = 0; l < L; l++) {
            float best = a[l];
            int32_t bi = 0;
            bool t = (b[l] > best) | (b[l] != b[l]);
            best = t ? b[l] : best, bi = t ? 1 : bi;
            t = (c[l] > best) | (c[l] != c[l]);
            best = t ? c[l] : best, bi = t ? 2 : bi;
            t = (d[l] > best) | (d[l] != d[l]);
            best = t ? d[l] : best, bi = t ? 3 : bi;
            if (relu) { /* relu(x) then max: a window with nothing positive is all zeros, the first wins */
                bool keep = best > 0.0f || best != best;
                best = keep ? best : 0.0f, bi = keep ? bi : 0;
            }
            y[ow * L + l] = best;
            ix[ow * L + l] = i0 + (bi & 1) + (int64_t)(bi >> 1) * W;
        }
    }
}

static kiln_status SFX(blocked_pool)(const kiln_op_args *a, bool relu) {
    const float *x = a->in[0].data;
    float *y = a->out[0].data;
    int64_t *ix = a->out[1].data;
    if (a->out[0].layout != BLOCK_LAYOUT || a->out[1].layout != BLOCK_LAYOUT)
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "kiln_max_pool2d: the blocked kernel needs blocked outputs");
    kiln_pool_geom g = kiln_pool_geom_of(a->attrs);
    const int64_t N = a->in[0].shape[0], CB = a->in[0].shape[1] / L, H = a->in[0].shape[2], W = a->in[0].shape[3];
    const int64_t OH = a->out[0].shape[2], OW = a->out[0].shape[3];
    const int64_t kh = g.kernel[0], kw = g.kernel[1], sh = g.stride[0], sw = g.stride[1];
    const int64_t ph = g.padding[0], pw = g.padding[1];
    const bool avx2 = kiln_pool_avx2_ok();
    /* values and int64 indices: streaming stores past the cache (pool_avx2.h) */
    const bool stream = avx2 && (size_t)(N * CB * OH * OW * L) * 12 >= kiln_pool_stream_bytes() &&
                        aligned32(y) && aligned32(ix);
#ifdef _OPENMP
#pragma omp parallel for collapse(2) schedule(static) if (N * CB * OH * OW * L > 4096)
#endif
    for (int64_t p = 0; p < N * CB; p++)
        for (int64_t oh = 0; oh < OH; oh++) {
            const float *xp = x + p * H * W * L;
            float *yp = y + (p * OH + oh) * OW * L;
            int64_t *ip = ix + (p * OH + oh) * OW * L;
            if (kh == 2 && kw == 2 && sh == 2 && sw == 2 && ph == 0 && pw == 0 && 2 * OH <= H && 2 * OW <= W) {
                /* The first window value is taken as is (the general loop
                 * starts from -inf and takes it unless it is -inf, keeping
                 * the first index either way: the same result). */
                if (avx2)
                    kiln_pool2x2_row_avx2(xp + 2 * oh * W * L, xp + (2 * oh + 1) * W * L, yp, ip, OW, 2 * oh * W, W, L,
                                          relu, stream);
                else
                    SFX(pool_row_2x2)(xp + 2 * oh * W * L, xp + (2 * oh + 1) * W * L, yp, ip, OW, 2 * oh * W, W, relu);
                continue;
            }
            int64_t h0 = oh * sh - ph, h1 = h0 + kh < H ? h0 + kh : H;
            if (h0 < 0) h0 = 0;
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t w0 = ow * sw - pw, w1 = w0 + kw < W ? w0 + kw : W;
                if (w0 < 0) w0 = 0;
                float best[L];
                int64_t bi[L];
                for (int l = 0; l < L; l++) best[l] = -INFINITY, bi[l] = h0 * W + w0;
                for (int64_t h = h0; h < h1; h++)
                    for (int64_t w = w0; w < w1; w++) {
                        const float *v = xp + (h * W + w) * L;
                        for (int l = 0; l < L; l++) {
                            bool take = (v[l] > best[l]) | (v[l] != v[l]);
                            best[l] = take ? v[l] : best[l];
                            bi[l] = take ? h * W + w : bi[l];
                        }
                    }
                for (int l = 0; l < L; l++) {
                    float b = best[l];
                    int64_t k = bi[l];
                    if (relu && !(b > 0.0f || b != b)) b = 0.0f, k = h0 * W + w0; /* all zeros after relu: the first */
                    yp[ow * L + l] = b, ip[ow * L + l] = k;
                }
            }
        }
    return KILN_OK;
}

static kiln_status SFX(kiln_blocked_max_pool2d)(const kiln_op_args *a) { return SFX(blocked_pool)(a, false); }
/* relu_max_pool2d: max pooling, then ReLU on the maxima (the two commute);
 * the indices are those max pooling gives for relu(x): where no value of a
 * window is positive, its first element. */
static kiln_status SFX(kiln_blocked_relu_max_pool2d)(const kiln_op_args *a) { return SFX(blocked_pool)(a, true); }

/* grad_out in either layout, indices blocked (as the forward wrote them),
 * grad_input blocked. Non-overlapping windows only (each input element
 * gets at most one gradient, so the sum has one term, as in the
 * reference). */
static bool SFX(kiln_blocked_max_pool2d_backward_supports)(const kiln_op_args *a) {
    kiln_pool_geom g = kiln_pool_geom_of(a->attrs);
    if (g.stride[0] < g.kernel[0] || g.stride[1] < g.kernel[1]) return false;
    const kiln_strided *go = &a->in[0], *ix = &a->in[1], *dx = &a->out[0];
    return SFX(blocked4)(ix, KILN_I64) && (SFX(blocked4)(go, KILN_F32) || plain4(go, KILN_F32)) && dx->ndim == 4 &&
           dx->dtype == KILN_F32 && dx->shape[1] % L == 0 && go->shape[1] == dx->shape[1];
}


/* The input gradient of two input rows under one output row of a 2x2,
 * stride-2 window, written densely: each input element gets its window's
 * gradient where the window's index names it, else 0; with y (the fused
 * relu_max_pool2d_backward) only where y > 0. All blocked: go, ix, y hold
 * OW * 16 values. Returns how many indices lie outside their own window.
 * sum: each lane's gradients that passed, added in order in double. */
#define POOL_BWD_ROW(NAME, RELU)                                                                             \
    KILN_SIMD_CLONES static int64_t NAME(const float *restrict go, const int64_t *restrict ix,               \
                                         const float *restrict y, float *restrict d0, float *restrict d1,    \
                                         int64_t OW, int64_t index0, int64_t W, double *restrict sum) {      \
        int64_t stray = 0;                                                                                   \
        for (int l = 0; l < L; l++) sum[l] = 0.0;                                                            \
        for (int64_t ow = 0; ow < OW; ow++) {                                                                \
            const int32_t w32 = (int32_t)W;                                                                  \
            for (int l = 0; l < L; l++) {                                                                    \
                float g = go[ow * L + l];                                                                    \
                if (RELU) g = y[ow * L + l] > 0.0f ? g : 0.0f;                                               \
                sum[l] += (double)g;                                                                         \
                /* an offset outside [0, W + 1] matches no position (its low half may) */                  \
                int64_t off = ix[ow * L + l] - (index0 + 2 * ow);                                            \
                int32_t rel = off >= 0 && off <= (int64_t)W + 1 ? (int32_t)off : -1;                         \
                d0[(2 * ow) * L + l] = rel == 0 ? g : 0.0f;                                                  \
                d0[(2 * ow + 1) * L + l] = rel == 1 ? g : 0.0f;                                              \
                d1[(2 * ow) * L + l] = rel == w32 ? g : 0.0f;                                                \
                d1[(2 * ow + 1) * L + l] = rel == w32 + 1 ? g : 0.0f;                                        \
                stray += (rel != 0) & (rel != 1) & (rel != w32) & (rel != w32 + 1);                          \
            }                                                                                                \
        }                                                                                                    \
        return stray;                                                                                        \
    }
POOL_BWD_ROW(SFX(pool_bwd_row), 0)
POOL_BWD_ROW(SFX(pool_bwd_row_relu), 1)

/* A plain row's chunk (planes `plane` apart) in blocked order in buf. */
static const float *SFX(gather_row)(const float *row, int64_t plane, int64_t c0, int64_t n, float *buf) {
    for (int l = 0; l < L; l++)
        for (int64_t i = 0; i < n; i++) buf[i * L + l] = row[l * plane + c0 + i];
    return buf;
}

/* One output row: a plain grad_out or y row (planes `plane` apart: both
 * have the pooled size) is first gathered into blocked order in chunks on
 * the stack. acc (L doubles) or NULL: gains each lane's gradients that
 * passed, in double (a plane's sum is then exact in practice, so its bits
 * are those of any order). */
static int64_t SFX(pool_backward_rows_2x2)(const float *go_row, bool go_blocked, int64_t plane, const int64_t *ix_row,
                                      const float *y_row, bool y_blocked, float *d0, float *d1, int64_t OW,
                                      int64_t index0, int64_t W, bool avx2, bool stream, double *acc) {
    int64_t stray = 0;
    for (int64_t c0 = 0; c0 < OW; c0 += ROW_CHUNK) {
        int64_t n = OW - c0 < ROW_CHUNK ? OW - c0 : ROW_CHUNK;
        float buf[ROW_CHUNK * L], ybuf[ROW_CHUNK * L];
        const float *g = go_blocked ? go_row + c0 * L : SFX(gather_row)(go_row, plane, c0, n, buf);
        const float *y = !y_row ? NULL : y_blocked ? y_row + c0 * L : SFX(gather_row)(y_row, plane, c0, n, ybuf);
        const int64_t *ix = ix_row + c0 * L;
        float *e0 = d0 + 2 * c0 * L, *e1 = d1 + 2 * c0 * L;
        double part[L];
        if (avx2)
            stray += kiln_pool2x2_backward_row_avx2(g, ix, y, e0, e1, n, index0 + 2 * c0, W, L, stream, acc ? part : NULL);
        else
            stray += y ? SFX(pool_bwd_row_relu)(g, ix, y, e0, e1, n, index0 + 2 * c0, W, part)
                       : SFX(pool_bwd_row)(g, ix, NULL, e0, e1, n, index0 + 2 * c0, W, part);
        if (acc)
            for (int l = 0; l < L; l++) acc[l] += part[l];
    }
    return stray;
}

/* One (n, channel block) plane of the dense 2x2 path: dp (H x W x L)
 * from the plane's grad_out and y (NULL: max_pool2d's), each blocked or
 * plain with planes `plane` apart, and indices; the rows and columns no
 * window covers get 0; acc (L doubles, zeroed here) or NULL: the plane's
 * sums. Returns the indices outside their window. */
static int64_t SFX(pool_backward_plane_2x2)(const float *go_p, bool go_blocked, int64_t plane, const int64_t *ix_p,
                                       const float *y_p, bool y_blocked, float *dp, int64_t OH, int64_t OW, int64_t H,
                                       int64_t W, bool avx2, bool stream, double *acc) {
    int64_t stray = 0;
    if (acc)
        for (int l = 0; l < L; l++) acc[l] = 0.0;
    if (2 * OH < H) memset(dp + 2 * OH * W * L, 0, sizeof(float) * (size_t)((H - 2 * OH) * W * L));
    for (int64_t oh = 0; oh < OH; oh++) {
        float *d0 = dp + 2 * oh * W * L, *d1 = d0 + W * L;
        if (2 * OW < W)
            for (int64_t w = 2 * OW; w < W; w++)
                for (int l = 0; l < L; l++) d0[w * L + l] = d1[w * L + l] = 0.0f;
        const float *go_row = go_blocked ? go_p + oh * OW * L : go_p + oh * OW;
        const float *y_row = !y_p ? NULL : y_blocked ? y_p + oh * OW * L : y_p + oh * OW;
        stray += SFX(pool_backward_rows_2x2)(go_row, go_blocked, plane, ix_p + oh * OW * L, y_row, y_blocked, d0, d1,
                                        OW, 2 * oh * W, W, avx2, stream, acc);
    }
    return stray;
}

/* max_pool2d_backward (grad_out, indices) and, with relu, the fused
 * relu_max_pool2d_backward (grad_out, y, indices): the gradient passes
 * only where the pooled output y is > 0. grad_out and y are blocked like
 * the indices, or plain NCHW: a flatten's backward (the classifier's
 * reshape of y) leaves y plain, and converting the int64 indices to match
 * sent the whole op to the plain scalar scatter and its gradient to the
 * convolution plain.
 * part (N x C doubles) or NULL: part[n * C + c] = the sum of plane (n, c)
 * of the input gradient, from the gradients that passed. */
static kiln_status SFX(blocked_pool_backward)(const kiln_op_args *a, bool relu, double *part) {
    const float *go = a->in[0].data;
    const int64_t *ix = a->in[relu ? 2 : 1].data;
    const float *yv = relu ? a->in[1].data : NULL;
    float *dx = a->out[0].data;
    if (a->out[0].layout != BLOCK_LAYOUT)
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "kiln_max_pool2d_backward: the blocked kernel needs a blocked output");
    const bool go_blocked = a->in[0].layout == BLOCK_LAYOUT, y_blocked = !relu || a->in[1].layout == BLOCK_LAYOUT;
    const int64_t N = a->out[0].shape[0], CB = a->out[0].shape[1] / L, H = a->out[0].shape[2], W = a->out[0].shape[3];
    const int64_t OH = a->in[0].shape[2], OW = a->in[0].shape[3], HW = H * W, OHW = OH * OW;
    kiln_pool_geom g = kiln_pool_geom_of(a->attrs);
    if (g.kernel[0] == 2 && g.kernel[1] == 2 && g.stride[0] == 2 && g.stride[1] == 2 && g.padding[0] == 0 &&
        g.padding[1] == 0 && 2 * OH <= H && 2 * OW <= W) {
        /* The dense path needs every index inside its own window (what
         * kiln_max_pool2d writes); any other index sends the whole call to
         * the scatter path below, which overwrites everything and checks
         * the indices against the plane. */
        int64_t stray = 0;
        const bool avx2 = kiln_pool_avx2_ok();
        /* the input gradient: streaming stores past the cache (pool_avx2.h) */
        const bool stream = avx2 && (size_t)(N * CB * HW * L) * 4 >= kiln_pool_stream_bytes() && aligned32(dx);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) reduction(+ : stray) if (N * CB * HW * L > 4096)
#endif
        for (int64_t p = 0; p < N * CB; p++)
            stray += SFX(pool_backward_plane_2x2)(go_blocked ? go + p * OHW * L : go + p * L * OHW, go_blocked, OHW,
                                             ix + p * OHW * L, !yv ? NULL : y_blocked ? yv + p * OHW * L : yv + p * L * OHW,
                                             y_blocked, dx + p * HW * L, OH, OW, H, W, avx2, stream,
                                             part ? part + p * L : NULL);
        if (!stray) return KILN_OK;
    }
    int bad = 0;
    int64_t bad_index = 0;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (N * CB * HW * L > 4096)
#endif
    for (int64_t p = 0; p < N * CB; p++) {
        float *dp = dx + p * HW * L;
        const int64_t *ip = ix + p * OHW * L;
        double *acc = part ? part + p * L : NULL;
        if (acc)
            for (int l = 0; l < L; l++) acc[l] = 0.0;
        memset(dp, 0, sizeof(float) * (size_t)(HW * L));
        for (int64_t i = 0; i < OHW; i++)
            for (int l = 0; l < L; l++) {
                int64_t k = ip[i * L + l];
                /* grad_out blocked: (p, i, l); plain: plane (p * 16 + l), element i */
                float gv = go_blocked ? go[(p * OHW + i) * L + l] : go[(p * L + l) * OHW + i];
                if (yv) gv = (y_blocked ? yv[(p * OHW + i) * L + l] : yv[(p * L + l) * OHW + i]) > 0.0f ? gv : 0.0f;
                if (k < 0 || k >= HW) {
#ifdef _OPENMP
#pragma omp critical(kiln_blocked_pool_bad)
#endif
                    {
                        bad = 1;
                        bad_index = k;
                    }
                    continue;
                }
                dp[k * L + l] += gv;
                if (acc) acc[l] += (double)gv;
            }
    }
    if (bad)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass the indices kiln_max_pool2d returned",
                          "kiln_max_pool2d_backward: index %lld is outside the %lld-element plane",
                          (long long)bad_index, (long long)HW);
    return KILN_OK;
}

static kiln_status SFX(kiln_blocked_max_pool2d_backward)(const kiln_op_args *a) { return SFX(blocked_pool_backward)(a, false, NULL); }
static kiln_status SFX(kiln_blocked_relu_max_pool2d_backward)(const kiln_op_args *a) { return SFX(blocked_pool_backward)(a, true, NULL); }
static kiln_status SFX(kiln_blocked_relu_max_pool2d_backward_sum)(const kiln_op_args *a, double *part) {
    return SFX(blocked_pool_backward)(a, true, part);
}

/* relu_max_pool2d_backward (grad_out, y, indices): y and the indices
 * blocked (as the forward wrote them), grad_out either. */
static bool SFX(kiln_blocked_relu_max_pool2d_backward_supports)(const kiln_op_args *a) {
    kiln_pool_geom g = kiln_pool_geom_of(a->attrs);
    if (a->n_in < 3 || g.stride[0] < g.kernel[0] || g.stride[1] < g.kernel[1]) return false;
    const kiln_strided *go = &a->in[0], *y = &a->in[1], *ix = &a->in[2], *dx = &a->out[0];
    return SFX(blocked4)(ix, KILN_I64) && (SFX(blocked4)(y, KILN_F32) || plain4(y, KILN_F32)) &&
           (SFX(blocked4)(go, KILN_F32) || plain4(go, KILN_F32)) &&
           dx->ndim == 4 && dx->dtype == KILN_F32 && dx->shape[1] % L == 0 && go->shape[1] == dx->shape[1];
}


/* ---- the bias gradient: sum over (N, H, W) of a blocked tensor ----------------------- */

/* acc[l] += x[i * 16 + l] over i, in order (16 double lanes). */
KILN_SIMD_CLONES static void SFX(sum_block)(const float *restrict x, int64_t HW, double *restrict acc) {
    double a[L];
    for (int l = 0; l < L; l++) a[l] = acc[l];
    for (int64_t i = 0; i < HW; i++)
        for (int l = 0; l < L; l++) a[l] += (double)x[i * L + l];
    for (int l = 0; l < L; l++) acc[l] = a[l];
}

static bool SFX(kiln_blocked_sum_supports)(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0];
    const kiln_op_attrs *at = a->attrs;
    if (!SFX(blocked4)(x, KILN_F32) || at->keepdim || at->n_dims != 3 || a->out[0].ndim != 1 ||
        a->out[0].dtype != KILN_F32)
        return false;
    bool red[4] = {false};
    for (int i = 0; i < 3; i++) red[((at->dims[i] % 4) + 4) % 4] = true;
    return red[0] && !red[1] && red[2] && red[3];
}


static kiln_status SFX(kiln_blocked_sum)(const kiln_op_args *a) {
    const float *x = a->in[0].data;
    float *y = a->out[0].data;
    const int64_t N = a->in[0].shape[0], CB = a->in[0].shape[1] / L, HW = a->in[0].shape[2] * a->in[0].shape[3];
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (N * CB * HW * L >= 65536 && CB > 1)
#endif
    for (int64_t cb = 0; cb < CB; cb++) {
        double acc[L];
        for (int l = 0; l < L; l++) acc[l] = 0;
        for (int64_t n = 0; n < N; n++) SFX(sum_block)(x + (n * CB + cb) * HW * L, HW, acc);
        for (int l = 0; l < L; l++) y[cb * L + l] = (float)acc[l];
    }
    return KILN_OK;
}


/* The conv2d kernels for one compute type, included by ops_conv.c twice:
 * with NN_T float (f32, f16, bf16 data) and NN_T double (f64 data). NN_FN(x)
 * pastes the type's suffix onto a name.
 *
 * Each image and group is lowered to a GEMM over im2col columns:
 *   col  (K, P)   K = Cg * kH * kW, P = Ho * Wo
 *   fwd  out (Og, P)  = W (Og, K) x col (K, P)
 *   dgrad col (K, P)  = W^T (K, Og) x g (Og, P), then col2im
 *   wgrad dW (Og, K) += g (Og, P) x col^T (P, K)
 * GEMM loops run over column blocks of NN_PBLOCK so a block of col stays
 * in cache while every output row streams over it. */

/* x[n, c0 : c0 + C] -> buf (C, H, W) contiguous. */
static void NN_FN(load_planes)(const kiln_strided *x, int64_t n, int64_t c0, int64_t C, NN_T *buf) {
    int64_t H = x->shape[2], W = x->shape[3];
    const int64_t *st = x->strides;
    for (int64_t c = 0; c < C; c++)
        for (int64_t h = 0; h < H; h++) {
            int64_t base = n * st[0] + (c0 + c) * st[1] + h * st[2];
            NN_T *row = buf + (c * H + h) * W;
            if (x->dtype == KILN_F32 && st[3] == 1) {
                const float *src = (const float *)x->data + base;
                for (int64_t w = 0; w < W; w++) row[w] = (NN_T)src[w];
            } else {
                for (int64_t w = 0; w < W; w++) row[w] = (NN_T)nn_ld(x->data, x->dtype, base + w * st[3]);
            }
        }
}

/* w (O, Cg, kH, kW) strided -> buf (O, K) contiguous. */
static void NN_FN(load_weight)(const kiln_strided *w, NN_T *buf) {
    int64_t idx[4] = {0, 0, 0, 0}, i = 0;
    if (nn_numel(4, w->shape) == 0) return;
    do {
        buf[i++] = (NN_T)nn_ld(w->data, w->dtype, nn_offset(4, w->strides, idx));
    } while (nn_next(4, w->shape, idx));
}

static void NN_FN(im2col)(const NN_T *xb, int64_t C, int64_t H, int64_t W, int64_t kH, int64_t kW,
                          const kiln_conv_geom *g, int64_t Ho, int64_t Wo, NN_T *col) {
    for (int64_t c = 0; c < C; c++)
        for (int64_t kh = 0; kh < kH; kh++)
            for (int64_t kw = 0; kw < kW; kw++) {
                NN_T *dst = col + ((c * kH + kh) * kW + kw) * Ho * Wo;
                for (int64_t oh = 0; oh < Ho; oh++) {
                    int64_t ih = oh * g->stride[0] - g->padding[0] + kh * g->dilation[0];
                    NN_T *drow = dst + oh * Wo;
                    if (ih < 0 || ih >= H) {
                        for (int64_t ow = 0; ow < Wo; ow++) drow[ow] = 0;
                        continue;
                    }
                    const NN_T *srow = xb + (c * H + ih) * W;
                    for (int64_t ow = 0; ow < Wo; ow++) {
                        int64_t iw = ow * g->stride[1] - g->padding[1] + kw * g->dilation[1];
                        drow[ow] = (iw >= 0 && iw < W) ? srow[iw] : (NN_T)0;
                    }
                }
            }
}

/* The adjoint of im2col: xb (C, H, W) += scatter of col. xb is zeroed first. */
static void NN_FN(col2im)(const NN_T *col, int64_t C, int64_t H, int64_t W, int64_t kH, int64_t kW,
                          const kiln_conv_geom *g, int64_t Ho, int64_t Wo, NN_T *xb) {
    for (int64_t i = 0; i < C * H * W; i++) xb[i] = 0;
    for (int64_t c = 0; c < C; c++)
        for (int64_t kh = 0; kh < kH; kh++)
            for (int64_t kw = 0; kw < kW; kw++) {
                const NN_T *src = col + ((c * kH + kh) * kW + kw) * Ho * Wo;
                for (int64_t oh = 0; oh < Ho; oh++) {
                    int64_t ih = oh * g->stride[0] - g->padding[0] + kh * g->dilation[0];
                    if (ih < 0 || ih >= H) continue;
                    NN_T *xrow = xb + (c * H + ih) * W;
                    const NN_T *srow = src + oh * Wo;
                    for (int64_t ow = 0; ow < Wo; ow++) {
                        int64_t iw = ow * g->stride[1] - g->padding[1] + kw * g->dilation[1];
                        if (iw >= 0 && iw < W) xrow[iw] += srow[ow];
                    }
                }
            }
}

/* C (M, P) = A (M, K; row stride lda) x B (K, P). */
static void NN_FN(gemm_nn)(int64_t M, int64_t K, int64_t P, const NN_T *A, int64_t lda, const NN_T *B,
                           NN_T *Cm) {
    for (int64_t i = 0; i < M * P; i++) Cm[i] = 0;
    for (int64_t p0 = 0; p0 < P; p0 += NN_PBLOCK) {
        int64_t pn = P - p0 < NN_PBLOCK ? P - p0 : NN_PBLOCK;
        for (int64_t m = 0; m < M; m++) {
            NN_T *crow = Cm + m * P + p0;
            for (int64_t k = 0; k < K; k++) {
                NN_T a = A[m * lda + k];
                const NN_T *brow = B + k * P + p0;
                for (int64_t p = 0; p < pn; p++) crow[p] += a * brow[p];
            }
        }
    }
}

/* Col (K, P) = A^T x G: A (M, K; row stride lda), G (M, P). */
static void NN_FN(gemm_tn)(int64_t M, int64_t K, int64_t P, const NN_T *A, int64_t lda, const NN_T *G,
                           NN_T *Col) {
    for (int64_t i = 0; i < K * P; i++) Col[i] = 0;
    for (int64_t p0 = 0; p0 < P; p0 += NN_PBLOCK) {
        int64_t pn = P - p0 < NN_PBLOCK ? P - p0 : NN_PBLOCK;
        for (int64_t m = 0; m < M; m++) {
            const NN_T *grow = G + m * P + p0;
            for (int64_t k = 0; k < K; k++) {
                NN_T a = A[m * lda + k];
                NN_T *crow = Col + k * P + p0;
                for (int64_t p = 0; p < pn; p++) crow[p] += a * grow[p];
            }
        }
    }
}

/* acc (M, K; row stride ldacc) += G (M, P) x Col^T; each dot product is
 * summed in NN_T over one image, then added to the double accumulator. */
static void NN_FN(gemm_nt_acc)(int64_t M, int64_t K, int64_t P, const NN_T *G, const NN_T *Col, double *acc,
                               int64_t ldacc) {
    for (int64_t m = 0; m < M; m++) {
        const NN_T *grow = G + m * P;
        for (int64_t k = 0; k < K; k++) {
            const NN_T *crow = Col + k * P;
            NN_T s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            int64_t p = 0;
            for (; p + 4 <= P; p += 4) {
                s0 += grow[p] * crow[p];
                s1 += grow[p + 1] * crow[p + 1];
                s2 += grow[p + 2] * crow[p + 2];
                s3 += grow[p + 3] * crow[p + 3];
            }
            for (; p < P; p++) s0 += grow[p] * crow[p];
            acc[m * ldacc + k] += (double)((s0 + s1) + (s2 + s3));
        }
    }
}

/* relu: conv2d_relu, relu applied to each result (NaN kept, as relu does)
 * before it is stored; rounding to the output dtype commutes with it. */
static kiln_status NN_FN(conv_forward)(const kiln_op_args *a, bool relu) {
    const kiln_strided *x = &a->in[0], *w = &a->in[1], *b = &a->in[2], *y = &a->out[0];
    kiln_conv_geom g = kiln_conv_geom_of(a->attrs);
    int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t O = w->shape[0], Cg = w->shape[1], kH = w->shape[2], kW = w->shape[3];
    int64_t Ho = y->shape[2], Wo = y->shape[3], P = Ho * Wo, K = Cg * kH * kW, Og = O / g.groups;
    (void)C;
    NN_T *wb = a->workspace;     /* (O, K) */
    NN_T *xb = wb + O * K;       /* (Cg, H, W) */
    NN_T *col = xb + Cg * H * W; /* (K, P) */
    NN_T *ob = col + K * P;      /* (Og, P) */
    NN_FN(load_weight)(w, wb);
    for (int64_t n = 0; n < N; n++)
        for (int64_t gi = 0; gi < g.groups; gi++) {
            NN_FN(load_planes)(x, n, gi * Cg, Cg, xb);
            NN_FN(im2col)(xb, Cg, H, W, kH, kW, &g, Ho, Wo, col);
            NN_FN(gemm_nn)(Og, K, P, wb + gi * Og * K, K, col, ob);
            for (int64_t o = 0; o < Og; o++) {
                int64_t oc = gi * Og + o;
                NN_T bias = b->ndim >= 0 ? (NN_T)nn_ld(b->data, b->dtype, oc * b->strides[0]) : (NN_T)0;
                for (int64_t oh = 0; oh < Ho; oh++)
                    for (int64_t ow = 0; ow < Wo; ow++) {
                        NN_T v = ob[o * P + oh * Wo + ow] + bias;
                        if (relu && !(v > 0 || v != v)) v = 0;
                        nn_st(y->data, y->dtype,
                              n * y->strides[0] + oc * y->strides[1] + oh * y->strides[2] +
                                  ow * y->strides[3],
                              (double)v);
                    }
            }
        }
    return KILN_OK;
}

static kiln_status NN_FN(conv_grad_input)(const kiln_op_args *a) {
    const kiln_strided *go = &a->in[0], *w = &a->in[1], *dx = &a->out[0];
    kiln_conv_geom g = kiln_conv_geom_of(a->attrs);
    int64_t N = dx->shape[0], H = dx->shape[2], W = dx->shape[3];
    int64_t O = w->shape[0], Cg = w->shape[1], kH = w->shape[2], kW = w->shape[3];
    int64_t Ho = go->shape[2], Wo = go->shape[3], P = Ho * Wo, K = Cg * kH * kW, Og = O / g.groups;
    NN_T *wb = a->workspace; /* (O, K) */
    NN_T *gb = wb + O * K;   /* (Og, P) */
    NN_T *col = gb + Og * P; /* (K, P) */
    NN_T *xb = col + K * P;  /* (Cg, H, W) */
    NN_FN(load_weight)(w, wb);
    for (int64_t n = 0; n < N; n++)
        for (int64_t gi = 0; gi < g.groups; gi++) {
            NN_FN(load_planes)(go, n, gi * Og, Og, gb);
            NN_FN(gemm_tn)(Og, K, P, wb + gi * Og * K, K, gb, col);
            NN_FN(col2im)(col, Cg, H, W, kH, kW, &g, Ho, Wo, xb);
            for (int64_t c = 0; c < Cg; c++)
                for (int64_t h = 0; h < H; h++)
                    for (int64_t ww = 0; ww < W; ww++)
                        nn_st(dx->data, dx->dtype,
                              n * dx->strides[0] + (gi * Cg + c) * dx->strides[1] + h * dx->strides[2] +
                                  ww * dx->strides[3],
                              (double)xb[(c * H + h) * W + ww]);
        }
    return KILN_OK;
}

static kiln_status NN_FN(conv_grad_weight)(const kiln_op_args *a) {
    const kiln_strided *go = &a->in[0], *x = &a->in[1], *dw = &a->out[0];
    kiln_conv_geom g = kiln_conv_geom_of(a->attrs);
    int64_t N = x->shape[0], H = x->shape[2], W = x->shape[3];
    int64_t O = dw->shape[0], Cg = dw->shape[1], kH = dw->shape[2], kW = dw->shape[3];
    int64_t Ho = go->shape[2], Wo = go->shape[3], P = Ho * Wo, K = Cg * kH * kW, Og = O / g.groups;
    double *acc = a->workspace;       /* (O, K) */
    NN_T *gb = (NN_T *)(acc + O * K); /* (Og, P) */
    NN_T *xb = gb + Og * P;           /* (Cg, H, W) */
    NN_T *col = xb + Cg * H * W;      /* (K, P) */
    for (int64_t i = 0; i < O * K; i++) acc[i] = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t gi = 0; gi < g.groups; gi++) {
            NN_FN(load_planes)(go, n, gi * Og, Og, gb);
            NN_FN(load_planes)(x, n, gi * Cg, Cg, xb);
            NN_FN(im2col)(xb, Cg, H, W, kH, kW, &g, Ho, Wo, col);
            NN_FN(gemm_nt_acc)(Og, K, P, gb, col, acc + gi * Og * K, K);
        }
    int64_t idx[4] = {0, 0, 0, 0}, i = 0;
    if (O * K == 0) return KILN_OK;
    do {
        nn_st(dw->data, dw->dtype, nn_offset(4, dw->strides, idx), acc[i++]);
    } while (nn_next(4, dw->shape, idx));
    return KILN_OK;
}

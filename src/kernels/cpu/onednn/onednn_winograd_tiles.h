/* The transforms of onednn_winograd.c's tiles and the passes over one
 * tile: F(2x2, 3x3)'s written out; F(4x4, 3x3)'s and F(6x6, 3x3)'s
 * matrices, with one body per pass (the filters' transforms U = G g G^T
 * and dW = G^T S G for the weight gradient, the input, output-gradient
 * and output tiles) that every square tile and the mixed tiling's 4x6 and
 * 6x4 share. Not a header of its own: it is included once, by
 * onednn_winograd.c, after the types and helpers it uses (v8, act, the
 * AVX2 target attribute), as the kernels' _tmpl.h files are, so every
 * function stays static and inlines into the passes. */
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
                                        int64_t k, bool acc) {
#pragma omp parallel for schedule(static)
    for (int64_t ci = 0; ci < c; ci++)
        for (int64_t co = 0; co < k; co += 8) {
            v8 m[4][4];
            for (int xi = 0; xi < 16; xi++) {
                v8 sum = *(const v8u *)(s + ((int64_t)xi * c + ci) * k + co);
                for (int64_t t = 1; t < threads; t++)
                    sum += *(const v8u *)(s + (size_t)t * thread_stride + ((int64_t)xi * c + ci) * k + co);
                m[xi / 4][xi % 4] = sum;
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
                for (int tap = 0; tap < 9; tap++) out[tap] = acc ? out[tap] + o[tap][e] : o[tap][e];
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

/* ---- F(4x4, 3x3) ---------------------------------------------------------------------
 *
 * 6x6 input tiles, 4x4 output tiles, 36 planes (Lavin and Gray, 2016):
 *   B^T = [4 0 -5 0 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0; 0 -2 -1 2 1 0; 0 2 -1 -2 1 0; 0 4 0 -5 0 1]
 *   G   = [1/4 0 0; -1/6 -1/6 -1/6; -1/6 1/6 -1/6; 1/24 1/12 1/6; 1/24 -1/12 1/6; 0 0 1]
 *   A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1]
 * The products are 36/16 = 2.25 multiply-adds per output and channel pair
 * against F(2x2)'s 4 and the direct convolution's 9; the transforms'
 * constants up to 8 and fractions down to 1/24 round more than F(2x2)'s
 * (tests/kernels/test_winograd_conv.c holds both to the same bound). Each
 * helper applies its matrix to six (or four, three) vectors d[0], d[ds],
 * ... and writes o[0], o[os], ... */

AVX2 static inline v8 splat(float f) { return (v8){f, f, f, f, f, f, f, f}; }

AVX2 static inline void bt6(const v8 *d, int ds, v8 *o, int os) {
    const v8 four = splat(4.0f), five = splat(5.0f), two = splat(2.0f);
    v8 d0 = d[0], d1 = d[ds], d2 = d[2 * ds], d3 = d[3 * ds], d4 = d[4 * ds], d5 = d[5 * ds];
    o[0] = four * d0 - five * d2 + d4;
    o[os] = d3 + d4 - four * (d1 + d2);
    o[2 * os] = four * (d1 - d2) + d4 - d3;
    o[3 * os] = two * (d3 - d1) + d4 - d2;
    o[4 * os] = two * (d1 - d3) + d4 - d2;
    o[5 * os] = four * d1 - five * d3 + d5;
}

/* A^T: six vectors to four. */
AVX2 static inline void at6(const v8 *m, int ms, v8 *o, int os) {
    const v8 two = splat(2.0f), four = splat(4.0f), eight = splat(8.0f);
    v8 m0 = m[0], m1 = m[ms], m2 = m[2 * ms], m3 = m[3 * ms], m4 = m[4 * ms], m5 = m[5 * ms];
    v8 a = m1 + m2, b = m1 - m2, c = m3 + m4, e = m3 - m4;
    o[0] = m0 + a + c;
    o[os] = b + two * e;
    o[2 * os] = a + four * c;
    o[3 * os] = b + eight * e + m5;
}

/* A: four vectors to six. */
AVX2 static inline void a4(const v8 *e, int es, v8 *o, int os) {
    const v8 two = splat(2.0f), four = splat(4.0f), eight = splat(8.0f);
    v8 e0 = e[0], e1 = e[es], e2 = e[2 * es], e3 = e[3 * es];
    v8 ev = e0 + four * e2, od = two * e1 + eight * e3;
    o[0] = e0;
    o[os] = e0 + e1 + e2 + e3;
    o[2 * os] = e0 - e1 + e2 - e3;
    o[3 * os] = ev + od;
    o[4 * os] = ev - od;
    o[5 * os] = e3;
}

/* G: three vectors to six. */
AVX2 static inline void g3(const v8 *g, int gs, v8 *o, int os) {
    const v8 q = splat(0.25f), s6 = splat(1.0f / 6.0f), s12 = splat(1.0f / 12.0f), s24 = splat(1.0f / 24.0f);
    v8 g0 = g[0], g1 = g[gs], g2 = g[2 * gs];
    v8 sum = g0 + g2;
    o[0] = q * g0;
    o[os] = -s6 * (sum + g1);
    o[2 * os] = -s6 * (sum - g1);
    o[3 * os] = s24 * g0 + s12 * g1 + s6 * g2;
    o[4 * os] = s24 * g0 - s12 * g1 + s6 * g2;
    o[5 * os] = g2;
}

/* G^T: six vectors to three. */
AVX2 static inline void gt6(const v8 *s, int ss, v8 *o, int os) {
    const v8 q = splat(0.25f), s6 = splat(1.0f / 6.0f), s12 = splat(1.0f / 12.0f), s24 = splat(1.0f / 24.0f);
    v8 s0 = s[0], s1 = s[ss], s2 = s[2 * ss], s3 = s[3 * ss], s4 = s[4 * ss], s5 = s[5 * ss];
    o[0] = q * s0 - s6 * (s1 + s2) + s24 * (s3 + s4);
    o[os] = s6 * (s2 - s1) + s12 * (s3 - s4);
    o[2 * os] = s6 * (s3 + s4 - s1 - s2) + s5;
}

/* ---- F(6x6, 3x3) ---------------------------------------------------------------------
 *
 * 8x8 input tiles, 6x6 output tiles, 64 planes (Lavin and Gray, 2016; the
 * points 0, 1, -1, 1/2, -1/2, 2, -2 and infinity):
 *   B^T = [1 0 -21/4 0 21/4 0 -1 0;  0 1 1 -17/4 -17/4 1 1 0;  0 -1 1 17/4 -17/4 -1 1 0;
 *          0 1/2 1/4 -5/2 -5/4 2 1 0;  0 -1/2 1/4 5/2 -5/4 -2 1 0;  0 2 4 -5/2 -5 1/2 1 0;
 *          0 -2 4 5/2 -5 -1/2 1 0;  0 -1 0 21/4 0 -21/4 0 1]
 *   G   = [1 0 0; -2/9 -2/9 -2/9; -2/9 2/9 -2/9; 1/90 1/45 2/45; 1/90 -1/45 2/45;
 *          32/45 16/45 8/45; 32/45 -16/45 8/45; 0 0 1]
 *   A^T = [1 1 1 1 1 1 1 0; 0 1 -1 2 -2 1/2 -1/2 0; 0 1 1 4 4 1/4 1/4 0;
 *          0 1 -1 8 -8 1/8 -1/8 0; 0 1 1 16 16 1/16 1/16 0; 0 1 -1 32 -32 1/32 -1/32 1]
 * 64/36 = 1.78 multiply-adds per output and channel pair, but a 6x6 tile
 * wastes more of a plane whose side is not a multiple of 6, and the
 * constants (up to 32, fractions down to 1/90) round more than F(4x4)'s.
 * It pays where a plane fits the tiles: the pooled forward of a 7x7
 * convolution, whose 2x2 pooling reads only the top-left 6x6 (one tile
 * against F(4x4)'s four, 64 products against 144; onednn_conv.c,
 * wino_default). */

AVX2 static inline void bt8(const v8 *d, int ds, v8 *o, int os) {
    const v8 c525 = splat(5.25f), c425 = splat(4.25f), c025 = splat(0.25f), c125 = splat(1.25f),
             c05 = splat(0.5f), c25 = splat(2.5f), two = splat(2.0f), four = splat(4.0f), five = splat(5.0f);
    v8 d0 = d[0], d1 = d[ds], d2 = d[2 * ds], d3 = d[3 * ds], d4 = d[4 * ds], d5 = d[5 * ds], d6 = d[6 * ds],
       d7 = d[7 * ds];
    o[0] = d0 - d6 + c525 * (d4 - d2);
    v8 a = d2 + d6 - c425 * d4, b = d1 + d5 - c425 * d3;
    o[os] = a + b;
    o[2 * os] = a - b;
    a = c025 * d2 - c125 * d4 + d6, b = c05 * d1 - c25 * d3 + two * d5;
    o[3 * os] = a + b;
    o[4 * os] = a - b;
    a = four * d2 - five * d4 + d6, b = two * d1 - c25 * d3 + c05 * d5;
    o[5 * os] = a + b;
    o[6 * os] = a - b;
    o[7 * os] = d7 - d1 + c525 * (d3 - d5);
}

/* A^T: eight vectors to six. */
AVX2 static inline void at8(const v8 *m, int ms, v8 *o, int os) {
    const v8 two = splat(2.0f), four = splat(4.0f), eight = splat(8.0f), c16 = splat(16.0f), c32 = splat(32.0f),
             h2 = splat(0.5f), h4 = splat(0.25f), h8 = splat(0.125f), h16 = splat(0.0625f), h32 = splat(0.03125f);
    v8 m0 = m[0], m7 = m[7 * ms];
    v8 a = m[ms] + m[2 * ms], b = m[ms] - m[2 * ms], c = m[3 * ms] + m[4 * ms], e = m[3 * ms] - m[4 * ms],
       f = m[5 * ms] + m[6 * ms], h = m[5 * ms] - m[6 * ms];
    o[0] = m0 + a + c + f;
    o[os] = b + two * e + h2 * h;
    o[2 * os] = a + four * c + h4 * f;
    o[3 * os] = b + eight * e + h8 * h;
    o[4 * os] = a + c16 * c + h16 * f;
    o[5 * os] = b + c32 * e + h32 * h + m7;
}

/* A: six vectors to eight. */
AVX2 static inline void a6(const v8 *e, int es, v8 *o, int os) {
    const v8 two = splat(2.0f), four = splat(4.0f), eight = splat(8.0f), c16 = splat(16.0f), c32 = splat(32.0f),
             h2 = splat(0.5f), h4 = splat(0.25f), h8 = splat(0.125f), h16 = splat(0.0625f), h32 = splat(0.03125f);
    v8 e0 = e[0], e1 = e[es], e2 = e[2 * es], e3 = e[3 * es], e4 = e[4 * es], e5 = e[5 * es];
    v8 ev = e0 + e2 + e4, od = e1 + e3 + e5;
    o[0] = e0;
    o[os] = ev + od;
    o[2 * os] = ev - od;
    ev = e0 + four * e2 + c16 * e4, od = two * e1 + eight * e3 + c32 * e5;
    o[3 * os] = ev + od;
    o[4 * os] = ev - od;
    ev = e0 + h4 * e2 + h16 * e4, od = h2 * e1 + h8 * e3 + h32 * e5;
    o[5 * os] = ev + od;
    o[6 * os] = ev - od;
    o[7 * os] = e5;
}

/* G: three vectors to eight. */
AVX2 static inline void g3_8(const v8 *g, int gs, v8 *o, int os) {
    const v8 c29 = splat(2.0f / 9.0f), c90 = splat(1.0f / 90.0f), c45 = splat(1.0f / 45.0f), two = splat(2.0f),
             four = splat(4.0f), c32 = splat(32.0f), c16 = splat(16.0f), eight = splat(8.0f);
    v8 g0 = g[0], g1 = g[gs], g2 = g[2 * gs];
    o[0] = g0;
    o[os] = -c29 * (g0 + g1 + g2);
    o[2 * os] = -c29 * (g0 - g1 + g2);
    o[3 * os] = c90 * (g0 + two * g1 + four * g2);
    o[4 * os] = c90 * (g0 - two * g1 + four * g2);
    o[5 * os] = c45 * (c32 * g0 + c16 * g1 + eight * g2);
    o[6 * os] = c45 * (c32 * g0 - c16 * g1 + eight * g2);
    o[7 * os] = g2;
}

/* G^T: eight vectors to three. */
AVX2 static inline void gt8(const v8 *s, int ss, v8 *o, int os) {
    const v8 c29 = splat(2.0f / 9.0f), c90 = splat(1.0f / 90.0f), c45 = splat(1.0f / 45.0f), two = splat(2.0f),
             c32 = splat(32.0f), c16 = splat(16.0f), eight = splat(8.0f);
    v8 s0 = s[0], s7 = s[7 * ss];
    v8 p12 = s[ss] + s[2 * ss], m12 = s[2 * ss] - s[ss], p34 = s[3 * ss] + s[4 * ss], m34 = s[3 * ss] - s[4 * ss],
       p56 = s[5 * ss] + s[6 * ss], m56 = s[5 * ss] - s[6 * ss];
    o[0] = s0 - c29 * p12 + c90 * p34 + c45 * (c32 * p56);
    o[os] = c29 * m12 + c45 * (m34 + c16 * m56);
    o[2 * os] = c45 * (two * p34 + eight * p56) - c29 * p12 + s7;
}

/* ---- F(4x4) and F(6x6): the passes over a tile ----------------------------------------
 *
 * One body for every tile: an output tile of MR x MC (4 or 6 each), an
 * input tile of TR x TC = (MR + 2) x (MC + 2) (TR * TC planes, plane
 * a * TC + q for row a and column q), through each side's matrices (bt:
 * B^T, T to T; at: A^T, T to M; a: A, M to T; g: G, 3 to T; gt: G^T, T to
 * 3), the rows' first (r) and the columns' (c). The square tiles take one
 * size's matrices on both sides; F(4x6) and F(6x4), the mixed tiling's
 * (onednn_winograd.c, "F(4x4) and F(6x6) together"), one of each. Each
 * body is inlined into the functions below with the sizes and matrices
 * constant, so the loops unroll and the transforms inline as if written
 * out for each tile. The arrays are sized for the largest tile. */
typedef void (*wino_tx)(const v8 *d, int ds, v8 *o, int os);
#define TILE_BODY AVX2 static inline __attribute__((always_inline))

/* The filters' transforms go nb (1 or 2) blocks of 8 output channels at
 * a time, so that each plane's row gets a whole 64-byte line at once: a
 * plane is cin x cout floats, often a power of two of bytes (32 KiB for 64
 * -> 128 channels), so the TR x TC planes' rows of one (ci, co) fall into
 * one or two sets of the L1 and L2 caches, and with a block at a time each
 * line left the caches between its two halves (the filters' transforms
 * took about a fifth of F(6x6)'s forward at batch 128; docs/performance.md). */
#define FILTER_BLOCKS(cout, co) ((cout) - (co) >= 16 ? 2 : 1)

/* U[xi][ci][co..co+8*nb-1] = (G_r g G_c^T)[xi] for the filters from ci to
 * those output channels. */
TILE_BODY void filters_tile(int TR, int TC, wino_tx gr, wino_tx gc, const float *w, float *u, int64_t ci, int64_t co,
                            int64_t cin, int64_t cout, bool flip, int nb) {
    v8 r[2][8][8];
    for (int b = 0; b < nb; b++) {
        v8 f[3][3], t[8][3];
        gather_filters(w, ci, co + 8 * b, cin, cout, flip, f);
        for (int j = 0; j < 3; j++) gr(&f[0][j], 3, &t[0][j], 3);
        for (int i = 0; i < TR; i++) gc(&t[i][0], 1, &r[b][i][0], 1);
    }
    for (int xi = 0; xi < TR * TC; xi++) {
        float *row = u + ((int64_t)xi * cin + ci) * cout + co;
        for (int b = 0; b < nb; b++) *(v8u *)(row + 8 * b) = r[b][xi / TC][xi % TC];
    }
}

/* dW[co..co+8*nb-1][ci] = G_r^T S G_c, S the threads' sums added in thread
 * order; acc: added to dW (the mixed tiling's later tiles), else written. */
TILE_BODY void filters_grad_tile(int TR, int TC, wino_tx gtr, wino_tx gtc, const float *s, int64_t threads,
                                 size_t thread_stride, float *dw, int64_t ci, int64_t co, int64_t c, int64_t k,
                                 bool acc, int nb) {
    v8 m[2][8][8];
    for (int xi = 0; xi < TR * TC; xi++)
        for (int b = 0; b < nb; b++) {
            const float *sx = s + ((int64_t)xi * c + ci) * k + co + 8 * b;
            v8 sum = *(const v8u *)sx;
            for (int64_t th = 1; th < threads; th++) sum += *(const v8u *)(sx + (size_t)th * thread_stride);
            m[b][xi / TC][xi % TC] = sum;
        }
    for (int b = 0; b < nb; b++) {
        v8 t[3][8], o[3][3];
        for (int j = 0; j < TC; j++) gtr(&m[b][0][j], 8, &t[0][j], 8);
        for (int i = 0; i < 3; i++) gtc(&t[i][0], 1, &o[i][0], 1);
        for (int e = 0; e < 8; e++) {
            float *out = dw + ((co + 8 * b + e) * c + ci) * 9;
            for (int tap = 0; tap < 9; tap++)
                out[tap] = acc ? out[tap] + o[tap / 3][tap % 3][e] : o[tap / 3][tap % 3][e];
        }
    }
}

/* The passes over a tile below unroll their loops (TR, TC, MR and MC are
 * constants where they are inlined): left to itself GCC kept them as
 * loops, the intermediate t[][] in memory between the two halves of a
 * transform. Unrolled, it stays in registers, and GCC may fuse a multiply
 * of the first half with an add of the second (FMA contraction), so the
 * bits moved against the rolled build (within the Winograd bound of
 * tests/kernels/test_winograd_conv.c). The bench CNN's training step
 * (F(4x4) everywhere) took 0.944x the time; the main job's (F(6x6) and
 * the mixed tiling) 0.995x (docs/performance.md). */
/* V[xi][p][c0..c0+7] = (B_r^T d B_c)[xi] for the TR x TC input tile at
 * (h0, w0): a column of d at a time through B_r^T (TR loads, TR results
 * kept), then a row at a time through B_c into the planes, so few values
 * leave registers. */
TILE_BODY void input_tile_n(int TR, int TC, wino_tx btr, wino_tx btc, const act *x, const float *base, int64_t h0,
                            int64_t w0, float *v, size_t xi_stride) {
    v8 t[8][8], d[8];
    const v8 zero = {0};
    int64_t rs = x->w * x->b, cs = x->b;
    bool inside = h0 >= 0 && w0 >= 0 && h0 + TR <= x->h && w0 + TC <= x->w;
#pragma GCC unroll 8
    for (int q = 0; q < TC; q++) {
        int64_t w = w0 + q;
        if (inside) {
            const float *p = base + h0 * rs + w * cs;
#pragma GCC unroll 8
            for (int a = 0; a < TR; a++) d[a] = *(const v8u *)(p + a * rs);
        } else {
#pragma GCC unroll 8
            for (int a = 0; a < TR; a++) {
                int64_t h = h0 + a;
                d[a] = h >= 0 && h < x->h && w >= 0 && w < x->w ? *(const v8u *)(base + h * rs + w * cs) : zero;
            }
        }
        btr(d, 1, &t[0][q], 8);
    }
#pragma GCC unroll 8
    for (int a = 0; a < TR; a++) {
        v8 r[8];
        btc(t[a], 1, r, 1);
#pragma GCC unroll 8
        for (int q = 0; q < TC; q++) *(v8u *)(v + (size_t)(a * TC + q) * xi_stride) = r[q];
    }
}

/* Z[xi][p][k0..k0+7] = (A_r e A_c^T)[xi] for the MR x MC output-gradient
 * tile e at (h0, w0), a column then a row at a time as input_tile_n. */
TILE_BODY void grad_tile_n(int MR, int MC, wino_tx ar, wino_tx ac, const act *y, const float *base, int64_t h0,
                           int64_t w0, float *z, size_t xi_stride) {
    const int TR = MR + 2, TC = MC + 2;
    v8 u[8][6], e[6];
    const v8 zero = {0};
#pragma GCC unroll 8
    for (int b = 0; b < MC; b++) {
#pragma GCC unroll 8
        for (int a = 0; a < MR; a++)
            e[a] = h0 + a < y->h && w0 + b < y->w ? *(const v8u *)(base + ((h0 + a) * y->w + w0 + b) * y->b) : zero;
        ar(e, 1, &u[0][b], 6);
    }
#pragma GCC unroll 8
    for (int i = 0; i < TR; i++) {
        v8 r[8];
        ac(u[i], 1, r, 1);
#pragma GCC unroll 8
        for (int q = 0; q < TC; q++) *(v8u *)(z + (size_t)(i * TC + q) * xi_stride) = r[q];
    }
}

/* A_r^T m of the TR x TC tile m (planes xi_stride apart): s[a][q], row a. */
TILE_BODY void tile_at_m(int MR, int MC, wino_tx atr, const float *m, size_t xi_stride, v8 s[6][8]) {
    const int TR = MR + 2, TC = MC + 2;
    v8 c[8];
#pragma GCC unroll 8
    for (int q = 0; q < TC; q++) {
#pragma GCC unroll 8
        for (int a = 0; a < TR; a++) c[a] = *(const v8u *)(m + (size_t)(a * TC + q) * xi_stride);
        atr(c, 1, &s[0][q], 8);
    }
}

/* y's MR x MC tile at (h0, w0), channels k0..k0+7: A_r^T m A_c, plus the bias, ReLU. */
TILE_BODY void output_tile_n(int MR, int MC, wino_tx atr, wino_tx atc, const float *m, size_t xi_stride,
                             const float *bias, bool relu, const act *y, float *base, int64_t h0, int64_t w0) {
    v8 s[6][8];
    tile_at_m(MR, MC, atr, m, xi_stride, s);
    const v8 zero = {0};
    v8 bv = bias ? *(const v8u *)bias : zero;
    int64_t rows = y->h - h0, cols = y->w - w0;
#pragma GCC unroll 6
    for (int a = 0; a < MR; a++) {
        if (a >= rows) break;
        v8 o[6];
        atc(s[a], 1, o, 1);
#pragma GCC unroll 6
        for (int b = 0; b < MC; b++) {
            if (b >= cols) break;
            v8 r = o[b] + bv;
            if (relu) r = (v8)((v8i)r & (r > zero)); /* NaN -> 0, as oneDNN's ReLU post-op */
            *(v8u *)(base + ((h0 + a) * y->w + w0 + b) * y->b) = r;
        }
    }
}

/* Each tile's functions: the filters' transforms (OpenMP over the input
 * channels, as weights_transform and weights_grad_transform) and the
 * tiles', named by the output tile (4: 4x4, 6: 6x6, 46: 4 rows by 6
 * columns, 64: 6 rows by 4 columns). */
#define WINO_TILE_FUNCTIONS(NAME, MR, MC, BTR, BTC, ATR, ATC, AR, AC, GR, GC, GTR, GTC)                        \
    AVX2 static void weights_transform##NAME(const float *w, float *u, int64_t cin, int64_t cout, bool flip) {  \
        _Pragma("omp parallel for schedule(static)")                                                           \
        for (int64_t ci = 0; ci < cin; ci++)                                                                   \
            for (int64_t co = 0, nb; co < cout; co += 8 * nb)                                                  \
                filters_tile(MR + 2, MC + 2, GR, GC, w, u, ci, co, cin, cout, flip, nb = FILTER_BLOCKS(cout, co)); \
    }                                                                                                          \
    AVX2 static void weights_grad_transform##NAME(const float *s, int64_t threads, size_t thread_stride,         \
                                                  float *dw, int64_t c, int64_t k, bool acc) {                 \
        _Pragma("omp parallel for schedule(static)")                                                           \
        for (int64_t ci = 0; ci < c; ci++)                                                                     \
            for (int64_t co = 0, nb; co < k; co += 8 * nb)                                                     \
                filters_grad_tile(MR + 2, MC + 2, GTR, GTC, s, threads, thread_stride, dw, ci, co, c, k, acc,  \
                                  nb = FILTER_BLOCKS(k, co));                                                  \
    }                                                                                                          \
    AVX2 static void input_tile##NAME(const act *x, const float *base, int64_t h0, int64_t w0, float *v,         \
                                      size_t xi_stride) {                                                      \
        input_tile_n(MR + 2, MC + 2, BTR, BTC, x, base, h0, w0, v, xi_stride);                                 \
    }                                                                                                          \
    AVX2 static void grad_tile##NAME(const act *y, const float *base, int64_t h0, int64_t w0, float *z,          \
                                     size_t xi_stride) {                                                       \
        grad_tile_n(MR, MC, AR, AC, y, base, h0, w0, z, xi_stride);                                            \
    }                                                                                                          \
    AVX2 static void output_tile##NAME(const float *m, size_t xi_stride, const float *bias, bool relu,          \
                                       const act *y, float *base, int64_t h0, int64_t w0) {                    \
        output_tile_n(MR, MC, ATR, ATC, m, xi_stride, bias, relu, y, base, h0, w0);                            \
    }

WINO_TILE_FUNCTIONS(4, 4, 4, bt6, bt6, at6, at6, a4, a4, g3, g3, gt6, gt6)
WINO_TILE_FUNCTIONS(6, 6, 6, bt8, bt8, at8, at8, a6, a6, g3_8, g3_8, gt8, gt8)
WINO_TILE_FUNCTIONS(46, 4, 6, bt6, bt8, at6, at8, a4, a6, g3, g3_8, gt6, gt8)
WINO_TILE_FUNCTIONS(64, 6, 4, bt8, bt6, at8, at6, a6, a4, g3_8, g3, gt8, gt6)

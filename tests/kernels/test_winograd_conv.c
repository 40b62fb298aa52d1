/* Kiln's Winograd F(2x2, 3x3), F(4x4, 3x3) and F(6x6, 3x3) convolutions for AVX2
 * (src/kernels/cpu/onednn/onednn_winograd.c), and F(4x4) and F(6x6) together
 * (m 46: each side cut into 4s then 6s, up to four regions of 4x4, 4x6, 6x4
 * and 6x6 tiles), each pass of each against a
 * double-precision reference on the same f32 inputs, normwise
 * (||got - ref||_2 / ||ref||_2 <= 2e-5, oneDNN's Winograd's tolerance in
 * test_onednn_conv_algorithms), and elementwise (every element within
 * 1e-4 of the reference's scale), on:
 *   - odd and even images (7x5, 2x3, 9x9, 16x16, 14x14, 7x7, 13x10, 33x31:
 *     partial tiles at the right and bottom edges, and tiles that are all
 *     padding there, for every tile; the mixed tiling's four regions, one
 *     (4x6 tiles only, 7x5) and two);
 *   - every layout pair of x and y: plain NCHW, nChw8c, nChw16c;
 *   - the forward with and without bias and ReLU, the input gradient and
 *     the weight gradient;
 *   - chunks that split an image (many tiles) and one partial chunk;
 *   - one and two OpenMP threads: each gives the same bits run to run;
 *     the forward and the input gradient give the same bits on 1, 2 and
 *     3 threads;
 *   - the split of each region's tiles over 1-4 threads: equal shares
 *     (within one tile) that cover every tile once, chunks a multiple of 6
 *     tiles; the regions' products (kiln_wino_products) as the split says;
 *   - the filters transformed beforehand (the dispatcher's prepared copy)
 *     give the same bits as transforming them in the call.
 *   - the forward pooling its own tiles (conv2d_relu_max_pool2d's pool_y)
 *     gives the bits of the forward's y pooled by relu_max_pool2d's rule,
 *     NaN included, in nChw8c and nChw16c, and refuses the ReLU post-op;
 *     where the mixed tiling cuts the pooled rows and columns otherwise than
 *     the whole plane's (an odd side), the values within the Winograd bound
 *     and each index at its window's largest value of y within it;
 *   - the weight gradient and the input gradient tiled for a 2x2 or 3x3
 *     pooling (kiln_wino_shape.pool: only the rows and columns the pooling
 *     reads; the input gradient's row and column after them from their
 *     taps, zeros beyond) against the reference with grad_out zero
 *     elsewhere; a forward that does not pool its tiles refuses it.
 * Shapes the kernels do not cover are refused (channels not divisible by
 * 8), and a short workspace is an error, not a write past it. Skips (77)
 * on a CPU without AVX2 and FMA. */
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "test_util.h"

#ifdef KILN_WITH_ONEDNN
#include "kernels/cpu/onednn/onednn_winograd.h"
#include "kernels/kernels.h"

typedef struct shape {
    int64_t n, c, h, w, k;
} shape;

static const shape shapes[] = {
    {2, 8, 7, 5, 16}, {1, 16, 2, 3, 8}, {3, 24, 9, 9, 8}, {2, 32, 16, 16, 64}, {1, 8, 33, 31, 8},
    {3, 32, 14, 14, 64}, {2, 64, 7, 7, 128}, {2, 16, 13, 10, 24},
};

/* The tiles each check runs: F(2x2), F(4x4), F(6x6), and the mixed tiling. */
static const int tile_ms[4] = {2, 4, 6, 46};

static void fill(float *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)((seed >> 8) * (1.0 / 16777216.0) * 2.0 - 1.0);
    }
}

/* The three passes in double: y = relu?(conv(x, w) + b), gx, gw from gy. */
static void reference(const shape *s, const float *x, const float *w, const float *b, bool relu, const float *gy,
                      double *y, double *gx, double *gw) {
    int64_t H = s->h, W = s->w;
    memset(gx, 0, sizeof(double) * (size_t)(s->n * s->c * H * W));
    memset(gw, 0, sizeof(double) * (size_t)(s->k * s->c * 9));
    for (int64_t n = 0; n < s->n; n++)
        for (int64_t o = 0; o < s->k; o++)
            for (int64_t oh = 0; oh < H; oh++)
                for (int64_t ow = 0; ow < W; ow++) {
                    int64_t yi = ((n * s->k + o) * H + oh) * W + ow;
                    double acc = b ? b[o] : 0.0;
                    for (int64_t c = 0; c < s->c; c++)
                        for (int64_t i = 0; i < 3; i++)
                            for (int64_t j = 0; j < 3; j++) {
                                int64_t ih = oh - 1 + i, iw = ow - 1 + j;
                                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                int64_t xi = ((n * s->c + c) * H + ih) * W + iw, wi = ((o * s->c + c) * 3 + i) * 3 + j;
                                acc += (double)x[xi] * w[wi];
                                gx[xi] += (double)gy[yi] * w[wi];
                                gw[wi] += (double)gy[yi] * x[xi];
                            }
                    y[yi] = relu && acc < 0 ? 0.0 : acc;
                }
}

/* Normwise error; *elem: the largest elementwise error over the reference's
 * largest magnitude. */
static double rel_err(const float *got, const double *ref, size_t n, double *elem) {
    double num = 0, den = 0, worst = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double d = got[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
        if (fabs(d) > worst || d != d) worst = d != d ? INFINITY : fabs(d);
        if (fabs(ref[i]) > scale) scale = fabs(ref[i]);
    }
    *elem = scale > 0 ? worst / scale : worst;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* t (plain, n x ch x h x w) in the layout of block b (0: plain) into dst. */
static void to_layout(float *dst, const float *t, const shape *s, int64_t ch, int b) {
    int64_t sh[4] = {s->n, ch, s->h, s->w};
    if (b) kiln_cpu_reorder_blocked(dst, t, sizeof(float), sh, b, true);
    else memcpy(dst, t, sizeof(float) * (size_t)(s->n * ch * s->h * s->w));
}

static void from_layout(float *dst, const float *t, const shape *s, int64_t ch, int b) {
    int64_t sh[4] = {s->n, ch, s->h, s->w};
    if (b) kiln_cpu_reorder_blocked(dst, t, sizeof(float), sh, b, false);
    else memcpy(dst, t, sizeof(float) * (size_t)(s->n * ch * s->h * s->w));
}

/* Runs a pass with a fresh workspace, twice: the same bits both times;
 * then, for the forward and the input gradient, with the filters
 * transformed beforehand (the prepared copy): the same bits again. */
static void run2(kiln_wino_pass pass, const kiln_wino_shape *ws, const kiln_wino_buffers *b, float *out,
                 size_t n_out, const char *what) {
    size_t bytes = kiln_wino_workspace(pass, ws);
    void *w1 = aligned_alloc(64, (bytes + 63) / 64 * 64);
    float *first = malloc(n_out * sizeof(float));
    CHECK_OK(kiln_wino_run(pass, ws, b, w1, bytes));
    memcpy(first, out, n_out * sizeof(float));
    memset(w1, 0xff, bytes); /* NaN everywhere: nothing may be read before written */
    memset(out, 0xff, n_out * sizeof(float));
    CHECK_OK(kiln_wino_run(pass, ws, b, w1, bytes));
    CHECK_MSG(!memcmp(first, out, n_out * sizeof(float)), "%s: two runs differ", what);
    if (pass != KILN_WINO_BWD_WEIGHTS) {
        float *u = malloc(kiln_wino_weights_size(pass, ws) * sizeof(float));
        kiln_wino_weights(pass, ws, b->w, u);
        kiln_wino_buffers bu = *b;
        bu.u = u;
        bu.w = NULL; /* not read when the filters are prepared */
        memset(out, 0xff, n_out * sizeof(float));
        CHECK_OK(kiln_wino_run(pass, ws, &bu, w1, bytes));
        CHECK_MSG(!memcmp(first, out, n_out * sizeof(float)), "%s: prepared filters give other bits", what);
        free(u);
    }
    /* A workspace one byte short is refused. */
    CHECK_FAILS(kiln_wino_run(pass, ws, b, w1, bytes - 1), KILN_ERR_INTERNAL, "workspace");
    free(first);
    free(w1);
}

static int checked_cases;
static double worst[4][2]; /* per tile_ms entry: the largest normwise and elementwise errors */

static void note(int m, double e, double elem) {
    int t = m == 46 ? 3 : m / 2 - 1;
    if (e > worst[t][0]) worst[t][0] = e;
    if (elem > worst[t][1]) worst[t][1] = elem;
}

static void check_shape(const shape *s, int xb, int yb, int m) {
    if ((xb && s->c % xb) || (yb && s->k % yb)) return;
    size_t nx = (size_t)(s->n * s->c * s->h * s->w), ny = (size_t)(s->n * s->k * s->h * s->w),
           nw = (size_t)(s->k * s->c * 9);
    float *x = malloc(nx * 4), *w = malloc(nw * 4), *b = malloc((size_t)s->k * 4), *gy = malloc(ny * 4);
    float *xl = malloc(nx * 4), *yl = malloc(ny * 4), *gyl = malloc(ny * 4), *gxl = malloc(nx * 4);
    float *out = malloc((nx > ny ? nx : ny) * 4), *gw = malloc(nw * 4);
    double *ry = malloc(ny * 8), *rgx = malloc(nx * 8), *rgw = malloc(nw * 8);
    fill(x, nx, 1), fill(w, nw, 2), fill(b, (size_t)s->k, 3), fill(gy, ny, 4);
    to_layout(xl, x, s, s->c, xb);
    to_layout(gyl, gy, s, s->k, yb);
    kiln_wino_shape ws = {s->n, s->c, s->h, s->w, s->k, xb, yb, m};
    CHECK(kiln_wino_shape_ok(&ws));
    char what[160];
    double e, elem;
    for (int variant = 0; variant < 2; variant++) {
        bool relu = variant == 1;
        const float *bias = variant == 1 ? b : NULL;
        reference(s, x, w, bias, relu, gy, ry, rgx, rgw);
        kiln_wino_buffers fb = {.x = xl, .y = yl, .w = w, .bias = bias, .relu = relu};
        snprintf(what, sizeof what, "F(%d) fwd %lldx%lldx%lldx%lld->%lld x%d y%d %s", m, (long long)s->n,
                 (long long)s->c, (long long)s->h, (long long)s->w, (long long)s->k, xb, yb,
                 relu ? "bias+relu" : "plain");
        run2(KILN_WINO_FWD, &ws, &fb, yl, ny, what);
        from_layout(out, yl, s, s->k, yb);
        e = rel_err(out, ry, ny, &elem);
        CHECK_MSG(e <= 2e-5 && elem <= 1e-4, "%s: error %.3e (elementwise %.3e)", what, e, elem);
        note(m, e, elem);
        checked_cases++;
    }
    kiln_wino_buffers db = {.x = gxl, .y = gyl, .w = w};
    snprintf(what, sizeof what, "F(%d) bwd_data %lldx%lldx%lldx%lld->%lld x%d y%d", m, (long long)s->n,
             (long long)s->c, (long long)s->h, (long long)s->w, (long long)s->k, xb, yb);
    run2(KILN_WINO_BWD_DATA, &ws, &db, gxl, nx, what);
    from_layout(out, gxl, s, s->c, xb);
    e = rel_err(out, rgx, nx, &elem);
    CHECK_MSG(e <= 2e-5 && elem <= 1e-4, "%s: error %.3e (elementwise %.3e)", what, e, elem);
    note(m, e, elem);
    kiln_wino_buffers wb = {.x = xl, .y = gyl, .w_out = gw};
    snprintf(what, sizeof what, "F(%d) bwd_weight %lldx%lldx%lldx%lld->%lld x%d y%d", m, (long long)s->n,
             (long long)s->c, (long long)s->h, (long long)s->w, (long long)s->k, xb, yb);
    run2(KILN_WINO_BWD_WEIGHTS, &ws, &wb, gw, nw, what);
    e = rel_err(gw, rgw, nw, &elem);
    CHECK_MSG(e <= 2e-5 && elem <= 1e-4, "%s: error %.3e (elementwise %.3e)", what, e, elem);
    note(m, e, elem);
    checked_cases += 2;
    free(x), free(w), free(b), free(gy), free(xl), free(yl), free(gyl), free(gxl), free(out), free(gw);
    free(ry), free(rgx), free(rgw);
}

/* The weight gradient tiled for a p x p pooling (kiln_wino_shape.pool,
 * conv2d_relu_max_pool2d's backward): y (grad_out) zero outside the first
 * h / p * p rows and w / p * p columns, as the pooling's backward leaves
 * it, against the float64 reference on that y; the same bits twice. And
 * what may not take a pooled shape: the input gradient, and a forward that
 * does not pool its tiles (rows of y would be left unwritten). */
static void check_pooled_wgrad(const shape *s, int m, int p) {
    if (s->h < p || s->w < p) return;
    size_t nx = (size_t)(s->n * s->c * s->h * s->w), ny = (size_t)(s->n * s->k * s->h * s->w),
           nw = (size_t)(s->k * s->c * 9);
    float *x = malloc(nx * 4), *w = malloc(nw * 4), *gy = malloc(ny * 4), *gyl = malloc(ny * 4), *gw = malloc(nw * 4);
    double *ry = malloc(ny * 8), *rgx = malloc(nx * 8), *rgw = malloc(nw * 8);
    fill(x, nx, 21), fill(w, nw, 22), fill(gy, ny, 23);
    int64_t rh = s->h / p * p, rw = s->w / p * p;
    for (size_t i = 0; i < ny; i++) {
        int64_t hw = (int64_t)i % (s->h * s->w), h = hw / s->w, ww = hw % s->w;
        if (h >= rh || ww >= rw) gy[i] = 0.0f;
    }
    reference(s, x, w, NULL, false, gy, ry, rgx, rgw);
    to_layout(gyl, gy, s, s->k, 8);
    kiln_wino_shape ws = {s->n, s->c, s->h, s->w, s->k, 0, 8, m, p};
    CHECK(kiln_wino_shape_ok(&ws));
    kiln_wino_buffers wb = {.x = x, .y = gyl, .w_out = gw};
    char what[160];
    snprintf(what, sizeof what, "F(%d) bwd_weight pooled %d %lldx%lldx%lldx%lld->%lld", m, p, (long long)s->n,
             (long long)s->c, (long long)s->h, (long long)s->w, (long long)s->k);
    run2(KILN_WINO_BWD_WEIGHTS, &ws, &wb, gw, nw, what);
    double elem, e = rel_err(gw, rgw, nw, &elem);
    CHECK_MSG(e <= 2e-5 && elem <= 1e-4, "%s: error %.3e (elementwise %.3e)", what, e, elem);
    note(m, e, elem);
    checked_cases++;
    /* the input gradient: tiles over the pooled rows and columns, the row
     * and column after them from their taps, zeros beyond; x plain and nChw8c */
    float *gx = malloc(nx * 4), *gxl = malloc(nx * 4);
    for (int xb = 0; xb <= 8; xb += 8) {
        if (xb && s->c % xb) continue;
        kiln_wino_shape ds = ws;
        ds.xb = xb;
        CHECK(kiln_wino_shape_ok(&ds));
        kiln_wino_buffers db = {.x = gxl, .y = gyl, .w = w};
        snprintf(what, sizeof what, "F(%d) bwd_data pooled %d %lldx%lldx%lldx%lld->%lld x%d", m, p, (long long)s->n,
                 (long long)s->c, (long long)s->h, (long long)s->w, (long long)s->k, xb);
        run2(KILN_WINO_BWD_DATA, &ds, &db, gxl, nx, what);
        from_layout(gx, gxl, s, s->c, xb);
        e = rel_err(gx, rgx, nx, &elem);
        CHECK_MSG(e <= 2e-5 && elem <= 1e-4, "%s: error %.3e (elementwise %.3e)", what, e, elem);
        note(m, e, elem);
        checked_cases++;
    }
    free(gx), free(gxl);
    size_t bytes = kiln_wino_workspace(KILN_WINO_FWD, &ws);
    void *work = aligned_alloc(64, (bytes + 63) / 64 * 64);
    kiln_wino_buffers fb = {.x = x, .y = gyl, .w = w};
    CHECK_FAILS(kiln_wino_run(KILN_WINO_FWD, &ws, &fb, work, bytes), KILN_ERR_INTERNAL, "pooled shape");
    free(work);
    free(x), free(w), free(gy), free(gyl), free(gw), free(ry), free(rgx), free(rgw);
}

/* Each pass's split of the tiles over 1-4 threads: contiguous shares, in
 * thread order, covering every tile once, none more than one tile longer
 * than another; chunks a multiple of the micro-kernel's 6 rows. */
static void check_split(const shape *s, int m) {
    kiln_wino_shape ws = {s->n, s->c, s->h, s->w, s->k, 8, 8, m};
    int regions = kiln_wino_regions(&ws);
    CHECK_MSG(regions >= 1 && regions <= (m == 46 ? 4 : 1), "F(%d): %d regions", m, regions);
    /* the products: each side's points (F(2x2) 4 a tile, F(4x4) 6, F(6x6) 8;
     * the mixed tiling the fewest of 4s then 6s) squared, per image */
    int64_t side[2] = {s->h, s->w}, points[2];
    for (int d = 0; d < 2; d++) {
        int64_t len = side[d];
        int tile = m == 4 || m == 6 ? m : 2;
        if (m != 46) points[d] = (tile + 2) * ((len + tile - 1) / tile);
        else {
            points[d] = INT64_MAX;
            for (int64_t b = 0; 6 * b < len + 6; b++) {
                int64_t a = len > 6 * b ? (len - 6 * b + 3) / 4 : 0;
                if (6 * a + 8 * b < points[d]) points[d] = 6 * a + 8 * b;
            }
        }
    }
    CHECK_MSG(kiln_wino_products(&ws) == points[0] * points[1], "F(%d) %lldx%lld: %lld products, not %lld", m,
              (long long)s->h, (long long)s->w, (long long)kiln_wino_products(&ws), (long long)(points[0] * points[1]));
    for (int region = 0; region < regions; region++)
    for (int pass = KILN_WINO_FWD; pass <= KILN_WINO_BWD_WEIGHTS; pass++)
        for (int threads = 1; threads <= 4; threads++) {
            int64_t next = 0, least = INT64_MAX, most = 0, tiles = 0, lo, hi, chunk;
            for (int tid = 0; tid < threads; tid++) {
                kiln_wino_split((kiln_wino_pass)pass, &ws, region, threads, tid, &tiles, &lo, &hi, &chunk);
                CHECK_MSG(lo == next && hi >= lo, "F(%d) pass %d, %d threads: thread %d starts at %lld, not %lld", m,
                          pass, threads, tid, (long long)lo, (long long)next);
                CHECK_MSG(chunk > 0 && chunk % 6 == 0, "F(%d) pass %d: chunk of %lld tiles", m, pass, (long long)chunk);
                next = hi;
                if (hi - lo < least) least = hi - lo;
                if (hi - lo > most) most = hi - lo;
            }
            CHECK_MSG(next == tiles, "F(%d) pass %d, %d threads: %lld of %lld tiles covered", m, pass, threads,
                      (long long)next, (long long)tiles);
            CHECK_MSG(tiles < threads || most - least <= 1, "F(%d) pass %d, %d threads: shares of %lld to %lld tiles",
                      m, pass, threads, (long long)least, (long long)most);
        }
}

/* The forward and the input gradient on 1, 2 and 3 threads: the same bits. */
static void check_thread_bits(const shape *s, int m) {
    size_t nx = (size_t)(s->n * s->c * s->h * s->w), ny = (size_t)(s->n * s->k * s->h * s->w),
           nw = (size_t)(s->k * s->c * 9);
    float *x = malloc(nx * 4), *w = malloc(nw * 4), *b = malloc((size_t)s->k * 4), *y = malloc(ny * 4);
    float *first_y = malloc(ny * 4), *gx = malloc(nx * 4), *first_gx = malloc(nx * 4);
    fill(x, nx, 5), fill(w, nw, 6), fill(b, (size_t)s->k, 7);
    kiln_wino_shape ws = {s->n, s->c, s->h, s->w, s->k, 8, 8, m};
    for (int threads = 1; threads <= 3; threads++) {
#ifdef _OPENMP
        omp_set_num_threads(threads);
#endif
        size_t bytes = kiln_wino_workspace(KILN_WINO_FWD, &ws), gbytes = kiln_wino_workspace(KILN_WINO_BWD_DATA, &ws);
        if (gbytes > bytes) bytes = gbytes;
        void *work = aligned_alloc(64, (bytes + 63) / 64 * 64);
        kiln_wino_buffers fb = {.x = x, .y = y, .w = w, .bias = b, .relu = true};
        kiln_wino_buffers db = {.x = gx, .y = y, .w = w};
        CHECK_OK(kiln_wino_run(KILN_WINO_FWD, &ws, &fb, work, bytes));
        CHECK_OK(kiln_wino_run(KILN_WINO_BWD_DATA, &ws, &db, work, bytes)); /* y as the output gradient */
        if (threads == 1) memcpy(first_y, y, ny * 4), memcpy(first_gx, gx, nx * 4);
        CHECK_MSG(!memcmp(first_y, y, ny * 4) && !memcmp(first_gx, gx, nx * 4),
                  "F(%d) %lldx%lldx%lldx%lld->%lld: %d threads give other bits than 1", m, (long long)s->n,
                  (long long)s->c, (long long)s->h, (long long)s->w, (long long)s->k, threads);
        free(work);
    }
    free(x), free(w), free(b), free(y), free(first_y), free(gx), free(first_gx);
}

/* The forward pooling its tiles (pool_y) against the forward writing y,
 * pooled here by relu_max_pool2d's rule (a later value wins when greater
 * or NaN; nothing positive: 0 at the window's first element): the same
 * bits, values and indices, in y's block layout yb (8 or 16). */
static void check_pooled(const shape *s, int yb, int m) {
    if (s->k % yb || s->h < 2 || s->w < 2) return;
    int64_t oh = s->h / 2, ow = s->w / 2;
    size_t nx = (size_t)(s->n * s->c * s->h * s->w), ny = (size_t)(s->n * s->k * s->h * s->w),
           nw = (size_t)(s->k * s->c * 9), np = (size_t)(s->n * s->k * oh * ow);
    float *x = malloc(nx * 4), *w = malloc(nw * 4), *b = malloc((size_t)s->k * 4), *y = malloc(ny * 4);
    float *py = malloc(np * 4), *want_y = malloc(np * 4);
    int64_t *pix = malloc(np * 8), *want_ix = malloc(np * 8);
    fill(x, nx, 11), fill(w, nw, 12), fill(b, (size_t)s->k, 13);
    /* the mixed tiling cuts an odd side's pooled rows (its even part) as it
     * would cut them alone: other tiles than the whole plane's, other bits */
    bool exact = m != 46 || (s->h % 2 == 0 && s->w % 2 == 0);
    /* a NaN reaches some outputs: it must win its window both ways (a tile
     * spreads it over its outputs, so only where the tiles are the same) */
    if (nx > 3 && exact) x[3] = NAN;
    kiln_wino_shape ws = {s->n, s->c, s->h, s->w, s->k, 8, yb, m};
    size_t bytes = kiln_wino_workspace(KILN_WINO_FWD, &ws);
    void *work = aligned_alloc(64, (bytes + 63) / 64 * 64);
    kiln_wino_buffers fb = {.x = x, .y = y, .w = w, .bias = b};
    CHECK_OK(kiln_wino_run(KILN_WINO_FWD, &ws, &fb, work, bytes));
    int64_t cb = s->k / yb;
    for (int64_t n = 0; n < s->n; n++)
        for (int64_t k = 0; k < s->k; k++) {
            const float *plane = y + ((n * cb + k / yb) * s->h * s->w) * yb + k % yb;
            for (int64_t i = 0; i < oh; i++)
                for (int64_t j = 0; j < ow; j++) {
                    int64_t at[4] = {2 * i * s->w + 2 * j, 2 * i * s->w + 2 * j + 1, (2 * i + 1) * s->w + 2 * j,
                                     (2 * i + 1) * s->w + 2 * j + 1};
                    float best = plane[at[0] * yb];
                    int64_t bi = at[0];
                    for (int q = 1; q < 4; q++) {
                        float v = plane[at[q] * yb];
                        if (v > best || v != v) best = v, bi = at[q];
                    }
                    if (!(best > 0 || best != best)) best = 0.0f, bi = at[0];
                    size_t o = (size_t)(((n * cb + k / yb) * oh + i) * ow + j) * (size_t)yb + (size_t)(k % yb);
                    want_y[o] = best, want_ix[o] = bi;
                }
        }
    kiln_wino_buffers pb = {.x = x, .w = w, .bias = b, .pool_y = py, .pool_ix = pix};
    CHECK_OK(kiln_wino_run(KILN_WINO_FWD, &ws, &pb, work, bytes));
    if (exact)
        CHECK_MSG(!memcmp(py, want_y, np * 4) && !memcmp(pix, want_ix, np * 8),
                  "F(%d) %lldx%lldx%lldx%lld->%lld, y nChw%dc: the pooled tiles differ from the pooled output", m,
                  (long long)s->n, (long long)s->c, (long long)s->h, (long long)s->w, (long long)s->k, yb);
    else {
        double *want = calloc(np, sizeof(double)), elem;
        for (size_t i = 0; i < np; i++) want[i] = want_y[i];
        double e = rel_err(py, want, np, &elem), scale = 0;
        for (size_t i = 0; i < np; i++) scale = fabs(want[i]) > scale ? fabs(want[i]) : scale;
        CHECK_MSG(e <= 2e-5 && elem <= 1e-4, "F(%d) %lldx%lld pooled by its own tiles: error %.3e (elementwise %.3e)",
                  m, (long long)s->h, (long long)s->w, e, elem);
        size_t off = 0; /* indices off their window, or at a value of y below its largest by more than the bound */
        for (int64_t n = 0; n < s->n; n++)
            for (int64_t k = 0; k < s->k; k++) {
                const float *plane = y + ((n * cb + k / yb) * s->h * s->w) * yb + k % yb;
                for (int64_t i = 0; i < oh; i++)
                    for (int64_t j = 0; j < ow; j++) {
                        size_t o = (size_t)(((n * cb + k / yb) * oh + i) * ow + j) * (size_t)yb + (size_t)(k % yb);
                        int64_t ix = pix[o], r = ix / s->w, c = ix % s->w;
                        bool inside = r / 2 == i && c / 2 == j && ix >= 0 && ix < s->h * s->w;
                        float at = inside ? plane[ix * yb] : NAN, top = want_y[o];
                        if (!inside || (top > 0 && !(at >= top - 1e-4 * scale))) off++;
                    }
            }
        CHECK_MSG(off == 0, "F(%d) %lldx%lld pooled by its own tiles: %zu indices off their window's largest value",
                  m, (long long)s->h, (long long)s->w, off);
        free(want);
    }
    pb.relu = true; /* pooling has ReLU's rule; the post-op with it is refused */
    CHECK_FAILS(kiln_wino_run(KILN_WINO_FWD, &ws, &pb, work, bytes), KILN_ERR_INTERNAL, "pooling needs");
    free(work);
    free(x), free(w), free(b), free(y), free(py), free(want_y), free(pix), free(want_ix);
}

int main(void) {
    if (!kiln_wino_cpu_ok()) kt_skip("this CPU has no AVX2 and FMA: the Winograd kernels are not used");
    if (kiln_init() != KILN_OK) {
        fprintf(stderr, "kiln_init: %s\n", kiln_error_message());
        return 1;
    }
    static const int blocks[3] = {0, 8, 16};
    for (int threads = 1; threads <= 2; threads++) {
#ifdef _OPENMP
        omp_set_num_threads(threads);
#endif
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            for (int xb = 0; xb < 3; xb++)
                for (int yb = 0; yb < 3; yb++)
                    for (int t = 0; t < 4; t++) check_shape(&shapes[i], blocks[xb], blocks[yb], tile_ms[t]);
            for (int t = 0; t < 4; t++)
                check_pooled_wgrad(&shapes[i], tile_ms[t], 2), check_pooled_wgrad(&shapes[i], tile_ms[t], 3);
        }
    }
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int t = 0; t < 4; t++) {
            int m = tile_ms[t];
            check_split(&shapes[i], m), check_thread_bits(&shapes[i], m);
            check_pooled(&shapes[i], 8, m), check_pooled(&shapes[i], 16, m);
        }
#ifdef _OPENMP
    omp_set_num_threads(2);
#endif
    printf("%d pass checks; largest errors, normwise / elementwise: F(2x2) %.2e / %.2e, F(4x4) %.2e / %.2e, "
           "F(6x6) %.2e / %.2e, F(4x4) with F(6x6) %.2e / %.2e\n",
           checked_cases, worst[0][0], worst[0][1], worst[1][0], worst[1][1], worst[2][0], worst[2][1], worst[3][0],
           worst[3][1]);
    kiln_wino_shape bad = {1, 12, 8, 8, 16, 0, 0, 2};
    CHECK(!kiln_wino_shape_ok(&bad));
    bad.c = 16, bad.pool = 8; /* as large as the plane: fine */
    CHECK(kiln_wino_shape_ok(&bad));
    bad.pool = 1; /* a pooling window of 2 at least */
    CHECK(!kiln_wino_shape_ok(&bad));
    bad.pool = 9; /* larger than the plane */
    CHECK(!kiln_wino_shape_ok(&bad));
    bad.pool = 0;
    bad.m = 3; /* no F(3x3, 3x3) */
    CHECK(!kiln_wino_shape_ok(&bad));
    bad.m = 8; /* nor F(8x8, 3x3) */
    CHECK(!kiln_wino_shape_ok(&bad));
    bad.m = 64; /* the mixed tiling is 46 */
    CHECK(!kiln_wino_shape_ok(&bad));
    bad.m = 4;
    bad.c = 16, bad.h = 1;
    CHECK(!kiln_wino_shape_ok(&bad));
    kiln_shutdown();
    return kt_finish();
}
#else
int main(void) { kt_skip("built without oneDNN (KILN_WITH_ONEDNN off)"); }
#endif

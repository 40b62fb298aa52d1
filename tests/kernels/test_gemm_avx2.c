/* Kiln's AVX2 matrix product (src/kernels/cpu/fast/gemm_avx2.c), used by
 * the Winograd convolutions and by mm on AVX2 CPUs:
 *   - against a float64 reference, normwise 1e-6 and elementwise, on odd
 *     sizes (rows not a multiple of the 6-row tile, columns with an 8-wide
 *     half panel and a scalar tail), K above the 256-row packing block,
 *     A plain and transposed (strides), C overwritten and accumulated;
 *   - kiln_cpu_gemm_avx2_parallel (packed panels, K in blocks, columns
 *     over threads) bit-identical to the single unblocked chain of
 *     kiln_cpu_gemm_avx2 where n is a multiple of 8, on 1 and 2 threads;
 *   - kiln_cpu_gemm_avx2_parallel_wt (W^T gathered into the panels) bit
 *     for bit against the product on W^T written out;
 *   - kiln_mm through the dispatcher on a transposed left operand (the
 *     backward of a linear layer) against the reference.
 * Skips (77) on a CPU without AVX2 and FMA. */
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "test_util.h"
#include "kernels/cpu/fast/gemm_avx2.h"

static void fill(float *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)((seed >> 8) * (1.0 / 16777216.0) * 2.0 - 1.0);
    }
}

typedef struct dims {
    int64_t m, n, k;
} dims;

static const dims cases[] = {{1, 8, 1}, {7, 16, 5}, {13, 24, 300}, {128, 2048, 64}, {37, 517, 513}, {6, 19, 17}};

static void check_case(const dims *d, bool trans, bool acc) {
    int64_t m = d->m, n = d->n, k = d->k;
    float *a = malloc(sizeof(float) * (size_t)(m * k)), *b = malloc(sizeof(float) * (size_t)(k * n));
    float *c = malloc(sizeof(float) * (size_t)(m * n)), *c1 = malloc(sizeof(float) * (size_t)(m * n));
    double *ref = malloc(sizeof(double) * (size_t)(m * n));
    fill(a, (size_t)(m * k), 1), fill(b, (size_t)(k * n), 2), fill(c, (size_t)(m * n), 3);
    memcpy(c1, c, sizeof(float) * (size_t)(m * n));
    /* trans: A stored as (k x m), element (i, l) at a[l * m + i] */
    int64_t ai = trans ? 1 : k, al = trans ? m : 1;
    double num = 0, den = 0, worst = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = acc ? c[i * n + j] : 0.0;
            for (int64_t l = 0; l < k; l++) s += (double)a[i * ai + l * al] * b[l * n + j];
            ref[i * n + j] = s;
        }
    kiln_cpu_gemm_avx2_parallel(m, n, k, a, ai, al, b, n, c, n, acc);
    for (int64_t i = 0; i < m * n; i++) {
        double e = c[i] - ref[i];
        num += e * e, den += ref[i] * ref[i];
        if (fabs(e) > worst || e != e) worst = e != e ? INFINITY : fabs(e);
    }
    double err = sqrt(num / den);
    CHECK_MSG(err <= 1e-6 && worst <= 1e-5 * (double)k, "m=%lld n=%lld k=%lld trans=%d acc=%d: error %.3e (max %.3e)",
              (long long)m, (long long)n, (long long)k, trans, acc, err, worst);
    if (n % 8 == 0) { /* one unblocked chain per element: the same bits */
        kiln_cpu_gemm_avx2(m, n, k, a, ai, al, b, n, c1, n, acc);
        CHECK_MSG(!memcmp(c, c1, sizeof(float) * (size_t)(m * n)),
                  "m=%lld n=%lld k=%lld: packed and blocked differ from one chain", (long long)m, (long long)n,
                  (long long)k);
    }
    free(a), free(b), free(c), free(c1), free(ref);
}

/* kiln_cpu_gemm_avx2_parallel_wt (B = W^T gathered from W, its rows in a
 * column table's order or in order) bit for bit against the same product
 * on W^T written out: the panels' gathers, in 8 x 8 transposes where the
 * table's columns run contiguous and one element at a time elsewhere,
 * must put the same values in the same places. The tables are a blocked
 * x's (nChw8c) flattened order over `hw` positions a channel: 16 runs of
 * 16 (the transposes), 9 mostly not, 4 never; without a table, K = 300
 * leaves 44 rows after the last 64. */
static void check_wt(int64_t m, int64_t n, int64_t channels, int64_t hw, bool table) {
    int64_t k = channels * hw;
    float *a = malloc(sizeof(float) * (size_t)(m * k)), *w = malloc(sizeof(float) * (size_t)(n * k));
    float *bt = malloc(sizeof(float) * (size_t)(k * n)), *c = malloc(sizeof(float) * (size_t)(m * n));
    float *c_ref = malloc(sizeof(float) * (size_t)(m * n));
    int64_t *wcol = malloc(sizeof(int64_t) * (size_t)k);
    fill(a, (size_t)(m * k), 7), fill(w, (size_t)(n * k), 8), fill(c, (size_t)(m * n), 9);
    memcpy(c_ref, c, sizeof(float) * (size_t)(m * n));
    for (int64_t f = 0; f < k; f++) /* f = ((c / 8) * hw + p) * 8 + c % 8 -> column c * hw + p */
        wcol[f] = table ? (f / (8 * hw) * 8 + f % 8) * hw + f / 8 % hw : f;
    for (int64_t l = 0; l < k; l++)
        for (int64_t j = 0; j < n; j++) bt[l * n + j] = w[j * k + wcol[l]];
    kiln_cpu_gemm_avx2_parallel(m, n, k, a, k, 1, bt, n, c_ref, n, true);
    kiln_cpu_gemm_avx2_parallel_wt(m, n, k, a, k, 1, w, k, table ? wcol : NULL, c, n, true);
    CHECK_MSG(!memcmp(c, c_ref, sizeof(float) * (size_t)(m * n)),
              "W^T gathered (m=%lld n=%lld k=%lld, %s) differs from W^T written out", (long long)m, (long long)n,
              (long long)k, table ? "nChw8c column table" : "no table");
    free(a), free(w), free(bt), free(c), free(c_ref), free(wcol);
}

/* kiln_mm(dy^T, x) as linear's weight gradient computes it, through the dispatcher. */
static void check_mm(void) {
    kiln_scope_begin();
    kiln_manual_seed(5);
    kiln_tensor *dy = kiln_randn(KILN_SHAPE(33, 40), KILN_F32, KILN_CPU);
    kiln_tensor *x = kiln_randn(KILN_SHAPE(33, 70), KILN_F32, KILN_CPU);
    kiln_tensor *dyt = kiln_transpose(dy, 0, 1);
    kiln_tensor *g = kiln_mm(dyt, x);
    CHECK(g != NULL);
    if (g) {
        const float *pd = kiln_data_ptr(dy), *px = kiln_data_ptr(x), *pg = kiln_data_ptr(g);
        double num = 0, den = 0;
        for (int i = 0; i < 40; i++)
            for (int j = 0; j < 70; j++) {
                double s = 0;
                for (int l = 0; l < 33; l++) s += (double)pd[l * 40 + i] * px[l * 70 + j];
                num += (pg[i * 70 + j] - s) * (pg[i * 70 + j] - s), den += s * s;
            }
        CHECK_MSG(sqrt(num / den) <= 1e-6, "kiln_mm(dy^T, x): error %.3e", sqrt(num / den));
    }
    CHECK_OK(kiln_scope_end());
}

int main(void) {
    if (!kiln_cpu_gemm_avx2_ok()) kt_skip("this CPU has no AVX2 and FMA: the AVX2 product is not used");
    if (kiln_init() != KILN_OK) {
        fprintf(stderr, "kiln_init: %s\n", kiln_error_message());
        return 1;
    }
    for (int threads = 1; threads <= 2; threads++) {
#ifdef _OPENMP
        omp_set_num_threads(threads);
#endif
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            for (int trans = 0; trans < 2; trans++)
                for (int acc = 0; acc < 2; acc++) check_case(&cases[i], trans, acc);
    }
    for (int table = 0; table < 2; table++) {
        check_wt(8, 512, 128, 16, table); /* the bench CNN's fc1 at batch 8 */
        check_wt(13, 40, 32, 9, table);   /* the 28x28x1 CNN's planes, a 8-column half panel */
        check_wt(70, 19, 16, 4, table);   /* three tail columns */
    }
    check_wt(5, 24, 1, 300, false);
    check_mm();
    kiln_shutdown();
    return kt_finish();
}

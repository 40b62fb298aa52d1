/* Kiln's AVX2 matrix product (src/kernels/cpu/fast/gemm_avx2.c), used by
 * the Winograd convolutions and by mm on AVX2 CPUs:
 *   - against a float64 reference, normwise 1e-6 and elementwise, on odd
 *     sizes (rows not a multiple of the 6-row tile, columns with an 8-wide
 *     half panel and a scalar tail), K above the 256-row packing block,
 *     A plain and transposed (strides), C overwritten and accumulated;
 *   - kiln_cpu_gemm_avx2_parallel (packed panels, K in blocks, columns
 *     over threads) bit-identical to the single unblocked chain of
 *     kiln_cpu_gemm_avx2 where n is a multiple of 8, on 1 and 2 threads;
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
    check_mm();
    kiln_shutdown();
    return kt_finish();
}

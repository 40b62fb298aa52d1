/* The single-precision product of gemm_avx2.h: a 6 x 16 micro-kernel of
 * fused multiply-adds (12 sums in registers, B's row loaded as two
 * 8-lane vectors, A's element broadcast), tiled over C. A is read through
 * its strides (a transposed A costs nothing); the parallel entry packs B in
 * 16-column panels, the single-threaded one reads its rows in place. At
 * these operands' sizes (the Winograd products, fully-connected backward
 * passes) it runs at 89-95% of a core's FMA peak on the machine of
 * docs/performance.md. */
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/cpu/fast/gemm_avx2.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define AVX2 __attribute__((target("avx2,fma")))
#include <immintrin.h>

bool kiln_cpu_gemm_avx2_ok(void) {
    static int ok = -1;
    if (ok < 0) {
        __builtin_cpu_init();
        ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return ok;
}

/* On AVX-512 CPUs too: on a Xeon with AVX-512, AVX512-BF16 and AMX (session 17,
 * docs/performance.md, "Kiln's AVX2 kernels on AVX-512"), the bench CNN's f32 step took
 * 0.61-0.86x the time with them as the default than with oneDNN's AVX-512 kernels, its
 * forward 0.59-0.86x, and the main job's epoch 0.82-0.90x. */
bool kiln_cpu_avx2_kernels_default(void) { return kiln_cpu_gemm_avx2_ok(); }

/* C (rows x 8*nv) (+)= A (rows x kd) . B (kd x 8*nv): A's element (i, l) at
 * a[i * ai + l * al] (the forward's V rows, or the weight gradient's V
 * transposed), B's rows ldb apart, C's ldc apart. rows and nv are
 * constants where it is inlined, so the 12 sums stay in registers. */
#define MR 6
/* The sums are named variables, not an array: GCC keeps an array of
 * vectors in memory and stores it every iteration. */
#define ROW_INIT(r)                                                                                          \
    __m256 s##r##0 = _mm256_setzero_ps(), s##r##1 = _mm256_setzero_ps();                                     \
    if (rows > r && acc) {                                                                                   \
        s##r##0 = _mm256_loadu_ps(c + r * ldc);                                                              \
        if (nv > 1) s##r##1 = _mm256_loadu_ps(c + r * ldc + 8);                                              \
    }
#define ROW_FMA(r)                                                                                           \
    if (rows > r) {                                                                                          \
        __m256 av = _mm256_broadcast_ss(ap + r * ai);                                                        \
        s##r##0 = _mm256_fmadd_ps(av, b0, s##r##0);                                                          \
        if (nv > 1) s##r##1 = _mm256_fmadd_ps(av, b1, s##r##1);                                              \
    }
#define ROW_STORE(r)                                                                                         \
    if (rows > r) {                                                                                          \
        _mm256_storeu_ps(c + r * ldc, s##r##0);                                                              \
        if (nv > 1) _mm256_storeu_ps(c + r * ldc + 8, s##r##1);                                              \
    }
AVX2 static inline __attribute__((always_inline)) void micro(const int rows, const int nv, int64_t kd, const float *a,
                                                             int64_t ai, int64_t al, const float *b, int64_t ldb,
                                                             float *c, int64_t ldc, bool acc) {
    ROW_INIT(0) ROW_INIT(1) ROW_INIT(2) ROW_INIT(3) ROW_INIT(4) ROW_INIT(5)
    for (int64_t l = 0; l < kd; l++) {
        __m256 b0 = _mm256_loadu_ps(b + l * ldb), b1 = nv > 1 ? _mm256_loadu_ps(b + l * ldb + 8) : b0;
        const float *ap = a + l * al;
        ROW_FMA(0) ROW_FMA(1) ROW_FMA(2) ROW_FMA(3) ROW_FMA(4) ROW_FMA(5)
    }
    ROW_STORE(0) ROW_STORE(1) ROW_STORE(2) ROW_STORE(3) ROW_STORE(4) ROW_STORE(5)
}

#define MICRO_CASE(R)                                                                                        \
    case R:                                                                                                  \
        if (nv == 2) micro(R, 2, kd, a, ai, al, b, ldb, c, ldc, acc);                                        \
        else micro(R, 1, kd, a, ai, al, b, ldb, c, ldc, acc);                                                \
        break;

AVX2 static void micro_any(int rows, int nv, int64_t kd, const float *a, int64_t ai, int64_t al, const float *b,
                           int64_t ldb, float *c, int64_t ldc, bool acc) {
    switch (rows) {
        MICRO_CASE(1)
        MICRO_CASE(2)
        MICRO_CASE(3)
        MICRO_CASE(4)
        MICRO_CASE(5)
        MICRO_CASE(6)
    }
}

/* C (m x n) (+)= A (m x kd) . B (kd x n), n a multiple of 8, in tiles of
 * MR rows by 16 columns (8 at the end when n is not a multiple of 16). */
AVX2 void kiln_cpu_gemm_avx2(int64_t m, int64_t n, int64_t kd, const float *a, int64_t ai, int64_t al, const float *b,
                      int64_t ldb, float *c, int64_t ldc, bool acc) {
    for (int64_t j = 0; j < n; j += 16) {
        int nv = n - j >= 16 ? 2 : 1;
        for (int64_t i = 0; i < m; i += MR)
            micro_any(m - i < MR ? (int)(m - i) : MR, nv, kd, a + i * ai, ai, al, b + j, ldb, c + i * ldc + j, ldc,
                      acc);
    }
}


/* B as the parallel entries read it: row-major (b[l * ldb + j]) or, for
 * kiln_cpu_gemm_avx2_parallel_wt, the transpose of W (b[j * ldb + col(l)],
 * col(l) = wcol[l] or l). */
typedef struct b_operand {
    const float *b;
    int64_t ldb;
    const int64_t *wcol;
    bool wt;
} b_operand;

static inline float b_at(const b_operand *B, int64_t l, int64_t j) {
    return B->wt ? B->b[j * B->ldb + (B->wcol ? B->wcol[l] : l)] : B->b[l * B->ldb + j];
}

/* The last n % 8 columns: the same chain of fused multiply-adds per element. */
AVX2 static void tail_columns(int64_t m, int64_t j0, int64_t n, int64_t k, const float *a, int64_t ai, int64_t al,
                              const b_operand *B, float *c, int64_t ldc, bool acc) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = j0; j < n; j++) {
            float s = acc ? c[i * ldc + j] : 0.0f;
            for (int64_t l = 0; l < k; l++) s = __builtin_fmaf(a[i * ai + l * al], b_at(B, l, j), s);
            c[i * ldc + j] = s;
        }
}

#define COL_BLOCK 64
#define K_BLOCK 256

/* Panel rows r0 + t * rs (t < 8), columns 0-7 (dst points at the first
 * row's column): W[i][c0 + t] for W's eight rows i from w, eight
 * contiguous floats of each row transposed in registers. */
AVX2 static inline __attribute__((always_inline)) void pack_8x8(const float *w, int64_t ldw, int64_t c0, float *dst,
                                                                int64_t rs) {
    __m256 r0 = _mm256_loadu_ps(w + c0), r1 = _mm256_loadu_ps(w + ldw + c0);
    __m256 r2 = _mm256_loadu_ps(w + 2 * ldw + c0), r3 = _mm256_loadu_ps(w + 3 * ldw + c0);
    __m256 r4 = _mm256_loadu_ps(w + 4 * ldw + c0), r5 = _mm256_loadu_ps(w + 5 * ldw + c0);
    __m256 r6 = _mm256_loadu_ps(w + 6 * ldw + c0), r7 = _mm256_loadu_ps(w + 7 * ldw + c0);
    __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
    __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xee);
    const int64_t step = rs * 16;
    _mm256_storeu_ps(dst, _mm256_permute2f128_ps(s0, s4, 0x20));
    _mm256_storeu_ps(dst + step, _mm256_permute2f128_ps(s1, s5, 0x20));
    _mm256_storeu_ps(dst + 2 * step, _mm256_permute2f128_ps(s2, s6, 0x20));
    _mm256_storeu_ps(dst + 3 * step, _mm256_permute2f128_ps(s3, s7, 0x20));
    _mm256_storeu_ps(dst + 4 * step, _mm256_permute2f128_ps(s0, s4, 0x31));
    _mm256_storeu_ps(dst + 5 * step, _mm256_permute2f128_ps(s1, s5, 0x31));
    _mm256_storeu_ps(dst + 6 * step, _mm256_permute2f128_ps(s2, s6, 0x31));
    _mm256_storeu_ps(dst + 7 * step, _mm256_permute2f128_ps(s3, s7, 0x31));
}

/* W^T's panel rows [la, lb) one at a time: a row of W at a time (reads
 * along W's rows, stores 64 bytes apart within the panel, in L1). */
static void pack_wt_rows(const b_operand *B, int64_t l0, int64_t la, int64_t lb, int64_t j, int nv, float *dst) {
    for (int jj = 0; jj < nv * 8; jj++) {
        const float *src = B->b + (j + jj) * B->ldb;
        if (B->wcol)
            for (int64_t l = la; l < lb; l++) dst[l * 16 + jj] = src[B->wcol[l0 + l]];
        else
            for (int64_t l = la; l < lb; l++) dst[l * 16 + jj] = src[l0 + l];
    }
}

/* A 16-column panel of B, K_BLOCK rows from l0, packed contiguous: B's
 * rows are often a power-of-two bytes apart (8 KiB for fc1's 2048
 * columns), which maps a panel onto a few L1 sets and evicts it between row
 * tiles. W^T's panel is gathered from W 64 rows at a time in 8 x 8
 * transposes where W's columns run contiguous: always without a column
 * table, and with one where each of the 8 rows' sets l + s + 8t (t < 8)
 * reads 8 consecutive columns (a blocked x's nChw8c order: s the channel
 * within the block, t the position). Where a set breaks the run (the
 * 28x28x1 model's fc1 has 9 positions to a channel: 64 of each channel
 * block's 72 rows run, the 8 of its last position do not), 8 rows are
 * gathered one element at a time and the search resumes after them; so are
 * the rows after the last 64. The bench CNN's fc1 forward spent 0.3-0.4 ms
 * a call gathering one element at a time, at any batch; the transposes
 * take the same values to the same places. */
AVX2 static void pack_panel(const b_operand *B, int64_t l0, int64_t rows, int64_t j, int nv, float *dst) {
    if (B->wt) {
        const int64_t *wc = B->wcol ? B->wcol + l0 : NULL;
        int64_t l = 0;
        while (l + 64 <= rows) {
            bool runs = true;
            for (int s = 0; wc && s < 8 && runs; s++)
                for (int t = 1; t < 8 && runs; t++) runs = wc[l + s + 8 * t] == wc[l + s] + t;
            if (!runs) { /* 8 rows one at a time, then look for a run again */
                pack_wt_rows(B, l0, l, l + 8, j, nv, dst);
                l += 8;
                continue;
            }
            for (int h = 0; h < nv; h++) {
                const float *w = B->b + (j + 8 * h) * B->ldb;
                for (int s = 0; s < 8; s++) {
                    if (wc) pack_8x8(w, B->ldb, wc[l + s], dst + (l + s) * 16 + 8 * h, 8);
                    else pack_8x8(w, B->ldb, l0 + l + 8 * s, dst + (l + 8 * s) * 16 + 8 * h, 1);
                }
            }
            l += 64;
        }
        pack_wt_rows(B, l0, l, rows, j, nv, dst);
        return;
    }
    const float *b = B->b + l0 * B->ldb + j;
    for (int64_t l = 0; l < rows; l++) {
        _mm256_storeu_ps(dst + l * 16, _mm256_loadu_ps(b + l * B->ldb));
        if (nv > 1) _mm256_storeu_ps(dst + l * 16 + 8, _mm256_loadu_ps(b + l * B->ldb + 8));
    }
}

/* Columns [j0, j0 + w) of C, K in blocks: the later blocks continue each
 * element's chain of fused multiply-adds from C (a float, as in the
 * registers), so the bits are those of one unblocked chain. */
AVX2 static void column_block(int64_t m, int64_t j0, int64_t w, int64_t k, const float *a, int64_t ai, int64_t al,
                              const b_operand *B, float *c, int64_t ldc, bool acc) {
    if (m <= MR && !B->wt) { /* one row tile: each element of B is read once, packing would only copy it */
        kiln_cpu_gemm_avx2(m, w, k, a, ai, al, B->b + j0, B->ldb, c + j0, ldc, acc);
        return;
    }
    float panel[K_BLOCK * 16] __attribute__((aligned(32)));
    for (int64_t l0 = 0; l0 < k; l0 += K_BLOCK) {
        int64_t kl = k - l0 < K_BLOCK ? k - l0 : K_BLOCK;
        for (int64_t j = j0; j < j0 + w; j += 16) {
            int nv = j0 + w - j >= 16 ? 2 : 1;
            pack_panel(B, l0, kl, j, nv, panel);
            kiln_cpu_gemm_avx2(m, nv * 8, kl, a + l0 * al, ai, al, panel, 16, c + j, ldc, acc || l0 > 0);
        }
    }
}

static void gemm_parallel(int64_t m, int64_t n, int64_t k, const float *a, int64_t ai, int64_t al, const b_operand *B,
                          float *c, int64_t ldc, bool acc) {
    int64_t n8 = n / 8 * 8, blocks = (n8 + COL_BLOCK - 1) / COL_BLOCK;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (m * n * k >= 65536 && blocks > 1)
#endif
    for (int64_t cb = 0; cb < blocks; cb++) {
        int64_t j = cb * COL_BLOCK, w = n8 - j < COL_BLOCK ? n8 - j : COL_BLOCK;
        column_block(m, j, w, k, a, ai, al, B, c, ldc, acc);
    }
    if (n8 < n) tail_columns(m, n8, n, k, a, ai, al, B, c, ldc, acc);
}

void kiln_cpu_gemm_avx2_parallel(int64_t m, int64_t n, int64_t k, const float *a, int64_t ai, int64_t al,
                                 const float *b, int64_t ldb, float *c, int64_t ldc, bool acc) {
    b_operand B = {b, ldb, NULL, false};
    gemm_parallel(m, n, k, a, ai, al, &B, c, ldc, acc);
}

void kiln_cpu_gemm_avx2_parallel_wt(int64_t m, int64_t n, int64_t k, const float *a, int64_t ai, int64_t al,
                                    const float *w, int64_t ldw, const int64_t *wcol, float *c, int64_t ldc,
                                    bool acc) {
    b_operand B = {w, ldw, wcol, true};
    gemm_parallel(m, n, k, a, ai, al, &B, c, ldc, acc);
}

#else /* not x86-64: never used (kiln_cpu_gemm_avx2_ok is false) */

bool kiln_cpu_gemm_avx2_ok(void) { return false; }
bool kiln_cpu_avx2_kernels_default(void) { return false; }
void kiln_cpu_gemm_avx2(int64_t m, int64_t n, int64_t k, const float *a, int64_t ai, int64_t al, const float *b,
                        int64_t ldb, float *c, int64_t ldc, bool acc) {
    (void)m, (void)n, (void)k, (void)a, (void)ai, (void)al, (void)b, (void)ldb, (void)c, (void)ldc, (void)acc;
}
void kiln_cpu_gemm_avx2_parallel(int64_t m, int64_t n, int64_t k, const float *a, int64_t ai, int64_t al,
                                 const float *b, int64_t ldb, float *c, int64_t ldc, bool acc) {
    (void)m, (void)n, (void)k, (void)a, (void)ai, (void)al, (void)b, (void)ldb, (void)c, (void)ldc, (void)acc;
}
void kiln_cpu_gemm_avx2_parallel_wt(int64_t m, int64_t n, int64_t k, const float *a, int64_t ai, int64_t al,
                                    const float *w, int64_t ldw, const int64_t *wcol, float *c, int64_t ldc,
                                    bool acc) {
    (void)m, (void)n, (void)k, (void)a, (void)ai, (void)al, (void)w, (void)ldw, (void)wcol, (void)c, (void)ldc;
    (void)acc;
}

#endif

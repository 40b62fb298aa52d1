/* AVX2 rows of the blocked 2x2, stride-2 max pooling and its backward
 * (blocked_fast_tmpl.h calls them on CPUs with AVX2): eight channels per
 * vector, the indices widened to int64 in registers, and, for tensors
 * larger than a quarter of the last-level cache, streaming stores.
 *
 * Why: the first pooling of the main job's network reads 12.8 MB and
 * writes 9.6 MB (its values and int64 indices); the backward writes a
 * 12.8 MB input gradient. Neither is read again soon from the cache, and
 * an ordinary store first reads the line it writes: streaming stores skip
 * that read, a third of the backward's memory traffic. The compiler's
 * vectorisation of the generic rows also spent most of its time on the
 * 64-bit index arithmetic (docs/performance.md has the figures).
 *
 * The results are the generic rows' bit for bit: the same comparisons in
 * the same order (the first maximum wins ties, NaN beats everything), the
 * same indices, the same zeros. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "kernels/cpu/fast/gemm_avx2.h"
#include "kernels/cpu/fast/pool_avx2.h"

/* The test switches of kiln_pool_avx2_test_set: -1 / 0 mean "as the CPU says". */
static _Atomic int forced_rows = -1;
static _Atomic size_t forced_stream_bytes = 0;

void kiln_pool_avx2_test_set(int use_rows, size_t stream_bytes) {
    atomic_store(&forced_rows, use_rows);
    atomic_store(&forced_stream_bytes, stream_bytes);
}

/* The last-level cache one core sees: sysfs's index3 (what lscpu shows per
 * instance), else sysconf (which on some VMs gives the whole host's:
 * 256 MiB for 32 per core complex), else 32 MiB. */
static size_t last_cache_bytes(void) {
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
    if (f) {
        unsigned long v = 0;
        char unit = 0;
        int got = fscanf(f, "%lu%c", &v, &unit);
        fclose(f);
        if (got >= 1 && v > 0) return (size_t)v << (unit == 'K' ? 10 : unit == 'M' ? 20 : 0);
    }
    long l3 = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
    l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
    return l3 > 0 ? (size_t)l3 : (size_t)32 << 20;
}

size_t kiln_pool_stream_bytes(void) {
    size_t forced = atomic_load(&forced_stream_bytes);
    if (forced) return forced;
    static _Atomic size_t bytes = 0;
    size_t b = atomic_load(&bytes);
    if (!b) {
        b = last_cache_bytes() / 4;
        atomic_store(&bytes, b);
    }
    return b;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma")))

/* The CPU check is the AVX2 micro-kernel's (gemm_avx2.h). */
bool kiln_pool_avx2_ok(void) { return kiln_cpu_gemm_avx2_ok() && atomic_load(&forced_rows) != 0; }

/* v taken where it is greater than best or NaN (the generic row's test). */
AVX2 static inline __m256 takes(__m256 v, __m256 best) {
    return _mm256_or_ps(_mm256_cmp_ps(v, best, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}

AVX2 static inline void put_ps(float *p, __m256 v, bool stream) {
    if (stream) _mm256_stream_ps(p, v);
    else _mm256_storeu_ps(p, v);
}

AVX2 static inline void put_si(int64_t *p, __m256i v, bool stream) {
    if (stream) _mm256_stream_si256((__m256i *)p, v);
    else _mm256_storeu_si256((__m256i *)p, v);
}

AVX2 void kiln_pool2x2_row_avx2(const float *r0, const float *r1, float *y, int64_t *ix, int64_t ow_n, int64_t index0,
                                int64_t w, int lanes, bool relu, bool stream) {
    const __m256i one = _mm256_set1_epi32(1), below = _mm256_set1_epi32((int)w), below1 = _mm256_set1_epi32((int)w + 1);
    const __m256 zero = _mm256_setzero_ps();
    for (int64_t ow = 0; ow < ow_n; ow++)
        for (int h = 0; h < lanes; h += 8) {
            const float *a = r0 + 2 * ow * lanes + h, *c = r1 + 2 * ow * lanes + h;
            __m256 best = _mm256_loadu_ps(a), b = _mm256_loadu_ps(a + lanes);
            __m256 cv = _mm256_loadu_ps(c), d = _mm256_loadu_ps(c + lanes);
            __m256i bi = _mm256_setzero_si256();
            __m256 t = takes(b, best);
            best = _mm256_blendv_ps(best, b, t), bi = _mm256_blendv_epi8(bi, one, _mm256_castps_si256(t));
            t = takes(cv, best);
            best = _mm256_blendv_ps(best, cv, t), bi = _mm256_blendv_epi8(bi, below, _mm256_castps_si256(t));
            t = takes(d, best);
            best = _mm256_blendv_ps(best, d, t), bi = _mm256_blendv_epi8(bi, below1, _mm256_castps_si256(t));
            if (relu) { /* nothing positive in the window: 0 at its first element */
                __m256 keep = takes(best, zero);
                best = _mm256_and_ps(best, keep), bi = _mm256_and_si256(bi, _mm256_castps_si256(keep));
            }
            const __m256i at = _mm256_set1_epi64x(index0 + 2 * ow);
            __m256i lo = _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(bi)), at);
            __m256i hi = _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_extracti128_si256(bi, 1)), at);
            put_ps(y + ow * lanes + h, best, stream);
            put_si(ix + ow * lanes + h, lo, stream);
            put_si(ix + ow * lanes + h + 4, hi, stream);
        }
    if (stream) _mm_sfence();
}

/* The lanes of an index whose offset from its window's first element is
 * not 0, 1, w or w + 1 count as strays (any int64 value). lanes (8 or 16)
 * is a constant where this is inlined, so the four sums stay in registers:
 * indexed by a variable lane block they lived on the stack, and each
 * window's sum waited for the last one's store (the first layer's scatter
 * of 512 planes of 14 x 14 windows took 1.3-1.6 ms on one thread, 0.6-0.8
 * now; the same sums in the same order). */
AVX2 static inline __attribute__((always_inline)) int64_t backward_row(const int lanes, const float *go,
                                                                       const int64_t *ix, const float *y, float *d0,
                                                                       float *d1, int64_t ow_n, int64_t index0,
                                                                       int64_t w, bool stream, double *sum) {
    const __m256i one = _mm256_set1_epi32(1), below = _mm256_set1_epi32((int)w), below1 = _mm256_set1_epi32((int)w + 1);
    const __m256i top = _mm256_set1_epi64x(w + 1), none = _mm256_setzero_si256();
    const __m256i pack = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    int64_t stray = 0;
    /* sums of lanes 0-3, 4-7, 8-11, 12-15 */
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd(), s2 = _mm256_setzero_pd(), s3 = _mm256_setzero_pd();
    for (int64_t ow = 0; ow < ow_n; ow++)
        for (int h = 0; h < lanes; h += 8) {
            __m256 g = _mm256_loadu_ps(go + ow * lanes + h);
            if (y) g = _mm256_and_ps(g, _mm256_cmp_ps(_mm256_loadu_ps(y + ow * lanes + h), _mm256_setzero_ps(), _CMP_GT_OQ));
            if (sum) { /* in double: a plane's sum is exact, whatever the order of its values */
                __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(g)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(g, 1));
                if (h == 0) s0 = _mm256_add_pd(s0, lo), s1 = _mm256_add_pd(s1, hi);
                else s2 = _mm256_add_pd(s2, lo), s3 = _mm256_add_pd(s3, hi);
            }
            const __m256i at = _mm256_set1_epi64x(index0 + 2 * ow);
            __m256i lo = _mm256_sub_epi64(_mm256_loadu_si256((const __m256i *)(ix + ow * lanes + h)), at);
            __m256i hi = _mm256_sub_epi64(_mm256_loadu_si256((const __m256i *)(ix + ow * lanes + h + 4)), at);
            /* outside [0, w + 1] in 64 bits: a stray whatever its low half */
            __m256i out = _mm256_or_si256(_mm256_or_si256(_mm256_cmpgt_epi64(lo, top), _mm256_cmpgt_epi64(none, lo)),
                                          _mm256_or_si256(_mm256_cmpgt_epi64(hi, top), _mm256_cmpgt_epi64(none, hi)));
            /* the low halves of the eight offsets, in lane order */
            __m256i rel = _mm256_permute2x128_si256(_mm256_permutevar8x32_epi32(lo, pack),
                                                    _mm256_permutevar8x32_epi32(hi, pack), 0x20);
            __m256i e0 = _mm256_cmpeq_epi32(rel, none), e1 = _mm256_cmpeq_epi32(rel, one);
            __m256i e2 = _mm256_cmpeq_epi32(rel, below), e3 = _mm256_cmpeq_epi32(rel, below1);
            int hit = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_or_si256(_mm256_or_si256(e0, e1), _mm256_or_si256(e2, e3))));
            stray += __builtin_popcount((unsigned)(~hit & 0xff)) + (_mm256_testz_si256(out, out) ? 0 : 1);
            float *p0 = d0 + 2 * ow * lanes + h, *p1 = d1 + 2 * ow * lanes + h;
            put_ps(p0, _mm256_and_ps(g, _mm256_castsi256_ps(e0)), stream);
            put_ps(p0 + lanes, _mm256_and_ps(g, _mm256_castsi256_ps(e1)), stream);
            put_ps(p1, _mm256_and_ps(g, _mm256_castsi256_ps(e2)), stream);
            put_ps(p1 + lanes, _mm256_and_ps(g, _mm256_castsi256_ps(e3)), stream);
        }
    if (stream) _mm_sfence();
    if (sum) {
        _mm256_storeu_pd(sum, s0), _mm256_storeu_pd(sum + 4, s1);
        if (lanes == 16) _mm256_storeu_pd(sum + 8, s2), _mm256_storeu_pd(sum + 12, s3);
    }
    return stray;
}

AVX2 int64_t kiln_pool2x2_backward_row_avx2(const float *go, const int64_t *ix, const float *y, float *d0, float *d1,
                                            int64_t ow_n, int64_t index0, int64_t w, int lanes, bool stream,
                                            double *sum) {
    return lanes == 8 ? backward_row(8, go, ix, y, d0, d1, ow_n, index0, w, stream, sum)
                      : backward_row(16, go, ix, y, d0, d1, ow_n, index0, w, stream, sum);
}

#else /* not x86-64: never called (kiln_pool_avx2_ok is false) */

bool kiln_pool_avx2_ok(void) { return false; }
void kiln_pool2x2_row_avx2(const float *r0, const float *r1, float *y, int64_t *ix, int64_t ow_n, int64_t index0,
                           int64_t w, int lanes, bool relu, bool stream) {
    (void)r0, (void)r1, (void)y, (void)ix, (void)ow_n, (void)index0, (void)w, (void)lanes, (void)relu, (void)stream;
}
int64_t kiln_pool2x2_backward_row_avx2(const float *go, const int64_t *ix, const float *y, float *d0, float *d1,
                                       int64_t ow_n, int64_t index0, int64_t w, int lanes, bool stream, double *sum) {
    (void)go, (void)ix, (void)y, (void)d0, (void)d1, (void)ow_n, (void)index0, (void)w, (void)lanes, (void)stream;
    (void)sum;
    return 0;
}

#endif

/* A single-precision matrix product on AVX2 + FMA (gemm_avx2.c): the
 * products of Kiln's Winograd convolutions and the CPU mm of backward
 * passes. Every output element is one chain of fused multiply-adds over
 * k in order, so the result does not depend on the thread count. All
 * calls block the host; the caller owns every buffer, and C must not
 * overlap A or B. */
#ifndef KILN_SRC_KERNELS_CPU_FAST_GEMM_AVX2_H
#define KILN_SRC_KERNELS_CPU_FAST_GEMM_AVX2_H

#include <stdbool.h>
#include <stdint.h>

/* True on a CPU with AVX2 and FMA. */
bool kiln_cpu_gemm_avx2_ok(void);
/* True where Kiln's AVX2 kernels (this product for mm, the Winograd and
 * small-channel convolutions) are the default over oneDNN's: every CPU with
 * AVX2 and FMA, AVX-512 ones included (measured faster there than oneDNN's
 * AVX-512 kernels for f32). */
bool kiln_cpu_avx2_kernels_default(void);

/* C (m x n) = A (m x k) . B (k x n), or C += it when acc: A's element
 * (i, l) at a[i * ai + l * al] (any strides: a transposed A is ai = 1),
 * B row-major with rows ldb apart, C row-major with rows ldc apart. n a
 * multiple of 8. On the calling thread; only on a CPU where
 * kiln_cpu_gemm_avx2_ok. */
void kiln_cpu_gemm_avx2(int64_t m, int64_t n, int64_t k, const float *a, int64_t ai, int64_t al, const float *b,
                        int64_t ldb, float *c, int64_t ldc, bool acc);

/* The same for any n (the last n % 8 columns by scalar fused
 * multiply-adds in the same order), over the OpenMP threads in blocks of
 * 64 columns. */
void kiln_cpu_gemm_avx2_parallel(int64_t m, int64_t n, int64_t k, const float *a, int64_t ai, int64_t al,
                                 const float *b, int64_t ldb, float *c, int64_t ldc, bool acc);

/* The same product with B the transpose of a matrix W read in place (a
 * linear layer's weight, no transposed copy): B's element (l, j) is
 * w[j * ldw + col(l)], col(l) = wcol[l] or l itself when wcol is NULL (a
 * permutation of W's columns into A's column order). Each element is the
 * same chain of fused multiply-adds as kiln_cpu_gemm_avx2_parallel's on
 * that B, so the same bits. W must not overlap C. */
void kiln_cpu_gemm_avx2_parallel_wt(int64_t m, int64_t n, int64_t k, const float *a, int64_t ai, int64_t al,
                                    const float *w, int64_t ldw, const int64_t *wcol, float *c, int64_t ldc,
                                    bool acc);

#endif

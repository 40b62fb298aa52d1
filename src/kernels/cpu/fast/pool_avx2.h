/* AVX2 rows of the blocked 2x2, stride-2 max pooling and its backward
 * (pool_avx2.c), for blocked_fast_tmpl.h: `lanes` channels (8 or 16) side
 * by side per position, as in nChw8c and nChw16c. They give the generic
 * rows' bits. Block the calling thread; the caller owns every buffer. */
#ifndef KILN_SRC_KERNELS_CPU_FAST_POOL_AVX2_H
#define KILN_SRC_KERNELS_CPU_FAST_POOL_AVX2_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* True on a CPU with AVX2 and FMA: the rows below may be called. */
bool kiln_pool_avx2_ok(void);
/* For tests: use_rows 0 keeps the pooling kernels on their generic rows
 * (-1: the AVX2 rows where the CPU has AVX2); stream_bytes replaces the
 * streaming threshold below (0: the cache's). */
void kiln_pool_avx2_test_set(int use_rows, size_t stream_bytes);
/* Bytes written by one call from which the pooling kernels use streaming
 * stores (stream = true below): a quarter of the last-level cache of one
 * core complex (32 MiB where the system does not say). */
size_t kiln_pool_stream_bytes(void);

/* One output row of ow_n windows: r0, r1 the two input rows, y and ix the
 * row's values and int64 plane indices (index0: the plane index of the
 * row's first window's first element; w: the input's width). With relu,
 * relu_max_pool2d's row. stream: streaming stores, which need y and ix
 * 32-byte aligned. */
void kiln_pool2x2_row_avx2(const float *r0, const float *r1, float *y, int64_t *ix, int64_t ow_n, int64_t index0,
                           int64_t w, int lanes, bool relu, bool stream);
/* The input gradient under one output row, written densely into the two
 * input rows d0 and d1: each element gets its window's gradient where the
 * window's index names it, else 0; with y (relu_max_pool2d_backward) only
 * where y > 0. Returns how many indices lie outside their own window (the
 * caller then takes its scatter path). stream as above, for d0 and d1.
 * sum (lanes doubles) or NULL: sum[l] = lane l's gradients that passed
 * (y > 0), added over the row in order, in double. */
int64_t kiln_pool2x2_backward_row_avx2(const float *go, const int64_t *ix, const float *y, float *d0, float *d1,
                                       int64_t ow_n, int64_t index0, int64_t w, int lanes, bool stream, double *sum);

#endif

/* Kiln's Winograd F(2x2, 3x3), F(4x4, 3x3) and F(6x6, 3x3) convolutions for
 * AVX2 CPUs (onednn_winograd.c): candidates of the oneDNN convolution provider
 * (onednn_conv.c, "winograd_2x2", "winograd_4x4", "winograd_6x6"), for 3x3 stride-1
 * padding-1 ungrouped f32 convolutions with channel counts divisible by 8. All calls block
 * the host until their results are written; the caller owns every
 * buffer. */
#ifndef KILN_SRC_KERNELS_CPU_ONEDNN_ONEDNN_WINOGRAD_H
#define KILN_SRC_KERNELS_CPU_ONEDNN_ONEDNN_WINOGRAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/base.h"

typedef enum kiln_wino_pass { KILN_WINO_FWD, KILN_WINO_BWD_DATA, KILN_WINO_BWD_WEIGHTS } kiln_wino_pass;

/* x (n, c, h, w) -> y (n, k, h, w) in forward terms, whichever pass; xb
 * and yb: the activations' channel blocks (8: nChw8c, 16: nChw16c, 0:
 * plain NCHW); m: the output tile, 2 for F(2x2, 3x3) (16 planes; 0 reads
 * as 2), 4 for F(4x4, 3x3) (36 planes), 6 for F(6x6, 3x3) (64 planes), or
 * 46 for F(4x4) and F(6x6) together: each side cut into 4s then 6s, the
 * fewest transformed points (14 = 4 + 4 + 6), up to four regions of 4x4,
 * 4x6, 6x4 and 6x6 tiles (onednn_winograd.c, "F(4x4) and F(6x6) together").
 * pool: 0, or the window p of a p x p pooling at stride p (floor) that is
 * all that reads y in the gradients' passes: y (grad_out) is zero outside
 * its first h / p * p rows and w / p * p columns, and the tiles cover only
 * those (conv2d_relu_max_pool2d's backward); the input gradient computes
 * the row and the column of x after them from their taps, and writes
 * zeros beyond (where a side is not a multiple of p, its prepared filters
 * hold those taps too: such a shape's kiln_wino_weights are larger than the
 * unpooled one's). The pooled
 * forward (pool_y) tiles the rows and columns its 2x2 windows read
 * whatever pool says; a forward without pool_y refuses a pool. */
typedef struct kiln_wino_shape {
    int64_t n, c, h, w, k;
    int xb, yb, m;
    int pool;
} kiln_wino_shape;

/* The pass's tensors in forward names: forward reads x, w and bias (or
 * NULL) and writes y; the input gradient reads y (grad_out) and w and
 * writes x (grad_input); the weight gradient reads x and y and writes
 * w_out (OIHW, overwritten). */
typedef struct kiln_wino_buffers {
    float *x, *y;
    const float *w, *bias;
    float *w_out;
    bool relu;      /* forward: ReLU after the bias */
    const float *u; /* forward and input gradient: the filters already
                       transformed (kiln_wino_weights), or NULL to
                       transform w in the call */
    /* forward with a blocked y (yb 8 or 16) and relu false: when pool_y
     * is set, y is not written (it may be NULL); each tile is max-pooled
     * as relu_max_pool2d pools relu(y) over 2x2 windows at stride 2
     * (floor), values into pool_y and indices (h * w + w into y's plane)
     * into pool_ix, both (n, k, h / 2, w / 2) in y's block layout: the
     * same bits as the forward followed by that pooling. */
    float *pool_y;
    int64_t *pool_ix;
} kiln_wino_buffers;

/* True on a CPU with AVX2 and FMA (the transforms are written for it). */
bool kiln_wino_cpu_ok(void);
/* True when the shape is one these kernels cover (channels divisible by
 * 8, at least 2x2, a block of 8 or 16 dividing the channels). */
bool kiln_wino_shape_ok(const kiln_wino_shape *s);
/* Workspace bytes of the pass, for the current OpenMP thread count. */
size_t kiln_wino_workspace(kiln_wino_pass pass, const kiln_wino_shape *s);
/* Floats of the transformed filters of a forward or input-gradient pass. */
size_t kiln_wino_weights_size(kiln_wino_pass pass, const kiln_wino_shape *s);
/* The pass's transformed filters of w (OIHW) into u: what the dispatcher
 * keeps as the weight's prepared copy (kernels/op_args.h), refilled when
 * the weight changes, so a call does not transform them again. */
void kiln_wino_weights(kiln_wino_pass pass, const kiln_wino_shape *s, const float *w, float *u);
/* The transformed points of one image and channel pair: the products the
 * pass makes per pair (its regions' tiles times their planes), for
 * choosing a tile (onednn_conv.c, wino_default). Any m, any pool. */
int64_t kiln_wino_products(const kiln_wino_shape *s);
/* The regions a pass tiles one after another: 1, or up to 4 for the
 * mixed tiling (m 46). */
int kiln_wino_regions(const kiln_wino_shape *s);
/* How a pass on `threads` threads splits the tiles of region `region`
 * (for tests): thread tid takes tiles [*lo, *hi) of *tiles, in chunks of
 * at most *chunk (an empty range at the end for a thread the pass does
 * not use). */
void kiln_wino_split(kiln_wino_pass pass, const kiln_wino_shape *s, int region, int threads, int tid,
                     int64_t *tiles, int64_t *lo, int64_t *hi, int64_t *chunk);
/* Runs the pass; the workspace must hold kiln_wino_workspace bytes for
 * the thread count at the time of the call. */
kiln_status kiln_wino_run(kiln_wino_pass pass, const kiln_wino_shape *s, const kiln_wino_buffers *b, void *workspace,
                          size_t workspace_bytes);

#endif

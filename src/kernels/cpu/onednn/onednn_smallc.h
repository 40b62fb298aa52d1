/* Kiln's convolutions of images with few channels for AVX2 CPUs
 * (onednn_smallc.c): a candidate of the oneDNN convolution provider
 * (onednn_conv.c, "small_c"), for the first layer of a network, whose
 * input has 1 to 4 channels (grey or colour images) and where oneDNN's
 * direct kernels, built for channel blocks of 8 or 16, run at a tenth of
 * the FMA peak. The forward (with bias and fused ReLU) and the weight
 * gradient of a 3x3 ungrouped f32 convolution, stride 1 or 2, padding 0
 * to 2; the input gradient is not covered (a first layer's input needs
 * none). All calls block the host until their results are written; the
 * caller owns every buffer. */
#ifndef KILN_SRC_KERNELS_CPU_ONEDNN_ONEDNN_SMALLC_H
#define KILN_SRC_KERNELS_CPU_ONEDNN_ONEDNN_SMALLC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/base.h"

typedef enum kiln_smallc_pass { KILN_SMALLC_FWD, KILN_SMALLC_BWD_WEIGHTS } kiln_smallc_pass;

/* x (n, c, h, w), plain NCHW, -> y (n, k, oh, ow) with a 3x3 filter; yb:
 * y's channel block (8: nChw8c, 16: nChw16c, 0: plain NCHW). */
typedef struct kiln_smallc_shape {
    int64_t n, c, h, w, k, oh, ow;
    int sh, sw, ph, pw, yb;
} kiln_smallc_shape;

/* The forward reads x, w (OIHW) and bias (or NULL) and writes y; the
 * weight gradient reads x and y (grad_out) and writes w_out (OIHW,
 * overwritten). */
typedef struct kiln_smallc_buffers {
    const float *x;
    float *y;
    const float *w, *bias;
    float *w_out;
    bool relu; /* forward: ReLU after the bias (NaN stays NaN) */
    /* forward with yb 8 and relu false: when pool_y is set, y is not
     * written (it may be NULL); each image's 8-channel plane is computed
     * into the workspace and max-pooled there as relu_max_pool2d pools
     * relu(y) over 2x2 windows at stride 2 (floor), by its own row kernel
     * (kernels/cpu/fast/pool_avx2.h): values into pool_y, indices (oh *
     * ow + ow into y's plane) into pool_ix, both (n, k, oh / 2, ow / 2)
     * nChw8c. The same bits as the forward, then that pooling. */
    float *pool_y;
    int64_t *pool_ix;
    /* weight gradient with yb 8: when pool_go is set, y is not read. The
     * gradient of y is relu_max_pool2d_backward's of pool_go through
     * pool_y (> 0 passes) and pool_ix, all (n, k, oh / 2, ow / 2) nChw8c
     * as the pooling forward wrote them (2x2 windows at stride 2, floor):
     * each image's 8-channel plane is scattered into the workspace by the
     * pooling backward's own row kernel, with the same values and the
     * same plane sums (bias_part[n * k + channel], doubles) as
     * relu_max_pool2d_backward_sum, and never written out. An index
     * outside its window: KILN_ERR_INVALID_ARGUMENT. */
    const float *pool_go;
    double *bias_part;
} kiln_smallc_buffers;

/* True when the shape is one these kernels cover: 1 to 4 input channels,
 * output channels a multiple of 8 (and of yb), stride 1 or 2, padding 0
 * to 2, and oh, ow those of that geometry. */
bool kiln_smallc_shape_ok(const kiln_smallc_shape *s);
/* Workspace bytes of the pass, for the current OpenMP thread count. */
size_t kiln_smallc_workspace(kiln_smallc_pass pass, const kiln_smallc_shape *s);
/* Runs the pass (only on a CPU where kiln_cpu_gemm_avx2_ok). The result
 * depends on the shape only, not on the thread count: each output is one
 * chain of fused multiply-adds in a fixed order (the weight gradient's
 * over fixed chunks of images, the chunks' sums added in order). */
kiln_status kiln_smallc_run(kiln_smallc_pass pass, const kiln_smallc_shape *s, const kiln_smallc_buffers *b,
                            void *workspace, size_t workspace_bytes);

#endif

/* Output sizes of convolution and pooling, shared by shape inference (the
 * ops layer, the meta device) and every backend's kernels, so they cannot
 * disagree. Attribute zeros mean PyTorch's defaults: stride 0 = 1 for
 * convolution and = kernel for pooling, dilation 0 = 1, groups 0 = 1. */
#ifndef KILN_SRC_KERNELS_NN_GEOMETRY_H
#define KILN_SRC_KERNELS_NN_GEOMETRY_H

#include "kernels/op_args.h"

typedef struct kiln_conv_geom {
    int64_t stride[2], padding[2], dilation[2], groups;
} kiln_conv_geom;

static inline kiln_conv_geom kiln_conv_geom_of(const kiln_op_attrs *a) {
    kiln_conv_geom g;
    for (int i = 0; i < 2; i++) {
        g.stride[i] = a->stride[i] ? a->stride[i] : 1;
        g.padding[i] = a->padding[i];
        g.dilation[i] = a->dilation[i] ? a->dilation[i] : 1;
    }
    g.groups = a->groups ? a->groups : 1;
    return g;
}

/* (in + 2p - d(k-1) - 1) / s + 1; a value < 1 means the kernel does not fit. */
static inline int64_t kiln_conv_out_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
    int64_t span = in + 2 * p - d * (k - 1) - 1;
    if (span < 0) return 0;
    return span / s + 1;
}

typedef struct kiln_pool_geom {
    int64_t kernel[2], stride[2], padding[2];
    bool ceil_mode, count_include_pad;
} kiln_pool_geom;

static inline kiln_pool_geom kiln_pool_geom_of(const kiln_op_attrs *a) {
    kiln_pool_geom g;
    for (int i = 0; i < 2; i++) {
        g.kernel[i] = a->kernel[i];
        g.stride[i] = a->stride[i] ? a->stride[i] : a->kernel[i];
        g.padding[i] = a->padding[i];
    }
    g.ceil_mode = a->ceil_mode;
    g.count_include_pad = a->count_include_pad;
    return g;
}

/* PyTorch's pooling_output_shape: floor or ceil of (in + 2p - k) / s, plus
 * one; in ceil mode the last window must start inside the input or the
 * left padding, else it is dropped. */
static inline int64_t kiln_pool_out_size(int64_t in, int64_t k, int64_t s, int64_t p, bool ceil_mode) {
    int64_t num = in + 2 * p - k + (ceil_mode ? s - 1 : 0);
    if (num < 0) return 0;
    int64_t out = num / s + 1;
    if (ceil_mode && (out - 1) * s >= in + p) out--;
    return out;
}

/* PyTorch's adaptive pooling bins: [floor(i*in/out), ceil((i+1)*in/out)). */
static inline int64_t kiln_adaptive_start(int64_t i, int64_t out, int64_t in) { return (i * in) / out; }
static inline int64_t kiln_adaptive_end(int64_t i, int64_t out, int64_t in) {
    return ((i + 1) * in + out - 1) / out;
}

#endif

/* conv2d_relu_max_pool2d (ops.def) as its two ops, for the kernels that
 * compute it that way (the CPU reference, CUDA, the CPU fast path where
 * the convolution cannot pool its own tiles): the convolution's args,
 * writing into the front of the fused op's workspace, and the pooling's
 * args, reading it. Every backend's kernels share this, so the split
 * cannot differ between them. */
#ifndef KILN_SRC_KERNELS_CONV_POOL_H
#define KILN_SRC_KERNELS_CONV_POOL_H

#include <string.h>

#include "kernels/nn_geometry.h"

typedef struct kiln_conv_pool_split {
    kiln_op_attrs pool_attrs; /* the p x p window at stride p, no padding */
    kiln_op_args conv;        /* x, weight, bias -> the convolution's output */
    kiln_op_args pool;        /* that output -> y, indices (relu_max_pool2d) */
} kiln_conv_pool_split;

static inline size_t kiln_conv_pool_align(size_t n) { return (n + 255) / 256 * 256; }

static inline size_t kiln_conv_pool_elem(kiln_dtype dt) {
    return dt == KILN_F64 ? 8 : dt == KILN_F16 || dt == KILN_BF16 ? 2 : 4;
}

/* The convolution's output shape for the fused op's args. */
static inline void kiln_conv_pool_conv_shape(const kiln_op_args *a, int64_t shape[4]) {
    kiln_conv_geom g = kiln_conv_geom_of(a->attrs);
    const kiln_strided *x = &a->in[0], *w = &a->in[1];
    shape[0] = x->shape[0], shape[1] = w->shape[0];
    for (int i = 0; i < 2; i++)
        shape[2 + i] = kiln_conv_out_size(x->shape[2 + i], w->shape[2 + i], g.stride[i], g.padding[i], g.dilation[i]);
}

/* Bytes of the convolution's output at the front of the workspace. */
static inline size_t kiln_conv_pool_conv_bytes(const kiln_op_args *a) {
    int64_t s[4];
    kiln_conv_pool_conv_shape(a, s);
    return kiln_conv_pool_align((size_t)(s[0] * s[1] * s[2] * s[3]) * kiln_conv_pool_elem(a->out[0].dtype));
}

/* The two ops' args for the fused op's args a, the convolution's output in
 * `layout` (strided: contiguous NCHW). The convolution gets the workspace
 * after its output (a->workspace may be NULL, as in workspace and
 * supports fns: then both data pointers are NULL) and the prepared copy. */
static inline void kiln_conv_pool_split_of(const kiln_op_args *a, kiln_layout layout, kiln_conv_pool_split *s) {
    memset(s, 0, sizeof *s);
    int64_t p = a->attrs->kernel[0];
    s->pool_attrs.kernel[0] = s->pool_attrs.kernel[1] = p;
    s->pool_attrs.stride[0] = s->pool_attrs.stride[1] = p;
    size_t conv_bytes = kiln_conv_pool_conv_bytes(a);
    s->conv = *a;
    s->conv.n_out = 1;
    kiln_strided *c = &s->conv.out[0];
    memset(c, 0, sizeof *c);
    c->dtype = a->out[0].dtype;
    c->ndim = 4;
    kiln_conv_pool_conv_shape(a, c->shape);
    c->strides[3] = 1, c->strides[2] = c->shape[3], c->strides[1] = c->shape[2] * c->shape[3];
    c->strides[0] = c->shape[1] * c->strides[1];
    c->layout = layout;
    bool ws = a->workspace != NULL;
    c->data = ws ? a->workspace : NULL;
    s->conv.workspace = ws ? (char *)a->workspace + conv_bytes : NULL;
    s->conv.workspace_bytes = ws && a->workspace_bytes > conv_bytes ? a->workspace_bytes - conv_bytes : 0;
    s->pool = *a;
    s->pool.n_in = 1;
    s->pool.in[0] = *c;
    s->pool.attrs = &s->pool_attrs;
    s->pool.workspace = NULL, s->pool.workspace_bytes = 0, s->pool.prepared = NULL;
}

/* conv2d_relu_max_pool2d_grad_weight (ops.def) as its two ops: the
 * pooling's backward with its sums, (grad_out, y, indices) -> the
 * convolution's output gradient g (at the front of the workspace, in
 * `layout`) and the bias gradient (out[1]); then conv2d_grad_weight,
 * (g, x) -> out[0]. The two run one after the other and share the
 * workspace after g (each gets all of it). */
typedef struct kiln_conv_pool_wgrad_split {
    kiln_op_attrs pool_attrs; /* the p x p window at stride p, ints = g's shape */
    kiln_op_args pool;        /* relu_max_pool2d_backward_sum */
    kiln_op_args wgrad;       /* conv2d_grad_weight */
} kiln_conv_pool_wgrad_split;

/* g's shape for the grad-weight op's args: (N, K, OH, OW) of x and the weight shape in attrs.ints. */
static inline void kiln_conv_pool_wgrad_g_shape(const kiln_op_args *a, int64_t shape[4]) {
    kiln_conv_geom g = kiln_conv_geom_of(a->attrs);
    const kiln_strided *x = &a->in[3];
    shape[0] = x->shape[0], shape[1] = a->attrs->ints[0];
    for (int i = 0; i < 2; i++)
        shape[2 + i] =
            kiln_conv_out_size(x->shape[2 + i], a->attrs->ints[2 + i], g.stride[i], g.padding[i], g.dilation[i]);
}

static inline size_t kiln_conv_pool_wgrad_g_bytes(const kiln_op_args *a) {
    int64_t s[4];
    kiln_conv_pool_wgrad_g_shape(a, s);
    return kiln_conv_pool_align((size_t)(s[0] * s[1] * s[2] * s[3]) * kiln_conv_pool_elem(a->in[0].dtype));
}

static inline void kiln_conv_pool_wgrad_split_of(const kiln_op_args *a, kiln_layout layout,
                                                 kiln_conv_pool_wgrad_split *s) {
    memset(s, 0, sizeof *s);
    int64_t p = a->attrs->kernel[0];
    s->pool_attrs.kernel[0] = s->pool_attrs.kernel[1] = p;
    s->pool_attrs.stride[0] = s->pool_attrs.stride[1] = p;
    s->pool_attrs.n_ints = 4;
    kiln_strided g;
    memset(&g, 0, sizeof g);
    g.dtype = a->in[0].dtype;
    g.ndim = 4;
    kiln_conv_pool_wgrad_g_shape(a, g.shape);
    memcpy(s->pool_attrs.ints, g.shape, sizeof g.shape[0] * 4);
    g.strides[3] = 1, g.strides[2] = g.shape[3], g.strides[1] = g.shape[2] * g.shape[3];
    g.strides[0] = g.shape[1] * g.strides[1];
    g.layout = layout;
    size_t g_bytes = kiln_conv_pool_wgrad_g_bytes(a);
    bool ws = a->workspace != NULL;
    g.data = ws ? a->workspace : NULL;
    void *rest = ws ? (char *)a->workspace + g_bytes : NULL;
    size_t rest_bytes = ws && a->workspace_bytes > g_bytes ? a->workspace_bytes - g_bytes : 0;
    s->pool = *a;
    s->pool.n_in = 3, s->pool.n_out = 2;
    s->pool.out[0] = g, s->pool.out[1] = a->out[1];
    s->pool.attrs = &s->pool_attrs;
    s->pool.workspace = rest, s->pool.workspace_bytes = rest_bytes, s->pool.prepared = NULL;
    s->wgrad = *a;
    s->wgrad.n_in = 2, s->wgrad.n_out = 1;
    s->wgrad.in[0] = g, s->wgrad.in[1] = a->in[3];
    s->wgrad.workspace = rest, s->wgrad.workspace_bytes = rest_bytes, s->wgrad.prepared = NULL;
}

#endif

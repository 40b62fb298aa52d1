/* conv2d_relu_max_pool2d on the fast CPU path: the convolution of the
 * oneDNN provider (onednn_conv.c) with relu_max_pool2d after it, one op.
 *
 * Why: in the tutorial CNN every convolution is followed by ReLU and a
 * 2x2 max pooling. As two ops, the convolution writes its whole output
 * (the first layer's at batch 128 and 32x32: 16.8 MB), and the pooling
 * reads it back to write a quarter of it plus the indices. Where the
 * convolution runs as Kiln's Winograd into a blocked output, each output
 * tile is pooled while it is still in registers (onednn_winograd.c,
 * pool_y): the full output is never written. Elsewhere the convolution
 * writes into the workspace and the pooling kernels read it there.
 *
 * Bits: the convolution is planned as conv2d's would be (the same key,
 * algorithm and prepared weights), without timing (pool mode,
 * onednn_kernels.h); the pooled Winograd tiles compare as the pooling
 * kernels do. So y and the indices equal conv2d then relu_max_pool2d on
 * this path, and the backward (relu_max_pool2d_backward, then conv2d's
 * gradients) is theirs. */
#ifdef KILN_WITH_ONEDNN
#include "base/error.h"
#include "kernels/conv_pool.h"
#include "kernels/cpu/fast/fast_kernels.h"
#include "kernels/cpu/onednn/onednn_kernels.h"
#include "kernels/cpu/ops_nn_cpu.h"

/* What one call does, from shapes, layouts and the untimed plan alone, so
 * the workspace, layout and run agree. */
typedef struct fused_call {
    kiln_conv_pool_split s; /* s.conv's output: in the workspace, or none when pooled */
    kiln_layout layout;     /* the convolution's output layout, and y's and the indices' */
    bool pooled;            /* the convolution pools its own tiles */
} fused_call;

static void call_of(const kiln_op_args *a, fused_call *c) {
    kiln_conv_pool_split_of(a, KILN_LAYOUT_STRIDED, &c->s);
    c->s.conv.out[0].data = NULL, c->s.conv.workspace = NULL; /* planning reads shapes only */
    c->layout = KILN_LAYOUT_STRIDED;
    kiln_onednn_conv2d_layout(&c->s.conv, &c->layout);
    c->s.conv.out[0].layout = c->layout;
    c->pooled = a->attrs->kernel[0] == 2 && kiln_layout_block(c->layout) && kiln_onednn_conv2d_pools(&c->s.conv);
    if (c->pooled) { /* the workspace is the convolution's */
        c->s.conv.workspace = a->workspace, c->s.conv.workspace_bytes = a->workspace_bytes;
        return;
    }
    kiln_conv_pool_split_of(a, c->layout, &c->s);
}

static bool pool_supports(const kiln_op_args *pool) {
    return kiln_layout_block(pool->in[0].layout) ? kiln_blocked_max_pool2d_supports(pool)
                                                 : kiln_fast_max_pool2d_supports(pool);
}

static kiln_status pool_run(const kiln_op_args *pool) {
    return kiln_layout_block(pool->in[0].layout) ? kiln_blocked_relu_max_pool2d(pool) : kiln_fast_relu_max_pool2d(pool);
}

bool kiln_onednn_conv2d_relu_max_pool2d_supports(const kiln_op_args *a) {
    kiln_onednn_conv2d_pool_mode(true, NULL, NULL);
    fused_call c;
    call_of(a, &c);
    bool ok = kiln_onednn_conv2d_supports(&c.s.conv) && (c.pooled || pool_supports(&c.s.pool));
    kiln_onednn_conv2d_pool_mode(false, NULL, NULL);
    return ok;
}

/* y and the indices in the convolution's output layout. */
void kiln_onednn_conv2d_relu_max_pool2d_layout(const kiln_op_args *a, kiln_layout *out) {
    kiln_onednn_conv2d_pool_mode(true, NULL, NULL);
    fused_call c;
    call_of(a, &c);
    kiln_onednn_conv2d_pool_mode(false, NULL, NULL);
    out[0] = out[1] = c.layout;
}

size_t kiln_onednn_conv2d_relu_max_pool2d_workspace(const kiln_op_args *a) {
    kiln_onednn_conv2d_pool_mode(true, NULL, NULL);
    fused_call c;
    call_of(a, &c);
    size_t conv = kiln_onednn_conv2d_workspace(&c.s.conv);
    kiln_onednn_conv2d_pool_mode(false, NULL, NULL);
    return (c.pooled ? 0 : kiln_conv_pool_conv_bytes(a)) + conv;
}

/* The prepared weights are conv2d's: the same key, so one copy serves both. */
void kiln_onednn_conv2d_relu_max_pool2d_prepare(const kiln_op_args *a, kiln_op_prepare *p) {
    kiln_onednn_conv2d_pool_mode(true, NULL, NULL);
    fused_call c;
    call_of(a, &c);
    kiln_onednn_conv2d_prepare(&c.s.conv, p);
    kiln_onednn_conv2d_pool_mode(false, NULL, NULL);
}

kiln_status kiln_onednn_conv2d_relu_max_pool2d_fill(const kiln_op_args *a, void *dst) {
    kiln_onednn_conv2d_pool_mode(true, NULL, NULL);
    fused_call c;
    call_of(a, &c);
    kiln_status st = kiln_onednn_conv2d_fill(&c.s.conv, dst);
    kiln_onednn_conv2d_pool_mode(false, NULL, NULL);
    return st;
}

kiln_status kiln_onednn_conv2d_relu_max_pool2d(const kiln_op_args *a) {
    kiln_onednn_conv2d_pool_mode(true, NULL, NULL);
    fused_call c;
    call_of(a, &c);
    kiln_status st = KILN_OK;
    if (a->out[0].layout != c.layout || a->out[1].layout != c.layout)
        st = KILN_RAISE(KILN_ERR_INTERNAL, NULL,
                        "kiln_conv2d_relu_max_pool2d: outputs in another layout than the kernel's layout fn gave");
    else if (c.pooled) {
        kiln_onednn_conv2d_pool_mode(true, a->out[0].data, a->out[1].data);
        st = kiln_onednn_conv2d(&c.s.conv);
    } else {
        st = kiln_onednn_conv2d(&c.s.conv);
    }
    kiln_onednn_conv2d_pool_mode(false, NULL, NULL);
    if (st || c.pooled) return st;
    return pool_run(&c.s.pool);
}

#else
typedef int kiln_onednn_conv_pool_unused; /* ISO C: a translation unit is not empty */
#endif

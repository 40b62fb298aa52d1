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
 * Bits: the convolution is planned as conv2d's would be (the same key and
 * prepared weights), without timing (pool mode, onednn_kernels.h); the
 * pooled Winograd tiles compare as the pooling kernels do. So y and the
 * indices equal conv2d then relu_max_pool2d on this path, and the backward
 * (relu_max_pool2d_backward, then conv2d's gradients) is theirs, with two
 * exceptions that tile only what a 2x2 pooling reads: a pooled Winograd
 * forward picks its algorithm for those rows and columns (F(6x6) for a
 * 7x7 output, whose windows read 6x6, where conv2d takes F(4x4) for all
 * 7x7), and the weight gradient of the backward is told the pooling
 * window (conv2d_grad_weight's attrs.kernel) and skips the rows and
 * columns no window reads. There the rounding differs from the two ops'
 * (tests/kernels/test_conv_pool_fused.c holds them to the Winograd
 * kernels' float64 bound, and the indices and x's gradient to the bit). */
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
    if (pool->in[0].dtype == KILN_BF16) return kiln_bf16_relu_max_pool2d_supports(pool);
    return kiln_layout_block(pool->in[0].layout) ? kiln_blocked_max_pool2d_supports(pool)
                                                 : kiln_fast_max_pool2d_supports(pool);
}

static kiln_status pool_run(const kiln_op_args *pool) {
    if (pool->in[0].dtype == KILN_BF16) return kiln_bf16_relu_max_pool2d(pool);
    return kiln_layout_block(pool->in[0].layout) ? kiln_blocked_relu_max_pool2d(pool) : kiln_fast_relu_max_pool2d(pool);
}

bool kiln_onednn_conv2d_relu_max_pool2d_supports(const kiln_op_args *a) {
    if (kiln_bf16_conv_pool_smallc_supports(a)) return false; /* the plain-C table's (conv_pool_bf16.c) */
    kiln_onednn_conv2d_pool_mode(true, a->attrs->kernel[0], NULL, NULL);
    fused_call c;
    call_of(a, &c);
    bool ok = kiln_onednn_conv2d_supports(&c.s.conv) && (c.pooled || pool_supports(&c.s.pool));
    kiln_onednn_conv2d_pool_mode(false, 0, NULL, NULL);
    return ok;
}

/* y and the indices in the convolution's output layout. */
void kiln_onednn_conv2d_relu_max_pool2d_layout(const kiln_op_args *a, kiln_layout *out) {
    kiln_onednn_conv2d_pool_mode(true, a->attrs->kernel[0], NULL, NULL);
    fused_call c;
    call_of(a, &c);
    kiln_onednn_conv2d_pool_mode(false, 0, NULL, NULL);
    out[0] = out[1] = c.layout;
}

size_t kiln_onednn_conv2d_relu_max_pool2d_workspace(const kiln_op_args *a) {
    kiln_onednn_conv2d_pool_mode(true, a->attrs->kernel[0], NULL, NULL);
    fused_call c;
    call_of(a, &c);
    size_t conv = kiln_onednn_conv2d_workspace(&c.s.conv);
    kiln_onednn_conv2d_pool_mode(false, 0, NULL, NULL);
    return (c.pooled ? 0 : kiln_conv_pool_conv_bytes(a)) + conv;
}

/* The prepared weights are conv2d's, keyed by the pass and algorithm: one
 * copy serves both ops where they pick the same algorithm (not where the
 * fused op takes F(6x6) for its pooled rows and conv2d F(4x4)). */
void kiln_onednn_conv2d_relu_max_pool2d_prepare(const kiln_op_args *a, kiln_op_prepare *p) {
    kiln_onednn_conv2d_pool_mode(true, a->attrs->kernel[0], NULL, NULL);
    fused_call c;
    call_of(a, &c);
    kiln_onednn_conv2d_prepare(&c.s.conv, p);
    kiln_onednn_conv2d_pool_mode(false, 0, NULL, NULL);
}

kiln_status kiln_onednn_conv2d_relu_max_pool2d_fill(const kiln_op_args *a, void *dst) {
    kiln_onednn_conv2d_pool_mode(true, a->attrs->kernel[0], NULL, NULL);
    fused_call c;
    call_of(a, &c);
    kiln_status st = kiln_onednn_conv2d_fill(&c.s.conv, dst);
    kiln_onednn_conv2d_pool_mode(false, 0, NULL, NULL);
    return st;
}

/* bf16 (oneDNN's convolution into NHWC, its choice on AMX and AVX512-BF16):
 * the pooling reads the NHWC output where the convolution left it, instead
 * of a reorder to NCHW first (1.7 ms of the bench CNN's 9.8 ms bf16 forward
 * at batch 128 for its first layer's output alone). */
static kiln_status run_nhwc(const fused_call *c, const kiln_op_args *a) {
    const void *nhwc = NULL;
    KILN_TRY(kiln_onednn_conv2d_nhwc(&c->s.conv, &nhwc));
    const kiln_strided *v = &c->s.conv.out[0];
    return kiln_bf16_relu_max_pool2d_from_nhwc(nhwc, v->shape[0], v->shape[1], v->shape[2], v->shape[3],
                                               a->attrs->kernel[0], a->out[0].data, a->out[1].data,
                                               a->out[0].shape[2], a->out[0].shape[3]);
}

kiln_status kiln_onednn_conv2d_relu_max_pool2d(const kiln_op_args *a) {
    kiln_onednn_conv2d_pool_mode(true, a->attrs->kernel[0], NULL, NULL);
    fused_call c;
    call_of(a, &c);
    kiln_status st = KILN_OK;
    if (a->out[0].dtype == KILN_BF16 && kiln_onednn_conv2d_nhwc_out(&c.s.conv) &&
        kiln_bf16_relu_max_pool2d_supports(&c.s.pool)) {
        st = run_nhwc(&c, a);
        kiln_onednn_conv2d_pool_mode(false, 0, NULL, NULL);
        return st;
    }
    if (a->out[0].layout != c.layout || a->out[1].layout != c.layout)
        st = KILN_RAISE(KILN_ERR_INTERNAL, NULL,
                        "kiln_conv2d_relu_max_pool2d: outputs in another layout than the kernel's layout fn gave");
    else if (c.pooled) {
        kiln_onednn_conv2d_pool_mode(true, a->attrs->kernel[0], a->out[0].data, a->out[1].data);
        st = kiln_onednn_conv2d(&c.s.conv);
    } else {
        st = kiln_onednn_conv2d(&c.s.conv);
    }
    kiln_onednn_conv2d_pool_mode(false, 0, NULL, NULL);
    if (st || c.pooled) return st;
    return pool_run(&c.s.pool);
}

/* ---- conv2d_relu_max_pool2d_grad_weight ----------------------------------------------- */

/* The weight gradient of a first layer (x needs none): where the weight
 * gradient is the small-channel kernel on an nChw8c gradient, that kernel
 * scatters each image's pooled gradient into its workspace where it reads
 * it (kiln_onednn_conv2d_grad_weight_pool_inputs): the convolution-sized
 * gradient (the tutorial CNN's first layer at batch 128: 12.8 MB) is
 * neither written nor read back. Elsewhere the pooling's backward writes it
 * into the workspace and the weight gradient reads it there. Either way
 * the values, their order and so the bits are those of
 * relu_max_pool2d_backward_sum then conv2d_grad_weight with the untimed
 * pick. */
typedef struct wgrad_call {
    kiln_conv_pool_wgrad_split s; /* s.pool's g: in the workspace, unless pooled */
    bool pooled;                  /* the weight gradient reads the pooled gradient */
} wgrad_call;

static size_t part_bytes(const kiln_op_args *a) {
    return (size_t)(a->in[3].shape[0] * a->attrs->ints[0]) * sizeof(double);
}

/* Called in pool mode (the default pick, never timed). */
static void wgrad_call_of(const kiln_op_args *a, wgrad_call *c) {
    kiln_conv_pool_wgrad_split_of(a, a->in[2].layout, &c->s);
    c->pooled = a->attrs->kernel[0] == 2 && a->in[2].layout == KILN_LAYOUT_NCHW8C &&
                a->in[0].layout == KILN_LAYOUT_NCHW8C && a->in[1].layout == KILN_LAYOUT_NCHW8C &&
                kiln_onednn_conv2d_grad_weight_pools(&c->s.wgrad);
    if (c->pooled && a->workspace) { /* the workspace: the plane sums, then the weight gradient's */
        size_t pb = kiln_conv_pool_align(part_bytes(a));
        c->s.wgrad.workspace = (char *)a->workspace + pb;
        c->s.wgrad.workspace_bytes = a->workspace_bytes > pb ? a->workspace_bytes - pb : 0;
    }
}

bool kiln_onednn_conv2d_relu_max_pool2d_grad_weight_supports(const kiln_op_args *a) {
    kiln_dtype dt = a->out[0].dtype;
    if ((dt != KILN_F32 && dt != KILN_BF16) || a->out[1].dtype != dt) return false;
    if (kiln_bf16_conv_pool_smallc_grad_weight_supports(a)) return false; /* conv_pool_bf16.c's */
    kiln_onednn_conv2d_pool_mode(true, a->attrs->kernel[0], NULL, NULL);
    wgrad_call c;
    wgrad_call_of(a, &c);
    bool ok = kiln_onednn_conv2d_grad_weight_supports(&c.s.wgrad) &&
              (c.pooled || kiln_fast_relu_max_pool2d_backward_sum_supports(&c.s.pool));
    kiln_onednn_conv2d_pool_mode(false, 0, NULL, NULL);
    return ok;
}

void kiln_onednn_conv2d_relu_max_pool2d_grad_weight_layout(const kiln_op_args *a, kiln_layout *out) {
    (void)a;
    out[0] = out[1] = KILN_LAYOUT_STRIDED;
}

size_t kiln_onednn_conv2d_relu_max_pool2d_grad_weight_workspace(const kiln_op_args *a) {
    kiln_onednn_conv2d_pool_mode(true, a->attrs->kernel[0], NULL, NULL);
    wgrad_call c;
    wgrad_call_of(a, &c);
    size_t conv = kiln_onednn_conv2d_grad_weight_workspace(&c.s.wgrad);
    kiln_onednn_conv2d_pool_mode(false, 0, NULL, NULL);
    size_t part = kiln_conv_pool_align(part_bytes(a));
    if (c.pooled) return part + conv;
    size_t pool = kiln_fast_relu_max_pool2d_backward_sum_workspace(&c.s.pool);
    return kiln_conv_pool_wgrad_g_bytes(a) + (pool > conv ? pool : conv);
}

kiln_status kiln_onednn_conv2d_relu_max_pool2d_grad_weight(const kiln_op_args *a) {
    kiln_onednn_conv2d_pool_mode(true, a->attrs->kernel[0], NULL, NULL);
    wgrad_call c;
    wgrad_call_of(a, &c);
    kiln_status st = KILN_OK;
    if (c.pooled) {
        double *part = a->workspace;
        kiln_onednn_conv2d_grad_weight_pool_inputs(a->in[0].data, a->in[1].data, a->in[2].data, part);
        st = kiln_onednn_conv2d_grad_weight(&c.s.wgrad);
        kiln_onednn_conv2d_pool_mode(false, 0, NULL, NULL);
        if (st == KILN_OK) kiln_fast_add_planes(part, a->in[3].shape[0], a->attrs->ints[0], &a->out[1]);
        return st;
    }
    st = kiln_fast_relu_max_pool2d_backward_sum(&c.s.pool);
    if (st == KILN_OK) st = kiln_onednn_conv2d_grad_weight(&c.s.wgrad);
    kiln_onednn_conv2d_pool_mode(false, 0, NULL, NULL);
    return st;
}

#else
typedef int kiln_onednn_conv_pool_unused; /* ISO C: a translation unit is not empty */
#endif

/* Shape and dtype inference of convolution, pooling and batch norm (and
 * their backward ops). Output sizes come from kernels/nn_geometry.h, the
 * formulas every backend's kernels use. */
#include <string.h>

#include "base/error.h"
#include "kernels/nn_geometry.h"
#include "ops/op_infer.h"
#include "tensor/tensor_internal.h"

#define SHAPE_OF(t, buf) kiln_shape_format((t)->ndim, (t)->shape, (buf), sizeof(buf))

static kiln_status need_float(const char *op, const char *what, const kiln_tensor *t) {
    if (kiln_dtype_is_floating(t->dtype)) return KILN_OK;
    return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "convert it with kiln_cast to a floating dtype",
                      "%s: %s has dtype %s; it must be floating", op, what, kiln_dtype_name(t->dtype));
}

static void set_meta(kiln_meta *m, kiln_dtype dt, int ndim, const int64_t *shape) {
    memset(m, 0, sizeof *m);
    m->dtype = dt, m->ndim = ndim;
    memcpy(m->shape, shape, sizeof(int64_t) * (size_t)ndim);
}

/* ---- conv2d ---------------------------------------------------------------------- */

static kiln_status check_conv_attrs(const char *op, const kiln_conv_geom *g) {
    for (int i = 0; i < 2; i++)
        if (g->stride[i] < 1 || g->dilation[i] < 1 || g->padding[i] < 0)
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use stride >= 1, dilation >= 1 and padding >= 0",
                              "%s: stride (%lld, %lld), padding (%lld, %lld), dilation (%lld, %lld)", op,
                              (long long)g->stride[0], (long long)g->stride[1], (long long)g->padding[0],
                              (long long)g->padding[1], (long long)g->dilation[0], (long long)g->dilation[1]);
    if (g->groups < 1)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use groups >= 1", "%s: groups %lld", op,
                          (long long)g->groups);
    return KILN_OK;
}

kiln_status kiln_infer_conv2d(const char *op, const kiln_op_attrs *attrs, int n_in, kiln_tensor *const *in,
                              kiln_meta *out, kiln_dtype *in_dtype) {
    const kiln_tensor *x = in[0], *w = in[1], *b = n_in > 2 ? in[2] : NULL;
    char sx[96], sw[96];
    if (x->ndim != 4 || w->ndim != 4)
        return KILN_RAISE(
            KILN_ERR_INVALID_ARGUMENT, "pass x as (N, C, H, W) and weight as (O, C/groups, kH, kW)",
            "%s: x is %s and weight is %s; both must be 4-d", op, SHAPE_OF(x, sx), SHAPE_OF(w, sw));
    KILN_TRY(need_float(op, "x", x));
    KILN_TRY(need_float(op, "weight", w));
    kiln_conv_geom g = kiln_conv_geom_of(attrs);
    KILN_TRY(check_conv_attrs(op, &g));
    int64_t O = w->shape[0];
    if (w->shape[1] * g.groups != x->shape[1] || O % g.groups)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                          "weight must be (O, C/groups, kH, kW) with O and C divisible by groups",
                          "%s: x %s, weight %s and groups %lld do not match", op, SHAPE_OF(x, sx),
                          SHAPE_OF(w, sw), (long long)g.groups);
    KILN_TRY(kiln_infer_layer_dtypes(op, x, w, b));
    kiln_dtype dt = kiln_promote_types(x->dtype, w->dtype);
    if (b) {
        char sb[96];
        KILN_TRY(need_float(op, "bias", b));
        if (b->ndim != 1 || b->shape[0] != O)
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass a bias of shape (O), or NULL",
                              "%s: bias is %s but weight has %lld output channels", op, SHAPE_OF(b, sb),
                              (long long)O);
        dt = kiln_promote_types(dt, b->dtype);
        in_dtype[2] = dt;
    }
    in_dtype[0] = in_dtype[1] = dt;
    int64_t ho = kiln_conv_out_size(x->shape[2], w->shape[2], g.stride[0], g.padding[0], g.dilation[0]);
    int64_t wo = kiln_conv_out_size(x->shape[3], w->shape[3], g.stride[1], g.padding[1], g.dilation[1]);
    if (ho < 1 || wo < 1)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pad the input or use a smaller kernel or dilation",
                          "%s: the (dilated) kernel of weight %s is larger than the padded input %s", op,
                          SHAPE_OF(w, sw), SHAPE_OF(x, sx));
    set_meta(&out[0], dt, 4, (int64_t[]){x->shape[0], O, ho, wo});
    return KILN_OK;
}

/* conv2d's checks and output, then the p x p window at stride p
 * (attrs.kernel) over it, no padding, floor; out[1] the i64 indices. */
kiln_status kiln_infer_conv2d_relu_max_pool2d(const char *op, const kiln_op_attrs *attrs, int n_in,
                                              kiln_tensor *const *in, kiln_meta *out, kiln_dtype *in_dtype) {
    KILN_TRY(kiln_infer_conv2d(op, attrs, n_in, in, out, in_dtype));
    int64_t p = attrs->kernel[0];
    if (p < 1 || attrs->kernel[1] != p)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass a pooling window of 1 or more (2 for nn.MaxPool2d(2))",
                          "%s: pooling window %lldx%lld; it must be square and at least 1", op,
                          (long long)attrs->kernel[0], (long long)attrs->kernel[1]);
    int64_t ho = out[0].shape[2], wo = out[0].shape[3];
    if (ho < p || wo < p)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use a smaller pooling window or a larger input",
                          "%s: a %lldx%lld pooling window does not fit the convolution's %lldx%lld output", op,
                          (long long)p, (long long)p, (long long)ho, (long long)wo);
    int64_t shape[4] = {out[0].shape[0], out[0].shape[1], ho / p, wo / p};
    set_meta(&out[0], out[0].dtype, 4, shape);
    set_meta(&out[1], KILN_I64, 4, shape);
    return KILN_OK;
}

/* (grad_out, y, indices, x) -> (grad_weight (attrs.ints), grad_bias (K)):
 * grad_out, y and the indices shaped as conv2d_relu_max_pool2d's outputs
 * for x and that weight shape. */
kiln_status kiln_infer_conv2d_relu_max_pool2d_grad_weight(const char *op, const kiln_op_attrs *attrs, int n_in,
                                                          kiln_tensor *const *in, kiln_meta *out,
                                                          kiln_dtype *in_dtype) {
    (void)n_in;
    const kiln_tensor *go = in[0], *y = in[1], *ix = in[2], *x = in[3];
    char sg[96], sx[96];
    if (x->ndim != 4 || go->ndim != 4 || attrs->n_ints != 4)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass 4-d tensors and the weight's shape in attrs.ints",
                          "%s: grad_out is %s and x %s with a weight shape of %d dims; all must be 4-d", op,
                          SHAPE_OF(go, sg), SHAPE_OF(x, sx), attrs->n_ints);
    KILN_TRY(need_float(op, "grad_out", go));
    KILN_TRY(need_float(op, "x", x));
    KILN_TRY(need_float(op, "y", y));
    kiln_conv_geom g = kiln_conv_geom_of(attrs);
    KILN_TRY(check_conv_attrs(op, &g));
    const int64_t *ws = attrs->ints, p = attrs->kernel[0];
    if (p < 1 || attrs->kernel[1] != p)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass the pooling window conv2d_relu_max_pool2d had",
                          "%s: pooling window %lldx%lld; it must be square and at least 1", op,
                          (long long)attrs->kernel[0], (long long)attrs->kernel[1]);
    if (ws[0] < 1 || ws[1] < 1 || ws[2] < 1 || ws[3] < 1 || ws[0] % g.groups || ws[1] * g.groups != x->shape[1])
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "set attrs.ints to the weight's shape (K, C / groups, kH, kW)",
                          "%s: weight shape (%lld, %lld, %lld, %lld) with %lld groups does not fit x %s", op,
                          (long long)ws[0], (long long)ws[1], (long long)ws[2], (long long)ws[3], (long long)g.groups,
                          SHAPE_OF(x, sx));
    int64_t want[4] = {x->shape[0], ws[0], 0, 0};
    for (int i = 0; i < 2; i++)
        want[2 + i] = kiln_conv_out_size(x->shape[2 + i], ws[2 + i], g.stride[i], g.padding[i], g.dilation[i]) / p;
    const kiln_tensor *same[3] = {go, y, ix};
    static const char *const names[3] = {"grad_out", "y", "indices"};
    for (int t = 0; t < 3; t++)
        if (same[t]->ndim != 4 || memcmp(same[t]->shape, want, sizeof want))
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass what conv2d_relu_max_pool2d returned and its gradient",
                              "%s: %s is %s; the pooled output of x %s is (%lld, %lld, %lld, %lld)", op, names[t],
                              SHAPE_OF(same[t], sg), SHAPE_OF(x, sx), (long long)want[0], (long long)want[1],
                              (long long)want[2], (long long)want[3]);
    if (kiln_dtype_is_floating(ix->dtype))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass the indices kiln_conv2d_relu_max_pool2d returned",
                          "%s: indices must be integers", op);
    kiln_dtype dt = kiln_promote_types(go->dtype, x->dtype);
    in_dtype[0] = in_dtype[1] = in_dtype[3] = dt;
    in_dtype[2] = KILN_I64;
    set_meta(&out[0], dt, 4, ws);
    set_meta(&out[1], dt, 1, &ws[0]);
    return KILN_OK;
}

/* Gradient ops of conv2d: out[0] has the shape in attrs.ints[0..3]. */
static kiln_status infer_conv_grad(const char *op, const kiln_op_attrs *attrs, kiln_tensor *const *in,
                                   kiln_meta *out, kiln_dtype *in_dtype) {
    if (in[0]->ndim != 4 || in[1]->ndim != 4)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass 4-d tensors", "%s: operands must be 4-d", op);
    kiln_conv_geom g = kiln_conv_geom_of(attrs);
    KILN_TRY(check_conv_attrs(op, &g));
    for (int i = 0; i < 4; i++)
        if (attrs->ints[i] < 0)
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "set attrs.ints[0..3] to the result's shape",
                              "%s: result size %lld in dim %d", op, (long long)attrs->ints[i], i);
    kiln_dtype dt = kiln_promote_types(in[0]->dtype, in[1]->dtype);
    in_dtype[0] = in_dtype[1] = dt;
    set_meta(&out[0], dt, 4, attrs->ints);
    return KILN_OK;
}

kiln_status kiln_infer_conv2d_grad_input(const char *op, const kiln_op_attrs *attrs, int n_in,
                                         kiln_tensor *const *in, kiln_meta *out, kiln_dtype *in_dtype) {
    (void)n_in;
    return infer_conv_grad(op, attrs, in, out, in_dtype);
}

kiln_status kiln_infer_conv2d_grad_weight(const char *op, const kiln_op_attrs *attrs, int n_in,
                                          kiln_tensor *const *in, kiln_meta *out, kiln_dtype *in_dtype) {
    (void)n_in;
    return infer_conv_grad(op, attrs, in, out, in_dtype);
}

/* ---- pooling ---------------------------------------------------------------------- */

static kiln_status check_pool_input(const char *op, const kiln_tensor *x) {
    char sx[96];
    if (x->ndim != 3 && x->ndim != 4)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass (N, C, H, W) or (C, H, W)",
                          "%s: x is %s; it must be 3-d or 4-d", op, SHAPE_OF(x, sx));
    return need_float(op, "x", x);
}

/* out[0] (and out[1] for max pooling) from the window attributes. */
static kiln_status infer_pool(const char *op, const kiln_op_attrs *attrs, const kiln_tensor *x,
                              kiln_meta *out, int n_out) {
    KILN_TRY(check_pool_input(op, x));
    kiln_pool_geom g = kiln_pool_geom_of(attrs);
    for (int i = 0; i < 2; i++) {
        if (g.kernel[i] < 1 || g.stride[i] < 1 || g.padding[i] < 0)
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                              "use kernel >= 1, stride >= 1 (0 = kernel) and padding >= 0",
                              "%s: kernel (%lld, %lld), stride (%lld, %lld), padding (%lld, %lld)", op,
                              (long long)g.kernel[0], (long long)g.kernel[1], (long long)g.stride[0],
                              (long long)g.stride[1], (long long)g.padding[0], (long long)g.padding[1]);
        if (g.padding[i] * 2 > g.kernel[i])
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use padding <= kernel / 2",
                              "%s: padding %lld is more than half of kernel size %lld", op,
                              (long long)g.padding[i], (long long)g.kernel[i]);
    }
    int nd = x->ndim;
    int64_t shape[4];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)nd);
    for (int i = 0; i < 2; i++) {
        shape[nd - 2 + i] =
            kiln_pool_out_size(x->shape[nd - 2 + i], g.kernel[i], g.stride[i], g.padding[i], g.ceil_mode);
        if (shape[nd - 2 + i] < 1) {
            char sx[96];
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use a smaller kernel or pad the input",
                              "%s: a %lldx%lld window does not fit input %s", op, (long long)g.kernel[0],
                              (long long)g.kernel[1], SHAPE_OF(x, sx));
        }
    }
    set_meta(&out[0], x->dtype, nd, shape);
    if (n_out > 1) set_meta(&out[1], KILN_I64, nd, shape);
    return KILN_OK;
}

kiln_status kiln_infer_max_pool2d(const char *op, const kiln_op_attrs *attrs, int n_in,
                                  kiln_tensor *const *in, kiln_meta *out, kiln_dtype *in_dtype) {
    (void)n_in, (void)in_dtype;
    return infer_pool(op, attrs, in[0], out, 2);
}

kiln_status kiln_infer_avg_pool2d(const char *op, const kiln_op_attrs *attrs, int n_in,
                                  kiln_tensor *const *in, kiln_meta *out, kiln_dtype *in_dtype) {
    (void)n_in, (void)in_dtype;
    return infer_pool(op, attrs, in[0], out, 1);
}

kiln_status kiln_infer_adaptive_avg_pool2d(const char *op, const kiln_op_attrs *attrs, int n_in,
                                           kiln_tensor *const *in, kiln_meta *out, kiln_dtype *in_dtype) {
    (void)n_in, (void)in_dtype;
    const kiln_tensor *x = in[0];
    KILN_TRY(check_pool_input(op, x));
    int nd = x->ndim;
    if (attrs->ints[0] < 1 || attrs->ints[1] < 1 || x->shape[nd - 2] < 1 || x->shape[nd - 1] < 1) {
        char sx[96];
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use an output size >= 1 and a non-empty input",
                          "%s: output size (%lld, %lld) from input %s", op, (long long)attrs->ints[0],
                          (long long)attrs->ints[1], SHAPE_OF(x, sx));
    }
    int64_t shape[4];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)nd);
    shape[nd - 2] = attrs->ints[0], shape[nd - 1] = attrs->ints[1];
    set_meta(&out[0], x->dtype, nd, shape);
    return KILN_OK;
}

/* The pooling backwards: grad_input with the input shape in attrs.ints
 * (n_ints entries, 3 or 4; 0 means 4) and grad_out's dtype. */
kiln_status kiln_infer_pool_backward(const char *op, const kiln_op_attrs *attrs, int n_in,
                                     kiln_tensor *const *in, kiln_meta *out, kiln_dtype *in_dtype) {
    int nd = attrs->n_ints ? attrs->n_ints : 4;
    if (nd != in[0]->ndim)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "set attrs.ints to the forward input's shape",
                          "%s: input shape has %d dims but grad_out has %d", op, nd, in[0]->ndim);
    KILN_TRY(need_float(op, "grad_out", in[0]));
    if (n_in > 1) {
        if (kiln_dtype_is_floating(in[1]->dtype) || in[1]->ndim != nd)
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass the indices kiln_max_pool2d returned",
                              "%s: indices must be integers shaped like grad_out", op);
        in_dtype[1] = KILN_I64;
    }
    set_meta(&out[0], in[0]->dtype, nd, attrs->ints);
    return KILN_OK;
}

/* (grad_out, y, indices) -> grad_input of relu_max_pool2d: y and indices
 * as relu_max_pool2d returned them, shaped like grad_out; the input shape
 * in attrs.ints as for the other pooling backwards. */
kiln_status kiln_infer_relu_max_pool2d_backward(const char *op, const kiln_op_attrs *attrs, int n_in,
                                                kiln_tensor *const *in, kiln_meta *out,
                                                kiln_dtype *in_dtype) {
    (void)n_in;
    const kiln_tensor *go = in[0], *y = in[1], *ix = in[2];
    char sg[96], sy[96];
    if (y->ndim != go->ndim || memcmp(y->shape, go->shape, sizeof(int64_t) * (size_t)go->ndim))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass the y kiln_relu_max_pool2d returned",
                          "%s: y is %s but grad_out is %s; they must match", op, SHAPE_OF(y, sy),
                          SHAPE_OF(go, sg));
    KILN_TRY(need_float(op, "y", y));
    if (ix->ndim != go->ndim || memcmp(ix->shape, go->shape, sizeof(int64_t) * (size_t)go->ndim))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass the indices kiln_relu_max_pool2d returned",
                          "%s: indices are %s but grad_out is %s; they must match", op, SHAPE_OF(ix, sy),
                          SHAPE_OF(go, sg));
    /* grad_out and the indices as the max pooling backward checks them */
    KILN_TRY(kiln_infer_pool_backward(op, attrs, 2, (kiln_tensor *[]){in[0], in[2]}, out, in_dtype));
    in_dtype[2] = in_dtype[1];
    in_dtype[1] = go->dtype;
    return KILN_OK;
}

/* relu_max_pool2d_backward's checks, 4-d tensors only, and out[1] (C) in
 * grad_input's dtype: the per-channel sums. */
kiln_status kiln_infer_relu_max_pool2d_backward_sum(const char *op, const kiln_op_attrs *attrs, int n_in,
                                                    kiln_tensor *const *in, kiln_meta *out, kiln_dtype *in_dtype) {
    if (in[0]->ndim != 4 || attrs->n_ints != 4) {
        char sg[96];
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use relu_max_pool2d_backward for 3-d tensors",
                          "%s: grad_out is %s with an input shape of %d dims; both must be 4-d (N, C, H, W)", op,
                          SHAPE_OF(in[0], sg), attrs->n_ints);
    }
    KILN_TRY(kiln_infer_relu_max_pool2d_backward(op, attrs, n_in, in, out, in_dtype));
    set_meta(&out[1], out[0].dtype, 1, &out[0].shape[1]);
    return KILN_OK;
}

/* ---- batch norm --------------------------------------------------------------------- */

/* Batch norm keeps its parameters and statistics in f32 whatever x's
 * dtype, except for f64 data, which is computed in f64 throughout (what
 * gradient checks need). */
static kiln_dtype bn_param_dtype(const kiln_tensor *x) { return x->dtype == KILN_F64 ? KILN_F64 : KILN_F32; }

/* Optional per-channel parameter: (C) or NULL, converted to `dt`
 * (KILN_DTYPE_COUNT: left in its own floating dtype, for the running
 * statistics, which are updated in place and so must not be copies). */
static kiln_status check_channel_param(const char *op, const char *what, const kiln_tensor *p, int64_t C,
                                       kiln_dtype dt, kiln_dtype *in_dtype) {
    if (!p) return KILN_OK;
    char sp[96];
    if (p->ndim != 1 || p->shape[0] != C)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass one value per channel",
                          "%s: %s is %s but x has %lld channels", op, what, SHAPE_OF(p, sp), (long long)C);
    KILN_TRY(need_float(op, what, p));
    if (dt != KILN_DTYPE_COUNT) *in_dtype = dt;
    return KILN_OK;
}

kiln_status kiln_infer_batch_norm(const char *op, const kiln_op_attrs *attrs, int n_in,
                                  kiln_tensor *const *in, kiln_meta *out, kiln_dtype *in_dtype) {
    const kiln_tensor *x = in[0];
    char sx[96];
    if (x->ndim < 2)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass x as (N, C, ...)",
                          "%s: x is %s; it needs at least 2 dims", op, SHAPE_OF(x, sx));
    KILN_TRY(need_float(op, "x", x));
    int64_t C = x->shape[1];
    static const char *names[5] = {"x", "weight", "bias", "running_mean", "running_var"};
    kiln_dtype pdt = bn_param_dtype(x);
    for (int i = 1; i < n_in && i < 5; i++)
        KILN_TRY(check_channel_param(op, names[i], in[i], C, i < 3 ? pdt : KILN_DTYPE_COUNT, &in_dtype[i]));
    if (!attrs->training && (n_in < 5 || !in[3] || !in[4]))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                          "pass running_mean and running_var, or use training mode",
                          "%s: eval mode normalises with the running statistics, which are missing", op);
    if (attrs->training && C > 0 && kiln_numel(x) / C == 1)
        return KILN_RAISE(
            KILN_ERR_INVALID_ARGUMENT, "use a batch of more than one value per channel, or eval mode",
            "%s: expected more than 1 value per channel when training, got input %s", op, SHAPE_OF(x, sx));
    if (!(attrs->eps >= 0))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use eps >= 0 (PyTorch's default is 1e-5)", "%s: eps %g",
                          op, attrs->eps);
    set_meta(&out[0], x->dtype, x->ndim, x->shape);
    set_meta(&out[1], pdt, 1, &C);
    set_meta(&out[2], pdt, 1, &C);
    return KILN_OK;
}

/* (grad_out, x, weight or NULL, mean, invstd) -> (grad_x, grad_weight, grad_bias) */
kiln_status kiln_infer_batch_norm_backward(const char *op, const kiln_op_attrs *attrs, int n_in,
                                           kiln_tensor *const *in, kiln_meta *out, kiln_dtype *in_dtype) {
    (void)attrs, (void)n_in;
    const kiln_tensor *go = in[0], *x = in[1];
    char sg[96], sx[96];
    if (x->ndim < 2 || go->ndim != x->ndim || memcmp(go->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass grad_out shaped like x",
                          "%s: grad_out %s and x %s differ", op, SHAPE_OF(go, sg), SHAPE_OF(x, sx));
    KILN_TRY(need_float(op, "x", x));
    KILN_TRY(need_float(op, "grad_out", go));
    int64_t C = x->shape[1];
    in_dtype[0] = x->dtype;
    kiln_dtype pdt = bn_param_dtype(x);
    KILN_TRY(check_channel_param(op, "weight", in[2], C, pdt, &in_dtype[2]));
    if (!in[3] || !in[4])
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass the mean and invstd batch_norm returned",
                          "%s: mean and invstd are required", op);
    KILN_TRY(check_channel_param(op, "mean", in[3], C, pdt, &in_dtype[3]));
    KILN_TRY(check_channel_param(op, "invstd", in[4], C, pdt, &in_dtype[4]));
    set_meta(&out[0], x->dtype, x->ndim, x->shape);
    set_meta(&out[1], pdt, 1, &C);
    set_meta(&out[2], pdt, 1, &C);
    return KILN_OK;
}

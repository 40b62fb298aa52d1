/* oneDNN convolution: forward (with bias), input gradient and weight
 * gradient, f32, plain NCHW activations and OIHW weights (goihw when
 * grouped), direct algorithm. The bias gradient stays with the portable
 * path (backward_conv2d sums grad_out; CONV2D_GRAD_WEIGHT has one output). */
#ifdef KILN_WITH_ONEDNN
#include <string.h>

#include "kernels/cpu/onednn/onednn_internal.h"
#include "kernels/nn_geometry.h"

/* Key layout: the problem in forward terms, whichever pass it is. */
enum {
    K_N,
    K_C,
    K_H,
    K_W,
    K_O,
    K_KH,
    K_KW,
    K_OH,
    K_OW,
    K_SH,
    K_SW,
    K_PH,
    K_PW,
    K_DH,
    K_DW,
    K_G,
    K_BIAS,
    K_COUNT
};

/* x (N, C, H, W), w (O, C/G, kH, kW), y (N, O, OH, OW): the forward names
 * of the three tensors, whichever pass's inputs and outputs they are. */
static bool conv_key(kiln_onednn_kind kind, const kiln_strided *x, const kiln_strided *w,
                     const kiln_strided *y, const kiln_strided *bias, const kiln_op_attrs *attrs,
                     kiln_onednn_key *key) {
    if (x->ndim != 4 || w->ndim != 4 || y->ndim != 4) return false;
    if (x->dtype != KILN_F32 || w->dtype != KILN_F32 || y->dtype != KILN_F32) return false;
    if (!kiln_onednn_is_contiguous(x) || !kiln_onednn_is_contiguous(w) || !kiln_onednn_is_contiguous(y))
        return false;
    if (bias && (bias->ndim != 1 || bias->dtype != KILN_F32 || !kiln_onednn_is_contiguous(bias)))
        return false;
    kiln_conv_geom g = kiln_conv_geom_of(attrs);
    if (g.groups < 1 || x->shape[1] != w->shape[1] * g.groups || w->shape[0] % g.groups) return false;
    /* The gradient ops take their shapes from the caller: leave sizes that
     * are not a forward convolution's to the reference kernels. */
    if (y->shape[2] !=
            kiln_conv_out_size(x->shape[2], w->shape[2], g.stride[0], g.padding[0], g.dilation[0]) ||
        y->shape[3] != kiln_conv_out_size(x->shape[3], w->shape[3], g.stride[1], g.padding[1], g.dilation[1]))
        return false;
    memset(key, 0, sizeof *key);
    key->kind = kind;
    int64_t *v = key->v;
    v[K_N] = x->shape[0], v[K_C] = x->shape[1], v[K_H] = x->shape[2], v[K_W] = x->shape[3];
    v[K_O] = w->shape[0], v[K_KH] = w->shape[2], v[K_KW] = w->shape[3];
    v[K_OH] = y->shape[2], v[K_OW] = y->shape[3];
    v[K_SH] = g.stride[0], v[K_SW] = g.stride[1], v[K_PH] = g.padding[0], v[K_PW] = g.padding[1];
    v[K_DH] = g.dilation[0], v[K_DW] = g.dilation[1], v[K_G] = g.groups, v[K_BIAS] = bias != NULL;
    return y->shape[0] == x->shape[0] && y->shape[1] == w->shape[0];
}

typedef struct conv_mds {
    dnnl_memory_desc_t src, wei, bias, dst;
    dnnl_dims_t strides, dilates, pad_l, pad_r;
} conv_mds;

static kiln_status conv_mds_of(const int64_t *v, conv_mds *m) {
    dnnl_dims_t src = {v[K_N], v[K_C], v[K_H], v[K_W]}, dst = {v[K_N], v[K_O], v[K_OH], v[K_OW]};
    KILN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&m->src, 4, src, dnnl_f32, dnnl_nchw));
    KILN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&m->dst, 4, dst, dnnl_f32, dnnl_nchw));
    int64_t G = v[K_G];
    if (G > 1) {
        dnnl_dims_t wei = {G, v[K_O] / G, v[K_C] / G, v[K_KH], v[K_KW]};
        KILN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&m->wei, 5, wei, dnnl_f32, dnnl_goihw));
    } else {
        dnnl_dims_t wei = {v[K_O], v[K_C], v[K_KH], v[K_KW]};
        KILN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&m->wei, 4, wei, dnnl_f32, dnnl_oihw));
    }
    dnnl_dims_t bias = {v[K_O]};
    KILN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&m->bias, 1, bias, dnnl_f32, dnnl_a));
    /* oneDNN counts dilation from 0; PyTorch pads symmetrically and floors
     * the output size, which oneDNN's consistency check accepts with
     * pad_r = pad_l. */
    m->strides[0] = v[K_SH], m->strides[1] = v[K_SW];
    m->dilates[0] = v[K_DH] - 1, m->dilates[1] = v[K_DW] - 1;
    m->pad_l[0] = m->pad_r[0] = v[K_PH];
    m->pad_l[1] = m->pad_r[1] = v[K_PW];
    return KILN_OK;
}

static kiln_status conv_forward_pd(const int64_t *v, const_dnnl_primitive_attr_t attr, dnnl_engine_t engine,
                                   dnnl_primitive_desc_t *pd) {
    conv_mds m;
    KILN_TRY(conv_mds_of(v, &m));
    dnnl_convolution_desc_t d;
    KILN_DNNL_CHECK(dnnl_dilated_convolution_forward_desc_init(
        &d, dnnl_forward_training, dnnl_convolution_direct, &m.src, &m.wei, v[K_BIAS] ? &m.bias : NULL,
        &m.dst, m.strides, m.dilates, m.pad_l, m.pad_r));
    KILN_DNNL_CHECK(dnnl_primitive_desc_create(pd, &d, attr, engine, NULL));
    return KILN_OK;
}

static kiln_status build_forward(const kiln_onednn_key *key, const_dnnl_primitive_attr_t attr,
                                 dnnl_engine_t engine, dnnl_primitive_desc_t *pd) {
    return conv_forward_pd(key->v, attr, engine, pd);
}

/* The backward passes: a forward primitive descriptor is oneDNN's hint. */
static kiln_status build_backward(const kiln_onednn_key *key, const_dnnl_primitive_attr_t attr,
                                  dnnl_engine_t engine, dnnl_primitive_desc_t *pd) {
    const int64_t *v = key->v;
    conv_mds m;
    KILN_TRY(conv_mds_of(v, &m));
    dnnl_primitive_desc_t hint = NULL;
    KILN_TRY(conv_forward_pd(v, NULL, engine, &hint));
    dnnl_convolution_desc_t d;
    dnnl_status_t st;
    if (key->kind == KILN_ONEDNN_CONV_BWD_DATA)
        st = dnnl_dilated_convolution_backward_data_desc_init(&d, dnnl_convolution_direct, &m.src, &m.wei,
                                                              &m.dst, m.strides, m.dilates, m.pad_l, m.pad_r);
    else
        st = dnnl_dilated_convolution_backward_weights_desc_init(&d, dnnl_convolution_direct, &m.src, &m.wei,
                                                                 NULL, &m.dst, m.strides, m.dilates, m.pad_l,
                                                                 m.pad_r);
    if (st == dnnl_success) st = dnnl_primitive_desc_create(pd, &d, attr, engine, hint);
    dnnl_primitive_desc_destroy(hint);
    KILN_DNNL_CHECK(st);
    return KILN_OK;
}

static const int fwd_args[] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
static const int bwd_data_args[] = {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC};
static const int bwd_weights_args[] = {DNNL_ARG_DIFF_DST, DNNL_ARG_SRC, DNNL_ARG_DIFF_WEIGHTS};

/* The pass's cached primitive in *p; *p stays NULL when the args are
 * outside what these kernels cover (not an error). */
static kiln_status conv_prepare(kiln_onednn_kind kind, const kiln_op_args *a, kiln_onednn_prim **p) {
    *p = NULL;
    kiln_onednn_key key;
    if (kind == KILN_ONEDNN_CONV_FWD) {
        const kiln_strided *bias = a->in[2].ndim >= 0 ? &a->in[2] : NULL;
        if (!conv_key(kind, &a->in[0], &a->in[1], &a->out[0], bias, a->attrs, &key)) return KILN_OK;
        return kiln_onednn_get(&key, build_forward, bias ? 4 : 3, fwd_args, p);
    }
    if (kind == KILN_ONEDNN_CONV_BWD_DATA) { /* (grad_out, weight) -> grad_input */
        if (!conv_key(kind, &a->out[0], &a->in[1], &a->in[0], NULL, a->attrs, &key)) return KILN_OK;
        return kiln_onednn_get(&key, build_backward, 3, bwd_data_args, p);
    }
    /* (grad_out, input) -> grad_weight */
    if (!conv_key(kind, &a->in[1], &a->out[0], &a->in[0], NULL, a->attrs, &key)) return KILN_OK;
    return kiln_onednn_get(&key, build_backward, 3, bwd_weights_args, p);
}

static kiln_status conv_run(kiln_onednn_kind kind, const kiln_op_args *a, const char *op) {
    kiln_onednn_prim *p;
    KILN_TRY(conv_prepare(kind, a, &p));
    if (!p)
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "%s: the oneDNN kernel was given arguments it declines",
                          op);
    void *data[4] = {a->in[0].data, a->in[1].data, a->out[0].data, a->n_in > 2 ? a->in[2].data : NULL};
    return kiln_onednn_execute(p, data, a->workspace, a->workspace_bytes);
}

/* A build failure makes supports false (the reference kernel runs) and
 * the workspace 0; it is cached, so it costs one attempt per shape. */
static size_t conv_workspace(kiln_onednn_kind kind, const kiln_op_args *a) {
    kiln_onednn_prim *p;
    return conv_prepare(kind, a, &p) == KILN_OK && p ? p->scratch_bytes : 0;
}

static bool conv_supports(kiln_onednn_kind kind, const kiln_op_args *a) {
    kiln_onednn_prim *p;
    return conv_prepare(kind, a, &p) == KILN_OK && p;
}

kiln_status kiln_onednn_conv2d(const kiln_op_args *a) {
    return conv_run(KILN_ONEDNN_CONV_FWD, a, "kiln_conv2d");
}
size_t kiln_onednn_conv2d_workspace(const kiln_op_args *a) { return conv_workspace(KILN_ONEDNN_CONV_FWD, a); }
bool kiln_onednn_conv2d_supports(const kiln_op_args *a) { return conv_supports(KILN_ONEDNN_CONV_FWD, a); }

kiln_status kiln_onednn_conv2d_grad_input(const kiln_op_args *a) {
    return conv_run(KILN_ONEDNN_CONV_BWD_DATA, a, "kiln_conv2d_grad_input");
}
size_t kiln_onednn_conv2d_grad_input_workspace(const kiln_op_args *a) {
    return conv_workspace(KILN_ONEDNN_CONV_BWD_DATA, a);
}
bool kiln_onednn_conv2d_grad_input_supports(const kiln_op_args *a) {
    return conv_supports(KILN_ONEDNN_CONV_BWD_DATA, a);
}

kiln_status kiln_onednn_conv2d_grad_weight(const kiln_op_args *a) {
    return conv_run(KILN_ONEDNN_CONV_BWD_WEIGHTS, a, "kiln_conv2d_grad_weight");
}
size_t kiln_onednn_conv2d_grad_weight_workspace(const kiln_op_args *a) {
    return conv_workspace(KILN_ONEDNN_CONV_BWD_WEIGHTS, a);
}
bool kiln_onednn_conv2d_grad_weight_supports(const kiln_op_args *a) {
    return conv_supports(KILN_ONEDNN_CONV_BWD_WEIGHTS, a);
}

#else
typedef int kiln_onednn_conv_unused; /* ISO C: a translation unit is not empty */
#endif

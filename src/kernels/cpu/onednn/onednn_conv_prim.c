/* oneDNN's primitive descriptors for the convolution provider
 * (onednn_conv.c): the convolution of a key, forward or backward, in the
 * user's layouts or the ones oneDNN prefers, and the reorders between the
 * two (onednn_conv_key.h). */
#ifdef KILN_WITH_ONEDNN
#include <string.h>

#include "base/error.h"
#include "kernels/cpu/onednn/onednn_conv_key.h"

typedef struct conv_mds {
    dnnl_memory_desc_t src, wei, bias, dst;
    dnnl_dims_t strides, dilates, pad_l, pad_r;
} conv_mds;

/* The descriptors: any_layout leaves src, weights and dst to oneDNN;
 * otherwise they are the user's tensors (user_layouts: the activations'
 * layouts from the key, else plain NCHW). */
static kiln_status conv_mds_of_user(const int64_t *v, bool any_layout, bool user_layouts, conv_mds *m) {
    dnnl_dims_t src = {v[K_N], v[K_C], v[K_H], v[K_W]}, dst = {v[K_N], v[K_O], v[K_OH], v[K_OW]};
    dnnl_format_tag_t act = any_layout ? dnnl_format_tag_any : dnnl_nchw;
    dnnl_format_tag_t src_tag = act, dst_tag = act;
    if (!any_layout && user_layouts) {
        if (v[K_LX]) src_tag = v[K_LX] == 8 ? dnnl_nChw8c : dnnl_nChw16c;
        if (v[K_LY]) dst_tag = v[K_LY] == 8 ? dnnl_nChw8c : dnnl_nChw16c;
    }
    dnnl_data_type_t dt = kiln_onednn_conv_dt(v);
    KILN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&m->src, 4, src, dt, src_tag));
    KILN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&m->dst, 4, dst, dt, dst_tag));
    int64_t G = v[K_G];
    if (G > 1) {
        dnnl_dims_t wei = {G, v[K_O] / G, v[K_C] / G, v[K_KH], v[K_KW]};
        KILN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&m->wei, 5, wei, dt,
                                                     any_layout ? dnnl_format_tag_any : dnnl_goihw));
    } else {
        dnnl_dims_t wei = {v[K_O], v[K_C], v[K_KH], v[K_KW]};
        KILN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&m->wei, 4, wei, dt,
                                                     any_layout ? dnnl_format_tag_any : dnnl_oihw));
    }
    dnnl_dims_t bias = {v[K_O]};
    KILN_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&m->bias, 1, bias, dt, dnnl_a));
    /* oneDNN counts dilation from 0; PyTorch pads symmetrically and floors
     * the output size, which oneDNN's consistency check accepts with
     * pad_r = pad_l. */
    m->strides[0] = v[K_SH], m->strides[1] = v[K_SW];
    m->dilates[0] = v[K_DH] - 1, m->dilates[1] = v[K_DW] - 1;
    m->pad_l[0] = m->pad_r[0] = v[K_PH];
    m->pad_l[1] = m->pad_r[1] = v[K_PW];
    return KILN_OK;
}

static kiln_status conv_mds_of(const int64_t *v, bool any_layout, conv_mds *m) {
    return conv_mds_of_user(v, any_layout, false, m);
}

static dnnl_alg_kind_t dnnl_alg_of(int64_t alg) {
    return alg == ALG_WINOGRAD ? dnnl_convolution_winograd : dnnl_convolution_direct;
}

/* attr with a ReLU post-op appended (a new attr the caller destroys). */
static kiln_status relu_attr(const_dnnl_primitive_attr_t attr, dnnl_primitive_attr_t *out) {
    *out = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_status_t st = attr ? dnnl_primitive_attr_clone(out, attr) : dnnl_primitive_attr_create(out);
    if (st == dnnl_success) st = dnnl_post_ops_create(&po);
    if (st == dnnl_success) st = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f);
    if (st == dnnl_success) st = dnnl_primitive_attr_set_post_ops(*out, po);
    if (po) dnnl_post_ops_destroy(po);
    if (st != dnnl_success && *out) dnnl_primitive_attr_destroy(*out), *out = NULL;
    KILN_DNNL_CHECK(st);
    return KILN_OK;
}

static kiln_status conv_forward_pd(const int64_t *v, const_dnnl_primitive_attr_t attr, dnnl_engine_t engine,
                                   dnnl_primitive_desc_t *pd) {
    conv_mds m;
    KILN_TRY(conv_mds_of(v, v[K_ALG] != ALG_DIRECT_PLAIN, &m));
    dnnl_convolution_desc_t d;
    KILN_DNNL_CHECK(dnnl_dilated_convolution_forward_desc_init(
        &d, dnnl_forward_training, dnnl_alg_of(v[K_ALG]), &m.src, &m.wei, v[K_BIAS] ? &m.bias : NULL, &m.dst,
        m.strides, m.dilates, m.pad_l, m.pad_r));
    dnnl_primitive_attr_t with_relu = NULL;
    if (v[K_RELU]) KILN_TRY(relu_attr(attr, &with_relu));
    dnnl_status_t st = dnnl_primitive_desc_create(pd, &d, with_relu ? with_relu : attr, engine, NULL);
    if (with_relu) dnnl_primitive_attr_destroy(with_relu);
    KILN_DNNL_CHECK(st);
    return KILN_OK;
}

/* The backward passes: a forward primitive descriptor is oneDNN's hint. */
static kiln_status conv_backward_pd(kiln_onednn_kind kind, const int64_t *v, const_dnnl_primitive_attr_t attr,
                                    dnnl_engine_t engine, dnnl_primitive_desc_t *pd) {
    conv_mds m;
    KILN_TRY(conv_mds_of(v, v[K_ALG] != ALG_DIRECT_PLAIN, &m));
    dnnl_primitive_desc_t hint = NULL;
    int64_t fv[K_COUNT];
    memcpy(fv, v, sizeof fv);
    fv[K_RELU] = 0;
    KILN_TRY(conv_forward_pd(fv, NULL, engine, &hint));
    dnnl_convolution_desc_t d;
    dnnl_status_t st;
    if (kind == KILN_ONEDNN_CONV_BWD_DATA)
        st = dnnl_dilated_convolution_backward_data_desc_init(&d, dnnl_alg_of(v[K_ALG]), &m.src, &m.wei,
                                                              &m.dst, m.strides, m.dilates, m.pad_l, m.pad_r);
    else
        st = dnnl_dilated_convolution_backward_weights_desc_init(
            &d, dnnl_alg_of(v[K_ALG]), &m.src, &m.wei, NULL, &m.dst, m.strides, m.dilates, m.pad_l, m.pad_r);
    if (st == dnnl_success) st = dnnl_primitive_desc_create(pd, &d, attr, engine, hint);
    dnnl_primitive_desc_destroy(hint);
    KILN_DNNL_CHECK(st);
    return KILN_OK;
}

static kiln_status conv_pd(kiln_onednn_kind kind, const int64_t *v, const_dnnl_primitive_attr_t attr,
                           dnnl_engine_t engine, dnnl_primitive_desc_t *pd) {
    return kind == KILN_ONEDNN_CONV_FWD ? conv_forward_pd(v, attr, engine, pd)
                                        : conv_backward_pd(kind, v, attr, engine, pd);
}

kiln_status kiln_onednn_conv_build(const kiln_onednn_key *key, const_dnnl_primitive_attr_t attr,
                              dnnl_engine_t engine, dnnl_primitive_desc_t *pd) {
    return conv_pd((kiln_onednn_kind)key->kind, key->v, attr, engine, pd);
}

/* Execution arguments, in the order of the op's buffers: position 0 and 1
 * are the op's inputs, 2 its output, 3 the forward bias. */
static const int fwd_args[] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
static const int bwd_data_args[] = {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC};
static const int bwd_weights_args[] = {DNNL_ARG_DIFF_DST, DNNL_ARG_SRC, DNNL_ARG_DIFF_WEIGHTS};

const int *kiln_onednn_conv_args(kiln_onednn_kind kind) {
    return kind == KILN_ONEDNN_CONV_FWD        ? fwd_args
           : kind == KILN_ONEDNN_CONV_BWD_DATA ? bwd_data_args
                                               : bwd_weights_args;
}

/* The descriptor of the user's tensor at argument position `pos` of a
 * pass (NCHW or nChw16c activations, OIHW weights). */
kiln_status kiln_onednn_conv_plain_md(kiln_onednn_kind kind, const int64_t *v, int pos, dnnl_memory_desc_t *md) {
    conv_mds m;
    KILN_TRY(conv_mds_of_user(v, false, true, &m));
    static const char which[3][3] = {
        {'s', 'w', 'd'}, /* forward: src, weights -> dst */
        {'d', 'w', 's'}, /* backward data: diff_dst, weights -> diff_src */
        {'d', 's', 'w'}, /* backward weights: diff_dst, src -> diff_weights */
    };
    char c = which[kind - KILN_ONEDNN_CONV_FWD][pos];
    *md = c == 's' ? m.src : c == 'w' ? m.wei : m.dst;
    return KILN_OK;
}

/* A reorder between the plain tensor at position v[K_REORDER_POS] and the
 * layout the blocked convolution chose for it: plain -> blocked for the
 * inputs, blocked -> plain for the output. */
kiln_status kiln_onednn_conv_build_reorder(const kiln_onednn_key *key, const_dnnl_primitive_attr_t attr,
                                 dnnl_engine_t engine, dnnl_primitive_desc_t *pd) {
    kiln_onednn_kind kind = (kiln_onednn_kind)key->v[K_CONV_KIND];
    int pos = (int)key->v[K_REORDER_POS];
    dnnl_primitive_desc_t cpd = NULL;
    KILN_TRY(conv_pd(kind, key->v, NULL, engine, &cpd));
    const dnnl_memory_desc_t *blocked =
        dnnl_primitive_desc_query_md(cpd, dnnl_query_exec_arg_md, kiln_onednn_conv_args(kind)[pos]);
    dnnl_memory_desc_t plain, chosen;
    kiln_status st = kiln_onednn_conv_plain_md(kind, key->v, pos, &plain);
    if (!st && !blocked)
        st = KILN_RAISE(KILN_ERR_INTERNAL, NULL, "oneDNN: the convolution has no argument %d", pos);
    if (!st) chosen = *blocked;
    dnnl_status_t ds = dnnl_success;
    if (!st)
        ds = pos < 2 ? dnnl_reorder_primitive_desc_create(pd, &plain, engine, &chosen, engine, attr)
                     : dnnl_reorder_primitive_desc_create(pd, &chosen, engine, &plain, engine, attr);
    dnnl_primitive_desc_destroy(cpd);
    KILN_TRY(st);
    KILN_DNNL_CHECK(ds);
    return KILN_OK;
}
#else
typedef int kiln_onednn_conv_prim_unused; /* ISO C: a translation unit is not empty */
#endif

/* The convolution provider's key and algorithms (onednn_conv.c), and the
 * oneDNN primitive descriptors built from a key (onednn_conv_prim.c). */
#ifndef KILN_SRC_KERNELS_CPU_ONEDNN_ONEDNN_CONV_KEY_H
#define KILN_SRC_KERNELS_CPU_ONEDNN_ONEDNN_CONV_KEY_H

#include "kernels/cpu/onednn/onednn_internal.h"

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
    K_ALG,         /* conv_alg */
    K_CONV_KIND,   /* reorder keys: the convolution's kind */
    K_REORDER_POS, /* reorder keys: the argument position (0, 1: inputs, 2: output) */
    K_LX,          /* x's layout: its channel block (kernels/kernels.h): 0 NCHW, 16 nChw16c, 8 nChw8c */
    K_LY,          /* y's layout */
    K_RELU,        /* forward: ReLU fused as a post-op (conv2d_relu) */
    K_POOL,        /* gradients: the pooling window whose backward made grad_out (kiln_wino_shape.pool) */
    K_DT,          /* the tensors' dtype: 0 f32, 1 bf16 (oneDNN's "direct" and "direct_plain" only) */
    K_COUNT
};

typedef enum conv_alg {
    ALG_DIRECT = 0,
    ALG_DIRECT_PLAIN,
    ALG_WINOGRAD,
    ALG_WINO2,
    ALG_SMALLC,
    ALG_WINO4,
    ALG_WINO6,
    ALG_WINO46,
    ALG_COUNT
} conv_alg;

/* oneDNN's data type of the key's tensors (v[K_DT]). */
static inline dnnl_data_type_t kiln_onednn_conv_dt(const int64_t *v) { return v[K_DT] ? dnnl_bf16 : dnnl_f32; }

/* oneDNN's convolution of the key's pass (key->kind), v[K_ALG] its
 * algorithm; the caller owns *pd. Does not block. */
kiln_status kiln_onednn_conv_build(const kiln_onednn_key *key, const_dnnl_primitive_attr_t attr, dnnl_engine_t engine,
                                   dnnl_primitive_desc_t *pd);
/* The reorder between the plain tensor at position v[K_REORDER_POS] of
 * pass v[K_CONV_KIND] and the layout that pass's convolution chose for it. */
kiln_status kiln_onednn_conv_build_reorder(const kiln_onednn_key *key, const_dnnl_primitive_attr_t attr,
                                           dnnl_engine_t engine, dnnl_primitive_desc_t *pd);
/* A pass's execution arguments, in the order of the op's buffers. */
const int *kiln_onednn_conv_args(kiln_onednn_kind kind);
/* The descriptor of the user's tensor at argument position pos of a pass. */
kiln_status kiln_onednn_conv_plain_md(kiln_onednn_kind kind, const int64_t *v, int pos, dnnl_memory_desc_t *md);

#endif

/* Fast CPU kernels on oneDNN's blocked layouts (kiln/tensor.h):
 * KILN_LAYOUT_NCHW16C (what oneDNN's AVX-512 convolutions take) and
 * KILN_LAYOUT_NCHW8C (AVX2's): the reorder to and from NCHW, max pooling
 * and its backward, and the per-channel sum of a convolution's bias
 * gradient. A 4-D f32 (N, C, H, W) tensor with C = B * CB is stored as
 * (N, CB, H, W, B): the B channels of a block sit side by side, so each
 * loop works on B lanes at once and the compiler vectorises it. The
 * kernels are written once (blocked_fast_tmpl.h, B as the macro L) and
 * compiled for B = 16 and B = 8; the entry points below pick by the
 * layout of the tensor that carries it.
 *
 * Results are those of the NCHW kernels: pooling compares in the same
 * order per channel (first maximum wins ties, NaN beats everything) and
 * writes the same indices (h * W + w within the channel's plane), stored
 * in the same blocked order as the values; the sum accumulates in double
 * in a fixed order. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/fast/fast_kernels.h"
#include "kernels/cpu/fast/pool_avx2.h"
#include "kernels/nn_geometry.h"

static bool plain4(const kiln_strided *t, kiln_dtype dtype) {
    if (t->layout != KILN_LAYOUT_STRIDED || t->ndim != 4 || t->dtype != dtype) return false;
    int64_t expect = 1;
    for (int i = 3; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != expect) return false;
        expect *= t->shape[i];
    }
    return true;
}

static bool aligned32(const void *p) { return ((uintptr_t)p & 31) == 0; }

#define ROW_CHUNK 64

#define L 16
#define SFX(name) name##_b16
#define BLOCK_LAYOUT KILN_LAYOUT_NCHW16C
#include "kernels/cpu/fast/blocked_fast_tmpl.h"
#undef L
#undef SFX
#undef BLOCK_LAYOUT

#define L 8
#define SFX(name) name##_b8
#define BLOCK_LAYOUT KILN_LAYOUT_NCHW8C
#include "kernels/cpu/fast/blocked_fast_tmpl.h"
#undef L
#undef SFX
#undef BLOCK_LAYOUT

/* ---- entry points: the instance of the layout's block ------------------------------- */

void kiln_cpu_reorder_blocked(void *dst, const void *src, size_t elem, const int64_t *shape, int block,
                              bool to_blocked) {
    if (block == 8) kiln_cpu_reorder_nchw16c_b8(dst, src, elem, shape, to_blocked);
    else kiln_cpu_reorder_nchw16c_b16(dst, src, elem, shape, to_blocked);
}

void kiln_cpu_reorder_nchw16c(void *dst, const void *src, size_t elem, const int64_t *shape, bool to_blocked) {
    kiln_cpu_reorder_blocked(dst, src, elem, shape, 16, to_blocked);
}

#define BY_BLOCK(layout, fn, a) ((layout) == KILN_LAYOUT_NCHW8C ? fn##_b8(a) : fn##_b16(a))

bool kiln_blocked_max_pool2d_supports(const kiln_op_args *a) {
    return BY_BLOCK(a->in[0].layout, kiln_blocked_max_pool2d_supports, a);
}
kiln_status kiln_blocked_max_pool2d(const kiln_op_args *a) { return BY_BLOCK(a->in[0].layout, kiln_blocked_max_pool2d, a); }
/* relu_max_pool2d: max pooling, then ReLU on the maxima (the two commute);
 * the indices are those max pooling gives for relu(x): where no value of a
 * window is positive, its first element. */
kiln_status kiln_blocked_relu_max_pool2d(const kiln_op_args *a) {
    return BY_BLOCK(a->in[0].layout, kiln_blocked_relu_max_pool2d, a);
}
/* The backward passes go by the indices' layout (the forward's input's). */
bool kiln_blocked_max_pool2d_backward_supports(const kiln_op_args *a) {
    return BY_BLOCK(a->in[1].layout, kiln_blocked_max_pool2d_backward_supports, a);
}
kiln_status kiln_blocked_max_pool2d_backward(const kiln_op_args *a) {
    return BY_BLOCK(a->in[1].layout, kiln_blocked_max_pool2d_backward, a);
}
bool kiln_blocked_relu_max_pool2d_backward_supports(const kiln_op_args *a) {
    return a->n_in >= 3 && BY_BLOCK(a->in[2].layout, kiln_blocked_relu_max_pool2d_backward_supports, a);
}
kiln_status kiln_blocked_relu_max_pool2d_backward(const kiln_op_args *a) {
    return BY_BLOCK(a->in[2].layout, kiln_blocked_relu_max_pool2d_backward, a);
}
kiln_status kiln_blocked_relu_max_pool2d_backward_sum(const kiln_op_args *a, double *part) {
    return a->in[2].layout == KILN_LAYOUT_NCHW8C ? kiln_blocked_relu_max_pool2d_backward_sum_b8(a, part)
                                                 : kiln_blocked_relu_max_pool2d_backward_sum_b16(a, part);
}
int64_t kiln_blocked_relu_pool_backward_plane_b8(const float *go, const int64_t *ix, const float *y, float *dx, int64_t oh,
                                                 int64_t ow, int64_t h, int64_t w, double *sums) {
    return pool_backward_plane_2x2_b8(go, true, oh * ow, ix, y, true, dx, oh, ow, h, w, kiln_pool_avx2_ok(), false, sums);
}
bool kiln_blocked_sum_supports(const kiln_op_args *a) { return BY_BLOCK(a->in[0].layout, kiln_blocked_sum_supports, a); }
kiln_status kiln_blocked_sum(const kiln_op_args *a) { return BY_BLOCK(a->in[0].layout, kiln_blocked_sum, a); }

/* ---- layouts ------------------------------------------------------------------------- */

void kiln_blocked_same_as_input(const kiln_op_args *a, kiln_layout *out) {
    for (int i = 0; i < a->n_out; i++) out[i] = a->in[0].layout;
}

void kiln_blocked_pool_backward_layout(const kiln_op_args *a, kiln_layout *out) {
    out[0] = a->in[1].layout; /* the input's layout, which its indices keep */
}

void kiln_blocked_relu_pool_backward_layout(const kiln_op_args *a, kiln_layout *out) {
    out[0] = a->in[2].layout; /* the input's layout, which its indices keep */
}

void kiln_blocked_strided_out(const kiln_op_args *a, kiln_layout *out) {
    for (int i = 0; i < a->n_out; i++) out[i] = KILN_LAYOUT_STRIDED;
}


/* ---- elementwise: ReLU and its backward on any one layout --------------------------- */

void kiln_blocked_relu_layout(const kiln_op_args *a, kiln_layout *out) {
    /* elementwise over the bytes: the output takes the inputs' layout */
    out[0] = a->in[0].layout;
}

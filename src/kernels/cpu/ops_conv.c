/* CPU reference kernels of conv2d (and conv2d_relu, conv2d_relu_max_pool2d) and its two gradients (im2col + blocked
 * GEMM, ops_conv_tmpl.h). f32, f16 and bf16 data are computed in float,
 * f64 in double; the weight gradient is summed over the batch in double.
 * Scratch (converted weight, one image's planes, the column matrix, one
 * image's output) comes from the workspace, sized by the *_workspace fns. */
#include "base/error.h"
#include "kernels/cpu/nn_cpu_util.h"
#include "kernels/cpu/ops_nn_cpu.h"
#include "kernels/conv_pool.h"
#include "kernels/nn_geometry.h"

#define NN_PBLOCK 256

#define NN_T        float
#define NN_FN(name) name##_f
#include "kernels/cpu/ops_conv_tmpl.h"
#undef NN_T
#undef NN_FN

#define NN_T        double
#define NN_FN(name) name##_d
#include "kernels/cpu/ops_conv_tmpl.h"
#undef NN_T
#undef NN_FN

static size_t compute_size(kiln_dtype dt) { return dt == KILN_F64 ? sizeof(double) : sizeof(float); }

size_t kiln_cpu_conv2d_workspace(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *w = &a->in[1], *y = &a->out[0];
    kiln_conv_geom g = kiln_conv_geom_of(a->attrs);
    int64_t O = w->shape[0], K = w->shape[1] * w->shape[2] * w->shape[3], P = y->shape[2] * y->shape[3];
    int64_t elems = O * K + w->shape[1] * x->shape[2] * x->shape[3] + K * P + (O / g.groups) * P;
    return (size_t)elems * compute_size(y->dtype);
}

size_t kiln_cpu_conv2d_grad_input_workspace(const kiln_op_args *a) {
    const kiln_strided *go = &a->in[0], *w = &a->in[1], *dx = &a->out[0];
    kiln_conv_geom g = kiln_conv_geom_of(a->attrs);
    int64_t O = w->shape[0], K = w->shape[1] * w->shape[2] * w->shape[3], P = go->shape[2] * go->shape[3];
    int64_t elems = O * K + (O / g.groups) * P + K * P + w->shape[1] * dx->shape[2] * dx->shape[3];
    return (size_t)elems * compute_size(dx->dtype);
}

size_t kiln_cpu_conv2d_grad_weight_workspace(const kiln_op_args *a) {
    const kiln_strided *go = &a->in[0], *x = &a->in[1], *dw = &a->out[0];
    kiln_conv_geom g = kiln_conv_geom_of(a->attrs);
    int64_t O = dw->shape[0], Cg = dw->shape[1], K = Cg * dw->shape[2] * dw->shape[3];
    int64_t P = go->shape[2] * go->shape[3];
    int64_t elems = (O / g.groups) * P + Cg * x->shape[2] * x->shape[3] + K * P;
    return (size_t)(O * K) * sizeof(double) + (size_t)elems * compute_size(dw->dtype);
}

kiln_status kiln_cpu_conv2d(const kiln_op_args *a) {
    return a->out[0].dtype == KILN_F64 ? conv_forward_d(a, false) : conv_forward_f(a, false);
}

/* conv2d_relu: conv2d's kernel with relu applied as each result is stored
 * (the same workspace as conv2d). */
kiln_status kiln_cpu_conv2d_relu(const kiln_op_args *a) {
    return a->out[0].dtype == KILN_F64 ? conv_forward_d(a, true) : conv_forward_f(a, true);
}

/* conv2d_relu_max_pool2d: conv2d's kernel into the front of the
 * workspace, then relu_max_pool2d's (kernels/conv_pool.h). */
size_t kiln_cpu_conv2d_relu_max_pool2d_workspace(const kiln_op_args *a) {
    kiln_conv_pool_split s;
    kiln_conv_pool_split_of(a, KILN_LAYOUT_STRIDED, &s);
    return kiln_conv_pool_conv_bytes(a) + kiln_cpu_conv2d_workspace(&s.conv);
}

kiln_status kiln_cpu_conv2d_relu_max_pool2d(const kiln_op_args *a) {
    kiln_conv_pool_split s;
    kiln_conv_pool_split_of(a, KILN_LAYOUT_STRIDED, &s);
    KILN_TRY(kiln_cpu_conv2d(&s.conv));
    return kiln_cpu_relu_max_pool2d(&s.pool);
}

/* conv2d_relu_max_pool2d_grad_weight: relu_max_pool2d_backward_sum's
 * kernel into the front of the workspace (and the bias gradient), then
 * conv2d_grad_weight's (kernels/conv_pool.h). */
size_t kiln_cpu_conv2d_relu_max_pool2d_grad_weight_workspace(const kiln_op_args *a) {
    kiln_conv_pool_wgrad_split s;
    kiln_conv_pool_wgrad_split_of(a, KILN_LAYOUT_STRIDED, &s);
    size_t pool = kiln_cpu_pool_backward_workspace(&s.pool), wgrad = kiln_cpu_conv2d_grad_weight_workspace(&s.wgrad);
    return kiln_conv_pool_wgrad_g_bytes(a) + (pool > wgrad ? pool : wgrad);
}

kiln_status kiln_cpu_conv2d_relu_max_pool2d_grad_weight(const kiln_op_args *a) {
    kiln_conv_pool_wgrad_split s;
    kiln_conv_pool_wgrad_split_of(a, KILN_LAYOUT_STRIDED, &s);
    KILN_TRY(kiln_cpu_relu_max_pool2d_backward_sum(&s.pool));
    return kiln_cpu_conv2d_grad_weight(&s.wgrad);
}

kiln_status kiln_cpu_conv2d_grad_input(const kiln_op_args *a) {
    return a->out[0].dtype == KILN_F64 ? conv_grad_input_d(a) : conv_grad_input_f(a);
}

kiln_status kiln_cpu_conv2d_grad_weight(const kiln_op_args *a) {
    return a->out[0].dtype == KILN_F64 ? conv_grad_weight_d(a) : conv_grad_weight_f(a);
}

/* CPU kernels: activations, their backward ops and dropout. Floating
 * dtypes only; computed in double, stored in the output's dtype.
 *
 * The *_BACKWARD ops take (grad, t) with t the forward's output (relu,
 * sigmoid, tanh) or input (leaky_relu, gelu, silu), both with the
 * output's shape and dtype. */
#include <math.h>

#include "kernels/cpu/ew_common.h"
#include "kernels/cpu/ops_elementwise.h"

#define EW_EACH_FLOAT(dt, FN, ...)                                                                           \
    switch (dt) {                                                                                            \
    case KILN_F32:                                                                                           \
        FN(__VA_ARGS__, KILN_F32);                                                                           \
        break;                                                                                               \
    case KILN_F64:                                                                                           \
        FN(__VA_ARGS__, KILN_F64);                                                                           \
        break;                                                                                               \
    case KILN_F16:                                                                                           \
        FN(__VA_ARGS__, KILN_F16);                                                                           \
        break;                                                                                               \
    case KILN_BF16:                                                                                          \
        FN(__VA_ARGS__, KILN_BF16);                                                                          \
        break;                                                                                               \
    default:                                                                                                 \
        return KILN_ERR_UNSUPPORTED;                                                                         \
    }

#define GELU_K0      0.7978845608028654 /* sqrt(2 / pi) */
#define GELU_K1      0.044715
#define INV_SQRT2    0.7071067811865476
#define INV_SQRT_2PI 0.3989422804014327

/* 1 / (1 + e^-x) without overflow for large |x|. */
EW_INLINE double sigmoid(double x) {
    if (x >= 0) return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}

/* attrs.flag != 0: the tanh approximation; else the exact erf form. */
EW_INLINE double gelu(double x, int tanh_form) {
    if (tanh_form) return 0.5 * x * (1.0 + tanh(GELU_K0 * (x + GELU_K1 * x * x * x)));
    return 0.5 * x * (1.0 + erf(x * INV_SQRT2));
}

EW_INLINE double gelu_grad(double x, int tanh_form) {
    if (tanh_form) {
        double t = tanh(GELU_K0 * (x + GELU_K1 * x * x * x));
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_K0 * (1.0 + 3.0 * GELU_K1 * x * x);
    }
    return 0.5 * (1.0 + erf(x * INV_SQRT2)) + x * INV_SQRT_2PI * exp(-0.5 * x * x);
}

enum { A_LEAKY, A_GELU, A_SIGMOID, A_TANH, A_SILU };

EW_INLINE double act_f(int op, double x, const kiln_op_attrs *at) {
    switch (op) {
    case A_LEAKY:
        return x > 0 ? x : x * at->scalar[0];
    case A_GELU:
        return gelu(x, at->flag);
    case A_SIGMOID:
        return sigmoid(x);
    case A_TANH:
        return tanh(x);
    default:
        return x * sigmoid(x);
    }
}

/* g: incoming gradient; t: the saved forward output or input. */
EW_INLINE double act_grad(int op, double g, double t, const kiln_op_attrs *at) {
    switch (op) {
    case A_LEAKY:
        return t > 0 ? g : g * at->scalar[0];
    case A_GELU:
        return g * gelu_grad(t, at->flag);
    case A_SIGMOID:
        return g * t * (1.0 - t);
    case A_TANH:
        return g * (1.0 - t * t);
    default: {
        double s = sigmoid(t);
        return g * s * (1.0 + t * (1.0 - s));
    }
    }
}

EW_INLINE void act_loop(const kiln_op_args *a, int op, kiln_dtype dt) {
    const kiln_strided *v[2] = {&a->out[0], &a->in[0]};
    ew_iter it;
    ew_init(&it, 2, v);
    void *o = a->out[0].data;
    const void *x = a->in[0].data;
    const kiln_op_attrs *at = a->attrs;
    EW_FOR_EACH(it, kiln_cpu_st_f(o, dt, o0, act_f(op, kiln_cpu_ld_f(x, dt, o1), at)));
}

EW_INLINE kiln_status act_run(const kiln_op_args *a, int op) {
    EW_EACH_FLOAT(a->out[0].dtype, act_loop, a, op);
    return KILN_OK;
}

kiln_status kiln_cpu_ew_leaky_relu(const kiln_op_args *a) { return act_run(a, A_LEAKY); }
kiln_status kiln_cpu_ew_gelu(const kiln_op_args *a) { return act_run(a, A_GELU); }
kiln_status kiln_cpu_ew_sigmoid(const kiln_op_args *a) { return act_run(a, A_SIGMOID); }
kiln_status kiln_cpu_ew_tanh(const kiln_op_args *a) { return act_run(a, A_TANH); }
kiln_status kiln_cpu_ew_silu(const kiln_op_args *a) { return act_run(a, A_SILU); }

EW_INLINE void grad_loop(const kiln_op_args *a, int op, kiln_dtype dt) {
    const kiln_strided *v[3] = {&a->out[0], &a->in[0], &a->in[1]};
    ew_iter it;
    ew_init(&it, 3, v);
    void *o = a->out[0].data;
    const void *g = a->in[0].data, *t = a->in[1].data;
    const kiln_op_attrs *at = a->attrs;
    EW_FOR_EACH(it, kiln_cpu_st_f(o, dt, o0, act_grad(op, kiln_cpu_ld_f(g, dt, o1), kiln_cpu_ld_f(t, dt, o2), at)));
}

EW_INLINE kiln_status grad_run(const kiln_op_args *a, int op) {
    EW_EACH_FLOAT(a->out[0].dtype, grad_loop, a, op);
    return KILN_OK;
}

/* relu's backward passes the gradient where the output is positive. */
EW_INLINE void relu_grad_loop(const kiln_op_args *a, int unused, kiln_dtype dt) {
    (void)unused;
    const kiln_strided *v[3] = {&a->out[0], &a->in[0], &a->in[1]};
    ew_iter it;
    ew_init(&it, 3, v);
    void *o = a->out[0].data;
    const void *g = a->in[0].data, *t = a->in[1].data;
    EW_FOR_EACH(it, kiln_cpu_st_f(o, dt, o0, kiln_cpu_ld_f(t, dt, o2) > 0 ? kiln_cpu_ld_f(g, dt, o1) : 0.0));
}

kiln_status kiln_cpu_ew_relu_backward(const kiln_op_args *a) {
    EW_EACH_FLOAT(a->out[0].dtype, relu_grad_loop, a, 0);
    return KILN_OK;
}
kiln_status kiln_cpu_ew_leaky_relu_backward(const kiln_op_args *a) { return grad_run(a, A_LEAKY); }
kiln_status kiln_cpu_ew_gelu_backward(const kiln_op_args *a) { return grad_run(a, A_GELU); }
kiln_status kiln_cpu_ew_sigmoid_backward(const kiln_op_args *a) { return grad_run(a, A_SIGMOID); }
kiln_status kiln_cpu_ew_tanh_backward(const kiln_op_args *a) { return grad_run(a, A_TANH); }
kiln_status kiln_cpu_ew_silu_backward(const kiln_op_args *a) { return grad_run(a, A_SILU); }

/* ---- Dropout ------------------------------------------------------------------------------
 * Element i (the output's flat row-major index) is kept iff
 * uniform(word i of attrs.rng) >= p, and scaled by 1 / (1 - p). The same
 * attrs applied to the gradient give the same mask (the backward). */
EW_INLINE void dropout_loop(const kiln_op_args *a, int unused, kiln_dtype dt) {
    (void)unused;
    const kiln_strided *v[2] = {&a->out[0], &a->in[0]};
    ew_iter it;
    ew_init(&it, 2, v);
    void *o = a->out[0].data;
    const void *x = a->in[0].data;
    const kiln_rng *rng = &a->attrs->rng;
    double p = a->attrs->scalar[0];
    double scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
    EW_FOR_EACH(it, {
        bool keep = (double)kiln_rng_u32_to_uniform(kiln_rng_u32_at(rng, (uint64_t)flat)) >= p;
        kiln_cpu_st_f(o, dt, o0, keep ? kiln_cpu_ld_f(x, dt, o1) * scale : 0.0);
    });
}

kiln_status kiln_cpu_ew_dropout(const kiln_op_args *a) {
    EW_EACH_FLOAT(a->out[0].dtype, dropout_loop, a, 0);
    return KILN_OK;
}

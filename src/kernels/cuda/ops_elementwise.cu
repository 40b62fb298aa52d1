/* CUDA kernels of the elementwise op group (cuda_ops.h): arithmetic, scalar
 * ops, unary math, clamp, relu, comparisons, isfinite, where, cast, copy,
 * activations and their backward ops, dropout and the in-place ops. The
 * semantics are those of the CPU reference kernels (kernels/cpu/
 * ops_elementwise.c, ops_activation.c), op for op and dtype for dtype:
 *
 *   - every operand has out[0]'s shape (broadcast inputs arrive with
 *     stride-0 dims) and any strides; one grid-stride loop over the flat
 *     row-major index of the output, dims merged where all operands allow
 *     (cuda_dtype.h's geom);
 *   - f32/f16/bf16 compute in float, f64 in double (cuda_dtype.h); the
 *     scalar ops (add_scalar, mul_scalar), clamp and dropout's scaling
 *     compute in double as the CPU does, so their f32 results are the
 *     CPU's bit for bit; integers compute in int64 with wrapping
 *     arithmetic, stores wrap to the dtype's width;
 *   - NaN propagates through arithmetic, clamp and relu (relu keeps NaN);
 *   - dropout keeps element i (the output's flat index) iff the uniform
 *     from word i of attrs.rng is >= p (src/base/philox.h, as the CPU's
 *     kiln_rng_u32_at), so both backends draw the same mask;
 *   - cast and copy are the tensor layer's strided copy (same conversions
 *     as kiln_to).
 * Every kernel is enqueued on args->stream of the device that owns
 * out[0]; nothing blocks the host. */
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_dtype.h"
#include "kernels/cuda/cuda_ops.h"

namespace {

using namespace kiln_cuda;

/* ---- Launching ----------------------------------------------------------------------- */

/* One grid-stride loop over the geometry; f(flat, offsets) per element. */
template <class F> __global__ void ew_kernel(F f, geom g) {
    for (int64_t i = global_thread(); i < g.numel; i += global_stride()) {
        int64_t off[kMaxOperands];
        g.offsets(i, off);
        f(i, off);
    }
}

template <class F> kiln_status launch_ew(const F &f, const geom &g, const kiln_op_args *a, const char *what) {
    if (g.numel == 0) return KILN_OK;
    device_guard guard;
    KILN_TRY(guard.enter(a->out[0].data));
    auto *k = &ew_kernel<F>;
    KILN_LAUNCH(k, grid_for(g.numel), kThreads, 0, a->stream, f, g);
    KILN_LAUNCH_CHECK(guard.device, what);
    return KILN_OK;
}

kiln_status unsupported(const char *op, kiln_dtype d) {
    return KILN_RAISE(KILN_ERR_UNSUPPORTED, "cast the inputs with kiln_to to a supported dtype",
                      "CUDA %s kernel: dtype %s is not supported", op, kiln_dtype_name(d));
}

/* Instantiate FN<dtype>(args...) for the dtype d. */
#define EW_CASE(D, FN, ...)                                                                                  \
    case D:                                                                                                  \
        return FN<D>(__VA_ARGS__);
#define EW_DISPATCH_FLOAT(d, name, FN, ...)                                                                  \
    switch (d) {                                                                                             \
        EW_CASE(KILN_F32, FN, __VA_ARGS__)                                                                   \
        EW_CASE(KILN_F64, FN, __VA_ARGS__)                                                                   \
        EW_CASE(KILN_F16, FN, __VA_ARGS__)                                                                   \
        EW_CASE(KILN_BF16, FN, __VA_ARGS__)                                                                  \
    default:                                                                                                 \
        return unsupported(name, d);                                                                         \
    }
#define EW_DISPATCH_ALL(d, name, FN, ...)                                                                    \
    switch (d) {                                                                                             \
        EW_CASE(KILN_F32, FN, __VA_ARGS__)                                                                   \
        EW_CASE(KILN_F64, FN, __VA_ARGS__)                                                                   \
        EW_CASE(KILN_F16, FN, __VA_ARGS__)                                                                   \
        EW_CASE(KILN_BF16, FN, __VA_ARGS__)                                                                  \
        EW_CASE(KILN_I32, FN, __VA_ARGS__)                                                                   \
        EW_CASE(KILN_I64, FN, __VA_ARGS__)                                                                   \
        EW_CASE(KILN_U8, FN, __VA_ARGS__)                                                                    \
        EW_CASE(KILN_BOOL, FN, __VA_ARGS__)                                                                  \
    default:                                                                                                 \
        return unsupported(name, d);                                                                         \
    }

/* ---- Binary arithmetic ---------------------------------------------------------------- */

enum { B_ADD, B_SUB, B_MUL, B_DIV, B_POW };

KILN_HD inline float bin_val(int op, float x, float y) {
    switch (op) {
    case B_ADD:
        return x + y;
    case B_SUB:
        return x - y;
    case B_MUL:
        return x * y;
    case B_DIV:
        return x / y;
    default:
        return m_pow(x, y);
    }
}

KILN_HD inline double bin_val(int op, double x, double y) {
    switch (op) {
    case B_ADD:
        return x + y;
    case B_SUB:
        return x - y;
    case B_MUL:
        return x * y;
    case B_DIV:
        return x / y;
    default:
        return m_pow(x, y);
    }
}

/* Wrapping (through uint64); div and pow are floating-only ops. */
KILN_HD inline int64_t bin_val(int op, int64_t x, int64_t y) {
    uint64_t a = (uint64_t)x, b = (uint64_t)y;
    switch (op) {
    case B_ADD:
        return (int64_t)(a + b);
    case B_SUB:
        return (int64_t)(a - b);
    default:
        return (int64_t)(a * b);
    }
}

template <int D> struct bin_fn {
    int op;
    void *o;
    const void *x, *y;
    __device__ void operator()(int64_t, const int64_t *off) const {
        typedef dt<D> T;
        T::st(o, off[0], bin_val(op, T::ld(x, off[1]), T::ld(y, off[2])));
    }
};

template <int D> kiln_status run_bin(const kiln_op_args *a, int op) {
    const kiln_strided *v[3] = {&a->out[0], &a->in[0], &a->in[1]};
    bin_fn<D> f = {op, a->out[0].data, a->in[0].data, a->in[1].data};
    return launch_ew(f, make_geom(3, v), a, "bin_fn kernel");
}

kiln_status bin_any(const kiln_op_args *a, int op,
                    const char *name){EW_DISPATCH_ALL(a->out[0].dtype, name, run_bin, a, op)} kiln_status
    bin_float(const kiln_op_args *a, int op,
              const char *name){EW_DISPATCH_FLOAT(a->out[0].dtype, name, run_bin, a, op)}

kiln_status ew_add(const kiln_op_args *a) {
    return bin_any(a, B_ADD, "add");
}
kiln_status ew_sub(const kiln_op_args *a) { return bin_any(a, B_SUB, "sub"); }
kiln_status ew_mul(const kiln_op_args *a) { return bin_any(a, B_MUL, "mul"); }
kiln_status ew_div(const kiln_op_args *a) { return bin_float(a, B_DIV, "div"); }
kiln_status ew_pow(const kiln_op_args *a) { return bin_float(a, B_POW, "pow"); }
kiln_status ew_add_(const kiln_op_args *a) { return bin_any(a, B_ADD, "add_"); }
kiln_status ew_mul_(const kiln_op_args *a) { return bin_any(a, B_MUL, "mul_"); }

/* ---- Unary ------------------------------------------------------------------------------ */

enum { U_ADDS, U_MULS, U_POWS, U_NEG, U_EXP, U_LOG, U_SQRT, U_RSQRT, U_ABS, U_CLAMP, U_RELU };

/* The op's scalars, prepared on the host: s0/s1 the attrs' doubles,
 * i0/i1 their integer forms (add/mul: saturated; clamp: ceil of the lower
 * and floor of the upper bound), flag clamp's bound bits. */
struct un_params {
    int op, flag;
    double s0, s1;
    int64_t i0, i1;
};

template <class C> KILN_HD inline C un_float(const un_params &p, C x) {
    switch (p.op) {
    case U_ADDS:
        return (C)((double)x + p.s0);
    case U_MULS:
        return (C)((double)x * p.s0);
    case U_POWS:
        return m_pow(x, (C)p.s0);
    case U_NEG:
        return -x;
    case U_EXP:
        return m_exp(x);
    case U_LOG:
        return m_log(x);
    case U_SQRT:
        return m_sqrt(x);
    case U_RSQRT:
        return (C)1 / m_sqrt(x);
    case U_ABS:
        return m_fabs(x);
    case U_CLAMP: {
        double v = x;
        if ((p.flag & 1) && v < p.s0) v = p.s0;
        if ((p.flag & 2) && v > p.s1) v = p.s1;
        return (C)v;
    }
    default:
        return x > 0 || x != x ? x : (C)0; /* relu keeps NaN */
    }
}

KILN_HD inline int64_t un_int(const un_params &p, int64_t x) {
    uint64_t u = (uint64_t)x;
    switch (p.op) {
    case U_ADDS:
        return (int64_t)(u + (uint64_t)p.i0);
    case U_MULS:
        return (int64_t)(u * (uint64_t)p.i0);
    case U_NEG:
        return (int64_t)(0 - u);
    case U_ABS:
        return x < 0 ? (int64_t)(0 - u) : x;
    case U_CLAMP:
        if ((p.flag & 1) && (double)x < p.s0) x = p.i0;
        if ((p.flag & 2) && (double)x > p.s1) x = p.i1;
        return x;
    case U_RELU:
        return x > 0 ? x : 0;
    default:
        return x;
    }
}

KILN_HD inline float un_val(const un_params &p, float x) { return un_float<float>(p, x); }
KILN_HD inline double un_val(const un_params &p, double x) { return un_float<double>(p, x); }
KILN_HD inline int64_t un_val(const un_params &p, int64_t x) { return un_int(p, x); }

template <int D> struct un_fn {
    un_params p;
    void *o;
    const void *x;
    __device__ void operator()(int64_t, const int64_t *off) const {
        typedef dt<D> T;
        T::st(o, off[0], un_val(p, T::ld(x, off[1])));
    }
};

template <int D> kiln_status run_un(const kiln_op_args *a, const un_params *p) {
    const kiln_strided *v[2] = {&a->out[0], &a->in[0]};
    un_fn<D> f = {*p, a->out[0].data, a->in[0].data};
    return launch_ew(f, make_geom(2, v), a, "un_fn kernel");
}

kiln_status un_run(const kiln_op_args *a, int op, const char *name) {
    const kiln_op_attrs *at = a->attrs;
    un_params p;
    memset(&p, 0, sizeof p);
    p.op = op;
    p.flag = at->flag;
    p.s0 = at->scalar[0];
    p.s1 = at->scalar[1];
    if (op == U_CLAMP) {
        p.i0 = f64_to_i64_sat(ceil(at->scalar[0]));
        p.i1 = f64_to_i64_sat(floor(at->scalar[1]));
    } else {
        p.i0 = f64_to_i64_sat(at->scalar[0]);
    }
    kiln_dtype d = a->out[0].dtype;
    bool float_only = op == U_POWS || op == U_EXP || op == U_LOG || op == U_SQRT || op == U_RSQRT;
    if (float_only) EW_DISPATCH_FLOAT(d, name, run_un, a, &p)
    EW_DISPATCH_ALL(d, name, run_un, a, &p)
}

kiln_status ew_add_scalar(const kiln_op_args *a) { return un_run(a, U_ADDS, "add_scalar"); }
kiln_status ew_mul_scalar(const kiln_op_args *a) { return un_run(a, U_MULS, "mul_scalar"); }
kiln_status ew_pow_scalar(const kiln_op_args *a) { return un_run(a, U_POWS, "pow_scalar"); }
kiln_status ew_neg(const kiln_op_args *a) { return un_run(a, U_NEG, "neg"); }
kiln_status ew_exp(const kiln_op_args *a) { return un_run(a, U_EXP, "exp"); }
kiln_status ew_log(const kiln_op_args *a) { return un_run(a, U_LOG, "log"); }
kiln_status ew_sqrt(const kiln_op_args *a) { return un_run(a, U_SQRT, "sqrt"); }
kiln_status ew_rsqrt(const kiln_op_args *a) { return un_run(a, U_RSQRT, "rsqrt"); }
kiln_status ew_abs(const kiln_op_args *a) { return un_run(a, U_ABS, "abs"); }
kiln_status ew_clamp(const kiln_op_args *a) { return un_run(a, U_CLAMP, "clamp"); }
kiln_status ew_relu(const kiln_op_args *a) { return un_run(a, U_RELU, "relu"); }
kiln_status ew_relu_(const kiln_op_args *a) { return un_run(a, U_RELU, "relu_"); }

/* ---- Comparisons and isfinite (bool out; the inputs share one dtype) ----------------------- */

enum { C_EQ, C_NE, C_LT, C_LE, C_GT, C_GE };

template <class C> KILN_HD inline bool cmp_val(int op, C x, C y) {
    switch (op) {
    case C_EQ:
        return x == y;
    case C_NE:
        return x != y;
    case C_LT:
        return x < y;
    case C_LE:
        return x <= y;
    case C_GT:
        return x > y;
    default:
        return x >= y;
    }
}

template <int D> struct cmp_fn {
    int op;
    uint8_t *o;
    const void *x, *y;
    __device__ void operator()(int64_t, const int64_t *off) const {
        typedef dt<D> T;
        o[off[0]] = (uint8_t)cmp_val<typename T::C>(op, T::ld(x, off[1]), T::ld(y, off[2]));
    }
};

template <int D> kiln_status run_cmp(const kiln_op_args *a, int op) {
    const kiln_strided *v[3] = {&a->out[0], &a->in[0], &a->in[1]};
    cmp_fn<D> f = {op, (uint8_t *)a->out[0].data, a->in[0].data, a->in[1].data};
    return launch_ew(f, make_geom(3, v), a, "cmp_fn kernel");
}

kiln_status cmp_run(const kiln_op_args *a, int op,
                    const char *name){EW_DISPATCH_ALL(a->in[0].dtype, name, run_cmp, a, op)}

kiln_status ew_eq(const kiln_op_args *a) {
    return cmp_run(a, C_EQ, "eq");
}
kiln_status ew_ne(const kiln_op_args *a) { return cmp_run(a, C_NE, "ne"); }
kiln_status ew_lt(const kiln_op_args *a) { return cmp_run(a, C_LT, "lt"); }
kiln_status ew_le(const kiln_op_args *a) { return cmp_run(a, C_LE, "le"); }
kiln_status ew_gt(const kiln_op_args *a) { return cmp_run(a, C_GT, "gt"); }
kiln_status ew_ge(const kiln_op_args *a) { return cmp_run(a, C_GE, "ge"); }

/* Finite iff x - x == 0 (inf - inf and NaN - NaN are NaN); integers always. */
template <int D> struct isfinite_fn {
    uint8_t *o;
    const void *x;
    __device__ void operator()(int64_t, const int64_t *off) const {
        typedef dt<D> T;
        if (T::is_float) {
            double v = T::ld_f64(x, off[1]);
            o[off[0]] = (uint8_t)(v - v == 0.0);
        } else {
            o[off[0]] = 1;
        }
    }
};

template <int D> kiln_status run_isfinite(const kiln_op_args *a) {
    const kiln_strided *v[2] = {&a->out[0], &a->in[0]};
    isfinite_fn<D> f = {(uint8_t *)a->out[0].data, a->in[0].data};
    return launch_ew(f, make_geom(2, v), a, "isfinite_fn kernel");
}

kiln_status ew_isfinite(const kiln_op_args *a) {
    EW_DISPATCH_ALL(a->in[0].dtype, "isfinite", run_isfinite, a)
}

/* ---- where, cast, copy ------------------------------------------------------------------- */

/* where(cond, x, y): the chosen element's bits, any dtype (by size). */
template <class U> struct where_fn {
    U *o;
    const uint8_t *c;
    const U *x, *y;
    __device__ void operator()(int64_t, const int64_t *off) const {
        o[off[0]] = c[off[1]] ? x[off[2]] : y[off[3]];
    }
};

template <class U> kiln_status run_where(const kiln_op_args *a) {
    const kiln_strided *v[4] = {&a->out[0], &a->in[0], &a->in[1], &a->in[2]};
    where_fn<U> f = {(U *)a->out[0].data, (const uint8_t *)a->in[0].data, (const U *)a->in[1].data,
                     (const U *)a->in[2].data};
    return launch_ew(f, make_geom(4, v), a, "where_fn kernel");
}

kiln_status ew_where(const kiln_op_args *a) {
    switch (kiln_dtype_size(a->out[0].dtype)) {
    case 1:
        return run_where<uint8_t>(a);
    case 2:
        return run_where<uint16_t>(a);
    case 4:
        return run_where<uint32_t>(a);
    case 8:
        return run_where<uint64_t>(a);
    default:
        return unsupported("where", a->out[0].dtype);
    }
}

/* The tensor layer's strided copy: the conversions of kiln_to. */
kiln_status ew_cast(const kiln_op_args *a) {
    return kiln_cuda_tensor_kernels()->copy_strided(&a->out[0], &a->in[0], a->stream);
}
kiln_status ew_copy(const kiln_op_args *a) {
    return kiln_cuda_tensor_kernels()->copy_strided(&a->out[0], &a->in[0], a->stream);
}

/* ---- Activations (floating dtypes) --------------------------------------------------------- */

enum { A_LEAKY, A_GELU, A_SIGMOID, A_TANH, A_SILU, A_RELU_GRAD };

/* 1 / (1 + e^-x) without overflow for large |x|. */
template <class C> KILN_HD inline C sigmoid_of(C x) {
    if (x >= 0) return (C)1 / ((C)1 + m_exp(-x));
    C e = m_exp(x);
    return e / ((C)1 + e);
}

/* flag != 0: the tanh approximation; else the exact erf form. */
template <class C> KILN_HD inline C gelu_of(C x, int tanh_form) {
    const C k0 = (C)0.7978845608028654, k1 = (C)0.044715, inv_sqrt2 = (C)0.7071067811865476;
    if (tanh_form) return (C)0.5 * x * ((C)1 + m_tanh(k0 * (x + k1 * x * x * x)));
    return (C)0.5 * x * ((C)1 + m_erf(x * inv_sqrt2));
}

template <class C> KILN_HD inline C gelu_grad_of(C x, int tanh_form) {
    const C k0 = (C)0.7978845608028654, k1 = (C)0.044715, inv_sqrt2 = (C)0.7071067811865476,
            inv_sqrt_2pi = (C)0.3989422804014327;
    if (tanh_form) {
        C t = m_tanh(k0 * (x + k1 * x * x * x));
        return (C)0.5 * ((C)1 + t) + (C)0.5 * x * ((C)1 - t * t) * k0 * ((C)1 + (C)3 * k1 * x * x);
    }
    return (C)0.5 * ((C)1 + m_erf(x * inv_sqrt2)) + x * inv_sqrt_2pi * m_exp((C)-0.5 * x * x);
}

struct act_params {
    int op, flag;
    double slope;
};

template <class C> KILN_HD inline C act_val(const act_params &p, C x) {
    switch (p.op) {
    case A_LEAKY:
        return x > 0 ? x : (C)((double)x * p.slope);
    case A_GELU:
        return gelu_of(x, p.flag);
    case A_SIGMOID:
        return sigmoid_of(x);
    case A_TANH:
        return m_tanh(x);
    default:
        return x * sigmoid_of(x);
    }
}

/* g: incoming gradient; t: the saved forward output (relu, sigmoid, tanh)
 * or input (leaky_relu, gelu, silu). */
template <class C> KILN_HD inline C act_grad_val(const act_params &p, C g, C t) {
    switch (p.op) {
    case A_LEAKY:
        return t > 0 ? g : (C)((double)g * p.slope);
    case A_GELU:
        return g * gelu_grad_of(t, p.flag);
    case A_SIGMOID:
        return g * t * ((C)1 - t);
    case A_TANH:
        return g * ((C)1 - t * t);
    case A_SILU: {
        C s = sigmoid_of(t);
        return g * s * ((C)1 + t * ((C)1 - s));
    }
    default:
        return t > 0 ? g : (C)0; /* relu: the gradient where the output is positive */
    }
}

template <int D> struct act_fn {
    act_params p;
    void *o;
    const void *x;
    __device__ void operator()(int64_t, const int64_t *off) const {
        typedef dt<D> T;
        T::st(o, off[0], act_val(p, T::ld(x, off[1])));
    }
};

template <int D> struct act_grad_fn {
    act_params p;
    void *o;
    const void *g, *t;
    __device__ void operator()(int64_t, const int64_t *off) const {
        typedef dt<D> T;
        T::st(o, off[0], act_grad_val(p, T::ld(g, off[1]), T::ld(t, off[2])));
    }
};

template <int D> kiln_status run_act(const kiln_op_args *a, const act_params *p) {
    const kiln_strided *v[2] = {&a->out[0], &a->in[0]};
    act_fn<D> f = {*p, a->out[0].data, a->in[0].data};
    return launch_ew(f, make_geom(2, v), a, "act_fn kernel");
}

template <int D> kiln_status run_act_grad(const kiln_op_args *a, const act_params *p) {
    const kiln_strided *v[3] = {&a->out[0], &a->in[0], &a->in[1]};
    act_grad_fn<D> f = {*p, a->out[0].data, a->in[0].data, a->in[1].data};
    return launch_ew(f, make_geom(3, v), a, "act_grad_fn kernel");
}

kiln_status act_run(const kiln_op_args *a, int op, const char *name) {
    act_params p = {op, a->attrs->flag, a->attrs->scalar[0]};
    EW_DISPATCH_FLOAT(a->out[0].dtype, name, run_act, a, &p)
}

kiln_status grad_run(const kiln_op_args *a, int op, const char *name) {
    act_params p = {op, a->attrs->flag, a->attrs->scalar[0]};
    EW_DISPATCH_FLOAT(a->out[0].dtype, name, run_act_grad, a, &p)
}

kiln_status ew_leaky_relu(const kiln_op_args *a) { return act_run(a, A_LEAKY, "leaky_relu"); }
kiln_status ew_gelu(const kiln_op_args *a) { return act_run(a, A_GELU, "gelu"); }
kiln_status ew_sigmoid(const kiln_op_args *a) { return act_run(a, A_SIGMOID, "sigmoid"); }
kiln_status ew_tanh(const kiln_op_args *a) { return act_run(a, A_TANH, "tanh"); }
kiln_status ew_silu(const kiln_op_args *a) { return act_run(a, A_SILU, "silu"); }
kiln_status ew_relu_backward(const kiln_op_args *a) { return grad_run(a, A_RELU_GRAD, "relu_backward"); }
kiln_status ew_leaky_relu_backward(const kiln_op_args *a) {
    return grad_run(a, A_LEAKY, "leaky_relu_backward");
}
kiln_status ew_gelu_backward(const kiln_op_args *a) { return grad_run(a, A_GELU, "gelu_backward"); }
kiln_status ew_sigmoid_backward(const kiln_op_args *a) { return grad_run(a, A_SIGMOID, "sigmoid_backward"); }
kiln_status ew_tanh_backward(const kiln_op_args *a) { return grad_run(a, A_TANH, "tanh_backward"); }
kiln_status ew_silu_backward(const kiln_op_args *a) { return grad_run(a, A_SILU, "silu_backward"); }

/* ---- Dropout --------------------------------------------------------------------------------
 * Element i is kept iff (double)uniform(word i of the draw) >= p and then
 * scaled by 1 / (1 - p) in double, as the CPU kernel. A thread takes the
 * four elements of one Philox block (words 4b .. 4b+3 of the draw starting
 * at rng.offset), so each block is computed once. */
template <int D>
__global__ void dropout_kernel(void *o, const void *x, geom g, kiln_rng rng, const kiln_rng *rng_dev, double p,
                               double scale) {
    if (rng_dev) rng = *rng_dev; /* a CUDA graph's per-replay position (op_args.h) */
    int64_t blocks = (g.numel + 3) / 4;
    for (int64_t b = global_thread(); b < blocks; b += global_stride()) {
        uint32_t words[4];
        kiln_philox_stream_block(rng.seed, rng.subsequence, rng.offset + (uint64_t)b, words);
        for (int k = 0; k < 4; k++) {
            int64_t i = 4 * b + k;
            if (i >= g.numel) break;
            int64_t off[kMaxOperands];
            g.offsets(i, off);
            bool keep = (double)kiln_philox_uniform(words[k]) >= p;
            dt<D>::st_f64(o, off[0], keep ? dt<D>::ld_f64(x, off[1]) * scale : 0.0);
        }
    }
}

template <int D> kiln_status run_dropout(const kiln_op_args *a) {
    const kiln_strided *v[2] = {&a->out[0], &a->in[0]};
    geom g = make_geom(2, v);
    if (g.numel == 0) return KILN_OK;
    double p = a->attrs->scalar[0];
    double scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
    device_guard guard;
    KILN_TRY(guard.enter(a->out[0].data));
    auto *k = &dropout_kernel<D>;
    KILN_LAUNCH(k, grid_for((g.numel + 3) / 4), kThreads, 0, a->stream, a->out[0].data, a->in[0].data, g,
                a->attrs->rng, a->attrs->rng_dev, p, scale);
    KILN_LAUNCH_CHECK(guard.device, "dropout_kernel");
    return KILN_OK;
}

kiln_status ew_dropout(const kiln_op_args *a) {
    EW_DISPATCH_FLOAT(a->out[0].dtype, "dropout", run_dropout, a)
}

} // namespace

/* The exported kernels (cuda_ops.h), one per row of KILN_CUDA_EW_KERNELS;
 * src/ops/cuda_table_elementwise_cuda.c points the table at them. */
#define KILN_CUDA_EW_EXPORT(ID, name, dtypes)                                                                \
    extern "C" kiln_status kiln_cuda_ew_##name(const kiln_op_args *a) { return ew_##name(a); }
KILN_CUDA_EW_KERNELS(KILN_CUDA_EW_EXPORT)
#undef KILN_CUDA_EW_EXPORT

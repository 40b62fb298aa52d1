/* Harness cases of the elementwise group: arithmetic with broadcasting and
 * type promotion, scalar ops, unary math, clamp, where, cast, comparisons,
 * activations and their backward ops, dropout, views' backward, copy and
 * the in-place ops. Every file-scope name starts with elementwise_ (the
 * oracle test includes every cases file into one translation unit). */
#include <math.h>
#include <string.h>

#include "ops/harness.h"

/* ---- Float64 scalar references ----------------------------------------------------------- */

static double elementwise_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

static double elementwise_gelu(double x, int tanh_form) {
    if (tanh_form) return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
}

/* d/dx of the activations by definition, for the *_backward ops. */
static double elementwise_gelu_grad(double x, int tanh_form) {
    if (tanh_form) {
        double k = sqrt(2.0 / M_PI), t = tanh(k * (x + 0.044715 * x * x * x));
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
    }
    return 0.5 * (1 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2 * M_PI);
}

/* Unary ops by name: the value of y = op(x). */
static double elementwise_unary_value(const char *name, double x, const kiln_op_attrs *at) {
    if (!strcmp(name, "add_scalar")) return x + at->scalar[0];
    if (!strcmp(name, "mul_scalar")) return x * at->scalar[0];
    if (!strcmp(name, "pow_scalar")) return pow(x, at->scalar[0]);
    if (!strcmp(name, "neg")) return -x;
    if (!strcmp(name, "exp")) return exp(x);
    if (!strcmp(name, "log")) return log(x);
    if (!strcmp(name, "sqrt")) return sqrt(x);
    if (!strcmp(name, "rsqrt")) return 1.0 / sqrt(x);
    if (!strcmp(name, "abs")) return fabs(x);
    if (!strcmp(name, "relu") || !strcmp(name, "relu_")) return x > 0 ? x : 0;
    if (!strcmp(name, "leaky_relu")) return x > 0 ? x : x * at->scalar[0];
    if (!strcmp(name, "gelu")) return elementwise_gelu(x, at->flag);
    if (!strcmp(name, "sigmoid")) return elementwise_sigmoid(x);
    if (!strcmp(name, "tanh")) return tanh(x);
    if (!strcmp(name, "silu")) return x * elementwise_sigmoid(x);
    if (!strcmp(name, "clamp")) {
        if ((at->flag & 1) && x < at->scalar[0]) x = at->scalar[0];
        if ((at->flag & 2) && x > at->scalar[1]) x = at->scalar[1];
        return x;
    }
    return x; /* copy, views */
}

static kiln_tensor *elementwise_run_unary(kh_run *r) {
    const char *n = r->c->name;
    const kiln_op_attrs *at = r->attrs;
    kiln_tensor *x = r->in[0];
    if (!strcmp(n, "add_scalar")) return kiln_add_scalar(x, at->scalar[0]);
    if (!strcmp(n, "mul_scalar")) return kiln_mul_scalar(x, at->scalar[0]);
    if (!strcmp(n, "pow_scalar")) return kiln_pow_scalar(x, at->scalar[0]);
    if (!strcmp(n, "neg")) return kiln_neg(x);
    if (!strcmp(n, "exp")) return kiln_exp(x);
    if (!strcmp(n, "log")) return kiln_log(x);
    if (!strcmp(n, "sqrt")) return kiln_sqrt(x);
    if (!strcmp(n, "rsqrt")) return kiln_rsqrt(x);
    if (!strcmp(n, "abs")) return kiln_abs(x);
    if (!strcmp(n, "relu")) return kiln_relu(x);
    if (!strcmp(n, "leaky_relu")) return kiln_leaky_relu(x, at->scalar[0]);
    if (!strcmp(n, "gelu")) return kiln_gelu(x, at->flag != 0);
    if (!strcmp(n, "sigmoid")) return kiln_sigmoid(x);
    if (!strcmp(n, "tanh")) return kiln_tanh(x);
    if (!strcmp(n, "silu")) return kiln_silu(x);
    if (!strcmp(n, "isfinite")) return kiln_isfinite(x);
    if (!strcmp(n, "clamp"))
        return kiln_clamp(x, (at->flag & 1) ? at->scalar[0] : NAN, (at->flag & 2) ? at->scalar[1] : NAN);
    if (!strcmp(n, "copy")) return kiln_contiguous(x);
    if (!strcmp(n, "relu_")) { /* on a differentiable copy: run() must not modify its input */
        kiln_tensor *c = kiln_mul_scalar(x, 1.0);
        return c ? kiln_relu_(c) : NULL;
    }
    return NULL;
}

/* y = op(x), same shape; the output dtype is the run dtype unless the case
 * says otherwise through attrs.dtype (nonzero n_ints marks it). */
static void elementwise_ref_unary(kh_ref *r) {
    int as = r->attrs->n_ints ? KH_AS(r->attrs->dtype) : 0;
    kiln_dtype odt = as ? r->attrs->dtype : r->dtype;
    double *y = kh_out(r, 0, r->shape[0], as);
    for (int64_t i = 0; i < kh_numel(r->shape[0]); i++) {
        double v = elementwise_unary_value(r->c->name, r->in[0][i], r->attrs);
        if (!kiln_dtype_is_floating(odt)) v = trunc(v); /* integer results */
        y[i] = v;
    }
}

static void elementwise_ref_isfinite(kh_ref *r) {
    double *y = kh_out(r, 0, r->shape[0], KH_AS(KILN_BOOL));
    for (int64_t i = 0; i < kh_numel(r->shape[0]); i++) y[i] = isfinite(r->in[0][i]);
}

/* ---- Binary ------------------------------------------------------------------------------------ */

static kiln_tensor *elementwise_run_binary(kh_run *r) {
    const char *n = r->c->name;
    kiln_tensor *a = r->in[0], *b = r->in[1];
    if (!strcmp(n, "add")) return kiln_add(a, b);
    if (!strcmp(n, "sub")) return kiln_sub(a, b);
    if (!strcmp(n, "mul")) return kiln_mul(a, b);
    if (!strcmp(n, "div")) return kiln_div(a, b);
    if (!strcmp(n, "pow")) return kiln_pow(a, b);
    if (!strcmp(n, "eq")) return kiln_eq(a, b);
    if (!strcmp(n, "ne")) return kiln_ne(a, b);
    if (!strcmp(n, "lt")) return kiln_lt(a, b);
    if (!strcmp(n, "le")) return kiln_le(a, b);
    if (!strcmp(n, "gt")) return kiln_gt(a, b);
    if (!strcmp(n, "ge")) return kiln_ge(a, b);
    kiln_tensor *c = kiln_mul_scalar(a, 1.0); /* in place on a differentiable copy */
    if (!c) return NULL;
    if (!strcmp(n, "add_")) return kiln_add_(c, b);
    if (!strcmp(n, "mul_")) return kiln_mul_(c, b);
    return NULL;
}

static double elementwise_binary_value(const char *n, double a, double b) {
    if (!strcmp(n, "add") || !strcmp(n, "add_")) return a + b;
    if (!strcmp(n, "sub")) return a - b;
    if (!strcmp(n, "mul") || !strcmp(n, "mul_")) return a * b;
    if (!strcmp(n, "div")) return a / b;
    if (!strcmp(n, "pow")) return pow(a, b);
    if (!strcmp(n, "eq")) return a == b;
    if (!strcmp(n, "ne")) return a != b;
    if (!strcmp(n, "lt")) return a < b;
    if (!strcmp(n, "le")) return a <= b;
    if (!strcmp(n, "gt")) return a > b;
    return a >= b;
}

static bool elementwise_is_compare(const char *n) {
    return !strcmp(n, "eq") || !strcmp(n, "ne") || !strcmp(n, "lt") || !strcmp(n, "le") || !strcmp(n, "gt") ||
           !strcmp(n, "ge");
}

/* attrs.n_ints != 0: attrs.dtype is the expected output dtype (promotion
 * cases); comparisons give bool. Bool results of add/mul are logical. */
static void elementwise_ref_binary(kh_ref *r) {
    kiln_shape s;
    kh_broadcast(r->shape[0], r->shape[1], &s);
    const char *n = r->c->name;
    int as = elementwise_is_compare(n) ? KH_AS(KILN_BOOL) : r->attrs->n_ints ? KH_AS(r->attrs->dtype) : 0;
    kiln_dtype odt = as ? (kiln_dtype)(as - 1) : r->dtype;
    double *y = kh_out(r, 0, s, as);
    for (int64_t i = 0; i < kh_numel(s); i++) {
        double v = elementwise_binary_value(n, r->in[0][kh_bcast_index(s, i, r->shape[0])],
                                            r->in[1][kh_bcast_index(s, i, r->shape[1])]);
        if (odt == KILN_BOOL) v = v != 0;
        y[i] = v;
    }
}

/* ---- where, cast, backward ops, dropout, views ---------------------------------------------- */

static kiln_tensor *elementwise_run_where(kh_run *r) { return kiln_where(r->in[0], r->in[1], r->in[2]); }

static void elementwise_ref_where(kh_ref *r) {
    kiln_shape s, s2;
    kh_broadcast(r->shape[0], r->shape[1], &s2);
    kh_broadcast(s2, r->shape[2], &s);
    double *y = kh_out(r, 0, s, 0);
    for (int64_t i = 0; i < kh_numel(s); i++)
        y[i] = r->in[0][kh_bcast_index(s, i, r->shape[0])] != 0 ? r->in[1][kh_bcast_index(s, i, r->shape[1])]
                                                                : r->in[2][kh_bcast_index(s, i, r->shape[2])];
}

static kiln_tensor *elementwise_run_cast(kh_run *r) { return kiln_cast(r->in[0], r->attrs->dtype); }

/* Conversions as PyTorch: float -> integer truncates, -> bool is x != 0,
 * -> f16/bf16 rounds (the harness's tolerance covers that). */
static void elementwise_ref_cast(kh_ref *r) {
    kiln_dtype to = r->attrs->dtype;
    double *y = kh_out(r, 0, r->shape[0], KH_AS(to));
    for (int64_t i = 0; i < kh_numel(r->shape[0]); i++) {
        double v = r->in[0][i];
        y[i] = to == KILN_BOOL ? v != 0 : kiln_dtype_is_floating(to) ? v : trunc(v);
    }
}

static kiln_tensor *elementwise_run_grad_op(kh_run *r) {
    kiln_op_id op = (kiln_op_id)(r->c->op - 1);
    kiln_op_attrs at = *r->attrs;
    return kiln_dispatch_public(op, 2, (kiln_tensor *[]){r->in[0], r->in[1]}, &at, NULL);
}

/* (g, t): t is the forward's output for relu/sigmoid/tanh, its input else. */
static void elementwise_ref_grad_op(kh_ref *r) {
    double *y = kh_out(r, 0, r->shape[0], 0);
    const char *n = r->c->name;
    const kiln_op_attrs *at = r->attrs;
    for (int64_t i = 0; i < kh_numel(r->shape[0]); i++) {
        double g = r->in[0][i], t = r->in[1][i], d;
        if (!strcmp(n, "relu_backward"))
            d = t > 0;
        else if (!strcmp(n, "leaky_relu_backward"))
            d = t > 0 ? 1 : at->scalar[0];
        else if (!strcmp(n, "gelu_backward"))
            d = elementwise_gelu_grad(t, at->flag);
        else if (!strcmp(n, "sigmoid_backward"))
            d = t * (1 - t);
        else if (!strcmp(n, "tanh_backward"))
            d = 1 - t * t;
        else
            d = elementwise_sigmoid(t) * (1 + t * (1 - elementwise_sigmoid(t))); /* silu */
        y[i] = g * d;
    }
}

/* Dropout with the case's fixed draw (kiln_dropout reserves a fresh one). */
static kiln_tensor *elementwise_run_dropout(kh_run *r) {
    kiln_op_attrs at = *r->attrs;
    return kiln_dispatch_public(KILN_OP_DROPOUT, 1, (kiln_tensor *[]){r->in[0]}, &at, NULL);
}

static void elementwise_ref_dropout(kh_ref *r) {
    double *y = kh_out(r, 0, r->shape[0], 0);
    double p = r->attrs->scalar[0];
    for (int64_t i = 0; i < kh_numel(r->shape[0]); i++) {
        bool keep = kiln_rng_u32_to_uniform(kiln_rng_u32_at(&r->attrs->rng, (uint64_t)i)) >= p;
        y[i] = keep ? r->in[0][i] / (1.0 - p) : 0.0;
    }
}

/* Views: attrs.ints = the view/expand shape; dims = the permutation or
 * (narrow) dims[0] with ints[0..1] = start, length. The result is made
 * contiguous by the harness when it reads it. */
static kiln_tensor *elementwise_run_view(kh_run *r) {
    const kiln_op_attrs *at = r->attrs;
    kiln_shape s = {.ndim = at->n_ints};
    for (int i = 0; i < at->n_ints; i++) s.d[i] = at->ints[i];
    kiln_tensor *x = r->in[0];
    if (!strcmp(r->c->name, "reshape")) return kiln_reshape(x, s);
    if (!strcmp(r->c->name, "permute")) return kiln_permute(x, at->n_dims, at->dims);
    if (!strcmp(r->c->name, "narrow")) return kiln_narrow(x, at->dims[0], at->ints[0], at->ints[1]);
    if (!strcmp(r->c->name, "expand")) return kiln_expand(x, s);
    return NULL;
}

static void elementwise_ref_view(kh_ref *r) {
    const kiln_op_attrs *at = r->attrs;
    kiln_shape in = r->shape[0], s = {.ndim = at->n_ints};
    for (int i = 0; i < at->n_ints; i++) s.d[i] = at->ints[i];
    const char *n = r->c->name;
    if (!strcmp(n, "reshape")) {
        double *y = kh_out(r, 0, s, 0);
        memcpy(y, r->in[0], sizeof(double) * (size_t)kh_numel(s));
    } else if (!strcmp(n, "expand")) {
        double *y = kh_out(r, 0, s, 0);
        for (int64_t i = 0; i < kh_numel(s); i++) y[i] = r->in[0][kh_bcast_index(s, i, in)];
    } else if (!strcmp(n, "permute")) {
        kiln_shape o = {.ndim = in.ndim};
        int dims[KILN_MAX_DIMS];
        for (int i = 0; i < in.ndim; i++) dims[i] = at->dims[i] < 0 ? at->dims[i] + in.ndim : at->dims[i];
        for (int i = 0; i < in.ndim; i++) o.d[i] = in.d[dims[i]];
        double *y = kh_out(r, 0, o, 0);
        int64_t oi[KILN_MAX_DIMS], ii[KILN_MAX_DIMS];
        for (int64_t f = 0; f < kh_numel(o); f++) {
            kh_unravel(o, f, oi);
            for (int i = 0; i < in.ndim; i++) ii[dims[i]] = oi[i];
            y[f] = r->in[0][kh_ravel(in, ii)];
        }
    } else { /* narrow */
        kiln_shape o = in;
        int d = at->dims[0];
        o.d[d] = at->ints[1];
        double *y = kh_out(r, 0, o, 0);
        int64_t idx[KILN_MAX_DIMS];
        for (int64_t f = 0; f < kh_numel(o); f++) {
            kh_unravel(o, f, idx);
            idx[d] += at->ints[0];
            y[f] = r->in[0][kh_ravel(in, idx)];
        }
    }
}

/* ---- The table ------------------------------------------------------------------------------ */

#define ELEMENTWISE_IN(fill_, layout_, grad_, shape_)                                                        \
    { .shape = shape_, .fill = fill_, .layout = layout_, .grad = grad_ }
#define ELEMENTWISE_AS(fill_, as_, shape_)                                                                   \
    { .shape = shape_, .fill = fill_, .as = KH_AS(as_) }
#define ELEMENTWISE_RANGE(fill_, lo_, hi_, layout_, shape_)                                                  \
    { .shape = shape_, .fill = fill_, .lo = lo_, .hi = hi_, .layout = layout_ }
#define ELEMENTWISE_S(...) KILN_SHAPE(__VA_ARGS__)

/* A unary case; the variadic part is the attrs initializer (at least one member). */
#define ELEMENTWISE_UN(nm, prm, dts, ID, in0, ...)                                                           \
    {                                                                                                        \
        .name = nm, .params = prm, .dtypes = dts, .n_in = 1, .in = {in0}, .attrs = {__VA_ARGS__},            \
        .op = KH_OP(KILN_OP_##ID), .run = elementwise_run_unary, .reference = elementwise_ref_unary          \
    }
#define ELEMENTWISE_BIN(nm, prm, dts, ID, in0, in1, ...)                                                     \
    {                                                                                                        \
        .name = nm, .params = prm, .dtypes = dts, .n_in = 2, .in = {in0, in1}, .attrs = {__VA_ARGS__},       \
        .op = KH_OP(KILN_OP_##ID), .run = elementwise_run_binary, .reference = elementwise_ref_binary        \
    }
#define ELEMENTWISE_GRADOP(nm, prm, ID, in1, ...)                                                            \
    {                                                                                                        \
        .name = nm, .params = prm, .dtypes = KH_FLOAT, .n_in = 2,                                            \
        .in = {ELEMENTWISE_IN(KH_NORMAL, KH_CONTIG, false, ELEMENTWISE_S(3, 5)), in1},                       \
        .attrs = {__VA_ARGS__}, .op = KH_OP(KILN_OP_##ID), .run = elementwise_run_grad_op,                   \
        .reference = elementwise_ref_grad_op                                                                 \
    }
#define ELEMENTWISE_VIEW(nm, prm, in0, ...)                                                                  \
    {                                                                                                        \
        .name = nm, .params = prm, .dtypes = KH_FLOAT, .n_in = 1, .in = {in0}, .attrs = {__VA_ARGS__},       \
        .run = elementwise_run_view, .reference = elementwise_ref_view                                       \
    }

#define ELEMENTWISE_INT                    (KILN_DT(KILN_I32) | KILN_DT(KILN_I64))
#define ELEMENTWISE_G(fill_, layout_, ...) ELEMENTWISE_IN(fill_, layout_, true, ELEMENTWISE_S(__VA_ARGS__))
#define ELEMENTWISE_N(fill_, layout_, ...) ELEMENTWISE_IN(fill_, layout_, false, ELEMENTWISE_S(__VA_ARGS__))
#define ELEMENTWISE_I(lo_, hi_, layout_, ...)                                                                \
    ELEMENTWISE_RANGE(KH_INDEX, lo_, hi_, layout_, ELEMENTWISE_S(__VA_ARGS__))

static const kh_case elementwise_cases[] = {
    /* arithmetic: broadcasting, non-contiguous operands, gradients */
    ELEMENTWISE_BIN("add", "3x5 T + 1x5", KH_FLOAT, ADD, ELEMENTWISE_G(KH_NORMAL, KH_TRANSPOSED, 3, 5),
                    ELEMENTWISE_G(KH_NORMAL, KH_CONTIG, 1, 5), .flag = 0),
    ELEMENTWISE_BIN("add", "2x3x4 S + 4", KH_FLOAT, ADD, ELEMENTWISE_G(KH_NORMAL, KH_STRIDED, 2, 3, 4),
                    ELEMENTWISE_G(KH_NORMAL, KH_CONTIG, 4), .flag = 0),
    ELEMENTWISE_BIN("add", "scalar + 3x1x2", KH_FLOAT, ADD, ELEMENTWISE_G(KH_NORMAL, KH_CONTIG),
                    ELEMENTWISE_G(KH_NORMAL, KH_CONTIG, 3, 1, 2), .flag = 0),
    ELEMENTWISE_BIN("add", "int 4x3 + 3", ELEMENTWISE_INT | KILN_DT(KILN_U8), ADD,
                    ELEMENTWISE_I(0, 100, KH_TRANSPOSED, 4, 3), ELEMENTWISE_I(0, 100, KH_CONTIG, 3),
                    .flag = 0),
    ELEMENTWISE_BIN("add", "bool 3x4", KILN_DT(KILN_BOOL), ADD, ELEMENTWISE_N(KH_BOOL, KH_CONTIG, 3, 4),
                    ELEMENTWISE_N(KH_BOOL, KH_TRANSPOSED, 3, 4), .flag = 0),
    ELEMENTWISE_BIN("add", "i32 + f64 scalar -> f64", KILN_DT(KILN_I32), ADD,
                    ELEMENTWISE_I(-9, 9, KH_CONTIG, 2, 3),
                    ELEMENTWISE_AS(KH_NORMAL, KILN_F64, ELEMENTWISE_S()), .n_ints = 1, .dtype = KILN_F64),
    ELEMENTWISE_BIN(
        "add", "f16 + bf16 -> f32", KILN_DT(KILN_F16), ADD, ELEMENTWISE_N(KH_NORMAL, KH_CONTIG, 2, 3),
        ELEMENTWISE_AS(KH_NORMAL, KILN_BF16, ELEMENTWISE_S(2, 3)), .n_ints = 1, .dtype = KILN_F32),
    ELEMENTWISE_BIN("add", "f32 + i64 -> f32", KILN_DT(KILN_F32), ADD,
                    ELEMENTWISE_N(KH_NORMAL, KH_CONTIG, 2, 3),
                    ELEMENTWISE_AS(KH_NORMAL, KILN_I64, ELEMENTWISE_S(3)), .flag = 0),
    ELEMENTWISE_BIN("mul", "f16 * f32 scalar -> f16", KILN_DT(KILN_F16), MUL,
                    ELEMENTWISE_N(KH_NORMAL, KH_CONTIG, 2, 3),
                    ELEMENTWISE_AS(KH_NORMAL, KILN_F32, ELEMENTWISE_S()), .flag = 0),
    ELEMENTWISE_BIN("sub", "4x1x3 + 5x1", KH_FLOAT, SUB, ELEMENTWISE_G(KH_NORMAL, KH_CONTIG, 4, 1, 3),
                    ELEMENTWISE_G(KH_NORMAL, KH_STRIDED, 5, 1), .flag = 0),
    ELEMENTWISE_BIN("sub", "int 3x4 T", ELEMENTWISE_INT, SUB, ELEMENTWISE_I(-50, 50, KH_TRANSPOSED, 3, 4),
                    ELEMENTWISE_I(-50, 50, KH_CONTIG, 3, 4), .flag = 0),
    ELEMENTWISE_BIN("mul", "3x5 T * 3x5 S", KH_FLOAT, MUL, ELEMENTWISE_G(KH_NORMAL, KH_TRANSPOSED, 3, 5),
                    ELEMENTWISE_G(KH_NORMAL, KH_STRIDED, 3, 5), .flag = 0),
    ELEMENTWISE_BIN("mul", "2x1x4 * 3x1", KH_FLOAT, MUL, ELEMENTWISE_G(KH_NORMAL, KH_CONTIG, 2, 1, 4),
                    ELEMENTWISE_G(KH_NORMAL, KH_CONTIG, 3, 1), .flag = 0),
    ELEMENTWISE_BIN("mul", "int 3x4", ELEMENTWISE_INT | KILN_DT(KILN_U8), MUL,
                    ELEMENTWISE_I(0, 15, KH_STRIDED, 3, 4), ELEMENTWISE_I(0, 15, KH_CONTIG, 4), .flag = 0),
    ELEMENTWISE_BIN("mul", "bool 3x4", KILN_DT(KILN_BOOL), MUL, ELEMENTWISE_N(KH_BOOL, KH_CONTIG, 3, 4),
                    ELEMENTWISE_N(KH_BOOL, KH_CONTIG, 3, 1), .flag = 0),
    ELEMENTWISE_BIN("div", "3x4 T / 4", KH_FLOAT, DIV, ELEMENTWISE_G(KH_NORMAL, KH_TRANSPOSED, 3, 4),
                    ELEMENTWISE_G(KH_POSITIVE, KH_CONTIG, 4), .flag = 0),
    ELEMENTWISE_BIN("div", "i32 -> f32", KILN_DT(KILN_I32), DIV, ELEMENTWISE_I(-20, 20, KH_CONTIG, 3, 4),
                    ELEMENTWISE_I(1, 6, KH_CONTIG, 3, 4), .n_ints = 1, .dtype = KILN_F32),
    ELEMENTWISE_BIN("pow", "2x3 S ^ 2x3", KH_FLOAT, POW, ELEMENTWISE_G(KH_POSITIVE, KH_STRIDED, 2, 3),
                    ELEMENTWISE_G(KH_NORMAL, KH_CONTIG, 2, 3), .flag = 0),
    ELEMENTWISE_BIN("pow", "3x1 ^ 4", KH_FLOAT, POW, ELEMENTWISE_G(KH_POSITIVE, KH_CONTIG, 3, 1),
                    ELEMENTWISE_G(KH_NORMAL, KH_CONTIG, 4), .flag = 0),
    {.name = "add",
     .params = "3x4 + 5 mismatch",
     .dtypes = KILN_DT(KILN_F32),
     .n_in = 2,
     .in = {ELEMENTWISE_N(KH_NORMAL, KH_CONTIG, 3, 4), ELEMENTWISE_N(KH_NORMAL, KH_CONTIG, 5)},
     .run = elementwise_run_binary,
     .expect_error = "do not broadcast"},

    /* comparisons: small integers in every dtype, so ties occur */
    ELEMENTWISE_BIN("eq", "3x4 T + 4", KH_FLOAT | ELEMENTWISE_INT | KILN_DT(KILN_U8), EQ,
                    ELEMENTWISE_I(0, 3, KH_TRANSPOSED, 3, 4), ELEMENTWISE_I(0, 3, KH_CONTIG, 4), .flag = 0),
    ELEMENTWISE_BIN("ne", "3x4 + 4", KH_FLOAT | ELEMENTWISE_INT, NE, ELEMENTWISE_I(0, 3, KH_CONTIG, 3, 4),
                    ELEMENTWISE_I(0, 3, KH_STRIDED, 4), .flag = 0),
    ELEMENTWISE_BIN("lt", "2x3x2 + 3x1", KH_FLOAT | ELEMENTWISE_INT | KILN_DT(KILN_U8), LT,
                    ELEMENTWISE_I(0, 3, KH_CONTIG, 2, 3, 2), ELEMENTWISE_I(0, 3, KH_CONTIG, 3, 1), .flag = 0),
    ELEMENTWISE_BIN("le", "3x4 T", KH_FLOAT | ELEMENTWISE_INT, LE, ELEMENTWISE_I(0, 3, KH_TRANSPOSED, 3, 4),
                    ELEMENTWISE_I(0, 3, KH_CONTIG, 3, 4), .flag = 0),
    ELEMENTWISE_BIN("gt", "5 + 3x1", KH_FLOAT | ELEMENTWISE_INT, GT, ELEMENTWISE_I(0, 3, KH_CONTIG, 5),
                    ELEMENTWISE_I(0, 3, KH_CONTIG, 3, 1), .flag = 0),
    ELEMENTWISE_BIN("ge", "3x4 S", KH_FLOAT | ELEMENTWISE_INT | KILN_DT(KILN_U8), GE,
                    ELEMENTWISE_I(0, 3, KH_STRIDED, 3, 4), ELEMENTWISE_I(0, 3, KH_CONTIG, 3, 4), .flag = 0),
    ELEMENTWISE_BIN("lt", "f32 < i64", KILN_DT(KILN_F32), LT, ELEMENTWISE_I(0, 3, KH_CONTIG, 3, 4),
                    ELEMENTWISE_AS(KH_INDEX, KILN_I64, ELEMENTWISE_S(4)), .flag = 0),

    /* in place (on a differentiable copy of input 0) */
    ELEMENTWISE_BIN("add_", "3x4 T += 4", KH_FLOAT, ADD_, ELEMENTWISE_G(KH_NORMAL, KH_TRANSPOSED, 3, 4),
                    ELEMENTWISE_G(KH_NORMAL, KH_CONTIG, 4), .flag = 0),
    ELEMENTWISE_BIN("add_", "int 3x4 += 3x1", ELEMENTWISE_INT, ADD_, ELEMENTWISE_I(-9, 9, KH_CONTIG, 3, 4),
                    ELEMENTWISE_I(-9, 9, KH_CONTIG, 3, 1), .flag = 0),
    ELEMENTWISE_BIN("mul_", "3x4 *= 1x4 S", KH_FLOAT, MUL_, ELEMENTWISE_G(KH_NORMAL, KH_CONTIG, 3, 4),
                    ELEMENTWISE_N(KH_NORMAL, KH_STRIDED, 1, 4), .flag = 0),
    {.name = "add_",
     .params = "3x1 += 3x4",
     .dtypes = KILN_DT(KILN_F32),
     .n_in = 2,
     .in = {ELEMENTWISE_N(KH_NORMAL, KH_CONTIG, 3, 1), ELEMENTWISE_N(KH_NORMAL, KH_CONTIG, 3, 4)},
     .run = elementwise_run_binary,
     .expect_error = "does not broadcast to the shape"},
    {.name = "add_",
     .params = "i32 += f32",
     .dtypes = KILN_DT(KILN_I32),
     .n_in = 2,
     .in = {ELEMENTWISE_I(0, 5, KH_CONTIG, 3), ELEMENTWISE_AS(KH_NORMAL, KILN_F32, ELEMENTWISE_S(3))},
     .run = elementwise_run_binary,
     .expect_error = "cannot be written in place"},

    /* unary math and scalars */
    ELEMENTWISE_UN("add_scalar", "3x5 T", KH_FLOAT, ADD_SCALAR, ELEMENTWISE_G(KH_NORMAL, KH_TRANSPOSED, 3, 5),
                   .scalar = {2.5}),
    ELEMENTWISE_UN("add_scalar", "int + 3", ELEMENTWISE_INT, ADD_SCALAR,
                   ELEMENTWISE_I(-9, 9, KH_STRIDED, 3, 5), .scalar = {3}),
    ELEMENTWISE_UN("add_scalar", "i32 + 2.5 -> f32", KILN_DT(KILN_I32), ADD_SCALAR,
                   ELEMENTWISE_I(-9, 9, KH_CONTIG, 7), .scalar = {2.5}, .n_ints = 1, .dtype = KILN_F32),
    ELEMENTWISE_UN("mul_scalar", "2x3x4 S", KH_FLOAT, MUL_SCALAR,
                   ELEMENTWISE_G(KH_NORMAL, KH_STRIDED, 2, 3, 4), .scalar = {-1.5}),
    ELEMENTWISE_UN("mul_scalar", "int * -2", ELEMENTWISE_INT, MUL_SCALAR,
                   ELEMENTWISE_I(-9, 9, KH_CONTIG, 3, 5), .scalar = {-2}),
    ELEMENTWISE_UN("pow_scalar", "3x5 ^3", KH_FLOAT, POW_SCALAR,
                   ELEMENTWISE_G(KH_NORMAL, KH_TRANSPOSED, 3, 5), .scalar = {3}),
    ELEMENTWISE_UN("pow_scalar", "7 ^0.5", KH_FLOAT, POW_SCALAR, ELEMENTWISE_G(KH_POSITIVE, KH_STRIDED, 7),
                   .scalar = {0.5}),
    ELEMENTWISE_UN("pow_scalar", "7 ^0", KH_FLOAT, POW_SCALAR, ELEMENTWISE_G(KH_NORMAL, KH_CONTIG, 7),
                   .scalar = {0}),
    ELEMENTWISE_UN("neg", "3x5 T", KH_FLOAT | ELEMENTWISE_INT, NEG,
                   ELEMENTWISE_G(KH_NORMAL, KH_TRANSPOSED, 3, 5), .flag = 0),
    ELEMENTWISE_UN("exp", "2x3x4 S", KH_FLOAT, EXP, ELEMENTWISE_G(KH_NORMAL, KH_STRIDED, 2, 3, 4), .flag = 0),
    ELEMENTWISE_UN("log", "3x5 T", KH_FLOAT, LOG, ELEMENTWISE_G(KH_POSITIVE, KH_TRANSPOSED, 3, 5), .flag = 0),
    ELEMENTWISE_UN("sqrt", "3x5 S", KH_FLOAT, SQRT, ELEMENTWISE_G(KH_POSITIVE, KH_STRIDED, 3, 5), .flag = 0),
    ELEMENTWISE_UN("rsqrt", "3x5 T", KH_FLOAT, RSQRT, ELEMENTWISE_G(KH_POSITIVE, KH_TRANSPOSED, 3, 5),
                   .flag = 0),
    ELEMENTWISE_UN("abs", "3x5 T", KH_FLOAT, ABS, ELEMENTWISE_G(KH_AWAY, KH_TRANSPOSED, 3, 5), .flag = 0),
    ELEMENTWISE_UN("abs", "int", ELEMENTWISE_INT, ABS, ELEMENTWISE_I(-9, 9, KH_STRIDED, 4, 3), .flag = 0),
    ELEMENTWISE_UN("clamp", "3x5 [-0.5, 0.7]", KH_FLOAT, CLAMP, ELEMENTWISE_G(KH_NORMAL, KH_TRANSPOSED, 3, 5),
                   .scalar = {-0.5, 0.7}, .flag = 3),
    ELEMENTWISE_UN("clamp", "2x3x4 S [0.2, -]", KH_FLOAT, CLAMP,
                   ELEMENTWISE_G(KH_NORMAL, KH_STRIDED, 2, 3, 4), .scalar = {0.2}, .flag = 1),
    ELEMENTWISE_UN("clamp", "7 [-, 0.3]", KH_FLOAT, CLAMP, ELEMENTWISE_G(KH_NORMAL, KH_CONTIG, 7),
                   .scalar = {0, 0.3}, .flag = 2),
    ELEMENTWISE_UN("clamp", "int [-5, 7]", ELEMENTWISE_INT, CLAMP,
                   ELEMENTWISE_I(-20, 20, KH_TRANSPOSED, 3, 5), .scalar = {-5, 7}, .flag = 3),
    {.name = "clamp",
     .params = "no bounds",
     .dtypes = KILN_DT(KILN_F32),
     .n_in = 1,
     .in = {ELEMENTWISE_N(KH_NORMAL, KH_CONTIG, 3)},
     .run = elementwise_run_unary,
     .expect_error = "both bounds"},
    {.name = "isfinite",
     .params = "4x5 T",
     .dtypes = KH_FLOAT | KILN_DT(KILN_I32),
     .n_in = 1,
     .in = {ELEMENTWISE_N(KH_SPECIAL, KH_TRANSPOSED, 4, 5)},
     .op = KH_OP(KILN_OP_ISFINITE),
     .run = elementwise_run_unary,
     .reference = elementwise_ref_isfinite},
    ELEMENTWISE_UN("copy", "3x5 T", KH_FLOAT | ELEMENTWISE_INT, COPY,
                   ELEMENTWISE_G(KH_NORMAL, KH_TRANSPOSED, 3, 5), .flag = 0),

    /* activations */
    ELEMENTWISE_UN("relu", "3x5 T", KH_FLOAT, RELU, ELEMENTWISE_G(KH_AWAY, KH_TRANSPOSED, 3, 5), .flag = 0),
    ELEMENTWISE_UN("relu", "int", ELEMENTWISE_INT, RELU, ELEMENTWISE_I(-9, 9, KH_CONTIG, 3, 5), .flag = 0),
    ELEMENTWISE_UN("relu_", "2x3x4 S", KH_FLOAT, RELU_, ELEMENTWISE_G(KH_AWAY, KH_STRIDED, 2, 3, 4),
                   .flag = 0),
    ELEMENTWISE_UN("leaky_relu", "3x5 T 0.1", KH_FLOAT, LEAKY_RELU,
                   ELEMENTWISE_G(KH_AWAY, KH_TRANSPOSED, 3, 5), .scalar = {0.1}),
    ELEMENTWISE_UN("gelu", "3x5 T erf", KH_FLOAT, GELU, ELEMENTWISE_G(KH_NORMAL, KH_TRANSPOSED, 3, 5),
                   .flag = 0),
    ELEMENTWISE_UN("gelu", "2x3x4 S tanh", KH_FLOAT, GELU, ELEMENTWISE_G(KH_NORMAL, KH_STRIDED, 2, 3, 4),
                   .flag = 1),
    ELEMENTWISE_UN("sigmoid", "3x5 T", KH_FLOAT, SIGMOID, ELEMENTWISE_G(KH_NORMAL, KH_TRANSPOSED, 3, 5),
                   .flag = 0),
    ELEMENTWISE_UN("tanh", "2x3x4 S", KH_FLOAT, TANH, ELEMENTWISE_G(KH_NORMAL, KH_STRIDED, 2, 3, 4),
                   .flag = 0),
    ELEMENTWISE_UN("silu", "3x5 T", KH_FLOAT, SILU, ELEMENTWISE_G(KH_NORMAL, KH_TRANSPOSED, 3, 5), .flag = 0),
    ELEMENTWISE_GRADOP("relu_backward", "3x5 T", RELU_BACKWARD, ELEMENTWISE_N(KH_NORMAL, KH_TRANSPOSED, 3, 5),
                       .flag = 0),
    ELEMENTWISE_GRADOP("leaky_relu_backward", "3x5 T", LEAKY_RELU_BACKWARD,
                       ELEMENTWISE_N(KH_NORMAL, KH_TRANSPOSED, 3, 5), .scalar = {0.2}),
    ELEMENTWISE_GRADOP("gelu_backward", "3x5 T", GELU_BACKWARD, ELEMENTWISE_N(KH_NORMAL, KH_TRANSPOSED, 3, 5),
                       .flag = 0),
    ELEMENTWISE_GRADOP("gelu_backward", "3x5 S tanh", GELU_BACKWARD,
                       ELEMENTWISE_N(KH_NORMAL, KH_STRIDED, 3, 5), .flag = 1),
    ELEMENTWISE_GRADOP("sigmoid_backward", "3x5 T", SIGMOID_BACKWARD,
                       ELEMENTWISE_RANGE(KH_UNIFORM, 0.05, 0.95, KH_TRANSPOSED, ELEMENTWISE_S(3, 5)),
                       .flag = 0),
    ELEMENTWISE_GRADOP("tanh_backward", "3x5 T", TANH_BACKWARD,
                       ELEMENTWISE_N(KH_UNIFORM, KH_TRANSPOSED, 3, 5), .flag = 0),
    ELEMENTWISE_GRADOP("silu_backward", "3x5 T", SILU_BACKWARD, ELEMENTWISE_N(KH_NORMAL, KH_TRANSPOSED, 3, 5),
                       .flag = 0),
    {.name = "dropout",
     .params = "p=0.3 5x7 T",
     .dtypes = KH_FLOAT,
     .n_in = 1,
     .in = {ELEMENTWISE_G(KH_NORMAL, KH_TRANSPOSED, 5, 7)},
     .attrs = {.scalar = {0.3}, .rng = {1234, 7, 3}},
     .op = KH_OP(KILN_OP_DROPOUT),
     .run = elementwise_run_dropout,
     .reference = elementwise_ref_dropout},

    /* where and cast */
    {.name = "where",
     .params = "3x1 ? 3x4 T : 4",
     .dtypes = KH_FLOAT | KILN_DT(KILN_I64),
     .n_in = 3,
     .in = {ELEMENTWISE_N(KH_BOOL, KH_CONTIG, 3, 1), ELEMENTWISE_G(KH_NORMAL, KH_TRANSPOSED, 3, 4),
            ELEMENTWISE_G(KH_NORMAL, KH_CONTIG, 4)},
     .op = KH_OP(KILN_OP_WHERE),
     .run = elementwise_run_where,
     .reference = elementwise_ref_where},
    {.name = "cast",
     .params = "to f64 T",
     .dtypes = KH_FLOAT,
     .n_in = 1,
     .in = {ELEMENTWISE_G(KH_NORMAL, KH_TRANSPOSED, 3, 5)},
     .attrs = {.dtype = KILN_F64},
     .op = KH_OP(KILN_OP_CAST),
     .run = elementwise_run_cast,
     .reference = elementwise_ref_cast},
    {.name = "cast",
     .params = "to f32",
     .dtypes = KH_FLOAT | ELEMENTWISE_INT | KILN_DT(KILN_U8),
     .n_in = 1,
     .in = {ELEMENTWISE_I(-9, 9, KH_STRIDED, 3, 5)},
     .attrs = {.dtype = KILN_F32},
     .op = KH_OP(KILN_OP_CAST),
     .run = elementwise_run_cast,
     .reference = elementwise_ref_cast},
    {.name = "cast",
     .params = "to i32",
     .dtypes = KH_FLOAT,
     .n_in = 1,
     .in = {ELEMENTWISE_N(KH_NORMAL, KH_TRANSPOSED, 3, 5)},
     .attrs = {.dtype = KILN_I32},
     .op = KH_OP(KILN_OP_CAST),
     .run = elementwise_run_cast,
     .reference = elementwise_ref_cast},
    {.name = "cast",
     .params = "to bool",
     .dtypes = KH_FLOAT | KILN_DT(KILN_I32),
     .n_in = 1,
     .in = {ELEMENTWISE_I(-2, 2, KH_CONTIG, 3, 5)},
     .attrs = {.dtype = KILN_BOOL},
     .op = KH_OP(KILN_OP_CAST),
     .run = elementwise_run_cast,
     .reference = elementwise_ref_cast},

    /* views' backward formulas (the tensor layer makes the views) */
    ELEMENTWISE_VIEW("reshape", "3x4 T -> 2x6", ELEMENTWISE_G(KH_NORMAL, KH_TRANSPOSED, 3, 4), .n_ints = 2,
                     .ints = {2, 6}),
    ELEMENTWISE_VIEW("reshape", "2x3x4 -> 4x6", ELEMENTWISE_G(KH_NORMAL, KH_CONTIG, 2, 3, 4), .n_ints = 2,
                     .ints = {4, 6}),
    ELEMENTWISE_VIEW("permute", "2x3x4 (2,0,1)", ELEMENTWISE_G(KH_NORMAL, KH_CONTIG, 2, 3, 4), .n_dims = 3,
                     .dims = {2, 0, 1}),
    ELEMENTWISE_VIEW("permute", "2x3x4 S (-1,0,1)", ELEMENTWISE_G(KH_NORMAL, KH_STRIDED, 2, 3, 4),
                     .n_dims = 3, .dims = {-1, 0, 1}),
    ELEMENTWISE_VIEW("narrow", "5x4 dim0 1+3", ELEMENTWISE_G(KH_NORMAL, KH_TRANSPOSED, 5, 4), .dims = {0},
                     .ints = {1, 3}),
    ELEMENTWISE_VIEW("narrow", "3x6 dim1 2+3", ELEMENTWISE_G(KH_NORMAL, KH_CONTIG, 3, 6), .dims = {1},
                     .ints = {2, 3}),
    ELEMENTWISE_VIEW("expand", "3x1 -> 2x3x4", ELEMENTWISE_G(KH_NORMAL, KH_CONTIG, 3, 1), .n_ints = 3,
                     .ints = {2, 3, 4}),
};

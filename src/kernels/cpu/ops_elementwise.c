/* CPU kernels: elementwise arithmetic, scalar ops, unary math, clamp,
 * relu, comparisons, where, cast and dense copy.
 *
 * Every operand has out[0]'s shape (broadcast inputs come with stride-0
 * dims) and, except for comparisons (bool out), where (bool cond) and
 * cast, the dtype of out[0]: the dispatcher cast them as inference asked.
 * Floating math runs in double, integer math in int64 with wrapping
 * (unsigned) arithmetic, so overflow is defined and matches PyTorch's
 * two's-complement results. */
#include <math.h>

#include "kernels/cpu/ew_common.h"
#include "kernels/cpu/ops_elementwise.h"

/* Instantiate FN(args, op, dtype) for every dtype with a constant dtype. */
#define EW_EACH_DTYPE(dt, FN, ...)                                                                           \
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
    case KILN_I32:                                                                                           \
        FN(__VA_ARGS__, KILN_I32);                                                                           \
        break;                                                                                               \
    case KILN_I64:                                                                                           \
        FN(__VA_ARGS__, KILN_I64);                                                                           \
        break;                                                                                               \
    case KILN_U8:                                                                                            \
        FN(__VA_ARGS__, KILN_U8);                                                                            \
        break;                                                                                               \
    case KILN_BOOL:                                                                                          \
        FN(__VA_ARGS__, KILN_BOOL);                                                                          \
        break;                                                                                               \
    default:                                                                                                 \
        return KILN_ERR_UNSUPPORTED;                                                                         \
    }

/* ---- Binary arithmetic ---------------------------------------------------------------- */

enum { B_ADD, B_SUB, B_MUL, B_DIV, B_POW };

EW_INLINE double bin_f(int op, double x, double y) {
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
        return pow(x, y);
    }
}

EW_INLINE int64_t bin_i(int op, int64_t x, int64_t y) {
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

EW_INLINE void bin_loop(const kiln_op_args *a, int op, kiln_dtype dt) {
    const kiln_strided *v[3] = {&a->out[0], &a->in[0], &a->in[1]};
    ew_iter it;
    ew_init(&it, 3, v);
    void *o = a->out[0].data;
    const void *x = a->in[0].data, *y = a->in[1].data;
    if (ew_is_float(dt))
        EW_FOR_EACH(it, kiln_cpu_st_f(o, dt, o0, bin_f(op, kiln_cpu_ld_f(x, dt, o1), kiln_cpu_ld_f(y, dt, o2))));
    else
        EW_FOR_EACH(it, kiln_cpu_st_i(o, dt, o0, bin_i(op, kiln_cpu_ld_i(x, dt, o1), kiln_cpu_ld_i(y, dt, o2))));
}

EW_INLINE kiln_status bin_run(const kiln_op_args *a, int op) {
    EW_EACH_DTYPE(a->out[0].dtype, bin_loop, a, op);
    return KILN_OK;
}

kiln_status kiln_cpu_ew_add(const kiln_op_args *a) { return bin_run(a, B_ADD); }
kiln_status kiln_cpu_ew_sub(const kiln_op_args *a) { return bin_run(a, B_SUB); }
kiln_status kiln_cpu_ew_mul(const kiln_op_args *a) { return bin_run(a, B_MUL); }
kiln_status kiln_cpu_ew_div(const kiln_op_args *a) { return bin_run(a, B_DIV); }
kiln_status kiln_cpu_ew_pow(const kiln_op_args *a) { return bin_run(a, B_POW); }
kiln_status kiln_cpu_ew_add_(const kiln_op_args *a) { return bin_run(a, B_ADD); }
kiln_status kiln_cpu_ew_mul_(const kiln_op_args *a) { return bin_run(a, B_MUL); }

/* ---- Unary ------------------------------------------------------------------------------ */

enum { U_ADDS, U_MULS, U_POWS, U_NEG, U_EXP, U_LOG, U_SQRT, U_RSQRT, U_ABS, U_CLAMP, U_RELU };

/* clamp: attrs.flag bit 0 = lower bound scalar[0] given, bit 1 = upper
 * bound scalar[1] given. NaN propagates; lo > hi gives hi everywhere, as
 * in PyTorch (min(max(x, lo), hi)). */
EW_INLINE double clamp_f(double x, const kiln_op_attrs *at) {
    if ((at->flag & 1) && x < at->scalar[0]) x = at->scalar[0];
    if ((at->flag & 2) && x > at->scalar[1]) x = at->scalar[1];
    return x;
}

EW_INLINE double un_f(int op, double x, const kiln_op_attrs *at) {
    switch (op) {
    case U_ADDS:
        return x + at->scalar[0];
    case U_MULS:
        return x * at->scalar[0];
    case U_POWS:
        return pow(x, at->scalar[0]);
    case U_NEG:
        return -x;
    case U_EXP:
        return exp(x);
    case U_LOG:
        return log(x);
    case U_SQRT:
        return sqrt(x);
    case U_RSQRT:
        return 1.0 / sqrt(x);
    case U_ABS:
        return fabs(x);
    case U_CLAMP:
        return clamp_f(x, at);
    default:
        return x > 0 || x != x ? x : 0.0; /* relu keeps NaN */
    }
}

/* A double made an int64 without undefined behaviour (saturating). */
EW_INLINE int64_t sat_i64(double x) {
    if (x != x) return 0;
    if (x >= 9223372036854775808.0) return INT64_MAX;
    if (x < -9223372036854775808.0) return INT64_MIN;
    return (int64_t)x;
}

EW_INLINE int64_t un_i(int op, int64_t x, const kiln_op_attrs *at) {
    uint64_t u = (uint64_t)x;
    switch (op) {
    case U_ADDS:
        return (int64_t)(u + (uint64_t)sat_i64(at->scalar[0]));
    case U_MULS:
        return (int64_t)(u * (uint64_t)sat_i64(at->scalar[0]));
    case U_NEG:
        return (int64_t)(0 - u);
    case U_ABS:
        return x < 0 ? (int64_t)(0 - u) : x;
    case U_CLAMP:
        if ((at->flag & 1) && (double)x < at->scalar[0]) x = sat_i64(ceil(at->scalar[0]));
        if ((at->flag & 2) && (double)x > at->scalar[1]) x = sat_i64(floor(at->scalar[1]));
        return x;
    case U_RELU:
        return x > 0 ? x : 0;
    default:
        return x;
    }
}

EW_INLINE void un_loop(const kiln_op_args *a, int op, kiln_dtype dt) {
    const kiln_strided *v[2] = {&a->out[0], &a->in[0]};
    ew_iter it;
    ew_init(&it, 2, v);
    void *o = a->out[0].data;
    const void *x = a->in[0].data;
    const kiln_op_attrs *at = a->attrs;
    if (ew_is_float(dt))
        EW_FOR_EACH(it, kiln_cpu_st_f(o, dt, o0, un_f(op, kiln_cpu_ld_f(x, dt, o1), at)));
    else
        EW_FOR_EACH(it, kiln_cpu_st_i(o, dt, o0, un_i(op, kiln_cpu_ld_i(x, dt, o1), at)));
}

EW_INLINE kiln_status un_run(const kiln_op_args *a, int op) {
    EW_EACH_DTYPE(a->out[0].dtype, un_loop, a, op);
    return KILN_OK;
}

kiln_status kiln_cpu_ew_add_scalar(const kiln_op_args *a) { return un_run(a, U_ADDS); }
kiln_status kiln_cpu_ew_mul_scalar(const kiln_op_args *a) { return un_run(a, U_MULS); }
kiln_status kiln_cpu_ew_pow_scalar(const kiln_op_args *a) { return un_run(a, U_POWS); }
kiln_status kiln_cpu_ew_neg(const kiln_op_args *a) { return un_run(a, U_NEG); }
kiln_status kiln_cpu_ew_exp(const kiln_op_args *a) { return un_run(a, U_EXP); }
kiln_status kiln_cpu_ew_log(const kiln_op_args *a) { return un_run(a, U_LOG); }
kiln_status kiln_cpu_ew_sqrt(const kiln_op_args *a) { return un_run(a, U_SQRT); }
kiln_status kiln_cpu_ew_rsqrt(const kiln_op_args *a) { return un_run(a, U_RSQRT); }
kiln_status kiln_cpu_ew_abs(const kiln_op_args *a) { return un_run(a, U_ABS); }
kiln_status kiln_cpu_ew_clamp(const kiln_op_args *a) { return un_run(a, U_CLAMP); }
kiln_status kiln_cpu_ew_relu(const kiln_op_args *a) { return un_run(a, U_RELU); }
kiln_status kiln_cpu_ew_relu_(const kiln_op_args *a) { return un_run(a, U_RELU); }

/* ---- Comparisons and predicates (bool out; inputs share one dtype) ------------------------ */

enum { C_EQ, C_NE, C_LT, C_LE, C_GT, C_GE };

#define CMP(op, x, y)                                                                                        \
    ((op) == C_EQ   ? (x) == (y)                                                                             \
     : (op) == C_NE ? (x) != (y)                                                                             \
     : (op) == C_LT ? (x) < (y)                                                                              \
     : (op) == C_LE ? (x) <= (y)                                                                             \
     : (op) == C_GT ? (x) > (y)                                                                              \
                    : (x) >= (y))

EW_INLINE void cmp_loop(const kiln_op_args *a, int op, kiln_dtype dt) {
    const kiln_strided *v[3] = {&a->out[0], &a->in[0], &a->in[1]};
    ew_iter it;
    ew_init(&it, 3, v);
    uint8_t *o = a->out[0].data;
    const void *x = a->in[0].data, *y = a->in[1].data;
    if (ew_is_float(dt)) {
        EW_FOR_EACH(it, {
            double p = kiln_cpu_ld_f(x, dt, o1), q = kiln_cpu_ld_f(y, dt, o2);
            o[o0] = (uint8_t)CMP(op, p, q);
        });
    } else {
        EW_FOR_EACH(it, {
            int64_t p = kiln_cpu_ld_i(x, dt, o1), q = kiln_cpu_ld_i(y, dt, o2);
            o[o0] = (uint8_t)CMP(op, p, q);
        });
    }
}

EW_INLINE kiln_status cmp_run(const kiln_op_args *a, int op) {
    EW_EACH_DTYPE(a->in[0].dtype, cmp_loop, a, op);
    return KILN_OK;
}

kiln_status kiln_cpu_ew_eq(const kiln_op_args *a) { return cmp_run(a, C_EQ); }
kiln_status kiln_cpu_ew_ne(const kiln_op_args *a) { return cmp_run(a, C_NE); }
kiln_status kiln_cpu_ew_lt(const kiln_op_args *a) { return cmp_run(a, C_LT); }
kiln_status kiln_cpu_ew_le(const kiln_op_args *a) { return cmp_run(a, C_LE); }
kiln_status kiln_cpu_ew_gt(const kiln_op_args *a) { return cmp_run(a, C_GT); }
kiln_status kiln_cpu_ew_ge(const kiln_op_args *a) { return cmp_run(a, C_GE); }

EW_INLINE void isfinite_loop(const kiln_op_args *a, int unused, kiln_dtype dt) {
    (void)unused;
    const kiln_strided *v[2] = {&a->out[0], &a->in[0]};
    ew_iter it;
    ew_init(&it, 2, v);
    uint8_t *o = a->out[0].data;
    const void *x = a->in[0].data;
    if (ew_is_float(dt))
        EW_FOR_EACH(it, o[o0] = (uint8_t)isfinite(kiln_cpu_ld_f(x, dt, o1)));
    else
        EW_FOR_EACH(it, o[o0] = 1);
}

kiln_status kiln_cpu_ew_isfinite(const kiln_op_args *a) {
    EW_EACH_DTYPE(a->in[0].dtype, isfinite_loop, a, 0);
    return KILN_OK;
}

/* ---- where, cast, copy ----------------------------------------------------------------- */

/* where(cond, a, b): a byte copy of the chosen element, any dtype. */
EW_INLINE void where_loop(const kiln_op_args *a, size_t size) {
    const kiln_strided *v[4] = {&a->out[0], &a->in[0], &a->in[1], &a->in[2]};
    ew_iter it;
    ew_init(&it, 4, v);
    char *o = a->out[0].data;
    const uint8_t *c = a->in[0].data;
    const char *x = a->in[1].data, *y = a->in[2].data;
    EW_FOR_EACH(
        it, memcpy(o + o0 * (int64_t)size, c[o1] ? x + o2 * (int64_t)size : y + o3 * (int64_t)size, size));
}

kiln_status kiln_cpu_ew_where(const kiln_op_args *a) {
    switch (kiln_dtype_size(a->out[0].dtype)) {
    case 1:
        where_loop(a, 1);
        break;
    case 2:
        where_loop(a, 2);
        break;
    case 4:
        where_loop(a, 4);
        break;
    case 8:
        where_loop(a, 8);
        break;
    default:
        return KILN_ERR_UNSUPPORTED;
    }
    return KILN_OK;
}

/* Conversions follow the tensor layer's copy kernel (kernels/cpu/
 * tensor_kernels.c), so kiln_cast and kiln_to agree bit for bit. */
kiln_status kiln_cpu_ew_cast(const kiln_op_args *a) {
    return kiln_cpu_tensor_kernels()->copy_strided(&a->out[0], &a->in[0], a->stream);
}

kiln_status kiln_cpu_ew_copy(const kiln_op_args *a) {
    return kiln_cpu_tensor_kernels()->copy_strided(&a->out[0], &a->in[0], a->stream);
}

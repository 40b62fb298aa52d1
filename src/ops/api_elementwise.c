/* Public functions of the elementwise group (include/kiln/ops.h): each
 * fills the op's attributes and goes through the dispatcher. */
#include <math.h>

#include "base/error.h"
#include "kiln/ops.h"
#include "ops/op_registry.h"
#include "runtime/runtime_internal.h"
#include "tensor/scope.h"
#include "tensor/tensor_internal.h"

static kiln_tensor *unary(kiln_op_id op, kiln_tensor *a, kiln_op_attrs *at) {
    return kiln_dispatch_public(op, 1, (kiln_tensor *[]){a}, at, NULL);
}

static kiln_tensor *binary(kiln_op_id op, kiln_tensor *a, kiln_tensor *b) {
    kiln_op_attrs at = {0};
    return kiln_dispatch_public(op, 2, (kiln_tensor *[]){a, b}, &at, NULL);
}

kiln_tensor *(kiln_add)(kiln_tensor *a, kiln_tensor *b) { return binary(KILN_OP_ADD, a, b); }
kiln_tensor *(kiln_sub)(kiln_tensor *a, kiln_tensor *b) { return binary(KILN_OP_SUB, a, b); }
kiln_tensor *(kiln_mul)(kiln_tensor *a, kiln_tensor *b) { return binary(KILN_OP_MUL, a, b); }
kiln_tensor *(kiln_div)(kiln_tensor *a, kiln_tensor *b) { return binary(KILN_OP_DIV, a, b); }
kiln_tensor *(kiln_pow)(kiln_tensor *a, kiln_tensor *exponent) { return binary(KILN_OP_POW, a, exponent); }
kiln_tensor *(kiln_eq)(kiln_tensor *a, kiln_tensor *b) { return binary(KILN_OP_EQ, a, b); }
kiln_tensor *(kiln_ne)(kiln_tensor *a, kiln_tensor *b) { return binary(KILN_OP_NE, a, b); }
kiln_tensor *(kiln_lt)(kiln_tensor *a, kiln_tensor *b) { return binary(KILN_OP_LT, a, b); }
kiln_tensor *(kiln_le)(kiln_tensor *a, kiln_tensor *b) { return binary(KILN_OP_LE, a, b); }
kiln_tensor *(kiln_gt)(kiln_tensor *a, kiln_tensor *b) { return binary(KILN_OP_GT, a, b); }
kiln_tensor *(kiln_ge)(kiln_tensor *a, kiln_tensor *b) { return binary(KILN_OP_GE, a, b); }
kiln_tensor *(kiln_add_)(kiln_tensor *a, kiln_tensor *b) { return binary(KILN_OP_ADD_, a, b); }
kiln_tensor *(kiln_mul_)(kiln_tensor *a, kiln_tensor *b) { return binary(KILN_OP_MUL_, a, b); }

kiln_tensor *(kiln_add_scalar)(kiln_tensor *a, double s) {
    kiln_op_attrs at = {.scalar = {s}};
    return unary(KILN_OP_ADD_SCALAR, a, &at);
}

kiln_tensor *(kiln_mul_scalar)(kiln_tensor *a, double s) {
    kiln_op_attrs at = {.scalar = {s}};
    return unary(KILN_OP_MUL_SCALAR, a, &at);
}

kiln_tensor *(kiln_pow_scalar)(kiln_tensor *a, double exponent) {
    kiln_op_attrs at = {.scalar = {exponent}};
    return unary(KILN_OP_POW_SCALAR, a, &at);
}

#define PLAIN_UNARY(name, ID)                                                                                \
    kiln_tensor *(kiln_##name)(kiln_tensor * a) {                                                            \
        kiln_op_attrs at = {0};                                                                              \
        return unary(KILN_OP_##ID, a, &at);                                                                  \
    }
PLAIN_UNARY(neg, NEG)
PLAIN_UNARY(exp, EXP)
PLAIN_UNARY(log, LOG)
PLAIN_UNARY(sqrt, SQRT)
PLAIN_UNARY(rsqrt, RSQRT)
PLAIN_UNARY(abs, ABS)
PLAIN_UNARY(isfinite, ISFINITE)
PLAIN_UNARY(relu, RELU)
PLAIN_UNARY(sigmoid, SIGMOID)
PLAIN_UNARY(tanh, TANH)
PLAIN_UNARY(silu, SILU)
PLAIN_UNARY(relu_, RELU_)
#undef PLAIN_UNARY

/* attrs.flag: bit 0 = lower bound in scalar[0], bit 1 = upper bound in scalar[1]. */
kiln_tensor *(kiln_clamp)(kiln_tensor *a, double lo, double hi) {
    kiln_op_attrs at = {.scalar = {isnan(lo) ? 0 : lo, isnan(hi) ? 0 : hi},
                        .flag = (isnan(lo) ? 0 : 1) | (isnan(hi) ? 0 : 2)};
    if (!at.flag) {
        kiln_api_enter();
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give at least one bound (NAN means none on that side)",
                   "kiln_clamp: both bounds are NAN");
        return kiln_api_return(NULL);
    }
    return unary(KILN_OP_CLAMP, a, &at);
}

kiln_tensor *(kiln_where)(kiln_tensor *cond, kiln_tensor *a, kiln_tensor *b) {
    kiln_op_attrs at = {0};
    return kiln_dispatch_public(KILN_OP_WHERE, 3, (kiln_tensor *[]){cond, a, b}, &at, NULL);
}

kiln_tensor *(kiln_cast)(kiln_tensor *a, kiln_dtype dtype) {
    kiln_op_attrs at = {.dtype = dtype};
    return unary(KILN_OP_CAST, a, &at);
}

kiln_tensor *(kiln_leaky_relu)(kiln_tensor *a, double negative_slope) {
    kiln_op_attrs at = {.scalar = {negative_slope}};
    return unary(KILN_OP_LEAKY_RELU, a, &at);
}

kiln_tensor *(kiln_gelu)(kiln_tensor *a, bool approximate_tanh) {
    kiln_op_attrs at = {.flag = approximate_tanh ? 1 : 0};
    return unary(KILN_OP_GELU, a, &at);
}

/* Not training, or p == 0: the input itself (a new reference), as PyTorch
 * returns its input. Otherwise the draw of numel words is reserved from
 * the device's generator and kept in the node's attrs, so the backward
 * (and a recompute) reproduces the mask. */
kiln_tensor *(kiln_dropout)(kiln_tensor *x, double p, bool training) {
    kiln_api_enter();
    if (kiln_tensor_check(x, "kiln_dropout")) return kiln_api_return(NULL);
    if (!(p >= 0.0 && p <= 1.0)) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use a probability in [0, 1]",
                   "kiln_dropout: p = %g is not a probability", p);
        return kiln_api_return(NULL);
    }
    if (!training || p == 0.0) return kiln_api_return(kiln_retain(x));
    kiln_op_attrs at = {.scalar = {p}};
    at.rng = kiln_device_rng_reserve(kiln_get_device(x), (uint64_t)kiln_numel(x));
    return kiln_api_return(unary(KILN_OP_DROPOUT, x, &at));
}

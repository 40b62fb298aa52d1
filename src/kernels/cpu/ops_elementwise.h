/* The CPU kernels of the elementwise group (arithmetic, comparisons,
 * activations and their backward ops, dropout, cast and dense copy), one
 * per op row. KILN_CPU_EW_KERNELS(X) lists (ID, name, dtypes of out[0]);
 * ops/cpu_table_elementwise.c builds the table entries from it. */
#ifndef KILN_SRC_KERNELS_CPU_OPS_ELEMENTWISE_H
#define KILN_SRC_KERNELS_CPU_OPS_ELEMENTWISE_H

#include "kernels/op_args.h"

#define KILN_DT_NUM (KILN_DT_FLOAT | KILN_DT_INT)

#define KILN_CPU_EW_KERNELS(X)                                                                               \
    X(ADD, add, KILN_DT_ALL)                                                                                 \
    X(SUB, sub, KILN_DT_NUM)                                                                                 \
    X(MUL, mul, KILN_DT_ALL)                                                                                 \
    X(DIV, div, KILN_DT_FLOAT)                                                                               \
    X(POW, pow, KILN_DT_FLOAT)                                                                               \
    X(ADD_SCALAR, add_scalar, KILN_DT_NUM)                                                                   \
    X(MUL_SCALAR, mul_scalar, KILN_DT_NUM)                                                                   \
    X(POW_SCALAR, pow_scalar, KILN_DT_FLOAT)                                                                 \
    X(NEG, neg, KILN_DT_NUM)                                                                                 \
    X(EXP, exp, KILN_DT_FLOAT)                                                                               \
    X(LOG, log, KILN_DT_FLOAT)                                                                               \
    X(SQRT, sqrt, KILN_DT_FLOAT)                                                                             \
    X(RSQRT, rsqrt, KILN_DT_FLOAT)                                                                           \
    X(ABS, abs, KILN_DT_NUM)                                                                                 \
    X(CLAMP, clamp, KILN_DT_NUM)                                                                             \
    X(WHERE, where, KILN_DT_ALL)                                                                             \
    X(CAST, cast, KILN_DT_ALL)                                                                               \
    X(EQ, eq, KILN_DT(KILN_BOOL))                                                                            \
    X(NE, ne, KILN_DT(KILN_BOOL))                                                                            \
    X(LT, lt, KILN_DT(KILN_BOOL))                                                                            \
    X(LE, le, KILN_DT(KILN_BOOL))                                                                            \
    X(GT, gt, KILN_DT(KILN_BOOL))                                                                            \
    X(GE, ge, KILN_DT(KILN_BOOL))                                                                            \
    X(ISFINITE, isfinite, KILN_DT(KILN_BOOL))                                                                \
    X(RELU, relu, KILN_DT_NUM)                                                                               \
    X(LEAKY_RELU, leaky_relu, KILN_DT_FLOAT)                                                                 \
    X(GELU, gelu, KILN_DT_FLOAT)                                                                             \
    X(SIGMOID, sigmoid, KILN_DT_FLOAT)                                                                       \
    X(TANH, tanh, KILN_DT_FLOAT)                                                                             \
    X(SILU, silu, KILN_DT_FLOAT)                                                                             \
    X(RELU_BACKWARD, relu_backward, KILN_DT_FLOAT)                                                           \
    X(LEAKY_RELU_BACKWARD, leaky_relu_backward, KILN_DT_FLOAT)                                               \
    X(GELU_BACKWARD, gelu_backward, KILN_DT_FLOAT)                                                           \
    X(SIGMOID_BACKWARD, sigmoid_backward, KILN_DT_FLOAT)                                                     \
    X(TANH_BACKWARD, tanh_backward, KILN_DT_FLOAT)                                                           \
    X(SILU_BACKWARD, silu_backward, KILN_DT_FLOAT)                                                           \
    X(DROPOUT, dropout, KILN_DT_FLOAT)                                                                       \
    X(COPY, copy, KILN_DT_ALL)                                                                               \
    X(RELU_, relu_, KILN_DT_NUM)                                                                             \
    X(ADD_, add_, KILN_DT_ALL)                                                                               \
    X(MUL_, mul_, KILN_DT_ALL)

#define KILN_CPU_EW_DECL(ID, name, dtypes) kiln_status kiln_cpu_ew_##name(const kiln_op_args *args);
KILN_CPU_EW_KERNELS(KILN_CPU_EW_DECL)
#undef KILN_CPU_EW_DECL

#endif

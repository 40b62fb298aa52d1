/* The hand-written CUDA op kernels, one plain function per op row, with the
 * kiln_op_kernel_fn / kiln_op_workspace_fn signatures of op_args.h: the
 * CUDA counterparts of the CPU reference kernels (kernels/cpu/
 * ops_elementwise.h, reduce_kernels.h, ops_nn_cpu.h). The kernels know
 * nothing of op ids or tables: the CUDA reference table that points at
 * them is built in src/ops/ (cuda_table_*_cuda.c, assembled by
 * cuda_kernels_cuda.c), exactly as the CPU's is, and registered by
 * kiln_init for KILN_DEVICE_CUDA. tests/ops/test_op_coverage checks it
 * complete in CUDA builds (real and emulated).
 *
 * Each kernel is called by the dispatcher with views of device memory and
 * args->stream (a cudaStream_t of the output's device). It enqueues work on
 * that stream and returns without waiting for it (it never blocks the
 * host), allocates nothing (scratch comes from its workspace fn), and
 * checks every launch (KILN_LAUNCH_CHECK). */
#ifndef KILN_SRC_KERNELS_CUDA_CUDA_OPS_H
#define KILN_SRC_KERNELS_CUDA_CUDA_OPS_H

#include "kernels/op_args.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_CUDA_DT_NUM (KILN_DT_FLOAT | KILN_DT_INT)

/* ---- elementwise group (ops_elementwise.cu) ----
 * Arithmetic, comparisons, where/clamp/cast, activations and their backward
 * ops, dropout, copy and the in-place ops. KILN_CUDA_EW_KERNELS(X) lists
 * (ID, name, dtypes of out[0]) for kiln_cuda_ew_<name>; the dtype masks
 * are the CPU table's. */
#define KILN_CUDA_EW_KERNELS(X)                                                                              \
    X(ADD, add, KILN_DT_ALL)                                                                                 \
    X(SUB, sub, KILN_CUDA_DT_NUM)                                                                            \
    X(MUL, mul, KILN_DT_ALL)                                                                                 \
    X(DIV, div, KILN_DT_FLOAT)                                                                               \
    X(POW, pow, KILN_DT_FLOAT)                                                                               \
    X(ADD_SCALAR, add_scalar, KILN_CUDA_DT_NUM)                                                              \
    X(MUL_SCALAR, mul_scalar, KILN_CUDA_DT_NUM)                                                              \
    X(POW_SCALAR, pow_scalar, KILN_DT_FLOAT)                                                                 \
    X(NEG, neg, KILN_CUDA_DT_NUM)                                                                            \
    X(EXP, exp, KILN_DT_FLOAT)                                                                               \
    X(LOG, log, KILN_DT_FLOAT)                                                                               \
    X(SQRT, sqrt, KILN_DT_FLOAT)                                                                             \
    X(RSQRT, rsqrt, KILN_DT_FLOAT)                                                                           \
    X(ABS, abs, KILN_CUDA_DT_NUM)                                                                            \
    X(CLAMP, clamp, KILN_CUDA_DT_NUM)                                                                        \
    X(WHERE, where, KILN_DT_ALL)                                                                             \
    X(CAST, cast, KILN_DT_ALL)                                                                               \
    X(EQ, eq, KILN_DT(KILN_BOOL))                                                                            \
    X(NE, ne, KILN_DT(KILN_BOOL))                                                                            \
    X(LT, lt, KILN_DT(KILN_BOOL))                                                                            \
    X(LE, le, KILN_DT(KILN_BOOL))                                                                            \
    X(GT, gt, KILN_DT(KILN_BOOL))                                                                            \
    X(GE, ge, KILN_DT(KILN_BOOL))                                                                            \
    X(ISFINITE, isfinite, KILN_DT(KILN_BOOL))                                                                \
    X(RELU, relu, KILN_CUDA_DT_NUM)                                                                          \
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
    X(RELU_, relu_, KILN_CUDA_DT_NUM)                                                                        \
    X(ADD_, add_, KILN_DT_ALL)                                                                               \
    X(MUL_, mul_, KILN_DT_ALL)

#define KILN_CUDA_EW_DECL(ID, name, dtypes) kiln_status kiln_cuda_ew_##name(const kiln_op_args *args);
KILN_CUDA_EW_KERNELS(KILN_CUDA_EW_DECL)
#undef KILN_CUDA_EW_DECL

/* ---- reduce group ----
 * Reductions (ops_reduce.cu; one workspace fn for all six), softmax and
 * log-softmax with their backward ops (ops_softmax.cu), losses with their
 * backward (ops_loss.cu), matrix products (ops_gemm.cu). */
kiln_status kiln_cuda_sum(const kiln_op_args *a);
kiln_status kiln_cuda_mean(const kiln_op_args *a);
kiln_status kiln_cuda_amax(const kiln_op_args *a);
kiln_status kiln_cuda_amin(const kiln_op_args *a);
kiln_status kiln_cuda_argmax(const kiln_op_args *a);
kiln_status kiln_cuda_norm(const kiln_op_args *a);
size_t kiln_cuda_reduce_workspace(const kiln_op_args *a);

kiln_status kiln_cuda_softmax(const kiln_op_args *a);
kiln_status kiln_cuda_log_softmax(const kiln_op_args *a);
kiln_status kiln_cuda_softmax_backward(const kiln_op_args *a);
kiln_status kiln_cuda_log_softmax_backward(const kiln_op_args *a);

kiln_status kiln_cuda_nll_loss(const kiln_op_args *a);
size_t kiln_cuda_nll_loss_workspace(const kiln_op_args *a);
kiln_status kiln_cuda_nll_loss_backward(const kiln_op_args *a);
kiln_status kiln_cuda_mse_loss(const kiln_op_args *a);
size_t kiln_cuda_mse_loss_workspace(const kiln_op_args *a);

kiln_status kiln_cuda_mm(const kiln_op_args *a);
kiln_status kiln_cuda_bmm(const kiln_op_args *a);
kiln_status kiln_cuda_linear(const kiln_op_args *a);
kiln_status kiln_cuda_linear_act(const kiln_op_args *a);

/* ---- nn group ----
 * Convolution and its gradients (ops_conv.cu), pooling and its backward
 * (ops_pool.cu), batch norm and its backward (ops_nn.cu), cat, gather,
 * scatter_add, pad, flip, embedding (+ backward), randperm (ops_index.cu). */
kiln_status kiln_cuda_conv2d(const kiln_op_args *a);
kiln_status kiln_cuda_conv2d_relu(const kiln_op_args *a);
kiln_status kiln_cuda_conv2d_grad_input(const kiln_op_args *a);
kiln_status kiln_cuda_conv2d_grad_weight(const kiln_op_args *a);
size_t kiln_cuda_conv2d_grad_weight_workspace(const kiln_op_args *a);

kiln_status kiln_cuda_max_pool2d(const kiln_op_args *a);
kiln_status kiln_cuda_max_pool2d_backward(const kiln_op_args *a);
kiln_status kiln_cuda_relu_max_pool2d(const kiln_op_args *a);
kiln_status kiln_cuda_relu_max_pool2d_backward(const kiln_op_args *a);
kiln_status kiln_cuda_relu_max_pool2d_backward_sum(const kiln_op_args *a);
kiln_status kiln_cuda_conv2d_relu_max_pool2d_grad_weight(const kiln_op_args *a);
size_t kiln_cuda_conv2d_relu_max_pool2d_grad_weight_workspace(const kiln_op_args *a);
/* conv2d, then relu_max_pool2d, the convolution's output in the workspace (ops_conv.cu) */
kiln_status kiln_cuda_conv2d_relu_max_pool2d(const kiln_op_args *a);
size_t kiln_cuda_conv2d_relu_max_pool2d_workspace(const kiln_op_args *a);
kiln_status kiln_cuda_avg_pool2d(const kiln_op_args *a);
kiln_status kiln_cuda_avg_pool2d_backward(const kiln_op_args *a);
kiln_status kiln_cuda_adaptive_avg_pool2d(const kiln_op_args *a);
kiln_status kiln_cuda_adaptive_avg_pool2d_backward(const kiln_op_args *a);

kiln_status kiln_cuda_batch_norm(const kiln_op_args *a);
kiln_status kiln_cuda_batch_norm_backward(const kiln_op_args *a);

kiln_status kiln_cuda_cat(const kiln_op_args *a);
kiln_status kiln_cuda_gather(const kiln_op_args *a);
kiln_status kiln_cuda_scatter_add(const kiln_op_args *a);
kiln_status kiln_cuda_pad(const kiln_op_args *a);
kiln_status kiln_cuda_flip(const kiln_op_args *a);
kiln_status kiln_cuda_embedding(const kiln_op_args *a);
kiln_status kiln_cuda_embedding_backward(const kiln_op_args *a);
kiln_status kiln_cuda_randperm(const kiln_op_args *a);
/* Scratch for the device-side index check of gather, scatter_add and
 * embedding. */
size_t kiln_cuda_index_check_workspace(const kiln_op_args *a);
size_t kiln_cuda_embedding_backward_workspace(const kiln_op_args *a);
size_t kiln_cuda_randperm_workspace(const kiln_op_args *a);

#ifdef __cplusplus
}
#endif
#endif

/* Kiln ops: every differentiable operation on tensors.
 *
 * Ownership: each function returns a NEW reference (NULL on error, with the
 * reason in kiln_error_last()); inputs are borrowed. Results of calls made
 * directly by the user are owned by the innermost open scope, if any.
 * Synchronisation: ops are queued on the current stream of their device
 * and never block the host.
 * Devices: all tensor inputs of one call must be on one device (else an
 * error naming the op and both devices, with kiln_to as the hint; inside
 * kiln_module_forward the error names the misplaced parameter instead, with
 * kiln_module_to as the hint). Dtypes of the inputs of
 * arithmetic ops are promoted as PyTorch does (bool < u8 < i32 < i64 <
 * f16/bf16 < f32 < f64); broadcasting follows NumPy's rules.
 * Call sites: the macros at the end of this header record the caller's
 * file:line for autograd's diagnostics; nested calls keep the outer site. */
#ifndef KILN_OPS_H
#define KILN_OPS_H

#include "kiln/autograd.h"
#include "kiln/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A loss's reduction. Zero is the mean, PyTorch's default, so a
 * zero-initialised kiln_loss_opts means what PyTorch's defaults mean. */
typedef enum kiln_loss_reduction {
    KILN_LOSS_MEAN = 0,
    KILN_LOSS_SUM = 1,
    KILN_LOSS_NONE = 2, /* one loss per sample */
} kiln_loss_reduction;

/* ---- Kernels in force ---------------------------------------------------------------
 * kiln_init puts fast kernel tables before the portable reference kernels
 * of a device type: on the CPU oneDNN (where built) and the plain-C table,
 * unless KILN_CPU_KERNELS=reference; on CUDA cuBLASLt/cuDNN, unless
 * KILN_CUDA_KERNELS=reference (docs/architecture.md, "Fast CPU kernels").
 * Fixed until the next kiln_init. Neither call blocks. */

/* "fast" when fast tables are in force for `type`, else "reference" (also
 * for meta, which runs no kernel). A static string. Training checkpoints
 * record the CPU's (kiln.cpu_kernels): runs repeat bit for bit only with
 * the same one. */
const char *kiln_kernels_in_force(kiln_device_type type);
/* Whether a fast kernel in force on `type` runs op `op` (its name in
 * docs/ops.md: "conv2d", "mm") in `dtype`; such a kernel may still decline
 * particular shapes or views. False for a name that is no op. */
bool kiln_kernels_fast_covers(kiln_device_type type, const char *op, kiln_dtype dtype);

/* ---- Elementwise ------------------------------------------------------------------- */
kiln_tensor *kiln_add(kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_sub(kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_mul(kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_div(kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_pow(kiln_tensor *a, kiln_tensor *exponent);
kiln_tensor *kiln_add_scalar(kiln_tensor *a, double s);
kiln_tensor *kiln_mul_scalar(kiln_tensor *a, double s);
kiln_tensor *kiln_pow_scalar(kiln_tensor *a, double exponent);
kiln_tensor *kiln_neg(kiln_tensor *a);
kiln_tensor *kiln_exp(kiln_tensor *a);
kiln_tensor *kiln_log(kiln_tensor *a);
kiln_tensor *kiln_sqrt(kiln_tensor *a);
kiln_tensor *kiln_rsqrt(kiln_tensor *a);
kiln_tensor *kiln_abs(kiln_tensor *a);
/* Clamp to [lo, hi]; NAN for a bound means "no bound on that side". */
kiln_tensor *kiln_clamp(kiln_tensor *a, double lo, double hi);
/* cond ? a : b, elementwise with broadcasting (cond is bool). */
kiln_tensor *kiln_where(kiln_tensor *cond, kiln_tensor *a, kiln_tensor *b);
/* A differentiable dtype conversion (the gradient converts back). */
kiln_tensor *kiln_cast(kiln_tensor *a, kiln_dtype dtype);
/* Comparisons and predicates: bool results, no gradient. */
kiln_tensor *kiln_eq(kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_ne(kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_lt(kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_le(kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_gt(kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_ge(kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_isfinite(kiln_tensor *a);

/* ---- Activations ----------------------------------------------------------------------- */
kiln_tensor *kiln_relu(kiln_tensor *a);
kiln_tensor *kiln_leaky_relu(kiln_tensor *a, double negative_slope);
/* approximate: false = exact erf form (PyTorch's default), true = tanh form. */
kiln_tensor *kiln_gelu(kiln_tensor *a, bool approximate_tanh);
kiln_tensor *kiln_sigmoid(kiln_tensor *a);
kiln_tensor *kiln_tanh(kiln_tensor *a);
kiln_tensor *kiln_silu(kiln_tensor *a);

/* ---- Softmax and losses ---------------------------------------------------------------- */
kiln_tensor *kiln_softmax(kiln_tensor *a, int dim);
kiln_tensor *kiln_log_softmax(kiln_tensor *a, int dim);
/* Loss options. A zero-initialised struct ((kiln_loss_opts){0}) is
 * PyTorch's defaults, as is kiln_loss_defaults(): reduction mean, targets
 * equal to -100 ignored, no smoothing, no class weights. ignore_index is
 * read only when has_ignore_index is true (kiln_loss_defaults sets it,
 * with -100), so a zeroed struct does not ignore class 0. The weight is
 * borrowed for the call. */
typedef struct kiln_loss_opts {
    kiln_loss_reduction reduction; /* KILN_LOSS_MEAN (0), KILN_LOSS_SUM or KILN_LOSS_NONE */
    bool has_ignore_index;         /* false: PyTorch's ignore_index, -100 */
    int64_t ignore_index;          /* targets equal to it contribute nothing */
    double label_smoothing;        /* 0..1 */
    kiln_tensor *weight;           /* per-class weights (C), or NULL */
} kiln_loss_opts;
#define KILN_LOSS_IGNORE_INDEX_DEFAULT (-100)
/* reduction mean, ignore_index -100 (has_ignore_index true), no smoothing,
 * no weight: PyTorch's defaults, and the same losses as a zeroed struct. */
kiln_loss_opts kiln_loss_defaults(void);
/* logits (N, C) or (N, C, d1...), target i64 (N) or (N, d1...) of class indices. */
kiln_tensor *kiln_cross_entropy(kiln_tensor *logits, kiln_tensor *target, const kiln_loss_opts *opts);
kiln_tensor *kiln_nll_loss(kiln_tensor *log_probs, kiln_tensor *target, const kiln_loss_opts *opts);
kiln_tensor *kiln_mse_loss(kiln_tensor *input, kiln_tensor *target, kiln_loss_reduction reduction);

/* ---- Reductions (dims: n_dims entries; n_dims 0 = all dims) ----------------------------- */
kiln_tensor *kiln_sum(kiln_tensor *a, int n_dims, const int *dims, bool keepdim);
kiln_tensor *kiln_mean(kiln_tensor *a, int n_dims, const int *dims, bool keepdim);
/* Largest / smallest values over dims (gradient shared among ties). */
kiln_tensor *kiln_max(kiln_tensor *a, int n_dims, const int *dims, bool keepdim);
kiln_tensor *kiln_min(kiln_tensor *a, int n_dims, const int *dims, bool keepdim);
/* Index (i64) of the first maximum along dim. */
kiln_tensor *kiln_argmax(kiln_tensor *a, int dim, bool keepdim);
/* p-norm over dims (p = 2 for the Euclidean norm). */
kiln_tensor *kiln_norm(kiln_tensor *a, double p, int n_dims, const int *dims, bool keepdim);

/* ---- Linear algebra -------------------------------------------------------------------- */
kiln_tensor *kiln_mm(kiln_tensor *a, kiln_tensor *b);   /* (n, k) x (k, m) */
kiln_tensor *kiln_bmm(kiln_tensor *a, kiln_tensor *b);  /* (B, n, k) x (B, k, m) */
/* NumPy matmul: 1-D and batched operands, batch dims broadcast. */
kiln_tensor *kiln_matmul(kiln_tensor *a, kiln_tensor *b);
/* x (..., in) W^T + b; W (out, in), b (out) or NULL. */
kiln_tensor *kiln_linear(kiln_tensor *x, kiln_tensor *weight, kiln_tensor *bias);
/* The activation a fused op applies to its result. */
typedef enum kiln_activation {
    KILN_ACT_NONE = 0,
    KILN_ACT_RELU = 1,
} kiln_activation;
/* Fused flatten -> linear -> activation: x (N, d1, ...) is read as (N, K)
 * with K = d1 * ... (kiln_flatten(x, 1, -1) without the copy), weight
 * (out, K), bias (out) or NULL; returns (N, out) = act(x_flat W^T + b),
 * the same values and gradients as the three ops in sequence. */
kiln_tensor *kiln_linear_act(kiln_tensor *x, kiln_tensor *weight, kiln_tensor *bias, kiln_activation activation);

/* ---- Convolution, pooling, normalisation ----------------------------------------------- */
typedef struct kiln_conv2d_opts {
    int64_t stride[2], padding[2], dilation[2], groups; /* zeros mean 1, 0, 1, 1 */
} kiln_conv2d_opts;
/* x (N, C, H, W), weight (O, C/groups, kH, kW), bias (O) or NULL. opts NULL = defaults. */
kiln_tensor *kiln_conv2d(kiln_tensor *x, kiln_tensor *weight, kiln_tensor *bias, const kiln_conv2d_opts *opts);
/* Fused relu(conv2d(x, weight, bias, opts)): conv2d's arguments, one kernel,
 * the same values and gradients as kiln_relu(kiln_conv2d(...)). */
kiln_tensor *kiln_conv2d_relu(kiln_tensor *x, kiln_tensor *weight, kiln_tensor *bias,
                              const kiln_conv2d_opts *opts);
typedef struct kiln_pool2d_opts {
    int64_t kernel[2], stride[2], padding[2]; /* stride 0 = kernel */
    bool ceil_mode;
    bool count_include_pad; /* avg_pool2d; true is PyTorch's default: use kiln_pool2d_defaults */
} kiln_pool2d_opts;
kiln_pool2d_opts kiln_pool2d_defaults(int64_t kernel);
/* indices (optional out): i64 flat index h*W + w of each maximum, a new reference. */
kiln_tensor *kiln_max_pool2d(kiln_tensor *x, const kiln_pool2d_opts *opts, kiln_tensor **indices);
/* Fused kiln_max_pool2d(kiln_relu(x), opts, indices): the same y, indices
 * and gradient, one pass forward and one backward (the gradient scattered
 * only where y > 0). indices as kiln_max_pool2d's (optional out, new ref). */
kiln_tensor *kiln_relu_max_pool2d(kiln_tensor *x, const kiln_pool2d_opts *opts, kiln_tensor **indices);
/* Fused kiln_relu_max_pool2d(kiln_conv2d(x, weight, bias, opts), window pool):
 * conv2d's arguments, then max pooling of the ReLU over pool x pool windows
 * at stride pool without padding (nn.MaxPool2d(pool)). The same y, indices
 * (optional out, a new reference; flat indices h*W + w into the
 * convolution's output planes) and gradients as the two ops, without the
 * convolution's output as a tensor: on the CPU, Winograd convolutions pool
 * each output tile while it is in registers. Blocks the host on the CPU. */
kiln_tensor *kiln_conv2d_relu_max_pool2d(kiln_tensor *x, kiln_tensor *weight, kiln_tensor *bias,
                                         const kiln_conv2d_opts *opts, int64_t pool, kiln_tensor **indices);
kiln_tensor *kiln_avg_pool2d(kiln_tensor *x, const kiln_pool2d_opts *opts);
kiln_tensor *kiln_adaptive_avg_pool2d(kiln_tensor *x, int64_t out_h, int64_t out_w);
/* Batch norm over (N, C, ...) per channel. weight/bias (C) or NULL;
 * running_mean/var (C, f32) or NULL. training: normalise with batch
 * statistics and, when running stats are given and momentum >= 0, update
 * them in place (running = (1-momentum)*running + momentum*batch, the
 * variance unbiased). Eval: normalise with the running statistics. The
 * output has x's dtype whatever the parameters' dtype. */
kiln_tensor *kiln_batch_norm(kiln_tensor *x, kiln_tensor *weight, kiln_tensor *bias, kiln_tensor *running_mean,
                             kiln_tensor *running_var, bool training, double momentum, double eps);
/* Inverted dropout with probability p; identity when !training. The mask
 * comes from the device generator, keyed so that a recompute (gradient
 * checkpointing) reproduces it. */
kiln_tensor *kiln_dropout(kiln_tensor *x, double p, bool training);

/* ---- Shape and indexing ----------------------------------------------------------------- */
/* View as (d0, ..., d[start-1], prod, ...) merging dims start..end. */
kiln_tensor *kiln_flatten(kiln_tensor *x, int start_dim, int end_dim);
kiln_tensor *kiln_cat(int n, kiln_tensor *const *tensors, int dim);   /* n <= 16 */
kiln_tensor *kiln_stack(int n, kiln_tensor *const *tensors, int dim); /* n <= 16 */
kiln_tensor *kiln_gather(kiln_tensor *x, int dim, kiln_tensor *index);
/* Constant padding: pads has 2*n_pairs entries (left, right) starting from the last dim. */
kiln_tensor *kiln_pad(kiln_tensor *x, int n_pairs, const int64_t *pads, double value);
kiln_tensor *kiln_flip(kiln_tensor *x, int n_dims, const int *dims);
kiln_tensor *kiln_embedding(kiln_tensor *weight, kiln_tensor *indices);
/* A random permutation of 0..n-1 (i64) from the device's generator. */
kiln_tensor *kiln_randperm(int64_t n, kiln_device device);

/* ---- In place (return a new reference to `a`, written in place) -------------------------- */
kiln_tensor *kiln_relu_(kiln_tensor *a);
kiln_tensor *kiln_add_(kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_mul_(kiln_tensor *a, kiln_tensor *b);

#ifdef __cplusplus
}
#endif

/* Call-site capture (kiln_site_mark in kiln/tensor.h). A function-like
 * macro naming itself is not expanded again inside its own expansion, so
 * each macro calls the real function between recording the site and
 * closing it. Define KILN_NO_SITE_MACROS to turn them off (the library's
 * own sources do, and define functions as `(kiln_add)`). */
#if !defined(KILN_NO_SITE_MACROS)
#define KILN_SITE_CALL(fn, ...) (kiln_site_mark(__FILE__, __LINE__), kiln_site_done(fn(__VA_ARGS__)))
#define kiln_add(...) KILN_SITE_CALL(kiln_add, __VA_ARGS__)
#define kiln_sub(...) KILN_SITE_CALL(kiln_sub, __VA_ARGS__)
#define kiln_mul(...) KILN_SITE_CALL(kiln_mul, __VA_ARGS__)
#define kiln_div(...) KILN_SITE_CALL(kiln_div, __VA_ARGS__)
#define kiln_pow(...) KILN_SITE_CALL(kiln_pow, __VA_ARGS__)
#define kiln_add_scalar(...) KILN_SITE_CALL(kiln_add_scalar, __VA_ARGS__)
#define kiln_mul_scalar(...) KILN_SITE_CALL(kiln_mul_scalar, __VA_ARGS__)
#define kiln_pow_scalar(...) KILN_SITE_CALL(kiln_pow_scalar, __VA_ARGS__)
#define kiln_neg(...) KILN_SITE_CALL(kiln_neg, __VA_ARGS__)
#define kiln_exp(...) KILN_SITE_CALL(kiln_exp, __VA_ARGS__)
#define kiln_log(...) KILN_SITE_CALL(kiln_log, __VA_ARGS__)
#define kiln_sqrt(...) KILN_SITE_CALL(kiln_sqrt, __VA_ARGS__)
#define kiln_rsqrt(...) KILN_SITE_CALL(kiln_rsqrt, __VA_ARGS__)
#define kiln_abs(...) KILN_SITE_CALL(kiln_abs, __VA_ARGS__)
#define kiln_clamp(...) KILN_SITE_CALL(kiln_clamp, __VA_ARGS__)
#define kiln_where(...) KILN_SITE_CALL(kiln_where, __VA_ARGS__)
#define kiln_cast(...) KILN_SITE_CALL(kiln_cast, __VA_ARGS__)
#define kiln_relu(...) KILN_SITE_CALL(kiln_relu, __VA_ARGS__)
#define kiln_leaky_relu(...) KILN_SITE_CALL(kiln_leaky_relu, __VA_ARGS__)
#define kiln_gelu(...) KILN_SITE_CALL(kiln_gelu, __VA_ARGS__)
#define kiln_sigmoid(...) KILN_SITE_CALL(kiln_sigmoid, __VA_ARGS__)
#define kiln_tanh(...) KILN_SITE_CALL(kiln_tanh, __VA_ARGS__)
#define kiln_silu(...) KILN_SITE_CALL(kiln_silu, __VA_ARGS__)
#define kiln_softmax(...) KILN_SITE_CALL(kiln_softmax, __VA_ARGS__)
#define kiln_log_softmax(...) KILN_SITE_CALL(kiln_log_softmax, __VA_ARGS__)
#define kiln_cross_entropy(...) KILN_SITE_CALL(kiln_cross_entropy, __VA_ARGS__)
#define kiln_nll_loss(...) KILN_SITE_CALL(kiln_nll_loss, __VA_ARGS__)
#define kiln_mse_loss(...) KILN_SITE_CALL(kiln_mse_loss, __VA_ARGS__)
#define kiln_sum(...) KILN_SITE_CALL(kiln_sum, __VA_ARGS__)
#define kiln_mean(...) KILN_SITE_CALL(kiln_mean, __VA_ARGS__)
#define kiln_max(...) KILN_SITE_CALL(kiln_max, __VA_ARGS__)
#define kiln_min(...) KILN_SITE_CALL(kiln_min, __VA_ARGS__)
#define kiln_norm(...) KILN_SITE_CALL(kiln_norm, __VA_ARGS__)
#define kiln_mm(...) KILN_SITE_CALL(kiln_mm, __VA_ARGS__)
#define kiln_bmm(...) KILN_SITE_CALL(kiln_bmm, __VA_ARGS__)
#define kiln_matmul(...) KILN_SITE_CALL(kiln_matmul, __VA_ARGS__)
#define kiln_linear(...) KILN_SITE_CALL(kiln_linear, __VA_ARGS__)
#define kiln_linear_act(...) KILN_SITE_CALL(kiln_linear_act, __VA_ARGS__)
#define kiln_conv2d(...) KILN_SITE_CALL(kiln_conv2d, __VA_ARGS__)
#define kiln_conv2d_relu(...) KILN_SITE_CALL(kiln_conv2d_relu, __VA_ARGS__)
#define kiln_max_pool2d(...) KILN_SITE_CALL(kiln_max_pool2d, __VA_ARGS__)
#define kiln_relu_max_pool2d(...) KILN_SITE_CALL(kiln_relu_max_pool2d, __VA_ARGS__)
#define kiln_conv2d_relu_max_pool2d(...) KILN_SITE_CALL(kiln_conv2d_relu_max_pool2d, __VA_ARGS__)
#define kiln_avg_pool2d(...) KILN_SITE_CALL(kiln_avg_pool2d, __VA_ARGS__)
#define kiln_adaptive_avg_pool2d(...) KILN_SITE_CALL(kiln_adaptive_avg_pool2d, __VA_ARGS__)
#define kiln_batch_norm(...) KILN_SITE_CALL(kiln_batch_norm, __VA_ARGS__)
#define kiln_dropout(...) KILN_SITE_CALL(kiln_dropout, __VA_ARGS__)
#define kiln_flatten(...) KILN_SITE_CALL(kiln_flatten, __VA_ARGS__)
#define kiln_cat(...) KILN_SITE_CALL(kiln_cat, __VA_ARGS__)
#define kiln_stack(...) KILN_SITE_CALL(kiln_stack, __VA_ARGS__)
#define kiln_gather(...) KILN_SITE_CALL(kiln_gather, __VA_ARGS__)
#define kiln_pad(...) KILN_SITE_CALL(kiln_pad, __VA_ARGS__)
#define kiln_flip(...) KILN_SITE_CALL(kiln_flip, __VA_ARGS__)
#define kiln_embedding(...) KILN_SITE_CALL(kiln_embedding, __VA_ARGS__)
#define kiln_relu_(...) KILN_SITE_CALL(kiln_relu_, __VA_ARGS__)
#define kiln_add_(...) KILN_SITE_CALL(kiln_add_, __VA_ARGS__)
#define kiln_mul_(...) KILN_SITE_CALL(kiln_mul_, __VA_ARGS__)
#endif

#endif

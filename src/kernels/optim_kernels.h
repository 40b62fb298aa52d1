/* Fused optimizer updates: one pass over a parameter, its gradient and its
 * state instead of a dozen elementwise ops, each with its own allocation
 * and trip through memory. Kernels are arithmetic only (raw pointers, a
 * count, a stream), like the tensor kernels of kernels.h; the optimizer
 * (src/optim/optimizer.c) uses them when the tensors are contiguous and of
 * one dtype the table covers, and the elementwise ops otherwise.
 *
 * Each update reproduces the unfused sequence of ops exactly: every
 * intermediate is computed in double and rounded to the tensor dtype where
 * the op-by-op path stores a tensor, so the fused and unfused steps give the
 * same bits (tests/optim/test_fused_optim.c). */
#ifndef KILN_SRC_KERNELS_OPTIM_KERNELS_H
#define KILN_SRC_KERNELS_OPTIM_KERNELS_H

#include "kiln/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One Adam/AdamW step over n elements of p (updated), g, m, v (updated)
 * and vmax (updated; amsgrad only, else NULL). Scalars as the optimizer
 * computes them for this step. */
typedef struct kiln_adam_step {
    kiln_dtype dtype;
    int64_t n;
    void *p, *m, *v, *vmax;
    const void *g;
    bool adamw, amsgrad, maximize;
    double lr, beta1, beta2, eps, weight_decay;
    double step_size; /* lr / (1 - beta1^t) */
    double bc2_sqrt;  /* sqrt(1 - beta2^t) */
    /* Graph-safe inputs, read from device memory when the kernel runs
     * (NULL: unused). scalars = {lr, step_size, bc2_sqrt}, replacing the
     * fields above: what a CUDA graph's replay sets before each launch.
     * found_inf: nonzero skips this update entirely (the grad scaler's flag
     * of a step with an inf/nan gradient, as PyTorch's fused Adam takes). */
    const double *scalars;
    const float *found_inf;
} kiln_adam_step;

/* One SGD step; buf is the momentum buffer (NULL without momentum);
 * first: the buffer is initialised from the gradient this step. */
typedef struct kiln_sgd_step {
    kiln_dtype dtype;
    int64_t n;
    void *p, *buf;
    const void *g;
    bool first, nesterov, maximize;
    double lr, momentum, dampening, weight_decay;
    /* As kiln_adam_step's: lr_dev replaces lr; found_inf skips the update. */
    const double *lr_dev;
    const float *found_inf;
} kiln_sgd_step;

/* The grad scaler's unscale of one gradient (src/optim/grad_scaler.c), as
 * PyTorch's _amp_foreach_non_finite_check_and_unscale_: every element
 * g = R(g * *inv), R the rounding to the dtype (the op-by-op kiln_mul_'s
 * bits), and *found set to 1 where a result is not finite, left as it is
 * otherwise (so one flag can gather several gradients). inv and found are
 * () f32 tensors' data on the gradient's device. */
typedef struct kiln_unscale_step {
    kiln_dtype dtype;
    int64_t n;
    void *g;
    const float *inv;
    float *found;
} kiln_unscale_step;

/* Updates per launch: the optimizer batches up to this many parameters of
 * one device into one call (the multi-tensor apply of PyTorch's foreach
 * optimizers): on CUDA one kernel launch updates them all. */
#define KILN_OPTIM_MULTI 16

typedef struct kiln_optim_kernels {
    uint32_t dtypes; /* 1u << dtype of the dtypes covered */
    /* The n (1..KILN_OPTIM_MULTI) updates s[0..n), one dtype each (they
     * may differ), enqueued on `stream`; do not block the host. */
    kiln_status (*adam)(const kiln_adam_step *s, int n, void *stream);
    kiln_status (*sgd)(const kiln_sgd_step *s, int n, void *stream);
    /* n (1..KILN_OPTIM_MULTI) unscales, the same way (NULL: none). */
    kiln_status (*unscale)(const kiln_unscale_step *s, int n, void *stream);
} kiln_optim_kernels;

const kiln_optim_kernels *kiln_cpu_optim_kernels(void);
#ifdef KILN_WITH_CUDA
const kiln_optim_kernels *kiln_cuda_optim_kernels(void); /* cuda/optim_kernels.cu */
#endif
/* The table for a device type; NULL where there is none (meta, or a CUDA
 * build whose table is not registered). */
const kiln_optim_kernels *kiln_optim_kernels_for(kiln_device_type type);

#ifdef __cplusplus
}
#endif
#endif

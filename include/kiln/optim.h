/* Kiln optim: SGD, Adam and AdamW with PyTorch's defaults and update rules
 * (torch.optim's single-tensor implementations), gradient clipping and
 * learning-rate schedules.
 *
 * Ownership: an optimizer holds its own references to its parameters and
 * to its state (momentum buffers, moment estimates), so scopes never free
 * them; kiln_optimizer_free releases them. An optimizer has one parameter
 * group (one learning rate, settable).
 *
 * Synchronisation: steps queue work on the parameters' devices and do not
 * block the host. kiln_clip_grad_norm returns the total norm and therefore
 * blocks (a host synchronisation). Not thread-safe. */
#ifndef KILN_OPTIM_H
#define KILN_OPTIM_H

#include "kiln/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_optimizer kiln_optimizer;

/* torch.optim.SGD: momentum 0, dampening 0, weight_decay 0, nesterov and
 * maximize false. With momentum the buffer starts as the first gradient:
 *   g += weight_decay * p;  buf = momentum * buf + (1 - dampening) * g;
 *   g = nesterov ? g + momentum * buf : buf;  p -= lr * g. */
typedef struct kiln_sgd_opts {
    double lr, momentum, dampening, weight_decay;
    bool nesterov, maximize;
} kiln_sgd_opts;
kiln_sgd_opts kiln_sgd_defaults(double lr);

/* torch.optim.Adam / AdamW: lr 1e-3, betas (0.9, 0.999), eps 1e-8,
 * weight_decay 0 (Adam: added to the gradient) or 1e-2 (AdamW: decoupled,
 * p *= 1 - lr * weight_decay), amsgrad false. Per step t:
 *   m = m + (1 - b1) (g - m);  v = b2 v + (1 - b2) g^2;
 *   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps). */
typedef struct kiln_adam_opts {
    double lr, beta1, beta2, eps, weight_decay;
    bool amsgrad, maximize;
} kiln_adam_opts;
kiln_adam_opts kiln_adam_defaults(void);
kiln_adam_opts kiln_adamw_defaults(void);

/* New optimizers over n floating leaf tensors that require grad (the
 * optimizer takes its own references). opts NULL = defaults (SGD needs
 * opts: it has no default lr). NULL with an error on bad arguments. */
kiln_optimizer *kiln_sgd(kiln_tensor *const *params, int n, const kiln_sgd_opts *opts);
kiln_optimizer *kiln_adam(kiln_tensor *const *params, int n, const kiln_adam_opts *opts);
kiln_optimizer *kiln_adamw(kiln_tensor *const *params, int n, const kiln_adam_opts *opts);
/* Release the parameters' references and the state. NULL: no-op. */
void kiln_optimizer_free(kiln_optimizer *opt);

/* One update of every parameter that has a gradient (others are skipped,
 * as in PyTorch). Runs under no_grad, writes the parameters in place
 * (bumping their versions) and keeps no temporaries. Does not block. */
kiln_status kiln_optimizer_step(kiln_optimizer *opt);
/* set_to_none true (PyTorch's default): free each gradient; false: zero it
 * in place. */
kiln_status kiln_optimizer_zero_grad(kiln_optimizer *opt, bool set_to_none);
double kiln_optimizer_get_lr(const kiln_optimizer *opt);
kiln_status kiln_optimizer_set_lr(kiln_optimizer *opt, double lr);
/* Steps taken so far. */
int64_t kiln_optimizer_step_count(const kiln_optimizer *opt);
/* The optimizer's state for parameter i ("momentum_buffer", "exp_avg",
 * "exp_avg_sq", "max_exp_avg_sq"): a new reference, or NULL with no error
 * set when there is none yet. */
kiln_tensor *kiln_optimizer_state(kiln_optimizer *opt, int i, const char *name);

/* ---- Gradient accumulation -----------------------------------------------------------------
 * The forward and backward half of a training step over batch (x, y),
 * split along dim 0 into `micro_batches` contiguous micro-batches (sizes
 * floor(B*(k+1)/M) - floor(B*k/M), so an uneven split differs by at most
 * one sample). Each micro-batch's mean cross-entropy (opts: NULL =
 * kiln_loss_defaults, reduction must be mean) is multiplied by its share
 * of the batch's samples, n_k / B, before its backward, so the gradients
 * accumulated into the parameters' .grad are the full batch's mean-loss
 * gradient however the batch divides (exactly, up to rounding, for models
 * without batch statistics; BatchNorm normalises each micro-batch with its
 * own statistics, as in PyTorch, so its gradient differs: see
 * docs/training.md). With ignore_index or class weights the share is by
 * samples, exact only when every micro-batch has the same fraction of
 * ignored targets. Call zero_grad before and kiln_optimizer_step after.
 * micro_batches is clamped to [1, B]. *loss (may be NULL) gets a new
 * reference to the batch's mean loss: a detached scalar on x's device,
 * registered with the caller's scope; reading it (kiln_item) is the only
 * host synchronisation. *correct (may be NULL) likewise gets an i64
 * scalar on x's device: the samples whose largest logit is their target
 * (training accuracy without a host synchronisation per step). Queues
 * work; does not block. */
typedef struct kiln_module kiln_module;
kiln_status kiln_accumulate_backward(kiln_module *m, kiln_tensor *x, kiln_tensor *y, int micro_batches,
                                     const kiln_loss_opts *opts, kiln_tensor **loss, kiln_tensor **correct);

/* torch.nn.utils.clip_grad_norm_: the norm (norm_type = 2, any p >= 1, or
 * INFINITY) of all the gradients together; when it exceeds max_norm each
 * gradient is multiplied in place by max_norm / (total + 1e-6). Tensors
 * without a gradient are skipped. Returns the total norm (>= 0), or a
 * negative value with an error set. Blocks (a host synchronisation). */
double kiln_clip_grad_norm(kiln_tensor *const *params, int n, double max_norm, double norm_type);

/* ---- Learning-rate schedules ----------------------------------------------------------------
 * A schedule sets its optimizer's lr at creation (epoch 0) and at each
 * kiln_lr_scheduler_step (epoch + 1), like torch.optim.lr_scheduler. It
 * borrows the optimizer, which must outlive it. base_lr is the optimizer's
 * lr at creation. */
typedef struct kiln_lr_scheduler kiln_lr_scheduler;

/* StepLR: base_lr * gamma^floor(epoch / step_size). */
kiln_lr_scheduler *kiln_lr_step_create(kiln_optimizer *opt, int64_t step_size, double gamma);
/* CosineAnnealingLR, closed form:
 * eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / t_max)) / 2. */
kiln_lr_scheduler *kiln_lr_cosine_create(kiln_optimizer *opt, int64_t t_max, double eta_min);
/* LinearLR with end_factor 1: base_lr * (start_factor + (1 - start_factor)
 * * min(epoch, total_iters) / total_iters). */
kiln_lr_scheduler *kiln_lr_warmup_create(kiln_optimizer *opt, double start_factor, int64_t total_iters);
/* OneCycleLR (two phases, cosine annealing, no momentum cycling): from
 * max_lr / div_factor up to max_lr over pct_start * total_steps - 1 steps,
 * then down to max_lr / div_factor / final_div_factor at total_steps - 1.
 * PyTorch's defaults: pct_start 0.3, div_factor 25, final_div_factor 1e4.
 * Stepping past total_steps - 1 is an error, as in PyTorch. */
kiln_lr_scheduler *kiln_lr_one_cycle_create(kiln_optimizer *opt, double max_lr, int64_t total_steps,
                                            double pct_start, double div_factor, double final_div_factor);
/* Advance one epoch (or step) and set the optimizer's lr. */
kiln_status kiln_lr_scheduler_step(kiln_lr_scheduler *s);
/* The lr the schedule set last. */
double kiln_lr_scheduler_get_lr(const kiln_lr_scheduler *s);
int64_t kiln_lr_scheduler_epoch(const kiln_lr_scheduler *s);
void kiln_lr_scheduler_free(kiln_lr_scheduler *s);

#ifdef __cplusplus
}
#endif
#endif /* KILN_OPTIM_H */

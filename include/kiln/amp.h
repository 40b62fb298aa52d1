/* Kiln amp: automatic mixed precision — autocast regions and a dynamic
 * loss scaler, with PyTorch's semantics (torch.autocast, torch.amp.GradScaler).
 *
 * Autocast: inside a region opened for a device type, every op dispatched
 * on a device of that type runs in its precision class (docs/ops.md,
 * "autocast class"): LOWER ops (mm, bmm, linear, conv2d) in the region's
 * f16 or bf16, F32 ops (softmax, log_softmax, losses, sum, mean, norm,
 * exp, log, pow, rsqrt) in f32, PROMOTE ops (cat) in their widest input
 * type, ASIS ops (elementwise, activations, pooling, batch_norm) in their
 * input dtype. f64 inputs, non-floating inputs and in-place ops are left
 * alone. The casts are CAST ops, recorded by autograd, so gradients come
 * back in each input's own dtype. Casts of f32 leaf tensors that require
 * grad (the weights) to the low dtype are cached for the region, keyed by
 * tensor, storage version, dtype and grad mode: each weight is cast once
 * per forward; the cache is emptied when the outermost region ends.
 * kiln_backward runs with autocast off. BatchNorm parameters and running
 * statistics stay f32 (batch_norm is ASIS and its kernels take f16/bf16
 * activations with f32 parameters).
 *
 * Regions are per thread and nest; each begin must be paired with one
 * end. Nothing here blocks the host. */
#ifndef KILN_AMP_H
#define KILN_AMP_H

#include "kiln/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Open an autocast region for ops on devices of `device_type`. dtype:
 * KILN_F16 or KILN_BF16 turns autocast on with that low dtype (PyTorch's
 * defaults: f16 on CUDA, bf16 on CPU); KILN_F32 opens a region where
 * autocast is off for that device type (torch.autocast(enabled=False)).
 * Errors: another dtype or device type (KILN_ERR_INVALID_ARGUMENT), more
 * than 32 regions open (KILN_ERR_STATE). */
kiln_status kiln_autocast_begin(kiln_device_type device_type, kiln_dtype dtype);
/* Close the innermost region; closing the outermost one releases the
 * weight-cast cache. KILN_ERR_STATE when no region is open. */
kiln_status kiln_autocast_end(void);
/* Whether autocast is on for device_type on this thread, and its low
 * dtype (KILN_F32 when off). */
bool kiln_autocast_enabled(kiln_device_type device_type);
kiln_dtype kiln_autocast_dtype(kiln_device_type device_type);

/* ---- Dynamic loss scaling (torch.amp.GradScaler) ---------------------------------------------
 * Per effective step:
 *   loss_scaled = kiln_grad_scaler_scale(s, loss);  kiln_backward(loss_scaled, ...)
 *   [kiln_grad_scaler_unscale_(s, opt); kiln_clip_grad_norm(...)]   (clipping: unscale first)
 *   kiln_grad_scaler_step(s, opt, &stepped);  kiln_grad_scaler_update(s);
 * The scale (f32) and the growth tracker live on the device as 0-dim
 * tensors, created on the first scale() call on the loss's device.
 * unscale_ multiplies every gradient of the optimizer's parameters by
 * 1/scale in place and records on the device whether any is inf or NaN.
 * step reads that flag — the one host synchronisation per step — and runs
 * kiln_optimizer_step only when every gradient was finite. update runs on
 * the device: on inf/NaN scale *= backoff_factor and the tracker resets;
 * otherwise the tracker counts the step and, on reaching growth_interval,
 * scale *= growth_factor (when the result is finite) and it resets.
 * Several optimizers may share one scaler: one update after all steps.
 * The gradients of one optimizer may span devices (model parallelism):
 * as in PyTorch, each device gets its own copy of 1/scale and its own
 * inf/NaN check, and the flags meet on the scale's device (the loss's).
 * f16 gradients are refused (keep the parameters f32 and use autocast).
 * Not thread-safe. */
typedef struct kiln_grad_scaler kiln_grad_scaler;

typedef struct kiln_grad_scaler_opts {
    double init_scale;       /* 65536 */
    double growth_factor;    /* 2 */
    double backoff_factor;   /* 0.5 */
    int64_t growth_interval; /* 2000 */
    bool enabled;            /* true; false: every call passes through (scale 1, plain step) */
} kiln_grad_scaler_opts;
kiln_grad_scaler_opts kiln_grad_scaler_defaults(void);

/* A new scaler (opts NULL: defaults). NULL with an error on bad options
 * (growth_factor <= 1, backoff_factor outside (0, 1), growth_interval
 * < 1, init_scale not finite and > 0). Free with kiln_grad_scaler_free. */
kiln_grad_scaler *kiln_grad_scaler_create(const kiln_grad_scaler_opts *opts);
void kiln_grad_scaler_free(kiln_grad_scaler *s);

/* loss * scale: a new reference registered with the caller's scope (a
 * differentiable op: backward through it scales every gradient). The
 * scale is cast to loss's dtype. Does not block. */
kiln_tensor *kiln_grad_scaler_scale(kiln_grad_scaler *s, kiln_tensor *loss);
/* Unscale opt's gradients in place and record the inf/NaN flag. A second
 * call for the same optimizer before update() is an error (KILN_ERR_STATE),
 * as is a call after step(). Does not block. */
kiln_status kiln_grad_scaler_unscale_(kiln_grad_scaler *s, kiln_optimizer *opt);
/* Unscale (when not done yet), then kiln_optimizer_step unless a gradient
 * was inf or NaN. *stepped (may be NULL) says which. Blocks: reads the flag. */
kiln_status kiln_grad_scaler_step(kiln_grad_scaler *s, kiln_optimizer *opt, bool *stepped);
/* Update the scale from the flags of every optimizer unscaled since the
 * last update (on the device), and forget them. Without a prior unscale
 * or step it is an error (KILN_ERR_STATE). Does not block. */
kiln_status kiln_grad_scaler_update(kiln_grad_scaler *s);
/* Abandon the current iteration after a step failed part-way (an
 * out-of-memory in backward, clipping, the optimizer or update): forget
 * which optimizers were unscaled or stepped and their inf/NaN flags,
 * leaving the scale and growth tracker as they were, so the retried
 * iteration starts clean. Without it the retry's unscale_ is refused
 * (KILN_ERR_STATE). NULL is a no-op. Does not block. */
void kiln_grad_scaler_abandon_step(kiln_grad_scaler *s);

/* The current scale (opts.init_scale before the first scale() call) and
 * growth tracker. Block: read the device values. */
double kiln_grad_scaler_get_scale(kiln_grad_scaler *s);
int64_t kiln_grad_scaler_growth_tracker(kiln_grad_scaler *s);
/* Steps step() skipped since creation (host counter; no block). */
int64_t kiln_grad_scaler_skipped_steps(const kiln_grad_scaler *s);
/* Restore a saved state (kiln train's checkpoints): the scale (finite,
 * > 0) and the growth tracker (0 <= tracker < growth_interval). Takes
 * effect at the next scale() call. Does not block. */
kiln_status kiln_grad_scaler_load_state(kiln_grad_scaler *s, double scale, int64_t growth_tracker);
const kiln_grad_scaler_opts *kiln_grad_scaler_options(const kiln_grad_scaler *s);

/* kiln_accumulate_backward (kiln/optim.h) with each micro-batch's weighted
 * loss multiplied by the scaler's scale before its backward (scaler NULL:
 * exactly kiln_accumulate_backward). *loss stays the unscaled mean loss.
 * Open the autocast region around the call: the forwards run in it, the
 * backwards with autocast off. Does not block. */
kiln_status kiln_accumulate_backward_scaled(kiln_module *m, kiln_tensor *x, kiln_tensor *y, int micro_batches,
                                            const kiln_loss_opts *opts, kiln_grad_scaler *scaler, kiln_tensor **loss,
                                            kiln_tensor **correct);

#ifdef __cplusplus
}
#endif
#endif /* KILN_AMP_H */

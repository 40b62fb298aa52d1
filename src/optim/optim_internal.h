/* The optimizer record shared by optimizer.c and lr_scheduler.c. */
#ifndef KILN_SRC_OPTIM_OPTIM_INTERNAL_H
#define KILN_SRC_OPTIM_OPTIM_INTERNAL_H

#include "kiln/optim.h"

typedef enum kiln_optimizer_kind {
    KILN_OPTIM_SGD = 0,
    KILN_OPTIM_ADAM,
    KILN_OPTIM_ADAMW,
} kiln_optimizer_kind;

/* Per-parameter state slots: SGD uses [0] (momentum_buffer); Adam/AdamW
 * [0] exp_avg, [1] exp_avg_sq, [2] max_exp_avg_sq (amsgrad). */
#define KILN_OPTIM_STATES 3

struct kiln_optimizer {
    kiln_optimizer_kind kind;
    kiln_sgd_opts sgd;
    kiln_adam_opts adam;
    double lr; /* the single parameter group's lr (opts.lr at creation) */
    int n;
    kiln_tensor **params;                    /* (n) own references */
    kiln_tensor **state[KILN_OPTIM_STATES];  /* (n) own references or NULL */
    int64_t *steps;                          /* (n) updates each parameter received */
    int64_t step_count;                      /* kiln_optimizer_step calls that succeeded */
};

/* Whether updates may use the fused kernels where they apply (default on);
 * off runs every update op by op. For tests that compare the two paths. */
void kiln_optim_use_fused(bool on);
bool kiln_optim_fused_enabled(void);
/* Gradients the grad scaler unscaled with the fused multi-tensor kernel
 * (grad_scaler.c), since the process started: for tests. */
uint64_t kiln_grad_scaler_fused_unscales(void);
/* Parameter updates that ran fused since the process started, and the
 * calls (kernel launches on CUDA) they took: up to KILN_OPTIM_MULTI
 * updates of one device share one. */
uint64_t kiln_optim_fused_updates(void);
uint64_t kiln_optim_fused_launches(void);

/* The trace layer's recorder of fused updates (src/trace), installed on one
 * thread while kiln_trace records; NULL otherwise (one branch per launch).
 * It sees each launch just before it runs: the optimizer, the indices of
 * the n parameters updated, their gradients, and the steps as built (Adam's
 * bias corrections depend on o->steps[idx[k]], which a replay advances). */
typedef struct kiln_optimizer kiln_optimizer;
struct kiln_optim_kernels;
struct kiln_adam_step;
struct kiln_sgd_step;
typedef kiln_status (*kiln_optim_recorder_fn)(void *ctx, kiln_optimizer *o, const struct kiln_optim_kernels *k,
                                              bool adam, const int *idx, kiln_tensor *const *grads,
                                              const struct kiln_adam_step *as, const struct kiln_sgd_step *ss, int n,
                                              void *stream);
void kiln_optim_set_recorder(kiln_optim_recorder_fn fn, void *ctx);
/* Whether a recorder is installed on this thread (kiln_trace is recording). */
bool kiln_optim_recording(void);

/* The grad scaler's device-side step (grad_scaler.c, under kiln_trace):
 * kiln_optimizer_step with `found` (a () f32 tensor on the parameters'
 * device) passed to every fused update as found_inf, so the kernels skip
 * the whole update when it is nonzero, without the host reading it. Every
 * parameter with a gradient must take the fused path (else
 * KILN_ERR_UNSUPPORTED naming it). The step counts advance as for any
 * step; whoever reads the flag later puts them back for a skipped step
 * (kiln_optim_unstep) and counts it in *skipped (may be NULL), which the
 * recorder sees as the launch's `skipped`. */
kiln_status kiln_optimizer_step_unless_found(kiln_optimizer *o, kiln_tensor *found, int64_t *skipped);
/* A skipped step's count taken back: o->steps[idx[k]]-- for k < n. */
void kiln_optim_unstep(kiln_optimizer *o, const int *idx, int n);
/* The flag and skip counter of the kiln_optimizer_step_unless_found in
 * progress on this thread (NULL outside one), for the recorder. */
const float *kiln_optim_found_inf(int64_t **skipped);
/* The steps kiln_optimizer_step_unless_found made on this thread since the
 * last call, settled: each flag read (a host synchronisation: call it after
 * a trace's counters are read) and a skipped step's counts put back and
 * counted. kiln_trace calls it after the traced call. */
kiln_status kiln_optim_settle_found(void);

#endif

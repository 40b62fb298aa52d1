/* kiln train's step bookkeeping: the learning-rate schedule and the
 * per-window sums' way to the host (non-blocking copies into pinned memory
 * behind an event; a window's metrics record is written once they have
 * landed). */
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "kiln/kiln.h"
#include "train.h"
#include "train_run.h"

/* ---- The learning-rate schedule ------------------------------------------------------------ */

/* One-cycle over every optimizer step of the run (epochs x batches per
 * epoch), PyTorch's OneCycleLR shape (warm-up over the first 30%, cosine
 * down to lr / 25e4). A resumed run replays the schedule to its step, so
 * the learning rates, and with --deterministic the losses, are those of an
 * uninterrupted run. */
int train_schedule_setup(train_run *r) {
    if (!r->a.onecycle) return 0;
    int64_t nb = kiln_loader_num_batches(r->train_ld);
    r->sched_total = nb * r->a.epochs;
    if (r->sched_total < 2) return 0; /* one step: nothing to schedule, the constant lr */
    /* The warm-up ends at step 0.3 * total - 1, which must be past step 0:
     * the cycle needs 4 steps at the least. */
    if (0.3 * (double)r->sched_total - 1.0 <= 0) {
        fprintf(stderr,
                "kiln train: the one-cycle learning-rate schedule needs at least 4 optimizer steps (its warm-up is "
                "30%% of them), but this run has %lld (%lld batch%s of %lld per epoch x %d epoch%s); pass "
                "--schedule constant, or train more steps (more --epochs, a smaller --batch)\n",
                (long long)r->sched_total, (long long)nb, nb == 1 ? "" : "es", (long long)r->a.batch, r->a.epochs,
                r->a.epochs == 1 ? "" : "s");
        return 1;
    }
    r->sched = kiln_lr_one_cycle_create(r->opt, r->a.lr, r->sched_total, 0.3, 25.0, 1e4);
    if (!r->sched) return train_fail("train", "learning-rate schedule");
    for (int64_t k = 0; k < r->step && k < r->sched_total - 1; k++)
        if (kiln_lr_scheduler_step(r->sched) != KILN_OK) return train_fail("train", "learning-rate schedule");
    return 0;
}

/* After each optimizer step: the next step's learning rate. */
kiln_status train_schedule_step(train_run *r) {
    if (!r->sched || r->step >= r->sched_total - 1) return KILN_OK;
    return kiln_lr_scheduler_step(r->sched);
}

/* ---- A window's sums on their way to the host ------------------------------------------------ */

void train_readback_free(window_readback *w) {
    kiln_release(w->loss_host);
    kiln_release(w->hits_host);
    if (w->copied) kiln_event_destroy(w->copied);
    memset(w, 0, sizeof *w);
}

/* Start the copies of *loss and *hits (released and cleared). */
kiln_status train_readback_start(train_run *r, window_readback *w, kiln_tensor **loss, kiln_tensor **hits) {
    kiln_status st = KILN_OK;
    if (!w->loss_host) w->loss_host = kiln_empty_pinned(kiln_shape_of(*loss), kiln_dtype_of(*loss));
    if (!w->hits_host) w->hits_host = kiln_empty_pinned(kiln_shape_of(*hits), kiln_dtype_of(*hits));
    if (!w->loss_host || !w->hits_host) st = kiln_error_last()->status;
    if (st == KILN_OK && !w->copied) st = kiln_event_create(r->dev, 0, &w->copied);
    if (st == KILN_OK) st = kiln_copy_(w->loss_host, *loss, KILN_NON_BLOCKING);
    if (st == KILN_OK) st = kiln_copy_(w->hits_host, *hits, KILN_NON_BLOCKING);
    if (st == KILN_OK) st = kiln_event_record(w->copied, kiln_current_stream(r->dev));
    kiln_release(*loss), kiln_release(*hits);
    *loss = *hits = NULL;
    w->pending = st == KILN_OK;
    return st;
}

/* The pending window's two sums, once its copies are done: wait for them
 * when `wait`, else only if the event says they have landed. *ready says
 * whether the values were read. */
kiln_status train_readback_finish(window_readback *w, bool wait, double *loss, double *hits, bool *ready) {
    *ready = false;
    if (!w->pending) return KILN_OK;
    if (!wait && !kiln_event_query(w->copied)) return KILN_OK;
    if (wait) KILN_TRY(kiln_event_synchronize(w->copied));
    KILN_TRY(kiln_item(w->loss_host, loss)); /* pinned host memory: no device wait */
    KILN_TRY(kiln_item(w->hits_host, hits));
    w->pending = false;
    *ready = true;
    return KILN_OK;
}

/* The metrics record of a window whose sums (wl, wh) have landed; returns
 * the window's mean loss. */
double train_window_record(train_run *r, const window_readback *w, double wl, double wh) {
    double mean = wl / w->n;
    train_metric(r,
                 "{\"event\":\"step\",\"step\":%lld,\"epoch\":%d,\"loss\":%.9g,\"train_acc\":%.6f,\"lr\":%g,"
                 "\"img_s\":%.1f,\"data_wait_s\":%.4f,\"window_s\":%.4f,\"eta_s\":%.3f,\"mem_allocated\":%lld,"
                 "\"mem_reserved\":%lld,\"mem_peak\":%lld,\"amp_scale\":%g}\n",
                 (long long)w->step, w->epoch, mean, wh / (double)w->img, w->lr, w->img_s, w->wait_s, w->window_s,
                 w->eta_s, w->mem_alloc, w->mem_res, w->mem_peak, w->amp_scale);
    return mean;
}

/* kiln train's out-of-memory recovery (docs/memory.md, "Surviving out of
 * memory"; on by default, --no-auto-batch turns it off).
 *
 * Before each step the run's snapshot (kiln_step_snapshot: the model's
 * buffers and every device generator's position) is retaken. When the
 * forward/backward half of a step runs out of memory:
 *   1. the step's graph is already gone (kiln_accumulate_backward drops
 *      what it built); the gradients are dropped (zero_grad to none), the
 *      grad scaler forgets the iteration, the snapshot is restored and the
 *      allocator's cached blocks go back to the device;
 *   2. the micro-batch is halved by doubling the accumulation, so the
 *      effective batch and the math stay the same (the accumulation is
 *      sample-weighted);
 *   3. the same samples run again.
 * The new micro-batch is said once per change. At a micro-batch of one
 * sample nothing is left to halve: the run stops, giving the step's peak
 * and the limit. The optimizer step is not retried: it runs only after the
 * backward succeeded.
 *
 * The accumulation actually used (r->accum_live) starts at --accum and
 * only grows; the run configuration keeps --accum as given, so a resumed
 * run shrinks again at its first step if it has to. */
#include <stdio.h>

#include "train.h"
#include "train_run.h"

int train_oom_setup(train_run *r) {
    r->accum_live = r->a.accum;
    int rc = train_plan_setup(r); /* may start with a smaller micro-batch */
    if (rc) return rc;
    /* The first two steps against the plan need an epoch of three steps or
     * more: an epoch's end adds its evaluation. */
    if (kiln_loader_num_batches(r->train_ld) - r->skip_batches < 3) r->planned = false;
    if (r->a.no_auto_batch) return 0;
    r->snapshot = kiln_step_snapshot_take(r->net);
    if (!r->snapshot) return train_fail("train", "the out-of-memory recovery's snapshot");
    return 0;
}

void train_oom_teardown(train_run *r) {
    kiln_step_snapshot_free(r->snapshot);
    r->snapshot = NULL;
}

/* The devices the step allocates on: the loader's, the output's and each
 * of --devices / --split's. */
static int step_devices(const train_run *r, kiln_device *out, int cap) {
    int n = 0;
    kiln_device all[KILN_NN_MAX_PLACE_STAGES + 2];
    all[n++] = r->dev, all[n++] = r->out_dev;
    for (int i = 0; i < r->n_devices && n < KILN_NN_MAX_PLACE_STAGES + 2; i++) all[n++] = r->devices[i];
    int k = 0;
    for (int i = 0; i < n && k < cap; i++) {
        bool seen = false;
        for (int j = 0; j < k && !seen; j++) seen = kiln_device_equal(out[j], all[i]);
        if (!seen) out[k++] = all[i];
    }
    return k;
}

/* Everything the failed attempt left, dropped: gradients, the scaler's
 * iteration, the forward's buffer updates and draws, the cached blocks. */
static kiln_status undo_attempt(train_run *r) {
    kiln_status st = kiln_optimizer_zero_grad(r->opt, true);
    kiln_grad_scaler_abandon_step(r->scaler);
    if (st == KILN_OK) st = kiln_step_snapshot_restore(r->snapshot);
    kiln_device devs[KILN_NN_MAX_PLACE_STAGES + 2];
    int n = step_devices(r, devs, KILN_NN_MAX_PLACE_STAGES + 2);
    for (int i = 0; i < n && st == KILN_OK; i++) st = kiln_empty_cache(devs[i]);
    return st;
}

/* "12.0 MiB reserved at the peak, against a limit of 10.0 MiB, on cpu",
 * for the first device that has run out of memory. */
static void describe_peak(const train_run *r, char *buf, size_t size) {
    kiln_device devs[KILN_NN_MAX_PLACE_STAGES + 2];
    int n = step_devices(r, devs, KILN_NN_MAX_PLACE_STAGES + 2);
    snprintf(buf, size, "no allocator statistics");
    for (int i = 0; i < n; i++) {
        kiln_memory_stats ms;
        if (kiln_memory_stats_get(devs[i], &ms) || ms.num_ooms == 0) continue;
        char dev[32];
        kiln_device_str(devs[i], dev, sizeof dev);
        double mib = 1024.0 * 1024.0, peak = (double)ms.reserved_bytes[KILN_POOL_ALL].peak / mib;
        if (ms.limit_bytes)
            snprintf(buf, size, "%.1f MiB reserved at the peak, against a limit of %.1f MiB, on %s", peak,
                     (double)ms.limit_bytes / mib, dev);
        else
            snprintf(buf, size, "%.1f MiB reserved at the peak on %s, all it had", peak, dev);
        return;
    }
}

kiln_status train_oom_backward(train_run *r, kiln_tensor *x, kiln_tensor *y, kiln_tensor **loss, kiln_tensor **hits) {
    if (r->step == 2) train_plan_check(r); /* the two steps before, against the plan */
    kiln_status st = r->snapshot ? kiln_step_snapshot_retake(r->snapshot) : KILN_OK;
    if (st != KILN_OK) return st;
    int64_t n = kiln_size(x, 0);
    for (;;) {
        st = train_amp_backward(r, x, y, loss, hits);
        if (st != KILN_ERR_OUT_OF_MEMORY || !r->snapshot) return st;
        char what[1024];
        snprintf(what, sizeof what, "%s", kiln_error_message());
        int64_t micro = (n + r->accum_live - 1) / r->accum_live;
        int grown = (int64_t)r->accum_live * 2 < n ? r->accum_live * 2 : (int)n;
        if (micro <= 1 || grown <= r->accum_live) {
            char peak[160];
            describe_peak(r, peak, sizeof peak);
            /* The library's error (the allocation that failed) stays set:
             * the caller prints it after this. */
            fprintf(stderr,
                    "kiln train: out of memory with a micro-batch of %lld sample%s (batch %lld, accumulation %d), "
                    "nothing left to halve: %s; use a smaller model, --checkpoint N, --amp, or a device with more "
                    "memory\n",
                    (long long)micro, micro == 1 ? "" : "s", (long long)n, r->accum_live, peak);
            return st;
        }
        r->planned = false; /* the peaks are the failed attempt's */
        if ((st = undo_attempt(r)) != KILN_OK) return st;
        r->accum_live = grown;
        int64_t now = (n + r->accum_live - 1) / r->accum_live;
        fprintf(stderr,
                "kiln train: out of memory at a micro-batch of %lld (%s); retrying the step with micro-batches of "
                "%lld (accumulation %d, the batch of %lld unchanged)\n",
                (long long)micro, what, (long long)now, r->accum_live, (long long)n);
        train_metric(r, "{\"event\":\"auto_batch\",\"step\":%lld,\"micro_batch\":%lld,\"accum\":%d}\n", (long long)r->step,
                     (long long)now, r->accum_live);
    }
}

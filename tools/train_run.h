/* The state of one kiln train run, shared by tools/train.c (the loop,
 * checkpoints, metrics) and tools/train_diag.c (the diagnostics switches). */
#ifndef KILN_TOOLS_TRAIN_RUN_H
#define KILN_TOOLS_TRAIN_RUN_H

#include <limits.h>
#include <pthread.h>
#include <stdio.h>

#include "kiln/kiln.h"

typedef struct train_args {
    int epochs, accum, log_every, workers, profile_steps;
    int64_t batch, limit, max_steps;
    double lr;
    uint64_t seed;
    bool seed_given, deterministic, monitor, detect_leaks, detect_anomaly, memory_history;
    const char *model, *data, *out, *resume;
} train_args;

typedef struct train_run {
    train_args a;
    char out_dir[PATH_MAX];
    char ckpt_path[PATH_MAX + 32];
    FILE *metrics;
    pthread_mutex_t metrics_lock;
    kiln_device dev;
    kiln_module *model;
    char *spec_text;
    kiln_sample_info info;
    kiln_optimizer *opt;
    kiln_dataset *train_ds, *test_ds;
    kiln_loader *train_ld, *test_ld;
    bool tty, monitoring, profiling, trace_ready;
    int64_t step;
    int start_epoch;
    int64_t skip_batches;     /* resume: batches of start_epoch already trained */
    double resume_loss_sum;   /* resume: the epoch's loss sum before the stop */
    int64_t resume_images;
    double t0;
} train_run;

/* Seconds on the monotonic clock. */
double train_now_s(void);
/* One JSON line into metrics.jsonl, under the run's lock (the monitor
 * thread writes too). */
void train_metric(train_run *r, const char *fmt, ...);

/* The diagnostics switches (train_diag.c). */
kiln_status train_diag_begin(train_run *r);
/* After each optimizer step (its scope closed); *leak_reported is set once
 * a leak has been printed. */
kiln_status train_diag_step(train_run *r, bool *leak_reported);
void train_diag_end(train_run *r, bool leak_reported);

#endif

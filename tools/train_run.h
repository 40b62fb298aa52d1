/* The state of one kiln train run, shared by tools/train.c (the loop,
 * checkpoints, metrics) and tools/train_diag.c (the diagnostics switches). */
#ifndef KILN_TOOLS_TRAIN_RUN_H
#define KILN_TOOLS_TRAIN_RUN_H

#include <limits.h>
#include <pthread.h>
#include <stdio.h>

#include "kiln/kiln.h"
#include "timing.h"
#include "train.h"

/* --amp (train_amp.c). */
typedef enum train_amp_mode { TRAIN_AMP_AUTO = 0, TRAIN_AMP_OFF, TRAIN_AMP_F16, TRAIN_AMP_BF16 } train_amp_mode;

/* The flags that fix a run's math, as bits of train_args.given: set when
 * the flag was on the command line (not a default, not from a checkpoint). */
enum {
    TRAIN_GIVEN_DATA = 1 << 0,
    TRAIN_GIVEN_LIMIT = 1 << 1,
    TRAIN_GIVEN_BATCH = 1 << 2,
    TRAIN_GIVEN_ACCUM = 1 << 3,
    TRAIN_GIVEN_EPOCHS = 1 << 4,
    TRAIN_GIVEN_LR = 1 << 5,
    TRAIN_GIVEN_SEED = 1 << 6,
    TRAIN_GIVEN_SCHEDULE = 1 << 7,
    TRAIN_GIVEN_SMOOTHING = 1 << 8,
    TRAIN_GIVEN_AMP = 1 << 9,
    TRAIN_GIVEN_CHECKPOINT = 1 << 10,
    TRAIN_GIVEN_DETERMINISTIC = 1 << 11,
    TRAIN_GIVEN_LOG_EVERY = 1 << 12,
    TRAIN_GIVEN_DATASET = 1 << 13,
    TRAIN_GIVEN_AUGMENT = 1 << 14,
};

/* --epochs at most (the checkpoint's epoch range, kiln/io.h). */
#define TRAIN_MAX_EPOCHS KILN_CHECKPOINT_MAX_EPOCH

typedef struct train_args {
    int epochs, accum, log_every, workers, profile_steps;
    int64_t batch, limit, max_steps;
    double lr;
    uint64_t seed;
    bool seed_given, deterministic, monitor, detect_leaks, detect_anomaly, memory_history;
    bool no_auto_batch; /* --no-auto-batch: an out-of-memory in a step ends the run (train_oom.c) */
    bool no_plan;       /* --no-plan: no plan before the first step (train_plan.c) */
    const char *model, *data, *out, *resume;
    const char *device; /* --device (default: KILN_DEVICE, else kiln_default_device) */
    const char *devices; /* --devices LIST: DataParallel (train_devices.c) */
    const char *split;   /* --split LAYER:DEVICE,...: the layers placed in stages (train_devices.c) */
    int micro_batches;   /* --micro-batches K with --split (0: not given; 1 then) */
    train_amp_mode amp; /* --amp (default auto) */
    int checkpoint;        /* --checkpoint N (0: off) */
    bool checkpoint_auto;  /* --checkpoint auto */
    int64_t memory_budget; /* --memory-budget, bytes */
    bool onecycle;          /* --schedule onecycle (default) | constant */
    double label_smoothing; /* --label-smoothing (default 0.1) */
    int progress;           /* --progress: -1 auto (a bar when stderr is a terminal), 0 lines, 1 bar */
    unsigned given;         /* TRAIN_GIVEN_* of the flags on the command line */
    train_dataset dataset;  /* --dataset (default fashion-mnist) */
    train_augment augment;  /* --augment (default auto: the dataset's recipe) */
    bool benchmark;         /* --benchmark: kiln_set_cudnn_benchmark(true) */
    int world;              /* --world N (0: whatever the launcher started); after train_dist_init the
                             * world's size, stored in the run configuration */
} train_args;

typedef struct train_run {
    train_args a;
    char out_dir[PATH_MAX];
    char ckpt_path[PATH_MAX + 32];   /* where this run writes its checkpoint */
    char resume_from[PATH_MAX + 32]; /* --resume: the checkpoint file read */
    char *config_text;               /* the run configuration stored in each checkpoint (train_config.c) */
    char *config_data;               /* --data from the resumed checkpoint's configuration (a.data points here) */
    char *made_dir;                  /* the first directory open_output created, to remove after an early failure */
    bool made_metrics;               /* open_output created metrics.jsonl */
    bool metrics_truncate;           /* a new run over an old metrics.jsonl: emptied at the first record */
    FILE *metrics;
    pthread_mutex_t metrics_lock;
    kiln_device dev;     /* the loader's device: --device, the first of --devices, --split's first stage */
    kiln_module *model;  /* the plain model: its state dict is the checkpoint's */
    kiln_module *net;    /* what the forward runs: the DataParallel wrapper of model, else model */
    kiln_device out_dev; /* where the output, labels and loss live: --split's last stage, else dev */
    int n_devices;       /* --devices' devices, or --split's stages (0: neither flag) */
    kiln_device devices[KILN_NN_MAX_PLACE_STAGES];
    int split_first[KILN_NN_MAX_PLACE_STAGES]; /* --split: each stage's first layer */
    char *spec_text;
    kiln_sample_info info;
    kiln_optimizer *opt;
    kiln_lr_scheduler *sched;   /* one-cycle over every step of the run, or NULL */
    int64_t sched_total;        /* its total steps */
    kiln_loss_opts loss_opts;   /* the training loss (label smoothing) */
    kiln_dataset *train_ds, *test_ds;
    kiln_loader *train_ld, *test_ld;
    int loader_workers;       /* the training loader's, auto resolved */
    bool tty, monitoring, profiling, trace_ready;
    int64_t step;
    int start_epoch;
    int64_t skip_batches;     /* resume: batches of start_epoch already trained */
    kiln_train_state resumed; /* resume: the checkpoint's running sums (its strings freed: NULL) */
    double t0;                /* kiln_cmd_train's start: wall_s counts from here */
    double train_s;           /* the training loops so far (train_s in the summary) */
    kiln_dtype amp;           /* the autocast dtype, KILN_F32 when mixed precision is off */
    kiln_grad_scaler *scaler; /* with amp (disabled for bf16, which needs no loss scaling) */
    int accum_live;                /* the micro-batches a step runs in: --accum, doubled by train_oom.c */
    kiln_step_snapshot *snapshot;  /* what a failed step's retry restores (NULL: --no-auto-batch) */
    bool planned;                  /* train_plan.c: a plan to hold the first two steps against */
    int64_t plan_reserved, plan_allocated; /* its device peaks, bytes */
    /* Several processes (train_dist.c). */
    int rank, world;               /* this process's rank and the ranks (1: no DDP) */
    bool dist_up;                  /* kiln_dist_init succeeded: shut down at the end */
    kiln_dist_group *group;        /* the world, when world > 1 */
    kiln_ddp *ddp;                 /* the model under DDP, when world > 1 */
    int64_t padded;                /* the epoch's positions over all ranks after the sampler's padding */
    FILE *capture;                 /* ranks > 0: their stdout and stderr until the end */
    int saved_stdout, saved_stderr;
} train_run;

/* The command line into *a (train_args.c): 0 ok, 2 usage error (printed),
 * -1 help printed. */
int train_parse_args(int argc, char **argv, train_args *a);

/* One JSON line into metrics.jsonl, under the run's lock (the monitor
 * thread writes too). */
void train_metric(train_run *r, const char *fmt, ...);

/* The run configuration (train_config.c): the flags that fix the math,
 * as the JSON text stored in each checkpoint (kiln.run_config; NULL with a
 * message when out of memory), and on --resume the checkpoint's
 * configuration applied to every flag not given, a given flag that
 * contradicts it refused naming both values. train_config_resume returns
 * an exit code (0, 1 an unreadable or damaged checkpoint, 2 a
 * contradiction). */
char *train_config_text(const train_args *a);
int train_config_resume(train_run *r);

/* --checkpoint / --memory-budget (train_checkpoint.c): "2GiB", "512MiB",
 * "1.5e9" into bytes; apply the segments to the model (auto: plan each
 * candidate count and take the fewest segments under the budget). The
 * setup returns an exit code. */
bool train_parse_size(const char *s, int64_t *out);
int train_checkpoint_setup(train_run *r);

/* The diagnostics switches (train_diag.c). */
kiln_status train_diag_begin(train_run *r);
/* After each optimizer step (its scope closed); *leak_reported is set once
 * a leak has been printed. */
kiln_status train_diag_step(train_run *r, bool *leak_reported);
void train_diag_end(train_run *r, bool leak_reported);

/* Mixed precision (train_amp.c): parse --amp (1 ok, 0 bad value); choose
 * the mode (auto: see docs/training.md) and print it; the forward/backward
 * half of a step and the optimizer step with autocast and the loss scaler;
 * the scaler's state into and out of a checkpoint; the mode's name, the
 * current scale (1 when off; reads the device value: blocks) and the
 * steps skipped on inf/NaN. */
int train_amp_parse(const char *v, train_amp_mode *out);
kiln_status train_amp_setup(train_run *r);
kiln_status train_amp_backward(train_run *r, kiln_tensor *x, kiln_tensor *y, kiln_tensor **loss, kiln_tensor **hits);
kiln_status train_amp_step(train_run *r);
void train_amp_save(train_run *r, kiln_train_state *s);
kiln_status train_amp_resume(train_run *r, const kiln_train_state *s);
const char *train_amp_name(const train_run *r);
double train_amp_scale(train_run *r);
int64_t train_amp_skipped(const train_run *r);
/* Whether every parameter is finite, into *finite (blocks: reads them).
 * With f16 loss scaling a non-finite loss stops the run only then: the
 * scaler skips an overflowing step, but not past NaN weights. */
kiln_status train_amp_params_finite(train_run *r, bool *finite);


/* Out-of-memory recovery (train_oom.c): the snapshot made (an exit code)
 * and freed; the forward/backward half of a step (train_amp_backward)
 * run again with half the micro-batch after an out-of-memory, until it
 * fits or one sample does not. */
int train_oom_setup(train_run *r);
/* The plan before the first step (train_plan.c, called by train_oom_setup):
 * said, recorded, and the micro-batch halved until it fits the device's
 * limit (an exit code); after the second step, the measured peaks against
 * it (said once). */
int train_plan_setup(train_run *r);
/* kiln_plan_step of this run's step (steps 2) with `accum` micro-batches
 * and `checkpoint` segments (-1: the model's own setting). */
kiln_status train_plan_run(const train_run *r, int accum, int checkpoint, kiln_plan *p);
void train_plan_check(train_run *r);
void train_oom_teardown(train_run *r);
kiln_status train_oom_backward(train_run *r, kiln_tensor *x, kiln_tensor *y, kiln_tensor **loss, kiln_tensor **hits);
/* Several devices (train_devices.c): --device, --devices, --split and
 * --micro-batches checked against each other and parsed into r->dev and
 * r->devices (after the resumed configuration is applied; 0, or 2 with a
 * message naming the flag, the value and the fix); the placement or the
 * DataParallel wrapper applied to the loaded model (an exit code); the
 * labels moved to the output's device (a new scoped reference in *y); the
 * devices as text for the start line and as JSON fields for the summary
 * (",\"devices\":[...]" and the split, or "" without either flag). */
int train_devices_parse(train_run *r);
int train_devices_setup(train_run *r);
kiln_status train_devices_labels(train_run *r, kiln_tensor **y);
void train_devices_text(const train_run *r, char *buf, size_t size);
void train_devices_json(const train_run *r, char *buf, size_t size);

/* kiln train under mpirun (train_dist.c; with one rank each is a no-op or
 * the one-process path). train_dist_init joins the world (--world N or
 * KILN_WORLD_SIZE: a launch without mpirun says how; an exit code) and
 * quiets the ranks other than 0; train_dist_check refuses the flags DDP
 * does not combine with and turns the out-of-memory recovery off (an exit
 * code); train_dist_rank_batch is this rank's share of --batch;
 * train_dist_loaders gives the loaders their shards and says the per-rank
 * batch and the effective learning rate; train_dist_wrap wraps the model;
 * train_dist_epoch_begin sets the epoch's shard before the loader's epoch
 * begins; train_dist_backward is a step's forward/backward with its
 * gradients all-reduced (*loss: this rank's part of the global mean);
 * train_dist_step_rows the global batch's samples; train_dist_reduce_window
 * sums a window's device sums over the ranks (in place);
 * train_dist_agree_stop makes a stop the same on every rank;
 * train_dist_evaluate evaluates the test set split across the ranks;
 * train_dist_finish frees DDP, prints a failed rank's output and leaves
 * the world (without MPI_Finalize after a failure). All collective. */
int train_dist_init(train_run *r);
int train_dist_check(train_run *r);
int64_t train_dist_rank_batch(const train_run *r);
int train_dist_loaders(train_run *r);
int train_dist_wrap(train_run *r);
kiln_status train_dist_epoch_begin(train_run *r, int epoch);
kiln_status train_dist_backward(train_run *r, int64_t batch_index, kiln_tensor *x, kiln_tensor *y,
                                kiln_tensor **loss, kiln_tensor **hits);
int64_t train_dist_step_rows(const train_run *r, int64_t batch_index);
kiln_status train_dist_reduce_window(train_run *r, kiln_tensor *loss_sum, kiln_tensor *hits);
kiln_status train_dist_agree_stop(train_run *r, bool *stop);
kiln_status train_dist_evaluate(train_run *r, int64_t epoch, double *loss, double *acc);
void train_dist_finish(train_run *r, int rc);

/* train_window.c: the one-cycle schedule over the run's steps (replayed to
 * r->step on resume; 0 or a train_fail code) and its step after each
 * optimizer step. */
int train_schedule_setup(train_run *r);
kiln_status train_schedule_step(train_run *r);

/* A window's sums on their way to the host, with what its record and its
 * progress line need (taken when the window closed, so both describe the
 * window's last step, not the step at which its sums landed). */
typedef struct window_readback {
    bool pending;
    kiln_tensor *loss_host, *hits_host; /* pinned, reused */
    kiln_event *copied;
    int n, epoch;
    int64_t step, img;
    int64_t batch;       /* the window's last batch in its epoch (1-based) */
    double lr, img_s, wait_s, window_s, amp_scale;
    double epoch_img_s;  /* images trained this epoch since it (re)started / seconds */
    double eta_s;        /* the epoch's remaining batches at the epoch's pace so far */
    double wait_pct;     /* the loader's wait share of the epoch so far */
    long long mem_alloc, mem_res, mem_peak;
} window_readback;
void train_readback_free(window_readback *w);
/* Start the non-blocking copies of *loss and *hits (released, cleared). */
kiln_status train_readback_start(train_run *r, window_readback *w, kiln_tensor **loss, kiln_tensor **hits);
/* The pending window's sums once landed: wait when `wait`, else only if the
 * event has completed; *ready says whether they were read. */
kiln_status train_readback_finish(window_readback *w, bool wait, double *loss, double *hits, bool *ready);
/* Write the window's metrics record; returns its mean loss. */
double train_window_record(train_run *r, const window_readback *w, double wl, double wh);

#endif

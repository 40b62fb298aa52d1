/* kiln train: train a model spec on Fashion-MNIST with Adam, evaluate on
 * the test set after each epoch, log metrics as JSON lines, write
 * checkpoints and print a summary (docs/training.md).
 *
 * With no arguments it trains the tutorial CNN (models/
 * tutorial_cnn_28x28x1.txt) with the default recipe: 3 epochs, batch 128,
 * Adam with a one-cycle schedule (warm-up over 30% of the steps to the peak
 * lr 3e-3, cosine down), label smoothing 0.1 (docs/training.md, "The
 * default recipe"). Output goes to runs/<timestamp>/ (metrics.jsonl,
 * checkpoint.safetensors after every epoch, model.safetensors at the end,
 * trace.json with --profile).
 *
 * Losses and correct counts accumulate on the device; at the end of each
 * --log-every window they go to pinned host memory by non-blocking copies
 * behind an event, and the window's record (and, without a TTY, its
 * progress line, with that window's step and loss) is written once the
 * event has completed (checked without blocking at later steps; the epoch's
 * last window waits). So no step waits for the device to display a loss.
 * Ctrl-C finishes the step, writes a checkpoint and exits 130; --resume
 * continues from one. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>


#include "base/error.h"
#include "kiln/kiln.h"
#include "timing.h"
#include "train.h"
#include "train_run.h"



static volatile sig_atomic_t interrupted;

/* Ctrl-C. SIGINT is blocked in every thread of the run (the loader's and
 * OpenMP's workers inherit the mask), so no system call in them is
 * interrupted by it; one thread takes it with sigwait. A handler is
 * installed as well: it replaces an inherited SIG_IGN (a shell starts
 * background jobs with SIGINT ignored) and serves threads the process did
 * not create with the mask (a sanitizer's). The first Ctrl-C asks for a
 * checkpoint after the current step; a second one kills the process the
 * default way. */
static void second_interrupt(void) {
    signal(SIGINT, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    raise(SIGINT);
}

static void on_sigint(int sig) {
    (void)sig;
    if (interrupted) second_interrupt();
    interrupted = 1;
}

typedef struct sigint_watch {
    pthread_t thread;
    sigset_t set, old_mask;
    struct sigaction old_action;
    volatile sig_atomic_t stopping;
    bool running;
} sigint_watch;

static void *sigint_thread(void *arg) {
    sigint_watch *w = arg;
    for (;;) {
        int sig = 0;
        if (sigwait(&w->set, &sig) != 0 || w->stopping) return NULL;
        if (interrupted) {
            second_interrupt();
            return NULL;
        }
        interrupted = 1;
    }
}

static void sigint_watch_start(sigint_watch *w) {
    sigemptyset(&w->set);
    sigaddset(&w->set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &w->set, &w->old_mask);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &w->old_action);
    w->stopping = 0;
    w->running = pthread_create(&w->thread, NULL, sigint_thread, w) == 0;
}

static void sigint_watch_stop(sigint_watch *w) {
    if (w->running) {
        w->stopping = 1;
        pthread_kill(w->thread, SIGINT);
        pthread_join(w->thread, NULL);
    }
    /* A Ctrl-C that came after the watcher stopped is dropped, not turned
     * into a kill when the caller's mask comes back. */
    struct timespec zero = {0, 0};
    while (sigtimedwait(&w->set, NULL, &zero) > 0) continue;
    sigaction(SIGINT, &w->old_action, NULL);
    pthread_sigmask(SIG_SETMASK, &w->old_mask, NULL);
}

int train_fail(const char *cmd, const char *what) {
    const kiln_error *e = kiln_error_last();
    fprintf(stderr, "kiln %s: %s: %s\n", cmd, what, e->message);
    if (e->hint[0]) fprintf(stderr, "  hint: %s\n", e->hint);
    return 1;
}

static int fail(const char *what) { return train_fail("train", what); }

/* ---- Output -------------------------------------------------------------------------------- */

/* mkdir -p; *made gets the first directory it created (malloc'd; NULL
 * when all existed), the one to remove after an early failure. */
static int make_dirs(const char *path, char **made) {
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", path);
    *made = NULL;
    for (char *p = tmp + 1;; p++) {
        if (*p && *p != '/') continue;
        char c = *p;
        *p = '\0';
        if (mkdir(tmp, 0755) == 0) {
            if (!*made) *made = strdup(tmp);
        } else if (errno != EEXIST) {
            return -1;
        }
        if (!c) return 0;
        *p = '/';
    }
}

/* Create the output directory and open metrics.jsonl before any training,
 * so an unwritable place is reported at once. A resumed run appends. What
 * this creates is remembered, for remove_empty_output. */
static int open_output(train_run *r) {
    if (r->a.out) {
        snprintf(r->out_dir, sizeof r->out_dir, "%s", r->a.out);
    } else {
        time_t t = time(NULL);
        struct tm tm;
        localtime_r(&t, &tm);
        strftime(r->out_dir, sizeof r->out_dir, "runs/%Y%m%d-%H%M%S", &tm);
    }
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/metrics.jsonl", r->out_dir);
    struct stat sb;
    int made = make_dirs(r->out_dir, &r->made_dir);
    bool existed = made == 0 && lstat(path, &sb) == 0;
    /* Opened for appending: a new run's truncation waits for its first
     * record (train_metric), so a run that fails before it leaves an
     * earlier run's metrics.jsonl there as it was. O_NONBLOCK: a FIFO
     * without a reader fails at once instead of blocking the open. */
    struct stat target;
    bool irregular = existed && stat(path, &target) == 0 && !S_ISREG(target.st_mode);
    int fd = made == 0 && !irregular ? open(path, O_WRONLY | O_APPEND | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0644) : -1;
    if (fd < 0 && !irregular) {
        if (made == 0)
            fprintf(stderr, "kiln train: cannot write %s: %s (remove it, or choose another --out DIR)\n", path,
                    strerror(errno));
        else
            fprintf(stderr, "kiln train: cannot write to output directory %s: %s (choose another with --out DIR)\n",
                    r->out_dir, strerror(errno));
        return 1;
    }
    if (irregular || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || fcntl(fd, F_SETFL, O_APPEND) != 0 ||
        !(r->metrics = fdopen(fd, "a"))) {
        fprintf(stderr, "kiln train: %s is not a regular file (a FIFO, a device or a directory): metrics are "
                        "written to a regular file; remove it or choose another --out DIR\n", path);
        if (fd >= 0) close(fd);
        return 1;
    }
    r->made_metrics = !existed;
    r->metrics_truncate = !r->a.resume && existed;
    snprintf(r->ckpt_path, sizeof r->ckpt_path, "%s/checkpoint.safetensors", r->out_dir);
    return 0;
}

/* After a run that failed before writing anything: remove the empty
 * metrics.jsonl and the directories this run created (rmdir: only when
 * empty). A file or directory that was there before is never touched. */
static void remove_empty_output(train_run *r) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/metrics.jsonl", r->out_dir);
    struct stat sb;
    if (r->made_metrics && stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size == 0) unlink(path);
    if (!r->made_dir) return;
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", r->out_dir);
    for (size_t n = strlen(dir); n > 1 && dir[n - 1] == '/'; n--) dir[n - 1] = '\0';
    size_t top = strlen(r->made_dir);
    /* From the deepest directory up to the first one created. */
    while (strlen(dir) >= top && rmdir(dir) == 0) {
        char *slash = strrchr(dir, '/');
        if (!slash || (size_t)(slash - dir) < top) break;
        *slash = '\0';
    }
}

/* One JSON line into metrics.jsonl (the monitor thread writes too). */
void train_metric(train_run *r, const char *fmt, ...) {
    if (!r->metrics) return; /* ranks other than 0 write none */
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&r->metrics_lock);
    if (r->metrics_truncate && ftruncate(fileno(r->metrics), 0) == 0) r->metrics_truncate = false;
    vfprintf(r->metrics, fmt, ap);
    fflush(r->metrics);
    pthread_mutex_unlock(&r->metrics_lock);
    va_end(ap);
}

static void fmt_duration(double s, char *buf, size_t size) {
    long t = s > 0 ? (long)(s + 0.5) : 0;
    if (t >= 3600) snprintf(buf, size, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else snprintf(buf, size, "%ldm%02lds", t / 60, t % 60);
}

/* A non-TTY progress line: one per window, written when the window's sums
 * have landed, with the window's own step and loss. */
static void progress_line(const train_run *r, const window_readback *w, double loss, int64_t nb) {
    char eta[32];
    fmt_duration(w->eta_s, eta, sizeof eta);
    fprintf(stderr, "epoch %d/%d step %lld/%lld loss %.4f %.0f img/s ETA %s mem %.0f MiB wait %.0f%%\n", w->epoch,
            r->a.epochs, (long long)w->batch, (long long)nb, loss, w->epoch_img_s, eta,
            (double)w->mem_alloc / (1 << 20), w->wait_pct);
    fflush(stderr);
}

/* ---- Training ------------------------------------------------------------------------------ */

/* Add `v` (a scoped device scalar) into *acc, kept past the scope. */
static kiln_status accumulate(kiln_tensor **acc, kiln_tensor *v, const double *carry) {
    /* A window carried over a stop starts from its sum so far, in v's
     * dtype: the same additions, in the same order, as without the stop. */
    kiln_tensor *base = NULL;
    if (!*acc && carry && !(base = kiln_full(kiln_shape_of(v), *carry, kiln_dtype_of(v), kiln_get_device(v))))
        return kiln_error_last()->status;
    kiln_tensor *prev = *acc ? *acc : base;
    kiln_tensor *sum = prev ? kiln_add(prev, v) : kiln_retain(v);
    if (!sum) return kiln_error_last()->status;
    if (prev) kiln_keep(sum);
    kiln_release(*acc);
    *acc = sum;
    return KILN_OK;
}

typedef enum { EPOCH_DONE, EPOCH_STOPPED } epoch_end;

/* One epoch's running state: its batches and images, the open metrics
 * window (sums on the device), the closed window whose sums are on their
 * way to the host, and the latest landed loss the progress bar shows. */
typedef struct epoch_state {
    int epoch;
    int64_t nb, i, i0;        /* batches: in the epoch, done, skipped on resume */
    int64_t images, img_base; /* images of the epoch; img_base of them trained before a stop */
    int64_t hits_img;         /* images since the epoch (re)started: train_acc's denominator */
    double t0;                /* the first step's start (after skipped batches) */
    double loss_sum, correct; /* landed windows' sums (loss_sum from before a stop too) */
    kiln_tensor *win_loss, *win_hits; /* the open window's device sums */
    int win_n;
    int64_t win_img;
    int64_t win_img0;         /* of win_img, images carried over from before a stop (not this run's work) */
    bool carry;               /* resumed mid-window: the window's sums so far start the device sums */
    double carry_loss, carry_hits;
    double win_t0, win_wait0;
    window_readback rb;       /* the closed window on its way */
    bool landed;              /* a window of this epoch has landed: shown_* are set */
    double shown_loss;
    int64_t shown_batch;
    double last_draw;         /* the TTY bar's last redraw */
} epoch_state;

/* Land the closed window's sums (wait for them when `wait`, else only if
 * they are there) and write its record and, without a TTY, its progress
 * line: the one writer of both. */
static kiln_status window_land(train_run *r, epoch_state *e, bool wait) {
    double wl = 0, wh = 0;
    bool ready = false;
    KILN_TRY(train_readback_finish(&e->rb, wait, &wl, &wh, &ready));
    if (!ready) return KILN_OK;
    e->shown_loss = train_window_record(r, &e->rb, wl, wh);
    /* A loss that is no longer finite will not come back: stop, naming the
     * window. With f16 loss scaling the scaler skips such steps, which
     * helps only while the parameters are finite: an f16 overflow in one
     * batch passes, NaN weights (a diverged run's, a resumed checkpoint's)
     * stop the run as they do without it. */
    if (!isfinite(e->shown_loss)) {
        bool weights_ok = false;
        if (r->amp == KILN_F16) KILN_TRY(train_amp_params_finite(r, &weights_ok));
        if (!weights_ok)
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                              "lower --lr, or rerun with --detect-anomaly to name the op that made the first NaN/inf",
                              "the training loss became %g in the window ending at step %lld%s", e->shown_loss,
                              (long long)r->step,
                              r->amp == KILN_F16 ? ", and the parameters hold NaN/inf, which f16 loss scaling "
                                                   "cannot skip past"
                                                 : "");
    }
    e->shown_batch = e->rb.batch;
    e->landed = true;
    e->loss_sum += wl, e->correct += wh;
    if (!r->tty) progress_line(r, &e->rb, e->shown_loss, e->nb);
    return KILN_OK;
}

/* Close the open window at time t: take what its record shows and start
 * its sums' copies to the host. The previous window has landed. */
static kiln_status window_close(train_run *r, epoch_state *e, double t) {
    kiln_loader_stats ls;
    kiln_loader_stats_get(r->train_ld, &ls);
    kiln_memory_stats ms;
    memset(&ms, 0, sizeof ms);
    kiln_memory_stats_get(r->dev, &ms);
    window_readback *w = &e->rb;
    double elapsed = t - e->t0;
    w->n = e->win_n, w->epoch = e->epoch + 1, w->step = r->step, w->img = e->win_img, w->batch = e->i;
    w->lr = kiln_optimizer_get_lr(r->opt), w->img_s = (double)(e->win_img - e->win_img0) / (t - e->win_t0);
    w->wait_s = ls.wait_s - e->win_wait0, w->window_s = t - e->win_t0;
    /* Since the epoch (re)started: a resumed epoch's batches and images
     * from before the stop are not this run's work. */
    w->epoch_img_s = elapsed > 0 ? (double)(e->images - e->img_base) / elapsed : 0;
    w->eta_s = e->i > e->i0 ? elapsed / (double)(e->i - e->i0) * (double)(e->nb - e->i) : 0;
    w->wait_pct = ls.elapsed_s > 0 ? 100 * ls.wait_s / ls.elapsed_s : 0;
    w->mem_alloc = (long long)ms.allocated_bytes[KILN_POOL_ALL].current;
    w->mem_res = (long long)ms.reserved_bytes[KILN_POOL_ALL].current;
    w->mem_peak = (long long)ms.allocated_bytes[KILN_POOL_ALL].peak;
    w->amp_scale = train_amp_scale(r);
    KILN_TRY(train_dist_reduce_window(r, e->win_loss, e->win_hits)); /* the ranks' sums */
    e->win_n = 0, e->win_img = e->win_img0 = 0, e->win_t0 = t, e->win_wait0 = ls.wait_s;
    return train_readback_start(r, w, &e->win_loss, &e->win_hits);
}

/* The TTY bar: the batch now, and the latest landed window's loss with
 * the batch it belongs to ("–" until one has landed this epoch). */
static void progress_bar(train_run *r, const epoch_state *e, double t) {
    kiln_loader_stats ls;
    kiln_loader_stats_get(r->train_ld, &ls);
    double elapsed = t - e->t0;
    char eta[32], loss[48];
    fmt_duration(e->i > e->i0 ? elapsed / (double)(e->i - e->i0) * (double)(e->nb - e->i) : 0, eta, sizeof eta);
    if (e->landed) snprintf(loss, sizeof loss, "%.4f@%lld", e->shown_loss, (long long)e->shown_batch);
    else snprintf(loss, sizeof loss, "\xe2\x80\x93");
    int width = 24, fill = e->nb ? (int)(width * e->i / e->nb) : width;
    char bar[32];
    for (int k = 0; k < width; k++) bar[k] = k < fill ? '#' : '.';
    bar[width] = '\0';
    fprintf(stderr, "\repoch %d/%d [%s] %lld/%lld loss %s %.0f img/s ETA %s mem %.0f MiB wait %.0f%%  ",
            e->epoch + 1, r->a.epochs, bar, (long long)e->i, (long long)e->nb, loss,
            elapsed > 0 ? (double)(e->images - e->img_base) / elapsed : 0, eta,
            (double)kiln_memory_allocated(r->dev) / (1 << 20), ls.elapsed_s > 0 ? 100 * ls.wait_s / ls.elapsed_s : 0);
    fflush(stderr);
}

/* ---- Checkpoints ----------------------------------------------------------------------- */

/* A checkpoint at batch `batch_in_epoch` of `epoch`. With e (a stop
 * mid-epoch) it holds the epoch's running sums and the open window's
 * (read from the device: blocks), so the resumed run's epoch and window
 * records are the uninterrupted run's; at an epoch boundary they are 0. */
static kiln_status save_checkpoint(train_run *r, int epoch, int64_t batch_in_epoch, const epoch_state *e) {
    if (r->rank != 0) return KILN_OK;
    kiln_train_state s = {.epoch = epoch,
                          .step = r->step,
                          .batch_in_epoch = batch_in_epoch,
                          .epochs_done = epoch,
                          .data_seed = r->a.seed,
                          .input_c = r->info.channels,
                          .input_h = r->info.height,
                          .input_w = r->info.width,
                          .model_spec = r->spec_text,
                          .run_config = r->config_text};
    if (e) {
        s.epoch_loss_sum = e->loss_sum, s.epoch_correct = e->correct, s.epoch_images = e->images;
        s.window_steps = e->win_n, s.window_images = e->win_img;
        if (e->win_loss) KILN_TRY(kiln_item(e->win_loss, &s.window_loss_sum));
        if (e->win_hits) KILN_TRY(kiln_item(e->win_hits, &s.window_correct));
        if (e->carry) s.window_loss_sum = e->carry_loss, s.window_correct = e->carry_hits;
    }
    train_amp_save(r, &s);
    KILN_TRY(kiln_checkpoint_save(r->ckpt_path, r->model, r->opt, &s));
    train_metric(r,
                 "{\"event\":\"checkpoint\",\"path\":\"checkpoint.safetensors\",\"epoch\":%d,\"step\":%lld,"
                 "\"batch_in_epoch\":%lld}\n",
                 epoch + 1, (long long)r->step, (long long)batch_in_epoch);
    return KILN_OK;
}

/* Resume mid-epoch: the loader's order is a function of (seed, epoch);
 * the batches already trained are drawn and dropped. */
static kiln_status skip_batches(train_run *r, epoch_state *e) {
    kiln_status st = KILN_OK;
    for (; e->i < r->skip_batches && st == KILN_OK; e->i++) {
        kiln_scope_begin();
        kiln_tensor *x = NULL, *y = NULL;
        st = kiln_loader_next(r->train_ld, &x, &y);
        bool end = st == KILN_OK && !x;
        kiln_scope_end();
        if (end)
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "resume with the --limit and --batch of the interrupted run",
                              "the checkpoint stopped %lld batches into epoch %d, but this run's epoch has %lld",
                              (long long)r->skip_batches, e->epoch + 1, (long long)e->nb);
    }
    /* The sums of the batches trained before the stop, and the window
     * that was open then, carried on (kiln_train_state). */
    const kiln_train_state *s = &r->resumed;
    e->loss_sum = s->epoch_loss_sum, e->correct = s->epoch_correct;
    e->images = e->img_base = e->hits_img = s->epoch_images;
    e->win_n = (int)s->window_steps, e->win_img = e->win_img0 = s->window_images;
    e->carry = s->window_steps > 0, e->carry_loss = s->window_loss_sum, e->carry_hits = s->window_correct;
    return st;
}

/* One optimizer step on the next batch; *b is its images (0: the epoch's
 * batches are done). */
static kiln_status train_step(train_run *r, epoch_state *e, int64_t *b) {
    kiln_scope_begin();
    kiln_tensor *x = NULL, *y = NULL, *loss = NULL, *hits = NULL;
    kiln_status st = kiln_loader_next(r->train_ld, &x, &y);
    *b = st == KILN_OK && x ? kiln_size(x, 0) : 0;
    if (*b) {
        kiln_range_push("step");
        st = kiln_optimizer_zero_grad(r->opt, true);
        if (st == KILN_OK) st = train_dist_backward(r, e->i, x, y, &loss, &hits);
        if (st == KILN_OK && r->ddp) *b = train_dist_step_rows(r, e->i); /* the global batch's */
        if (st == KILN_OK) st = train_amp_step(r);
        if (st == KILN_OK) st = train_schedule_step(r);
        /* A carried window's sums so far are all ranks': rank 0 adds them. */
        bool carry = e->carry && r->rank == 0;
        if (st == KILN_OK) st = accumulate(&e->win_loss, loss, carry ? &e->carry_loss : NULL);
        if (st == KILN_OK) st = accumulate(&e->win_hits, hits, carry ? &e->carry_hits : NULL);
        if (st == KILN_OK) e->carry = false;
        kiln_range_pop();
    }
    kiln_scope_end();
    return st;
}

/* The epoch's steps, with a metrics record and (without a TTY) a progress
 * line per --log-every window. A window's sums land at a later step (or,
 * for the epoch's last window, at once), so no step waits for the device
 * to show a loss. *how says whether a stop cut the epoch short. */
static kiln_status run_steps(train_run *r, epoch_state *e, epoch_end *how, bool *leak_reported) {
    kiln_loader_stats ls0;
    kiln_loader_stats_get(r->train_ld, &ls0);
    e->t0 = e->win_t0 = tool_now_s();
    e->win_wait0 = ls0.wait_s;
    kiln_status st = KILN_OK;
    for (;;) {
        int64_t b = 0;
        if ((st = train_step(r, e, &b)) != KILN_OK || !b) break;
        e->i++, r->step++, e->win_n++, e->win_img += b, e->images += b, e->hits_img += b;
        if ((st = train_diag_step(r, leak_reported)) != KILN_OK) break;
        bool max = r->a.max_steps && r->step >= r->a.max_steps, stop = interrupted || max;
        if ((st = train_dist_agree_stop(r, &stop)) != KILN_OK) break;
        if (stop && !max) interrupted = 1; /* another rank's SIGINT: every rank stops here, exits 130 */
        /* A stop mid-window leaves the window open: its sums go into the
         * checkpoint, and the resumed run closes it where the
         * uninterrupted run would have (>=: --log-every may be lower now). */
        bool last = e->i == e->nb, window_end = e->win_n >= r->a.log_every || last;
        double t = tool_now_s();
        /* The previous window lands; before the next one closes, wait for it
         * (one readback slot). */
        if ((st = window_land(r, e, window_end || stop)) != KILN_OK) break;
        if (window_end && (st = window_close(r, e, t)) != KILN_OK) break;
        if ((last || stop) && (st = window_land(r, e, true)) != KILN_OK) break;
        if (r->tty && (t - e->last_draw > 0.2 || e->i == e->nb)) {
            progress_bar(r, e, t);
            e->last_draw = t;
        }
        if (stop) {
            *how = EPOCH_STOPPED;
            break;
        }
    }
    r->train_s += tool_now_s() - e->t0;
    if (r->tty && e->i > e->i0) fprintf(stderr, "\n");
    return st;
}

/* One epoch: its steps, then the test-set evaluation, the epoch record and
 * a checkpoint. *how says whether it was cut short (Ctrl-C or --max-steps:
 * a checkpoint written mid-epoch). *images gains the images trained. */
static kiln_status run_epoch(train_run *r, int epoch, double *test_acc, int64_t *images, epoch_end *how,
                             bool *leak_reported) {
    *how = EPOCH_DONE;
    epoch_state e = {.epoch = epoch};
    kiln_status st = train_dist_epoch_begin(r, epoch);
    if (st == KILN_OK) st = kiln_loader_epoch_begin(r->train_ld, epoch);
    if (st != KILN_OK) return st;
    e.nb = kiln_loader_num_batches(r->train_ld);
    if (epoch == r->start_epoch && r->skip_batches > 0) st = skip_batches(r, &e);
    e.i0 = e.i;
    if (st == KILN_OK) st = run_steps(r, &e, how, leak_reported);
    if (st == KILN_OK && *how == EPOCH_STOPPED) st = train_dist_reduce_window(r, e.win_loss, e.win_hits);
    if (st == KILN_OK && *how == EPOCH_STOPPED) st = save_checkpoint(r, epoch, e.i, &e);
    kiln_release(e.win_loss);
    kiln_release(e.win_hits);
    train_readback_free(&e.rb);
    if (st != KILN_OK || *how == EPOCH_STOPPED) {
        if (st == KILN_OK) *images += e.images - e.img_base;
        return st;
    }
    *images += e.images - e.img_base;
    double train_time = tool_now_s() - e.t0, test_loss = 0;
    st = train_dist_evaluate(r, epoch, &test_loss, test_acc);
    if (st != KILN_OK) return st;
    double epoch_time = tool_now_s() - e.t0;
    double train_loss = e.i ? e.loss_sum / (double)e.i : 0;
    train_metric(r,
                 "{\"event\":\"epoch\",\"epoch\":%d,\"train_loss\":%.9g,\"train_acc\":%.6f,\"test_loss\":%.9g,"
                 "\"test_acc\":%.6f,\"train_s\":%.3f,\"epoch_s\":%.3f}\n",
                 epoch + 1, train_loss, e.hits_img ? e.correct / (double)e.hits_img : 0, test_loss, *test_acc,
                 train_time, epoch_time);
    fprintf(stderr, "epoch %d/%d: train loss %.4f, test loss %.4f, test accuracy %.2f%% (%.1f s)\n", epoch + 1,
            r->a.epochs, train_loss, test_loss, 100 * *test_acc, epoch_time);
    return save_checkpoint(r, epoch + 1, 0, NULL);
}

/* The line (1-based) where two spec texts first differ. */
static int first_difference(const char *a, const char *b) {
    int line = 1;
    for (; *a && *a == *b; a++, b++) line += *a == '\n';
    return line;
}

/* The model: --model, else the spec stored in the resumed checkpoint,
 * else the default. With --resume, --model must hold the stored spec. */
static int load_model(train_run *r) {
    char model_buf[PATH_MAX];
    const char *model = r->a.model, *from_ckpt = NULL;
    char *stored = NULL;
    if (r->a.resume && kiln_checkpoint_read_meta(r->resume_from, "kiln.model_spec", &stored) != KILN_OK)
        return fail("resume");
    if (!model && stored) {
        r->spec_text = stored;
        model = from_ckpt = r->resume_from;
        stored = NULL;
    }
    if (!model) model = train_default_model(train_dataset_default_model(r->a.dataset), model_buf, sizeof model_buf);
    if (!model) {
        fprintf(stderr, "kiln train: cannot find models/%s (looked in PREFIX/share/kiln/models and the source tree); "
                        "pass --model FILE\n", train_dataset_default_model(r->a.dataset));
        return 1;
    }
    if (!r->spec_text && !(r->spec_text = train_read_text("train", model))) {
        free(stored);
        return 1;
    }
    if (stored && strcmp(stored, r->spec_text)) {
        fprintf(stderr,
                "kiln train: --resume %s: --model %s contradicts the model spec stored in the checkpoint (they "
                "differ at line %d); drop --model to continue the run as it was\n",
                r->a.resume, model, first_difference(stored, r->spec_text));
        free(stored);
        return 2;
    }
    free(stored);
    if (train_parse_spec("train", r->spec_text, model, from_ckpt, r->info.channels,
                         r->info.height, r->info.width, &r->model) != 0)
        return 1;
    return 0;
}

/* The model's output for one image must be one score per class of the
 * data: a spec whose last layer is not `linear <classes>` would fail at
 * its first step in the loss, naming no file. One forward of a zero image
 * in eval mode without autograd (no dropout draw, no running-statistics
 * update), before the optimizer exists. */
static int check_output(train_run *r, const char *model) {
    int classes = r->info.num_classes;
    kiln_scope_begin();
    kiln_module_train(r->net, false);
    kiln_no_grad_begin();
    kiln_tensor *x = kiln_zeros(KILN_SHAPE(1, r->info.channels, r->info.height, r->info.width), KILN_F32, r->dev);
    kiln_tensor *y = x ? kiln_module_forward(r->net, x) : NULL;
    if (y) r->out_dev = kiln_get_device(y); /* --split: the labels go there */
    kiln_grad_mode_end();
    kiln_module_train(r->net, true);
    int rc = 0;
    if (!y && kiln_error_last()->status == KILN_ERR_OUT_OF_MEMORY) {
        rc = fail("model");
        fprintf(stderr,
                "kiln train: one %dx%dx%d image through the model (%s) does not fit in the memory it may use: a "
                "smaller model, a larger KILN_ALLOC_CONF limit_mb, or a device with more memory\n",
                r->info.channels, r->info.height, r->info.width, model);
    } else if (!y) {
        rc = fail("model");
        fprintf(stderr, "kiln train: the model (%s) does not take the data's %dx%dx%d images\n", model,
                r->info.channels, r->info.height, r->info.width);
    } else if (classes > 0 && (kiln_ndim(y) != 2 || kiln_size(y, 1) != classes)) {
        kiln_shape sh = kiln_shape_of(y);
        char shape[160] = "(";
        for (int d = 0; d < sh.ndim; d++)
            snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld", d ? ", " : "", (long long)sh.d[d]);
        snprintf(shape + strlen(shape), sizeof shape - strlen(shape), ")");
        fprintf(stderr,
                "kiln train: the model (%s) gives %s for one %dx%dx%d image, but the data has %d classes: its last "
                "layer must be 'linear %d'\n",
                model, shape, r->info.channels, r->info.height,
                r->info.width, classes, classes);
        rc = 1;
    }
    kiln_scope_end();
    return rc;
}

/* The checkpoint to resume from: a file, or DIR/checkpoint.safetensors. */
static int resume_path(train_run *r) {
    struct stat sb;
    if (stat(r->a.resume, &sb) != 0) {
        fprintf(stderr, "kiln train: cannot resume from %s: %s\n", r->a.resume, strerror(errno));
        return 1;
    }
    if (S_ISDIR(sb.st_mode)) snprintf(r->resume_from, sizeof r->resume_from, "%s/checkpoint.safetensors", r->a.resume);
    else snprintf(r->resume_from, sizeof r->resume_from, "%s", r->a.resume);
    if (access(r->resume_from, R_OK) != 0) {
        fprintf(stderr, "kiln train: cannot resume: %s: %s\n", r->resume_from, strerror(errno));
        return 1;
    }
    return 0;
}

/* The checkpoint's model input against the data's images: a model built
 * for other images would fail at its first step, naming no file. */
static int check_input(train_run *r, const kiln_train_state *s) {
    if (!s->input_c || (s->input_c == r->info.channels && s->input_h == r->info.height && s->input_w == r->info.width))
        return 0;
    char file[PATH_MAX + 64];
    train_split_file(r->a.dataset, r->a.data, "train", file, sizeof file);
    fprintf(stderr,
            "kiln train: --resume %s: the checkpoint's model takes %lldx%lldx%lld images, but the training images "
            "(%s) are %lldx%lldx%lld; pass the --data the run was trained on\n",
            r->resume_from, (long long)s->input_c, (long long)s->input_h, (long long)s->input_w, file,
            (long long)r->info.channels, (long long)r->info.height, (long long)r->info.width);
    return 1;
}

static int resume(train_run *r) {
    kiln_train_state s;
    const char *from = r->resume_from;
    if (kiln_checkpoint_load(from, r->model, r->opt, &s) != KILN_OK) return fail("resume");
    free(s.model_spec);
    free(s.run_config);
    s.model_spec = s.run_config = NULL;
    if (check_input(r, &s)) return 1;
    if (train_amp_resume(r, &s) != KILN_OK) return fail("resume");
    /* The CPU kernel table in force, as kiln_init chose it. */
    const char *now = kiln_kernels_in_force(KILN_DEVICE_CPU);
    if (s.cpu_kernels[0] && strcmp(s.cpu_kernels, now)) {
        if (r->a.deterministic) {
            fprintf(stderr,
                    "kiln train: --deterministic: %s was written with the %s CPU kernels, this run has the %s "
                    "ones; set KILN_CPU_KERNELS=%s to repeat its losses bit for bit\n",
                    from, s.cpu_kernels, now, s.cpu_kernels);
            return 1;
        }
        fprintf(stderr, "kiln train: note: %s was written with the %s CPU kernels, this run uses the %s ones\n",
                from, s.cpu_kernels, now);
    }
    if (r->a.seed != s.data_seed) {
        /* Only a format-1 checkpoint (no run configuration) gets here. */
        if (r->a.seed_given)
            fprintf(stderr, "kiln train: --seed %llu ignored: the checkpoint's data seed %llu continues\n",
                    (unsigned long long)r->a.seed, (unsigned long long)s.data_seed);
        r->a.seed = s.data_seed;
    }
    /* The running sums count images of this dataset. */
    int64_t n = kiln_dataset_length(r->train_ds);
    if (s.epoch_images > n) {
        fprintf(stderr,
                "kiln train: --resume %s: metadata 'kiln.epoch_images' is %lld, more than the %lld training images: "
                "the checkpoint belongs to another dataset or --limit (pass the run's own)\n",
                from, (long long)s.epoch_images, (long long)n);
        return 1;
    }
    if (s.format_version < 2 && s.batch_in_epoch > 0)
        fprintf(stderr,
                "kiln train: note: %s (checkpoint format %d) holds no running sums: epoch %lld's record will cover "
                "only the batches trained from here\n",
                from, s.format_version, (long long)s.epoch + 1);
    r->resumed = s;
    r->step = s.step;
    r->start_epoch = (int)s.epoch;
    r->skip_batches = s.batch_in_epoch;
    fprintf(stderr, "kiln train: resuming from %s: epoch %lld, step %lld, %lld batches into the epoch\n", from,
            (long long)s.epoch + 1, (long long)s.step, (long long)s.batch_in_epoch);
    return 0;
}

/* The batch is at most the training set: a larger one is the same single
 * batch, and would only reserve pinned memory for images that are not
 * there (--batch 1000000000 asked for terabytes). */
static void clamp_batch(train_run *r) {
    int64_t n = kiln_dataset_length(r->train_ds);
    if (n <= 0 || r->a.batch <= n) return;
    fprintf(stderr, "kiln train: --batch %lld is more than the %lld training images: one batch of %lld per epoch\n",
            (long long)r->a.batch, (long long)n, (long long)n);
    r->a.batch = n;
    if (r->a.accum > n) r->a.accum = (int)n;
}

/* Everything before the first step; a non-zero return is the exit code. */
static int setup(train_run *r) {
    train_dataset kind = r->a.dataset;
    if (train_open_split(kind, r->a.data, r->a.limit, "train", &r->train_ds) != KILN_OK) return fail("training set");
    if (train_open_split(kind, r->a.data, r->a.limit, "test", &r->test_ds) != KILN_OK) return fail("test set");
    int rc = train_check_splits(kind, r->a.data, r->train_ds, r->test_ds);
    if (rc) return rc;
    r->info = kiln_dataset_info(r->train_ds);
    clamp_batch(r);
    kiln_manual_seed(r->a.seed);
    if ((rc = load_model(r))) return rc;
    if (kiln_module_to(r->model, r->dev) != KILN_OK) return fail("model");
    if ((rc = train_devices_setup(r))) return rc; /* --split's placement, --devices' DataParallel */
    if ((rc = check_output(r, r->a.model ? r->a.model : r->a.resume ? r->resume_from : "the default model")))
        return rc;
    kiln_tensor **params = NULL;
    int np = 0;
    if (kiln_module_parameters(r->model, &params, &np) != KILN_OK) return fail("model");
    kiln_adam_opts ao = kiln_adam_defaults();
    ao.lr = r->a.lr;
    r->opt = kiln_adam(params, np, &ao);
    free(params);
    if (!r->opt) return fail("optimizer");
    r->loss_opts = kiln_loss_defaults();
    r->loss_opts.label_smoothing = r->a.label_smoothing;
    if (train_amp_setup(r) != KILN_OK) return fail("mixed precision");
    if (r->a.resume && (rc = resume(r))) return rc;
    int64_t test_n = kiln_dataset_length(r->test_ds);
    int64_t batch = train_dist_rank_batch(r); /* --batch, or this rank's share of it */
    if (train_make_loader(kind, r->a.augment, r->train_ds, r->dev, batch, true, r->a.seed, r->a.workers,
                          &r->train_ld) != KILN_OK)
        return fail("loader");
    /* A test batch larger than the test set is the same single batch. */
    if (train_make_loader(kind, TRAIN_AUGMENT_NONE, r->test_ds, r->dev, test_n > 0 && test_n < batch ? test_n : batch,
                          false, r->a.seed, r->a.workers, &r->test_ld) != KILN_OK)
        return fail("loader");
    if ((rc = train_dist_loaders(r))) return rc; /* under mpirun: the shards */
    int64_t nb = kiln_loader_num_batches(r->train_ld);
    if (r->skip_batches > nb) {
        fprintf(stderr,
                "kiln train: --resume %s: the checkpoint stopped %lld batches into epoch %d, but an epoch here has "
                "%lld: it belongs to another dataset, --limit or --batch (pass the run's own)\n",
                r->resume_from, (long long)r->skip_batches, r->start_epoch + 1, (long long)nb);
        return 1;
    }
    if ((rc = train_checkpoint_setup(r))) return rc;
    if ((rc = train_dist_wrap(r))) return rc; /* after --checkpoint auto's measured steps */
    if ((rc = train_schedule_setup(r))) return rc;
    if ((rc = train_oom_setup(r))) return rc;
    char dev[1024];
    train_devices_text(r, dev, sizeof dev);
    kiln_loader_stats ls;
    kiln_loader_stats_get(r->train_ld, &ls);
    r->loader_workers = ls.num_workers;
    fprintf(stderr, "kiln train: %s (%lld parameters) on %s (%d compute thread%s, %d loader worker%s), %lld training "
                    "and %lld test images, %d epoch%s, batch %lld, Adam lr %g%s; output in %s\n",
            r->a.model ? r->a.model : "model", (long long)kiln_module_num_parameters(r->model),
            dev, kiln_num_threads(), kiln_num_threads() == 1 ? "" : "s",
            r->loader_workers, r->loader_workers == 1 ? "" : "s", (long long)kiln_dataset_length(r->train_ds),
            (long long)kiln_dataset_length(r->test_ds), r->a.epochs, r->a.epochs == 1 ? "" : "s",
            (long long)r->a.batch, kiln_optimizer_get_lr(r->opt), r->a.deterministic ? ", deterministic" : "",
            r->out_dir);
    train_augment aug = train_augment_resolve(kind, r->a.augment);
    if (kind != TRAIN_DATASET_FASHION_MNIST || aug != TRAIN_AUGMENT_NONE)
        fprintf(stderr, "kiln train: dataset %s, augmentation %s, per-channel mean/std normalisation\n",
                train_dataset_name(kind), train_augment_name(aug));
    return 0;
}

static void teardown(train_run *r) {
    kiln_ddp_free(r->ddp); /* its hooks are on the model's parameters */
    r->ddp = NULL;
    train_oom_teardown(r);
    if (r->monitoring) kiln_gpu_monitor_stop();
    if (r->profiling) kiln_profiler_stop();
    kiln_loader_free(r->train_ld);
    kiln_loader_free(r->test_ld);
    kiln_lr_scheduler_free(r->sched);
    kiln_optimizer_free(r->opt);
    kiln_grad_scaler_free(r->scaler);
    kiln_module_free(r->net ? r->net : r->model); /* the DataParallel wrapper holds the model */
    kiln_dataset_free(r->train_ds);
    kiln_dataset_free(r->test_ds);
    free(r->spec_text);
    free(r->config_text);
    free(r->config_data);
    r->config_text = r->config_data = NULL; /* kiln_cmd_train frees them after an early return */
    if (r->metrics) fclose(r->metrics);
}

static int train_and_report(train_run *r) {
    double acc = 0;
    int64_t images = 0;
    bool leak_reported = false;
    if (train_diag_begin(r) != KILN_OK) return fail("diagnostics");
    double t_epochs = tool_now_s();
    epoch_end how = EPOCH_DONE;
    int e = r->start_epoch;
    for (; e < r->a.epochs && how == EPOCH_DONE; e++)
        if (run_epoch(r, e, &acc, &images, &how, &leak_reported) != KILN_OK) {
            train_diag_end(r, true);
            return fail("training");
        }
    double epochs_s = tool_now_s() - t_epochs; /* steps, evaluations and checkpoints */
    train_diag_end(r, leak_reported);
    if (how == EPOCH_STOPPED) {
        fprintf(stderr, "kiln train: %s at step %lld; checkpoint %s (continue with --resume %s)\n",
                interrupted ? "interrupted" : "stopped (--max-steps)", (long long)r->step, r->ckpt_path, r->out_dir);
        return interrupted ? 130 : 0;
    }
    if (r->start_epoch >= r->a.epochs) {
        /* Nothing left to train: report the checkpoint's test accuracy. */
        double loss = 0;
        if (train_dist_evaluate(r, e, &loss, &acc) != KILN_OK) return fail("evaluation");
    }
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/model.safetensors", r->out_dir);
    if (r->rank == 0 && kiln_safetensors_save(path, r->model) != KILN_OK) return fail("weights");
    kiln_memory_stats ms;
    int64_t peak = kiln_memory_stats_get(r->dev, &ms) == KILN_OK ? ms.allocated_bytes[KILN_POOL_ALL].peak : 0;
    double wall = tool_now_s() - r->t0;
    double img_s = epochs_s > 0 ? (double)images / epochs_s : 0;
    printf("kiln train: test accuracy %.2f%%, %.1f s (training loop %.1f s), %.0f train img/s, peak memory %.1f MiB, "
           "checkpoint %s\n",
           100 * acc, wall, r->train_s, img_s, (double)peak / (1 << 20), r->ckpt_path);
    /* What each time covers: docs/training.md, "Metrics". */
    char summary[4096], devname[32], devices[3072];
    train_devices_json(r, devices, sizeof devices); /* --devices, --split */
    snprintf(summary, sizeof summary,
             "{\"event\":\"summary\",\"test_acc\":%.6f,\"wall_s\":%.3f,\"train_img_s\":%.1f,\"train_s\":%.3f,"
             "\"images\":%lld,\"peak_bytes\":%lld,\"steps\":%lld,\"epochs\":%d,\"threads\":%d,\"loader_workers\":%d,"
             "\"device\":\"%s\",\"amp\":\"%s\","
             "\"amp_scale\":%g,\"amp_skipped_steps\":%lld%s}",
             acc, wall, img_s, r->train_s, (long long)images, (long long)peak, (long long)r->step, r->a.epochs,
             kiln_num_threads(), r->loader_workers, kiln_device_str(r->dev, devname, sizeof devname), train_amp_name(r), train_amp_scale(r), (long long)train_amp_skipped(r), devices);
    train_metric(r, "%s\n", summary);
    printf("%s\n", summary); /* the last stdout line */
    return 0;
}

/* After the world is joined: the run, up to its exit code. */
static int run(train_run *r) {
    /* The resumed run's configuration, before anything is created. */
    int rc = 0;
    if (r->a.resume && ((rc = resume_path(r)) || (rc = train_config_resume(r)))) return rc;
    if (!(r->config_text = train_config_text(&r->a))) return 1;
    if (r->a.deterministic) kiln_set_deterministic(true);
    if (r->a.benchmark) kiln_set_cudnn_benchmark(true);
    /* --device, --devices, --split (train_devices.c), and what DDP takes of them. */
    if (!(rc = train_devices_parse(r))) rc = train_dist_check(r);
    if (rc) return rc;
    /* Modules, loaders and the generator follow the current device. */
    if (kiln_set_device(r->dev) != KILN_OK) return fail("device");
    r->tty = r->a.progress < 0 ? isatty(2) : r->a.progress == 1;
    sigint_watch watch;
    sigint_watch_start(&watch);
    rc = r->rank == 0 ? open_output(r) : 0; /* only rank 0 writes */
    if (!rc) rc = setup(r);
    if (!rc) rc = train_and_report(r);
    teardown(r);
    if (rc && rc != 130) remove_empty_output(r);
    sigint_watch_stop(&watch);
    return rc;
}

int kiln_cmd_train(int argc, char **argv) {
    train_run r = {.t0 = tool_now_s()};
    pthread_mutex_init(&r.metrics_lock, NULL);
    int rc = train_parse_args(argc, argv, &r.a);
    if (rc) return rc < 0 ? 0 : rc;
    /* mpirun's ranks (train_dist.c); ranks other than 0 are quiet from here. */
    if (!(rc = train_dist_init(&r))) rc = run(&r);
    free(r.config_text);
    free(r.config_data);
    free(r.made_dir);
    train_dist_finish(&r, rc);
    pthread_mutex_destroy(&r.metrics_lock);
    return rc;
}

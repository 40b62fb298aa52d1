/* kiln train: train a model spec on Fashion-MNIST with Adam, evaluate on
 * the test set after each epoch, log metrics as JSON lines, save the
 * weights as safetensors and print a summary.
 *
 * With no arguments it trains the tutorial CNN (models/
 * tutorial_cnn_28x28x1.txt) for one epoch, Adam lr 1e-3, batch 128: the
 * recipe of the tutorial. Output goes to runs/<timestamp>/ (metrics.jsonl,
 * model.safetensors). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kiln/kiln.h"
#include "train.h"

#define DEFAULT_MODEL "tutorial_cnn_28x28x1.txt"

typedef struct train_args {
    int epochs, accum, log_every, workers;
    int64_t batch, limit;
    double lr;
    uint64_t seed;
    const char *model, *data, *out;
} train_args;

typedef struct train_run {
    train_args a;
    char out_dir[PATH_MAX];
    FILE *metrics;
    kiln_device dev;
    kiln_module *model;
    kiln_optimizer *opt;
    kiln_dataset *train_ds, *test_ds;
    kiln_loader *train_ld, *test_ld;
    bool tty;
    int64_t step;
    double t0;
} train_run;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int fail(const char *what) {
    const kiln_error *e = kiln_error_last();
    fprintf(stderr, "kiln train: %s: %s\n", what, e->message);
    if (e->hint[0]) fprintf(stderr, "  hint: %s\n", e->hint);
    return 1;
}

static void usage(FILE *f) {
    fprintf(f, "usage: kiln train [options]\n"
               "  --model FILE   model spec (default: models/" DEFAULT_MODEL ")\n"
               "  --data DIR     Fashion-MNIST directory (default: the Debian package dataset-fashion-mnist)\n"
               "  --epochs N     epochs (default 1)\n"
               "  --batch B      batch size (default 128)\n"
               "  --accum N      split each batch into N micro-batches, one optimizer step (default 1)\n"
               "  --lr LR        Adam learning rate (default 1e-3)\n"
               "  --limit N      use only the first N training and test samples (quick runs)\n"
               "  --seed S       seed for initialisation, shuffling and dropout (default 0)\n"
               "  --workers N    loader threads (default -1: auto)\n"
               "  --log-every N  steps per metrics record and progress line (default 50)\n"
               "  --out DIR      output directory (default runs/<timestamp>)\n");
}

static bool parse_i64(const char *s, int64_t min, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < min) return false;
    *out = v;
    return true;
}

/* 0 ok, 2 usage error (printed). */
static int parse_args(int argc, char **argv, train_args *a) {
    *a = (train_args){.epochs = 1, .accum = 1, .log_every = 50, .workers = -1, .batch = 128, .lr = 1e-3};
    for (int i = 0; i < argc; i++) {
        const char *o = argv[i];
        if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
            usage(stdout);
            return -1;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "kiln train: %s needs a value (kiln train --help)\n", o);
            return 2;
        }
        const char *v = argv[++i];
        int64_t n = 0;
        bool ok = true;
        if (strcmp(o, "--model") == 0) a->model = v;
        else if (strcmp(o, "--data") == 0) a->data = v;
        else if (strcmp(o, "--out") == 0) a->out = v;
        else if (strcmp(o, "--epochs") == 0) ok = parse_i64(v, 1, &n) && n < INT_MAX && (a->epochs = (int)n);
        else if (strcmp(o, "--accum") == 0) ok = parse_i64(v, 1, &n) && n < INT_MAX && (a->accum = (int)n);
        else if (strcmp(o, "--log-every") == 0) ok = parse_i64(v, 1, &n) && n < INT_MAX && (a->log_every = (int)n);
        else if (strcmp(o, "--workers") == 0) ok = parse_i64(v, -1, &n) && n < 256 && ((a->workers = (int)n), 1);
        else if (strcmp(o, "--batch") == 0) ok = parse_i64(v, 1, &a->batch);
        else if (strcmp(o, "--limit") == 0) ok = parse_i64(v, 1, &a->limit);
        else if (strcmp(o, "--seed") == 0) ok = parse_i64(v, 0, &n) && ((a->seed = (uint64_t)n), 1);
        else if (strcmp(o, "--lr") == 0) {
            char *end;
            a->lr = strtod(v, &end);
            ok = *v && !*end && a->lr > 0;
        } else {
            fprintf(stderr, "kiln train: unknown option '%s' (kiln train --help)\n", o);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "kiln train: bad value '%s' for %s (kiln train --help)\n", v, o);
            return 2;
        }
    }
    if (a->accum > a->batch) {
        fprintf(stderr, "kiln train: --accum %d is larger than --batch %lld\n", a->accum, (long long)a->batch);
        return 2;
    }
    return 0;
}

/* The default model: next to an installed binary (PREFIX/share/kiln/models),
 * else in the source tree this binary was built from. */
static const char *find_default_model(char *buf, size_t size) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) *slash = '\0';
        int len = snprintf(buf, size, "%s/../share/kiln/models/%s", exe, DEFAULT_MODEL);
        if (len > 0 && (size_t)len < size && access(buf, R_OK) == 0) return buf;
    }
#ifdef KILN_SOURCE_DIR
    int n_src = snprintf(buf, size, "%s/models/%s", KILN_SOURCE_DIR, DEFAULT_MODEL);
    if (n_src > 0 && (size_t)n_src < size && access(buf, R_OK) == 0) return buf;
#endif
    return NULL;
}

/* ---- A dataset limited to its first n samples ---------------------------------------- */

typedef struct limited_ds {
    kiln_dataset *base;
    int64_t n;
} limited_ds;

static int64_t limited_length(void *ctx) { return ((limited_ds *)ctx)->n; }
static kiln_status limited_get(void *ctx, int64_t i, void *dst, int64_t *label) {
    return kiln_dataset_get(((limited_ds *)ctx)->base, i, dst, label);
}
static void limited_free(void *ctx) {
    kiln_dataset_free(((limited_ds *)ctx)->base);
    free(ctx);
}

/* Open one split; with limit > 0 keep only its first `limit` samples. */
static kiln_status open_split(const train_args *a, const char *split, kiln_dataset **out) {
    kiln_dataset *ds = NULL;
    kiln_status st = kiln_dataset_open_fashion_mnist(a->data, split, &ds);
    if (st != KILN_OK || a->limit <= 0 || a->limit >= kiln_dataset_length(ds)) {
        *out = ds;
        return st;
    }
    limited_ds *ctx = malloc(sizeof *ctx);
    if (!ctx) {
        kiln_dataset_free(ds);
        return KILN_ERR_OUT_OF_MEMORY;
    }
    *ctx = (limited_ds){ds, a->limit};
    static const kiln_dataset_ops ops = {limited_length, limited_get, limited_free};
    st = kiln_dataset_create(&ops, ctx, kiln_dataset_info(ds), out);
    if (st != KILN_OK) limited_free(ctx);
    return st;
}

static kiln_status make_loader(train_run *r, kiln_dataset *ds, bool shuffle, kiln_loader **out) {
    kiln_loader_opts o = kiln_loader_opts_default();
    o.batch_size = r->a.batch;
    o.shuffle = shuffle;
    o.seed = r->a.seed;
    o.num_workers = r->a.workers;
    o.pin_memory = true;
    o.device = r->dev;
    o.transforms.normalize = true;
    o.transforms.mean[0] = 0.2860f; /* Fashion-MNIST's training-set statistics */
    o.transforms.std[0] = 0.3530f;
    return kiln_loader_create(ds, &o, out);
}

/* ---- Output -------------------------------------------------------------------------------- */

static int make_dirs(const char *path) {
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(tmp, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* Create the output directory and open metrics.jsonl before any training,
 * so an unwritable place is reported at once. */
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
    if (make_dirs(r->out_dir) != 0 || !(r->metrics = fopen(path, "w"))) {
        fprintf(stderr, "kiln train: cannot write to output directory %s: %s (choose another with --out DIR)\n",
                r->out_dir, strerror(errno));
        return 1;
    }
    return 0;
}

static void fmt_duration(double s, char *buf, size_t size) {
    long t = s > 0 ? (long)(s + 0.5) : 0;
    if (t >= 3600) snprintf(buf, size, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else snprintf(buf, size, "%ldm%02lds", t / 60, t % 60);
}

static void progress(train_run *r, int epoch, int64_t i, int64_t nb, double loss, double img_s, double ep_t0,
                     bool final) {
    char eta[32];
    double elapsed = now_s() - ep_t0;
    fmt_duration(i ? elapsed / (double)i * (double)(nb - i) : 0, eta, sizeof eta);
    if (r->tty) {
        int width = 24, fill = nb ? (int)(width * i / nb) : width;
        char bar[32];
        for (int k = 0; k < width; k++) bar[k] = k < fill ? '#' : '.';
        bar[width] = '\0';
        fprintf(stderr, "\repoch %d/%d [%s] %lld/%lld loss %.4f %.0f img/s ETA %s  %s", epoch + 1, r->a.epochs,
                bar, (long long)i, (long long)nb, loss, img_s, eta, final ? "\n" : "");
    } else {
        fprintf(stderr, "epoch %d/%d step %lld/%lld loss %.4f %.0f img/s ETA %s\n", epoch + 1, r->a.epochs,
                (long long)i, (long long)nb, loss, img_s, eta);
    }
    fflush(stderr);
}

/* ---- Training and evaluation ------------------------------------------------------------ */

/* One optimizer step over batch (x, y), split into up to `accum`
 * micro-batches. Each micro-batch's mean loss is weighted by its share of
 * the batch's samples, so the accumulated gradient is the full batch's
 * mean-loss gradient however the batch divides. *loss gets the batch's
 * mean loss. */
static kiln_status train_step(train_run *r, kiln_tensor *x, kiln_tensor *y, double *loss) {
    int64_t b = kiln_size(x, 0);
    int parts = (int64_t)r->a.accum < b ? r->a.accum : (int)b;
    kiln_status st = KILN_OK;
    *loss = 0;
    for (int k = 0; k < parts && st == KILN_OK; k++) {
        int64_t lo = b * k / parts, hi = b * (k + 1) / parts;
        double share = (double)(hi - lo) / (double)b, v = 0;
        kiln_scope_begin();
        kiln_tensor *xs = parts > 1 ? kiln_narrow(x, 0, lo, hi - lo) : x;
        kiln_tensor *ys = parts > 1 ? kiln_narrow(y, 0, lo, hi - lo) : y;
        kiln_tensor *logits = xs && ys ? kiln_module_forward(r->model, xs) : NULL;
        kiln_tensor *l = logits ? kiln_cross_entropy(logits, ys, NULL) : NULL;
        kiln_tensor *scaled = l && parts > 1 ? kiln_mul_scalar(l, share) : l;
        st = scaled ? kiln_backward(scaled, NULL, false) : kiln_error_last()->status;
        if (st == KILN_OK) st = kiln_item(l, &v);
        *loss += v * share;
        kiln_scope_end();
    }
    if (st == KILN_OK) st = kiln_optimizer_step(r->opt);
    if (st == KILN_OK) st = kiln_optimizer_zero_grad(r->opt, true);
    return st;
}

/* Test-set loss and accuracy in eval mode without autograd. */
static kiln_status evaluate(train_run *r, int epoch, double *loss, double *acc) {
    kiln_module_train(r->model, false);
    kiln_no_grad_begin();
    kiln_status st = kiln_loader_epoch_begin(r->test_ld, epoch);
    double loss_sum = 0;
    int64_t correct = 0, seen = 0;
    int64_t *pred = NULL, *lab = NULL;
    while (st == KILN_OK) {
        kiln_scope_begin();
        kiln_tensor *x = NULL, *y = NULL;
        st = kiln_loader_next(r->test_ld, &x, &y);
        if (st != KILN_OK || !x) {
            kiln_scope_end();
            break;
        }
        int64_t b = kiln_size(x, 0);
        kiln_tensor *logits = kiln_module_forward(r->model, x);
        kiln_tensor *l = logits ? kiln_cross_entropy(logits, y, NULL) : NULL;
        kiln_tensor *am = l ? kiln_argmax(logits, 1, false) : NULL;
        double v = 0;
        int64_t *np = realloc(pred, (size_t)b * sizeof *pred), *nl = np ? realloc(lab, (size_t)b * sizeof *lab) : NULL;
        if (np) pred = np;
        if (nl) lab = nl;
        st = !am ? kiln_error_last()->status : !nl ? KILN_ERR_OUT_OF_MEMORY : kiln_item(l, &v);
        if (st == KILN_OK) st = kiln_to_host(am, pred, (size_t)b * sizeof *pred);
        if (st == KILN_OK) st = kiln_to_host(y, lab, (size_t)b * sizeof *lab);
        for (int64_t i = 0; st == KILN_OK && i < b; i++) correct += pred[i] == lab[i];
        loss_sum += v * (double)b;
        seen += b;
        kiln_scope_end();
    }
    free(pred);
    free(lab);
    kiln_grad_mode_end();
    kiln_module_train(r->model, true);
    *loss = seen ? loss_sum / (double)seen : 0;
    *acc = seen ? (double)correct / (double)seen : 0;
    return st;
}

/* One epoch: steps with progress and per-window metrics records, then the
 * test-set evaluation and the epoch record. */
static kiln_status run_epoch(train_run *r, int epoch, double *test_acc, int64_t *images) {
    kiln_status st = kiln_loader_epoch_begin(r->train_ld, epoch);
    if (st != KILN_OK) return st;
    int64_t nb = kiln_loader_num_batches(r->train_ld), i = 0, win_img = 0, ep_img = 0;
    double ep_t0 = now_s(), win_t0 = ep_t0, win_loss = 0, ep_loss = 0, last_draw = 0;
    int win_n = 0;
    while (st == KILN_OK) {
        kiln_scope_begin();
        kiln_tensor *x = NULL, *y = NULL;
        double loss = 0;
        st = kiln_loader_next(r->train_ld, &x, &y);
        bool done = st != KILN_OK || !x;
        int64_t b = done ? 0 : kiln_size(x, 0);
        if (!done) st = train_step(r, x, y, &loss);
        kiln_scope_end();
        if (done || st != KILN_OK) break;
        i++, r->step++, win_n++, win_img += b, ep_img += b;
        win_loss += loss, ep_loss += loss;
        double t = now_s();
        if (r->tty && (t - last_draw > 0.2 || i == nb)) {
            progress(r, epoch, i, nb, ep_loss / (double)i, (double)ep_img / (t - ep_t0), ep_t0, false);
            last_draw = t;
        }
        if (win_n == r->a.log_every || i == nb) {
            double img_s = (double)win_img / (t - win_t0);
            fprintf(r->metrics,
                    "{\"event\":\"step\",\"step\":%lld,\"epoch\":%d,\"loss\":%.6f,\"lr\":%g,\"img_s\":%.1f}\n",
                    (long long)r->step, epoch + 1, win_loss / win_n, kiln_optimizer_get_lr(r->opt), img_s);
            fflush(r->metrics);
            if (!r->tty) progress(r, epoch, i, nb, ep_loss / (double)i, (double)ep_img / (t - ep_t0), ep_t0, false);
            win_n = 0, win_img = 0, win_loss = 0, win_t0 = t;
        }
    }
    if (st != KILN_OK) return st;
    if (r->tty && i) progress(r, epoch, i, nb, ep_loss / (double)i, (double)ep_img / (now_s() - ep_t0), ep_t0, true);
    double train_time = now_s() - ep_t0, test_loss = 0;
    st = evaluate(r, epoch, &test_loss, test_acc);
    if (st != KILN_OK) return st;
    double epoch_time = now_s() - ep_t0;
    fprintf(r->metrics,
            "{\"event\":\"epoch\",\"epoch\":%d,\"train_loss\":%.6f,\"test_loss\":%.6f,\"test_acc\":%.6f,"
            "\"train_s\":%.3f,\"epoch_s\":%.3f}\n",
            epoch + 1, i ? ep_loss / (double)i : 0, test_loss, *test_acc, train_time, epoch_time);
    fflush(r->metrics);
    fprintf(stderr, "epoch %d/%d: train loss %.4f, test loss %.4f, test accuracy %.2f%% (%.1f s)\n", epoch + 1,
            r->a.epochs, i ? ep_loss / (double)i : 0, test_loss, 100 * *test_acc, epoch_time);
    *images += ep_img;
    return KILN_OK;
}

/* Everything before the first step; a non-zero return is the exit code. */
static int setup(train_run *r) {
    char model_buf[PATH_MAX];
    const char *model = r->a.model ? r->a.model : find_default_model(model_buf, sizeof model_buf);
    if (!model) {
        fprintf(stderr, "kiln train: cannot find models/" DEFAULT_MODEL
                        " (looked in PREFIX/share/kiln/models and the source tree); pass --model FILE\n");
        return 1;
    }
    if (open_split(&r->a, "train", &r->train_ds) != KILN_OK) return fail("training set");
    if (open_split(&r->a, "test", &r->test_ds) != KILN_OK) return fail("test set");
    kiln_sample_info info = kiln_dataset_info(r->train_ds);
    kiln_manual_seed(r->a.seed);
    if (kiln_model_spec_load(model, info.channels, info.height, info.width, &r->model) != KILN_OK)
        return fail("model");
    if (kiln_module_to(r->model, r->dev) != KILN_OK) return fail("model");
    kiln_tensor **params = NULL;
    int np = 0;
    if (kiln_module_parameters(r->model, &params, &np) != KILN_OK) return fail("model");
    kiln_adam_opts ao = kiln_adam_defaults();
    ao.lr = r->a.lr;
    r->opt = kiln_adam(params, np, &ao);
    free(params);
    if (!r->opt) return fail("optimizer");
    if (make_loader(r, r->train_ds, true, &r->train_ld) != KILN_OK) return fail("loader");
    if (make_loader(r, r->test_ds, false, &r->test_ld) != KILN_OK) return fail("loader");
    char dev[32];
    fprintf(stderr, "kiln train: %s (%lld parameters) on %s, %lld training and %lld test images, %d epoch%s, "
                    "batch %lld, Adam lr %g; output in %s\n",
            model, (long long)kiln_module_num_parameters(r->model), kiln_device_str(r->dev, dev, sizeof dev),
            (long long)kiln_dataset_length(r->train_ds), (long long)kiln_dataset_length(r->test_ds), r->a.epochs,
            r->a.epochs == 1 ? "" : "s", (long long)r->a.batch, r->a.lr, r->out_dir);
    return 0;
}

static void teardown(train_run *r) {
    kiln_loader_free(r->train_ld);
    kiln_loader_free(r->test_ld);
    kiln_optimizer_free(r->opt);
    kiln_module_free(r->model);
    kiln_dataset_free(r->train_ds);
    kiln_dataset_free(r->test_ds);
    if (r->metrics) fclose(r->metrics);
}

static int train_and_report(train_run *r) {
    double acc = 0;
    int64_t images = 0;
    double t_train = now_s();
    for (int e = 0; e < r->a.epochs; e++)
        if (run_epoch(r, e, &acc, &images) != KILN_OK) return fail("training");
    double train_s = now_s() - t_train;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/model.safetensors", r->out_dir);
    if (kiln_safetensors_save(path, r->model) != KILN_OK) return fail("checkpoint");
    kiln_memory_stats ms;
    int64_t peak = kiln_memory_stats_get(r->dev, &ms) == KILN_OK ? ms.allocated_bytes[KILN_POOL_ALL].peak : 0;
    double wall = now_s() - r->t0;
    fprintf(r->metrics,
            "{\"event\":\"summary\",\"test_acc\":%.6f,\"wall_s\":%.3f,\"train_img_s\":%.1f,\"peak_bytes\":%lld,"
            "\"steps\":%lld}\n",
            acc, wall, (double)images / train_s, (long long)peak, (long long)r->step);
    fflush(r->metrics);
    printf("kiln train: test accuracy %.2f%%, %.1f s, %.0f train img/s, peak memory %.1f MiB, checkpoint %s\n",
           100 * acc, wall, (double)images / train_s, (double)peak / (1 << 20), path);
    return 0;
}

int kiln_cmd_train(int argc, char **argv) {
    train_run r = {.t0 = now_s()};
    int rc = parse_args(argc, argv, &r.a);
    if (rc) return rc < 0 ? 0 : rc;
    r.dev = kiln_default_device();
    r.tty = isatty(2);
    rc = open_output(&r);
    if (!rc) rc = setup(&r);
    if (!rc) rc = train_and_report(&r);
    teardown(&r);
    return rc;
}

/* kiln train's run configuration in the checkpoint (kiln.run_config, a
 * JSON object): the flags that fix a run's math, so `--resume DIR` alone
 * continues the run that was stopped, not a run with today's defaults.
 * docs/training.md, "Resuming".
 *
 * On --resume every such flag not on the command line takes the
 * checkpoint's value; one given with another value is refused, naming
 * both, except those that may change: more --epochs (said), --log-every
 * (said: the metrics windows shift), --checkpoint/--memory-budget (the
 * same math, another memory trade; said). --out, --device, --progress, --workers,
 * --threads, --monitor, --profile, --detect-*, --memory-history and
 * --max-steps are not part of the configuration at all.
 *
 * Nor are --devices, --split and --micro-batches, for --device's reason:
 * they say where the math runs, not what it is. The step's gradient is the
 * whole batch's on one device or several (DataParallel sums the replicas'
 * shares, the pipeline sums its micro-batches), the checkpoint holds the
 * plain model's state dict either way, and moving a stopped run to other
 * devices (or back to one) is what a user with a changed machine needs.
 * The exception is BatchNorm in training, whose batch statistics are per
 * device or micro-batch (PyTorch's rule); that is documented in
 * docs/multi-device.md rather than enforced. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kiln/kiln.h"
#include "train.h"
#include "train_run.h"

static const char *const amp_names[] = {"auto", "off", "f16", "bf16"};

/* "off", "N" or "auto". */
static void checkpoint_text(const train_args *a, char *buf, size_t size) {
    if (a->checkpoint_auto) snprintf(buf, size, "auto");
    else if (a->checkpoint > 1) snprintf(buf, size, "%d", a->checkpoint);
    else snprintf(buf, size, "off");
}

char *train_config_text(const train_args *a) {
    cJSON *o = cJSON_CreateObject();
    char seed[32], budget[32], ckpt[16];
    snprintf(seed, sizeof seed, "%" PRIu64, a->seed);
    snprintf(budget, sizeof budget, "%" PRId64, a->memory_budget);
    checkpoint_text(a, ckpt, sizeof ckpt);
    /* --data as an absolute path, so a resume from another directory
     * finds the same files. */
    char data[PATH_MAX];
    if (a->data && !realpath(a->data, data)) snprintf(data, sizeof data, "%s", a->data);
    bool ok = o && (a->data ? cJSON_AddStringToObject(o, "data", data) : cJSON_AddNullToObject(o, "data")) &&
              cJSON_AddStringToObject(o, "dataset", train_dataset_name(a->dataset)) &&
              cJSON_AddStringToObject(o, "augment", train_augment_name(train_augment_resolve(a->dataset, a->augment))) &&
              cJSON_AddNumberToObject(o, "limit", (double)a->limit) &&
              cJSON_AddNumberToObject(o, "batch", (double)a->batch) &&
              cJSON_AddNumberToObject(o, "accum", a->accum) && cJSON_AddNumberToObject(o, "epochs", a->epochs) &&
              cJSON_AddNumberToObject(o, "lr", a->lr) && /* cJSON prints doubles that read back exactly */
              cJSON_AddStringToObject(o, "seed", seed) &&
              cJSON_AddStringToObject(o, "schedule", a->onecycle ? "onecycle" : "constant") &&
              cJSON_AddNumberToObject(o, "label_smoothing", a->label_smoothing) &&
              cJSON_AddStringToObject(o, "amp", amp_names[a->amp]) &&
              cJSON_AddStringToObject(o, "checkpoint", ckpt) &&
              cJSON_AddStringToObject(o, "memory_budget", budget) &&
              cJSON_AddBoolToObject(o, "deterministic", a->deterministic) &&
              cJSON_AddNumberToObject(o, "log_every", a->log_every) &&
              cJSON_AddNumberToObject(o, "world", a->world > 0 ? a->world : 1);
    char *text = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!text) fprintf(stderr, "kiln train: out of host memory writing the run configuration\n");
    return text;
}

/* ---- Reading the checkpoint's configuration ------------------------------------------------ */

typedef struct config_reader {
    const char *ckpt;
    const cJSON *root;
    int rc;
} config_reader;

static void damaged(config_reader *c, const char *field, const char *what) {
    if (c->rc) return;
    fprintf(stderr,
            "kiln train: --resume %s: the checkpoint's run configuration (metadata kiln.run_config) has %s %s: "
            "the file was edited or damaged; resume from another checkpoint\n",
            c->ckpt, field, what);
    c->rc = 1;
}

/* A whole number field in [lo, hi]. */
static int64_t get_int(config_reader *c, const char *field, int64_t lo, int64_t hi) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->root, field);
    if (!cJSON_IsNumber(v)) {
        damaged(c, field, v ? "that is not a number" : "missing");
        return lo;
    }
    double d = v->valuedouble;
    if (!(d >= (double)lo && d <= (double)hi) || floor(d) != d) {
        char what[96];
        snprintf(what, sizeof what, "%.17g, outside %" PRId64 "..%" PRId64, d, lo, hi);
        damaged(c, field, what);
        return lo;
    }
    return (int64_t)d;
}

static double get_double(config_reader *c, const char *field, double lo, double hi, bool lo_open) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->root, field);
    if (!cJSON_IsNumber(v)) {
        damaged(c, field, v ? "that is not a number" : "missing");
        return hi;
    }
    double d = v->valuedouble;
    if (!(isfinite(d) && (lo_open ? d > lo : d >= lo) && d <= hi)) {
        char what[96];
        snprintf(what, sizeof what, "%.17g, outside %s%g..%g", d, lo_open ? "(" : "", lo, hi);
        damaged(c, field, what);
        return hi;
    }
    return d;
}

/* A string field, one of `choices` (NULL: any text without control bytes,
 * shorter than PATH_MAX); the index of the choice, or -1. */
static const char *get_string(config_reader *c, const char *field, const char *const *choices, int n, int *which) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->root, field);
    if (which) *which = -1;
    if (!cJSON_IsString(v)) {
        damaged(c, field, v ? "that is not a string" : "missing");
        return NULL;
    }
    const char *s = v->valuestring;
    if (!choices) {
        size_t len = strlen(s);
        bool clean = len > 0 && len < PATH_MAX;
        for (size_t i = 0; clean && i < len; i++) clean = (unsigned char)s[i] >= 0x20;
        if (!clean) damaged(c, field, "that is empty, too long or holds control bytes");
        return clean ? s : NULL;
    }
    for (int i = 0; i < n; i++)
        if (!strcmp(s, choices[i])) {
            if (which) *which = i;
            return s;
        }
    damaged(c, field, "an unknown value");
    return NULL;
}

/* The checkpoint's configuration, parsed and range-checked like the
 * flags themselves (parse_args). */
static int read_config(const char *ckpt, const cJSON *root, train_args *out) {
    config_reader c = {ckpt, root, 0};
    if (!cJSON_IsObject(root)) {
        damaged(&c, "text", "that is not a JSON object");
        return c.rc;
    }
    train_args a = *out;
    int which = -1;
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(root, "data");
    a.data = cJSON_IsNull(data) ? NULL : get_string(&c, "data", NULL, 0, NULL);
    /* The dataset and its augmentation (absent before kiln train took
     * --dataset: Fashion-MNIST, not augmented). */
    static const char *const datasets[] = {"fashion-mnist", "cifar10"};
    static const char *const augments[] = {"auto", "none", "flip", "crop-flip"};
    a.dataset = TRAIN_DATASET_FASHION_MNIST;
    a.augment = TRAIN_AUGMENT_NONE;
    if (cJSON_GetObjectItemCaseSensitive(root, "dataset")) {
        get_string(&c, "dataset", datasets, 2, &which);
        a.dataset = which < 0 ? TRAIN_DATASET_FASHION_MNIST : (train_dataset)which;
    }
    if (cJSON_GetObjectItemCaseSensitive(root, "augment")) {
        get_string(&c, "augment", augments + 1, 3, &which);
        a.augment = which < 0 ? TRAIN_AUGMENT_NONE : (train_augment)(which + 1);
    }
    a.limit = get_int(&c, "limit", 0, INT64_MAX / 2);
    a.batch = get_int(&c, "batch", 1, INT64_MAX / 2);
    a.accum = (int)get_int(&c, "accum", 1, INT_MAX - 1);
    a.epochs = (int)get_int(&c, "epochs", 1, TRAIN_MAX_EPOCHS);
    a.lr = get_double(&c, "lr", 0, 10, true);
    a.label_smoothing = get_double(&c, "label_smoothing", 0, 1, false);
    if (!c.rc && a.label_smoothing >= 1) damaged(&c, "label_smoothing", "1 or more");
    a.log_every = (int)get_int(&c, "log_every", 1, INT_MAX - 1);
    const char *seed = get_string(&c, "seed", NULL, 0, NULL);
    char *end = NULL;
    errno = 0;
    if (seed) a.seed = strtoull(seed, &end, 10);
    if (seed && (*seed < '0' || *seed > '9' || *end || errno)) damaged(&c, "seed", "that is not an unsigned integer");
    static const char *const schedules[] = {"onecycle", "constant"};
    get_string(&c, "schedule", schedules, 2, &which);
    a.onecycle = which == 0;
    get_string(&c, "amp", amp_names, 4, &which);
    a.amp = which < 0 ? TRAIN_AMP_AUTO : (train_amp_mode)which;
    const char *ckpt_mode = get_string(&c, "checkpoint", NULL, 0, NULL);
    int64_t segments = 0;
    a.checkpoint_auto = ckpt_mode && !strcmp(ckpt_mode, "auto");
    a.checkpoint = 0;
    if (ckpt_mode && !a.checkpoint_auto && strcmp(ckpt_mode, "off")) {
        segments = strtoll(ckpt_mode, &end, 10);
        if (*end || segments < 2 || segments > KILN_NN_MAX_CHECKPOINT_SEGMENTS)
            damaged(&c, "checkpoint", "that is not off, auto or a segment count");
        else a.checkpoint = (int)segments;
    }
    const char *budget = get_string(&c, "memory_budget", NULL, 0, NULL);
    errno = 0;
    a.memory_budget = budget ? strtoll(budget, &end, 10) : 0;
    if (budget && (*end || errno || a.memory_budget < 0 || (a.memory_budget > 0) != a.checkpoint_auto))
        damaged(&c, "memory_budget", "that does not fit its --checkpoint");
    const cJSON *det = cJSON_GetObjectItemCaseSensitive(root, "deterministic");
    if (!cJSON_IsBool(det)) damaged(&c, "deterministic", det ? "that is not true or false" : "missing");
    a.deterministic = cJSON_IsTrue(det);
    if (!c.rc && a.accum > a.batch) damaged(&c, "accum", "larger than its batch");
    /* The ranks (absent before kiln train ran under mpirun: one). */
    a.world = cJSON_GetObjectItemCaseSensitive(root, "world") ? (int)get_int(&c, "world", 1, 65536) : 1;
    /* a.data points into the tree: copied by the caller. */
    if (!c.rc) *out = a;
    return c.rc;
}

/* ---- Applying it ------------------------------------------------------------------------------ */

/* Whether two --data values name one directory. */
static bool same_dir(const char *a, const char *b) {
    const char *def = "/usr/share/datasets/fashion-mnist";
    char ra[PATH_MAX], rb[PATH_MAX];
    if (!realpath(a ? a : def, ra) || !realpath(b ? b : def, rb))
        return !strcmp(a ? a : def, b ? b : def);
    return !strcmp(ra, rb);
}

static void contradiction(const train_run *r, const char *flag, const char *given, const char *stored,
                          const char *extra) {
    fprintf(stderr,
            "kiln train: --resume %s: %s %s contradicts the checkpoint's %s %s; drop the flag to continue the run "
            "as it was%s\n",
            r->a.resume, flag, given, flag, stored, extra ? extra : "");
}

/* "%g", or "%.17g" when "%g" would print two different values alike. */
static void two_numbers(double x, double y, char *a, char *b, size_t size) {
    snprintf(a, size, "%g", x);
    snprintf(b, size, "%g", y);
    if (!strcmp(a, b)) snprintf(a, size, "%.17g", x), snprintf(b, size, "%.17g", y);
}

/* Each flag given against the checkpoint's value: refused when it differs
 * (bad is counted), or taken with a note where it may change. */
static int compare(train_run *r, const train_args *c) {
    const train_args *a = &r->a;
    unsigned g = a->given;
    int bad = 0;
    char x[64], y[64];
    if ((g & TRAIN_GIVEN_DATASET) && a->dataset != c->dataset)
        contradiction(r, "--dataset", train_dataset_name(a->dataset), train_dataset_name(c->dataset), NULL), bad++;
    if ((g & TRAIN_GIVEN_AUGMENT) && a->augment != c->augment)
        contradiction(r, "--augment", train_augment_name(a->augment), train_augment_name(c->augment), NULL), bad++;
    if ((g & TRAIN_GIVEN_DATA) && !same_dir(a->data, c->data))
        contradiction(r, "--data", a->data, c->data ? c->data : "(the default, " "/usr/share/datasets/fashion-mnist)",
                      NULL),
            bad++;
#define CMP_INT(bit, flag, field)                                                                      \
    if ((g & (bit)) && a->field != c->field) {                                                         \
        snprintf(x, sizeof x, "%lld", (long long)a->field);                                            \
        snprintf(y, sizeof y, "%lld", (long long)c->field);                                            \
        contradiction(r, flag, x, y, NULL), bad++;                                                     \
    }
    CMP_INT(TRAIN_GIVEN_LIMIT, "--limit", limit)
    CMP_INT(TRAIN_GIVEN_BATCH, "--batch", batch)
    CMP_INT(TRAIN_GIVEN_ACCUM, "--accum", accum)
    if ((g & TRAIN_GIVEN_SEED) && a->seed != c->seed) {
        snprintf(x, sizeof x, "%" PRIu64, a->seed);
        snprintf(y, sizeof y, "%" PRIu64, c->seed);
        contradiction(r, "--seed", x, y, NULL), bad++;
    }
#undef CMP_INT
    if ((g & TRAIN_GIVEN_LR) && a->lr != c->lr) two_numbers(a->lr, c->lr, x, y, sizeof x), contradiction(r, "--lr", x, y, NULL), bad++;
    if ((g & TRAIN_GIVEN_SMOOTHING) && a->label_smoothing != c->label_smoothing)
        two_numbers(a->label_smoothing, c->label_smoothing, x, y, sizeof x),
            contradiction(r, "--label-smoothing", x, y, NULL), bad++;
    if ((g & TRAIN_GIVEN_SCHEDULE) && a->onecycle != c->onecycle)
        contradiction(r, "--schedule", a->onecycle ? "onecycle" : "constant", c->onecycle ? "onecycle" : "constant",
                      NULL),
            bad++;
    if ((g & TRAIN_GIVEN_AMP) && a->amp != c->amp)
        contradiction(r, "--amp", amp_names[a->amp], amp_names[c->amp], NULL), bad++;
    if ((g & TRAIN_GIVEN_DETERMINISTIC) && a->deterministic != c->deterministic)
        fprintf(stderr,
                "kiln train: --resume %s: --deterministic contradicts the checkpoint's run, which was not "
                "deterministic; drop the flag to continue the run as it was\n",
                a->resume),
            bad++;
    if (a->world != c->world) {
        /* Not a flag to drop: the launch itself differs. */
        fprintf(stderr,
                "kiln train: --resume %s: the checkpoint was written by a run of %d process%s, this run has %d: each "
                "rank's share of the data and of --batch depends on the count; resume it as %s%d\n",
                a->resume, c->world, c->world == 1 ? "" : "es", a->world, c->world == 1 ? "one process, without mpirun, or mpirun -np " : "mpirun -np ",
                c->world);
        bad++;
    }
    if ((g & TRAIN_GIVEN_EPOCHS) && a->epochs < c->epochs) {
        snprintf(x, sizeof x, "%d", a->epochs);
        snprintf(y, sizeof y, "%d", c->epochs);
        contradiction(r, "--epochs", x, y, " (more epochs may be given; --max-steps N stops earlier)"), bad++;
    }
    return bad;
}

/* The flags that may change, said when they do. */
static void notes(const train_run *r, const train_args *c) {
    const train_args *a = &r->a;
    unsigned g = a->given;
    if ((g & TRAIN_GIVEN_EPOCHS) && a->epochs > c->epochs)
        fprintf(stderr, "kiln train: --resume %s: continuing for %d epochs instead of %d%s\n", a->resume, a->epochs,
                c->epochs,
                c->onecycle ? " (the one-cycle schedule now spans them all: the learning rate from here is not the "
                              "shorter run's)"
                            : "");
    if ((g & TRAIN_GIVEN_LOG_EVERY) && a->log_every != c->log_every)
        fprintf(stderr,
                "kiln train: --resume %s: --log-every %d instead of %d: the metrics windows from here are not the "
                "uninterrupted run's (the epoch records are)\n",
                a->resume, a->log_every, c->log_every);
    char now[16], was[16];
    checkpoint_text(a, now, sizeof now);
    checkpoint_text(c, was, sizeof was);
    if ((g & TRAIN_GIVEN_CHECKPOINT) && (strcmp(now, was) || a->memory_budget != c->memory_budget))
        fprintf(stderr,
                "kiln train: --resume %s: gradient checkpointing %s instead of %s: the same math, another memory "
                "trade\n",
                a->resume, now, was);
}

int train_config_resume(train_run *r) {
    char *text = NULL;
    if (kiln_checkpoint_read_meta(r->resume_from, "kiln.run_config", &text) != KILN_OK)
        return train_fail("train", "resume");
    if (!text) {
        fprintf(stderr,
                "kiln train: note: --resume %s: the checkpoint holds no run configuration (an older Kiln wrote "
                "it): the run continues with this command's flags, which must repeat the original run's\n",
                r->resume_from);
        return 0;
    }
    cJSON *root = cJSON_Parse(text);
    free(text);
    train_args c = r->a;
    int rc = read_config(r->resume_from, root, &c);
    if (!rc && compare(r, &c)) rc = 2;
    if (!rc) notes(r, &c);
    /* Every flag not given takes the checkpoint's value; --data's string
     * is kept for the run's lifetime. */
    train_args *a = &r->a;
    unsigned g = a->given;
    if (!rc && !(g & TRAIN_GIVEN_DATA) && c.data && !(r->config_data = strdup(c.data))) {
        fprintf(stderr, "kiln train: out of host memory\n");
        rc = 1;
    }
    cJSON_Delete(root);
    if (rc) return rc;
    if (!(g & TRAIN_GIVEN_DATA)) a->data = r->config_data;
    if (!(g & TRAIN_GIVEN_DATASET)) a->dataset = c.dataset;
    if (!(g & TRAIN_GIVEN_AUGMENT)) a->augment = c.augment;
    if (!(g & TRAIN_GIVEN_LIMIT)) a->limit = c.limit;
    if (!(g & TRAIN_GIVEN_BATCH)) a->batch = c.batch;
    if (!(g & TRAIN_GIVEN_ACCUM)) a->accum = c.accum;
    if (!(g & TRAIN_GIVEN_EPOCHS)) a->epochs = c.epochs;
    if (!(g & TRAIN_GIVEN_LR)) a->lr = c.lr;
    if (!(g & TRAIN_GIVEN_SEED)) a->seed = c.seed;
    if (!(g & TRAIN_GIVEN_SCHEDULE)) a->onecycle = c.onecycle;
    if (!(g & TRAIN_GIVEN_SMOOTHING)) a->label_smoothing = c.label_smoothing;
    if (!(g & TRAIN_GIVEN_AMP)) a->amp = c.amp;
    if (!(g & TRAIN_GIVEN_DETERMINISTIC)) a->deterministic = c.deterministic;
    if (!(g & TRAIN_GIVEN_LOG_EVERY)) a->log_every = c.log_every;
    /* a->world stays the world this run joined (compare() held it to the checkpoint's). */
    if (!(g & TRAIN_GIVEN_CHECKPOINT))
        a->checkpoint = c.checkpoint, a->checkpoint_auto = c.checkpoint_auto, a->memory_budget = c.memory_budget;
    if (a->accum > a->batch) {
        fprintf(stderr, "kiln train: --resume %s: --accum %d is larger than the checkpoint's --batch %lld\n",
                a->resume, a->accum, (long long)a->batch);
        return 2;
    }
    return 0;
}

/* kiln train's data: the datasets (Fashion-MNIST, CIFAR-10; optionally
 * the first N samples), their loaders with normalisation and augmentation,
 * and the test-set evaluation. Shared by train and eval (train.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "kiln/kiln.h"
#include "train.h"

static const char *const dataset_names[TRAIN_DATASET_COUNT] = {"fashion-mnist", "cifar10"};
static const char *const augment_names[] = {"auto", "none", "flip", "crop-flip"};

const char *train_dataset_name(train_dataset kind) {
    return (unsigned)kind < TRAIN_DATASET_COUNT ? dataset_names[kind] : "?";
}

bool train_dataset_parse(const char *s, train_dataset *out) {
    for (int i = 0; i < TRAIN_DATASET_COUNT; i++)
        if (!strcmp(s, dataset_names[i])) return *out = (train_dataset)i, true;
    return false;
}

const char *train_augment_name(train_augment a) {
    return (unsigned)a <= TRAIN_AUGMENT_CROP_FLIP ? augment_names[a] : "?";
}

bool train_augment_parse(const char *s, train_augment *out) {
    for (int i = 0; i <= TRAIN_AUGMENT_CROP_FLIP; i++)
        if (!strcmp(s, augment_names[i])) return *out = (train_augment)i, true;
    return false;
}

train_augment train_augment_resolve(train_dataset kind, train_augment a) {
    if (a != TRAIN_AUGMENT_AUTO) return a;
    /* The tutorial's CIFAR-10 recipe: random crop with padding 4 and a
     * horizontal flip. Fashion-MNIST's recipe has none. */
    return kind == TRAIN_DATASET_CIFAR10 ? TRAIN_AUGMENT_CROP_FLIP : TRAIN_AUGMENT_NONE;
}

const char *train_dataset_default_model(train_dataset kind) {
    return kind == TRAIN_DATASET_CIFAR10 ? CIFAR10_MODEL : DEFAULT_MODEL;
}

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

/* The CIFAR-10 binary batch files of `split` under `dir`: data_batch_1..5.bin
 * or test_batch.bin, in `dir` itself or in the cifar-10-batches-bin
 * directory the archive unpacks to. The first missing file into `missing`. */
static int cifar_files(const char *dir, const char *split, char paths[5][4200], char *missing, size_t size) {
    static const char *const subdirs[] = {"", "/cifar-10-batches-bin"};
    bool train = !strcmp(split, "train");
    int n = train ? 5 : 1;
    for (int d = 0; d < 2; d++) {
        bool all = true;
        for (int i = 0; i < n && all; i++) {
            if (train) snprintf(paths[i], sizeof paths[i], "%s%s/data_batch_%d.bin", dir, subdirs[d], i + 1);
            else snprintf(paths[i], sizeof paths[i], "%s%s/test_batch.bin", dir, subdirs[d]);
            if (access(paths[i], R_OK) != 0) {
                if (d == 0) snprintf(missing, size, "%s", paths[i]);
                all = false;
            }
        }
        if (all) return n;
    }
    return 0;
}

static kiln_status open_cifar10(const char *data, const char *split, kiln_dataset **out) {
    if (!data)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, CIFAR10_WHERE,
                          "--dataset cifar10 needs --data DIR: Kiln ships no copy of CIFAR-10");
    char paths[5][4200], missing[4200] = "";
    int n = cifar_files(data, split, paths, missing, sizeof missing);
    if (n == 0)
        return KILN_RAISE(KILN_ERR_IO, CIFAR10_WHERE, "CIFAR-10 %s split: %s: not found or not readable", split,
                          missing);
    const char *p[5];
    for (int i = 0; i < n; i++) p[i] = paths[i];
    return kiln_dataset_open_cifar(n, p, 10, out);
}

kiln_status train_open_split(train_dataset kind, const char *data, int64_t limit, const char *split,
                             kiln_dataset **out) {
    kiln_dataset *ds = NULL;
    kiln_status st = kind == TRAIN_DATASET_CIFAR10 ? open_cifar10(data, split, &ds)
                                                   : kiln_dataset_open_fashion_mnist(data, split, &ds);
    if (st != KILN_OK) {
        if (kind == TRAIN_DATASET_CIFAR10) return st;
        char msg[sizeof kiln_error_last()->message];
        snprintf(msg, sizeof msg, "%s", kiln_error_last()->message);
        if (st == KILN_ERR_IO)
            return KILN_RAISE(st,
                              "install the Debian package dataset-fashion-mnist (scripts/setup.sh does), "
                              "or pass --data DIR holding the four *-ubyte(.gz) files",
                              "%s", msg);
        return st;
    }
    if (limit <= 0 || limit >= kiln_dataset_length(ds)) {
        *out = ds;
        return KILN_OK;
    }
    limited_ds *ctx = malloc(sizeof *ctx);
    if (!ctx) {
        kiln_dataset_free(ds);
        return KILN_ERR_OUT_OF_MEMORY;
    }
    *ctx = (limited_ds){ds, limit};
    static const kiln_dataset_ops ops = {limited_length, limited_get, limited_free};
    st = kiln_dataset_create(&ops, ctx, kiln_dataset_info(ds), out);
    if (st != KILN_OK) limited_free(ctx);
    return st;
}

void train_split_file(train_dataset kind, const char *data, const char *split, char *buf, size_t size) {
    if (kind == TRAIN_DATASET_CIFAR10) {
        char paths[5][4200], missing[4200] = "";
        const char *dir = data ? data : ".";
        if (cifar_files(dir, split, paths, missing, sizeof missing) > 0) snprintf(buf, size, "%s", paths[0]);
        else snprintf(buf, size, "%s", missing);
        return;
    }
    const char *dir = data ? data : FMNIST_DIR;
    const char *prefix = strcmp(split, "train") ? "t10k" : "train";
    snprintf(buf, size, "%s/%s-images-idx3-ubyte.gz", dir, prefix);
    if (access(buf, F_OK) != 0) snprintf(buf, size, "%s/%s-images-idx3-ubyte", dir, prefix);
}

int train_check_splits(train_dataset kind, const char *data, kiln_dataset *train, kiln_dataset *test) {
    kiln_sample_info a = kiln_dataset_info(train), b = kiln_dataset_info(test);
    if (a.channels == b.channels && a.height == b.height && a.width == b.width) return 0;
    char fa[4200], fb[4200];
    train_split_file(kind, data, "train", fa, sizeof fa);
    train_split_file(kind, data, "test", fb, sizeof fb);
    fprintf(stderr,
            "kiln train: the training images (%s) are %lldx%lldx%lld but the test images (%s) are %lldx%lldx%lld: "
            "one model cannot take both; pass a --data whose splits have one image size\n",
            fa, (long long)a.channels, (long long)a.height, (long long)a.width, fb, (long long)b.channels,
            (long long)b.height, (long long)b.width);
    return 1;
}

kiln_status train_make_loader(train_dataset kind, train_augment augment, kiln_dataset *ds, kiln_device dev,
                              int64_t batch, bool shuffle, uint64_t seed, int workers, kiln_loader **out) {
    kiln_loader_opts o = kiln_loader_opts_default();
    o.batch_size = batch;
    o.shuffle = shuffle;
    o.seed = seed;
    o.num_workers = workers;
    o.pin_memory = true;
    o.device = dev;
    o.transforms.normalize = true;
    if (kind == TRAIN_DATASET_CIFAR10) {
        /* CIFAR-10's training-set per-channel statistics (R, G, B). */
        static const float mean[3] = {0.4914f, 0.4822f, 0.4465f}, std[3] = {0.2470f, 0.2435f, 0.2616f};
        for (int c = 0; c < 3; c++) o.transforms.mean[c] = mean[c], o.transforms.std[c] = std[c];
    } else {
        o.transforms.mean[0] = 0.2860f; /* Fashion-MNIST's training-set statistics */
        o.transforms.std[0] = 0.3530f;
    }
    augment = train_augment_resolve(kind, augment);
    /* torchvision's RandomCrop(padding=4) pads with zeros, RandomHorizontalFlip flips with p 0.5. */
    if (augment == TRAIN_AUGMENT_FLIP || augment == TRAIN_AUGMENT_CROP_FLIP) o.transforms.flip_p = 0.5f;
    if (augment == TRAIN_AUGMENT_CROP_FLIP) o.transforms.crop_padding = 4, o.transforms.pad_mode = KILN_PAD_ZERO;
    return kiln_loader_create(ds, &o, out);
}

/* The batch's loss sum and correct count (scoped results) in chunks of
 * `chunk` samples. */
static kiln_status eval_batch(kiln_module *model, kiln_tensor *x, kiln_tensor *y, int64_t chunk, kiln_tensor **lsum,
                              kiln_tensor **hsum) {
    int64_t b = kiln_size(x, 0);
    *lsum = *hsum = NULL;
    for (int64_t start = 0; start < b; start += chunk) {
        int64_t len = b - start < chunk ? b - start : chunk;
        kiln_tensor *xs = len == b ? x : kiln_narrow(x, 0, start, len);
        kiln_tensor *ys = len == b ? y : kiln_narrow(y, 0, start, len);
        kiln_tensor *logits = xs && ys ? kiln_module_forward(model, xs) : NULL;
        /* A model placed on several devices (kiln train --split) gives its
         * output on its last stage's device: the labels go there. */
        if (logits && !kiln_device_equal(kiln_get_device(logits), kiln_get_device(ys)))
            ys = kiln_to(ys, kiln_get_device(logits), kiln_dtype_of(ys), 0);
        kiln_tensor *l = logits && ys ? kiln_cross_entropy(logits, ys, NULL) : NULL;
        kiln_tensor *lb = l ? kiln_mul_scalar(l, (double)len) : NULL;
        kiln_tensor *am = lb ? kiln_argmax(logits, 1, false) : NULL;
        kiln_tensor *eq = am ? kiln_eq(am, ys) : NULL;
        kiln_tensor *n = eq ? kiln_sum(eq, 0, NULL, false) : NULL;
        kiln_tensor *ns = !n ? NULL : *lsum ? kiln_add(*lsum, lb) : lb;
        kiln_tensor *nh = !ns ? NULL : *hsum ? kiln_add(*hsum, n) : n;
        if (!nh) return kiln_error_last()->status;
        *lsum = ns, *hsum = nh;
    }
    return KILN_OK;
}

/* The evaluation survives out-of-memory as training does (train_oom.c):
 * a batch that does not fit runs again in chunks of half the samples, and
 * the chunk size stays for the batches after it. No state changes in an
 * evaluation (no_grad, eval mode), so there is nothing to restore. */
kiln_status train_evaluate(kiln_module *model, kiln_loader *ld, int64_t epoch, double *loss, double *acc,
                           int64_t *images) {
    kiln_module_train(model, false);
    kiln_no_grad_begin();
    kiln_status st = kiln_loader_epoch_begin(ld, epoch);
    /* Sums stay on the device; one read at the end. */
    kiln_tensor *loss_sum = NULL, *hits = NULL;
    int64_t seen = 0, chunk = INT64_MAX;
    while (st == KILN_OK) {
        kiln_scope_begin();
        kiln_tensor *x = NULL, *y = NULL;
        st = kiln_loader_next(ld, &x, &y);
        if (st != KILN_OK || !x) {
            kiln_scope_end();
            break;
        }
        int64_t b = kiln_size(x, 0);
        kiln_tensor *lb = NULL, *n = NULL;
        for (;;) {
            kiln_scope_begin();
            st = eval_batch(model, x, y, chunk < b ? chunk : b, &lb, &n);
            if (st == KILN_OK) {
                kiln_keep(lb), kiln_keep(n);
                kiln_scope_end();
                break;
            }
            kiln_scope_end();
            int64_t was = chunk < b ? chunk : b;
            if (st != KILN_ERR_OUT_OF_MEMORY || was <= 1) break;
            chunk = (was + 1) / 2;
            fprintf(stderr, "kiln: evaluation: out of memory at %lld samples at once (%s); evaluating in chunks of "
                            "%lld\n",
                    (long long)was, kiln_error_message(), (long long)chunk);
            kiln_device dev = kiln_get_device(x);
            if ((st = kiln_empty_cache(dev)) != KILN_OK) break;
        }
        /* Each running sum is a scoped result moved out of the scope. */
        kiln_tensor *ns = st != KILN_OK ? NULL : loss_sum ? kiln_add(loss_sum, lb) : kiln_retain(lb);
        kiln_tensor *nh = !ns ? NULL : hits ? kiln_add(hits, n) : kiln_retain(n);
        if (st == KILN_OK && !nh) st = kiln_error_last()->status;
        if (ns) kiln_keep(ns);
        if (nh) kiln_keep(nh);
        kiln_release(lb);
        kiln_release(n);
        kiln_release(loss_sum);
        kiln_release(hits);
        loss_sum = ns, hits = nh;
        seen += b;
        kiln_scope_end();
    }
    double ls = 0, h = 0;
    if (st == KILN_OK && loss_sum) st = kiln_item(loss_sum, &ls);
    if (st == KILN_OK && hits) st = kiln_item(hits, &h);
    kiln_release(loss_sum);
    kiln_release(hits);
    kiln_grad_mode_end();
    kiln_module_train(model, true);
    *loss = seen ? ls / (double)seen : 0;
    *acc = seen ? h / (double)seen : 0;
    if (images) *images = seen;
    return st;
}

/* The loader: batches from a dataset, made by persistent worker threads
 * (or by the consumer when num_workers is 0) into pooled host buffers,
 * delivered in order, optionally prefetched onto a device (prefetch.c) —
 * or, in dataset-on-device mode, made by ops on the consumer's stream from
 * a copy of the whole dataset on the device (device_data.c; no workers).
 *
 * Scheduling. Batch b of an epoch is made by whichever worker claims it;
 * its content depends only on (seed, epoch, b) — the permutation and the
 * transforms are keyed by those — so any number of workers gives the same
 * bits. Workers claim batches in order and never run more than `window`
 * (num_workers * prefetch_factor) batches ahead of the consumer; a result
 * waits in ring slot b % window until the consumer takes it. One mutex
 * guards all shared state; `work_cv` wakes workers (new epoch, window
 * moved, shutdown), `ready_cv` wakes the consumer (a batch landed),
 * `idle_cv` wakes an epoch change waiting for in-progress batches.
 *
 * Buffers. The pool holds one reference to each buffer's tensors and hands
 * out fresh views, so a buffer is reusable exactly when no other handle
 * refers to its storage; reuse also waits for the copies recorded on its
 * reuse event (loader_internal.h). No allocation happens once the pool
 * covers the batches in flight plus those the consumer holds. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log_internal.h"
#include "data/loader_internal.h"
#include "tensor/scope.h"
#include "tensor/tensor_internal.h"

#define PERM_TAG 0x5045524DULL /* "PERM": keeps the permutation stream apart */

typedef struct ring_slot {
    loader_buffer *buf;
    int64_t rows;
    bool ready;
    kiln_status status; /* the worker's result; its error in `error` */
    kiln_error error;
} ring_slot;

struct kiln_loader {
    kiln_dataset *dataset;
    kiln_loader_opts opts;
    kiln_sample_info info;
    size_t sample_floats; /* C * H * W */
    int64_t length;       /* dataset length */
    int64_t n_order;      /* samples an epoch visits: length, or the index list's count */
    bool use_list;        /* kiln_loader_set_indices: perm holds the caller's list */
    int64_t num_batches;
    int num_workers;
    int window; /* ring size: batches in flight at most */
    bool prefetch;
    loader_prefetch *prefetcher;
    loader_ondevice *ondev; /* dataset-on-device mode, else NULL */
    void *scratch; /* one raw sample, for num_workers == 0 */

    pthread_mutex_t mu;
    pthread_cond_t work_cv, ready_cv, idle_cv;
    pthread_t *threads;
    int threads_started;
    bool shutdown;
    /* Epoch state: written by kiln_loader_epoch_begin while no worker is
     * busy, read by workers under `mu` when they claim. */
    bool active;
    uint64_t generation;
    int64_t epoch;
    int64_t *perm; /* (n_order) sample order of this epoch: the permutation, or the caller's list */
    int64_t perm_cap; /* entries perm has room for */
    int64_t next_claim, next_deliver;
    int busy;
    ring_slot *ring; /* (window) */
    loader_buffer **buffers;
    int n_buffers;

    /* Consumer-side statistics. */
    double epoch_start, wait_s;
    int64_t delivered;
};

kiln_loader_opts kiln_loader_opts_default(void) {
    kiln_loader_opts o;
    memset(&o, 0, sizeof o);
    o.batch_size = 64;
    o.prefetch_factor = 2;
    /* Where the caller computes: after kiln_set_device(cuda:0) batches
     * arrive there, not on the host (meta receives no data: the CPU). */
    kiln_device cur = kiln_current_device();
    o.device = cur.type == KILN_DEVICE_META ? KILN_CPU : cur;
    o.transforms = kiln_transform_opts_default();
    o.on_device = KILN_DATA_ON_DEVICE_OFF;
    o.on_device_fraction = 0.25;
    return o;
}

int64_t kiln_loader_num_batches(const kiln_loader *l) { return l ? l->num_batches : 0; }

kiln_stream *loader_test_copy_stream(const kiln_loader *l) {
    return l && l->prefetcher ? loader_prefetch_stream(l->prefetcher) : NULL;
}

/* ---- Buffer pool ------------------------------------------------------------------ */

bool loader_buffer_released(const loader_buffer *b) {
    return atomic_load(&b->x->refcount) == 1 && atomic_load(&b->x->storage->refcount) == 1 &&
           atomic_load(&b->y->refcount) == 1 && atomic_load(&b->y->storage->refcount) == 1;
}

static void buffer_free(loader_buffer *b) {
    if (!b) return;
    if (b->reuse_pending) kiln_event_synchronize(b->reuse_event);
    kiln_event_destroy(b->reuse_event);
    kiln_tensor_drop(b->x);
    kiln_tensor_drop(b->y);
    free(b);
}

static loader_buffer *buffer_new(kiln_loader *l) {
    loader_buffer *b = KILN_CALLOC(1, sizeof *b);
    if (!b) return NULL;
    const kiln_sample_info *in = &l->info;
    int64_t B = l->opts.batch_size;
    b->x = kiln_tensor_alloc("kiln_loader", KILN_SHAPE(B, in->channels, in->height, in->width), KILN_F32,
                             KILN_CPU, l->opts.pin_memory);
    b->y = kiln_tensor_alloc("kiln_loader", KILN_SHAPE(B), KILN_I64, KILN_CPU, l->opts.pin_memory);
    if (!b->x || !b->y) {
        buffer_free(b);
        return NULL;
    }
    return b;
}

/* A buffer for a new batch, state FILLING: a free one, one the consumer
 * has released, or a new one. Called with `mu` held; allocation under the
 * lock happens only while the pool grows (the first batches). */
static loader_buffer *buffer_take_locked(kiln_loader *l) {
    for (int i = 0; i < l->n_buffers; i++) {
        loader_buffer *b = l->buffers[i];
        if (b->state == BUF_FREE || (b->state == BUF_OUT && loader_buffer_released(b))) {
            b->state = BUF_FILLING;
            return b;
        }
    }
    loader_buffer **grown = KILN_REALLOC(l->buffers, (size_t)(l->n_buffers + 1) * sizeof *grown);
    if (!grown) return NULL;
    l->buffers = grown;
    loader_buffer *b = buffer_new(l);
    if (!b) return NULL;
    b->state = BUF_FILLING;
    l->buffers[l->n_buffers++] = b;
    return b;
}

/* ---- Making one batch ---------------------------------------------------------------- */

static kiln_status fill_batch(kiln_loader *l, loader_buffer *b, const int64_t *perm, int64_t epoch,
                              int64_t batch, int64_t rows, void *scratch) {
    if (b->reuse_pending) {
        KILN_TRY(kiln_event_synchronize(b->reuse_event));
        b->reuse_pending = false;
    }
    float *x = kiln_data_ptr(b->x);   /* (B, C, H, W) */
    int64_t *y = kiln_data_ptr(b->y); /* (B) */
    for (int64_t i = 0; i < rows; i++) {
        int64_t pos = batch * l->opts.batch_size + i;
        int64_t idx = perm[pos];
        KILN_TRY(kiln_dataset_get(l->dataset, idx, scratch, &y[i]));
        kiln_transform_apply(&l->opts.transforms, l->info, scratch, x + (size_t)i * l->sample_floats,
                             l->opts.seed, epoch, idx);
    }
    return KILN_OK;
}

static int64_t batch_rows(const kiln_loader *l, int64_t batch) {
    int64_t left = l->n_order - batch * l->opts.batch_size;
    return left < l->opts.batch_size ? left : l->opts.batch_size;
}

static bool claimable_locked(const kiln_loader *l) {
    return l->active && l->next_claim < l->num_batches && l->next_claim < l->next_deliver + l->window;
}

static void *worker_main(void *arg) {
    kiln_loader *l = arg;
    void *scratch = KILN_MALLOC(kiln_sample_bytes(l->info));
    pthread_mutex_lock(&l->mu);
    while (!l->shutdown) {
        if (!claimable_locked(l)) {
            pthread_cond_wait(&l->work_cv, &l->mu);
            continue;
        }
        int64_t batch = l->next_claim++, epoch = l->epoch;
        uint64_t gen = l->generation;
        const int64_t *perm = l->perm;
        loader_buffer *b = buffer_take_locked(l);
        l->busy++;
        pthread_mutex_unlock(&l->mu);

        int64_t rows = batch_rows(l, batch);
        kiln_status st = KILN_ERR_OUT_OF_MEMORY;
        if (b && scratch)
            st = fill_batch(l, b, perm, epoch, batch, rows, scratch);
        else if (!scratch)
            kiln_error_raise(st, __FILE__, __LINE__, NULL, "kiln_loader: no memory for a sample");

        pthread_mutex_lock(&l->mu);
        l->busy--;
        if (gen != l->generation) {
            if (b) b->state = BUF_FREE; /* the epoch was abandoned */
        } else {
            ring_slot *s = &l->ring[batch % l->window];
            s->buf = b;
            s->rows = rows;
            s->status = st;
            if (st) s->error = *kiln_error_last();
            s->ready = true;
            pthread_cond_broadcast(&l->ready_cv);
        }
        if (l->busy == 0) pthread_cond_broadcast(&l->idle_cv);
    }
    pthread_mutex_unlock(&l->mu);
    free(scratch);
    return NULL;
}

/* ---- Creation and shutdown -------------------------------------------------------------- */

static kiln_status check_opts(const kiln_loader_opts *o, kiln_sample_info info) {
    if (o->batch_size <= 0)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use a batch size of at least 1",
                          "kiln_loader_create: batch_size %lld", (long long)o->batch_size);
    if (o->prefetch_factor < 0)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use 0 for the default (2)",
                          "kiln_loader_create: prefetch_factor %d is negative", o->prefetch_factor);
    if (o->on_device != KILN_DATA_ON_DEVICE_OFF && o->on_device != KILN_DATA_ON_DEVICE_AUTO &&
        o->on_device != KILN_DATA_ON_DEVICE_ON)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use KILN_DATA_ON_DEVICE_OFF, _AUTO or _ON",
                          "kiln_loader_create: on_device %d is not a kiln_data_on_device", (int)o->on_device);
    if (!(o->on_device_fraction >= 0.0 && o->on_device_fraction <= 1.0))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use a fraction in (0, 1], or 0 for the default (0.25)",
                          "kiln_loader_create: on_device_fraction %g is outside [0, 1]", o->on_device_fraction);
    if (o->device.type == KILN_DEVICE_META)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "load onto cpu or cuda; meta tensors hold no data",
                          "kiln_loader_create: device meta cannot receive batches");
    if (!kiln_device_is_available(o->device)) {
        char name[32];
        return KILN_RAISE(KILN_ERR_DEVICE, "pick a device kiln_device_count lists",
                          "kiln_loader_create: device %s is not available",
                          kiln_device_str(o->device, name, sizeof name));
    }
    return kiln_transform_check(&o->transforms, info);
}

/* Auto is kiln_num_loader_workers: the cores the compute threads leave
 * (src/runtime/threads.c decides both). */
static int resolve_workers(const kiln_loader_opts *o) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    int threads = kiln_num_threads();
    if (o->num_workers >= 0) {
        if (o->device.type == KILN_DEVICE_CPU && o->num_workers > 0 && o->num_workers + threads > cores)
            kiln_log_write(KILN_LOG_INFO,
                           "kiln_loader: %d workers + %d compute threads on %ld cores: they will share cores",
                           o->num_workers, threads, cores);
        return o->num_workers;
    }
    int n = kiln_num_loader_workers();
    kiln_log_write(KILN_LOG_INFO,
                   "kiln_loader: num_workers auto: %d worker%s beside %d compute thread%s on %ld cores", n,
                   n == 1 ? "" : "s", threads, threads == 1 ? "" : "s", cores);
    return n;
}

static void stop_workers(kiln_loader *l) {
    pthread_mutex_lock(&l->mu);
    l->shutdown = true;
    pthread_cond_broadcast(&l->work_cv);
    pthread_mutex_unlock(&l->mu);
    for (int i = 0; i < l->threads_started; i++) pthread_join(l->threads[i], NULL);
    l->threads_started = 0;
}

void kiln_loader_free(kiln_loader *l) {
    if (!l) return;
    stop_workers(l);
    /* The buffers first: the pinned allocator recorded the copies from them
     * on the copy stream, which must still exist when they are freed. */
    for (int i = 0; i < l->n_buffers; i++) buffer_free(l->buffers[i]);
    loader_prefetch_free(l->prefetcher);
    loader_ondevice_free(l->ondev);
    free(l->buffers);
    free(l->ring);
    free(l->perm);
    free(l->threads);
    free(l->scratch);
    pthread_cond_destroy(&l->work_cv);
    pthread_cond_destroy(&l->ready_cv);
    pthread_cond_destroy(&l->idle_cv);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

static kiln_status start_workers(kiln_loader *l) {
    l->threads = KILN_CALLOC((size_t)l->num_workers, sizeof *l->threads);
    if (!l->threads) return KILN_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < l->num_workers; i++) {
        int rc = pthread_create(&l->threads[i], NULL, worker_main, l);
        if (rc)
            return KILN_RAISE(KILN_ERR_INTERNAL, "lower num_workers",
                              "kiln_loader_create: starting worker %d of %d failed (error %d)", i + 1,
                              l->num_workers, rc);
        l->threads_started++;
    }
    return KILN_OK;
}

/* Whether to use the dataset-on-device mode; the choice and its reason are
 * logged at info level (except OFF, the default). */
static bool want_on_device(const kiln_loader *l) {
    const kiln_loader_opts *o = &l->opts;
    if (o->on_device == KILN_DATA_ON_DEVICE_OFF) return false;
    char dev[32];
    kiln_device_str(o->device, dev, sizeof dev);
    double mib = (double)loader_ondevice_bytes(&o->transforms, l->info, l->length) / (1 << 20);
    if (o->on_device == KILN_DATA_ON_DEVICE_ON) {
        kiln_log_write(KILN_LOG_INFO, "kiln_loader: dataset on %s (%.1f MiB, asked for): batches made by device ops",
                       dev, mib);
        return true;
    }
    size_t free_b = 0, total_b = 0;
    if (kiln_device_mem_info(o->device, &free_b, &total_b)) {
        kiln_log_write(KILN_LOG_INFO, "kiln_loader: on_device auto: free memory of %s unknown (%s): host path",
                       dev, kiln_error_last()->message);
        kiln_error_clear();
        return false;
    }
    double fraction = o->on_device_fraction > 0 ? o->on_device_fraction : 0.25;
    double limit = fraction * (double)free_b / (1 << 20);
    bool fits = mib <= limit;
    kiln_log_write(KILN_LOG_INFO,
                   "kiln_loader: on_device auto: dataset %.1f MiB, %s %.0f%% of %.0f MiB free on %s: %s", mib,
                   fits ? "within" : "over", 100 * fraction, (double)free_b / (1 << 20), dev,
                   fits ? "dataset on the device, batches made by device ops" : "host path (workers, pooled buffers)");
    return fits;
}

static kiln_status start_on_device(kiln_loader *l) {
    if (l->opts.num_workers != 0)
        kiln_log_write(KILN_LOG_INFO, "kiln_loader: num_workers %d unused: the dataset is on the device",
                       l->opts.num_workers);
    kiln_status st = loader_ondevice_create(l->dataset, &l->opts, &l->ondev);
    if (st == KILN_ERR_OUT_OF_MEMORY) {
        char dev[32];
        kiln_error cause = *kiln_error_last(); /* the raise below rewrites this thread's error */
        return KILN_RAISE(st, "use on_device KILN_DATA_ON_DEVICE_AUTO or _OFF (the host path)",
                          "kiln_loader_create: the dataset (%.1f MiB padded) does not fit on %s: %s",
                          (double)loader_ondevice_bytes(&l->opts.transforms, l->info, l->length) /
                              (1 << 20),
                          kiln_device_str(l->opts.device, dev, sizeof dev), cause.message);
    }
    return st;
}

static kiln_status loader_init(kiln_loader *l, kiln_dataset *ds, const kiln_loader_opts *opts) {
    l->dataset = ds;
    l->opts = *opts;
    if (l->opts.prefetch_factor == 0) l->opts.prefetch_factor = 2;
    l->info = kiln_dataset_info(ds);
    KILN_TRY(check_opts(&l->opts, l->info));
    l->sample_floats = (size_t)l->info.channels * (size_t)l->info.height * (size_t)l->info.width;
    l->length = l->n_order = l->perm_cap = kiln_dataset_length(ds);
    int64_t B = l->opts.batch_size;
    l->num_batches = l->opts.drop_last ? l->length / B : (l->length + B - 1) / B;
    if (want_on_device(l)) {
        l->window = 1;
        l->ring = KILN_CALLOC(1, sizeof *l->ring);
        l->perm = KILN_MALLOC((size_t)(l->length > 0 ? l->length : 1) * sizeof *l->perm);
        if (!l->ring || !l->perm) return KILN_ERR_OUT_OF_MEMORY;
        return start_on_device(l);
    }
    l->num_workers = resolve_workers(&l->opts);
    l->window = (l->num_workers > 0 ? l->num_workers : 1) * l->opts.prefetch_factor;
    l->prefetch = l->opts.device.type != KILN_DEVICE_CPU || l->opts.prefetch_to_device;
    l->ring = KILN_CALLOC((size_t)l->window, sizeof *l->ring);
    l->perm = KILN_MALLOC((size_t)(l->length > 0 ? l->length : 1) * sizeof *l->perm);
    l->scratch = KILN_MALLOC(kiln_sample_bytes(l->info));
    if (!l->ring || !l->perm || !l->scratch) return KILN_ERR_OUT_OF_MEMORY;
    if (l->prefetch && l->opts.device.type != KILN_DEVICE_CPU && !l->opts.pin_memory) {
        static const char key[] = "loader-pageable";
        kiln_log_once(key, KILN_LOG_INFO,
                      "kiln_loader: pin_memory is off, so each batch's copy to the device blocks the host (a "
                      "copy from pageable memory cannot be asynchronous); set kiln_loader_opts.pin_memory");
    }
    if (l->prefetch) KILN_TRY(loader_prefetch_create(l->opts.device, &l->prefetcher));
    return l->num_workers > 0 ? start_workers(l) : KILN_OK;
}

kiln_status kiln_loader_create(kiln_dataset *dataset, const kiln_loader_opts *opts, kiln_loader **out) {
    if (!out) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_loader_create: out is NULL");
    *out = NULL;
    if (!dataset || !opts)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_loader_create: %s is NULL",
                          dataset ? "opts" : "dataset");
    kiln_loader *l = KILN_CALLOC(1, sizeof *l);
    if (!l) return KILN_ERR_OUT_OF_MEMORY;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->work_cv, NULL);
    pthread_cond_init(&l->ready_cv, NULL);
    pthread_cond_init(&l->idle_cv, NULL);
    kiln_status st = loader_init(l, dataset, opts);
    if (st) {
        kiln_error saved = *kiln_error_last();
        kiln_loader_free(l);
        return kiln_error_raise(st, saved.file, saved.line, saved.hint[0] ? saved.hint : NULL, "%s",
                                saved.message);
    }
    *out = l;
    return KILN_OK;
}

/* ---- Epochs ---------------------------------------------------------------------------- */

/* Fisher-Yates over words of the stream keyed by (seed, "PERM", epoch):
 * the same order on every machine and for every worker count. */
void kiln_loader_permutation(int64_t n, bool shuffle, uint64_t seed, int64_t epoch, int64_t *perm) {
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    if (!shuffle || n < 2) return;
    kiln_rng r = kiln_rng_split(kiln_rng_split(kiln_rng_make(seed), PERM_TAG), (uint64_t)epoch);
    kiln_rng_shuffle(&r, perm, n);
}

/* Abandon the epoch in progress: no worker is busy or can claim when this
 * returns, and the ring holds nothing (kiln_loader_epoch_begin and
 * kiln_loader_set_indices, which both rewrite the epoch state). */
static void epoch_stop(kiln_loader *l) {
    pthread_mutex_lock(&l->mu);
    l->active = false;
    l->generation++;
    while (l->busy > 0) pthread_cond_wait(&l->idle_cv, &l->mu);
    for (int i = 0; i < l->window; i++) {
        ring_slot *s = &l->ring[i];
        if (s->ready && s->buf) s->buf->state = BUF_FREE;
        s->ready = false;
        s->buf = NULL;
    }
    pthread_mutex_unlock(&l->mu);
    if (l->prefetcher) loader_prefetch_discard(l->prefetcher);
}

static kiln_status check_indices(const kiln_loader *l, const int64_t *indices, int64_t count) {
    if (count < 0 || (count > 0 && !indices))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass count >= 0 entries (NULL and 0: the whole dataset)",
                          "kiln_loader_set_indices: count %lld with indices %s", (long long)count,
                          indices ? "given" : "NULL");
    if (count > ((int64_t)1 << 40))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give at most 2^40 indices",
                          "kiln_loader_set_indices: count %lld is out of range", (long long)count);
    for (int64_t i = 0; i < count; i++)
        if (indices[i] < 0 || indices[i] >= l->length)
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass indices of this loader's dataset",
                              "kiln_loader_set_indices: entry %lld is %lld, outside the dataset's [0, %lld)",
                              (long long)i, (long long)indices[i], (long long)l->length);
    return KILN_OK;
}

kiln_status kiln_loader_set_indices(kiln_loader *l, const int64_t *indices, int64_t count) {
    if (!l) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_loader_set_indices: loader is NULL");
    KILN_TRY(check_indices(l, indices, count));
    epoch_stop(l);
    bool list = indices != NULL;
    int64_t n = list ? count : l->length;
    if (n > l->perm_cap) {
        int64_t *grown = KILN_MALLOC((size_t)n * sizeof *grown);
        if (!grown) return KILN_ERR_OUT_OF_MEMORY;
        free(l->perm);
        l->perm = grown;
        l->perm_cap = n;
    }
    if (list && count > 0) memcpy(l->perm, indices, (size_t)count * sizeof *indices);
    int64_t B = l->opts.batch_size;
    pthread_mutex_lock(&l->mu);
    l->use_list = list;
    l->n_order = n;
    l->num_batches = l->opts.drop_last ? n / B : (n + B - 1) / B;
    pthread_mutex_unlock(&l->mu);
    return KILN_OK;
}

kiln_status kiln_loader_epoch_begin(kiln_loader *l, int64_t epoch) {
    if (!l) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_loader_epoch_begin: loader is NULL");
    epoch_stop(l);
    /* No worker reads the epoch state now: none is busy and none can claim
     * while `active` is false. The caller's list is the order as given. */
    if (!l->use_list) kiln_loader_permutation(l->length, l->opts.shuffle, l->opts.seed, epoch, l->perm);
    pthread_mutex_lock(&l->mu);
    l->epoch = epoch;
    l->next_claim = l->next_deliver = 0;
    l->active = true;
    pthread_cond_broadcast(&l->work_cv);
    pthread_mutex_unlock(&l->mu);
    l->epoch_start = kiln_clock_now_s();
    l->wait_s = 0;
    l->delivered = 0;
    return KILN_OK;
}

/* Re-raise a batch's error on the consumer's thread, naming the batch. */
static kiln_status batch_error(int64_t batch, kiln_status st, const kiln_error *e) {
    kiln_error copy = *e; /* e may be this thread's error object, which the raise rewrites */
    return kiln_error_raise(st, copy.file, copy.line, copy.hint[0] ? copy.hint : NULL,
                            "kiln_loader: batch %lld: %s", (long long)batch, copy.message);
}

/* The next host batch in order, or *buf NULL at the end of the epoch.
 * With workers, waits for it; without, makes it here. With `nowait`, a
 * batch that is not ready already (always, without workers) gives *buf
 * NULL and *pending true. */
static kiln_status host_batch(kiln_loader *l, bool nowait, loader_buffer **buf, int64_t *rows,
                              bool *pending) {
    *buf = NULL;
    *pending = false;
    pthread_mutex_lock(&l->mu);
    if (!l->active || l->next_deliver >= l->num_batches) {
        pthread_mutex_unlock(&l->mu);
        return KILN_OK;
    }
    int64_t batch = l->next_deliver;
    if (l->num_workers == 0 && nowait) { /* making it here would block */
        pthread_mutex_unlock(&l->mu);
        *pending = true;
        return KILN_OK;
    }
    if (l->num_workers == 0) {
        loader_buffer *b = buffer_take_locked(l);
        l->next_deliver++;
        pthread_mutex_unlock(&l->mu);
        if (!b) return kiln_error_last()->status;
        *rows = batch_rows(l, batch);
        kiln_status st = fill_batch(l, b, l->perm, l->epoch, batch, *rows, l->scratch);
        if (st) {
            pthread_mutex_lock(&l->mu);
            b->state = BUF_FREE;
            pthread_mutex_unlock(&l->mu);
            return batch_error(batch, st, kiln_error_last());
        }
        *buf = b;
        return KILN_OK;
    }
    ring_slot *s = &l->ring[batch % l->window];
    if (!s->ready && nowait) {
        pthread_mutex_unlock(&l->mu);
        *pending = true;
        return KILN_OK;
    }
    while (!s->ready) pthread_cond_wait(&l->ready_cv, &l->mu);
    ring_slot got = *s;
    s->ready = false;
    s->buf = NULL;
    l->next_deliver++;
    pthread_cond_broadcast(&l->work_cv); /* the window moved */
    if (got.status && got.buf) got.buf->state = BUF_FREE;
    pthread_mutex_unlock(&l->mu);
    if (got.status) return batch_error(batch, got.status, &got.error);
    *buf = got.buf;
    *rows = got.rows;
    return KILN_OK;
}

static void buffer_set_state(kiln_loader *l, loader_buffer *b, int state) {
    pthread_mutex_lock(&l->mu);
    b->state = state;
    pthread_mutex_unlock(&l->mu);
}

/* Host views of the batch for the consumer; the buffer stays BUF_OUT until
 * they (and any views of them) are released. */
static kiln_status hand_out_host(kiln_loader *l, loader_buffer *b, int64_t rows, kiln_tensor **x,
                                 kiln_tensor **y) {
    *x = loader_rows_view(b->x, rows);
    *y = *x ? loader_rows_view(b->y, rows) : NULL;
    buffer_set_state(l, b, BUF_OUT);
    if (!*y) {
        kiln_tensor_drop(*x);
        *x = NULL;
        return kiln_error_last()->status;
    }
    return KILN_OK;
}

/* Copy a host batch to the device on the copy stream; the buffer is free
 * again at once (a refill waits for the copy's event). */
static kiln_status stage(kiln_loader *l, loader_buffer *b, int64_t rows) {
    kiln_status st = loader_prefetch_stage(l->prefetcher, b, rows);
    buffer_set_state(l, b, BUF_FREE);
    return st;
}

static kiln_status next_prefetched(kiln_loader *l, kiln_tensor **x, kiln_tensor **y) {
    loader_buffer *b;
    int64_t rows = 0;
    bool pending;
    if (!loader_prefetch_staged(l->prefetcher)) {
        KILN_TRY(host_batch(l, false, &b, &rows, &pending));
        if (!b) return KILN_OK; /* end of epoch */
        KILN_TRY(stage(l, b, rows));
    }
    KILN_TRY(loader_prefetch_take(l->prefetcher, x, y));
    /* Queue the next copy now, so it overlaps the work the caller is about
     * to queue on this batch — if a worker has it ready; waiting for it
     * here would delay this batch. */
    kiln_status st = host_batch(l, true, &b, &rows, &pending);
    if (!st && b) st = stage(l, b, rows);
    if (st) {
        kiln_tensor_drop(*x);
        kiln_tensor_drop(*y);
        *x = *y = NULL;
    }
    return st;
}

/* Device mode: the consumer queues the batch's ops itself (no workers). */
static kiln_status next_on_device(kiln_loader *l, kiln_tensor **x, kiln_tensor **y) {
    if (!l->active || l->next_deliver >= l->num_batches) return KILN_OK;
    int64_t batch = l->next_deliver++;
    kiln_status st = loader_ondevice_batch(l->ondev, l->perm + batch * l->opts.batch_size, batch_rows(l, batch),
                                           l->epoch, x, y);
    return st ? batch_error(batch, st, kiln_error_last()) : KILN_OK;
}

static kiln_status next_impl(kiln_loader *l, kiln_tensor **x, kiln_tensor **y) {
    if (l->ondev) return next_on_device(l, x, y);
    if (l->prefetch) return next_prefetched(l, x, y);
    loader_buffer *b;
    int64_t rows = 0;
    bool pending;
    KILN_TRY(host_batch(l, false, &b, &rows, &pending));
    if (!b) return KILN_OK;
    return hand_out_host(l, b, rows, x, y);
}

kiln_status kiln_loader_next(kiln_loader *l, kiln_tensor **x, kiln_tensor **y) {
    if (!x || !y) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_loader_next: x or y is NULL");
    *x = *y = NULL;
    if (!l) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_loader_next: loader is NULL");
    if (l->generation == 0)
        return KILN_RAISE(KILN_ERR_STATE, "call kiln_loader_epoch_begin first",
                          "kiln_loader_next: no epoch has begun");
    double t0 = kiln_clock_now_s();
    kiln_api_enter(); /* library calls below must not register with the caller's scope */
    kiln_tensor *bx = NULL, *by = NULL;
    kiln_status st = next_impl(l, &bx, &by);
    l->wait_s += kiln_clock_now_s() - t0;
    if (st || !bx) {
        kiln_api_leave();
        return st;
    }
    l->delivered++;
    /* Each result is returned like a public function's: registered with
     * the caller's innermost scope when one is open. */
    *x = kiln_api_return(bx);
    kiln_api_enter();
    *y = kiln_api_return(by);
    if (!*x || !*y) {
        kiln_release(*x);
        kiln_release(*y);
        *x = *y = NULL;
        return KILN_ERR_OUT_OF_MEMORY;
    }
    return KILN_OK;
}

kiln_status kiln_loader_stats_get(const kiln_loader *l, kiln_loader_stats *out) {
    if (!l || !out)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_loader_stats_get: NULL argument");
    memset(out, 0, sizeof *out);
    out->epoch = l->epoch;
    out->batches = l->delivered;
    out->batches_per_epoch = l->num_batches;
    out->wait_s = l->wait_s;
    out->elapsed_s = l->epoch_start > 0 ? kiln_clock_now_s() - l->epoch_start : 0;
    out->batches_per_s = out->elapsed_s > 0 ? (double)l->delivered / out->elapsed_s : 0;
    out->num_workers = l->num_workers;
    out->on_device = l->ondev != NULL;
    out->device_bytes = loader_ondevice_size(l->ondev);
    pthread_mutex_t *mu = (pthread_mutex_t *)&l->mu; /* the pool size changes under the lock */
    pthread_mutex_lock(mu);
    out->buffers_allocated = l->n_buffers;
    pthread_mutex_unlock(mu);
    return KILN_OK;
}

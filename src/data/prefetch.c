/* The device prefetcher: the tutorials' DataPrefetcher in C.
 *
 *   stage(batch k+1):  on the copy stream, x_dev = to(x_host, NON_BLOCKING)
 *                      record `ready` (and the host buffer's reuse event)
 *   take(batch k+1):   consumer stream waits on `ready` (device-side)
 *                      record_stream(x_dev, consumer stream)
 *
 * The copy overlaps whatever the consumer queued before taking the batch.
 * Three hazards and what guards each:
 *   - the consumer reading x_dev before the copy landed: the wait on
 *     `ready` orders the consumer stream after the copy;
 *   - the pool refilling the pinned host buffer while the DMA still reads
 *     it: the buffer's reuse event, which the worker synchronises on
 *     before refilling;
 *   - the copy stream's allocator handing x_dev's block to a later copy
 *     while the consumer stream still uses it: record_stream on x_dev.
 * With a CPU target (the forced path) the copies run synchronously on the
 * submitting thread, and the same calls are made, so the logic is
 * exercised without a GPU. */
#include <stdatomic.h>
#include <stdlib.h>

#include "base/error.h"
#include "data/loader_internal.h"
#include "tensor/tensor_internal.h"

struct loader_prefetch {
    kiln_device device;
    kiln_stream *copy_stream;
    kiln_event *ready;
    kiln_tensor *x, *y; /* staged device batch, NULL when none */
};

kiln_status loader_prefetch_create(kiln_device device, loader_prefetch **out) {
    *out = NULL;
    loader_prefetch *p = KILN_CALLOC(1, sizeof *p);
    if (!p) return KILN_ERR_OUT_OF_MEMORY;
    p->device = device;
    kiln_status st = kiln_stream_create(device, 0, &p->copy_stream);
    if (!st) st = kiln_event_create(device, KILN_EVENT_DEFAULT, &p->ready);
    if (st) {
        loader_prefetch_free(p);
        return st;
    }
    *out = p;
    return KILN_OK;
}

static atomic_bool skip_wait_for_tests, skip_record_for_tests;

void loader_prefetch_test_skip_wait(bool skip) { atomic_store(&skip_wait_for_tests, skip); }

void loader_prefetch_test_skip_record(bool skip) { atomic_store(&skip_record_for_tests, skip); }

bool loader_prefetch_staged(const loader_prefetch *p) { return p->x != NULL; }

kiln_stream *loader_prefetch_stream(const loader_prefetch *p) { return p->copy_stream; }

kiln_tensor *loader_rows_view(kiln_tensor *t, int64_t rows) {
    int64_t shape[KILN_MAX_DIMS], strides[KILN_MAX_DIMS];
    int nd = kiln_ndim(t);
    for (int i = 0; i < nd; i++) shape[i] = kiln_size(t, i);
    shape[0] = rows;
    kiln_contiguous_strides(nd, shape, strides);
    return kiln_tensor_alias(t, nd, shape, strides, 0);
}

static kiln_status copy_rows(loader_prefetch *p, kiln_tensor *host, int64_t rows, kiln_tensor **dev) {
    kiln_tensor *view = loader_rows_view(host, rows);
    if (!view) return kiln_error_last()->status;
    /* KILN_COPY: on the forced CPU path the target equals the source's
     * device and dtype, and a reference to the pooled buffer must never
     * escape. */
    *dev = kiln_to(view, p->device, kiln_dtype_of(host), KILN_NON_BLOCKING | KILN_COPY);
    kiln_tensor_drop(view);
    return *dev ? KILN_OK : kiln_error_last()->status;
}

kiln_status loader_prefetch_stage(loader_prefetch *p, loader_buffer *buf, int64_t rows) {
    KILN_ASSERT(!p->x);
    kiln_stream_guard g = kiln_stream_guard_begin(p->copy_stream);
    kiln_status st = copy_rows(p, buf->x, rows, &p->x);
    if (!st) st = copy_rows(p, buf->y, rows, &p->y);
    if (!st) st = kiln_event_record(p->ready, p->copy_stream);
    if (!st && !buf->reuse_event) st = kiln_event_create(p->device, KILN_EVENT_DEFAULT, &buf->reuse_event);
    if (!st) st = kiln_event_record(buf->reuse_event, p->copy_stream);
    if (!st) buf->reuse_pending = true;
    kiln_stream_guard_end(&g);
    if (st) {
        /* A failed stage may have queued a copy already: the buffer is
         * refilled only after the copy stream drains. */
        kiln_stream_synchronize(p->copy_stream);
        kiln_tensor_drop(p->x);
        kiln_tensor_drop(p->y);
        p->x = p->y = NULL;
    }
    return st;
}

kiln_status loader_prefetch_take(loader_prefetch *p, kiln_tensor **x, kiln_tensor **y) {
    KILN_ASSERT(p->x);
    kiln_stream *consumer = kiln_current_stream(p->device);
    kiln_status st = consumer ? KILN_OK : kiln_error_last()->status;
    if (!st && !atomic_load(&skip_wait_for_tests)) st = kiln_stream_wait_event(consumer, p->ready);
    if (!st && !atomic_load(&skip_record_for_tests)) st = kiln_record_stream(p->x, consumer);
    if (!st && !atomic_load(&skip_record_for_tests)) st = kiln_record_stream(p->y, consumer);
    if (st) {
        loader_prefetch_discard(p);
        return st;
    }
    *x = p->x;
    *y = p->y;
    p->x = p->y = NULL;
    return KILN_OK;
}

void loader_prefetch_discard(loader_prefetch *p) {
    kiln_tensor_drop(p->x);
    kiln_tensor_drop(p->y);
    p->x = p->y = NULL;
}

void loader_prefetch_free(loader_prefetch *p) {
    if (!p) return;
    loader_prefetch_discard(p);
    if (p->copy_stream) kiln_stream_destroy(p->copy_stream);
    kiln_event_destroy(p->ready);
    free(p);
}

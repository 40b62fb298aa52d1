/* Streams and events: thin, checked wrappers over the backend's handles,
 * plus the per-thread current stream of each device. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "base/error.h"
#include "runtime/counters.h"
#include "runtime/runtime_internal.h"

struct kiln_stream {
    kiln_device device;
    void *handle; /* backend stream */
    uint64_t id;
    int priority;
    bool is_default;
};

struct kiln_event {
    kiln_device device;
    void *handle; /* backend event */
    unsigned flags;
    bool recorded;
};

static _Atomic uint64_t next_stream_id = 1;
static pthread_mutex_t default_mutex = PTHREAD_MUTEX_INITIALIZER;
static kiln_stream *default_streams[KILN_DEVICE_TYPE_COUNT][KILN_MAX_DEVICES];
static _Thread_local kiln_stream *tls_current[KILN_DEVICE_TYPE_COUNT][KILN_MAX_DEVICES];

static kiln_status null_arg(const char *what) {
    return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "%s is NULL", what);
}

kiln_stream *kiln_stream_default(kiln_device device) {
    const kiln_backend *be = kiln_backend_for(device);
    if (!be) return NULL;
    pthread_mutex_lock(&default_mutex);
    kiln_stream **slot = &default_streams[device.type][device.index];
    if (!*slot) {
        kiln_stream *s = KILN_CALLOC(1, sizeof *s);
        if (s) {
            s->device = device;
            s->handle = be->stream_default(device.index);
            s->id = atomic_fetch_add(&next_stream_id, 1);
            s->is_default = true;
            *slot = s;
        }
    }
    kiln_stream *s = *slot;
    pthread_mutex_unlock(&default_mutex);
    return s;
}

kiln_status kiln_stream_create(kiln_device device, int priority, kiln_stream **out) {
    if (!out) return null_arg("kiln_stream_create: out");
    *out = NULL;
    const kiln_backend *be = kiln_backend_for(device);
    if (!be) return kiln_error_last()->status;
    kiln_stream *s = KILN_CALLOC(1, sizeof *s);
    if (!s) return KILN_ERR_OUT_OF_MEMORY;
    kiln_status st = be->stream_create(device.index, priority, &s->handle);
    if (st) {
        free(s);
        return st;
    }
    s->device = device;
    s->priority = priority;
    s->id = atomic_fetch_add(&next_stream_id, 1);
    *out = s;
    return KILN_OK;
}

kiln_status kiln_stream_destroy(kiln_stream *stream) {
    if (!stream) return KILN_OK;
    if (stream->is_default)
        return KILN_RAISE(KILN_ERR_STATE, "destroy only streams made by kiln_stream_create",
                          "kiln_stream_destroy: stream %llu is a default stream, owned by the library",
                          (unsigned long long)stream->id);
    const kiln_backend *be = kiln_backend_get(stream->device.type);
    kiln_status st = be->stream_synchronize(stream->device.index, stream->handle);
    /* Blocks whose use was recorded on this stream (kiln_record_stream) must
     * not record events on it once it is gone; its work is done. */
    kiln_caching_allocator *dev_alloc = kiln_device_allocator(stream->device), *pin = kiln_pinned_allocator();
    if (dev_alloc) kiln_caching_allocator_forget_stream(dev_alloc, (kiln_alloc_stream)stream);
    if (pin) kiln_caching_allocator_forget_stream(pin, (kiln_alloc_stream)stream);
    if (tls_current[stream->device.type][stream->device.index] == stream)
        tls_current[stream->device.type][stream->device.index] = NULL;
    be->stream_destroy(stream->device.index, stream->handle);
    free(stream);
    return st;
}

kiln_stream *kiln_current_stream(kiln_device device) {
    if (!kiln_device_is_available(device)) return kiln_stream_default(device); /* raises */
    kiln_stream *s = tls_current[device.type][device.index];
    return s ? s : kiln_stream_default(device);
}

kiln_status kiln_set_stream(kiln_stream *stream) {
    if (!stream) return null_arg("kiln_set_stream: stream");
    tls_current[stream->device.type][stream->device.index] = stream;
    return KILN_OK;
}

kiln_stream_guard kiln_stream_guard_begin(kiln_stream *stream) {
    kiln_stream_guard g = {NULL, stream};
    if (!stream) return g;
    g.previous = kiln_current_stream(stream->device);
    kiln_set_stream(stream);
    return g;
}

void kiln_stream_guard_end(kiln_stream_guard *guard) {
    if (!guard || !guard->stream) return;
    tls_current[guard->stream->device.type][guard->stream->device.index] = guard->previous;
    guard->stream = NULL;
}

kiln_device kiln_stream_device(const kiln_stream *stream) { return stream->device; }
uint64_t kiln_stream_id(const kiln_stream *stream) { return stream->id; }
int kiln_stream_priority(const kiln_stream *stream) { return stream->priority; }
void *kiln_stream_handle(const kiln_stream *stream) { return stream->handle; }

bool kiln_stream_query(kiln_stream *stream) {
    if (!stream) return true;
    return kiln_backend_get(stream->device.type)->stream_query(stream->device.index, stream->handle);
}

kiln_status kiln_stream_synchronize(kiln_stream *stream) {
    if (!stream) return null_arg("kiln_stream_synchronize: stream");
    uint64_t t0 = kiln_sync_enter();
    kiln_status st = kiln_backend_get(stream->device.type)->stream_synchronize(stream->device.index, stream->handle);
    kiln_sync_leave("kiln_stream_synchronize", t0);
    return st;
}

kiln_status kiln_stream_wait_stream(kiln_stream *waiter, kiln_stream *other) {
    if (!waiter || !other) return null_arg("kiln_stream_wait_stream: stream");
    if (waiter == other) return KILN_OK;
    kiln_event *ev = NULL;
    KILN_TRY(kiln_event_create(other->device, KILN_EVENT_DEFAULT, &ev));
    kiln_status st = kiln_event_record(ev, other);
    if (!st) st = kiln_stream_wait_event(waiter, ev);
    /* Destroying a recorded event is safe in CUDA: the wait holds on. */
    kiln_event_destroy(ev);
    return st;
}

/* ---- Events ---------------------------------------------------------------- */

kiln_status kiln_event_create(kiln_device device, unsigned flags, kiln_event **out) {
    if (!out) return null_arg("kiln_event_create: out");
    *out = NULL;
    const kiln_backend *be = kiln_backend_for(device);
    if (!be) return kiln_error_last()->status;
    kiln_event *e = KILN_CALLOC(1, sizeof *e);
    if (!e) return KILN_ERR_OUT_OF_MEMORY;
    kiln_status st = be->event_create(device.index, flags, &e->handle);
    if (st) {
        free(e);
        return st;
    }
    e->device = device;
    e->flags = flags;
    *out = e;
    return KILN_OK;
}

void kiln_event_destroy(kiln_event *event) {
    if (!event) return;
    kiln_backend_get(event->device.type)->event_destroy(event->device.index, event->handle);
    free(event);
}

kiln_status kiln_event_record(kiln_event *event, kiln_stream *stream) {
    if (!event || !stream) return null_arg("kiln_event_record: event or stream");
    if (!kiln_device_equal(event->device, stream->device)) {
        char a[32], b[32];
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "create the event on the stream's device",
                          "kiln_event_record: event is on %s but the stream is on %s",
                          kiln_device_str(event->device, a, sizeof a), kiln_device_str(stream->device, b, sizeof b));
    }
    KILN_TRY(kiln_backend_get(event->device.type)->event_record(event->device.index, event->handle, stream->handle));
    event->recorded = true;
    return KILN_OK;
}

bool kiln_event_query(kiln_event *event) {
    if (!event || !event->recorded) return true;
    return kiln_backend_get(event->device.type)->event_query(event->device.index, event->handle);
}

kiln_status kiln_event_synchronize(kiln_event *event) {
    if (!event) return null_arg("kiln_event_synchronize: event");
    if (!event->recorded) return KILN_OK;
    uint64_t t0 = kiln_sync_enter();
    kiln_status st = kiln_backend_get(event->device.type)->event_synchronize(event->device.index, event->handle);
    kiln_sync_leave("kiln_event_synchronize", t0);
    return st;
}

kiln_status kiln_stream_wait_event(kiln_stream *stream, kiln_event *event) {
    if (!stream || !event) return null_arg("kiln_stream_wait_event: stream or event");
    if (!event->recorded) return KILN_OK;
    if (stream->device.type != event->device.type) {
        /* Cross-type waits (a CPU stream on a CUDA event) have no device-side
         * form: wait on the host, which is what the CPU stream would do. */
        return kiln_event_synchronize(event);
    }
    return kiln_backend_get(stream->device.type)->stream_wait_event(stream->device.index, stream->handle, event->handle);
}

kiln_status kiln_event_elapsed_ms(kiln_event *start, kiln_event *end, float *ms) {
    if (!start || !end || !ms) return null_arg("kiln_event_elapsed_ms: argument");
    if (!(start->flags & KILN_EVENT_TIMING) || !(end->flags & KILN_EVENT_TIMING))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "create both events with KILN_EVENT_TIMING",
                          "kiln_event_elapsed_ms: an event was created without timing");
    if (!start->recorded || !end->recorded)
        return KILN_RAISE(KILN_ERR_STATE, "record both events before asking for the time between them",
                          "kiln_event_elapsed_ms: an event has not been recorded");
    if (!kiln_device_equal(start->device, end->device))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_event_elapsed_ms: events are on different devices");
    if (!kiln_event_query(start) || !kiln_event_query(end))
        return KILN_RAISE(KILN_ERR_STATE, "call kiln_event_synchronize(end) first",
                          "kiln_event_elapsed_ms: the events have not completed");
    return kiln_backend_get(start->device.type)->event_elapsed_ms(start->device.index, start->handle, end->handle, ms);
}

void kiln_streams_shutdown(void) {
    pthread_mutex_lock(&default_mutex);
    for (int t = 0; t < KILN_DEVICE_TYPE_COUNT; t++)
        for (int i = 0; i < KILN_MAX_DEVICES; i++) {
            free(default_streams[t][i]);
            default_streams[t][i] = NULL;
        }
    pthread_mutex_unlock(&default_mutex);
}

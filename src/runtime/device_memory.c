/* Per-device caching allocators, the pinned host allocator, their public
 * API, and the per-device random generators. The allocators are created
 * lazily (first use) with the configuration in force at that moment. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "runtime/counters.h"
#include "runtime/runtime_internal.h"

static pthread_mutex_t memory_mutex = PTHREAD_MUTEX_INITIALIZER;
static kiln_alloc_config global_config;
static bool config_ready;
static kiln_caching_allocator *allocators[KILN_DEVICE_TYPE_COUNT][KILN_MAX_DEVICES];
static kiln_raw_ops meta_ops;
static bool meta_ops_ready;
static kiln_caching_allocator *pinned;

/* ---- Raw ops over a backend -------------------------------------------------------
 * ctx packs the device; events use the backend of the stream they are
 * recorded on, which for the pinned allocator is a device stream. */

typedef struct raw_event {
    const kiln_backend *backend;
    int index;
    void *handle;
} raw_event;

static kiln_status raw_event_record(void *ctx, kiln_alloc_stream stream, void **event) {
    (void)ctx;
    kiln_stream *s = (kiln_stream *)stream;
    kiln_device d = kiln_stream_device(s);
    raw_event *e = KILN_MALLOC(sizeof *e);
    if (!e) return KILN_ERR_OUT_OF_MEMORY;
    e->backend = kiln_backend_get(d.type);
    e->index = d.index;
    kiln_status st = e->backend->event_create(d.index, KILN_EVENT_DEFAULT, &e->handle);
    if (!st) st = e->backend->event_record(d.index, e->handle, kiln_stream_handle(s));
    if (st) {
        free(e);
        return st;
    }
    *event = e;
    return KILN_OK;
}

static bool raw_event_query(void *ctx, void *event) {
    (void)ctx;
    raw_event *e = event;
    return e->backend->event_query(e->index, e->handle);
}

static void raw_event_synchronize(void *ctx, void *event) {
    (void)ctx;
    raw_event *e = event;
    if (e->backend->event_synchronize(e->index, e->handle))
        kiln_log_write(KILN_LOG_WARN, "allocator: event synchronize failed: %s", kiln_error_message());
}

static void raw_event_destroy(void *ctx, void *event) {
    (void)ctx;
    raw_event *e = event;
    e->backend->event_destroy(e->index, e->handle);
    free(e);
}

static uint64_t raw_stream_id(void *ctx, kiln_alloc_stream stream) {
    (void)ctx;
    return kiln_stream_id((const kiln_stream *)stream);
}

/* Device ctx: (type << 16) | index, so no allocation is needed for it. */
static uintptr_t pack(kiln_device d) { return ((uintptr_t)d.type << 16) | (uintptr_t)d.index; }
static kiln_device unpack(void *ctx) {
    uintptr_t v = (uintptr_t)ctx;
    return (kiln_device){(kiln_device_type)(v >> 16), (int)(v & 0xffff)};
}

static kiln_status dev_alloc(void *ctx, size_t bytes, void **ptr) {
    kiln_device d = unpack(ctx);
    kiln_counter_add(KILN_COUNTER_RAW_ALLOCS, 1);
    return kiln_backend_get(d.type)->raw_alloc(d.index, bytes, ptr);
}
static void dev_free(void *ctx, void *ptr, size_t bytes) {
    kiln_device d = unpack(ctx);
    kiln_backend_get(d.type)->raw_free(d.index, ptr, bytes);
}
static kiln_status dev_mem_info(void *ctx, size_t *free_bytes, size_t *total_bytes) {
    kiln_device d = unpack(ctx);
    return kiln_backend_get(d.type)->mem_info(d.index, free_bytes, total_bytes);
}

/* Pinned memory comes from the CUDA backend when it has a device (page-locked
 * through cudaHostAlloc), otherwise from aligned host memory. */
static const kiln_backend *pinned_source(void) {
    const kiln_backend *cuda = kiln_backend_get(KILN_DEVICE_CUDA);
    if (cuda && cuda->host_alloc && cuda->device_count() > 0) return cuda;
    return NULL;
}
static kiln_status pinned_alloc_raw(void *ctx, size_t bytes, void **ptr) {
    (void)ctx;
    const kiln_backend *be = pinned_source();
    if (be) return be->host_alloc(bytes, ptr);
    return kiln_cpu_backend()->raw_alloc(0, bytes, ptr);
}
static void pinned_free_raw(void *ctx, void *ptr, size_t bytes) {
    (void)ctx;
    const kiln_backend *be = pinned_source();
    if (be) be->host_free(ptr);
    else kiln_cpu_backend()->raw_free(0, ptr, bytes);
}
static kiln_status pinned_mem_info(void *ctx, size_t *free_bytes, size_t *total_bytes) {
    (void)ctx;
    return kiln_cpu_backend()->mem_info(0, free_bytes, total_bytes);
}

static void ensure_config(void) {
    if (config_ready) return;
    global_config = kiln_alloc_config_default();
    config_ready = true;
}

static kiln_caching_allocator *create_for(kiln_device d, const kiln_backend *be) {
    static char names[KILN_DEVICE_TYPE_COUNT][KILN_MAX_DEVICES][16];
    char *name = names[d.type][d.index];
    kiln_device_str(d, name, sizeof names[0][0]);
    kiln_raw_ops ops;
    if (!be->has_memory) {
        if (!meta_ops_ready) {
            meta_ops = kiln_simulated_raw_ops((size_t)1 << 40, "meta");
            meta_ops_ready = true;
        }
        ops = meta_ops;
    } else {
        ops = (kiln_raw_ops){
            .ctx = (void *)pack(d),
            .device_name = name,
            .host_accessible = be->host_accessible,
            .alloc = dev_alloc,
            .free = dev_free,
            .mem_info = dev_mem_info,
        };
    }
    ops.event_record = raw_event_record;
    ops.stream_id = raw_stream_id;
    ops.event_query = raw_event_query;
    ops.event_synchronize = raw_event_synchronize;
    ops.event_destroy = raw_event_destroy;
    return kiln_caching_allocator_create(&ops, &global_config);
}

kiln_caching_allocator *kiln_device_allocator(kiln_device device) {
    const kiln_backend *be = kiln_backend_for(device);
    if (!be) return NULL;
    if (device.type != KILN_DEVICE_CUDA) device.index = 0;
    pthread_mutex_lock(&memory_mutex);
    ensure_config();
    kiln_caching_allocator **slot = &allocators[device.type][device.index];
    if (!*slot) *slot = create_for(device, be);
    kiln_caching_allocator *a = *slot;
    pthread_mutex_unlock(&memory_mutex);
    return a;
}

kiln_caching_allocator *kiln_pinned_allocator(void) {
    pthread_mutex_lock(&memory_mutex);
    ensure_config();
    if (!pinned) {
        kiln_raw_ops ops = {
            .ctx = NULL,
            .device_name = "pinned host memory",
            .host_accessible = true,
            .alloc = pinned_alloc_raw,
            .free = pinned_free_raw,
            .mem_info = pinned_mem_info,
            .event_record = raw_event_record,
            .event_query = raw_event_query,
            .event_synchronize = raw_event_synchronize,
            .event_destroy = raw_event_destroy,
            .stream_id = raw_stream_id,
        };
        kiln_alloc_config cfg = global_config;
        cfg.limit_bytes = 0; /* device limits do not apply to host memory */
        cfg.fraction = 0;
        pinned = kiln_caching_allocator_create(&ops, &cfg);
    }
    kiln_caching_allocator *a = pinned;
    pthread_mutex_unlock(&memory_mutex);
    return a;
}

/* ---- Public memory API ------------------------------------------------------------ */

#define ALLOCATOR_OR_RETURN(a, device)                                                             \
    kiln_caching_allocator *a = kiln_device_allocator(device);                                     \
    if (!a) return kiln_error_last()->status

/* ---- Fault injection -------------------------------------------------------------- */

/* Allocations attempted since the last arming, and the index that fails
 * (-1: none). Relaxed atomics: the count is exact under concurrency, and
 * exactly one allocation takes the failure. */
static _Atomic int64_t fault_count;
static _Atomic int64_t fault_target = -1;

void kiln_memory_fail_nth(int64_t n) {
    atomic_store_explicit(&fault_target, n < 0 ? -1 : n, memory_order_relaxed);
    atomic_store_explicit(&fault_count, 0, memory_order_relaxed);
}

int64_t kiln_memory_alloc_count(void) { return atomic_load_explicit(&fault_count, memory_order_relaxed); }

/* Counts one allocation; the armed one raises out-of-memory. `device`
 * NULL: pinned host memory. */
static kiln_status fault_check(const kiln_device *device, size_t bytes) {
    int64_t i = atomic_fetch_add_explicit(&fault_count, 1, memory_order_relaxed);
    int64_t target = atomic_load_explicit(&fault_target, memory_order_relaxed);
    if (__builtin_expect(target < 0 || i != target, 1)) return KILN_OK;
    if (!atomic_compare_exchange_strong(&fault_target, &target, -1)) return KILN_OK;
    char b[32], what[32] = "pinned host memory";
    if (device && kiln_device_name(*device, what, sizeof what) != KILN_OK) snprintf(what, sizeof what, "device");
    return KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, "injected by kiln_memory_fail_nth or KILN_FAIL_ALLOC",
                      "%s out of memory: allocation #%lld (%s) failed on purpose", what, (long long)i,
                      kiln_format_bytes(bytes, b, sizeof b));
}

static _Thread_local const kiln_memory_observer *memory_observer;

const kiln_memory_observer *kiln_memory_set_observer(const kiln_memory_observer *o) {
    const kiln_memory_observer *old = memory_observer;
    memory_observer = o;
    return old;
}

kiln_status kiln_memory_alloc(kiln_device device, size_t bytes, kiln_stream *stream, void **ptr) {
    if (!ptr) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_memory_alloc: ptr is NULL");
    *ptr = NULL;
    KILN_TRY(fault_check(&device, bytes));
    ALLOCATOR_OR_RETURN(a, device);
    if (!stream) stream = kiln_current_stream(device);
    if (!stream) return kiln_error_last()->status;
    kiln_status st = kiln_caching_allocator_malloc(a, bytes, (kiln_alloc_stream)stream, ptr);
    if (memory_observer && !st) memory_observer->event(memory_observer->ctx, device, *ptr, bytes, true);
    return st;
}

kiln_status kiln_memory_free(kiln_device device, void *ptr) {
    if (!ptr) return KILN_OK;
    ALLOCATOR_OR_RETURN(a, device);
    if (memory_observer) memory_observer->event(memory_observer->ctx, device, ptr, 0, false);
    return kiln_caching_allocator_free(a, ptr);
}

kiln_status kiln_memory_record_stream(kiln_device device, void *ptr, kiln_stream *stream) {
    if (!stream) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_memory_record_stream: stream is NULL");
    ALLOCATOR_OR_RETURN(a, device);
    return kiln_caching_allocator_record_stream(a, ptr, (kiln_alloc_stream)stream);
}

kiln_status kiln_pinned_alloc(size_t bytes, void **ptr) {
    if (!ptr) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_pinned_alloc: ptr is NULL");
    *ptr = NULL;
    KILN_TRY(fault_check(NULL, bytes));
    kiln_caching_allocator *a = kiln_pinned_allocator();
    if (!a) return kiln_error_last()->status;
    return kiln_caching_allocator_malloc(a, bytes, (kiln_alloc_stream)kiln_stream_default(KILN_CPU), ptr);
}

kiln_status kiln_pinned_free(void *ptr) {
    if (!ptr) return KILN_OK;
    kiln_caching_allocator *a = kiln_pinned_allocator();
    if (!a) return kiln_error_last()->status;
    return kiln_caching_allocator_free(a, ptr);
}

bool kiln_is_pinned_ptr(const void *ptr) {
    if (!ptr) return false;
    pthread_mutex_lock(&memory_mutex);
    kiln_caching_allocator *a = pinned;
    pthread_mutex_unlock(&memory_mutex);
    return a && kiln_caching_allocator_owns(a, ptr);
}

kiln_status kiln_memory_stats_get(kiln_device device, kiln_memory_stats *out) {
    if (!out) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_memory_stats_get: out is NULL");
    ALLOCATOR_OR_RETURN(a, device);
    kiln_caching_allocator_stats(a, out);
    return KILN_OK;
}

kiln_status kiln_memory_reset_peak(kiln_device device) {
    ALLOCATOR_OR_RETURN(a, device);
    kiln_caching_allocator_reset_peak(a);
    return KILN_OK;
}

kiln_status kiln_memory_reset_accumulated(kiln_device device) {
    ALLOCATOR_OR_RETURN(a, device);
    kiln_caching_allocator_reset_accumulated(a);
    return KILN_OK;
}

size_t kiln_memory_allocated(kiln_device device) {
    kiln_memory_stats s;
    return kiln_memory_stats_get(device, &s) ? 0 : (size_t)s.allocated_bytes[KILN_POOL_ALL].current;
}

size_t kiln_memory_reserved(kiln_device device) {
    kiln_memory_stats s;
    return kiln_memory_stats_get(device, &s) ? 0 : (size_t)s.reserved_bytes[KILN_POOL_ALL].current;
}

kiln_status kiln_empty_cache(kiln_device device) {
    ALLOCATOR_OR_RETURN(a, device);
    return kiln_caching_allocator_empty_cache(a);
}

kiln_status kiln_memory_set_fraction(kiln_device device, double fraction) {
    ALLOCATOR_OR_RETURN(a, device);
    return kiln_caching_allocator_set_fraction(a, fraction);
}

kiln_status kiln_memory_set_limit(kiln_device device, size_t bytes) {
    ALLOCATOR_OR_RETURN(a, device);
    return kiln_caching_allocator_set_limit(a, bytes);
}

char *kiln_memory_summary(kiln_device device, bool abbreviated) {
    kiln_caching_allocator *a = kiln_device_allocator(device);
    if (!a) return NULL;
    char name[32], title[80];
    snprintf(title, sizeof title, "Kiln memory summary, device %s", kiln_device_str(device, name, sizeof name));
    return kiln_caching_allocator_summary(a, title, abbreviated);
}

kiln_status kiln_alloc_conf_set(const char *text) {
    pthread_mutex_lock(&memory_mutex);
    ensure_config();
    kiln_alloc_config cfg = global_config;
    kiln_status st = kiln_alloc_config_parse(text, &cfg);
    if (!st) global_config = cfg;
    pthread_mutex_unlock(&memory_mutex);
    if (st) return st;
    /* Limits apply at once to allocators that already exist. */
    for (int t = 0; t < KILN_DEVICE_TYPE_COUNT; t++) {
        for (int i = 0; i < KILN_MAX_DEVICES; i++) {
            pthread_mutex_lock(&memory_mutex);
            kiln_caching_allocator *a = allocators[t][i];
            pthread_mutex_unlock(&memory_mutex);
            if (!a) continue;
            KILN_TRY(kiln_caching_allocator_set_limit(a, cfg.limit_bytes));
            KILN_TRY(kiln_caching_allocator_set_fraction(a, cfg.fraction));
        }
    }
    return KILN_OK;
}

/* ---- Per-device generators --------------------------------------------------------- */

static pthread_mutex_t rng_mutex = PTHREAD_MUTEX_INITIALIZER;
static uint64_t rng_seed;
static kiln_rng rngs[KILN_DEVICE_TYPE_COUNT][KILN_MAX_DEVICES];
static bool rng_ready[KILN_DEVICE_TYPE_COUNT][KILN_MAX_DEVICES];

void kiln_device_rng_seed_all(uint64_t seed) {
    pthread_mutex_lock(&rng_mutex);
    rng_seed = seed;
    memset(rng_ready, 0, sizeof rng_ready);
    pthread_mutex_unlock(&rng_mutex);
}

/* Every device draws the same stream of numbers from the seed, each with
 * its own position in it: after kiln_manual_seed, the same calls give the
 * same values on cpu, meta (shared with cpu, so a model initialised on
 * meta and then on cpu gets the same values) and every CUDA device, as
 * include/kiln/tensor.h promises (and as torch.manual_seed seeds every
 * device alike). */
kiln_rng kiln_device_rng_reserve(kiln_device device, uint64_t n_words) {
    int t = device.type == KILN_DEVICE_META ? KILN_DEVICE_CPU : device.type;
    int i = device.type == KILN_DEVICE_CUDA ? device.index : 0;
    pthread_mutex_lock(&rng_mutex);
    if (!rng_ready[t][i]) {
        rngs[t][i] = kiln_rng_split(kiln_rng_make(rng_seed), (uint64_t)KILN_DEVICE_CPU * KILN_MAX_DEVICES);
        rng_ready[t][i] = true;
    }
    kiln_rng draw = kiln_rng_advance(&rngs[t][i], n_words);
    pthread_mutex_unlock(&rng_mutex);
    return draw;
}

void kiln_device_rng_set(kiln_device device, kiln_rng state) {
    int t = device.type == KILN_DEVICE_META ? KILN_DEVICE_CPU : device.type;
    int i = device.type == KILN_DEVICE_CUDA ? device.index : 0;
    pthread_mutex_lock(&rng_mutex);
    rngs[t][i] = state;
    rng_ready[t][i] = true;
    pthread_mutex_unlock(&rng_mutex);
}

void kiln_device_rng_save(kiln_rng_positions *out) {
    pthread_mutex_lock(&rng_mutex);
    out->seed = rng_seed;
    memcpy(out->rng, rngs, sizeof rngs);
    memcpy(out->ready, rng_ready, sizeof rng_ready);
    pthread_mutex_unlock(&rng_mutex);
}

void kiln_device_rng_restore(const kiln_rng_positions *in) {
    pthread_mutex_lock(&rng_mutex);
    rng_seed = in->seed;
    memcpy(rngs, in->rng, sizeof rngs);
    memcpy(rng_ready, in->ready, sizeof rng_ready);
    pthread_mutex_unlock(&rng_mutex);
}

/* ---- Init and shutdown -------------------------------------------------------------- */

kiln_status kiln_runtime_init(void) {
    pthread_mutex_lock(&memory_mutex);
    ensure_config();
    pthread_mutex_unlock(&memory_mutex);
    const char *env = getenv("KILN_ALLOC_CONF");
    if (env && *env) {
        kiln_status st = kiln_alloc_conf_set(env);
        if (st) {
            char msg[sizeof kiln_error_last()->message];
            snprintf(msg, sizeof msg, "%s", kiln_error_message());
            return KILN_RAISE(st, "fix or unset KILN_ALLOC_CONF (see docs/memory.md)", "KILN_ALLOC_CONF: %s", msg);
        }
    }
    const char *fail = getenv("KILN_FAIL_ALLOC");
    if (fail && *fail) {
        char *end;
        errno = 0;
        long long n = strtoll(fail, &end, 10);
        if (*end || errno || n < 0)
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give the index of the allocation to fail (0 is the first), or unset it",
                              "KILN_FAIL_ALLOC='%s' is not a non-negative integer", fail);
        kiln_memory_fail_nth((int64_t)n);
    }
    return KILN_OK;
}

void kiln_runtime_shutdown(void) {
    for (int t = 0; t < KILN_DEVICE_TYPE_COUNT; t++) {
        for (int i = 0; i < KILN_MAX_DEVICES; i++) {
            if (!allocators[t][i]) continue;
            const kiln_backend *be = kiln_backend_get((kiln_device_type)t);
            if (be) be->synchronize(i);
            kiln_caching_allocator_destroy(allocators[t][i]);
            allocators[t][i] = NULL;
        }
    }
    if (pinned) kiln_caching_allocator_destroy(pinned);
    pinned = NULL;
    if (meta_ops_ready) kiln_simulated_raw_ops_destroy(&meta_ops);
    meta_ops_ready = false;
    config_ready = false;
    kiln_streams_shutdown();
}

/* The caching allocator: one generic implementation of PyTorch's CUDA
 * caching allocator semantics (docs/memory.md) over raw allocation
 * callbacks. Used for every device type (cpu, cuda, meta in simulate mode)
 * and for pinned host memory.
 *
 * Thread-safe: every entry point takes the allocator's lock (a spin-then-
 * yield lock: holds are a few hundred instructions; see docs/memory.md). */
#ifndef KILN_SRC_RUNTIME_CACHING_ALLOCATOR_H
#define KILN_SRC_RUNTIME_CACHING_ALLOCATOR_H

#include "kiln/runtime.h"

/* Allocator settings, from KILN_ALLOC_CONF or the API. */
typedef struct kiln_alloc_config {
    bool caching;                 /* false: "backend:malloc", every block is raw */
    uint64_t max_split_size;      /* UINT64_MAX: unset ("max_split_size_mb") */
    uint64_t limit_bytes;         /* 0: none ("limit_mb") */
    double fraction;              /* 0: none ("per_process_memory_fraction") */
    int roundup_power2_divisions; /* 0/1: plain 512-byte rounding */
} kiln_alloc_config;

/* Defaults: caching on, nothing else set. */
kiln_alloc_config kiln_alloc_config_default(void);
/* Parse "key:value,key:value" into *cfg (which keeps keys not named).
 * Errors name the key or value and list the accepted keys. */
kiln_status kiln_alloc_config_parse(const char *text, kiln_alloc_config *cfg);

/* Streams are opaque tokens to the allocator: a nonzero value unique per
 * stream (the runtime passes the kiln_stream pointer). */
typedef uintptr_t kiln_alloc_stream;

/* What the allocator needs from below. `ctx` is passed back to each call. */
typedef struct kiln_raw_ops {
    void *ctx;
    const char *device_name; /* "cpu", "cuda:0", "meta", "pinned" — for messages */
    bool host_accessible;    /* poison free memory under ASan */
    /* Return KILN_ERR_OUT_OF_MEMORY without raising when memory is short. */
    kiln_status (*alloc)(void *ctx, size_t bytes, void **ptr);
    void (*free)(void *ctx, void *ptr, size_t bytes);
    kiln_status (*mem_info)(void *ctx, size_t *free_bytes, size_t *total_bytes);
    /* Record a new event capturing work queued so far on `stream`. */
    kiln_status (*event_record)(void *ctx, kiln_alloc_stream stream, void **event);
    bool (*event_query)(void *ctx, void *event);
    void (*event_synchronize)(void *ctx, void *event);
    void (*event_destroy)(void *ctx, void *event);
    /* Optional: a stable id for `stream` (kiln_stream_id), read when a
     * segment is made, for the memory history and snapshots. */
    uint64_t (*stream_id)(void *ctx, kiln_alloc_stream stream);
} kiln_raw_ops;

typedef struct kiln_caching_allocator kiln_caching_allocator;

/* Create an allocator over `ops` (copied). NULL with an error on failure. */
kiln_caching_allocator *kiln_caching_allocator_create(const kiln_raw_ops *ops,
                                                      const kiln_alloc_config *cfg);
/* Frees every segment (live blocks included: callers destroy only at
 * shutdown) and the allocator. */
void kiln_caching_allocator_destroy(kiln_caching_allocator *a);

/* Allocate `size` bytes (rounded) for `stream`. size 0 returns NULL with
 * KILN_OK. On exhaustion: frees cached unsplit segments, retries, then
 * raises KILN_ERR_OUT_OF_MEMORY with the full message. */
kiln_status kiln_caching_allocator_malloc(kiln_caching_allocator *a, size_t size,
                                          kiln_alloc_stream stream, void **ptr);
/* Return a block. Unknown pointers raise KILN_ERR_INVALID_ARGUMENT. */
kiln_status kiln_caching_allocator_free(kiln_caching_allocator *a, void *ptr);
/* Note that the block holding `ptr` is used on `stream` (record_stream). */
kiln_status kiln_caching_allocator_record_stream(kiln_caching_allocator *a, void *ptr,
                                                 kiln_alloc_stream stream);
/* Drop `stream` from every live block's record_stream set: the stream is
 * being destroyed after a synchronisation, so its uses are complete, and
 * its handle must not be recorded on when those blocks are freed. */
void kiln_caching_allocator_forget_stream(kiln_caching_allocator *a, kiln_alloc_stream stream);
/* True when ptr is the start of, or inside, a live block. */
bool kiln_caching_allocator_owns(kiln_caching_allocator *a, const void *ptr);
/* Synchronise pending events, release whole free segments. */
kiln_status kiln_caching_allocator_empty_cache(kiln_caching_allocator *a);
void kiln_caching_allocator_stats(kiln_caching_allocator *a, kiln_memory_stats *out);
void kiln_caching_allocator_reset_peak(kiln_caching_allocator *a);
void kiln_caching_allocator_reset_accumulated(kiln_caching_allocator *a);
/* Limits: bytes (0 = none) and fraction of mem_info's total (0 = none);
 * the effective limit is the smaller of those set. */
kiln_status kiln_caching_allocator_set_limit(kiln_caching_allocator *a, uint64_t bytes);
kiln_status kiln_caching_allocator_set_fraction(kiln_caching_allocator *a, double fraction);
/* PyTorch-style text table; caller frees with free(). `title` e.g.
 * "Kiln memory summary, device cpu". */
char *kiln_caching_allocator_summary(kiln_caching_allocator *a, const char *title,
                                     bool abbreviated);

/* Memory history (docs/memory.md, "Memory history and snapshots"). Start
 * (enabled; a restart clears the trace) or stop and discard recording of
 * every alloc, free, segment and OOM event into a ring buffer of
 * `max_entries` (0: KILN_MEMORY_HISTORY_DEFAULT_ENTRIES). */
kiln_status kiln_caching_allocator_record_history(kiln_caching_allocator *a, bool enabled, size_t max_entries);
bool kiln_caching_allocator_history_enabled(kiln_caching_allocator *a);
/* The snapshot JSON (segments, blocks, trace) as a malloc'd string the
 * caller frees; NULL with an error when host memory is short. */
char *kiln_caching_allocator_snapshot_json(kiln_caching_allocator *a, const char *device_name);

/* What the memory history records as the context of an allocation: the op
 * the dispatcher is running and the user's file:line (NULL / 0 when
 * unknown). The ops layer provides it (kiln_init registers the provider);
 * without one, the context is empty. The strings must be static. */
typedef struct kiln_alloc_context {
    const char *op;
    const char *file;
    int line;
} kiln_alloc_context;
void kiln_alloc_set_context_provider(void (*provider)(kiln_alloc_context *out));

/* Raw ops that touch no memory: addresses come from a private address
 * range of `capacity` bytes (first fit), events complete at once. The meta
 * device uses them so a step on meta predicts the real allocator's peak.
 * Free with kiln_simulated_raw_ops_destroy after the allocator. */
kiln_raw_ops kiln_simulated_raw_ops(size_t capacity, const char *device_name);
void kiln_simulated_raw_ops_destroy(kiln_raw_ops *ops);

/* Size helpers, exposed for tests and the memory planner. */
size_t kiln_alloc_round_size(const kiln_alloc_config *cfg, size_t size);
size_t kiln_alloc_segment_size(size_t rounded);

#endif

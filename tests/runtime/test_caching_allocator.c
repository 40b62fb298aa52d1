/* The caching allocator over a fake raw backend: a fixed capacity, fake
 * addresses (never touched), counted calls, and events whose completion the
 * test decides. Every expected number below follows from PyTorch's rules
 * (docs/memory.md); the comments show the arithmetic. */
#include <pthread.h>
#include <stdint.h>

#include "runtime/caching_allocator.h"
#include "test_util.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

typedef struct fake_dev {
    size_t capacity, used;
    uintptr_t next_addr; /* bump allocation: addresses only grow */
    size_t last_alloc;
    int n_alloc, n_free;
    bool events_done; /* what event_query answers */
    int n_recorded, n_destroyed, n_synced;
} fake_dev;

static kiln_status fake_alloc(void *ctx, size_t bytes, void **ptr) {
    fake_dev *d = ctx;
    if (d->used + bytes > d->capacity) return KILN_ERR_OUT_OF_MEMORY;
    d->used += bytes;
    d->n_alloc++;
    d->last_alloc = bytes;
    *ptr = (void *)d->next_addr;
    d->next_addr += bytes;
    return KILN_OK;
}

static void fake_free(void *ctx, void *ptr, size_t bytes) {
    fake_dev *d = ctx;
    (void)ptr;
    d->used -= bytes;
    d->n_free++;
}

static kiln_status fake_mem_info(void *ctx, size_t *free_bytes, size_t *total_bytes) {
    fake_dev *d = ctx;
    *free_bytes = d->capacity - d->used;
    *total_bytes = d->capacity;
    return KILN_OK;
}

static kiln_status fake_event_record(void *ctx, kiln_alloc_stream stream, void **event) {
    fake_dev *d = ctx;
    d->n_recorded++;
    *event = (void *)stream; /* any non-NULL token */
    return KILN_OK;
}

static bool fake_event_query(void *ctx, void *event) {
    (void)event;
    return ((fake_dev *)ctx)->events_done;
}

static void fake_event_synchronize(void *ctx, void *event) {
    (void)event;
    ((fake_dev *)ctx)->n_synced++;
}

static void fake_event_destroy(void *ctx, void *event) {
    (void)event;
    ((fake_dev *)ctx)->n_destroyed++;
}

static kiln_raw_ops fake_ops(fake_dev *d, size_t capacity) {
    *d = (fake_dev){.capacity = capacity, .next_addr = (uintptr_t)1 << 32};
    kiln_raw_ops ops = {.ctx = d,
                        .device_name = "fake:0",
                        .host_accessible = false,
                        .alloc = fake_alloc,
                        .free = fake_free,
                        .mem_info = fake_mem_info,
                        .event_record = fake_event_record,
                        .event_query = fake_event_query,
                        .event_synchronize = fake_event_synchronize,
                        .event_destroy = fake_event_destroy};
    return ops;
}

static kiln_caching_allocator *make(fake_dev *d, size_t capacity, const kiln_alloc_config *cfg) {
    kiln_raw_ops ops = fake_ops(d, capacity);
    kiln_alloc_config def = kiln_alloc_config_default();
    kiln_caching_allocator *a = kiln_caching_allocator_create(&ops, cfg ? cfg : &def);
    CHECK(a != NULL);
    return a;
}

static kiln_memory_stats stats_of(kiln_caching_allocator *a) {
    kiln_memory_stats s;
    kiln_caching_allocator_stats(a, &s);
    return s;
}

static void *alloc_on(kiln_caching_allocator *a, size_t size, kiln_alloc_stream stream) {
    void *p = NULL;
    CHECK_OK(kiln_caching_allocator_malloc(a, size, stream, &p));
    return p;
}

static void *alloc(kiln_caching_allocator *a, size_t size) { return alloc_on(a, size, 1); }

static void test_rounding(void) {
    kiln_alloc_config cfg = kiln_alloc_config_default();
    CHECK_EQ_I(kiln_alloc_round_size(&cfg, 1), 512);
    CHECK_EQ_I(kiln_alloc_round_size(&cfg, 512), 512);
    CHECK_EQ_I(kiln_alloc_round_size(&cfg, 513), 1024);
    CHECK_EQ_I(kiln_alloc_round_size(&cfg, 9000), 9216);
    CHECK_EQ_I(kiln_alloc_round_size(&cfg, MIB + 1), MIB + 512);
    cfg.roundup_power2_divisions = 4;
    /* 9000 lies in [8192, 16384): quarter steps of 2048 -> 10240. */
    CHECK_EQ_I(kiln_alloc_round_size(&cfg, 9000), 10240);
    CHECK_EQ_I(kiln_alloc_round_size(&cfg, 8192), 8192);
    /* At most 512 * divisions: plain 512-byte rounding. */
    CHECK_EQ_I(kiln_alloc_round_size(&cfg, 1200), 1536);
    cfg.roundup_power2_divisions = 8;
    CHECK_EQ_I(kiln_alloc_round_size(&cfg, MIB + 1), MIB + 128 * KIB);
    /* Sizes that cannot be rounded come back as SIZE_MAX, never wrapped. */
    CHECK(kiln_alloc_round_size(&cfg, SIZE_MAX - 3 * MIB) == SIZE_MAX);
    CHECK(kiln_alloc_round_size(NULL, SIZE_MAX - 100) == SIZE_MAX);

    CHECK_EQ_I(kiln_alloc_segment_size(512), 2 * MIB);
    CHECK_EQ_I(kiln_alloc_segment_size(MIB), 2 * MIB);
    CHECK_EQ_I(kiln_alloc_segment_size(MIB + 512), 20 * MIB);
    CHECK_EQ_I(kiln_alloc_segment_size(10 * MIB - 512), 20 * MIB);
    CHECK_EQ_I(kiln_alloc_segment_size(10 * MIB), 10 * MIB);
    CHECK_EQ_I(kiln_alloc_segment_size(11 * MIB + 512), 12 * MIB);
}

static void test_small_pool_split_merge(void) {
    fake_dev d;
    kiln_caching_allocator *a = make(&d, 64 * MIB, NULL);
    void *p0 = NULL;
    CHECK_OK(kiln_caching_allocator_malloc(a, 0, 1, &p0));
    CHECK(p0 == NULL);

    char *p1 = alloc(a, 1000); /* 1024 bytes from a new 2 MiB segment */
    kiln_memory_stats s = stats_of(a);
    CHECK_EQ_I(d.n_alloc, 1);
    CHECK_EQ_I(d.last_alloc, 2 * MIB);
    CHECK_EQ_I(s.allocation[KILN_POOL_SMALL].current, 1);
    CHECK_EQ_I(s.allocation[KILN_POOL_LARGE].current, 0);
    CHECK_EQ_I(s.allocated_bytes[KILN_POOL_ALL].current, 1024);
    CHECK_EQ_I(s.requested_bytes[KILN_POOL_ALL].current, 1000);
    CHECK_EQ_I(s.reserved_bytes[KILN_POOL_SMALL].current, 2 * MIB);
    CHECK_EQ_I(s.segment[KILN_POOL_ALL].current, 1);
    CHECK_EQ_I(s.inactive_split[KILN_POOL_SMALL].current, 1);
    CHECK_EQ_I(s.inactive_split_bytes[KILN_POOL_SMALL].current, 2 * MIB - 1024);

    char *p2 = alloc(a, 1024); /* best fit: the remainder, right after p1 */
    CHECK(p2 == p1 + 1024);
    s = stats_of(a);
    CHECK_EQ_I(d.n_alloc, 1);
    CHECK_EQ_I(s.inactive_split[KILN_POOL_ALL].current, 1);
    CHECK_EQ_I(s.inactive_split_bytes[KILN_POOL_ALL].current, 2 * MIB - 2048);
    /* Shrinking an already split block moves bytes, not the count. */
    CHECK_EQ_I(s.inactive_split[KILN_POOL_ALL].allocated, 1);

    CHECK_OK(kiln_caching_allocator_free(a, p1)); /* p2 still live: no merge */
    s = stats_of(a);
    CHECK_EQ_I(s.inactive_split[KILN_POOL_ALL].current, 2);
    CHECK_EQ_I(s.inactive_split_bytes[KILN_POOL_ALL].current, 2 * MIB - 1024);
    CHECK_EQ_I(s.active[KILN_POOL_ALL].current, 1);

    char *p3 = alloc(a, 600); /* best fit: p1's 1024-byte hole, taken whole */
    CHECK(p3 == p1);
    CHECK_OK(kiln_caching_allocator_free(a, p3));
    CHECK_OK(kiln_caching_allocator_free(a, p2)); /* merges with both sides: one whole block */
    s = stats_of(a);
    CHECK_EQ_I(s.inactive_split[KILN_POOL_ALL].current, 0);
    CHECK_EQ_I(s.inactive_split_bytes[KILN_POOL_ALL].current, 0);
    CHECK_EQ_I(s.inactive_split[KILN_POOL_ALL].peak, 2);
    CHECK_EQ_I(s.allocation[KILN_POOL_ALL].current, 0);
    CHECK_EQ_I(s.allocation[KILN_POOL_ALL].peak, 2);
    CHECK_EQ_I(s.allocation[KILN_POOL_ALL].allocated, 3);
    CHECK_EQ_I(s.allocation[KILN_POOL_ALL].freed, 3);
    CHECK_EQ_I(s.allocated_bytes[KILN_POOL_ALL].allocated, 3 * 1024);
    CHECK_EQ_I(s.requested_bytes[KILN_POOL_ALL].allocated, 1000 + 1024 + 600);
    CHECK_EQ_I(s.requested_bytes[KILN_POOL_ALL].current, 0);
    CHECK_EQ_I(s.active_bytes[KILN_POOL_ALL].current, 0);
    CHECK_EQ_I(s.reserved_bytes[KILN_POOL_ALL].current, 2 * MIB); /* cached, not returned */
    CHECK_EQ_I(d.n_free, 0);

    char *p4 = alloc(a, 2 * MIB - 512); /* rounded 2 MiB - 512: large pool (> 1 MiB) */
    s = stats_of(a);
    CHECK_EQ_I(s.allocation[KILN_POOL_LARGE].current, 1);
    CHECK_EQ_I(d.last_alloc, 20 * MIB);
    CHECK_OK(kiln_caching_allocator_free(a, p4));
    kiln_caching_allocator_destroy(a);
    CHECK_EQ_I(d.used, 0);
}

static void test_large_pool_best_fit(void) {
    fake_dev d;
    kiln_caching_allocator *a = make(&d, 256 * MIB, NULL);
    char *p = alloc(a, 3 * MIB); /* 20 MiB segment, 17 MiB remainder split off */
    kiln_memory_stats s = stats_of(a);
    CHECK_EQ_I(d.last_alloc, 20 * MIB);
    CHECK_EQ_I(s.inactive_split_bytes[KILN_POOL_LARGE].current, 17 * MIB);
    char *q = alloc(a, 19 * MIB + 512 * KIB); /* 17 MiB free does not fit: new 20 MiB segment */
    s = stats_of(a);
    CHECK_EQ_I(d.n_alloc, 2);
    /* Remainder 0.5 MiB is not > 1 MiB: no split, the block keeps 20 MiB. */
    CHECK_EQ_I(s.allocated_bytes[KILN_POOL_LARGE].current, 3 * MIB + 20 * MIB);
    CHECK_EQ_I(s.requested_bytes[KILN_POOL_LARGE].current, 3 * MIB + 19 * MIB + 512 * KIB);
    CHECK_OK(kiln_caching_allocator_free(a, q));
    CHECK_OK(kiln_caching_allocator_free(a, p));
    CHECK_OK(kiln_caching_allocator_empty_cache(a));
    CHECK_EQ_I(d.used, 0);

    /* Three exact-size segments (>= 10 MiB: 2 MiB multiples), all cached. */
    char *b12 = alloc(a, 12 * MIB), *b14 = alloc(a, 14 * MIB), *b16 = alloc(a, 16 * MIB);
    CHECK_EQ_I(d.n_alloc, 5);
    CHECK_OK(kiln_caching_allocator_free(a, b14));
    CHECK_OK(kiln_caching_allocator_free(a, b12));
    CHECK_OK(kiln_caching_allocator_free(a, b16));
    CHECK(alloc(a, 13 * MIB) == b14); /* smallest that fits; 1 MiB left is not split */
    CHECK(alloc(a, 11 * MIB) == b12);
    CHECK(alloc(a, 15 * MIB) == b16);
    CHECK_EQ_I(d.n_alloc, 5);
    s = stats_of(a);
    CHECK_EQ_I(s.allocated_bytes[KILN_POOL_ALL].current, 42 * MIB);
    CHECK_EQ_I(s.requested_bytes[KILN_POOL_ALL].current, 39 * MIB);
    /* Fragmentation: 30 MiB cached in two blocks, yet 20 MiB needs a new segment. */
    CHECK_OK(kiln_caching_allocator_free(a, b14));
    CHECK_OK(kiln_caching_allocator_free(a, b16));
    char *big = alloc(a, 20 * MIB);
    CHECK_EQ_I(d.n_alloc, 6);
    CHECK_EQ_I(d.last_alloc, 20 * MIB);
    CHECK(big != NULL);
    kiln_caching_allocator_destroy(a);
    CHECK_EQ_I(d.used, 0);
}

static void test_streams(void) {
    fake_dev d;
    kiln_caching_allocator *a = make(&d, 64 * MIB, NULL);
    void *p = alloc_on(a, 4096, 1);
    CHECK_OK(kiln_caching_allocator_free(a, p));
    CHECK(alloc_on(a, 4096, 1) == p); /* same stream: reused at once */
    void *other = alloc_on(a, 4096, 2);
    CHECK(other != p);
    CHECK_EQ_I(d.n_alloc, 2); /* stream 2 never sees stream 1's blocks */

    CHECK_OK(kiln_caching_allocator_record_stream(a, p, 1)); /* own stream: ignored */
    CHECK_OK(kiln_caching_allocator_record_stream(a, p, 3));
    CHECK_OK(kiln_caching_allocator_record_stream(a, (char *)p + 100, 3)); /* inside, duplicate */
    CHECK_OK(kiln_caching_allocator_record_stream(a, p, 4));
    d.events_done = false;
    CHECK_OK(kiln_caching_allocator_free(a, p));
    CHECK_EQ_I(d.n_recorded, 2);
    kiln_memory_stats s = stats_of(a);
    CHECK_EQ_I(s.allocation[KILN_POOL_ALL].current, 1); /* `other` */
    CHECK_EQ_I(s.active[KILN_POOL_ALL].current, 2);     /* p awaits its events */
    CHECK_EQ_I(s.active_bytes[KILN_POOL_ALL].current, 2 * 4096);
    CHECK_EQ_I(s.requested_bytes[KILN_POOL_ALL].current, 2 * 4096);
    CHECK(!kiln_caching_allocator_owns(a, p));

    void *q = alloc_on(a, 4096, 1); /* events pending: p is not reusable */
    CHECK(q != p);
    CHECK_OK(kiln_caching_allocator_free(a, q));
    d.events_done = true;
    void *r = alloc_on(a, 4096, 1); /* polled at the start of malloc: p is free again */
    CHECK(r == p);
    CHECK_EQ_I(d.n_destroyed, 2);
    CHECK_EQ_I(d.n_synced, 0);
    s = stats_of(a);
    CHECK_EQ_I(s.active[KILN_POOL_ALL].current, 2);
    CHECK_EQ_I(s.num_sync_all_streams, 0);
    /* The uses were consumed by the free: a second free/alloc needs no event. */
    CHECK_OK(kiln_caching_allocator_free(a, r));
    CHECK_EQ_I(d.n_recorded, 2);

    CHECK_FAILS(kiln_caching_allocator_free(a, r), KILN_ERR_INVALID_ARGUMENT, "not a live block");
    CHECK_FAILS(kiln_caching_allocator_free(a, (void *)0x1234), KILN_ERR_INVALID_ARGUMENT, "fake:0");
    CHECK_FAILS(kiln_caching_allocator_record_stream(a, (void *)0x1234, 2), KILN_ERR_INVALID_ARGUMENT,
                "record_stream");
    CHECK_OK(kiln_caching_allocator_free(a, NULL));

    /* empty_cache waits for pending events (host sync) and releases. */
    void *t = alloc_on(a, 4096, 2);
    CHECK_OK(kiln_caching_allocator_record_stream(a, t, 5));
    d.events_done = false;
    CHECK_OK(kiln_caching_allocator_free(a, t));
    CHECK_OK(kiln_caching_allocator_free(a, other));
    CHECK_OK(kiln_caching_allocator_empty_cache(a));
    CHECK_EQ_I(d.n_synced, 1);
    s = stats_of(a);
    CHECK_EQ_I(s.num_sync_all_streams, 1);
    CHECK_EQ_I(s.active[KILN_POOL_ALL].current, 0);
    CHECK_EQ_I(s.reserved_bytes[KILN_POOL_ALL].current, 0);
    kiln_caching_allocator_destroy(a);
}

static void test_oom_ladder(void) {
    fake_dev d;
    kiln_caching_allocator *a = make(&d, 64 * MIB, NULL);
    void *x = alloc(a, 30 * MIB), *y = alloc(a, 30 * MIB);
    CHECK_OK(kiln_caching_allocator_free(a, x));
    /* 32 MiB: no cached fit, 60 + 32 > 64, so the cached 30 MiB segment
     * goes back and the raw allocation is retried. */
    void *z = alloc(a, 32 * MIB);
    kiln_memory_stats s = stats_of(a);
    CHECK(z != NULL);
    CHECK_EQ_I(s.num_alloc_retries, 1);
    CHECK_EQ_I(s.num_sync_all_streams, 1); /* the flush always counts, pending or not */
    CHECK_EQ_I(s.num_ooms, 0);
    CHECK_EQ_I(s.num_device_free, 1);
    CHECK_EQ_I(s.reserved_bytes[KILN_POOL_ALL].current, 62 * MIB);

    void *w = NULL;
    kiln_error_clear();
    CHECK_FAILS(kiln_caching_allocator_malloc(a, 3 * MIB, 1, &w), KILN_ERR_OUT_OF_MEMORY,
                "fake:0 out of memory: tried to allocate 20.00 MiB (request 3.00 MiB)");
    CHECK(w == NULL);
    const char *m = kiln_error_message();
    CHECK(strstr(m, "2.00 MiB free of 64.00 MiB") != NULL);
    CHECK(strstr(m, "62.00 MiB allocated by kiln, 0 bytes reserved by kiln but unallocated") != NULL);
    CHECK(strstr(m, "limit") == NULL);
    CHECK(strstr(kiln_error_last()->hint, "kiln_empty_cache") != NULL);
    CHECK(strstr(kiln_error_last()->hint, "max_split_size_mb") != NULL);
    s = stats_of(a);
    CHECK_EQ_I(s.num_ooms, 1);
    CHECK_EQ_I(s.num_alloc_retries, 2);
    CHECK_FAILS(kiln_caching_allocator_malloc(a, SIZE_MAX - 100, 1, &w), KILN_ERR_OUT_OF_MEMORY,
                "cannot be represented");
    CHECK_FAILS(kiln_caching_allocator_malloc(a, 100, 1, NULL), KILN_ERR_INVALID_ARGUMENT, "NULL");

    /* A block awaiting events is recovered by the ladder's synchronisation. */
    CHECK_OK(kiln_caching_allocator_record_stream(a, y, 7));
    d.events_done = false;
    CHECK_OK(kiln_caching_allocator_free(a, y));
    /* The only way: wait for y's event; its segment, now whole and free, is
     * released with the other unsplit ones and the raw allocation retried. */
    void *v = alloc(a, 30 * MIB);
    CHECK(v != NULL);
    s = stats_of(a);
    CHECK_EQ_I(d.n_synced, 1);
    CHECK_EQ_I(s.num_sync_all_streams, 3);
    CHECK_EQ_I(s.num_alloc_retries, 3);
    CHECK_EQ_I(s.num_device_free, 2);
    CHECK_EQ_I(s.active[KILN_POOL_ALL].current, 2);

    kiln_caching_allocator_reset_accumulated(a);
    s = stats_of(a);
    CHECK_EQ_I(s.num_ooms, 0);
    CHECK_EQ_I(s.num_alloc_retries, 0);
    CHECK_EQ_I(s.num_device_alloc, 0);
    CHECK_EQ_I(s.allocation[KILN_POOL_ALL].allocated, 0);
    CHECK_EQ_I(s.allocation[KILN_POOL_ALL].current, 2);
    CHECK_EQ_I(s.allocation[KILN_POOL_ALL].peak, 2);
    kiln_caching_allocator_destroy(a);
}

static void test_empty_cache(void) {
    fake_dev d;
    kiln_caching_allocator *a = make(&d, 64 * MIB, NULL);
    void *s1 = alloc(a, 1000), *s2 = alloc(a, 1000), *l1 = alloc(a, 12 * MIB);
    CHECK_OK(kiln_caching_allocator_free(a, s1));
    CHECK_OK(kiln_caching_allocator_free(a, l1));
    CHECK_OK(kiln_caching_allocator_empty_cache(a)); /* small segment still partly used */
    kiln_memory_stats s = stats_of(a);
    CHECK_EQ_I(d.n_free, 1);
    CHECK_EQ_I(s.segment[KILN_POOL_ALL].current, 1);
    CHECK_EQ_I(s.reserved_bytes[KILN_POOL_SMALL].current, 2 * MIB);
    CHECK_EQ_I(s.reserved_bytes[KILN_POOL_LARGE].current, 0);
    CHECK_EQ_I(s.segment[KILN_POOL_LARGE].freed, 1);
    CHECK_EQ_I(s.inactive_split_bytes[KILN_POOL_SMALL].current, 2 * MIB - 1024);
    CHECK_OK(kiln_caching_allocator_free(a, s2));
    CHECK_OK(kiln_caching_allocator_empty_cache(a));
    s = stats_of(a);
    CHECK_EQ_I(s.reserved_bytes[KILN_POOL_ALL].current, 0);
    CHECK_EQ_I(s.reserved_bytes[KILN_POOL_ALL].peak, 14 * MIB);
    CHECK_EQ_I(s.num_device_free, 2);
    CHECK_EQ_I(d.used, 0);
    kiln_caching_allocator_reset_peak(a);
    s = stats_of(a);
    CHECK_EQ_I(s.reserved_bytes[KILN_POOL_ALL].peak, 0);
    CHECK_EQ_I(s.reserved_bytes[KILN_POOL_ALL].allocated, 14 * MIB);
    kiln_caching_allocator_destroy(a);
}

static void test_limits(void) {
    fake_dev d;
    kiln_caching_allocator *a = make(&d, 64 * MIB, NULL);
    CHECK_EQ_I(stats_of(a).limit_bytes, 0);
    CHECK_OK(kiln_caching_allocator_set_limit(a, 30 * MIB));
    void *p = alloc(a, 12 * MIB);
    void *q = NULL;
    CHECK_FAILS(kiln_caching_allocator_malloc(a, 20 * MIB, 1, &q), KILN_ERR_OUT_OF_MEMORY, "limit 30.00 MiB");
    CHECK_EQ_I(d.n_alloc, 1); /* the limit refused before the device was asked */
    CHECK_OK(kiln_caching_allocator_set_fraction(a, 0.25)); /* 16 MiB < 30 MiB: wins */
    CHECK_EQ_I(stats_of(a).limit_bytes, 16 * MIB);
    /* 12 MiB reserved: a 20 MiB segment for 4 MiB would pass the limit, a
     * segment of just the request does not (the ladder's last step). */
    CHECK_OK(kiln_caching_allocator_malloc(a, 4 * MIB, 1, &q));
    CHECK_EQ_I(stats_of(a).reserved_bytes[KILN_POOL_ALL].current, 16 * MIB);
    CHECK_OK(kiln_caching_allocator_free(a, q));
    void *r = NULL;
    CHECK_FAILS(kiln_caching_allocator_malloc(a, 4 * MIB + 512, 1, &r), KILN_ERR_OUT_OF_MEMORY, "limit 16.00 MiB");
    CHECK_OK(kiln_caching_allocator_set_limit(a, 0));
    CHECK_EQ_I(stats_of(a).limit_bytes, 16 * MIB);
    CHECK_OK(kiln_caching_allocator_set_fraction(a, 0));
    CHECK_EQ_I(stats_of(a).limit_bytes, 0);
    q = alloc(a, 40 * MIB);
    CHECK(q != NULL);
    CHECK_FAILS(kiln_caching_allocator_set_fraction(a, 1.5), KILN_ERR_INVALID_ARGUMENT, "1.5");
    CHECK_FAILS(kiln_caching_allocator_set_fraction(a, -0.1), KILN_ERR_INVALID_ARGUMENT, "fraction");
    kiln_caching_allocator_destroy(a);

    kiln_alloc_config cfg = kiln_alloc_config_default();
    cfg.limit_bytes = 8 * MIB;
    a = make(&d, 64 * MIB, &cfg);
    p = NULL;
    /* The 20 MiB segment exceeds the 8 MiB limit, the request alone does
     * not: it gets a segment of its own size. */
    CHECK_OK(kiln_caching_allocator_malloc(a, 4 * MIB - 512, 1, &p));
    CHECK_EQ_I(stats_of(a).reserved_bytes[KILN_POOL_ALL].current, 4 * MIB - 512);
    CHECK_EQ_I(stats_of(a).num_ooms, 0);
    void *big = NULL;
    CHECK_FAILS(kiln_caching_allocator_malloc(a, 5 * MIB, 1, &big), KILN_ERR_OUT_OF_MEMORY,
                "tried to allocate 20.00 MiB"); /* neither 20 MiB nor 5 MiB fits beside the 4 MiB */
    CHECK(big == NULL);
    CHECK_EQ_I(stats_of(a).num_ooms, 1);
    CHECK_OK(kiln_caching_allocator_free(a, p));
    p = alloc(a, MIB);
    CHECK(p != NULL); /* 2 MiB small segment fits */
    kiln_caching_allocator_destroy(a);

    cfg = kiln_alloc_config_default();
    cfg.fraction = 0.5;
    a = make(&d, 64 * MIB, &cfg);
    CHECK_EQ_I(stats_of(a).limit_bytes, 32 * MIB);
    kiln_caching_allocator_destroy(a);
}

static void test_max_split_size(void) {
    fake_dev d;
    kiln_alloc_config cfg = kiln_alloc_config_default();
    cfg.max_split_size = 24 * MIB;
    kiln_caching_allocator *a = make(&d, 96 * MIB, &cfg);
    CHECK_EQ_I(stats_of(a).max_split_size, 24 * MIB);
    char *big = alloc(a, 30 * MIB);
    kiln_memory_stats s = stats_of(a);
    CHECK_EQ_I(s.oversize_allocations.current, 1);
    CHECK_EQ_I(s.oversize_segments.current, 1);
    CHECK_OK(kiln_caching_allocator_free(a, big));
    s = stats_of(a);
    CHECK_EQ_I(s.oversize_allocations.current, 0);
    CHECK_EQ_I(s.oversize_segments.current, 1);

    char *small = alloc(a, 5 * MIB); /* may not take the oversize block: new 20 MiB segment */
    CHECK(small != big);
    CHECK_EQ_I(d.n_alloc, 2);
    char *over = alloc(a, 26 * MIB); /* oversize, 30 < 26 + 20: takes it whole, no split */
    CHECK(over == big);
    s = stats_of(a);
    CHECK_EQ_I(s.allocated_bytes[KILN_POOL_LARGE].current, 5 * MIB + 30 * MIB);
    CHECK_EQ_I(s.inactive_split[KILN_POOL_LARGE].current, 1); /* only the 20 MiB segment's rest */
    CHECK_OK(kiln_caching_allocator_free(a, over));
    CHECK_OK(kiln_caching_allocator_free(a, small));

    /* Ladder step 4: a cached 50 MiB oversize segment cannot serve 26 MiB
     * (50 >= 26 + 20) and leaves no room for a new one; it is released and
     * the raw allocation retried, with no full flush. */
    CHECK_OK(kiln_caching_allocator_empty_cache(a));
    char *huge = alloc(a, 50 * MIB);
    char *keep = alloc(a, 30 * MIB);
    CHECK_OK(kiln_caching_allocator_free(a, huge));
    int frees = d.n_free;
    char *mid = alloc(a, 26 * MIB);
    s = stats_of(a);
    CHECK(mid != NULL && mid != huge);
    CHECK_EQ_I(d.n_free, frees + 1);
    CHECK_EQ_I(s.num_alloc_retries, 0);
    CHECK_EQ_I(s.oversize_segments.current, 2);
    CHECK(keep != NULL);
    kiln_caching_allocator_destroy(a);
}

static void test_caching_off(void) {
    fake_dev d;
    kiln_alloc_config cfg = kiln_alloc_config_default();
    cfg.caching = false;
    kiln_caching_allocator *a = make(&d, 64 * MIB, &cfg);
    void *p = alloc(a, 1000);
    CHECK_EQ_I(d.last_alloc, 1024);
    void *q = alloc(a, 3 * MIB + 1);
    CHECK_EQ_I(d.last_alloc, 3 * MIB + 512);
    kiln_memory_stats s = stats_of(a);
    CHECK_EQ_I(s.reserved_bytes[KILN_POOL_ALL].current, 1024 + 3 * MIB + 512);
    CHECK_EQ_I(s.allocation[KILN_POOL_SMALL].current, 1);
    CHECK_EQ_I(s.inactive_split[KILN_POOL_ALL].current, 0);
    CHECK_OK(kiln_caching_allocator_free(a, p));
    CHECK_EQ_I(d.n_free, 1);
    CHECK_OK(kiln_caching_allocator_record_stream(a, q, 9));
    d.events_done = false;
    CHECK_OK(kiln_caching_allocator_free(a, q));
    CHECK_EQ_I(d.n_free, 1); /* still in use on stream 9 */
    d.events_done = true;
    p = alloc(a, 1000);
    CHECK_EQ_I(d.n_free, 2);
    CHECK_OK(kiln_caching_allocator_free(a, p));
    s = stats_of(a);
    CHECK_EQ_I(s.reserved_bytes[KILN_POOL_ALL].current, 0);
    CHECK_EQ_I(s.num_device_alloc, 3);
    CHECK_EQ_I(s.num_device_free, 3);
    CHECK_EQ_I(s.allocation[KILN_POOL_ALL].allocated, 3);
    kiln_caching_allocator_destroy(a);
}

static void test_owns(void) {
    fake_dev d;
    kiln_caching_allocator *a = make(&d, 64 * MIB, NULL);
    char *p = alloc(a, 1000), *q = alloc(a, 5 * MIB);
    CHECK(kiln_caching_allocator_owns(a, p));
    CHECK(kiln_caching_allocator_owns(a, p + 999));
    CHECK(kiln_caching_allocator_owns(a, q + 5 * MIB - 1));
    CHECK(!kiln_caching_allocator_owns(a, q + 5 * MIB)); /* the free remainder */
    CHECK(!kiln_caching_allocator_owns(a, (void *)16));
    CHECK_OK(kiln_caching_allocator_free(a, p));
    CHECK(!kiln_caching_allocator_owns(a, p));
    kiln_caching_allocator_destroy(a);
}

static void test_config(void) {
    kiln_alloc_config cfg = kiln_alloc_config_default();
    CHECK(cfg.caching && cfg.max_split_size == UINT64_MAX && cfg.limit_bytes == 0);
    CHECK_OK(kiln_alloc_config_parse("", &cfg));
    CHECK_OK(kiln_alloc_config_parse(" backend:malloc , max_split_size_mb:64,limit_mb:512,"
                                     "per_process_memory_fraction:0.5,roundup_power2_divisions:4,",
                                     &cfg));
    CHECK(!cfg.caching);
    CHECK_EQ_I(cfg.max_split_size, 64 * MIB);
    CHECK_EQ_I(cfg.limit_bytes, 512 * MIB);
    CHECK(cfg.fraction == 0.5);
    CHECK_EQ_I(cfg.roundup_power2_divisions, 4);
    CHECK_OK(kiln_alloc_config_parse("backend:native", &cfg));
    CHECK(cfg.caching);
    CHECK_EQ_I(cfg.limit_bytes, 512 * MIB); /* keys not named are kept */

    kiln_alloc_config before = cfg;
    CHECK_FAILS(kiln_alloc_config_parse("limit_mb:1,foo:1", &cfg), KILN_ERR_INVALID_ARGUMENT,
                "unknown key 'foo'");
    CHECK(strstr(kiln_error_message(), "roundup_power2_divisions") != NULL);
    CHECK(memcmp(&before, &cfg, sizeof cfg) == 0); /* nothing applied */
    CHECK_FAILS(kiln_alloc_config_parse("max_split_size_mb:abc", &cfg), KILN_ERR_INVALID_ARGUMENT, "'abc'");
    CHECK_FAILS(kiln_alloc_config_parse("max_split_size_mb:20", &cfg), KILN_ERR_INVALID_ARGUMENT,
                "max_split_size_mb");
    CHECK_FAILS(kiln_alloc_config_parse("backend:cudaMallocAsync", &cfg), KILN_ERR_INVALID_ARGUMENT,
                "native or malloc");
    CHECK_FAILS(kiln_alloc_config_parse("limit_mb", &cfg), KILN_ERR_INVALID_ARGUMENT, "no value");
    CHECK_FAILS(kiln_alloc_config_parse("limit_mb:-5", &cfg), KILN_ERR_INVALID_ARGUMENT, "limit_mb");
    CHECK_FAILS(kiln_alloc_config_parse("per_process_memory_fraction:1.5", &cfg), KILN_ERR_INVALID_ARGUMENT,
                "'1.5'");
    CHECK_FAILS(kiln_alloc_config_parse("roundup_power2_divisions:3", &cfg), KILN_ERR_INVALID_ARGUMENT,
                "power of two");
    CHECK(strstr(kiln_error_last()->hint, "KILN_ALLOC_CONF") != NULL);
}

static void test_summary(void) {
    fake_dev d;
    kiln_caching_allocator *a = make(&d, 64 * MIB, NULL);
    void *p = alloc(a, 3 * MIB), *q = alloc(a, 1000);
    char *text = kiln_caching_allocator_summary(a, "Kiln memory summary, device fake:0", false);
    CHECK(text != NULL);
    if (text) {
        CHECK(strstr(text, "Kiln memory summary, device fake:0") != NULL);
        CHECK(strstr(text, "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ") !=
              NULL);
        /* 3 MiB + 1024 bytes allocated: the unit is KiB (below 768 MiB), floor-divided. */
        CHECK(strstr(text, "| Allocated memory      |   3073 KiB |   3073 KiB |   3073 KiB |      0 B   |") !=
              NULL);
        CHECK(strstr(text, "|       from small pool |      1 KiB |") != NULL);
        CHECK(strstr(text, "| Allocations           |       2    |       2    |       2    |       0    |") !=
              NULL);
        CHECK(strstr(text, "Reserved segments") != NULL);
        CHECK(strstr(text, "Oversize segments") != NULL);
        int lines = 0;
        bool widths_ok = true;
        for (char *line = text; *line;) {
            char *nl = strchr(line, '\n');
            if (!nl) break;
            widths_ok = widths_ok && nl - line == 77 && line[0] == '|' && line[76] == '|';
            lines++;
            line = nl + 1;
        }
        CHECK(widths_ok);
        CHECK_EQ_I(lines, 6 + 9 * 4 + 4 + 1);
        free(text);
    }
    text = kiln_caching_allocator_summary(a, "short", true);
    CHECK(text && strstr(text, "from large pool") == NULL && strstr(text, "Active allocs") != NULL);
    free(text);
    CHECK_OK(kiln_caching_allocator_free(a, p));
    CHECK_OK(kiln_caching_allocator_free(a, q));
    kiln_caching_allocator_destroy(a);
}

/* Replays one trace on an allocator; stats are snapshotted at checkpoints. */
static void replay_trace(kiln_caching_allocator *a, kiln_memory_stats snaps[4]) {
    enum { SLOTS = 64 };
    void *live[SLOTS] = {0};
    uint64_t rng = 12345;
    int snap = 0;
    for (int i = 0; i < 4000; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        int slot = (int)(rng % SLOTS);
        kiln_alloc_stream stream = 1 + (rng >> 20) % 2;
        if (live[slot]) {
            if ((rng >> 30) % 5 == 0) kiln_caching_allocator_record_stream(a, live[slot], 3);
            kiln_caching_allocator_free(a, live[slot]);
            live[slot] = NULL;
        } else {
            /* Log-uniform-ish: 1 B .. 16 MiB. */
            size_t size = (size_t)1 << ((rng >> 40) % 25);
            size += (rng >> 8) % size;
            if (kiln_caching_allocator_malloc(a, size, stream, &live[slot]) != KILN_OK) live[slot] = NULL;
        }
        if (i % 1000 == 999) kiln_caching_allocator_stats(a, &snaps[snap++]);
    }
    for (int s = 0; s < SLOTS; s++) kiln_caching_allocator_free(a, live[s]);
}

static void test_simulate_agrees(void) {
    /* Events complete at once in simulation, so the real side answers
     * "done" too; capacity is ample so no OOM reorders segments. */
    fake_dev d;
    kiln_caching_allocator *real = make(&d, (size_t)8 << 30, NULL);
    d.events_done = true;
    kiln_raw_ops sim_ops = kiln_simulated_raw_ops((size_t)8 << 30, "meta");
    kiln_caching_allocator *sim = kiln_caching_allocator_create(&sim_ops, NULL);
    CHECK(sim != NULL);
    kiln_memory_stats r[4], s[4];
    memset(r, 0, sizeof r);
    memset(s, 0, sizeof s);
    replay_trace(real, r);
    replay_trace(sim, s);
    for (int i = 0; i < 4; i++) CHECK_MSG(memcmp(&r[i], &s[i], sizeof r[i]) == 0, "checkpoint %d differs", i);
    CHECK(r[3].allocation[KILN_POOL_ALL].allocated > 1000);
    CHECK(r[3].inactive_split[KILN_POOL_ALL].peak > 0);
    kiln_memory_stats rf, sf;
    kiln_caching_allocator_stats(real, &rf);
    kiln_caching_allocator_stats(sim, &sf);
    CHECK(memcmp(&rf, &sf, sizeof rf) == 0);
    CHECK_EQ_I(rf.allocation[KILN_POOL_ALL].current, 0);

    /* Simulated OOM: a small address space runs out like a device. */
    kiln_raw_ops tiny_ops = kiln_simulated_raw_ops(8 * MIB, "meta");
    kiln_caching_allocator *tiny = kiln_caching_allocator_create(&tiny_ops, NULL);
    void *p = NULL;
    CHECK_FAILS(kiln_caching_allocator_malloc(tiny, 9 * MIB, 1, &p), KILN_ERR_OUT_OF_MEMORY,
                "meta out of memory: tried to allocate 20.00 MiB (request 9.00 MiB)");
    CHECK(strstr(kiln_error_message(), "8.00 MiB free of 8.00 MiB") != NULL);
    kiln_caching_allocator_destroy(tiny);
    kiln_simulated_raw_ops_destroy(&tiny_ops);

    kiln_caching_allocator_destroy(real);
    kiln_caching_allocator_destroy(sim);
    kiln_simulated_raw_ops_destroy(&sim_ops);
    CHECK(sim_ops.ctx == NULL);
}

typedef struct thread_arg {
    kiln_caching_allocator *a;
    kiln_alloc_stream stream;
    int failures;
} thread_arg;

static void *thread_main(void *p) {
    thread_arg *t = p;
    void *live[16] = {0};
    for (int i = 0; i < 20000; i++) {
        int slot = (i * 7 + (int)t->stream) % 16;
        if (live[slot]) {
            if (kiln_caching_allocator_free(t->a, live[slot]) != KILN_OK) t->failures++;
            live[slot] = NULL;
        } else if (kiln_caching_allocator_malloc(t->a, (size_t)(i % 5000) * 97 + 1, t->stream, &live[slot]) !=
                   KILN_OK) {
            t->failures++;
        }
    }
    for (int s = 0; s < 16; s++)
        if (live[s] && kiln_caching_allocator_free(t->a, live[s]) != KILN_OK) t->failures++;
    return NULL;
}

static void test_threads(void) {
    fake_dev d;
    kiln_caching_allocator *a = make(&d, 1024 * MIB, NULL);
    pthread_t th[4];
    thread_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thread_arg){a, (kiln_alloc_stream)(i % 2 + 1), 0};
        pthread_create(&th[i], NULL, thread_main, &args[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_I(args[i].failures, 0);
    }
    kiln_memory_stats s = stats_of(a);
    CHECK_EQ_I(s.allocation[KILN_POOL_ALL].current, 0);
    CHECK_EQ_I(s.allocated_bytes[KILN_POOL_ALL].current, 0);
    CHECK_EQ_I(s.allocation[KILN_POOL_ALL].allocated, s.allocation[KILN_POOL_ALL].freed);
    CHECK_EQ_I(s.inactive_split[KILN_POOL_ALL].current, 0); /* every segment merged back whole */
    kiln_caching_allocator_destroy(a);
}

int main(void) {
    test_rounding();
    test_small_pool_split_merge();
    test_large_pool_best_fit();
    test_streams();
    test_oom_ladder();
    test_empty_cache();
    test_limits();
    test_max_split_size();
    test_caching_off();
    test_owns();
    test_config();
    test_summary();
    test_simulate_agrees();
    test_threads();
    return kt_finish();
}

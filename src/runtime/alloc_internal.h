/* Internals of the caching allocator shared by its source files
 * (caching_allocator.c: the hot paths; alloc_control.c: lifetime, cache
 * control, statistics). Nothing outside src/runtime/alloc_*.c and
 * caching_allocator.c includes this. */
#ifndef KILN_SRC_RUNTIME_ALLOC_INTERNAL_H
#define KILN_SRC_RUNTIME_ALLOC_INTERNAL_H

#include <pthread.h>

#include "runtime/caching_allocator.h"

#if defined(__SANITIZE_ADDRESS__)
#define KILN_ALLOC_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KILN_ALLOC_ASAN 1
#endif
#endif
#ifdef KILN_ALLOC_ASAN
#include <sanitizer/asan_interface.h>
#endif

#define MIN_BLOCK       ((size_t)512)
#define SMALL_SIZE      ((size_t)1 << 20)  /* largest request of the small pool */
#define SMALL_BUFFER    ((size_t)2 << 20)  /* small-pool segment */
#define MIN_LARGE_ALLOC ((size_t)10 << 20) /* below this, large requests get LARGE_BUFFER */
#define LARGE_BUFFER    ((size_t)20 << 20)
#define ROUND_LARGE     ((size_t)2 << 20)
#define SLAB_BLOCKS     256

enum { POOL_LARGE = 0, POOL_SMALL = 1 };
enum { BLOCK_FREE = 0, BLOCK_ALLOCATED, BLOCK_PENDING };

typedef struct alloc_segment alloc_segment;

/* 128 bytes, 64-aligned in its slab: what a tree descent reads (children,
 * key, priority) shares the first cache line. */
typedef struct alloc_block {
    struct alloc_block *child[2]; /* treap children while free: [0] smaller keys */
    kiln_alloc_stream stream;
    size_t size; /* bytes the block covers (rounded) */
    uintptr_t ptr;
    uint32_t prio;
    uint8_t state;
    uint8_t pool;
    struct alloc_block *hnext; /* hash chain while allocated; slab free list */
    /* second cache line */
    size_t requested; /* bytes asked for, while allocated or pending */
    alloc_segment *seg;
    struct alloc_block *prev, *next; /* neighbours in the segment */
    kiln_alloc_stream *uses;         /* record_stream streams (rare: heap) */
    uint32_t n_uses, cap_uses;
    int event_count;
} __attribute__((aligned(64))) alloc_block;

struct alloc_segment {
    uintptr_t base;
    size_t size;
    alloc_block *head; /* the block at `base` */
    uint8_t pool;
};

typedef struct pending_event {
    void *event;
    alloc_block *block;
} pending_event;

struct kiln_caching_allocator {
    pthread_mutex_t mutex;
    kiln_raw_ops ops;
    kiln_alloc_config cfg;
    bool poison;
    uint32_t rng;
    alloc_block *free_root[2];
    alloc_block **buckets; /* live blocks by address */
    size_t n_buckets, n_live;
    alloc_segment **segs; /* sorted by base */
    size_t n_segs, cap_segs;
    pending_event *pending;
    size_t n_pending, cap_pending;
    alloc_block *spare; /* recycled block records */
    void **slabs;
    size_t n_slabs, cap_slabs;
    uint64_t fraction_limit; /* cfg.fraction * total, 0 when unset */
    kiln_memory_stats stats;
};

/* ASan: free blocks and slack bytes are poisoned when the memory is host
 * accessible, so an overrun into cached memory is still reported. */
static inline void kiln_alloc_poison(const kiln_caching_allocator *a, uintptr_t p, size_t n) {
#ifdef KILN_ALLOC_ASAN
    if (a->poison) ASAN_POISON_MEMORY_REGION((void *)p, n);
#else
    (void)a, (void)p, (void)n;
#endif
}

static inline void kiln_alloc_unpoison(const kiln_caching_allocator *a, uintptr_t p, size_t n) {
#ifdef KILN_ALLOC_ASAN
    if (a->poison) ASAN_UNPOISON_MEMORY_REGION((void *)p, n);
#else
    (void)a, (void)p, (void)n;
#endif
}

/* Wait for every pending stream event, then cache the blocks they held. */
void kiln_alloc_events_synchronize(kiln_caching_allocator *a);
/* Release every cached segment that is one free block. */
void kiln_alloc_release_unsplit(kiln_caching_allocator *a);
/* The smaller of limit_bytes and fraction * total; 0 when neither is set. */
uint64_t kiln_alloc_effective_limit(const kiln_caching_allocator *a);
/* Fill the KILN_POOL_ALL current/allocated/freed of the per-pool stat
 * arrays of `s` from the pools (the hot path keeps only their peak). */
void kiln_alloc_stats_fill_all(kiln_memory_stats *s);
/* The out-of-memory message for a failed segment of `seg_size` bytes. */
void kiln_alloc_format_oom(kiln_caching_allocator *a, size_t seg_size, size_t rounded, char *msg, size_t n);

#endif

/* Internals of the caching allocator shared by its source files
 * (caching_allocator.c: the hot paths; alloc_segments.c: segments, stream
 * records, the out-of-memory ladder; alloc_control.c: lifetime, cache
 * control, statistics, the lock's waiting side). Nothing outside src/runtime/alloc_*.c and
 * caching_allocator.c includes this. */
#ifndef KILN_SRC_RUNTIME_ALLOC_INTERNAL_H
#define KILN_SRC_RUNTIME_ALLOC_INTERNAL_H

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

/* Free blocks of one (stream, pool) sit in size bins (docs/memory.md,
 * "Implementation and speed"). Small pool: bin (size >> 9) - 1, one exact size per
 * bin from 512 B to 2 MiB. Large pool (every block > 1 MiB): bin
 * (size >> 16) - 16, 64 KiB wide, up to 256 MiB; the last bin takes every
 * larger block. A two-level bitmap finds the first non-empty bin at or
 * above a request's with two ctz; each bin is a treap ordered by (size,
 * address), so best fit, with the lowest address among equal sizes, stays
 * exactly PyTorch's. */
#define BIN_COUNT 4096
#define BIN_WORDS (BIN_COUNT / 64)

struct alloc_block;

typedef struct alloc_bins {
    unsigned shift, base;                /* bin of size s: (s >> shift) - base, at most BIN_COUNT - 1 */
    uint64_t summary;                    /* bit w: words[w] != 0 */
    uint64_t words[BIN_WORDS];           /* bit i % 64 of words[i / 64]: bin i is not empty */
    struct alloc_block *root[BIN_COUNT]; /* (BIN_COUNT) treap roots */
} alloc_bins;

/* The free-block index of one stream: 66 KiB, made with the stream's first
 * segment (caching on) and freed with its last. */
typedef struct alloc_stream_pools {
    kiln_alloc_stream stream;
    size_t n_segs;
    alloc_bins bins[2]; /* POOL_LARGE, POOL_SMALL */
} alloc_stream_pools;

typedef struct alloc_segment {
    uintptr_t base;
    size_t size;
    struct alloc_block *head; /* the block at `base` */
    alloc_stream_pools *sp;   /* NULL without caching: its blocks never go to a pool */
    uint64_t stream_id;       /* ops.stream_id of its stream (memory history, snapshots) */
    uint8_t pool;
} alloc_segment;

/* 128 bytes, 64-aligned in its slab: what a bin descent reads (children,
 * key, priority) shares the first cache line. */
typedef struct alloc_block {
    struct alloc_block *child[2]; /* treap children while free: [0] smaller keys */
    size_t size;                  /* bytes the block covers (rounded) */
    uintptr_t ptr;
    uint32_t prio;
    uint8_t state;
    uint8_t pool;
    uint16_t bin;              /* its bin, while free */
    alloc_bins *bins;          /* the bins of its stream and pool; NULL without caching */
    struct alloc_block *hnext; /* hash chain while allocated; slab free list */
    kiln_alloc_stream stream;
    /* second cache line */
    size_t requested; /* bytes asked for, while allocated or pending */
    alloc_segment *seg;
    struct alloc_block *prev, *next; /* neighbours in the segment */
    kiln_alloc_stream *uses;         /* record_stream streams (rare: heap) */
    uint32_t n_uses, cap_uses;
    int event_count;
    uint32_t ctx; /* while allocated and the history is on: its allocation's context (memory_history.c) */
} __attribute__((aligned(64))) alloc_block;

typedef struct pending_event {
    void *event;
    alloc_block *block;
} pending_event;

/* The per-pool stat arrays of kiln_memory_stats, `allocation` to
 * `inactive_split_bytes`. */
#define KILN_ALLOC_POOL_STATS 9

struct kiln_caching_allocator {
    int lock; /* see alloc_lock */
    kiln_raw_ops ops;
    kiln_alloc_config cfg;
    bool poison;
    uint32_t rng;
    alloc_stream_pools *mru;      /* the stream pools found last */
    alloc_stream_pools **streams; /* one per stream owning a segment (caching on) */
    size_t n_streams, cap_streams;
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
    struct kiln_alloc_history *history; /* NULL unless recording (memory_history.c) */
    kiln_memory_stats stats;
    /* Per pool (POOL_LARGE, POOL_SMALL): blocks awaiting stream events and
     * their bytes, and what active.freed / active_bytes.freed add to
     * allocation.freed / allocated_bytes.freed. */
    int64_t pending_blocks[2], pending_bytes[2];
    int64_t active_freed_adjust[2], active_bytes_freed_adjust[2];
    /* Per stat array of `stats` and pool: current at the last accumulated
     * reset (see the statistics comment). */
    int64_t stats_base[KILN_ALLOC_POOL_STATS][2];
};

/* ---- The allocator lock ---------------------------------------------------------
 * One atomic exchange takes it and a plain release store gives it back. A
 * pthread mutex also unlocks with a locked instruction, a full fence that
 * cost about 8 ns of a ~70 ns malloc+free pair (kiln bench alloc). The
 * price is that a store cannot wake a sleeper: kiln_alloc_lock_wait spins
 * briefly, then yields, then sleeps in naps doubling to 1 ms (a holder may
 * keep the lock through a device allocation). One thread driving a device,
 * the common case, never waits. */
void kiln_alloc_lock_wait(kiln_caching_allocator *a);

static inline void alloc_lock(kiln_caching_allocator *a) {
    if (__builtin_expect(__atomic_exchange_n(&a->lock, 1, __ATOMIC_ACQUIRE) != 0, 0)) kiln_alloc_lock_wait(a);
}

static inline void alloc_unlock(kiln_caching_allocator *a) {
    __atomic_store_n(&a->lock, 0, __ATOMIC_RELEASE);
}

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

/* ---- Statistics ------------------------------------------------------------------
 * The hot path keeps, for each per-pool stat array (pool entry
 * KILN_POOL_LARGE + pool), the pools' current and allocated and the peaks of
 * the pools and of KILN_POOL_ALL; kiln_alloc_stats_fill_all derives the rest
 * when the statistics are read:
 * - freed = allocated - current + the current at the last accumulated reset
 *   (stats_base), since current moves by exactly allocated - freed;
 * - the KILN_POOL_ALL current, allocated and freed are the pools' sums;
 * - active and active_bytes are never touched here: active is allocation
 *   plus the blocks awaiting stream events (pending_blocks), its allocated
 *   total equals allocation's (both grow only in malloc), its freed total is
 *   allocation's plus active_freed_adjust (moved only when a block starts or
 *   stops waiting), and its peak is max(stored peak, allocation's peak):
 *   while nothing waits the two coincide, and while something waits malloc
 *   updates the stored peak (active_peaks_update).
 * Fewer stores and no branch on the sign of a change: with the lock's
 * fence before it, every store and dependent load of the hot path shows
 * in kiln bench alloc. A peak is written only when it rises (rare, and
 * well predicted); the ALL peak compares the pool's new current plus the
 * other pool's, whose address does not depend on the late-known pool. */

static inline int64_t max_i64(int64_t x, int64_t y) { return x > y ? x : y; }

static inline void stat_peak(kiln_stat *arr, kiln_stat *p, int pool, int64_t cur) {
    if (__builtin_expect(cur > p->peak, 0)) p->peak = cur;
    int64_t all = cur + arr[KILN_POOL_SMALL - pool].current; /* the other pool */
    if (__builtin_expect(all > arr[KILN_POOL_ALL].peak, 0)) arr[KILN_POOL_ALL].peak = all;
}

static inline void stat_inc(kiln_stat *arr, int pool, int64_t n) {
    kiln_stat *p = &arr[KILN_POOL_LARGE + pool];
    int64_t cur = p->current + n;
    p->current = cur;
    p->allocated += n;
    stat_peak(arr, p, pool, cur);
}

static inline void stat_dec(kiln_stat *arr, int pool, int64_t n) { arr[KILN_POOL_LARGE + pool].current -= n; }

/* A change of either sign: the inactive-split stats move by net changes,
 * as PyTorch's do; 0 changes nothing. */
static inline void stat_net(kiln_stat *arr, int pool, int64_t d) {
    kiln_stat *p = &arr[KILN_POOL_LARGE + pool];
    int64_t cur = p->current + d;
    p->current = cur;
    p->allocated += d > 0 ? d : 0;
    stat_peak(arr, p, pool, cur);
}

/* A single stat (no pools; the oversize ones, rarely moved): kept whole. */
static inline void stat_update(kiln_stat *s, int64_t delta) {
    int64_t up = delta > 0 ? delta : 0;
    s->current += delta;
    s->allocated += up;
    s->freed += up - delta;
    s->peak = s->current > s->peak ? s->current : s->peak;
}

static inline bool is_oversize(const kiln_caching_allocator *a, size_t size) {
    return (uint64_t)size >= a->cfg.max_split_size;
}

/* ---- Between the hot paths (caching_allocator.c) and the segment, stream
 * and recovery code (alloc_segments.c) ------------------------------------------------ */

/* A fresh block record (fields cleared, random treap priority), or NULL. */
alloc_block *kiln_alloc_block_new(kiln_caching_allocator *a);
void kiln_alloc_block_recycle(kiln_caching_allocator *a, alloc_block *b);
/* Take free block b out of its bin. */
void kiln_alloc_pool_remove(alloc_block *b);
/* Best fit for `size` bytes of `stream` in `pool`, taken out of its bin;
 * NULL when none fits. */
alloc_block *kiln_alloc_pool_find(kiln_caching_allocator *a, int pool, kiln_alloc_stream stream, size_t size);
/* A pending block whose stream events have all completed: merge it with its
 * free neighbours and cache it (or, without caching, release its segment). */
void kiln_alloc_block_free_pending(kiln_caching_allocator *a, alloc_block *b);
/* The live block starting at p, or NULL. */
alloc_block *kiln_alloc_live_find(kiln_caching_allocator *a, uintptr_t p);

/* The stream pools of `stream` (remembered as a->mru), or NULL: a stream
 * without segments has no free blocks. */
alloc_stream_pools *kiln_alloc_stream_pools_lookup(kiln_caching_allocator *a, kiln_alloc_stream stream);
/* Give an entirely free segment (its one block, out of every bin) back. */
void kiln_alloc_segment_release(kiln_caching_allocator *a, alloc_block *b);
/* After a failed best fit: a new segment, then the recovery ladder
 * (docs/memory.md). KILN_ERR_OUT_OF_MEMORY with the message in `msg` when
 * everything fails. */
kiln_status kiln_alloc_block_obtain(kiln_caching_allocator *a, int pool, kiln_alloc_stream stream,
                                    size_t rounded, alloc_block **out, char *msg, size_t msg_size);
/* Wait for every pending stream event, then cache the blocks they held. */
void kiln_alloc_events_synchronize(kiln_caching_allocator *a);
/* Release every cached segment that is one free block. */
void kiln_alloc_release_unsplit(kiln_caching_allocator *a);
/* Free every stream record (destroy). */
void kiln_alloc_streams_free(kiln_caching_allocator *a);
/* The smaller of limit_bytes and fraction * total; 0 when neither is set. */
uint64_t kiln_alloc_effective_limit(const kiln_caching_allocator *a);
/* Complete a->stats from what the hot path keeps: the KILN_POOL_ALL
 * allocated/freed of every per-pool stat, and all of active and
 * active_bytes (see the statistics comment above). */
void kiln_alloc_stats_fill_all(kiln_caching_allocator *a);
/* ---- Memory history (memory_history.c) ------------------------------------------
 * Called with the lock held, only when a->history is set: the hot paths pay
 * one branch on it. Each records one trace entry (PyTorch's actions). */
typedef enum kiln_alloc_action {
    KILN_ALLOC_ACT_ALLOC = 0,
    KILN_ALLOC_ACT_FREE_REQUESTED,  /* the user freed it: allocated drops */
    KILN_ALLOC_ACT_FREE_COMPLETED,  /* back in the cache: requested and active drop */
    KILN_ALLOC_ACT_SEGMENT_ALLOC,   /* raw device allocation */
    KILN_ALLOC_ACT_SEGMENT_FREE,
    KILN_ALLOC_ACT_OOM,
    KILN_ALLOC_ACT_RESET_PEAK,
    KILN_ALLOC_ACT_RESET_ACCUMULATED,
    KILN_ALLOC_ACT_COUNT
} kiln_alloc_action;
/* Block events: `b` as it is at the moment (address, rounded size,
 * requested size, pool, segment's stream); ALLOC also stores the context
 * in b->ctx. */
void kiln_alloc_history_block(kiln_caching_allocator *a, kiln_alloc_action action, const alloc_block *b);
void kiln_alloc_history_alloc(kiln_caching_allocator *a, alloc_block *b);
/* Segment events, OOM (size: the rounded request, requested: as asked)
 * and the two resets. */
void kiln_alloc_history_event(kiln_caching_allocator *a, kiln_alloc_action action, uintptr_t addr, size_t size,
                              size_t requested, int pool, uint64_t stream_id);
/* Free the history (destroy). */
void kiln_alloc_history_free(kiln_caching_allocator *a);

/* The out-of-memory message for a failed segment of `seg_size` bytes. */
void kiln_alloc_format_oom(kiln_caching_allocator *a, size_t seg_size, size_t rounded, char *msg, size_t n);

#endif

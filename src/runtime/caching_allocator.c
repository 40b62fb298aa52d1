/* The caching allocator's hot paths: PyTorch's CUDACachingAllocator
 * semantics (see docs/memory.md and reference §1) over raw allocation
 * callbacks. Segments, stream records and the out-of-memory ladder are in
 * alloc_segments.c; lifetime and statistics in alloc_control.c.
 *
 * Data structures, chosen so a cached malloc+free pair costs a few hundred
 * instructions (kiln bench alloc measures it):
 * - every piece of a raw segment is a block record, linked prev/next in
 *   address order; records come from slabs and are recycled, so the hot path
 *   never calls malloc;
 * - free blocks of each (stream, pool) sit in size bins (alloc_internal.h):
 *   a two-level bitmap finds the first non-empty bin that can serve a
 *   request with two ctz, and each bin is a treap ordered by (size, address)
 *   that usually holds zero or one block, so best fit, insertion and removal
 *   are O(1) in practice and O(log n) at worst;
 * - live blocks sit in a chained hash table keyed by address, for free();
 * - segments sit in an array sorted by base address, for owns() on interior
 *   pointers and for the rare walks (empty_cache, OOM recovery). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "runtime/alloc_internal.h"

/* ---- Sizes ------------------------------------------------------------------ */

/* Between two powers of two, round up to the next of `div` equal steps
 * (9000, div 4 -> 10240): fewer distinct sizes, better reuse. */
static size_t round_power2_division(size_t size, size_t div) {
    if ((size & (size - 1)) == 0) return size;
    size_t floor2 = (size_t)1 << (63 - __builtin_clzll((unsigned long long)size));
    size_t step = floor2 / div;
    if (step == 0) return floor2 << 1;
    size_t down = size & ~(step - 1);
    return down == size ? size : down + step;
}

size_t kiln_alloc_round_size(const kiln_alloc_config *cfg, size_t size) {
    if (size < MIN_BLOCK) return MIN_BLOCK;
    if (size > SIZE_MAX - ROUND_LARGE) return SIZE_MAX; /* the caller reports it */
    size_t div = cfg && cfg->roundup_power2_divisions > 1 ? (size_t)cfg->roundup_power2_divisions : 0;
    if (div > 1 && size > MIN_BLOCK * div) {
        size_t r = round_power2_division(size, div);
        return r < size ? SIZE_MAX : r; /* wrapped past the top of size_t */
    }
    return (size + MIN_BLOCK - 1) / MIN_BLOCK * MIN_BLOCK;
}

size_t kiln_alloc_segment_size(size_t rounded) {
    if (rounded <= SMALL_SIZE) return SMALL_BUFFER;
    if (rounded < MIN_LARGE_ALLOC) return LARGE_BUFFER;
    return (rounded + ROUND_LARGE - 1) / ROUND_LARGE * ROUND_LARGE;
}

/* ---- Block records ------------------------------------------------------------- */

/* A record off the spare list keeps: uses NULL, n_uses = cap_uses =
 * event_count = 0 (block_recycle restores what may have changed), and its
 * treap priority, drawn once when its slab is made: priorities need only
 * be random and independent of the keys, so the hot path draws none. */
static __attribute__((noinline)) bool slab_add(kiln_caching_allocator *a) {
    if (a->n_slabs == a->cap_slabs) {
        size_t cap = a->cap_slabs ? a->cap_slabs * 2 : 16;
        void **s = KILN_REALLOC(a->slabs, cap * sizeof *s);
        if (!s) return false;
        a->slabs = s;
        a->cap_slabs = cap;
    }
    alloc_block *slab = KILN_ALIGNED_ALLOC(64, SLAB_BLOCKS * sizeof *slab);
    if (!slab) return false;
    a->slabs[a->n_slabs++] = slab;
    for (int i = 0; i < SLAB_BLOCKS; i++) {
        alloc_block *b = &slab[i];
        uint32_t x = a->rng; /* xorshift32 */
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        a->rng = x;
        b->prio = x;
        b->uses = NULL;
        b->n_uses = b->cap_uses = 0;
        b->event_count = 0;
        b->hnext = a->spare;
        a->spare = b;
    }
    return true;
}

/* A record with its invariant fields set; the caller sets the rest. */
static inline alloc_block *block_new(kiln_caching_allocator *a) {
    if (__builtin_expect(!a->spare, 0) && !slab_add(a)) return NULL;
    alloc_block *b = a->spare;
    a->spare = b->hnext;
    return b;
}

alloc_block *kiln_alloc_block_new(kiln_caching_allocator *a) {
    alloc_block *b = block_new(a);
    if (b) {
        b->requested = 0;
        b->prev = b->next = b->child[0] = b->child[1] = b->hnext = NULL;
        b->state = BLOCK_FREE;
    }
    return b;
}

static inline void block_recycle(kiln_caching_allocator *a, alloc_block *b) {
    if (__builtin_expect(b->uses != NULL, 0)) {
        free(b->uses);
        b->uses = NULL;
        b->n_uses = b->cap_uses = 0;
    }
    b->hnext = a->spare;
    a->spare = b;
}

void kiln_alloc_block_recycle(kiln_caching_allocator *a, alloc_block *b) { block_recycle(a, b); }

/* ---- Free blocks: size bins, each a treap ordered by (size, ptr) ------------------ */

/* The bin of a free block or request of `size` bytes (alloc_internal.h):
 * the shift and base come from the bins, not from a branch on the pool,
 * which is as random as the sizes. */
static inline unsigned bin_of(const alloc_bins *bins, size_t size) {
    size_t i = (size >> bins->shift) - bins->base;
    return i < BIN_COUNT - 1 ? (unsigned)i : BIN_COUNT - 1;
}

static inline void bins_mark(alloc_bins *bins, unsigned i) {
    bins->words[i >> 6] |= 1ull << (i & 63);
    bins->summary |= 1ull << (i >> 6);
}

static inline void bins_unmark(alloc_bins *bins, unsigned i) {
    uint64_t w = bins->words[i >> 6] & ~(1ull << (i & 63));
    bins->words[i >> 6] = w;
    bins->summary &= ~((uint64_t)(w == 0) << (i >> 6));
}

/* The first non-empty bin at or above i, or BIN_COUNT. */
static inline unsigned bins_next(const alloc_bins *bins, unsigned i) {
    if (i >= BIN_COUNT) return BIN_COUNT;
    unsigned w = i >> 6;
    uint64_t m = bins->words[w] & (~0ull << (i & 63));
    if (m) return (w << 6) | (unsigned)__builtin_ctzll(m);
    uint64_t above = bins->summary & ~((2ull << w) - 1); /* words after w; 0 when w = 63 */
    if (!above) return BIN_COUNT;
    w = (unsigned)__builtin_ctzll(above);
    return (w << 6) | (unsigned)__builtin_ctzll(bins->words[w]);
}

/* Tree descents choose a child by index, with the comparison computed
 * without branches: the direction is random, so a branch would be
 * mispredicted half the time. */

/* 1 when block x sorts before the key (size, ptr). */
static inline int key_less(const alloc_block *x, size_t size, uintptr_t ptr) {
    return (x->size < size) | ((x->size == size) & (x->ptr < ptr));
}

static inline int block_less(const alloc_block *x, const alloc_block *key) {
    return key_less(x, key->size, key->ptr);
}

/* Split tree t into keys below `key` (*l) and the rest (*r). */
static void treap_split(alloc_block *t, const alloc_block *key, alloc_block **l, alloc_block **r) {
    while (t) {
        int lt = block_less(t, key);
        /* Selects, not branches (see above); no array, which would put the
         * two links in memory and serialise iterations on store forwarding. */
        alloc_block **dst = lt ? l : r;
        *dst = t;
        l = lt ? &t->child[1] : l;
        r = lt ? r : &t->child[0];
        t = t->child[lt];
    }
    *l = *r = NULL;
}

/* Join trees x and y, every key of x below every key of y. */
static alloc_block *treap_merge(alloc_block *x, alloc_block *y) {
    alloc_block *root = NULL, **link = &root;
    while (x && y) {
        if (x->prio > y->prio) {
            *link = x;
            link = &x->child[1];
            x = x->child[1];
        } else {
            *link = y;
            link = &y->child[0];
            y = y->child[0];
        }
    }
    *link = x ? x : y;
    return root;
}

/* Most bins hold zero or one block: those cases skip the treap code. */
static inline void pool_insert(alloc_block *b) {
    alloc_bins *bins = b->bins;
    unsigned i = bin_of(bins, b->size);
    alloc_block **link = &bins->root[i];
    b->state = BLOCK_FREE;
    b->bin = (uint16_t)i;
    if (!*link) {
        b->child[0] = b->child[1] = NULL;
        *link = b;
        bins_mark(bins, i);
        return;
    }
    while (*link && (*link)->prio > b->prio) link = &(*link)->child[block_less(*link, b)];
    treap_split(*link, b, &b->child[0], &b->child[1]);
    *link = b;
}

/* Unlink the block at *link (its parent's child pointer or the root of bin
 * i). */
static inline void pool_unlink(alloc_bins *bins, unsigned i, alloc_block **link) {
    alloc_block *b = *link, *l = b->child[0], *r = b->child[1];
    *link = l && r ? treap_merge(l, r) : (alloc_block *)((uintptr_t)l | (uintptr_t)r);
    if (!bins->root[i]) bins_unmark(bins, i);
}

static inline void pool_remove(alloc_block *b) {
    unsigned i = b->bin;
    alloc_block **link = &b->bins->root[i];
    while (*link != b) {
        KILN_ASSERT(*link != NULL);
        link = &(*link)->child[block_less(*link, b)];
    }
    pool_unlink(b->bins, i, link);
}

void kiln_alloc_pool_remove(alloc_block *b) { pool_remove(b); }

/* Best fit with PyTorch's max_split_size rules: a request below the limit
 * may not take an oversize block; an oversize request may take a block at
 * most LARGE_BUFFER bigger (it will not be split). Within the request's own
 * bin a lower bound finds the smallest block that fits (a large bin spans
 * sizes); failing that, the smallest block of the next non-empty bin is
 * the best fit, since every size there is larger. */
static inline alloc_block *pool_find(kiln_caching_allocator *a, int pool, kiln_alloc_stream stream,
                                     size_t size) {
    alloc_stream_pools *sp = a->mru;
    if (__builtin_expect(!sp || sp->stream != stream, 0)) {
        sp = kiln_alloc_stream_pools_lookup(a, stream);
        if (!sp) return NULL;
    }
    alloc_bins *bins = &sp->bins[pool];
    unsigned i = bin_of(bins, size);
    alloc_block **link = NULL;
    unsigned j = bins_next(bins, i); /* the bitmap, not the root: usually i is empty */
    if (j == i) {
        for (alloc_block **l = &bins->root[i]; *l;) {
            int lt = key_less(*l, size, 0);
            link = lt ? link : l;
            l = &(*l)->child[lt];
        }
        if (!link) j = bins_next(bins, i + 1);
    }
    if (!link) {
        i = j;
        if (i == BIN_COUNT) return NULL;
        link = &bins->root[i];
        while ((*link)->child[0]) link = &(*link)->child[0];
    }
    alloc_block *b = *link;
    if (__builtin_expect(a->cfg.max_split_size != UINT64_MAX, 0)) {
        if (!is_oversize(a, size) && is_oversize(a, b->size)) return NULL;
        if (is_oversize(a, size) && b->size >= size + LARGE_BUFFER) return NULL;
    }
    pool_unlink(bins, i, link);
    return b;
}

alloc_block *kiln_alloc_pool_find(kiln_caching_allocator *a, int pool, kiln_alloc_stream stream,
                                  size_t size) {
    return pool_find(a, pool, stream, size);
}

/* ---- Live blocks by address ------------------------------------------------------- */

static inline size_t hash_ptr(const kiln_caching_allocator *a, uintptr_t p) {
    uint64_t h = (uint64_t)(p >> 9) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 32) & (a->n_buckets - 1);
}

static __attribute__((noinline)) void hash_grow(kiln_caching_allocator *a) {
    size_t n = a->n_buckets ? a->n_buckets * 2 : 1024;
    alloc_block **nb = KILN_CALLOC(n, sizeof *nb);
    if (!nb) return; /* longer chains; the table stays correct */
    alloc_block **old = a->buckets;
    size_t old_n = a->n_buckets;
    a->buckets = nb;
    a->n_buckets = n;
    for (size_t i = 0; i < old_n; i++) {
        for (alloc_block *b = old[i], *nx; b; b = nx) {
            nx = b->hnext;
            size_t h = hash_ptr(a, b->ptr);
            b->hnext = nb[h];
            nb[h] = b;
        }
    }
    free(old);
}

static inline void hash_insert(kiln_caching_allocator *a, alloc_block *b) {
    if (__builtin_expect(a->n_live >= a->n_buckets, 0)) hash_grow(a);
    size_t h = hash_ptr(a, b->ptr);
    b->hnext = a->buckets[h];
    a->buckets[h] = b;
    a->n_live++;
}

static inline alloc_block *hash_find(kiln_caching_allocator *a, uintptr_t p, bool remove) {
    if (!a->n_buckets) return NULL;
    alloc_block **link = &a->buckets[hash_ptr(a, p)];
    for (; *link; link = &(*link)->hnext) {
        alloc_block *b = *link;
        if (b->ptr != p) continue;
        if (remove) {
            *link = b->hnext;
            a->n_live--;
        }
        return b;
    }
    return NULL;
}

alloc_block *kiln_alloc_live_find(kiln_caching_allocator *a, uintptr_t p) { return hash_find(a, p, false); }

/* ---- Taking and returning blocks ------------------------------------------------ */

static inline bool block_is_split(const alloc_block *b) {
    return ((uintptr_t)b->prev | (uintptr_t)b->next) != 0;
}

/* A select, not a branch on the pool, which is as random as the sizes. */
static inline bool should_split(const kiln_caching_allocator *a, const alloc_block *b, size_t size) {
    size_t remaining = b->size - size;
    bool small = remaining >= MIN_BLOCK, large = !is_oversize(a, size) & (remaining > SMALL_SIZE);
    return b->pool == POOL_SMALL ? small : large;
}

/* While blocks await stream events, active (= allocated + pending, see
 * kiln_alloc_stats_fill_all) can peak above what `allocation` records. */
static __attribute__((noinline)) void active_peaks_update(kiln_caching_allocator *a, int pool) {
    kiln_stat *act = a->stats.active, *act_b = a->stats.active_bytes;
    int64_t cur[2], cur_b[2];
    for (int p = 0; p < 2; p++) {
        cur[p] = a->stats.allocation[KILN_POOL_LARGE + p].current + a->pending_blocks[p];
        cur_b[p] = a->stats.allocated_bytes[KILN_POOL_LARGE + p].current + a->pending_bytes[p];
    }
    kiln_stat *p = &act[KILN_POOL_LARGE + pool], *pb = &act_b[KILN_POOL_LARGE + pool];
    p->peak = cur[pool] > p->peak ? cur[pool] : p->peak;
    pb->peak = cur_b[pool] > pb->peak ? cur_b[pool] : pb->peak;
    int64_t all = cur[0] + cur[1], all_b = cur_b[0] + cur_b[1];
    act[KILN_POOL_ALL].peak = all > act[KILN_POOL_ALL].peak ? all : act[KILN_POOL_ALL].peak;
    act_b[KILN_POOL_ALL].peak = all_b > act_b[KILN_POOL_ALL].peak ? all_b : act_b[KILN_POOL_ALL].peak;
}

/* Make free block `b` (out of its bin) a live block of `size` bytes,
 * splitting off the rest when the rules allow. The inactive-split stats move
 * by their net change, as PyTorch's do. */
static inline __attribute__((always_inline)) void block_take(kiln_caching_allocator *a, alloc_block *b,
                                                             size_t size, size_t requested) {
    bool already_split = block_is_split(b);
    int64_t d_count, d_bytes;
    int pool = b->pool;
    alloc_block *rest = should_split(a, b, size) ? block_new(a) : NULL;
    if (rest) { /* a failed record allocation only means no split */
        rest->ptr = b->ptr + size;
        rest->size = b->size - size;
        rest->stream = b->stream;
        rest->seg = b->seg;
        rest->pool = b->pool;
        rest->bins = b->bins;
        rest->prev = b;
        rest->next = b->next;
        if (b->next) b->next->prev = rest;
        b->next = rest;
        b->size = size;
        pool_insert(rest);
        /* Already split: the free bytes shrink by `size`; else one new
         * inactive split block of rest->size. */
        d_count = !already_split;
        d_bytes = already_split ? -(int64_t)size : (int64_t)rest->size;
    } else {
        d_count = -(int64_t)already_split;
        d_bytes = already_split ? -(int64_t)b->size : 0;
    }
    stat_net(a->stats.inactive_split, pool, d_count);
    stat_net(a->stats.inactive_split_bytes, pool, d_bytes);
    b->state = BLOCK_ALLOCATED;
    b->requested = requested;
    hash_insert(a, b);
    stat_inc(a->stats.allocation, pool, 1);
    stat_inc(a->stats.allocated_bytes, pool, (int64_t)b->size);
    stat_inc(a->stats.requested_bytes, pool, (int64_t)requested);
    if (__builtin_expect(a->n_pending != 0, 0)) active_peaks_update(a, pool);
    if (is_oversize(a, b->size)) stat_update(&a->stats.oversize_allocations, 1);
    kiln_alloc_unpoison(a, b->ptr, requested);
}

/* Absorb b's left (merge_prev) or right (merge_next) neighbour when it is
 * free (not live, not awaiting events); returns the bytes absorbed, 0 when
 * there is nothing to merge. */
static inline size_t merge_prev(kiln_caching_allocator *a, alloc_block *b) {
    alloc_block *n = b->prev;
    if (!n || n->state != BLOCK_FREE) return 0;
    pool_remove(n);
    b->ptr = n->ptr;
    b->prev = n->prev;
    if (n->prev)
        n->prev->next = b;
    else
        b->seg->head = b;
    size_t absorbed = n->size;
    b->size += absorbed;
    block_recycle(a, n);
    return absorbed;
}

static inline size_t merge_next(kiln_caching_allocator *a, alloc_block *b) {
    alloc_block *n = b->next;
    if (!n || n->state != BLOCK_FREE) return 0;
    pool_remove(n);
    b->next = n->next;
    if (n->next) n->next->prev = b;
    size_t absorbed = n->size;
    b->size += absorbed;
    block_recycle(a, n);
    return absorbed;
}

/* A block that is neither live nor awaiting events (active, allocation and
 * pending stats already moved): merge it with free neighbours and cache it
 * (or, without caching, release its segment). */
static inline __attribute__((always_inline)) void block_free(kiln_caching_allocator *a, alloc_block *b) {
    int pool = b->pool;
    stat_dec(a->stats.requested_bytes, pool, (int64_t)b->requested);
    size_t absorbed_prev = merge_prev(a, b), absorbed_next = merge_next(a, b);
    /* Each neighbour absorbed was an inactive split block; b becomes one
     * if its segment stays split. */
    bool split = block_is_split(b);
    int64_t d_count = (int64_t)split - (absorbed_prev != 0) - (absorbed_next != 0);
    int64_t d_bytes = (split ? (int64_t)b->size : 0) - (int64_t)(absorbed_prev + absorbed_next);
    stat_net(a->stats.inactive_split, pool, d_count);
    stat_net(a->stats.inactive_split_bytes, pool, d_bytes);
    if (__builtin_expect(a->cfg.caching || split, 1))
        pool_insert(b);
    else
        kiln_alloc_segment_release(a, b);
}

/* A block whose stream events have all completed: no longer active. */
static void block_free_pending(kiln_caching_allocator *a, alloc_block *b) {
    int pool = b->pool;
    if (a->history) kiln_alloc_history_block(a, KILN_ALLOC_ACT_FREE_COMPLETED, b);
    a->pending_blocks[pool]--;
    a->pending_bytes[pool] -= (int64_t)b->size;
    a->active_freed_adjust[pool]++;
    a->active_bytes_freed_adjust[pool] += (int64_t)b->size;
    block_free(a, b);
}

void kiln_alloc_block_free_pending(kiln_caching_allocator *a, alloc_block *b) { block_free_pending(a, b); }

/* Poll the events of blocks freed while in use on other streams; a block
 * whose events have all completed returns to the cache. */
static __attribute__((noinline)) void events_process(kiln_caching_allocator *a) {
    size_t kept = 0;
    for (size_t i = 0; i < a->n_pending; i++) {
        pending_event pe = a->pending[i];
        if (!a->ops.event_query(a->ops.ctx, pe.event)) {
            a->pending[kept++] = pe;
            continue;
        }
        a->ops.event_destroy(a->ops.ctx, pe.event);
        if (--pe.block->event_count == 0) block_free_pending(a, pe.block);
    }
    a->n_pending = kept;
}

/* ---- malloc / free ---------------------------------------------------------------- */

#define OOM_HINT                                                                                             \
    "call kiln_empty_cache, lower the batch size, set KILN_ALLOC_CONF=max_split_size_mb:N "                  \
    "against fragmentation, or turn on gradient checkpointing"

/* Everything after a failed best fit, with the lock held on entry and
 * released on return. Out of line so the hot path carries neither the
 * message buffer nor the stack protector that comes with it. */
static __attribute__((noinline)) kiln_status malloc_slow(kiln_caching_allocator *a, int pool,
                                                         kiln_alloc_stream stream, size_t rounded,
                                                         size_t size, void **ptr) {
    char msg[512];
    msg[0] = '\0';
    alloc_block *b = NULL;
    kiln_status st = kiln_alloc_block_obtain(a, pool, stream, rounded, &b, msg, sizeof msg);
    if (st == KILN_OK) {
        block_take(a, b, rounded, size);
        if (a->history) kiln_alloc_history_alloc(a, b);
        *ptr = (void *)b->ptr;
    } else if (st == KILN_ERR_OUT_OF_MEMORY && a->history) {
        kiln_alloc_history_event(a, KILN_ALLOC_ACT_OOM, 0, rounded, size, pool,
                                 a->ops.stream_id ? a->ops.stream_id(a->ops.ctx, stream) : (uint64_t)stream);
    }
    alloc_unlock(a);
    if (st == KILN_ERR_OUT_OF_MEMORY && msg[0]) return KILN_RAISE(st, OOM_HINT, "%s", msg);
    return st;
}

static __attribute__((noinline)) kiln_status malloc_bad_size(kiln_caching_allocator *a, size_t size,
                                                             void **ptr) {
    char s[32];
    if (!a || !ptr)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "caching allocator malloc: NULL %s",
                          a ? "ptr" : "allocator");
    return KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, "check the size computation",
                      "%s out of memory: request of %s cannot be represented", a->ops.device_name,
                      kiln_format_bytes(size, s, sizeof s));
}

kiln_status kiln_caching_allocator_malloc(kiln_caching_allocator *a, size_t size, kiln_alloc_stream stream,
                                          void **ptr) {
    if (!a || !ptr) return malloc_bad_size(a, size, ptr);
    *ptr = NULL;
    if (size == 0) return KILN_OK;
    /* Plain 512-byte rounding inline ((size + 511) & ~511 is 512 for sizes
     * below 512); power-of-two divisions and overflow out of line. */
    size_t rounded = (size + MIN_BLOCK - 1) & ~(MIN_BLOCK - 1);
    if (__builtin_expect(a->cfg.roundup_power2_divisions > 1 || size > SIZE_MAX - ROUND_LARGE, 0)) {
        rounded = kiln_alloc_round_size(&a->cfg, size);
        if (rounded == SIZE_MAX) return malloc_bad_size(a, size, ptr);
    }
    int pool = rounded <= SMALL_SIZE ? POOL_SMALL : POOL_LARGE;
    alloc_lock(a);
    if (__builtin_expect(a->n_pending != 0, 0)) events_process(a);
    alloc_block *b = a->cfg.caching ? pool_find(a, pool, stream, rounded) : NULL;
    if (__builtin_expect(!b, 0)) return malloc_slow(a, pool, stream, rounded, size, ptr);
    block_take(a, b, rounded, size);
    if (__builtin_expect(a->history != NULL, 0)) kiln_alloc_history_alloc(a, b);
    *ptr = (void *)b->ptr;
    alloc_unlock(a);
    return KILN_OK;
}

/* Record one event per stream the block was used on; all or nothing. */
static kiln_status events_record(kiln_caching_allocator *a, alloc_block *b) {
    if (!a->ops.event_record) return KILN_OK; /* no streams: nothing to wait for */
    if (a->n_pending + b->n_uses > a->cap_pending) {
        size_t cap = (a->n_pending + b->n_uses) * 2;
        pending_event *p = KILN_REALLOC(a->pending, cap * sizeof *p);
        if (!p) return KILN_ERR_OUT_OF_MEMORY;
        a->pending = p;
        a->cap_pending = cap;
    }
    for (uint32_t i = 0; i < b->n_uses; i++) {
        void *ev = NULL;
        kiln_status st = a->ops.event_record(a->ops.ctx, b->uses[i], &ev);
        if (st != KILN_OK) {
            for (uint32_t j = 0; j < i; j++)
                a->ops.event_destroy(a->ops.ctx, a->pending[a->n_pending + j].event);
            return st;
        }
        a->pending[a->n_pending + i] = (pending_event){ev, b};
    }
    a->n_pending += b->n_uses;
    b->event_count = (int)b->n_uses;
    return KILN_OK;
}

/* The free of a block used on other streams: it waits for their events
 * (PENDING, still active) or, with none recorded, is freed at once. */
static __attribute__((noinline)) kiln_status free_with_uses(kiln_caching_allocator *a, alloc_block *b) {
    kiln_status st = events_record(a, b);
    if (st != KILN_OK) {
        hash_insert(a, b); /* the block stays live; the caller may retry */
        return st;
    }
    int pool = b->pool;
    stat_dec(a->stats.allocation, pool, 1);
    stat_dec(a->stats.allocated_bytes, pool, (int64_t)b->size);
    if (is_oversize(a, b->size)) stat_update(&a->stats.oversize_allocations, -1);
    kiln_alloc_poison(a, b->ptr, b->size);
    b->n_uses = 0; /* the uses now live on as events */
    if (a->history) kiln_alloc_history_block(a, KILN_ALLOC_ACT_FREE_REQUESTED, b);
    if (!b->event_count) {
        if (a->history) kiln_alloc_history_block(a, KILN_ALLOC_ACT_FREE_COMPLETED, b);
        block_free(a, b);
        return KILN_OK;
    }
    b->state = BLOCK_PENDING;
    a->pending_blocks[pool]++;
    a->pending_bytes[pool] += (int64_t)b->size;
    a->active_freed_adjust[pool]--;
    a->active_bytes_freed_adjust[pool] -= (int64_t)b->size;
    return KILN_OK;
}

static __attribute__((noinline)) kiln_status free_unknown(kiln_caching_allocator *a, void *ptr) {
    return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "free only pointers this allocator returned, once",
                      "%s allocator: free of %p, which is not a live block (double free or foreign pointer)",
                      a->ops.device_name, ptr);
}

kiln_status kiln_caching_allocator_free(kiln_caching_allocator *a, void *ptr) {
    if (!ptr) return KILN_OK;
    alloc_lock(a);
    alloc_block *b = hash_find(a, (uintptr_t)ptr, true);
    kiln_status st = KILN_OK;
    if (__builtin_expect(!b, 0)) {
        alloc_unlock(a);
        return free_unknown(a, ptr);
    }
    if (__builtin_expect(b->n_uses != 0, 0)) {
        st = free_with_uses(a, b);
    } else {
        int pool = b->pool;
        if (__builtin_expect(a->history != NULL, 0)) {
            kiln_alloc_history_block(a, KILN_ALLOC_ACT_FREE_REQUESTED, b);
            kiln_alloc_history_block(a, KILN_ALLOC_ACT_FREE_COMPLETED, b);
        }
        stat_dec(a->stats.allocation, pool, 1);
        stat_dec(a->stats.allocated_bytes, pool, (int64_t)b->size);
        if (is_oversize(a, b->size)) stat_update(&a->stats.oversize_allocations, -1);
        kiln_alloc_poison(a, b->ptr, b->size);
        block_free(a, b);
    }
    alloc_unlock(a);
    return st;
}

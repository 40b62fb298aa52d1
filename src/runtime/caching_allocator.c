/* The caching allocator: PyTorch's CUDACachingAllocator semantics (see
 * docs/memory.md and reference §1) over raw allocation callbacks.
 *
 * Data structures, chosen so a cached malloc+free pair costs a few hundred
 * instructions (kiln bench alloc measures it):
 * - every piece of a raw segment is a block record, linked prev/next in
 *   address order; records come from slabs and are recycled, so the hot path
 *   never calls malloc;
 * - free blocks of each pool (large, small) sit in a treap ordered by
 *   (stream, size, ptr): best fit is a lower_bound, O(log n) expected;
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

/* ---- Statistics ----------------------------------------------------------------- */

/* The per-pool stat arrays keep their KILN_POOL_ALL entry lazily: only its
 * peak is maintained here (it cannot be derived later); current, allocated
 * and freed are the sums of the two pools, filled in by
 * kiln_alloc_stats_fill_all when the statistics are read. Half the stores
 * on the hot path. Pool entry: KILN_POOL_LARGE + pool. */

static void stat_update(kiln_stat *s, int64_t delta) {
    s->current += delta;
    if (delta > 0) {
        s->allocated += delta;
        if (s->current > s->peak) s->peak = s->current;
    } else {
        s->freed -= delta;
    }
}

static inline void stat_all_peak(kiln_stat *arr) {
    int64_t all = arr[KILN_POOL_LARGE].current + arr[KILN_POOL_SMALL].current;
    arr[KILN_POOL_ALL].peak = all > arr[KILN_POOL_ALL].peak ? all : arr[KILN_POOL_ALL].peak;
}

/* A delta of either sign (the inactive-split stats move by net changes). */
static void stat_pool(kiln_stat *arr, int pool, int64_t delta) {
    if (delta == 0) return;
    stat_update(&arr[KILN_POOL_LARGE + pool], delta);
    if (delta > 0) stat_all_peak(arr);
}

/* The hot-path forms, for changes of known sign: no branches on the sign. */
static inline void stat_inc(kiln_stat *arr, int pool, int64_t n) {
    kiln_stat *p = &arr[KILN_POOL_LARGE + pool];
    p->current += n;
    p->allocated += n;
    p->peak = p->current > p->peak ? p->current : p->peak;
    stat_all_peak(arr);
}

static inline void stat_dec(kiln_stat *arr, int pool, int64_t n) {
    arr[KILN_POOL_LARGE + pool].current -= n;
    arr[KILN_POOL_LARGE + pool].freed += n;
}

static bool is_oversize(const kiln_caching_allocator *a, size_t size) {
    return (uint64_t)size >= a->cfg.max_split_size;
}

/* ---- Block records ------------------------------------------------------------- */

static alloc_block *block_new(kiln_caching_allocator *a) {
    if (!a->spare) {
        if (a->n_slabs == a->cap_slabs) {
            size_t cap = a->cap_slabs ? a->cap_slabs * 2 : 16;
            void **s = KILN_REALLOC(a->slabs, cap * sizeof *s);
            if (!s) return NULL;
            a->slabs = s;
            a->cap_slabs = cap;
        }
        alloc_block *slab = KILN_ALIGNED_ALLOC(64, SLAB_BLOCKS * sizeof *slab);
        if (!slab) return NULL;
        a->slabs[a->n_slabs++] = slab;
        for (int i = 0; i < SLAB_BLOCKS; i++) {
            slab[i].hnext = a->spare;
            a->spare = &slab[i];
        }
    }
    alloc_block *b = a->spare;
    a->spare = b->hnext;
    /* Field by field: a memset of the record compiles to a slow rep stos. */
    b->requested = 0;
    b->prev = b->next = b->child[0] = b->child[1] = b->hnext = NULL;
    b->uses = NULL;
    b->n_uses = b->cap_uses = 0;
    b->event_count = 0;
    b->state = BLOCK_FREE;
    /* xorshift32: treap priorities must be random for O(log n) depth. */
    uint32_t x = a->rng;
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    a->rng = x;
    b->prio = x;
    return b;
}

static void block_recycle(kiln_caching_allocator *a, alloc_block *b) {
    free(b->uses);
    b->uses = NULL;
    b->hnext = a->spare;
    a->spare = b;
}

/* ---- Free-block treap, ordered by (stream, size, ptr) ------------------------------- */

/* Tree descents choose a child by index, with the comparison computed
 * without branches: the direction is random, so a branch would be
 * mispredicted half the time, and those misses dominated malloc. */

/* 1 when block x sorts before the key (stream, size, ptr). */
static inline int key_less(const alloc_block *x, kiln_alloc_stream stream, size_t size, uintptr_t ptr) {
    return (x->stream < stream) |
           ((x->stream == stream) & ((x->size < size) | ((x->size == size) & (x->ptr < ptr))));
}

static inline int block_less(const alloc_block *x, const alloc_block *key) {
    return key_less(x, key->stream, key->size, key->ptr);
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

static void pool_insert(kiln_caching_allocator *a, alloc_block *b) {
    alloc_block **link = &a->free_root[b->pool];
    while (*link && (*link)->prio > b->prio) link = &(*link)->child[block_less(*link, b)];
    treap_split(*link, b, &b->child[0], &b->child[1]);
    *link = b;
    b->state = BLOCK_FREE;
}

/* Unlink b, found at *link (its parent's child pointer or the root). */
static void pool_unlink(alloc_block **link, alloc_block *b) {
    *link = treap_merge(b->child[0], b->child[1]);
    b->child[0] = b->child[1] = NULL;
}

static void pool_remove(kiln_caching_allocator *a, alloc_block *b) {
    alloc_block **link = &a->free_root[b->pool];
    while (*link != b) {
        KILN_ASSERT(*link != NULL);
        link = &(*link)->child[block_less(*link, b)];
    }
    pool_unlink(link, b);
}

/* The link to the smallest free block of `stream` with size >= `size`, or
 * NULL. */
static alloc_block **pool_lower_bound(kiln_caching_allocator *a, int pool, kiln_alloc_stream stream,
                                      size_t size) {
    alloc_block **link = &a->free_root[pool], **best = NULL;
    while (*link) {
        int lt = key_less(*link, stream, size, 0);
        best = lt ? best : link;
        link = &(*link)->child[lt];
    }
    return best && (*best)->stream == stream ? best : NULL;
}

/* Best fit with PyTorch's max_split_size rules: a request below the limit
 * may not take an oversize block; an oversize request may take a block at
 * most LARGE_BUFFER bigger (it will not be split). */
static alloc_block *pool_find(kiln_caching_allocator *a, int pool, kiln_alloc_stream stream, size_t size) {
    alloc_block **link = pool_lower_bound(a, pool, stream, size);
    if (!link) return NULL;
    alloc_block *b = *link;
    if (!is_oversize(a, size) && is_oversize(a, b->size)) return NULL;
    if (is_oversize(a, size) && b->size >= size + LARGE_BUFFER) return NULL;
    pool_unlink(link, b);
    return b;
}

/* ---- Live blocks by address ------------------------------------------------------- */

static size_t hash_ptr(const kiln_caching_allocator *a, uintptr_t p) {
    uint64_t h = (uint64_t)(p >> 9) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 32) & (a->n_buckets - 1);
}

static bool hash_grow(kiln_caching_allocator *a) {
    size_t n = a->n_buckets ? a->n_buckets * 2 : 1024;
    alloc_block **nb = KILN_CALLOC(n, sizeof *nb);
    if (!nb) return false;
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
    return true;
}

static void hash_insert(kiln_caching_allocator *a, alloc_block *b) {
    /* Growth failure only lengthens the chains; the table stays correct. */
    if (a->n_live >= a->n_buckets) (void)hash_grow(a);
    size_t h = hash_ptr(a, b->ptr);
    b->hnext = a->buckets[h];
    a->buckets[h] = b;
    a->n_live++;
}

static alloc_block *hash_find(kiln_caching_allocator *a, uintptr_t p, bool remove) {
    if (!a->n_buckets) return NULL;
    alloc_block **link = &a->buckets[hash_ptr(a, p)];
    for (; *link; link = &(*link)->hnext) {
        alloc_block *b = *link;
        if (b->ptr != p) continue;
        if (remove) {
            *link = b->hnext;
            b->hnext = NULL;
            a->n_live--;
        }
        return b;
    }
    return NULL;
}

/* ---- Segments ------------------------------------------------------------------- */

/* Index of the first segment with base > p. */
static size_t seg_upper(const kiln_caching_allocator *a, uintptr_t p) {
    size_t lo = 0, hi = a->n_segs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (a->segs[mid]->base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

uint64_t kiln_alloc_effective_limit(const kiln_caching_allocator *a) {
    uint64_t l = a->cfg.limit_bytes;
    if (a->fraction_limit && (!l || a->fraction_limit < l)) l = a->fraction_limit;
    return l;
}

/* A new segment of `size` bytes as one free block, not yet in any pool.
 * KILN_ERR_OUT_OF_MEMORY (not raised) when the device or the limit says no. */
static kiln_status segment_alloc(kiln_caching_allocator *a, size_t size, int pool, kiln_alloc_stream stream,
                                 alloc_block **out) {
    uint64_t limit = kiln_alloc_effective_limit(a);
    uint64_t reserved = (uint64_t)(a->stats.reserved_bytes[KILN_POOL_LARGE].current +
                                   a->stats.reserved_bytes[KILN_POOL_SMALL].current);
    if (limit && reserved + size > limit) return KILN_ERR_OUT_OF_MEMORY;
    if (a->n_segs == a->cap_segs) {
        size_t cap = a->cap_segs ? a->cap_segs * 2 : 64;
        alloc_segment **s = KILN_REALLOC(a->segs, cap * sizeof *s);
        if (!s) return KILN_ERR_OUT_OF_MEMORY;
        a->segs = s;
        a->cap_segs = cap;
    }
    alloc_segment *seg = KILN_MALLOC(sizeof *seg);
    alloc_block *b = seg ? block_new(a) : NULL;
    if (!b) {
        free(seg);
        return KILN_ERR_OUT_OF_MEMORY;
    }
    void *p = NULL;
    kiln_status st = a->ops.alloc(a->ops.ctx, size, &p);
    if (st != KILN_OK) {
        free(seg);
        block_recycle(a, b);
        return st;
    }
    *seg = (alloc_segment){.base = (uintptr_t)p, .size = size, .head = b, .pool = (uint8_t)pool};
    b->ptr = (uintptr_t)p;
    b->size = size;
    b->stream = stream;
    b->seg = seg;
    b->pool = (uint8_t)pool;
    size_t at = seg_upper(a, seg->base);
    memmove(&a->segs[at + 1], &a->segs[at], (a->n_segs - at) * sizeof *a->segs);
    a->segs[at] = seg;
    a->n_segs++;
    stat_inc(a->stats.segment, pool, 1);
    stat_inc(a->stats.reserved_bytes, pool, (int64_t)size);
    if (is_oversize(a, size)) stat_update(&a->stats.oversize_segments, 1);
    a->stats.num_device_alloc++;
    kiln_alloc_poison(a, b->ptr, size);
    *out = b;
    return KILN_OK;
}

/* Give an entirely free segment (its one block, out of every pool) back. */
static void segment_release(kiln_caching_allocator *a, alloc_block *b) {
    alloc_segment *seg = b->seg;
    KILN_ASSERT(!b->prev && !b->next && seg->head == b);
    size_t at = seg_upper(a, seg->base) - 1;
    KILN_ASSERT(a->segs[at] == seg);
    memmove(&a->segs[at], &a->segs[at + 1], (a->n_segs - at - 1) * sizeof *a->segs);
    a->n_segs--;
    kiln_alloc_unpoison(a, seg->base, seg->size);
    a->ops.free(a->ops.ctx, (void *)seg->base, seg->size);
    stat_dec(a->stats.segment, seg->pool, 1);
    stat_dec(a->stats.reserved_bytes, seg->pool, (int64_t)seg->size);
    if (is_oversize(a, seg->size)) stat_update(&a->stats.oversize_segments, -1);
    a->stats.num_device_free++;
    block_recycle(a, b);
    free(seg);
}

static bool block_is_split(const alloc_block *b) { return b->prev || b->next; }

/* ---- Taking and returning blocks ------------------------------------------------ */

static bool should_split(const kiln_caching_allocator *a, const alloc_block *b, size_t size) {
    size_t remaining = b->size - size;
    if (b->pool == POOL_SMALL) return remaining >= MIN_BLOCK;
    return !is_oversize(a, size) && remaining > SMALL_SIZE;
}

/* Make free block `b` (out of the pool) a live block of `size` bytes,
 * splitting off the rest when the rules allow. The inactive-split stats move
 * by their net change, as PyTorch's do. */
static void block_take(kiln_caching_allocator *a, alloc_block *b, size_t size, size_t requested) {
    bool already_split = block_is_split(b);
    int64_t d_count = 0, d_bytes = 0;
    alloc_block *rest = should_split(a, b, size) ? block_new(a) : NULL;
    if (rest) { /* a failed record allocation only means no split */
        rest->ptr = b->ptr + size;
        rest->size = b->size - size;
        rest->stream = b->stream;
        rest->seg = b->seg;
        rest->pool = b->pool;
        rest->prev = b;
        rest->next = b->next;
        if (b->next) b->next->prev = rest;
        b->next = rest;
        b->size = size;
        pool_insert(a, rest);
        if (already_split) {
            d_bytes = -(int64_t)size;
        } else {
            d_count = 1;
            d_bytes = (int64_t)rest->size;
        }
    } else if (already_split) {
        d_count = -1;
        d_bytes = -(int64_t)b->size;
    }
    stat_pool(a->stats.inactive_split, b->pool, d_count);
    stat_pool(a->stats.inactive_split_bytes, b->pool, d_bytes);
    b->state = BLOCK_ALLOCATED;
    b->requested = requested;
    hash_insert(a, b);
    stat_inc(a->stats.allocation, b->pool, 1);
    stat_inc(a->stats.allocated_bytes, b->pool, (int64_t)b->size);
    stat_inc(a->stats.active, b->pool, 1);
    stat_inc(a->stats.active_bytes, b->pool, (int64_t)b->size);
    stat_inc(a->stats.requested_bytes, b->pool, (int64_t)requested);
    if (is_oversize(a, b->size)) stat_update(&a->stats.oversize_allocations, 1);
    kiln_alloc_unpoison(a, b->ptr, requested);
}

/* Absorb free neighbour `n` into `b`; returns the bytes absorbed (0 if `n`
 * cannot merge: absent, live, or awaiting events). */
static size_t block_merge(kiln_caching_allocator *a, alloc_block *b, alloc_block *n) {
    if (!n || n->state != BLOCK_FREE) return 0;
    pool_remove(a, n);
    if (n == b->prev) {
        b->ptr = n->ptr;
        b->prev = n->prev;
        if (b->prev) b->prev->next = b;
        if (b->seg->head == n) b->seg->head = b;
    } else {
        b->next = n->next;
        if (b->next) b->next->prev = b;
    }
    size_t absorbed = n->size;
    b->size += absorbed;
    block_recycle(a, n);
    return absorbed;
}

/* A block no longer live nor awaiting events: merge it with free
 * neighbours and cache it (or, without caching, release its segment). */
static void block_free(kiln_caching_allocator *a, alloc_block *b) {
    size_t orig_size = b->size, requested = b->requested;
    int64_t d_count = 0, d_bytes = 0;
    alloc_block *neighbours[2] = {b->prev, b->next};
    for (int i = 0; i < 2; i++) {
        size_t absorbed = block_merge(a, b, neighbours[i]);
        if (absorbed) d_count -= 1, d_bytes -= (int64_t)absorbed;
    }
    int pool = b->pool;
    if (block_is_split(b)) d_count += 1, d_bytes += (int64_t)b->size;
    b->requested = 0;
    if (a->cfg.caching || block_is_split(b))
        pool_insert(a, b);
    else
        segment_release(a, b);
    stat_pool(a->stats.inactive_split, pool, d_count);
    stat_pool(a->stats.inactive_split_bytes, pool, d_bytes);
    stat_dec(a->stats.active, pool, 1);
    stat_dec(a->stats.active_bytes, pool, (int64_t)orig_size);
    stat_dec(a->stats.requested_bytes, pool, (int64_t)requested);
}

/* Poll the events of blocks freed while in use on other streams; a block
 * whose events have all completed returns to the cache. */
static void events_process(kiln_caching_allocator *a) {
    size_t kept = 0;
    for (size_t i = 0; i < a->n_pending; i++) {
        pending_event pe = a->pending[i];
        if (!a->ops.event_query(a->ops.ctx, pe.event)) {
            a->pending[kept++] = pe;
            continue;
        }
        a->ops.event_destroy(a->ops.ctx, pe.event);
        if (--pe.block->event_count == 0) block_free(a, pe.block);
    }
    a->n_pending = kept;
}

void kiln_alloc_events_synchronize(kiln_caching_allocator *a) {
    for (size_t i = 0; i < a->n_pending; i++) {
        pending_event pe = a->pending[i];
        a->ops.event_synchronize(a->ops.ctx, pe.event);
        a->ops.event_destroy(a->ops.ctx, pe.event);
        if (--pe.block->event_count == 0) block_free(a, pe.block);
    }
    a->n_pending = 0;
    a->stats.num_sync_all_streams++;
}

void kiln_alloc_release_unsplit(kiln_caching_allocator *a) {
    for (size_t i = a->n_segs; i-- > 0;) {
        alloc_block *h = a->segs[i]->head;
        if (h->state == BLOCK_FREE && !block_is_split(h)) {
            pool_remove(a, h);
            segment_release(a, h);
        }
    }
}

/* With max_split_size set: release the smallest cached oversize segment of
 * `stream` that covers the request, or else the largest ones until their
 * total does. True when that freed enough. */
static bool release_oversize(kiln_caching_allocator *a, int pool, kiln_alloc_stream stream, size_t size) {
    if (a->cfg.max_split_size == UINT64_MAX) return false;
    size_t key = (uint64_t)size < a->cfg.max_split_size ? (size_t)a->cfg.max_split_size : size;
    alloc_block *best = NULL;
    for (size_t i = 0; i < a->n_segs; i++) {
        alloc_block *h = a->segs[i]->head;
        if (h->state != BLOCK_FREE || block_is_split(h) || h->pool != pool || h->stream != stream) continue;
        if (h->size >= key && (!best || h->size < best->size)) best = h;
    }
    if (best) {
        pool_remove(a, best);
        segment_release(a, best);
        return true;
    }
    size_t released = 0;
    while (released < key) {
        alloc_block *largest = NULL;
        for (size_t i = 0; i < a->n_segs; i++) {
            alloc_block *h = a->segs[i]->head;
            if (h->state != BLOCK_FREE || block_is_split(h) || h->pool != pool || h->stream != stream ||
                !is_oversize(a, h->size))
                continue;
            if (!largest || h->size > largest->size) largest = h;
        }
        if (!largest) break;
        released += largest->size;
        pool_remove(a, largest);
        segment_release(a, largest);
    }
    return released >= key;
}

/* ---- malloc / free ---------------------------------------------------------------- */

/* Steps 2-5 of the ladder, after the best-fit lookup failed: a new
 * segment; then, with max_split_size, dropping cached oversize segments;
 * then waiting for every pending event and dropping every cached unsplit
 * segment. KILN_ERR_OUT_OF_MEMORY (message in `msg`) when all fail. */
static kiln_status block_obtain(kiln_caching_allocator *a, int pool, kiln_alloc_stream stream, size_t rounded,
                                alloc_block **out, char *msg, size_t msg_size) {
    size_t seg_size = a->cfg.caching ? kiln_alloc_segment_size(rounded) : rounded;
    kiln_status st = segment_alloc(a, seg_size, pool, stream, out);
    if (st != KILN_ERR_OUT_OF_MEMORY) return st;
    if (a->cfg.caching && release_oversize(a, pool, stream, rounded)) {
        st = segment_alloc(a, seg_size, pool, stream, out);
        if (st != KILN_ERR_OUT_OF_MEMORY) return st;
    }
    kiln_alloc_events_synchronize(a);
    kiln_alloc_release_unsplit(a);
    a->stats.num_alloc_retries++;
    if (a->cfg.caching && (*out = pool_find(a, pool, stream, rounded)) != NULL) return KILN_OK;
    st = segment_alloc(a, seg_size, pool, stream, out);
    if (st != KILN_ERR_OUT_OF_MEMORY) return st;
    a->stats.num_ooms++;
    kiln_alloc_format_oom(a, seg_size, rounded, msg, msg_size);
    return st;
}

#define OOM_HINT                                                                                             \
    "call kiln_empty_cache, lower the batch size, set KILN_ALLOC_CONF=max_split_size_mb:N "                  \
    "against fragmentation, or turn on gradient checkpointing"

/* Everything after a failed best fit, with the mutex held on entry and
 * released on return. Out of line so the hot path carries neither the
 * message buffer nor the stack protector that comes with it. */
static __attribute__((noinline)) kiln_status malloc_slow(kiln_caching_allocator *a, int pool,
                                                         kiln_alloc_stream stream, size_t rounded,
                                                         size_t size, void **ptr) {
    char msg[512];
    msg[0] = '\0';
    alloc_block *b = NULL;
    kiln_status st = block_obtain(a, pool, stream, rounded, &b, msg, sizeof msg);
    if (st == KILN_OK) {
        block_take(a, b, rounded, size);
        *ptr = (void *)b->ptr;
    }
    pthread_mutex_unlock(&a->mutex);
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
    size_t rounded = kiln_alloc_round_size(&a->cfg, size);
    if (rounded == SIZE_MAX) return malloc_bad_size(a, size, ptr);
    int pool = rounded <= SMALL_SIZE ? POOL_SMALL : POOL_LARGE;
    pthread_mutex_lock(&a->mutex);
    if (a->n_pending) events_process(a);
    alloc_block *b = a->cfg.caching ? pool_find(a, pool, stream, rounded) : NULL;
    if (!b) return malloc_slow(a, pool, stream, rounded, size, ptr);
    block_take(a, b, rounded, size);
    *ptr = (void *)b->ptr;
    pthread_mutex_unlock(&a->mutex);
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

kiln_status kiln_caching_allocator_free(kiln_caching_allocator *a, void *ptr) {
    if (!ptr) return KILN_OK;
    pthread_mutex_lock(&a->mutex);
    alloc_block *b = hash_find(a, (uintptr_t)ptr, true);
    kiln_status st = b && b->n_uses ? events_record(a, b) : KILN_OK;
    if (b && st != KILN_OK) {
        hash_insert(a, b); /* the block stays live; the caller may retry */
    } else if (b) {
        stat_dec(a->stats.allocation, b->pool, 1);
        stat_dec(a->stats.allocated_bytes, b->pool, (int64_t)b->size);
        if (is_oversize(a, b->size)) stat_update(&a->stats.oversize_allocations, -1);
        kiln_alloc_poison(a, b->ptr, b->size);
        b->n_uses = 0; /* the uses now live on as events */
        if (b->event_count) {
            b->state = BLOCK_PENDING;
        } else {
            block_free(a, b);
        }
    }
    pthread_mutex_unlock(&a->mutex);
    if (!b)
        return KILN_RAISE(
            KILN_ERR_INVALID_ARGUMENT, "free only pointers this allocator returned, once",
            "%s allocator: free of %p, which is not a live block (double free or foreign pointer)",
            a->ops.device_name, ptr);
    return st;
}

/* The live block containing `p`, or NULL. */
static alloc_block *block_containing(kiln_caching_allocator *a, uintptr_t p) {
    alloc_block *b = hash_find(a, p, false);
    if (b) return b;
    size_t at = seg_upper(a, p);
    if (at == 0) return NULL;
    alloc_segment *seg = a->segs[at - 1];
    if (p >= seg->base + seg->size) return NULL;
    for (b = seg->head; b; b = b->next)
        if (p >= b->ptr && p < b->ptr + b->size) return b->state == BLOCK_ALLOCATED ? b : NULL;
    return NULL;
}

kiln_status kiln_caching_allocator_record_stream(kiln_caching_allocator *a, void *ptr,
                                                 kiln_alloc_stream stream) {
    pthread_mutex_lock(&a->mutex);
    alloc_block *b = block_containing(a, (uintptr_t)ptr);
    kiln_status st = KILN_OK;
    bool known = b && stream == b->stream;
    for (uint32_t i = 0; b && !known && i < b->n_uses; i++) known = b->uses[i] == stream;
    if (b && !known) {
        if (b->n_uses == b->cap_uses) {
            uint32_t cap = b->cap_uses ? b->cap_uses * 2 : 4;
            kiln_alloc_stream *u = KILN_REALLOC(b->uses, cap * sizeof *u);
            if (u)
                b->uses = u, b->cap_uses = cap;
            else
                st = KILN_ERR_OUT_OF_MEMORY;
        }
        if (st == KILN_OK) b->uses[b->n_uses++] = stream;
    }
    pthread_mutex_unlock(&a->mutex);
    if (!b)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass a pointer into a live block",
                          "%s allocator: record_stream on %p, which is not in a live block",
                          a->ops.device_name, ptr);
    return st;
}

bool kiln_caching_allocator_owns(kiln_caching_allocator *a, const void *ptr) {
    pthread_mutex_lock(&a->mutex);
    bool owns = block_containing(a, (uintptr_t)ptr) != NULL;
    pthread_mutex_unlock(&a->mutex);
    return owns;
}

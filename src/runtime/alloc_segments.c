/* The caching allocator's segments and everything around them that is off
 * the hot path: the per-stream free-block indexes (made with a stream's
 * first segment, freed with its last), raw segment allocation and release,
 * the out-of-memory ladder, and the interior-pointer lookups behind
 * record_stream and owns. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "runtime/alloc_internal.h"

/* ---- Stream records ------------------------------------------------------------ */

/* A linear scan: a program has a handful of streams with cached memory, and
 * the hot path asks here only when the stream differs from the last one. */
alloc_stream_pools *kiln_alloc_stream_pools_lookup(kiln_caching_allocator *a, kiln_alloc_stream stream) {
    for (size_t i = 0; i < a->n_streams; i++) {
        if (a->streams[i]->stream == stream) return a->mru = a->streams[i];
    }
    return NULL;
}

/* The record of `stream`, made if it has none; NULL when host memory is
 * short. */
static alloc_stream_pools *stream_pools_acquire(kiln_caching_allocator *a, kiln_alloc_stream stream) {
    alloc_stream_pools *sp = kiln_alloc_stream_pools_lookup(a, stream);
    if (sp) return sp;
    if (a->n_streams == a->cap_streams) {
        size_t cap = a->cap_streams ? a->cap_streams * 2 : 8;
        alloc_stream_pools **s = KILN_REALLOC(a->streams, cap * sizeof *s);
        if (!s) return NULL;
        a->streams = s;
        a->cap_streams = cap;
    }
    sp = KILN_CALLOC(1, sizeof *sp);
    if (!sp) return NULL;
    sp->stream = stream;
    sp->bins[POOL_SMALL].shift = 9; /* alloc_internal.h */
    sp->bins[POOL_SMALL].base = 1;
    sp->bins[POOL_LARGE].shift = 16;
    sp->bins[POOL_LARGE].base = 16;
    a->streams[a->n_streams++] = sp;
    return a->mru = sp;
}

/* Drop the record of a stream whose last segment went: its bins are empty. */
static void stream_pools_drop(kiln_caching_allocator *a, alloc_stream_pools *sp) {
    KILN_ASSERT(sp->bins[POOL_LARGE].summary == 0 && sp->bins[POOL_SMALL].summary == 0);
    for (size_t i = 0; i < a->n_streams; i++) {
        if (a->streams[i] == sp) {
            a->streams[i] = a->streams[--a->n_streams];
            break;
        }
    }
    if (a->mru == sp) a->mru = NULL;
    free(sp);
}

void kiln_alloc_streams_free(kiln_caching_allocator *a) {
    for (size_t i = 0; i < a->n_streams; i++) free(a->streams[i]);
    free(a->streams);
    a->streams = NULL;
    a->n_streams = a->cap_streams = 0;
    a->mru = NULL;
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

/* A new segment of `size` bytes as one free block, not yet in any bin.
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
    /* Without caching no block ever waits in a bin: no stream record. */
    alloc_stream_pools *sp = a->cfg.caching ? stream_pools_acquire(a, stream) : NULL;
    if (a->cfg.caching && !sp) return KILN_ERR_OUT_OF_MEMORY;
    alloc_segment *seg = KILN_MALLOC(sizeof *seg);
    alloc_block *b = seg ? kiln_alloc_block_new(a) : NULL;
    void *p = NULL;
    kiln_status st = b ? a->ops.alloc(a->ops.ctx, size, &p) : KILN_ERR_OUT_OF_MEMORY;
    if (st != KILN_OK) {
        free(seg);
        if (b) kiln_alloc_block_recycle(a, b);
        if (sp && sp->n_segs == 0) stream_pools_drop(a, sp);
        return st;
    }
    if (sp) sp->n_segs++;
    uint64_t stream_id = a->ops.stream_id ? a->ops.stream_id(a->ops.ctx, stream) : (uint64_t)stream;
    *seg = (alloc_segment){
        .base = (uintptr_t)p, .size = size, .head = b, .sp = sp, .stream_id = stream_id, .pool = (uint8_t)pool};
    b->ptr = (uintptr_t)p;
    b->size = size;
    b->stream = stream;
    b->seg = seg;
    b->pool = (uint8_t)pool;
    b->bins = sp ? &sp->bins[pool] : NULL;
    size_t at = seg_upper(a, seg->base);
    memmove(&a->segs[at + 1], &a->segs[at], (a->n_segs - at) * sizeof *a->segs);
    a->segs[at] = seg;
    a->n_segs++;
    stat_inc(a->stats.segment, pool, 1);
    stat_inc(a->stats.reserved_bytes, pool, (int64_t)size);
    if (is_oversize(a, size)) stat_update(&a->stats.oversize_segments, 1);
    a->stats.num_device_alloc++;
    if (a->history) kiln_alloc_history_event(a, KILN_ALLOC_ACT_SEGMENT_ALLOC, seg->base, size, 0, pool, stream_id);
    kiln_alloc_poison(a, b->ptr, size);
    *out = b;
    return KILN_OK;
}

void kiln_alloc_segment_release(kiln_caching_allocator *a, alloc_block *b) {
    alloc_segment *seg = b->seg;
    KILN_ASSERT(!b->prev && !b->next && seg->head == b);
    size_t at = seg_upper(a, seg->base) - 1;
    KILN_ASSERT(a->segs[at] == seg);
    memmove(&a->segs[at], &a->segs[at + 1], (a->n_segs - at - 1) * sizeof *a->segs);
    a->n_segs--;
    if (a->history)
        kiln_alloc_history_event(a, KILN_ALLOC_ACT_SEGMENT_FREE, seg->base, seg->size, 0, seg->pool, seg->stream_id);
    kiln_alloc_unpoison(a, seg->base, seg->size);
    a->ops.free(a->ops.ctx, (void *)seg->base, seg->size);
    stat_dec(a->stats.segment, seg->pool, 1);
    stat_dec(a->stats.reserved_bytes, seg->pool, (int64_t)seg->size);
    if (is_oversize(a, seg->size)) stat_update(&a->stats.oversize_segments, -1);
    a->stats.num_device_free++;
    if (seg->sp && --seg->sp->n_segs == 0) stream_pools_drop(a, seg->sp);
    kiln_alloc_block_recycle(a, b);
    free(seg);
}

static bool block_is_split(const alloc_block *b) { return b->prev || b->next; }

/* ---- Recovery ------------------------------------------------------------------- */

void kiln_alloc_events_synchronize(kiln_caching_allocator *a) {
    for (size_t i = 0; i < a->n_pending; i++) {
        pending_event pe = a->pending[i];
        a->ops.event_synchronize(a->ops.ctx, pe.event);
        a->ops.event_destroy(a->ops.ctx, pe.event);
        if (--pe.block->event_count == 0) kiln_alloc_block_free_pending(a, pe.block);
    }
    a->n_pending = 0;
    a->stats.num_sync_all_streams++;
}

void kiln_alloc_release_unsplit(kiln_caching_allocator *a) {
    for (size_t i = a->n_segs; i-- > 0;) {
        alloc_block *h = a->segs[i]->head;
        if (h->state == BLOCK_FREE && !block_is_split(h)) {
            kiln_alloc_pool_remove(h);
            kiln_alloc_segment_release(a, h);
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
        kiln_alloc_pool_remove(best);
        kiln_alloc_segment_release(a, best);
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
        kiln_alloc_pool_remove(largest);
        kiln_alloc_segment_release(a, largest);
    }
    return released >= key;
}

/* Steps 2-6 of the ladder, after the best-fit lookup failed: a new
 * segment; then, with max_split_size, dropping cached oversize segments;
 * then waiting for every pending event and dropping every cached unsplit
 * segment; last, where the segment would have been bigger than the
 * request (a large request under 10 MiB gets a 20 MiB segment), a segment
 * of just the request. PyTorch stops before that last step, so under a
 * limit of, say, 16 MiB it refuses any request over 1 MiB; Kiln then
 * serves it as long as the request itself fits (a step that shrank its
 * micro-batch after an out-of-memory can then run). */
kiln_status kiln_alloc_block_obtain(kiln_caching_allocator *a, int pool, kiln_alloc_stream stream,
                                    size_t rounded, alloc_block **out, char *msg, size_t msg_size) {
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
    if (a->cfg.caching && (*out = kiln_alloc_pool_find(a, pool, stream, rounded)) != NULL) return KILN_OK;
    st = segment_alloc(a, seg_size, pool, stream, out);
    if (st != KILN_ERR_OUT_OF_MEMORY) return st;
    if (seg_size > rounded) {
        st = segment_alloc(a, rounded, pool, stream, out);
        if (st != KILN_ERR_OUT_OF_MEMORY) return st;
    }
    a->stats.num_ooms++;
    kiln_alloc_format_oom(a, seg_size, rounded, msg, msg_size);
    return st;
}

/* ---- Interior pointers -------------------------------------------------------------- */

/* The live block containing `p`, or NULL. */
static alloc_block *block_containing(kiln_caching_allocator *a, uintptr_t p) {
    alloc_block *b = kiln_alloc_live_find(a, p);
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
    alloc_lock(a);
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
    alloc_unlock(a);
    if (!b)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass a pointer into a live block",
                          "%s allocator: record_stream on %p, which is not in a live block",
                          a->ops.device_name, ptr);
    return st;
}

void kiln_caching_allocator_forget_stream(kiln_caching_allocator *a, kiln_alloc_stream stream) {
    alloc_lock(a);
    for (size_t s = 0; s < a->n_segs; s++)
        for (alloc_block *b = a->segs[s]->head; b; b = b->next) {
            if (b->state != BLOCK_ALLOCATED) continue;
            uint32_t kept = 0;
            for (uint32_t i = 0; i < b->n_uses; i++)
                if (b->uses[i] != stream) b->uses[kept++] = b->uses[i];
            b->n_uses = kept;
        }
    alloc_unlock(a);
}

bool kiln_caching_allocator_owns(kiln_caching_allocator *a, const void *ptr) {
    alloc_lock(a);
    bool owns = block_containing(a, (uintptr_t)ptr) != NULL;
    alloc_unlock(a);
    return owns;
}

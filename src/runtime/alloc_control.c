/* The caching allocator's lifetime, cache control, limits and statistics,
 * and the waiting side of its lock: everything off the malloc/free hot path
 * (which is caching_allocator.c). */
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "runtime/alloc_internal.h"

void kiln_alloc_format_oom(kiln_caching_allocator *a, size_t seg_size, size_t rounded, char *msg, size_t n) {
    char s1[32], s2[32], s3[32], s4[32], s5[32], s6[32], s7[32];
    size_t free_b = 0, total_b = 0;
    bool have_info = a->ops.mem_info && a->ops.mem_info(a->ops.ctx, &free_b, &total_b) == KILN_OK;
    kiln_alloc_stats_fill_all(a);
    int64_t alloc_b = a->stats.allocated_bytes[KILN_POOL_ALL].current;
    int64_t reserved_b = a->stats.reserved_bytes[KILN_POOL_ALL].current;
    int len = snprintf(msg, n, "%s out of memory: tried to allocate %s (request %s); ",
                       a->ops.device_name ? a->ops.device_name : "device",
                       kiln_format_bytes(seg_size, s1, sizeof s1), kiln_format_bytes(rounded, s2, sizeof s2));
    if (len < 0 || (size_t)len >= n) return;
    if (have_info)
        len += snprintf(msg + len, n - (size_t)len, "%s free of %s; ",
                        kiln_format_bytes(free_b, s3, sizeof s3), kiln_format_bytes(total_b, s4, sizeof s4));
    else
        len += snprintf(msg + len, n - (size_t)len, "free and total memory unknown; ");
    if (len < 0 || (size_t)len >= n) return;
    len += snprintf(msg + len, n - (size_t)len, "%s allocated by kiln, %s reserved by kiln but unallocated",
                    kiln_format_bytes((uint64_t)alloc_b, s5, sizeof s5),
                    kiln_format_bytes((uint64_t)(reserved_b - alloc_b), s6, sizeof s6));
    if (len < 0 || (size_t)len >= n) return;
    uint64_t limit = kiln_alloc_effective_limit(a);
    if (limit) snprintf(msg + len, n - (size_t)len, "; limit %s", kiln_format_bytes(limit, s7, sizeof s7));
}

/* Contended: spin, then yield, then nap (alloc_internal.h says why). */
void kiln_alloc_lock_wait(kiln_caching_allocator *a) {
    long nap_ns = 1000;
    for (unsigned n = 0;; n++) {
        if (__atomic_load_n(&a->lock, __ATOMIC_RELAXED) == 0 &&
            __atomic_exchange_n(&a->lock, 1, __ATOMIC_ACQUIRE) == 0)
            return;
        if (n < 100) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        } else if (n < 200) {
            sched_yield();
        } else {
            struct timespec nap = {0, nap_ns};
            nanosleep(&nap, NULL);
            nap_ns = nap_ns < 1000000 ? nap_ns * 2 : nap_ns;
        }
    }
}

/* ---- Lifetime, cache control, statistics ------------------------------------------ */

static kiln_status fraction_limit_compute(kiln_caching_allocator *a, double fraction, uint64_t *out) {
    *out = 0;
    if (fraction == 0) return KILN_OK;
    if (!(fraction > 0 && fraction <= 1))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use a fraction in (0, 1], or 0 for none",
                          "%s allocator: memory fraction %g is out of range", a->ops.device_name, fraction);
    size_t free_b = 0, total_b = 0;
    if (!a->ops.mem_info || a->ops.mem_info(a->ops.ctx, &free_b, &total_b) != KILN_OK)
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "set an absolute limit (limit_mb) instead",
                          "%s allocator: memory fraction needs the device's total memory, which is unknown",
                          a->ops.device_name);
    *out = (uint64_t)(fraction * (double)total_b);
    return KILN_OK;
}

kiln_caching_allocator *kiln_caching_allocator_create(const kiln_raw_ops *ops, const kiln_alloc_config *cfg) {
    if (!ops || !ops->alloc || !ops->free) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "caching allocator: raw ops need alloc and free");
        return NULL;
    }
    if (ops->event_record && (!ops->event_query || !ops->event_synchronize || !ops->event_destroy)) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL,
                   "caching allocator: event_record needs event_query, event_synchronize and event_destroy");
        return NULL;
    }
    kiln_caching_allocator *a = KILN_CALLOC(1, sizeof *a);
    if (!a) return NULL;
    a->ops = *ops;
    if (!a->ops.device_name) a->ops.device_name = "device";
    a->cfg = cfg ? *cfg : kiln_alloc_config_default();
    if (a->cfg.max_split_size == 0) a->cfg.max_split_size = UINT64_MAX;
    a->rng = 0x9E3779B9u;
#ifdef KILN_ALLOC_ASAN
    a->poison = ops->host_accessible;
#endif
    if (fraction_limit_compute(a, a->cfg.fraction, &a->fraction_limit) != KILN_OK) {
        free(a);
        return NULL;
    }
    a->stats.max_split_size = a->cfg.max_split_size;
    return a;
}

void kiln_caching_allocator_destroy(kiln_caching_allocator *a) {
    if (!a) return;
    for (size_t i = 0; i < a->n_pending; i++) a->ops.event_destroy(a->ops.ctx, a->pending[i].event);
    for (size_t i = 0; i < a->n_segs; i++) {
        alloc_segment *seg = a->segs[i];
        for (alloc_block *b = seg->head; b; b = b->next) free(b->uses);
        kiln_alloc_unpoison(a, seg->base, seg->size);
        a->ops.free(a->ops.ctx, (void *)seg->base, seg->size);
        free(seg);
    }
    kiln_alloc_history_free(a);
    for (size_t i = 0; i < a->n_slabs; i++) kiln_aligned_free(a->slabs[i]);
    free(a->slabs);
    free(a->segs);
    free(a->pending);
    free(a->buckets);
    kiln_alloc_streams_free(a);
    free(a);
}

kiln_status kiln_caching_allocator_empty_cache(kiln_caching_allocator *a) {
    alloc_lock(a);
    kiln_alloc_events_synchronize(a);
    kiln_alloc_release_unsplit(a);
    alloc_unlock(a);
    return KILN_OK;
}

/* The per-pool stat arrays, `allocation` to `inactive_split_bytes`, as one
 * array: they precede the two oversize stats. */
_Static_assert(offsetof(kiln_memory_stats, oversize_allocations) - offsetof(kiln_memory_stats, allocation) ==
                   KILN_ALLOC_POOL_STATS * sizeof(kiln_stat[KILN_POOL_KIND_COUNT]),
               "KILN_ALLOC_POOL_STATS does not match kiln_memory_stats");
static kiln_stat (*pool_stats(kiln_memory_stats *s))[KILN_POOL_KIND_COUNT] { return &s->allocation; }

void kiln_alloc_stats_fill_all(kiln_caching_allocator *a) {
    kiln_memory_stats *s = &a->stats;
    kiln_stat(*arr)[KILN_POOL_KIND_COUNT] = pool_stats(s);
    for (size_t i = 0; i < KILN_ALLOC_POOL_STATS; i++) {
        for (int p = 0; p < 2; p++) {
            kiln_stat *st = &arr[i][KILN_POOL_LARGE + p];
            st->freed = a->stats_base[i][p] + st->allocated - st->current;
        }
    }
    for (int p = 0; p < 2; p++) {
        const kiln_stat *n = &s->allocation[KILN_POOL_LARGE + p],
                        *nb = &s->allocated_bytes[KILN_POOL_LARGE + p];
        kiln_stat *ac = &s->active[KILN_POOL_LARGE + p], *acb = &s->active_bytes[KILN_POOL_LARGE + p];
        ac->current = n->current + a->pending_blocks[p];
        ac->allocated = n->allocated;
        ac->freed = n->freed + a->active_freed_adjust[p];
        ac->peak = max_i64(ac->peak, n->peak);
        acb->current = nb->current + a->pending_bytes[p];
        acb->allocated = nb->allocated;
        acb->freed = nb->freed + a->active_bytes_freed_adjust[p];
        acb->peak = max_i64(acb->peak, nb->peak);
    }
    for (size_t i = 0; i < KILN_ALLOC_POOL_STATS; i++) {
        kiln_stat *all = &arr[i][KILN_POOL_ALL], *l = &arr[i][KILN_POOL_LARGE],
                  *sm = &arr[i][KILN_POOL_SMALL];
        all->current = l->current + sm->current;
        all->allocated = l->allocated + sm->allocated;
        all->freed = l->freed + sm->freed;
    }
    s->active[KILN_POOL_ALL].peak = max_i64(s->active[KILN_POOL_ALL].peak, s->allocation[KILN_POOL_ALL].peak);
    s->active_bytes[KILN_POOL_ALL].peak =
        max_i64(s->active_bytes[KILN_POOL_ALL].peak, s->allocated_bytes[KILN_POOL_ALL].peak);
}

void kiln_caching_allocator_stats(kiln_caching_allocator *a, kiln_memory_stats *out) {
    alloc_lock(a);
    kiln_alloc_stats_fill_all(a);
    *out = a->stats;
    out->max_split_size = a->cfg.max_split_size;
    out->limit_bytes = kiln_alloc_effective_limit(a);
    alloc_unlock(a);
}

/* Every kiln_stat of `s`, as one array: they precede the counters. */
static kiln_stat *stats_begin(kiln_memory_stats *s, size_t *count) {
    *count = (size_t)((char *)&s->num_alloc_retries - (char *)s) / sizeof(kiln_stat);
    return (kiln_stat *)(void *)s;
}

void kiln_caching_allocator_reset_peak(kiln_caching_allocator *a) {
    alloc_lock(a);
    kiln_alloc_stats_fill_all(a);
    size_t n;
    kiln_stat *s = stats_begin(&a->stats, &n);
    for (size_t i = 0; i < n; i++) s[i].peak = s[i].current;
    if (a->history) kiln_alloc_history_event(a, KILN_ALLOC_ACT_RESET_PEAK, 0, 0, 0, 0, 0);
    alloc_unlock(a);
}

void kiln_caching_allocator_reset_accumulated(kiln_caching_allocator *a) {
    alloc_lock(a);
    size_t n;
    kiln_stat *s = stats_begin(&a->stats, &n);
    for (size_t i = 0; i < n; i++) s[i].allocated = s[i].freed = 0;
    kiln_stat(*arr)[KILN_POOL_KIND_COUNT] = pool_stats(&a->stats);
    for (size_t i = 0; i < KILN_ALLOC_POOL_STATS; i++)
        for (int p = 0; p < 2; p++) a->stats_base[i][p] = arr[i][KILN_POOL_LARGE + p].current;
    for (int p = 0; p < 2; p++) a->active_freed_adjust[p] = a->active_bytes_freed_adjust[p] = 0;
    a->stats.num_alloc_retries = a->stats.num_ooms = a->stats.num_sync_all_streams = 0;
    a->stats.num_device_alloc = a->stats.num_device_free = 0;
    if (a->history) kiln_alloc_history_event(a, KILN_ALLOC_ACT_RESET_ACCUMULATED, 0, 0, 0, 0, 0);
    alloc_unlock(a);
}

kiln_status kiln_caching_allocator_set_limit(kiln_caching_allocator *a, uint64_t bytes) {
    alloc_lock(a);
    a->cfg.limit_bytes = bytes;
    alloc_unlock(a);
    return KILN_OK;
}

kiln_status kiln_caching_allocator_set_fraction(kiln_caching_allocator *a, double fraction) {
    alloc_lock(a);
    uint64_t limit = 0;
    kiln_status st = fraction_limit_compute(a, fraction, &limit);
    if (st == KILN_OK) {
        a->cfg.fraction = fraction;
        a->fraction_limit = limit;
    }
    alloc_unlock(a);
    return st;
}

/* The caching allocator's memory history and snapshots: PyTorch's
 * _record_memory_history / _snapshot (reference §1, docs/memory.md).
 *
 * While recording, the allocator calls in here (lock held) for every alloc,
 * free_requested, free_completed, segment_alloc, segment_free, oom and
 * statistics reset; off, it pays one branch on a->history. Entries go to a
 * ring buffer of max_entries. The history also keeps a baseline: the
 * statistics as they were before its oldest entry (copied from the
 * allocator when recording starts; an entry pushed out of the ring is
 * applied to it). So baseline + trace replays to the allocator's
 * statistics exactly, wrap or not, and `kiln report` can draw the memory
 * of the blocks allocated before the trace began.
 *
 * Each allocation's context (the op the dispatcher runs, the user's
 * file:line) comes from a provider the ops layer registers; contexts are
 * interned, and a live block remembers its context id (alloc_block.ctx) so
 * the snapshot can name the site of every live block. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "runtime/alloc_internal.h"
#include "runtime/runtime_internal.h"

/* ---- Context provider ------------------------------------------------------------ */

static void (*context_provider)(kiln_alloc_context *out);

void kiln_alloc_set_context_provider(void (*provider)(kiln_alloc_context *out)) {
    __atomic_store_n(&context_provider, provider, __ATOMIC_RELEASE);
}

/* ---- State: the statistics the trace replays ------------------------------------- */

enum {
    ST_ALLOCATED_BYTES,
    ST_REQUESTED_BYTES,
    ST_RESERVED_BYTES,
    ST_ALLOCATION,
    ST_SEGMENT,
    ST_ACTIVE,
    ST_ACTIVE_BYTES,
    ST_COUNT
};
static const char *const stat_names[ST_COUNT] = {"allocated_bytes", "requested_bytes", "reserved_bytes",
                                                 "allocation",      "segment",         "active",
                                                 "active_bytes"};

/* Per stat: current and total allocated per pool (POOL_LARGE, POOL_SMALL),
 * peak per pool and for both pools (index 2). Active peaks are not kept
 * (the allocator derives them lazily); their current and totals are. */
typedef struct hist_state {
    int64_t cur[ST_COUNT][2], total[ST_COUNT][2], peak[ST_COUNT][3];
    int64_t num_device_alloc, num_device_free, num_ooms;
} hist_state;

static const kiln_stat *stat_array(const kiln_memory_stats *s, int st) {
    switch (st) {
    case ST_ALLOCATED_BYTES:
        return s->allocated_bytes;
    case ST_REQUESTED_BYTES:
        return s->requested_bytes;
    case ST_RESERVED_BYTES:
        return s->reserved_bytes;
    case ST_ALLOCATION:
        return s->allocation;
    case ST_SEGMENT:
        return s->segment;
    case ST_ACTIVE:
        return s->active;
    default:
        return s->active_bytes;
    }
}

static void state_from_stats(const kiln_memory_stats *s, hist_state *out) {
    memset(out, 0, sizeof *out);
    for (int st = 0; st < ST_COUNT; st++) {
        const kiln_stat *arr = stat_array(s, st);
        for (int p = 0; p < 2; p++) {
            out->cur[st][p] = arr[KILN_POOL_LARGE + p].current;
            out->total[st][p] = arr[KILN_POOL_LARGE + p].allocated;
            out->peak[st][p] = arr[KILN_POOL_LARGE + p].peak;
        }
        out->peak[st][2] = arr[KILN_POOL_ALL].peak;
    }
    out->num_device_alloc = s->num_device_alloc;
    out->num_device_free = s->num_device_free;
    out->num_ooms = s->num_ooms;
}

static void state_inc(hist_state *s, int st, int p, int64_t n) {
    s->cur[st][p] += n;
    s->total[st][p] += n;
    if (s->cur[st][p] > s->peak[st][p]) s->peak[st][p] = s->cur[st][p];
    int64_t all = s->cur[st][0] + s->cur[st][1];
    if (all > s->peak[st][2]) s->peak[st][2] = all;
}

typedef struct hist_entry {
    uint8_t action, pool;
    uint32_t ctx;
    uint64_t addr, size, requested, stream, time_ns, seq;
} hist_entry;

/* The effect of one entry on the statistics: the allocator's own updates,
 * restated per action. */
static void state_apply(hist_state *s, const hist_entry *e) {
    int p = e->pool & 1;
    int64_t size = (int64_t)e->size, req = (int64_t)e->requested;
    switch (e->action) {
    case KILN_ALLOC_ACT_ALLOC:
        state_inc(s, ST_ALLOCATION, p, 1);
        state_inc(s, ST_ALLOCATED_BYTES, p, size);
        state_inc(s, ST_REQUESTED_BYTES, p, req);
        state_inc(s, ST_ACTIVE, p, 1);
        state_inc(s, ST_ACTIVE_BYTES, p, size);
        break;
    case KILN_ALLOC_ACT_FREE_REQUESTED:
        s->cur[ST_ALLOCATION][p] -= 1;
        s->cur[ST_ALLOCATED_BYTES][p] -= size;
        break;
    case KILN_ALLOC_ACT_FREE_COMPLETED:
        s->cur[ST_REQUESTED_BYTES][p] -= req;
        s->cur[ST_ACTIVE][p] -= 1;
        s->cur[ST_ACTIVE_BYTES][p] -= size;
        break;
    case KILN_ALLOC_ACT_SEGMENT_ALLOC:
        state_inc(s, ST_SEGMENT, p, 1);
        state_inc(s, ST_RESERVED_BYTES, p, size);
        s->num_device_alloc++;
        break;
    case KILN_ALLOC_ACT_SEGMENT_FREE:
        s->cur[ST_SEGMENT][p] -= 1;
        s->cur[ST_RESERVED_BYTES][p] -= size;
        s->num_device_free++;
        break;
    case KILN_ALLOC_ACT_OOM:
        s->num_ooms++;
        break;
    case KILN_ALLOC_ACT_RESET_PEAK:
        for (int st = 0; st < ST_COUNT; st++) {
            s->peak[st][0] = s->cur[st][0];
            s->peak[st][1] = s->cur[st][1];
            s->peak[st][2] = s->cur[st][0] + s->cur[st][1];
        }
        break;
    case KILN_ALLOC_ACT_RESET_ACCUMULATED:
        memset(s->total, 0, sizeof s->total);
        s->num_device_alloc = s->num_device_free = s->num_ooms = 0;
        break;
    default:
        break;
    }
}

static const char *const action_names[KILN_ALLOC_ACT_COUNT] = {
    "alloc", "free_requested", "free_completed",   "segment_alloc", "segment_free",
    "oom",   "reset_peak",     "reset_accumulated"};

/* ---- The history ------------------------------------------------------------------ */

typedef struct kiln_alloc_history {
    hist_entry *ring;
    size_t cap, head, count; /* oldest entry at head */
    uint64_t seq;            /* entries recorded since the start */
    uint64_t start_ns;
    hist_state base;          /* the statistics before ring[head] */
    kiln_alloc_context *ctxs; /* interned contexts; id i + 1 is ctxs[i] */
    uint32_t n_ctx, cap_ctx;
    uint32_t *slots;  /* open addressing over ctxs: id, 0 empty */
    uint32_t n_slots; /* power of two */
} kiln_alloc_history;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint32_t ctx_hash(const kiln_alloc_context *c) {
    uint64_t h = (uint64_t)(uintptr_t)c->op * 0x9E3779B97F4A7C15ull;
    h ^= ((uint64_t)(uintptr_t)c->file + (uint64_t)(uint32_t)c->line) * 0xC2B2AE3D27D4EB4Full;
    return (uint32_t)(h >> 32);
}

static bool ctx_equal(const kiln_alloc_context *x, const kiln_alloc_context *y) {
    return x->op == y->op && x->file == y->file && x->line == y->line;
}

static bool ctx_slots_grow(kiln_alloc_history *h) {
    uint32_t n = h->n_slots ? h->n_slots * 2 : 256;
    uint32_t *slots = calloc(n, sizeof *slots);
    if (!slots) return false;
    for (uint32_t i = 0; i < h->n_ctx; i++) {
        uint32_t j = ctx_hash(&h->ctxs[i]) & (n - 1);
        while (slots[j]) j = (j + 1) & (n - 1);
        slots[j] = i + 1;
    }
    free(h->slots);
    h->slots = slots;
    h->n_slots = n;
    return true;
}

/* The id of the calling thread's context, interned; 0 when unknown or
 * when host memory is short (the entry is then recorded without one). */
static uint32_t ctx_current(kiln_alloc_history *h) {
    void (*provider)(kiln_alloc_context *) = __atomic_load_n(&context_provider, __ATOMIC_ACQUIRE);
    if (!provider) return 0;
    kiln_alloc_context c = {NULL, NULL, 0};
    provider(&c);
    if (!c.op && !c.file) return 0;
    if (!c.file) c.line = 0;
    if ((h->n_ctx + 1) * 2 > h->n_slots && !ctx_slots_grow(h)) return 0;
    uint32_t j = ctx_hash(&c) & (h->n_slots - 1);
    for (; h->slots[j]; j = (j + 1) & (h->n_slots - 1))
        if (ctx_equal(&h->ctxs[h->slots[j] - 1], &c)) return h->slots[j];
    if (h->n_ctx == h->cap_ctx) {
        uint32_t cap = h->cap_ctx ? h->cap_ctx * 2 : 64;
        kiln_alloc_context *ctxs = realloc(h->ctxs, cap * sizeof *ctxs);
        if (!ctxs) return 0;
        h->ctxs = ctxs;
        h->cap_ctx = cap;
    }
    h->ctxs[h->n_ctx++] = c;
    h->slots[j] = h->n_ctx;
    return h->n_ctx;
}

static void history_push(kiln_alloc_history *h, const hist_entry *e) {
    if (h->count == h->cap) { /* full: the oldest entry moves into the baseline */
        state_apply(&h->base, &h->ring[h->head]);
        h->head = h->head + 1 == h->cap ? 0 : h->head + 1;
        h->count--;
    }
    size_t at = h->head + h->count;
    if (at >= h->cap) at -= h->cap;
    h->ring[at] = *e;
    h->ring[at].seq = h->seq++;
    h->ring[at].time_ns = now_ns();
    h->count++;
}

void kiln_alloc_history_block(kiln_caching_allocator *a, kiln_alloc_action action, const alloc_block *b) {
    hist_entry e = {.action = (uint8_t)action,
                    .pool = b->pool,
                    .ctx = action == KILN_ALLOC_ACT_ALLOC ? b->ctx : ctx_current(a->history),
                    .addr = (uint64_t)b->ptr,
                    .size = b->size,
                    .requested = b->requested,
                    .stream = b->seg->stream_id};
    history_push(a->history, &e);
}

void kiln_alloc_history_alloc(kiln_caching_allocator *a, alloc_block *b) {
    b->ctx = ctx_current(a->history);
    kiln_alloc_history_block(a, KILN_ALLOC_ACT_ALLOC, b);
}

void kiln_alloc_history_event(kiln_caching_allocator *a, kiln_alloc_action action, uintptr_t addr,
                              size_t size, size_t requested, int pool, uint64_t stream_id) {
    hist_entry e = {.action = (uint8_t)action,
                    .pool = (uint8_t)pool,
                    .ctx = action == KILN_ALLOC_ACT_OOM ? ctx_current(a->history) : 0,
                    .addr = (uint64_t)addr,
                    .size = size,
                    .requested = requested,
                    .stream = stream_id};
    history_push(a->history, &e);
}

static void history_destroy(kiln_alloc_history *h) {
    if (!h) return;
    free(h->ring);
    free(h->ctxs);
    free(h->slots);
    free(h);
}

void kiln_alloc_history_free(kiln_caching_allocator *a) {
    history_destroy(a->history);
    a->history = NULL;
}

kiln_status kiln_caching_allocator_record_history(kiln_caching_allocator *a, bool enabled,
                                                  size_t max_entries) {
    if (!a) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "record_history: NULL allocator");
    kiln_alloc_history *h = NULL;
    if (enabled) {
        if (max_entries == 0) max_entries = KILN_MEMORY_HISTORY_DEFAULT_ENTRIES;
        if (max_entries > SIZE_MAX / sizeof(hist_entry))
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass a smaller max_entries, or 0 for the default",
                              "%s allocator: memory history of %zu entries is too large", a->ops.device_name,
                              max_entries);
        h = KILN_CALLOC(1, sizeof *h);
        if (h) h->ring = KILN_MALLOC(max_entries * sizeof *h->ring);
        if (!h || !h->ring) {
            free(h);
            char s[32];
            return KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, "pass a smaller max_entries",
                              "%s allocator: no host memory for a history of %zu entries (%s)",
                              a->ops.device_name, max_entries,
                              kiln_format_bytes(max_entries * sizeof(hist_entry), s, sizeof s));
        }
        h->cap = max_entries;
        h->start_ns = now_ns();
    }
    alloc_lock(a);
    kiln_alloc_history *old = a->history;
    if (h) {
        kiln_alloc_stats_fill_all(a);
        state_from_stats(&a->stats, &h->base);
        /* Live blocks from before have no context in this history. */
        for (size_t i = 0; i < a->n_segs; i++)
            for (alloc_block *b = a->segs[i]->head; b; b = b->next) b->ctx = 0;
    }
    a->history = h;
    alloc_unlock(a);
    history_destroy(old);
    return KILN_OK;
}

bool kiln_caching_allocator_history_enabled(kiln_caching_allocator *a) {
    if (!a) return false;
    alloc_lock(a);
    bool on = a->history != NULL;
    alloc_unlock(a);
    return on;
}

/* ---- Snapshot JSON ------------------------------------------------------------------- */

typedef struct jbuf {
    char *data;
    size_t len, cap;
    bool failed;
} jbuf;

static void jb_reserve(jbuf *b, size_t n) {
    if (b->failed || b->len + n + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 1 << 16;
    while (cap < b->len + n + 1) cap *= 2;
    char *d = realloc(b->data, cap);
    if (!d) {
        b->failed = true;
        return;
    }
    b->data = d;
    b->cap = cap;
}

static void jb_printf(jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void jb_printf(jbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof tmp) n = (int)sizeof tmp - 1; /* callers print numbers and short keys */
    jb_reserve(b, (size_t)n);
    if (b->failed) return;
    memcpy(b->data + b->len, tmp, (size_t)n);
    b->len += (size_t)n;
    b->data[b->len] = '\0';
}

/* A JSON string: quotes, backslashes and control characters escaped. */
static void jb_str(jbuf *b, const char *s) {
    jb_reserve(b, strlen(s) * 6 + 2);
    if (b->failed) return;
    char *o = b->data + b->len;
    *o++ = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            *o++ = '\\';
            *o++ = (char)*p;
        } else if (*p < 0x20) {
            o += sprintf(o, "\\u%04x", *p);
        } else {
            *o++ = (char)*p;
        }
    }
    *o++ = '"';
    b->len = (size_t)(o - b->data);
    b->data[b->len] = '\0';
}

static void jb_state(jbuf *b, const hist_state *s) {
    jb_printf(b, "{");
    for (int st = 0; st < ST_COUNT; st++) {
        bool active = st == ST_ACTIVE || st == ST_ACTIVE_BYTES; /* no peaks kept: see hist_state */
        jb_printf(b, "%s\"%s\":{", st ? "," : "", stat_names[st]);
        static const char *const pools[3] = {"large", "small", "all"};
        for (int p = 0; p < 3; p++) {
            int64_t cur = p < 2 ? s->cur[st][p] : s->cur[st][0] + s->cur[st][1];
            int64_t tot = p < 2 ? s->total[st][p] : s->total[st][0] + s->total[st][1];
            jb_printf(b, "%s\"%s\":{\"current\":%lld,\"allocated\":%lld", p ? "," : "", pools[p],
                      (long long)cur, (long long)tot);
            if (!active) jb_printf(b, ",\"peak\":%lld", (long long)s->peak[st][p]);
            jb_printf(b, "}");
        }
        jb_printf(b, "}");
    }
    jb_printf(b, ",\"num_device_alloc\":%lld,\"num_device_free\":%lld,\"num_ooms\":%lld}",
              (long long)s->num_device_alloc, (long long)s->num_device_free, (long long)s->num_ooms);
}

/* "frames":[{"name":op,"filename":file,"line":n}] (PyTorch's frames, one
 * frame: the user's line, named by the op), when the context is known. */
static void jb_frames(jbuf *b, const kiln_alloc_history *h, uint32_t ctx) {
    if (!h || ctx == 0 || ctx > h->n_ctx) return;
    const kiln_alloc_context *c = &h->ctxs[ctx - 1];
    jb_printf(b, ",\"frames\":[{\"name\":");
    jb_str(b, c->op ? c->op : "");
    jb_printf(b, ",\"filename\":");
    jb_str(b, c->file ? c->file : "");
    jb_printf(b, ",\"line\":%d}]", c->line);
}

static const char *state_name(int state) {
    return state == BLOCK_ALLOCATED ? "active_allocated"
           : state == BLOCK_PENDING ? "active_awaiting_free"
                                    : "inactive";
}

/* What the snapshot needs, copied under the allocator's lock so that the
 * JSON (tens of MB for a full ring) is formatted after it is released. */
typedef struct snap_block {
    uint64_t ptr, size, requested;
    uint32_t ctx;
    uint8_t state;
} snap_block;

typedef struct snap_seg {
    uint64_t base, size, stream_id;
    size_t first, count; /* its blocks in snap_copy.blocks */
    uint8_t pool;
} snap_seg;

typedef struct snap_copy {
    snap_seg *segs;
    size_t n_segs;
    snap_block *blocks;
    size_t n_blocks;
    hist_entry *trace; /* oldest first */
    size_t n_trace;
    kiln_alloc_history meta; /* counters, baseline and contexts (ring not used) */
    bool history;
    hist_state stats;
} snap_copy;

static void snap_copy_free(snap_copy *c) {
    free(c->segs);
    free(c->blocks);
    free(c->trace);
    free(c->meta.ctxs);
}

/* With the lock held. False when host memory is short. */
static bool snap_copy_take(kiln_caching_allocator *a, snap_copy *c) {
    memset(c, 0, sizeof *c);
    size_t n_blocks = 0;
    for (size_t i = 0; i < a->n_segs; i++)
        for (const alloc_block *x = a->segs[i]->head; x; x = x->next) n_blocks++;
    c->segs = malloc((a->n_segs ? a->n_segs : 1) * sizeof *c->segs);
    c->blocks = malloc((n_blocks ? n_blocks : 1) * sizeof *c->blocks);
    kiln_alloc_history *h = a->history;
    if (h) {
        c->trace = malloc((h->count ? h->count : 1) * sizeof *c->trace);
        c->meta.ctxs = malloc((h->n_ctx ? h->n_ctx : 1) * sizeof *c->meta.ctxs);
    }
    if (!c->segs || !c->blocks || (h && (!c->trace || !c->meta.ctxs))) return false;
    for (size_t i = 0; i < a->n_segs; i++) {
        const alloc_segment *seg = a->segs[i];
        snap_seg *o = &c->segs[c->n_segs++];
        *o = (snap_seg){.base = seg->base,
                        .size = seg->size,
                        .stream_id = seg->stream_id,
                        .first = c->n_blocks,
                        .pool = seg->pool};
        for (const alloc_block *x = seg->head; x; x = x->next) {
            c->blocks[c->n_blocks++] = (snap_block){.ptr = x->ptr,
                                                    .size = x->size,
                                                    .requested = x->state == BLOCK_FREE ? 0 : x->requested,
                                                    .ctx = h && x->state != BLOCK_FREE ? x->ctx : 0,
                                                    .state = x->state};
            o->count++;
        }
    }
    if (h) {
        c->history = true;
        c->meta.cap = h->cap;
        c->meta.seq = h->seq;
        c->meta.count = h->count;
        c->meta.start_ns = h->start_ns;
        c->meta.base = h->base;
        c->meta.n_ctx = h->n_ctx;
        if (h->n_ctx) memcpy(c->meta.ctxs, h->ctxs, h->n_ctx * sizeof *h->ctxs);
        size_t first = h->cap - h->head < h->count ? h->cap - h->head : h->count;
        memcpy(c->trace, h->ring + h->head, first * sizeof *c->trace);
        memcpy(c->trace + first, h->ring, (h->count - first) * sizeof *c->trace);
        c->n_trace = h->count;
    }
    kiln_alloc_stats_fill_all(a);
    state_from_stats(&a->stats, &c->stats);
    return true;
}

char *kiln_caching_allocator_snapshot_json(kiln_caching_allocator *a, const char *device_name) {
    snap_copy c;
    alloc_lock(a);
    bool ok = snap_copy_take(a, &c);
    alloc_unlock(a);
    jbuf b = {0};
    if (ok) {
        const kiln_alloc_history *h = c.history ? &c.meta : NULL;
        jb_printf(&b, "{\"format\":\"kiln memory snapshot 1\",\"device\":");
        jb_str(&b, device_name ? device_name : a->ops.device_name);
        jb_printf(&b, ",\"time_us\":%.3f,\n\"segments\":[", (double)now_ns() / 1e3);
        for (size_t i = 0; i < c.n_segs; i++) {
            const snap_seg *seg = &c.segs[i];
            uint64_t allocated = 0, active = 0, requested = 0;
            for (size_t k = seg->first; k < seg->first + seg->count; k++) {
                const snap_block *x = &c.blocks[k];
                if (x->state == BLOCK_ALLOCATED) allocated += x->size, requested += x->requested;
                if (x->state != BLOCK_FREE) active += x->size;
            }
            jb_printf(&b,
                      "%s\n{\"address\":%llu,\"total_size\":%llu,\"stream\":%llu,\"segment_type\":\"%s\","
                      "\"allocated_size\":%llu,\"active_size\":%llu,\"requested_size\":%llu,\"blocks\":[",
                      i ? "," : "", (unsigned long long)seg->base, (unsigned long long)seg->size,
                      (unsigned long long)seg->stream_id, seg->pool == POOL_SMALL ? "small" : "large",
                      (unsigned long long)allocated, (unsigned long long)active,
                      (unsigned long long)requested);
            for (size_t k = seg->first; k < seg->first + seg->count; k++) {
                const snap_block *x = &c.blocks[k];
                jb_printf(&b,
                          "%s{\"address\":%llu,\"offset\":%llu,\"size\":%llu,\"requested_size\":%llu,"
                          "\"state\":\"%s\"",
                          k == seg->first ? "" : ",", (unsigned long long)x->ptr,
                          (unsigned long long)(x->ptr - seg->base), (unsigned long long)x->size,
                          (unsigned long long)x->requested, state_name(x->state));
                jb_frames(&b, h, x->ctx);
                jb_printf(&b, "}");
            }
            jb_printf(&b, "]}");
        }
        jb_printf(&b, "],\n\"history\":{\"enabled\":%s", h ? "true" : "false");
        if (h) {
            jb_printf(&b,
                      ",\"max_entries\":%zu,\"recorded\":%llu,\"dropped\":%llu,\"start_time_us\":%.3f,"
                      "\"baseline\":",
                      h->cap, (unsigned long long)h->seq, (unsigned long long)(h->seq - h->count),
                      (double)h->start_ns / 1e3);
            jb_state(&b, &h->base);
        }
        jb_printf(&b, "},\n\"device_traces\":[[");
        for (size_t k = 0; k < c.n_trace; k++) {
            const hist_entry *e = &c.trace[k];
            jb_printf(
                &b,
                "%s\n{\"seq\":%llu,\"action\":\"%s\",\"addr\":%llu,\"size\":%llu,\"requested_size\":%llu,"
                "\"pool\":\"%s\",\"stream\":%llu,\"time_us\":%.3f",
                k ? "," : "", (unsigned long long)e->seq, action_names[e->action],
                (unsigned long long)e->addr, (unsigned long long)e->size, (unsigned long long)e->requested,
                e->pool == POOL_SMALL ? "small" : "large", (unsigned long long)e->stream,
                (double)e->time_ns / 1e3);
            jb_frames(&b, h, e->ctx);
            jb_printf(&b, "}");
        }
        jb_printf(&b, "]],\n\"stats\":");
        jb_state(&b, &c.stats);
        jb_printf(&b, "}\n");
    }
    snap_copy_free(&c);
    if (!ok || b.failed) {
        free(b.data);
        KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, "turn the history off, or record fewer entries",
                   "%s allocator: no host memory for the memory snapshot", a->ops.device_name);
        return NULL;
    }
    return b.data;
}

/* ---- Public API ----------------------------------------------------------------------- */

kiln_status kiln_memory_record_history(kiln_device device, bool enabled, size_t max_entries) {
    kiln_caching_allocator *a = kiln_device_allocator(device);
    if (!a) return kiln_error_last()->status;
    return kiln_caching_allocator_record_history(a, enabled, max_entries);
}

bool kiln_memory_history_enabled(kiln_device device) {
    kiln_caching_allocator *a = kiln_device_allocator(device);
    return a && kiln_caching_allocator_history_enabled(a);
}

kiln_status kiln_memory_snapshot(kiln_device device, const char *path) {
    if (!path || !*path)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass a file path",
                          "kiln_memory_snapshot: no path given");
    kiln_caching_allocator *a = kiln_device_allocator(device);
    if (!a) return kiln_error_last()->status;
    char name[32];
    kiln_device_str(device, name, sizeof name);
    char *json = kiln_caching_allocator_snapshot_json(a, name);
    if (!json) return kiln_error_last()->status;
    FILE *f = fopen(path, "w");
    if (!f) {
        int err = errno;
        free(json);
        return KILN_RAISE(KILN_ERR_IO, "choose a writable path", "kiln_memory_snapshot: cannot write %s: %s",
                          path, strerror(err));
    }
    size_t n = strlen(json);
    bool ok = fwrite(json, 1, n, f) == n;
    ok = fclose(f) == 0 && ok;
    free(json);
    if (!ok)
        return KILN_RAISE(KILN_ERR_IO, "check the disk space and the path",
                          "kiln_memory_snapshot: writing %s failed", path);
    return KILN_OK;
}

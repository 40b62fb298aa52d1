/* What a planned step's memory is made of at its peak, read from the meta
 * allocator's memory history (src/runtime/memory_history.c).
 *
 * While a plan runs, the history records every allocation on meta with a
 * context from this file's provider: the op (as the ops layer gives it),
 * the phase of the step in `filename` and what the dispatcher was
 * allocating (output, workspace, prepared copy) in `line`. The trace is
 * replayed from the history's baseline: the allocated and reserved bytes
 * after every event, their highest points after the step's peak reset,
 * and the blocks alive at the allocated peak, each sorted into one part.
 * Replaying rather than reading the statistics lets the CPU plan leave
 * out its batch (kept on a meta stream of its own: on the CPU it is
 * pinned host memory, not the device's). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd_internal.h"
#include "base/error.h"
#include "diag/json.h"
#include "ops/op_registry.h"
#include "plan/plan_internal.h"
#include "runtime/runtime_internal.h"

static _Thread_local plan_phase tls_phase;
static _Thread_local bool tls_library_workspace;

void plan_phase_set(plan_phase phase) { tls_phase = phase; }
void plan_library_workspace_set(bool on) { tls_library_workspace = on; }

static const char *phase_name(plan_phase p) {
    switch (p) {
    case PLAN_PHASE_SETUP:
        return "setup";
    case PLAN_PHASE_BATCH:
        return "batch";
    case PLAN_PHASE_OPTIMIZER:
        return "optimizer";
    case PLAN_PHASE_STEP:
        if (!kiln_backward_running_node()) return "forward";
        return kiln_checkpoint_recomputing() || kiln_is_grad_enabled() ? "backward (recompute)" : "backward";
    default:
        return NULL;
    }
}

/* Other threads (and this one outside a plan) get the ops layer's context. */
static void plan_context(kiln_alloc_context *out) {
    kiln_memory_context_fill(out);
    const char *phase = phase_name(tls_phase);
    if (!phase) return;
    out->file = phase;
    out->line = tls_library_workspace ? KILN_DISPATCH_ALLOC_WORKSPACE : (int)kiln_dispatch_allocating();
}

kiln_status plan_breakdown_begin(void) {
    kiln_caching_allocator *a = kiln_device_allocator(KILN_META);
    if (!a) return kiln_error_last()->status;
    if (kiln_caching_allocator_history_enabled(a))
        return KILN_RAISE(KILN_ERR_STATE,
                          "stop it (kiln_memory_record_history(meta, false, 0)) before planning",
                          "kiln_plan_step: the meta device's memory history is being recorded, and the plan "
                          "needs it for itself");
    kiln_alloc_set_context_provider(plan_context);
    /* Room for a step of a large model: 56 bytes an entry. */
    kiln_status st = kiln_caching_allocator_record_history(a, true, (size_t)1 << 21);
    if (st) kiln_memory_context_register();
    return st;
}

void plan_breakdown_end(void) {
    kiln_caching_allocator *a = kiln_device_allocator(KILN_META);
    if (a) kiln_caching_allocator_record_history(a, false, 0);
    kiln_memory_context_register();
}

static int cmp_addr(const void *a, const void *b) {
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

static bool addrs_has(const plan_addrs *s, uintptr_t a) {
    return s && s->n && bsearch(&a, s->a, (size_t)s->n, sizeof a, cmp_addr);
}

static void addrs_sort(const plan_addrs *s) {
    if (s && s->n) qsort(s->a, (size_t)s->n, sizeof *s->a, cmp_addr);
}

/* A live block of the replay. */
typedef struct live_block {
    uintptr_t addr;
    int64_t size, requested;
    const cJSON *entry; /* its alloc event */
} live_block;

typedef struct replay {
    const cJSON *trace;
    live_block *live, *peak; /* alive now; alive at the allocated peak */
    int n_live, cap_live, n_peak, cap_peak;
    int64_t allocated, reserved, requested;
} replay;

static kiln_status live_add(replay *r, live_block b) {
    if (r->n_live == r->cap_live) {
        int cap = r->cap_live ? r->cap_live * 2 : 256;
        live_block *l = KILN_REALLOC(r->live, (size_t)cap * sizeof *l);
        if (!l) return KILN_ERR_OUT_OF_MEMORY;
        r->live = l, r->cap_live = cap;
    }
    r->live[r->n_live++] = b;
    return KILN_OK;
}

static void live_remove(replay *r, uintptr_t addr) {
    for (int i = r->n_live - 1; i >= 0; i--)
        if (r->live[i].addr == addr) {
            r->requested -= r->live[i].requested;
            r->live[i] = r->live[--r->n_live];
            return;
        }
}

static const cJSON *frame_of(const cJSON *e) { return kiln_json_at(kiln_json_get(e, "frames"), 0); }

/* Which part a block alive at the peak belongs to. */
static kiln_plan_part part_of(const live_block *b, const cJSON *e, const plan_sets *sets, bool lives_on) {
    /* The sets hold where the gradients, Adam's state and the batch are at
     * the end of the step: a block at one of those addresses is one of them
     * only if it is still alive then (an address is reused). */
    if (lives_on && addrs_has(&sets->grads, b->addr)) return KILN_PLAN_GRADIENTS;
    if (lives_on && addrs_has(&sets->optimizer_state, b->addr)) return KILN_PLAN_OPTIMIZER_STATE;
    if (lives_on && addrs_has(&sets->batch, b->addr)) return KILN_PLAN_BATCH;
    const cJSON *f = frame_of(e);
    const char *phase = kiln_json_string(kiln_json_get(f, "filename"), "");
    int64_t kind = kiln_json_int(kiln_json_get(f, "line"), 0);
    if (kind == KILN_DISPATCH_ALLOC_WORKSPACE) return KILN_PLAN_WORKSPACES;
    if (kind == KILN_DISPATCH_ALLOC_PREPARED) return KILN_PLAN_WEIGHT_COPIES;
    if (!strcmp(phase, "setup")) return KILN_PLAN_PARAMETERS;
    if (!strcmp(phase, "forward") || !strcmp(phase, "backward (recompute)")) return KILN_PLAN_ACTIVATIONS;
    return KILN_PLAN_TRANSIENT;
}

/* A new allocated peak at event `at`: what is alive is kept to be sorted
 * into parts once the end of the step is known. */
static kiln_status note_peak(replay *r, kiln_plan_memory *m, const cJSON *at) {
    m->allocated_peak = r->allocated;
    m->requested_at_peak = r->requested;
    if (r->n_live > r->cap_peak) {
        live_block *p = KILN_REALLOC(r->peak, (size_t)r->cap_live * sizeof *p);
        if (!p) return KILN_ERR_OUT_OF_MEMORY;
        r->peak = p, r->cap_peak = r->cap_live;
    }
    if (r->n_live) memcpy(r->peak, r->live, (size_t)r->n_live * sizeof *r->peak);
    r->n_peak = r->n_live;
    const cJSON *f = frame_of(at);
    snprintf(m->phase, sizeof m->phase, "%s", kiln_json_string(kiln_json_get(f, "filename"), ""));
    snprintf(m->op, sizeof m->op, "%s", kiln_json_string(kiln_json_get(f, "name"), ""));
    return KILN_OK;
}

static int cmp_ptr(const void *a, const void *b) {
    uintptr_t x = (uintptr_t) * (const void *const *)a, y = (uintptr_t) * (const void *const *)b;
    return x < y ? -1 : x > y;
}

/* Sort the blocks alive at the peak into parts. */
static kiln_status sort_parts(replay *r, const plan_sets *sets, kiln_plan_memory *m) {
    const cJSON **end = KILN_MALLOC((size_t)(r->n_live ? r->n_live : 1) * sizeof *end);
    if (!end) return KILN_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < r->n_live; i++) end[i] = r->live[i].entry;
    qsort(end, (size_t)r->n_live, sizeof *end, cmp_ptr);
    memset(m->parts, 0, sizeof m->parts);
    for (int i = 0; i < r->n_peak; i++) {
        const live_block *b = &r->peak[i];
        bool lives_on = r->n_live && bsearch(&b->entry, end, (size_t)r->n_live, sizeof *end, cmp_ptr);
        m->parts[part_of(b, b->entry, sets, lives_on)] += b->size;
    }
    free(end);
    return KILN_OK;
}

/* Replay `trace` from the baseline; peaks count from the last reset_peak. */
static kiln_status replay_trace(replay *r, const plan_sets *sets, uint64_t excluded_stream,
                                kiln_plan_memory *m) {
    const cJSON *e, *start = NULL;
    cJSON_ArrayForEach(e, r->trace) {
        if (!strcmp(kiln_json_string(kiln_json_get(e, "action"), ""), "reset_peak")) start = e;
    }
    bool stepping = false;
    m->allocated_peak = -1;
    cJSON_ArrayForEach(e, r->trace) {
        const char *act = kiln_json_string(kiln_json_get(e, "action"), "");
        uintptr_t addr = (uintptr_t)kiln_json_int(kiln_json_get(e, "addr"), 0);
        int64_t size = kiln_json_int(kiln_json_get(e, "size"), 0);
        bool excluded =
            excluded_stream && (uint64_t)kiln_json_int(kiln_json_get(e, "stream"), 0) == excluded_stream;
        if (!strcmp(act, "segment_alloc") && !excluded) {
            r->reserved += size;
        } else if (!strcmp(act, "segment_free") && !excluded) {
            r->reserved -= size;
        } else if (!strcmp(act, "alloc") && !excluded) {
            int64_t req = kiln_json_int(kiln_json_get(e, "requested_size"), size);
            KILN_TRY(live_add(r, (live_block){addr, size, req, e}));
            r->allocated += size, r->requested += req;
        } else if (!strcmp(act, "free_requested") && !excluded) {
            live_remove(r, addr);
            r->allocated -= size;
        }
        if (e == start) {
            stepping = true;
            m->reserved_peak = r->reserved;
            KILN_TRY(note_peak(r, m, e));
            continue;
        }
        if (!stepping) continue;
        if (r->reserved > m->reserved_peak) m->reserved_peak = r->reserved;
        if (r->allocated > m->allocated_peak) KILN_TRY(note_peak(r, m, e));
    }
    if (!stepping)
        return KILN_RAISE(KILN_ERR_INTERNAL, "report it: the plan's history lost the step",
                          "kiln_plan_step: the meta device's history holds no peak reset before the step");
    return sort_parts(r, sets, m);
}

kiln_status plan_breakdown_read(const plan_sets *sets, uint64_t excluded_stream, kiln_plan_memory *m) {
    kiln_caching_allocator *a = kiln_device_allocator(KILN_META);
    if (!a) return kiln_error_last()->status;
    addrs_sort(&sets->grads);
    addrs_sort(&sets->optimizer_state);
    addrs_sort(&sets->batch);
    char *text = kiln_caching_allocator_snapshot_json(a, "meta");
    if (!text) return kiln_error_last()->status;
    char err[256];
    cJSON *doc = kiln_json_parse(text, strlen(text), err, sizeof err);
    free(text);
    if (!doc)
        return KILN_RAISE(KILN_ERR_INTERNAL, "report it",
                          "kiln_plan_step: the meta memory snapshot does not parse: %s", err);
    const cJSON *hist = kiln_json_get(doc, "history");
    replay r = {.trace = kiln_json_at(kiln_json_get(doc, "device_traces"), 0)};
    r.allocated =
        kiln_json_int(kiln_json_path(hist, "baseline", "allocated_bytes", "all", "current", NULL), 0);
    r.reserved = kiln_json_int(kiln_json_path(hist, "baseline", "reserved_bytes", "all", "current", NULL), 0);
    kiln_status st = KILN_OK;
    if (kiln_json_int(kiln_json_get(hist, "dropped"), 0) != 0)
        st = KILN_RAISE(KILN_ERR_INTERNAL, "report it: the step needs a longer history",
                        "kiln_plan_step: the meta history dropped %lld events",
                        (long long)kiln_json_int(kiln_json_get(hist, "dropped"), 0));
    if (!st) st = replay_trace(&r, sets, excluded_stream, m);
    free(r.live);
    free(r.peak);
    cJSON_Delete(doc);
    return st;
}

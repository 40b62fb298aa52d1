/* kiln report's memory section: the memory snapshot that
 * kiln_memory_snapshot writes (src/runtime/memory_history.c) drawn as a
 * timeline of allocated bytes stacked by the user's source line (or the op,
 * where no line is known), the peak marked, the blocks alive at the peak
 * listed, and the snapshot's segments summarised.
 *
 * The trace may hold hundreds of thousands of entries: the file is walked
 * with a cursor (diag/json.h) and each entry, parsed by cJSON on its own,
 * is read into a compact record and freed, so the tree of the whole trace
 * never exists. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics_read.h"
#include "report.h"

#define MAX_LAYERS  8   /* sites drawn separately; the rest are "other" */
#define MAX_SAMPLES 800 /* x positions of the timeline */
#define PEAK_ROWS   50  /* rows of the peak table */

enum { A_ALLOC, A_FREE_REQ, A_FREE_DONE, A_SEG_ALLOC, A_SEG_FREE, A_OOM, A_OTHER };

typedef struct ev {
    uint64_t addr, size, requested;
    int64_t seq;
    double time_us;
    uint32_t group, site, op;
    uint8_t action;
} ev;

/* ---- Interned strings ---------------------------------------------------------------- */

typedef struct interner {
    char **s;
    uint32_t n, cap;
    uint32_t *slots; /* id + 1, 0 empty */
    uint32_t n_slots;
} interner;

static uint32_t str_hash(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

/* The id of s (0 for ""); UINT32_MAX when host memory is short. */
static uint32_t intern(interner *t, const char *s) {
    if (!t->n) { /* id 0 is "" */
        t->s = malloc(16 * sizeof *t->s);
        t->slots = calloc(32, sizeof *t->slots);
        char *empty = malloc(1);
        if (!t->s || !t->slots || !empty) return free(empty), UINT32_MAX;
        empty[0] = '\0';
        t->s[0] = empty, t->n = 1, t->cap = 16, t->n_slots = 32;
        t->slots[str_hash("") & 31] = 1;
    }
    if ((t->n + 1) * 2 > t->n_slots) {
        uint32_t ns = t->n_slots * 2;
        uint32_t *slots = calloc(ns, sizeof *slots);
        if (!slots) return UINT32_MAX;
        for (uint32_t i = 0; i < t->n; i++) {
            uint32_t j = str_hash(t->s[i]) & (ns - 1);
            while (slots[j]) j = (j + 1) & (ns - 1);
            slots[j] = i + 1;
        }
        free(t->slots);
        t->slots = slots, t->n_slots = ns;
    }
    uint32_t j = str_hash(s) & (t->n_slots - 1);
    for (; t->slots[j]; j = (j + 1) & (t->n_slots - 1))
        if (!strcmp(t->s[t->slots[j] - 1], s)) return t->slots[j] - 1;
    if (t->n == t->cap) {
        char **ns = realloc(t->s, t->cap * 2 * sizeof *ns);
        if (!ns) return UINT32_MAX;
        t->s = ns, t->cap *= 2;
    }
    size_t len = strlen(s);
    char *copy = malloc(len + 1);
    if (!copy) return UINT32_MAX;
    memcpy(copy, s, len + 1);
    t->s[t->n] = copy;
    t->slots[j] = t->n + 1;
    return t->n++;
}

static void interner_free(interner *t) {
    for (uint32_t i = 0; i < t->n; i++) free(t->s[i]);
    free(t->s);
    free(t->slots);
}

/* ---- Live blocks by address: linear probing, backward-shift deletion ------------------- */

typedef struct amap {
    uint64_t *keys; /* address + 1; 0 empty */
    uint32_t *vals;
    size_t cap, n;
} amap;

static size_t amap_slot(const amap *m, uint64_t k) {
    return (size_t)((k * 0x9E3779B97F4A7C15ull) >> 20) & (m->cap - 1);
}

static bool amap_put(amap *m, uint64_t addr, uint32_t v) {
    if ((m->n + 1) * 2 > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 1024;
        uint64_t *keys = calloc(cap, sizeof *keys);
        uint32_t *vals = calloc(cap, sizeof *vals);
        if (!keys || !vals) return free(keys), free(vals), false;
        amap old = *m;
        m->keys = keys, m->vals = vals, m->cap = cap, m->n = 0;
        for (size_t i = 0; i < old.cap; i++)
            if (old.keys[i]) amap_put(m, old.keys[i] - 1, old.vals[i]);
        free(old.keys), free(old.vals);
    }
    uint64_t k = addr + 1;
    size_t j = amap_slot(m, k);
    while (m->keys[j] && m->keys[j] != k) j = (j + 1) & (m->cap - 1);
    if (!m->keys[j]) m->n++;
    m->keys[j] = k, m->vals[j] = v;
    return true;
}

/* Remove addr; its value in *v. False when absent. */
static bool amap_take(amap *m, uint64_t addr, uint32_t *v) {
    if (!m->cap) return false;
    uint64_t k = addr + 1;
    size_t j = amap_slot(m, k);
    while (m->keys[j] && m->keys[j] != k) j = (j + 1) & (m->cap - 1);
    if (!m->keys[j]) return false;
    *v = m->vals[j];
    m->keys[j] = 0;
    m->n--;
    for (size_t i = (j + 1) & (m->cap - 1); m->keys[i]; i = (i + 1) & (m->cap - 1)) {
        size_t home = amap_slot(m, m->keys[i]);
        /* Move back when the hole lies cyclically between home and i. */
        if (((i - home) & (m->cap - 1)) >= ((i - j) & (m->cap - 1))) {
            m->keys[j] = m->keys[i], m->vals[j] = m->vals[i], m->keys[i] = 0;
            j = i;
        }
    }
    return true;
}

static void amap_clear(amap *m) {
    if (m->cap) memset(m->keys, 0, m->cap * sizeof *m->keys);
    m->n = 0;
}

/* ---- Reading the snapshot -------------------------------------------------------------- */

typedef struct snap {
    ev *evs;
    size_t n, cap;
    interner sites, ops, groups;
    double base_alloc, base_reserved;
    bool have_history;
} snap;

static int action_code(const char *a) {
    static const char *const names[] = {"alloc",         "free_requested", "free_completed",
                                        "segment_alloc", "segment_free",   "oom"};
    for (int i = 0; i < 6; i++)
        if (!strcmp(a, names[i])) return i;
    return A_OTHER;
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* Site "file.c:12", op and group ids of an event or block from its frames. */
static bool context_ids(snap *s, const cJSON *obj, uint32_t *site, uint32_t *op, uint32_t *group) {
    const cJSON *f = kiln_json_at(kiln_json_get(obj, "frames"), 0);
    const char *file = kiln_json_string(kiln_json_get(f, "filename"), "");
    const char *name = kiln_json_string(kiln_json_get(f, "name"), "");
    int64_t line = kiln_json_int(kiln_json_get(f, "line"), 0);
    char buf[512];
    if (*file)
        snprintf(buf, sizeof buf, "%s:%lld", base_name(file), (long long)line);
    else
        buf[0] = '\0';
    *site = intern(&s->sites, buf);
    *op = intern(&s->ops, name);
    if (!*buf) snprintf(buf, sizeof buf, *name ? "op %s (no user line)" : "(no context)", name);
    *group = intern(&s->groups, buf);
    return *site != UINT32_MAX && *op != UINT32_MAX && *group != UINT32_MAX;
}

static double stat_of(const cJSON *state, const char *stat, const char *field) {
    double v = 0;
    kiln_json_number(kiln_json_path(state, stat, "all", field, NULL), &v);
    return v;
}

/* ---- The section -------------------------------------------------------------------------- */

static void note(kiln_strbuf *notes, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(kiln_strbuf *notes, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    kiln_strbuf_printf(notes, "<li>");
    rp_html_escape(notes, buf);
    kiln_strbuf_printf(notes, "</li>\n");
}

static void bytes_cell(kiln_strbuf *o, double v) {
    char b[32];
    rp_format_bytes(v, b, sizeof b);
    kiln_strbuf_printf(o, "<td data-v=\"%.17g\">%s</td>", v, b);
}

typedef struct replay {
    amap live;
    double before;       /* bytes of blocks allocated before the trace, still live */
    double *group_bytes; /* per group id */
    double total, reserved;
} replay;

static void replay_reset(replay *r, const snap *s) {
    amap_clear(&r->live);
    r->before = s->base_alloc;
    r->total = s->base_alloc;
    r->reserved = s->base_reserved;
    memset(r->group_bytes, 0, s->groups.n * sizeof *r->group_bytes);
}

static bool replay_step(replay *r, const snap *s, size_t i) {
    const ev *e = &s->evs[i];
    uint32_t j;
    switch (e->action) {
    case A_ALLOC:
        if (!amap_put(&r->live, e->addr, (uint32_t)i)) return false;
        r->group_bytes[e->group] += (double)e->size;
        r->total += (double)e->size;
        break;
    case A_FREE_REQ:
        if (amap_take(&r->live, e->addr, &j))
            r->group_bytes[s->evs[j].group] -= (double)s->evs[j].size;
        else
            r->before = fmax(0, r->before - (double)e->size); /* allocated before the trace */
        r->total -= (double)e->size;
        break;
    case A_SEG_ALLOC:
        r->reserved += (double)e->size;
        break;
    case A_SEG_FREE:
        r->reserved -= (double)e->size;
        break;
    default:
        break;
    }
    return true;
}

static const ev *sort_evs;
static int cmp_idx_size(const void *a, const void *b) {
    const ev *x = &sort_evs[*(const uint32_t *)a], *y = &sort_evs[*(const uint32_t *)b];
    return x->size < y->size ? 1 : x->size > y->size ? -1 : (x->seq > y->seq) - (x->seq < y->seq);
}
static const double *sort_keys;
static int cmp_key_desc(const void *a, const void *b) {
    double x = sort_keys[*(const uint32_t *)a], y = sort_keys[*(const uint32_t *)b];
    return x < y ? 1 : x > y ? -1 : 0;
}

static int draw_timeline(kiln_strbuf *o, kiln_strbuf *notes, snap *s, const cJSON *root) {
    size_t n = s->n;
    replay r = {.group_bytes = calloc(s->groups.n ? s->groups.n : 1, sizeof(double))};
    double *px = malloc((MAX_SAMPLES + 4) * sizeof *px), *res = malloc((MAX_SAMPLES + 4) * sizeof *res);
    double *layer_mem = calloc((size_t)(MAX_LAYERS + 2) * (MAX_SAMPLES + 4), sizeof *layer_mem);
    uint32_t *order = malloc((s->groups.n ? s->groups.n : 1) * sizeof *order);
    uint32_t *peak_live = NULL;
    double *peak_groups = calloc(s->groups.n ? s->groups.n : 1, sizeof *peak_groups);
    int plots = 0;
    if (!r.group_bytes || !px || !res || !layer_mem || !order || !peak_groups) {
        note(notes, "memory timeline skipped: out of host memory");
        goto done;
    }
    /* Pass 1: the peak (first maximum of the allocated bytes). */
    replay_reset(&r, s);
    size_t peak = 0;
    double peak_total = -1;
    for (size_t i = 0; i < n; i++) {
        if (!replay_step(&r, s, i)) goto oom;
        if (r.total > peak_total) peak_total = r.total, peak = i;
    }
    /* Pass 2: what is alive at the peak. */
    replay_reset(&r, s);
    for (size_t i = 0; i <= peak; i++)
        if (!replay_step(&r, s, i)) goto oom;
    double before_at_peak = r.before;
    memcpy(peak_groups, r.group_bytes, s->groups.n * sizeof *peak_groups);
    size_t n_live = r.live.n;
    peak_live = malloc((n_live ? n_live : 1) * sizeof *peak_live);
    if (!peak_live) goto oom;
    for (size_t i = 0, k = 0; i < r.live.cap; i++)
        if (r.live.keys[i]) peak_live[k++] = r.live.vals[i];
    /* Layers: the largest groups at the peak; the rest are "other". */
    for (uint32_t g = 0; g < s->groups.n; g++) order[g] = g;
    sort_keys = peak_groups;
    qsort(order, s->groups.n, sizeof *order, cmp_key_desc);
    int n_top = 0;
    int layer_of_group_default = -1;
    int *layer_of = malloc((s->groups.n ? s->groups.n : 1) * sizeof *layer_of);
    if (!layer_of) goto oom;
    for (uint32_t g = 0; g < s->groups.n; g++) layer_of[g] = layer_of_group_default;
    for (uint32_t k = 0; k < s->groups.n && n_top < MAX_LAYERS; k++)
        if (peak_groups[order[k]] > 0) layer_of[order[k]] = 1 + n_top++;
    bool any_other = false;
    /* Pass 3: the samples. */
    replay_reset(&r, s);
    size_t stride = n / MAX_SAMPLES + 1, ns = 0;
    int n_layers = n_top + 2; /* before the trace, the top sites, other */
    for (size_t i = 0; i < n; i++) {
        if (!replay_step(&r, s, i)) {
            free(layer_of);
            goto oom;
        }
        if (!(i % stride == stride - 1 || i == n - 1 || i == peak || i == 0) || ns >= MAX_SAMPLES + 4)
            continue;
        px[ns] = (double)s->evs[i].seq;
        res[ns] = r.reserved / 1048576.0;
        double *row = layer_mem;
        row[0 * (MAX_SAMPLES + 4) + ns] = r.before / 1048576.0;
        for (uint32_t g = 0; g < s->groups.n; g++) {
            int l = layer_of[g] < 0 ? n_top + 1 : layer_of[g];
            if (l == n_top + 1 && r.group_bytes[g] > 0) any_other = true;
            row[(size_t)l * (MAX_SAMPLES + 4) + ns] += fmax(0, r.group_bytes[g]) / 1048576.0;
        }
        ns++;
    }
    free(layer_of);
    const double *layers[MAX_LAYERS + 2];
    const char *names[MAX_LAYERS + 2];
    for (int l = 0; l < n_layers; l++) layers[l] = layer_mem + (size_t)l * (MAX_SAMPLES + 4);
    names[0] = "allocated before the trace";
    for (int k = 0; k < n_top; k++) names[1 + k] = s->groups.s[order[k]];
    names[n_top + 1] = "other sites";
    if (!any_other) n_layers--;
    char pk[32], lbl[96];
    rp_format_bytes(peak_total, pk, sizeof pk);
    snprintf(lbl, sizeof lbl, "peak %s at event %lld", pk, (long long)s->evs[peak].seq);
    rp_series reserved = {.name = "reserved", .x = px, .y = res, .n = ns, .dashed = true};
    rp_plot p = {.title = "Memory timeline: allocated bytes by source line",
                 .xlabel = "trace event",
                 .ylabel = "MiB",
                 .series = &reserved,
                 .n_series = 1,
                 .x_integer = true,
                 .mark = true,
                 .mark_x = (double)s->evs[peak].seq,
                 .mark_label = lbl};
    rp_stack_plot(o, &p, px, ns, layers, names, n_layers);
    plots++;
    /* The blocks alive at the peak. */
    sort_evs = s->evs;
    qsort(peak_live, n_live, sizeof *peak_live, cmp_idx_size);
    char b1[32];
    rp_format_bytes(peak_total, b1, sizeof b1);
    kiln_strbuf_printf(o,
                       "<h3>Blocks alive at the peak (%s at trace event %lld, %.3f s into the trace)</h3>\n",
                       b1, (long long)s->evs[peak].seq, (s->evs[peak].time_us - s->evs[0].time_us) / 1e6);
    if (before_at_peak > 0) {
        rp_format_bytes(before_at_peak, b1, sizeof b1);
        kiln_strbuf_printf(o, "<p>%s of it was allocated before the trace began (no site recorded).</p>\n",
                           b1);
    }
    kiln_strbuf_printf(
        o, "<table class=\"sortable\"><thead><tr><th>size</th><th>requested</th><th>source line</th>"
           "<th>op</th><th>allocated at event</th><th>address</th></tr></thead><tbody>\n");
    for (size_t k = 0; k < n_live && k < PEAK_ROWS; k++) {
        const ev *e = &s->evs[peak_live[k]];
        kiln_strbuf_printf(o, "<tr>");
        bytes_cell(o, (double)e->size);
        bytes_cell(o, (double)e->requested);
        kiln_strbuf_printf(o, "<td>");
        rp_html_escape(o, *s->sites.s[e->site] ? s->sites.s[e->site] : "(unknown)");
        kiln_strbuf_printf(o, "</td><td>");
        rp_html_escape(o, *s->ops.s[e->op] ? s->ops.s[e->op] : "-");
        kiln_strbuf_printf(o, "</td><td data-v=\"%lld\">%lld</td><td>0x%" PRIx64 "</td></tr>\n",
                           (long long)e->seq, (long long)e->seq, e->addr);
    }
    kiln_strbuf_printf(o, "</tbody></table>\n");
    if (n_live > PEAK_ROWS)
        kiln_strbuf_printf(o, "<p>%zu more blocks not listed.</p>\n", n_live - (size_t)PEAK_ROWS);
    /* The peak by source line. */
    kiln_strbuf_printf(
        o, "<h3>At the peak, by source line</h3>\n<table class=\"sortable\"><thead><tr><th>source line "
           "or op</th><th>bytes</th></tr></thead><tbody>\n");
    for (uint32_t k = 0; k < s->groups.n && k < 20; k++) {
        if (peak_groups[order[k]] <= 0) break;
        kiln_strbuf_printf(o, "<tr><td>");
        rp_html_escape(o, s->groups.s[order[k]]);
        kiln_strbuf_printf(o, "</td>");
        bytes_cell(o, peak_groups[order[k]]);
        kiln_strbuf_printf(o, "</tr>\n");
    }
    kiln_strbuf_printf(o, "</tbody></table>\n");
    {
        double stats_peak = stat_of(kiln_json_get(root, "stats"), "allocated_bytes", "peak");
        if (stats_peak > peak_total + 0.5) {
            char b2[32];
            rp_format_bytes(stats_peak, b1, sizeof b1);
            rp_format_bytes(peak_total, b2, sizeof b2);
            kiln_strbuf_printf(
                o,
                "<p>The allocator's peak since its last reset (%s) is above the trace's (%s): it "
                "came before the oldest recorded event.</p>\n",
                b1, b2);
        }
    }
    goto done;
oom:
    note(notes, "memory timeline skipped: out of host memory");
done:
    amap_clear(&r.live);
    free(r.live.keys), free(r.live.vals), free(r.group_bytes);
    free(px), free(res), free(layer_mem), free(order), free(peak_live), free(peak_groups);
    return plots;
}

static void segments_summary(kiln_strbuf *o, const cJSON *segs, snap *s) {
    double reserved = 0, allocated = 0;
    size_t n_blocks = 0, n_live = 0;
    interner *g = &s->groups;
    size_t cap = 0;
    double *by_group = NULL, *count = NULL;
    const cJSON *seg, *seg_list = cJSON_IsArray(segs) ? segs : NULL;
    cJSON_ArrayForEach(seg, seg_list) {
        double v = 0;
        if (kiln_json_number(kiln_json_get(seg, "total_size"), &v)) reserved += v;
        const cJSON *blocks = kiln_json_get(seg, "blocks"), *b;
        if (!cJSON_IsArray(blocks)) blocks = NULL;
        cJSON_ArrayForEach(b, blocks) {
            n_blocks++;
            if (strcmp(kiln_json_string(kiln_json_get(b, "state"), ""), "active_allocated")) continue;
            double size = 0;
            kiln_json_number(kiln_json_get(b, "size"), &size);
            allocated += size, n_live++;
            uint32_t site, op, grp;
            if (!context_ids(s, b, &site, &op, &grp)) continue;
            if (grp >= cap) {
                size_t nc = (grp + 1) * 2;
                double *nb = realloc(by_group, nc * sizeof *nb),
                       *nn = nb ? realloc(count, nc * sizeof *nn) : NULL;
                if (nb) by_group = nb;
                if (!nn) continue;
                count = nn;
                memset(by_group + cap, 0, (nc - cap) * sizeof *by_group);
                memset(count + cap, 0, (nc - cap) * sizeof *count);
                cap = nc;
            }
            by_group[grp] += size, count[grp] += 1;
        }
    }
    char b1[32], b2[32];
    rp_format_bytes(reserved, b1, sizeof b1);
    rp_format_bytes(allocated, b2, sizeof b2);
    kiln_strbuf_printf(o,
                       "<h3>At snapshot time</h3>\n<p>%zu segments reserve %s; %zu of their %zu blocks are "
                       "allocated, %s.</p>\n",
                       (size_t)(cJSON_IsArray(segs) ? cJSON_GetArraySize(segs) : 0), b1, n_live, n_blocks,
                       b2);
    if (!cap) {
        free(by_group), free(count);
        return;
    }
    uint32_t *order = malloc(cap * sizeof *order);
    if (order) {
        for (uint32_t i = 0; i < cap; i++) order[i] = i;
        sort_keys = by_group;
        qsort(order, cap, sizeof *order, cmp_key_desc);
        kiln_strbuf_printf(o, "<table class=\"sortable\"><thead><tr><th>live blocks by source line or op</th>"
                              "<th>bytes</th><th>blocks</th></tr></thead><tbody>\n");
        for (size_t k = 0; k < cap && k < 20 && by_group[order[k]] > 0; k++) {
            kiln_strbuf_printf(o, "<tr><td>");
            rp_html_escape(o, order[k] < g->n ? g->s[order[k]] : "?");
            kiln_strbuf_printf(o, "</td>");
            bytes_cell(o, by_group[order[k]]);
            char c[32];
            rp_format_number(count[order[k]], c, sizeof c);
            kiln_strbuf_printf(o, "<td>%s</td></tr>\n", c);
        }
        kiln_strbuf_printf(o, "</tbody></table>\n");
    }
    free(order), free(by_group), free(count);
}

/* One trace entry into a compact record; false when host memory is short. */
static bool read_event(snap *s, const cJSON *e, size_t i) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 1024;
        ev *nv = realloc(s->evs, cap * sizeof *nv);
        if (!nv) return false;
        s->evs = nv, s->cap = cap;
    }
    ev *x = &s->evs[s->n];
    memset(x, 0, sizeof *x);
    x->action = (uint8_t)action_code(kiln_json_string(kiln_json_get(e, "action"), ""));
    x->addr = (uint64_t)kiln_json_int(kiln_json_get(e, "addr"), 0);
    int64_t size = kiln_json_int(kiln_json_get(e, "size"), 0),
            req = kiln_json_int(kiln_json_get(e, "requested_size"), 0);
    x->size = size > 0 ? (uint64_t)size : 0;
    x->requested = req > 0 ? (uint64_t)req : 0;
    x->seq = kiln_json_int(kiln_json_get(e, "seq"), (int64_t)i);
    kiln_json_number(kiln_json_get(e, "time_us"), &x->time_us);
    if (!context_ids(s, e, &x->site, &x->op, &x->group)) return false;
    s->n++;
    return true;
}

/* device_traces, at the cursor: [[entry, ...], ...], one trace per device;
 * the first is read, an entry at a time. */
static void read_traces(kiln_json_cursor *c, snap *s, size_t *bad) {
    bool room = true;
    for (int k = 0; kiln_json_cursor_next(c); k++) {
        if (k > 0 || !kiln_json_cursor_enter(c, '[')) {
            cJSON_Delete(kiln_json_cursor_value(c));
            continue;
        }
        for (size_t i = 0; kiln_json_cursor_next(c); i++) {
            cJSON *e = kiln_json_cursor_value(c);
            if (!e) return;
            if (!cJSON_IsObject(e))
                (*bad)++;
            else if (room)
                room = read_event(s, e, i);
            cJSON_Delete(e);
        }
    }
}

/* The snapshot's members other than the trace into a tree (*root), the
 * trace into s->evs. False with the reason in err when the text is not a
 * JSON object. */
static bool read_snapshot(const char *text, size_t len, snap *s, cJSON **root, size_t *bad, char *err,
                          size_t err_size) {
    kiln_json_cursor c;
    kiln_json_cursor_init(&c, text, len);
    *root = cJSON_CreateObject();
    bool object = *root && kiln_json_cursor_enter(&c, '{');
    while (object && kiln_json_cursor_next(&c)) {
        if (!strcmp(kiln_json_cursor_key(&c), "device_traces") && kiln_json_cursor_enter(&c, '[')) {
            read_traces(&c, s, bad);
            continue;
        }
        cJSON *v = kiln_json_cursor_value(&c);
        if (v && !cJSON_AddItemToObject(*root, kiln_json_cursor_key(&c), v)) cJSON_Delete(v);
    }
    bool ok = object && kiln_json_cursor_at_end(&c);
    kiln_json_cursor_free(&c);
    if (!*root)
        snprintf(err, err_size, "out of host memory");
    else if (!object && !c.failed)
        snprintf(err, err_size, "not an object");
    else if (!ok)
        snprintf(err, err_size, "syntax error at byte %zu", c.err_at);
    return ok;
}

int rp_memory_section(kiln_strbuf *o, kiln_strbuf *notes, const char *path, int *plots_out) {
    size_t len = 0;
    char err[4400];
    char *text = kiln_metrics_read_file(path, RP_MAX_SNAPSHOT_BYTES, &len, err, sizeof err);
    if (!text) {
        fprintf(stderr, "kiln report: memory snapshot: %s (%s)\n", err,
                errno == EFBIG ? "record a shorter history with kiln_memory_record_history"
                               : "pass a snapshot written by kiln_memory_snapshot with --snapshot FILE, or "
                                 "remove it from the run directory");
        return 1;
    }
    cJSON *root = NULL;
    size_t bad = 0, n_oom = 0;
    int plots = 0;
    snap s = {0};
    char why[160];
    if (!read_snapshot(text, len, &s, &root, &bad, why, sizeof why)) {
        note(notes, "memory snapshot %s is not valid JSON (%s): memory timeline skipped", path, why);
        goto out;
    }
    for (size_t i = 0; i < s.n; i++) n_oom += s.evs[i].action == A_OOM;
    const char *format = kiln_json_string(kiln_json_get(root, "format"), "");
    if (strncmp(format, "kiln memory snapshot", 20))
        note(notes, "%s does not say it is a kiln memory snapshot (\"format\"); reading it anyway", path);
    const cJSON *history = kiln_json_get(root, "history"), *stats = kiln_json_get(root, "stats");
    const cJSON *baseline = kiln_json_get(history, "baseline");
    s.have_history = baseline != NULL;
    s.base_alloc = stat_of(baseline, "allocated_bytes", "current");
    s.base_reserved = stat_of(baseline, "reserved_bytes", "current");
    kiln_strbuf_printf(o, "<h2>Memory</h2>\n<p>Snapshot of device <b>");
    rp_html_escape(o, kiln_json_string(kiln_json_get(root, "device"), "?"));
    kiln_strbuf_printf(o, "</b> (");
    rp_html_escape(o, base_name(path));
    kiln_strbuf_printf(o, ")");
    if (stats) {
        char a[32], b[32], c[32];
        rp_format_bytes(stat_of(stats, "allocated_bytes", "current"), a, sizeof a);
        rp_format_bytes(stat_of(stats, "allocated_bytes", "peak"), b, sizeof b);
        rp_format_bytes(stat_of(stats, "reserved_bytes", "current"), c, sizeof c);
        double ooms = 0, dev = 0;
        char n_ooms[32], n_dev[32];
        kiln_json_number(kiln_json_get(stats, "num_ooms"), &ooms);
        kiln_json_number(kiln_json_get(stats, "num_device_alloc"), &dev);
        rp_format_number(ooms, n_ooms, sizeof n_ooms), rp_format_number(dev, n_dev, sizeof n_dev);
        kiln_strbuf_printf(o, ": allocated %s (peak %s), reserved %s, %s raw device allocations, %s OOMs", a,
                           b, c, n_dev, n_ooms);
    }
    kiln_strbuf_printf(o, ".</p>\n");
    if (bad) {
        note(notes, "memory snapshot: %zu trace entries are not objects and were skipped", bad);
    }
    if (!s.have_history || s.n == 0) {
        kiln_strbuf_printf(
            o, "<p class=\"note\">No memory history in the snapshot (record it with "
               "kiln_memory_record_history before the work, see docs/memory.md): no timeline.</p>\n");
        note(notes, "memory snapshot %s has no history trace: memory timeline skipped", path);
    } else {
        double span = (s.evs[s.n - 1].time_us - s.evs[0].time_us) / 1e6;
        double dropped = 0;
        kiln_json_number(kiln_json_get(history, "dropped"), &dropped);
        kiln_strbuf_printf(o, "<p>The trace holds %zu events over %.3f s", s.n, span);
        char n_dropped[32];
        rp_format_number(dropped, n_dropped, sizeof n_dropped);
        if (dropped > 0) kiln_strbuf_printf(o, " (%s older events fell out of the ring buffer)", n_dropped);
        if (n_oom) kiln_strbuf_printf(o, "; <b>%zu out-of-memory errors</b>", n_oom);
        kiln_strbuf_printf(o, ".</p>\n");
        plots += draw_timeline(o, notes, &s, root);
    }
    segments_summary(o, kiln_json_get(root, "segments"), &s);
out:
    free(s.evs);
    interner_free(&s.sites), interner_free(&s.ops), interner_free(&s.groups);
    cJSON_Delete(root);
    free(text);
    *plots_out += plots;
    return 0;
}

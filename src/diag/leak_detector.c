/* The graph-retention detector: finds autograd graphs that outlive the
 * training steps that built them (the `total_loss += loss` leak).
 *
 * At each step boundary the live-node registry (autograd/node.c) is walked:
 * the nodes no other live node points at are the roots of graphs kept
 * alive by some tensor the user still holds. Roots are grouped by the
 * user's file:line recorded when their op was called, and each group's
 * reachable subgraph is measured (nodes, bytes of saved tensors). When the
 * live graph grows at `window` consecutive boundaries, the groups that grew
 * are reported, most bytes first: for `total = kiln_add(total, loss)` that
 * is the kiln_add line, whose one root reaches every step's graph. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd_internal.h"
#include "base/error.h"
#include "kiln/diag.h"
#include "ops/op_registry.h"

#define DEFAULT_WINDOW 3

static const char leak_pattern[] =
    "a tensor that requires grad is accumulated across steps: use kiln_item or kiln_detach";

/* One group of roots: everything reachable from the roots created at one line. */
typedef struct root_group {
    const char *file;
    int line;
    const char *op;
    int64_t roots, nodes;
    uint64_t saved_bytes, node_bytes;
} root_group;

static pthread_mutex_t leak_mutex = PTHREAD_MUTEX_INITIALIZER;
static struct {
    bool active;
    int window, steps, growing;
    int64_t prev_nodes, grow_base_nodes;
    uint64_t prev_bytes;
    root_group *prev; /* the groups at the previous boundary */
    size_t n_prev;
} leak;

static int cmp_ptr(const void *a, const void *b) {
    uintptr_t x = (uintptr_t) * (kiln_node *const *)a, y = (uintptr_t) * (kiln_node *const *)b;
    return x < y ? -1 : x > y;
}

static bool same_site(const char *fa, int la, const char *fb, int lb) {
    return la == lb && (fa == fb || (fa && fb && strcmp(fa, fb) == 0));
}

static ptrdiff_t node_index(kiln_node *const *all, size_t n, const kiln_node *x) {
    kiln_node *const *hit = bsearch(&x, all, n, sizeof *all, cmp_ptr);
    return hit ? hit - all : -1;
}

/* Sum the subgraph reachable from every root of group `g` (stamp g + 1
 * marks visited nodes, so each node counts once per group). */
static kiln_status measure_group(kiln_node *const *all, size_t n, const bool *is_root, int *stamp, int g,
                                 root_group *grp) {
    size_t *stack = KILN_MALLOC(n * sizeof *stack);
    if (!stack) return KILN_ERR_OUT_OF_MEMORY;
    size_t top = 0;
    for (size_t i = 0; i < n; i++)
        if (is_root[i] && same_site(all[i]->file, all[i]->line, grp->file, grp->line)) {
            stamp[i] = g + 1;
            stack[top++] = i;
            grp->roots++;
        }
    while (top > 0) {
        const kiln_node *x = all[stack[--top]];
        grp->nodes++;
        grp->saved_bytes += atomic_load(&((kiln_node *)x)->saved_bytes);
        grp->node_bytes += sizeof(kiln_node);
        for (int e = 0; e < x->n_in; e++) {
            ptrdiff_t j = x->next[e].node ? node_index(all, n, x->next[e].node) : -1;
            if (j < 0 || stamp[j] == g + 1) continue;
            stamp[j] = g + 1;
            stack[top++] = (size_t)j;
        }
    }
    free(stack);
    return KILN_OK;
}

/* Walk the registry (under its lock) and build the root groups. */
static kiln_status collect_groups_locked(kiln_node **all, size_t n, root_group **out, size_t *n_out) {
    bool *is_root = KILN_MALLOC(n * sizeof *is_root);
    int *stamp = KILN_CALLOC(n, sizeof *stamp);
    root_group *groups = KILN_CALLOC(n, sizeof *groups);
    kiln_status st = is_root && stamp && groups ? KILN_OK : KILN_ERR_OUT_OF_MEMORY;
    size_t n_groups = 0;
    if (!st) {
        qsort(all, n, sizeof *all, cmp_ptr);
        for (size_t i = 0; i < n; i++) is_root[i] = true;
        for (size_t i = 0; i < n; i++)
            for (int e = 0; e < all[i]->n_in; e++) {
                ptrdiff_t j = all[i]->next[e].node ? node_index(all, n, all[i]->next[e].node) : -1;
                if (j >= 0) is_root[j] = false;
            }
        for (size_t i = 0; i < n && !st; i++) {
            if (!is_root[i]) continue;
            size_t g = 0;
            while (g < n_groups && !same_site(groups[g].file, groups[g].line, all[i]->file, all[i]->line))
                g++;
            if (g < n_groups) continue;
            groups[g].file = all[i]->file;
            groups[g].line = all[i]->line;
            groups[g].op = kiln_node_name(all[i]);
            n_groups++;
            st = measure_group(all, n, is_root, stamp, (int)g, &groups[g]);
        }
    }
    free(is_root);
    free(stamp);
    if (st) {
        free(groups);
        return st;
    }
    *out = groups;
    *n_out = n_groups;
    return KILN_OK;
}

static kiln_status collect_groups(root_group **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    kiln_node_registry_lock();
    size_t n = 0;
    for (kiln_node *x = kiln_node_registry_first(); x; x = x->reg_next) n++;
    kiln_node **all = n ? malloc(n * sizeof *all) : NULL;
    kiln_status st = KILN_OK;
    if (n && !all) {
        st = KILN_ERR_OUT_OF_MEMORY;
    } else if (n) {
        size_t k = 0;
        for (kiln_node *x = kiln_node_registry_first(); x; x = x->reg_next) all[k++] = x;
        st = collect_groups_locked(all, n, out, n_out);
    }
    kiln_node_registry_unlock();
    free(all);
    if (st == KILN_ERR_OUT_OF_MEMORY)
        return KILN_RAISE(st, "free memory or stop the leak check",
                          "kiln_leak_check_step: out of host memory "
                          "while walking %zu autograd nodes",
                          n);
    return st;
}

static int cmp_site(const void *a, const void *b) {
    const kiln_leak_site *x = a, *y = b;
    uint64_t bx = x->saved_bytes + x->node_bytes, by = y->saved_bytes + y->node_bytes;
    if (bx != by) return bx > by ? -1 : 1;
    if (x->nodes != y->nodes) return x->nodes > y->nodes ? -1 : 1;
    return x->line - y->line;
}

static int64_t previous_nodes(const char *file, int line) {
    for (size_t i = 0; i < leak.n_prev; i++)
        if (same_site(leak.prev[i].file, leak.prev[i].line, file, line)) return leak.prev[i].nodes;
    return 0;
}

/* The groups that grew since the previous boundary (all groups when none
 * did: the growth is in saved bytes), most bytes first. */
static void fill_sites(kiln_leak_report *r, const root_group *groups, size_t n_groups) {
    kiln_leak_site all[KILN_LEAK_MAX_SITES * 4];
    int n = 0;
    for (int pass = 0; pass < 2 && n == 0; pass++)
        for (size_t i = 0; i < n_groups && n < (int)(sizeof all / sizeof all[0]); i++) {
            int64_t growth = groups[i].nodes - previous_nodes(groups[i].file, groups[i].line);
            if (pass == 0 && growth <= 0) continue;
            all[n++] = (kiln_leak_site){groups[i].file,        groups[i].line,      groups[i].op,
                                        groups[i].roots,       groups[i].nodes,     growth,
                                        groups[i].saved_bytes, groups[i].node_bytes};
        }
    qsort(all, (size_t)n, sizeof all[0], cmp_site);
    r->n_sites = n < KILN_LEAK_MAX_SITES ? n : KILN_LEAK_MAX_SITES;
    memcpy(r->sites, all, sizeof all[0] * (size_t)r->n_sites);
}

kiln_status kiln_leak_check_begin(int window) {
    if (window < 0)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass 0 for the default (3)",
                          "kiln_leak_check_begin: window %d is negative", window);
    pthread_mutex_lock(&leak_mutex);
    free(leak.prev);
    memset(&leak, 0, sizeof leak);
    leak.active = true;
    leak.window = window ? window : DEFAULT_WINDOW;
    pthread_mutex_unlock(&leak_mutex);
    return KILN_OK;
}

void kiln_leak_check_end(void) {
    pthread_mutex_lock(&leak_mutex);
    free(leak.prev);
    memset(&leak, 0, sizeof leak);
    pthread_mutex_unlock(&leak_mutex);
}

kiln_status kiln_leak_check_step(kiln_leak_report *report) {
    if (!report) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_leak_check_step: report is NULL");
    memset(report, 0, sizeof *report);
    pthread_mutex_lock(&leak_mutex);
    if (!leak.active) {
        pthread_mutex_unlock(&leak_mutex);
        return KILN_RAISE(
            KILN_ERR_STATE, "call kiln_leak_check_begin before the first step",
            "kiln_leak_check_step: the leak check was not started (call kiln_leak_check_begin first)");
    }
    root_group *groups = NULL;
    size_t n_groups = 0;
    kiln_status st = collect_groups(&groups, &n_groups);
    if (st) {
        pthread_mutex_unlock(&leak_mutex);
        return st;
    }
    int64_t nodes;
    uint64_t bytes;
    kiln_node_live_stats(&nodes, &bytes);
    bool grew =
        leak.steps > 0 && nodes >= leak.prev_nodes && (nodes > leak.prev_nodes || bytes > leak.prev_bytes);
    if (!grew) leak.grow_base_nodes = nodes;
    leak.growing = grew ? leak.growing + 1 : 0;
    leak.steps++;
    report->steps = leak.steps;
    report->growing_steps = leak.growing;
    report->live_nodes = nodes;
    report->saved_bytes = bytes;
    report->leaking = leak.growing >= leak.window;
    if (report->leaking) {
        report->nodes_per_step = (nodes - leak.grow_base_nodes) / leak.growing;
        report->pattern = leak_pattern;
        fill_sites(report, groups, n_groups);
    }
    free(leak.prev);
    leak.prev = groups;
    leak.n_prev = n_groups;
    leak.prev_nodes = nodes;
    leak.prev_bytes = bytes;
    pthread_mutex_unlock(&leak_mutex);
    return KILN_OK;
}

char *kiln_leak_report_format(const kiln_leak_report *r) {
    size_t cap = 512 + (size_t)(r ? r->n_sites : 0) * 320;
    char *text = KILN_MALLOC(cap);
    if (!text || !r) return text;
    char b1[32], b2[32];
    size_t len = 0;
    if (!r->leaking) {
        snprintf(text, cap, "kiln leak check: no graph growth (%lld live autograd nodes after %d steps)\n",
                 (long long)r->live_nodes, r->steps);
        return text;
    }
    len += (size_t)snprintf(text + len, cap - len,
                            "kiln leak check: the autograd graph grew at %d consecutive step boundaries: "
                            "%lld live nodes (+%lld per step), %s held by saved tensors\n  %s\n",
                            r->growing_steps, (long long)r->live_nodes, (long long)r->nodes_per_step,
                            kiln_format_bytes(r->saved_bytes, b1, sizeof b1), r->pattern);
    len +=
        (size_t)snprintf(text + len, cap - len, "  graph roots kept alive, by the line that created them:\n");
    for (int i = 0; i < r->n_sites && len < cap; i++) {
        const kiln_leak_site *s = &r->sites[i];
        len += (size_t)snprintf(text + len, cap - len,
                                "    %s:%d  kiln_%s  %lld root%s reaching %lld nodes (+%lld this step), "
                                "%s in saved tensors, %s in node records\n",
                                s->file ? s->file : "(unknown)", s->line, s->op, (long long)s->roots,
                                s->roots == 1 ? "" : "s", (long long)s->nodes, (long long)s->node_growth,
                                kiln_format_bytes(s->saved_bytes, b1, sizeof b1),
                                kiln_format_bytes(s->node_bytes, b2, sizeof b2));
    }
    return text;
}

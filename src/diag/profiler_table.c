/* The profiler table, in the format of PyTorch's key_averages().table():
 * rows aggregate records by name; self time is a record's time minus its
 * children's (on its thread); device total adds the device time of
 * everything the record ran, children included. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "diag/profiler_internal.h"

#define NAME_WIDTH 55
#define COL_WIDTH 12
#define N_COLS 9

typedef struct table_row {
    const char *name;
    uint64_t self_cpu, cpu_total, self_dev, dev_total, bytes, flops;
    int64_t calls;
} table_row;

/* A growing string; on allocation failure it keeps failing quietly and the
 * caller sees NULL. */
typedef struct strbuf {
    char *s;
    size_t n, cap;
    bool failed;
} strbuf;

static void sb_printf(strbuf *b, const char *fmt, ...) {
    if (b->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->failed = true;
            return;
        }
        if (b->s && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = b->cap ? b->cap : 1024;
        while (cap <= b->n + (size_t)k) cap *= 2;
        char *s = KILN_REALLOC(b->s, cap);
        if (!s) {
            b->failed = true;
            return;
        }
        b->s = s, b->cap = cap;
    }
}

/* PyTorch's time format: s, ms or us with three decimals. */
static void fmt_time(char *buf, size_t size, uint64_t ns) {
    double us = (double)ns / 1e3;
    if (us >= 1e6) snprintf(buf, size, "%.3fs", us / 1e6);
    else if (us >= 1e3) snprintf(buf, size, "%.3fms", us / 1e3);
    else snprintf(buf, size, "%.3fus", us);
}

static void fmt_percent(char *buf, size_t size, uint64_t part, uint64_t total) {
    if (total == 0) snprintf(buf, size, "NaN");
    else snprintf(buf, size, "%.2f%%", 100.0 * (double)part / (double)total);
}

/* PyTorch's memory format: Gb, Mb, Kb (powers of 1024) or "N b". */
static void fmt_bytes(char *buf, size_t size, uint64_t b) {
    const double k = 1024.0;
    if ((double)b >= k * k * k) snprintf(buf, size, "%.2f Gb", (double)b / (k * k * k));
    else if ((double)b >= k * k) snprintf(buf, size, "%.2f Mb", (double)b / (k * k));
    else if ((double)b >= k) snprintf(buf, size, "%.2f Kb", (double)b / k);
    else snprintf(buf, size, "%llu b", (unsigned long long)b);
}

static kiln_profiler_sort sort_key;

static uint64_t row_key(const table_row *r) {
    switch (sort_key) {
    case KILN_SORT_SELF_CPU: return r->self_cpu;
    case KILN_SORT_CPU_TOTAL: return r->cpu_total;
    case KILN_SORT_CPU_AVG: return r->calls ? r->cpu_total / (uint64_t)r->calls : 0;
    case KILN_SORT_SELF_DEVICE: return r->self_dev;
    case KILN_SORT_DEVICE_TOTAL: return r->dev_total;
    case KILN_SORT_CALLS: return (uint64_t)r->calls;
    case KILN_SORT_BYTES: return r->bytes;
    default: return 0;
    }
}

static int row_cmp(const void *pa, const void *pb) {
    const table_row *a = pa, *b = pb;
    if (sort_key != KILN_SORT_NAME) {
        uint64_t ka = row_key(a), kb = row_key(b);
        if (ka != kb) return ka > kb ? -1 : 1;
    }
    return strcmp(a->name, b->name);
}

static uint64_t span(uint64_t start, uint64_t end) { return end > start ? end - start : 0; }

/* Per-record self CPU and device total (children come after parents, so
 * one backward pass folds children into parents). */
static void record_times(const prof_result *res, uint64_t *self_cpu, uint64_t *dev_total) {
    for (size_t i = 0; i < res->n; i++) {
        self_cpu[i] = res->rec[i].kind == PROF_ASYNC ? 0 : span(res->rec[i].start_ns, res->rec[i].end_ns);
        dev_total[i] = span(res->rec[i].dev_start_ns, res->rec[i].dev_end_ns);
    }
    for (size_t i = res->n; i-- > 0;) {
        int64_t p = res->rec[i].parent;
        if (p < 0) continue;
        uint64_t d = span(res->rec[i].start_ns, res->rec[i].end_ns);
        self_cpu[p] = self_cpu[p] > d ? self_cpu[p] - d : 0;
        dev_total[p] += dev_total[i];
    }
}

static int name_cmp(const void *a, const void *b) {
    return strcmp((*(const prof_record *const *)a)->name, (*(const prof_record *const *)b)->name);
}

/* Rows keyed by name: sort pointers by name, then fold runs. */
static size_t build_rows(const prof_result *res, const uint64_t *self_cpu, const uint64_t *dev_total,
                         const prof_record **order, table_row *rows) {
    for (size_t i = 0; i < res->n; i++) order[i] = &res->rec[i];
    qsort(order, res->n, sizeof *order, name_cmp);
    size_t n = 0;
    for (size_t k = 0; k < res->n; k++) {
        const prof_record *r = order[k];
        size_t i = (size_t)(r - res->rec);
        if (n == 0 || strcmp(rows[n - 1].name, r->name) != 0) rows[n++] = (table_row){.name = r->name};
        table_row *row = &rows[n - 1];
        row->calls++;
        row->self_cpu += self_cpu[i];
        row->cpu_total += span(r->start_ns, r->end_ns);
        row->self_dev += span(r->dev_start_ns, r->dev_end_ns);
        row->dev_total += dev_total[i];
        row->bytes += r->out_bytes;
        row->flops += r->flops;
    }
    return n;
}

/* With any matmul or convolution recorded, two more columns: the row's
 * GFLOP and its rate over the time its kernels ran (self device time; self
 * CPU time when no kernel time was seen), PyTorch's "Total FLOPs" made a
 * rate so that a pass can be read against the FMA peak. */
#define FLOP_COLS 2

static void rule(strbuf *b, int cols) {
    for (int i = 0; i < NAME_WIDTH; i++) sb_printf(b, "-");
    for (int c = 0; c < cols; c++) sb_printf(b, "  %.*s", COL_WIDTH, "--------------------");
    sb_printf(b, "\n");
}

static void print_flops(strbuf *b, const table_row *r) {
    char g[32] = "", rate[32] = "";
    uint64_t ns = r->self_dev ? r->self_dev : r->self_cpu;
    if (r->flops) {
        snprintf(g, sizeof g, "%.3f", (double)r->flops * 1e-9);
        if (ns) snprintf(rate, sizeof rate, "%.1f", (double)r->flops / (double)ns);
    }
    sb_printf(b, "  %*s  %*s", COL_WIDTH, g, COL_WIDTH, rate);
}

static void print_row(strbuf *b, const table_row *r, uint64_t self_total, bool flops) {
    char name[NAME_WIDTH + 1];
    if (strlen(r->name) > NAME_WIDTH) snprintf(name, sizeof name, "%.*s...", NAME_WIDTH - 3, r->name);
    else snprintf(name, sizeof name, "%s", r->name);
    char c[N_COLS][32];
    fmt_percent(c[0], sizeof c[0], r->self_cpu, self_total);
    fmt_time(c[1], sizeof c[1], r->self_cpu);
    fmt_percent(c[2], sizeof c[2], r->cpu_total, self_total);
    fmt_time(c[3], sizeof c[3], r->cpu_total);
    fmt_time(c[4], sizeof c[4], r->calls ? r->cpu_total / (uint64_t)r->calls : 0);
    fmt_time(c[5], sizeof c[5], r->self_dev);
    fmt_time(c[6], sizeof c[6], r->dev_total);
    snprintf(c[7], sizeof c[7], "%lld", (long long)r->calls);
    fmt_bytes(c[8], sizeof c[8], r->bytes);
    sb_printf(b, "%-*s", NAME_WIDTH, name);
    for (int i = 0; i < N_COLS; i++) sb_printf(b, "  %*s", COL_WIDTH, c[i]);
    if (flops) print_flops(b, r);
    sb_printf(b, "\n");
}

static char *format_table(table_row *rows, size_t n_rows, int row_limit) {
    uint64_t self_total = 0, dev_self_total = 0;
    bool flops = false;
    for (size_t i = 0; i < n_rows; i++)
        self_total += rows[i].self_cpu, dev_self_total += rows[i].self_dev, flops |= rows[i].flops != 0;
    int cols = N_COLS + (flops ? FLOP_COLS : 0);
    strbuf b = {0};
    static const char *const heads[N_COLS] = {"Self CPU %",  "Self CPU",     "CPU total %",
                                              "CPU total",   "CPU time avg", "Self Device",
                                              "Device total", "# of Calls",  "Output bytes"};
    rule(&b, cols);
    sb_printf(&b, "%-*s", NAME_WIDTH, "Name");
    for (int i = 0; i < N_COLS; i++) sb_printf(&b, "  %*s", COL_WIDTH, heads[i]);
    if (flops) sb_printf(&b, "  %*s  %*s", COL_WIDTH, "Total GFLOP", COL_WIDTH, "GFLOP/s");
    sb_printf(&b, "\n");
    rule(&b, cols);
    size_t shown = row_limit > 0 && (size_t)row_limit < n_rows ? (size_t)row_limit : n_rows;
    for (size_t i = 0; i < shown; i++) print_row(&b, &rows[i], self_total, flops);
    rule(&b, cols);
    char t[32];
    fmt_time(t, sizeof t, self_total);
    sb_printf(&b, "Self CPU time total: %s\n", t);
    fmt_time(t, sizeof t, dev_self_total);
    sb_printf(&b, "Self Device time total: %s\n", t);
    if (b.failed) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

char *kiln_profiler_table(kiln_profiler_sort sort, int row_limit) {
    if ((unsigned)sort > KILN_SORT_NAME) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_profiler_table: sort %d is not a kiln_profiler_sort",
                   (int)sort);
        return NULL;
    }
    const prof_result *res = kiln_profiler_result_lock();
    size_t n = res->n ? res->n : 1;
    uint64_t *self_cpu = KILN_CALLOC(n, sizeof *self_cpu);
    uint64_t *dev_total = KILN_CALLOC(n, sizeof *dev_total);
    const prof_record **order = KILN_CALLOC(n, sizeof *order);
    table_row *rows = KILN_CALLOC(n, sizeof *rows);
    char *out = NULL;
    if (self_cpu && dev_total && order && rows) {
        record_times(res, self_cpu, dev_total);
        size_t n_rows = build_rows(res, self_cpu, dev_total, order, rows);
        /* The sort key is file-local state: serialised by the result lock. */
        sort_key = sort;
        qsort(rows, n_rows, sizeof *rows, row_cmp);
        out = format_table(rows, n_rows, row_limit);
    }
    kiln_profiler_result_unlock();
    free(self_cpu);
    free(dev_total);
    free(order);
    free(rows);
    return out;
}

int kiln_profiler_op_flops(const char *name, double *gflop, double *seconds) {
    uint64_t flops = 0, ns = 0;
    int calls = 0;
    const prof_result *res = kiln_profiler_result_lock();
    for (size_t i = 0; name && i < res->n; i++) {
        const prof_record *r = &res->rec[i];
        if (r->kind != PROF_OP || strcmp(r->name, name) != 0) continue;
        calls++;
        flops += r->flops;
        uint64_t dev = span(r->dev_start_ns, r->dev_end_ns);
        ns += dev ? dev : span(r->start_ns, r->end_ns);
    }
    kiln_profiler_result_unlock();
    if (gflop) *gflop = (double)flops * 1e-9;
    if (seconds) *seconds = (double)ns * 1e-9;
    return calls;
}

int kiln_profiler_device_times(kiln_device *devices, double *ms, int cap) {
    enum { MAX_DEVICES = 64 };
    kiln_device seen[MAX_DEVICES];
    uint64_t ns[MAX_DEVICES] = {0};
    int n = 0;
    const prof_result *res = kiln_profiler_result_lock();
    for (size_t i = 0; i < res->n; i++) {
        const prof_record *r = &res->rec[i];
        uint64_t t = span(r->dev_start_ns, r->dev_end_ns);
        if (!t) continue;
        int k = 0;
        while (k < n && !kiln_device_equal(seen[k], r->device)) k++;
        if (k == n) {
            if (n == MAX_DEVICES) continue;
            seen[n++] = r->device;
        }
        ns[k] += t;
    }
    kiln_profiler_result_unlock();
    for (int k = 0; k < n && k < cap; k++) {
        if (devices) devices[k] = seen[k];
        if (ms) ms[k] = (double)ns[k] / 1e6;
    }
    return n;
}

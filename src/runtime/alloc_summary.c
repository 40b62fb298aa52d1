/* kiln_caching_allocator_summary: the statistics as the text table of
 * PyTorch's torch.cuda.memory_summary (75-character lines framed by '|'),
 * so people who read those tables read these the same way. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "runtime/caching_allocator.h"

#define LINE_WIDTH 75

typedef struct text_buf {
    char *data;
    size_t len, cap;
    bool failed;
} text_buf;

static void buf_append(text_buf *b, const char *s, size_t n) {
    if (b->failed) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + n + 1) cap *= 2;
        char *d = KILN_REALLOC(b->data, cap);
        if (!d) {
            b->failed = true;
            return;
        }
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

/* One framed line: the content padded (or cut) to LINE_WIDTH. */
static void buf_line(text_buf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void buf_line(text_buf *b, const char *fmt, ...) {
    char content[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(content, sizeof content, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    char line[LINE_WIDTH + 3];
    memset(line, ' ', sizeof line);
    line[0] = '|';
    memcpy(line + 1, content, (size_t)(n < LINE_WIDTH ? n : LINE_WIDTH));
    line[LINE_WIDTH + 1] = '|';
    line[LINE_WIDTH + 2] = '\n';
    buf_append(b, line, sizeof line);
}

static void buf_rule(text_buf *b, char c) {
    char rule[LINE_WIDTH + 1];
    memset(rule, c, LINE_WIDTH);
    rule[LINE_WIDTH] = '\0';
    buf_line(b, "%s", rule);
}

/* "%6lld KiB": the unit follows the column's "all" value, stepping up at
 * 768 of the current unit, values floor-divided (PyTorch's _format_size). */
static void format_size(int64_t v, int64_t pref, char *out, size_t n) {
    static const char *units[] = {"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int u = 0;
    double p = (double)pref;
    while (u < 5 && p >= 768.0 * 1024.0) {
        v /= 1024;
        p /= 1024.0;
        u++;
    }
    snprintf(out, n, "%6lld %s", (long long)v, units[u]);
}

/* "%7lld K ": counts step up at 750 thousand (PyTorch's _format_count). */
static void format_count(int64_t v, int64_t pref, char *out, size_t n) {
    static const char *units[] = {" ", "K", "M"};
    int u = 0;
    double p = (double)pref;
    while (u < 2 && p >= 750.0 * 1000.0) {
        v /= 1000;
        p /= 1000.0;
        u++;
    }
    snprintf(out, n, "%7lld %s ", (long long)v, units[u]);
}

typedef void (*cell_format)(int64_t v, int64_t pref, char *out, size_t n);

static void metric_row(text_buf *b, const char *name, const kiln_stat *s, const kiln_stat *pref,
                       cell_format f) {
    char c[4][32];
    f(s->current, pref->current, c[0], sizeof c[0]);
    f(s->peak, pref->peak, c[1], sizeof c[1]);
    f(s->allocated, pref->allocated, c[2], sizeof c[2]);
    f(s->freed, pref->freed, c[3], sizeof c[3]);
    buf_line(b, " %-21s | %s | %s | %s | %s ", name, c[0], c[1], c[2], c[3]);
}

static void metric_block(text_buf *b, const char *name, const kiln_stat *arr, cell_format f,
                         bool abbreviated) {
    buf_rule(b, '-');
    metric_row(b, name, &arr[KILN_POOL_ALL], &arr[KILN_POOL_ALL], f);
    if (abbreviated) return;
    metric_row(b, "      from large pool", &arr[KILN_POOL_LARGE], &arr[KILN_POOL_ALL], f);
    metric_row(b, "      from small pool", &arr[KILN_POOL_SMALL], &arr[KILN_POOL_ALL], f);
}

char *kiln_caching_allocator_summary(kiln_caching_allocator *a, const char *title, bool abbreviated) {
    kiln_memory_stats s;
    kiln_caching_allocator_stats(a, &s);
    text_buf b = {0};
    const char *t = title ? title : "Kiln memory summary";
    size_t tl = strlen(t);
    int pad = tl < LINE_WIDTH ? (int)(LINE_WIDTH - tl) / 2 : 0;
    buf_rule(&b, '=');
    buf_line(&b, "%*s%s", pad, "", t);
    buf_rule(&b, '-');
    buf_line(&b, "  %9s OOMs: %-12lld | %6s allocation retries: %-8lld  ", "", (long long)s.num_ooms, "",
             (long long)s.num_alloc_retries);
    buf_rule(&b, '=');
    buf_line(&b, "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ");
    metric_block(&b, "Allocated memory", s.allocated_bytes, format_size, abbreviated);
    metric_block(&b, "Active memory", s.active_bytes, format_size, abbreviated);
    metric_block(&b, "Requested memory", s.requested_bytes, format_size, abbreviated);
    metric_block(&b, "Reserved memory", s.reserved_bytes, format_size, abbreviated);
    metric_block(&b, "Non-releasable memory", s.inactive_split_bytes, format_size, abbreviated);
    metric_block(&b, "Allocations", s.allocation, format_count, abbreviated);
    metric_block(&b, "Active allocs", s.active, format_count, abbreviated);
    metric_block(&b, "Reserved segments", s.segment, format_count, abbreviated);
    metric_block(&b, "Non-releasable allocs", s.inactive_split, format_count, abbreviated);
    buf_rule(&b, '-');
    metric_row(&b, "Oversize allocations", &s.oversize_allocations, &s.oversize_allocations, format_count);
    buf_rule(&b, '-');
    metric_row(&b, "Oversize segments", &s.oversize_segments, &s.oversize_segments, format_count);
    buf_rule(&b, '=');
    if (b.failed) {
        free(b.data);
        return NULL;
    }
    return b.data;
}

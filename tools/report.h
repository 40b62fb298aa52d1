/* kiln report: one self-contained HTML page (inline SVG plots, no external
 * resources) from a run directory's metrics.jsonl and, when present, its
 * memory_snapshot.json. report.c reads the metrics and writes the page;
 * report_memory.c draws the snapshot; report_svg.c holds the plot
 * primitives. docs/report.md describes the page. */
#ifndef KILN_TOOLS_REPORT_H
#define KILN_TOOLS_REPORT_H

#include <stdbool.h>
#include <stddef.h>

#include "diag/json.h"
#include "diag/strbuf.h"

/* `kiln report RUN_DIR [--out FILE]`; the exit code. */
int kiln_cmd_report(int argc, char **argv);

/* ---- Plots (report_svg.c) ------------------------------------------------------ */

typedef struct rp_series {
    const char *name;
    const double *x, *y;
    size_t n;
    bool dashed;
} rp_series;

typedef struct rp_plot {
    const char *title, *xlabel, *ylabel;
    const rp_series *series;
    int n_series;
    bool y_from_zero; /* include 0 in the y range */
    bool x_integer;   /* x ticks at whole numbers (steps, epochs) */
    bool mark;        /* a vertical marker at mark_x, labelled */
    double mark_x;
    const char *mark_label;
} rp_plot;

/* A line plot (a dot for a single point) with axes, ticks, grid, legend
 * and a tooltip per point. Series with n == 0 are left out. */
void rp_line_plot(kiln_strbuf *out, const rp_plot *p);
/* Stacked areas over x[0..n): layer k's values layers[k][0..n), layer 0 at
 * the bottom, named names[k]; p->series (if any) drawn as lines on top. */
void rp_stack_plot(kiln_strbuf *out, const rp_plot *p, const double *x, size_t n, const double *const *layers,
                   const char *const *names, int n_layers);
/* The i-th colour of the palette (cycles). */
const char *rp_color(int i);
/* Text with & < > " ' escaped for HTML. */
void rp_html_escape(kiln_strbuf *out, const char *s);
/* A number for a tick or a table: 4 significant digits, no exponent below 1e9. */
void rp_format_number(double v, char *buf, size_t n);
/* Bytes as "12.3 MiB". */
void rp_format_bytes(double v, char *buf, size_t n);

/* ---- The memory snapshot (report_memory.c) --------------------------------------- */

/* The most of a memory snapshot kiln report reads: a full history ring
 * (262144 events of ~300 bytes) is some 80 MB. */
#define RP_MAX_SNAPSHOT_BYTES ((size_t)512 << 20)

/* Append the memory section for the snapshot at `path` (a timeline plot
 * and tables) to `html` and add its plot count to *plots; problems with
 * its content go to `notes` as list items. 1 (the reason printed to
 * stderr, naming the file) when the file cannot be read: not a regular
 * file (checked before reading, so a FIFO never blocks), over
 * RP_MAX_SNAPSHOT_BYTES, or unreadable; else 0. */
int rp_memory_section(kiln_strbuf *html, kiln_strbuf *notes, const char *path, int *plots);

#endif

/* kiln report RUN_DIR: RUN_DIR/metrics.jsonl (and memory_snapshot.json
 * when present) as one self-contained HTML page, RUN_DIR/report.html:
 * the run's summary and configuration as tables, then SVG plots of the
 * loss per step window and per epoch, accuracy per epoch, throughput,
 * learning rate, memory over the run, and the memory timeline of the
 * snapshot (report_memory.c). No external resources; a few lines of inline
 * JavaScript only sort tables.
 *
 * Robust to what a run leaves behind: an interrupted run (no summary
 * record), one data point, missing fields (that plot is skipped with a
 * note) and malformed lines (skipped and counted). Record fields are found
 * by name, not position, so records gaining fields keep working. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "metrics_read.h"
#include "report.h"

/* ---- Numeric columns of the step and epoch records --------------------------------- */

typedef struct col {
    char *name;
    double *x, *y;
    size_t n, cap;
} col;

typedef struct cols {
    col *c;
    size_t n, cap;
} cols;

static col *col_find(const cols *cs, const char *name) {
    for (size_t i = 0; i < cs->n; i++)
        if (!strcmp(cs->c[i].name, name)) return &cs->c[i];
    return NULL;
}

static bool col_push(cols *cs, const char *name, double x, double y) {
    col *c = col_find(cs, name);
    if (!c) {
        if (cs->n == cs->cap) {
            size_t cap = cs->cap ? cs->cap * 2 : 16;
            col *nc = realloc(cs->c, cap * sizeof *nc);
            if (!nc) return false;
            cs->c = nc, cs->cap = cap;
        }
        c = &cs->c[cs->n];
        memset(c, 0, sizeof *c);
        c->name = strdup(name);
        if (!c->name) return false;
        cs->n++;
    }
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 64;
        double *nx = realloc(c->x, cap * sizeof *nx);
        if (!nx) return false;
        c->x = nx;
        double *ny = realloc(c->y, cap * sizeof *ny);
        if (!ny) return false;
        c->y = ny, c->cap = cap;
    }
    c->x[c->n] = x, c->y[c->n] = y, c->n++;
    return true;
}

static void cols_free(cols *cs) {
    for (size_t i = 0; i < cs->n; i++) free(cs->c[i].name), free(cs->c[i].x), free(cs->c[i].y);
    free(cs->c);
}

/* ---- Reading metrics.jsonl ---------------------------------------------------------------- */

#define MAX_OTHER 256 /* other records (configuration, checkpoints) kept for the tables */

typedef struct run {
    cols step, epoch;
    cJSON *summary;
    cJSON *other[MAX_OTHER];
    size_t n_other, extra_other;
    size_t lines, malformed, too_long, no_event, n_step, n_epoch;
    size_t bad_line[4], n_bad_listed;
} run;

static void bad_line(run *r, size_t line) {
    r->malformed++;
    if (r->n_bad_listed < 4) r->bad_line[r->n_bad_listed++] = line;
}

/* Every plottable number of `rec` (kiln_metrics_value) except the x
 * field goes into a column. */
static bool record_numbers(cols *cs, const cJSON *rec, const char *x_key, double x) {
    const cJSON *f;
    cJSON_ArrayForEach(f, rec) {
        double v;
        if (!strcmp(f->string, x_key) || !kiln_metrics_value(f, &v)) continue;
        if (!col_push(cs, f->string, x, v)) return false;
    }
    return true;
}

/* The lines of text[0..len) (kiln_metrics_read_file's buffer) into r;
 * false when host memory ran out. */
static bool read_metrics(const char *text, size_t len, run *r) {
    bool ok = true;
    size_t at = 0, n;
    const char *line;
    while (ok && kiln_metrics_next_line(text, len, &at, &line, &n)) {
        r->lines++;
        kiln_metrics_record m;
        switch (kiln_metrics_line_parse(line, n, &m)) {
        case KILN_METRICS_BLANK:
            break;
        case KILN_METRICS_TOO_LONG:
            r->too_long++;
            bad_line(r, r->lines);
            break;
        case KILN_METRICS_MALFORMED:
            bad_line(r, r->lines);
            break;
        case KILN_METRICS_NO_EVENT:
            r->no_event++;
            cJSON_Delete(m.rec);
            break;
        case KILN_METRICS_STEP:
            r->n_step++;
            ok = record_numbers(&r->step, m.rec, "step", m.has_x ? m.x : (double)r->n_step);
            cJSON_Delete(m.rec);
            break;
        case KILN_METRICS_EPOCH:
            r->n_epoch++;
            ok = record_numbers(&r->epoch, m.rec, "epoch", m.has_x ? m.x : (double)r->n_epoch);
            cJSON_Delete(m.rec);
            break;
        case KILN_METRICS_SUMMARY:
            cJSON_Delete(r->summary); /* the last one counts */
            r->summary = m.rec;
            break;
        case KILN_METRICS_OTHER:
            if (r->n_other < MAX_OTHER) {
                r->other[r->n_other++] = m.rec;
            } else {
                r->extra_other++;
                cJSON_Delete(m.rec);
            }
            break;
        }
    }
    return ok;
}

/* ---- Page pieces ------------------------------------------------------------------------- */

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

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* A JSON value as short display text: integers as written (exact up to
 * 2^53), other numbers to 4 significant digits, containers cut after 12
 * items or `budget` levels. */
static void value_text(kiln_strbuf *o, const cJSON *v, int budget) {
    char b[64];
    if (cJSON_IsNull(v)) {
        kiln_strbuf_printf(o, "null");
    } else if (cJSON_IsBool(v)) {
        kiln_strbuf_printf(o, "%s", cJSON_IsTrue(v) ? "true" : "false");
    } else if (cJSON_IsNumber(v)) {
        double x = v->valuedouble;
        if (x == floor(x) && fabs(x) <= 9007199254740992.0)
            kiln_strbuf_printf(o, "%lld", (long long)x);
        else
            rp_format_number(x, b, sizeof b), kiln_strbuf_printf(o, "%s", b);
    } else if (cJSON_IsString(v)) {
        rp_html_escape(o, v->valuestring);
    } else if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        kiln_strbuf_printf(o, cJSON_IsArray(v) ? "[" : "{");
        int i = 0;
        for (const cJSON *item = v->child; item; item = item->next, i++) {
            if (i) kiln_strbuf_printf(o, ", ");
            if (budget <= 0 || i >= 12) {
                kiln_strbuf_printf(o, "&hellip;");
                break;
            }
            if (cJSON_IsObject(v)) rp_html_escape(o, item->string), kiln_strbuf_printf(o, ": ");
            value_text(o, item, budget - 1);
        }
        kiln_strbuf_printf(o, cJSON_IsArray(v) ? "]" : "}");
    } else {
        kiln_strbuf_printf(o, "&hellip;");
    }
}

/* A summary value formatted by its name: bytes, accuracy, seconds. */
static void summary_value(kiln_strbuf *o, const char *key, const cJSON *v) {
    double x;
    char b[64];
    if (kiln_json_number(v, &x)) {
        if (ends_with(key, "_bytes") || strstr(key, "mem")) {
            rp_format_bytes(x, b, sizeof b);
            kiln_strbuf_printf(o, "%s", b);
            return;
        }
        if ((ends_with(key, "_acc") || !strcmp(key, "acc") || strstr(key, "accuracy")) && x >= 0 && x <= 1) {
            kiln_strbuf_printf(o, "%.2f%%", 100 * x);
            return;
        }
        rp_format_number(x, b, sizeof b);
        kiln_strbuf_printf(o, "%s%s", b, ends_with(key, "_s") && !strstr(key, "img") ? " s" : "");
        return;
    }
    value_text(o, v, 3);
}

static void object_table(kiln_strbuf *o, const cJSON *rec, bool summary) {
    kiln_strbuf_printf(o, "<table class=\"kv\"><tbody>\n");
    const cJSON *f;
    cJSON_ArrayForEach(f, rec) {
        if (!strcmp(f->string, "event")) continue;
        kiln_strbuf_printf(o, "<tr><th>");
        rp_html_escape(o, f->string);
        kiln_strbuf_printf(o, "</th><td>");
        if (summary)
            summary_value(o, f->string, f);
        else
            value_text(o, f, 3);
        kiln_strbuf_printf(o, "</td></tr>\n");
    }
    kiln_strbuf_printf(o, "</tbody></table>\n");
}

/* The records that are not step, epoch or summary, by event name: a
 * key/value table for a record that occurs once (a configuration), else
 * one row per record (checkpoints) with the first keys as columns. */
static void other_tables(kiln_strbuf *o, const run *r) {
    bool done[MAX_OTHER] = {false};
    for (size_t i = 0; i < r->n_other; i++) {
        if (done[i]) continue;
        const char *ev = kiln_json_string(kiln_json_get(r->other[i], "event"), "?");
        size_t same[MAX_OTHER], n = 0;
        for (size_t j = i; j < r->n_other; j++)
            if (!done[j] && !strcmp(ev, kiln_json_string(kiln_json_get(r->other[j], "event"), "?")))
                same[n++] = j, done[j] = true;
        kiln_strbuf_printf(o, "<h3>");
        rp_html_escape(o, ev);
        kiln_strbuf_printf(o, n > 1 ? " (%zu records)</h3>\n" : "</h3>\n", n);
        if (n == 1) {
            object_table(o, r->other[i], false);
            continue;
        }
        /* Columns: the keys of the first record, then any new ones, 12 at most. */
        const char *keys[12];
        int nk = 0;
        for (size_t k = 0; k < n; k++) {
            for (const cJSON *f = r->other[same[k]]->child; f && nk < 12; f = f->next) {
                bool seen = !strcmp(f->string, "event");
                for (int q = 0; q < nk && !seen; q++) seen = !strcmp(keys[q], f->string);
                if (!seen) keys[nk++] = f->string;
            }
        }
        kiln_strbuf_printf(o, "<table class=\"sortable\"><thead><tr>");
        for (int q = 0; q < nk; q++) {
            kiln_strbuf_printf(o, "<th>");
            rp_html_escape(o, keys[q]);
            kiln_strbuf_printf(o, "</th>");
        }
        kiln_strbuf_printf(o, "</tr></thead><tbody>\n");
        for (size_t k = 0; k < n; k++) {
            kiln_strbuf_printf(o, "<tr>");
            for (int q = 0; q < nk; q++) {
                const cJSON *v = kiln_json_get(r->other[same[k]], keys[q]);
                double x;
                if (kiln_json_number(v, &x))
                    kiln_strbuf_printf(o, "<td data-v=\"%.17g\">", x);
                else
                    kiln_strbuf_printf(o, "<td>");
                if (v) value_text(o, v, 2);
                kiln_strbuf_printf(o, "</td>");
            }
            kiln_strbuf_printf(o, "</tr>\n");
        }
        kiln_strbuf_printf(o, "</tbody></table>\n");
    }
}

/* Memory columns: names that say bytes or memory. Values in MiB. */
static bool is_memory_col(const char *name) {
    return strstr(name, "mem") || strstr(name, "alloc") || strstr(name, "reserved") || strstr(name, "peak") ||
           ends_with(name, "_bytes") || ends_with(name, "_mib");
}

static bool is_mib(const char *name) { return strstr(name, "mib") || ends_with(name, "_mb"); }

typedef struct plotter {
    kiln_strbuf *html, *notes;
    int plots;
} plotter;

/* A line plot of the named columns (NULL-terminated list of name, label
 * pairs); skipped with a note when none exists. `scale`: multiply y. */
static void plot_cols(plotter *pl, const cols *cs, const char *title, const char *xlabel, const char *ylabel,
                      const char *const *names, double scale, const char *missing) {
    bool from_zero = !strcmp(ylabel, "MiB") || !strcmp(ylabel, "seconds") || !strcmp(ylabel, "images/s");
    rp_series series[16];
    double *scaled[16] = {NULL};
    int n = 0;
    for (int i = 0; names[i] && n < 16; i += 2) {
        const col *c = col_find(cs, names[i]);
        if (!c || !c->n) continue;
        series[n] = (rp_series){.name = names[i + 1], .x = c->x, .y = c->y, .n = c->n};
        if (scale != 1) {
            scaled[n] = malloc(c->n * sizeof *scaled[n]);
            if (!scaled[n]) continue;
            for (size_t k = 0; k < c->n; k++) scaled[n][k] = c->y[k] * scale;
            series[n].y = scaled[n];
        }
        n++;
    }
    if (!n) {
        note(pl->notes, "%s: plot skipped (%s)", title, missing);
    } else {
        rp_plot p = {.title = title,
                     .xlabel = xlabel,
                     .ylabel = ylabel,
                     .series = series,
                     .n_series = n,
                     .x_integer = true,
                     .y_from_zero = from_zero};
        rp_line_plot(pl->html, &p);
        pl->plots++;
    }
    for (int i = 0; i < n; i++) free(scaled[i]);
}

/* Accuracy: every *_acc column of the epoch records, in percent. */
static void plot_accuracy(plotter *pl, const cols *ep) {
    const char *names[33];
    int n = 0;
    double maxv = 0;
    for (size_t i = 0; i < ep->n && n < 30; i++) {
        const char *nm = ep->c[i].name;
        if (!(ends_with(nm, "_acc") || !strcmp(nm, "acc") || strstr(nm, "accuracy"))) continue;
        names[n++] = nm, names[n++] = nm;
        for (size_t k = 0; k < ep->c[i].n; k++) maxv = fmax(maxv, ep->c[i].y[k]);
    }
    names[n] = NULL;
    bool fraction = maxv <= 1.0;
    plot_cols(pl, ep, "Accuracy per epoch", "epoch", fraction ? "accuracy (%)" : "accuracy", names,
              fraction ? 100 : 1, "no accuracy fields (test_acc, train_acc) in the epoch records");
}

static void plot_memory(plotter *pl, const cols *st, const cols *ep) {
    const cols *cs = st;
    int n_mem = 0;
    for (size_t i = 0; i < st->n; i++) n_mem += is_memory_col(st->c[i].name);
    if (!n_mem) cs = ep;
    const char *names[33];
    char labels[15][64];
    int n = 0;
    bool mib = false;
    for (size_t i = 0; i < cs->n && n < 30; i++) {
        const char *nm = cs->c[i].name;
        if (!is_memory_col(nm)) continue;
        /* "mem_allocated" and "allocated_bytes" read as "allocated". */
        const char *l = strncmp(nm, "mem_", 4) ? nm : nm + 4;
        size_t len = strlen(l);
        if (ends_with(l, "_bytes")) len -= 6;
        snprintf(labels[n / 2], sizeof labels[0], "%.*s", (int)len, l);
        names[n] = nm, names[n + 1] = labels[n / 2], n += 2;
        mib |= is_mib(nm);
    }
    names[n] = NULL;
    /* Bytes become MiB; fields already in MiB stay. Mixed units would
     * mislead: then the byte fields are plotted alone. */
    if (mib) {
        int k = 0;
        for (int i = 0; names[i]; i += 2)
            if (is_mib(names[i])) names[k] = names[i], names[k + 1] = names[i + 1], k += 2;
        names[k] = NULL;
    }
    plot_cols(pl, cs, "Memory over the run", cs == st ? "step" : "epoch", "MiB", names,
              mib ? 1 : 1.0 / 1048576.0,
              "no memory fields (allocated, reserved, peak) in the step or epoch records");
}

static const char page_css[] =
    "body{font:14px/1.4 system-ui,sans-serif;margin:24px auto;max-width:1000px;color:#222;padding:0 16px}"
    "h1{font-size:22px;margin-bottom:4px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}"
    "h3{font-size:15px}.sub{color:#666;margin-top:0}"
    "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}"
    "table.kv th{background:#f6f6f6;font-weight:600}thead th{background:#f0f0f0;cursor:pointer}"
    "td[data-v]{text-align:right}.notes{background:#fff8e1;border:1px solid #f0d98c;padding:8px 24px}"
    ".grid{display:flex;flex-wrap:wrap;gap:12px}svg.plot{border:1px solid #eee;background:#fff}"
    "svg text{font:11px system-ui,sans-serif;fill:#333}svg .title{font-size:14px;font-weight:600}"
    "svg .legend{font-size:12px}svg .label{font-size:12px}svg .grid{stroke:#eee}"
    "svg .axis,svg .tickmark{stroke:#888}svg .mark{stroke:#c00;stroke-dasharray:4 3}"
    "svg .marklabel{fill:#c00;font-weight:600}.note{color:#666}";

/* Sorts tables by a clicked header (numbers by data-v); marks the page
 * ready with its plot count, which the Chromium test reads. */
static const char page_js[] =
    "(function(){\n"
    "  var tables = document.querySelectorAll('table.sortable');\n"
    "  for (var t = 0; t < tables.length; t++) {\n"
    "    var heads = tables[t].querySelectorAll('thead th');\n"
    "    for (var h = 0; h < heads.length; h++) {\n"
    "      heads[h].addEventListener('click', (function(table, col) {\n"
    "        var asc = false;\n"
    "        return function() {\n"
    "          var body = table.tBodies[0];\n"
    "          var rows = Array.prototype.slice.call(body.rows);\n"
    "          asc = !asc;\n"
    "          rows.sort(function(a, b) {\n"
    "            var x = a.cells[col], y = b.cells[col];\n"
    "            var vx = x.hasAttribute('data-v') ? parseFloat(x.getAttribute('data-v')) : x.textContent;\n"
    "            var vy = y.hasAttribute('data-v') ? parseFloat(y.getAttribute('data-v')) : y.textContent;\n"
    "            var c = vx < vy ? -1 : vx > vy ? 1 : 0;\n"
    "            return asc ? c : -c;\n"
    "          });\n"
    "          for (var i = 0; i < rows.length; i++) body.appendChild(rows[i]);\n"
    "        };\n"
    "      })(tables[t], h));\n"
    "    }\n"
    "  }\n"
    "  document.body.setAttribute('data-ready', String(document.querySelectorAll('svg.plot').length));\n"
    "})();\n";

/* ---- The command ----------------------------------------------------------------------------- */

static void usage(FILE *f) {
    fprintf(f, "usage: kiln report RUN_DIR [--out FILE] [--snapshot FILE]\n"
               "  Writes RUN_DIR/report.html: one self-contained page with the run's summary,\n"
               "  configuration and plots from RUN_DIR/metrics.jsonl, and a memory timeline from\n"
               "  RUN_DIR/memory_snapshot.json when present (see docs/report.md).\n"
               "  --out FILE       write the page to FILE instead\n"
               "  --snapshot FILE  read the memory snapshot from FILE instead\n");
}

static void run_free(run *r) {
    cols_free(&r->step);
    cols_free(&r->epoch);
    cJSON_Delete(r->summary);
    for (size_t i = 0; i < r->n_other; i++) cJSON_Delete(r->other[i]);
}

int kiln_cmd_report(int argc, char **argv) {
    const char *dir = NULL, *out_arg = NULL, *snap_arg = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if ((!strcmp(argv[i], "--out") || !strcmp(argv[i], "--snapshot")) && i + 1 < argc) {
            *(argv[i][2] == 'o' ? &out_arg : &snap_arg) = argv[i + 1];
            i++;
        } else if (argv[i][0] == '-' || dir) {
            fprintf(stderr, "kiln report: unexpected argument '%s' (kiln report --help)\n", argv[i]);
            return 2;
        } else {
            dir = argv[i];
        }
    }
    if (!dir) {
        usage(stderr);
        return 2;
    }
    char metrics_path[4096], snap_path[4096], out_path[4096], tmp_path[4200];
    snprintf(metrics_path, sizeof metrics_path, "%s/metrics.jsonl", dir);
    snprintf(snap_path, sizeof snap_path, "%s", snap_arg ? snap_arg : "");
    if (!snap_arg) snprintf(snap_path, sizeof snap_path, "%s/memory_snapshot.json", dir);
    snprintf(out_path, sizeof out_path, "%s", out_arg ? out_arg : "");
    if (!out_arg) snprintf(out_path, sizeof out_path, "%s/report.html", dir);

    run r;
    memset(&r, 0, sizeof r);
    kiln_strbuf html = {0}, notes = {0}, body = {0};
    plotter pl = {.html = &body, .notes = &notes};
    /* metrics.jsonl: read whole (bounded, regular files only). A missing
     * one is fine when there is a snapshot to show; one that exists but
     * cannot be read is an error, never a page that quietly lacks it. */
    char err[4400];
    size_t mlen = 0;
    char *mtext = kiln_metrics_read_file(metrics_path, KILN_METRICS_MAX_FILE_BYTES, &mlen, err, sizeof err);
    int merr = mtext ? 0 : errno;
    bool have_metrics = mtext != NULL, metrics_missing = merr == ENOENT;
    struct stat sb;
    /* There is one unless the name is free: a symlink loop or an unreadable
     * entry is reported by rp_memory_section, not taken for "none". */
    bool have_snapshot = snap_arg || stat(snap_path, &sb) == 0 || errno != ENOENT;
    if (!have_metrics && (!metrics_missing || !have_snapshot)) {
        fprintf(stderr, "kiln report: %s (%s)\n", err,
                merr == EFBIG ? "report a thinned copy that keeps every n-th step record, e.g. "
                                "awk 'NR % 10 == 1 || !/\"event\":\"step\"/'"
                              : "pass the --out directory of a kiln train run, which holds metrics.jsonl");
        return 1;
    }
    if (have_metrics) {
        bool ok = read_metrics(mtext, mlen, &r);
        free(mtext);
        if (!ok) {
            fprintf(stderr, "kiln report: out of host memory reading %s\n", metrics_path);
            run_free(&r);
            return 1;
        }
    } else {
        note(&notes, "%s does not exist: training plots skipped", metrics_path);
    }
    if (r.malformed) {
        char lines[96] = "";
        for (size_t i = 0, len = 0; i < r.n_bad_listed; i++)
            len += (size_t)snprintf(lines + len, sizeof lines - len, "%s%zu", i ? ", " : "", r.bad_line[i]);
        note(&notes, "%zu malformed line%s in metrics.jsonl skipped (line%s %s%s)", r.malformed,
             r.malformed == 1 ? "" : "s", r.n_bad_listed == 1 ? "" : "s", lines,
             r.malformed > r.n_bad_listed ? ", ..." : "");
    }
    if (r.too_long)
        note(&notes, "%zu line%s of metrics.jsonl longer than %zu bytes skipped unread", r.too_long,
             r.too_long == 1 ? "" : "s", KILN_METRICS_MAX_LINE_BYTES);
    if (r.no_event) note(&notes, "%zu records without an \"event\" field skipped", r.no_event);
    if (have_metrics && !r.summary)
        note(&notes,
             "no summary record: the run was interrupted or is still running (figures below come from the "
             "records it wrote)");

    /* Summary and configuration. */
    kiln_strbuf_printf(&body, "<h2>Summary</h2>\n");
    if (r.summary) {
        object_table(&body, r.summary, true);
    } else {
        kiln_strbuf_printf(
            &body,
            "<p class=\"note\">Run incomplete: no summary record.</p>\n<table class=\"kv\"><tbody>"
            "<tr><th>step records</th><td>%zu</td></tr><tr><th>epoch records</th><td>%zu</td></tr>",
            r.n_step, r.n_epoch);
        const col *acc = col_find(&r.epoch, "test_acc"), *loss = col_find(&r.step, "loss");
        char x[32], y[32];
        if (acc && acc->n) {
            double a = acc->y[acc->n - 1];
            rp_format_number(acc->x[acc->n - 1], x, sizeof x);
            if (a >= 0 && a <= 1)
                snprintf(y, sizeof y, "%.2f", 100 * a);
            else
                rp_format_number(a, y, sizeof y);
            kiln_strbuf_printf(&body, "<tr><th>last test_acc (epoch %s)</th><td>%s%%</td></tr>", x, y);
        }
        if (loss && loss->n) {
            rp_format_number(loss->x[loss->n - 1], x, sizeof x);
            snprintf(y, sizeof y, "%.4g", loss->y[loss->n - 1]);
            kiln_strbuf_printf(&body, "<tr><th>last loss (step %s)</th><td>%s</td></tr>", x, y);
        }
        kiln_strbuf_printf(&body, "</tbody></table>\n");
    }
    if (r.n_other) {
        kiln_strbuf_printf(&body, "<h2>Configuration and other records</h2>\n");
        other_tables(&body, &r);
        if (r.extra_other)
            note(&notes, "%zu further records (not step, epoch or summary) not shown", r.extra_other);
    }

    /* Training plots. */
    if (have_metrics) {
        kiln_strbuf_printf(&body, "<h2>Training</h2>\n<div class=\"grid\">\n");
        static const char *const loss_names[] = {"loss", "loss", NULL};
        plot_cols(&pl, &r.step, "Training loss per step window", "step", "loss", loss_names, 1,
                  "no loss field in the step records");
        static const char *const ep_loss[] = {"train_loss", "train", "test_loss", "test", NULL};
        plot_cols(&pl, &r.epoch, "Loss per epoch", "epoch", "loss", ep_loss, 1,
                  "no train_loss or test_loss in the epoch records");
        plot_accuracy(&pl, &r.epoch);
        static const char *const tput[] = {"img_s", "train images/s", "samples_s", "samples/s", NULL};
        plot_cols(&pl, &r.step, "Throughput per step window", "step", "images/s", tput, 1,
                  "no img_s field in the step records");
        plot_memory(&pl, &r.step, &r.epoch);
        static const char *const times[] = {"window_s", "step window", "data_wait_s", "waiting for data",
                                            NULL};
        plot_cols(&pl, &r.step, "Time per step window", "step", "seconds", times, 1,
                  "no window_s or data_wait_s field in the step records");
        static const char *const lr[] = {"lr", "learning rate", NULL};
        plot_cols(&pl, &r.step, "Learning rate", "step", "lr", lr, 1, "no lr field in the step records");
        kiln_strbuf_printf(&body, "</div>\n");
    }
    /* A snapshot that exists but cannot be read (a FIFO, a directory, too
     * large) is an error like metrics.jsonl's; bad JSON inside is a note. */
    if (have_snapshot && rp_memory_section(&body, &notes, snap_path, &pl.plots) != 0) {
        free(html.data), free(notes.data), free(body.data);
        run_free(&r);
        return 1;
    }
    if (!have_snapshot)
        note(&notes,
             "no memory snapshot (%s): memory timeline skipped; a program writes one with "
             "kiln_memory_snapshot (docs/report.md)",
             snap_path);

    /* The page. */
    time_t now = time(NULL);
    char when[64];
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", gmtime(&now));
    kiln_strbuf_printf(&html,
                       "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>Kiln "
                       "report: ");
    rp_html_escape(&html, dir);
    kiln_strbuf_printf(&html,
                       "</title>\n<style>%s</style>\n</head>\n<body>\n<h1>Kiln run report</h1>\n<p "
                       "class=\"sub\">",
                       page_css);
    rp_html_escape(&html, dir);
    kiln_strbuf_printf(&html, " &middot; generated %s &middot; kiln report</p>\n", when);
    if (notes.len)
        kiln_strbuf_printf(&html, "<div class=\"notes\"><b>Notes</b><ul>\n%s</ul></div>\n", notes.data);
    if (body.data) kiln_strbuf_printf(&html, "%s", body.data);
    kiln_strbuf_printf(&html, "<script>\n%s</script>\n</body>\n</html>\n", page_js);
    int rc = 0;
    if (html.failed || body.failed || notes.failed) {
        fprintf(stderr, "kiln report: out of host memory building the page\n");
        rc = 1;
    } else {
        snprintf(tmp_path, sizeof tmp_path, "%s.tmp", out_path);
        FILE *f = fopen(tmp_path, "w");
        bool ok = f && fwrite(html.data, 1, html.len, f) == html.len;
        if (f) ok = fclose(f) == 0 && ok;
        if (!ok || rename(tmp_path, out_path) != 0) {
            fprintf(stderr, "kiln report: cannot write %s: %s (choose another with --out FILE)\n", out_path,
                    strerror(errno));
            remove(tmp_path);
            rc = 1;
        } else {
            size_t n_notes = 0;
            for (const char *p = notes.data; p && (p = strstr(p, "<li>")); p += 4) n_notes++;
            printf("kiln report: wrote %s (%d plot%s, %zu note%s)\n", out_path, pl.plots,
                   pl.plots == 1 ? "" : "s", n_notes, n_notes == 1 ? "" : "s");
        }
    }
    free(html.data), free(notes.data), free(body.data);
    run_free(&r);
    return rc;
}

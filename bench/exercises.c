/* `kiln bench exercises [--device D] [--out DIR] [--quick] [--rounds R]
 * [--only N] [--cifar DIR]`: the five exercises at the end of the PyTorch
 * CUDA-optimisation tutorial (docs/tutorials.md), answered with Kiln and
 * written as one self-contained page, DIR/exercises.html (inline SVG, in
 * the style of `kiln report`), and DIR/exercises.json:
 *   1. profile a training loop, name the top 3 ops by time;
 *   2. mixed precision's speed-up, with loss curves showing nothing broke;
 *   3. pinned against pageable memory in the data loader;
 *   4. gradient checkpointing's memory savings, beside kiln plan's
 *      prediction of each peak;
 *   5. DDP scaling efficiency (kiln bench ddp, under mpirun).
 * Each section says what the tutorial asked, the command that answers it
 * alone, the answer (medians of interleaved rounds with their spread) and
 * one sentence on what it means. Most figures come from child processes of
 * this binary (kiln train, kiln bench ddp), run as the section's command
 * says; their output is kept under DIR/logs. CIFAR-10 is the --cifar DIR
 * when given, else a synthetic directory in the standard binary layout
 * written under DIR (said on the page). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "../tools/report.h"
#include "../tools/train.h"
#include "bench.h"
#include "cpu_peak.h"
#include "kiln/plan.h"

#define EX_MAX_ROUNDS 9
#define EX_MAX_OPS    64
/* snprintf into an array, truncating (display text: a cut is harmless). */
#define TEXT(buf, ...) ((void)(snprintf((buf), sizeof(buf), __VA_ARGS__) < 0))

typedef struct ex {
    char exe[PATH_MAX], out[PATH_MAX], cifar[PATH_MAX + 32], device[64], devflag[80], cpu[160];
    const char *fmnist; /* Fashion-MNIST's directory, or NULL when it is not installed */
    bool quick, synthetic, cuda;
    int rounds, only;
    bench_cpu_info cpuinfo;
    kiln_strbuf body;
    cJSON *list;
    int sections, plots, tables;
} ex;

/* ---- Helpers ------------------------------------------------------------------------------ */

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    kiln_strbuf b = {0};
    char chunk[8192];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) kiln_strbuf_printf(&b, "%.*s", (int)n, chunk);
    fclose(f);
    if (!b.data) kiln_strbuf_printf(&b, "%s", "");
    return b.data;
}

/* Run this binary with `args` (a shell-quoted string); stdout and stderr
 * into DIR/logs/TAG.out/.err, read back into *out and *err (malloc'd, may be
 * NULL). The exit code (-1: not started). */
static int run_kiln(ex *e, const char *tag, char **out, char **err, const char *fmt, ...) {
    char args[4096], cmd[4 * PATH_MAX + 8192], po[PATH_MAX + 64], pe[PATH_MAX + 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(po, sizeof po, "%s/logs/%s.out", e->out, tag);
    snprintf(pe, sizeof pe, "%s/logs/%s.err", e->out, tag);
    snprintf(cmd, sizeof cmd, "'%s' %s > '%s' 2> '%s'", e->exe, args, po, pe);
    fprintf(stderr, "kiln bench exercises: %s: kiln %s\n", tag, args);
    int rc = system(cmd);
    if (out) *out = slurp(po);
    if (err) *err = slurp(pe);
    return rc == -1 ? -1 : WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

/* The last line of `text` that parses as a JSON object holding `key`. */
static cJSON *last_json(const char *text, const char *key) {
    cJSON *found = NULL;
    for (const char *p = text; p && *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        if (len > 1 && p[0] == '{') {
            char *line = strndup(p, len);
            cJSON *o = line ? cJSON_Parse(line) : NULL;
            free(line);
            if (o && cJSON_GetObjectItemCaseSensitive(o, key)) {
                cJSON_Delete(found);
                found = o;
            } else {
                cJSON_Delete(o);
            }
        }
        p = nl ? nl + 1 : NULL;
    }
    return found;
}

static double num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

typedef struct spread {
    double med, lo, hi;
    int n;
} spread;

static spread spread_of(const double *v, int n) {
    double t[EX_MAX_ROUNDS];
    int k = 0;
    for (int i = 0; i < n && k < EX_MAX_ROUNDS; i++)
        if (isfinite(v[i])) t[k++] = v[i];
    if (!k) return (spread){NAN, NAN, NAN, 0};
    spread s = {tool_median(t, k), t[0], t[k - 1], k}; /* tool_median sorted t */
    return s;
}

/* "123.4 [120.1-125.0]" (the median and the rounds' range), or the median alone for one round. */
static void cell(kiln_strbuf *b, spread s, const char *unit) {
    char m[32], lo[32], hi[32];
    rp_format_number(s.med, m, sizeof m);
    rp_format_number(s.lo, lo, sizeof lo);
    rp_format_number(s.hi, hi, sizeof hi);
    if (s.n > 1) kiln_strbuf_printf(b, "<td data-v=\"%g\">%s%s [%s&ndash;%s]</td>", s.med, m, unit, lo, hi);
    else kiln_strbuf_printf(b, "<td data-v=\"%g\">%s%s</td>", s.med, m, unit);
}

static cJSON *json_spread(spread s) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "median", s.med);
    cJSON_AddNumberToObject(o, "min", s.lo);
    cJSON_AddNumberToObject(o, "max", s.hi);
    cJSON_AddNumberToObject(o, "rounds", s.n);
    return o;
}

/* A plot of k configurations' medians with the rounds' min and max. */
static void spread_plot(ex *e, const char *title, const char *ylabel, const spread *s, int k, const char *xlabel) {
    double x[16], med[16], lo[16], hi[16];
    for (int i = 0; i < k && i < 16; i++) x[i] = i + 1, med[i] = s[i].med, lo[i] = s[i].lo, hi[i] = s[i].hi;
    rp_series series[3] = {{"median", x, med, (size_t)k, false},
                           {"slowest round", x, lo, (size_t)k, true},
                           {"fastest round", x, hi, (size_t)k, true}};
    rp_plot p = {.title = title, .xlabel = xlabel, .ylabel = ylabel, .series = series, .n_series = 3,
                 .y_from_zero = true, .x_integer = true};
    rp_line_plot(&e->body, &p);
    e->plots++;
}

static void section_begin(ex *e, int id, const char *title, const char *asked, const char *command) {
    kiln_strbuf_printf(&e->body, "<section id=\"ex%d\">\n<h2>%d. ", id, id);
    rp_html_escape(&e->body, title);
    kiln_strbuf_printf(&e->body, "</h2>\n<p><b>The tutorial asks:</b> ");
    rp_html_escape(&e->body, asked);
    kiln_strbuf_printf(&e->body, "</p>\n<p><b>The command that answers it alone:</b> <code>");
    rp_html_escape(&e->body, command);
    kiln_strbuf_printf(&e->body, "</code></p>\n");
    e->sections++;
}

static void section_end(ex *e, const char *answer, const char *meaning) {
    kiln_strbuf_printf(&e->body, "<p class=\"answer\"><b>Answer:</b> ");
    rp_html_escape(&e->body, answer);
    kiln_strbuf_printf(&e->body, "</p>\n<p><b>What it means:</b> ");
    rp_html_escape(&e->body, meaning);
    kiln_strbuf_printf(&e->body, "</p>\n</section>\n");
}

static void note(ex *e, const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    kiln_strbuf_printf(&e->body, "<p class=\"note\">");
    rp_html_escape(&e->body, buf);
    kiln_strbuf_printf(&e->body, "</p>\n");
}

static cJSON *add_exercise(ex *e, int id, const char *command) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", id);
    cJSON_AddStringToObject(o, "command", command);
    cJSON_AddItemToArray(e->list, o);
    return o;
}

/* ---- 1. The profile ----------------------------------------------------------------------------- */

typedef struct op_row {
    char name[64];
    double self_ms[EX_MAX_ROUNDS], share[EX_MAX_ROUNDS], calls[EX_MAX_ROUNDS];
} op_row;

static double to_ms(double v, const char *unit) {
    if (!strcmp(unit, "s")) return v * 1e3;
    if (!strcmp(unit, "ms")) return v;
    if (!strcmp(unit, "us")) return v * 1e-3;
    if (!strcmp(unit, "ns")) return v * 1e-6;
    return NAN;
}

/* The ops of kiln train's profile table (stderr) into rows, round r. */
static int parse_profile(const char *err, op_row *rows, int n_rows, int r) {
    const char *p = err ? strstr(err, "kiln train: profile of") : NULL;
    p = p ? strstr(p, "\nName ") : NULL;
    if (!p) return n_rows;
    p = strchr(p + 1, '\n');   /* the header */
    p = p ? strchr(p + 1, '\n') : NULL; /* the rule under it */
    while (p && *++p && *p != '-') {
        char name[64], u_self[16];
        double pct, self;
        if (sscanf(p, "%63s %lf%% %lf%15s", name, &pct, &self, u_self) == 4) {
            /* the calls column: the 9th field */
            char f[10][32];
            int k = sscanf(p, "%31s %31s %31s %31s %31s %31s %31s %31s %31s", f[0], f[1], f[2], f[3], f[4], f[5],
                           f[6], f[7], f[8]);
            bool skip = !strcmp(name, "step") || !strncmp(name, "ProfilerStep", 12) || !strncmp(name, "backward_", 9);
            if (k == 9 && !skip) {
                int i = 0;
                while (i < n_rows && strcmp(rows[i].name, name)) i++;
                if (i == n_rows && n_rows < EX_MAX_OPS) {
                    memset(&rows[i], 0, sizeof rows[i]);
                    for (int j = 0; j < EX_MAX_ROUNDS; j++) rows[i].self_ms[j] = rows[i].share[j] = rows[i].calls[j] = NAN;
                    snprintf(rows[i].name, sizeof rows[i].name, "%s", name);
                    n_rows++;
                }
                if (i < n_rows) {
                    rows[i].self_ms[r] = to_ms(self, u_self);
                    rows[i].share[r] = pct;
                    rows[i].calls[r] = atof(f[8]);
                }
            }
        }
        p = strchr(p, '\n');
    }
    return n_rows;
}

static int cmp_rows(const void *a, const void *b) {
    double x = ((const op_row *)a)->share[EX_MAX_ROUNDS - 1], y = ((const op_row *)b)->share[EX_MAX_ROUNDS - 1];
    return x < y ? 1 : x > y ? -1 : 0;
}

static void exercise_profile(ex *e) {
    int batch = e->quick ? 32 : 128, steps = e->quick ? 2 : 5;
    char cmd[3 * PATH_MAX + 2048];
    snprintf(cmd, sizeof cmd,
             "kiln train --dataset cifar10 --data %s --batch %d --profile %d --max-steps %d --schedule constant "
             "--workers 0%s --out DIR",
             e->cifar, batch, steps, steps + 1, e->devflag);
    section_begin(e, 1, "Profile a training loop: the top 3 operations by time",
                  "Profile a simple neural network training loop on your GPU and identify the top 3 operations that "
                  "consume the most time.",
                  cmd);
    cJSON *j = add_exercise(e, 1, cmd);
    static op_row rows[EX_MAX_OPS];
    int n = 0, ok = 0;
    char trace[PATH_MAX + 64] = "";
    for (int r = 0; r < e->rounds; r++) {
        char tag[32], *err = NULL;
        TEXT(tag, "ex1_round%d", r + 1);
        int rc = run_kiln(e, tag, NULL, &err,
                          "train --dataset cifar10 --data '%s' --batch %d --profile %d --max-steps %d --schedule "
                          "constant --workers 0%s --out '%s/runs/%s'",
                          e->cifar, batch, steps, steps + 1, e->devflag, e->out, tag);
        if (rc == 0) {
            n = parse_profile(err, rows, n, r);
            ok++;
            if (!trace[0]) TEXT(trace, "runs/%s/trace.json", tag);
        }
        free(err);
    }
    /* Order by the median share (kept in the last slot for the sort). */
    for (int i = 0; i < n; i++) rows[i].share[EX_MAX_ROUNDS - 1] = spread_of(rows[i].share, e->rounds).med;
    qsort(rows, (size_t)n, sizeof rows[0], cmp_rows);
    kiln_strbuf_printf(&e->body,
                       "<table class=\"sortable\"><thead><tr><th>Op</th><th>Self CPU per step</th><th>Share of the "
                       "profiled steps</th><th>Calls per step</th></tr></thead><tbody>\n");
    cJSON *top = cJSON_AddArrayToObject(j, "top_ops");
    spread plot_s[8];
    int shown = n < 8 ? n : 8;
    for (int i = 0; i < shown; i++) {
        double per_step[EX_MAX_ROUNDS], calls[EX_MAX_ROUNDS];
        for (int r = 0; r < e->rounds; r++) per_step[r] = rows[i].self_ms[r] / steps, calls[r] = rows[i].calls[r] / steps;
        spread s = spread_of(per_step, e->rounds), sh = spread_of(rows[i].share, e->rounds),
               c = spread_of(calls, e->rounds);
        plot_s[i] = s;
        kiln_strbuf_printf(&e->body, "<tr><td>%d. ", i + 1);
        rp_html_escape(&e->body, rows[i].name);
        kiln_strbuf_printf(&e->body, "</td>");
        cell(&e->body, s, " ms");
        cell(&e->body, sh, "%");
        cell(&e->body, c, "");
        kiln_strbuf_printf(&e->body, "</tr>\n");
        if (i < 3) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "op", rows[i].name);
            cJSON_AddItemToObject(o, "self_ms_per_step", json_spread(s));
            cJSON_AddItemToObject(o, "share_percent", json_spread(sh));
            cJSON_AddNumberToObject(o, "calls_per_step", c.med);
            cJSON_AddItemToArray(top, o);
        }
    }
    kiln_strbuf_printf(&e->body, "</tbody></table>\n");
    e->tables++;
    spread_plot(e, "Self CPU time per step of the top ops (by rank in the table)", "ms per step", plot_s, shown,
                "op (rank)");
    if (trace[0]) {
        kiln_strbuf_printf(&e->body, "<p>The trace of round 1: <a href=\"%s\">%s</a> (open it in Perfetto).</p>\n",
                           trace, trace);
        cJSON_AddStringToObject(j, "trace", trace);
    }
    char answer[PATH_MAX + 512];
    if (n >= 3)
        TEXT(answer, "%s (%.1f%%), %s (%.1f%%) and %s (%.1f%%) of the profiled steps' time, over %d of %d rounds of %d steps at batch %d on %s.",
                 rows[0].name, rows[0].share[EX_MAX_ROUNDS - 1], rows[1].name, rows[1].share[EX_MAX_ROUNDS - 1],
                 rows[2].name, rows[2].share[EX_MAX_ROUNDS - 1], ok, e->rounds, steps, batch, e->device);
    else
        TEXT(answer, "no profile table was produced (see %s/logs/ex1_round1.err).", e->out);
    section_end(e, answer,
                "The convolutions and their two gradients take most of the tutorial CNN's step, so they are where a "
                "faster kernel (oneDNN on the CPU, cuDNN on a GPU) or a smaller input pays; the loader and the "
                "optimizer barely show.");
    cJSON_AddStringToObject(j, "answer", answer);
}

/* ---- 2. Mixed precision ------------------------------------------------------------------------- */

static void exercise_amp(ex *e) {
    const char *modes_cpu[] = {"auto", "bf16"}, *modes_gpu[] = {"off", "f16", "bf16"};
    const char **modes = e->cuda ? modes_gpu : modes_cpu;
    int n_modes = e->cuda ? 3 : 2;
    int limit = e->quick ? 256 : 4096, batch = 128;
    char data[PATH_MAX + 128], cmd[3 * PATH_MAX + 2048];
    if (e->fmnist) TEXT(data, "--limit %d", limit);
    else TEXT(data, "--dataset cifar10 --data '%s' --limit %d", e->cifar, limit);
    TEXT(cmd, "kiln train %s --epochs 1 --batch %d --log-every 1 --schedule constant --workers 0%s "
             "--amp %s (and --amp %s)", data, batch, e->devflag, modes[0], modes[n_modes - 1]);
    section_begin(e, 2, "Mixed precision: the speed-up",
                  "Implement mixed precision training for a model of your choice and measure the speedup.", cmd);
    cJSON *j = add_exercise(e, 2, cmd);
    double img_s[3][EX_MAX_ROUNDS];
    double loss_x[3][512], loss_y[3][512];
    size_t n_loss[3] = {0};
    char amp_line[512] = "", amp_used[3][16] = {"", "", ""};
    for (int r = 0; r < e->rounds; r++)
        for (int m = 0; m < n_modes; m++) { /* interleaved: each round runs every mode */
            char tag[32], *out = NULL, *err = NULL;
            TEXT(tag, "ex2_%s_round%d", modes[m], r + 1);
            img_s[m][r] = NAN;
            int rc = run_kiln(e, tag, &out, &err,
                              "train %s --epochs 1 --batch %d --log-every 1 --schedule constant --workers 0%s --amp "
                              "%s --out '%s/runs/%s'",
                              data, batch, e->devflag, modes[m], e->out, tag);
            cJSON *sum = rc == 0 ? last_json(out, "train_img_s") : NULL;
            if (sum) {
                img_s[m][r] = num(sum, "train_img_s");
                const cJSON *a = cJSON_GetObjectItemCaseSensitive(sum, "amp");
                if (cJSON_IsString(a)) snprintf(amp_used[m], sizeof amp_used[m], "%s", a->valuestring);
            }
            cJSON_Delete(sum);
            const char *l = err ? strstr(err, "kiln train: mixed precision") : NULL;
            if (l && m == 0 && !amp_line[0]) TEXT(amp_line, "%.*s", (int)strcspn(l, "\n"), l);
            if (r == 0 && rc == 0) { /* the loss curve of round 1 */
                char path[PATH_MAX + 96];
                snprintf(path, sizeof path, "%s/runs/%s/metrics.jsonl", e->out, tag);
                char *metrics = slurp(path);
                for (const char *p = metrics; p && (p = strstr(p, "{\"event\":\"step\"")) && n_loss[m] < 512; p++) {
                    const char *s = strstr(p, "\"step\":"), *lo = strstr(p, "\"loss\":");
                    if (!s || !lo) break;
                    loss_x[m][n_loss[m]] = atof(s + 7);
                    loss_y[m][n_loss[m]] = atof(lo + 7);
                    n_loss[m]++;
                }
                free(metrics);
            }
            free(out);
            free(err);
        }
    if (!e->cuda)
        note(e, "This CPU (%s) has %s: bf16 here is emulated (converted in software around f32 arithmetic), so it "
                "shows what runs, not what bf16 hardware would give. --amp auto resolves to: %s",
             e->cpu, e->cpuinfo.native_bf16 ? "native bf16 instructions" : "no bf16 instructions (no AVX512_BF16, no AMX-BF16)",
             amp_line[0] ? amp_line : "(not reported)");
    kiln_strbuf_printf(&e->body, "<table class=\"sortable\"><thead><tr><th>--amp</th><th>ran as</th><th>training "
                                 "images/s</th><th>vs the first</th></tr></thead><tbody>\n");
    spread s[3];
    cJSON *res = cJSON_AddArrayToObject(j, "modes");
    for (int m = 0; m < n_modes; m++) {
        s[m] = spread_of(img_s[m], e->rounds);
        kiln_strbuf_printf(&e->body, "<tr><td>%s</td><td>%s</td>", modes[m], amp_used[m][0] ? amp_used[m] : "?");
        cell(&e->body, s[m], "");
        kiln_strbuf_printf(&e->body, "<td data-v=\"%g\">%.2fx</td></tr>\n", s[m].med / s[0].med, s[m].med / s[0].med);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "amp", modes[m]);
        cJSON_AddStringToObject(o, "ran_as", amp_used[m]);
        cJSON_AddItemToObject(o, "img_s", json_spread(s[m]));
        cJSON_AddItemToArray(res, o);
    }
    kiln_strbuf_printf(&e->body, "</tbody></table>\n");
    e->tables++;
    spread_plot(e, "Training images/s per --amp mode (in the table's order)", "images/s", s, n_modes, "--amp mode");
    rp_series ls[3];
    for (int m = 0; m < n_modes; m++) ls[m] = (rp_series){modes[m], loss_x[m], loss_y[m], n_loss[m], m > 0};
    rp_plot lp = {.title = e->fmnist ? "Training loss per step (Fashion-MNIST, round 1)" : "Training loss per step (round 1)",
                  .xlabel = "step", .ylabel = "loss", .series = ls, .n_series = n_modes, .x_integer = true};
    rp_line_plot(&e->body, &lp);
    e->plots++;
    char answer[PATH_MAX + 512];
    TEXT(answer, "%s: %.0f images/s; %s: %.0f images/s (%.2fx), medians of %d rounds%s.",
             modes[0], s[0].med, modes[n_modes - 1], s[n_modes - 1].med, s[n_modes - 1].med / s[0].med, e->rounds,
             e->fmnist ? " on Fashion-MNIST" : "");
    section_end(e, answer,
                e->cuda ? "On a GPU with tensor cores f16/bf16 halve the bytes moved and use the tensor cores; the loss "
                          "curves lying together say the lower precision did not break training."
                        : "On a CPU without bf16 instructions mixed precision cannot be faster (every bf16 value is "
                          "converted in software), which is why --amp auto leaves it off here; the loss curves lying "
                          "together say it trains the same.");
    cJSON_AddStringToObject(j, "amp_auto", amp_line);
    cJSON_AddStringToObject(j, "answer", answer);
}

/* ---- 3. Pinned against pageable ----------------------------------------------------------------- */

/* One loader epoch's images/s over ds, pinned or not. */
static double loader_img_s(kiln_dataset *ds, kiln_device dev, bool pinned) {
    kiln_loader_opts o = kiln_loader_opts_default();
    o.batch_size = 128;
    o.num_workers = 0;
    o.pin_memory = pinned;
    o.device = dev;
    o.transforms.normalize = true;
    for (int c = 0; c < 3; c++) o.transforms.mean[c] = 0.5f, o.transforms.std[c] = 0.25f;
    kiln_loader *ld = NULL;
    if (kiln_loader_create(ds, &o, &ld) != KILN_OK) return NAN;
    double t0 = tool_now_s();
    int64_t images = 0;
    kiln_status st = kiln_loader_epoch_begin(ld, 0);
    while (st == KILN_OK) {
        kiln_scope_begin();
        kiln_tensor *x = NULL, *y = NULL;
        st = kiln_loader_next(ld, &x, &y);
        if (x) images += kiln_size(x, 0);
        bool end = !x;
        kiln_scope_end();
        if (end) break;
    }
    if (st == KILN_OK && dev.type != KILN_DEVICE_CPU) st = kiln_device_synchronize(dev);
    double dt = tool_now_s() - t0;
    kiln_loader_free(ld);
    return st == KILN_OK && dt > 0 ? (double)images / dt : NAN;
}

/* GB/s of copying `bytes` from a pageable buffer into `dst`, best of 3 copies. */
static double copy_gb_s(void *dst, const void *src, size_t bytes) {
    double best = 0;
    for (int i = 0; i < 3; i++) {
        double t0 = tool_now_s();
        memcpy(dst, src, bytes);
        double dt = tool_now_s() - t0;
        if (dt > 0 && bytes / dt / 1e9 > best) best = bytes / dt / 1e9;
    }
    return best;
}

static void exercise_pinned(ex *e) {
    char cmd[256];
    TEXT(cmd, "kiln bench exercises --only 3%s%s", e->devflag, e->quick ? " --quick" : "");
    section_begin(e, 3, "Pinned against pageable memory in the data loader",
                  "Compare the performance of a CNN model with and without pinned memory for the data loader.", cmd);
    cJSON *j = add_exercise(e, 3, cmd);
    kiln_device dev = KILN_CPU;
    if (e->cuda && kiln_device_parse(e->device, &dev) != KILN_OK) dev = KILN_CPU;
    if (!e->cuda)
        note(e, "No GPU here (%s): there is nothing to copy the batches to, so pinning cannot speed anything up. "
                "What is shown is its host-side cost only: the loader assembling CIFAR-sized batches into pinned "
                "or pageable buffers, and a host memcpy into each kind of buffer.",
             kiln_device_absent_reason(KILN_DEVICE_CUDA));
    int n_images = e->quick ? 1024 : 8192;
    kiln_dataset *ds = kiln_bench_synthetic_cifar(n_images);
    size_t bytes = (size_t)(e->quick ? 16 : 64) << 20;
    kiln_tensor *pinned = kiln_empty_pinned(KILN_SHAPE((int64_t)bytes), KILN_U8);
    void *pageable = malloc(bytes), *src = malloc(bytes);
    double ld[2][EX_MAX_ROUNDS], cp[2][EX_MAX_ROUNDS];
    for (int r = 0; r < e->rounds; r++) {
        for (int k = 0; k < 2; k++) ld[k][r] = cp[k][r] = NAN;
        /* Alternate which goes first: a warm cache favours the second. */
        for (int k = 0; k < 2 && ds; k++) {
            int which = (k + r) % 2;
            ld[which][r] = loader_img_s(ds, dev, which == 0);
        }
        if (pinned && pageable && src) {
            memset(src, r + 1, bytes);
            cp[0][r] = copy_gb_s(kiln_data_ptr(pinned), src, bytes);
            cp[1][r] = copy_gb_s(pageable, src, bytes);
        }
    }
    spread sl[2] = {spread_of(ld[0], e->rounds), spread_of(ld[1], e->rounds)};
    spread sc[2] = {spread_of(cp[0], e->rounds), spread_of(cp[1], e->rounds)};
    kiln_strbuf_printf(&e->body, "<table class=\"sortable\"><thead><tr><th>batches in</th><th>loader images/s "
                                 "(batch 128, to %s)</th><th>%s GB/s</th></tr></thead><tbody>\n",
                       e->cuda ? e->device : "the host", e->cuda ? "host memcpy (pageable source)" : "host memcpy");
    const char *names[2] = {"pinned memory", "pageable memory"};
    cJSON *res = cJSON_AddArrayToObject(j, "buffers");
    for (int k = 0; k < 2; k++) {
        kiln_strbuf_printf(&e->body, "<tr><td>%s</td>", names[k]);
        cell(&e->body, sl[k], "");
        cell(&e->body, sc[k], "");
        kiln_strbuf_printf(&e->body, "</tr>\n");
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "memory", k ? "pageable" : "pinned");
        cJSON_AddItemToObject(o, "loader_img_s", json_spread(sl[k]));
        cJSON_AddItemToObject(o, "memcpy_gb_s", json_spread(sc[k]));
        cJSON_AddItemToArray(res, o);
    }
    kiln_strbuf_printf(&e->body, "</tbody></table>\n");
    e->tables++;
    spread_plot(e, "Loader images/s: 1 pinned, 2 pageable", "images/s", sl, 2, "buffers");
    if (e->cuda) note(e, "The device copy bandwidth of each kind of buffer: kiln bench copy --device %s.", e->device);
    char answer[PATH_MAX + 512];
    TEXT(answer, "pinned %.0f images/s, pageable %.0f images/s (%.2fx); memcpy %.1f vs %.1f GB/s, "
             "medians of %d rounds over %d synthetic CIFAR images.",
             sl[0].med, sl[1].med, sl[0].med / sl[1].med, sc[0].med, sc[1].med, e->rounds, n_images);
    section_end(e, answer,
                e->cuda ? "Pinned batches let the copy to the GPU run asynchronously on the copy stream, overlapped "
                          "with compute; pageable ones are staged and block the host."
                        : "Without a GPU pinned and pageable buffers cost the loader the same to fill (a difference "
                          "within the spread is noise); pinning only pays when a device copies from the buffer.");
    cJSON_AddStringToObject(j, "answer", answer);
    cJSON_AddBoolToObject(j, "gpu", e->cuda);
    kiln_release(pinned);
    free(pageable);
    free(src);
    kiln_dataset_free(ds);
}

/* ---- 4. Gradient checkpointing ------------------------------------------------------------------ */

static void exercise_checkpoint(ex *e) {
    char model[PATH_MAX];
    if (!train_default_model("resnet_small_cifar10.txt", model, sizeof model)) snprintf(model, sizeof model, "models/resnet_small_cifar10.txt");
    int batch = e->quick ? 32 : 128, steps = e->quick ? 2 : 3;
    char cmd[3 * PATH_MAX + 2048];
    snprintf(cmd, sizeof cmd,
             "kiln train --dataset cifar10 --data %s --model %s --batch %d --limit %d --epochs 1 --schedule constant "
             "--workers 0%s --checkpoint off|2|4|auto [--memory-budget SIZE]; kiln plan for the predictions",
             e->cifar, model, batch, batch * steps, e->devflag);
    section_begin(e, 4, "Gradient checkpointing: the memory savings",
                  "Implement gradient checkpointing for a large model and measure the memory savings.", cmd);
    cJSON *j = add_exercise(e, 4, cmd);
    /* The plan of each segment count (1: off); auto's budget halfway
     * between the planned reserved peaks of off and 2 segments, and the
     * count its rule (the fewest segments whose planned reserved peak fits)
     * picks under it. */
    const int segs[3] = {0, 2, 4};
    double planned[4] = {NAN, NAN, NAN, NAN}, alloc[7], reserved[7];
    kiln_device dev = KILN_CPU;
    if (e->cuda) kiln_device_parse(e->device, &dev);
    for (int k = 1; k <= 6; k++) {
        kiln_plan_opts po = {.model = model, .batch = batch, .device = dev, .amp = KILN_F32,
                             .checkpoint = k == 1 ? 0 : k, .accum = 1, .steps = 2};
        kiln_plan p;
        alloc[k] = reserved[k] = NAN;
        if (kiln_plan_step(&po, &p) == KILN_OK)
            alloc[k] = (double)p.memory[0].allocated_peak, reserved[k] = (double)p.memory[0].reserved_peak;
        else
            fprintf(stderr, "kiln bench exercises: kiln_plan_step (%d segments): %s\n", k, kiln_error_message());
    }
    planned[0] = alloc[1], planned[1] = alloc[2], planned[2] = alloc[4];
    double lowest = reserved[1];
    for (int k = 2; k <= 6; k++)
        if (isfinite(reserved[k]) && reserved[k] < lowest) lowest = reserved[k];
    int64_t budget = isfinite(lowest) ? (int64_t)((reserved[1] + lowest) / 2) : 0;
    int chosen = 0;
    for (int k = 1; k <= 6 && !chosen; k++)
        if (isfinite(reserved[k]) && reserved[k] <= (double)budget) chosen = k;
    if (chosen) planned[3] = alloc[chosen];
    const char *labels[4] = {"off", "2 segments", "4 segments", "auto"};
    double peak[4][EX_MAX_ROUNDS], step_ms[4][EX_MAX_ROUNDS];
    char auto_line[512] = "";
    for (int r = 0; r < e->rounds; r++)
        for (int c = 0; c < 4; c++) {
            char tag[32], arg[96], *out = NULL, *err = NULL;
            peak[c][r] = step_ms[c][r] = NAN;
            if (c == 3 && budget <= 0) continue;
            TEXT(tag, "ex4_%d_round%d", c, r + 1);
            if (c == 0) TEXT(arg, "--checkpoint 0");
            else if (c < 3) TEXT(arg, "--checkpoint %d", segs[c]);
            else TEXT(arg, "--checkpoint auto --memory-budget %lld", (long long)budget);
            int rc = run_kiln(e, tag, &out, &err,
                              "train --dataset cifar10 --data '%s' --model '%s' --batch %d --limit %d --epochs 1 "
                              "--schedule constant --workers 0%s %s --out '%s/runs/%s'",
                              e->cifar, model, batch, batch * steps, e->devflag, arg, e->out, tag);
            cJSON *sum = rc == 0 ? last_json(out, "peak_bytes") : NULL;
            if (sum) {
                peak[c][r] = num(sum, "peak_bytes");
                step_ms[c][r] = 1e3 * num(sum, "train_s") / num(sum, "steps");
            }
            cJSON_Delete(sum);
            const char *l = err ? strstr(err, "--checkpoint auto") : NULL;
            if (c == 3 && l && !auto_line[0]) {
                while (l > err && l[-1] != '\n') l--;
                TEXT(auto_line, "%.*s", (int)strcspn(l, "\n"), l);
            }
            free(out);
            free(err);
        }
    kiln_strbuf_printf(&e->body, "<table class=\"sortable\"><thead><tr><th>--checkpoint</th><th>measured step peak "
                                 "(allocated)</th><th>kiln plan's prediction</th><th>vs off</th><th>step "
                                 "time</th></tr></thead><tbody>\n");
    spread sp[4], st[4];
    cJSON *res = cJSON_AddArrayToObject(j, "configs");
    for (int c = 0; c < 4; c++) {
        sp[c] = spread_of(peak[c], e->rounds);
        st[c] = spread_of(step_ms[c], e->rounds);
        char m[32], p[32];
        rp_format_bytes(sp[c].med, m, sizeof m);
        if (isfinite(planned[c])) rp_format_bytes(planned[c], p, sizeof p);
        else snprintf(p, sizeof p, "n/a");
        kiln_strbuf_printf(&e->body, "<tr><td>%s</td><td data-v=\"%g\">%s</td><td data-v=\"%g\">%s</td>"
                                     "<td data-v=\"%g\">%.0f%%</td>",
                           labels[c], sp[c].med, m, planned[c], p, sp[c].med / sp[0].med, 100 * sp[c].med / sp[0].med);
        cell(&e->body, st[c], " ms");
        kiln_strbuf_printf(&e->body, "</tr>\n");
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "checkpoint", labels[c]);
        cJSON_AddItemToObject(o, "peak_bytes", json_spread(sp[c]));
        if (isfinite(planned[c])) cJSON_AddNumberToObject(o, "planned_bytes", planned[c]);
        else cJSON_AddNullToObject(o, "planned_bytes");
        cJSON_AddItemToObject(o, "step_ms", json_spread(st[c]));
        cJSON_AddItemToArray(res, o);
    }
    kiln_strbuf_printf(&e->body, "</tbody></table>\n");
    e->tables++;
    note(e, "auto ran under --memory-budget %.1f MiB (halfway between the planned reserved peak of off and the "
            "lowest of 2..6 segments); by kiln plan the fewest segments that fit are %d (1: off). kiln train said: %s",
         (double)budget / (1 << 20), chosen, auto_line[0] ? auto_line : "(nothing)");
    double x[4] = {1, 2, 3, 4}, mp[4], pp[4];
    for (int c = 0; c < 4; c++) mp[c] = sp[c].med / (1 << 20), pp[c] = planned[c] / (1 << 20);
    rp_series ser[2] = {{"measured peak", x, mp, 4, false}, {"kiln plan", x, pp, 4, true}};
    rp_plot pl = {.title = "Step peak: 1 off, 2 and 4 segments, 4 auto", .xlabel = "--checkpoint",
                  .ylabel = "MiB allocated", .series = ser, .n_series = 2, .y_from_zero = true, .x_integer = true};
    rp_line_plot(&e->body, &pl);
    e->plots++;
    char answer[PATH_MAX + 512];
    TEXT(answer, "the small ResNet at batch %d on %s: peak %.1f MiB off, %.1f MiB with 2 segments "
             "(%.0f%%), %.1f MiB with 4 (%.0f%%); step time %.0f, %.0f, %.0f ms.",
             batch, e->device, sp[0].med / (1 << 20), sp[1].med / (1 << 20), 100 * sp[1].med / sp[0].med,
             sp[2].med / (1 << 20), 100 * sp[2].med / sp[0].med, st[0].med, st[1].med, st[2].med);
    section_end(e, answer,
                "Checkpointing trades recomputation for memory: the activations of all but the segment boundaries "
                "are dropped in the forward and recomputed in the backward, so the peak falls and the step gets "
                "slower; kiln plan predicts the peak before anything runs.");
    cJSON_AddNumberToObject(j, "auto_budget_bytes", (double)budget);
    cJSON_AddStringToObject(j, "auto", auto_line);
    cJSON_AddStringToObject(j, "answer", answer);
}

/* ---- 5. DDP ------------------------------------------------------------------------------------- */

static void exercise_ddp(ex *e) {
    int steps = e->quick ? 2 : 10, batch = 32, ranks = 2;
    char cmd[512];
    TEXT(cmd, "kiln bench ddp --ranks %d --batch %d --steps %d --warmup 1 --rounds %d", ranks, batch,
             steps, e->rounds);
    section_begin(e, 5, "DDP: the scaling efficiency",
                  "If you have access to multiple GPUs, modify the example CNN to train using DistributedDataParallel "
                  "and measure the scaling efficiency.",
                  cmd);
    cJSON *j = add_exercise(e, 5, cmd);
    double one[EX_MAX_ROUNDS], n_s[EX_MAX_ROUNDS], eff[EX_MAX_ROUNDS], hid[EX_MAX_ROUNDS];
    char peer[512] = "", why[512] = "";
    int ran = 0;
    for (int r = 0; r < e->rounds; r++) {
        char tag[32], *out = NULL, *err = NULL;
        TEXT(tag, "ex5_round%d", r + 1);
        one[r] = n_s[r] = eff[r] = hid[r] = NAN;
        int rc = run_kiln(e, tag, &out, &err, "bench ddp --ranks %d --batch %d --steps %d --warmup 1 --rounds 1",
                          ranks, batch, steps);
        cJSON *o = rc == 0 ? last_json(out, "bench") : NULL;
        const cJSON *k = o ? cJSON_GetObjectItemCaseSensitive(o, "kiln") : NULL;
        if (k) {
            one[r] = num(k, "img_s_1"), n_s[r] = num(k, "img_s_n"), eff[r] = num(k, "efficiency");
            hid[r] = num(k, "allreduce_hidden");
            const cJSON *ps = cJSON_GetObjectItemCaseSensitive(o, "peer_skipped");
            if (cJSON_IsString(ps)) TEXT(peer, "%s", ps->valuestring);
            ran++;
        } else if (!why[0]) {
            const char *l = err && *err ? err : "no output";
            TEXT(why, "kiln bench ddp exited %d: %.*s", rc, (int)strcspn(l, "\n"), l);
        }
        cJSON_Delete(o);
        free(out);
        free(err);
    }
    note(e, "Processes on one host, %d compute threads each over MPI (this machine: %ld cores%s); on a GPU machine "
            "each rank would own a GPU.",
         kiln_num_threads(), sysconf(_SC_NPROCESSORS_ONLN), e->cuda ? "" : ", no GPU");
    if (why[0]) note(e, "%s", why);
    note(e, "PyTorch's DDP peer: %s", peer[0] ? peer : ran ? "ran (see the log)" : "not run");
    spread s1 = spread_of(one, e->rounds), sn = spread_of(n_s, e->rounds), se = spread_of(eff, e->rounds),
           sh = spread_of(hid, e->rounds);
    kiln_strbuf_printf(&e->body, "<table class=\"sortable\"><thead><tr><th>processes</th><th>images/s (all "
                                 "ranks)</th><th>scaling efficiency</th><th>all-reduce hidden behind "
                                 "backward</th></tr></thead><tbody>\n<tr><td>1</td>");
    cell(&e->body, s1, "");
    kiln_strbuf_printf(&e->body, "<td>1</td><td>-</td></tr>\n<tr><td>%d</td>", ranks);
    cell(&e->body, sn, "");
    cell(&e->body, se, "");
    if (sh.n) {
        spread pct = {100 * sh.med, 100 * sh.lo, 100 * sh.hi, sh.n};
        cell(&e->body, pct, "%");
    } else {
        kiln_strbuf_printf(&e->body, "<td>n/a</td>");
    }
    kiln_strbuf_printf(&e->body, "</tr>\n</tbody></table>\n");
    e->tables++;
    double x[2] = {1, (double)ranks}, y[2] = {s1.med, sn.med}, ideal[2] = {s1.med, ranks * s1.med};
    rp_series ser[2] = {{"Kiln DDP", x, y, 2, false}, {"ideal (N x 1 process)", x, ideal, 2, true}};
    rp_plot pl = {.title = "Images/s against processes", .xlabel = "processes", .ylabel = "images/s",
                  .series = ser, .n_series = 2, .y_from_zero = true, .x_integer = true};
    rp_line_plot(&e->body, &pl);
    e->plots++;
    char answer[PATH_MAX + 512];
    if (ran)
        TEXT(answer, "%d processes: %.0f images/s against %.0f for one, a scaling efficiency of "
                 "%.2f (medians of %d rounds).", ranks, sn.med, s1.med, se.med, ran);
    else
        TEXT(answer, "not measured: %s", why[0] ? why : "kiln bench ddp did not run");
    section_end(e, answer,
                "Efficiency is N-process throughput over N times one process's: on one shared CPU host the ranks "
                "split the same cores, so it mostly measures how well the all-reduce hides behind backward, not "
                "what more GPUs would add.");
    cJSON_AddItemToObject(j, "img_s_1", json_spread(s1));
    cJSON_AddItemToObject(j, "img_s_n", json_spread(sn));
    cJSON_AddItemToObject(j, "efficiency", json_spread(se));
    cJSON_AddStringToObject(j, "peer", peer[0] ? peer : "");
    cJSON_AddStringToObject(j, "answer", answer);
}

/* ---- The page ------------------------------------------------------------------------------------ */

static const char page_css[] =
    "body{font:14px/1.4 system-ui,sans-serif;margin:24px auto;max-width:1000px;color:#222;padding:0 16px}"
    "h1{font-size:22px;margin-bottom:4px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}"
    ".sub{color:#666;margin-top:0}code{background:#f4f4f4;padding:1px 4px;word-break:break-all}"
    "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}"
    "thead th{background:#f0f0f0}td[data-v]{text-align:right}.answer{background:#eef6ee;padding:6px}"
    "svg.plot{border:1px solid #eee;background:#fff}svg text{font:11px system-ui,sans-serif;fill:#333}"
    "svg .title{font-size:14px;font-weight:600}svg .legend{font-size:12px}svg .label{font-size:12px}"
    "svg .grid{stroke:#eee}svg .axis,svg .tickmark{stroke:#888}.note{color:#555}";

/* Marks the page ready with its section and plot counts (the smoke test reads them). */
static const char page_js[] =
    "(function(){var s=document.querySelectorAll('section'),ok=0;\n"
    "for(var i=0;i<s.length;i++)if(s[i].querySelector('table')&&s[i].querySelector('svg'))ok++;\n"
    "document.body.setAttribute('data-sections',String(ok));\n"
    "document.body.setAttribute('data-plots',String(document.querySelectorAll('svg.plot').length));})();\n";

static int write_file(const char *path, const char *text) {
    char tmp[PATH_MAX + 16];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    bool ok = f && fputs(text, f) >= 0;
    if (f) ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        fprintf(stderr, "kiln bench exercises: cannot write %s: %s\n", path, strerror(errno));
        remove(tmp);
        return 1;
    }
    return 0;
}

/* A synthetic CIFAR-10 directory in the standard binary layout: class c's
 * images a noisy colour of their own (the runs learn something). */
static int write_synthetic_cifar(ex *e, int per_batch) {
    TEXT(e->cifar, "%s/cifar-10-synthetic", e->out);
    if (mkdir(e->cifar, 0755) != 0 && errno != EEXIST) return 1;
    uint64_t rng = 0x9E3779B97F4A7C15ULL;
    unsigned char rec[3073];
    for (int b = 0; b < 6; b++) {
        char path[PATH_MAX + 64];
        if (b < 5) snprintf(path, sizeof path, "%s/data_batch_%d.bin", e->cifar, b + 1);
        else snprintf(path, sizeof path, "%s/test_batch.bin", e->cifar);
        FILE *f = fopen(path, "wb");
        if (!f) return 1;
        int n = b < 5 ? per_batch : per_batch / 2;
        for (int i = 0; i < n; i++) {
            int label = (b * per_batch + i) % 10;
            rec[0] = (unsigned char)label;
            for (int k = 0; k < 3072; k++) {
                rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                rec[1 + k] = (unsigned char)((label * 25 + (k / 1024) * 40 + (int)(rng % 64)) & 255);
            }
            if (fwrite(rec, 1, sizeof rec, f) != sizeof rec) {
                fclose(f);
                return 1;
            }
        }
        if (fclose(f) != 0) return 1;
    }
    e->synthetic = true;
    return 0;
}

static int usage(void) {
    fprintf(stderr,
            "usage: kiln bench exercises [--device D] [--out DIR] [--quick] [--rounds R] [--only N] [--cifar DIR]\n"
            "  the tutorial's five exercises; DIR/exercises.html and DIR/exercises.json (default DIR:\n"
            "  runs/exercises). --quick: small sizes and 1 round (a smoke test); --rounds R: interleaved rounds\n"
            "  (default 3, at most %d); --only N: exercise N alone; --cifar DIR: real CIFAR-10 (binary version)\n"
            "  instead of a synthetic directory\n",
            EX_MAX_ROUNDS);
    return 2;
}

int kiln_bench_exercises(int argc, char **argv) {
    static ex e;
    memset(&e, 0, sizeof e);
    const char *out = "runs/exercises", *cifar = NULL, *device = NULL;
    e.rounds = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick")) e.quick = true;
        else if (!strcmp(a, "--out") && v) out = v, i++;
        else if (!strcmp(a, "--device") && v) device = v, i++;
        else if (!strcmp(a, "--cifar") && v) cifar = v, i++;
        else if (!strcmp(a, "--rounds") && v) {
            e.rounds = atoi(v), i++;
            if (e.rounds < 1 || e.rounds > EX_MAX_ROUNDS) return usage();
        } else if (!strcmp(a, "--only") && v) {
            e.only = atoi(v), i++;
            if (e.only < 1 || e.only > 5) return usage();
        } else
            return usage();
    }
    if (!e.rounds) e.rounds = e.quick ? 1 : 3;
    kiln_device dev = KILN_CPU;
    if (device && (kiln_device_parse(device, &dev) != KILN_OK || dev.type == KILN_DEVICE_META)) {
        fprintf(stderr, "kiln bench exercises: --device %s: %s\n", device,
                dev.type == KILN_DEVICE_META ? "meta tensors hold no data" : kiln_error_message());
        return 2;
    }
    e.cuda = dev.type == KILN_DEVICE_CUDA;
    kiln_device_str(dev, e.device, sizeof e.device);
    if (device) snprintf(e.devflag, sizeof e.devflag, " --device %s", e.device);
    ssize_t len = readlink("/proc/self/exe", e.exe, sizeof e.exe - 1);
    if (len <= 0) {
        fprintf(stderr, "kiln bench exercises: cannot find its own binary (/proc/self/exe): %s\n", strerror(errno));
        return 1;
    }
    e.exe[len] = '\0';
    char cmd[PATH_MAX + 32];
    TEXT(cmd, "mkdir -p '%s/logs' '%s/runs'", out, out);
    if (system(cmd) != 0 || !realpath(out, e.out)) {
        fprintf(stderr, "kiln bench exercises: cannot create %s/logs (choose another --out DIR)\n", out);
        return 1;
    }
    if (cifar) {
        if (!realpath(cifar, e.cifar)) {
            fprintf(stderr, "kiln bench exercises: --cifar %s: %s\n", cifar, strerror(errno));
            return 2;
        }
    } else if (write_synthetic_cifar(&e, e.quick ? 64 : 512) != 0) {
        fprintf(stderr, "kiln bench exercises: cannot write a synthetic CIFAR-10 under %s\n", e.out);
        return 1;
    }
    if (access(FMNIST_DIR "/train-images-idx3-ubyte.gz", R_OK) == 0 || access(FMNIST_DIR "/train-images-idx3-ubyte", R_OK) == 0)
        e.fmnist = FMNIST_DIR;
    bench_cpu_info_get(&e.cpuinfo);
    snprintf(e.cpu, sizeof e.cpu, "%s", e.cpuinfo.model);
    e.list = cJSON_CreateArray();
    double t0 = tool_now_s();
    if (!e.only || e.only == 1) exercise_profile(&e);
    if (!e.only || e.only == 2) exercise_amp(&e);
    if (!e.only || e.only == 3) exercise_pinned(&e);
    if (!e.only || e.only == 4) exercise_checkpoint(&e);
    if (!e.only || e.only == 5) exercise_ddp(&e);
    double wall = tool_now_s() - t0;

    kiln_strbuf html = {0};
    time_t now = time(NULL);
    char when[64];
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&now));
    kiln_strbuf_printf(&html, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>Kiln: "
                              "the tutorial's exercises</title>\n<style>%s</style>\n</head>\n<body>\n<h1>The "
                              "tutorial's five exercises, answered with Kiln</h1>\n<p class=\"sub\">",
                       page_css);
    rp_html_escape(&html, e.cpu);
    kiln_strbuf_printf(&html, " (%s), %d compute threads, device %s &middot; %d round%s%s &middot; %.0f s &middot; "
                              "generated %s &middot; kiln bench exercises</p>\n",
                       e.cpuinfo.flags, kiln_num_threads(), e.device, e.rounds, e.rounds == 1 ? "" : "s",
                       e.quick ? " (--quick: small sizes, a smoke test, not a measurement)" : "", wall, when);
    kiln_strbuf_printf(&html, "<p>Timings on a shared machine are noisy: each cell is the median of the rounds, "
                              "run interleaved, with the slowest and fastest in brackets. CIFAR-10: ");
    rp_html_escape(&html, e.synthetic ? "a synthetic directory in the standard binary layout written under --out "
                                        "(pass --cifar DIR for the real one)" : e.cifar);
    kiln_strbuf_printf(&html, ". The logs of every run are in logs/ beside this page.</p>\n%s",
                       e.body.data ? e.body.data : "");
    kiln_strbuf_printf(&html, "<script>\n%s</script>\n</body>\n</html>\n", page_js);

    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "bench", "exercises");
    cJSON_AddNumberToObject(j, "threads", kiln_num_threads());
    cJSON_AddStringToObject(j, "cpu", e.cpu);
    cJSON_AddStringToObject(j, "device", e.device);
    cJSON_AddBoolToObject(j, "quick", e.quick);
    cJSON_AddNumberToObject(j, "rounds", e.rounds);
    cJSON_AddBoolToObject(j, "synthetic_cifar", e.synthetic);
    cJSON_AddNumberToObject(j, "wall_s", wall);
    cJSON_AddItemToObject(j, "exercises", e.list);
    char *text = cJSON_PrintUnformatted(j);
    char path[PATH_MAX + 32];
    int rc = html.failed || e.body.failed || !text;
    snprintf(path, sizeof path, "%s/exercises.html", e.out);
    if (!rc) rc = write_file(path, html.data);
    snprintf(path, sizeof path, "%s/exercises.json", e.out);
    if (!rc) rc = write_file(path, text);
    if (!rc) {
        printf("kiln bench exercises: %d sections, %d tables, %d plots in %s/exercises.html (%.0f s)\n", e.sections,
               e.tables, e.plots, e.out, wall);
        printf("%s\n", text);
    }
    free(text);
    cJSON_Delete(j);
    free(html.data);
    free(e.body.data);
    return rc;
}

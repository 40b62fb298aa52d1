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
#include "exercises.h"

/* ---- Helpers ------------------------------------------------------------------------------ */

char *ex_slurp(const char *path) {
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
int ex_run(ex *e, const char *tag, char **out, char **err, const char *fmt, ...) {
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
    if (out) *out = ex_slurp(po);
    if (err) *err = ex_slurp(pe);
    return rc == -1 ? -1 : WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

/* The last line of `text` that parses as a JSON object holding `key`. */
cJSON *ex_last_json(const char *text, const char *key) {
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

double ex_num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

spread ex_spread_of(const double *v, int n) {
    double t[EX_MAX_ROUNDS];
    int k = 0;
    for (int i = 0; i < n && k < EX_MAX_ROUNDS; i++)
        if (isfinite(v[i])) t[k++] = v[i];
    if (!k) return (spread){NAN, NAN, NAN, 0};
    spread s = {tool_median(t, k), t[0], t[k - 1], k}; /* tool_median sorted t */
    return s;
}

/* "123.4 [120.1-125.0]" (the median and the rounds' range), the median alone for one round, or
 * "n/a" when no round measured it. */
void ex_cell(kiln_strbuf *b, spread s, const char *unit) {
    if (!s.n) {
        kiln_strbuf_printf(b, "<td>n/a</td>");
        return;
    }
    char m[32], lo[32], hi[32];
    rp_format_number(s.med, m, sizeof m);
    rp_format_number(s.lo, lo, sizeof lo);
    rp_format_number(s.hi, hi, sizeof hi);
    if (s.n > 1)
        kiln_strbuf_printf(b, "<td data-v=\"%g\">%s%s [%s&ndash;%s]</td>", s.med, m, unit, lo, hi);
    else
        kiln_strbuf_printf(b, "<td data-v=\"%g\">%s%s</td>", s.med, m, unit);
}

cJSON *ex_json_spread(spread s) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "median", s.med);
    cJSON_AddNumberToObject(o, "min", s.lo);
    cJSON_AddNumberToObject(o, "max", s.hi);
    cJSON_AddNumberToObject(o, "rounds", s.n);
    return o;
}

/* A plot of k configurations' medians with the rounds' min and max. */
void ex_spread_plot(ex *e, const char *title, const char *ylabel, const spread *s, int k,
                    const char *xlabel) {
    double x[16], med[16], lo[16], hi[16];
    for (int i = 0; i < k && i < 16; i++) x[i] = i + 1, med[i] = s[i].med, lo[i] = s[i].lo, hi[i] = s[i].hi;
    rp_series series[3] = {{"median", x, med, (size_t)k, false},
                           {"slowest round", x, lo, (size_t)k, true},
                           {"fastest round", x, hi, (size_t)k, true}};
    rp_plot p = {.title = title,
                 .xlabel = xlabel,
                 .ylabel = ylabel,
                 .series = series,
                 .n_series = 3,
                 .y_from_zero = true,
                 .x_integer = true};
    rp_line_plot(&e->body, &p);
    e->plots++;
}

void ex_section_begin(ex *e, int id, const char *title, const char *asked, const char *command) {
    kiln_strbuf_printf(&e->body, "<section id=\"ex%d\">\n<h2>%d. ", id, id);
    rp_html_escape(&e->body, title);
    kiln_strbuf_printf(&e->body, "</h2>\n<p><b>The tutorial asks:</b> ");
    rp_html_escape(&e->body, asked);
    kiln_strbuf_printf(&e->body, "</p>\n<p><b>The command that answers it alone:</b> <code>");
    rp_html_escape(&e->body, command);
    kiln_strbuf_printf(&e->body, "</code></p>\n");
    e->sections++;
}

void ex_section_end(ex *e, const char *answer, const char *meaning) {
    kiln_strbuf_printf(&e->body, "<p class=\"answer\"><b>Answer:</b> ");
    rp_html_escape(&e->body, answer);
    kiln_strbuf_printf(&e->body, "</p>\n<p><b>What it means:</b> ");
    rp_html_escape(&e->body, meaning);
    kiln_strbuf_printf(&e->body, "</p>\n</section>\n");
}

void ex_note(ex *e, const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    kiln_strbuf_printf(&e->body, "<p class=\"note\">");
    rp_html_escape(&e->body, buf);
    kiln_strbuf_printf(&e->body, "</p>\n");
}

cJSON *ex_add(ex *e, int id, const char *command) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", id);
    cJSON_AddStringToObject(o, "command", command);
    cJSON_AddItemToArray(e->list, o);
    return o;
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
        if (b < 5)
            snprintf(path, sizeof path, "%s/data_batch_%d.bin", e->cifar, b + 1);
        else
            snprintf(path, sizeof path, "%s/test_batch.bin", e->cifar);
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
    fprintf(
        stderr,
        "usage: kiln bench exercises [--device D] [--out DIR] [--quick] [--rounds R] [--only N] [--cifar "
        "DIR]\n"
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
        if (!strcmp(a, "--quick"))
            e.quick = true;
        else if (!strcmp(a, "--out") && v)
            out = v, i++;
        else if (!strcmp(a, "--device") && v)
            device = v, i++;
        else if (!strcmp(a, "--cifar") && v)
            cifar = v, i++;
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
        fprintf(stderr, "kiln bench exercises: cannot find its own binary (/proc/self/exe): %s\n",
                strerror(errno));
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
    if (access(FMNIST_DIR "/train-images-idx3-ubyte.gz", R_OK) == 0 ||
        access(FMNIST_DIR "/train-images-idx3-ubyte", R_OK) == 0)
        e.fmnist = FMNIST_DIR;
    bench_cpu_info_get(&e.cpuinfo);
    snprintf(e.cpu, sizeof e.cpu, "%s", e.cpuinfo.model);
    e.list = cJSON_CreateArray();
    double t0 = tool_now_s();
    if (!e.only || e.only == 1) ex_profile(&e);
    if (!e.only || e.only == 2) ex_amp(&e);
    if (!e.only || e.only == 3) ex_pinned(&e);
    if (!e.only || e.only == 4) ex_checkpoint(&e);
    if (!e.only || e.only == 5) ex_ddp(&e);
    double wall = tool_now_s() - t0;

    kiln_strbuf html = {0};
    time_t now = time(NULL);
    char when[64];
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&now));
    kiln_strbuf_printf(&html,
                       "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>Kiln: "
                       "the tutorial's exercises</title>\n<style>%s</style>\n</head>\n<body>\n<h1>The "
                       "tutorial's five exercises, answered with Kiln</h1>\n<p class=\"sub\">",
                       page_css);
    rp_html_escape(&html, e.cpu);
    kiln_strbuf_printf(&html,
                       " (%s), %d compute threads, device %s &middot; %d round%s%s &middot; %.0f s &middot; "
                       "generated %s &middot; kiln bench exercises</p>\n",
                       e.cpuinfo.flags, kiln_num_threads(), e.device, e.rounds, e.rounds == 1 ? "" : "s",
                       e.quick ? " (--quick: small sizes, a smoke test, not a measurement)" : "", wall, when);
    kiln_strbuf_printf(&html,
                       "<p>Timings on a shared machine are noisy: each cell is the median of the rounds, "
                       "run interleaved, with the slowest and fastest in brackets. CIFAR-10: ");
    rp_html_escape(&html, e.synthetic
                              ? "a synthetic directory in the standard binary layout written under --out "
                                "(pass --cifar DIR for the real one)"
                              : e.cifar);
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
        printf("kiln bench exercises: %d sections, %d tables, %d plots in %s/exercises.html (%.0f s)\n",
               e.sections, e.tables, e.plots, e.out, wall);
        printf("%s\n", text);
    }
    free(text);
    cJSON_Delete(j);
    free(html.data);
    free(e.body.data);
    return rc;
}

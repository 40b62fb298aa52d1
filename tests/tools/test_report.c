/* `kiln report RUN_DIR`: the page from a real kiln train run's metrics
 * (tests/tools/fixtures/fmnist_2epochs, written by kiln train --limit 512
 * --epochs 2 --log-every 1) and a memory snapshot of a small training loop
 * has every plot, non-empty, the memory timeline with its peak and the
 * planted block at the top of the peak table; and bad inputs (malformed
 * lines, an interrupted run, one point, missing fields, absurd values,
 * binary junk, a broken snapshot) never crash it: each gives a page with
 * notes saying what was skipped. The page in a browser is
 * test_report_chromium. */
#include "tools/report_test_util.h"

static char kiln_bin[4200], tmp[4096];

/* Run kiln report on dir; the page (NULL when missing); *rc the exit code. */
static char *report(const char *dir, int *rc) {
    char page[4400];
    snprintf(page, sizeof page, "%s/report.html", dir);
    unlink(page);
    *rc = rt_run("'%s' report '%s' > '%s/stdout' 2> '%s/stderr'", kiln_bin, dir, dir, dir);
    return rt_read(page);
}

static void make_dir(char *out, size_t n, const char *name) {
    snprintf(out, n, "%s/%s", tmp, name);
    CHECK_MSG(mkdir(out, 0755) == 0, "mkdir %s: %s", out, strerror(errno));
}

/* No coordinate may be NaN or infinite: browsers drop such shapes. */
static void check_finite_svg(const char *html, const char *what) {
    CHECK_MSG(!strstr(html, "nan") && !strstr(html, "inf,") && !strstr(html, "inf "),
              "%s: the page has a NaN or infinite number", what);
}

/* The page of a metrics file alone: it exists, exits 0, ends well, and
 * has `plots` SVG plots; returns it for more checks. */
static char *page_of(const char *name, const char *metrics, size_t len, int plots) {
    char dir[4200], path[4400];
    make_dir(dir, sizeof dir, name);
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    rt_write(path, metrics, len);
    int rc = -1;
    char *html = report(dir, &rc);
    CHECK_MSG(rc == 0, "%s: kiln report exited %d", name, rc);
    CHECK_MSG(html && strstr(html, "</html>"), "%s: no complete report.html", name);
    if (!html) return NULL;
    int got = (int)rt_count(html, "<svg class=\"plot");
    CHECK_MSG(plots < 0 || got == plots, "%s: %d plots, expected %d", name, got, plots);
    check_finite_svg(html, name);
    return html;
}

static void full_report(void) {
    char dir[4200], path[4400], src[4400];
    make_dir(dir, sizeof dir, "full");
    snprintf(src, sizeof src, "%s/tests/tools/fixtures/fmnist_2epochs/metrics.jsonl", KILN_SOURCE_DIR);
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    rt_copy(src, path);
    snprintf(path, sizeof path, "%s/memory_snapshot.json", dir);
    int big_line = 0;
    rt_make_snapshot(path, &big_line);
    int rc = -1;
    char *html = report(dir, &rc);
    CHECK_MSG(rc == 0, "full: kiln report exited %d", rc);
    CHECK(html != NULL);
    if (!html) return;
    /* Loss per step, loss per epoch, accuracy, throughput, memory, time,
     * learning rate, and the memory timeline. */
    CHECK_EQ_I(rt_count(html, "<svg class=\"plot"), 8);
    CHECK_EQ_I(rt_count(html, "<svg class=\"plot timeline"), 1);
    CHECK(strstr(html, "Training loss per step window") && strstr(html, "Accuracy per epoch") &&
          strstr(html, "Memory over the run") && strstr(html, "Throughput per step window"));
    /* Every line plot has a polyline with points (8 steps, 2 epochs). */
    CHECK(rt_count(html, "<polyline class=\"series\"") >= 10);
    CHECK(!strstr(html, "points=\"\""));
    CHECK(strstr(html, "<path class=\"area\"") && strstr(html, "d=\"M"));
    CHECK(strstr(html, "peak "));
    /* The summary of the fixture, and no notes but the absent ones. */
    CHECK(strstr(html, "56.05%"));
    CHECK(!strstr(html, "malformed"));
    CHECK(!strstr(html, "no summary record"));
    /* The planted 4 MiB block heads the peak table, with its line. */
    char site[64];
    snprintf(site, sizeof site, "report_test_util.h:%d", big_line);
    const char *table = strstr(html, "Blocks alive at the peak");
    CHECK_MSG(table != NULL, "no peak table");
    const char *row = table ? strstr(table, "<tbody>") : NULL;
    const char *first_site = row ? strstr(row, site) : NULL;
    const char *first_row = row ? strstr(row, "<tr>") : NULL;
    const char *second_row = first_row ? strstr(first_row + 4, "<tr>") : NULL;
    const char *op = row ? strstr(row, "<td>linear</td>") : NULL;
    CHECK_MSG(first_site && second_row && first_site < second_row && strstr(row, "4.0 MiB") < second_row &&
                  op && op < second_row,
              "the peak table's first row is not the 4 MiB block of linear at %s", site);
    CHECK(strstr(html, "At snapshot time"));
    check_finite_svg(html, "full");
    /* Self-contained: nothing fetched from elsewhere. */
    CHECK(!strstr(html, "src=\"http") && !strstr(html, "href=\"http") && !strstr(html, "<link"));
    free(html);
    /* --out elsewhere, and a page from the snapshot alone. */
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    unlink(path);
    CHECK_EQ_I(rt_run("'%s' report '%s' --out '%s/other.html' > /dev/null", kiln_bin, dir, tmp), 0);
    snprintf(path, sizeof path, "%s/other.html", tmp);
    html = rt_read(path);
    CHECK(html && rt_count(html, "<svg class=\"plot") == 1 && strstr(html, "metrics.jsonl does not exist"));
    free(html);
}

static void bad_inputs(void) {
    static const char step1[] =
        "{\"event\":\"step\",\"step\":1,\"epoch\":1,\"loss\":2.3,\"lr\":0.001,\"img_s\":100}\n";
    /* Empty: no plots, notes for each. */
    char *h = page_of("empty", "", 0, 0);
    CHECK(h && strstr(h, "no summary record") && strstr(h, "plot skipped"));
    free(h);
    /* One step record: dots, no crash on a zero-width range. */
    h = page_of("single", step1, strlen(step1), 3);
    CHECK(h && strstr(h, "<circle"));
    free(h);
    /* Four kinds of bad line among good ones, the last one truncated. */
    static const char mixed[] = "not json at all\n"
                                "{\"event\":\"step\",\"step\":1,\"loss\":2.0}\n"
                                "{\"event\":\"step\",\"step\":2,\"loss\":\n"
                                "[1,2,3]\n"
                                "\n"
                                "{\"no_event\":1}\n"
                                "{\"event\":\"step\",\"step\":3,\"loss\":1.5}\n"
                                "{\"event\":\"epoch\",\"epoch\":1,\"test_acc\":0.5}\n"
                                "{\"event\":\"step\",\"step\":4,\"lo";
    h = page_of("mixed", mixed, strlen(mixed), 2);
    CHECK_MSG(h && strstr(h, "4 malformed lines in metrics.jsonl skipped (lines 1, 3, 4, 9)"),
              "mixed: the malformed lines are not counted and named");
    CHECK(h && strstr(h, "1 records without an"));
    free(h);
    /* Interrupted: steps and an epoch, no summary. */
    static const char interrupted[] =
        "{\"event\":\"step\",\"step\":1,\"epoch\":1,\"loss\":2.3,\"img_s\":50}\n"
        "{\"event\":\"step\",\"step\":2,\"epoch\":1,\"loss\":2.1,\"img_s\":60}\n"
        "{\"event\":\"epoch\",\"epoch\":1,\"train_loss\":2.2,\"test_loss\":2.0,\"test_acc\":0.4}\n"
        "{\"event\":\"step\",\"step\":3,\"epoch\":2,\"loss\":1.9,\"img_s\":70}\n";
    h = page_of("interrupted", interrupted, strlen(interrupted), 4);
    CHECK(h && strstr(h, "Run incomplete") && strstr(h, "last test_acc (epoch 1)") && strstr(h, "40.00%"));
    free(h);
    /* Missing fields: steps without loss, epochs without accuracy. */
    static const char missing[] =
        "{\"event\":\"step\",\"step\":1,\"img_s\":50}\n{\"event\":\"step\",\"step\":2,\"img_s\":55}\n"
        "{\"event\":\"epoch\",\"epoch\":1,\"train_loss\":2.2}\n{\"event\":\"summary\",\"wall_s\":3}\n";
    h = page_of("missing", missing, strlen(missing), 2);
    CHECK(h && strstr(h, "Training loss per step window: plot skipped (no loss field"));
    CHECK(h && strstr(h, "Accuracy per epoch: plot skipped"));
    free(h);
    /* Absurd values: huge, negative, strings, nested, duplicate and
     * decreasing steps, a configuration record with HTML in it. */
    static const char absurd[] =
        "{\"event\":\"config\",\"model\":\"<script>alert(1)</"
        "script>\",\"nested\":{\"a\":[1,2,{\"b\":null}]}}\n"
        "{\"event\":\"step\",\"step\":5,\"loss\":1e308,\"img_s\":-1e308}\n"
        "{\"event\":\"step\",\"step\":5,\"loss\":\"high\",\"img_s\":1}\n"
        "{\"event\":\"step\",\"step\":-3,\"loss\":1e-300,\"img_s\":1e300}\n"
        "{\"event\":\"step\",\"step\":1e18,\"loss\":0,\"img_s\":0,\"mem_allocated\":1e30}\n"
        "{\"event\":\"epoch\",\"epoch\":1,\"test_acc\":7}\n";
    h = page_of("absurd", absurd, strlen(absurd), 4);
    CHECK(h && !strstr(h, "<script>alert") && strstr(h, "&lt;script&gt;"));
    free(h);
    /* Deep nesting, a megabyte line, NUL bytes and binary junk. */
    size_t big = 1 << 20;
    char *junk = malloc(big + 4096);
    if (junk) {
        size_t n = 0;
        for (int i = 0; i < 200; i++) junk[n++] = '[';
        junk[n++] = '\n';
        junk[n++] = '{', junk[n++] = '"', junk[n++] = 'x', junk[n++] = '"', junk[n++] = ':', junk[n++] = '"';
        memset(junk + n, 'a', big), n += big;
        junk[n++] = '"', junk[n++] = '}', junk[n++] = '\n';
        const char bin[] = "{\"event\":\"st\0ep\",\"loss\":1}\n\xff\xfe\x01\x02\n";
        memcpy(junk + n, bin, sizeof bin - 1), n += sizeof bin - 1;
        memcpy(junk + n, step1, sizeof step1 - 1), n += sizeof step1 - 1;
        h = page_of("junk", junk, n, 3);
        /* The megabyte line is over KILN_METRICS_MAX_LINE_BYTES: skipped unparsed. */
        CHECK(h && strstr(h, "4 malformed lines"));
        CHECK(h && strstr(h, "1 line of metrics.jsonl longer than 1048576 bytes skipped unread"));
        free(h);
        free(junk);
    }
    /* Broken snapshots beside good metrics: skipped with a note. */
    static const char *const snaps[] = {
        "{\"format\":\"kiln memory snapshot 1\",\"segments\":[",
        "[]",
        "{\"format\":\"kiln memory snapshot "
        "1\",\"history\":{\"baseline\":{}},\"device_traces\":[[1,\"x\",{\"action\":"
        "\"alloc\",\"addr\":-5,\"size\":\"big\",\"frames\":7},{\"action\":\"free_requested\",\"addr\":99,"
        "\"size\":1e30}]],"
        "\"segments\":[{\"blocks\":[{\"state\":\"active_allocated\",\"size\":-1,\"frames\":[{}]}]},3]}",
        "{\"segments\":[],\"device_traces\":[]}",
    };
    for (size_t i = 0; i < sizeof snaps / sizeof snaps[0]; i++) {
        char name[32], dir[4200], path[4400];
        snprintf(name, sizeof name, "snap%zu", i);
        make_dir(dir, sizeof dir, name);
        snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
        rt_write(path, step1, strlen(step1));
        snprintf(path, sizeof path, "%s/memory_snapshot.json", dir);
        rt_write(path, snaps[i], strlen(snaps[i]));
        int rc = -1;
        h = report(dir, &rc);
        CHECK_MSG(rc == 0 && h && strstr(h, "</html>"), "%s: kiln report exited %d", name, rc);
        CHECK_MSG(h && strstr(h, "emory timeline"), "%s: no note about the memory timeline", name);
        if (h) check_finite_svg(h, name);
        free(h);
    }
}

static void errors(void) {
    char dir[4200];
    make_dir(dir, sizeof dir, "nothing");
    CHECK_EQ_I(rt_run("'%s' report '%s' > /dev/null 2> '%s/err'", kiln_bin, dir, tmp), 1);
    char path[4400];
    snprintf(path, sizeof path, "%s/err", tmp);
    char *err = rt_read(path);
    CHECK(err && strstr(err, "cannot open") && strstr(err, "metrics.jsonl") && strstr(err, "No such file"));
    free(err);
    CHECK_EQ_I(rt_run("'%s' report > /dev/null 2>&1", kiln_bin), 2);
    CHECK_EQ_I(rt_run("'%s' report a b > /dev/null 2>&1", kiln_bin), 2);
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    rt_write(path, "", 0);
    CHECK_EQ_I(
        rt_run("'%s' report '%s' --out /proc/kiln_no_dir/r.html > /dev/null 2> '%s/err'", kiln_bin, dir, tmp),
        1);
    snprintf(path, sizeof path, "%s/err", tmp);
    err = rt_read(path);
    CHECK(err && strstr(err, "cannot write"));
    free(err);
}

/* The longest run of digits in s: a number printed with %.0f from 1e300
 * is 301 of them. */
static size_t longest_digits(const char *s) {
    size_t best = 0, run = 0;
    for (; *s; s++) {
        run = *s >= '0' && *s <= '9' ? run + 1 : 0;
        if (run > best) best = run;
    }
    return best;
}

/* Only regular files are read, within a size cap, and neither a FIFO nor
 * /dev/zero blocks: each is refused, exit 1, naming the file and what it
 * is. Huge numbers print as short numbers. */
static void hostile_files(void) {
    static const char good[] = "{\"event\":\"step\",\"step\":1,\"loss\":2.0}\n";
    static const struct {
        const char *name, *make, *expect;
    } cases[] = {
        {"fifo", "mkfifo '%s/metrics.jsonl'", "is a FIFO (named pipe), not a regular file"},
        {"directory", "mkdir '%s/metrics.jsonl'", "is a directory, not a regular file"},
        {"devzero", "ln -s /dev/zero '%s/metrics.jsonl'", "is a character device, not a regular file"},
        {"loop", "ln -s metrics.jsonl '%s/metrics.jsonl'", "Too many levels of symbolic links"},
        {"huge", "truncate -s 300M '%s/metrics.jsonl'", "more than the 256.00 MiB kiln report reads"},
        {"snapfifo", "mkfifo '%s/memory_snapshot.json'", "memory_snapshot.json is a FIFO (named pipe)"},
        {"snapdir", "mkdir '%s/memory_snapshot.json'", "memory_snapshot.json is a directory"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[4200], path[4400], cmd[8800];
        make_dir(dir, sizeof dir, cases[i].name);
        if (!strncmp(cases[i].name, "snap", 4)) {
            snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
            rt_write(path, good, strlen(good));
        }
        snprintf(cmd, sizeof cmd, cases[i].make, dir);
        CHECK_MSG(rt_run("%s", cmd) == 0, "%s: %s failed", cases[i].name, cmd);
        /* `timeout`: a read that blocks fails the case instead of hanging the test. */
        int rc = rt_run("timeout 20 '%s' report '%s' > /dev/null 2> '%s/stderr'", kiln_bin, dir, dir);
        snprintf(path, sizeof path, "%s/stderr", dir);
        char *err = rt_read(path);
        CHECK_MSG(rc == 1, "%s: kiln report exited %d, expected 1", cases[i].name, rc);
        CHECK_MSG(err && strstr(err, dir) && strstr(err, cases[i].expect), "%s: stderr lacks \"%s\": %s",
                  cases[i].name, cases[i].expect, err ? err : "(none)");
        free(err);
    }
    /* Numbers near the double range in every place a number is printed. */
    static const char huge[] =
        "{\"event\":\"config\",\"seed\":1e300,\"batch\":-1e300}\n"
        "{\"event\":\"step\",\"step\":1e300,\"epoch\":1e300,\"loss\":1e300,\"mem_allocated\":1e300}\n"
        "{\"event\":\"step\",\"step\":2,\"loss\":-1e300,\"mem_allocated\":1.7e308}\n"
        "{\"event\":\"epoch\",\"epoch\":1e300,\"test_acc\":1e300,\"epoch_images\":1e300}\n"
        "{\"event\":\"config\",\"seed\":2,\"batch\":1e308}\n";
    char *h = page_of("hugenumbers", huge, strlen(huge), -1);
    CHECK_MSG(h && longest_digits(h) < 24, "hugenumbers: a number of %zu digits on the page",
              h ? longest_digits(h) : 0);
    free(h);
    static const char huge_summary[] = "{\"event\":\"summary\",\"peak_mem_bytes\":1e300,\"wall_s\":1e300,"
                                       "\"test_acc\":1e300,\"steps\":9.3e18}\n";
    h = page_of("hugesummary", huge_summary, strlen(huge_summary), -1);
    CHECK_MSG(h && longest_digits(h) < 24, "hugesummary: a number of %zu digits on the page",
              h ? longest_digits(h) : 0);
    free(h);
}

int main(void) {
    if (!rt_find_kiln(kiln_bin, sizeof kiln_bin))
        kt_missing("the kiln binary is not built next to the tests (bin/kiln)");
    if (kiln_init() != KILN_OK) {
        fprintf(stderr, "kiln_init: %s\n", kiln_error_message());
        return 1;
    }
    rt_mkdtemp(tmp, sizeof tmp);
    full_report();
    bad_inputs();
    errors();
    hostile_files();
    if (!kt_failed_)
        rt_run("rm -rf '%s'", tmp);
    else
        printf("pages kept in %s\n", tmp);
    kiln_shutdown();
    return kt_finish();
}

/* `kiln report`'s page in a browser: headless Chromium (Debian's
 * `chromium`) loads report.html from a real run's metrics and a memory
 * snapshot without a console message, its inline script runs (it marks
 * the body with the plot count), and the DOM holds every SVG plot with
 * non-empty polylines and areas. A page with a planted script error shows
 * the console check catches one. A screenshot is taken too (kept with
 * KILN_REPORT_KEEP=1, for looking at). Skipped without chromium. */
#include "tools/report_test_util.h"

static char kiln_bin[4200], tmp[4096], chromium[256];

static bool find_chromium(void) {
    static const char *const names[] = {"/usr/bin/chromium", "/usr/bin/chromium-browser",
                                        "/usr/bin/google-chrome"};
    const char *env = getenv("KILN_CHROMIUM");
    if (env && *env && access(env, X_OK) == 0) return snprintf(chromium, sizeof chromium, "%s", env), true;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (access(names[i], X_OK) == 0) return snprintf(chromium, sizeof chromium, "%s", names[i]), true;
    return false;
}

/* Load `page` in headless Chromium: the DOM after load and the log; the
 * number of console lines in the log (-1 when chromium failed). */
static int load(const char *page, const char *tag, char **dom, char **log) {
    char dom_path[4400], log_path[4400];
    snprintf(dom_path, sizeof dom_path, "%s/%s.dom", tmp, tag);
    snprintf(log_path, sizeof log_path, "%s/%s.log", tmp, tag);
    int rc = rt_run(
        "timeout 120 '%s' --headless --disable-gpu --no-sandbox --no-first-run --user-data-dir='%s/profile' "
        "--enable-logging=stderr --v=0 --dump-dom 'file://%s' > '%s' 2> '%s'",
        chromium, tmp, page, dom_path, log_path);
    *dom = rt_read(dom_path);
    *log = rt_read(log_path);
    if (rc != 0 || !*dom || !*log) {
        fprintf(stderr, "chromium exited %d; log:\n%s\n", rc, *log ? *log : "(none)");
        return -1;
    }
    return (int)(rt_count(*log, ":CONSOLE") + rt_count(*log, "Uncaught"));
}

int main(void) {
    if (!find_chromium())
        kt_missing("chromium is not installed (Debian package chromium; scripts/setup.sh installs it)");
    if (!rt_find_kiln(kiln_bin, sizeof kiln_bin))
        kt_missing("the kiln binary is not built next to the tests (bin/kiln)");
    if (kiln_init() != KILN_OK) {
        fprintf(stderr, "kiln_init: %s\n", kiln_error_message());
        return 1;
    }
    rt_mkdtemp(tmp, sizeof tmp);

    /* The detector sees a script error. */
    char bad[4400];
    snprintf(bad, sizeof bad, "%s/bad.html", tmp);
    static const char bad_page[] =
        "<!DOCTYPE html><html><body><p>x</p><script>kiln_no_such_function();</script></body></html>";
    rt_write(bad, bad_page, sizeof bad_page - 1);
    char *dom = NULL, *log = NULL;
    int console = load(bad, "bad", &dom, &log);
    CHECK_MSG(console > 0, "a page with a script error gave %d console lines", console);
    free(dom), free(log);

    /* The report of a real run with a memory snapshot. */
    char run[4200], path[4400], src[4400], page[4400];
    snprintf(run, sizeof run, "%s/run", tmp);
    CHECK(mkdir(run, 0755) == 0);
    snprintf(src, sizeof src, "%s/tests/tools/fixtures/fmnist_2epochs/metrics.jsonl", KILN_SOURCE_DIR);
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    rt_copy(src, path);
    snprintf(path, sizeof path, "%s/memory_snapshot.json", run);
    int big_line = 0;
    rt_make_snapshot(path, &big_line);
    CHECK_EQ_I(rt_run("'%s' report '%s' > /dev/null", kiln_bin, run), 0);
    snprintf(page, sizeof page, "%s/report.html", run);
    console = load(page, "report", &dom, &log);
    CHECK_MSG(console == 0, "the report page logged %d console lines:\n%s", console, log ? log : "");
    if (dom) {
        /* 7 training plots and the memory timeline; the script ran. */
        CHECK_MSG(strstr(dom, "data-ready=\"8\"") != NULL, "the page script did not mark 8 plots ready");
        CHECK_EQ_I(rt_count(dom, "<svg "), 8);
        CHECK(rt_count(dom, "<polyline") >= 10);
        CHECK(!strstr(dom, "points=\"\""));
        CHECK(rt_count(dom, "<path class=\"area\"") >= 2);
        CHECK(strstr(dom, "Memory timeline") && strstr(dom, "Blocks alive at the peak"));
        /* Every polyline has at least two points. */
        for (const char *p = dom; (p = strstr(p, "<polyline")); p++) {
            const char *pts = strstr(p, "points=\"");
            CHECK(pts && strchr(pts + 8, ',') && strchr(strchr(pts + 8, ',') + 1, ','));
        }
    }
    free(dom), free(log);
    /* A screenshot, for people: it must be a PNG. */
    snprintf(path, sizeof path, "%s/report.png", tmp);
    int rc = rt_run(
        "timeout 120 '%s' --headless --disable-gpu --no-sandbox --no-first-run --user-data-dir='%s/profile' "
        "--window-size=1100,3000 --screenshot='%s' 'file://%s' > /dev/null 2>&1",
        chromium, tmp, path, page);
    char *png = rt_read(path);
    CHECK_MSG(rc == 0 && png && !memcmp(png, "\x89PNG", 4), "no screenshot (chromium exited %d)", rc);
    free(png);
    const char *keep = getenv("KILN_REPORT_KEEP");
    if (!kt_failed_ && !(keep && *keep == '1'))
        rt_run("rm -rf '%s'", tmp);
    else
        printf("pages and screenshot kept in %s\n", tmp);
    kiln_shutdown();
    return kt_finish();
}

/* Helpers shared by the `kiln report` tests: the kiln binary of this build
 * tree, temporary run directories, a memory snapshot of a small training
 * loop with a planted large allocation, and running commands. */
#ifndef KILN_TESTS_TOOLS_REPORT_TEST_UTIL_H
#define KILN_TESTS_TOOLS_REPORT_TEST_UTIL_H

#include <errno.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "diag/json.h"
#include "test_util.h"

/* The kiln binary: BUILD/bin/kiln next to BUILD/tests/<this test>. */
static bool rt_find_kiln(char *out, size_t n) {
    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return false;
    exe[len] = '\0';
    char *slash = strrchr(exe, '/');
    if (!slash) return false;
    *slash = '\0';
    snprintf(out, n, "%s/../bin/kiln", exe);
    return access(out, X_OK) == 0;
}

static void rt_mkdtemp(char *out, size_t n) {
    const char *base = getenv("TMPDIR");
    snprintf(out, n, "%s/kiln_report_test.XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(out)) {
        fprintf(stderr, "mkdtemp %s: %s\n", out, strerror(errno));
        exit(1);
    }
}

static void rt_write(const char *path, const char *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s: %s\n", path, strerror(errno));
        exit(1);
    }
}

static char *rt_read(const char *path) { return kiln_json_read_file(path, NULL); }

static int rt_run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Run a shell command; its exit status, or 128 + signal when killed. */
static int rt_run(const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    fflush(stdout);
    int st = system(cmd);
    if (st == -1) return -1;
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return WEXITSTATUS(st);
}

static size_t rt_count(const char *hay, const char *needle) {
    size_t n = 0;
    for (const char *p = hay; p && (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

static void rt_copy(const char *from, const char *to) {
    char *text = rt_read(from);
    if (!text) {
        fprintf(stderr, "cannot read %s\n", from);
        exit(1);
    }
    rt_write(to, text, strlen(text));
    free(text);
}

/* A few SGD steps of a small MLP on the CPU with the memory history on, a
 * 4 MiB tensor allocated by kiln_linear at *big_line and alive at the
 * peak, then the snapshot at `path`. (Arguments are not nested calls: a
 * creation function without a site macro, such as kiln_randn, inside an
 * op macro's arguments takes the op's site.) */
static void rt_make_snapshot(const char *path, int *big_line) {
    kiln_device d = KILN_CPU;
    CHECK_OK(kiln_memory_record_history(d, true, 0));
    kiln_tensor *w = kiln_randn(KILN_SHAPE(64, 128), KILN_F32, d);
    CHECK_OK(kiln_set_requires_grad(w, true));
    kiln_sgd_opts so = kiln_sgd_defaults(0.01);
    kiln_optimizer *opt = kiln_sgd(&w, 1, &so);
    kiln_tensor *big = NULL;
    for (int step = 0; step < 4; step++) {
        kiln_scope_begin();
        kiln_tensor *x = kiln_randn(KILN_SHAPE(32, 128), KILN_F32, d);
        if (step == 2) { /* a 2048 x 512 output from small inputs: the largest block */
            kiln_tensor *xb = kiln_randn(KILN_SHAPE(2048, 16), KILN_F32, d);
            kiln_tensor *wb = kiln_randn(KILN_SHAPE(512, 16), KILN_F32, d);
            *big_line = __LINE__ + 1;
            big = kiln_linear(xb, wb, NULL);
            big = kiln_retain(big); /* past the scope */
        }
        kiln_tensor *y = kiln_relu(kiln_linear(x, w, NULL));
        CHECK_OK(kiln_backward(kiln_sum(y, 0, NULL, false), NULL, false));
        CHECK_OK(kiln_optimizer_step(opt));
        CHECK_OK(kiln_optimizer_zero_grad(opt, true));
        kiln_scope_end();
    }
    CHECK_OK(kiln_memory_snapshot(d, path));
    kiln_release(big);
    kiln_optimizer_free(opt);
    kiln_release(w);
    CHECK_OK(kiln_memory_record_history(d, false, 0));
}

#endif

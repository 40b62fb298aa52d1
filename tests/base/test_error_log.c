/* The error object, the logger, checked allocation and byte formatting of
 * src/base: what a caller sees when something fails, and where log lines go. */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log_internal.h"
#include "test_util.h"

#ifdef __SANITIZE_ADDRESS__
/* An absurd malloc must come back as NULL (and a Kiln error), which is what
 * the library handles; by default ASan aborts on it instead. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }
#endif

/* ---- Errors ------------------------------------------------------------------ */

static void test_status_names(void) {
    CHECK(strcmp(kiln_status_name(KILN_OK), "KILN_OK") == 0);
    CHECK(strcmp(kiln_status_name(KILN_ERR_OUT_OF_MEMORY), "KILN_ERR_OUT_OF_MEMORY") == 0);
    for (int a = 0; a < KILN_STATUS_COUNT; a++) {
        const char *name = kiln_status_name((kiln_status)a);
        CHECK_MSG(name != NULL && strncmp(name, "KILN_", 5) == 0, "status %d", a);
        for (int b = 0; b < a; b++)
            CHECK_MSG(strcmp(name, kiln_status_name((kiln_status)b)) != 0, "status %d == %d", a, b);
    }
    CHECK(kiln_status_name(KILN_STATUS_COUNT) != NULL);
    CHECK(kiln_status_name((kiln_status)-1) != NULL);
}

static void test_raise_and_clear(void) {
    kiln_error_clear();
    const kiln_error *e = kiln_error_last();
    CHECK(e != NULL);
    CHECK(e->status == KILN_OK);
    CHECK(kiln_error_message()[0] == '\0');

    const char *where = "cpu";
    int line = __LINE__ + 1; /* the raise must stay on the next line */
    kiln_status st = KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use kiln_to", "x is on %s, not cuda:0", where);
    CHECK(st == KILN_ERR_INVALID_ARGUMENT);
    e = kiln_error_last();
    CHECK(e->status == KILN_ERR_INVALID_ARGUMENT);
    CHECK(strcmp(e->message, "x is on cpu, not cuda:0") == 0);
    CHECK(strcmp(kiln_error_message(), e->message) == 0);
    CHECK(strcmp(e->hint, "use kiln_to") == 0);
    CHECK(e->file != NULL && strstr(e->file, "test_error_log.c") != NULL);
    CHECK_EQ_I(e->line, line);

    /* A raise without a hint clears the previous hint. */
    st = KILN_RAISE(KILN_ERR_IO, NULL, "cannot open %s", "weights.safetensors");
    CHECK(st == KILN_ERR_IO);
    CHECK(kiln_error_last()->hint[0] == '\0');
    CHECK(strcmp(kiln_error_message(), "cannot open weights.safetensors") == 0);

    /* A message may quote the previous error (how callers add context). */
    KILN_RAISE(KILN_ERR_IO, "check the path", "loading the model: %s", kiln_error_message());
    CHECK(strcmp(kiln_error_message(), "loading the model: cannot open weights.safetensors") == 0);
    /* ... and a hint may be the previous hint. */
    KILN_RAISE(KILN_ERR_IO, kiln_error_last()->hint, "again");
    CHECK(strcmp(kiln_error_last()->hint, "check the path") == 0);

    /* Long messages are truncated, never overrun. */
    char long_text[3000];
    memset(long_text, 'x', sizeof long_text - 1);
    long_text[sizeof long_text - 1] = '\0';
    KILN_RAISE(KILN_ERR_INTERNAL, long_text, "%s", long_text);
    CHECK(strlen(kiln_error_message()) == sizeof kiln_error_last()->message - 1);
    CHECK(strlen(kiln_error_last()->hint) == sizeof kiln_error_last()->hint - 1);

    kiln_error_clear();
    CHECK(kiln_error_last()->status == KILN_OK);
    CHECK(kiln_error_last()->hint[0] == '\0');
    CHECK(kiln_error_last()->file == NULL);
}

static kiln_status try_twice(int fail_second, int *reached_end) {
    KILN_TRY(KILN_OK);
    KILN_TRY(fail_second ? KILN_RAISE(KILN_ERR_STATE, NULL, "second step") : KILN_OK);
    *reached_end = 1;
    return KILN_OK;
}

static void test_try(void) {
    int reached = 0;
    CHECK(try_twice(0, &reached) == KILN_OK && reached);
    reached = 0;
    CHECK(try_twice(1, &reached) == KILN_ERR_STATE && !reached);
    CHECK(strcmp(kiln_error_message(), "second step") == 0);
}

static void *raise_on_other_thread(void *arg) {
    (void)arg;
    /* A fresh thread starts with no error and does not see the main thread's. */
    int clean = kiln_error_last()->status == KILN_OK && kiln_error_message()[0] == '\0';
    KILN_RAISE(KILN_ERR_DEVICE, NULL, "from the worker");
    return (void *)(intptr_t)clean;
}

static void test_thread_local(void) {
    KILN_RAISE(KILN_ERR_IO, NULL, "from main");
    pthread_t thread;
    void *clean = NULL;
    CHECK(pthread_create(&thread, NULL, raise_on_other_thread, NULL) == 0);
    CHECK(pthread_join(thread, &clean) == 0);
    CHECK(clean != NULL);
    CHECK(strcmp(kiln_error_message(), "from main") == 0);
    CHECK(kiln_error_last()->status == KILN_ERR_IO);
}

/* KILN_ASSERT aborts with the condition and file:line, in a child process. */
static void test_assert_aborts(void) {
    int fds[2];
    CHECK(pipe(fds) == 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], STDERR_FILENO);
        kiln_log_set_sink(NULL, NULL);
        kiln_log_set_level(KILN_LOG_WARN);
        int two = 2;
        KILN_ASSERT(two == 3);
        _exit(0); /* not reached when the assert works */
    }
    CHECK(pid > 0);
    close(fds[1]);
    char out[4096] = {0};
    size_t got = 0;
    ssize_t n;
    while ((n = read(fds[0], out + got, sizeof out - 1 - got)) > 0) got += (size_t)n;
    close(fds[0]);
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "child status %d", status);
    CHECK_MSG(strstr(out, "two == 3") && strstr(out, "test_error_log.c:"), "assert said '%s'", out);
}

/* ---- Allocation ------------------------------------------------------------------ */

static void test_checked_alloc(void) {
    void *p = KILN_MALLOC(64);
    CHECK(p != NULL);
    free(p);
    p = KILN_MALLOC(0); /* a valid pointer, never NULL-as-success */
    CHECK(p != NULL);
    free(p);
    p = KILN_ALIGNED_ALLOC(256, 1000);
    CHECK(p != NULL && ((uintptr_t)p % 256) == 0);
    kiln_aligned_free(p);

    /* volatile: a constant this size is rejected by the compiler itself. */
    volatile size_t absurd = SIZE_MAX / 2;
    kiln_error_clear();
    p = KILN_MALLOC(absurd);
    CHECK(p == NULL);
    CHECK(kiln_error_last()->status == KILN_ERR_OUT_OF_MEMORY);
    CHECK_MSG(strstr(kiln_error_message(), "EiB") || strstr(kiln_error_message(), "GiB"),
              "message '%s' does not name the size", kiln_error_message());
    CHECK(strstr(kiln_error_last()->file, "test_error_log.c") != NULL);
    free(p);

    kiln_error_clear();
    p = KILN_CALLOC(absurd, 4); /* count * size overflows */
    CHECK(p == NULL);
    CHECK(kiln_error_last()->status == KILN_ERR_OUT_OF_MEMORY);
    free(p);

    kiln_error_clear();
    void *keep = KILN_MALLOC(16);
    p = KILN_REALLOC(keep, absurd);
    CHECK(p == NULL);
    CHECK(kiln_error_last()->status == KILN_ERR_OUT_OF_MEMORY);
    free(keep); /* a failed realloc leaves the block alone */
}

static void test_format_bytes(void) {
    char buf[32];
    CHECK(strcmp(kiln_format_bytes(0, buf, sizeof buf), "0 bytes") == 0);
    CHECK(strcmp(kiln_format_bytes(512, buf, sizeof buf), "512 bytes") == 0);
    CHECK(strcmp(kiln_format_bytes(1536, buf, sizeof buf), "1.50 KiB") == 0);
    CHECK(strcmp(kiln_format_bytes(2u << 20, buf, sizeof buf), "2.00 MiB") == 0);
    CHECK(strcmp(kiln_format_bytes(3ull << 29, buf, sizeof buf), "1.50 GiB") == 0);
    CHECK(kiln_format_bytes(1, buf, sizeof buf) == buf);
    /* A short buffer is truncated and terminated. */
    char tiny[4];
    kiln_format_bytes(123456789, tiny, sizeof tiny);
    CHECK(strlen(tiny) == 3);
}

/* ---- Logging ----------------------------------------------------------------------- */

typedef struct captured {
    int count;
    kiln_log_level levels[16];
    char lines[16][256];
} captured;

static void capture_sink(kiln_log_level level, const char *message, void *user) {
    captured *c = user;
    if (c->count < 16) {
        c->levels[c->count] = level;
        snprintf(c->lines[c->count], sizeof c->lines[0], "%s", message);
    }
    c->count++;
}

static void test_log_sink_and_level(void) {
    captured c = {0};
    kiln_log_level saved = kiln_log_get_level();
    kiln_log_set_sink(capture_sink, &c);

    kiln_log_set_level(KILN_LOG_INFO);
    CHECK(kiln_log_get_level() == KILN_LOG_INFO);
    kiln_log_write(KILN_LOG_DEBUG, "dropped %d", 1);
    kiln_log_write(KILN_LOG_INFO, "kept %d", 2);
    kiln_log_write(KILN_LOG_ERROR, "kept %s", "three");
    CHECK_EQ_I(c.count, 2);
    CHECK(c.levels[0] == KILN_LOG_INFO && strcmp(c.lines[0], "kept 2") == 0);
    CHECK(c.levels[1] == KILN_LOG_ERROR && strcmp(c.lines[1], "kept three") == 0);

    kiln_log_set_level(KILN_LOG_OFF);
    kiln_log_write(KILN_LOG_ERROR, "nothing passes OFF");
    CHECK_EQ_I(c.count, 2);

    /* Raising an error logs it at debug level, with its location. */
    kiln_log_set_level(KILN_LOG_DEBUG);
    c.count = 0;
    KILN_RAISE(KILN_ERR_DEVICE, NULL, "driver gone");
    CHECK_EQ_I(c.count, 1);
    CHECK(c.levels[0] == KILN_LOG_DEBUG);
    CHECK(strstr(c.lines[0], "driver gone") && strstr(c.lines[0], "test_error_log.c"));

    /* Once per key. */
    static const char key_a = 0, key_b = 0;
    c.count = 0;
    kiln_log_once(&key_a, KILN_LOG_WARN, "first a");
    kiln_log_once(&key_a, KILN_LOG_WARN, "second a");
    kiln_log_once(&key_b, KILN_LOG_WARN, "first b");
    CHECK_EQ_I(c.count, 2);
    CHECK(strcmp(c.lines[0], "first a") == 0 && strcmp(c.lines[1], "first b") == 0);

    /* KILN_LOG from the environment. */
    setenv("KILN_LOG", "error", 1);
    kiln_log_init_from_env();
    CHECK(kiln_log_get_level() == KILN_LOG_ERROR);
    setenv("KILN_LOG", "Debug", 1);
    kiln_log_init_from_env();
    CHECK(kiln_log_get_level() == KILN_LOG_DEBUG);
    c.count = 0;
    setenv("KILN_LOG", "loud", 1);
    kiln_log_init_from_env(); /* not understood: level kept, and a warning says so */
    CHECK(kiln_log_get_level() == KILN_LOG_DEBUG);
    CHECK(c.count == 1 && strstr(c.lines[0], "loud") != NULL);
    unsetenv("KILN_LOG");

    kiln_log_set_sink(NULL, NULL);
    kiln_log_set_level(saved);
}

/* The default sink writes "kiln <level>: <message>" lines to stderr. */
static void test_default_sink(void) {
    char path[] = "/tmp/kiln_test_log_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    fflush(stderr);
    int saved_stderr = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    kiln_log_set_sink(NULL, NULL);
    kiln_log_level saved = kiln_log_get_level();
    kiln_log_set_level(KILN_LOG_WARN);
    kiln_log_write(KILN_LOG_WARN, "to stderr %d", 7);
    kiln_log_write(KILN_LOG_INFO, "not to stderr");
    fflush(stderr);
    dup2(saved_stderr, STDERR_FILENO);
    close(saved_stderr);
    kiln_log_set_level(saved);

    char text[512] = {0};
    ssize_t n = pread(fd, text, sizeof text - 1, 0);
    close(fd);
    unlink(path);
    CHECK(n > 0);
    CHECK_MSG(strstr(text, "to stderr 7") != NULL, "stderr got '%s'", text);
    CHECK(strstr(text, "warn") != NULL);
    CHECK(strstr(text, "not to stderr") == NULL);
}

int main(void) {
    test_status_names();
    test_raise_and_clear();
    test_try();
    test_thread_local();
    test_assert_aborts();
    test_checked_alloc();
    test_format_bytes();
    test_log_sink_and_level();
    test_default_sink();
    return kt_finish();
}

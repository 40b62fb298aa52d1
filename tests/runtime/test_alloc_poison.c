/* Caching must not blind AddressSanitizer: in ASan builds the allocator
 * poisons cached (free) blocks and the slack between the requested and the
 * rounded size. Each bad access runs in a forked child, whose stderr the
 * parent reads to find ASan's report. Without ASan there is nothing to
 * check: the test says so and is skipped. */
#include <stdint.h>

#include "runtime/caching_allocator.h"
#include "test_util.h"

#if defined(__SANITIZE_ADDRESS__)
#define POISON_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define POISON_TEST_ASAN 1
#endif
#endif

#ifdef POISON_TEST_ASAN
#include <sys/wait.h>
#include <unistd.h>

static kiln_status host_alloc(void *ctx, size_t bytes, void **ptr) {
    (void)ctx;
    return posix_memalign(ptr, 512, bytes) == 0 ? KILN_OK : KILN_ERR_OUT_OF_MEMORY;
}

static void host_free(void *ctx, void *ptr, size_t bytes) {
    (void)ctx, (void)bytes;
    free(ptr);
}

static kiln_caching_allocator *cpu_like_allocator(void) {
    kiln_raw_ops ops = {
        .device_name = "cpu", .host_accessible = true, .alloc = host_alloc, .free = host_free};
    kiln_alloc_config cfg = kiln_alloc_config_default();
    return kiln_caching_allocator_create(&ops, &cfg);
}

enum child_action { WRITE_VALID, WRITE_AFTER_FREE, WRITE_SLACK, WRITE_CACHED_NEIGHBOUR };

/* Runs in the child: returns only if no report stopped it. */
static int child_run(enum child_action action) {
    kiln_caching_allocator *a = cpu_like_allocator();
    void *p = NULL, *q = NULL;
    if (!a || kiln_caching_allocator_malloc(a, 1000, 1, &p) != KILN_OK ||
        kiln_caching_allocator_malloc(a, 1000, 1, &q) != KILN_OK)
        return 3;
    volatile char *vp = p, *vq = q;
    switch (action) {
    case WRITE_VALID:
        for (int i = 0; i < 1000; i++) vp[i] = (char)i;
        /* A block freed and taken again is writable again (up to its request). */
        kiln_caching_allocator_free(a, p);
        kiln_caching_allocator_malloc(a, 900, 1, &p);
        vp = p;
        for (int i = 0; i < 900; i++) vp[i] = 1;
        break;
    case WRITE_AFTER_FREE:
        kiln_caching_allocator_free(a, p);
        vp[10] = 1; /* p is cached, not returned to libc: only poisoning catches this */
        break;
    case WRITE_SLACK:
        vp[1000] = 1; /* rounded to 1024: byte 1000 is slack */
        break;
    case WRITE_CACHED_NEIGHBOUR:
        vq[1024 + 8] = 1; /* past q's block: the segment's free remainder */
        break;
    }
    kiln_caching_allocator_destroy(a);
    return 0;
}

/* Fork, run `action`, return the child's exit status and stderr. */
static int run_child(enum child_action action, char *err, size_t err_size) {
    int fds[2];
    if (pipe(fds) != 0) return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        _exit(child_run(action));
    }
    close(fds[1]);
    size_t len = 0;
    char chunk[4096];
    ssize_t n;
    /* Read to EOF, keeping what fits, so the child never blocks on a full pipe. */
    while ((n = read(fds[0], chunk, sizeof chunk)) > 0) {
        size_t keep = (size_t)n < err_size - 1 - len ? (size_t)n : err_size - 1 - len;
        memcpy(err + len, chunk, keep);
        len += keep;
    }
    err[len] = '\0';
    close(fds[0]);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void expect_report(enum child_action action, const char *what) {
    static char err[1 << 16];
    int rc = run_child(action, err, sizeof err);
    CHECK_MSG(rc != 0, "%s: the child was not stopped", what);
    CHECK_MSG(strstr(err, "use-after-poison") != NULL, "%s: no use-after-poison report in:\n%s", what, err);
}

int main(void) {
    static char err[1 << 16];
    int rc = run_child(WRITE_VALID, err, sizeof err);
    CHECK_MSG(rc == 0, "valid writes were reported (exit %d):\n%s", rc, err);
    expect_report(WRITE_AFTER_FREE, "write into a freed, cached block");
    expect_report(WRITE_SLACK, "write past the requested size into slack");
    expect_report(WRITE_CACHED_NEIGHBOUR, "write into the free rest of a segment");
    return kt_finish();
}

#else

int main(void) {
    kt_skip("not an AddressSanitizer build: configure with -DKILN_SANITIZE=address,undefined to check "
            "that cached blocks and slack bytes are poisoned");
    return 0;
}

#endif

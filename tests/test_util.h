/* Minimal test helpers: CHECK records a failure and continues; each test
 * binary ends with kt_finish(), which prints "N passed, N failed" and
 * returns the exit code (0 ok, 1 failure). kt_skip() exits 77 with the
 * reason, which CTest reports as skipped. */
#ifndef KILN_TESTS_TEST_UTIL_H
#define KILN_TESTS_TEST_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"

static int kt_passed_;
static int kt_failed_;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (cond) {                                                                                \
            kt_passed_++;                                                                          \
        } else {                                                                                   \
            kt_failed_++;                                                                          \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                       \
    do {                                                                                           \
        if (cond) {                                                                                \
            kt_passed_++;                                                                          \
        } else {                                                                                   \
            kt_failed_++;                                                                          \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

#define CHECK_EQ_I(a, b)                                                                           \
    CHECK_MSG((long long)(a) == (long long)(b), "%lld != %lld", (long long)(a), (long long)(b))

/* A call that must succeed; prints the library's error if it does not. */
#define CHECK_OK(expr)                                                                             \
    do {                                                                                           \
        kiln_status kt_st_ = (expr);                                                               \
        CHECK_MSG(kt_st_ == KILN_OK, "%s -> %s: %s", #expr, kiln_status_name(kt_st_),              \
                  kiln_error_message());                                                           \
    } while (0)

/* A call that must fail with `status` and an error message containing `needle`. */
#define CHECK_FAILS(expr, status, needle)                                                          \
    do {                                                                                           \
        kiln_error_clear();                                                                        \
        kiln_status kt_st_ = (expr);                                                               \
        CHECK_MSG(kt_st_ == (status), "%s -> %s (wanted %s): %s", #expr, kiln_status_name(kt_st_), \
                  kiln_status_name(status), kiln_error_message());                                 \
        CHECK_MSG(strstr(kiln_error_message(), (needle)) != NULL,                                  \
                  "error '%s' does not mention '%s'", kiln_error_message(), (needle));             \
    } while (0)

/* A tensor-returning call that must fail (NULL) with a message containing `needle`. */
#define CHECK_NULL_ERR(expr, needle)                                                               \
    do {                                                                                           \
        kiln_error_clear();                                                                        \
        kiln_tensor *kt_t_ = (expr);                                                               \
        CHECK_MSG(kt_t_ == NULL, "%s returned a tensor, expected an error", #expr);                \
        if (kt_t_) kiln_release(kt_t_);                                                            \
        CHECK_MSG(strstr(kiln_error_message(), (needle)) != NULL,                                  \
                  "error '%s' does not mention '%s'", kiln_error_message(), (needle));             \
    } while (0)

static inline int kt_finish(void) {
    printf("%d passed, %d failed\n", kt_passed_, kt_failed_);
    return kt_failed_ ? 1 : 0;
}

/* A test skips (77) only where the machine has no GPU or driver for it.
 * Anything else a test needs (a package, a tool, a writable /tmp) is
 * installed by scripts/setup.sh, so its absence is a failure: kt_missing. */
static inline void kt_skip(const char *why) {
    printf("SKIPPED: %s\n", why);
    exit(77);
}

static inline void kt_missing(const char *what) {
    printf("FAILED: %s\n", what);
    exit(1);
}

#endif

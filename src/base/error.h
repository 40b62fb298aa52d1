/* Internal error helpers: raise an error with file:line, always-on asserts,
 * checked allocation. Library code never calls exit(). */
#ifndef KILN_SRC_BASE_ERROR_H
#define KILN_SRC_BASE_ERROR_H

#include "kiln/base.h"

#ifdef __cplusplus
#define KILN_NORETURN [[noreturn]]
extern "C" {
#else
#define KILN_NORETURN _Noreturn
#endif

/* Set the thread-local error and return `status`. `hint` may be NULL. */
kiln_status kiln_error_raise(kiln_status status, const char *file, int line, const char *hint,
                             const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;

/* return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use kiln_to", "x is on %s", d); */
#define KILN_RAISE(status, hint, ...) kiln_error_raise((status), __FILE__, __LINE__, (hint), __VA_ARGS__)

/* Propagate a failing status unchanged (its error is already set). */
#define KILN_TRY(expr)                                                                             \
    do {                                                                                           \
        kiln_status kiln_try_st_ = (expr);                                                         \
        if (kiln_try_st_ != KILN_OK) return kiln_try_st_;                                          \
    } while (0)

/* Invariants whose failure means a bug in Kiln. Always on; prints the
 * condition and file:line through the logger and aborts (never exit()). */
KILN_NORETURN void kiln_assert_fail(const char *cond, const char *file, int line, const char *msg);
#define KILN_ASSERT(cond)                                                                          \
    do {                                                                                           \
        if (!(cond)) kiln_assert_fail(#cond, __FILE__, __LINE__, NULL);                            \
    } while (0)
#define KILN_ASSERT_MSG(cond, msg)                                                                 \
    do {                                                                                           \
        if (!(cond)) kiln_assert_fail(#cond, __FILE__, __LINE__, (msg));                           \
    } while (0)

/* Checked host allocation: NULL with KILN_ERR_OUT_OF_MEMORY set (naming the
 * size and the call site) on failure. Free with free() / kiln_aligned_free. */
void *kiln_malloc_at(size_t size, const char *file, int line);
void *kiln_calloc_at(size_t count, size_t size, const char *file, int line);
void *kiln_realloc_at(void *ptr, size_t size, const char *file, int line);
void *kiln_aligned_alloc_at(size_t alignment, size_t size, const char *file, int line);
void kiln_aligned_free(void *ptr);
#define KILN_MALLOC(size) kiln_malloc_at((size), __FILE__, __LINE__)
#define KILN_CALLOC(count, size) kiln_calloc_at((count), (size), __FILE__, __LINE__)
#define KILN_REALLOC(ptr, size) kiln_realloc_at((ptr), (size), __FILE__, __LINE__)
#define KILN_ALIGNED_ALLOC(align, size) kiln_aligned_alloc_at((align), (size), __FILE__, __LINE__)

/* "1.50 GiB", "512 bytes" — PyTorch's format_size. Writes into buf. */
const char *kiln_format_bytes(uint64_t bytes, char *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif

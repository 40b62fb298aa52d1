/* Checked host allocation: failures raise KILN_ERR_OUT_OF_MEMORY naming the
 * size and the call site instead of crashing later on a NULL. */
#include <stdlib.h>

#include "base/error.h"

static void *oom(size_t size, const char *file, int line) {
    char b[32];
    kiln_error_raise(KILN_ERR_OUT_OF_MEMORY, file, line,
                     "free host memory or lower the batch size",
                     "host out of memory: allocating %s at %s:%d failed",
                     kiln_format_bytes(size, b, sizeof b), file, line);
    return NULL;
}

void *kiln_malloc_at(size_t size, const char *file, int line) {
    void *p = malloc(size ? size : 1);
    return p ? p : oom(size, file, line);
}

void *kiln_calloc_at(size_t count, size_t size, const char *file, int line) {
    if (size && count > SIZE_MAX / size) return oom(SIZE_MAX, file, line);
    void *p = calloc(count ? count : 1, size ? size : 1);
    return p ? p : oom(count * size, file, line);
}

void *kiln_realloc_at(void *ptr, size_t size, const char *file, int line) {
    void *p = realloc(ptr, size ? size : 1);
    return p ? p : oom(size, file, line);
}

void *kiln_aligned_alloc_at(size_t alignment, size_t size, const char *file, int line) {
    void *p = NULL;
    if (alignment < sizeof(void *)) alignment = sizeof(void *);
    if (posix_memalign(&p, alignment, size ? size : 1) != 0) return oom(size, file, line);
    return p;
}

void kiln_aligned_free(void *ptr) { free(ptr); }

/* A growable text buffer for the diag layer's tables and reports. */
#ifndef KILN_SRC_DIAG_STRBUF_H
#define KILN_SRC_DIAG_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct kiln_strbuf {
    char *data; /* NUL-terminated; the owner frees it with free() */
    size_t len, cap;
    bool failed; /* an allocation failed: the text is truncated */
} kiln_strbuf;

/* Append printf-formatted text; on allocation failure sets `failed`. */
void kiln_strbuf_printf(kiln_strbuf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#endif

/* The diag layer's growable text buffer. */
#include "diag/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void kiln_strbuf_printf(kiln_strbuf *b, const char *fmt, ...) {
    if (b->failed) return;
    for (;;) {
        size_t room = b->cap - b->len;
        va_list ap;
        va_start(ap, fmt);
        int n = b->data ? vsnprintf(b->data + b->len, room, fmt, ap) : -2;
        va_end(ap);
        if (n == -1) {
            b->failed = true;
            return;
        }
        if (n >= 0 && (size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        size_t need = b->len + (n > 0 ? (size_t)n : 0) + 1;
        size_t cap = b->cap ? b->cap * 2 : 1024;
        while (cap < need) cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) {
            b->failed = true;
            return;
        }
        b->data = d, b->cap = cap;
    }
}

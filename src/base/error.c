/* The thread-local error object and always-on asserts. */
#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local kiln_error tls_error;

static const char *const status_names[KILN_STATUS_COUNT] = {
    [KILN_OK] = "KILN_OK",
    [KILN_ERR_INVALID_ARGUMENT] = "KILN_ERR_INVALID_ARGUMENT",
    [KILN_ERR_OUT_OF_MEMORY] = "KILN_ERR_OUT_OF_MEMORY",
    [KILN_ERR_DEVICE] = "KILN_ERR_DEVICE",
    [KILN_ERR_UNSUPPORTED] = "KILN_ERR_UNSUPPORTED",
    [KILN_ERR_STATE] = "KILN_ERR_STATE",
    [KILN_ERR_IO] = "KILN_ERR_IO",
    [KILN_ERR_INTERNAL] = "KILN_ERR_INTERNAL",
};

const char *kiln_status_name(kiln_status status) {
    if ((unsigned)status >= KILN_STATUS_COUNT) return "KILN_STATUS_UNKNOWN";
    return status_names[status];
}

const kiln_error *kiln_error_last(void) { return &tls_error; }

const char *kiln_error_message(void) { return tls_error.message; }

void kiln_error_clear(void) {
    tls_error.status = KILN_OK;
    tls_error.file = NULL;
    tls_error.line = 0;
    tls_error.message[0] = '\0';
    tls_error.hint[0] = '\0';
}

kiln_status kiln_error_raise(kiln_status status, const char *file, int line, const char *hint,
                             const char *fmt, ...) {
    /* Format into a scratch buffer first: the message may quote the
     * previous error (kiln_error_message()), which lives in tls_error. */
    char message[sizeof tls_error.message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    memcpy(tls_error.message, message, sizeof message);
    if (hint && hint != tls_error.hint) snprintf(tls_error.hint, sizeof tls_error.hint, "%s", hint);
    else if (!hint) tls_error.hint[0] = '\0';
    tls_error.status = status;
    tls_error.file = file;
    tls_error.line = line;
    kiln_log_write(KILN_LOG_DEBUG, "%s at %s:%d: %s", kiln_status_name(status), file, line, message);
    return status;
}

KILN_NORETURN void kiln_assert_fail(const char *cond, const char *file, int line, const char *msg) {
    kiln_log_write(KILN_LOG_ERROR, "internal error: assertion `%s` failed at %s:%d%s%s (please report this bug)",
             cond, file, line, msg ? ": " : "", msg ? msg : "");
    fflush(stderr);
    abort();
}

const char *kiln_format_bytes(uint64_t bytes, char *buf, size_t size) {
    const double kib = 1024.0, mib = kib * 1024.0, gib = mib * 1024.0;
    double b = (double)bytes;
    if (bytes <= 1024) snprintf(buf, size, "%llu bytes", (unsigned long long)bytes);
    else if (b <= mib) snprintf(buf, size, "%.2f KiB", b / kib);
    else if (b <= gib) snprintf(buf, size, "%.2f MiB", b / mib);
    else snprintf(buf, size, "%.2f GiB", b / gib);
    return buf;
}

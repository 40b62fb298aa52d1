/* kiln report's input: metrics.jsonl lines and bounded whole-file reads
 * (metrics_read.h). */
#include "metrics_read.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "data/readers.h"

static bool blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

kiln_metrics_kind kiln_metrics_line_parse(const char *text, size_t len, kiln_metrics_record *out) {
    *out = (kiln_metrics_record){.kind = KILN_METRICS_BLANK};
    while (len && blank(text[len - 1])) len--;
    size_t start = 0;
    while (start < len && blank(text[start])) start++;
    if (start == len) return out->kind;
    if (len - start > KILN_METRICS_MAX_LINE_BYTES) return out->kind = KILN_METRICS_TOO_LONG;
    cJSON *rec = kiln_json_parse(text + start, len - start, NULL, 0);
    if (!cJSON_IsObject(rec)) {
        cJSON_Delete(rec);
        return out->kind = KILN_METRICS_MALFORMED;
    }
    out->rec = rec;
    const char *event = kiln_json_string(kiln_json_get(rec, "event"), NULL);
    if (!event) return out->kind = KILN_METRICS_NO_EVENT;
    out->event = event;
    const char *x_key = NULL;
    if (!strcmp(event, "step"))
        out->kind = KILN_METRICS_STEP, x_key = "step";
    else if (!strcmp(event, "epoch"))
        out->kind = KILN_METRICS_EPOCH, x_key = "epoch";
    else if (!strcmp(event, "summary"))
        out->kind = KILN_METRICS_SUMMARY;
    else
        out->kind = KILN_METRICS_OTHER;
    double x;
    if (x_key && kiln_json_number(kiln_json_get(rec, x_key), &x) && fabs(x) <= KILN_METRICS_MAX_INDEX)
        out->has_x = true, out->x = x;
    return out->kind;
}

bool kiln_metrics_next_line(const char *text, size_t len, size_t *at, const char **line, size_t *line_len) {
    if (*at >= len) return false;
    const char *nl = memchr(text + *at, '\n', len - *at);
    size_t end = nl ? (size_t)(nl - text) : len;
    *line = text + *at, *line_len = end - *at;
    *at = end + 1;
    return true;
}

bool kiln_metrics_value(const cJSON *field, double *out) {
    double v;
    if (!kiln_json_number(field, &v) || !(fabs(v) <= 1e300)) return false;
    *out = v;
    return true;
}

/* The open file `fd` of `path`: a regular file of at most `limit` bytes,
 * else false with the reason in err. */
static bool check_regular(int fd, const char *path, size_t limit, size_t *size, char *err, size_t err_size) {
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(err, err_size, "cannot stat %s: %s", path, strerror(errno));
        return false;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, err_size, "%s is %s, not a regular file", path,
                 kiln_file_type_name((unsigned)st.st_mode));
        errno = EINVAL;
        return false;
    }
    if ((uint64_t)st.st_size > (uint64_t)limit) {
        char a[32], b[32];
        snprintf(err, err_size, "%s is %s, more than the %s kiln report reads", path,
                 kiln_format_bytes((uint64_t)st.st_size, a, sizeof a), kiln_format_bytes(limit, b, sizeof b));
        errno = EFBIG;
        return false;
    }
    *size = (size_t)st.st_size;
    return true;
}

char *kiln_metrics_read_file(const char *path, size_t limit, size_t *len, char *err, size_t err_size) {
    *len = 0;
    /* O_NONBLOCK: opening a FIFO for reading would wait for a writer. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        snprintf(err, err_size, "cannot open %s: %s", path, strerror(e));
        errno = e;
        return NULL;
    }
    size_t size = 0;
    if (!check_regular(fd, path, limit, &size, err, err_size)) {
        int e = errno;
        close(fd);
        errno = e;
        return NULL;
    }
    char *buf = malloc(size + 1);
    if (!buf) {
        close(fd);
        snprintf(err, err_size, "out of host memory reading %s (%zu bytes)", path, size);
        errno = ENOMEM;
        return NULL;
    }
    size_t got = 0;
    while (got < size) {
        ssize_t n = read(fd, buf + got, size - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            int e = errno;
            snprintf(err, err_size, "cannot read %s: %s", path, strerror(e));
            close(fd);
            free(buf);
            errno = e;
            return NULL;
        }
        if (n == 0) break; /* it shrank while it was read: keep what there was */
        got += (size_t)n;
    }
    close(fd);
    buf[got] = '\0';
    *len = got;
    return buf;
}

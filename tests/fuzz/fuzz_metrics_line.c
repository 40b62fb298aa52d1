/* libFuzzer target for kiln report's metrics.jsonl reader
 * (tools/metrics_read.c): the input is the file's text, split into lines
 * and parsed line by line as kiln report does, every numeric field of each
 * record read as a plot value. Checks beyond the sanitizers: a line is
 * never read past its end (the input is not NUL-terminated), a record's x
 * is within the documented range, plot values are finite and bounded, and
 * a record is returned exactly for the kinds that carry one. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "../../tools/metrics_read.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                                                     \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            fprintf(stderr, "fuzz_metrics_line: %s:%d: %s\n", __FILE__, __LINE__, #cond);                    \
            abort();                                                                                         \
        }                                                                                                    \
    } while (0)

static void check_record(const kiln_metrics_record *m) {
    bool has_rec = m->kind >= KILN_METRICS_NO_EVENT;
    FUZZ_CHECK(has_rec == (m->rec != NULL));
    FUZZ_CHECK((m->kind >= KILN_METRICS_STEP) == (m->event != NULL));
    if (m->has_x) FUZZ_CHECK(isfinite(m->x) && fabs(m->x) <= KILN_METRICS_MAX_INDEX);
    if (!m->rec) return;
    FUZZ_CHECK(cJSON_IsObject(m->rec));
    const cJSON *f;
    cJSON_ArrayForEach(f, m->rec) {
        double v = 0;
        FUZZ_CHECK(f->string != NULL);
        if (kiln_metrics_value(f, &v)) FUZZ_CHECK(isfinite(v) && fabs(v) <= 1e300);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* An exact-size copy: reading past the end is a heap overflow ASan sees. */
    char *text = malloc(size ? size : 1);
    if (!text) return 0;
    for (size_t i = 0; i < size; i++) text[i] = (char)data[i];
    size_t at = 0, n;
    const char *line;
    while (kiln_metrics_next_line(text, size, &at, &line, &n)) {
        FUZZ_CHECK(line >= text && line + n <= text + size);
        kiln_metrics_record m;
        kiln_metrics_kind kind = kiln_metrics_line_parse(line, n, &m);
        FUZZ_CHECK(kind == m.kind);
        check_record(&m);
        cJSON_Delete(m.rec);
    }
    free(text);
    return 0;
}

/* Reading what kiln report reads: a metrics.jsonl line as a classified
 * record, and a whole file with its type and size checked first.
 *
 * Split from report.c so that the fuzz target tests/fuzz/fuzz_metrics_line.c
 * (built without the CLI) runs the same line parser kiln report runs. The
 * bounds are part of the contract (docs/report.md, "Hostile input"):
 * nothing but a regular file is read (a FIFO or /dev/zero never blocks or
 * streams forever), a file is refused above a cap before a byte is read,
 * and a line above KILN_METRICS_MAX_LINE_BYTES is skipped unparsed. */
#ifndef KILN_TOOLS_METRICS_READ_H
#define KILN_TOOLS_METRICS_READ_H

#include <stdbool.h>
#include <stddef.h>

#include "diag/json.h"

/* The most of metrics.jsonl kiln report reads (a run logging every step
 * writes ~300 bytes a step: 256 MiB is some 900k records), and the longest
 * line it parses (kiln train's longest record, the configuration, is
 * under 2 KiB). */
#define KILN_METRICS_MAX_FILE_BYTES ((size_t)256 << 20)
#define KILN_METRICS_MAX_LINE_BYTES ((size_t)1 << 20)
/* A step or epoch number is used as a plot's x only within +-2^53 (where
 * a double still counts in ones); beyond it the record's ordinal is used. */
#define KILN_METRICS_MAX_INDEX 9007199254740992.0

typedef enum kiln_metrics_kind {
    KILN_METRICS_BLANK,     /* white space only */
    KILN_METRICS_TOO_LONG,  /* over KILN_METRICS_MAX_LINE_BYTES, not parsed */
    KILN_METRICS_MALFORMED, /* not a JSON object */
    KILN_METRICS_NO_EVENT,  /* an object without a string "event" */
    KILN_METRICS_STEP,      /* "event":"step" */
    KILN_METRICS_EPOCH,     /* "event":"epoch" */
    KILN_METRICS_SUMMARY,   /* "event":"summary" */
    KILN_METRICS_OTHER,     /* any other event (configuration, checkpoint, ...) */
} kiln_metrics_kind;

typedef struct kiln_metrics_record {
    kiln_metrics_kind kind;
    cJSON *rec;        /* the object for NO_EVENT and after, else NULL; the caller frees it */
    const char *event; /* the event name, inside rec; NULL unless STEP and after */
    bool has_x;        /* STEP/EPOCH: "step"/"epoch" is a number within +-KILN_METRICS_MAX_INDEX */
    double x;          /* that number */
} kiln_metrics_record;

/* Classify and parse one line (text[0..len), need not be NUL-terminated;
 * a trailing newline, CR and surrounding blanks are ignored). Never reads
 * outside the line; returns out->kind. */
kiln_metrics_kind kiln_metrics_line_parse(const char *text, size_t len, kiln_metrics_record *out);

/* The next line of text[0..len) from *at (no newline in it) into
 * *line, *line_len; *at moves past it. False at the end. */
bool kiln_metrics_next_line(const char *text, size_t len, size_t *at, const char **line, size_t *line_len);

/* A numeric field of a record as a plot value: a finite number (cJSON
 * gives +-inf for 1e999) with |v| <= 1e300, so ranges and sums of a few
 * stay finite. */
bool kiln_metrics_value(const cJSON *field, double *out);

/* Read the whole regular file at `path` into a NUL-terminated malloc'd
 * buffer (length in *len). Opens without blocking and checks the type
 * with fstat before reading: a directory, FIFO or device is refused, as is
 * a file above `limit` bytes (a file growing while it is read is read up
 * to the size it had). NULL with the reason in err ("PATH is a FIFO (named
 * pipe), not a regular file", "cannot open PATH: No such file or
 * directory", ...; always naming the path), errno set (ENOENT when it does
 * not exist). Blocks only on the disk. */
char *kiln_metrics_read_file(const char *path, size_t limit, size_t *len, char *err, size_t err_size);

#endif

/* A small JSON reader for the diag layer's consumers: `kiln report` reads
 * metrics.jsonl and memory snapshots with it, and the tests parse the
 * snapshots and traces Kiln writes. RFC 8259 values into a tree; numbers
 * keep their integer value exactly when written as integers. Nesting is
 * limited (KILN_JSON_MAX_DEPTH levels of containers) so hostile input cannot exhaust the stack. */
#ifndef KILN_SRC_DIAG_JSON_READ_H
#define KILN_SRC_DIAG_JSON_READ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KILN_JSON_MAX_DEPTH 64

typedef enum kiln_json_type {
    KILN_JSON_NULL,
    KILN_JSON_BOOL,
    KILN_JSON_NUMBER,
    KILN_JSON_STRING,
    KILN_JSON_ARRAY,
    KILN_JSON_OBJECT,
    KILN_JSON_RAW /* an unparsed container (kiln_json_parse_lazy): raw, raw_len */
} kiln_json_type;

typedef struct kiln_json {
    kiln_json_type type;
    bool boolean;
    bool is_int;     /* a number written without fraction or exponent that fits int64 */
    double number;   /* every number */
    int64_t integer; /* exact when is_int */
    char *string;    /* NUL-terminated (decoded; \u0000 ends it early) */
    size_t n;        /* items of an array, members of an object */
    struct kiln_json **items;
    char **keys;     /* object member names, parallel to items */
    const char *raw; /* KILN_JSON_RAW: the container's text, inside the parsed buffer */
    size_t raw_len;
} kiln_json;

/* Parse exactly one value (surrounding white space allowed) from
 * text[0..len). NULL on a syntax error or when host memory is short, with
 * a message naming the byte offset in err (may be NULL). The caller frees
 * the tree with kiln_json_free. */
kiln_json *kiln_json_parse(const char *text, size_t len, char *err, size_t err_size);
void kiln_json_free(kiln_json *v);
/* As kiln_json_parse, but containers nested deeper than `depth` (the root
 * is depth 0) are only checked for balanced brackets and kept as
 * KILN_JSON_RAW spans of `text`, which must outlive the tree: a large
 * trace can then be read one entry at a time. */
kiln_json *kiln_json_parse_lazy(const char *text, size_t len, int depth, char *err, size_t err_size);
/* Parse a KILN_JSON_RAW node in place (it becomes the full value); other
 * nodes are left alone. False with a message in err on a syntax error. */
bool kiln_json_expand(kiln_json *v, char *err, size_t err_size);

/* Member `key` of an object (the last one when repeated), or NULL. */
const kiln_json *kiln_json_get(const kiln_json *obj, const char *key);
/* Item i of an array, or NULL. */
const kiln_json *kiln_json_at(const kiln_json *arr, size_t i);
/* Typed reads with a fallback when v is NULL or of another type. */
bool kiln_json_number(const kiln_json *v, double *out);
int64_t kiln_json_int(const kiln_json *v, int64_t fallback);
const char *kiln_json_string(const kiln_json *v, const char *fallback);
/* A path of object keys, e.g. kiln_json_path(root, "stats", "allocated_bytes", "all", "peak", NULL). */
const kiln_json *kiln_json_path(const kiln_json *v, ...);

/* Read a whole file into a NUL-terminated malloc'd buffer (length in
 * *len). NULL when it cannot be read (errno kept). */
char *kiln_json_read_file(const char *path, size_t *len);

#endif

/* Reading JSON on top of cJSON (<cjson/cJSON.h>), for the JSON Kiln reads
 * back: safetensors headers, and in `kiln report` and the tests,
 * metrics.jsonl records and memory snapshots.
 *
 * cJSON parses; this adds what its callers kept repeating: a parse bounded
 * by a length that rejects trailing text and names the byte offset of an
 * error, typed reads with a fallback, and a cursor that walks a document
 * too large for one tree one value at a time (a memory snapshot's trace
 * holds up to 262144 entries of ~14 cJSON nodes each: 408 MB as one
 * tree, measured with cJSON 1.7.15, against one entry's worth through the
 * cursor). cJSON limits nesting to CJSON_NESTING_LIMIT (1000) levels, so
 * hostile input cannot exhaust the stack. */
#ifndef KILN_SRC_DIAG_JSON_H
#define KILN_SRC_DIAG_JSON_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Where text[0..len) holds a control byte JSON never allows: below 0x20
 * and not white space (a NUL, say). cJSON copes with such a byte inside a
 * string by cutting the string short, so a name "a\0b" would read as
 * "a"; callers refuse the text instead. len when there is none. */
size_t kiln_json_control_byte(const char *text, size_t len);
/* Parse exactly one value from text[0..len) (white space around it
 * allowed; text need not be NUL-terminated). NULL on a syntax error, a
 * control byte (kiln_json_control_byte) or when host memory is short, with
 * "not valid JSON at byte N", "control byte 0xNN at byte N" or "text after
 * the value at byte N" in err (may be NULL; N counts from text).
 * The caller frees the tree with cJSON_Delete. Does not block. */
cJSON *kiln_json_parse(const char *text, size_t len, char *err, size_t err_size);

/* Member `key` of an object (case-sensitive; the first of a repeated
 * name) or item i of an array; NULL when v is NULL, of another type, or
 * has no such member or item. */
const cJSON *kiln_json_get(const cJSON *obj, const char *key);
const cJSON *kiln_json_at(const cJSON *arr, int i);
/* Typed reads with a fallback when v is NULL or of another type.
 * kiln_json_number is true only for a finite number; kiln_json_int
 * truncates a number within int64's range (exact up to 2^53, the most a
 * double holds). */
bool kiln_json_number(const cJSON *v, double *out);
int64_t kiln_json_int(const cJSON *v, int64_t fallback);
const char *kiln_json_string(const cJSON *v, const char *fallback);
/* A path of object keys (case-sensitive, the first member of a repeated
 * name), NULL-terminated: kiln_json_path(root, "stats", "allocated_bytes",
 * "all", "peak", NULL). NULL when a step is missing. */
const cJSON *kiln_json_path(const cJSON *v, ...);

/* Read a whole file into a NUL-terminated malloc'd buffer (length in
 * *len, may be NULL). NULL when it cannot be read (errno kept). Blocks. */
char *kiln_json_read_file(const char *path, size_t *len);

/* ---- Walking a large document one value at a time -----------------------------------
 * The cursor steps over brackets, commas and colons; every value the
 * caller takes is parsed by cJSON. Typical use, a huge array of objects:
 *
 *   kiln_json_cursor c;
 *   kiln_json_cursor_init(&c, text, len);
 *   if (kiln_json_cursor_enter(&c, '['))
 *       while (kiln_json_cursor_next(&c)) { cJSON *e = kiln_json_cursor_value(&c); ...; cJSON_Delete(e); }
 *   if (c.failed) ... c.err_at ...
 *   kiln_json_cursor_free(&c);
 */
#define KILN_JSON_CURSOR_DEPTH 16 /* containers entered at once */

typedef struct kiln_json_cursor {
    const char *s, *end, *start;
    int depth;                          /* containers entered and not yet left */
    char close[KILN_JSON_CURSOR_DEPTH]; /* their closing brackets */
    bool first[KILN_JSON_CURSOR_DEPTH]; /* no item read yet at that level */
    cJSON *key;                         /* the current member's name (objects) */
    bool failed;                        /* a syntax error; nothing more is read */
    size_t err_at;                      /* its byte offset from the text's start */
} kiln_json_cursor;

/* Start at text[0..len), which must outlive the cursor. */
void kiln_json_cursor_init(kiln_json_cursor *c, const char *text, size_t len);
/* Step into the container at the cursor when it opens with `open` ('[' or
 * '{'); false, the cursor unmoved, when another value is there. */
bool kiln_json_cursor_enter(kiln_json_cursor *c, char open);
/* Inside the innermost entered container: true with the cursor at the
 * next item's value (for an object, kiln_json_cursor_key names it); false
 * at the container's end, which is stepped past (or on a syntax error:
 * c->failed). */
bool kiln_json_cursor_next(kiln_json_cursor *c);
/* The current object member's name, borrowed until the next call; "" in
 * an array. */
const char *kiln_json_cursor_key(const kiln_json_cursor *c);
/* Parse the value at the cursor and step past it: a tree the caller frees
 * with cJSON_Delete, or NULL on a syntax error (c->failed). */
cJSON *kiln_json_cursor_value(kiln_json_cursor *c);
/* True when only white space is left after the top-level value. */
bool kiln_json_cursor_at_end(kiln_json_cursor *c);
void kiln_json_cursor_free(kiln_json_cursor *c);

#endif

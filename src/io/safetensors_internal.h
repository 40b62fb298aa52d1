/* The safetensors header parser, shared by safetensors.c and the fuzz
 * target (tests/fuzz/fuzz_safetensors.c). */
#ifndef KILN_SRC_IO_SAFETENSORS_INTERNAL_H
#define KILN_SRC_IO_SAFETENSORS_INTERNAL_H

#include "kiln/nn.h"

/* One tensor of the header. */
typedef struct kiln_st_entry {
    char *name;
    kiln_dtype dtype;
    kiln_shape shape;
    uint64_t begin, end; /* byte range in the data section */
} kiln_st_entry;

/* One __metadata__ entry (both strings owned by the index). */
typedef struct kiln_st_meta {
    char *key, *value;
} kiln_st_meta;

typedef struct kiln_st_index {
    int n;
    kiln_st_entry *items;
    uint64_t data_size; /* bytes after the header */
    int n_meta;
    kiln_st_meta *meta; /* the __metadata__ string map, in file order */
} kiln_st_index;

#define KILN_ST_HEADER_MAX (100u << 20) /* what the reference reader accepts */

/* The header length from the file's first 8 bytes (little-endian),
 * checked against the file's size and KILN_ST_HEADER_MAX before anything
 * is allocated for it. KILN_ERR_IO naming `file` when it does not fit. */
kiln_status kiln_st_header_length(const char *file, const uint8_t len8[8], uint64_t file_size, uint64_t *n);
/* Parse and validate the header's JSON text json[0..len) (not
 * NUL-terminated) of a file whose data section holds data_size bytes
 * (`file` names it in errors): every dtype, shape and range (inside the
 * data section, end - begin = numel * dtype size, no two ranges
 * overlapping), no tensor name twice. On success fills *idx (free with
 * kiln_st_index_free). KILN_ERR_IO on a bad header. */
kiln_status kiln_st_header_parse(const char *file, const char *json, size_t len, uint64_t data_size,
                                 kiln_st_index *idx);
/* kiln_st_header_length + kiln_st_header_parse over a whole file's bytes
 * (the fuzz target's entry point). */
kiln_status kiln_st_index_parse(const char *file, const uint8_t *bytes, size_t size, kiln_st_index *idx);
void kiln_st_index_free(kiln_st_index *idx);
/* The __metadata__ value of `key`, borrowed from idx; NULL when absent. */
const char *kiln_st_meta_get(const kiln_st_index *idx, const char *key);
/* Open `path` and parse its header (kiln_safetensors_open), then read the
 * whole data section: *bytes (free()) holds it and *data points at it; *idx
 * is the header. Blocks. */
kiln_status kiln_st_read(const char *path, uint8_t **bytes, const uint8_t **data, kiln_st_index *idx);
/* Write `n` named tensors (copied to the host, in order) and `n_meta`
 * metadata pairs (meta[2k] key, meta[2k+1] value) to `path` atomically:
 * a temporary file in the same directory, fsync'd, renamed over path,
 * then the directory fsync'd. Blocks. */
kiln_status kiln_st_write(const char *path, const kiln_named_tensor *items, int n, const char *const *meta,
                          int n_meta);

/* Load the file's tensors named like m's state dict into m (strict: the
 * error lists missing and unexpected names, names starting with
 * ignore_prefix excepted; every shape and dtype is checked before any
 * copy). Blocks. */
kiln_status kiln_st_load_module(const char *path, const kiln_st_index *idx, const uint8_t *data, kiln_module *m,
                                const char *ignore_prefix);

/* "F32", "I64", ... (safetensors' names); NULL for a dtype it lacks. */
const char *kiln_st_dtype_name(kiln_dtype dtype);

#endif

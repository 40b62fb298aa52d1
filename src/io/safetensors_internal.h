/* The safetensors header parser, shared by safetensors.c and the fuzz
 * target (tests/fuzz/fuzz_safetensors.c). */
#ifndef KILN_SRC_IO_SAFETENSORS_INTERNAL_H
#define KILN_SRC_IO_SAFETENSORS_INTERNAL_H

#include "kiln/tensor.h"

/* One tensor of the header. */
typedef struct kiln_st_entry {
    char *name;
    kiln_dtype dtype;
    kiln_shape shape;
    uint64_t begin, end; /* byte range in the data section */
} kiln_st_entry;

typedef struct kiln_st_index {
    int n, cap;
    kiln_st_entry *items;
    uint64_t data_size; /* bytes after the header */
} kiln_st_index;

/* Parse and validate the file's bytes (`file` names it in errors): the
 * header length, the JSON, every dtype, shape and range (inside the data
 * section, end - begin = numel * dtype size, no two ranges overlapping).
 * On success fills *idx (free with kiln_st_index_free). KILN_ERR_IO on a
 * bad file. */
kiln_status kiln_st_index_parse(const char *file, const uint8_t *bytes, size_t size, kiln_st_index *idx);
void kiln_st_index_free(kiln_st_index *idx);
/* "F32", "I64", ... (safetensors' names); NULL for a dtype it lacks. */
const char *kiln_st_dtype_name(kiln_dtype dtype);

#endif

/* Parsing the JSON header of a safetensors file. cJSON parses the text;
 * this file checks that the tree has the format's shape (an object of
 * tensor entries plus an optional "__metadata__" object of strings) and
 * that every number, name and range is sane before anything uses it. The
 * header is untrusted input: lengths are bounded before anything is
 * allocated, sizes are multiplied with overflow checks, and the names are
 * checked for repeats, which cJSON itself accepts silently. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "diag/json.h"
#include "io/safetensors_internal.h"

/* Integers in the header are read through a double: 2^53 is where they
 * stop being exact, far above any real offset (8 PiB). */
#define ST_MAX_EXACT 9007199254740992.0

static const char *const st_dtypes[KILN_DTYPE_COUNT] = {
    [KILN_F32] = "F32", [KILN_F16] = "F16", [KILN_BF16] = "BF16", [KILN_F64] = "F64",
    [KILN_I32] = "I32", [KILN_I64] = "I64", [KILN_U8] = "U8",     [KILN_BOOL] = "BOOL",
};

const char *kiln_st_dtype_name(kiln_dtype dtype) {
    return (unsigned)dtype < KILN_DTYPE_COUNT ? st_dtypes[dtype] : NULL;
}

/* A header that is not the format's: names the file, the tensor (when one
 * is at fault) and what was wrong. */
static kiln_status bad(const char *file, const char *tensor, const char *what) {
    if (tensor)
        return KILN_RAISE(KILN_ERR_IO, "the file is not a valid safetensors file (truncated or corrupted?)",
                          "%s: bad safetensors header: tensor '%s': %s", file, tensor, what);
    return KILN_RAISE(KILN_ERR_IO, "the file is not a valid safetensors file (truncated or corrupted?)",
                      "%s: bad safetensors header: %s", file, what);
}

kiln_status kiln_st_header_length(const char *file, const uint8_t len8[8], uint64_t file_size, uint64_t *n) {
    *n = 0;
    if (file_size < 8)
        return KILN_RAISE(KILN_ERR_IO, "the file is truncated",
                          "%s: %llu bytes, too short for a safetensors header", file,
                          (unsigned long long)file_size);
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | len8[i];
    if (v > KILN_ST_HEADER_MAX || v > file_size - 8)
        return KILN_RAISE(KILN_ERR_IO, "the file is truncated or not a safetensors file",
                          "%s: header length %llu does not fit the file's %llu bytes (at most 100 MiB)", file,
                          (unsigned long long)v, (unsigned long long)file_size);
    *n = v;
    return KILN_OK;
}

/* A non-negative integer of the header (a shape dimension, an offset). */
static bool header_uint(const cJSON *v, uint64_t max, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return false;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= (double)max && d <= ST_MAX_EXACT) || floor(d) != d) return false;
    *out = (uint64_t)d;
    return true;
}

static kiln_status parse_dtype(const char *file, const char *name, const cJSON *v, kiln_st_entry *e) {
    if (!cJSON_IsString(v)) return bad(file, name, "\"dtype\" must be a string");
    for (int i = 0; i < KILN_DTYPE_COUNT; i++)
        if (strcmp(v->valuestring, st_dtypes[i]) == 0) {
            e->dtype = (kiln_dtype)i;
            return KILN_OK;
        }
    char what[160];
    snprintf(what, sizeof what, "unknown dtype '%.40s' (Kiln reads F32 F16 BF16 F64 I32 I64 U8 BOOL)",
             v->valuestring);
    return bad(file, name, what);
}

static kiln_status parse_shape(const char *file, const char *name, const cJSON *v, kiln_st_entry *e) {
    if (!cJSON_IsArray(v)) return bad(file, name, "\"shape\" must be an array of dimensions");
    int n = cJSON_GetArraySize(v);
    if (n > KILN_MAX_DIMS) {
        char what[96];
        snprintf(what, sizeof what, "\"shape\" has %d dimensions (Kiln holds at most %d)", n, KILN_MAX_DIMS);
        return bad(file, name, what);
    }
    e->shape.ndim = n;
    int i = 0;
    for (const cJSON *d = v->child; d; d = d->next, i++) {
        uint64_t x;
        if (!header_uint(d, UINT64_MAX, &x))
            return bad(file, name, "\"shape\" holds a value that is not a non-negative integer");
        if (x > (1ull << 40)) return bad(file, name, "dimension too large (at most 2^40)");
        e->shape.d[i] = (int64_t)x;
    }
    return KILN_OK;
}

static kiln_status parse_offsets(const char *file, const char *name, const cJSON *v, kiln_st_entry *e) {
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 2 || !header_uint(v->child, UINT64_MAX, &e->begin) ||
        !header_uint(v->child->next, UINT64_MAX, &e->end))
        return bad(file, name, "data_offsets must be [begin, end], two non-negative integers");
    return KILN_OK;
}

/* The entry's range must lie in the data section and hold exactly
 * numel * dtype size bytes. */
static kiln_status check_range(const char *file, const kiln_st_entry *e, uint64_t data_size) {
    uint64_t bytes = kiln_dtype_size(e->dtype);
    for (int i = 0; i < e->shape.ndim; i++) {
        uint64_t d = (uint64_t)e->shape.d[i];
        if (d && bytes > UINT64_MAX / d)
            return bad(file, e->name, "tensor too large (its byte size overflows)");
        bytes *= d;
    }
    if (e->begin > e->end || e->end > data_size)
        return KILN_RAISE(KILN_ERR_IO, "the file is truncated or corrupted",
                          "%s: tensor '%s' has data_offsets [%llu, %llu] outside the %llu data bytes", file,
                          e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
                          (unsigned long long)data_size);
    if (e->end - e->begin != bytes)
        return KILN_RAISE(KILN_ERR_IO, "the file is corrupted",
                          "%s: tensor '%s' has %llu data bytes but its dtype and shape need %llu", file,
                          e->name, (unsigned long long)(e->end - e->begin), (unsigned long long)bytes);
    return KILN_OK;
}

/* One tensor entry: exactly the three fields, each once. */
static kiln_status parse_entry(const char *file, const cJSON *obj, uint64_t data_size, kiln_st_entry *e) {
    if (!cJSON_IsObject(obj))
        return bad(file, e->name, "the entry must be an object {dtype, shape, data_offsets}");
    bool seen[3] = {false, false, false};
    static const char *const fields[3] = {"dtype", "shape", "data_offsets"};
    for (const cJSON *f = obj->child; f; f = f->next) {
        int k = 0;
        while (k < 3 && strcmp(f->string, fields[k]) != 0) k++;
        if (k == 3) {
            char what[160];
            snprintf(what, sizeof what, "unknown field '%.40s' (an entry has dtype, shape, data_offsets)",
                     f->string);
            return bad(file, e->name, what);
        }
        if (seen[k]) {
            char what[96];
            snprintf(what, sizeof what, "field '%s' appears twice", fields[k]);
            return bad(file, e->name, what);
        }
        seen[k] = true;
        KILN_TRY(k == 0   ? parse_dtype(file, e->name, f, e)
                 : k == 1 ? parse_shape(file, e->name, f, e)
                          : parse_offsets(file, e->name, f, e));
    }
    if (!seen[0] || !seen[1] || !seen[2])
        return bad(file, e->name, "the entry needs dtype, shape and data_offsets");
    return check_range(file, e, data_size);
}

/* __metadata__ is a map of strings to strings; kept in idx->meta in file
 * order. */
static kiln_status parse_metadata(const char *file, const cJSON *obj, kiln_st_index *idx) {
    if (!cJSON_IsObject(obj)) return bad(file, NULL, "\"__metadata__\" must be an object of strings");
    int n = cJSON_GetArraySize(obj);
    idx->meta = KILN_MALLOC((size_t)(n ? n : 1) * sizeof *idx->meta);
    if (!idx->meta) return KILN_ERR_OUT_OF_MEMORY;
    for (const cJSON *m = obj->child; m; m = m->next) {
        if (!cJSON_IsString(m)) {
            char what[160];
            snprintf(what, sizeof what, "\"__metadata__\" value of '%.60s' is not a string", m->string);
            return bad(file, NULL, what);
        }
        char *k = strdup(m->string), *v = k ? strdup(m->valuestring) : NULL;
        if (!v) {
            free(k);
            return KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL,
                              "%s: out of host memory copying the header's metadata", file);
        }
        idx->meta[idx->n_meta++] = (kiln_st_meta){k, v};
    }
    return KILN_OK;
}

const char *kiln_st_meta_get(const kiln_st_index *idx, const char *key) {
    for (int i = idx->n_meta - 1; i >= 0; i--)
        if (strcmp(idx->meta[i].key, key) == 0) return idx->meta[i].value;
    return NULL;
}

static int cmp_range(const void *a, const void *b) {
    const kiln_st_entry *x = *(kiln_st_entry *const *)a, *y = *(kiln_st_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp((*(kiln_st_entry *const *)a)->name, (*(kiln_st_entry *const *)b)->name);
}

/* The data section is exactly its tensors' bytes, as the reference
 * library (safetensors' `validate`) requires: in offset order each range
 * begins where the previous one ended, the first at 0, and the last ends
 * at the end of the file. A gap, an overlap or bytes after the last
 * tensor are refused, so a file never carries data no tensor owns. */
static kiln_status check_exact(const char *file, kiln_st_entry *const *order, int n, uint64_t data_size) {
    uint64_t at = 0;
    for (int i = 0; i < n; i++) {
        const kiln_st_entry *e = order[i];
        if (e->begin < at)
            return KILN_RAISE(KILN_ERR_IO, "the file is corrupted", "%s: tensors '%s' and '%s' overlap", file,
                              order[i - 1]->name, e->name);
        if (e->begin > at)
            return KILN_RAISE(KILN_ERR_IO, "the file is corrupted or was not written by a safetensors writer",
                              "%s: data bytes %llu..%llu belong to no tensor (a gap before '%s'; safetensors data "
                              "is contiguous)",
                              file, (unsigned long long)at, (unsigned long long)e->begin, e->name);
        at = e->end;
    }
    if (at != data_size)
        return KILN_RAISE(KILN_ERR_IO, "the file was appended to or damaged: cut it to its tensors' data, or write it again",
                          "%s: %llu bytes after the data section's last tensor (the tensors index %llu of its %llu "
                          "data bytes; safetensors data is exactly the tensors' bytes)",
                          file, (unsigned long long)(data_size - at), (unsigned long long)at,
                          (unsigned long long)data_size);
    return KILN_OK;
}

/* No name repeats, "__metadata__" comes at most once, and the ranges index
 * the data section exactly: found by sorting, so a header of any size is
 * checked in n log n. */
static kiln_status check_unique(const char *file, kiln_st_index *idx, int n_metadata) {
    if (n_metadata > 1) return bad(file, NULL, "\"__metadata__\" appears twice");
    kiln_st_entry **order = KILN_MALLOC((size_t)(idx->n ? idx->n : 1) * sizeof *order);
    if (!order) return KILN_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < idx->n; i++) order[i] = &idx->items[i];
    kiln_status st = KILN_OK;
    qsort(order, (size_t)idx->n, sizeof *order, cmp_name);
    for (int i = 1; i < idx->n && st == KILN_OK; i++)
        if (strcmp(order[i]->name, order[i - 1]->name) == 0)
            st = KILN_RAISE(KILN_ERR_IO, "the file is corrupted",
                            "%s: tensor '%s' appears twice in the header", file, order[i]->name);
    qsort(order, (size_t)idx->n, sizeof *order, cmp_range);
    if (st == KILN_OK) st = check_exact(file, order, idx->n, idx->data_size);
    free(order);
    return st;
}

static kiln_status parse_tree(const char *file, const cJSON *root, uint64_t data_size, kiln_st_index *idx) {
    if (!cJSON_IsObject(root)) return bad(file, NULL, "the header must be a JSON object");
    int n_metadata = 0, n = cJSON_GetArraySize(root);
    idx->items = KILN_MALLOC((size_t)(n ? n : 1) * sizeof *idx->items);
    if (!idx->items) return KILN_ERR_OUT_OF_MEMORY;
    idx->data_size = data_size;
    for (const cJSON *m = root->child; m; m = m->next) {
        if (strcmp(m->string, "__metadata__") == 0) {
            if (n_metadata++ == 0) KILN_TRY(parse_metadata(file, m, idx));
            continue;
        }
        kiln_st_entry *e = &idx->items[idx->n];
        memset(e, 0, sizeof *e);
        e->name = strdup(m->string);
        if (!e->name)
            return KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "%s: out of host memory copying a tensor name",
                              file);
        idx->n++;
        KILN_TRY(parse_entry(file, m, data_size, e));
    }
    return check_unique(file, idx, n_metadata);
}

kiln_status kiln_st_header_parse(const char *file, const char *json, size_t len, uint64_t data_size,
                                 kiln_st_index *idx) {
    memset(idx, 0, sizeof *idx);
    /* A control byte would cut a name short inside cJSON: refused first. */
    size_t ctl = kiln_json_control_byte(json, len);
    if (ctl < len)
        return KILN_RAISE(KILN_ERR_IO, "the file is not a valid safetensors file (truncated or corrupted?)",
                          "%s: bad safetensors header at byte %llu: control byte 0x%02x (JSON allows none)",
                          file, (unsigned long long)ctl + 8, (unsigned)(unsigned char)json[ctl]);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, false);
    kiln_status st = KILN_OK;
    if (!root) {
        /* cJSON reports where it stopped (it cannot tell running out of
         * memory from bad text); byte offsets count from the file's start:
         * the header begins after its 8-byte length. */
        long long at = end ? (long long)(end - json) + 8 : 8;
        st = KILN_RAISE(KILN_ERR_IO, "the file is not a valid safetensors file (truncated or corrupted?)",
                        "%s: bad safetensors header at byte %lld: not valid JSON", file, at);
    } else {
        /* cJSON stops after the value; only the format's space padding may
         * follow it. */
        const char *p = end;
        while (p < json + len && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
        if (p != json + len)
            st = KILN_RAISE(KILN_ERR_IO, "the file is not a valid safetensors file (truncated or corrupted?)",
                            "%s: bad safetensors header at byte %lld: text after the header object", file,
                            (long long)(p - json) + 8);
    }
    if (st == KILN_OK) st = parse_tree(file, root, data_size, idx);
    cJSON_Delete(root);
    if (st != KILN_OK) kiln_st_index_free(idx);
    return st;
}

kiln_status kiln_st_index_parse(const char *file, const uint8_t *bytes, size_t size, kiln_st_index *idx) {
    memset(idx, 0, sizeof *idx);
    uint64_t n = 0;
    KILN_TRY(kiln_st_header_length(file, bytes, size, &n));
    return kiln_st_header_parse(file, (const char *)bytes + 8, (size_t)n, size - 8 - n, idx);
}

void kiln_st_index_free(kiln_st_index *idx) {
    for (int i = 0; i < idx->n; i++) free(idx->items[i].name);
    free(idx->items);
    for (int i = 0; i < idx->n_meta; i++) {
        free(idx->meta[i].key);
        free(idx->meta[i].value);
    }
    free(idx->meta);
    memset(idx, 0, sizeof *idx);
}

/* Parsing the JSON header of a safetensors file. The header is untrusted
 * input: every length, number and range is checked before it is used, and
 * the parser accepts only the format's shape (an object of tensor entries
 * plus an optional "__metadata__" object of strings). */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "io/safetensors_internal.h"

#define ST_HEADER_MAX (100u << 20) /* what the reference reader accepts */

typedef struct json_cursor {
    const char *file;
    const char *s, *end, *start;
} json_cursor;

static kiln_status bad(json_cursor *c, const char *what) {
    return KILN_RAISE(KILN_ERR_IO, "the file is not a valid safetensors file (truncated or corrupted?)",
                      "%s: bad safetensors header at byte %lld: %s", c->file, (long long)(c->s - c->start) + 8, what);
}

static void skip_ws(json_cursor *c) {
    while (c->s < c->end && (*c->s == ' ' || *c->s == '\n' || *c->s == '\r' || *c->s == '\t')) c->s++;
}

static kiln_status expect(json_cursor *c, char ch) {
    skip_ws(c);
    if (c->s >= c->end || *c->s != ch) {
        char what[32] = "expected ' '";
        what[10] = ch;
        return bad(c, what);
    }
    c->s++;
    return KILN_OK;
}

static int hexval(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* A JSON string into a malloc'd, NUL-terminated copy. \u escapes are
 * accepted for ASCII only (names Kiln and PyTorch write are ASCII). */
static kiln_status parse_string(json_cursor *c, char **out) {
    *out = NULL;
    KILN_TRY(expect(c, '"'));
    const char *q = c->s;
    while (q < c->end && *q != '"') q += (*q == '\\' && q + 1 < c->end) ? 2 : 1;
    if (q >= c->end) return bad(c, "unterminated string");
    char *r = KILN_MALLOC((size_t)(q - c->s) + 1), *w = r;
    if (!r) return KILN_ERR_OUT_OF_MEMORY;
    while (c->s < q) {
        char ch = *c->s++;
        if ((unsigned char)ch < 0x20) {
            free(r);
            return bad(c, "control character in a string");
        }
        if (ch != '\\') {
            *w++ = ch;
            continue;
        }
        ch = *c->s++;
        static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
        const char *hit = ch ? strchr(from, ch) : NULL;
        if (hit) {
            *w++ = to[hit - from];
        } else if (ch == 'u' && q - c->s >= 4 && hexval(c->s[0]) == 0 && hexval(c->s[1]) == 0 && hexval(c->s[2]) >= 0 &&
                   hexval(c->s[2]) < 8 && hexval(c->s[3]) >= 0 && (hexval(c->s[2]) | hexval(c->s[3]))) {
            *w++ = (char)(hexval(c->s[2]) * 16 + hexval(c->s[3]));
            c->s += 4;
        } else {
            free(r);
            return bad(c, "unsupported escape in a string");
        }
    }
    *w = '\0';
    c->s = q + 1;
    *out = r;
    return KILN_OK;
}

static kiln_status parse_uint(json_cursor *c, uint64_t *out) {
    skip_ws(c);
    uint64_t v = 0;
    const char *d = c->s;
    while (c->s < c->end && *c->s >= '0' && *c->s <= '9') {
        if (v > (UINT64_MAX - 9) / 10) return bad(c, "number too large");
        v = v * 10 + (uint64_t)(*c->s++ - '0');
    }
    if (c->s == d) return bad(c, "expected a non-negative integer");
    *out = v;
    return KILN_OK;
}

/* [a, b, ...] of non-negative integers, at most `max` of them. */
static kiln_status parse_uint_array(json_cursor *c, int max, uint64_t *v, int *n) {
    *n = 0;
    KILN_TRY(expect(c, '['));
    skip_ws(c);
    if (c->s < c->end && *c->s == ']') {
        c->s++;
        return KILN_OK;
    }
    for (;;) {
        if (*n == max) return bad(c, "array too long");
        KILN_TRY(parse_uint(c, &v[(*n)++]));
        skip_ws(c);
        if (c->s < c->end && *c->s == ',') {
            c->s++;
            continue;
        }
        return expect(c, ']');
    }
}

static const char *const st_dtypes[KILN_DTYPE_COUNT] = {
    [KILN_F32] = "F32", [KILN_F16] = "F16", [KILN_BF16] = "BF16", [KILN_F64] = "F64",
    [KILN_I32] = "I32", [KILN_I64] = "I64", [KILN_U8] = "U8",     [KILN_BOOL] = "BOOL",
};

const char *kiln_st_dtype_name(kiln_dtype dtype) {
    return (unsigned)dtype < KILN_DTYPE_COUNT ? st_dtypes[dtype] : NULL;
}

/* Calls f(c, key, ctx) for each key of an object, with the cursor at the value. */
typedef kiln_status (*member_fn)(json_cursor *c, const char *key, void *ctx);
static kiln_status parse_object(json_cursor *c, member_fn f, void *ctx) {
    KILN_TRY(expect(c, '{'));
    skip_ws(c);
    if (c->s < c->end && *c->s == '}') {
        c->s++;
        return KILN_OK;
    }
    for (;;) {
        char *key;
        KILN_TRY(parse_string(c, &key));
        kiln_status st = expect(c, ':');
        if (st == KILN_OK) st = f(c, key, ctx);
        free(key);
        KILN_TRY(st);
        skip_ws(c);
        if (c->s < c->end && *c->s == ',') {
            c->s++;
            continue;
        }
        return expect(c, '}');
    }
}

/* __metadata__ is a map of strings to strings; kept in idx->meta. */
static kiln_status metadata_member(json_cursor *c, const char *key, void *ctx) {
    kiln_st_index *idx = ctx;
    char *value;
    KILN_TRY(parse_string(c, &value));
    if (idx->n_meta == idx->cap_meta) {
        int cap = idx->cap_meta ? idx->cap_meta * 2 : 16;
        kiln_st_meta *m = KILN_REALLOC(idx->meta, (size_t)cap * sizeof *m);
        if (!m) {
            free(value);
            return KILN_ERR_OUT_OF_MEMORY;
        }
        idx->meta = m;
        idx->cap_meta = cap;
    }
    char *k = strdup(key);
    if (!k) {
        free(value);
        return KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "out of memory copying a metadata key");
    }
    idx->meta[idx->n_meta++] = (kiln_st_meta){k, value};
    return KILN_OK;
}

const char *kiln_st_meta_get(const kiln_st_index *idx, const char *key) {
    for (int i = idx->n_meta - 1; i >= 0; i--)
        if (strcmp(idx->meta[i].key, key) == 0) return idx->meta[i].value;
    return NULL;
}

/* Fields seen so far in one tensor entry. */
typedef struct entry_fields {
    kiln_st_entry *e;
    bool dtype, shape, offsets;
} entry_fields;

static kiln_status entry_member(json_cursor *c, const char *key, void *ctx) {
    entry_fields *f = ctx;
    uint64_t v[KILN_MAX_DIMS + 1];
    int n;
    if (strcmp(key, "dtype") == 0) {
        char *name;
        KILN_TRY(parse_string(c, &name));
        int found = -1;
        for (int i = 0; i < KILN_DTYPE_COUNT; i++)
            if (strcmp(name, st_dtypes[i]) == 0) found = i;
        free(name);
        if (found < 0) return bad(c, "unknown dtype (Kiln reads F32 F16 BF16 F64 I32 I64 U8 BOOL)");
        f->e->dtype = (kiln_dtype)found;
        f->dtype = true;
    } else if (strcmp(key, "shape") == 0) {
        KILN_TRY(parse_uint_array(c, KILN_MAX_DIMS, v, &n));
        f->e->shape.ndim = n;
        for (int i = 0; i < n; i++) {
            if (v[i] > (1ull << 40)) return bad(c, "dimension too large");
            f->e->shape.d[i] = (int64_t)v[i];
        }
        f->shape = true;
    } else if (strcmp(key, "data_offsets") == 0) {
        KILN_TRY(parse_uint_array(c, 2, v, &n));
        if (n != 2) return bad(c, "data_offsets must be [begin, end]");
        f->e->begin = v[0];
        f->e->end = v[1];
        f->offsets = true;
    } else {
        return bad(c, "unknown field in a tensor entry (dtype, shape, data_offsets)");
    }
    return KILN_OK;
}

/* The entry's range must hold exactly numel * dtype size bytes. */
static kiln_status check_entry(json_cursor *c, const kiln_st_entry *e, uint64_t data_size) {
    uint64_t bytes = kiln_dtype_size(e->dtype);
    for (int i = 0; i < e->shape.ndim; i++) {
        uint64_t d = (uint64_t)e->shape.d[i];
        if (d && bytes > UINT64_MAX / d) return bad(c, "tensor too large");
        bytes *= d;
    }
    if (e->begin > e->end || e->end > data_size)
        return KILN_RAISE(KILN_ERR_IO, "the file is truncated or corrupted",
                          "%s: tensor '%s' has data_offsets [%llu, %llu] outside the %llu data bytes", c->file,
                          e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
                          (unsigned long long)data_size);
    if (e->end - e->begin != bytes)
        return KILN_RAISE(KILN_ERR_IO, "the file is corrupted",
                          "%s: tensor '%s' has %llu data bytes but its dtype and shape need %llu", c->file, e->name,
                          (unsigned long long)(e->end - e->begin), (unsigned long long)bytes);
    return KILN_OK;
}

static kiln_status top_member(json_cursor *c, const char *key, void *ctx) {
    kiln_st_index *idx = ctx;
    if (strcmp(key, "__metadata__") == 0) return parse_object(c, metadata_member, idx);
    if (idx->n == idx->cap) {
        int cap = idx->cap ? idx->cap * 2 : 16;
        kiln_st_entry *items = KILN_REALLOC(idx->items, (size_t)cap * sizeof *items);
        if (!items) return KILN_ERR_OUT_OF_MEMORY;
        idx->items = items;
        idx->cap = cap;
    }
    kiln_st_entry *e = &idx->items[idx->n];
    memset(e, 0, sizeof *e);
    e->name = strdup(key);
    if (!e->name) return KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "out of memory copying a tensor name");
    idx->n++;
    entry_fields f = {.e = e};
    KILN_TRY(parse_object(c, entry_member, &f));
    if (!f.dtype || !f.shape || !f.offsets) return bad(c, "a tensor entry needs dtype, shape and data_offsets");
    return check_entry(c, e, idx->data_size);
}

static int cmp_begin(const void *a, const void *b) {
    const kiln_st_entry *x = *(kiln_st_entry *const *)a, *y = *(kiln_st_entry *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* No two tensors share bytes and no name repeats. */
static kiln_status check_overlaps(const char *file, kiln_st_index *idx) {
    kiln_st_entry **order = KILN_MALLOC((size_t)(idx->n ? idx->n : 1) * sizeof *order);
    if (!order) return KILN_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < idx->n; i++) order[i] = &idx->items[i];
    qsort(order, (size_t)idx->n, sizeof *order, cmp_begin);
    kiln_status st = KILN_OK;
    for (int i = 1; i < idx->n && st == KILN_OK; i++)
        if (order[i]->begin < order[i - 1]->end && order[i]->begin != order[i]->end)
            st = KILN_RAISE(KILN_ERR_IO, "the file is corrupted", "%s: tensors '%s' and '%s' overlap", file,
                            order[i - 1]->name, order[i]->name);
    for (int i = 0; i < idx->n && st == KILN_OK; i++)
        for (int j = i + 1; j < idx->n && st == KILN_OK && idx->n <= 4096; j++)
            if (strcmp(idx->items[i].name, idx->items[j].name) == 0)
                st = KILN_RAISE(KILN_ERR_IO, "the file is corrupted", "%s: tensor '%s' appears twice", file,
                                idx->items[i].name);
    free(order);
    return st;
}

kiln_status kiln_st_index_parse(const char *file, const uint8_t *bytes, size_t size, kiln_st_index *idx) {
    memset(idx, 0, sizeof *idx);
    if (size < 8)
        return KILN_RAISE(KILN_ERR_IO, "the file is truncated", "%s: %zu bytes, too short for a safetensors header",
                          file, size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | bytes[i];
    if (n > ST_HEADER_MAX || n > size - 8)
        return KILN_RAISE(KILN_ERR_IO, "the file is truncated or not a safetensors file",
                          "%s: header length %llu does not fit the file's %zu bytes (at most 100 MiB)", file,
                          (unsigned long long)n, size);
    json_cursor c = {.file = file, .s = (const char *)bytes + 8, .end = (const char *)bytes + 8 + n};
    c.start = c.s;
    idx->data_size = size - 8 - n;
    kiln_status st = parse_object(&c, top_member, idx);
    if (st == KILN_OK) {
        skip_ws(&c);
        if (c.s != c.end) st = bad(&c, "text after the header object");
    }
    if (st == KILN_OK) st = check_overlaps(file, idx);
    if (st != KILN_OK) kiln_st_index_free(idx);
    return st;
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

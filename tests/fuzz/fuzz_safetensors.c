/* libFuzzer target for the safetensors header parser: the input is a whole
 * file. A header the parser accepts must describe ranges inside the data
 * section, each of the size its dtype and shape need, under names that do
 * not repeat (abort otherwise); errors are the expected outcome for almost
 * every input.
 *
 * A structure-aware mutator (LLVMFuzzerCustomMutator) keeps most inputs
 * well framed: a file is an 8-byte little-endian header length, the JSON
 * header, then the data. Byte-level mutations almost always break that
 * length and stop at "bad safetensors header at byte 8"; the mutator
 * instead mutates the header or the data section on its own with
 * libFuzzer's mutators and writes the length back, and now and then grows
 * or cuts the data section to the end the header's data_offsets name, so
 * that the checks past the framing (dtypes, shapes, offsets, sizes) are
 * reached. One mutation in eight is left raw, so that a length that
 * disagrees with the file stays covered. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "io/safetensors_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kiln_st_index idx;
    if (kiln_st_index_parse("fuzz.safetensors", data, size, &idx) != KILN_OK) return 0;
    for (int i = 0; i < idx.n; i++) {
        const kiln_st_entry *e = &idx.items[i];
        if (e->begin > e->end || e->end > idx.data_size) abort();
        uint64_t bytes = kiln_dtype_size(e->dtype);
        for (int d = 0; d < e->shape.ndim; d++) bytes *= (uint64_t)e->shape.d[d];
        if (e->end - e->begin != bytes) abort();
        for (int j = 0; j < i && i < 512; j++)
            if (strcmp(idx.items[j].name, e->name) == 0) abort();
    }
    kiln_st_index_free(&idx);
    return 0;
}

static uint64_t get_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static void put_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* The largest data_offsets end in the JSON header (len bytes), or -1 when
 * it does not parse or names none. */
static int64_t header_data_end(const uint8_t *header, size_t len) {
    cJSON *root = cJSON_ParseWithLength((const char *)header, len);
    int64_t end = -1;
    for (cJSON *e = root ? root->child : NULL; e; e = e->next) {
        cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        cJSON *last = cJSON_IsArray(off) ? cJSON_GetArrayItem(off, 1) : NULL;
        if (cJSON_IsNumber(last) && last->valuedouble >= 0 && last->valuedouble < 1e9 &&
            (int64_t)last->valuedouble > end)
            end = (int64_t)last->valuedouble;
    }
    cJSON_Delete(root);
    return end;
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    if (seed % 8 == 0 || size < 8 || size > max_size || max_size < 16 || get_le64(data) > size - 8)
        return LLVMFuzzerMutate(data, size, max_size);
    uint64_t hlen = get_le64(data);
    size_t dlen = size - 8 - (size_t)hlen;
    uint8_t *out = malloc(max_size);
    if (!out) return LLVMFuzzerMutate(data, size, max_size);
    size_t room = max_size - 8;
    size_t nh = (size_t)hlen, nd = dlen;
    if (seed % 8 <= 5) { /* the header */
        memcpy(out + 8, data + 8, nh);
        nh = LLVMFuzzerMutate(out + 8, nh, room - nd);
        memcpy(out + 8 + nh, data + 8 + hlen, nd);
    } else { /* the data section */
        memcpy(out + 8, data + 8, nh);
        memcpy(out + 8 + nh, data + 8 + hlen, nd);
        nd = LLVMFuzzerMutate(out + 8 + nh, nd, room - nh);
    }
    /* One in four: the data section as long as the header says. */
    if ((seed >> 3) % 4 == 0) {
        int64_t end = header_data_end(out + 8, nh);
        if (end >= 0 && (uint64_t)end <= room - nh) {
            if ((size_t)end > nd) memset(out + 8 + nh + nd, 0x3c, (size_t)end - nd);
            nd = (size_t)end;
        }
    }
    put_le64(out, nh);
    memcpy(data, out, 8 + nh + nd);
    free(out);
    return 8 + nh + nd;
}

/* libFuzzer target for the safetensors header parser: the input is a whole
 * file. A header the parser accepts must describe ranges inside the data
 * section, each of the size its dtype and shape need, under names that do
 * not repeat (abort otherwise); errors are the expected outcome for almost
 * every input. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

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

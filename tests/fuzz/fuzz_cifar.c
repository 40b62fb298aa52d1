/* libFuzzer target for the CIFAR-10/100 batch reader.
 *
 * The first byte picks CIFAR-10 or CIFAR-100; the rest is a batch file.
 * Valid batches are read back sample by sample through the dataset
 * interface. Inputs that start with the gzip magic also go through the
 * bounded decompressor first, as the file reader does. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "data/readers.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void parse_batch(const uint8_t *bytes, size_t size, int num_classes) {
    kiln_image_set set;
    if (kiln_cifar_parse_memory("batch", bytes, size, num_classes, &set) != KILN_OK) return;
    kiln_dataset *ds = NULL;
    if (kiln_dataset_from_image_set(&set, &ds) != KILN_OK) return;
    uint8_t sample[KILN_CIFAR_IMAGE_BYTES];
    if (kiln_sample_bytes(kiln_dataset_info(ds)) != sizeof sample) abort();
    for (int64_t i = 0; i < kiln_dataset_length(ds); i++) {
        int64_t label;
        if (kiln_dataset_get(ds, i, sample, &label) != KILN_OK) abort(); /* a validated set must read back */
        if (label < 0 || label >= num_classes) abort();
    }
    kiln_dataset_free(ds);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int num_classes = data[0] & 1 ? 100 : 10;
    const uint8_t *rest = data + 1;
    size_t rest_size = size - 1;
    parse_batch(rest, rest_size, num_classes);
    if (kiln_is_gzip(rest, rest_size)) {
        uint8_t *plain;
        size_t plain_size;
        if (kiln_gunzip_memory("gz", rest, rest_size, 1 << 20, 0, &plain, &plain_size) == KILN_OK) {
            parse_batch(plain, plain_size, num_classes);
            free(plain);
        }
    }
    return 0;
}

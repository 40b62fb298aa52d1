/* libFuzzer target for the IDX reader (MNIST, Fashion-MNIST).
 *
 * Input layout: byte 0 holds flags (bit 0: check labels against 10
 * classes, else infer the count), bytes 1-2 the images file's length
 * (big-endian, clamped), then the images file and the labels file. So one
 * input exercises both headers and the checks between them (counts, label
 * ranges), and a seed is easy to write by hand (tests/fuzz/make_corpus.py).
 * Each file goes through kiln_idx_decode (gzip or raw) as the file
 * reader's bytes do. Any crash, sanitizer report or leak is a finding; an
 * error return is the expected outcome for almost every input. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/readers.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A malloc'd copy of one file's bytes, decoded as the file reader does
 * (gzip or raw); NULL when decoding fails. */
static uint8_t *decode(const uint8_t *bytes, size_t size, int ndim, size_t *out_size) {
    uint8_t *raw = malloc(size + 1), *out;
    char shown[64];
    if (!raw) return NULL;
    if (size) memcpy(raw, bytes, size);
    if (kiln_idx_decode("file", raw, size, ndim, &out, out_size, shown, sizeof shown) != KILN_OK) return NULL;
    return out;
}

/* Parse one images/labels pair and, when it is valid, read every sample
 * back through the dataset interface. */
static void parse_pair(const uint8_t *im_file, size_t im_file_size, const uint8_t *lb_file,
                       size_t lb_file_size, int num_classes) {
    size_t im_size, lb_size;
    uint8_t *im = decode(im_file, im_file_size, 3, &im_size);
    uint8_t *lb = decode(lb_file, lb_file_size, 1, &lb_size);
    kiln_image_set set;
    kiln_status st = KILN_ERR_IO;
    if (im && lb) st = kiln_idx_build_memory("images", im, im_size, "labels", lb, lb_size, num_classes, &set);
    free(im);
    free(lb);
    if (st != KILN_OK) return;
    kiln_dataset *ds = NULL;
    if (kiln_dataset_from_image_set(&set, &ds) != KILN_OK) return;
    size_t bytes = kiln_sample_bytes(kiln_dataset_info(ds));
    uint8_t *sample = malloc(bytes ? bytes : 1);
    for (int64_t i = 0; sample && i < kiln_dataset_length(ds); i++) {
        int64_t label;
        if (kiln_dataset_get(ds, i, sample, &label) != KILN_OK) abort(); /* a validated set must read back */
    }
    free(sample);
    kiln_dataset_free(ds);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3) return 0;
    const uint8_t *rest = data + 3;
    size_t rest_size = size - 3, im_size = (size_t)data[1] << 8 | data[2];
    if (im_size > rest_size) im_size = rest_size;
    parse_pair(rest, im_size, rest + im_size, rest_size - im_size, data[0] & 1 ? 10 : 0);

    /* The whole input as one file of each kind. */
    kiln_idx_array a;
    size_t total;
    (void)kiln_idx_parse_memory("whole", rest, rest_size, 3, &a);
    (void)kiln_idx_parse_memory("whole", rest, rest_size, 1, &a);
    (void)kiln_idx_header_parse("whole", rest, rest_size, 3, &a, &total);

    if (kiln_is_gzip(rest, rest_size)) {
        uint8_t *plain;
        size_t plain_size;
        if (kiln_gunzip_memory("gz", rest, rest_size, 1 << 20, 0, &plain, &plain_size) == KILN_OK)
            free(plain);
    }
    return 0;
}

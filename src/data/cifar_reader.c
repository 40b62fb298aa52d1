/* CIFAR-10 and CIFAR-100 binary batches (https://www.cs.toronto.edu/~kriz/cifar.html).
 *
 * A batch file is a sequence of fixed-size records with no header:
 *
 *   CIFAR-10:   u8 label (0..9),                         u8 image[3072]   3073 bytes
 *   CIFAR-100:  u8 coarse (0..19), u8 fine (0..99),      u8 image[3072]   3074 bytes
 *
 * the image being (3, 32, 32): the red plane, then green, then blue, each
 * row-major. With no header, the file size and the label bytes are all
 * there is to validate: the size must be a whole number of records and
 * every label byte must be in range. Kiln's label for CIFAR-100 is the fine
 * one (100 classes), as in torchvision. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/checked.h"
#include "base/error.h"
#include "data/readers.h"

size_t kiln_cifar_record_bytes(int num_classes) {
    if (num_classes == 10) return 1 + KILN_CIFAR_IMAGE_BYTES;
    if (num_classes == 100) return 2 + KILN_CIFAR_IMAGE_BYTES;
    return 0;
}

static kiln_status cifar_check_classes(const char *fn, int num_classes) {
    if (kiln_cifar_record_bytes(num_classes) == 0)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use 10 for CIFAR-10 or 100 for CIFAR-100",
                          "%s: num_classes %d is not a CIFAR class count", fn, num_classes);
    return KILN_OK;
}

/* The error for a size that is not a whole number of records; names the
 * other CIFAR variant when the size fits it. */
static kiln_status cifar_size_error(const char *name, size_t size, int num_classes) {
    size_t record = kiln_cifar_record_bytes(num_classes);
    int other = num_classes == 10 ? 100 : 10;
    size_t other_record = kiln_cifar_record_bytes(other);
    char hint[96];
    snprintf(hint, sizeof hint, "this size fits CIFAR-%d records: pass num_classes %d", other, other);
    if (size == 0)
        return KILN_RAISE(KILN_ERR_IO, "the file is empty: download or copy it again",
                          "%s: empty file: expected at least one %zu-byte CIFAR-%d record", name, record,
                          num_classes);
    size_t last = size - size % record;
    return KILN_RAISE(
        KILN_ERR_IO, size % other_record == 0 ? hint : "the file is truncated or not a CIFAR batch",
        "%s: %zu bytes is not a whole number of %zu-byte CIFAR-%d records (%d label byte%s + %d "
        "image bytes): the record at offset %zu has %zu of its %zu bytes",
        name, size, record, num_classes, num_classes == 10 ? 1 : 2, num_classes == 10 ? "" : "s",
        KILN_CIFAR_IMAGE_BYTES, last, size - last, record);
}

kiln_status kiln_cifar_check_memory(const char *name, const uint8_t *bytes, size_t size, int num_classes,
                                    int64_t *count) {
    *count = 0;
    KILN_TRY(cifar_check_classes(name, num_classes));
    size_t record = kiln_cifar_record_bytes(num_classes);
    if (size == 0 || size % record != 0) return cifar_size_error(name, size, num_classes);
    size_t n = size / record;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *r = bytes + i * record;
        if (num_classes == 10 && r[0] >= 10)
            return KILN_RAISE(
                KILN_ERR_IO, "the file is corrupt, or is a CIFAR-100 batch (pass num_classes 100)",
                "%s: label %u at offset %zu (record %zu): expected 0..9", name, r[0], i * record, i);
        if (num_classes == 100 && r[0] >= 20)
            return KILN_RAISE(KILN_ERR_IO, "the file is corrupt, or is not a CIFAR-100 batch",
                              "%s: coarse label %u at offset %zu (record %zu): expected 0..19", name, r[0],
                              i * record, i);
        if (num_classes == 100 && r[1] >= 100)
            return KILN_RAISE(KILN_ERR_IO, "the file is corrupt, or is not a CIFAR-100 batch",
                              "%s: fine label %u at offset %zu (record %zu): expected 0..99", name, r[1],
                              i * record + 1, i);
    }
    *count = (int64_t)n;
    return KILN_OK;
}

/* Split `count` validated records into images (count, 3, 32, 32) and labels (count). */
static void cifar_copy(const uint8_t *bytes, int64_t count, int num_classes, uint8_t *images,
                       uint8_t *labels) {
    size_t record = kiln_cifar_record_bytes(num_classes);
    size_t label_at = num_classes == 10 ? 0 : 1, image_at = num_classes == 10 ? 1 : 2;
    for (int64_t i = 0; i < count; i++) {
        const uint8_t *r = bytes + (size_t)i * record;
        labels[i] = r[label_at];
        memcpy(images + (size_t)i * KILN_CIFAR_IMAGE_BYTES, r + image_at, KILN_CIFAR_IMAGE_BYTES);
    }
}

/* One allocation for `count` samples: images, then labels. */
static kiln_status cifar_set_alloc(int64_t count, int num_classes, kiln_image_set *out) {
    size_t n = (size_t)count, bytes;
    if (!kiln_checked_mul_size(n, (size_t)KILN_CIFAR_IMAGE_BYTES + 1, &bytes))
        return KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "CIFAR: %lld records do not fit in memory",
                          (long long)count);
    uint8_t *buffer = KILN_MALLOC(bytes);
    if (!buffer) return KILN_ERR_OUT_OF_MEMORY;
    out->buffer = buffer;
    out->images = buffer;
    out->labels = buffer + n * KILN_CIFAR_IMAGE_BYTES;
    out->count = count;
    out->channels = 3;
    out->height = 32;
    out->width = 32;
    out->num_classes = num_classes;
    return KILN_OK;
}

kiln_status kiln_cifar_parse_memory(const char *name, const uint8_t *bytes, size_t size, int num_classes,
                                    kiln_image_set *out) {
    memset(out, 0, sizeof *out);
    int64_t count;
    KILN_TRY(kiln_cifar_check_memory(name, bytes, size, num_classes, &count));
    KILN_TRY(cifar_set_alloc(count, num_classes, out));
    cifar_copy(bytes, count, num_classes, out->buffer, out->buffer + (size_t)count * KILN_CIFAR_IMAGE_BYTES);
    return KILN_OK;
}

/* One batch file read and checked, raw or gzip. */
typedef struct cifar_file {
    uint8_t *bytes;
    size_t size;
    int64_t count;
} cifar_file;

/* With no header to announce a size, a batch file is bounded by the
 * largest real one: CIFAR-100's training file holds 50000 records. Above
 * KILN_CIFAR_MAX_RECORDS a raw file is refused before it is read, and a
 * gzip one stops inflating there (a small bomb cannot reach gigabytes). */
#define KILN_CIFAR_MAX_RECORDS 60000

static kiln_status cifar_load(const char *path, int num_classes, cifar_file *f) {
    size_t cap = (size_t)KILN_CIFAR_MAX_RECORDS * kiln_cifar_record_bytes(num_classes);
    /* A gzip file of incompressible records is a little larger than they are. */
    KILN_TRY(kiln_file_read_all(path, cap + cap / 16 + 4096, &f->bytes, &f->size));
    char name[4200];
    snprintf(name, sizeof name, "%s", path);
    if (!kiln_is_gzip(f->bytes, f->size) && f->size > cap) {
        char b[32];
        return KILN_RAISE(KILN_ERR_IO, "split the records over several batch files",
                          "%s: %zu bytes is more than %d CIFAR-%d records (%s): a batch file holds at most "
                          "that",
                          path, f->size, KILN_CIFAR_MAX_RECORDS, num_classes, kiln_format_bytes(cap, b, sizeof b));
    }
    if (kiln_is_gzip(f->bytes, f->size)) {
        uint8_t *plain;
        size_t plain_size;
        kiln_status st = kiln_gunzip_memory(path, f->bytes, f->size, cap, 0, &plain, &plain_size);
        free(f->bytes);
        f->bytes = plain;
        f->size = plain_size;
        KILN_TRY(st);
        snprintf(name, sizeof name, "%s (decompressed)", path);
    }
    return kiln_cifar_check_memory(name, f->bytes, f->size, num_classes, &f->count);
}

static kiln_status cifar_open_files(int n_paths, const char *const *paths, int num_classes, cifar_file *files,
                                    kiln_image_set *set) {
    int64_t total = 0;
    for (int i = 0; i < n_paths; i++) {
        if (!paths[i])
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_dataset_open_cifar: paths[%d] is NULL",
                              i);
        KILN_TRY(cifar_load(paths[i], num_classes, &files[i]));
        total += files[i].count; /* each file is at most 4 GiB: this cannot overflow */
    }
    KILN_TRY(cifar_set_alloc(total, num_classes, set));
    int64_t at = 0;
    uint8_t *labels = set->buffer + (size_t)total * KILN_CIFAR_IMAGE_BYTES;
    for (int i = 0; i < n_paths; i++) {
        cifar_copy(files[i].bytes, files[i].count, num_classes,
                   set->buffer + (size_t)at * KILN_CIFAR_IMAGE_BYTES, labels + at);
        at += files[i].count;
        free(files[i].bytes);
        files[i].bytes = NULL;
    }
    return KILN_OK;
}

kiln_status kiln_dataset_open_cifar(int n_paths, const char *const *paths, int num_classes,
                                    kiln_dataset **out) {
    if (!out) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_dataset_open_cifar: out is NULL");
    *out = NULL;
    if (n_paths < 1 || !paths)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass at least one batch file",
                          "kiln_dataset_open_cifar: %d paths", n_paths);
    KILN_TRY(cifar_check_classes("kiln_dataset_open_cifar", num_classes));
    cifar_file *files = KILN_CALLOC((size_t)n_paths, sizeof *files);
    if (!files) return KILN_ERR_OUT_OF_MEMORY;
    kiln_image_set set;
    memset(&set, 0, sizeof set);
    kiln_status st = cifar_open_files(n_paths, paths, num_classes, files, &set);
    for (int i = 0; i < n_paths; i++) free(files[i].bytes);
    free(files);
    KILN_TRY(st);
    return kiln_dataset_from_image_set(&set, out);
}

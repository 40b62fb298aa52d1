/* The IDX format of MNIST and Fashion-MNIST (http://yann.lecun.com/exdb/mnist/):
 *
 *   offset 0   u8 0, u8 0        magic, first half
 *   offset 2   u8 type           0x08 = unsigned byte (the only type Kiln reads)
 *   offset 3   u8 ndim           3 for images (N, rows, cols), 1 for labels (N)
 *   offset 4   u32 dims[ndim]    big-endian
 *   then       prod(dims) bytes  row-major data
 *
 * so an images file is 16 + N*rows*cols bytes and a labels file 8 + N.
 * Every check below compares the header with the file size before any
 * data is touched, in 64-bit arithmetic that cannot overflow (each dim is
 * below 2^31 and the product is checked step by step). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "data/readers.h"

static const char *idx_kind(int ndim) { return ndim == 3 ? "images" : "labels"; }

static uint32_t read_be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static const char *idx_type_name(uint8_t type) {
    switch (type) {
    case 0x08:
        return "unsigned byte";
    case 0x09:
        return "signed byte";
    case 0x0B:
        return "short";
    case 0x0C:
        return "int";
    case 0x0D:
        return "float";
    case 0x0E:
        return "double";
    default:
        return "not an IDX type";
    }
}

/* "60000 images of 28x28" or "60000 labels". */
static const char *idx_describe(const kiln_idx_array *a, char *buf, size_t size) {
    if (a->ndim == 3)
        snprintf(buf, size, "%lld images of %lldx%lld", (long long)a->dims[0], (long long)a->dims[1],
                 (long long)a->dims[2]);
    else
        snprintf(buf, size, "%lld labels", (long long)a->dims[0]);
    return buf;
}

/* Magic (offsets 0..3). */
static kiln_status idx_check_magic(const char *name, const uint8_t *bytes, size_t size, int ndim) {
    uint32_t want = ndim == 3 ? KILN_IDX_IMAGES_MAGIC : KILN_IDX_LABELS_MAGIC;
    if (size < 4)
        return KILN_RAISE(KILN_ERR_IO, "the file is truncated or empty",
                          "%s: truncated IDX header: the file is %zu bytes, expected at least 4 (the magic "
                          "number 0x%08X at offset 0)",
                          name, size, want);
    if (bytes[0] != 0 || bytes[1] != 0)
        return KILN_RAISE(KILN_ERR_IO, "pass an MNIST-style IDX file (raw or .gz)",
                          "%s: bad magic number at offset 0: expected 0x%08X (IDX %s), found 0x%08X: not an "
                          "IDX file",
                          name, want, idx_kind(ndim), read_be32(bytes));
    if (bytes[2] != 0x08)
        return KILN_RAISE(KILN_ERR_IO, "Kiln reads IDX files of unsigned bytes (MNIST, Fashion-MNIST)",
                          "%s: data type at offset 2: expected 0x08 (unsigned byte), found 0x%02X (%s)", name,
                          bytes[2], idx_type_name(bytes[2]));
    if (bytes[3] != ndim)
        return KILN_RAISE(KILN_ERR_IO,
                          bytes[3] == 1 || bytes[3] == 3 ? "are the images and labels paths swapped?" : NULL,
                          "%s: dimension count at offset 3: expected %d (IDX %s, magic 0x%08X), found %d",
                          name, ndim, idx_kind(ndim), want, bytes[3]);
    return KILN_OK;
}

kiln_status kiln_idx_header_parse(const char *name, const uint8_t *bytes, size_t size, int ndim,
                                  kiln_idx_array *out, size_t *total_size) {
    memset(out, 0, sizeof *out);
    *total_size = 0;
    if (ndim != 1 && ndim != 3)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "%s: IDX arrays of %d dimensions are not read",
                          name, ndim);
    KILN_TRY(idx_check_magic(name, bytes, size, ndim));
    size_t header = 4 + 4 * (size_t)ndim;
    if (size < header)
        return KILN_RAISE(
            KILN_ERR_IO, "the file is truncated",
            "%s: truncated IDX header: expected %zu header bytes (magic and %d dimension sizes), "
            "the file has %zu",
            name, header, ndim, size);
    static const char *const dim_names[2][3] = {{"label count", "", ""}, {"image count", "rows", "columns"}};
    uint64_t product = 1;
    char limit[32];
    for (int i = 0; i < ndim; i++) {
        size_t at = 4 + 4 * (size_t)i;
        uint32_t d = read_be32(bytes + at);
        const char *what = dim_names[ndim == 3][i];
        if (d == 0)
            return KILN_RAISE(KILN_ERR_IO, NULL, "%s: %s at offset %zu is 0: expected at least 1", name, what,
                              at);
        if (d > INT32_MAX)
            return KILN_RAISE(KILN_ERR_IO, "the header is corrupt",
                              "%s: %s at offset %zu is %u: expected at most %d", name, what, at, d,
                              INT32_MAX);
        /* product is at most 4 GiB here and d below 2^31: no 64-bit overflow. */
        product *= d;
        if (product > KILN_DATA_MAX_FILE_BYTES)
            return KILN_RAISE(KILN_ERR_IO, "the header is corrupt",
                              "%s: the dimension sizes at offsets 4..%zu declare more than %s of data: "
                              "expected at most that",
                              name, at + 3, kiln_format_bytes(KILN_DATA_MAX_FILE_BYTES, limit, sizeof limit));
        out->dims[i] = d;
    }
    out->ndim = ndim;
    out->header_bytes = header;
    out->data_bytes = (size_t)product;
    out->data = bytes + header;
    *total_size = header + (size_t)product;
    return KILN_OK;
}

kiln_status kiln_idx_parse_memory(const char *name, const uint8_t *bytes, size_t size, int ndim,
                                  kiln_idx_array *out) {
    size_t total;
    KILN_TRY(kiln_idx_header_parse(name, bytes, size, ndim, out, &total));
    char what[96];
    if (size < total)
        return KILN_RAISE(
            KILN_ERR_IO, "the file is truncated: download or copy it again",
            "%s: truncated: the header declares %s, %zu bytes of data from offset %zu, so the file "
            "should be %zu bytes; the data ends at offset %zu",
            name, idx_describe(out, what, sizeof what), out->data_bytes, out->header_bytes, total, size);
    if (size > total)
        return KILN_RAISE(
            KILN_ERR_IO, "the file is corrupt, or the header belongs to another file",
            "%s: %zu unexpected bytes from offset %zu: the header declares %s, so the file should "
            "end at offset %zu",
            name, size - total, total, idx_describe(out, what, sizeof what), total);
    return KILN_OK;
}

/* Every label below num_classes (or, with 0, the count of classes seen). */
static kiln_status idx_check_labels(const char *name, const kiln_idx_array *labels, int *num_classes) {
    if (*num_classes < 0 || *num_classes > 256)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                          "IDX labels are bytes: use 1..256 classes, or 0 to infer",
                          "%s: num_classes %d is out of range", name, *num_classes);
    const uint8_t *l = labels->data;
    size_t n = (size_t)labels->dims[0];
    if (*num_classes == 0) {
        int top = 0;
        for (size_t i = 0; i < n; i++)
            if (l[i] > top) top = l[i];
        *num_classes = top + 1;
        return KILN_OK;
    }
    for (size_t i = 0; i < n; i++)
        if (l[i] >= *num_classes)
            return KILN_RAISE(KILN_ERR_IO, "the file is corrupt, or holds another dataset's labels",
                              "%s: label %u at offset %zu (sample %zu): expected 0..%d", name, l[i],
                              labels->header_bytes + i, i, *num_classes - 1);
    return KILN_OK;
}

kiln_status kiln_idx_build_memory(const char *images_name, const uint8_t *images, size_t images_size,
                                  const char *labels_name, const uint8_t *labels, size_t labels_size,
                                  int num_classes, kiln_image_set *out) {
    memset(out, 0, sizeof *out);
    kiln_idx_array im, lb;
    KILN_TRY(kiln_idx_parse_memory(images_name, images, images_size, 3, &im));
    KILN_TRY(kiln_idx_parse_memory(labels_name, labels, labels_size, 1, &lb));
    if (im.dims[0] != lb.dims[0])
        return KILN_RAISE(KILN_ERR_IO, "pass the labels file that belongs to these images",
                          "image and label counts disagree: %s declares %lld images at offset 4, %s declares "
                          "%lld labels at offset 4",
                          images_name, (long long)im.dims[0], labels_name, (long long)lb.dims[0]);
    KILN_TRY(idx_check_labels(labels_name, &lb, &num_classes));
    size_t count = (size_t)im.dims[0];
    /* Images then labels, one allocation: the set's whole footprint. */
    uint8_t *buffer = KILN_MALLOC(im.data_bytes + count);
    if (!buffer) return KILN_ERR_OUT_OF_MEMORY;
    memcpy(buffer, im.data, im.data_bytes);
    memcpy(buffer + im.data_bytes, lb.data, count);
    out->buffer = buffer;
    out->images = buffer;
    out->labels = buffer + im.data_bytes;
    out->count = (int64_t)count;
    out->channels = 1;
    out->height = (int)im.dims[1];
    out->width = (int)im.dims[2];
    out->num_classes = num_classes;
    return KILN_OK;
}

kiln_status kiln_idx_decode(const char *path, uint8_t *raw, size_t raw_size, int ndim, uint8_t **out,
                            size_t *out_size, char *shown, size_t shown_size) {
    *out = NULL;
    *out_size = 0;
    snprintf(shown, shown_size, "%s", path);
    if (!kiln_is_gzip(raw, raw_size)) {
        *out = raw;
        *out_size = raw_size;
        return KILN_OK;
    }
    snprintf(shown, shown_size, "%s (decompressed)", path);
    /* Decode the header alone first: the size it declares bounds the
     * decompression of the whole, so a gzip bomb stops at that size. */
    uint8_t *head;
    size_t head_size, total;
    kiln_idx_array probe;
    kiln_status st = kiln_gunzip_memory(path, raw, raw_size, 4 + 4 * (size_t)ndim, 1, &head, &head_size);
    if (st == KILN_OK) {
        st = kiln_idx_header_parse(shown, head, head_size, ndim, &probe, &total);
        free(head);
    }
    if (st == KILN_OK) st = kiln_gunzip_memory(path, raw, raw_size, total, 0, out, out_size);
    free(raw);
    return st;
}

kiln_status kiln_idx_load_file(const char *path, int ndim, uint8_t **out, size_t *out_size, char *shown,
                               size_t shown_size) {
    *out = NULL;
    *out_size = 0;
    uint8_t *raw;
    size_t raw_size;
    KILN_TRY(kiln_file_read_all(path, KILN_DATA_MAX_FILE_BYTES, &raw, &raw_size));
    return kiln_idx_decode(path, raw, raw_size, ndim, out, out_size, shown, shown_size);
}

/* Deflate expands at most 1032-fold (RFC 1951: a 258-byte match in about
 * two bits at best), so a gzip file of n bytes decodes to at most this. */
static uint64_t gzip_max_decoded(size_t compressed) { return (uint64_t)compressed * 1032 + 1024; }

/* The header of one IDX file as read from disk (raw or gzip), decoded
 * alone: never the data. A gzip header that declares more than the
 * compressed bytes can hold is refused here, before anything inflates. */
static kiln_status idx_probe(const char *path, const uint8_t *raw, size_t raw_size, int ndim,
                             int64_t *count) {
    kiln_idx_array a;
    size_t total;
    if (!kiln_is_gzip(raw, raw_size)) {
        KILN_TRY(kiln_idx_header_parse(path, raw, raw_size, ndim, &a, &total));
        *count = a.dims[0];
        return KILN_OK;
    }
    char shown[4200];
    snprintf(shown, sizeof shown, "%s (decompressed)", path);
    uint8_t *head;
    size_t head_size;
    KILN_TRY(kiln_gunzip_memory(path, raw, raw_size, 4 + 4 * (size_t)ndim, 1, &head, &head_size));
    kiln_status st = kiln_idx_header_parse(shown, head, head_size, ndim, &a, &total);
    free(head);
    KILN_TRY(st);
    if ((uint64_t)total > gzip_max_decoded(raw_size)) {
        char what[96], declared[32];
        return KILN_RAISE(KILN_ERR_IO, "the file is truncated or its header is corrupt: download or copy it again",
                          "%s: the header declares %s (%s), more than a gzip file of %zu bytes can hold "
                          "(deflate expands at most 1032-fold)",
                          shown, idx_describe(&a, what, sizeof what),
                          kiln_format_bytes(total, declared, sizeof declared), raw_size);
    }
    *count = a.dims[0];
    return KILN_OK;
}

/* Both files read (compressed), both headers checked against each other,
 * and only then the data decoded: a mismatched pair or a gzip bomb costs
 * the compressed bytes, not gigabytes of inflated data. */
kiln_status kiln_idx_open(const char *images_path, const char *labels_path, int num_classes,
                          kiln_dataset **out) {
    *out = NULL;
    if (!images_path || !labels_path)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_dataset_open_idx: a path is NULL");
    char images_name[4200], labels_name[4200];
    uint8_t *images_raw, *labels_raw, *images = NULL, *labels = NULL;
    size_t images_raw_size, labels_raw_size, images_size = 0, labels_size = 0;
    KILN_TRY(kiln_file_read_all(images_path, KILN_DATA_MAX_FILE_BYTES, &images_raw, &images_raw_size));
    kiln_status st = kiln_file_read_all(labels_path, KILN_DATA_MAX_FILE_BYTES, &labels_raw, &labels_raw_size);
    if (st != KILN_OK) {
        free(images_raw);
        return st;
    }
    int64_t n_images = 0, n_labels = 0;
    st = idx_probe(images_path, images_raw, images_raw_size, 3, &n_images);
    if (st == KILN_OK) st = idx_probe(labels_path, labels_raw, labels_raw_size, 1, &n_labels);
    if (st == KILN_OK && n_images != n_labels)
        st = KILN_RAISE(KILN_ERR_IO, "pass the labels file that belongs to these images",
                        "image and label counts disagree: %s declares %lld images at offset 4, %s declares "
                        "%lld labels at offset 4",
                        images_path, (long long)n_images, labels_path, (long long)n_labels);
    if (st != KILN_OK) {
        free(images_raw);
        free(labels_raw);
        return st;
    }
    /* kiln_idx_decode takes over the raw buffers, on error too. */
    st = kiln_idx_decode(images_path, images_raw, images_raw_size, 3, &images, &images_size, images_name,
                         sizeof images_name);
    if (st == KILN_OK)
        st = kiln_idx_decode(labels_path, labels_raw, labels_raw_size, 1, &labels, &labels_size, labels_name,
                             sizeof labels_name);
    else
        free(labels_raw);
    kiln_image_set set;
    if (st == KILN_OK)
        st = kiln_idx_build_memory(images_name, images, images_size, labels_name, labels, labels_size,
                                   num_classes, &set);
    free(images);
    free(labels);
    KILN_TRY(st);
    return kiln_dataset_from_image_set(&set, out);
}

kiln_status kiln_dataset_open_idx(const char *images_path, const char *labels_path, kiln_dataset **out) {
    if (!out) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_dataset_open_idx: out is NULL");
    return kiln_idx_open(images_path, labels_path, 0, out);
}

/* Dataset files for the data tests, generated in a temporary directory:
 * IDX images and labels (raw and gzip, written with zlib's own gzwrite so
 * the reader is checked against an independent writer) and CIFAR batches.
 * Included by the data tests (one executable per test file). Sample i of
 * a generated set has pixel p = (i * 7 + p) mod 251, so any misplaced byte
 * shows. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "kiln/data.h"

#define DF_MAX_FILES 128

static char df_dir[64];
static char df_files[DF_MAX_FILES][256];
static int df_count;

static uint8_t df_pixel(int64_t sample, int64_t p) { return (uint8_t)((sample * 7 + p) % 251); }

/* A fresh temporary directory for this run's files; false on failure. */
static bool df_init(void) {
    snprintf(df_dir, sizeof df_dir, "/tmp/kiln_data_test_XXXXXX");
    return mkdtemp(df_dir) != NULL;
}

static void df_cleanup(void) {
    for (int i = 0; i < df_count; i++) unlink(df_files[i]);
    rmdir(df_dir);
}

/* dir/name; the returned path is owned by the helper and lives until cleanup. */
static const char *df_path(const char *name) {
    if (df_count == DF_MAX_FILES) {
        fprintf(stderr, "dataset_files: more than %d files\n", DF_MAX_FILES);
        abort();
    }
    snprintf(df_files[df_count], sizeof df_files[0], "%s/%s", df_dir, name);
    return df_files[df_count++];
}

static const char *df_write(const char *name, const uint8_t *bytes, size_t size) {
    const char *path = df_path(name);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(bytes, 1, size, f) != size) || fclose(f) != 0) {
        fprintf(stderr, "dataset_files: cannot write %s\n", path);
        abort();
    }
    return path;
}

static const char *df_write_gz(const char *name, const uint8_t *bytes, size_t size) {
    const char *path = df_path(name);
    gzFile gz = gzopen(path, "wb");
    if (!gz || (size && gzwrite(gz, bytes, (unsigned)size) != (int)size) || gzclose(gz) != Z_OK) {
        fprintf(stderr, "dataset_files: cannot write %s\n", path);
        abort();
    }
    return path;
}

/* The bytes of a file the helper wrote (malloc'd); *size set. */
static uint8_t *df_read(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) abort();
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n + 1);
    if (!b || fread(b, 1, (size_t)n, f) != (size_t)n) abort();
    fclose(f);
    *size = (size_t)n;
    return b;
}

static void df_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* An IDX images file: 16-byte header, then (count, rows, cols) u8. */
static uint8_t *df_idx_images(uint32_t count, uint32_t rows, uint32_t cols, size_t *size) {
    *size = 16 + (size_t)count * rows * cols;
    uint8_t *b = malloc(*size);
    df_be32(b, 0x00000803);
    df_be32(b + 4, count);
    df_be32(b + 8, rows);
    df_be32(b + 12, cols);
    for (uint32_t i = 0; i < count; i++)
        for (uint32_t p = 0; p < rows * cols; p++) b[16 + (size_t)i * rows * cols + p] = df_pixel(i, p);
    return b;
}

/* An IDX labels file: 8-byte header, then label i = i mod classes. */
static uint8_t *df_idx_labels(uint32_t count, int classes, size_t *size) {
    *size = 8 + (size_t)count;
    uint8_t *b = malloc(*size);
    df_be32(b, 0x00000801);
    df_be32(b + 4, count);
    for (uint32_t i = 0; i < count; i++) b[8 + i] = (uint8_t)(i % (uint32_t)classes);
    return b;
}

/* A CIFAR batch of `count` records starting at sample `first`; label
 * (fine label for CIFAR-100) = sample mod classes, coarse = fine / 5. */
static uint8_t *df_cifar(int64_t first, int64_t count, int classes, size_t *size) {
    size_t label_bytes = classes == 10 ? 1 : 2, record = label_bytes + 3072;
    *size = (size_t)count * record;
    uint8_t *b = malloc(*size);
    for (int64_t i = 0; i < count; i++) {
        uint8_t *r = b + (size_t)i * record;
        int64_t s = first + i;
        if (classes == 10) {
            r[0] = (uint8_t)(s % 10);
        } else {
            r[0] = (uint8_t)(s % 100 / 5);
            r[1] = (uint8_t)(s % 100);
        }
        for (int p = 0; p < 3072; p++) r[label_bytes + (size_t)p] = df_pixel(s, p);
    }
    return b;
}

/* True when sample `index` of ds is the generated sample `expect`, with
 * label `label`. */
static bool df_sample_is(const kiln_dataset *ds, int64_t index, int64_t expect, int64_t label) {
    size_t bytes = kiln_sample_bytes(kiln_dataset_info(ds));
    uint8_t *buf = malloc(bytes);
    int64_t got = -1;
    bool ok = kiln_dataset_get(ds, index, buf, &got) == KILN_OK && got == label;
    for (size_t p = 0; ok && p < bytes; p++) ok = buf[p] == df_pixel(expect, (int64_t)p);
    free(buf);
    return ok;
}

/* Every validation error of the dataset readers on crafted bad files: each
 * must fail with KILN_ERR_IO and a message naming the file, the byte offset
 * and what was expected (checked by the phrases below). Under ASan this is
 * also the proof that no bad file makes a reader touch memory it should
 * not. */
#include <sys/stat.h>
#include <unistd.h>

#include "data/readers.h"
#include "test_util.h"

#include "data/dataset_files.c"

/* A failing open: KILN_ERR_IO, the path in the message, and each phrase. */
static void check_bad(kiln_status st, kiln_dataset *ds, const char *path, int line,
                      const char *const *needles) {
    const char *msg = kiln_error_message();
    CHECK_MSG(st == KILN_ERR_IO, "line %d: %s (wanted KILN_ERR_IO): %s", line, kiln_status_name(st), msg);
    CHECK_MSG(ds == NULL, "line %d: a dataset came back with an error", line);
    CHECK_MSG(strstr(msg, path) != NULL, "line %d: '%s' does not name %s", line, msg, path);
    for (int i = 0; needles[i]; i++)
        CHECK_MSG(strstr(msg, needles[i]) != NULL, "line %d: '%s' does not mention '%s'", line, msg,
                  needles[i]);
}

#define EXPECT_BAD(expr, path, ...)                                                                          \
    do {                                                                                                     \
        kiln_dataset *bad_ds_ = NULL;                                                                        \
        kiln_error_clear();                                                                                  \
        kiln_status bad_st_ = (expr);                                                                        \
        check_bad(bad_st_, bad_ds_, (path), __LINE__, (const char *const[]){__VA_ARGS__, NULL});             \
        kiln_dataset_free(bad_ds_);                                                                          \
    } while (0)

static const char *good_images, *good_labels;

/* The images file (4 images of 3x2, 40 bytes) with byte `at` set to `v`. */
static const char *images_with(const char *name, size_t at, uint8_t v) {
    size_t sz;
    uint8_t *b = df_idx_images(4, 3, 2, &sz);
    b[at] = v;
    const char *p = df_write(name, b, sz);
    free(b);
    return p;
}

static void test_idx_headers(void) {
    size_t isz, lsz;
    uint8_t *im = df_idx_images(4, 3, 2, &isz), *lb = df_idx_labels(4, 3, &lsz);
    good_images = df_write("good-images", im, isz);
    good_labels = df_write("good-labels", lb, lsz);
    kiln_dataset *ds = NULL;
    CHECK_OK(kiln_dataset_open_idx(good_images, good_labels, &ds));
    CHECK(ds && df_sample_is(ds, 3, 3, 0));
    kiln_dataset_free(ds);

    const char *p = images_with("bad-magic", 0, 0x12);
    EXPECT_BAD(kiln_dataset_open_idx(p, good_labels, &bad_ds_), p, "offset 0", "expected 0x00000803");
    p = images_with("bad-type", 2, 0x0D);
    EXPECT_BAD(kiln_dataset_open_idx(p, good_labels, &bad_ds_), p, "offset 2", "0x08 (unsigned byte)",
               "float");
    EXPECT_BAD(kiln_dataset_open_idx(good_labels, good_images, &bad_ds_), good_labels, "offset 3",
               "expected 3");
    CHECK(strstr(kiln_error_last()->hint, "swapped") != NULL);
    p = df_write("empty", im, 0);
    EXPECT_BAD(kiln_dataset_open_idx(p, good_labels, &bad_ds_), p, "0 bytes", "at least 4", "offset 0");
    p = df_write("short-header", im, 10);
    EXPECT_BAD(kiln_dataset_open_idx(p, good_labels, &bad_ds_), p, "truncated IDX header", "16 header bytes");
    p = images_with("zero-rows", 11, 0);
    EXPECT_BAD(kiln_dataset_open_idx(p, good_labels, &bad_ds_), p, "rows at offset 8 is 0", "at least 1");
    p = images_with("huge-cols", 12, 0x80);
    EXPECT_BAD(kiln_dataset_open_idx(p, good_labels, &bad_ds_), p, "columns at offset 12",
               "at most 2147483647");
    /* 2^31-1 cubed overflows 64 bits: the check must stop before that. */
    uint8_t absurd[16] = {0, 0, 8, 3, 0x7f, 0xff, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff};
    p = df_write("absurd", absurd, sizeof absurd);
    EXPECT_BAD(kiln_dataset_open_idx(p, good_labels, &bad_ds_), p, "offsets 4..", "more than 4.00 GiB");
    free(im);
    free(lb);
}

static void test_idx_sizes(void) {
    size_t isz, lsz;
    uint8_t *im = df_idx_images(4, 3, 2, &isz), *lb = df_idx_labels(5, 3, &lsz);
    const char *p = df_write("truncated", im, isz - 1);
    EXPECT_BAD(kiln_dataset_open_idx(p, good_labels, &bad_ds_), p, "truncated", "4 images of 3x2",
               "from offset 16", "should be 40 bytes", "ends at offset 39");
    uint8_t *longer = calloc(isz + 3, 1);
    memcpy(longer, im, isz);
    p = df_write("trailing", longer, isz + 3);
    EXPECT_BAD(kiln_dataset_open_idx(p, good_labels, &bad_ds_), p, "3 unexpected bytes from offset 40");
    const char *l5 = df_write("labels-5", lb, lsz);
    EXPECT_BAD(kiln_dataset_open_idx(good_images, l5, &bad_ds_), l5, "counts disagree",
               "4 images at offset 4", "5 labels at offset 4");
    CHECK(strstr(kiln_error_message(), good_images) != NULL);
    /* Labels against a known class count: Fashion-MNIST's 10. */
    uint8_t *im28 = df_idx_images(6, 28, 28, &isz), *lb6 = df_idx_labels(6, 10, &lsz);
    lb6[8 + 4] = 10;
    df_write("train-images-idx3-ubyte", im28, isz);
    p = df_write("train-labels-idx1-ubyte", lb6, lsz);
    EXPECT_BAD(kiln_dataset_open_fashion_mnist(df_dir, "train", &bad_ds_), p,
               "label 10 at offset 12 (sample 4)", "expected 0..9");
    EXPECT_BAD(kiln_idx_open(good_images, good_labels, 2, &bad_ds_), good_labels, "label 2 at offset 10",
               "expected 0..1");
    free(longer);
    free(im);
    free(lb);
    free(im28);
    free(lb6);
}

static void test_idx_gzip(void) {
    size_t isz, gsz;
    uint8_t *im = df_idx_images(4, 3, 2, &isz);
    const char *gz = df_write_gz("images.gz", im, isz);
    uint8_t *g = df_read(gz, &gsz);
    /* The CRC-32 in the trailer no longer matches the data. */
    g[gsz - 8] ^= 0xff;
    const char *p = df_write("bad-crc.gz", g, gsz);
    EXPECT_BAD(kiln_dataset_open_idx(p, good_labels, &bad_ds_), p, "corrupt gzip data", "compressed byte",
               "incorrect data check");
    g[gsz - 8] ^= 0xff;
    g[2] = 7; /* compression method: only 8 (deflate) exists */
    p = df_write("bad-method.gz", g, gsz);
    EXPECT_BAD(kiln_dataset_open_idx(p, good_labels, &bad_ds_), p, "corrupt gzip data", "compressed byte");
    g[2] = 8;
    p = df_write("cut.gz", g, gsz / 2 + 6);
    EXPECT_BAD(kiln_dataset_open_idx(p, good_labels, &bad_ds_), p, "ends early at compressed byte");
    uint8_t *junk = malloc(gsz + 4);
    memcpy(junk, g, gsz);
    memcpy(junk + gsz, "junk", 4);
    p = df_write("junk.gz", junk, gsz + 4);
    EXPECT_BAD(kiln_dataset_open_idx(p, good_labels, &bad_ds_), p, "4 bytes after the end of the gzip stream",
               "compressed byte");
    /* A gzip bomb: the header declares 4 images of 3x2 (40 bytes), the
     * stream holds 8 MiB; decoding must stop at the 40 the header allows. */
    size_t bomb_size = (size_t)8 << 20;
    uint8_t *bomb = calloc(bomb_size, 1);
    memcpy(bomb, im, isz);
    p = df_write_gz("bomb.gz", bomb, bomb_size);
    EXPECT_BAD(kiln_dataset_open_idx(p, good_labels, &bad_ds_), p, "decompresses to more than", "40 bytes");
    im[0] = 0x42;
    p = df_write_gz("inner-magic.gz", im, isz);
    EXPECT_BAD(kiln_dataset_open_idx(p, good_labels, &bad_ds_), p, "(decompressed)", "offset 0");
    im[0] = 0;
    p = df_write_gz("inner-short.gz", im, 6);
    EXPECT_BAD(kiln_dataset_open_idx(p, good_labels, &bad_ds_), p, "(decompressed)", "truncated IDX header");
    /* The headers are compared before any data inflates: a stream that
     * holds 2000 images of 28x28 cut after 4 KiB fails on the counts (the
     * labels file has 4), not on the cut, which inflating would reach first. */
    size_t big_size;
    uint8_t *big = df_idx_images(2000, 28, 28, &big_size);
    p = df_write_gz("big.gz", big, big_size);
    size_t big_gz_size;
    uint8_t *big_gz = df_read(p, &big_gz_size);
    CHECK(big_gz_size > 4096);
    p = df_write("big-cut.gz", big_gz, 4096);
    EXPECT_BAD(kiln_dataset_open_idx(p, good_labels, &bad_ds_), p, "counts disagree", "2000 images",
               "4 labels");
    /* A header that declares more than deflate can hold in the file's
     * size is refused before inflating (a 20-byte stream, 1.5 MB declared). */
    p = df_write_gz("big-head.gz", big, 16);
    EXPECT_BAD(kiln_dataset_open_idx(p, good_labels, &bad_ds_), p, "(decompressed)", "2000 images of 28x28",
               "more than a gzip file of", "1032-fold");
    free(big_gz);
    free(big);
    free(bomb);
    free(junk);
    free(g);
    free(im);
}

static void test_files(void) {
    char missing[128];
    snprintf(missing, sizeof missing, "%s/no-such-file", df_dir);
    EXPECT_BAD(kiln_dataset_open_idx(missing, good_labels, &bad_ds_), missing, "cannot open");
    EXPECT_BAD(kiln_dataset_open_idx(df_dir, good_labels, &bad_ds_), df_dir, "not a regular file");
    kiln_dataset *ds = NULL;
    CHECK_FAILS(kiln_dataset_open_idx(NULL, good_labels, &ds), KILN_ERR_INVALID_ARGUMENT, "NULL");
    /* The memory entry points take empty input without reading it. */
    kiln_image_set set;
    CHECK_FAILS(kiln_idx_build_memory("a", NULL, 0, "b", NULL, 0, 0, &set), KILN_ERR_IO, "0 bytes");
    CHECK_FAILS(kiln_cifar_parse_memory("c", NULL, 0, 10, &set), KILN_ERR_IO, "empty");
}

/* Paths that exist but cannot be read as dataset files are named as what
 * they are, with the errno, never "not found"; a FIFO never blocks. */
static void test_file_types(void) {
    char dir[128], path[320], sub[192], loop[192];
    snprintf(dir, sizeof dir, "%s/types", df_dir);
    CHECK(mkdir(dir, 0755) == 0);
    /* A FIFO as the images file, given directly and found in --data. */
    snprintf(path, sizeof path, "%s/train-images-idx3-ubyte.gz", dir);
    CHECK(mkfifo(path, 0644) == 0);
    EXPECT_BAD(kiln_dataset_open_idx(path, good_labels, &bad_ds_), path,
               "is a FIFO (named pipe), not a regular file");
    EXPECT_BAD(kiln_dataset_open_fashion_mnist(dir, "train", &bad_ds_), path, "is a FIFO (named pipe)");
    unlink(path);
    /* A directory in its place. */
    CHECK(mkdir(path, 0755) == 0);
    EXPECT_BAD(kiln_dataset_open_fashion_mnist(dir, "train", &bad_ds_), path,
               "is a directory, not a regular file");
    rmdir(path);
    /* A symbolic link loop in its place. */
    snprintf(loop, sizeof loop, "%s/loop", dir);
    CHECK(symlink("loop", loop) == 0 && symlink("loop", path) == 0);
    EXPECT_BAD(kiln_dataset_open_fashion_mnist(dir, "train", &bad_ds_), path, "symbolic links");
    EXPECT_BAD(kiln_dataset_open_idx(path, good_labels, &bad_ds_), path, "cannot open", "symbolic links");
    unlink(path);
    unlink(loop);
    /* A regular file as the directory. */
    EXPECT_BAD(kiln_dataset_open_fashion_mnist(good_labels, "test", &bad_ds_), good_labels,
               "is a regular file, not a directory");
    /* A directory that does not exist is still "not found". */
    snprintf(sub, sizeof sub, "%s/absent", dir);
    EXPECT_BAD(kiln_dataset_open_fashion_mnist(sub, "test", &bad_ds_), sub, "split not found");
    /* No permission: root reads anyway, so only other users can check it. */
    snprintf(sub, sizeof sub, "%s/locked", dir);
    CHECK(mkdir(sub, 0755) == 0);
    snprintf(path, sizeof path, "%s/t10k-images-idx3-ubyte", sub);
    FILE *f = fopen(path, "wb");
    CHECK(f && fclose(f) == 0);
    CHECK(chmod(sub, 0) == 0);
    if (geteuid() == 0)
        printf("skipped: the permission-denied case (running as root, which permission bits do not stop)\n");
    else
        EXPECT_BAD(kiln_dataset_open_fashion_mnist(sub, "test", &bad_ds_), path, "Permission denied");
    CHECK(chmod(sub, 0755) == 0);
    unlink(path);
    rmdir(sub);
    rmdir(dir);
}

static void test_cifar_errors(void) {
    size_t sz;
    uint8_t *b = df_cifar(0, 3, 10, &sz);
    const char *good = df_write("good.bin", b, sz);
    const char *p = df_write("short.bin", b, 2 * 3073 + 100);
    EXPECT_BAD(kiln_dataset_open_cifar(1, &p, 10, &bad_ds_), p,
               "not a whole number of 3073-byte CIFAR-10 records", "offset 6146", "100 of its 3073 bytes");
    b[3073] = 10;
    p = df_write("label.bin", b, sz);
    const char *two[2] = {good, p};
    EXPECT_BAD(kiln_dataset_open_cifar(2, two, 10, &bad_ds_), p, "label 10 at offset 3073 (record 1)",
               "expected 0..9");
    p = df_write("empty.bin", b, 0);
    EXPECT_BAD(kiln_dataset_open_cifar(1, &p, 10, &bad_ds_), p, "empty file", "3073-byte");
    free(b);

    uint8_t *c = df_cifar(0, 2, 100, &sz);
    p = df_write("c100.bin", c, sz);
    EXPECT_BAD(kiln_dataset_open_cifar(1, &p, 10, &bad_ds_), p, "not a whole number", "offset 6146");
    CHECK(strstr(kiln_error_last()->hint, "num_classes 100") != NULL);
    c[3074] = 20;
    p = df_write("coarse.bin", c, sz);
    EXPECT_BAD(kiln_dataset_open_cifar(1, &p, 100, &bad_ds_), p, "coarse label 20 at offset 3074 (record 1)",
               "expected 0..19");
    c[3074] = 0;
    c[3075] = 100;
    p = df_write("fine.bin", c, sz);
    EXPECT_BAD(kiln_dataset_open_cifar(1, &p, 100, &bad_ds_), p, "fine label 100 at offset 3075 (record 1)",
               "expected 0..99");
    p = df_write_gz("fine.bin.gz", c, sz);
    EXPECT_BAD(kiln_dataset_open_cifar(1, &p, 100, &bad_ds_), p, "(decompressed)", "fine label 100");
    kiln_dataset *ds = NULL;
    CHECK_FAILS(kiln_dataset_open_cifar(1, &good, 7, &ds), KILN_ERR_INVALID_ARGUMENT, "num_classes 7");
    CHECK_FAILS(kiln_dataset_open_cifar(0, &good, 10, &ds), KILN_ERR_INVALID_ARGUMENT, "0 paths");
    free(c);
    /* A gzip bomb of 60001 zero records (184 MB in 180 KB): inflating stops
     * at 60000 records, the most a batch file may hold. */
    size_t bomb_size = (size_t)60001 * 3073;
    uint8_t *bomb = calloc(bomb_size, 1);
    p = df_write_gz("bomb.bin.gz", bomb, bomb_size);
    free(bomb);
    EXPECT_BAD(kiln_dataset_open_cifar(1, &p, 10, &bad_ds_), p, "decompresses to more than",
               "184380000 bytes");
}

int main(void) {
    CHECK_OK(kiln_init());
    if (!df_init()) {
        fprintf(stderr, "cannot create a temporary directory\n");
        return 1;
    }
    test_idx_headers();
    test_idx_sizes();
    test_idx_gzip();
    test_files();
    test_file_types();
    test_cifar_errors();
    df_cleanup();
    return kt_finish();
}

/* Datasets that open: IDX (raw, gzip, multi-member gzip) and CIFAR-10/100
 * on generated files, the real Fashion-MNIST files when Debian's package is
 * installed, the tensor dataset and a user dataset over callbacks, and
 * `get` from several threads at once. The bad-file errors are in
 * test_dataset_errors.c. */
#include <pthread.h>

#include "kiln/data.h"
#include "test_util.h"

#include "data/dataset_files.c"

static void test_idx_raw_and_gzip(void) {
    size_t isz, lsz;
    uint8_t *im = df_idx_images(7, 5, 3, &isz);
    uint8_t *lb = df_idx_labels(7, 4, &lsz);
    const char *raw_i = df_write("im-idx3-ubyte", im, isz), *raw_l = df_write("lb-idx1-ubyte", lb, lsz);
    const char *gz_i = df_write_gz("im-idx3-ubyte.gz", im, isz),
               *gz_l = df_write_gz("lb-idx1-ubyte.gz", lb, lsz);
    const char *pairs[4][2] = {{raw_i, raw_l}, {gz_i, gz_l}, {gz_i, raw_l}, {raw_i, gz_l}};
    for (int k = 0; k < 4; k++) {
        kiln_dataset *ds = NULL;
        CHECK_OK(kiln_dataset_open_idx(pairs[k][0], pairs[k][1], &ds));
        if (!ds) continue;
        kiln_sample_info info = kiln_dataset_info(ds);
        CHECK_EQ_I(kiln_dataset_length(ds), 7);
        CHECK(info.dtype == KILN_U8 && info.channels == 1 && info.height == 5 && info.width == 3);
        CHECK_EQ_I(info.num_classes, 4); /* inferred: largest label 3, plus one */
        CHECK_EQ_I(kiln_sample_bytes(info), 15);
        for (int64_t i = 0; i < 7; i++)
            CHECK_MSG(df_sample_is(ds, i, i, i % 4), "pair %d sample %lld", k, (long long)i);
        kiln_dataset_free(ds);
    }
    /* `cat a.gz b.gz` is one valid gzip file: split the images in two members. */
    uint8_t *two = NULL;
    size_t a_size, b_size;
    const char *a = df_write_gz("part-a.gz", im, 40), *b = df_write_gz("part-b.gz", im + 40, isz - 40);
    uint8_t *a_bytes = df_read(a, &a_size), *b_bytes = df_read(b, &b_size);
    two = malloc(a_size + b_size);
    memcpy(two, a_bytes, a_size);
    memcpy(two + a_size, b_bytes, b_size);
    const char *multi = df_write("multi-idx3-ubyte.gz", two, a_size + b_size);
    kiln_dataset *ds = NULL;
    CHECK_OK(kiln_dataset_open_idx(multi, raw_l, &ds));
    CHECK(ds && df_sample_is(ds, 6, 6, 2));
    kiln_dataset_free(ds);
    free(two);
    free(a_bytes);
    free(b_bytes);
    free(im);
    free(lb);
}

static void test_cifar(void) {
    size_t s1, s2, s3;
    uint8_t *b1 = df_cifar(0, 3, 10, &s1), *b2 = df_cifar(3, 2, 10, &s2);
    const char *paths[2] = {df_write("data_batch_1.bin", b1, s1), df_write_gz("data_batch_2.bin.gz", b2, s2)};
    kiln_dataset *ds = NULL;
    CHECK_OK(kiln_dataset_open_cifar(2, paths, 10, &ds));
    if (ds) {
        kiln_sample_info info = kiln_dataset_info(ds);
        CHECK_EQ_I(kiln_dataset_length(ds), 5);
        CHECK(info.dtype == KILN_U8 && info.channels == 3 && info.height == 32 && info.width == 32);
        CHECK_EQ_I(info.num_classes, 10);
        for (int64_t i = 0; i < 5; i++)
            CHECK_MSG(df_sample_is(ds, i, i, i % 10), "CIFAR-10 sample %lld", (long long)i);
        kiln_dataset_free(ds);
    }
    uint8_t *b3 = df_cifar(90, 12, 100, &s3); /* fine labels 90..99, then 0, 1 */
    const char *p100 = df_write("train.bin", b3, s3);
    CHECK_OK(kiln_dataset_open_cifar(1, &p100, 100, &ds));
    if (ds) {
        CHECK_EQ_I(kiln_dataset_length(ds), 12);
        CHECK_EQ_I(kiln_dataset_info(ds).num_classes, 100);
        for (int64_t i = 0; i < 12; i++)
            CHECK_MSG(df_sample_is(ds, i, 90 + i, (90 + i) % 100), "CIFAR-100 sample %lld", (long long)i);
        kiln_dataset_free(ds);
    }
    free(b1);
    free(b2);
    free(b3);
}

/* The files of Debian's dataset-fashion-mnist, when installed. */
static void test_fashion_mnist_real(void) {
    if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) != 0) {
        printf("note: Fashion-MNIST not installed (Debian package dataset-fashion-mnist): real-file checks "
               "skipped\n");
        return;
    }
    static const char *const splits[2] = {"train", "test"};
    static const int64_t lengths[2] = {60000, 10000};
    for (int s = 0; s < 2; s++) {
        kiln_dataset *ds = NULL;
        CHECK_OK(kiln_dataset_open_fashion_mnist(NULL, splits[s], &ds));
        if (!ds) continue;
        kiln_sample_info info = kiln_dataset_info(ds);
        CHECK_EQ_I(kiln_dataset_length(ds), lengths[s]);
        CHECK(info.dtype == KILN_U8 && info.channels == 1 && info.height == 28 && info.width == 28);
        CHECK_EQ_I(info.num_classes, 10);
        /* Fashion-MNIST is balanced: a tenth of each split per class. */
        int64_t per_class[10] = {0};
        uint8_t img[784];
        int64_t nonzero = 0;
        for (int64_t i = 0; i < lengths[s]; i++) {
            int64_t label = -1;
            if (kiln_dataset_get(ds, i, img, &label) != KILN_OK || label < 0 || label > 9) {
                CHECK_MSG(0, "%s sample %lld: label %lld", splits[s], (long long)i, (long long)label);
                break;
            }
            per_class[label]++;
            for (int p = 0; p < 784; p++) nonzero += img[p] != 0;
        }
        for (int c = 0; c < 10; c++) CHECK_EQ_I(per_class[c], lengths[s] / 10);
        CHECK(nonzero > lengths[s] * 100); /* real images, not zeros */
        kiln_dataset_free(ds);
    }
}

static void test_fashion_mnist_dir(void) {
    /* Raw (unpacked) names in a directory the user gives. */
    size_t isz, lsz;
    uint8_t *im = df_idx_images(20, 28, 28, &isz), *lb = df_idx_labels(20, 10, &lsz);
    df_write("t10k-images-idx3-ubyte", im, isz);
    df_write_gz("t10k-labels-idx1-ubyte.gz", lb, lsz);
    kiln_dataset *ds = NULL;
    CHECK_OK(kiln_dataset_open_fashion_mnist(df_dir, "test", &ds));
    CHECK(ds && kiln_dataset_length(ds) == 20 && kiln_dataset_info(ds).num_classes == 10);
    CHECK(ds && df_sample_is(ds, 13, 13, 3));
    kiln_dataset_free(ds);
    CHECK_FAILS(kiln_dataset_open_fashion_mnist(df_dir, "train", &ds), KILN_ERR_IO,
                "train-images-idx3-ubyte.gz");
    CHECK(strstr(kiln_error_message(), "not found") && strstr(kiln_error_message(), df_dir));
    CHECK_FAILS(kiln_dataset_open_fashion_mnist(df_dir, "validation", &ds), KILN_ERR_INVALID_ARGUMENT,
                "validation");
    free(im);
    free(lb);
}

static void test_tensor_dataset(void) {
    kiln_tensor *data = kiln_arange(0, 5 * 2 * 3 * 4, 1, KILN_F32, KILN_CPU);
    kiln_tensor *x = kiln_reshape(data, KILN_SHAPE(5, 2, 3, 4));
    int64_t lab[5] = {4, 0, 2, 1, 3};
    kiln_tensor *labels = kiln_from_data(KILN_SHAPE(5), KILN_I64, KILN_CPU, lab);
    kiln_dataset *ds = NULL;
    CHECK_OK(kiln_dataset_from_tensors(x, labels, 5, &ds));
    /* The dataset holds its own references: the caller's may go. */
    kiln_release(data);
    kiln_release(x);
    kiln_release(labels);
    if (ds) {
        kiln_sample_info info = kiln_dataset_info(ds);
        CHECK(info.dtype == KILN_F32 && info.channels == 2 && info.height == 3 && info.width == 4);
        CHECK_EQ_I(kiln_sample_bytes(info), 24 * sizeof(float));
        float s[24];
        int64_t label;
        CHECK_OK(kiln_dataset_get(ds, 3, s, &label));
        CHECK_EQ_I(label, 1);
        bool same = true;
        for (int i = 0; i < 24; i++) same = same && s[i] == (float)(3 * 24 + i);
        CHECK(same);
        CHECK_FAILS(kiln_dataset_get(ds, 5, s, &label), KILN_ERR_INVALID_ARGUMENT, "index 5");
        CHECK_FAILS(kiln_dataset_get(ds, -1, s, &label), KILN_ERR_INVALID_ARGUMENT, "out of range");
        kiln_dataset_free(ds);
    }
    /* A transposed view (N, W, H) is copied to contiguous memory, inside a
     * scope that ends before the dataset is used. */
    kiln_scope_begin();
    kiln_tensor *base = kiln_reshape(kiln_arange(0, 3 * 2 * 4, 1, KILN_F64, KILN_CPU), KILN_SHAPE(3, 2, 4));
    kiln_tensor *view = kiln_transpose(base, 1, 2);
    kiln_tensor *l3 = kiln_from_data(KILN_SHAPE(3), KILN_I64, KILN_CPU, lab);
    CHECK_OK(kiln_dataset_from_tensors(view, l3, 5, &ds));
    kiln_dataset *bad = NULL;
    CHECK_FAILS(kiln_dataset_from_tensors(view, l3, 4, &bad), KILN_ERR_INVALID_ARGUMENT, "labels[0] is 4");
    kiln_tensor *li32 = kiln_from_data(KILN_SHAPE(3), KILN_I32, KILN_CPU, (int32_t[]){0, 1, 2});
    CHECK_FAILS(kiln_dataset_from_tensors(view, li32, 5, &bad), KILN_ERR_INVALID_ARGUMENT, "i64");
    CHECK_FAILS(kiln_dataset_from_tensors(l3, l3, 5, &bad), KILN_ERR_INVALID_ARGUMENT, "dimensions");
    CHECK_OK(kiln_scope_end());
    if (ds) {
        kiln_sample_info info = kiln_dataset_info(ds);
        CHECK(info.channels == 1 && info.height == 4 && info.width == 2);
        double s[8];
        int64_t label;
        CHECK_OK(kiln_dataset_get(ds, 2, s, &label));
        CHECK_EQ_I(label, 2);
        /* view[2][h][w] = base[2][w][h] = 16 + 4w + h */
        bool same = true;
        for (int h = 0; h < 4; h++)
            for (int w = 0; w < 2; w++) same = same && s[h * 2 + w] == 16 + 4 * w + h;
        CHECK(same);
        kiln_dataset_free(ds);
    }
}

/* A user dataset: sample i is eight floats equal to i, label i mod 3. */
typedef struct user_ctx {
    int64_t n;
    int *freed;
} user_ctx;

static int64_t user_length(void *ctx) { return ((user_ctx *)ctx)->n; }

static kiln_status user_get(void *ctx, int64_t index, void *dst, int64_t *label) {
    (void)ctx;
    float *f = dst;
    for (int i = 0; i < 8; i++) f[i] = (float)index;
    *label = index == 9 ? 7 : index % 3; /* sample 9 breaks the contract */
    return KILN_OK;
}

static void user_free(void *ctx) {
    user_ctx *u = ctx;
    (*u->freed)++;
    free(u);
}

static void test_user_dataset(void) {
    int freed = 0;
    user_ctx *u = malloc(sizeof *u);
    u->n = 10;
    u->freed = &freed;
    kiln_dataset_ops ops = {user_length, user_get, user_free};
    kiln_sample_info info = {KILN_F32, 2, 2, 2, 3};
    kiln_dataset *ds = NULL;
    CHECK_OK(kiln_dataset_create(&ops, u, info, &ds));
    CHECK_EQ_I(kiln_dataset_length(ds), 10);
    float s[8];
    int64_t label;
    CHECK_OK(kiln_dataset_get(ds, 4, s, &label));
    CHECK(label == 1 && s[0] == 4.0f && s[7] == 4.0f);
    CHECK_OK(kiln_dataset_get(ds, 5, s, NULL)); /* the label is optional */
    CHECK_FAILS(kiln_dataset_get(ds, 9, s, &label), KILN_ERR_STATE, "label 7");
    CHECK_FAILS(kiln_dataset_get(ds, 10, s, &label), KILN_ERR_INVALID_ARGUMENT, "out of range");
    kiln_dataset_free(ds);
    CHECK_EQ_I(freed, 1);
    /* A bad interface is refused and ctx stays the caller's. */
    kiln_dataset_ops no_get = {user_length, NULL, user_free};
    CHECK_FAILS(kiln_dataset_create(&no_get, NULL, info, &ds), KILN_ERR_INVALID_ARGUMENT, "callback");
    kiln_sample_info empty = {KILN_F32, 0, 2, 2, 3};
    CHECK_FAILS(kiln_dataset_create(&ops, NULL, empty, &ds), KILN_ERR_INVALID_ARGUMENT, "0 x 2 x 2");
    CHECK_EQ_I(freed, 1);
    CHECK_EQ_I(kiln_dataset_length(NULL), 0);
    CHECK_EQ_I(kiln_sample_bytes(empty), 0);
}

/* Many threads reading one image set; each checks every sample it reads. */
typedef struct reader_arg {
    const kiln_dataset *ds;
    int64_t start;
    int bad;
} reader_arg;

static void *reader_main(void *p) {
    reader_arg *a = p;
    int64_t n = kiln_dataset_length(a->ds);
    for (int64_t k = 0; k < 4 * n; k++) {
        int64_t i = (a->start + k * 7) % n;
        if (!df_sample_is(a->ds, i, i, i % 10)) a->bad++;
    }
    return NULL;
}

static void test_concurrent_get(void) {
    size_t sz;
    uint8_t *b = df_cifar(0, 40, 10, &sz);
    const char *path = df_write("threads.bin", b, sz);
    kiln_dataset *ds = NULL;
    CHECK_OK(kiln_dataset_open_cifar(1, &path, 10, &ds));
    if (!ds) return;
    pthread_t th[4];
    reader_arg args[4];
    for (int t = 0; t < 4; t++) {
        args[t] = (reader_arg){ds, t * 11, 0};
        pthread_create(&th[t], NULL, reader_main, &args[t]);
    }
    for (int t = 0; t < 4; t++) {
        pthread_join(th[t], NULL);
        CHECK_EQ_I(args[t].bad, 0);
    }
    kiln_dataset_free(ds);
    free(b);
}

int main(void) {
    CHECK_OK(kiln_init());
    if (!df_init()) {
        fprintf(stderr, "cannot create a temporary directory\n");
        return 1;
    }
    test_idx_raw_and_gzip();
    test_cifar();
    test_fashion_mnist_dir();
    test_fashion_mnist_real();
    test_tensor_dataset();
    test_user_dataset();
    test_concurrent_get();
    df_cleanup();
    return kt_finish();
}

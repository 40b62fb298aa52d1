/* kiln_loader_set_indices (a sampler's index list, as the distributed
 * sampler feeds kiln train's loader) and kiln_loader_permutation: the
 * batches visit exactly the listed samples in the listed order, repeats
 * included, with 0 and 2 workers and on the dataset-on-device path; the
 * list stays across epochs and its transforms are keyed by the epoch;
 * NULL restores the whole dataset in the loader's own (shuffled) order,
 * which kiln_loader_permutation reproduces; a list set mid-epoch abandons
 * it; bad entries are refused by position. */
#include "kiln/data.h"
#include "test_util.h"

enum { N = 23, C = 1, H = 4, W = 3, CHW = C * H * W };

static int64_t ds_length(void *ctx) {
    (void)ctx;
    return N;
}

static kiln_status ds_get(void *ctx, int64_t index, void *dst, int64_t *label) {
    (void)ctx;
    uint8_t *px = dst;
    for (int i = 0; i < CHW; i++) px[i] = (uint8_t)(index * 7 + i);
    *label = index;
    return KILN_OK;
}

static kiln_dataset *make_dataset(void) {
    static const kiln_dataset_ops ops = {ds_length, ds_get, NULL};
    kiln_sample_info info = {KILN_U8, C, H, W, N};
    kiln_dataset *ds = NULL;
    CHECK_OK(kiln_dataset_create(&ops, NULL, info, &ds));
    return ds;
}

/* One epoch's labels (each sample's label is its index) into out; the
 * batch sizes into sizes. Returns the samples seen. */
static int64_t epoch_labels(kiln_loader *l, int64_t epoch, int64_t *out, int64_t *sizes, int64_t *nb) {
    CHECK_OK(kiln_loader_epoch_begin(l, epoch));
    int64_t seen = 0;
    *nb = 0;
    for (;;) {
        kiln_tensor *x = NULL, *y = NULL;
        CHECK_OK(kiln_loader_next(l, &x, &y));
        if (!x) break;
        int64_t b = kiln_size(y, 0);
        CHECK_EQ_I(kiln_size(x, 0), b);
        const int64_t *lab = kiln_data_ptr(y);
        const float *px =
            kiln_data_ptr(x); /* (b, C, H, W): sample lab[i]'s first pixel is lab[i] * 7 / 255 */
        for (int64_t i = 0; i < b; i++) {
            CHECK(fabsf(px[i * CHW] - (float)((lab[i] * 7) & 255) / 255.0f) < 1e-6f);
            out[seen++] = lab[i];
        }
        sizes[(*nb)++] = b;
        kiln_release(x);
        kiln_release(y);
    }
    return seen;
}

static void check_list(kiln_data_on_device mode, int workers) {
    kiln_dataset *ds = make_dataset();
    kiln_loader_opts o = kiln_loader_opts_default();
    o.batch_size = 4;
    o.shuffle = true;
    o.seed = 9;
    o.num_workers = workers;
    o.device = KILN_CPU;
    o.on_device = mode;
    kiln_loader *l = NULL;
    CHECK_OK(kiln_loader_create(ds, &o, &l));
    CHECK_EQ_I(kiln_loader_num_batches(l), 6);
    int64_t got[64], sizes[64], nb = 0;
    /* The whole dataset in the loader's own order: kiln_loader_permutation's. */
    int64_t perm[N];
    kiln_loader_permutation(N, true, 9, 2, perm);
    CHECK_EQ_I(epoch_labels(l, 2, got, sizes, &nb), N);
    CHECK(!memcmp(got, perm, sizeof perm));
    /* A list with a repeat (the sampler's padding) and a ragged last batch. */
    const int64_t list[] = {5, 0, 22, 5, 17, 3, 11, 8, 1, 19, 7};
    const int64_t n_list = (int64_t)(sizeof list / sizeof list[0]);
    CHECK_OK(kiln_loader_set_indices(l, list, n_list));
    CHECK_EQ_I(kiln_loader_num_batches(l), 3);
    for (int64_t epoch = 0; epoch < 2; epoch++) { /* the list stays; shuffle does not apply */
        CHECK_EQ_I(epoch_labels(l, epoch, got, sizes, &nb), n_list);
        CHECK(!memcmp(got, list, sizeof list));
        CHECK_EQ_I(nb, 3);
        CHECK(sizes[0] == 4 && sizes[1] == 4 && sizes[2] == 3);
    }
    /* Set mid-epoch: the epoch is abandoned until the next begin. */
    CHECK_OK(kiln_loader_epoch_begin(l, 5));
    kiln_tensor *x = NULL, *y = NULL;
    CHECK_OK(kiln_loader_next(l, &x, &y));
    kiln_release(x), kiln_release(y);
    const int64_t longer[] = {1,  2,  3,  4,  5,  6,  7,  8,  9, 10, 11, 12, 13, 14,
                              15, 16, 17, 18, 19, 20, 21, 22, 0, 1,  2,  3,  4};
    CHECK_OK(kiln_loader_set_indices(l, longer, 27)); /* more entries than the dataset has */
    CHECK_OK(kiln_loader_next(l, &x, &y));
    CHECK(x == NULL && y == NULL);
    CHECK_EQ_I(epoch_labels(l, 5, got, sizes, &nb), 27);
    CHECK(!memcmp(got, longer, sizeof longer));
    /* NULL: back to the whole dataset, shuffled again. */
    CHECK_OK(kiln_loader_set_indices(l, NULL, 0));
    CHECK_EQ_I(kiln_loader_num_batches(l), 6);
    kiln_loader_permutation(N, true, 9, 4, perm);
    CHECK_EQ_I(epoch_labels(l, 4, got, sizes, &nb), N);
    CHECK(!memcmp(got, perm, sizeof perm));
    /* An empty list: empty epochs. */
    CHECK_OK(kiln_loader_set_indices(l, list, 0));
    CHECK_EQ_I(kiln_loader_num_batches(l), 0);
    CHECK_EQ_I(epoch_labels(l, 0, got, sizes, &nb), 0);
    const int64_t bad[] = {0, 23};
    CHECK_FAILS(kiln_loader_set_indices(l, bad, 2), KILN_ERR_INVALID_ARGUMENT,
                "entry 1 is 23, outside the dataset's [0, 23)");
    CHECK_FAILS(kiln_loader_set_indices(l, NULL, 3), KILN_ERR_INVALID_ARGUMENT, "count 3 with indices NULL");
    kiln_loader_free(l);
    kiln_dataset_free(ds);
}

static void test_permutation(void) {
    int64_t a[N], b[N], c[N];
    kiln_loader_permutation(N, true, 1, 0, a);
    kiln_loader_permutation(N, true, 1, 0, b);
    kiln_loader_permutation(N, true, 1, 1, c);
    CHECK(!memcmp(a, b, sizeof a));
    CHECK(memcmp(a, c, sizeof a) != 0);
    int seen[N] = {0};
    for (int i = 0; i < N; i++) seen[a[i]]++;
    for (int i = 0; i < N; i++) CHECK_EQ_I(seen[i], 1);
    kiln_loader_permutation(N, false, 1, 0, a);
    for (int i = 0; i < N; i++) CHECK_EQ_I(a[i], i);
}

int main(void) {
    if (kiln_init()) return 1;
    test_permutation();
    check_list(KILN_DATA_ON_DEVICE_OFF, 0);
    check_list(KILN_DATA_ON_DEVICE_OFF, 2);
    check_list(KILN_DATA_ON_DEVICE_ON, 0);
    kiln_shutdown();
    return kt_finish();
}

/* Dataset-on-device mode on the CPU device: the dataset is one tensor and
 * every batch is made by ops (gather, cast, multiply-add, where). It must
 * give the host path's batches bit for bit, over several epochs, for zero
 * and reflect padding, random and alternating flips, cutout, u8 and f32
 * samples and a ragged last batch; AUTO must follow the memory fraction;
 * bad options are named. (tests/data/test_loader_cuda.c runs the same on
 * emulated cuda:0.) */
#include "loader_epochs.c"

static const int64_t EPOCHS[] = {0, 1, 2, 5};
enum { N_EPOCHS = 4 };

static void test_same_as_host(void) {
    static le_run ref, got;
    for (int dt = 0; dt < 2; dt++) {
        kiln_dataset *ds = le_dataset(dt == 0 ? KILN_U8 : KILN_F32);
        for (int recipe = 0; recipe < 3; recipe++) {
            for (int drop = 0; drop < 2; drop++) {
                kiln_loader_opts o = le_opts(recipe);
                o.drop_last = drop;
                le_collect(ds, &o, N_EPOCHS, EPOCHS, &ref);
                CHECK(!ref.stats.on_device);
                o.on_device = KILN_DATA_ON_DEVICE_ON;
                o.num_workers = 2; /* unused in device mode */
                le_collect(ds, &o, N_EPOCHS, EPOCHS, &got);
                CHECK_EQ_I(ref.rows[0], drop ? 40 : LE_N);
                CHECK_MSG(le_same(&ref, &got, N_EPOCHS),
                          "%s samples, recipe %d, drop_last %d: device mode differs from the host path "
                          "(first float %lld)",
                          dt == 0 ? "u8" : "f32", recipe, drop,
                          (long long)le_first_diff(&ref, &got, N_EPOCHS));
                CHECK(got.stats.on_device && got.stats.num_workers == 0 && got.on_device_ok);
                int pad = o.transforms.crop_padding;
                bool mirrored = o.transforms.flip_p > 0 || o.transforms.alternating_flip;
                int64_t want = (int64_t)LE_N * LE_C * (LE_H + 2 * pad) * (LE_W + 2 * pad) *
                                   (int64_t)kiln_dtype_size(dt == 0 ? KILN_U8 : KILN_F32) *
                                   (mirrored ? 2 : 1) +
                               LE_N * 8;
                CHECK_EQ_I(got.stats.device_bytes, want);
            }
        }
        kiln_dataset_free(ds);
    }
}

/* The check above can fail: a different seed changes the device batches. */
static void test_detects_difference(void) {
    static le_run a, b;
    kiln_dataset *ds = le_dataset(KILN_U8);
    kiln_loader_opts o = le_opts(0);
    o.on_device = KILN_DATA_ON_DEVICE_ON;
    le_collect(ds, &o, 1, EPOCHS, &a);
    o.seed++;
    le_collect(ds, &o, 1, EPOCHS, &b);
    CHECK(!le_same(&a, &b, 1));
    /* Epochs differ too (shuffle and transforms are keyed by the epoch). */
    o.seed--;
    le_collect(ds, &o, 1, EPOCHS + 1, &b);
    CHECK(!le_same(&a, &b, 1));
    kiln_dataset_free(ds);
}

static void test_auto_and_options(void) {
    static le_run r;
    kiln_dataset *ds = le_dataset(KILN_U8);
    kiln_loader_opts o = le_opts(1);
    o.on_device = KILN_DATA_ON_DEVICE_AUTO;
    o.on_device_fraction = 1e-12; /* nothing fits */
    le_collect(ds, &o, 1, EPOCHS, &r);
    CHECK_MSG(!r.stats.on_device, "AUTO with a tiny fraction chose the device");
    o.on_device_fraction = 1.0;
    le_collect(ds, &o, 1, EPOCHS, &r);
    CHECK_MSG(r.stats.on_device, "AUTO with the whole free memory chose the host");
    o.on_device_fraction = 0; /* the default, 0.25: 40 KiB fit */
    le_collect(ds, &o, 1, EPOCHS, &r);
    CHECK(r.stats.on_device);

    kiln_loader *l = NULL;
    o = le_opts(0);
    o.on_device = (kiln_data_on_device)9;
    CHECK_FAILS(kiln_loader_create(ds, &o, &l), KILN_ERR_INVALID_ARGUMENT, "on_device 9");
    o = le_opts(0);
    o.on_device = KILN_DATA_ON_DEVICE_AUTO;
    o.on_device_fraction = 1.5;
    CHECK_FAILS(kiln_loader_create(ds, &o, &l), KILN_ERR_INVALID_ARGUMENT, "on_device_fraction 1.5");
    CHECK(l == NULL);
    kiln_dataset_free(ds);
}

/* An epoch restarted after one batch, batches kept past the loader's end,
 * and batches owned by a scope. */
static void test_restart_and_ownership(void) {
    static le_run ref;
    kiln_dataset *ds = le_dataset(KILN_U8);
    kiln_loader_opts o = le_opts(0);
    o.on_device = KILN_DATA_ON_DEVICE_ON;
    le_collect(ds, &o, 1, EPOCHS + 1, &ref);
    kiln_loader *l = NULL;
    CHECK_OK(kiln_loader_create(ds, &o, &l));
    kiln_tensor *x = NULL, *y = NULL, *kept = NULL;
    CHECK_OK(kiln_loader_epoch_begin(l, 0));
    CHECK_OK(kiln_loader_next(l, &x, &y));
    kiln_release(x);
    kiln_release(y);
    CHECK_OK(kiln_loader_epoch_begin(l, EPOCHS[1]));
    int64_t rows = 0;
    static float xs[LE_N * LE_CHW];
    for (;;) {
        kiln_scope_begin();
        CHECK_OK(kiln_loader_next(l, &x, &y));
        bool end = x == NULL;
        if (x && rows + kiln_size(x, 0) <= LE_N) {
            CHECK_OK(kiln_to_host(x, xs + rows * LE_CHW, (size_t)(kiln_size(x, 0) * LE_CHW) * sizeof(float)));
            rows += kiln_size(x, 0);
            if (!kept) kept = kiln_retain(x);
        }
        CHECK_OK(kiln_scope_end());
        if (end) break;
    }
    CHECK_EQ_I(rows, LE_N);
    CHECK(memcmp(xs, ref.x[0], sizeof xs) == 0);
    kiln_loader_free(l);
    float first[LE_CHW];
    kiln_tensor *row0 = kiln_narrow(kept, 0, 0, 1);
    CHECK_OK(kiln_to_host(row0, first, sizeof first));
    kiln_release(row0);
    CHECK(memcmp(first, ref.x[0], sizeof first) == 0);
    kiln_release(kept);
    kiln_dataset_free(ds);
}

int main(void) {
    CHECK_OK(kiln_init());
    test_same_as_host();
    test_detects_difference();
    test_auto_and_options();
    test_restart_and_ownership();
    kiln_shutdown();
    return kt_finish();
}

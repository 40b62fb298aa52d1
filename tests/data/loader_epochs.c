/* Shared by the loader tests of the dataset-on-device mode and of the
 * device prefetch path (included; one executable per test file): a small
 * random u8 (or f32) dataset, transform recipes that use every random
 * transform, and a collector that runs a loader over several epochs and
 * concatenates what it delivers, read back to the host. */
#include <stdint.h>

#include "kiln/data.h"
#include "test_util.h"

enum { LE_N = 45, LE_C = 3, LE_H = 7, LE_W = 6, LE_CHW = LE_C * LE_H * LE_W, LE_MAX_EPOCHS = 4 };

/* Pixels from xorshift (any misplaced byte shows), labels i % 10. */
static kiln_dataset *le_dataset(kiln_dtype dtype) {
    kiln_tensor *data = kiln_empty(KILN_SHAPE(LE_N, LE_C, LE_H, LE_W), dtype, KILN_CPU);
    kiln_tensor *labels = kiln_empty(KILN_SHAPE(LE_N), KILN_I64, KILN_CPU);
    uint64_t s = 0x2545F4914F6CDD1Dull;
    for (int64_t i = 0; i < (int64_t)LE_N * LE_CHW; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        if (dtype == KILN_U8)
            ((uint8_t *)kiln_data_ptr(data))[i] = (uint8_t)(s >> 56);
        else
            ((float *)kiln_data_ptr(data))[i] = (float)(int)(s >> 40) / 65536.0f - 128.0f;
    }
    for (int64_t i = 0; i < LE_N; i++) ((int64_t *)kiln_data_ptr(labels))[i] = i % 10;
    kiln_dataset *ds = NULL;
    CHECK_OK(kiln_dataset_from_tensors(data, labels, 10, &ds));
    kiln_release(data);
    kiln_release(labels);
    return ds;
}

/* Recipe 0: zero padding, random flip, cutout; 1: reflect padding,
 * alternating and random flip, a larger cutout; 2: convert only. */
static kiln_loader_opts le_opts(int recipe) {
    kiln_loader_opts o = kiln_loader_opts_default();
    o.device = KILN_CPU; /* the host path, whatever the current device */
    o.batch_size = 8; /* 45 = 5 * 8 + 5: a ragged last batch */
    o.shuffle = recipe != 2;
    o.seed = 77 + (uint64_t)recipe;
    kiln_transform_opts *t = &o.transforms;
    if (recipe == 0) {
        t->crop_padding = 2;
        t->pad_mode = KILN_PAD_ZERO;
        t->flip_p = 0.5f;
        t->cutout = 3;
    } else if (recipe == 1) {
        t->crop_padding = 3;
        t->pad_mode = KILN_PAD_REFLECT;
        t->alternating_flip = true;
        t->flip_p = 0.3f;
        t->cutout = 4;
    }
    if (recipe != 2) {
        t->normalize = true;
        const float mean[3] = {0.49f, 0.48f, 0.45f}, std[3] = {0.25f, 0.24f, 0.26f};
        for (int c = 0; c < LE_C; c++) t->mean[c] = mean[c], t->std[c] = std[c];
    }
    return o;
}

typedef struct le_run {
    float x[LE_MAX_EPOCHS][LE_N * LE_CHW];
    int64_t y[LE_MAX_EPOCHS][LE_N];
    int64_t rows[LE_MAX_EPOCHS];
    bool on_device_ok; /* every batch was on the loader's device */
    kiln_loader_stats stats;
} le_run;

/* One loader, epochs[0..n) in turn. Each batch is read back with
 * kiln_to_host (ordered after the caller's current stream). */
static void le_collect(kiln_dataset *ds, const kiln_loader_opts *o, int n, const int64_t *epochs,
                       le_run *out) {
    memset(out, 0, sizeof *out);
    out->on_device_ok = true;
    kiln_loader *l = NULL;
    CHECK_OK(kiln_loader_create(ds, o, &l));
    if (!l) return;
    for (int e = 0; e < n; e++) {
        CHECK_OK(kiln_loader_epoch_begin(l, epochs[e]));
        for (;;) {
            kiln_tensor *x = NULL, *y = NULL;
            CHECK_OK(kiln_loader_next(l, &x, &y));
            if (!x) break;
            int64_t b = kiln_size(x, 0);
            bool ok = kiln_ndim(x) == 4 && kiln_size(x, 1) == LE_C && kiln_size(x, 2) == LE_H &&
                      kiln_size(x, 3) == LE_W && kiln_dtype_of(x) == KILN_F32 &&
                      kiln_dtype_of(y) == KILN_I64 && kiln_size(y, 0) == b && out->rows[e] + b <= LE_N;
            CHECK(ok);
            out->on_device_ok &= kiln_device_equal(kiln_get_device(x), o->device) &&
                                 kiln_device_equal(kiln_get_device(y), o->device);
            if (ok) {
                CHECK_OK(
                    kiln_to_host(x, out->x[e] + out->rows[e] * LE_CHW, (size_t)(b * LE_CHW) * sizeof(float)));
                CHECK_OK(kiln_to_host(y, out->y[e] + out->rows[e], (size_t)b * sizeof(int64_t)));
                out->rows[e] += b;
            }
            kiln_release(x);
            kiln_release(y);
        }
    }
    CHECK_OK(kiln_loader_stats_get(l, &out->stats));
    kiln_loader_free(l);
}

/* The first differing float of two runs (or -1), for messages. */
static int64_t le_first_diff(const le_run *a, const le_run *b, int n) {
    for (int e = 0; e < n; e++)
        for (int64_t i = 0; i < LE_N * LE_CHW; i++)
            if (memcmp(&a->x[e][i], &b->x[e][i], sizeof(float)) != 0) return (int64_t)e * LE_N * LE_CHW + i;
    return -1;
}

static bool le_same(const le_run *a, const le_run *b, int n) {
    for (int e = 0; e < n; e++)
        if (a->rows[e] != b->rows[e] || memcmp(a->y[e], b->y[e], sizeof a->y[e]) != 0) return false;
    return le_first_diff(a, b, n) < 0;
}

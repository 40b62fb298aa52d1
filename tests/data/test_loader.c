/* The loader: bit-identical batches for 0, 1 and 3 workers (and with
 * pinning or the forced prefetch path), order, shuffling per epoch,
 * drop_last and a ragged last batch, the pinned pool's bound, scopes,
 * worker errors, and shutdown at awkward moments (run under ASan and TSan:
 * no leaked thread, no deadlock, no race). No test sleeps: waits are on
 * condition variables signalled by the dataset callbacks. */
#include <pthread.h>
#include <unistd.h>

#include "kiln/data.h"
#include "test_util.h"

enum { N = 37, C = 3, H = 6, W = 5, CHW = C * H * W };

/* A dataset over callbacks that counts reads, so a test can wait until
 * the workers have made a given number of samples; sample i is a
 * deterministic pattern and its label is i. Index `fail_at` fails. */
typedef struct counting_ds {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t reads;
    int64_t length;
    int64_t fail_at;
} counting_ds;

static int64_t cds_length(void *ctx) { return ((counting_ds *)ctx)->length; }

static kiln_status cds_get(void *ctx, int64_t index, void *dst, int64_t *label) {
    counting_ds *d = ctx;
    uint8_t *px = dst;
    for (int i = 0; i < CHW; i++) px[i] = (uint8_t)((index * 31 + i * 7 + (i * index) % 11) & 255);
    *label = index;
    pthread_mutex_lock(&d->mu);
    d->reads++;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    if (index == d->fail_at) {
        kiln_error_clear();
        /* The public error API has no raise; an invalid kiln_empty call sets one. */
        kiln_tensor *t = kiln_empty(KILN_SHAPE(-1), KILN_F32, KILN_CPU);
        kiln_release(t);
        return KILN_ERR_IO;
    }
    return KILN_OK;
}

static void cds_free(void *ctx) {
    counting_ds *d = ctx;
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
    free(d);
}

static kiln_dataset *make_dataset(int64_t length, int64_t fail_at, counting_ds **ctx_out) {
    counting_ds *d = calloc(1, sizeof *d);
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    d->length = length;
    d->fail_at = fail_at;
    static const kiln_dataset_ops ops = {cds_length, cds_get, cds_free};
    kiln_sample_info info = {KILN_U8, C, H, W, (int)length};
    kiln_dataset *ds = NULL;
    CHECK_OK(kiln_dataset_create(&ops, d, info, &ds));
    if (ctx_out) *ctx_out = d;
    return ds;
}

static void wait_reads(counting_ds *d, int64_t n) {
    pthread_mutex_lock(&d->mu);
    while (d->reads < n) pthread_cond_wait(&d->cv, &d->mu);
    pthread_mutex_unlock(&d->mu);
}

static kiln_loader_opts base_opts(void) {
    kiln_loader_opts o = kiln_loader_opts_default();
    o.device = KILN_CPU; /* the host path, whatever the current device */
    o.batch_size = 8;
    o.shuffle = true;
    o.seed = 1234;
    o.transforms.crop_padding = 2;
    o.transforms.pad_mode = KILN_PAD_REFLECT;
    o.transforms.flip_p = 0.5f;
    o.transforms.cutout = 3;
    o.transforms.normalize = true;
    for (int c = 0; c < C; c++) o.transforms.mean[c] = 0.5f, o.transforms.std[c] = 0.25f;
    return o;
}

/* One epoch's batches, concatenated: x (N, C, H, W) floats, y (N). */
typedef struct epoch_data {
    float x[N * CHW];
    int64_t y[N];
    int64_t rows;
    int batches;
    bool shapes_ok, pinned, on_device_copy;
} epoch_data;

static void collect(kiln_dataset *ds, kiln_loader_opts o, int64_t epoch, epoch_data *out) {
    memset(out, 0, sizeof *out);
    out->shapes_ok = out->pinned = true;
    kiln_loader *l = NULL;
    CHECK_OK(kiln_loader_create(ds, &o, &l));
    if (!l) return;
    CHECK_OK(kiln_loader_epoch_begin(l, epoch));
    for (;;) {
        kiln_tensor *x = NULL, *y = NULL;
        CHECK_OK(kiln_loader_next(l, &x, &y));
        if (!x) break;
        int64_t b = kiln_size(x, 0);
        out->shapes_ok &= kiln_ndim(x) == 4 && kiln_size(x, 1) == C && kiln_size(x, 2) == H &&
                          kiln_size(x, 3) == W && kiln_dtype_of(x) == KILN_F32 &&
                          kiln_dtype_of(y) == KILN_I64 && kiln_size(y, 0) == b && out->rows + b <= N;
        out->pinned &= kiln_is_pinned(x) && kiln_is_pinned(y);
        if (out->shapes_ok) {
            CHECK_OK(kiln_to_host(x, out->x + out->rows * CHW, (size_t)(b * CHW) * sizeof(float)));
            CHECK_OK(kiln_to_host(y, out->y + out->rows, (size_t)b * sizeof(int64_t)));
        }
        out->rows += b;
        out->batches++;
        kiln_release(x);
        kiln_release(y);
    }
    kiln_loader_stats st;
    CHECK_OK(kiln_loader_stats_get(l, &st));
    CHECK_EQ_I(st.batches, out->batches);
    CHECK_EQ_I(st.batches_per_epoch, kiln_loader_num_batches(l));
    kiln_loader_free(l);
}

static void test_identical_across_workers(kiln_dataset *ds) {
    static epoch_data ref, got;
    kiln_loader_opts o = base_opts();
    collect(ds, o, 2, &ref);
    CHECK(ref.shapes_ok);
    CHECK_EQ_I(ref.rows, N);
    CHECK_EQ_I(ref.batches, 5);
    struct {
        int workers, prefetch;
        bool pin, to_device;
    } cases[] = {{1, 0, false, false}, {3, 0, false, false}, {3, 1, true, false},
                 {0, 0, true, true},   {2, 3, true, true},   {3, 0, false, true}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        o = base_opts();
        o.num_workers = cases[i].workers;
        o.prefetch_factor = cases[i].prefetch;
        o.pin_memory = cases[i].pin;
        o.prefetch_to_device = cases[i].to_device;
        collect(ds, o, 2, &got);
        CHECK_MSG(got.rows == N && memcmp(got.x, ref.x, sizeof ref.x) == 0 &&
                      memcmp(got.y, ref.y, sizeof ref.y) == 0,
                  "case %zu (%d workers, pin %d, prefetch %d) differs from 0 workers", i, cases[i].workers,
                  cases[i].pin, cases[i].to_device);
        if (cases[i].pin && !cases[i].to_device) CHECK(got.pinned);
        if (cases[i].to_device) CHECK(!got.pinned); /* a device copy, not the pooled buffer */
    }
}

static bool is_permutation(const int64_t *y, int64_t n) {
    bool seen[N] = {false};
    for (int64_t i = 0; i < n; i++) {
        if (y[i] < 0 || y[i] >= N || seen[y[i]]) return false;
        seen[y[i]] = true;
    }
    return true;
}

static void test_order_and_shuffle(kiln_dataset *ds) {
    static epoch_data a, b;
    kiln_loader_opts o = base_opts();
    o.shuffle = false;
    o.num_workers = 3;
    o.prefetch_factor = 1;
    o.transforms = kiln_transform_opts_default();
    collect(ds, o, 0, &a);
    bool in_order = a.rows == N;
    for (int64_t i = 0; i < a.rows; i++) in_order &= a.y[i] == i;
    CHECK_MSG(in_order, "without shuffling, batches come in dataset order");
    /* The pixels are the dataset's sample, converted. */
    uint8_t raw[CHW];
    int64_t label;
    bool pixels = true;
    for (int64_t i = 0; i < N; i++) {
        kiln_dataset_get(ds, i, raw, &label);
        for (int k = 0; k < CHW; k++) pixels &= fabsf(a.x[i * CHW + k] - raw[k] / 255.0f) < 1e-6f;
    }
    CHECK(pixels);

    o = base_opts();
    o.num_workers = 2;
    collect(ds, o, 0, &a);
    collect(ds, o, 1, &b);
    CHECK(is_permutation(a.y, a.rows) && a.rows == N);
    CHECK(is_permutation(b.y, b.rows) && b.rows == N);
    CHECK_MSG(memcmp(a.y, b.y, sizeof a.y) != 0, "epochs 0 and 1 have the same order");
    int moved = 0;
    for (int64_t i = 0; i < N; i++) moved += a.y[i] != i;
    CHECK_MSG(moved > N / 2, "shuffled order leaves %d of %d in place", N - moved, N);
}

static void test_drop_last(kiln_dataset *ds) {
    static epoch_data a;
    kiln_loader_opts o = base_opts();
    o.drop_last = true;
    o.num_workers = 2;
    collect(ds, o, 0, &a);
    CHECK_EQ_I(a.batches, 4);
    CHECK_EQ_I(a.rows, 32);
    o.batch_size = 40; /* larger than the dataset */
    collect(ds, o, 0, &a);
    CHECK_EQ_I(a.batches, 0);
    o.drop_last = false;
    collect(ds, o, 0, &a);
    CHECK_EQ_I(a.batches, 1);
    CHECK_EQ_I(a.rows, N);
}

/* Free after one batch while the workers are blocked on a full window. */
static void test_shutdown_mid_epoch(void) {
    counting_ds *d;
    kiln_dataset *ds = make_dataset(200, -1, &d);
    kiln_loader_opts o = base_opts();
    o.batch_size = 1;
    o.num_workers = 3;
    o.prefetch_factor = 2;
    o.pin_memory = true;
    kiln_loader *l = NULL;
    CHECK_OK(kiln_loader_create(ds, &o, &l));
    CHECK_OK(kiln_loader_epoch_begin(l, 0));
    kiln_tensor *x = NULL, *y = NULL;
    CHECK_OK(kiln_loader_next(l, &x, &y));
    CHECK(x && y);
    /* One delivered plus a full window (3 workers x 2) of one-sample batches. */
    wait_reads(d, 1 + 3 * 2);
    kiln_loader_free(l);
    /* The batch the caller holds outlives the loader. */
    double label = -1;
    CHECK_OK(kiln_item(y, &label));
    CHECK(label >= 0 && label < 200);
    kiln_release(x);
    kiln_release(y);

    /* Free right after an epoch begins (workers busy), and with the
     * prefetch path holding a staged batch. */
    CHECK_OK(kiln_loader_create(ds, &o, &l));
    CHECK_OK(kiln_loader_epoch_begin(l, 1));
    kiln_loader_free(l);
    o.prefetch_to_device = true;
    CHECK_OK(kiln_loader_create(ds, &o, &l));
    CHECK_OK(kiln_loader_epoch_begin(l, 1));
    CHECK_OK(kiln_loader_next(l, &x, &y));
    kiln_release(x);
    kiln_release(y);
    kiln_loader_free(l);
    /* A loader that never began an epoch, and one restarted mid-epoch. */
    CHECK_OK(kiln_loader_create(ds, &o, &l));
    kiln_loader_free(l);
    kiln_loader_free(NULL);
    kiln_dataset_free(ds);
}

static void test_restart_mid_epoch(kiln_dataset *ds) {
    static epoch_data ref;
    kiln_loader_opts o = base_opts();
    o.num_workers = 3;
    collect(ds, o, 1, &ref);
    kiln_loader *l = NULL;
    CHECK_OK(kiln_loader_create(ds, &o, &l));
    kiln_tensor *x, *y;
    CHECK_OK(kiln_loader_epoch_begin(l, 0));
    CHECK_OK(kiln_loader_next(l, &x, &y));
    kiln_release(x);
    kiln_release(y);
    CHECK_OK(kiln_loader_epoch_begin(l, 1)); /* abandons epoch 0 */
    int64_t rows = 0;
    bool same = true;
    int64_t ys[N];
    for (;;) {
        CHECK_OK(kiln_loader_next(l, &x, &y));
        if (!x) break;
        int64_t b = kiln_size(y, 0);
        if (rows + b > N) {
            same = false;
            break;
        }
        kiln_to_host(y, ys + rows, (size_t)b * sizeof(int64_t));
        rows += b;
        kiln_release(x);
        kiln_release(y);
    }
    CHECK(same && rows == N && memcmp(ys, ref.y, sizeof ys) == 0);
    kiln_loader_free(l);
}

/* One epoch of 16 batches taken inside scopes (the scope's end releases
 * them); every fifth batch is kept, as a view, across three more. */
static void pool_epoch(kiln_loader *l, int epoch, bool hold) {
    CHECK_OK(kiln_loader_epoch_begin(l, epoch));
    kiln_tensor *held[3] = {NULL, NULL, NULL};
    int n = 0;
    for (;;) {
        kiln_scope_begin();
        kiln_tensor *x, *y;
        CHECK_OK(kiln_loader_next(l, &x, &y));
        bool end = x == NULL;
        if (x) CHECK(kiln_is_pinned(x));
        if (x && hold && n % 5 == 0) {
            kiln_release(held[n / 5 % 3]);
            held[n / 5 % 3] = kiln_retain(kiln_view(x, KILN_SHAPE(-1)));
        }
        CHECK_OK(kiln_scope_end());
        if (end) break;
        n++;
    }
    CHECK_EQ_I(n, 16);
    for (int i = 0; i < 3; i++) kiln_release(held[i]);
}

/* The pinned pool holds at most the batches in flight (the window) plus
 * those the consumer holds: 64 batches over 4 epochs reuse a handful of
 * buffers. How many it reaches within that bound depends on timing, so
 * the bound is what is checked. */
static void test_pinned_pool(void) {
    kiln_dataset *ds = make_dataset(64, -1, NULL);
    kiln_loader_opts o = base_opts();
    o.batch_size = 4;
    o.num_workers = 2;
    o.pin_memory = true;
    for (int hold = 0; hold <= 1; hold++) {
        kiln_loader *l = NULL;
        CHECK_OK(kiln_loader_create(ds, &o, &l));
        for (int epoch = 0; epoch < 4; epoch++) pool_epoch(l, epoch, hold);
        kiln_loader_stats st;
        CHECK_OK(kiln_loader_stats_get(l, &st));
        /* window (2 workers x 2) + the batch the consumer holds (+ 3 kept) */
        int64_t bound = 2 * 2 + 1 + (hold ? 3 : 0);
        CHECK_MSG(st.buffers_allocated >= 1 && st.buffers_allocated <= bound,
                  "pool of %lld buffers for 64 batches (bound %lld)", (long long)st.buffers_allocated,
                  (long long)bound);
        kiln_loader_free(l);
    }
    kiln_dataset_free(ds);
}

static void test_worker_error(void) {
    for (int workers = 0; workers <= 2; workers += 2) {
        kiln_dataset *ds = make_dataset(20, 9, NULL);
        kiln_loader_opts o = base_opts();
        o.shuffle = false;
        o.batch_size = 4;
        o.num_workers = workers;
        kiln_loader *l = NULL;
        CHECK_OK(kiln_loader_create(ds, &o, &l));
        CHECK_OK(kiln_loader_epoch_begin(l, 0));
        int ok = 0, failed = 0;
        for (int i = 0; i < 5; i++) {
            kiln_tensor *x = NULL, *y = NULL;
            kiln_error_clear();
            kiln_status s = kiln_loader_next(l, &x, &y);
            if (s) {
                failed++;
                CHECK_MSG(i == 2, "batch %d failed", i);
                CHECK(x == NULL && strstr(kiln_error_message(), "batch 2") != NULL);
            } else {
                ok += x != NULL;
            }
            kiln_release(x);
            kiln_release(y);
        }
        CHECK_EQ_I(ok, 4);
        CHECK_EQ_I(failed, 1);
        kiln_loader_free(l);
        kiln_dataset_free(ds);
    }
}

static void test_options(kiln_dataset *ds) {
    kiln_loader_opts o = base_opts();
    kiln_loader *l = NULL;
    o.batch_size = 0;
    CHECK_FAILS(kiln_loader_create(ds, &o, &l), KILN_ERR_INVALID_ARGUMENT, "batch_size 0");
    CHECK(l == NULL);
    o = base_opts();
    o.transforms.crop_padding = 9;
    CHECK_FAILS(kiln_loader_create(ds, &o, &l), KILN_ERR_INVALID_ARGUMENT, "reflect padding 9");
    o = base_opts();
    o.device = KILN_META;
    CHECK_FAILS(kiln_loader_create(ds, &o, &l), KILN_ERR_INVALID_ARGUMENT, "meta");
    o = base_opts();
    o.num_workers = -1;
    CHECK_OK(kiln_loader_create(ds, &o, &l));
    kiln_tensor *x, *y;
    CHECK_FAILS(kiln_loader_next(l, &x, &y), KILN_ERR_STATE, "no epoch has begun");
    kiln_loader_stats st;
    CHECK_OK(kiln_loader_stats_get(l, &st));
    CHECK_EQ_I(st.num_workers, kiln_num_loader_workers()); /* auto: the cores compute leaves */
    kiln_loader_free(l);
    /* With one compute thread on a machine of several cores, auto starts workers. */
    int threads = kiln_num_threads();
    CHECK_OK(kiln_set_num_threads(1));
    CHECK_OK(kiln_loader_create(ds, &o, &l));
    CHECK_OK(kiln_loader_stats_get(l, &st));
    CHECK_EQ_I(st.num_workers, (int64_t)(sysconf(_SC_NPROCESSORS_ONLN) > 1 ? sysconf(_SC_NPROCESSORS_ONLN) - 1 : 0));
    kiln_loader_free(l);
    CHECK_OK(kiln_set_num_threads(threads));
}

int main(void) {
    CHECK_OK(kiln_init());
    kiln_dataset *ds = make_dataset(N, -1, NULL);
    test_identical_across_workers(ds);
    test_order_and_shuffle(ds);
    test_drop_last(ds);
    test_restart_mid_epoch(ds);
    test_options(ds);
    test_shutdown_mid_epoch();
    test_pinned_pool();
    test_worker_error();
    kiln_dataset_free(ds);
    kiln_shutdown();
    return kt_finish();
}

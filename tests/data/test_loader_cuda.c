/* The loader's device paths on cuda:0 — in the emulation build
 * (-DKILN_CUDA_EMULATION=ON), whose streams run asynchronously on their own
 * threads, so a missing ordering between streams gives wrong data.
 * Skipped (exit 77) where cuda:0 does not exist.
 *
 *   - the prefetch path (pinned batches, the copy stream, the event the
 *     consumer's stream waits on, record_stream on the device batches):
 *     exactly the CPU path's batches over several epochs with 0, 1 and 2
 *     workers, shuffling and every random transform, on the default and on
 *     a created consumer stream;
 *   - that this check can fail: with the copy stream held by the
 *     emulator's test hook, a consumer that skips the wait on the copy's
 *     event reads the batch before it lands (wrong data), and with the wait
 *     its work stays queued until the copy has run (right data);
 *   - dataset-on-device mode on cuda:0: the host path's batches, bit for bit. */
#include "loader_epochs.c"

#include "data/loader_internal.h"
#include "runtime/runtime_internal.h"
#ifdef KILN_CUDA_EMULATION
#include "emu/kiln_emu_api.h"
#endif

static const int64_t EPOCHS[] = {0, 1, 3};
enum { N_EPOCHS = 3 };

static void test_prefetch_matches_cpu(kiln_dataset *ds) {
    static le_run ref, got;
    for (int recipe = 0; recipe < 2; recipe++) {
        kiln_loader_opts o = le_opts(recipe);
        le_collect(ds, &o, N_EPOCHS, EPOCHS, &ref);
        for (int workers = 0; workers <= 2; workers++) {
            for (int own_stream = 0; own_stream < 2; own_stream++) {
                if (own_stream && workers != 2) continue;
                o = le_opts(recipe);
                o.device = KILN_CUDA(0);
                o.pin_memory = true;
                o.num_workers = workers;
                o.prefetch_factor = workers == 1 ? 3 : 0;
                kiln_stream *s = NULL;
                kiln_stream_guard g = {0};
                if (own_stream) {
                    CHECK_OK(kiln_stream_create(KILN_CUDA(0), 0, &s));
                    g = kiln_stream_guard_begin(s);
                }
                le_collect(ds, &o, N_EPOCHS, EPOCHS, &got);
                if (own_stream) {
                    kiln_stream_guard_end(&g);
                    kiln_stream_destroy(s);
                }
                CHECK_MSG(
                    le_same(&ref, &got, N_EPOCHS),
                    "recipe %d, %d workers%s: cuda:0 prefetch differs from the CPU path (first float %lld)",
                    recipe, workers, own_stream ? ", own stream" : "",
                    (long long)le_first_diff(&ref, &got, N_EPOCHS));
                CHECK(got.on_device_ok && !got.stats.on_device);
            }
        }
    }
}

static void test_on_device_matches_host(kiln_dataset *ds) {
    static le_run ref, got;
    for (int recipe = 0; recipe < 3; recipe++) {
        kiln_loader_opts o = le_opts(recipe);
        le_collect(ds, &o, N_EPOCHS, EPOCHS, &ref);
        o.device = KILN_CUDA(0);
        o.on_device = KILN_DATA_ON_DEVICE_ON;
        le_collect(ds, &o, N_EPOCHS, EPOCHS, &got);
        CHECK_MSG(le_same(&ref, &got, N_EPOCHS),
                  "recipe %d: dataset on cuda:0 differs from the host path (first float %lld)", recipe,
                  (long long)le_first_diff(&ref, &got, N_EPOCHS));
        CHECK(got.on_device_ok && got.stats.on_device);
        o.on_device = KILN_DATA_ON_DEVICE_AUTO; /* 40 KiB fit in a quarter of the free memory */
        le_collect(ds, &o, 1, EPOCHS, &got);
        CHECK(got.stats.on_device && le_same(&ref, &got, 1));
    }
}

#ifdef KILN_CUDA_EMULATION
/* The first batch of `epoch`, taken while the emulator holds the loader's
 * copy stream; the consumer queues a read of it (x * 1) and the stream is
 * then released. Returns whether the read saw the right batch. */
static bool held_copy_read(kiln_dataset *ds, const float *want, int64_t epoch, bool skip_wait) {
    kiln_loader_opts o = le_opts(0);
    o.device = KILN_CUDA(0);
    o.pin_memory = true;
    kiln_loader *l = NULL;
    CHECK_OK(kiln_loader_create(ds, &o, &l));
    if (!l) return false;
    CHECK_OK(kiln_loader_epoch_begin(l, epoch));
    cudaStream_t copy = (cudaStream_t)kiln_stream_handle(loader_test_copy_stream(l));
    kiln_stream *consumer = kiln_current_stream(KILN_CUDA(0));
    CHECK(kiln_emu_hold_stream(copy, true) == cudaSuccess);
    loader_prefetch_test_skip_wait(skip_wait);
    kiln_tensor *x = NULL, *y = NULL;
    CHECK_OK(kiln_loader_next(l, &x, &y));
    loader_prefetch_test_skip_wait(false);
    kiln_tensor *z = x ? kiln_mul_scalar(x, 1.0) : NULL; /* queued on the consumer stream */
    CHECK(z != NULL);
    if (skip_wait) {
        /* Nothing orders the read after the copy: it runs now. */
        CHECK_OK(kiln_stream_synchronize(consumer));
    } else {
        /* The read waits on the copy's event, which the held stream has not reached. */
        CHECK_MSG(!kiln_stream_query(consumer), "the consumer's read ran while the copy was held");
    }
    CHECK(kiln_emu_hold_stream(copy, false) == cudaSuccess);
    static float got[8 * LE_CHW];
    bool same = false;
    if (z && kiln_numel(z) == 8 * LE_CHW) {
        CHECK_OK(kiln_to_host(z, got, sizeof got));
        same = memcmp(got, want, sizeof got) == 0;
        /* The batch itself is right once the copy has run (without the
         * wait, only the copy stream's own synchronisation says when). */
        CHECK_OK(kiln_stream_synchronize(loader_test_copy_stream(l)));
        static float direct[8 * LE_CHW];
        CHECK_OK(kiln_to_host(x, direct, sizeof direct));
        CHECK(memcmp(direct, want, sizeof direct) == 0);
    }
    kiln_release(z);
    kiln_release(x);
    kiln_release(y);
    kiln_loader_free(l);
    return same;
}

/* Batch 0 of `epoch` is read (x * 1) on the consumer stream while the
 * emulator holds that stream, and released; batch 1 is then copied and the
 * copy stream drained before the stream is let go. Returns whether the read
 * saw batch 0: record_stream must keep batch 0's block from the copy of
 * batch 1. */
static bool held_consumer_read(kiln_dataset *ds, const float *want, int64_t epoch, bool skip_record) {
    kiln_loader_opts o = le_opts(0);
    o.device = KILN_CUDA(0);
    o.pin_memory = true;
    kiln_loader *l = NULL;
    CHECK_OK(kiln_loader_create(ds, &o, &l));
    if (!l) return false;
    CHECK_OK(kiln_loader_epoch_begin(l, epoch));
    kiln_stream *copy = loader_test_copy_stream(l);
    kiln_stream *consumer = kiln_current_stream(KILN_CUDA(0));
    cudaStream_t held = (cudaStream_t)kiln_stream_handle(consumer);
    loader_prefetch_test_skip_record(skip_record);
    kiln_tensor *x = NULL, *y = NULL, *x1 = NULL, *y1 = NULL;
    CHECK_OK(kiln_loader_next(l, &x, &y));
    CHECK(kiln_emu_hold_stream(held, true) == cudaSuccess);
    kiln_tensor *z = x ? kiln_mul_scalar(x, 1.0) : NULL;
    kiln_release(x);
    kiln_release(y);
    CHECK_OK(kiln_loader_next(l, &x1, &y1));
    loader_prefetch_test_skip_record(false);
    CHECK_OK(kiln_stream_synchronize(copy)); /* batch 1 has landed */
    CHECK(kiln_emu_hold_stream(held, false) == cudaSuccess);
    static float got[8 * LE_CHW];
    bool same = false;
    if (z && kiln_numel(z) == 8 * LE_CHW) {
        CHECK_OK(kiln_to_host(z, got, sizeof got));
        same = memcmp(got, want, sizeof got) == 0;
    }
    kiln_release(z);
    kiln_release(x1);
    kiln_release(y1);
    kiln_loader_free(l);
    return same;
}

static void test_missing_record_is_caught(kiln_dataset *ds) {
    static le_run ref;
    const int64_t epochs[2] = {50, 51};
    kiln_loader_opts o = le_opts(0);
    le_collect(ds, &o, 2, epochs, &ref);
    CHECK_MSG(!held_consumer_read(ds, ref.x[0], epochs[0], true),
              "without record_stream the consumer's pending read still saw its batch: the test cannot catch "
              "a missing record_stream");
    CHECK_MSG(held_consumer_read(ds, ref.x[1], epochs[1], false),
              "with record_stream the consumer's pending read saw another batch");
}

static void test_missing_wait_is_caught(kiln_dataset *ds) {
    static le_run ref;
    /* Epochs no other test used, so no cached block holds this batch already. */
    const int64_t epochs[2] = {40, 41};
    kiln_loader_opts o = le_opts(0);
    le_collect(ds, &o, 2, epochs, &ref);
    CHECK_MSG(!held_copy_read(ds, ref.x[0], epochs[0], true),
              "without the wait on the copy's event the consumer still read the right batch: the test "
              "cannot catch a missing wait");
    CHECK_MSG(held_copy_read(ds, ref.x[1], epochs[1], false),
              "with the wait the consumer read a wrong batch");
}
#endif

/* A cuda:0 loader without pin_memory says once, at KILN_LOG=info, that its
 * copies block the host; a second such loader says nothing more. */
static int pageable_lines;
static void count_sink(kiln_log_level level, const char *message, void *user) {
    (void)level, (void)user;
    if (strstr(message, "pin_memory is off")) pageable_lines++;
}

static void test_pageable_copies_said_once(kiln_dataset *ds) {
    kiln_log_level level = kiln_log_get_level();
    kiln_log_set_level(KILN_LOG_INFO);
    kiln_log_set_sink(count_sink, NULL);
    for (int i = 0; i < 2; i++) {
        kiln_loader_opts o = le_opts(2);
        o.device = KILN_CUDA(0);
        o.pin_memory = false;
        kiln_loader *l = NULL;
        CHECK_OK(kiln_loader_create(ds, &o, &l));
        kiln_loader_free(l);
    }
    kiln_log_set_sink(NULL, NULL);
    kiln_log_set_level(level);
    CHECK_MSG(pageable_lines == 1, "the blocking-copy note was logged %d times, want once", pageable_lines);
}

int main(void) {
    CHECK_OK(kiln_init());
    if (!kiln_device_is_available(KILN_CUDA(0))) {
        printf("cuda:0 is not available (%s); configure with -DKILN_CUDA_EMULATION=ON to run these tests on "
               "the emulator\n",
               kiln_device_absent_reason(KILN_DEVICE_CUDA));
        kiln_shutdown();
        kt_skip("no cuda:0");
    }
    /* The default loader delivers to the current device. */
    CHECK(kiln_loader_opts_default().device.type == kiln_current_device().type);
    kiln_device before = kiln_current_device();
    CHECK_OK(kiln_set_device(KILN_CUDA(0)));
    kiln_loader_opts d = kiln_loader_opts_default();
    CHECK_MSG(kiln_device_equal(d.device, KILN_CUDA(0)), "after kiln_set_device(cuda:0) the default loader "
                                                         "device is %d:%d", (int)d.device.type, d.device.index);
    CHECK_OK(kiln_set_device(before));
    kiln_dataset *ds = le_dataset(KILN_U8);
    test_prefetch_matches_cpu(ds);
    test_on_device_matches_host(ds);
    test_pageable_copies_said_once(ds);
#ifdef KILN_CUDA_EMULATION
    test_missing_wait_is_caught(ds);
    test_missing_record_is_caught(ds);
#else
    printf("the held-stream check needs the CUDA emulator's test hook: skipped on a real GPU\n");
#endif
    kiln_dataset_free(ds);
    kiln_shutdown();
    return kt_finish();
}

/* The CUDA runtime on a real GPU: memory, streams, events, copies of every
 * kind, pinned asynchronous copies, the allocator's cross-stream rule.
 * Without a CUDA build or a driver it exits 77 with the reason, so CTest
 * shows it as skipped, never as passed. */
#include "test_util.h"

static void test_memory_and_copies(kiln_device dev) {
    kiln_scope_begin();
    float host[1000];
    for (int i = 0; i < 1000; i++) host[i] = (float)i * 0.5f - 100.0f;
    kiln_tensor *a = kiln_from_data(KILN_SHAPE(10, 100), KILN_F32, dev, host);
    CHECK(a != NULL);
    kiln_tensor *back = kiln_to(a, KILN_CPU, KILN_F32, 0);
    float got[1000];
    CHECK_OK(kiln_to_host(back, got, sizeof got));
    CHECK(memcmp(got, host, sizeof got) == 0);
    /* A strided device view with a dtype change, computed on the device. */
    kiln_tensor *t = kiln_to(kiln_transpose(a, 0, 1), dev, KILN_F16, KILN_COPY);
    kiln_tensor *t_host = kiln_to(t, KILN_CPU, KILN_F32, 0);
    double v;
    CHECK_OK(kiln_item(kiln_narrow(kiln_narrow(t_host, 0, 3, 1), 1, 2, 1), &v));
    CHECK(v == (double)kiln_f16_to_f32(kiln_f32_to_f16(host[2 * 100 + 3])));
    /* Random numbers: the same on the GPU as on the CPU. */
    kiln_manual_seed(7);
    kiln_tensor *r_dev = kiln_to(kiln_rand(KILN_SHAPE(257), KILN_F32, dev), KILN_CPU, KILN_F32, 0);
    kiln_manual_seed(7);
    kiln_tensor *r_cpu = kiln_rand(KILN_SHAPE(257), KILN_F32, KILN_CPU);
    float x[257], y[257];
    CHECK_OK(kiln_to_host(r_dev, x, sizeof x));
    CHECK_OK(kiln_to_host(r_cpu, y, sizeof y));
    CHECK(memcmp(x, y, sizeof x) == 0);
    kiln_scope_end();
}

static void test_streams_events_pinned(kiln_device dev) {
    kiln_scope_begin();
    kiln_stream *side = NULL;
    CHECK_OK(kiln_stream_create(dev, -1, &side));
    kiln_event *start = NULL, *end = NULL;
    CHECK_OK(kiln_event_create(dev, KILN_EVENT_TIMING, &start));
    CHECK_OK(kiln_event_create(dev, KILN_EVENT_TIMING, &end));
    kiln_tensor *pinned = kiln_empty_pinned(KILN_SHAPE(1 << 20), KILN_F32);
    CHECK(pinned && kiln_is_pinned(pinned));
    kiln_stream_guard g = kiln_stream_guard_begin(side);
    CHECK_OK(kiln_event_record(start, side));
    kiln_tensor *d = kiln_to(pinned, dev, KILN_F32, KILN_NON_BLOCKING); /* async on `side` */
    CHECK_OK(kiln_event_record(end, side));
    kiln_stream_guard_end(&g);
    CHECK_OK(kiln_record_stream(d, side));
    CHECK_OK(kiln_stream_wait_stream(kiln_current_stream(dev), side));
    CHECK_OK(kiln_event_synchronize(end));
    float ms = -1;
    CHECK_OK(kiln_event_elapsed_ms(start, end, &ms));
    CHECK(ms >= 0);
    CHECK(kiln_stream_query(side));
    kiln_event_destroy(start);
    kiln_event_destroy(end);
    kiln_scope_end();
    CHECK_OK(kiln_device_synchronize(dev));
    CHECK_OK(kiln_stream_destroy(side));
}

static void test_allocator_limits(kiln_device dev) {
    size_t free_b = 0, total_b = 0;
    CHECK_OK(kiln_device_mem_info(dev, &free_b, &total_b));
    CHECK(total_b > 0 && free_b <= total_b);
    CHECK_OK(kiln_memory_set_limit(dev, (size_t)64 << 20));
    void *p = NULL;
    CHECK_FAILS(kiln_memory_alloc(dev, (size_t)128 << 20, NULL, &p), KILN_ERR_OUT_OF_MEMORY, "out of memory");
    CHECK_OK(kiln_memory_set_limit(dev, 0));
    CHECK_OK(kiln_memory_alloc(dev, (size_t)8 << 20, NULL, &p));
    CHECK_OK(kiln_memory_free(dev, p));
    CHECK_OK(kiln_empty_cache(dev));
    char *s = kiln_memory_summary(dev, true);
    CHECK(s && strstr(s, "cuda:0"));
    free(s);
}

int main(void) {
    if (kiln_init()) return 1;
    if (kiln_device_count(KILN_DEVICE_CUDA) == 0) {
        char why[512];
        snprintf(why, sizeof why, "no CUDA device: %s", kiln_device_absent_reason(KILN_DEVICE_CUDA));
        kiln_shutdown();
        kt_skip(why);
    }
    kiln_device dev = KILN_CUDA(0);
    char name[256];
    CHECK_OK(kiln_device_name(dev, name, sizeof name));
    printf("running on %s\n", name);
    test_memory_and_copies(dev);
    test_streams_events_pinned(dev);
    test_allocator_limits(dev);
    kiln_shutdown();
    return kt_finish();
}

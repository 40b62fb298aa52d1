/* The runtime as users see it: device names and counts, the current
 * device, streams, events, raw device memory and its statistics, pinned
 * memory, and allocator settings (KILN_ALLOC_CONF syntax through
 * kiln_alloc_conf_set, including backend:malloc in a second session). */
#include <stdint.h>

#include "test_util.h"

static void test_devices(void) {
    kiln_device d;
    CHECK_OK(kiln_device_parse("cpu", &d));
    CHECK(d.type == KILN_DEVICE_CPU && d.index == 0);
    CHECK_OK(kiln_device_parse("meta", &d));
    CHECK(d.type == KILN_DEVICE_META);
    CHECK_OK(kiln_device_parse("cpu:0", &d));
    char buf[32];
    CHECK(strcmp(kiln_device_str(KILN_CPU, buf, sizeof buf), "cpu") == 0);
    CHECK(strcmp(kiln_device_str(KILN_META, buf, sizeof buf), "meta") == 0);
    CHECK(strcmp(kiln_device_str(KILN_CUDA(3), buf, sizeof buf), "cuda:3") == 0);
    char tiny[4];
    kiln_device_str(KILN_CUDA(12), tiny, sizeof tiny);
    CHECK(strlen(tiny) == 3); /* truncated, NUL-terminated */

    CHECK_EQ_I(kiln_device_count(KILN_DEVICE_CPU), 1);
    CHECK_EQ_I(kiln_device_count(KILN_DEVICE_META), 1);
    int cuda = kiln_device_count(KILN_DEVICE_CUDA);
    if (cuda == 0) {
        const char *why = kiln_device_absent_reason(KILN_DEVICE_CUDA);
        CHECK(why != NULL && why[0] != '\0');
        printf("cuda: 0 devices (%s)\n", why);
        CHECK_FAILS(kiln_device_parse("cuda", &d), KILN_ERR_DEVICE, "cuda:0 requested");
        CHECK(kiln_device_equal(kiln_default_device(), KILN_CPU));
    }
    CHECK_FAILS(kiln_device_parse("cuda:3", &d), KILN_ERR_DEVICE, "cuda:3 requested");
    CHECK_FAILS(kiln_device_parse("tpu", &d), KILN_ERR_INVALID_ARGUMENT, "tpu");
    CHECK(kiln_device_is_available(KILN_CPU));
    CHECK(kiln_device_is_available(KILN_META));
    CHECK(!kiln_device_is_available(KILN_CUDA(cuda)));
    CHECK(kiln_device_equal(KILN_CPU, KILN_CPU));
    CHECK(!kiln_device_equal(KILN_CPU, KILN_META));
    CHECK(!kiln_device_equal(KILN_CUDA(0), KILN_CUDA(1)));
    CHECK_EQ_I(kiln_device_absent_reason(KILN_DEVICE_CPU)[0], '\0');

    char name[256];
    CHECK_OK(kiln_device_name(KILN_CPU, name, sizeof name));
    CHECK(name[0] != '\0');
    size_t free_b = 0, total_b = 0;
    CHECK_OK(kiln_device_mem_info(KILN_CPU, &free_b, &total_b));
    CHECK(total_b > 0 && free_b <= total_b);
    CHECK_FAILS(kiln_device_mem_info(KILN_CUDA(cuda), &free_b, &total_b), KILN_ERR_DEVICE, "requested");

    /* Current device: per thread, starts at the default. */
    CHECK(kiln_device_equal(kiln_current_device(), kiln_default_device()));
    CHECK_OK(kiln_set_device(KILN_META));
    CHECK(kiln_device_equal(kiln_current_device(), KILN_META));
    CHECK_FAILS(kiln_set_device(KILN_CUDA(cuda + 1)), KILN_ERR_DEVICE, "requested");
    CHECK(kiln_device_equal(kiln_current_device(), KILN_META));
    CHECK_OK(kiln_set_device(KILN_CPU));
    CHECK_OK(kiln_device_synchronize(KILN_CPU));
}

static void test_streams(void) {
    kiln_stream *def = kiln_stream_default(KILN_CPU);
    CHECK(def != NULL);
    CHECK(kiln_current_stream(KILN_CPU) == def);
    CHECK(kiln_device_equal(kiln_stream_device(def), KILN_CPU));
    CHECK_FAILS(kiln_stream_destroy(def), KILN_ERR_STATE, "default stream");

    kiln_stream *s1 = NULL, *s2 = NULL;
    CHECK_OK(kiln_stream_create(KILN_CPU, 0, &s1));
    CHECK_OK(kiln_stream_create(KILN_CPU, -1, &s2));
    CHECK(s1 && s2 && s1 != s2);
    CHECK(kiln_stream_id(s1) != kiln_stream_id(s2) && kiln_stream_id(s1) != kiln_stream_id(def));
    CHECK_EQ_I(kiln_stream_priority(s2), -1);
    CHECK_OK(kiln_set_stream(s1));
    CHECK(kiln_current_stream(KILN_CPU) == s1);
    kiln_stream_guard g = kiln_stream_guard_begin(s2);
    CHECK(kiln_current_stream(KILN_CPU) == s2);
    kiln_stream_guard_end(&g);
    CHECK(kiln_current_stream(KILN_CPU) == s1);
    CHECK_OK(kiln_stream_wait_stream(s1, s2));
    CHECK_OK(kiln_stream_wait_stream(s1, s1));
    CHECK(kiln_stream_query(s1));
    CHECK_OK(kiln_stream_synchronize(s2));
    CHECK_OK(kiln_stream_destroy(s1)); /* the current stream: the default takes over */
    CHECK(kiln_current_stream(KILN_CPU) == def);
    CHECK_OK(kiln_stream_destroy(s2));
    CHECK_OK(kiln_stream_destroy(NULL));
    CHECK(kiln_stream_default(KILN_META) != NULL);
    CHECK(kiln_stream_default(KILN_CUDA(kiln_device_count(KILN_DEVICE_CUDA))) == NULL);
    kiln_stream *bad = (kiln_stream *)1;
    CHECK_FAILS(kiln_stream_create(KILN_CUDA(kiln_device_count(KILN_DEVICE_CUDA)), 0, &bad), KILN_ERR_DEVICE,
                "requested");
    CHECK(bad == NULL);
}

static void test_events(void) {
    kiln_stream *s = kiln_stream_default(KILN_CPU);
    kiln_event *start = NULL, *end = NULL, *plain = NULL;
    CHECK_OK(kiln_event_create(KILN_CPU, KILN_EVENT_TIMING, &start));
    CHECK_OK(kiln_event_create(KILN_CPU, KILN_EVENT_TIMING | KILN_EVENT_BLOCKING_SYNC, &end));
    CHECK_OK(kiln_event_create(KILN_CPU, KILN_EVENT_DEFAULT, &plain));
    CHECK(kiln_event_query(start)); /* never recorded: complete */
    float ms = -1;
    CHECK_FAILS(kiln_event_elapsed_ms(start, end, &ms), KILN_ERR_STATE, "not been recorded");
    CHECK_OK(kiln_event_record(start, s));
    volatile double x = 0;
    for (int i = 0; i < 200000; i++) x += i * 0.5; /* some host work between the events */
    CHECK(x > 0);
    CHECK_OK(kiln_event_record(end, s));
    CHECK_OK(kiln_event_record(plain, s));
    CHECK(kiln_event_query(end));
    CHECK_OK(kiln_event_synchronize(end));
    CHECK_OK(kiln_event_elapsed_ms(start, end, &ms));
    CHECK_MSG(ms >= 0.0f && ms < 10000.0f, "elapsed %g ms", ms);
    CHECK_FAILS(kiln_event_elapsed_ms(start, plain, &ms), KILN_ERR_INVALID_ARGUMENT, "without timing");
    CHECK_OK(kiln_stream_wait_event(s, plain));
    kiln_event *meta_ev = NULL;
    CHECK_OK(kiln_event_create(KILN_META, 0, &meta_ev));
    CHECK_FAILS(kiln_event_record(meta_ev, s), KILN_ERR_INVALID_ARGUMENT, "meta");
    kiln_event_destroy(meta_ev);
    kiln_event_destroy(plain);
    kiln_event_destroy(end);
    kiln_event_destroy(start);
    kiln_event_destroy(NULL);
}

static void test_memory(void) {
    size_t a0 = kiln_memory_allocated(KILN_CPU);
    void *p = NULL, *q = NULL;
    CHECK_OK(kiln_memory_alloc(KILN_CPU, 1000, NULL, &p));
    CHECK(p != NULL);
    memset(p, 0xAB, 1000);                                  /* the block is real, writable memory */
    CHECK_EQ_I(kiln_memory_allocated(KILN_CPU), a0 + 1024); /* 512-byte rounding */
    CHECK(kiln_memory_reserved(KILN_CPU) >= kiln_memory_allocated(KILN_CPU));
    CHECK_OK(kiln_memory_alloc(KILN_CPU, 3u << 20, kiln_stream_default(KILN_CPU), &q));
    kiln_memory_stats st;
    CHECK_OK(kiln_memory_stats_get(KILN_CPU, &st));
    CHECK(st.allocation[KILN_POOL_ALL].current >= 2);
    CHECK(st.allocation[KILN_POOL_SMALL].current >= 1 && st.allocation[KILN_POOL_LARGE].current >= 1);
    CHECK(st.requested_bytes[KILN_POOL_ALL].current >= 1000 + (3 << 20));
    int64_t peak = st.allocated_bytes[KILN_POOL_ALL].peak;
    CHECK_OK(kiln_memory_free(KILN_CPU, q));
    CHECK_OK(kiln_memory_free(KILN_CPU, p));
    CHECK_OK(kiln_memory_free(KILN_CPU, NULL));
    CHECK_EQ_I(kiln_memory_allocated(KILN_CPU), a0);
    CHECK_OK(kiln_memory_stats_get(KILN_CPU, &st));
    CHECK_EQ_I(st.allocated_bytes[KILN_POOL_ALL].peak, peak);
    CHECK_OK(kiln_memory_reset_peak(KILN_CPU));
    CHECK_OK(kiln_memory_stats_get(KILN_CPU, &st));
    CHECK_EQ_I(st.allocated_bytes[KILN_POOL_ALL].peak, st.allocated_bytes[KILN_POOL_ALL].current);
    CHECK_OK(kiln_memory_reset_accumulated(KILN_CPU));
    CHECK_OK(kiln_memory_stats_get(KILN_CPU, &st));
    CHECK_EQ_I(st.allocated_bytes[KILN_POOL_ALL].allocated, 0);
    CHECK(kiln_memory_reserved(KILN_CPU) > 0); /* freed blocks stay cached */
    CHECK_OK(kiln_empty_cache(KILN_CPU));
    CHECK_EQ_I(kiln_memory_reserved(KILN_CPU), kiln_memory_allocated(KILN_CPU));

    /* record_stream on a side stream, then free: fine on the CPU. */
    kiln_stream *side = NULL;
    CHECK_OK(kiln_stream_create(KILN_CPU, 0, &side));
    CHECK_OK(kiln_memory_alloc(KILN_CPU, 4096, NULL, &p));
    CHECK_OK(kiln_memory_record_stream(KILN_CPU, p, side));
    CHECK_OK(kiln_memory_free(KILN_CPU, p));
    CHECK_OK(kiln_stream_destroy(side));
    int local;
    CHECK_FAILS(kiln_memory_free(KILN_CPU, &local), KILN_ERR_INVALID_ARGUMENT, "");
    CHECK_FAILS(kiln_memory_alloc(KILN_CPU, 16, NULL, NULL), KILN_ERR_INVALID_ARGUMENT, "NULL");

    /* meta: addresses without memory; statistics still move. */
    CHECK_OK(kiln_memory_alloc(KILN_META, (size_t)1 << 30, NULL, &p));
    CHECK(kiln_memory_allocated(KILN_META) >= ((size_t)1 << 30));
    CHECK_OK(kiln_memory_free(KILN_META, p));
    CHECK_EQ_I(kiln_memory_allocated(KILN_META), 0);

    char *summary = kiln_memory_summary(KILN_CPU, false);
    CHECK(summary != NULL && strstr(summary, "cpu") != NULL);
    free(summary);
    summary = kiln_memory_summary(KILN_CPU, true);
    CHECK(summary != NULL);
    free(summary);
}

static void test_pinned(void) {
    void *p = NULL;
    CHECK_OK(kiln_pinned_alloc(10000, &p));
    CHECK(p != NULL);
    CHECK(kiln_is_pinned_ptr(p));
    CHECK(kiln_is_pinned_ptr((char *)p + 9999));
    memset(p, 1, 10000);
    int local = 0;
    CHECK(!kiln_is_pinned_ptr(&local));
    CHECK(!kiln_is_pinned_ptr(NULL));
    CHECK_OK(kiln_pinned_free(p));
    CHECK(!kiln_is_pinned_ptr(p));
    CHECK_OK(kiln_pinned_free(NULL));
}

static void test_alloc_conf(void) {
    CHECK_OK(kiln_alloc_conf_set("limit_mb:16"));
    kiln_memory_stats st;
    CHECK_OK(kiln_memory_stats_get(KILN_CPU, &st));
    CHECK_EQ_I(st.limit_bytes, 16u << 20);
    void *p = NULL;
    CHECK_FAILS(kiln_memory_alloc(KILN_CPU, 64u << 20, NULL, &p), KILN_ERR_OUT_OF_MEMORY, "out of memory");
    CHECK(strstr(kiln_error_message(), "cpu") != NULL);
    CHECK(p == NULL);
    CHECK_OK(kiln_memory_stats_get(KILN_CPU, &st));
    CHECK(st.num_ooms >= 1);
    CHECK_OK(kiln_memory_alloc(KILN_CPU, 1u << 20, NULL, &p)); /* under the limit: fine */
    CHECK_OK(kiln_memory_free(KILN_CPU, p));
    CHECK_OK(kiln_alloc_conf_set("limit_mb:0"));
    CHECK_OK(kiln_memory_alloc(KILN_CPU, 64u << 20, NULL, &p));
    CHECK_OK(kiln_memory_free(KILN_CPU, p));
    CHECK_FAILS(kiln_alloc_conf_set("limit_mb:lots"), KILN_ERR_INVALID_ARGUMENT, "limit_mb");
    CHECK_FAILS(kiln_alloc_conf_set("colour:blue"), KILN_ERR_INVALID_ARGUMENT, "colour");
    /* The limit caps what is reserved: a cached 64 MiB segment could still
     * serve 32 MiB, so return the cache first. */
    CHECK_OK(kiln_empty_cache(KILN_CPU));
    CHECK_OK(kiln_memory_set_limit(KILN_CPU, 8u << 20));
    CHECK_FAILS(kiln_memory_alloc(KILN_CPU, 32u << 20, NULL, &p), KILN_ERR_OUT_OF_MEMORY, "cpu");
    CHECK_OK(kiln_memory_set_limit(KILN_CPU, 0));
    CHECK_OK(kiln_memory_set_fraction(KILN_CPU, 1.0));
}

/* backend:malloc shapes allocators created afterwards: a fresh session. */
static void test_malloc_backend(void) {
    kiln_shutdown();
    CHECK_OK(kiln_init());
    CHECK_OK(kiln_alloc_conf_set("backend:malloc"));
    void *p = NULL;
    kiln_memory_stats before, after;
    CHECK_OK(kiln_memory_stats_get(KILN_CPU, &before));
    CHECK_OK(kiln_memory_alloc(KILN_CPU, 1000, NULL, &p));
    CHECK_OK(kiln_memory_free(KILN_CPU, p));
    CHECK_OK(kiln_memory_stats_get(KILN_CPU, &after));
    CHECK_EQ_I(after.num_device_alloc - before.num_device_alloc, 1);
    CHECK_EQ_I(after.num_device_free - before.num_device_free, 1); /* nothing cached */
    CHECK_EQ_I(kiln_memory_reserved(KILN_CPU), 0);
    kiln_tensor *t = kiln_ones(KILN_SHAPE(100), KILN_F32, KILN_CPU);
    double v;
    kiln_tensor *one = kiln_narrow(t, 0, 99, 1);
    CHECK_OK(kiln_item(one, &v));
    CHECK(v == 1.0);
    kiln_release(one);
    kiln_release(t);
    CHECK_EQ_I(kiln_memory_reserved(KILN_CPU), 0);
}

int main(void) {
    if (kiln_init()) {
        fprintf(stderr, "kiln_init: %s\n", kiln_error_message());
        return 1;
    }
    test_devices();
    test_streams();
    test_events();
    test_memory();
    test_pinned();
    test_alloc_conf();
    test_malloc_backend();
    kiln_shutdown();
    return kt_finish();
}

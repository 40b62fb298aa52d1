/* The CUDA backend's asynchronous rules, through Kiln's public API:
 *   - ordering between two streams needs an event (kiln_stream_wait_event);
 *   - the caching allocator's stream rule: a block freed after use on a
 *     second stream (kiln_record_stream) is not reused before that stream's
 *     work has completed;
 *   - pinned asynchronous copies host -> device -> host;
 *   - peer copies cuda:0 <-> cuda:1;
 *   - device memory exhaustion is Kiln's out-of-memory error.
 * In the emulation build (KILN_CUDA_EMULATION) a stream can be held back
 * (kiln_emu_hold_stream), so a missing wait or record_stream gives a wrong
 * answer on every run, and the planted-bug variants check exactly that.
 * On a real GPU nothing holds a stream: the checks of correct code run
 * unchanged (their answer is defined whatever the timing), while a
 * planted bug races for real and only what is defined is checked (the
 * allocator's choice of block, made on the host; every element one of the
 * two racing values). Without a CUDA device: skipped (77). */
#include <stdbool.h>

#include "runtime/runtime_internal.h"
#include "test_util.h"
#ifdef KILN_CUDA_EMULATION
#include "emu/kiln_emu_api.h"
#endif

enum { N = 4099 }; /* odd: not a multiple of any block size */

/* Hold or release `stream`'s work (emulation only; a no-op on a GPU). */
static bool hold(kiln_stream *stream, bool on) {
#ifdef KILN_CUDA_EMULATION
    return kiln_emu_hold_stream((cudaStream_t)kiln_stream_handle(stream), on) == cudaSuccess;
#else
    (void)stream;
    (void)on;
    return false;
#endif
}

/* All elements of a CPU f32 tensor equal to v? */
static bool all_equal(kiln_tensor *host, float v) {
    float *p = (float *)kiln_data_ptr(host);
    for (int64_t i = 0; i < kiln_numel(host); i++)
        if (p[i] != v) return false;
    return true;
}

/* Side stream writes `value` into x; the default stream then copies x to
 * pinned host memory, with or without waiting for the side stream's event.
 * Returns the host copy (after everything has completed). */
static kiln_tensor *race(kiln_device dev, kiln_stream *side, kiln_tensor *x, float value, bool wait) {
    kiln_stream *main_s = kiln_current_stream(dev);
    kiln_tensor *src = kiln_full(KILN_SHAPE(N), value, KILN_F32, dev); /* on the default stream */
    CHECK_OK(kiln_stream_wait_stream(side, main_s));                   /* side may read src */
    bool held = hold(side, true);
    kiln_stream_guard g = kiln_stream_guard_begin(side);
    CHECK_OK(kiln_copy_(x, src, 0)); /* a kernel queued on side */
    kiln_stream_guard_end(&g);
    CHECK_OK(kiln_record_stream(src, side));
    kiln_event *ev = NULL;
    CHECK_OK(kiln_event_create(dev, 0, &ev));
    CHECK_OK(kiln_event_record(ev, side));
    if (wait) CHECK_OK(kiln_stream_wait_event(main_s, ev));
    kiln_tensor *out = kiln_to(x, KILN_CPU, KILN_F32, KILN_NON_BLOCKING); /* async, on the default stream */
    CHECK(out != NULL && kiln_is_pinned(out));
    if (held && !wait) CHECK_OK(kiln_stream_synchronize(main_s)); /* the read completes while side is held */
    if (held) hold(side, false);
    CHECK_OK(kiln_stream_synchronize(main_s));
    CHECK_OK(kiln_stream_synchronize(side));
    kiln_event_destroy(ev);
    kiln_release(src);
    return out;
}

static void test_wait_event(kiln_device dev) {
    kiln_scope_begin();
    kiln_stream *side = NULL;
    CHECK_OK(kiln_stream_create(dev, 0, &side));
    kiln_tensor *x = kiln_zeros(KILN_SHAPE(N), KILN_F32, dev);
    CHECK_OK(kiln_record_stream(x, side));
    /* With the event wait: the read sees the side stream's write. */
    kiln_tensor *seen = race(dev, side, x, 7.0f, true);
    CHECK_MSG(all_equal(seen, 7.0f), "with wait_event the default stream must see the side stream's write");
#ifdef KILN_CUDA_EMULATION
    /* Planted bug: no wait. The side stream is held, so the default stream
     * reads the old values on every run. */
    for (int run = 0; run < 3; run++) {
        kiln_tensor *stale = race(dev, side, x, 9.0f + (float)run, false);
        CHECK_MSG(all_equal(stale, run == 0 ? 7.0f : 8.0f + (float)run),
                  "without wait_event the read must be stale (run %d)", run);
    }
#endif
    kiln_scope_end();
    CHECK_OK(kiln_device_synchronize(dev));
    CHECK_OK(kiln_stream_destroy(side));
}

/* Elements of a CPU f32 tensor equal to v; -1 when one equals neither v nor
 * other (or the copy failed). */
static int64_t count_equal(kiln_tensor *host, float v, float other) {
    if (!host) return -1;
    const float *p = (const float *)kiln_data_ptr(host);
    int64_t n = 0;
    for (int64_t i = 0; i < kiln_numel(host); i++) {
        if (p[i] == v)
            n++;
        else if (p[i] != other)
            return -1;
    }
    return n;
}

/* The allocator's stream rule. Tensor a (allocated on the default stream)
 * is overwritten on a held side stream, then released. With record_stream,
 * the next allocation of the same size must not get a's block while the
 * side stream's write is pending; without it (planted bug), it does, and
 * the late write clobbers the new tensor. On a real GPU (no hold) the
 * planted bug's race has no defined outcome: b's block is a's all the same
 * (the allocator decides on the host), and each element of b ends as the
 * fill's 3 or the side stream's 5, in whatever mix the timing gave. */
static void test_allocator_stream_rule(kiln_device dev) {
    kiln_scope_begin();
    kiln_stream *side = NULL;
    CHECK_OK(kiln_stream_create(dev, 0, &side));
    kiln_stream *main_s = kiln_current_stream(dev);
    kiln_tensor *five = kiln_full(KILN_SHAPE(N), 5.0, KILN_F32, dev);
    for (int record = 1; record >= 0; record--) {
        kiln_tensor *a = kiln_zeros(KILN_SHAPE(N), KILN_F32, dev);
        void *a_ptr = kiln_data_ptr(a);
        CHECK_OK(kiln_stream_wait_stream(side, main_s));
        bool held = hold(side, true);
        kiln_stream_guard g = kiln_stream_guard_begin(side);
        CHECK_OK(kiln_copy_(a, five, 0)); /* pending on side */
        kiln_stream_guard_end(&g);
        if (record) CHECK_OK(kiln_record_stream(a, side));
        CHECK_OK(kiln_record_stream(five, side));
        CHECK_OK(kiln_release(a));
        kiln_tensor *b = kiln_full(KILN_SHAPE(N), 3.0, KILN_F32, dev); /* same size, default stream */
        void *b_ptr = kiln_data_ptr(b);
        if (record)
            CHECK_MSG(b_ptr != a_ptr, "a block with a pending side-stream event was reused");
        else
            CHECK_MSG(b_ptr == a_ptr, "without record_stream the freed block is reused at once");
        kiln_tensor *b_host = kiln_to(b, KILN_CPU, KILN_F32, 0);
        /* Defined with record_stream (b has its own block) or with the side
         * stream held (its write cannot land yet). */
        if (record || held)
            CHECK_MSG(b_host && all_equal(b_host, 3.0f), "b does not read back its fill of 3");
        else
            CHECK_MSG(count_equal(b_host, 5.0f, 3.0f) >= 0, "b reads back a value that is neither 3 nor 5");
        if (held) hold(side, false);
        CHECK_OK(kiln_stream_synchronize(side));
        kiln_tensor *b_after = kiln_to(b, KILN_CPU, KILN_F32, 0);
        if (record) {
            CHECK_MSG(b_after && all_equal(b_after, 3.0f),
                      "the side stream's late write clobbered a new tensor");
        } else if (held) {
            /* The planted bug shows: same block, clobbered by the late write. */
            CHECK_MSG(b_after && all_equal(b_after, 5.0f), "without record_stream the late write lands in b");
        } else {
            /* A real race: only the values' set is defined. */
            int64_t fives = count_equal(b_after, 5.0f, 3.0f);
            CHECK_MSG(fives >= 0,
                      "without record_stream b holds a value that is neither the fill's 3 nor the "
                      "side stream's 5");
            printf("without record_stream (real race, no hold): %lld of %d elements of b took the side "
                   "stream's write\n",
                   (long long)fives, N);
        }
        if (record) {
            /* Once the side stream's work is done, the block comes back (b
             * still holds the other block of this size). */
            kiln_tensor *c = kiln_zeros(KILN_SHAPE(N), KILN_F32, dev);
            CHECK_MSG(c && kiln_data_ptr(c) == a_ptr, "the block is reused after its event completed");
            kiln_release(c);
        }
        kiln_release(b);
    }
    kiln_scope_end();
    CHECK_OK(kiln_device_synchronize(dev));
    CHECK_OK(kiln_stream_destroy(side));
}

/* Pinned host -> device -> host, asynchronous on a side stream. While the
 * stream is held, the copy has not run: changing the pinned source before
 * releasing it changes what arrives (the copy really is asynchronous). */
static void test_pinned_async(kiln_device dev) {
    kiln_scope_begin();
    kiln_stream *side = NULL;
    CHECK_OK(kiln_stream_create(dev, -1, &side));
    kiln_tensor *pinned = kiln_empty_pinned(KILN_SHAPE(N), KILN_F32);
    CHECK(pinned && kiln_is_pinned(pinned));
    float *p = (float *)kiln_data_ptr(pinned);
    for (int i = 0; i < N; i++) p[i] = (float)((i * 37) % 101) - 50.0f;
    bool held = hold(side, true);
    kiln_stream_guard g = kiln_stream_guard_begin(side);
    kiln_tensor *d = kiln_to(pinned, dev, KILN_F32, KILN_NON_BLOCKING);
    CHECK(d != NULL);
    if (held) {
        CHECK(!kiln_stream_query(side));
        p[0] = 1234.0f; /* before the copy runs */
    }
    kiln_tensor *back = kiln_to(d, KILN_CPU, KILN_F32, KILN_NON_BLOCKING);
    kiln_stream_guard_end(&g);
    CHECK(back && kiln_is_pinned(back));
    CHECK_OK(kiln_record_stream(d, side));
    if (held) hold(side, false);
    CHECK_OK(kiln_stream_synchronize(side));
    CHECK(kiln_stream_query(side));
    float *q = (float *)kiln_data_ptr(back);
    int bad = 0;
    for (int i = 0; i < N; i++)
        if (q[i] != p[i]) bad++;
    CHECK_MSG(bad == 0, "%d of %d elements differ after pinned H2D + D2H", bad, N);
    if (held) CHECK(q[0] == 1234.0f);
    kiln_scope_end();
    CHECK_OK(kiln_stream_destroy(side));
}

/* cuda:0 -> cuda:1 -> cuda:0, contiguous and strided, with a dtype change. */
static void test_peer_copies(void) {
    if (kiln_device_count(KILN_DEVICE_CUDA) < 2) {
        printf("peer copies: skipped (one CUDA device)\n");
        return;
    }
    kiln_scope_begin();
    static float host[3 * 1001];
    for (int i = 0; i < 3 * 1001; i++) host[i] = (float)i * 0.25f - 300.0f;
    kiln_tensor *a0 = kiln_from_data(KILN_SHAPE(3, 1001), KILN_F32, KILN_CUDA(0), host);
    kiln_tensor *a1 = kiln_to(a0, KILN_CUDA(1), KILN_F32, 0);
    CHECK(a1 && kiln_get_device(a1).index == 1);
    kiln_tensor *back = kiln_to(a1, KILN_CUDA(0), KILN_F32, 0);
    float got[3 * 1001];
    CHECK_OK(kiln_to_host(back, got, sizeof got));
    CHECK(memcmp(got, host, sizeof got) == 0);
    /* Strided source and a conversion: staged on the device, then copied. */
    kiln_tensor *t1 = kiln_to(kiln_transpose(a0, 0, 1), KILN_CUDA(1), KILN_F64, KILN_COPY);
    CHECK(t1 != NULL);
    double v = 0;
    CHECK_OK(kiln_item(kiln_narrow(kiln_narrow(t1, 0, 500, 1), 1, 2, 1), &v));
    CHECK(v == (double)host[2 * 1001 + 500]);
    /* Asynchronous peer copy into an existing tensor. */
    kiln_tensor *z0 = kiln_zeros(KILN_SHAPE(3, 1001), KILN_F32, KILN_CUDA(0));
    CHECK_OK(kiln_copy_(z0, a1, KILN_NON_BLOCKING));
    CHECK_OK(kiln_to_host(z0, got, sizeof got));
    CHECK(memcmp(got, host, sizeof got) == 0);
    kiln_scope_end();
    CHECK_OK(kiln_device_synchronize(KILN_CUDA(0)));
    CHECK_OK(kiln_device_synchronize(KILN_CUDA(1)));
}

/* The emulated device has KILN_CUDA_EMU_MEMORY bytes (set in main). */
static void test_out_of_memory(kiln_device dev) {
#ifdef KILN_CUDA_EMULATION
    size_t free_b = 0, total_b = 0;
    CHECK_OK(kiln_device_mem_info(dev, &free_b, &total_b));
    CHECK_EQ_I(total_b, (size_t)256 << 20);
    void *p = NULL;
    CHECK_FAILS(kiln_memory_alloc(dev, (size_t)300 << 20, NULL, &p), KILN_ERR_OUT_OF_MEMORY, "out of memory");
    kiln_error_clear();
    kiln_tensor *big = kiln_empty(KILN_SHAPE(100, 1 << 20), KILN_F32, dev); /* 400 MiB */
    CHECK(big == NULL && kiln_error_last()->status == KILN_ERR_OUT_OF_MEMORY);
    CHECK_OK(kiln_memory_alloc(dev, (size_t)100 << 20, NULL, &p));
    CHECK_OK(kiln_memory_free(dev, p));
    CHECK_OK(kiln_empty_cache(dev));
#else
    (void)dev;
#endif
}

int main(void) {
#ifdef KILN_CUDA_EMULATION
    setenv("KILN_CUDA_EMU_MEMORY", "256MiB", 1);
#endif
    if (kiln_init()) return 1;
    if (kiln_device_count(KILN_DEVICE_CUDA) == 0) {
        char why[512];
        snprintf(why, sizeof why, "no CUDA device: %s", kiln_device_absent_reason(KILN_DEVICE_CUDA));
        kiln_shutdown();
        kt_skip(why);
    }
    kiln_device dev = KILN_CUDA(0);
    test_wait_event(dev);
    test_allocator_stream_rule(dev);
    test_pinned_async(dev);
    test_peer_copies();
    test_out_of_memory(dev);
    kiln_shutdown();
    return kt_finish();
}

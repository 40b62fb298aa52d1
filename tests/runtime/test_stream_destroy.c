/* Destroying a stream that a live block's use was recorded on
 * (kiln_record_stream): the stream is synchronised, the allocators forget
 * it, and freeing the block later records no event on the destroyed
 * stream (under ASan a use of the freed stream record is an error). For a
 * pinned CPU tensor here, and for a cuda:0 tensor where cuda:0 exists. */
#include "kiln/kiln.h"
#include "test_util.h"

static void check_device(kiln_device dev, bool pinned) {
    kiln_stream *s = NULL;
    CHECK_OK(kiln_stream_create(dev, 0, &s));
    if (!s) return;
    kiln_tensor *t = pinned ? kiln_empty_pinned(KILN_SHAPE(1024), KILN_F32) : kiln_zeros(KILN_SHAPE(1024), KILN_F32, dev);
    CHECK(t != NULL);
    CHECK_OK(kiln_record_stream(t, s));
    CHECK_OK(kiln_stream_destroy(s));
    kiln_release(t); /* must not touch the destroyed stream */
    /* The block is reusable at once: nothing is pending on a dead stream. */
    kiln_tensor *u = pinned ? kiln_empty_pinned(KILN_SHAPE(1024), KILN_F32) : kiln_zeros(KILN_SHAPE(1024), KILN_F32, dev);
    CHECK(u != NULL);
    kiln_release(u);
}

int main(void) {
    CHECK_OK(kiln_init());
    check_device(KILN_CPU, true);
    check_device(KILN_CPU, false);
    if (kiln_device_is_available(KILN_CUDA(0))) {
        check_device(KILN_CUDA(0), true);
        check_device(KILN_CUDA(0), false);
    } else {
        printf("no cuda:0: pinned and CPU tensors only\n");
    }
    kiln_shutdown();
    return kt_finish();
}

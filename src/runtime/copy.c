/* Byte copies between devices: picks the copy kind and decides whether a
 * copy may stay asynchronous. The rule is CUDA's: a host<->device copy is
 * asynchronous only when the host side is pinned; otherwise the host waits
 * for it (that is what makes reusing a pageable buffer safe). */
#include "base/error.h"
#include "runtime/counters.h"
#include "runtime/runtime_internal.h"

/* A host<->device copy: counted (bytes each way, pageable or pinned) and,
 * when it is blocking, a host synchronisation. */
static kiln_status host_device_copy(const kiln_backend *be, kiln_copy_kind kind, int index, void *dst,
                                    const void *src, size_t bytes, void *stream, bool non_blocking) {
    const void *host = kind == KILN_COPY_H2D ? src : dst;
    bool pinned = kiln_is_pinned_ptr(host);
    bool async = non_blocking && pinned;
    kiln_counter_add(kind == KILN_COPY_H2D ? KILN_COUNTER_BYTES_H2D : KILN_COUNTER_BYTES_D2H, bytes);
    if (!pinned) kiln_counter_add(KILN_COUNTER_PAGEABLE_COPIES, 1);
    if (async) return be->copy(kind, index, index, dst, src, bytes, stream, true);
    uint64_t t0 = kiln_sync_enter();
    kiln_status st = be->copy(kind, index, index, dst, src, bytes, stream, false);
    kiln_sync_leave(kind == KILN_COPY_H2D ? "blocking copy H2D" : "blocking copy D2H", t0);
    return st;
}

kiln_status kiln_runtime_copy(kiln_device dst_device, void *dst, kiln_device src_device, const void *src,
                              size_t bytes, kiln_stream *stream, bool non_blocking) {
    if (bytes == 0) return KILN_OK;
    if (dst_device.type == KILN_DEVICE_META || src_device.type == KILN_DEVICE_META) {
        if (dst_device.type != KILN_DEVICE_META) {
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "meta tensors have no data; create the tensor on a real device",
                              "cannot copy data out of a meta tensor");
        }
        return KILN_OK;
    }
    bool src_host = src_device.type == KILN_DEVICE_CPU, dst_host = dst_device.type == KILN_DEVICE_CPU;
    kiln_device dev = dst_host ? src_device : dst_device; /* the device side (CPU when both are) */
    const kiln_backend *be = kiln_backend_for(dev);
    if (!be) return kiln_error_last()->status;
    if (!stream) stream = kiln_current_stream(dev);
    if (!stream) return kiln_error_last()->status;
    kiln_device sdev = kiln_stream_device(stream);
    if (!kiln_device_equal(sdev, dev)) {
        char a[32], b[32];
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass a stream of the device side of the copy, or NULL",
                          "copy: the stream is on %s but the copy runs on %s", kiln_device_str(sdev, a, sizeof a),
                          kiln_device_str(dev, b, sizeof b));
    }
    void *h = kiln_stream_handle(stream);
    if (src_host && dst_host) return be->copy(KILN_COPY_H2H, 0, 0, dst, src, bytes, h, false);
    if (src_host) return host_device_copy(be, KILN_COPY_H2D, dev.index, dst, src, bytes, h, non_blocking);
    if (dst_host) return host_device_copy(be, KILN_COPY_D2H, dev.index, dst, src, bytes, h, non_blocking);
    if (src_device.type != dst_device.type) {
        char a[32], b[32];
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "copy through the cpu device",
                          "no direct copy from %s to %s", kiln_device_str(src_device, a, sizeof a),
                          kiln_device_str(dst_device, b, sizeof b));
    }
    /* Device to device copies are ordered on the destination's stream and
     * never need the host to wait. */
    if (src_device.index == dst_device.index)
        return be->copy(KILN_COPY_D2D, src_device.index, dst_device.index, dst, src, bytes, h, true);
    /* A peer copy also reads the source device's memory: it waits for the
     * work queued so far on the source's current stream (which may still
     * be writing the source), and that stream's later work waits for the
     * copy (which may still be reading it when the source is overwritten or
     * freed), as PyTorch does. */
    kiln_stream *src_stream = kiln_current_stream(src_device);
    if (!src_stream) return kiln_error_last()->status;
    KILN_TRY(kiln_stream_wait_stream(stream, src_stream));
    KILN_TRY(be->copy(KILN_COPY_PEER, src_device.index, dst_device.index, dst, src, bytes, h, true));
    return kiln_stream_wait_stream(src_stream, stream);
}

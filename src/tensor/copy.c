/* Copies: kiln_copy_ (elementwise, converting, broadcasting), kiln_to,
 * host reads (kiln_to_host, kiln_item) and kiln_record_stream.
 *
 * Within one device the device's copy_strided kernel does everything
 * (dtype conversion, strides, broadcast). Across devices the bytes move
 * once through kiln_runtime_copy: the source is first made contiguous on
 * its own device if it is not, the bytes land either directly in dst (same
 * dtype, contiguous, same shape) or in a contiguous landing buffer on dst's
 * device, from which dst's kernel converts and scatters. */
#include <string.h>

#include "base/error.h"
#include "runtime/counters.h"
#include "runtime/runtime_internal.h"
#include "tensor/scope.h"
#include "tensor/tensor_internal.h"

#define SHAPE_TEXT 160

static kiln_status kernel_copy(kiln_device device, const kiln_strided *dst, const kiln_strided *src) {
    const kiln_tensor_kernels *k = kiln_tensor_kernels_for(device.type);
    if (!k) return KILN_RAISE(KILN_ERR_UNSUPPORTED, NULL, "copy: no tensor kernels for this device type");
    void *stream;
    KILN_TRY(kiln_tensor_kernel_stream(device, &stream));
    return k->copy_strided(dst, src, stream);
}

/* A contiguous copy of t on t's device, t's dtype and shape. */
static kiln_tensor *clone_contiguous(const kiln_tensor *t) {
    kiln_tensor *c = kiln_tensor_alloc("kiln_copy_", kiln_shape_of(t), t->dtype, t->storage->device, false);
    if (!c) return NULL;
    kiln_strided d, s;
    if (kiln_tensor_strided(c, &d) || kiln_tensor_strided(t, &s) ||
        (kiln_numel(t) && kiln_get_device(t).type != KILN_DEVICE_META &&
         kernel_copy(kiln_get_device(t), &d, &s))) {
        kiln_tensor_drop(c);
        return NULL;
    }
    return c;
}

static bool same_shape(const kiln_tensor *a, const kiln_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

/* src's strides over dst's shape: missing leading dims and size-1 dims
 * that dst widens get stride 0. False when src does not broadcast. src
 * is strided already (copy_impl converts both sides first). */
static bool broadcast_src(const kiln_tensor *dst, const kiln_tensor *src, kiln_strided *out) {
    if (src->ndim > dst->ndim) return false;
    KILN_ASSERT(src->storage->layout == KILN_LAYOUT_STRIDED);
    *out = kiln_tensor_kernel_view(src);
    out->ndim = dst->ndim;
    int lead = dst->ndim - src->ndim;
    for (int i = dst->ndim - 1; i >= 0; i--) {
        int64_t have = i >= lead ? src->shape[i - lead] : 1;
        int64_t stride = i >= lead ? src->strides[i - lead] : 0;
        if (have != dst->shape[i] && have != 1) return false;
        out->shape[i] = dst->shape[i];
        out->strides[i] = have == dst->shape[i] ? stride : 0;
    }
    return true;
}

/* A destination whose dims of size > 1 have stride 0 would have several
 * elements written to one address, in an unspecified order. */
static bool dst_overlaps_itself(const kiln_tensor *dst) {
    for (int i = 0; i < dst->ndim; i++)
        if (dst->shape[i] > 1 && dst->strides[i] == 0) return true;
    return false;
}

static bool same_view(const kiln_tensor *a, const kiln_tensor *b) {
    if (a->storage != b->storage || a->dtype != b->dtype || a->offset != b->offset || !same_shape(a, b))
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] > 1 && a->strides[i] != b->strides[i]) return false;
    return true;
}

static kiln_status same_device_copy(kiln_tensor *dst, const kiln_tensor *src) {
    if (same_view(dst, src)) return KILN_OK;
    kiln_tensor *tmp = NULL;
    if (dst->storage == src->storage) {
        /* Overlapping views would read elements already overwritten: copy
         * the source out first. */
        tmp = clone_contiguous(src);
        if (!tmp) return kiln_error_last()->status;
        src = tmp;
    }
    kiln_strided d, s;
    kiln_status st = kiln_tensor_strided(dst, &d);
    if (!st) {
        KILN_ASSERT(broadcast_src(dst, src, &s));
        st = kernel_copy(kiln_get_device(dst), &d, &s);
    }
    kiln_tensor_drop(tmp);
    return st;
}

/* After an asynchronous copy whose host side is pinned, the pinned block
 * must not be reused before the copy has run: record the device side's
 * stream on it (PyTorch's CachingHostAllocator does the same). */
static kiln_status protect_pinned(const kiln_tensor *host, kiln_device device_side) {
    if (!host->storage->pinned || !host->storage->base) return KILN_OK;
    kiln_stream *s = kiln_current_stream(device_side);
    if (!s) return kiln_error_last()->status;
    return kiln_caching_allocator_record_stream(kiln_pinned_allocator(), host->storage->base,
                                                (kiln_alloc_stream)s);
}

static kiln_status cross_device_copy(kiln_tensor *dst, const kiln_tensor *src, bool non_blocking) {
    kiln_device dd = kiln_get_device(dst), sd = kiln_get_device(src);
    kiln_tensor *staged = NULL, *landing = NULL;
    kiln_status st = KILN_OK;
    if (!kiln_is_contiguous(src)) {
        staged = clone_contiguous(src);
        if (!staged) return kiln_error_last()->status;
        src = staged;
    }
    bool direct = dst->dtype == src->dtype && kiln_is_contiguous(dst) && same_shape(dst, src);
    if (!direct) {
        landing = kiln_tensor_alloc("kiln_copy_", kiln_shape_of(src), src->dtype, dd, false);
        if (!landing) st = kiln_error_last()->status;
        /* A host-side conversion reads the landing buffer at once. */
        if (dd.type == KILN_DEVICE_CPU) non_blocking = false;
    }
    kiln_tensor *target = direct ? dst : landing;
    if (!st) {
        size_t bytes = (size_t)kiln_numel(src) * kiln_dtype_size(src->dtype);
        st = kiln_runtime_copy(dd, kiln_data_ptr(target), sd, kiln_data_ptr(src), bytes, NULL, non_blocking);
    }
    if (!st && non_blocking) {
        if (sd.type == KILN_DEVICE_CPU)
            st = protect_pinned(src, dd);
        else if (dd.type == KILN_DEVICE_CPU)
            st = protect_pinned(target, sd);
    }
    kiln_strided d, s;
    if (!st && !direct) st = kiln_tensor_strided(dst, &d);
    if (!st && !direct) {
        KILN_ASSERT(broadcast_src(dst, landing, &s));
        st = kernel_copy(dd, &d, &s);
    }
    kiln_tensor_drop(landing);
    kiln_tensor_drop(staged);
    return st;
}

static kiln_status copy_impl(kiln_tensor *dst, const kiln_tensor *src, unsigned flags) {
    KILN_TRY(kiln_tensor_check(dst, "kiln_copy_ (dst)"));
    KILN_TRY(kiln_tensor_check(src, "kiln_copy_ (src)"));
    KILN_TRY(kiln_tensor_ensure_strided(dst));
    KILN_TRY(kiln_tensor_ensure_strided(src));
    char a[SHAPE_TEXT], b[SHAPE_TEXT];
    kiln_strided probe;
    if (!broadcast_src(dst, src, &probe))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                          "give dst the source's shape, or a source that broadcasts to it (see kiln_expand)",
                          "kiln_copy_: cannot copy a tensor of shape %s into a tensor of shape %s",
                          kiln_shape_format(src->ndim, src->shape, a, sizeof a),
                          kiln_shape_format(dst->ndim, dst->shape, b, sizeof b));
    if (dst_overlaps_itself(dst))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "copy into a kiln_contiguous tensor instead",
                          "kiln_copy_: dst of shape %s with strides %s has several elements at one address "
                          "(an expanded tensor cannot be written)",
                          kiln_shape_format(dst->ndim, dst->shape, a, sizeof a),
                          kiln_shape_format(dst->ndim, dst->strides, b, sizeof b));
    kiln_device dd = kiln_get_device(dst), sd = kiln_get_device(src);
    if (sd.type == KILN_DEVICE_META && dd.type != KILN_DEVICE_META)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                          "create the source on a real device (meta is for shapes only)",
                          "kiln_copy_: meta tensors have no data: cannot copy a meta tensor into a %s tensor",
                          kiln_device_str(dd, a, sizeof a));
    kiln_status st = KILN_OK;
    if (dd.type != KILN_DEVICE_META && kiln_numel(dst) > 0) {
        if (kiln_device_equal(dd, sd))
            st = same_device_copy(dst, src);
        else
            st = cross_device_copy(dst, src, (flags & KILN_NON_BLOCKING) != 0);
    }
    if (!st) kiln_tensor_bump_version(dst);
    return st;
}

kiln_status kiln_copy_(kiln_tensor *dst, const kiln_tensor *src, unsigned flags) {
    kiln_api_enter();
    kiln_status st = copy_impl(dst, src, flags);
    kiln_api_leave();
    return st;
}

static kiln_tensor *to_impl(kiln_tensor *t, kiln_device device, kiln_dtype dtype, unsigned flags) {
    if (kiln_tensor_check(t, "kiln_to")) return NULL;
    if (!kiln_backend_for(device)) return NULL;
    if (kiln_device_equal(device, kiln_get_device(t)) && dtype == t->dtype && !(flags & KILN_COPY))
        return kiln_retain(t);
    /* As PyTorch: a non-blocking copy from a device to the CPU lands in
     * pinned memory, or it could not be asynchronous. */
    bool pinned = (flags & KILN_NON_BLOCKING) && device.type == KILN_DEVICE_CPU &&
                  kiln_get_device(t).type == KILN_DEVICE_CUDA;
    kiln_tensor *out = kiln_tensor_alloc("kiln_to", kiln_shape_of(t), dtype, device, pinned);
    if (!out) return NULL;
    if (copy_impl(out, t, flags)) {
        kiln_tensor_drop(out);
        return NULL;
    }
    /* Differentiable, as PyTorch's .to(): the gradient returns to t's
     * device and dtype (a model split across devices backpropagates). */
    return kiln_tensor_recorded_copy(t, out);
}

kiln_tensor *kiln_to(kiln_tensor *t, kiln_device device, kiln_dtype dtype, unsigned flags) {
    kiln_api_enter();
    return kiln_api_return(to_impl(t, device, dtype, flags));
}

static kiln_status to_host_impl(const kiln_tensor *t, void *dst, size_t size) {
    KILN_TRY(kiln_tensor_check(t, "kiln_to_host"));
    KILN_TRY(kiln_tensor_ensure_strided(t));
    char a[SHAPE_TEXT];
    size_t want = (size_t)kiln_numel(t) * kiln_dtype_size(t->dtype);
    if (size != want)
        return KILN_RAISE(
            KILN_ERR_INVALID_ARGUMENT, "pass a buffer of numel * dtype size bytes",
            "kiln_to_host: buffer of %zu bytes given for a %s tensor of shape %s, which needs %zu bytes",
            size, kiln_dtype_name(t->dtype), kiln_shape_format(t->ndim, t->shape, a, sizeof a), want);
    if (want == 0) return KILN_OK;
    if (!dst) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_to_host: dst is NULL");
    kiln_device dev = kiln_get_device(t);
    if (dev.type == KILN_DEVICE_META)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                          "create the tensor on a real device (meta is for shapes only)",
                          "kiln_to_host: meta tensors have no data (shape %s)",
                          kiln_shape_format(t->ndim, t->shape, a, sizeof a));
    if (dev.type == KILN_DEVICE_CPU) {
        /* dst as a contiguous tensor of t's shape; the kernel gathers. */
        kiln_strided s;
        KILN_TRY(kiln_tensor_strided(t, &s));
        kiln_strided d = s;
        d.data = dst;
        kiln_contiguous_strides(t->ndim, t->shape, d.strides);
        return kernel_copy(dev, &d, &s);
    }
    kiln_tensor *staged = NULL;
    if (!kiln_is_contiguous(t)) {
        staged = clone_contiguous(t);
        if (!staged) return kiln_error_last()->status;
        t = staged;
    }
    kiln_status st = kiln_runtime_copy(KILN_CPU, dst, dev, kiln_data_ptr(t), want, NULL, false);
    kiln_tensor_drop(staged);
    return st;
}

/* The one element of t into dst (size bytes). From a device with streams
 * the value travels through a small pinned block from the pinned caching
 * allocator: a non-blocking copy on the current stream, then one stream
 * synchronisation — the step's one host sync, and no pageable copy (the
 * efficiency counters' steady state). */
static kiln_status item_bytes(const kiln_tensor *t, void *dst, size_t size) {
    kiln_device dev = kiln_get_device(t);
    if (dev.type == KILN_DEVICE_CPU || dev.type == KILN_DEVICE_META) return to_host_impl(t, dst, size);
    kiln_stream *stream = kiln_current_stream(dev);
    if (!stream) return kiln_error_last()->status;
    void *pin = NULL;
    KILN_TRY(kiln_pinned_alloc(16, &pin));
    kiln_status st = kiln_runtime_copy(KILN_CPU, pin, dev, kiln_data_ptr(t), size, stream, true);
    if (!st) st = kiln_stream_synchronize(stream);
    if (!st) memcpy(dst, pin, size);
    kiln_status fst = kiln_pinned_free(pin);
    return st ? st : fst;
}

kiln_status kiln_to_host(const kiln_tensor *t, void *dst, size_t size) {
    kiln_api_enter();
    kiln_status st = to_host_impl(t, dst, size);
    kiln_api_leave();
    return st;
}

static kiln_status item_impl(const kiln_tensor *t, double *out) {
    KILN_TRY(kiln_tensor_check(t, "kiln_item"));
    if (!out) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_item: out is NULL");
    if (kiln_numel(t) != 1) {
        char a[SHAPE_TEXT];
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use kiln_to_host to read several elements",
                          "kiln_item: a tensor of shape %s has %lld elements; kiln_item needs exactly one",
                          kiln_shape_format(t->ndim, t->shape, a, sizeof a), (long long)kiln_numel(t));
    }
    union {
        float f32;
        uint16_t half;
        double f64;
        int32_t i32;
        int64_t i64;
        uint8_t u8;
    } v;
    KILN_TRY(item_bytes(t, &v, kiln_dtype_size(t->dtype)));
    switch (t->dtype) {
    case KILN_F32:
        *out = v.f32;
        break;
    case KILN_F16:
        *out = kiln_f16_to_f32(v.half);
        break;
    case KILN_BF16:
        *out = kiln_bf16_to_f32(v.half);
        break;
    case KILN_F64:
        *out = v.f64;
        break;
    case KILN_I32:
        *out = v.i32;
        break;
    case KILN_I64:
        *out = (double)v.i64;
        break;
    case KILN_U8:
        *out = v.u8;
        break;
    case KILN_BOOL:
        *out = v.u8 != 0;
        break;
    default:
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "kiln_item: invalid dtype %d", (int)t->dtype);
    }
    return KILN_OK;
}

kiln_status kiln_item(const kiln_tensor *t, double *out) {
    kiln_api_enter();
    /* Reading a value always waits for the device: one host sync, even on
     * the CPU device (where the wait is free), so counts agree across devices. */
    uint64_t t0 = kiln_sync_enter();
    kiln_status st = item_impl(t, out);
    kiln_sync_leave("kiln_item", t0);
    kiln_api_leave();
    return st;
}

kiln_status kiln_record_stream(kiln_tensor *t, kiln_stream *stream) {
    KILN_TRY(kiln_tensor_check(t, "kiln_record_stream"));
    if (!stream) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_record_stream: stream is NULL");
    kiln_storage *s = t->storage;
    if (!s->base) return KILN_OK; /* no elements, no block */
    if (s->pinned)
        return kiln_caching_allocator_record_stream(kiln_pinned_allocator(), s->base,
                                                    (kiln_alloc_stream)stream);
    return kiln_memory_record_stream(s->device, s->base, stream);
}

/* Creation: tensors made directly on a device, filled by the device's
 * kernels on its current stream (never staged through the host, except
 * kiln_from_data, whose source is host memory). */
#include <math.h>

#include "base/error.h"
#include "runtime/runtime_internal.h"
#include "tensor/scope.h"
#include "tensor/tensor_internal.h"

/* Run `fill` over a freshly allocated tensor; meta tensors have no data. */
static kiln_tensor *filled(const char *fn, kiln_shape shape, kiln_dtype dtype, kiln_device device,
                           double value) {
    kiln_tensor *t = kiln_tensor_alloc(fn, shape, dtype, device, false);
    if (!t || kiln_numel(t) == 0 || device.type == KILN_DEVICE_META) return t;
    const kiln_tensor_kernels *k = kiln_tensor_kernels_for(device.type);
    void *stream;
    kiln_strided dst;
    if (!k) {
        KILN_RAISE(KILN_ERR_UNSUPPORTED, NULL, "%s: no tensor kernels for this device type", fn);
    } else if (!kiln_tensor_strided(t, &dst) && !kiln_tensor_kernel_stream(device, &stream) &&
               !k->fill(&dst, value, stream)) {
        return t;
    }
    kiln_tensor_drop(t);
    return NULL;
}

kiln_tensor *kiln_empty(kiln_shape shape, kiln_dtype dtype, kiln_device device) {
    kiln_api_enter();
    return kiln_api_return(kiln_tensor_alloc("kiln_empty", shape, dtype, device, false));
}

kiln_tensor *kiln_zeros(kiln_shape shape, kiln_dtype dtype, kiln_device device) {
    kiln_api_enter();
    return kiln_api_return(filled("kiln_zeros", shape, dtype, device, 0.0));
}

kiln_tensor *kiln_ones(kiln_shape shape, kiln_dtype dtype, kiln_device device) {
    kiln_api_enter();
    return kiln_api_return(filled("kiln_ones", shape, dtype, device, 1.0));
}

kiln_tensor *kiln_full(kiln_shape shape, double value, kiln_dtype dtype, kiln_device device) {
    kiln_api_enter();
    return kiln_api_return(filled("kiln_full", shape, dtype, device, value));
}

static kiln_tensor *arange_impl(double start, double end, double step, kiln_dtype dtype, kiln_device device) {
    if (!isfinite(start) || !isfinite(end) || !isfinite(step) || step == 0.0 || (end - start) / step < 0) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                   "use finite bounds and a nonzero step whose sign points from start to end",
                   "kiln_arange: invalid range start %g, end %g, step %g", start, end, step);
        return NULL;
    }
    double count = ceil((end - start) / step);
    if (!(count < 9.2e18)) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use a larger step",
                   "kiln_arange: start %g, end %g, step %g gives %g elements", start, end, step, count);
        return NULL;
    }
    int64_t n = (int64_t)count;
    kiln_tensor *t = kiln_tensor_alloc("kiln_arange", KILN_SHAPE(n), dtype, device, false);
    if (!t || n == 0 || device.type == KILN_DEVICE_META) return t;
    const kiln_tensor_kernels *k = kiln_tensor_kernels_for(device.type);
    void *stream;
    if (k && !kiln_tensor_kernel_stream(device, &stream) &&
        !k->arange(kiln_data_ptr(t), dtype, n, start, step, stream))
        return t;
    if (!k) KILN_RAISE(KILN_ERR_UNSUPPORTED, NULL, "kiln_arange: no tensor kernels for this device type");
    kiln_tensor_drop(t);
    return NULL;
}

kiln_tensor *kiln_arange(double start, double end, double step, kiln_dtype dtype, kiln_device device) {
    kiln_api_enter();
    return kiln_api_return(arange_impl(start, end, step, dtype, device));
}

/* Uniform draws use one word per element, normal draws two (Box-Muller).
 * The draw is reserved on meta too, so the generator's position after a
 * step on meta is the one a real step would leave. */
static kiln_tensor *random_impl(const char *fn, kiln_shape shape, kiln_dtype dtype, kiln_device device,
                                bool normal) {
    if ((unsigned)dtype < KILN_DTYPE_COUNT && !kiln_dtype_is_floating(dtype)) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "draw in f32 and convert with kiln_to",
                   "%s: dtype %s is not floating point (use f32, f16, bf16 or f64)", fn,
                   kiln_dtype_name(dtype));
        return NULL;
    }
    kiln_tensor *t = kiln_tensor_alloc(fn, shape, dtype, device, false);
    int64_t n = kiln_numel(t);
    if (!t || n == 0) return t;
    kiln_rng draw = kiln_device_rng_reserve(device, (uint64_t)n * (normal ? 2u : 1u));
    if (device.type == KILN_DEVICE_META) return t;
    const kiln_tensor_kernels *k = kiln_tensor_kernels_for(device.type);
    void *stream;
    if (k && !kiln_tensor_kernel_stream(device, &stream)) {
        kiln_status st = normal ? k->rand_normal(kiln_data_ptr(t), dtype, n, draw, stream)
                                : k->rand_uniform(kiln_data_ptr(t), dtype, n, draw, stream);
        if (!st) return t;
    } else if (!k) {
        KILN_RAISE(KILN_ERR_UNSUPPORTED, NULL, "%s: no tensor kernels for this device type", fn);
    }
    kiln_tensor_drop(t);
    return NULL;
}

kiln_tensor *kiln_rand(kiln_shape shape, kiln_dtype dtype, kiln_device device) {
    kiln_api_enter();
    return kiln_api_return(random_impl("kiln_rand", shape, dtype, device, false));
}

kiln_tensor *kiln_randn(kiln_shape shape, kiln_dtype dtype, kiln_device device) {
    kiln_api_enter();
    return kiln_api_return(random_impl("kiln_randn", shape, dtype, device, true));
}

void kiln_manual_seed(uint64_t seed) { kiln_device_rng_seed_all(seed); }

static kiln_tensor *from_data_impl(kiln_shape shape, kiln_dtype dtype, kiln_device device, const void *data) {
    kiln_tensor *t = kiln_tensor_alloc("kiln_from_data", shape, dtype, device, false);
    if (!t) return NULL;
    size_t bytes = t->storage->nbytes;
    if (bytes && !data) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass a host buffer of numel * dtype size bytes",
                   "kiln_from_data: data is NULL for %zu bytes", bytes);
    } else if (!kiln_runtime_copy(t->storage->device, t->storage->base, KILN_CPU, data, bytes, NULL, false)) {
        return t;
    }
    kiln_tensor_drop(t);
    return NULL;
}

kiln_tensor *kiln_from_data(kiln_shape shape, kiln_dtype dtype, kiln_device device, const void *data) {
    kiln_api_enter();
    return kiln_api_return(from_data_impl(shape, dtype, device, data));
}

kiln_tensor *kiln_empty_pinned(kiln_shape shape, kiln_dtype dtype) {
    kiln_api_enter();
    return kiln_api_return(kiln_tensor_alloc("kiln_empty_pinned", shape, dtype, KILN_CPU, true));
}

/* ---- new_*: dtype and device from `like` --------------------------------------------- */

kiln_tensor *kiln_new_empty(const kiln_tensor *like, kiln_shape shape) {
    kiln_api_enter();
    kiln_tensor *t = NULL;
    if (!kiln_tensor_check(like, "kiln_new_empty"))
        t = kiln_tensor_alloc("kiln_new_empty", shape, like->dtype, like->storage->device, false);
    return kiln_api_return(t);
}

kiln_tensor *kiln_new_full(const kiln_tensor *like, kiln_shape shape, double value) {
    kiln_api_enter();
    kiln_tensor *t = NULL;
    if (!kiln_tensor_check(like, "kiln_new_full"))
        t = filled("kiln_new_full", shape, like->dtype, like->storage->device, value);
    return kiln_api_return(t);
}

kiln_tensor *kiln_new_zeros(const kiln_tensor *like, kiln_shape shape) {
    kiln_api_enter();
    kiln_tensor *t = NULL;
    if (!kiln_tensor_check(like, "kiln_new_zeros"))
        t = filled("kiln_new_zeros", shape, like->dtype, like->storage->device, 0.0);
    return kiln_api_return(t);
}

kiln_tensor *kiln_new_ones(const kiln_tensor *like, kiln_shape shape) {
    kiln_api_enter();
    kiln_tensor *t = NULL;
    if (!kiln_tensor_check(like, "kiln_new_ones"))
        t = filled("kiln_new_ones", shape, like->dtype, like->storage->device, 1.0);
    return kiln_api_return(t);
}

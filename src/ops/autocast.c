/* Autocast: the dispatcher's KILN_HOOK_AUTOCAST hook. Before an op's shape
 * inference runs, the hook looks up the op's precision class (ops.def) and
 * the innermost autocast region that covers the op's device type, and
 * replaces the floating inputs by CAST ops to the class's dtype. The casts
 * are dispatched like any op, so autograd records them and the gradient of
 * each input comes back in the input's dtype.
 *
 * State is per thread: a stack of regions (device type + dtype; a
 * suspension entry covers every device type) and a weight-cast cache that
 * lives until the outermost region ends. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kiln/autograd.h"
#include "ops/autocast.h"
#include "ops/op_registry.h"
#include "tensor/tensor_internal.h"

#define AUTOCAST_DEPTH 32
#define ALL_DEVICE_TYPES (-1)

typedef struct region {
    int device_type; /* kiln_device_type, or ALL_DEVICE_TYPES for a suspension */
    kiln_dtype dtype; /* KILN_F16/BF16: on; KILN_F32: off */
} region;

/* One cached weight cast: src (f32 leaf requiring grad) as it was at
 * `version`, cast to `dtype` with grad mode `grad`. Both references owned. */
typedef struct cache_entry {
    kiln_tensor *src;
    uint64_t version;
    kiln_dtype dtype;
    bool grad;
    kiln_tensor *cast;
} cache_entry;

static _Thread_local region regions[AUTOCAST_DEPTH];
static _Thread_local int depth;
/* Suspensions past the region stack's depth are only counted. */
static _Thread_local int overflow_suspends;
static _Thread_local cache_entry *cache;
static _Thread_local size_t cache_n, cache_cap;
static _Thread_local uint64_t cache_hits;

static const region *covering(kiln_device_type type) {
    for (int i = depth - 1; i >= 0; i--)
        if (regions[i].device_type == ALL_DEVICE_TYPES || regions[i].device_type == (int)type) return &regions[i];
    return NULL;
}

kiln_dtype kiln_autocast_dtype(kiln_device_type device_type) {
    if (overflow_suspends) return KILN_F32;
    const region *r = covering(device_type);
    return r ? r->dtype : KILN_F32;
}

bool kiln_autocast_enabled(kiln_device_type device_type) { return kiln_autocast_dtype(device_type) != KILN_F32; }

static void cache_clear(void) {
    for (size_t i = 0; i < cache_n; i++) {
        kiln_tensor_drop(cache[i].cast);
        kiln_tensor_drop(cache[i].src);
    }
    free(cache);
    cache = NULL;
    cache_n = cache_cap = 0;
}

void kiln_autocast_cache_stats(size_t *entries, uint64_t *hits) {
    if (entries) *entries = cache_n;
    if (hits) *hits = cache_hits;
}

kiln_status kiln_autocast_begin(kiln_device_type device_type, kiln_dtype dtype) {
    if ((unsigned)device_type >= KILN_DEVICE_TYPE_COUNT)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass KILN_DEVICE_CPU or KILN_DEVICE_CUDA",
                          "kiln_autocast_begin: %d is not a device type", (int)device_type);
    if (dtype != KILN_F16 && dtype != KILN_BF16 && dtype != KILN_F32)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                          "pass KILN_F16 or KILN_BF16 (autocast on) or KILN_F32 (autocast off in the region)",
                          "kiln_autocast_begin: %s is not an autocast dtype", kiln_dtype_name(dtype));
    if (depth == AUTOCAST_DEPTH)
        return KILN_RAISE(KILN_ERR_STATE, "close regions with kiln_autocast_end",
                          "kiln_autocast_begin: %d regions are already open on this thread", AUTOCAST_DEPTH);
    regions[depth++] = (region){(int)device_type, dtype};
    return KILN_OK;
}

kiln_status kiln_autocast_end(void) {
    if (depth == 0 || regions[depth - 1].device_type == ALL_DEVICE_TYPES)
        return KILN_RAISE(KILN_ERR_STATE, "pair every kiln_autocast_begin with one kiln_autocast_end",
                          "kiln_autocast_end: no autocast region is open%s",
                          depth ? " at this level (inside kiln_backward)" : "");
    if (--depth == 0) cache_clear();
    return KILN_OK;
}

void kiln_autocast_suspend(void) {
    if (depth == AUTOCAST_DEPTH || overflow_suspends) overflow_suspends++;
    else regions[depth++] = (region){ALL_DEVICE_TYPES, KILN_F32};
}

void kiln_autocast_resume(void) {
    if (overflow_suspends) overflow_suspends--;
    else if (depth && regions[depth - 1].device_type == ALL_DEVICE_TYPES && --depth == 0) cache_clear();
}

/* ---- The hook ------------------------------------------------------------------------ */

static bool castable(const kiln_tensor *t) {
    return t && kiln_dtype_is_floating(t->dtype) && t->dtype != KILN_F64;
}

/* The dtype the op's castable inputs run in, or KILN_DTYPE_COUNT for none. */
static kiln_dtype target_dtype(const kiln_op_call *c, kiln_dtype low) {
    switch (c->info->precision) {
    case KILN_PREC_LOWER: return low;
    case KILN_PREC_F32: return KILN_F32;
    case KILN_PREC_PROMOTE: {
        /* The widest floating input: f64 wins (f64 inputs are not cast, so
         * the op's own promotion handles them), f16 with bf16 meets at f32. */
        kiln_dtype w = KILN_DTYPE_COUNT;
        for (int i = 0; i < c->n_in; i++) {
            const kiln_tensor *t = c->in[i];
            if (!t || !kiln_dtype_is_floating(t->dtype)) continue;
            if (t->dtype == KILN_F64) return KILN_DTYPE_COUNT;
            if (w == KILN_DTYPE_COUNT) w = t->dtype;
            else if (w != t->dtype) w = KILN_F32;
        }
        return w;
    }
    default: return KILN_DTYPE_COUNT;
    }
}

static kiln_status cache_put(kiln_tensor *src, kiln_dtype dtype, bool grad, kiln_tensor *cast) {
    if (cache_n == cache_cap) {
        size_t cap = cache_cap ? 2 * cache_cap : 16;
        cache_entry *grown = realloc(cache, cap * sizeof *grown);
        if (!grown) return KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "autocast: the weight-cast cache cannot grow");
        cache = grown;
        cache_cap = cap;
    }
    cache[cache_n++] = (cache_entry){kiln_retain(src), kiln_tensor_version(src), dtype, grad, kiln_retain(cast)};
    return KILN_OK;
}

/* Replace input i of the call by its cast to dtype (a new reference the
 * dispatcher drops after the call). Weights (f32 leaves requiring grad)
 * cast to the low dtype come from, or go into, the region's cache. */
static kiln_status cast_input(kiln_op_call *c, int i, kiln_dtype dtype) {
    kiln_tensor *src = c->in[i];
    bool cacheable = c->info->precision == KILN_PREC_LOWER && src->dtype == KILN_F32 && src->requires_grad;
    bool grad = kiln_is_grad_enabled();
    if (cacheable) {
        uint64_t v = kiln_tensor_version(src);
        for (size_t k = 0; k < cache_n; k++) {
            cache_entry *e = &cache[k];
            if (e->src == src && e->version == v && e->dtype == dtype && e->grad == grad) {
                cache_hits++;
                if (c->in_owned[i]) kiln_tensor_drop(src);
                c->in[i] = kiln_retain(e->cast);
                c->in_owned[i] = true;
                return KILN_OK;
            }
        }
    }
    kiln_op_attrs a = {.dtype = dtype};
    kiln_tensor *out[KILN_OP_MAX_OUT] = {NULL};
    KILN_TRY(kiln_dispatch(KILN_OP_CAST, 1, &src, &a, c->device, out));
    kiln_status st = cacheable ? cache_put(src, dtype, grad, out[0]) : KILN_OK;
    if (st) {
        kiln_tensor_drop(out[0]);
        return st;
    }
    if (c->in_owned[i]) kiln_tensor_drop(src);
    c->in[i] = out[0];
    c->in_owned[i] = true;
    return KILN_OK;
}

static kiln_status autocast_hook_begin(kiln_op_call *c) {
    if (!depth || c->info->precision == KILN_PREC_ASIS || (c->info->flags & OPF_INPLACE)) return KILN_OK;
    kiln_dtype low = kiln_autocast_dtype(c->device.type);
    if (low == KILN_F32) return KILN_OK;
    kiln_dtype dt = target_dtype(c, low);
    if (dt == KILN_DTYPE_COUNT) return KILN_OK;
    for (int i = 0; i < c->n_in; i++)
        if (castable(c->in[i]) && c->in[i]->dtype != dt) KILN_TRY(cast_input(c, i, dt));
    return KILN_OK;
}

void kiln_autocast_init(void) {
    static const kiln_dispatch_hook hook = {.begin = autocast_hook_begin, .end = NULL};
    kiln_dispatch_set_hook(KILN_HOOK_AUTOCAST, &hook);
}

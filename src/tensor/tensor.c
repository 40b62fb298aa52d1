/* Tensor and storage records: allocation from the device's caching
 * allocator, atomic reference counts, release (with double-release
 * detection), and the read-only properties. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kiln_config.h"
#include "runtime/runtime_internal.h"
#include "tensor/scope.h"
#include "tensor/tensor_internal.h"

static _Atomic(kiln_autograd_free_hook) autograd_free_hook;

void kiln_tensor_set_autograd_free_hook(kiln_autograd_free_hook hook) {
    atomic_store(&autograd_free_hook, hook);
}

/* ---- Storage ------------------------------------------------------------------------ */

static kiln_storage *storage_create(kiln_device device, size_t nbytes, bool pinned) {
    kiln_storage *s = KILN_CALLOC(1, sizeof *s);
    if (!s) return NULL;
    s->device = device;
    s->nbytes = nbytes;
    s->pinned = pinned;
    atomic_init(&s->refcount, 1);
    atomic_init(&s->version, 0);
    kiln_status st = KILN_OK;
    if (pinned) {
        s->stream = kiln_stream_default(KILN_CPU); /* the pinned pool's stream */
        if (nbytes) st = kiln_pinned_alloc(nbytes, &s->base);
    } else {
        s->stream = kiln_current_stream(device);
        if (!s->stream)
            st = kiln_error_last()->status;
        else if (nbytes)
            st = kiln_memory_alloc(device, nbytes, s->stream, &s->base);
    }
    if (st) {
        free(s);
        return NULL;
    }
    return s;
}

/* ---- Prepared copies ------------------------------------------------------------------- */

typedef struct kiln_prepared {
    struct kiln_prepared *next;
    uint64_t key, version;
    uint64_t seen; /* lazy: the version the last call saw */
    bool filled;
    size_t bytes;
    void *block;
} kiln_prepared;

static pthread_mutex_t prepared_lock = PTHREAD_MUTEX_INITIALIZER;
static int64_t prepared_fills; /* under prepared_lock */

int64_t kiln_tensor_prepared_fills(void) {
    pthread_mutex_lock(&prepared_lock);
    int64_t n = prepared_fills;
    pthread_mutex_unlock(&prepared_lock);
    return n;
}

static void prepared_free_all(kiln_storage *s) {
    for (kiln_prepared *p = s->prepared, *next; p; p = next) {
        next = p->next;
        if (p->block && kiln_memory_free(s->device, p->block))
            kiln_log_write(KILN_LOG_WARN, "a kernel's prepared copy: free failed: %s", kiln_error_message());
        free(p);
    }
    s->prepared = NULL;
}

kiln_status kiln_tensor_prepared(const kiln_tensor *t, uint64_t key, size_t bytes, bool lazy,
                                 kiln_status (*fill)(void *ctx, void *dst), void *ctx, void **out) {
    kiln_storage *s = t->storage;
    *out = NULL;
    pthread_mutex_lock(&prepared_lock);
    kiln_prepared *p = s->prepared;
    while (p && !(p->key == key && p->bytes == bytes)) p = p->next;
    /* Versions count from 0; a new lazy record has seen none (UINT64_MAX). */
    uint64_t v = (uint64_t)atomic_load_explicit(&s->version, memory_order_relaxed);
    kiln_status st = KILN_OK;
    if (!p) {
        p = KILN_CALLOC(1, sizeof *p);
        if (!p) st = kiln_error_last()->status;
        else {
            p->key = key, p->bytes = bytes, p->seen = UINT64_MAX;
            p->next = s->prepared;
            s->prepared = p;
        }
    }
    if (!st && !(p->filled && p->version == v)) {
        if (lazy && p->seen != v) {
            /* Moved since the last call (or never seen): no copy this time.
             * A block made before stays for the next fill, so a replayed
             * program's later runs call no allocator (docs/trace.md). */
            p->filled = false;
            p->seen = v;
            pthread_mutex_unlock(&prepared_lock);
            return KILN_OK;
        }
        p->filled = false;
        if (!p->block) st = kiln_memory_alloc(s->device, bytes ? bytes : 1, s->stream, &p->block);
        if (!st) {
            st = fill(ctx, p->block);
            prepared_fills++;
        }
        if (!st) p->filled = true, p->version = v;
    }
    if (!st) *out = p->block, p->seen = v;
    pthread_mutex_unlock(&prepared_lock);
    return st;
}

static void storage_release(kiln_storage *s) {
    if (atomic_fetch_sub_explicit(&s->refcount, 1, memory_order_acq_rel) != 1) return;
    prepared_free_all(s);
    if (s->base) {
        kiln_status st = s->pinned ? kiln_pinned_free(s->base) : kiln_memory_free(s->device, s->base);
        /* Unknown pointers mean allocator state was lost (a tensor outliving
         * kiln_shutdown): log it, the storage record still goes. */
        if (st) kiln_log_write(KILN_LOG_WARN, "tensor storage free failed: %s", kiln_error_message());
    }
    free(s);
}

/* ---- Tensor records ------------------------------------------------------------------- */

static kiln_tensor *tensor_create(kiln_storage *storage, kiln_dtype dtype, int ndim, const int64_t *shape,
                                  const int64_t *strides, int64_t offset) {
    kiln_tensor *t = KILN_CALLOC(1, sizeof *t);
    if (!t) return NULL;
    t->magic = KILN_TENSOR_MAGIC;
    atomic_init(&t->refcount, 1);
    t->storage = storage;
    t->dtype = dtype;
    t->ndim = ndim;
    if (ndim) {
        memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
        memcpy(t->strides, strides, (size_t)ndim * sizeof *strides);
    }
    t->offset = offset;
    if (kiln_handle_add(t)) {
        free(t);
        return NULL;
    }
    return t;
}

kiln_tensor *kiln_tensor_alloc(const char *fn, kiln_shape shape, kiln_dtype dtype, kiln_device device,
                               bool pinned) {
    int64_t numel;
    if (kiln_shape_check(fn, shape, dtype, &numel)) return NULL;
    if (!kiln_backend_for(device)) return NULL;
    if (device.type != KILN_DEVICE_CUDA) device.index = 0;
    kiln_storage *s = storage_create(device, (size_t)numel * kiln_dtype_size(dtype), pinned);
    if (!s) return NULL;
    int64_t strides[KILN_MAX_DIMS];
    kiln_contiguous_strides(shape.ndim, shape.d, strides);
    kiln_tensor *t = tensor_create(s, dtype, shape.ndim, shape.d, strides, 0);
    if (!t) storage_release(s);
    return t;
}

kiln_tensor *kiln_tensor_alias(kiln_tensor *t, int ndim, const int64_t *shape, const int64_t *strides,
                               int64_t offset) {
    /* Only a handle with t's full geometry may share an opaque layout. */
    bool same = ndim == t->ndim && offset == t->offset && !memcmp(shape, t->shape, sizeof(int64_t) * (size_t)ndim) &&
                !memcmp(strides, t->strides, sizeof(int64_t) * (size_t)ndim);
    if (!same && kiln_tensor_ensure_strided(t)) return NULL;
    atomic_fetch_add_explicit(&t->storage->refcount, 1, memory_order_relaxed);
    kiln_tensor *v = tensor_create(t->storage, t->dtype, ndim, shape, strides, offset);
    if (!v) storage_release(t->storage);
    return v;
}

kiln_status kiln_tensor_check(const kiln_tensor *t, const char *fn) {
    if (!t)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "check the call that made the tensor for an error",
                          "%s: tensor is NULL", fn);
    if (!kiln_handle_is_live(t) || t->magic != KILN_TENSOR_MAGIC)
        return KILN_RAISE(KILN_ERR_STATE, "a tensor cannot be used after its last kiln_release",
                          "%s: tensor %p is not live (released already?)", fn, (const void *)t);
    return KILN_OK;
}

static void tensor_free(kiln_tensor *t) {
    if (t->autograd) {
        kiln_autograd_free_hook hook = atomic_load(&autograd_free_hook);
        if (hook) hook(t);
    }
    kiln_handle_remove(t);
    kiln_storage *s = t->storage;
    t->magic = KILN_TENSOR_DEAD;
    free(t);
    storage_release(s);
}

/* Release checks liveness before touching the record: in debug builds the
 * handle set answers without reading freed memory; in release builds the
 * magic word is all there is, which catches most double releases but reads
 * memory that may have been reused, so detection is only guaranteed in
 * debug and sanitizer builds. */
static kiln_status release_checked(kiln_tensor *t, bool from_user) {
    if (!kiln_handle_is_live(t) || t->magic != KILN_TENSOR_MAGIC)
        return KILN_RAISE(KILN_ERR_STATE,
                          "release each reference once; a scope releases what it owns at its end",
                          "kiln_release: tensor %p is not live (released twice?)", (void *)t);
    if (from_user) kiln_scope_unregister(t);
    if (atomic_fetch_sub_explicit(&t->refcount, 1, memory_order_acq_rel) == 1) tensor_free(t);
    return KILN_OK;
}

kiln_status kiln_tensor_drop(kiln_tensor *t) {
    if (!t) return KILN_OK;
    return release_checked(t, false);
}

kiln_status kiln_release(kiln_tensor *t) {
    if (!t) return KILN_OK;
    return release_checked(t, kiln_api_depth() == 0);
}

/* kiln_retain never registers with a scope: the caller asked for a
 * reference of its own (a holder), so it owns and releases it. */
kiln_tensor *kiln_retain(kiln_tensor *t) {
    if (kiln_tensor_check(t, "kiln_retain")) return NULL;
    atomic_fetch_add_explicit(&t->refcount, 1, memory_order_relaxed);
    return t;
}

void kiln_tensor_bump_version(kiln_tensor *t) {
    atomic_fetch_add_explicit(&t->storage->version, 1, memory_order_relaxed);
}

void kiln_tensor_swap_data(kiln_tensor *a, kiln_tensor *b) {
    kiln_storage *st = a->storage;
    a->storage = b->storage, b->storage = st;
    kiln_dtype dt = a->dtype;
    a->dtype = b->dtype, b->dtype = dt;
    int nd = a->ndim;
    a->ndim = b->ndim, b->ndim = nd;
    int64_t tmp[KILN_MAX_DIMS];
    memcpy(tmp, a->shape, sizeof tmp), memcpy(a->shape, b->shape, sizeof tmp), memcpy(b->shape, tmp, sizeof tmp);
    memcpy(tmp, a->strides, sizeof tmp), memcpy(a->strides, b->strides, sizeof tmp);
    memcpy(b->strides, tmp, sizeof tmp);
    int64_t off = a->offset;
    a->offset = b->offset, b->offset = off;
}

static void *data_of(const kiln_tensor *t) {
    if (!t->storage->base || t->storage->device.type == KILN_DEVICE_META) return NULL;
    return (char *)t->storage->base + t->offset * (int64_t)kiln_dtype_size(t->dtype);
}

kiln_strided kiln_tensor_kernel_view(const kiln_tensor *t) {
    kiln_strided v = {.data = data_of(t), .dtype = t->dtype, .ndim = t->ndim, .layout = t->storage->layout};
    for (int i = 0; i < t->ndim; i++) {
        v.shape[i] = t->shape[i];
        v.strides[i] = t->strides[i];
    }
    return v;
}

kiln_status kiln_tensor_strided(const kiln_tensor *t, kiln_strided *out) {
    KILN_TRY(kiln_tensor_ensure_strided(t));
    *out = kiln_tensor_kernel_view(t);
    return KILN_OK;
}

/* Opaque layouts exist on the CPU only (the fast CPU kernels make them),
 * and on meta, which plans a CPU step: there the conversion allocates and
 * frees as on the CPU, with no bytes to move. */
kiln_status kiln_tensor_ensure_strided(const kiln_tensor *t) {
    kiln_storage *s = t->storage;
    if (s->layout == KILN_LAYOUT_STRIDED) return KILN_OK;
    const int block = kiln_layout_block(s->layout);
    if (!block || t->ndim != 4 || t->offset || t->shape[1] % block ||
        (s->device.type != KILN_DEVICE_CPU && s->device.type != KILN_DEVICE_META))
        return KILN_RAISE(KILN_ERR_INTERNAL, "report this", "tensor layout %d on a tensor it cannot describe",
                          (int)s->layout);
    void *plain = NULL;
    if (s->nbytes) {
        KILN_TRY(kiln_memory_alloc(s->device, s->nbytes, s->stream, &plain));
        if (s->device.type == KILN_DEVICE_CPU)
            kiln_cpu_reorder_blocked(plain, s->base, kiln_dtype_size(t->dtype), t->shape, block, false);
        kiln_status st = kiln_memory_free(s->device, s->base);
        s->base = plain;
        if (st) kiln_log_write(KILN_LOG_WARN, "tensor layout conversion: freeing the old block failed: %s",
                               kiln_error_message());
    }
    s->layout = KILN_LAYOUT_STRIDED;
    return KILN_OK;
}

void kiln_tensor_set_layout(kiln_tensor *t, kiln_layout layout) { t->storage->layout = layout; }

kiln_status kiln_tensor_kernel_stream(kiln_device device, void **handle) {
    kiln_stream *s = kiln_current_stream(device);
    if (!s) return kiln_error_last()->status;
    *handle = kiln_stream_handle(s);
    return KILN_OK;
}

void kiln_tensor_layer_shutdown(void) { kiln_handles_shutdown(); }

/* ---- Properties ------------------------------------------------------------------------ */

int kiln_ndim(const kiln_tensor *t) { return t ? t->ndim : 0; }

int64_t kiln_size(const kiln_tensor *t, int dim) {
    int d;
    if (!t || !kiln_wrap_dim(dim, t->ndim, &d)) return -1;
    return t->shape[d];
}

int64_t kiln_stride(const kiln_tensor *t, int dim) {
    int d;
    if (!t || !kiln_wrap_dim(dim, t->ndim, &d)) return -1;
    return t->strides[d];
}

kiln_shape kiln_shape_of(const kiln_tensor *t) {
    kiln_shape s = {0};
    if (!t) return s;
    s.ndim = t->ndim;
    for (int i = 0; i < t->ndim; i++) s.d[i] = t->shape[i];
    return s;
}

int64_t kiln_numel(const kiln_tensor *t) {
    if (!t) return 0;
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

kiln_dtype kiln_dtype_of(const kiln_tensor *t) { return t ? t->dtype : KILN_DTYPE_COUNT; }
kiln_layout kiln_layout_of(const kiln_tensor *t) { return t ? t->storage->layout : KILN_LAYOUT_COUNT; }

const char *kiln_layout_name(kiln_layout layout) {
    switch (layout) {
    case KILN_LAYOUT_STRIDED: return "strided";
    case KILN_LAYOUT_NCHW16C: return "nChw16c";
    case KILN_LAYOUT_NCHW8C: return "nChw8c";
    default: return "invalid";
    }
}
kiln_device kiln_get_device(const kiln_tensor *t) { return t ? t->storage->device : KILN_CPU; }
int64_t kiln_storage_offset(const kiln_tensor *t) { return t ? t->offset : 0; }
bool kiln_is_pinned(const kiln_tensor *t) { return t && t->storage->pinned; }

/* PyTorch's rule: size-1 dims do not constrain their stride, and a tensor
 * with no elements is contiguous. */
bool kiln_is_contiguous(const kiln_tensor *t) {
    if (!t) return false;
    int64_t expected = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] == 0) return true;
        if (t->shape[i] == 1) continue;
        if (t->strides[i] != expected) return false;
        expected *= t->shape[i];
    }
    return true;
}

bool kiln_shares_storage(const kiln_tensor *a, const kiln_tensor *b) {
    return a && b && a->storage == b->storage;
}

uint64_t kiln_tensor_version(const kiln_tensor *t) {
    return t ? (uint64_t)atomic_load_explicit(&t->storage->version, memory_order_relaxed) : 0;
}

void *kiln_data_ptr(const kiln_tensor *t) {
    if (!t || kiln_tensor_ensure_strided(t)) return NULL;
    return data_of(t);
}

int kiln_refcount(const kiln_tensor *t) { return t ? atomic_load(&t->refcount) : 0; }

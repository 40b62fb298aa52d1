/* The per-thread copy of CUDA's current device and the table of Kiln's
 * device-memory segments (cuda_device.h). Why: a CUDA kernel launch costs
 * the host a few microseconds, and asking the runtime which device owns a
 * pointer (cudaPointerGetAttributes, a driver call that takes a lock) and
 * which device is current, around every launch, added calls of the same
 * order to each of them (docs/cuda.md, "Host calls per step"). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "base/error.h"
#include "runtime/cuda_backend.h"
#include "runtime/cuda_device.h"

/* ---- The current device ------------------------------------------------------------ */

/* CUDA's current device on this thread as Kiln last set or read it; -1:
 * not known yet (ask the runtime). */
static _Thread_local int tls_current = -1;

kiln_status kiln_cuda_device_switch(int index, int *previous) {
    *previous = -1;
    int current = tls_current;
    if (current < 0) {
        KILN_CUDA_TRY(index, cudaGetDevice(&current));
        tls_current = current;
    }
    if (current != index) {
        KILN_CUDA_TRY(index, cudaSetDevice(index));
        tls_current = index;
    }
    *previous = current;
    return KILN_OK;
}

void kiln_cuda_device_restore(int index, int previous) {
    if (previous < 0 || previous == index) return;
    /* On failure the runtime's current device is whatever it is: ask next time. */
    tls_current = KILN_CUDA_CHECK(previous, cudaSetDevice(previous)) == KILN_OK ? previous : -1;
}

void kiln_cuda_device_forget(void) { tls_current = -1; }

/* ---- The segments ------------------------------------------------------------------ */

typedef struct segment {
    uintptr_t base, end; /* [base, end) */
    int device;
} segment;

/* Sorted by base; segments do not overlap. Written under the write lock
 * (each raw cudaMalloc/cudaFree, rare once the caching allocator is warm),
 * read under the read lock. */
static pthread_rwlock_t seg_lock = PTHREAD_RWLOCK_INITIALIZER;
static segment *segs;
static size_t n_segs, cap_segs;
/* Bumped under the write lock by every change: a thread's last hit is
 * still true while the generation it was read at is current, so repeated
 * launches on one segment take no lock at all. */
static _Atomic uint64_t seg_generation = 1;
static _Thread_local struct {
    uint64_t generation;
    segment seg;
} tls_hit;

/* The first segment whose base is above p (n_segs if none). */
static size_t upper_bound(uintptr_t p) {
    size_t lo = 0, hi = n_segs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (segs[mid].base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

void kiln_cuda_segment_add(int device, const void *base, size_t bytes) {
    if (!base || !bytes) return;
    uintptr_t b = (uintptr_t)base;
    pthread_rwlock_wrlock(&seg_lock);
    if (n_segs == cap_segs) {
        size_t cap = cap_segs ? 2 * cap_segs : 64;
        segment *grown = realloc(segs, cap * sizeof *grown);
        if (!grown) {
            pthread_rwlock_unlock(&seg_lock);
            return;
        }
        segs = grown, cap_segs = cap;
    }
    size_t i = upper_bound(b);
    memmove(&segs[i + 1], &segs[i], (n_segs - i) * sizeof *segs);
    segs[i] = (segment){b, b + bytes, device};
    n_segs++;
    atomic_fetch_add(&seg_generation, 1);
    pthread_rwlock_unlock(&seg_lock);
}

void kiln_cuda_segment_remove(const void *base) {
    uintptr_t b = (uintptr_t)base;
    pthread_rwlock_wrlock(&seg_lock);
    size_t i = upper_bound(b);
    if (i > 0 && segs[i - 1].base == b) {
        memmove(&segs[i - 1], &segs[i], (n_segs - i) * sizeof *segs);
        n_segs--;
    }
    atomic_fetch_add(&seg_generation, 1);
    pthread_rwlock_unlock(&seg_lock);
}

/* The device of the registered segment holding p, or -1. */
static int segment_device(uintptr_t p) {
    uint64_t generation = atomic_load_explicit(&seg_generation, memory_order_acquire);
    if (tls_hit.generation == generation && p >= tls_hit.seg.base && p < tls_hit.seg.end)
        return tls_hit.seg.device;
    int device = -1;
    pthread_rwlock_rdlock(&seg_lock);
    size_t i = upper_bound(p);
    if (i > 0 && p < segs[i - 1].end) {
        device = segs[i - 1].device;
        tls_hit.generation = atomic_load_explicit(&seg_generation, memory_order_relaxed);
        tls_hit.seg = segs[i - 1];
    }
    pthread_rwlock_unlock(&seg_lock);
    return device;
}

kiln_status kiln_cuda_device_of(const void *ptr, const char *what, int *device) {
    *device = segment_device((uintptr_t)ptr);
    if (*device >= 0) return KILN_OK;
    struct cudaPointerAttributes attr;
    KILN_CUDA_TRY(-1, cudaPointerGetAttributes(&attr, ptr));
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "allocate the tensor on the cuda device",
                          "%s given host pointer %p, which the GPU cannot access", what, ptr);
    *device = attr.device;
    return KILN_OK;
}

/* Runtime internals shared with the tensor layer. */
#ifndef KILN_SRC_RUNTIME_RUNTIME_INTERNAL_H
#define KILN_SRC_RUNTIME_RUNTIME_INTERNAL_H

#include "runtime/backend.h"
#include "runtime/caching_allocator.h"

/* The backend handle wrapped by `stream` (what kernels receive). */
void *kiln_stream_handle(const kiln_stream *stream);

/* Copy `bytes` between any two devices (cpu, cuda:N; meta copies nothing).
 * Chooses H2D/D2H/D2D/peer. Asynchronous on `stream` (the device side's
 * stream; NULL = its current stream) only if `non_blocking` and the host
 * side is pinned or both sides are on one device; otherwise returns after
 * the copy is done. A copy to or from meta is a no-op. */
kiln_status kiln_runtime_copy(kiln_device dst_device, void *dst, kiln_device src_device,
                              const void *src, size_t bytes, kiln_stream *stream,
                              bool non_blocking);

/* Which device type's kernels a meta op on this thread stands for: its
 * kernel choice, workspace, output layouts and prepared copies (cpu by
 * default; cuda while kiln_plan models a CUDA device). Per thread. */
void kiln_meta_kernels_set(kiln_device_type type);
kiln_device_type kiln_meta_kernels(void);
/* Which device of that type (its index; 0 unless set): a library kernel
 * that sizes its workspace from the device's own heuristics (cuDNN's
 * convolutions) asks that device while a planned step has no data. */
void kiln_meta_kernels_set_index(int index);
int kiln_meta_kernels_index(void);

/* The caching allocator of `device`, created on first use. NULL with an
 * error if the device is unavailable. */
kiln_caching_allocator *kiln_device_allocator(kiln_device device);
/* The pinned host allocator (cached). */
kiln_caching_allocator *kiln_pinned_allocator(void);

/* The generator of `device` (seeded by kiln_manual_seed, split per device).
 * kiln_rng_advance on it reserves a draw. Thread-safe via the returned
 * lock-protected helper below. */
kiln_rng kiln_device_rng_reserve(kiln_device device, uint64_t n_words);
void kiln_device_rng_seed_all(uint64_t seed);
/* Put `device`'s generator back at `state` (a value kiln_device_rng_reserve
 * returned with n_words 0): gradient checkpointing replays a forward's
 * draws. */
void kiln_device_rng_set(kiln_device device, kiln_rng state);
/* Every device generator's seed and position, saved and put back as a
 * whole (kiln_step_snapshot: a retried step draws what the failed one
 * drew). */
typedef struct kiln_rng_positions {
    uint64_t seed;
    kiln_rng rng[KILN_DEVICE_TYPE_COUNT][KILN_MAX_DEVICES];
    bool ready[KILN_DEVICE_TYPE_COUNT][KILN_MAX_DEVICES];
} kiln_rng_positions;
void kiln_device_rng_save(kiln_rng_positions *out);
void kiln_device_rng_restore(const kiln_rng_positions *in);

/* An observer of this thread's kiln_memory_alloc / kiln_memory_free calls
 * (the trace layer's, while kiln_trace records: which blocks a traced call
 * made and freed). NULL when none: one predictable branch per call.
 * alloc: true for a successful allocation of `bytes` at ptr, false for a
 * free of ptr. Returns the previous observer. */
typedef struct kiln_memory_observer {
    void *ctx;
    void (*event)(void *ctx, kiln_device device, void *ptr, size_t bytes, bool alloc);
} kiln_memory_observer;
const kiln_memory_observer *kiln_memory_set_observer(const kiln_memory_observer *o);

/* Free the default stream records (kiln_shutdown). */
void kiln_streams_shutdown(void);

/* Called by kiln_init / kiln_shutdown. */
kiln_status kiln_runtime_init(void);
/* KILN_DEVICE (cpu, cuda, cuda:N; emulated devices too) as the default
 * device; an unknown or unavailable one is kiln_init's error. */
kiln_status kiln_device_default_from_env(void);
/* KILN_NUM_THREADS into the OpenMP pool (threads.c); called by kiln_init. */
kiln_status kiln_threads_init(void);
void kiln_runtime_shutdown(void);

#endif

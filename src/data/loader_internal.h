/* The loader's shared pieces: the host batch buffers of its pool
 * (loader.c) and the device prefetcher (prefetch.c). Not installed. */
#ifndef KILN_SRC_DATA_LOADER_INTERNAL_H
#define KILN_SRC_DATA_LOADER_INTERNAL_H

#include "kiln/data.h"
#include "kiln/runtime.h"

/* One host batch: x f32 (B, C, H, W) and y i64 (B), pinned when the loader
 * pins. The pool holds one reference to each tensor; batches are handed
 * out as fresh views, so the buffer is free again exactly when no handle
 * but the pool's refers to its storage. */
typedef struct loader_buffer {
    kiln_tensor *x; /* (B, C, H, W) f32 */
    kiln_tensor *y; /* (B) i64 */
    /* Work that reads the buffer and must finish before it is refilled: the
     * prefetch copy, or the consumer's own copies (recorded on its stream
     * when the buffer comes back). NULL until first needed. */
    kiln_event *reuse_event;
    bool reuse_pending; /* reuse_event was recorded since the last refill */
    int state;          /* loader_buffer_state */
} loader_buffer;

enum loader_buffer_state { BUF_FREE = 0, BUF_FILLING, BUF_READY, BUF_OUT };

/* True when only the pool refers to b's storage (the consumer dropped
 * every handle and view). */
bool loader_buffer_released(const loader_buffer *b);

/* The first `rows` rows (dim 0) of pooled tensor t as a new contiguous
 * handle on its storage (never registered with a scope). */
kiln_tensor *loader_rows_view(kiln_tensor *t, int64_t rows);

/* The device prefetcher (DataPrefetcher): copies of host batches on a
 * dedicated stream, one batch ahead of the consumer. */
typedef struct loader_prefetch loader_prefetch;

kiln_status loader_prefetch_create(kiln_device device, loader_prefetch **out);
/* Queue the copy of buf's first `rows` rows to the device on the copy
 * stream and record an event after it, also as buf's reuse event. Takes no
 * reference to buf: the caller may return it to the free list at once,
 * since a refill first synchronises the reuse event. */
kiln_status loader_prefetch_stage(loader_prefetch *p, loader_buffer *buf, int64_t rows);
/* True when a batch is staged. */
bool loader_prefetch_staged(const loader_prefetch *p);
/* Hand the staged batch to the caller: the caller's current stream of the
 * device waits on the copy's event, the device tensors are recorded on
 * that stream, and the references move to *x, *y. */
kiln_status loader_prefetch_take(loader_prefetch *p, kiln_tensor **x, kiln_tensor **y);
/* Drop a staged batch (epoch change, shutdown). */
void loader_prefetch_discard(loader_prefetch *p);
/* Waits for the copy stream's work, then frees. */
void loader_prefetch_free(loader_prefetch *p);
/* Tests only: while set, loader_prefetch_take does NOT make the consumer
 * stream wait on the copy's event (the bug the emulated cuda:0 tests must
 * catch). Process-wide; off unless a test sets it. */
void loader_prefetch_test_skip_wait(bool skip);
/* Tests only: while set, loader_prefetch_take does NOT record the device
 * batch on the consumer's stream (its memory may then be reused by a later
 * copy while the consumer still reads it). */
void loader_prefetch_test_skip_record(bool skip);
/* The prefetcher's copy stream (tests hold it in the CUDA emulator). */
kiln_stream *loader_prefetch_stream(const loader_prefetch *p);
/* Tests only: the loader's copy stream, NULL when it has no prefetcher. */
kiln_stream *loader_test_copy_stream(const kiln_loader *l);

/* Dataset-on-device mode (device_data.c): the dataset in one tensor on the
 * device, batches made by ops on the caller's current stream. */
typedef struct loader_ondevice loader_ondevice;

/* Bytes the upload of n samples takes (padded images, twice when the
 * transforms flip, + i64 labels). */
int64_t loader_ondevice_bytes(const kiln_transform_opts *t, kiln_sample_info info, int64_t n);
/* Read every sample of ds, pad it for opts->transforms' crop and upload it
 * with the labels to opts->device (blocking). opts must have passed the
 * loader's checks. */
kiln_status loader_ondevice_create(kiln_dataset *ds, const kiln_loader_opts *opts, loader_ondevice **out);
/* Bytes held on the device. */
int64_t loader_ondevice_size(const loader_ondevice *d);
/* Queue the batch of samples idx[0..rows) of `epoch` (rows <= batch_size)
 * on the current stream of the device: *x f32 (rows, C, H, W), *y i64
 * (rows), new unregistered references. */
kiln_status loader_ondevice_batch(loader_ondevice *d, const int64_t *idx, int64_t rows, int64_t epoch,
                                  kiln_tensor **x, kiln_tensor **y);
/* Waits for the parameter uploads, then frees. NULL is a no-op. */
void loader_ondevice_free(loader_ondevice *d);

#endif

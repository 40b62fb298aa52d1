/* The backend vtable: one per device type, filled by each backend and
 * registered explicitly by kiln_init. Everything a device can do for the
 * runtime and the allocators, nothing about ops.
 *
 * Entries marked (optional) may be NULL. Every entry that can fail returns
 * a kiln_status and sets the thread-local error. `index` is the device
 * index within the type. Stream and event handles are the backend's own
 * (a cudaStream_t, a CPU stream record); the runtime wraps them. */
#ifndef KILN_SRC_RUNTIME_BACKEND_H
#define KILN_SRC_RUNTIME_BACKEND_H

#include "kiln/runtime.h"

typedef enum kiln_copy_kind {
    KILN_COPY_H2D = 0,
    KILN_COPY_D2H,
    KILN_COPY_D2D,  /* same device */
    KILN_COPY_PEER, /* between two devices of this type */
    KILN_COPY_H2H,
} kiln_copy_kind;

typedef struct kiln_backend {
    const char *name; /* "cpu", "cuda", "meta" */
    kiln_device_type type;
    bool host_accessible; /* device pointers can be dereferenced by the host */
    bool has_memory;      /* false for meta: the allocator simulates */
    bool emulated;        /* kernels run on the CPU (CUDA emulation): never the default device */

    int (*device_count)(void);
    /* Why the count is zero ("no CUDA driver (cudaErrorInsufficientDriver)"). */
    const char *(*absent_reason)(void);
    kiln_status (*device_name)(int index, char *buf, size_t size);
    kiln_status (*mem_info)(int index, size_t *free_bytes, size_t *total_bytes);

    /* Raw memory, below the caching allocator. On exhaustion returns
     * KILN_ERR_OUT_OF_MEMORY *without* raising (the allocator raises its
     * own, fuller message). */
    kiln_status (*raw_alloc)(int index, size_t bytes, void **ptr);
    void (*raw_free)(int index, void *ptr, size_t bytes);

    /* Copies. `stream` is a backend stream handle of device `index` (for
     * PEER, the destination `dst_index`). `async` only when the host side
     * is pinned; otherwise the copy completes before return. */
    kiln_status (*copy)(kiln_copy_kind kind, int index, int dst_index, void *dst, const void *src,
                        size_t bytes, void *stream, bool async);

    kiln_status (*stream_create)(int index, int priority, void **stream);
    /* The device's default stream handle (NULL may be a valid handle). */
    void *(*stream_default)(int index);
    void (*stream_destroy)(int index, void *stream);
    bool (*stream_query)(int index, void *stream);
    kiln_status (*stream_synchronize)(int index, void *stream);

    kiln_status (*event_create)(int index, unsigned flags, void **event);
    void (*event_destroy)(int index, void *event);
    kiln_status (*event_record)(int index, void *event, void *stream);
    bool (*event_query)(int index, void *event);
    kiln_status (*event_synchronize)(int index, void *event);
    kiln_status (*stream_wait_event)(int index, void *stream, void *event);
    kiln_status (*event_elapsed_ms)(int index, void *start, void *end, float *ms);

    kiln_status (*synchronize)(int index);

    /* (optional) Page-locked host memory; NULL: aligned host memory. */
    kiln_status (*host_alloc)(size_t bytes, void **ptr);
    void (*host_free)(void *ptr);

    /* (optional, all four or none) Graphs (CUDA graphs; src/trace's replay).
     * graph_capture_begin: the work the calling thread queues on `stream`
     * (a stream of its own, not the default one) is recorded from now on,
     * not run; the calling thread may not synchronise or allocate until
     * graph_capture_end (the backend's error names the call). graph_capture_end:
     * ends the capture and instantiates it into *graph (a handle for
     * graph_launch and graph_destroy); on failure (the capture was
     * invalidated) the capture is over all the same and *graph is NULL.
     * graph_launch queues the whole graph on `stream` as one piece of work
     * (does not block). graph_destroy frees it (a queued launch still runs).
     * graph_capture_begin first makes what a captured step would otherwise
     * make at first use on that stream (CUDA: the cuBLASLt handle and the
     * stream's GEMM workspace), since nothing may be allocated meanwhile. */
    kiln_status (*graph_capture_begin)(int index, void *stream);
    kiln_status (*graph_capture_end)(int index, void *stream, void **graph);
    kiln_status (*graph_launch)(int index, void *graph, void *stream);
    void (*graph_destroy)(int index, void *graph);

    /* (optional) Bytes of the persistent workspace a library keeps per
     * stream for its GEMMs (CUDA: cuBLASLt's, from the caching allocator,
     * counted as allocated): made at a stream's first such GEMM (or its
     * graph capture's begin), held until the stream is destroyed or
     * kiln_shutdown. 0, or NULL, when the build or the kernel choice has
     * none (the emulation build, KILN_CUDA_KERNELS=reference). Does not
     * block; the planner (src/plan) adds it to a step's memory. */
    size_t (*stream_workspace_bytes)(int index);
} kiln_backend;

/* Register a backend for its type (kiln_init does this). Replaces any
 * earlier one. */
void kiln_backend_register(const kiln_backend *backend);
/* The registered backend for `type`, or NULL. */
const kiln_backend *kiln_backend_get(kiln_device_type type);
/* The backend of `device` after checking that the device is available;
 * NULL with an error naming the device otherwise. */
const kiln_backend *kiln_backend_for(kiln_device device);

/* Most device indices per type that the runtime tracks state for. */
#define KILN_MAX_DEVICES 64

/* Backends compiled into this build. */
const kiln_backend *kiln_cpu_backend(void);
const kiln_backend *kiln_meta_backend(void);
#ifdef KILN_WITH_CUDA
const kiln_backend *kiln_cuda_backend(void);
#endif

#endif

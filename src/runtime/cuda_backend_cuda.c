/* The CUDA backend: the kiln_backend vtable over the CUDA runtime API.
 *
 * Without a driver (cudaErrorInsufficientDriver, or error 34 when the
 * toolkit's link-only libcuda is found first) or without a device, the
 * backend reports 0 devices and says why in absent_reason; nothing raises,
 * because a machine without a GPU is a normal place to run Kiln.
 *
 * Device selection: CUDA keeps a current device per host thread, and every
 * handle-less call (cudaMalloc, the legacy default stream, event creation)
 * acts on it. Each entry below makes `index` current for the duration of
 * the call and restores the caller's device afterwards, so Kiln never
 * changes which device the user's own CUDA code sees.
 *
 * Every CUDA call goes through KILN_CUDA_CHECK / KILN_CUDA_TRY, which raise
 * an error naming the call, the device, the CUDA error and file:line.
 *
 * The same file builds against the CUDA emulator (KILN_CUDA_EMULATION:
 * src/emu/include's cuda_runtime_api.h, the emulated runtime of src/emu/);
 * there the backend is marked emulated (never the default device) and its
 * errors carry the emulator's explanation (kiln_emu_error_detail). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "base/error.h"
#include "runtime/backend.h"
#include "runtime/cuda_backend.h"
#include "runtime/cuda_device.h"
#ifndef KILN_CUDA_EMULATION
#include "kernels/cuda/cuda_fast.h" /* the fast table's per-stream state (cuBLASLt) */
#endif

/* ---- Errors ------------------------------------------------------------------- */

static const char *hint_for(cudaError_t error) {
    switch (error) {
    case cudaErrorMemoryAllocation:
        return "free memory (kiln_empty_cache), lower the batch size, or turn on gradient checkpointing";
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
    case cudaErrorNoDevice:
        return "install the NVIDIA driver that matches this CUDA runtime, or use the cpu device";
    case cudaErrorInvalidDevice:
        return "check the device index against kiln_device_count(KILN_DEVICE_CUDA) and CUDA_VISIBLE_DEVICES";
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
        return "a kernel touched memory it does not own; the CUDA context is now unusable: rerun under "
               "compute-sanitizer to find it";
    case cudaErrorStreamCaptureUnsupported:
    case cudaErrorStreamCaptureInvalidated:
        return "a call that synchronises, allocates or copies pageable memory ran during a CUDA graph capture: "
               "make it before the capture or after it";
    default:
        return NULL;
    }
}

kiln_status kiln_cuda_check_at(int error, const char *call, int index, const char *file, int line) {
    cudaError_t err = (cudaError_t)error;
    if (err == cudaSuccess) return KILN_OK;
    /* Consume the runtime's record of this error (non-sticky errors only;
     * a sticky one stays and will be reported by every later call). */
    (void)cudaGetLastError();
    if (index < 0 && cudaGetDevice(&index) != cudaSuccess) {
        (void)cudaGetLastError();
        index = -1;
    }
    char device[32];
    if (index >= 0)
        snprintf(device, sizeof device, "cuda:%d", index);
    else
        snprintf(device, sizeof device, "cuda");
    kiln_status status = err == cudaErrorMemoryAllocation ? KILN_ERR_OUT_OF_MEMORY : KILN_ERR_DEVICE;
#ifdef KILN_CUDA_EMULATION
    const char *detail = kiln_emu_error_detail();
    if (detail[0])
        return kiln_error_raise(status, file, line, hint_for(err), "%s: %s failed: %s (%s) at %s:%d: %s", device,
                                call, cudaGetErrorName(err), cudaGetErrorString(err), file, line, detail);
#endif
    return kiln_error_raise(status, file, line, hint_for(err), "%s: %s failed: %s (%s) at %s:%d", device,
                            call, cudaGetErrorName(err), cudaGetErrorString(err), file, line);
}

/* Every entry below makes its device current with kiln_cuda_device_switch
 * and gives the caller's back with kiln_cuda_device_restore: no runtime
 * call when the device is current already (runtime/cuda_device.h). */

/* Entries that cannot return a status (free, destroy, query) still raise
 * the error so kiln_error_last() shows it, and log it because nobody may
 * look. */
static void log_failure(kiln_status status) {
    if (status != KILN_OK) kiln_log_write(KILN_LOG_ERROR, "%s", kiln_error_message());
}

/* ---- Devices ------------------------------------------------------------------- */

static pthread_once_t count_once = PTHREAD_ONCE_INIT;
static int device_count_cached;
static char absent_reason_text[256];

/* Why CUDA is unusable, in words a user can act on. */
static const char *absence_summary(cudaError_t err) {
    switch (err) {
    case cudaErrorInsufficientDriver:
        return "no CUDA driver";
    case cudaErrorStubLibrary:
        return "no CUDA driver (the toolkit's link-only libcuda was loaded instead)";
    case cudaErrorNoDevice:
        return "no CUDA device";
    default:
        return "CUDA unavailable";
    }
}

/* The count is asked once: it cannot change while the process runs
 * (CUDA_VISIBLE_DEVICES is read at CUDA's initialisation), and asking a
 * machine without a driver costs a library probe each time. */
static void count_devices(void) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(absent_reason_text, sizeof absent_reason_text, "%s (%s: %s)", absence_summary(err),
                 cudaGetErrorName(err), cudaGetErrorString(err));
        device_count_cached = 0;
        return;
    }
    if (n == 0) snprintf(absent_reason_text, sizeof absent_reason_text, "no CUDA device visible");
    if (n > KILN_MAX_DEVICES) {
        kiln_log_write(KILN_LOG_WARN, "%d CUDA devices visible; Kiln uses the first %d", n, KILN_MAX_DEVICES);
        n = KILN_MAX_DEVICES;
    }
    device_count_cached = n;
}

static int cuda_device_count(void) {
    pthread_once(&count_once, count_devices);
    return device_count_cached;
}

static const char *cuda_absent_reason(void) {
    pthread_once(&count_once, count_devices);
    return absent_reason_text;
}

static kiln_status check_index(int index) {
    int n = cuda_device_count();
    if (index >= 0 && index < n) return KILN_OK;
    if (n == 0)
        return KILN_RAISE(KILN_ERR_DEVICE, "use the cpu device", "cuda:%d requested, but %s", index,
                          cuda_absent_reason());
    return KILN_RAISE(KILN_ERR_DEVICE, "check CUDA_VISIBLE_DEVICES",
                      "cuda:%d requested, %d CUDA device%s visible", index, n, n == 1 ? "" : "s");
}

static kiln_status cuda_device_name(int index, char *buf, size_t size) {
    KILN_TRY(check_index(index));
    struct cudaDeviceProp prop;
    KILN_CUDA_TRY(index, cudaGetDeviceProperties(&prop, index));
    snprintf(buf, size, "%s", prop.name);
    return KILN_OK;
}

static kiln_status cuda_mem_info(int index, size_t *free_bytes, size_t *total_bytes) {
    int previous;
    KILN_TRY(kiln_cuda_device_switch(index, &previous));
    size_t free_b = 0, total_b = 0;
    kiln_status st = KILN_CUDA_CHECK(index, cudaMemGetInfo(&free_b, &total_b));
    kiln_cuda_device_restore(index, previous);
    if (free_bytes) *free_bytes = free_b;
    if (total_bytes) *total_bytes = total_b;
    return st;
}

kiln_status kiln_cuda_versions(int *driver, int *runtime) {
    int d = 0, r = 0;
    kiln_status st = KILN_CUDA_CHECK(-1, cudaDriverGetVersion(&d));
    if (st == KILN_OK) st = KILN_CUDA_CHECK(-1, cudaRuntimeGetVersion(&r));
    if (driver) *driver = d;
    if (runtime) *runtime = r;
    return st;
}

kiln_status kiln_cuda_device_properties(int index, char *buf, size_t size) {
    KILN_TRY(check_index(index));
    struct cudaDeviceProp prop;
    KILN_CUDA_TRY(index, cudaGetDeviceProperties(&prop, index));
    int driver = 0, runtime = 0;
    KILN_TRY(kiln_cuda_versions(&driver, &runtime));
    char mem[32];
    snprintf(buf, size, "compute capability %d.%d, %d SMs, %s, driver %d.%d, runtime %d.%d", prop.major,
             prop.minor, prop.multiProcessorCount, kiln_format_bytes(prop.totalGlobalMem, mem, sizeof mem),
             driver / 1000, (driver % 1000) / 10, runtime / 1000, (runtime % 1000) / 10);
    return KILN_OK;
}

/* ---- Memory -------------------------------------------------------------------- */

static kiln_status cuda_raw_alloc(int index, size_t bytes, void **ptr) {
    int previous;
    KILN_TRY(kiln_cuda_device_switch(index, &previous));
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes);
    kiln_status st = KILN_OK;
    if (err == cudaErrorMemoryAllocation) {
        /* Not raised: the caching allocator frees cached blocks, retries and
         * then raises its own message with the allocator's figures. */
        (void)cudaGetLastError();
        st = KILN_ERR_OUT_OF_MEMORY;
    } else {
        st = KILN_CUDA_CHECK(index, err);
    }
    kiln_cuda_device_restore(index, previous);
    if (st == KILN_OK) {
        kiln_cuda_segment_add(index, p, bytes); /* kernels find their device here */
        *ptr = p;
    }
    return st;
}

static void cuda_raw_free(int index, void *ptr, size_t bytes) {
    (void)bytes;
    kiln_cuda_segment_remove(ptr);
    int previous;
    kiln_status st = kiln_cuda_device_switch(index, &previous);
    if (st == KILN_OK) {
        st = KILN_CUDA_CHECK(index, cudaFree(ptr));
        kiln_cuda_device_restore(index, previous);
    }
    log_failure(st);
}

/* Pinned memory is allocated portable: page-locked for every device, not
 * only the one current when it was made, because the pinned pool serves
 * copies to all of them. */
static kiln_status cuda_host_alloc(size_t bytes, void **ptr) {
    void *p = NULL;
    cudaError_t err = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable);
    if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return KILN_ERR_OUT_OF_MEMORY; /* the pinned allocator raises, as for raw_alloc */
    }
    KILN_CUDA_TRY(-1, err);
    *ptr = p;
    return KILN_OK;
}

static void cuda_host_free(void *ptr) { log_failure(KILN_CUDA_CHECK(-1, cudaFreeHost(ptr))); }

/* ---- Copies -------------------------------------------------------------------- */

/* Peer access state per ordered pair (destination device, source device):
 * 0 not yet asked, 1 enabled, 2 not possible (copies are then staged by
 * the driver). Two threads may both ask; the second sees "already enabled",
 * which is harmless. */
enum { PEER_UNKNOWN = 0, PEER_ENABLED = 1, PEER_UNAVAILABLE = 2 };
static _Atomic unsigned char peer_state[KILN_MAX_DEVICES][KILN_MAX_DEVICES];

/* Called with dst current. */
static kiln_status ensure_peer_access(int dst, int src) {
    if (atomic_load(&peer_state[dst][src]) != PEER_UNKNOWN) return KILN_OK;
    int can = 0;
    KILN_CUDA_TRY(dst, cudaDeviceCanAccessPeer(&can, dst, src));
    if (!can) {
        atomic_store(&peer_state[dst][src], PEER_UNAVAILABLE);
        return KILN_OK;
    }
    cudaError_t err = cudaDeviceEnablePeerAccess(src, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled)
        (void)cudaGetLastError();
    else
        KILN_CUDA_TRY(dst, err);
    atomic_store(&peer_state[dst][src], PEER_ENABLED);
    return KILN_OK;
}

static enum cudaMemcpyKind memcpy_kind(kiln_copy_kind kind) {
    switch (kind) {
    case KILN_COPY_H2D:
        return cudaMemcpyHostToDevice;
    case KILN_COPY_D2H:
        return cudaMemcpyDeviceToHost;
    case KILN_COPY_H2H:
        return cudaMemcpyHostToHost;
    default:
        return cudaMemcpyDeviceToDevice;
    }
}

/* Everything is queued on `stream` with the Async forms so that the copy is
 * ordered with the stream's other work; a blocking copy then waits for that
 * stream only, not the whole device. For PEER, `stream` and the current
 * device are the destination's. */
static kiln_status cuda_copy(kiln_copy_kind kind, int index, int dst_index, void *dst, const void *src,
                             size_t bytes, void *stream, bool async) {
    if (bytes == 0) return KILN_OK;
    int device = kind == KILN_COPY_PEER ? dst_index : index;
    cudaStream_t s = (cudaStream_t)stream;
    int previous;
    KILN_TRY(kiln_cuda_device_switch(device, &previous));
    kiln_status st;
    if (kind == KILN_COPY_PEER) {
        st = ensure_peer_access(dst_index, index);
        if (st == KILN_OK)
            st = KILN_CUDA_CHECK(device, cudaMemcpyPeerAsync(dst, dst_index, src, index, bytes, s));
    } else {
        st = KILN_CUDA_CHECK(device, cudaMemcpyAsync(dst, src, bytes, memcpy_kind(kind), s));
    }
    if (st == KILN_OK && !async) st = KILN_CUDA_CHECK(device, cudaStreamSynchronize(s));
    kiln_cuda_device_restore(device, previous);
    return st;
}

/* ---- Streams -------------------------------------------------------------------- */

/* Kiln priorities follow CUDA's convention (0 normal, lower = higher
 * priority); out-of-range values are clamped to what the device offers. */
static kiln_status cuda_stream_create(int index, int priority, void **stream) {
    int previous;
    KILN_TRY(kiln_cuda_device_switch(index, &previous));
    int least = 0, greatest = 0;
    kiln_status st = KILN_CUDA_CHECK(index, cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t s = NULL;
    if (st == KILN_OK) {
        if (priority > least) priority = least;
        if (priority < greatest) priority = greatest;
        /* Non-blocking: Kiln's streams must not serialise with the legacy
         * default stream behind the user's back; ordering between streams
         * is explicit (wait_stream, wait_event), as in PyTorch. */
        st = KILN_CUDA_CHECK(index, cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority));
    }
    kiln_cuda_device_restore(index, previous);
    if (st == KILN_OK) *stream = s;
    return st;
}

/* The default stream is CUDA's legacy default stream, named explicitly as
 * cudaStreamLegacy so the choice does not depend on how a file was compiled
 * (--default-stream per-thread turns a NULL handle into the per-thread
 * stream). Not cudaStreamPerThread: the runtime keeps ONE default kiln_stream
 * per device, shared by all host threads, and the caching allocator keys
 * block reuse on that stream. With the per-thread stream that one key would
 * stand for a different CUDA stream on each thread, and a block freed in
 * thread A's order could be handed to thread B's unordered work. The legacy
 * stream is one queue per device, which is what the key promises (it is
 * also PyTorch's choice). Its cost, synchronising with blocking streams, does
 * not arise: Kiln creates non-blocking streams only. */
static void *cuda_stream_default(int index) {
    (void)index;
    return (void *)cudaStreamLegacy;
}

static bool is_default_stream(void *stream) {
    return stream == NULL || stream == (void *)cudaStreamLegacy || stream == (void *)cudaStreamPerThread;
}

static void cuda_stream_destroy(int index, void *stream) {
    if (is_default_stream(stream)) return;
#ifndef KILN_CUDA_EMULATION
    kiln_cuda_fast_forget_stream(index, stream); /* its GEMM workspace goes back */
#endif
    int previous;
    kiln_status st = kiln_cuda_device_switch(index, &previous);
    if (st == KILN_OK) {
        st = KILN_CUDA_CHECK(index, cudaStreamDestroy((cudaStream_t)stream));
        kiln_cuda_device_restore(index, previous);
    }
    log_failure(st);
}

/* A query that fails (a sticky error from an earlier kernel) answers true:
 * the work will never finish, and answering false would make a polling
 * caller spin forever. The error is raised and logged, and the next
 * synchronising call reports it. */
static bool query_result(cudaError_t err, int index, const char *call) {
    if (err == cudaSuccess) return true;
    if (err == cudaErrorNotReady) return false;
    log_failure(kiln_cuda_check_at((int)err, call, index, __FILE__, __LINE__));
    return true;
}

static bool cuda_stream_query(int index, void *stream) {
    int previous;
    if (kiln_cuda_device_switch(index, &previous) != KILN_OK) {
        log_failure(KILN_ERR_DEVICE);
        return true;
    }
    cudaError_t err = cudaStreamQuery((cudaStream_t)stream);
    kiln_cuda_device_restore(index, previous);
    return query_result(err, index, "cudaStreamQuery(stream)");
}

static kiln_status cuda_stream_synchronize(int index, void *stream) {
    int previous;
    KILN_TRY(kiln_cuda_device_switch(index, &previous));
    kiln_status st = KILN_CUDA_CHECK(index, cudaStreamSynchronize((cudaStream_t)stream));
    kiln_cuda_device_restore(index, previous);
    return st;
}

/* ---- Events ---------------------------------------------------------------------- */

static kiln_status cuda_event_create(int index, unsigned flags, void **event) {
    unsigned cuda_flags = cudaEventDefault;
    /* Timing costs a timestamp write per record; most events (the
     * allocator's, wait_stream's) only order work. */
    if (!(flags & KILN_EVENT_TIMING)) cuda_flags |= cudaEventDisableTiming;
    if (flags & KILN_EVENT_BLOCKING_SYNC) cuda_flags |= cudaEventBlockingSync;
    int previous;
    KILN_TRY(kiln_cuda_device_switch(index, &previous));
    cudaEvent_t e = NULL;
    kiln_status st = KILN_CUDA_CHECK(index, cudaEventCreateWithFlags(&e, cuda_flags));
    kiln_cuda_device_restore(index, previous);
    if (st == KILN_OK) *event = e;
    return st;
}

static void cuda_event_destroy(int index, void *event) {
    int previous;
    kiln_status st = kiln_cuda_device_switch(index, &previous);
    if (st == KILN_OK) {
        st = KILN_CUDA_CHECK(index, cudaEventDestroy((cudaEvent_t)event));
        kiln_cuda_device_restore(index, previous);
    }
    log_failure(st);
}

static kiln_status cuda_event_record(int index, void *event, void *stream) {
    int previous;
    KILN_TRY(kiln_cuda_device_switch(index, &previous));
    kiln_status st = KILN_CUDA_CHECK(index, cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream));
    kiln_cuda_device_restore(index, previous);
    return st;
}

static bool cuda_event_query(int index, void *event) {
    return query_result(cudaEventQuery((cudaEvent_t)event), index, "cudaEventQuery(event)");
}

static kiln_status cuda_event_synchronize(int index, void *event) {
    KILN_CUDA_TRY(index, cudaEventSynchronize((cudaEvent_t)event));
    return KILN_OK;
}

static kiln_status cuda_stream_wait_event(int index, void *stream, void *event) {
    int previous;
    KILN_TRY(kiln_cuda_device_switch(index, &previous));
    kiln_status st = KILN_CUDA_CHECK(index, cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0));
    kiln_cuda_device_restore(index, previous);
    return st;
}

static kiln_status cuda_event_elapsed_ms(int index, void *start, void *end, float *ms) {
    KILN_CUDA_TRY(index, cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)end));
    return KILN_OK;
}

static kiln_status cuda_synchronize(int index) {
    int previous;
    KILN_TRY(kiln_cuda_device_switch(index, &previous));
    kiln_status st = KILN_CUDA_CHECK(index, cudaDeviceSynchronize());
    kiln_cuda_device_restore(index, previous);
    return st;
}

/* ---- Graphs --------------------------------------------------------------------- */

/* A captured graph and its executable instance, freed together. Thread-local
 * capture mode: only the capturing thread is barred from synchronising or
 * allocating meanwhile (a loader thread's cudaMalloc goes on). */
typedef struct cuda_graph {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
} cuda_graph;

/* What a captured step would make at its first use on the stream must
 * exist before the capture, where nothing may be allocated: the cuBLASLt
 * handle and the stream's GEMM workspace (cuBLAS, unlike eager use, needs a
 * workspace set by the caller under capture). The cuDNN handles are per
 * device and made by the eager calls before (a traced program's recording);
 * the convolutions' workspaces are the program's own, in its arena. */
static kiln_status cuda_graph_capture_begin(int index, void *stream) {
#ifndef KILN_CUDA_EMULATION
    KILN_TRY(kiln_cuda_fast_prepare_stream(index, stream));
#endif
    KILN_CUDA_TRY(index, cudaStreamBeginCapture((cudaStream_t)stream, cudaStreamCaptureModeThreadLocal));
    return KILN_OK;
}

static kiln_status cuda_graph_capture_end(int index, void *stream, void **out) {
    *out = NULL;
    cudaGraph_t graph = NULL;
    KILN_CUDA_TRY(index, cudaStreamEndCapture((cudaStream_t)stream, &graph));
    cuda_graph *g = calloc(1, sizeof *g);
    if (!g) {
        (void)cudaGraphDestroy(graph);
        return KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "cuda:%d: no host memory for a CUDA graph", index);
    }
    g->graph = graph;
    int previous;
    kiln_status st = kiln_cuda_device_switch(index, &previous);
    if (st == KILN_OK) {
        st = KILN_CUDA_CHECK(index, cudaGraphInstantiate(&g->exec, graph, 0));
        kiln_cuda_device_restore(index, previous);
    }
    if (st != KILN_OK) {
        (void)cudaGraphDestroy(graph);
        free(g);
        return st;
    }
    *out = g;
    return KILN_OK;
}

static kiln_status cuda_graph_launch(int index, void *graph, void *stream) {
    int previous;
    KILN_TRY(kiln_cuda_device_switch(index, &previous));
    kiln_status st = KILN_CUDA_CHECK(index, cudaGraphLaunch(((cuda_graph *)graph)->exec, (cudaStream_t)stream));
    kiln_cuda_device_restore(index, previous);
    return st;
}

static void cuda_graph_destroy(int index, void *graph) {
    cuda_graph *g = graph;
    if (!g) return;
    log_failure(KILN_CUDA_CHECK(index, cudaGraphExecDestroy(g->exec)));
    log_failure(KILN_CUDA_CHECK(index, cudaGraphDestroy(g->graph)));
    free(g);
}

#ifndef KILN_CUDA_EMULATION
static size_t cuda_stream_workspace_bytes(int index) { return kiln_cuda_fast_stream_workspace_bytes(index); }
#endif

static const kiln_backend cuda_backend = {
    .name = "cuda",
    .type = KILN_DEVICE_CUDA,
    .host_accessible = false,
    .has_memory = true,
#ifdef KILN_CUDA_EMULATION
    .emulated = true,
#else
    .emulated = false,
#endif
    .device_count = cuda_device_count,
    .absent_reason = cuda_absent_reason,
    .device_name = cuda_device_name,
    .mem_info = cuda_mem_info,
    .raw_alloc = cuda_raw_alloc,
    .raw_free = cuda_raw_free,
    .copy = cuda_copy,
    .stream_create = cuda_stream_create,
    .stream_default = cuda_stream_default,
    .stream_destroy = cuda_stream_destroy,
    .stream_query = cuda_stream_query,
    .stream_synchronize = cuda_stream_synchronize,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_synchronize = cuda_event_synchronize,
    .stream_wait_event = cuda_stream_wait_event,
    .event_elapsed_ms = cuda_event_elapsed_ms,
    .synchronize = cuda_synchronize,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .graph_capture_begin = cuda_graph_capture_begin,
    .graph_capture_end = cuda_graph_capture_end,
    .graph_launch = cuda_graph_launch,
    .graph_destroy = cuda_graph_destroy,
#ifndef KILN_CUDA_EMULATION
    .stream_workspace_bytes = cuda_stream_workspace_bytes,
#endif
};

const kiln_backend *kiln_cuda_backend(void) { return &cuda_backend; }

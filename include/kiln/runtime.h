/* Kiln runtime: devices, streams, events, device memory and its statistics.
 *
 * Threading: current device and current streams are per thread. Streams,
 * events and allocators may be used from any thread. */
#ifndef KILN_RUNTIME_H
#define KILN_RUNTIME_H

#include "kiln/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Devices ------------------------------------------------------------ */

typedef enum kiln_device_type {
    KILN_DEVICE_CPU = 0,
    KILN_DEVICE_CUDA = 1,
    KILN_DEVICE_META = 2, /* shapes and dtypes only; memory is simulated */
    KILN_DEVICE_TYPE_COUNT
} kiln_device_type;

typedef struct kiln_device {
    kiln_device_type type;
    int index;
} kiln_device;

#define KILN_CPU ((kiln_device){KILN_DEVICE_CPU, 0})
#define KILN_META ((kiln_device){KILN_DEVICE_META, 0})
#define KILN_CUDA(i) ((kiln_device){KILN_DEVICE_CUDA, (i)})

/* Parse "cpu", "meta", "cuda" (the current CUDA device) or "cuda:N". Fails
 * with KILN_ERR_INVALID_ARGUMENT on bad text and KILN_ERR_DEVICE when the
 * index is not visible ("cuda:3 requested, 1 CUDA device visible"). */
kiln_status kiln_device_parse(const char *text, kiln_device *out);
/* Writes "cpu", "cuda:0", "meta" into buf (always NUL-terminated). Returns
 * buf for convenience. */
const char *kiln_device_str(kiln_device device, char *buf, size_t size);
/* Devices of `type` visible to this process; 0 for CUDA without a driver. */
int kiln_device_count(kiln_device_type type);
/* True when `device` exists and can run work. */
bool kiln_device_is_available(kiln_device device);
/* Why devices of `type` are absent ("no CUDA driver (error 35)") or "". */
const char *kiln_device_absent_reason(kiln_device_type type);
/* Human name ("Intel Xeon ...", "NVIDIA H100 80GB HBM3"). */
kiln_status kiln_device_name(kiln_device device, char *buf, size_t size);
/* Free and total bytes of the device as its driver/OS reports them. */
kiln_status kiln_device_mem_info(kiln_device device, size_t *free_bytes, size_t *total_bytes);
/* Set this thread's current device (used when a call gets no device). */
kiln_status kiln_set_device(kiln_device device);
/* This thread's current device; initially kiln_default_device(). */
kiln_device kiln_current_device(void);
/* The environment's KILN_DEVICE (cpu, cuda, cuda:N; an emulated device
 * too) when set, else the first real CUDA device if any, else the CPU.
 * Emulated devices are never the default unless KILN_DEVICE names one. An
 * unknown or unavailable KILN_DEVICE makes kiln_init fail, naming it. */
kiln_device kiln_default_device(void);
/* Block the host until all work queued on every stream of `device` is
 * done. Host synchronisation. */
kiln_status kiln_device_synchronize(kiln_device device);
bool kiln_device_equal(kiln_device a, kiln_device b);

/* ---- CUDA facts (what `kiln info` and autocast's dtype choice read) ---------
 * Defined in every build: without CUDA compiled in, the versions are 0 and
 * the per-device queries fail with KILN_ERR_UNSUPPORTED naming the build.
 * None of them blocks. */

/* One line about cuda:index: compute capability, SM count, memory, driver
 * and runtime versions ("compute capability 9.0, 132 SMs, 79.19 GiB,
 * driver 13.0, runtime 13.0"), into buf (always NUL-terminated). Fails
 * with KILN_ERR_DEVICE if the device is not visible. */
kiln_status kiln_cuda_device_properties(int index, char *buf, size_t size);
/* CUDA driver and runtime versions as CUDA encodes them (13000 = 13.0).
 * driver is 0 when no driver is installed, both are 0 in a build without
 * CUDA; neither is an error. Either pointer may be NULL. */
kiln_status kiln_cuda_versions(int *driver, int *runtime);
/* The compute capability of cuda:index (9.0: *major 9, *minor 0). An
 * emulated device has none: KILN_ERR_UNSUPPORTED. Either pointer may be
 * NULL. */
kiln_status kiln_cuda_capability(int index, int *major, int *minor);
/* Kiln keeps a per-thread copy of CUDA's current device and changes it only
 * through its own calls, so a kernel launch asks the runtime nothing
 * (docs/cuda.md, "Host calls per step"); it restores the caller's device
 * after each call. Code of your own that calls cudaSetDevice on a thread
 * that then runs Kiln's CUDA work must call this afterwards: the copy is
 * dropped and read from the runtime at Kiln's next device switch. Without
 * it, a later Kiln call may see a stale device and launch on the one your
 * code chose. Nothing to do in a build or a process without CUDA. Does not
 * block. */
void kiln_cuda_forget_current_device(void);

/* ---- Threads ------------------------------------------------------------- */

#define KILN_MAX_THREADS 1024

/* The threads CPU compute runs on: OpenMP's pool, which the fast CPU
 * kernels, oneDNN and OpenBLAS share. kiln_init sets it from
 * KILN_NUM_THREADS, else OMP_NUM_THREADS when set, else every online
 * core (measured fastest on an idle machine: docs/training.md, "Threads"). Call
 * from the main thread between ops: it resizes the pool for the OpenMP
 * regions this thread starts next. KILN_ERR_INVALID_ARGUMENT outside
 * 1..KILN_MAX_THREADS. */
kiln_status kiln_set_num_threads(int n);
/* The compute threads in force. */
int kiln_num_threads(void);
/* The workers a loader with num_workers < 0 (auto) starts: the online
 * cores the compute threads leave, which is 0 when they take every core
 * (batches are then made on the consumer's thread). */
int kiln_num_loader_workers(void);
/* Parse a thread count given by the user: `text` must be a whole number in
 * 1..KILN_MAX_THREADS, else KILN_ERR_INVALID_ARGUMENT with a message naming
 * `what` (the flag or variable, "--threads") and the text. `out` may be
 * NULL (validate only). */
kiln_status kiln_num_threads_parse(const char *text, const char *what, int *out);

/* ---- Streams ------------------------------------------------------------- */

/* A queue of work on one device, run in submission order. The CPU backend
 * runs work on the submitting thread, so its streams are always idle after
 * a call returns. */
typedef struct kiln_stream kiln_stream;

/* Create a stream on `device`. `priority`: 0 normal, negative higher (as
 * CUDA). The caller owns it and destroys it with kiln_stream_destroy after
 * its work is done. Does not block. */
kiln_status kiln_stream_create(kiln_device device, int priority, kiln_stream **out);
/* Waits for the stream's work, then frees it. Destroying a device's
 * default stream is refused. */
kiln_status kiln_stream_destroy(kiln_stream *stream);
/* The device's default stream, owned by the library. NULL (with an error)
 * if the device is not available. */
kiln_stream *kiln_stream_default(kiln_device device);
/* This thread's current stream for `device` (its default stream until
 * kiln_set_stream). Borrowed. */
kiln_stream *kiln_current_stream(kiln_device device);
/* Make `stream` this thread's current stream for its device. */
kiln_status kiln_set_stream(kiln_stream *stream);
/* Scoped current stream: begin saves the current stream of the stream's
 * device and sets `stream`; end restores the saved one. */
typedef struct kiln_stream_guard {
    kiln_stream *previous;
    kiln_stream *stream;
} kiln_stream_guard;
kiln_stream_guard kiln_stream_guard_begin(kiln_stream *stream);
void kiln_stream_guard_end(kiln_stream_guard *guard);
/* Make future work on `waiter` wait for work queued so far on `other`.
 * Device-side: does not block the host. */
kiln_status kiln_stream_wait_stream(kiln_stream *waiter, kiln_stream *other);
/* True when all work queued on `stream` has finished. Does not block. */
bool kiln_stream_query(kiln_stream *stream);
/* Block the host until `stream` is idle. Host synchronisation. */
kiln_status kiln_stream_synchronize(kiln_stream *stream);
kiln_device kiln_stream_device(const kiln_stream *stream);
/* A process-unique id (default streams included); never reused. */
uint64_t kiln_stream_id(const kiln_stream *stream);
int kiln_stream_priority(const kiln_stream *stream);

/* ---- Events -------------------------------------------------------------- */

typedef struct kiln_event kiln_event;

enum {
    KILN_EVENT_DEFAULT = 0,
    KILN_EVENT_TIMING = 1u << 0,        /* needed for kiln_event_elapsed_ms */
    KILN_EVENT_BLOCKING_SYNC = 1u << 1, /* synchronize sleeps instead of spinning */
};

/* Create an event on `device`. The caller owns it (kiln_event_destroy). */
kiln_status kiln_event_create(kiln_device device, unsigned flags, kiln_event **out);
void kiln_event_destroy(kiln_event *event);
/* Capture the work queued so far on `stream`. Does not block. */
kiln_status kiln_event_record(kiln_event *event, kiln_stream *stream);
/* True when the captured work is done (true for a never-recorded event). */
bool kiln_event_query(kiln_event *event);
/* Block the host until the captured work is done. Host synchronisation. */
kiln_status kiln_event_synchronize(kiln_event *event);
/* Future work on `stream` waits for `event`. Device-side; does not block. */
kiln_status kiln_stream_wait_event(kiln_stream *stream, kiln_event *event);
/* Milliseconds between two recorded, completed timing events. Fails if
 * either was created without KILN_EVENT_TIMING or has not completed. */
kiln_status kiln_event_elapsed_ms(kiln_event *start, kiln_event *end, float *ms);

/* ---- Device memory -------------------------------------------------------- */

/* Raw device memory from the device's caching allocator, for users who
 * manage buffers themselves. The block belongs to `stream` (NULL: the
 * current stream): reuse after kiln_memory_free is safe in that stream's
 * order. Rounded as described in docs/memory.md. Does not block, except
 * that an out-of-memory retry synchronises pending events. */
kiln_status kiln_memory_alloc(kiln_device device, size_t bytes, kiln_stream *stream, void **ptr);
/* Return a block from kiln_memory_alloc to the cache. */
kiln_status kiln_memory_free(kiln_device device, void *ptr);
/* Mark the block containing `ptr` as used by `stream`, so it is reused only
 * after work queued on `stream` up to its free has completed. */
kiln_status kiln_memory_record_stream(kiln_device device, void *ptr, kiln_stream *stream);

/* Pinned (page-locked) host memory from a cached pool. Without CUDA it is
 * aligned host memory marked pinned. Freed with kiln_pinned_free. */
kiln_status kiln_pinned_alloc(size_t bytes, void **ptr);
kiln_status kiln_pinned_free(void *ptr);
/* True when `ptr` points into a live pinned block. */
bool kiln_is_pinned_ptr(const void *ptr);

/* Fault injection, for proving error paths: every allocation through
 * kiln_memory_alloc and kiln_pinned_alloc (tensor storage on every device,
 * workspaces, pinned staging buffers) is counted, and once armed with
 * kiln_memory_fail_nth(n) the n-th of them from that call on (0 is the
 * next one) fails with KILN_ERR_OUT_OF_MEMORY and a message saying it was
 * injected; one failure, then allocation works again. n < 0 disarms.
 * kiln_memory_alloc_count is the number of allocations attempted since the
 * last kiln_memory_fail_nth (or since start-up), so a caller can count a
 * step's allocations with n = -1 and then walk n over them. Process-wide,
 * thread-safe; the environment variable KILN_FAIL_ALLOC=N arms it at
 * kiln_init. Does not block. */
void kiln_memory_fail_nth(int64_t n);
int64_t kiln_memory_alloc_count(void);

/* One statistic, as PyTorch keeps it: current value, peak since the last
 * peak reset, total added and total removed since the last accumulated
 * reset. */
typedef struct kiln_stat {
    int64_t current;
    int64_t peak;
    int64_t allocated;
    int64_t freed;
} kiln_stat;

typedef enum kiln_pool_kind {
    KILN_POOL_ALL = 0,
    KILN_POOL_LARGE = 1,
    KILN_POOL_SMALL = 2,
    KILN_POOL_KIND_COUNT
} kiln_pool_kind;

/* The allocator's statistics, indexed by kiln_pool_kind. */
typedef struct kiln_memory_stats {
    kiln_stat allocation[KILN_POOL_KIND_COUNT];      /* live blocks */
    kiln_stat allocated_bytes[KILN_POOL_KIND_COUNT]; /* rounded bytes of live blocks */
    kiln_stat requested_bytes[KILN_POOL_KIND_COUNT]; /* bytes as asked for */
    kiln_stat segment[KILN_POOL_KIND_COUNT];         /* raw device allocations */
    kiln_stat reserved_bytes[KILN_POOL_KIND_COUNT];  /* bytes of those */
    kiln_stat active[KILN_POOL_KIND_COUNT];          /* live + awaiting stream events */
    kiln_stat active_bytes[KILN_POOL_KIND_COUNT];
    kiln_stat inactive_split[KILN_POOL_KIND_COUNT];  /* free blocks in partly used segments */
    kiln_stat inactive_split_bytes[KILN_POOL_KIND_COUNT];
    kiln_stat oversize_allocations; /* blocks >= max_split_size */
    kiln_stat oversize_segments;
    int64_t num_alloc_retries;    /* cache flushes to satisfy a request */
    int64_t num_ooms;             /* out-of-memory errors raised */
    int64_t num_sync_all_streams; /* waits on every pending event */
    int64_t num_device_alloc;     /* raw allocations (cudaMalloc / malloc) */
    int64_t num_device_free;      /* raw frees */
    uint64_t max_split_size;      /* SIZE_MAX when unset */
    uint64_t limit_bytes;         /* effective limit, 0 when none */
} kiln_memory_stats;

/* Copy the statistics of `device`'s allocator. Does not block. */
kiln_status kiln_memory_stats_get(kiln_device device, kiln_memory_stats *out);
/* Set every peak to its current value. */
kiln_status kiln_memory_reset_peak(kiln_device device);
/* Zero allocated/freed totals and the counters. */
kiln_status kiln_memory_reset_accumulated(kiln_device device);
/* allocated_bytes.all.current / reserved_bytes.all.current (0 on error). */
size_t kiln_memory_allocated(kiln_device device);
size_t kiln_memory_reserved(kiln_device device);
/* Release every cached segment that is entirely free back to the device.
 * Waits for pending stream events first (host synchronisation). */
kiln_status kiln_empty_cache(kiln_device device);
/* Cap the memory the allocator may reserve on `device` at `fraction` of
 * the device's total (0 < fraction <= 1). */
kiln_status kiln_memory_set_fraction(kiln_device device, double fraction);
/* Cap reserved memory at `bytes` (0 removes the cap). */
kiln_status kiln_memory_set_limit(kiln_device device, size_t bytes);
/* A text table of the statistics, PyTorch's memory_summary layout. The
 * caller frees the returned string with free(). NULL on error. */
char *kiln_memory_summary(kiln_device device, bool abbreviated);

/* ---- Memory history and snapshots (docs/memory.md) ------------------------
 * PyTorch's torch.cuda.memory._record_memory_history / _dump_snapshot. */

/* Default ring-buffer size of kiln_memory_record_history (56 bytes each). */
#define KILN_MEMORY_HISTORY_DEFAULT_ENTRIES ((size_t)1 << 18)

/* enabled: start recording every event of `device`'s caching allocator
 * (alloc, free_requested, free_completed with requested and rounded sizes;
 * segment_alloc / segment_free, the raw device allocations; oom; the peak
 * and accumulated resets) with a timestamp, the stream, the op the
 * dispatcher is running and the user's file:line behind it, into a ring
 * buffer of the last `max_entries` events (0: the default). Older events
 * are folded into a baseline, so replaying the baseline and the trace
 * gives the allocator's statistics exactly. Starting again clears the
 * trace. !enabled: stop and discard the trace (write a snapshot first).
 * Off by default; while off, the allocator pays one branch per call.
 * Takes the allocator's lock; does not block on the device. */
kiln_status kiln_memory_record_history(kiln_device device, bool enabled, size_t max_entries);
/* True while `device`'s allocator records its history. */
bool kiln_memory_history_enabled(kiln_device device);
/* Write `device`'s memory snapshot to `path` as JSON: every segment with
 * its blocks (address, offset, size, requested size, state, and for live
 * blocks allocated while recording, the op and user's site that allocated
 * them), the trace and its baseline, and the statistics. The layout
 * follows PyTorch's _snapshot() (see docs/memory.md); `kiln report` draws
 * it. Without history the trace is empty. The file is replaced; the
 * caller keeps `path`. Blocks the host for the file write only (no
 * device synchronisation). */
kiln_status kiln_memory_snapshot(kiln_device device, const char *path);
/* Apply allocator settings in KILN_ALLOC_CONF syntax, e.g.
 * "limit_mb:512,max_split_size_mb:64" (see docs/memory.md). Settings that
 * shape the cache (backend, max_split_size_mb, roundup_power2_divisions)
 * apply to allocators created afterwards; limits apply at once. */
kiln_status kiln_alloc_conf_set(const char *text);

/* ---- Determinism ------------------------------------------------------------
 * A process-wide flag (torch.use_deterministic_algorithms; initially from
 * the environment variable KILN_DETERMINISTIC=1): when on, code that has a
 * faster non-deterministic path takes a run-to-run deterministic one (the
 * convolution autotuner keeps to deterministic candidates and does no
 * timing). The loader is deterministic by construction (order and
 * transforms keyed by seed, epoch and index). Checkpoints record the flag;
 * `kiln train --deterministic --resume` refuses a checkpoint written under
 * another CPU kernel table. Thread-safe. */
void kiln_set_deterministic(bool enabled);
bool kiln_deterministic(void);

/* ---- Convolution autotuning (docs/performance.md, "Autotuning") ------------
 * enabled: the first time a convolution configuration (pass, dtypes, every
 * shape including batch, stride/padding/dilation/groups, layout, math mode)
 * runs, each candidate algorithm is timed on the real buffers (one warm-up
 * and five timed runs, the fastest counts; candidates that fail to build
 * or need more workspace than the caching allocator can give are skipped)
 * and the fastest is kept for the process and written to the cache file,
 * keyed by device model and library versions, so later runs do not time
 * again. The cache file is KILN_AUTOTUNE_CACHE ("off": none), else
 * $XDG_CACHE_HOME/kiln/autotune.txt, else ~/.cache/kiln/autotune.txt; a
 * corrupt one is ignored with one warning line and rewritten. That first
 * call blocks the host while it times. !enabled: each provider's default
 * algorithm, no timing (on the CPU oneDNN's direct convolution on plain
 * NCHW, the configuration the parity tests use).
 * kiln_set_conv_autotune steers the CPU (oneDNN: direct, direct on blocked
 * layouts, Winograd), kiln_set_cudnn_benchmark CUDA (cuDNN's algorithms,
 * as torch.backends.cudnn.benchmark). Both are off by default, or on when
 * the environment variable KILN_CONV_AUTOTUNE / KILN_CUDNN_BENCHMARK is 1
 * at first use. kiln_set_deterministic(true) overrides both: deterministic
 * candidates only, the provider's first that builds and fits, no timing.
 * Process-wide, thread-safe; a change applies to configurations not yet
 * chosen in the new mode. */
void kiln_set_conv_autotune(bool enabled);
bool kiln_is_conv_autotune(void);
void kiln_set_cudnn_benchmark(bool enabled);
bool kiln_is_cudnn_benchmark(void);

/* torch.backends.cudnn.enabled. enabled (the default; KILN_CUDNN=0 in the
 * environment at first use turns it off): in a build with cuDNN
 * (kiln_build_options() says cudnn=on) the CUDA convolutions, average
 * pooling and batch norm run cuDNN's kernels where it takes the shapes;
 * !enabled: Kiln's own CUDA kernels run them. A build without cuDNN (the
 * CUDA emulation build among them) runs Kiln's kernels either way.
 * Process-wide, thread-safe; applies to the ops dispatched after the call. */
void kiln_set_cudnn_enabled(bool enabled);
bool kiln_is_cudnn_enabled(void);
/* CUDA_LAUNCH_BLOCKING=1. enabled (off by default; KILN_LAUNCH_BLOCKING=1 in
 * the environment at first use turns it on): after every CUDA kernel Kiln
 * launches (its own and the library ones: cuBLASLt, cuDNN) the host waits
 * for the device to finish, and a kernel that failed while running is
 * reported by the op that launched it: "KILN_LAUNCH_BLOCKING: op conv2d:
 * kernel ... failed on cuda:0: ...". Without it a failure inside a kernel
 * surfaces at the next call that waits for the device, naming that call.
 * Every launch blocks the host: a debugging switch, and the way to time
 * single ops from the host. Process-wide, thread-safe. */
void kiln_set_launch_blocking(bool enabled);
bool kiln_is_launch_blocking(void);

/* ---- Opaque CPU layouts (kiln/tensor.h, kiln_layout) -----------------------
 * enabled (the default; KILN_CPU_LAYOUTS=0 in the environment at first use
 * turns it off): the fast CPU kernels may leave f32 activations whose
 * channel count is a multiple of 16 in oneDNN's nChw16c layout between
 * layers (convolution, pooling, ReLU and their gradients pass it on), so no
 * reorder runs between consecutive layers. Values are the same either way
 * up to the kernels' own rounding; the layout is invisible to users (see
 * kiln_layout). Process-wide, thread-safe; affects ops started after the
 * call. */
void kiln_set_cpu_layouts(bool enabled);
bool kiln_cpu_layouts(void);

/* ---- TF32 (docs/cuda.md, "Fast paths") --------------------------------------
 * enabled: f32 matrix multiplies (cuBLASLt) and convolutions (cuDNN) on CUDA
 * devices may use TF32 tensor cores (10-bit mantissa inputs, f32
 * accumulation), as torch.backends.cuda.matmul.allow_tf32. Off by default
 * (f32 math stays f32), or on when the environment variable
 * KILN_ALLOW_TF32 is 1 at first use. No effect on the CPU or on the
 * hand-written CUDA kernels. Process-wide, thread-safe; a change applies to
 * the next op call. */
void kiln_set_allow_tf32(bool enabled);
bool kiln_allow_tf32(void);

#ifdef __cplusplus
}
#endif
#endif /* KILN_RUNTIME_H */

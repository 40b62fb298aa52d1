/* Kiln diagnostics: the profiler, efficiency counters, and (in their own
 * sections) leak and anomaly detection and the GPU monitor.
 * Everything here is thread-safe unless a function says otherwise. */
#ifndef KILN_DIAG_H
#define KILN_DIAG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/base.h"
#include "kiln/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ==== Profiler ======================================================================== */

/* Efficiency counters: always on, process-wide, nearly free (one relaxed
 * atomic add where each thing happens). In a steady-state training step
 * raw_allocs and pageable_copies should be 0 and host_syncs at most 1. */
typedef struct kiln_counters {
    uint64_t kernel_launches; /* kernels run by the dispatcher */
    uint64_t host_syncs;      /* kiln_item, blocking copies, stream/event/device synchronize */
    uint64_t raw_allocs;      /* the caching allocator asked the backend for memory */
    uint64_t pageable_copies; /* host<->device copies whose host side is not pinned */
    uint64_t bytes_h2d;
    uint64_t bytes_d2h;
} kiln_counters;

/* The counters now (since the process started or the last reset). */
void kiln_counters_get(kiln_counters *out);
/* Zero the counters. */
void kiln_counters_reset(void);
/* out = after - before, field by field (a per-step delta from two snapshots). */
void kiln_counters_diff(const kiln_counters *after, const kiln_counters *before, kiln_counters *out);

/* PyTorch's torch.profiler.schedule. All zero: record from start to stop. */
typedef struct kiln_profiler_schedule {
    int wait, warmup, active;
    int repeat;     /* cycles; 0 = repeat forever */
    int skip_first; /* steps skipped before the first cycle */
} kiln_profiler_schedule;

typedef enum kiln_profiler_action {
    KILN_PROFILER_NONE = 0,        /* not profiling */
    KILN_PROFILER_WARMUP,          /* profiling, results discarded */
    KILN_PROFILER_RECORD,          /* profiling, results kept */
    KILN_PROFILER_RECORD_AND_SAVE, /* the last active step: on_trace_ready follows it */
} kiln_profiler_action;

/* The action for step `step` (0-based) under schedule s, as PyTorch's. */
kiln_profiler_action kiln_profiler_schedule_action(const kiln_profiler_schedule *s, int64_t step);

typedef struct kiln_profiler_opts {
    kiln_profiler_schedule schedule;
    /* Called (on the thread calling kiln_profiler_step or _stop) when the
     * last active step of a cycle ends; the trace is ready: read it with
     * kiln_profiler_table / kiln_profiler_export_chrome_trace. */
    void (*on_trace_ready)(void *user);
    void *user;
} kiln_profiler_opts;

/* Start profiling (opts may be NULL: no schedule, record everything).
 * Every op then records its CPU start/end, thread, name, parent, bytes of
 * its outputs and, on devices with streams, its device time (events on
 * its stream, resolved at stop: no stall). Fails if already started.
 * Does not block. */
kiln_status kiln_profiler_start(const kiln_profiler_opts *opts);
/* Advance the schedule by one step (call once per training step, at its
 * end). Records a "ProfilerStep#N" range and the counters of the step. */
kiln_status kiln_profiler_step(void);
/* Stop profiling and keep what was recorded for the table and the trace.
 * Synchronises the devices whose device times are still pending (a host
 * sync, not counted: it is the profiler's own). */
kiln_status kiln_profiler_stop(void);
/* True between start and stop. */
bool kiln_profiler_is_running(void);
/* Counters of the last completed kiln_profiler_step (zeros before one). */
void kiln_profiler_step_counters(kiln_counters *out);

/* Record asynchronous work that has ended -- a collective that ran while
 * the thread went on (kiln_dist records each as "mpi:all_reduce",
 * "mpi:broadcast", ... from its start to the wait or poll that saw it
 * complete) -- as a record `name` from start_ns to end_ns (CLOCK_MONOTONIC
 * nanoseconds) on the calling thread's track. It has no parent and no self
 * CPU time (it did not occupy the thread): the table counts it in CPU total
 * only. name is copied. No-op when not recording. Does not block. */
void kiln_profiler_record_async(const char *name, uint64_t start_ns, uint64_t end_ns);

/* User ranges: nest like ops and appear in the table and the trace. name
 * is copied. Cost when the profiler is off: one load and a branch. */
void kiln_range_push(const char *name);
void kiln_range_pop(void);

typedef enum kiln_profiler_sort {
    KILN_SORT_SELF_CPU = 0,
    KILN_SORT_CPU_TOTAL,
    KILN_SORT_CPU_AVG,
    KILN_SORT_SELF_DEVICE,
    KILN_SORT_DEVICE_TOTAL,
    KILN_SORT_CALLS,
    KILN_SORT_BYTES,
    KILN_SORT_NAME,
} kiln_profiler_sort;

/* The last recording as a table like PyTorch's key_averages().table():
 * Name, Self CPU %, Self CPU, CPU total %, CPU total, CPU time avg,
 * Self Device, Device total, # of Calls, Output bytes, and when any
 * matmul or convolution ran, Total GFLOP and GFLOP/s; rows sorted
 * (descending; NAME ascending), at most row_limit rows (<= 0: all).
 * Returns a malloc'd string (free it), NULL on error. */
char *kiln_profiler_table(kiln_profiler_sort sort, int row_limit);
/* The last recording's device time per device: the sum of every op's own
 * device time (the table's Self Device) on each device (the CPU's kernels
 * count as its device work), in ms, in order of first appearance. Fills up to cap entries of devices and
 * ms; returns how many devices had device time (0: none, e.g. on the CPU).
 * Does not block. */
int kiln_profiler_device_times(kiln_device *devices, double *ms, int cap);
/* The last recording's arithmetic for the ops named `name`: *gflop gets
 * their floating-point operations (a multiply-add counts 2, as PyTorch's
 * with_flops; only convolutions in their three passes and matrix products
 * carry any), *seconds the time their kernels ran (device time: on the CPU
 * the kernel's own time), both summed over the calls; either may be NULL.
 * The table shows the same as its Total GFLOP and GFLOP/s columns. Returns
 * the number of calls (0: none). Does not block. */
int kiln_profiler_op_flops(const char *name, double *gflop, double *seconds);
/* Write the last recording as Chrome trace JSON (Perfetto, chrome://tracing):
 * one track per thread, one per device stream, flows from launches to
 * device work. */
kiln_status kiln_profiler_export_chrome_trace(const char *path);

/* ==== Leaks and anomalies ============================================================ */

/* One place in the user's code that created graph roots kept alive across
 * steps. Strings are static (the file is the __FILE__ of the call). */
typedef struct kiln_leak_site {
    const char *file;
    int line;
    const char *op;       /* the op called there ("add") */
    int64_t roots;        /* live graph roots created at this line */
    int64_t nodes;        /* autograd nodes reachable from them */
    int64_t node_growth;  /* nodes gained since the previous step boundary */
    uint64_t saved_bytes; /* bytes held by those nodes' saved tensors */
    uint64_t node_bytes;  /* host bytes of the node records themselves */
} kiln_leak_site;

#define KILN_LEAK_MAX_SITES 16

/* What kiln_leak_check_step found. `pattern` is NULL when nothing leaks. */
typedef struct kiln_leak_report {
    bool leaking;
    int steps;                  /* step boundaries seen since kiln_leak_check_begin */
    int growing_steps;          /* consecutive boundaries at which the graph grew */
    int64_t live_nodes;         /* autograd nodes alive now */
    uint64_t saved_bytes;       /* bytes held by all live nodes' saved tensors */
    int64_t nodes_per_step;     /* average growth over the growing steps */
    int n_sites;                /* sites[0..n_sites), most bytes held first */
    kiln_leak_site sites[KILN_LEAK_MAX_SITES];
    const char *pattern;        /* the diagnosis, a static string */
} kiln_leak_report;

/* Start watching for autograd graphs that outlive training steps: call
 * kiln_leak_check_step at each step boundary (after the step's scope has
 * ended and the optimizer has stepped). `window` is how many consecutive
 * boundaries of growth count as a leak (0: the default, 3). Resets any
 * previous history. Thread-safe; does not block on a device. */
kiln_status kiln_leak_check_begin(int window);
/* Record one step boundary: count the live autograd nodes and the bytes
 * their saved tensors hold; when they have grown at `window` consecutive
 * boundaries, fill `report` with leaking = true and the user's lines that
 * created the graph roots being kept alive (grouped by file:line, most
 * bytes first), else leaking = false. Walks the live graph under the node
 * registry's lock (cost: the number of live nodes). KILN_ERR_STATE if
 * kiln_leak_check_begin was not called. */
kiln_status kiln_leak_check_step(kiln_leak_report *report);
/* Stop watching and forget the history. */
void kiln_leak_check_end(void);
/* The report as text: a headline, the diagnosis and one line per site. The
 * caller frees it with free(); NULL on allocation failure. */
char *kiln_leak_report_format(const kiln_leak_report *report);

/* Anomaly mode (the C form of torch.autograd.detect_anomaly): after every
 * op, forward or inside a backward formula, its floating outputs are read
 * and checked for NaN and infinity. The first op that produces one fails
 * with KILN_ERR_INVALID_ARGUMENT, an error naming the op (and, inside
 * backward, the forward op being differentiated), each input's range and
 * the user's file:line, also logged at KILN_LOG_ERROR. f16 outputs above
 * 90% of the largest finite f16 (65504) log a warning once per call site.
 * Reading outputs blocks the host on devices with streams (a host
 * synchronisation per op): a debugging tool, off by default. Meta tensors
 * are skipped. Process-wide and thread-safe. */
void kiln_set_detect_anomaly(bool enabled);
bool kiln_is_anomaly_enabled(void);

/* One input's values at the time of an anomaly. */
typedef struct kiln_anomaly_input {
    bool present;
    bool floating;
    double min, max; /* over the finite values */
    int64_t n_nan, n_inf;
} kiln_anomaly_input;

/* The last anomaly found on the calling thread. */
typedef struct kiln_anomaly_report {
    bool found;
    char op[32];          /* the op whose output is not finite ("log") */
    char backward_of[32]; /* inside backward: the forward op ("sqrt"), else "" */
    const char *file;     /* the user's line: the forward call for backward ops */
    int line;
    int output;           /* which output */
    int64_t n_nan, n_pos_inf, n_neg_inf;
    bool f16_overflow;    /* an f16 result beyond 65504 */
    int n_in;
    kiln_anomaly_input in[8];
} kiln_anomaly_report;

/* Copy the calling thread's last anomaly (found = false if none since
 * kiln_anomaly_clear). Does not block. */
void kiln_anomaly_last(kiln_anomaly_report *out);
void kiln_anomaly_clear(void);

/* ==== GPU monitor ===================================================================== */

#define KILN_GPU_MAX_PROCS 8

/* One GPU as NVML reports it. A value NVML does not support on the device
 * is left at 0 and its bit in `missing` is set. */
typedef struct kiln_gpu_stats {
    int index;
    char name[96];
    unsigned util_gpu, util_memory; /* percent over the driver's last sample period */
    uint64_t memory_used, memory_total;
    double power_watts;
    unsigned temperature_c;
    unsigned clock_sm_mhz, clock_memory_mhz;
    uint64_t throttle_reasons; /* NVML's clocks-event reason bits */
    int n_procs;
    struct {
        unsigned pid;
        uint64_t memory; /* 0 when the driver cannot tell */
    } procs[KILN_GPU_MAX_PROCS];
    unsigned missing; /* KILN_GPU_MISSING_* */
} kiln_gpu_stats;

enum {
    KILN_GPU_MISSING_UTIL = 1u << 0,
    KILN_GPU_MISSING_MEMORY = 1u << 1,
    KILN_GPU_MISSING_POWER = 1u << 2,
    KILN_GPU_MISSING_TEMPERATURE = 1u << 3,
    KILN_GPU_MISSING_CLOCKS = 1u << 4,
    KILN_GPU_MISSING_THROTTLE = 1u << 5,
    KILN_GPU_MISSING_PROCS = 1u << 6,
};

/* Sample every NVIDIA GPU (up to `max`) through NVML, which is loaded at
 * run time (dlopen of libnvidia-ml.so.1: no build-time dependency; the
 * environment variable KILN_NVML_LIBRARY, read at the first call, names
 * another library to load instead: the tests point it at a fake NVML,
 * tests/diag/fake_nvml.c). Writes the number sampled to *count. Without a
 * driver: KILN_ERR_DEVICE with the error "no NVIDIA driver
 * (libnvidia-ml.so.1 not found)" (or the KILN_NVML_LIBRARY path and
 * dlerror's reason) and *count = 0.
 * Does not touch the CUDA context; takes about a millisecond per GPU. */
kiln_status kiln_gpu_monitor_sample(kiln_gpu_stats *out, int max, int *count);
/* "power cap, thermal slowdown" for NVML's reason bits ("none" for 0) into
 * buf; returns buf. */
const char *kiln_gpu_throttle_reasons_str(uint64_t reasons, char *buf, size_t size);

/* Called from the sampler thread with this sample (count may be 0, with
 * `status` saying why: no driver). `gpus` is valid during the call only. */
typedef void (*kiln_gpu_monitor_callback)(const kiln_gpu_stats *gpus, int count, kiln_status status,
                                          void *user);
/* Start a background thread that samples every `interval_ms` (>= 10) and
 * calls `callback`, the first time at once. One sampler per process:
 * KILN_ERR_STATE if one runs. */
kiln_status kiln_gpu_monitor_start(int interval_ms, kiln_gpu_monitor_callback callback, void *user);
/* Stop the sampler and wait for its thread (the callback is not running
 * once this returns). A no-op when none runs. */
void kiln_gpu_monitor_stop(void);

/* A process using Kiln, read from /proc. */
typedef struct kiln_host_process {
    int pid;
    char name[64];
    double cpu_percent; /* over the sampling interval; 100 = one core */
    uint64_t rss_bytes;
    bool self;          /* the calling process */
} kiln_host_process;

/* The calling process and every process whose executable is a `kiln`
 * binary or which maps libkiln (up to `max`, the calling process first),
 * with CPU use measured over `interval_ms` (blocks that long; 0: CPU use
 * is reported as 0) and resident memory. Linux only: KILN_ERR_UNSUPPORTED
 * where /proc is missing. */
kiln_status kiln_host_processes_sample(kiln_host_process *out, int max, int interval_ms, int *count);

/* The `kiln smi` table: one row per GPU (utilisation, memory, power,
 * temperature, clocks, throttle reasons) and its processes, or, without a
 * driver, a line saying so and the host CPU and memory of Kiln processes.
 * The caller frees *text with free(). Blocks about interval_ms. */
kiln_status kiln_smi_table(int interval_ms, char **text);

#ifdef __cplusplus
}
#endif
#endif /* KILN_DIAG_H */

/* Kiln CUDA emulator: its own C-callable calls, beyond the CUDA runtime
 * API (test hooks and diagnostics). Valid C and C++. Declared only in the
 * emulation build (KILN_CUDA_EMULATION); the real CUDA build has none of
 * them. */
#ifndef KILN_EMU_KILN_EMU_API_H
#define KILN_EMU_KILN_EMU_API_H

#include <stdbool.h>
#include <stddef.h>

#include "include/driver_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Test hook: while held, `stream` starts no further work (work already
 * running finishes); releasing it lets the queued work run. Used to make a
 * missing wait_event or record_stream fail on every run instead of by
 * luck. Synchronising on a held stream (or on an event it must record)
 * would wait forever, so the emulator aborts with a message instead after
 * KILN_CUDA_EMU_HOLD_TIMEOUT seconds (default 30). NULL or
 * cudaStreamLegacy: the calling thread's current device's legacy default
 * stream. Returns cudaErrorInvalidResourceHandle for an unknown stream.
 * Does not block. */
cudaError_t kiln_emu_hold_stream(cudaStream_t stream, bool hold);

/* The emulator's explanation of the last error it reported on the calling
 * host thread (a bad launch configuration, a host pointer passed to a
 * kernel, a copy past the end of an allocation...): "" if none. Reading it
 * clears it. The string stays valid until the thread's next runtime call. */
const char *kiln_emu_error_detail(void);

/* Counters since the process started (for tests and `kiln info`). */
typedef struct kiln_emu_stats {
    unsigned long long launches;      /* kernels run */
    unsigned long long blocks;        /* thread blocks run */
    unsigned long long fiber_switches; /* context switches between CUDA threads */
    unsigned long long async_ops;     /* stream operations run by stream workers (a graph launch is one) */
    unsigned long long direct_launches;   /* kernel launches the host queued straight on a stream */
    unsigned long long captured_launches; /* kernel launches recorded into a graph by stream capture */
    unsigned long long graph_launches;    /* cudaGraphLaunch calls (their kernels count in `launches` as they run) */
} kiln_emu_stats;
void kiln_emu_get_stats(kiln_emu_stats *stats);

/* The timeline: while on, every piece of work a stream worker runs
 * (kernels, copies, memsets; not waits on events) is recorded with its
 * device and its start and end, in seconds since the start call. Shows
 * whether two devices' streams really ran at the same time (the pipeline's
 * overlap); the times are the emulator's, not a GPU's. start clears and
 * turns it on; stop turns it off, copies up to cap intervals into out (may
 * be NULL) and returns how many were recorded. Work that runs on the
 * calling thread (synchronous copies) is not recorded. */
typedef struct kiln_emu_interval {
    int device;
    double start_s, end_s;
} kiln_emu_interval;
void kiln_emu_timeline_start(void);
int kiln_emu_timeline_stop(kiln_emu_interval *out, int cap);

/* Test hook: the next kernel launched whose name contains `kernel` (""
 * for any kernel) does not run; when its turn on its stream comes it
 * faults, as a GPU kernel with an illegal access does: its device gets the
 * sticky error cudaErrorLaunchFailure, which cudaDeviceSynchronize,
 * cudaStreamSynchronize, cudaEventSynchronize and cudaGetLastError return
 * from then on (KILN_LAUNCH_BLOCKING's test). NULL disarms it and clears
 * every device's fault (a GPU would need a new process). Does not block. */
void kiln_emu_inject_fault(const char *kernel);

/* Host threads that run thread blocks (KILN_CUDA_EMU_THREADS, default 2). */
int kiln_emu_worker_threads(void);

#ifdef __cplusplus
}
#endif
#endif

/* Kiln CUDA emulator internals shared by streams.cpp (configuration,
 * errors, the allocation table, streams and events, launch) and runtime.cpp
 * (the CUDA runtime C API on top of them). */
#ifndef KILN_EMU_STREAMS_INTERNAL_H
#define KILN_EMU_STREAMS_INTERNAL_H

#include <stdio.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "emu_internal.h"
#include "kiln_emu_api.h"

namespace kiln_emu {

constexpr int kMaxDevices = 64;
constexpr uint32_t kStreamMagic = 0x4B53544Du; /* "KSTM" */
constexpr uint32_t kEventMagic = 0x4B45564Eu;  /* "KEVN" */
constexpr size_t kSharedPerBlock = 48 * 1024;
constexpr size_t kSharedOptin = 163 * 1024; /* sm_80 */

/* ---- Configuration ---------------------------------------------------------------- */

struct config {
    int devices = 2;
    size_t memory = (size_t)4 << 30;
    int threads = 2;
    size_t stack = 64 * 1024;
    double hold_timeout_s = 30.0;
};

/* The configuration, read from the environment on first use. */
const config &cfg();

/* ---- Errors ------------------------------------------------------------------------- */

extern thread_local cudaError_t tls_last_error;
extern thread_local int tls_device;
extern thread_local char tls_detail[1024];
extern thread_local char tls_detail_out[1024];

/* Sets the thread's last error to e and returns it. */
cudaError_t fail(cudaError_t e);

/* fail(e), with a message for kiln_emu_error_detail (also printed to stderr
 * unless KILN_CUDA_EMU_QUIET is set). */
cudaError_t fail_detail(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- Allocation table ------------------------------------------------------------------ */

enum alloc_kind { ALLOC_DEVICE, ALLOC_PINNED };

struct alloc_info {
    uintptr_t base;
    size_t size;
    int device; /* -1 for pinned */
    alloc_kind kind;
};

struct alloc_table {
    std::shared_mutex m;
    std::map<uintptr_t, alloc_info> by_base;
};

alloc_table &allocs();

/* The allocation containing p (an end pointer, one past the last byte,
 * counts when `allow_end`). */
bool find_alloc(const void *p, alloc_info *out, bool allow_end = false);

/* ---- Streams and events ---------------------------------------------------------------- */

using clock_type = std::chrono::steady_clock;

/* How many streams kiln_emu_hold_stream holds now. */
extern std::atomic<int> held_streams;

struct stream;
using stream_ptr = std::shared_ptr<stream>;
struct event;
using event_ptr = std::shared_ptr<event>;

/* One queued operation: work to run, or an event record (no work). */
struct stream_op {
    std::function<void()> fn;
    bool wait = false; /* a cudaStreamWaitEvent: not work, left off the timeline */
    event_ptr record; /* set for an event record */
    uint64_t gen = 0; /* which record of the event */
};

/* ---- Stream capture (graphs.cpp) ------------------------------------------------------- */

enum node_kind { NODE_KERNEL, NODE_MEMCPY, NODE_MEMSET };

/* One node of a captured graph: the work a stream operation would have
 * done, run again at every launch of the graph. */
struct graph_node {
    node_kind kind;
    std::string name;
    std::function<void()> fn;
};
using node_ptr = std::shared_ptr<graph_node>;

/* A capture sequence in progress on one stream (cudaStreamBeginCapture):
 * the nodes recorded so far, a chain in issue order. */
struct capture {
    unsigned long long id = 0;
    int mode = 0; /* cudaStreamCaptureMode */
    std::thread::id thread;
    bool invalidated = false;
    std::string why; /* what invalidated it, for cudaStreamEndCapture's message */
    std::vector<node_ptr> nodes;
    cudaGraphNode_t last = nullptr; /* cudaStreamGetCaptureInfo's dependency */
};
using capture_ptr = std::shared_ptr<capture>;

struct stream {
    uint32_t magic = kStreamMagic;
    int device = 0;
    unsigned flags = 0;
    int priority = 0;
    bool legacy = false;
    std::mutex m;
    std::condition_variable cv;
    std::deque<stream_op> queue;
    uint64_t enqueued = 0;
    uint64_t completed = 0;
    bool held = false;
    bool stopping = false;
    capture_ptr cap; /* set while capturing: work is recorded, not queued */
    std::weak_ptr<stream> self;
};

struct event {
    uint32_t magic = kEventMagic;
    int device = 0;
    unsigned flags = 0;
    std::mutex m;
    std::condition_variable cv;
    uint64_t recorded = 0;  /* records issued */
    uint64_t completed = 0; /* the latest record that has run */
    clock_type::time_point when;
};

struct device_state {
    std::mutex m; /* guards streams and peer */
    stream_ptr legacy;
    std::vector<std::weak_ptr<stream>> streams; /* created streams, blocking or not */
    bool peer[kMaxDevices] = {};
    std::atomic<size_t> used{0};
};

struct registry {
    std::mutex m;
    std::unordered_map<const void *, stream_ptr> streams;
    std::unordered_map<const void *, event_ptr> events;
    std::unordered_map<const void *, int> max_dynamic_shared;
    device_state devices[kMaxDevices];
};

registry &reg();

/* Waits on cv until pred; past the hold timeout while a stream is held,
 * aborts (a wait on held work would never end). */
template <typename Pred> void wait_or_die(std::unique_lock<std::mutex> &lock, std::condition_variable &cv, Pred pred,
                                          const char *what) {
    auto start = clock_type::now();
    while (!pred()) {
        cv.wait_for(lock, std::chrono::milliseconds(200));
        if (pred()) return;
        double waited = std::chrono::duration<double>(clock_type::now() - start).count();
        if (held_streams.load() > 0 && waited > cfg().hold_timeout_s) {
            fprintf(stderr,
                    "kiln CUDA emulator: %s has waited %.0f s on work of a stream held by kiln_emu_hold_stream: "
                    "release the stream before waiting on it\n",
                    what, waited);
            abort();
        }
    }
}

/* A new stream of `device` with its worker thread (detached). */
stream_ptr make_stream(int device, unsigned flags, int priority, bool legacy);

int device_count();

bool is_default_handle(cudaStream_t s);

/* The stream behind a handle; NULL (with the error set) for an unknown one. */
stream_ptr resolve_stream(cudaStream_t h, cudaError_t *err);

/* The event behind a handle; NULL for an unknown one. */
event_ptr resolve_event(cudaEvent_t h);

/* A marker: the stream's count of queued operations. */
uint64_t queued_count(stream &s);

/* Waits until s has run `target` operations. */
void wait_stream_count(const stream_ptr &s, uint64_t target, const char *what);

/* Queue op on s, after the legacy-stream dependencies. Returns the count
 * the stream reaches when op has run. */
uint64_t enqueue(const stream_ptr &s, stream_op op);

/* Everything queued so far on every stream of `device` has run. */
void synchronize_device(int device, const char *what);

/* kiln_emu_inject_fault: the sticky error of `device` (cudaSuccess when
 * none), and whether the kernel `name` is the one armed to fail (disarms). */
cudaError_t device_fault(int device);
bool take_fault(const char *name, int device);
void set_device_fault(int device);

/* p in words for a message (which memory, the offset in its allocation),
 * written to buf. */
const char *describe(const void *p, char *buf, size_t size);

/* Where a copy side lives. */
enum side_kind { SIDE_PAGEABLE, SIDE_PINNED, SIDE_DEVICE };

struct side {
    side_kind kind;
    int device;
};

/* Classify [p, p+n) and check it lies inside one allocation. */
cudaError_t check_side(const char *call, const char *which, const void *p, size_t n, side *out);

/* cudaMemcpy and cudaMemcpyAsync: checks the pointers against the kind and
 * queues the copy on h. */
cudaError_t copy_common(const char *call, void *dst, const void *src, size_t count, cudaMemcpyKind kind,
                        cudaStream_t h, bool async);

/* Stream capture (graphs.cpp). capture_node: when s is capturing, records
 * fn as a node of its graph and returns true (nothing is queued); false
 * when s is not capturing. capture_forbid: cudaSuccess, or, when an active
 * capture forbids `call` on this thread (CUDA's "potentially unsafe" calls:
 * synchronisation, cudaMalloc/cudaFree, synchronous copies; forbidden to
 * the capturing thread unless its mode is relaxed, and to every thread
 * while a global-mode capture runs), invalidates that capture and fails
 * with cudaErrorStreamCaptureUnsupported. capture_refuse: s is capturing
 * and `call` cannot be captured there: invalidates and fails with e. */
capture_ptr capturing(const stream_ptr &s);
bool capture_node(const stream_ptr &s, node_kind kind, const char *name, std::function<void()> fn);
cudaError_t capture_forbid(const char *call);
cudaError_t capture_refuse(const stream_ptr &s, cudaError_t e, const char *call, const char *why);

/* kiln_emu_timeline_start / _stop (kiln_emu_api.h). */
void timeline_start();
int timeline_stop(kiln_emu_interval *out, int cap);

} // namespace kiln_emu

#endif

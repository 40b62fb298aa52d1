/* Kiln CUDA emulator: the CUDA runtime API on the CPU.
 *
 * Devices: KILN_CUDA_EMU_DEVICES of them (default 2), each with
 * KILN_CUDA_EMU_MEMORY bytes (default 4 GiB; "1GiB", "512MiB" accepted).
 * Device memory is host memory from posix_memalign with the exact size asked
 * (padding would hide overruns from AddressSanitizer), registered in an
 * allocation table with its device; pinned host memory (cudaHostAlloc) is
 * registered too. Copies, memsets and kernel pointer arguments are checked
 * against the table: a host pointer where device memory is needed, memory
 * of another device without peer access, or a range past the end of an
 * allocation is an error with a message (kiln_emu_error_detail).
 *
 * Streams are asynchronous: each has a worker thread that runs its
 * operations in order (kernels, copies, memsets, event records, waits on
 * events). Copies between device memory and pinned memory run on the worker;
 * a copy involving pageable host memory completes before the call returns,
 * as in CUDA. The legacy default stream of a device serialises with the
 * device's blocking streams (those created without cudaStreamNonBlocking):
 * work queued on it waits for all earlier work queued on them, and their
 * later work waits for it. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "emu_internal.h"

namespace kiln_emu {
namespace {

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

size_t parse_bytes(const char *name, const char *s, size_t fallback) {
    char *end = nullptr;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0) {
        fprintf(stderr, "kiln CUDA emulator: %s='%s' is not a size (use e.g. 1GiB, 512MiB, 1048576)\n", name, s);
        return fallback;
    }
    while (*end == ' ') end++;
    double mul = 1;
    if (!strcasecmp(end, "k") || !strcasecmp(end, "kib") || !strcasecmp(end, "kb"))
        mul = 1024.0;
    else if (!strcasecmp(end, "m") || !strcasecmp(end, "mib") || !strcasecmp(end, "mb"))
        mul = 1024.0 * 1024;
    else if (!strcasecmp(end, "g") || !strcasecmp(end, "gib") || !strcasecmp(end, "gb"))
        mul = 1024.0 * 1024 * 1024;
    else if (*end && strcasecmp(end, "b")) {
        fprintf(stderr, "kiln CUDA emulator: %s='%s': unknown unit (use B, KiB, MiB or GiB)\n", name, s);
        return fallback;
    }
    return (size_t)(v * mul);
}

const config &cfg() {
    static const config c = [] {
        config k;
        if (const char *s = getenv("KILN_CUDA_EMU_DEVICES")) {
            int n = atoi(s);
            if (n < 0 || n > kMaxDevices)
                fprintf(stderr, "kiln CUDA emulator: KILN_CUDA_EMU_DEVICES=%s out of range 0..%d; using 2\n", s,
                        kMaxDevices);
            else
                k.devices = n;
        }
        if (const char *s = getenv("KILN_CUDA_EMU_MEMORY")) k.memory = parse_bytes("KILN_CUDA_EMU_MEMORY", s, k.memory);
        if (const char *s = getenv("KILN_CUDA_EMU_THREADS")) {
            int n = atoi(s);
            if (n >= 1 && n <= 256) k.threads = n;
        }
#if defined(__SANITIZE_ADDRESS__)
        k.stack = 256 * 1024; /* ASan's redzones make frames several times larger */
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
        k.stack = 256 * 1024;
#endif
#endif
        if (const char *s = getenv("KILN_CUDA_EMU_STACK")) {
            size_t b = parse_bytes("KILN_CUDA_EMU_STACK", s, k.stack);
            if (b >= 16 * 1024) k.stack = (b + 4095) & ~(size_t)4095;
        }
        if (const char *s = getenv("KILN_CUDA_EMU_HOLD_TIMEOUT")) {
            double t = atof(s);
            if (t > 0) k.hold_timeout_s = t;
        }
        return k;
    }();
    return c;
}

/* ---- Errors ------------------------------------------------------------------------- */

thread_local cudaError_t tls_last_error = cudaSuccess;
thread_local int tls_device = 0;
thread_local char tls_detail[1024];
thread_local char tls_detail_out[1024];

cudaError_t fail(cudaError_t e) {
    tls_last_error = e;
    return e;
}

cudaError_t fail_detail(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
cudaError_t fail_detail(cudaError_t e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tls_detail, sizeof tls_detail, fmt, ap);
    va_end(ap);
    if (getenv("KILN_CUDA_EMU_QUIET") == nullptr) fprintf(stderr, "kiln CUDA emulator: %s\n", tls_detail);
    return fail(e);
}

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

alloc_table &allocs() {
    static alloc_table *t = new alloc_table;
    return *t;
}

/* The allocation containing p (an end pointer, one past the last byte,
 * counts when `allow_end`). */
bool find_alloc(const void *p, alloc_info *out, bool allow_end = false) {
    alloc_table &t = allocs();
    uintptr_t a = (uintptr_t)p;
    std::shared_lock<std::shared_mutex> lock(t.m);
    auto it = t.by_base.upper_bound(a);
    if (it == t.by_base.begin()) return false;
    --it;
    const alloc_info &i = it->second;
    if (a < i.base + i.size || (allow_end && a == i.base + i.size) || a == i.base) {
        *out = i;
        return true;
    }
    return false;
}

/* ---- Streams and events ---------------------------------------------------------------- */

using clock_type = std::chrono::steady_clock;

std::atomic<int> held_streams{0};

struct stream;
using stream_ptr = std::shared_ptr<stream>;
struct event;
using event_ptr = std::shared_ptr<event>;

/* One queued operation: work to run, or an event record (no work). */
struct stream_op {
    std::function<void()> fn;
    event_ptr record; /* set for an event record */
    uint64_t gen = 0; /* which record of the event */
};

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

registry &reg() {
    static registry *r = new registry; /* never destroyed: workers may outlive static destructors */
    return *r;
}

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

void worker_main(stream_ptr s) {
    std::unique_lock<std::mutex> lock(s->m);
    for (;;) {
        s->cv.wait(lock, [&] { return (!s->queue.empty() && !s->held) || (s->stopping && s->queue.empty()); });
        if (s->queue.empty()) break; /* stopping */
        stream_op op = std::move(s->queue.front());
        s->queue.pop_front();
        if (op.fn) {
            lock.unlock();
            op.fn();
            op.fn = nullptr;
            stat_async_ops.fetch_add(1, std::memory_order_relaxed);
            lock.lock();
            s->completed++;
            s->cv.notify_all();
            continue;
        }
        /* Event records: this one and those right behind it complete
         * together, under the stream's lock (lock order: stream, then
         * event), so whoever sees an event complete and then asks the
         * stream finds it counted done, and a stream found idle has all its
         * events complete (as on a GPU, where a record takes no time). */
        std::vector<stream_op> records;
        records.push_back(std::move(op));
        while (!s->queue.empty() && !s->queue.front().fn) {
            records.push_back(std::move(s->queue.front()));
            s->queue.pop_front();
        }
        clock_type::time_point now = clock_type::now();
        for (stream_op &r : records) {
            event &e = *r.record;
            std::lock_guard<std::mutex> elock(e.m);
            if (r.gen > e.completed) {
                e.completed = r.gen;
                e.when = now;
            }
            e.cv.notify_all();
        }
        s->completed += records.size();
        s->cv.notify_all();
        lock.unlock();
        records.clear();
        stat_async_ops.fetch_add(1, std::memory_order_relaxed);
        lock.lock();
    }
}

stream_ptr make_stream(int device, unsigned flags, int priority, bool legacy) {
    stream_ptr s = std::make_shared<stream>();
    s->device = device;
    s->flags = flags;
    s->priority = priority;
    s->legacy = legacy;
    s->self = s;
    std::thread(worker_main, s).detach();
    return s;
}

stream_ptr legacy_stream(int device) {
    device_state &d = reg().devices[device];
    std::lock_guard<std::mutex> lock(d.m);
    if (!d.legacy) d.legacy = make_stream(device, cudaStreamDefault, 0, true);
    return d.legacy;
}

int device_count() { return cfg().devices; }

bool is_default_handle(cudaStream_t s) { return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread; }

/* The stream behind a handle; NULL (with the error set) for an unknown one. */
stream_ptr resolve_stream(cudaStream_t h, cudaError_t *err) {
    *err = cudaSuccess;
    if (is_default_handle(h)) {
        if (tls_device >= device_count()) {
            *err = cudaErrorInvalidDevice;
            return nullptr;
        }
        return legacy_stream(tls_device);
    }
    registry &r = reg();
    std::lock_guard<std::mutex> lock(r.m);
    auto it = r.streams.find((const void *)h);
    if (it == r.streams.end()) {
        *err = cudaErrorInvalidResourceHandle;
        return nullptr;
    }
    return it->second;
}

event_ptr resolve_event(cudaEvent_t h) {
    registry &r = reg();
    std::lock_guard<std::mutex> lock(r.m);
    auto it = r.events.find((const void *)h);
    return it == r.events.end() ? nullptr : it->second;
}

/* A marker: the stream's count of queued operations. */
uint64_t queued_count(stream &s) {
    std::lock_guard<std::mutex> lock(s.m);
    return s.enqueued;
}

void wait_stream_count(const stream_ptr &s, uint64_t target, const char *what) {
    std::unique_lock<std::mutex> lock(s->m);
    wait_or_die(lock, s->cv, [&] { return s->completed >= target; }, what);
}

/* Queue op on s, after the legacy-stream dependencies. Returns the count
 * the stream reaches when op has run. */
uint64_t enqueue(const stream_ptr &s, stream_op op) {
    std::vector<std::pair<stream_ptr, uint64_t>> deps;
    device_state &d = reg().devices[s->device];
    {
        std::lock_guard<std::mutex> lock(d.m);
        if (s->legacy) {
            for (auto &w : d.streams) {
                stream_ptr o = w.lock();
                if (o && !(o->flags & cudaStreamNonBlocking)) deps.emplace_back(o, queued_count(*o));
            }
        } else if (!(s->flags & cudaStreamNonBlocking) && d.legacy) {
            deps.emplace_back(d.legacy, queued_count(*d.legacy));
        }
    }
    std::lock_guard<std::mutex> lock(s->m);
    for (auto &dep : deps) {
        stream_ptr o = dep.first;
        uint64_t target = dep.second;
        stream_op w;
        w.fn = [o, target] { wait_stream_count(o, target, "a legacy default stream dependency"); };
        s->queue.push_back(std::move(w));
        s->enqueued++;
    }
    s->queue.push_back(std::move(op));
    uint64_t n = ++s->enqueued;
    s->cv.notify_all();
    return n;
}

/* Everything queued so far on every stream of `device` has run. */
void synchronize_device(int device, const char *what) {
    std::vector<stream_ptr> all;
    device_state &d = reg().devices[device];
    {
        std::lock_guard<std::mutex> lock(d.m);
        if (d.legacy) all.push_back(d.legacy);
        for (auto &w : d.streams)
            if (stream_ptr o = w.lock()) all.push_back(o);
    }
    for (auto &s : all) wait_stream_count(s, queued_count(*s), what);
}

bool peer_enabled(int from, int to) {
    if (from == to) return true;
    device_state &d = reg().devices[from];
    std::lock_guard<std::mutex> lock(d.m);
    return d.peer[to];
}

const char *describe(const void *p, char *buf, size_t size) {
    alloc_info a;
    if (!p)
        snprintf(buf, size, "NULL");
    else if (find_alloc(p, &a, true) && a.kind == ALLOC_DEVICE)
        snprintf(buf, size, "%p (cuda:%d memory, offset %zu of %zu bytes)", p, a.device, (size_t)((uintptr_t)p - a.base),
                 a.size);
    else if (find_alloc(p, &a, true))
        snprintf(buf, size, "%p (pinned host memory, offset %zu of %zu bytes)", p, (size_t)((uintptr_t)p - a.base),
                 a.size);
    else
        snprintf(buf, size, "%p (host memory that is not pinned)", p);
    return buf;
}

/* Where a copy side lives. */
enum side_kind { SIDE_PAGEABLE, SIDE_PINNED, SIDE_DEVICE };

struct side {
    side_kind kind;
    int device;
};

/* Classify [p, p+n) and check it lies inside one allocation. */
cudaError_t check_side(const char *call, const char *which, const void *p, size_t n, side *out) {
    alloc_info a;
    if (!find_alloc(p, &a)) {
        out->kind = SIDE_PAGEABLE;
        out->device = -1;
        return cudaSuccess;
    }
    out->kind = a.kind == ALLOC_DEVICE ? SIDE_DEVICE : SIDE_PINNED;
    out->device = a.device;
    uintptr_t end = (uintptr_t)p + n;
    if (end > a.base + a.size || end < (uintptr_t)p) {
        char buf[160];
        return fail_detail(cudaErrorInvalidValue,
                           "%s: %s range of %zu bytes at %s runs past the end of its allocation", call, which, n,
                           describe(p, buf, sizeof buf));
    }
    return cudaSuccess;
}

cudaError_t copy_common(const char *call, void *dst, const void *src, size_t count, cudaMemcpyKind kind,
                        cudaStream_t h, bool async) {
    if (count == 0) return cudaSuccess;
    if (!dst || !src) return fail_detail(cudaErrorInvalidValue, "%s: NULL %s pointer", call, dst ? "source" : "destination");
    if ((unsigned)kind > (unsigned)cudaMemcpyDefault)
        return fail_detail(cudaErrorInvalidMemcpyDirection, "%s: copy kind %d", call, (int)kind);
    cudaError_t err;
    stream_ptr s = resolve_stream(h, &err);
    if (!s) return fail_detail(err, "%s: unknown stream %p", call, (void *)h);
    side ds, ss;
    if ((err = check_side(call, "destination", dst, count, &ds)) != cudaSuccess) return err;
    if ((err = check_side(call, "source", src, count, &ss)) != cudaSuccess) return err;
    bool dst_dev = ds.kind == SIDE_DEVICE, src_dev = ss.kind == SIDE_DEVICE;
    const char *want = nullptr;
    switch (kind) {
    case cudaMemcpyHostToDevice:
        if (!dst_dev || src_dev) want = "host source and device destination";
        break;
    case cudaMemcpyDeviceToHost:
        if (dst_dev || !src_dev) want = "device source and host destination";
        break;
    case cudaMemcpyDeviceToDevice:
        if (!dst_dev || !src_dev) want = "device source and destination";
        break;
    case cudaMemcpyHostToHost:
        if (dst_dev || src_dev) want = "host source and destination";
        break;
    default:
        break;
    }
    if (want) {
        char a[160], b[160];
        return fail_detail(cudaErrorInvalidValue, "%s: kind %d needs a %s; got destination %s and source %s", call,
                           (int)kind, want, describe(dst, a, sizeof a), describe(src, b, sizeof b));
    }
    stream_op op;
    op.fn = [dst, src, count] { memcpy(dst, src, count); };
    uint64_t n = enqueue(s, std::move(op));
    /* Pageable host memory: the call returns after the copy, as CUDA's does
     * (for host-to-device, once the source may be reused). */
    if (!async || ds.kind == SIDE_PAGEABLE || ss.kind == SIDE_PAGEABLE) wait_stream_count(s, n, call);
    return cudaSuccess;
}

} // namespace

/* ---- Launch ------------------------------------------------------------------------------ */

int config_worker_threads() { return cfg().threads; }
size_t config_stack_bytes() { return cfg().stack; }

cudaError_t set_max_dynamic_shared(const void *fn, int bytes) {
    if (bytes < 0 || (size_t)bytes > kSharedOptin)
        return fail_detail(cudaErrorInvalidValue,
                           "cudaFuncSetAttribute: %d bytes of dynamic shared memory (the most is %zu)", bytes,
                           kSharedOptin);
    registry &r = reg();
    std::lock_guard<std::mutex> lock(r.m);
    r.max_dynamic_shared[fn] = bytes;
    return cudaSuccess;
}

void submit_launch(const launch_params &p, std::unique_ptr<kernel_body> body, const pointer_arg *ptrs, int n_ptrs) {
    const dim3 &g = p.grid, &b = p.block;
    if (!g.x || !g.y || !g.z || !b.x || !b.y || !b.z || b.x > 1024 || b.y > 1024 || b.z > 64 ||
        (uint64_t)b.x * b.y * b.z > 1024 || g.x > 2147483647u || g.y > 65535 || g.z > 65535) {
        fail_detail(cudaErrorInvalidConfiguration,
                    "kernel %s (%s:%d): invalid launch configuration grid (%u,%u,%u) block (%u,%u,%u) (at most 1024 "
                    "threads a block, block.z <= 64, grid.y and grid.z <= 65535, no zero dimension)",
                    p.name, p.file, p.line, g.x, g.y, g.z, b.x, b.y, b.z);
        return;
    }
    if (p.shmem > kSharedPerBlock) {
        size_t optin = 0;
        {
            registry &r = reg();
            std::lock_guard<std::mutex> lock(r.m);
            auto it = r.max_dynamic_shared.find(p.fn);
            if (it != r.max_dynamic_shared.end()) optin = (size_t)it->second;
        }
        if (p.shmem > optin) {
            fail_detail(cudaErrorInvalidValue,
                        "kernel %s (%s:%d): %zu bytes of dynamic shared memory; above 48 KiB needs "
                        "cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes)",
                        p.name, p.file, p.line, p.shmem);
            return;
        }
    }
    cudaError_t err;
    stream_ptr s = resolve_stream(p.stream, &err);
    if (!s) {
        fail_detail(err, "kernel %s (%s:%d): unknown stream %p", p.name, p.file, p.line, (void *)p.stream);
        return;
    }
    int device = tls_device;
    if (s->device != device) {
        fail_detail(cudaErrorInvalidResourceHandle,
                    "kernel %s (%s:%d): launched on a stream of cuda:%d while cuda:%d is current (make the "
                    "stream's device current first: kiln_cuda::device_guard)",
                    p.name, p.file, p.line, s->device, device);
        return;
    }
    for (int i = 0; i < n_ptrs; i++) {
        const void *ptr = ptrs[i].ptr;
        if (!ptr) continue;
        alloc_info a;
        char buf[160];
        if (!find_alloc(ptr, &a, true)) {
            fail_detail(cudaErrorInvalidValue,
                        "kernel %s (%s:%d): argument %d is %s, which the GPU cannot access (pass device memory, or "
                        "pinned memory from cudaHostAlloc)",
                        p.name, p.file, p.line, ptrs[i].index, describe(ptr, buf, sizeof buf));
            return;
        }
        if (a.kind == ALLOC_DEVICE && a.device != device && !peer_enabled(device, a.device)) {
            fail_detail(cudaErrorInvalidValue,
                        "kernel %s (%s:%d) on cuda:%d: argument %d is %s, and peer access from cuda:%d to cuda:%d is "
                        "not enabled",
                        p.name, p.file, p.line, device, ptrs[i].index, describe(ptr, buf, sizeof buf), device,
                        a.device);
            return;
        }
    }
    std::shared_ptr<launch_job> job = std::make_shared<launch_job>();
    job->params = p;
    job->body = std::move(body);
    job->device = device;
    stream_op op;
    op.fn = [job] { run_grid(*job); };
    enqueue(s, std::move(op));
}

} // namespace kiln_emu

using namespace kiln_emu;

/* ---- C API ------------------------------------------------------------------------------------ */

extern "C" {

static cudaError_t check_device(int d) {
    if (d < 0 || d >= device_count()) return fail(cudaErrorInvalidDevice);
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *count) {
    if (!count) return fail(cudaErrorInvalidValue);
    *count = device_count();
    if (*count == 0) return fail(cudaErrorNoDevice);
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    if (check_device(device)) return cudaErrorInvalidDevice;
    tls_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
    if (!device) return fail(cudaErrorInvalidValue);
    if (device_count() == 0) return fail(cudaErrorNoDevice);
    *device = tls_device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    if (!prop) return fail(cudaErrorInvalidValue);
    if (check_device(device)) return cudaErrorInvalidDevice;
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "Kiln CUDA emulator");
    prop->totalGlobalMem = cfg().memory;
    prop->sharedMemPerBlock = kSharedPerBlock;
    prop->sharedMemPerBlockOptin = kSharedOptin;
    prop->sharedMemPerMultiprocessor = 164 * 1024;
    prop->regsPerBlock = 65536;
    prop->regsPerMultiprocessor = 65536;
    prop->warpSize = 32;
    prop->memPitch = 2147483647;
    prop->maxThreadsPerBlock = 1024;
    prop->maxThreadsDim[0] = 1024;
    prop->maxThreadsDim[1] = 1024;
    prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 2147483647;
    prop->maxGridSize[1] = 65535;
    prop->maxGridSize[2] = 65535;
    prop->clockRate = 1410000;
    prop->totalConstMem = 65536;
    prop->major = 8;
    prop->minor = 0;
    prop->textureAlignment = 512;
    prop->deviceOverlap = 1;
    prop->multiProcessorCount = cfg().threads;
    prop->canMapHostMemory = 1;
    prop->concurrentKernels = 1;
    prop->pciBusID = device;
    prop->asyncEngineCount = 2;
    prop->unifiedAddressing = 1;
    prop->memoryClockRate = 1215000;
    prop->memoryBusWidth = 5120;
    prop->l2CacheSize = 40 * 1024 * 1024;
    prop->maxThreadsPerMultiProcessor = 2048;
    prop->streamPrioritiesSupported = 1;
    prop->managedMemory = 0;
    prop->maxBlocksPerMultiProcessor = 32;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *version) {
    if (!version) return fail(cudaErrorInvalidValue);
    *version = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *version) {
    if (!version) return fail(cudaErrorInvalidValue);
    *version = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    if (check_device(tls_device)) return cudaErrorInvalidDevice;
    synchronize_device(tls_device, "cudaDeviceSynchronize");
    return cudaSuccess;
}

cudaError_t cudaDeviceReset(void) { return cudaDeviceSynchronize(); }

cudaError_t cudaDeviceGetStreamPriorityRange(int *leastPriority, int *greatestPriority) {
    if (leastPriority) *leastPriority = 0;
    if (greatestPriority) *greatestPriority = -5;
    return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int *canAccessPeer, int device, int peerDevice) {
    if (!canAccessPeer) return fail(cudaErrorInvalidValue);
    if (check_device(device) || check_device(peerDevice)) return cudaErrorInvalidDevice;
    *canAccessPeer = device != peerDevice;
    return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags) {
    if (flags) return fail(cudaErrorInvalidValue);
    if (check_device(peerDevice)) return cudaErrorInvalidDevice;
    if (peerDevice == tls_device) return fail(cudaErrorInvalidDevice);
    device_state &d = reg().devices[tls_device];
    std::lock_guard<std::mutex> lock(d.m);
    if (d.peer[peerDevice]) return fail(cudaErrorPeerAccessAlreadyEnabled);
    d.peer[peerDevice] = true;
    return cudaSuccess;
}

cudaError_t cudaDeviceDisablePeerAccess(int peerDevice) {
    if (check_device(peerDevice)) return cudaErrorInvalidDevice;
    device_state &d = reg().devices[tls_device];
    std::lock_guard<std::mutex> lock(d.m);
    if (!d.peer[peerDevice]) return fail(cudaErrorPeerAccessNotEnabled);
    d.peer[peerDevice] = false;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = tls_last_error;
    tls_last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return tls_last_error; }

const char *cudaGetErrorName(cudaError_t error) {
    switch (error) {
#define KILN_EMU_NAME(e)                                                                                   \
    case e:                                                                                                \
        return #e;
        KILN_EMU_NAME(cudaSuccess)
        KILN_EMU_NAME(cudaErrorInvalidValue)
        KILN_EMU_NAME(cudaErrorMemoryAllocation)
        KILN_EMU_NAME(cudaErrorInitializationError)
        KILN_EMU_NAME(cudaErrorCudartUnloading)
        KILN_EMU_NAME(cudaErrorInvalidConfiguration)
        KILN_EMU_NAME(cudaErrorInvalidPitchValue)
        KILN_EMU_NAME(cudaErrorInvalidSymbol)
        KILN_EMU_NAME(cudaErrorInvalidHostPointer)
        KILN_EMU_NAME(cudaErrorInvalidDevicePointer)
        KILN_EMU_NAME(cudaErrorInvalidMemcpyDirection)
        KILN_EMU_NAME(cudaErrorStubLibrary)
        KILN_EMU_NAME(cudaErrorInsufficientDriver)
        KILN_EMU_NAME(cudaErrorNoDevice)
        KILN_EMU_NAME(cudaErrorInvalidDevice)
        KILN_EMU_NAME(cudaErrorInvalidResourceHandle)
        KILN_EMU_NAME(cudaErrorNotReady)
        KILN_EMU_NAME(cudaErrorIllegalAddress)
        KILN_EMU_NAME(cudaErrorLaunchOutOfResources)
        KILN_EMU_NAME(cudaErrorPeerAccessAlreadyEnabled)
        KILN_EMU_NAME(cudaErrorPeerAccessNotEnabled)
        KILN_EMU_NAME(cudaErrorHostMemoryAlreadyRegistered)
        KILN_EMU_NAME(cudaErrorLaunchFailure)
        KILN_EMU_NAME(cudaErrorNotSupported)
        KILN_EMU_NAME(cudaErrorUnknown)
#undef KILN_EMU_NAME
    }
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t error) {
    switch (error) {
    case cudaSuccess:
        return "no error";
    case cudaErrorInvalidValue:
        return "invalid argument";
    case cudaErrorMemoryAllocation:
        return "out of memory";
    case cudaErrorInitializationError:
        return "initialization error";
    case cudaErrorInvalidConfiguration:
        return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer:
        return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection:
        return "invalid copy direction for memcpy";
    case cudaErrorStubLibrary:
        return "CUDA driver is a stub library";
    case cudaErrorInsufficientDriver:
        return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorNoDevice:
        return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
        return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
        return "invalid resource handle";
    case cudaErrorNotReady:
        return "device not ready";
    case cudaErrorIllegalAddress:
        return "an illegal memory access was encountered";
    case cudaErrorPeerAccessAlreadyEnabled:
        return "peer access is already enabled";
    case cudaErrorPeerAccessNotEnabled:
        return "peer access has not been enabled";
    case cudaErrorLaunchFailure:
        return "unspecified launch failure";
    case cudaErrorNotSupported:
        return "operation not supported";
    default:
        return "unknown error";
    }
}

cudaError_t cudaMalloc(void **devPtr, size_t size) {
    if (!devPtr) return fail(cudaErrorInvalidValue);
    if (check_device(tls_device)) return cudaErrorInvalidDevice;
    *devPtr = nullptr;
    if (size == 0) return cudaSuccess;
    device_state &d = reg().devices[tls_device];
    size_t used = d.used.load();
    do {
        if (size > cfg().memory || used > cfg().memory - size) return fail(cudaErrorMemoryAllocation);
    } while (!d.used.compare_exchange_weak(used, used + size));
    void *p = nullptr;
    if (posix_memalign(&p, 256, size) != 0) {
        d.used -= size;
        return fail(cudaErrorMemoryAllocation);
    }
    {
        alloc_table &t = allocs();
        std::unique_lock<std::shared_mutex> lock(t.m);
        t.by_base[(uintptr_t)p] = alloc_info{(uintptr_t)p, size, tls_device, ALLOC_DEVICE};
    }
    *devPtr = p;
    return cudaSuccess;
}

cudaError_t cudaFree(void *devPtr) {
    if (!devPtr) return cudaSuccess;
    alloc_info a;
    {
        alloc_table &t = allocs();
        std::shared_lock<std::shared_mutex> lock(t.m);
        auto it = t.by_base.find((uintptr_t)devPtr);
        if (it == t.by_base.end() || it->second.kind != ALLOC_DEVICE) {
            char buf[160];
            lock.unlock();
            return fail_detail(cudaErrorInvalidValue, "cudaFree(%s): not the start of a device allocation",
                               describe(devPtr, buf, sizeof buf));
        }
        a = it->second;
    }
    /* cudaFree synchronises the device: in-flight work may still use it. */
    synchronize_device(a.device, "cudaFree");
    {
        alloc_table &t = allocs();
        std::unique_lock<std::shared_mutex> lock(t.m);
        t.by_base.erase(a.base);
    }
    free(devPtr);
    reg().devices[a.device].used -= a.size;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
    if (check_device(tls_device)) return cudaErrorInvalidDevice;
    size_t used = reg().devices[tls_device].used.load();
    if (free_bytes) *free_bytes = cfg().memory - used;
    if (total) *total = cfg().memory;
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
    (void)flags;
    if (!pHost) return fail(cudaErrorInvalidValue);
    *pHost = nullptr;
    void *p = nullptr;
    if (posix_memalign(&p, 4096, size ? size : 1) != 0) return fail(cudaErrorMemoryAllocation);
    alloc_table &t = allocs();
    std::unique_lock<std::shared_mutex> lock(t.m);
    t.by_base[(uintptr_t)p] = alloc_info{(uintptr_t)p, size ? size : 1, -1, ALLOC_PINNED};
    *pHost = p;
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **ptr, size_t size) { return cudaHostAlloc(ptr, size, cudaHostAllocDefault); }

cudaError_t cudaFreeHost(void *ptr) {
    if (!ptr) return cudaSuccess;
    {
        alloc_table &t = allocs();
        std::shared_lock<std::shared_mutex> lock(t.m);
        auto it = t.by_base.find((uintptr_t)ptr);
        if (it == t.by_base.end() || it->second.kind != ALLOC_PINNED) {
            lock.unlock();
            return fail_detail(cudaErrorInvalidValue, "cudaFreeHost(%p): not pinned memory from cudaHostAlloc", ptr);
        }
    }
    /* As CUDA's, the free waits for queued work (which may copy from it). */
    for (int d = 0; d < device_count(); d++) synchronize_device(d, "cudaFreeHost");
    {
        alloc_table &t = allocs();
        std::unique_lock<std::shared_mutex> lock(t.m);
        t.by_base.erase((uintptr_t)ptr);
    }
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr) {
    if (!attributes) return fail(cudaErrorInvalidValue);
    memset(attributes, 0, sizeof *attributes);
    attributes->device = -2;
    alloc_info a;
    if (ptr && find_alloc(ptr, &a)) {
        if (a.kind == ALLOC_DEVICE) {
            attributes->type = cudaMemoryTypeDevice;
            attributes->device = a.device;
            attributes->devicePointer = (void *)ptr;
        } else {
            attributes->type = cudaMemoryTypeHost;
            attributes->device = tls_device;
            attributes->devicePointer = (void *)ptr;
            attributes->hostPointer = (void *)ptr;
        }
    } else {
        attributes->type = cudaMemoryTypeUnregistered;
        attributes->hostPointer = (void *)ptr;
    }
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    return copy_common("cudaMemcpy", dst, src, count, kind, cudaStreamLegacy, false);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
    return copy_common("cudaMemcpyAsync", dst, src, count, kind, stream, true);
}

static cudaError_t peer_common(const char *call, void *dst, int dstDevice, const void *src, int srcDevice,
                               size_t count, cudaStream_t h, bool async) {
    if (check_device(dstDevice) || check_device(srcDevice)) return cudaErrorInvalidDevice;
    if (count == 0) return cudaSuccess;
    alloc_info a, b;
    char buf[160];
    if (!dst || !find_alloc(dst, &a) || a.kind != ALLOC_DEVICE || a.device != dstDevice)
        return fail_detail(cudaErrorInvalidValue, "%s: destination %s is not memory of cuda:%d", call,
                           describe(dst, buf, sizeof buf), dstDevice);
    if (!src || !find_alloc(src, &b) || b.kind != ALLOC_DEVICE || b.device != srcDevice)
        return fail_detail(cudaErrorInvalidValue, "%s: source %s is not memory of cuda:%d", call,
                           describe(src, buf, sizeof buf), srcDevice);
    side sd;
    cudaError_t err;
    if ((err = check_side(call, "destination", dst, count, &sd)) != cudaSuccess) return err;
    if ((err = check_side(call, "source", src, count, &sd)) != cudaSuccess) return err;
    stream_ptr s = resolve_stream(h, &err);
    if (!s) return fail_detail(err, "%s: unknown stream %p", call, (void *)h);
    stream_op op;
    op.fn = [dst, src, count] { memcpy(dst, src, count); };
    uint64_t n = enqueue(s, std::move(op));
    if (!async) wait_stream_count(s, n, call);
    return cudaSuccess;
}

cudaError_t cudaMemcpyPeer(void *dst, int dstDevice, const void *src, int srcDevice, size_t count) {
    return peer_common("cudaMemcpyPeer", dst, dstDevice, src, srcDevice, count, cudaStreamLegacy, false);
}

cudaError_t cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src, int srcDevice, size_t count,
                                cudaStream_t stream) {
    return peer_common("cudaMemcpyPeerAsync", dst, dstDevice, src, srcDevice, count, stream, true);
}

static cudaError_t memset_common(const char *call, void *p, int value, size_t count, cudaStream_t h, bool async) {
    if (count == 0) return cudaSuccess;
    alloc_info a;
    char buf[160];
    if (!p || !find_alloc(p, &a) || a.kind != ALLOC_DEVICE)
        return fail_detail(cudaErrorInvalidValue, "%s: %s is not device memory", call, describe(p, buf, sizeof buf));
    side sd;
    cudaError_t err;
    if ((err = check_side(call, "destination", p, count, &sd)) != cudaSuccess) return err;
    stream_ptr s = resolve_stream(h, &err);
    if (!s) return fail_detail(err, "%s: unknown stream %p", call, (void *)h);
    stream_op op;
    op.fn = [p, value, count] { memset(p, value, count); };
    uint64_t n = enqueue(s, std::move(op));
    if (!async) wait_stream_count(s, n, call);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *devPtr, int value, size_t count) {
    return memset_common("cudaMemset", devPtr, value, count, cudaStreamLegacy, false);
}

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream) {
    return memset_common("cudaMemsetAsync", devPtr, value, count, stream, true);
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags, int priority) {
    if (!pStream || (flags & ~(unsigned)cudaStreamNonBlocking)) return fail(cudaErrorInvalidValue);
    if (check_device(tls_device)) return cudaErrorInvalidDevice;
    if (priority > 0) priority = 0;
    if (priority < -5) priority = -5;
    stream_ptr s = make_stream(tls_device, flags, priority, false);
    registry &r = reg();
    {
        std::lock_guard<std::mutex> lock(r.m);
        r.streams[s.get()] = s;
    }
    {
        device_state &d = r.devices[tls_device];
        std::lock_guard<std::mutex> lock(d.m);
        /* Drop entries of destroyed streams while here. */
        std::vector<std::weak_ptr<stream>> live;
        for (auto &w : d.streams)
            if (!w.expired()) live.push_back(w);
        live.push_back(s);
        d.streams.swap(live);
    }
    *pStream = (cudaStream_t)s.get();
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
    return cudaStreamCreateWithPriority(pStream, flags, 0);
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream) { return cudaStreamCreateWithPriority(pStream, 0, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    if (is_default_handle(stream)) return fail(cudaErrorInvalidResourceHandle);
    stream_ptr s;
    registry &r = reg();
    {
        std::lock_guard<std::mutex> lock(r.m);
        auto it = r.streams.find((const void *)stream);
        if (it == r.streams.end()) return fail(cudaErrorInvalidResourceHandle);
        s = it->second;
        r.streams.erase(it);
    }
    {
        device_state &d = r.devices[s->device];
        std::lock_guard<std::mutex> lock(d.m);
        for (auto it = d.streams.begin(); it != d.streams.end(); ++it)
            if (it->lock() == s) {
                d.streams.erase(it);
                break;
            }
    }
    /* As in CUDA, queued work still runs; the worker exits when it is done. */
    std::lock_guard<std::mutex> lock(s->m);
    if (s->held) {
        s->held = false;
        held_streams--;
    }
    s->stopping = true;
    s->cv.notify_all();
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
    cudaError_t err;
    stream_ptr s = resolve_stream(stream, &err);
    if (!s) return fail(err);
    std::lock_guard<std::mutex> lock(s->m);
    return s->completed == s->enqueued ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    cudaError_t err;
    stream_ptr s = resolve_stream(stream, &err);
    if (!s) return fail(err);
    wait_stream_count(s, queued_count(*s), "cudaStreamSynchronize");
    return cudaSuccess;
}

cudaError_t cudaStreamGetPriority(cudaStream_t stream, int *priority) {
    cudaError_t err;
    stream_ptr s = resolve_stream(stream, &err);
    if (!s) return fail(err);
    if (priority) *priority = s->priority;
    return cudaSuccess;
}

cudaError_t cudaStreamGetFlags(cudaStream_t stream, unsigned int *flags) {
    cudaError_t err;
    stream_ptr s = resolve_stream(stream, &err);
    if (!s) return fail(err);
    if (flags) *flags = s->flags;
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *pEvent, unsigned int flags) {
    if (!pEvent || (flags & ~(unsigned)(cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess)))
        return fail(cudaErrorInvalidValue);
    if (check_device(tls_device)) return cudaErrorInvalidDevice;
    event_ptr e = std::make_shared<event>();
    e->device = tls_device;
    e->flags = flags;
    registry &r = reg();
    std::lock_guard<std::mutex> lock(r.m);
    r.events[e.get()] = e;
    *pEvent = (cudaEvent_t)e.get();
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t ev) {
    registry &r = reg();
    std::lock_guard<std::mutex> lock(r.m);
    auto it = r.events.find((const void *)ev);
    if (it == r.events.end()) return fail(cudaErrorInvalidResourceHandle);
    r.events.erase(it); /* queued records and waits keep it alive */
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t stream) {
    event_ptr e = resolve_event(ev);
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    cudaError_t err;
    stream_ptr s = resolve_stream(stream, &err);
    if (!s) return fail(err);
    if (s->device != e->device)
        return fail_detail(cudaErrorInvalidResourceHandle,
                           "cudaEventRecord: event of cuda:%d recorded on a stream of cuda:%d", e->device, s->device);
    uint64_t gen;
    {
        std::lock_guard<std::mutex> lock(e->m);
        gen = ++e->recorded;
    }
    stream_op op;
    op.record = e;
    op.gen = gen;
    enqueue(s, std::move(op));
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t ev) {
    event_ptr e = resolve_event(ev);
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::mutex> lock(e->m);
    return e->completed >= e->recorded ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
    event_ptr e = resolve_event(ev);
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    std::unique_lock<std::mutex> lock(e->m);
    uint64_t target = e->recorded;
    wait_or_die(lock, e->cv, [&] { return e->completed >= target; }, "cudaEventSynchronize");
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t ev, unsigned int flags) {
    if (flags) return fail(cudaErrorInvalidValue);
    event_ptr e = resolve_event(ev);
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    cudaError_t err;
    stream_ptr s = resolve_stream(stream, &err);
    if (!s) return fail(err);
    uint64_t target;
    {
        std::lock_guard<std::mutex> lock(e->m);
        target = e->recorded;
    }
    if (target == 0) return cudaSuccess; /* never recorded: nothing to wait for */
    stream_op op;
    op.fn = [e, target] {
        std::unique_lock<std::mutex> lock(e->m);
        wait_or_die(lock, e->cv, [&] { return e->completed >= target; }, "a stream's cudaStreamWaitEvent");
    };
    enqueue(s, std::move(op));
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    if (!ms) return fail(cudaErrorInvalidValue);
    event_ptr a = resolve_event(start), b = resolve_event(end);
    if (!a || !b) return fail(cudaErrorInvalidResourceHandle);
    if ((a->flags & cudaEventDisableTiming) || (b->flags & cudaEventDisableTiming))
        return fail(cudaErrorInvalidResourceHandle);
    clock_type::time_point ta, tb;
    {
        std::lock_guard<std::mutex> lock(a->m);
        if (a->recorded == 0) return fail(cudaErrorInvalidResourceHandle);
        if (a->completed < a->recorded) return fail(cudaErrorNotReady);
        ta = a->when;
    }
    {
        std::lock_guard<std::mutex> lock(b->m);
        if (b->recorded == 0) return fail(cudaErrorInvalidResourceHandle);
        if (b->completed < b->recorded) return fail(cudaErrorNotReady);
        tb = b->when;
    }
    *ms = (float)std::chrono::duration<double, std::milli>(tb - ta).count();
    return cudaSuccess;
}

/* ---- Emulator hooks ------------------------------------------------------------------------ */

cudaError_t kiln_emu_hold_stream(cudaStream_t stream, bool hold) {
    cudaError_t err;
    stream_ptr s = resolve_stream(stream, &err);
    if (!s) return fail(err);
    std::lock_guard<std::mutex> lock(s->m);
    if (s->held != hold) held_streams += hold ? 1 : -1;
    s->held = hold;
    s->cv.notify_all();
    return cudaSuccess;
}

const char *kiln_emu_error_detail(void) {
    memcpy(tls_detail_out, tls_detail, sizeof tls_detail_out);
    tls_detail[0] = 0;
    return tls_detail_out;
}

void kiln_emu_get_stats(kiln_emu_stats *stats) {
    if (!stats) return;
    stats->launches = stat_launches.load();
    stats->blocks = stat_blocks.load();
    stats->fiber_switches = stat_switches.load();
    stats->async_ops = stat_async_ops.load();
}

int kiln_emu_worker_threads(void) { return cfg().threads; }

} /* extern "C" */

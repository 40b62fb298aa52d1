/* Kiln CUDA emulator: the state behind the CUDA runtime API of runtime.cpp.
 *
 * Configuration from the environment (KILN_CUDA_EMU_*), the thread's last
 * error and its message, the allocation table that copies, memsets and
 * kernel pointer arguments are checked against, streams and events (one
 * worker thread a stream, the legacy default stream's ordering), and the
 * checks and queueing of kernel launches. Declared in streams_internal.h;
 * what the runtime API does with them is described at the head of
 * runtime.cpp. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

#include "streams_internal.h"

namespace kiln_emu {

/* ---- Configuration ---------------------------------------------------------------- */

static size_t parse_bytes(const char *name, const char *s, size_t fallback) {
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

cudaError_t fail_detail(cudaError_t e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tls_detail, sizeof tls_detail, fmt, ap);
    va_end(ap);
    if (getenv("KILN_CUDA_EMU_QUIET") == nullptr) fprintf(stderr, "kiln CUDA emulator: %s\n", tls_detail);
    return fail(e);
}

/* ---- Allocation table ------------------------------------------------------------------ */

alloc_table &allocs() {
    static alloc_table *t = new alloc_table;
    return *t;
}

bool find_alloc(const void *p, alloc_info *out, bool allow_end) {
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

std::atomic<int> held_streams{0};

registry &reg() {
    static registry *r = new registry; /* never destroyed: workers may outlive static destructors */
    return *r;
}

/* The timeline (kiln_emu_timeline_start): the work stream workers ran. */
static std::atomic<bool> timeline_on{false};
static std::mutex timeline_m;
static std::vector<kiln_emu_interval> timeline;
static clock_type::time_point timeline_zero;

void timeline_start() {
    std::lock_guard<std::mutex> lock(timeline_m);
    timeline.clear();
    timeline_zero = clock_type::now();
    timeline_on.store(true);
}

int timeline_stop(kiln_emu_interval *out, int cap) {
    std::lock_guard<std::mutex> lock(timeline_m);
    timeline_on.store(false);
    int n = 0;
    for (const kiln_emu_interval &iv : timeline) {
        if (out && n < cap) out[n] = iv;
        n++;
    }
    timeline.clear();
    return n;
}

static void timeline_add(int device, clock_type::time_point a, clock_type::time_point b) {
    std::lock_guard<std::mutex> lock(timeline_m);
    if (!timeline_on.load()) return;
    kiln_emu_interval iv;
    iv.device = device;
    iv.start_s = std::chrono::duration<double>(a - timeline_zero).count();
    iv.end_s = std::chrono::duration<double>(b - timeline_zero).count();
    timeline.push_back(iv);
}

static void worker_main(stream_ptr s) {
    std::unique_lock<std::mutex> lock(s->m);
    for (;;) {
        s->cv.wait(lock, [&] { return (!s->queue.empty() && !s->held) || (s->stopping && s->queue.empty()); });
        if (s->queue.empty()) break; /* stopping */
        stream_op op = std::move(s->queue.front());
        s->queue.pop_front();
        if (op.fn) {
            lock.unlock();
            bool timed = !op.wait && timeline_on.load(std::memory_order_relaxed);
            clock_type::time_point t0 = timed ? clock_type::now() : clock_type::time_point();
            op.fn();
            if (timed) timeline_add(s->device, t0, clock_type::now());
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

static stream_ptr legacy_stream(int device) {
    device_state &d = reg().devices[device];
    std::lock_guard<std::mutex> lock(d.m);
    if (!d.legacy) d.legacy = make_stream(device, cudaStreamDefault, 0, true);
    return d.legacy;
}

int device_count() { return cfg().devices; }

bool is_default_handle(cudaStream_t s) { return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread; }

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

uint64_t queued_count(stream &s) {
    std::lock_guard<std::mutex> lock(s.m);
    return s.enqueued;
}

void wait_stream_count(const stream_ptr &s, uint64_t target, const char *what) {
    std::unique_lock<std::mutex> lock(s->m);
    wait_or_die(lock, s->cv, [&] { return s->completed >= target; }, what);
}

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

static bool peer_enabled(int from, int to) {
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
    if (!async && (err = capture_forbid(call)) != cudaSuccess) return err;
    if (async && capturing(s)) {
        if (ds.kind == SIDE_PAGEABLE || ss.kind == SIDE_PAGEABLE)
            return capture_refuse(s, cudaErrorStreamCaptureUnsupported, call,
                                  "a copy with pageable host memory cannot be captured (use pinned memory)");
        capture_node(s, NODE_MEMCPY, call, [dst, src, count] { memcpy(dst, src, count); });
        return cudaSuccess;
    }
    stream_op op;
    op.fn = [dst, src, count] { memcpy(dst, src, count); };
    uint64_t n = enqueue(s, std::move(op));
    /* Pageable host memory: the call returns after the copy, as CUDA's does
     * (for host-to-device, once the source may be reused). */
    if (!async || ds.kind == SIDE_PAGEABLE || ss.kind == SIDE_PAGEABLE) wait_stream_count(s, n, call);
    return cudaSuccess;
}

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
    stream_op op;
    if (capturing(s)) {
        /* Recorded, not run: a graph launch runs it (faults are not injected into graphs). */
        std::shared_ptr<launch_job> job = std::make_shared<launch_job>();
        job->params = p;
        job->body = std::move(body);
        job->device = device;
        capture_node(s, NODE_KERNEL, p.name, [job] { run_grid(*job); });
        return;
    }
    stat_direct_launches.fetch_add(1, std::memory_order_relaxed);
    if (take_fault(p.name, device)) {
        /* The armed fault: the kernel "faults" when its turn on the stream
         * comes, as a GPU reports an illegal access: later, to whoever waits. */
        op.fn = [device] { set_device_fault(device); };
        enqueue(s, std::move(op));
        return;
    }
    std::shared_ptr<launch_job> job = std::make_shared<launch_job>();
    job->params = p;
    job->body = std::move(body);
    job->device = device;
    op.fn = [job] { run_grid(*job); };
    enqueue(s, std::move(op));
}

/* ---- Injected faults (kiln_emu_inject_fault) ---------------------------------------- */

static std::mutex fault_mutex;
static bool fault_armed;
static std::string fault_pattern;
static std::atomic<int> fault_sticky[kMaxDevices];

void set_device_fault(int device) {
    if (device >= 0 && device < kMaxDevices) fault_sticky[device].store((int)cudaErrorLaunchFailure);
}

cudaError_t device_fault(int device) {
    return device >= 0 && device < kMaxDevices ? (cudaError_t)fault_sticky[device].load() : cudaSuccess;
}

bool take_fault(const char *name, int device) {
    (void)device;
    std::lock_guard<std::mutex> lock(fault_mutex);
    if (!fault_armed || (!fault_pattern.empty() && !strstr(name, fault_pattern.c_str()))) return false;
    fault_armed = false;
    return true;
}

} // namespace kiln_emu

extern "C" void kiln_emu_inject_fault(const char *kernel) {
    using namespace kiln_emu;
    std::lock_guard<std::mutex> lock(fault_mutex);
    if (!kernel) {
        fault_armed = false;
        for (auto &f : fault_sticky) f.store(0);
        return;
    }
    fault_pattern = kernel;
    fault_armed = true;
}

namespace kiln_emu {

} // namespace kiln_emu


/* Kiln CUDA emulator: stream capture and CUDA graphs.
 *
 * cudaStreamBeginCapture puts a stream in capture mode: from then on the
 * kernels, async copies and memsets queued on it are not run but recorded
 * as the nodes of a graph, in issue order (one stream: a chain, which is
 * what a real capture of one stream gives). The launch checks still run at
 * capture time (configuration, pointer arguments), so a bad launch fails
 * where it is written. cudaStreamEndCapture hands back the graph;
 * cudaGraphInstantiate makes an executable copy; cudaGraphLaunch queues
 * ONE operation on the launch stream that runs the nodes in order, each
 * kernel node a full grid as its launch would have run (so the emulator's
 * `launches` counter counts them as they run, and `graph_launches` counts
 * the launch).
 *
 * What CUDA refuses during capture, the emulator refuses with the same
 * codes, and the capture is invalidated (cudaStreamEndCapture then fails
 * with cudaErrorStreamCaptureInvalidated and the reason):
 *   - "potentially unsafe" calls (cudaMalloc, cudaFree, cudaHostAlloc,
 *     cudaFreeHost, cudaMemcpy/cudaMemset and other synchronous copies,
 *     cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize)
 *     from the capturing thread unless its mode is relaxed, and from any
 *     thread while a global-mode capture runs: cudaErrorStreamCaptureUnsupported;
 *   - synchronising or querying the capturing stream: cudaErrorStreamCaptureUnsupported;
 *   - a copy with pageable host memory on the capturing stream (the graph
 *     would read memory the driver staged once): cudaErrorStreamCaptureUnsupported;
 *   - waiting on an event recorded outside the capture: cudaErrorStreamCaptureIsolation.
 * Not emulated (refused with cudaErrorStreamCaptureUnsupported and a
 * message saying so): event records in a capturing stream (the fork/join
 * of multi-stream capture) and graph launches into a capturing stream. */
#include <string.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "streams_internal.h"

namespace kiln_emu {

std::atomic<unsigned long long> stat_direct_launches{0}, stat_captured_launches{0}, stat_graph_launches{0};

constexpr uint32_t kGraphMagic = 0x4B475248u; /* "KGRH" */
constexpr uint32_t kExecMagic = 0x4B474558u;  /* "KGEX" */

struct graph_obj {
    uint32_t magic = kGraphMagic;
    int device = 0;
    std::vector<node_ptr> nodes;
};

struct exec_obj {
    uint32_t magic = kExecMagic;
    int device = 0;
    std::shared_ptr<const std::vector<node_ptr>> nodes;
};

struct graph_registry {
    std::mutex m;
    std::vector<capture_ptr> active; /* captures begun and not ended */
    unsigned long long next_id = 1;
    std::unordered_map<const void *, std::shared_ptr<graph_obj>> graphs;
    std::unordered_map<const void *, std::shared_ptr<exec_obj>> execs;
};

static graph_registry &greg() {
    static graph_registry *r = new graph_registry; /* never destroyed, like reg() */
    return *r;
}

static void invalidate(capture &c, const std::string &why) {
    if (c.invalidated) return;
    c.invalidated = true;
    c.why = why;
}

capture_ptr capturing(const stream_ptr &s) {
    std::lock_guard<std::mutex> lock(s->m);
    return s->cap;
}

bool capture_node(const stream_ptr &s, node_kind kind, const char *name, std::function<void()> fn) {
    capture_ptr c = capturing(s);
    if (!c) return false;
    std::lock_guard<std::mutex> lock(greg().m);
    if (!c->invalidated) {
        node_ptr n = std::make_shared<graph_node>();
        n->kind = kind;
        n->name = name;
        n->fn = std::move(fn);
        c->last = (cudaGraphNode_t)n.get();
        c->nodes.push_back(std::move(n));
        if (kind == NODE_KERNEL) stat_captured_launches.fetch_add(1, std::memory_order_relaxed);
    }
    return true;
}

cudaError_t capture_forbid(const char *call) {
    std::string hit;
    {
        graph_registry &g = greg();
        std::lock_guard<std::mutex> lock(g.m);
        std::thread::id me = std::this_thread::get_id();
        for (capture_ptr &c : g.active) {
            bool mine = c->thread == me;
            if ((mine && c->mode != cudaStreamCaptureModeRelaxed) ||
                (!mine && c->mode == cudaStreamCaptureModeGlobal)) {
                invalidate(*c, std::string(call) + " was called during the capture");
                if (hit.empty()) hit = mine ? "this thread's" : "another thread's global-mode";
            }
        }
    }
    if (hit.empty()) return cudaSuccess;
    return fail_detail(cudaErrorStreamCaptureUnsupported,
                       "%s: not permitted while %s stream capture is active (it may synchronise or allocate; "
                       "do it before cudaStreamBeginCapture or after cudaStreamEndCapture); the capture is "
                       "invalidated",
                       call, hit.c_str());
}

cudaError_t capture_refuse(const stream_ptr &s, cudaError_t e, const char *call, const char *why) {
    capture_ptr c = capturing(s);
    if (c) {
        std::lock_guard<std::mutex> lock(greg().m);
        invalidate(*c, std::string(call) + ": " + why);
    }
    return fail_detail(e, "%s on a capturing stream: %s; the capture is invalidated", call, why);
}

static std::shared_ptr<graph_obj> find_graph(cudaGraph_t h) {
    graph_registry &g = greg();
    std::lock_guard<std::mutex> lock(g.m);
    auto it = g.graphs.find((const void *)h);
    return it == g.graphs.end() ? nullptr : it->second;
}

static std::shared_ptr<exec_obj> find_exec(cudaGraphExec_t h) {
    graph_registry &g = greg();
    std::lock_guard<std::mutex> lock(g.m);
    auto it = g.execs.find((const void *)h);
    return it == g.execs.end() ? nullptr : it->second;
}

} // namespace kiln_emu

using namespace kiln_emu;

extern "C" {

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
    if ((int)mode < 0 || (int)mode > (int)cudaStreamCaptureModeRelaxed)
        return fail_detail(cudaErrorInvalidValue, "cudaStreamBeginCapture: capture mode %d", (int)mode);
    if (is_default_handle(stream))
        return fail_detail(
            cudaErrorStreamCaptureUnsupported,
            "cudaStreamBeginCapture: the legacy default stream cannot be captured (capture on a "
            "stream of your own)");
    cudaError_t err;
    stream_ptr s = resolve_stream(stream, &err);
    if (!s) return fail_detail(err, "cudaStreamBeginCapture: unknown stream %p", (void *)stream);
    capture_ptr c = std::make_shared<capture>();
    c->mode = (int)mode;
    c->thread = std::this_thread::get_id();
    graph_registry &g = greg();
    std::lock_guard<std::mutex> glock(g.m);
    std::lock_guard<std::mutex> lock(s->m);
    if (s->cap)
        return fail_detail(cudaErrorIllegalState, "cudaStreamBeginCapture: the stream is already capturing");
    c->id = g.next_id++;
    s->cap = c;
    g.active.push_back(c);
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph) {
    if (!pGraph) return fail(cudaErrorInvalidValue);
    *pGraph = nullptr;
    cudaError_t err;
    stream_ptr s = resolve_stream(stream, &err);
    if (!s) return fail_detail(err, "cudaStreamEndCapture: unknown stream %p", (void *)stream);
    capture_ptr c;
    {
        std::lock_guard<std::mutex> lock(s->m);
        c = s->cap;
        if (!c)
            return fail_detail(cudaErrorIllegalState, "cudaStreamEndCapture: the stream is not capturing");
        if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id())
            return fail_detail(cudaErrorStreamCaptureWrongThread,
                               "cudaStreamEndCapture: the capture was begun on another thread");
        s->cap = nullptr;
    }
    graph_registry &g = greg();
    std::lock_guard<std::mutex> lock(g.m);
    for (auto it = g.active.begin(); it != g.active.end(); ++it)
        if (*it == c) {
            g.active.erase(it);
            break;
        }
    if (c->invalidated)
        return fail_detail(cudaErrorStreamCaptureInvalidated,
                           "cudaStreamEndCapture: the capture was invalidated: %s", c->why.c_str());
    std::shared_ptr<graph_obj> gr = std::make_shared<graph_obj>();
    gr->device = s->device;
    gr->nodes = std::move(c->nodes);
    g.graphs[gr.get()] = gr;
    *pGraph = (cudaGraph_t)gr.get();
    return cudaSuccess;
}

/* The graph being built is not handed out (*graph_out is NULL: the
 * emulator builds it at cudaStreamEndCapture); the dependency set is the
 * last node captured, or empty. */
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, enum cudaStreamCaptureStatus *captureStatus_out,
                                     unsigned long long *id_out, cudaGraph_t *graph_out,
                                     const cudaGraphNode_t **dependencies_out,
                                     const struct cudaGraphEdgeData **edgeData_out,
                                     size_t *numDependencies_out) {
    if (!captureStatus_out) return fail(cudaErrorInvalidValue);
    cudaError_t err;
    stream_ptr s = resolve_stream(stream, &err);
    if (!s) return fail(err);
    capture_ptr c = capturing(s);
    std::lock_guard<std::mutex> lock(greg().m);
    *captureStatus_out = !c               ? cudaStreamCaptureStatusNone
                         : c->invalidated ? cudaStreamCaptureStatusInvalidated
                                          : cudaStreamCaptureStatusActive;
    bool active = c && !c->invalidated;
    if (id_out && active) *id_out = c->id;
    if (graph_out) *graph_out = nullptr;
    if (edgeData_out) *edgeData_out = nullptr;
    if (dependencies_out) *dependencies_out = active && c->last ? &c->last : nullptr;
    if (numDependencies_out) *numDependencies_out = active && c->last ? 1 : 0;
    return cudaSuccess;
}

/* The status alone: cudaStreamGetCaptureInfo's. */
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *pCaptureStatus) {
    return cudaStreamGetCaptureInfo(stream, pCaptureStatus, nullptr, nullptr, nullptr, nullptr, nullptr);
}

cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *numNodes) {
    if (!numNodes) return fail(cudaErrorInvalidValue);
    std::shared_ptr<graph_obj> g = find_graph(graph);
    if (!g) return fail_detail(cudaErrorInvalidValue, "cudaGraphGetNodes: unknown graph %p", (void *)graph);
    if (nodes)
        for (size_t i = 0; i < *numNodes && i < g->nodes.size(); i++)
            nodes[i] = (cudaGraphNode_t)g->nodes[i].get();
    *numNodes = g->nodes.size();
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph, unsigned long long flags) {
    if (!pGraphExec) return fail(cudaErrorInvalidValue);
    *pGraphExec = nullptr;
    if (flags)
        return fail_detail(cudaErrorInvalidValue, "cudaGraphInstantiate: flags 0x%llx (the emulator takes 0)",
                           flags);
    std::shared_ptr<graph_obj> g = find_graph(graph);
    if (!g)
        return fail_detail(cudaErrorInvalidValue, "cudaGraphInstantiate: unknown graph %p", (void *)graph);
    std::shared_ptr<exec_obj> e = std::make_shared<exec_obj>();
    e->device = g->device;
    e->nodes = std::make_shared<const std::vector<node_ptr>>(g->nodes);
    graph_registry &r = greg();
    std::lock_guard<std::mutex> lock(r.m);
    r.execs[e.get()] = e;
    *pGraphExec = (cudaGraphExec_t)e.get();
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
    std::shared_ptr<exec_obj> e = find_exec(graphExec);
    if (!e)
        return fail_detail(cudaErrorInvalidValue, "cudaGraphLaunch: unknown executable graph %p",
                           (void *)graphExec);
    cudaError_t err;
    stream_ptr s = resolve_stream(stream, &err);
    if (!s) return fail_detail(err, "cudaGraphLaunch: unknown stream %p", (void *)stream);
    if (capturing(s))
        return capture_refuse(s, cudaErrorStreamCaptureUnsupported, "cudaGraphLaunch",
                              "child graphs are not emulated");
    if (s->device != e->device)
        return fail_detail(cudaErrorInvalidValue,
                           "cudaGraphLaunch: a graph of cuda:%d launched on a stream of cuda:%d", e->device,
                           s->device);
    if (cudaError_t f = device_fault(s->device)) return fail(f);
    std::shared_ptr<const std::vector<node_ptr>> nodes = e->nodes;
    stream_op op;
    op.fn = [nodes] {
        for (const node_ptr &n : *nodes) n->fn();
    };
    enqueue(s, std::move(op));
    stat_graph_launches.fetch_add(1, std::memory_order_relaxed);
    return cudaSuccess;
}

/* As in CUDA, destroying an executable graph whose launch is still queued
 * is allowed: the launch holds the nodes. */
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec) {
    graph_registry &r = greg();
    std::lock_guard<std::mutex> lock(r.m);
    if (!r.execs.erase((const void *)graphExec)) return fail(cudaErrorInvalidValue);
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    graph_registry &r = greg();
    std::lock_guard<std::mutex> lock(r.m);
    if (!r.graphs.erase((const void *)graph)) return fail(cudaErrorInvalidValue);
    return cudaSuccess;
}

} /* extern "C" */

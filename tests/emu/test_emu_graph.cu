/* The CUDA emulator's stream capture and graphs: a capture records kernels,
 * async copies and memsets without running them; the instantiated graph
 * replays them in order on the launch stream, each launch one piece of
 * work (counted by the emulator's stats), reading device memory when it
 * runs (a per-launch input written by an async copy before each launch);
 * what CUDA refuses during capture is refused with CUDA's codes and
 * invalidates the capture (thread-local, global and relaxed modes told
 * apart); handles are checked. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <thread>

#include "emu/emu_test_util.h"

__global__ void add_kernel(float *p, float v, int n) {
    for (int i = (int)(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += (int)(gridDim.x * blockDim.x))
        p[i] += v;
}

/* p[i] += *v, read when the kernel runs */
__global__ void add_from_kernel(float *p, const float *v, int n) {
    for (int i = (int)(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += (int)(gridDim.x * blockDim.x))
        p[i] += *v;
}

static const int N = 1000;

static float read_at(const float *dev, int i) {
    float v = NAN;
    CUDA_OK(cudaMemcpy(&v, dev + i, sizeof v, cudaMemcpyDeviceToHost));
    return v;
}

static void test_capture_and_launch(void) {
    CUDA_OK(cudaSetDevice(0));
    cudaStream_t s, t;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUDA_OK(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
    float *p = nullptr, *q = nullptr, *v = nullptr, *h = nullptr;
    CUDA_OK(cudaMalloc((void **)&p, N * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&q, N * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&v, sizeof(float)));
    CUDA_OK(cudaHostAlloc((void **)&h, sizeof(float), 0));
    CUDA_OK(cudaMemset(p, 0, N * sizeof(float)));
    CUDA_OK(cudaMemset(q, 0xFF, N * sizeof(float)));

    kiln_emu_stats s0, s1, s2;
    kiln_emu_get_stats(&s0);
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    CUDA_OK(cudaStreamIsCapturing(s, &st));
    EXPECT(st == cudaStreamCaptureStatusActive, "capturing: status %d", (int)st);
    CUDA_OK(cudaStreamIsCapturing(t, &st));
    EXPECT(st == cudaStreamCaptureStatusNone, "the other stream: status %d", (int)st);
    unsigned long long id = 0;
    size_t deps = 9;
    const cudaGraphNode_t *dep = nullptr;
    CUDA_OK(cudaStreamGetCaptureInfo(s, &st, &id, nullptr, &dep, nullptr, &deps));
    EXPECT(id != 0 && deps == 0, "empty capture: id %llu, %zu dependencies", id, deps);
    KILN_LAUNCH(add_kernel, 3, 128, 0, s, p, 1.0f, N);                              /* node 0 */
    CUDA_OK(cudaMemcpyAsync(q, p, N * sizeof(float), cudaMemcpyDeviceToDevice, s)); /* node 1 */
    KILN_LAUNCH(add_from_kernel, 2, 96, 0, s, p, (const float *)v, N);              /* node 2 */
    CUDA_OK(cudaMemsetAsync(v, 0, sizeof(float), s));                               /* node 3 */
    EXPECT(cudaGetLastError() == cudaSuccess, "captured launches are fine");
    CUDA_OK(cudaStreamGetCaptureInfo(s, &st, nullptr, nullptr, &dep, nullptr, &deps));
    EXPECT(deps == 1 && dep && dep[0], "after 4 nodes: %zu dependencies", deps);
    cudaGraph_t g = nullptr;
    CUDA_OK(cudaStreamEndCapture(s, &g));
    EXPECT(g != nullptr, "a graph");
    CUDA_OK(cudaStreamIsCapturing(s, &st));
    EXPECT(st == cudaStreamCaptureStatusNone, "capture over: status %d", (int)st);
    kiln_emu_get_stats(&s1);
    EXPECT(s1.captured_launches - s0.captured_launches == 2 && s1.direct_launches == s0.direct_launches &&
               s1.launches == s0.launches,
           "capture ran nothing: captured %llu, direct %llu, run %llu",
           s1.captured_launches - s0.captured_launches, s1.direct_launches - s0.direct_launches,
           s1.launches - s0.launches);
    CUDA_OK(cudaStreamSynchronize(s));
    EXPECT(read_at(p, 0) == 0.0f && read_at(p, N - 1) == 0.0f, "p untouched by the capture: %g",
           read_at(p, 0));
    size_t n_nodes = 0;
    CUDA_OK(cudaGraphGetNodes(g, nullptr, &n_nodes));
    EXPECT(n_nodes == 4, "4 nodes, got %zu", n_nodes);

    cudaGraphExec_t e = nullptr;
    CUDA_OK(cudaGraphInstantiate(&e, g, 0));
    /* Each launch: p += 1; q = p; p += *v (the value copied in before the
     * launch, read when the launch runs); *v = 0. */
    const float vals[3] = {5.0f, 7.0f, 0.25f};
    float expect = 0.0f;
    for (int k = 0; k < 3; k++) {
        *h = vals[k];
        CUDA_OK(cudaMemcpyAsync(v, h, sizeof(float), cudaMemcpyHostToDevice, s));
        CUDA_OK(cudaGraphLaunch(e, s));
        CUDA_OK(cudaStreamSynchronize(s)); /* h is rewritten next round */
        expect += 1.0f;
        EXPECT(read_at(q, 7) == expect, "launch %d: q = p after the first node: %g, want %g", k,
               read_at(q, 7), expect);
        expect += vals[k];
        EXPECT(read_at(p, N - 1) == expect && read_at(p, 0) == expect, "launch %d: p %g, want %g", k,
               read_at(p, N - 1), expect);
        EXPECT(read_at(v, 0) == 0.0f, "launch %d: the memset node ran", k);
    }
    /* On another stream of the device: same graph, same order. */
    CUDA_OK(cudaGraphLaunch(e, t));
    CUDA_OK(cudaStreamSynchronize(t));
    expect += 1.0f;
    EXPECT(read_at(p, 3) == expect, "launch on another stream: %g, want %g", read_at(p, 3), expect);
    kiln_emu_get_stats(&s2);
    EXPECT(s2.graph_launches - s1.graph_launches == 4, "4 graph launches counted: %llu",
           s2.graph_launches - s1.graph_launches);
    EXPECT(s2.launches - s1.launches == 8, "2 kernels run per launch: %llu", s2.launches - s1.launches);
    EXPECT(s2.direct_launches == s1.direct_launches, "no kernel launched by the host: %llu",
           s2.direct_launches - s1.direct_launches);

    CUDA_OK(cudaSetDevice(1));
    cudaStream_t other;
    CUDA_OK(cudaStreamCreate(&other));
    EXPECT(cudaGraphLaunch(e, other) == cudaErrorInvalidValue, "a cuda:0 graph on a cuda:1 stream");
    (void)cudaGetLastError();
    CUDA_OK(cudaStreamDestroy(other));
    CUDA_OK(cudaSetDevice(0));

    CUDA_OK(cudaGraphExecDestroy(e));
    CUDA_OK(cudaGraphDestroy(g));
    EXPECT(cudaGraphExecDestroy(e) == cudaErrorInvalidValue, "destroyed twice");
    EXPECT(cudaGraphLaunch(e, s) == cudaErrorInvalidValue, "launch of a destroyed graph");
    EXPECT(cudaGraphInstantiate(&e, g, 0) == cudaErrorInvalidValue, "instantiate a destroyed graph");
    (void)cudaGetLastError();
    CUDA_OK(cudaFree(p));
    CUDA_OK(cudaFree(q));
    CUDA_OK(cudaFree(v));
    CUDA_OK(cudaFreeHost(h));
    CUDA_OK(cudaStreamDestroy(s));
    CUDA_OK(cudaStreamDestroy(t));
}

/* A capture on s in `mode`, ended: the graph must be refused as invalidated. */
static void expect_invalidated(cudaStream_t s, const char *what) {
    cudaGraph_t g = (cudaGraph_t)0x1234;
    cudaError_t e = cudaStreamEndCapture(s, &g);
    EXPECT(e == cudaErrorStreamCaptureInvalidated && g == nullptr, "%s: end capture gives %s", what,
           cudaGetErrorName(e));
    const char *detail = kiln_emu_error_detail();
    EXPECT(strstr(detail, "invalidated") != nullptr, "%s: the message says why: '%s'", what, detail);
    (void)cudaGetLastError();
}

static void test_capture_errors(void) {
    CUDA_OK(cudaSetDevice(0));
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float *p = nullptr;
    CUDA_OK(cudaMalloc((void **)&p, N * sizeof(float)));
    cudaEvent_t ev;
    CUDA_OK(cudaEventCreate(&ev));
    CUDA_OK(cudaEventRecord(ev, s));

    EXPECT(cudaStreamBeginCapture(cudaStreamLegacy, cudaStreamCaptureModeGlobal) ==
               cudaErrorStreamCaptureUnsupported,
           "the legacy stream cannot be captured");
    EXPECT(cudaStreamBeginCapture(s, (cudaStreamCaptureMode)7) == cudaErrorInvalidValue, "bad mode");
    cudaGraph_t g = nullptr;
    EXPECT(cudaStreamEndCapture(s, &g) == cudaErrorIllegalState, "end without begin");
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaErrorIllegalState,
           "begin twice");
    CUDA_OK(cudaStreamEndCapture(s, &g));
    CUDA_OK(cudaGraphDestroy(g)); /* an empty graph is a graph */
    (void)cudaGetLastError();

    /* Calls the capturing thread may not make. */
    void *x = nullptr;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    EXPECT(cudaMalloc(&x, 64) == cudaErrorStreamCaptureUnsupported && x == nullptr,
           "cudaMalloc during capture");
    expect_invalidated(s, "cudaMalloc");
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    EXPECT(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported,
           "synchronising the capturing stream");
    expect_invalidated(s, "cudaStreamSynchronize");
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    EXPECT(cudaStreamQuery(s) == cudaErrorStreamCaptureUnsupported, "querying the capturing stream");
    expect_invalidated(s, "cudaStreamQuery");
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    EXPECT(cudaDeviceSynchronize() == cudaErrorStreamCaptureUnsupported, "device synchronize during capture");
    expect_invalidated(s, "cudaDeviceSynchronize");
    float host[4] = {1, 2, 3, 4};
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    EXPECT(cudaMemcpy(p, host, sizeof host, cudaMemcpyHostToDevice) == cudaErrorStreamCaptureUnsupported,
           "a synchronous copy during capture");
    expect_invalidated(s, "cudaMemcpy");
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    EXPECT(cudaMemcpyAsync(p, host, sizeof host, cudaMemcpyHostToDevice, s) ==
               cudaErrorStreamCaptureUnsupported,
           "a pageable copy into the capture");
    expect_invalidated(s, "pageable cudaMemcpyAsync");
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    EXPECT(cudaStreamWaitEvent(s, ev, 0) == cudaErrorStreamCaptureIsolation, "waiting on an outside event");
    expect_invalidated(s, "cudaStreamWaitEvent");
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    EXPECT(cudaEventRecord(ev, s) == cudaErrorStreamCaptureUnsupported, "event records are not emulated");
    expect_invalidated(s, "cudaEventRecord");

    /* A bad launch fails at capture time and records nothing. */
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    KILN_LAUNCH(add_kernel, 1, 2000, 0, s, p, 1.0f, N);
    EXPECT(cudaGetLastError() == cudaErrorInvalidConfiguration, "bad launch configuration while capturing");
    CUDA_OK(cudaStreamEndCapture(s, &g));
    size_t n_nodes = 9;
    CUDA_OK(cudaGraphGetNodes(g, nullptr, &n_nodes));
    EXPECT(n_nodes == 0, "the bad launch is not a node: %zu", n_nodes);
    CUDA_OK(cudaGraphDestroy(g));

    /* Modes: a thread-local capture leaves other threads alone; a global
     * one forbids their unsafe calls too; relaxed forbids nothing. */
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    cudaError_t other = cudaErrorUnknown;
    std::thread([&] {
        void *y = nullptr;
        other = cudaMalloc(&y, 64);
        if (other == cudaSuccess) other = cudaFree(y);
    }).join();
    EXPECT(other == cudaSuccess, "thread-local capture: another thread's cudaMalloc gives %s",
           cudaGetErrorName(other));
    /* A thread-local capture is ended by its own thread only. */
    std::thread([&] { other = cudaStreamEndCapture(s, &g); }).join();
    EXPECT(other == cudaErrorStreamCaptureWrongThread, "end from another thread gives %s",
           cudaGetErrorName(other));
    CUDA_OK(cudaStreamEndCapture(s, &g));
    CUDA_OK(cudaGraphDestroy(g));
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    std::thread([&] {
        void *y = nullptr;
        other = cudaMalloc(&y, 64);
        (void)cudaGetLastError();
    }).join();
    EXPECT(other == cudaErrorStreamCaptureUnsupported, "global capture: another thread's cudaMalloc gives %s",
           cudaGetErrorName(other));
    expect_invalidated(s, "global mode");
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    CUDA_OK(cudaMalloc(&x, 64));
    CUDA_OK(cudaFree(x));
    cudaGraphExec_t e = nullptr;
    CUDA_OK(cudaStreamEndCapture(s, &g));
    CUDA_OK(cudaGraphInstantiate(&e, g, 0));
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    EXPECT(cudaGraphLaunch(e, s) == cudaErrorStreamCaptureUnsupported, "a graph launched into a capture");
    expect_invalidated(s, "child graph");
    CUDA_OK(cudaGraphExecDestroy(e));
    EXPECT(cudaGraphInstantiate(&e, g, 1) == cudaErrorInvalidValue && e == nullptr, "instantiate flags");
    (void)cudaGetLastError();
    CUDA_OK(cudaGraphDestroy(g));

    CUDA_OK(cudaEventDestroy(ev));
    CUDA_OK(cudaFree(p));
    CUDA_OK(cudaStreamDestroy(s));
}

int main(void) {
    setenv("KILN_CUDA_EMU_DEVICES", "2", 1);
    setenv("KILN_CUDA_EMU_MEMORY", "64MiB", 1);
    setenv("KILN_CUDA_EMU_QUIET", "1", 1);
    test_capture_and_launch();
    test_capture_errors();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

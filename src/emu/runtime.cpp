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
 * later work waits for it.
 *
 * The state behind these calls (configuration, errors, the allocation table,
 * stream workers, launch checks) is in streams.cpp. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "streams_internal.h"

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
    if (cudaError_t e = capture_forbid("cudaDeviceSynchronize")) return e;
    synchronize_device(tls_device, "cudaDeviceSynchronize");
    if (cudaError_t f = device_fault(tls_device)) return fail(f);
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

/* A kernel fault (kiln_emu_inject_fault) is sticky, as on a GPU: every
 * later call that reports errors returns it. */
cudaError_t cudaGetLastError(void) {
    cudaError_t e = tls_last_error;
    tls_last_error = cudaSuccess;
    if (e == cudaSuccess) e = device_fault(tls_device);
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return tls_last_error ? tls_last_error : device_fault(tls_device); }

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
        KILN_EMU_NAME(cudaErrorIllegalState)
        KILN_EMU_NAME(cudaErrorStreamCaptureUnsupported)
        KILN_EMU_NAME(cudaErrorStreamCaptureInvalidated)
        KILN_EMU_NAME(cudaErrorStreamCaptureUnmatched)
        KILN_EMU_NAME(cudaErrorStreamCaptureIsolation)
        KILN_EMU_NAME(cudaErrorStreamCaptureImplicit)
        KILN_EMU_NAME(cudaErrorCapturedEvent)
        KILN_EMU_NAME(cudaErrorStreamCaptureWrongThread)
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
    case cudaErrorIllegalState:
        return "the operation cannot be performed in the present state";
    case cudaErrorStreamCaptureUnsupported:
        return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
        return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnmatched:
        return "capture was not initiated in this stream";
    case cudaErrorStreamCaptureIsolation:
        return "dependency created on uncaptured work in another stream";
    case cudaErrorStreamCaptureImplicit:
        return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorCapturedEvent:
        return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorStreamCaptureWrongThread:
        return "attempt to terminate a thread-local capture sequence from another thread";
    default:
        return "unknown error";
    }
}

cudaError_t cudaMalloc(void **devPtr, size_t size) {
    if (!devPtr) return fail(cudaErrorInvalidValue);
    if (check_device(tls_device)) return cudaErrorInvalidDevice;
    *devPtr = nullptr;
    if (cudaError_t e = capture_forbid("cudaMalloc")) return e;
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
    if (cudaError_t e = capture_forbid("cudaFree")) return e;
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
    if (cudaError_t e = capture_forbid("cudaHostAlloc")) return e;
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
    if (cudaError_t e = capture_forbid("cudaFreeHost")) return e;
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
    if (!async && (err = capture_forbid(call)) != cudaSuccess) return err;
    if (async && capture_node(s, NODE_MEMCPY, call, [dst, src, count] { memcpy(dst, src, count); }))
        return cudaSuccess;
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
    if (!async && (err = capture_forbid(call)) != cudaSuccess) return err;
    if (async && capture_node(s, NODE_MEMSET, call, [p, value, count] { memset(p, value, count); }))
        return cudaSuccess;
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
    if (capturing(s))
        return capture_refuse(s, cudaErrorStreamCaptureUnsupported, "cudaStreamQuery", "a capturing stream runs nothing");
    std::lock_guard<std::mutex> lock(s->m);
    return s->completed == s->enqueued ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    cudaError_t err;
    stream_ptr s = resolve_stream(stream, &err);
    if (!s) return fail(err);
    if (capturing(s))
        return capture_refuse(s, cudaErrorStreamCaptureUnsupported, "cudaStreamSynchronize",
                              "a capturing stream runs nothing, so there is nothing to wait for");
    if (cudaError_t e = capture_forbid("cudaStreamSynchronize")) return e;
    wait_stream_count(s, queued_count(*s), "cudaStreamSynchronize");
    if (cudaError_t f = device_fault(s->device)) return fail(f);
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
    if (capturing(s))
        return capture_refuse(s, cudaErrorStreamCaptureUnsupported, "cudaEventRecord",
                              "event records in a capture (multi-stream capture) are not emulated");
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
    if (cudaError_t f = capture_forbid("cudaEventSynchronize")) return f;
    std::unique_lock<std::mutex> lock(e->m);
    uint64_t target = e->recorded;
    wait_or_die(lock, e->cv, [&] { return e->completed >= target; }, "cudaEventSynchronize");
    if (cudaError_t f = device_fault(e->device)) return fail(f);
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t ev, unsigned int flags) {
    if (flags) return fail(cudaErrorInvalidValue);
    event_ptr e = resolve_event(ev);
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    cudaError_t err;
    stream_ptr s = resolve_stream(stream, &err);
    if (!s) return fail(err);
    if (capturing(s))
        return capture_refuse(s, cudaErrorStreamCaptureIsolation, "cudaStreamWaitEvent",
                              "the event was recorded outside the capture, which a graph cannot wait on");
    uint64_t target;
    {
        std::lock_guard<std::mutex> lock(e->m);
        target = e->recorded;
    }
    if (target == 0) return cudaSuccess; /* never recorded: nothing to wait for */
    stream_op op;
    op.wait = true;
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
    stats->direct_launches = stat_direct_launches.load();
    stats->captured_launches = stat_captured_launches.load();
    stats->graph_launches = stat_graph_launches.load();
}

int kiln_emu_worker_threads(void) { return cfg().threads; }

void kiln_emu_timeline_start(void) { timeline_start(); }
int kiln_emu_timeline_stop(kiln_emu_interval *out, int cap) { return timeline_stop(out, cap); }

} /* extern "C" */

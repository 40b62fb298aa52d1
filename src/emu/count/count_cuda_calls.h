/* Force-included (-include) into Kiln's CUDA sources in the emulation
 * build (CMakeLists.txt: every .cu file and every *_cuda.c file under src):
 * each CUDA runtime call they make is counted (emu_call_counts.h), then
 * made. Never included by hand.
 *
 * The emulator's runtime headers come first, so their declarations (and
 * kiln_emu.h's inline templates, in C++) are parsed before the names become
 * macros. Each macro expands to (note, call): inside its own expansion a
 * macro's name is not expanded again, so the call reaches the real
 * function; #call in KILN_CUDA_CHECK's message still shows the call as
 * written. Only calls are counted: a name not followed by '(' (a function
 * pointer) is left alone. */
#ifndef KILN_EMU_COUNT_COUNT_CUDA_CALLS_H
#define KILN_EMU_COUNT_COUNT_CUDA_CALLS_H

#ifndef KILN_CUDA_EMULATION
#error "count_cuda_calls.h counts calls into the CUDA emulator: emulation build (KILN_CUDA_EMULATION) only"
#endif

#include <cuda_runtime.h> /* in C++ also the device side (kiln_emu.h) */
#include <cuda_runtime_api.h>

#include "emu_call_counts.h"

#define KILN_EMU_COUNTED_(name, ...) (kiln_emu_call_note(KILN_EMU_CALL_##name), name(__VA_ARGS__))

#define cudaGetLastError(...)                 KILN_EMU_COUNTED_(cudaGetLastError, __VA_ARGS__)
#define cudaPeekAtLastError(...)              KILN_EMU_COUNTED_(cudaPeekAtLastError, __VA_ARGS__)
#define cudaGetErrorName(...)                 KILN_EMU_COUNTED_(cudaGetErrorName, __VA_ARGS__)
#define cudaGetErrorString(...)               KILN_EMU_COUNTED_(cudaGetErrorString, __VA_ARGS__)
#define cudaGetDeviceCount(...)               KILN_EMU_COUNTED_(cudaGetDeviceCount, __VA_ARGS__)
#define cudaGetDevice(...)                    KILN_EMU_COUNTED_(cudaGetDevice, __VA_ARGS__)
#define cudaSetDevice(...)                    KILN_EMU_COUNTED_(cudaSetDevice, __VA_ARGS__)
#define cudaGetDeviceProperties(...)          KILN_EMU_COUNTED_(cudaGetDeviceProperties, __VA_ARGS__)
#define cudaDeviceGetAttribute(...)           KILN_EMU_COUNTED_(cudaDeviceGetAttribute, __VA_ARGS__)
#define cudaDriverGetVersion(...)             KILN_EMU_COUNTED_(cudaDriverGetVersion, __VA_ARGS__)
#define cudaRuntimeGetVersion(...)            KILN_EMU_COUNTED_(cudaRuntimeGetVersion, __VA_ARGS__)
#define cudaDeviceReset(...)                  KILN_EMU_COUNTED_(cudaDeviceReset, __VA_ARGS__)
#define cudaDeviceGetStreamPriorityRange(...) KILN_EMU_COUNTED_(cudaDeviceGetStreamPriorityRange, __VA_ARGS__)
#define cudaDeviceCanAccessPeer(...)          KILN_EMU_COUNTED_(cudaDeviceCanAccessPeer, __VA_ARGS__)
#define cudaDeviceEnablePeerAccess(...)       KILN_EMU_COUNTED_(cudaDeviceEnablePeerAccess, __VA_ARGS__)
#define cudaDeviceDisablePeerAccess(...)      KILN_EMU_COUNTED_(cudaDeviceDisablePeerAccess, __VA_ARGS__)
#define cudaPointerGetAttributes(...)         KILN_EMU_COUNTED_(cudaPointerGetAttributes, __VA_ARGS__)
#define cudaFuncSetAttribute(...)             KILN_EMU_COUNTED_(cudaFuncSetAttribute, __VA_ARGS__)
#define cudaDeviceSynchronize(...)            KILN_EMU_COUNTED_(cudaDeviceSynchronize, __VA_ARGS__)
#define cudaStreamSynchronize(...)            KILN_EMU_COUNTED_(cudaStreamSynchronize, __VA_ARGS__)
#define cudaEventSynchronize(...)             KILN_EMU_COUNTED_(cudaEventSynchronize, __VA_ARGS__)
#define cudaStreamQuery(...)                  KILN_EMU_COUNTED_(cudaStreamQuery, __VA_ARGS__)
#define cudaEventQuery(...)                   KILN_EMU_COUNTED_(cudaEventQuery, __VA_ARGS__)
#define cudaMalloc(...)                       KILN_EMU_COUNTED_(cudaMalloc, __VA_ARGS__)
#define cudaFree(...)                         KILN_EMU_COUNTED_(cudaFree, __VA_ARGS__)
#define cudaMemGetInfo(...)                   KILN_EMU_COUNTED_(cudaMemGetInfo, __VA_ARGS__)
#define cudaHostAlloc(...)                    KILN_EMU_COUNTED_(cudaHostAlloc, __VA_ARGS__)
#define cudaMallocHost(...)                   KILN_EMU_COUNTED_(cudaMallocHost, __VA_ARGS__)
#define cudaFreeHost(...)                     KILN_EMU_COUNTED_(cudaFreeHost, __VA_ARGS__)
#define cudaMemcpy(...)                       KILN_EMU_COUNTED_(cudaMemcpy, __VA_ARGS__)
#define cudaMemcpyAsync(...)                  KILN_EMU_COUNTED_(cudaMemcpyAsync, __VA_ARGS__)
#define cudaMemcpyPeer(...)                   KILN_EMU_COUNTED_(cudaMemcpyPeer, __VA_ARGS__)
#define cudaMemcpyPeerAsync(...)              KILN_EMU_COUNTED_(cudaMemcpyPeerAsync, __VA_ARGS__)
#define cudaMemset(...)                       KILN_EMU_COUNTED_(cudaMemset, __VA_ARGS__)
#define cudaMemsetAsync(...)                  KILN_EMU_COUNTED_(cudaMemsetAsync, __VA_ARGS__)
#define cudaStreamCreate(...)                 KILN_EMU_COUNTED_(cudaStreamCreate, __VA_ARGS__)
#define cudaStreamCreateWithFlags(...)        KILN_EMU_COUNTED_(cudaStreamCreateWithFlags, __VA_ARGS__)
#define cudaStreamCreateWithPriority(...)     KILN_EMU_COUNTED_(cudaStreamCreateWithPriority, __VA_ARGS__)
#define cudaStreamDestroy(...)                KILN_EMU_COUNTED_(cudaStreamDestroy, __VA_ARGS__)
#define cudaStreamGetPriority(...)            KILN_EMU_COUNTED_(cudaStreamGetPriority, __VA_ARGS__)
#define cudaStreamGetFlags(...)               KILN_EMU_COUNTED_(cudaStreamGetFlags, __VA_ARGS__)
#define cudaStreamWaitEvent(...)              KILN_EMU_COUNTED_(cudaStreamWaitEvent, __VA_ARGS__)
#define cudaEventCreate(...)                  KILN_EMU_COUNTED_(cudaEventCreate, __VA_ARGS__)
#define cudaEventCreateWithFlags(...)         KILN_EMU_COUNTED_(cudaEventCreateWithFlags, __VA_ARGS__)
#define cudaEventDestroy(...)                 KILN_EMU_COUNTED_(cudaEventDestroy, __VA_ARGS__)
#define cudaEventRecord(...)                  KILN_EMU_COUNTED_(cudaEventRecord, __VA_ARGS__)
#define cudaEventElapsedTime(...)             KILN_EMU_COUNTED_(cudaEventElapsedTime, __VA_ARGS__)
#define cudaStreamBeginCapture(...)           KILN_EMU_COUNTED_(cudaStreamBeginCapture, __VA_ARGS__)
#define cudaStreamEndCapture(...)             KILN_EMU_COUNTED_(cudaStreamEndCapture, __VA_ARGS__)
#define cudaStreamIsCapturing(...)            KILN_EMU_COUNTED_(cudaStreamIsCapturing, __VA_ARGS__)
#define cudaStreamGetCaptureInfo(...)         KILN_EMU_COUNTED_(cudaStreamGetCaptureInfo, __VA_ARGS__)
#define cudaGraphGetNodes(...)                KILN_EMU_COUNTED_(cudaGraphGetNodes, __VA_ARGS__)
#define cudaGraphInstantiate(...)             KILN_EMU_COUNTED_(cudaGraphInstantiate, __VA_ARGS__)
#define cudaGraphLaunch(...)                  KILN_EMU_COUNTED_(cudaGraphLaunch, __VA_ARGS__)
#define cudaGraphExecDestroy(...)             KILN_EMU_COUNTED_(cudaGraphExecDestroy, __VA_ARGS__)
#define cudaGraphDestroy(...)                 KILN_EMU_COUNTED_(cudaGraphDestroy, __VA_ARGS__)

#endif /* KILN_EMU_COUNT_COUNT_CUDA_CALLS_H */

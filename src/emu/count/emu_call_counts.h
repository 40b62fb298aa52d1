/* Kiln's CUDA runtime calls, counted on Kiln's side of the API (emulation
 * build only: KILN_CUDA_EMULATION). What the host does per training step
 * on a GPU is these calls, so counting them on the emulator measures the
 * host side of the CUDA path without a GPU (docs/cuda.md, "Host calls per
 * step").
 *
 * How: count_cuda_calls.h, force-included (-include) into every CUDA
 * source of Kiln (each .cu file and each *_cuda.c file under src) in the
 * emulation build, turns
 * each runtime call below into "note it, then call it"; KILN_LAUNCH
 * (kernels/cuda/cuda_common.h) notes each kernel launch. The emulator's
 * own calls (src/emu/) and the tests' are not counted. The counters are
 * process-wide and atomic, so calls from every host thread count.
 *
 * Valid C and C++; declares no CUDA type, so tests and benchmarks include
 * it without the emulator's headers. */
#ifndef KILN_EMU_COUNT_EMU_CALL_COUNTS_H
#define KILN_EMU_COUNT_EMU_CALL_COUNTS_H

#ifdef __cplusplus
extern "C" {
#endif

/* Everything counted: kernel launches first, then each CUDA runtime
 * function Kiln calls (and the rest the emulator provides). A function
 * added here needs its line in count_cuda_calls.h too. */
#define KILN_EMU_COUNTED_CALLS(X)                                                                            \
    X(kernel_launch)                                                                                         \
    X(cudaGetLastError)                                                                                      \
    X(cudaPeekAtLastError)                                                                                   \
    X(cudaGetErrorName)                                                                                      \
    X(cudaGetErrorString)                                                                                    \
    X(cudaGetDeviceCount)                                                                                    \
    X(cudaGetDevice)                                                                                         \
    X(cudaSetDevice)                                                                                         \
    X(cudaGetDeviceProperties)                                                                               \
    X(cudaDeviceGetAttribute)                                                                                \
    X(cudaDriverGetVersion)                                                                                  \
    X(cudaRuntimeGetVersion)                                                                                 \
    X(cudaDeviceReset)                                                                                       \
    X(cudaDeviceGetStreamPriorityRange)                                                                      \
    X(cudaDeviceCanAccessPeer)                                                                               \
    X(cudaDeviceEnablePeerAccess)                                                                            \
    X(cudaDeviceDisablePeerAccess)                                                                           \
    X(cudaPointerGetAttributes)                                                                              \
    X(cudaFuncSetAttribute)                                                                                  \
    X(cudaDeviceSynchronize)                                                                                 \
    X(cudaStreamSynchronize)                                                                                 \
    X(cudaEventSynchronize)                                                                                  \
    X(cudaStreamQuery)                                                                                       \
    X(cudaEventQuery)                                                                                        \
    X(cudaMalloc)                                                                                            \
    X(cudaFree)                                                                                              \
    X(cudaMemGetInfo)                                                                                        \
    X(cudaHostAlloc)                                                                                         \
    X(cudaMallocHost)                                                                                        \
    X(cudaFreeHost)                                                                                          \
    X(cudaMemcpy)                                                                                            \
    X(cudaMemcpyAsync)                                                                                       \
    X(cudaMemcpyPeer)                                                                                        \
    X(cudaMemcpyPeerAsync)                                                                                   \
    X(cudaMemset)                                                                                            \
    X(cudaMemsetAsync)                                                                                       \
    X(cudaStreamCreate)                                                                                      \
    X(cudaStreamCreateWithFlags)                                                                             \
    X(cudaStreamCreateWithPriority)                                                                          \
    X(cudaStreamDestroy)                                                                                     \
    X(cudaStreamGetPriority)                                                                                 \
    X(cudaStreamGetFlags)                                                                                    \
    X(cudaStreamWaitEvent)                                                                                   \
    X(cudaEventCreate)                                                                                       \
    X(cudaEventCreateWithFlags)                                                                              \
    X(cudaEventDestroy)                                                                                      \
    X(cudaEventRecord)                                                                                       \
    X(cudaEventElapsedTime)                                                                                  \
    X(cudaStreamBeginCapture)                                                                                \
    X(cudaStreamEndCapture)                                                                                  \
    X(cudaStreamIsCapturing)                                                                                 \
    X(cudaStreamGetCaptureInfo)                                                                              \
    X(cudaGraphGetNodes)                                                                                     \
    X(cudaGraphInstantiate)                                                                                  \
    X(cudaGraphLaunch)                                                                                       \
    X(cudaGraphExecDestroy)                                                                                  \
    X(cudaGraphDestroy)

typedef enum kiln_emu_call {
#define KILN_EMU_CALL_ENUM_(name) KILN_EMU_CALL_##name,
    KILN_EMU_COUNTED_CALLS(KILN_EMU_CALL_ENUM_)
#undef KILN_EMU_CALL_ENUM_
        KILN_EMU_CALL_COUNT
} kiln_emu_call;

/* Counts one call (what the wrappers do). Thread-safe, does not block. */
void kiln_emu_call_note(kiln_emu_call call);

/* Copies the counts since the process started or the last reset into
 * counts[0 .. KILN_EMU_CALL_COUNT). Thread-safe; calls other threads make
 * meanwhile may or may not be in the copy. Does not block. */
void kiln_emu_call_counts_get(unsigned long long counts[KILN_EMU_CALL_COUNT]);

/* Sets every count to zero. Thread-safe, does not block. */
void kiln_emu_call_counts_reset(void);

/* The counted call's name: "kernel_launch", "cudaMalloc", ... (static
 * storage); NULL outside [0, KILN_EMU_CALL_COUNT). */
const char *kiln_emu_call_name(int call);

#ifdef __cplusplus
}
#endif
#endif /* KILN_EMU_COUNT_EMU_CALL_COUNTS_H */

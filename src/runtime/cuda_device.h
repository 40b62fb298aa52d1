/* Which CUDA device is current on this host thread, and which device owns a
 * pointer, answered on the host without a runtime call in the steady state
 * (src/runtime/cuda_device_cuda.c). Used by every place Kiln changes the
 * current CUDA device: the backend's entries (cuda_backend_cuda.c), the
 * kernels' device guard (kernels/cuda/cuda_common.h), the library paths'
 * guard (fast_guard_cublas.c), the cuDNN and cuBLASLt handles and the NCCL
 * communicators.
 *
 * The current device: CUDA keeps one per host thread; Kiln keeps a
 * per-thread copy, read from the runtime once (cudaGetDevice) and then
 * updated by every device change Kiln makes, all of which go through
 * kiln_cuda_device_switch/restore. A switch to the device already current
 * costs nothing. Kiln restores the caller's device after each entry, so
 * the device the thread's own CUDA code sees does not change. Code that
 * calls cudaSetDevice itself on a thread that also runs Kiln's CUDA work
 * calls kiln_cuda_device_forget afterwards, or Kiln's copy is stale.
 *
 * A pointer's device: the backend registers each segment it gets from
 * cudaMalloc (raw_alloc) and unregisters it before cudaFree, so a lookup
 * in that table answers for every tensor, workspace and arena Kiln
 * allocates. Memory Kiln did not allocate (a test's own cudaMalloc) is
 * asked of the runtime (cudaPointerGetAttributes), which also refuses host
 * memory with a clear error.
 *
 * Names no CUDA type; C and C++. None of these blocks the host. */
#ifndef KILN_SRC_RUNTIME_CUDA_DEVICE_H
#define KILN_SRC_RUNTIME_CUDA_DEVICE_H

#include <stddef.h>

#include "kiln/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Make cuda:index current on this thread. *previous receives the device
 * that was current, for kiln_cuda_device_restore (-1 on failure, which
 * raises an error naming the device and leaves the current one as it
 * was). No runtime call when index is current already. */
kiln_status kiln_cuda_device_switch(int index, int *previous);

/* Make `previous` current again after kiln_cuda_device_switch(index, ...)
 * (nothing to do when it was index, or -1). A failure is raised (the
 * thread's error), not returned: callers are on their way out. */
void kiln_cuda_device_restore(int index, int previous);

/* Forget this thread's copy of the current device: the next switch asks
 * the runtime. For code that changed the device behind Kiln's back. */
void kiln_cuda_device_forget(void);

/* Segments of device memory on `device` (the backend's raw_alloc/raw_free).
 * A segment that cannot be registered (no host memory for the table) is
 * only slower to look up. Thread-safe. */
void kiln_cuda_segment_add(int device, const void *base, size_t bytes);
void kiln_cuda_segment_remove(const void *base);

/* The device owning `ptr`: from the segment table when Kiln allocated it,
 * else from the runtime (cudaPointerGetAttributes). Host memory (pinned or
 * not) is an error naming `what` ("CUDA kernel", "CUDA library path") and
 * the pointer. Thread-safe. */
kiln_status kiln_cuda_device_of(const void *ptr, const char *what, int *device);

#ifdef __cplusplus
}
#endif
#endif /* KILN_SRC_RUNTIME_CUDA_DEVICE_H */

/* The CUDA backend (built only with KILN_WITH_CUDA): the kiln_backend
 * vtable over the CUDA runtime API, plus what `kiln info` prints about CUDA.
 *
 * This header names no CUDA type, so C code that does not include the CUDA
 * headers (tools/kiln.c) can use it; the .cu kernel files use the check
 * macro too. */
#ifndef KILN_SRC_RUNTIME_CUDA_BACKEND_H
#define KILN_SRC_RUNTIME_CUDA_BACKEND_H

#include "kiln/base.h"

#ifdef __cplusplus
extern "C" {
#endif

struct kiln_backend;

/* The vtable; kiln_init registers it. Without a driver or device its
 * device_count is 0 and absent_reason says why; nothing errors. */
const struct kiln_backend *kiln_cuda_backend(void);

/* One line about device `index`: compute capability, SM count, memory,
 * driver and runtime versions ("compute capability 9.0, 132 SMs, 79.19 GiB,
 * driver 13.0, runtime 13.0"). Fails with KILN_ERR_DEVICE if the device is
 * not visible. Does not block. */
kiln_status kiln_cuda_device_properties(int index, char *buf, size_t size);

/* CUDA driver and runtime versions as CUDA encodes them (13000 = 13.0).
 * driver is 0 when no driver is installed; that is not an error. Either
 * pointer may be NULL. */
kiln_status kiln_cuda_versions(int *driver, int *runtime);

/* Turn a CUDA runtime error code into a Kiln error: KILN_ERR_DEVICE (or
 * KILN_ERR_OUT_OF_MEMORY for cudaErrorMemoryAllocation) with a message that
 * names the call, the device (index < 0: the calling thread's current CUDA
 * device), cudaGetErrorName/String and file:line. Also consumes the
 * runtime's non-sticky last error, so a later launch check does not report
 * this one again. KILN_OK for cudaSuccess. */
kiln_status kiln_cuda_check_at(int error, const char *call, int index, const char *file, int line);

/* KILN_CUDA_CHECK(index, cudaMalloc(&p, n)): a kiln_status. */
#define KILN_CUDA_CHECK(index, call) kiln_cuda_check_at((int)(call), #call, (index), __FILE__, __LINE__)
/* Return the Kiln error from the enclosing function if `call` fails. */
#define KILN_CUDA_TRY(index, call)                                                                           \
    do {                                                                                                     \
        kiln_status kiln_cuda_st_ = KILN_CUDA_CHECK((index), call);                                          \
        if (kiln_cuda_st_ != KILN_OK) return kiln_cuda_st_;                                                  \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif /* KILN_SRC_RUNTIME_CUDA_BACKEND_H */

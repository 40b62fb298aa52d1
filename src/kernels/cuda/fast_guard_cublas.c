/* Helpers every library path of cuda_fast.h shares: the device guard
 * around a library call and the density check of a view. Real CUDA build
 * only (a *_cublas.c file: the emulation build has no library paths). */
#include <cuda_runtime_api.h>

#include "base/error.h"
#include "kernels/cuda/cuda_fast.h"
#include "runtime/cuda_backend.h"

kiln_status kiln_cuda_fast_enter(const void *ptr, int *device, int *previous) {
    struct cudaPointerAttributes attr;
    *device = -1, *previous = -1;
    KILN_CUDA_TRY(-1, cudaPointerGetAttributes(&attr, ptr));
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "allocate the tensor on the cuda device",
                          "CUDA library path given host pointer %p", ptr);
    KILN_CUDA_TRY(attr.device, cudaGetDevice(previous));
    if (*previous != attr.device) KILN_CUDA_TRY(attr.device, cudaSetDevice(attr.device));
    *device = attr.device;
    return KILN_OK;
}

void kiln_cuda_fast_leave(int device, int previous) {
    if (previous >= 0 && previous != device) (void)KILN_CUDA_CHECK(previous, cudaSetDevice(previous));
}

bool kiln_cuda_fast_is_contiguous(const kiln_strided *s) {
    int64_t expect = 1;
    for (int k = s->ndim - 1; k >= 0; k--) {
        if (s->shape[k] != 1 && s->strides[k] != expect) return false;
        expect *= s->shape[k];
    }
    return true;
}

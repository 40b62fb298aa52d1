/* Helpers every library path of cuda_fast.h shares: the device guard
 * around a library call (no runtime call in the steady state:
 * runtime/cuda_device.h) and the density check of a view. Real CUDA build
 * only (a *_cublas.c file: the emulation build has no library paths). */
#include <cuda_runtime_api.h>

#include "base/error.h"
#include "kernels/cuda/cuda_fast.h"
#include "runtime/cuda_backend.h"
#include "runtime/cuda_device.h"

kiln_status kiln_cuda_fast_enter_index(int index, int *device, int *previous) {
    *device = -1, *previous = -1;
    KILN_TRY(kiln_cuda_device_switch(index, previous));
    *device = index;
    return KILN_OK;
}

kiln_status kiln_cuda_fast_enter(const void *ptr, int *device, int *previous) {
    *device = -1, *previous = -1;
    int d = -1;
    KILN_TRY(kiln_cuda_device_of(ptr, "CUDA library path", &d));
    return kiln_cuda_fast_enter_index(d, device, previous);
}

void kiln_cuda_fast_leave(int device, int previous) { kiln_cuda_device_restore(device, previous); }

bool kiln_cuda_fast_is_contiguous(const kiln_strided *s) {
    int64_t expect = 1;
    for (int k = s->ndim - 1; k >= 0; k--) {
        if (s->shape[k] != 1 && s->strides[k] != expect) return false;
        expect *= s->shape[k];
    }
    return true;
}

/* KILN_LAUNCH_BLOCKING: the wait after each kernel (launch_blocking.h). */
#include "kernels/cuda/launch_blocking.h"

#include <cuda_runtime_api.h>

#include "base/error.h"
#include "kiln/runtime.h"
#include "ops/op_registry.h"
#include "runtime/cuda_backend.h"
#ifdef KILN_CUDA_EMULATION
#include "emu/kiln_emu_api.h"
#endif

/* The failure of a kernel (launch_error, else the wait's) as the op's error. */
static kiln_status op_failed(int launch_error, int device, const char *what, const char *file, int line) {
    cudaError_t err = (cudaError_t)launch_error;
    if (err == cudaSuccess) err = cudaDeviceSynchronize();
    if (err == cudaSuccess) return KILN_OK;
    (void)cudaGetLastError(); /* a non-sticky error is consumed; a sticky one stays */
    if (device < 0 && cudaGetDevice(&device) != cudaSuccess) device = -1;
    const char *op = kiln_dispatch_current_op();
    const char *detail = "";
#ifdef KILN_CUDA_EMULATION
    detail = kiln_emu_error_detail();
#endif
    return kiln_error_raise(
        KILN_ERR_DEVICE, file, line,
        "the op's inputs or the kernel are at fault; the CUDA context is unusable after a "
        "kernel fault: restart the process",
        "KILN_LAUNCH_BLOCKING: op %s: kernel %s failed on cuda:%d: %s (%s)%s%s",
        op ? op : "(none: a call outside an op)", what ? what : "?", device, cudaGetErrorName(err),
        cudaGetErrorString(err), detail[0] ? ": " : "", detail);
}

kiln_status kiln_cuda_launch_check(int launch_error, int device, const char *what, const char *file,
                                   int line) {
    if (!kiln_is_launch_blocking()) return kiln_cuda_check_at(launch_error, what, device, file, line);
    return op_failed(launch_error, device, what, file, line);
}

kiln_status kiln_cuda_launch_blocking_check(int device, const char *what, const char *file, int line) {
    if (!kiln_is_launch_blocking()) return KILN_OK;
    return op_failed(cudaGetLastError(), device, what, file, line);
}

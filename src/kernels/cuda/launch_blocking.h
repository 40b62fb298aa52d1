/* KILN_LAUNCH_BLOCKING (kiln_set_launch_blocking, include/kiln/runtime.h):
 * the wait after each kernel launch that names the op whose kernel failed.
 * Valid C and C++ (the .cu files include it through cuda_common.h). */
#ifndef KILN_SRC_KERNELS_CUDA_LAUNCH_BLOCKING_H
#define KILN_SRC_KERNELS_CUDA_LAUNCH_BLOCKING_H

#include "kiln/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* After a kernel launch (KILN_LAUNCH_CHECK), with the launch's
 * cudaGetLastError(): launch blocking off, kiln_cuda_check_at's error
 * naming the kernel (never blocking). On: a launch error, else a failure of
 * the kernel while it ran (the host waits for the current device, which the
 * launch's device guard made the kernel's), as KILN_ERR_DEVICE naming the
 * op being dispatched (kiln_dispatch_current_op), the kernel `what`, the
 * device and the CUDA error. */
kiln_status kiln_cuda_launch_check(int launch_error, int device, const char *what, const char *file,
                                   int line);
/* After a library call that launched kernels (cuBLASLt, cuDNN) and
 * returned success: launch blocking off, KILN_OK at once; on, the wait and
 * the error as kiln_cuda_launch_check. */
kiln_status kiln_cuda_launch_blocking_check(int device, const char *what, const char *file, int line);

#ifdef __cplusplus
}
#endif
#endif

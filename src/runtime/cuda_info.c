/* The CUDA facts of include/kiln/runtime.h in every build: with CUDA
 * compiled in (the nvcc build or the emulator) the properties and versions
 * come from cuda_backend_cuda.c; without it, the versions are 0 and the
 * device queries say the build has no CUDA. The capability is read from
 * the properties line, whose format that file fixes. */
#include <stdio.h>

#include "base/error.h"
#include "kiln/runtime.h"
#include "runtime/cuda_backend.h"
#include "runtime/cuda_device.h"

#ifndef KILN_WITH_CUDA
static kiln_status no_cuda(const char *fn, int index) {
    return KILN_RAISE(KILN_ERR_UNSUPPORTED, "rebuild with -DKILN_WITH_CUDA=ON (or the CUDA emulator) to use CUDA",
                      "%s: cuda:%d: this build of kiln has no CUDA backend (rebuild with -DKILN_WITH_CUDA=ON)",
                      fn, index);
}

kiln_status kiln_cuda_device_properties(int index, char *buf, size_t size) {
    if (buf && size) buf[0] = '\0';
    return no_cuda("kiln_cuda_device_properties", index);
}

kiln_status kiln_cuda_versions(int *driver, int *runtime) {
    if (driver) *driver = 0;
    if (runtime) *runtime = 0;
    return KILN_OK;
}
#endif

kiln_status kiln_cuda_capability(int index, int *major, int *minor) {
    char buf[256];
    KILN_TRY(kiln_cuda_device_properties(index, buf, sizeof buf));
    int ma = 0, mi = 0;
    if (sscanf(buf, "compute capability %d.%d", &ma, &mi) != 2)
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "an emulated device has no compute capability",
                          "kiln_cuda_capability: cuda:%d reports no compute capability (%s)", index, buf);
    if (major) *major = ma;
    if (minor) *minor = mi;
    return KILN_OK;
}

void kiln_cuda_forget_current_device(void) {
#ifdef KILN_WITH_CUDA
    kiln_cuda_device_forget();
#endif
}

/* Which kernel table serves a device type. A plain switch: the tables are
 * static data, so nothing needs registering at kiln_init. */
#include "kernels/kernels.h"
#include "kernels/optim_kernels.h"

static _Thread_local kiln_tensor_kernels_override tensor_override;

kiln_tensor_kernels_override kiln_tensor_kernels_set_override(kiln_tensor_kernels_override fn) {
    kiln_tensor_kernels_override old = tensor_override;
    tensor_override = fn;
    return old;
}

const kiln_tensor_kernels *kiln_tensor_kernels_for(kiln_device_type type) {
    if (tensor_override) return tensor_override(type);
    return kiln_tensor_kernels_builtin(type);
}

const kiln_tensor_kernels *kiln_tensor_kernels_builtin(kiln_device_type type) {
    switch (type) {
    case KILN_DEVICE_CPU:
        return kiln_cpu_tensor_kernels();
#ifdef KILN_WITH_CUDA
    case KILN_DEVICE_CUDA:
        return kiln_cuda_tensor_kernels();
#endif
    default:
        return NULL; /* meta has no data; CUDA is absent from this build */
    }
}

const kiln_optim_kernels *kiln_optim_kernels_for(kiln_device_type type) {
    switch (type) {
    case KILN_DEVICE_CPU:
        return kiln_cpu_optim_kernels();
#ifdef KILN_WITH_CUDA
    case KILN_DEVICE_CUDA:
        return kiln_cuda_optim_kernels();
#endif
    default:
        return NULL;
    }
}

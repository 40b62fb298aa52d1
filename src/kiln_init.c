/* kiln_init: registers the compiled backends explicitly (constructors would
 * vanish from the static library) and reads the environment. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log_internal.h"
#include "kiln/kiln.h"
#include "kiln_config.h"
#include "runtime/runtime_internal.h"
#include "autograd/autograd_internal.h"
#include "diag/profiler_internal.h"
#include "diag/anomaly.h"
#include "ops/cpu_tables.h"
#ifdef KILN_WITH_CUDA
#include "ops/cuda_tables.h"
#include "runtime/cuda_module.h"
#endif
#if defined(KILN_WITH_CUDA) && !defined(KILN_CUDA_EMULATION)
#define KILN_CUDA_FAST_TABLE 1
#endif
#include "ops/autocast.h"
#include "ops/op_registry.h"
#include "tensor/tensor_internal.h"

static pthread_mutex_t init_mutex = PTHREAD_MUTEX_INITIALIZER;
static bool initialised;

/* KILN_CPU_KERNELS picks the CPU kernels: unset, empty or "fast" puts the
 * fast tables (oneDNN, where built, then the plain-C one) before the portable reference kernels;
 * "reference" runs the reference kernels only. Read once per kiln_init. */
static kiln_status register_fast_cpu_kernels(void) {
    kiln_ops_clear_fast_kernels(KILN_DEVICE_CPU);
    const char *choice = getenv("KILN_CPU_KERNELS");
    if (choice && !strcmp(choice, "reference")) return KILN_OK;
    if (choice && *choice && strcmp(choice, "fast"))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "set it to fast or reference, or unset it",
                          "KILN_CPU_KERNELS='%s' is not a kernel choice (fast or reference)", choice);
    const kiln_op_kernel *fast = kiln_cpu_fast_op_kernels();
    if (fast) kiln_ops_register_fast_kernels(KILN_DEVICE_CPU, fast);
    kiln_ops_register_fast_kernels(KILN_DEVICE_CPU, kiln_cpu_fast_c_op_kernels());
    return KILN_OK;
}

/* KILN_CUDA_KERNELS picks the CUDA kernels of the real CUDA build: unset,
 * empty or "fast" puts the library fast table (cuBLASLt, cuDNN: docs/cuda.md)
 * before the hand-written kernels; "reference" runs the hand-written ones
 * only. The emulation build has no library and registers none. */
static kiln_status register_fast_cuda_kernels(void) {
#ifdef KILN_CUDA_FAST_TABLE
    kiln_ops_clear_fast_kernels(KILN_DEVICE_CUDA);
    const char *choice = getenv("KILN_CUDA_KERNELS");
    if (choice && !strcmp(choice, "reference")) return KILN_OK;
    if (choice && *choice && strcmp(choice, "fast"))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "set it to fast or reference, or unset it",
                          "KILN_CUDA_KERNELS='%s' is not a kernel choice (fast or reference)", choice);
    const kiln_op_kernel *fast = kiln_cuda_fast_op_kernels(); /* NULL: the CUDA module is not loaded */
    if (fast) kiln_ops_register_fast_kernels(KILN_DEVICE_CUDA, fast);
#endif
    return KILN_OK;
}

kiln_status kiln_init(void) {
    pthread_mutex_lock(&init_mutex);
    kiln_status st = KILN_OK;
    if (!initialised) {
        kiln_log_init_from_env();
        kiln_backend_register(kiln_cpu_backend());
        kiln_backend_register(kiln_meta_backend());
#ifdef KILN_WITH_CUDA
        /* A CUDA build with the module: the backend is there only once the
         * module loaded (when a driver sees a device). */
        st = kiln_cuda_module_load();
        if (kiln_cuda_backend()) kiln_backend_register(kiln_cuda_backend());
#endif
        kiln_ops_register_kernels(KILN_DEVICE_CPU, kiln_cpu_op_kernels());
#ifdef KILN_WITH_CUDA
        if (kiln_cuda_op_kernels()) kiln_ops_register_kernels(KILN_DEVICE_CUDA, kiln_cuda_op_kernels());
#endif
        if (!st) st = register_fast_cpu_kernels();
        if (!st) st = register_fast_cuda_kernels();
        kiln_autograd_init();
        kiln_autocast_init();
        kiln_profiler_init();
        kiln_anomaly_init();
        kiln_memory_context_register();
        if (!st) st = kiln_runtime_init();
        if (!st) st = kiln_threads_init();
        if (!st) st = kiln_device_default_from_env();
        initialised = st == KILN_OK;
    }
    pthread_mutex_unlock(&init_mutex);
    return st;
}

void kiln_shutdown(void) {
    pthread_mutex_lock(&init_mutex);
    if (initialised) {
        kiln_tensor_layer_shutdown(); /* reports tensors still alive, before their memory goes */
#ifdef KILN_CUDA_FAST_TABLE
        kiln_cuda_fast_kernels_shutdown(); /* its persistent workspaces go back before the allocators */
#endif
        kiln_runtime_shutdown();
        kiln_cpu_fast_kernels_shutdown();
        initialised = false;
    }
    pthread_mutex_unlock(&init_mutex);
}

const char *kiln_version(void) { return KILN_VERSION_STRING; }

const char *kiln_build_options(void) { return KILN_BUILD_OPTIONS_STRING; }

bool kiln_debug_handles(void) { return KILN_DEBUG_HANDLES != 0; }

/* The CUDA backend as a module (docs/cuda.md, "The CUDA module"). In a
 * build with KILN_CUDA_MODULE (a real CUDA build, the default there) the
 * backend, its kernels and the CUDA libraries (cudart, cuBLASLt, cuDNN,
 * NCCL) live in libkiln_cuda.so, and libkiln links none of them.
 * kiln_init calls kiln_cuda_module_load, which loads the module only when
 * a CUDA driver is installed and sees a device, as ggml loads its
 * backends: a CPU-only machine runs the same build without mapping
 * hundreds of megabytes of GPU code, or without the CUDA libraries at all.
 *
 * The module's entry points are the kiln_cuda_* functions the rest of
 * libkiln calls (the backend vtable, the kernel tables, the device
 * queries); the module's own objects name them kiln_cudamod_* (CMake
 * renames them at compile time) and the definitions below forward to them
 * through the pointers looked up at load. Before a load, or when it did
 * not happen, they answer as a build without CUDA does, and
 * kiln_cuda_module_reason says why (kiln info prints it).
 *
 * KILN_CUDA: unset or "auto" loads the module when the driver sees a
 * device; "off" never loads it; "force" loads it even without a driver or
 * device (its backend then counts no device and says why: how CI checks
 * that the module loads and binds). KILN_CUDA_MODULE=PATH names the module
 * file; by default it is libkiln_cuda.so beside the libkiln that is
 * running, else in the install's libdir. */
#define _GNU_SOURCE /* dladdr */
#include "runtime/cuda_module.h"

#include "kiln_config.h"

#if KILN_CUDA_MODULE

#include <dlfcn.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "kernels/kernels.h"
#include "kernels/optim_kernels.h"
#include "kiln/kiln.h"
#include "ops/cuda_tables.h"
#include "runtime/backend.h"
#include "runtime/cuda_backend.h"
#include "runtime/cuda_device.h"

static struct {
    void *handle;
    const struct kiln_backend *(*backend)(void);
    const kiln_op_kernel *(*op_kernels)(void);
    const kiln_op_kernel *(*fast_op_kernels)(void);
    void (*fast_kernels_shutdown)(void);
    const kiln_tensor_kernels *(*tensor_kernels)(void);
    const kiln_optim_kernels *(*optim_kernels)(void);
    kiln_status (*device_properties)(int, char *, size_t);
    kiln_status (*versions)(int *, int *);
    void (*device_forget)(void);
} mod;
static char reason[2 * PATH_MAX] = "the CUDA module has not been looked for (kiln_init loads it)";
static char loaded_from[PATH_MAX];
static pthread_once_t once = PTHREAD_ONCE_INIT;
static bool bad_choice; /* KILN_CUDA holds no choice: kiln_init fails, naming it */

/* The driver's answer to "is there a device", without the runtime: 0 and
 * *count when libcuda loads and cuInit succeeds; else why not, in reason. */
static int driver_devices(int *count) {
    *count = 0;
    void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cu) {
        snprintf(reason, sizeof reason, "no CUDA driver (%s)", dlerror());
        return -1;
    }
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(cu, "cuInit");
    int (*get_count)(int *) = (int (*)(int *))dlsym(cu, "cuDeviceGetCount");
    if (!init || !get_count) {
        snprintf(reason, sizeof reason, "libcuda.so.1 lacks cuInit or cuDeviceGetCount (a broken driver install)");
        return -1;
    }
    int r = init(0);
    if (r) {
        /* 100: CUDA_ERROR_NO_DEVICE; 999 and others: the driver is not usable. */
        snprintf(reason, sizeof reason, "%s (cuInit returned %d)",
                 r == 100 ? "the CUDA driver sees no device" : "the CUDA driver failed to start", r);
        return -1;
    }
    if ((r = get_count(count)) != 0) {
        snprintf(reason, sizeof reason, "the CUDA driver could not count devices (cuDeviceGetCount returned %d)", r);
        return -1;
    }
    if (*count == 0) {
        snprintf(reason, sizeof reason, "the CUDA driver sees no device");
        return -1;
    }
    return 0;
}

/* Where the module is: KILN_CUDA_MODULE, else beside this libkiln, else
 * the install's libdir. */
static void module_path(char *out, size_t size) {
    const char *env = getenv("KILN_CUDA_MODULE");
    if (env && *env) {
        snprintf(out, size, "%s", env);
        return;
    }
    Dl_info info;
    if (dladdr((void *)kiln_cuda_module_load, &info) && info.dli_fname && strchr(info.dli_fname, '/')) {
        char self[PATH_MAX];
        snprintf(self, sizeof self, "%s", info.dli_fname);
        snprintf(out, size, "%s/libkiln_cuda.so", dirname(self));
        if (access(out, F_OK) == 0) return;
    }
    snprintf(out, size, "%s/libkiln_cuda.so", KILN_CUDA_MODULE_DIR);
}

/* A refused module stays mapped, unused: its constructors may already have
 * registered tables with libkiln (NCCL's, src/dist/nccl_cuda.c), which an
 * unmapped module would leave dangling. Its backend is never registered,
 * so no CUDA device exists and nothing reaches them. */
static void leave_mapped(void *h) { (void)h; }

#define LOOKUP(field)                                                                                       \
    do {                                                                                                    \
        *(void **)&mod.field = dlsym(h, "kiln_cudamod_" #field);                                            \
        if (!mod.field) {                                                                                   \
            snprintf(reason, sizeof reason, "%s does not match this libkiln (no kiln_cudamod_" #field ")",  \
                     path);                                                                                 \
            goto mismatch;                                                                                  \
        }                                                                                                   \
    } while (0)

static void load(void) {
    const char *choice = getenv("KILN_CUDA");
    bool force = choice && !strcmp(choice, "force");
    if (choice && *choice && strcmp(choice, "auto") && strcmp(choice, "force")) {
        if (!strcmp(choice, "off") || !strcmp(choice, "0")) {
            snprintf(reason, sizeof reason, "turned off by KILN_CUDA=%s", choice);
        } else {
            snprintf(reason, sizeof reason, "KILN_CUDA='%s' is not auto, off or force: the CUDA module was not loaded",
                     choice);
            bad_choice = true;
        }
        return;
    }
    int count = 0;
    if (driver_devices(&count) != 0 && !force) return;
    char path[PATH_MAX];
    module_path(path, sizeof path);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(reason, sizeof reason, "the CUDA module did not load: %s", dlerror());
        return;
    }
    /* The module must bind to this libkiln, not bring a second one (a
     * program linking the static libkiln would get two). */
    bool (*same_core)(void *) = (bool (*)(void *))dlsym(h, "kiln_cudamod_same_core");
    if (!same_core) {
        snprintf(reason, sizeof reason, "%s is not a Kiln CUDA module (no kiln_cudamod_same_core)", path);
        leave_mapped(h);
        return;
    }
    if (!same_core((void *)kiln_init)) {
        snprintf(reason, sizeof reason,
                 "%s binds to another libkiln than this one (a program linking the static libkiln cannot load "
                 "it: link libkiln.so)",
                 path);
        leave_mapped(h);
        return;
    }
    const char *(*build)(void) = (const char *(*)(void))dlsym(h, "kiln_cudamod_build");
    if (!build || strcmp(build(), KILN_VERSION_STRING " " KILN_BUILD_OPTIONS_STRING) != 0) {
        snprintf(reason, sizeof reason, "%s was built for another libkiln (%s; this one: %s)", path,
                 build ? build() : "no build string", KILN_VERSION_STRING " " KILN_BUILD_OPTIONS_STRING);
        leave_mapped(h);
        return;
    }
    LOOKUP(backend);
    LOOKUP(op_kernels);
    LOOKUP(fast_op_kernels);
    LOOKUP(fast_kernels_shutdown);
    LOOKUP(tensor_kernels);
    LOOKUP(optim_kernels);
    LOOKUP(device_properties);
    LOOKUP(versions);
    LOOKUP(device_forget);
    mod.handle = h;
    snprintf(loaded_from, sizeof loaded_from, "%s", path);
    reason[0] = '\0';
    return;
mismatch:
    memset(&mod, 0, sizeof mod);
    leave_mapped(h);
}

kiln_status kiln_cuda_module_load(void) {
    pthread_once(&once, load);
    if (bad_choice)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "set KILN_CUDA to auto, off or force, or unset it",
                          "KILN_CUDA='%s' is not a choice for loading the CUDA module (auto, off or force)",
                          getenv("KILN_CUDA") ? getenv("KILN_CUDA") : "");
    return KILN_OK;
}

const char *kiln_cuda_module_reason(void) { return reason; }

const char *kiln_cuda_module_path(void) { return mod.handle ? loaded_from : ""; }

const struct kiln_backend *kiln_cuda_backend(void) { return mod.backend ? mod.backend() : NULL; }
const kiln_op_kernel *kiln_cuda_op_kernels(void) { return mod.op_kernels ? mod.op_kernels() : NULL; }
const kiln_op_kernel *kiln_cuda_fast_op_kernels(void) { return mod.fast_op_kernels ? mod.fast_op_kernels() : NULL; }
void kiln_cuda_fast_kernels_shutdown(void) {
    if (mod.fast_kernels_shutdown) mod.fast_kernels_shutdown();
}
const kiln_tensor_kernels *kiln_cuda_tensor_kernels(void) { return mod.tensor_kernels ? mod.tensor_kernels() : NULL; }
const kiln_optim_kernels *kiln_cuda_optim_kernels(void) { return mod.optim_kernels ? mod.optim_kernels() : NULL; }

kiln_status kiln_cuda_device_properties(int index, char *buf, size_t size) {
    if (mod.device_properties) return mod.device_properties(index, buf, size);
    if (buf && size) buf[0] = '\0';
    return KILN_RAISE(KILN_ERR_DEVICE, "kiln info says why; KILN_CUDA=force loads the module anyway",
                      "kiln_cuda_device_properties: cuda:%d: the CUDA module is not loaded: %s", index, reason);
}

void kiln_cuda_device_forget(void) {
    if (mod.device_forget) mod.device_forget();
}

kiln_status kiln_cuda_versions(int *driver, int *runtime) {
    if (mod.versions) return mod.versions(driver, runtime);
    if (driver) *driver = 0;
    if (runtime) *runtime = 0;
    return KILN_OK;
}

#else

/* Without the module (a CPU-only build, the emulator, or a CUDA build
 * with KILN_CUDA_MODULE=OFF) there is nothing to load. */
kiln_status kiln_cuda_module_load(void) { return KILN_OK; }
const char *kiln_cuda_module_reason(void) { return ""; }
const char *kiln_cuda_module_path(void) { return ""; }

#endif

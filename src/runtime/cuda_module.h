/* Loading the CUDA backend as a module (src/runtime/cuda_module.c,
 * docs/cuda.md "The CUDA module"). In builds without the module (CPU-only,
 * the emulator, KILN_CUDA_MODULE=OFF) the calls do nothing. */
#ifndef KILN_SRC_RUNTIME_CUDA_MODULE_H
#define KILN_SRC_RUNTIME_CUDA_MODULE_H

#include "kiln/base.h"

/* Load libkiln_cuda.so once, when the driver sees a device (KILN_CUDA:
 * auto, off, force). KILN_OK whether or not it loaded (a module that does
 * not load leaves CUDA absent, and kiln_cuda_module_reason says why);
 * KILN_ERR_INVALID_ARGUMENT when KILN_CUDA holds another value. Blocks while the
 * driver initialises and the module's libraries are mapped (the first
 * call; kiln_init makes it). */
kiln_status kiln_cuda_module_load(void);
/* Why the module is not loaded ("no CUDA driver (...)", "turned off by
 * KILN_CUDA=off", "the CUDA module did not load: ..."); "" when it is, or
 * in a build without the module. Static storage. */
const char *kiln_cuda_module_reason(void);
/* The module file loaded; "" when none. Static storage. */
const char *kiln_cuda_module_path(void);

#endif

/* The CUDA module's own entry points (src/runtime/cuda_module.c loads the
 * module and checks them before looking up the renamed kiln_cudamod_*
 * functions). Compiled into libkiln_cuda.so only. */
#include "kiln/kiln.h"
#include "kiln_config.h"

#ifdef KILN_CUDA_MODULE_SIDE
bool kiln_cudamod_same_core(void *core_init);
const char *kiln_cudamod_build(void);

/* Whether kiln_init as this module binds it is the loader's: one libkiln
 * in the process. */
bool kiln_cudamod_same_core(void *core_init) { return core_init == (void *)kiln_init; }

/* The version and build options the module was compiled with; the loader
 * refuses a module of another build. */
const char *kiln_cudamod_build(void) { return KILN_VERSION_STRING " " KILN_BUILD_OPTIONS_STRING; }
#else
/* Outside the module the CUDA backend is part of libkiln: nothing to check. */
typedef int kiln_cuda_module_entry_unused;
#endif

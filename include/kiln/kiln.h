/* Kiln: a deep-learning training runtime in C11. Include this one header.
 *
 * Call kiln_init() once before anything else; it registers the compiled
 * backends explicitly (no constructors, so static linking works). */
#ifndef KILN_KILN_H
#define KILN_KILN_H

#include "kiln/base.h"
#include "kiln/runtime.h"
#include "kiln/tensor.h"
#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "kiln/nn.h"
#include "kiln/optim.h"
#include "kiln/amp.h"
#include "kiln/data.h"
#include "kiln/diag.h"
#include "kiln/io.h"
#include "kiln/dist.h"
#include "kiln/plan.h"
#include "kiln/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Register the backends this build has (cpu, meta, cuda when compiled),
 * read KILN_ALLOC_CONF and KILN_LOG. Idempotent and thread-safe. A CUDA
 * build on a machine without a driver succeeds with zero CUDA devices.
 * Does not block on any device. */
kiln_status kiln_init(void);
/* Wait for every device, free cached memory, unregister backends. Tensors
 * still alive must not be used afterwards. */
void kiln_shutdown(void);
/* "0.1.0". Static string. */
const char *kiln_version(void);
/* One line naming the build's options ("cuda=on cudnn=on ..."). Static. */
const char *kiln_build_options(void);
/* True in debug and sanitizer builds, where tensor handles are tracked so
 * that a double kiln_release is reported rather than undefined. */
bool kiln_debug_handles(void);

#ifdef __cplusplus
}
#endif
#endif /* KILN_KILN_H */

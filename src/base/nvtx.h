/* NVTX ranges: with the real CUDA backend and the toolkit's header-only
 * NVTX3 (KILN_HAVE_NVTX3, set by CMake), every dispatched op and every user
 * range (kiln_range_push/pop) is also an NVTX range, so Nsight Systems
 * shows Kiln's op names on the host timeline above the kernels they
 * launched. Without a tool attached an NVTX call is one indirect call to
 * an empty function. Elsewhere (CPU builds, the emulator) these are
 * no-ops. */
#ifndef KILN_SRC_BASE_NVTX_H
#define KILN_SRC_BASE_NVTX_H

#if defined(KILN_HAVE_NVTX3) && !defined(KILN_CUDA_EMULATION)
#include <nvtx3/nvToolsExt.h>
#define KILN_NVTX_PUSH(name) ((void)nvtxRangePushA(name))
#define KILN_NVTX_POP() ((void)nvtxRangePop())
#else
#define KILN_NVTX_PUSH(name) ((void)(name))
#define KILN_NVTX_POP() ((void)0)
#endif

#endif

/* Kiln CUDA emulator: cuda_runtime.h = the runtime API, plus (in C++) the
 * device-side emulation (kiln_emu.h). */
#ifndef KILN_EMU_CUDA_RUNTIME_H
#define KILN_EMU_CUDA_RUNTIME_H
#include "cuda_runtime_api.h"
#ifdef __cplusplus
#include "../kiln_emu.h"
#endif
#endif

/* Checks shared by the emulator's own tests (test_emu_*.cu): EXPECT counts
 * and reports a failed condition and goes on; CUDA_OK stops the test on a
 * failed runtime call. Each test prints `passed`/`failed` at the end. */
#ifndef KILN_TESTS_EMU_EMU_TEST_UTIL_H
#define KILN_TESTS_EMU_EMU_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda/cuda_common.h"

static int failed, passed;
#define EXPECT(cond, ...)                                                                                    \
    do {                                                                                                     \
        if (cond) {                                                                                          \
            passed++;                                                                                        \
        } else {                                                                                             \
            failed++;                                                                                        \
            fprintf(stderr, "%s:%d: FAILED %s: ", __FILE__, __LINE__, #cond);                                \
            fprintf(stderr, __VA_ARGS__);                                                                    \
            fputc('\n', stderr);                                                                             \
        }                                                                                                    \
    } while (0)
#define CUDA_OK(call)                                                                                        \
    do {                                                                                                     \
        cudaError_t e_ = (call);                                                                             \
        if (e_ != cudaSuccess) {                                                                             \
            fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #call, cudaGetErrorName(e_));           \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

#endif

/* kiln_set_allow_tf32 (include/kiln/runtime.h): whether the CUDA library
 * fast paths (cuBLASLt GEMM, cuDNN convolution) may use TF32 for f32 data.
 * In every build: the setting is public; only the real CUDA build reads it. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/runtime.h"

/* -1: not set yet (read from KILN_ALLOW_TF32 at first use). */
static atomic_int allow_tf32_flag = -1;

void kiln_set_allow_tf32(bool enabled) { atomic_store(&allow_tf32_flag, enabled ? 1 : 0); }

bool kiln_allow_tf32(void) {
    int v = atomic_load(&allow_tf32_flag);
    if (v < 0) {
        const char *e = getenv("KILN_ALLOW_TF32");
        int want = e && (!strcmp(e, "1") || !strcmp(e, "on") || !strcmp(e, "true")) ? 1 : 0;
        int expected = -1;
        atomic_compare_exchange_strong(&allow_tf32_flag, &expected, want);
        v = atomic_load(&allow_tf32_flag);
    }
    return v == 1;
}

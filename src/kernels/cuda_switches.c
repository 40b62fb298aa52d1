/* The runtime switches of the CUDA backend that PyTorch users know from
 * torch.backends.cudnn.enabled and CUDA_LAUNCH_BLOCKING
 * (include/kiln/runtime.h): kiln_set_cudnn_enabled / KILN_CUDNN and
 * kiln_set_launch_blocking / KILN_LAUNCH_BLOCKING. Built in every
 * configuration, so a program that sets them links without CUDA. */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/log_internal.h"
#include "kiln/runtime.h"

/* -1: not set yet (read from the environment at first use). */
static atomic_int cudnn_flag = -1;
static atomic_int blocking_flag = -1;

/* 1 on, 0 off, -1 unset or not a switch value (warned once). */
static int env_switch(const char *name) {
    const char *v = getenv(name);
    if (!v || !*v) return -1;
    if (!strcmp(v, "1") || !strcmp(v, "on") || !strcmp(v, "true")) return 1;
    if (!strcmp(v, "0") || !strcmp(v, "off") || !strcmp(v, "false")) return 0;
    kiln_log_write(KILN_LOG_WARN, "%s='%s' is not a switch (1/on/true or 0/off/false): ignored", name, v);
    return -1;
}

static bool read_switch(atomic_int *flag, const char *env, bool dflt) {
    int v = atomic_load(flag);
    if (v < 0) {
        int e = env_switch(env), expected = -1;
        atomic_compare_exchange_strong(flag, &expected, e < 0 ? (dflt ? 1 : 0) : e);
        v = atomic_load(flag);
    }
    return v == 1;
}

void kiln_set_cudnn_enabled(bool enabled) { atomic_store(&cudnn_flag, enabled ? 1 : 0); }
bool kiln_is_cudnn_enabled(void) { return read_switch(&cudnn_flag, "KILN_CUDNN", true); }
void kiln_set_launch_blocking(bool enabled) { atomic_store(&blocking_flag, enabled ? 1 : 0); }
bool kiln_is_launch_blocking(void) { return read_switch(&blocking_flag, "KILN_LAUNCH_BLOCKING", false); }

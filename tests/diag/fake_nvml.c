/* A fake NVML: a shared library exporting the NVML functions Kiln's GPU
 * monitor loads (src/diag/gpu_monitor.c) and returning scripted values for
 * two GPUs, so `kiln smi`, kiln train --monitor and the process list run
 * their real NVML code on a machine without a driver (tests/tools/nvml_fake.sh,
 * with KILN_NVML_LIBRARY pointing here). The signatures are NVML's
 * (nvml.h): nvmlReturn_t is an int, nvmlDevice_t an opaque pointer.
 *
 * GPU 0: "Fake GPU 0 (scripted)", 87% busy, memory 45% busy, 40 of 80 GiB,
 *        312.5 W, 61 C, SM 1755 MHz, memory 2619 MHz, throttled by the power
 *        cap; two processes: pid 4242 with 12 GiB, pid 4343 whose memory is
 *        not available (as under some MIG and container setups).
 * GPU 1: "Fake GPU 1 (scripted)", 3% / 0%, 1 of 80 GiB, 70 W, 35 C,
 *        SM 210 MHz, memory 405 MHz, idle; no processes.
 * FAKE_NVML_FAIL=init makes nvmlInit_v2 fail (NVML_ERROR_DRIVER_NOT_LOADED). */
#include <stdlib.h>
#include <string.h>

#define NVML_SUCCESS                 0
#define NVML_ERROR_INVALID_ARGUMENT  2
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_NOT_SUPPORTED     3
#define GIB                          (1024ULL * 1024 * 1024)
#define NOT_AVAILABLE                0xFFFFFFFFFFFFFFFFULL

typedef struct fake_util {
    unsigned int gpu, memory;
} fake_util;
typedef struct fake_memory {
    unsigned long long total, free, used;
} fake_memory;
typedef struct fake_process { /* nvmlProcessInfo_v3_t */
    unsigned int pid;
    unsigned long long used_gpu_memory;
    unsigned int gpu_instance_id, compute_instance_id;
} fake_process;

typedef struct fake_gpu {
    const char *name;
    fake_util util;
    unsigned long long used;
    unsigned power_mw, temp_c, sm_mhz, mem_mhz;
    unsigned long long throttle;
    int n_procs;
    fake_process procs[2];
} fake_gpu;

static const fake_gpu gpus[2] = {
    {"Fake GPU 0 (scripted)",
     {87, 45},
     40 * GIB,
     312500,
     61,
     1755,
     2619,
     0x4,
     2,
     {{4242, 12 * GIB, 0xFFFFFFFFu, 0xFFFFFFFFu}, {4343, NOT_AVAILABLE, 0xFFFFFFFFu, 0xFFFFFFFFu}}},
    {"Fake GPU 1 (scripted)", {3, 0}, 1 * GIB, 70000, 35, 210, 405, 0x1, 0, {{0, 0, 0, 0}}},
};

static int initialised;

/* A device handle is a pointer into gpus[]. */
static const fake_gpu *gpu_of(void *dev) {
    for (int i = 0; i < 2; i++)
        if (dev == (const void *)&gpus[i]) return &gpus[i];
    return NULL;
}

int nvmlInit_v2(void) {
    const char *fail = getenv("FAKE_NVML_FAIL");
    if (fail && !strcmp(fail, "init")) return NVML_ERROR_DRIVER_NOT_LOADED;
    initialised = 1;
    return NVML_SUCCESS;
}

int nvmlShutdown(void) {
    initialised = 0;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(int r) {
    switch (r) {
    case NVML_SUCCESS:
        return "Success";
    case NVML_ERROR_INVALID_ARGUMENT:
        return "Invalid Argument";
    case NVML_ERROR_INSUFFICIENT_SIZE:
        return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED:
        return "Driver Not Loaded (fake NVML, FAKE_NVML_FAIL=init)";
    default:
        return "Unknown Error";
    }
}

int nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialised || !count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = 2;
    return NVML_SUCCESS;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **dev) {
    if (!initialised || index >= 2 || !dev) return NVML_ERROR_INVALID_ARGUMENT;
    *dev = (void *)&gpus[index];
    return NVML_SUCCESS;
}

int nvmlDeviceGetName(void *dev, char *name, unsigned int length) {
    const fake_gpu *g = gpu_of(dev);
    if (!g || !name) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(g->name) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(name, g->name);
    return NVML_SUCCESS;
}

int nvmlDeviceGetUtilizationRates(void *dev, fake_util *u) {
    const fake_gpu *g = gpu_of(dev);
    if (!g || !u) return NVML_ERROR_INVALID_ARGUMENT;
    *u = g->util;
    return NVML_SUCCESS;
}

int nvmlDeviceGetMemoryInfo(void *dev, fake_memory *m) {
    const fake_gpu *g = gpu_of(dev);
    if (!g || !m) return NVML_ERROR_INVALID_ARGUMENT;
    m->total = 80 * GIB;
    m->used = g->used;
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

int nvmlDeviceGetPowerUsage(void *dev, unsigned int *mw) {
    const fake_gpu *g = gpu_of(dev);
    if (!g || !mw) return NVML_ERROR_INVALID_ARGUMENT;
    *mw = g->power_mw;
    return NVML_SUCCESS;
}

int nvmlDeviceGetTemperature(void *dev, int sensor, unsigned int *t) {
    const fake_gpu *g = gpu_of(dev);
    if (!g || !t || sensor != 0) return NVML_ERROR_INVALID_ARGUMENT;
    *t = g->temp_c;
    return NVML_SUCCESS;
}

int nvmlDeviceGetClockInfo(void *dev, int type, unsigned int *mhz) {
    const fake_gpu *g = gpu_of(dev);
    if (!g || !mhz || (type != 1 && type != 2)) return NVML_ERROR_INVALID_ARGUMENT;
    *mhz = type == 1 ? g->sm_mhz : g->mem_mhz;
    return NVML_SUCCESS;
}

int nvmlDeviceGetCurrentClocksThrottleReasons(void *dev, unsigned long long *reasons) {
    const fake_gpu *g = gpu_of(dev);
    if (!g || !reasons) return NVML_ERROR_INVALID_ARGUMENT;
    *reasons = g->throttle;
    return NVML_SUCCESS;
}

/* NVML's protocol: *count in is the room, out the process count;
 * NVML_ERROR_INSUFFICIENT_SIZE when the room is too small. */
int nvmlDeviceGetComputeRunningProcesses_v3(void *dev, unsigned int *count, fake_process *infos) {
    const fake_gpu *g = gpu_of(dev);
    if (!g || !count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned room = *count;
    *count = (unsigned)g->n_procs;
    if (room < (unsigned)g->n_procs) return NVML_ERROR_INSUFFICIENT_SIZE;
    if (g->n_procs && !infos) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < g->n_procs; i++) infos[i] = g->procs[i];
    return NVML_SUCCESS;
}

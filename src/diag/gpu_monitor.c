/* The GPU monitor: NVML, loaded at run time, sampled on demand or by a
 * background thread; and the `kiln smi` table.
 *
 * NVML is opened with dlopen("libnvidia-ml.so.1") (or the library
 * KILN_NVML_LIBRARY names: the tests' fake NVML) and a handful of
 * function pointers whose types are declared here, so nothing in the build
 * depends on nvml.h and the binaries run where there is no driver: sampling
 * then fails with a status that says so. The signatures follow NVML's
 * header (nvmlReturn_t is an int enum; nvmlDevice_t an opaque pointer). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "diag/strbuf.h"
#include "kiln/diag.h"

typedef int nvml_return;
typedef void *nvml_device;
typedef struct nvml_utilization {
    unsigned int gpu, memory;
} nvml_utilization;
typedef struct nvml_memory {
    unsigned long long total, free, used;
} nvml_memory;
typedef struct nvml_process_info { /* nvmlProcessInfo_v2_t / _v3_t */
    unsigned int pid;
    unsigned long long used_gpu_memory;
    unsigned int gpu_instance_id, compute_instance_id;
} nvml_process_info;

enum {
    NVML_SUCCESS = 0,
    NVML_TEMPERATURE_GPU = 0,
    NVML_CLOCK_SM = 1,
    NVML_CLOCK_MEM = 2,
};
#define NVML_VALUE_NOT_AVAILABLE 0xFFFFFFFFFFFFFFFFULL

static struct {
    nvml_return (*init)(void);
    nvml_return (*shutdown)(void);
    nvml_return (*count)(unsigned int *);
    nvml_return (*handle)(unsigned int, nvml_device *);
    nvml_return (*name)(nvml_device, char *, unsigned int);
    nvml_return (*utilization)(nvml_device, nvml_utilization *);
    nvml_return (*memory)(nvml_device, nvml_memory *);
    nvml_return (*power)(nvml_device, unsigned int *);
    nvml_return (*temperature)(nvml_device, int, unsigned int *);
    nvml_return (*clock)(nvml_device, int, unsigned int *);
    nvml_return (*throttle)(nvml_device, unsigned long long *);
    nvml_return (*processes)(nvml_device, unsigned int *, nvml_process_info *);
    const char *(*error_string)(nvml_return);
    void *lib;
    kiln_status status;
    char why[256];
} nvml;
static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;

static void *nvml_sym(const char *name) { return nvml.lib ? dlsym(nvml.lib, name) : NULL; }

static void nvml_load(void) {
    /* KILN_NVML_LIBRARY: another NVML (a path or a soname), e.g. the fake
     * one the tests script (tests/diag/fake_nvml.c). */
    const char *path = getenv("KILN_NVML_LIBRARY");
    bool other = path && *path;
    nvml.lib = dlopen(other ? path : "libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!nvml.lib) {
        nvml.status = KILN_ERR_DEVICE;
        if (other) {
            const char *err = dlerror();
            snprintf(nvml.why, sizeof nvml.why, "KILN_NVML_LIBRARY=%s cannot be loaded: %s", path,
                     err ? err : "dlopen failed");
        } else {
            snprintf(nvml.why, sizeof nvml.why, "no NVIDIA driver (libnvidia-ml.so.1 not found)");
        }
        return;
    }
    /* Casting dlsym's void * to a function pointer is what POSIX requires to work. */
    *(void **)&nvml.init = nvml_sym("nvmlInit_v2");
    *(void **)&nvml.shutdown = nvml_sym("nvmlShutdown");
    *(void **)&nvml.count = nvml_sym("nvmlDeviceGetCount_v2");
    *(void **)&nvml.handle = nvml_sym("nvmlDeviceGetHandleByIndex_v2");
    *(void **)&nvml.name = nvml_sym("nvmlDeviceGetName");
    *(void **)&nvml.utilization = nvml_sym("nvmlDeviceGetUtilizationRates");
    *(void **)&nvml.memory = nvml_sym("nvmlDeviceGetMemoryInfo");
    *(void **)&nvml.power = nvml_sym("nvmlDeviceGetPowerUsage");
    *(void **)&nvml.temperature = nvml_sym("nvmlDeviceGetTemperature");
    *(void **)&nvml.clock = nvml_sym("nvmlDeviceGetClockInfo");
    *(void **)&nvml.throttle = nvml_sym("nvmlDeviceGetCurrentClocksThrottleReasons");
    *(void **)&nvml.processes = nvml_sym("nvmlDeviceGetComputeRunningProcesses_v3");
    if (!nvml.processes) *(void **)&nvml.processes = nvml_sym("nvmlDeviceGetComputeRunningProcesses_v2");
    *(void **)&nvml.error_string = nvml_sym("nvmlErrorString");
    if (!nvml.init || !nvml.count || !nvml.handle) {
        nvml.status = KILN_ERR_DEVICE;
        snprintf(nvml.why, sizeof nvml.why,
                 "%s lacks nvmlInit_v2 or nvmlDeviceGetCount_v2 (driver too old)",
                 other ? path : "libnvidia-ml.so.1");
        return;
    }
    nvml_return r = nvml.init();
    if (r != NVML_SUCCESS) {
        nvml.status = KILN_ERR_DEVICE;
        snprintf(nvml.why, sizeof nvml.why, "nvmlInit_v2 failed: %s (error %d)",
                 nvml.error_string ? nvml.error_string(r) : "unknown", r);
    }
}

static kiln_status nvml_ready(const char *fn) {
    pthread_once(&nvml_once, nvml_load);
    if (nvml.status)
        return KILN_RAISE(nvml.status, "install the NVIDIA driver, or run where a GPU is visible", "%s: %s",
                          fn, nvml.why);
    return KILN_OK;
}

static void sample_device(unsigned idx, kiln_gpu_stats *g) {
    memset(g, 0, sizeof *g);
    g->index = (int)idx;
    nvml_device dev = NULL;
    if (nvml.handle(idx, &dev) != NVML_SUCCESS) {
        g->missing = ~0u;
        snprintf(g->name, sizeof g->name, "(unavailable)");
        return;
    }
    if (!nvml.name || nvml.name(dev, g->name, sizeof g->name) != NVML_SUCCESS)
        snprintf(g->name, sizeof g->name, "?");
    nvml_utilization u;
    if (nvml.utilization && nvml.utilization(dev, &u) == NVML_SUCCESS)
        g->util_gpu = u.gpu, g->util_memory = u.memory;
    else
        g->missing |= KILN_GPU_MISSING_UTIL;
    nvml_memory m;
    if (nvml.memory && nvml.memory(dev, &m) == NVML_SUCCESS)
        g->memory_used = m.used, g->memory_total = m.total;
    else
        g->missing |= KILN_GPU_MISSING_MEMORY;
    unsigned mw = 0, v = 0;
    if (nvml.power && nvml.power(dev, &mw) == NVML_SUCCESS)
        g->power_watts = mw / 1000.0;
    else
        g->missing |= KILN_GPU_MISSING_POWER;
    if (nvml.temperature && nvml.temperature(dev, NVML_TEMPERATURE_GPU, &v) == NVML_SUCCESS)
        g->temperature_c = v;
    else
        g->missing |= KILN_GPU_MISSING_TEMPERATURE;
    bool clocks = nvml.clock && nvml.clock(dev, NVML_CLOCK_SM, &g->clock_sm_mhz) == NVML_SUCCESS &&
                  nvml.clock(dev, NVML_CLOCK_MEM, &g->clock_memory_mhz) == NVML_SUCCESS;
    if (!clocks) g->missing |= KILN_GPU_MISSING_CLOCKS;
    unsigned long long reasons = 0;
    if (nvml.throttle && nvml.throttle(dev, &reasons) == NVML_SUCCESS)
        g->throttle_reasons = reasons;
    else
        g->missing |= KILN_GPU_MISSING_THROTTLE;
    nvml_process_info procs[32];
    unsigned n = 32;
    if (nvml.processes && nvml.processes(dev, &n, procs) == NVML_SUCCESS) {
        for (unsigned i = 0; i < n && g->n_procs < KILN_GPU_MAX_PROCS; i++) {
            g->procs[g->n_procs].pid = procs[i].pid;
            g->procs[g->n_procs].memory =
                procs[i].used_gpu_memory == NVML_VALUE_NOT_AVAILABLE ? 0 : procs[i].used_gpu_memory;
            g->n_procs++;
        }
    } else {
        g->missing |= KILN_GPU_MISSING_PROCS;
    }
}

kiln_status kiln_gpu_monitor_sample(kiln_gpu_stats *out, int max, int *count) {
    if (count) *count = 0;
    if (!count || (max > 0 && !out))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_gpu_monitor_sample: out or count is NULL");
    KILN_TRY(nvml_ready("kiln_gpu_monitor_sample"));
    unsigned n = 0;
    nvml_return r = nvml.count(&n);
    if (r != NVML_SUCCESS)
        return KILN_RAISE(KILN_ERR_DEVICE, "check the driver with nvidia-smi",
                          "kiln_gpu_monitor_sample: nvmlDeviceGetCount_v2 failed: %s (error %d)",
                          nvml.error_string ? nvml.error_string(r) : "unknown", r);
    for (unsigned i = 0; i < n && (int)i < max; i++) sample_device(i, &out[i]);
    *count = (int)n < max ? (int)n : max;
    return KILN_OK;
}

const char *kiln_gpu_throttle_reasons_str(uint64_t reasons, char *buf, size_t size) {
    static const struct {
        uint64_t bit;
        const char *name;
    } names[] = {
        {0x1, "idle"},
        {0x2, "application clocks"},
        {0x4, "power cap"},
        {0x8, "hw slowdown"},
        {0x10, "sync boost"},
        {0x20, "sw thermal slowdown"},
        {0x40, "hw thermal slowdown"},
        {0x80, "power brake"},
        {0x100, "display clocks"},
    };
    if (!buf || size == 0) return buf;
    buf[0] = '\0';
    size_t len = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if ((reasons & names[i].bit) && len < size)
            len += (size_t)snprintf(buf + len, size - len, "%s%s", len ? ", " : "", names[i].name);
    if (!reasons) snprintf(buf, size, "none");
    return buf;
}

/* ---- The background sampler ------------------------------------------------------- */

static pthread_mutex_t sampler_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sampler_cond = PTHREAD_COND_INITIALIZER;
static struct {
    bool running, stop;
    pthread_t thread;
    int interval_ms;
    kiln_gpu_monitor_callback callback;
    void *user;
} sampler;

static void *sampler_main(void *arg) {
    (void)arg;
    kiln_gpu_stats gpus[16];
    pthread_mutex_lock(&sampler_mutex);
    while (!sampler.stop) {
        pthread_mutex_unlock(&sampler_mutex);
        int n = 0;
        kiln_status st = kiln_gpu_monitor_sample(gpus, 16, &n);
        sampler.callback(gpus, n, st, sampler.user);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        long long ns = until.tv_nsec + (long long)sampler.interval_ms * 1000000LL;
        until.tv_sec += (time_t)(ns / 1000000000LL);
        until.tv_nsec = (long)(ns % 1000000000LL);
        pthread_mutex_lock(&sampler_mutex);
        while (!sampler.stop && pthread_cond_timedwait(&sampler_cond, &sampler_mutex, &until) == 0) {
        }
    }
    pthread_mutex_unlock(&sampler_mutex);
    return NULL;
}

kiln_status kiln_gpu_monitor_start(int interval_ms, kiln_gpu_monitor_callback callback, void *user) {
    if (!callback || interval_ms < 10)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass a callback and an interval of at least 10 ms",
                          "kiln_gpu_monitor_start: callback %s, interval %d ms", callback ? "set" : "NULL",
                          interval_ms);
    pthread_mutex_lock(&sampler_mutex);
    if (sampler.running) {
        pthread_mutex_unlock(&sampler_mutex);
        return KILN_RAISE(KILN_ERR_STATE, "call kiln_gpu_monitor_stop first",
                          "kiln_gpu_monitor_start: a sampler is already running");
    }
    sampler.stop = false;
    sampler.interval_ms = interval_ms;
    sampler.callback = callback;
    sampler.user = user;
    int rc = pthread_create(&sampler.thread, NULL, sampler_main, NULL);
    sampler.running = rc == 0;
    pthread_mutex_unlock(&sampler_mutex);
    if (rc)
        return KILN_RAISE(KILN_ERR_INTERNAL, "the system is out of threads",
                          "kiln_gpu_monitor_start: pthread_create failed (%s)", strerror(rc));
    return KILN_OK;
}

void kiln_gpu_monitor_stop(void) {
    pthread_mutex_lock(&sampler_mutex);
    if (!sampler.running) {
        pthread_mutex_unlock(&sampler_mutex);
        return;
    }
    sampler.stop = true;
    pthread_cond_broadcast(&sampler_cond);
    pthread_t t = sampler.thread;
    pthread_mutex_unlock(&sampler_mutex);
    pthread_join(t, NULL);
    pthread_mutex_lock(&sampler_mutex);
    sampler.running = false;
    pthread_mutex_unlock(&sampler_mutex);
}

/* ---- The `kiln smi` table ---------------------------------------------------------- */

static void gpu_rows(kiln_strbuf *t, const kiln_gpu_stats *g, int n) {
    kiln_strbuf_printf(
        t, "| ID | Name                     | GPU %% | Mem %% | Memory used / total   | Power   | Temp | "
           "SM MHz | Mem MHz | Throttle\n");
    for (int i = 0; i < n; i++) {
        char used[32], total[32], thr[160];
        kiln_format_bytes(g[i].memory_used, used, sizeof used);
        kiln_format_bytes(g[i].memory_total, total, sizeof total);
        kiln_gpu_throttle_reasons_str(g[i].throttle_reasons, thr, sizeof thr);
        kiln_strbuf_printf(
            t, "| %2d | %-24.24s | %5u | %5u | %9s / %-9s | %5.0f W | %3u C | %6u | %7u | %s\n", g[i].index,
            g[i].name, g[i].util_gpu, g[i].util_memory, used, total, g[i].power_watts, g[i].temperature_c,
            g[i].clock_sm_mhz, g[i].clock_memory_mhz, g[i].missing & KILN_GPU_MISSING_THROTTLE ? "n/a" : thr);
    }
    for (int i = 0; i < n; i++)
        for (int p = 0; p < g[i].n_procs; p++) {
            char mem[32];
            kiln_strbuf_printf(t, "  gpu %d  pid %-8u %s\n", g[i].index, g[i].procs[p].pid,
                               g[i].procs[p].memory ? kiln_format_bytes(g[i].procs[p].memory, mem, sizeof mem)
                                                    : "(memory not reported)");
        }
}

static kiln_status host_rows(kiln_strbuf *t, int interval_ms) {
    kiln_host_process procs[32];
    int n = 0;
    KILN_TRY(kiln_host_processes_sample(procs, 32, interval_ms, &n));
    kiln_strbuf_printf(t, "| PID      | Name             | CPU %%  | RSS        |\n");
    for (int i = 0; i < n; i++) {
        char rss[32];
        kiln_strbuf_printf(t, "| %-8d | %-16.16s | %6.1f | %10s |%s\n", procs[i].pid, procs[i].name,
                           procs[i].cpu_percent, kiln_format_bytes(procs[i].rss_bytes, rss, sizeof rss),
                           procs[i].self ? " (this process)" : "");
    }
    return KILN_OK;
}

kiln_status kiln_smi_table(int interval_ms, char **text) {
    if (!text) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_smi_table: text is NULL");
    *text = NULL;
    kiln_strbuf t = {0};
    kiln_gpu_stats gpus[16];
    int n = 0;
    kiln_status st = kiln_gpu_monitor_sample(gpus, 16, &n);
    if (st == KILN_OK && n > 0) {
        gpu_rows(&t, gpus, n);
    } else {
        /* The error reads "kiln_gpu_monitor_sample: no NVIDIA driver (...)". */
        const char *why = st ? strchr(kiln_error_message(), ':') : NULL;
        kiln_strbuf_printf(&t, "%s; showing host CPU and memory of Kiln processes\n",
                           why ? why + 2 : "NVML sees no NVIDIA GPU");
        kiln_error_clear();
        st = host_rows(&t, interval_ms);
    }
    if (!st && t.failed) st = KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "kiln_smi_table: out of host memory");
    if (st) {
        free(t.data);
        return st;
    }
    *text = t.data;
    return KILN_OK;
}

/* The CPU backend. Work submitted to a CPU stream runs on the submitting
 * thread before the call returns, so a CPU stream is always idle when the
 * host looks at it: queries are true, synchronisation returns at once, and
 * an event records the host clock at the moment all earlier work is done. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "runtime/backend.h"

/* Alignment of CPU blocks: a cache line and an AVX-512 vector. */
#define CPU_ALIGNMENT 64

typedef struct cpu_event {
    unsigned flags;
    struct timespec when;
} cpu_event;

static int cpu_count(void) { return 1; }

static kiln_status cpu_name(int index, char *buf, size_t size) {
    (void)index;
    char model[256] = "";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "model name", 10) == 0) {
                const char *colon = strchr(line, ':');
                if (colon) {
                    snprintf(model, sizeof model, "%s", colon + 2);
                    model[strcspn(model, "\n")] = '\0';
                }
                break;
            }
        }
        fclose(f);
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    snprintf(buf, size, "%s (%ld logical core%s)", model[0] ? model : "CPU", cores, cores == 1 ? "" : "s");
    return KILN_OK;
}

/* MemAvailable is what a new allocation can get without swapping; sysinfo's
 * freeram leaves out the page cache and understates it. */
static kiln_status cpu_mem_info(int index, size_t *free_bytes, size_t *total_bytes) {
    (void)index;
    struct sysinfo si;
    if (sysinfo(&si) != 0) return KILN_RAISE(KILN_ERR_DEVICE, NULL, "cpu: sysinfo failed");
    size_t total = (size_t)si.totalram * si.mem_unit;
    size_t avail = (size_t)si.freeram * si.mem_unit;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) avail = (size_t)kb * 1024;
        fclose(f);
    }
    if (free_bytes) *free_bytes = avail;
    if (total_bytes) *total_bytes = total;
    return KILN_OK;
}

static kiln_status cpu_raw_alloc(int index, size_t bytes, void **ptr) {
    (void)index;
    void *p = NULL;
    if (posix_memalign(&p, CPU_ALIGNMENT, bytes ? bytes : 1) != 0) return KILN_ERR_OUT_OF_MEMORY;
    *ptr = p;
    return KILN_OK;
}

static void cpu_raw_free(int index, void *ptr, size_t bytes) {
    (void)index;
    (void)bytes;
    free(ptr);
}

static kiln_status cpu_copy(kiln_copy_kind kind, int index, int dst_index, void *dst, const void *src,
                            size_t bytes, void *stream, bool async) {
    (void)kind, (void)index, (void)dst_index, (void)stream, (void)async;
    if (bytes) memmove(dst, src, bytes);
    return KILN_OK;
}

/* Stream handles only need to be distinct; the default stream's is static. */
static char cpu_default_stream_token;

static kiln_status cpu_stream_create(int index, int priority, void **stream) {
    (void)index, (void)priority;
    *stream = KILN_MALLOC(1);
    return *stream ? KILN_OK : KILN_ERR_OUT_OF_MEMORY;
}
static void *cpu_stream_default(int index) {
    (void)index;
    return &cpu_default_stream_token;
}
static void cpu_stream_destroy(int index, void *stream) {
    (void)index;
    if (stream != &cpu_default_stream_token) free(stream);
}
static bool cpu_stream_query(int index, void *stream) {
    (void)index, (void)stream;
    return true;
}
static kiln_status cpu_stream_synchronize(int index, void *stream) {
    (void)index, (void)stream;
    return KILN_OK;
}

static kiln_status cpu_event_create(int index, unsigned flags, void **event) {
    (void)index;
    cpu_event *e = KILN_CALLOC(1, sizeof *e);
    if (!e) return KILN_ERR_OUT_OF_MEMORY;
    e->flags = flags;
    *event = e;
    return KILN_OK;
}
static void cpu_event_destroy(int index, void *event) {
    (void)index;
    free(event);
}
static kiln_status cpu_event_record(int index, void *event, void *stream) {
    (void)index, (void)stream;
    clock_gettime(CLOCK_MONOTONIC, &((cpu_event *)event)->when);
    return KILN_OK;
}
static bool cpu_event_query(int index, void *event) {
    (void)index, (void)event;
    return true;
}
static kiln_status cpu_event_synchronize(int index, void *event) {
    (void)index, (void)event;
    return KILN_OK;
}
static kiln_status cpu_stream_wait_event(int index, void *stream, void *event) {
    (void)index, (void)stream, (void)event;
    return KILN_OK;
}
static kiln_status cpu_event_elapsed_ms(int index, void *start, void *end, float *ms) {
    (void)index;
    const struct timespec *a = &((cpu_event *)start)->when, *b = &((cpu_event *)end)->when;
    double d = (double)(b->tv_sec - a->tv_sec) * 1e3 + (double)(b->tv_nsec - a->tv_nsec) * 1e-6;
    *ms = (float)d;
    return KILN_OK;
}
static kiln_status cpu_synchronize(int index) {
    (void)index;
    return KILN_OK;
}

static const kiln_backend cpu_backend = {
    .name = "cpu",
    .type = KILN_DEVICE_CPU,
    .host_accessible = true,
    .has_memory = true,
    .device_count = cpu_count,
    .device_name = cpu_name,
    .mem_info = cpu_mem_info,
    .raw_alloc = cpu_raw_alloc,
    .raw_free = cpu_raw_free,
    .copy = cpu_copy,
    .stream_create = cpu_stream_create,
    .stream_default = cpu_stream_default,
    .stream_destroy = cpu_stream_destroy,
    .stream_query = cpu_stream_query,
    .stream_synchronize = cpu_stream_synchronize,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .event_query = cpu_event_query,
    .event_synchronize = cpu_event_synchronize,
    .stream_wait_event = cpu_stream_wait_event,
    .event_elapsed_ms = cpu_event_elapsed_ms,
    .synchronize = cpu_synchronize,
};

const kiln_backend *kiln_cpu_backend(void) { return &cpu_backend; }

/* ---- meta: shapes without data ------------------------------------------------
 * Streams and events behave like the CPU's (work is instantaneous). Memory
 * never reaches raw_alloc: the meta allocator runs in simulate mode. Its
 * "total" is the simulated capacity, set with KILN_ALLOC_CONF limit_mb or
 * kiln_memory_set_limit; without a limit it is 1 TiB of address space. */

#define META_CAPACITY ((size_t)1 << 40)

static kiln_status meta_name(int index, char *buf, size_t size) {
    (void)index;
    snprintf(buf, size, "meta (no data; memory simulated)");
    return KILN_OK;
}
static kiln_status meta_mem_info(int index, size_t *free_bytes, size_t *total_bytes) {
    (void)index;
    if (free_bytes) *free_bytes = META_CAPACITY;
    if (total_bytes) *total_bytes = META_CAPACITY;
    return KILN_OK;
}
static kiln_status meta_raw_alloc(int index, size_t bytes, void **ptr) {
    (void)index, (void)bytes, (void)ptr;
    return KILN_ERR_OUT_OF_MEMORY;
}
static void meta_raw_free(int index, void *ptr, size_t bytes) {
    (void)index, (void)ptr, (void)bytes;
}
static kiln_status meta_copy(kiln_copy_kind kind, int index, int dst_index, void *dst, const void *src,
                             size_t bytes, void *stream, bool async) {
    (void)kind, (void)index, (void)dst_index, (void)dst, (void)src, (void)bytes, (void)stream, (void)async;
    return KILN_OK;
}

static const kiln_backend meta_backend = {
    .name = "meta",
    .type = KILN_DEVICE_META,
    .host_accessible = false,
    .has_memory = false,
    .device_count = cpu_count,
    .device_name = meta_name,
    .mem_info = meta_mem_info,
    .raw_alloc = meta_raw_alloc,
    .raw_free = meta_raw_free,
    .copy = meta_copy,
    .stream_create = cpu_stream_create,
    .stream_default = cpu_stream_default,
    .stream_destroy = cpu_stream_destroy,
    .stream_query = cpu_stream_query,
    .stream_synchronize = cpu_stream_synchronize,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .event_query = cpu_event_query,
    .event_synchronize = cpu_event_synchronize,
    .stream_wait_event = cpu_stream_wait_event,
    .event_elapsed_ms = cpu_event_elapsed_ms,
    .synchronize = cpu_synchronize,
};

const kiln_backend *kiln_meta_backend(void) { return &meta_backend; }

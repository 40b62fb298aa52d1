/* Devices: the backend registry, parsing and formatting device names, and
 * the per-thread current device. */
#include <ctype.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "runtime/backend.h"
#include "runtime/cuda_module.h"
#include "runtime/counters.h"
#include "runtime/runtime_internal.h"

static _Atomic(const kiln_backend *) backends[KILN_DEVICE_TYPE_COUNT];
static const char *const type_names[KILN_DEVICE_TYPE_COUNT] = {"cpu", "cuda", "meta"};

/* Per-thread current device; `set` is false until kiln_set_device so that
 * the default is computed once the backends are registered. */
static _Thread_local struct {
    bool set;
    kiln_device device;
} tls_current;

/* Per-thread: whose kernels (and so workspaces, layouts and prepared
 * copies) a meta op stands for. The CPU's unless a planned step models a
 * CUDA device (src/plan). */
static _Thread_local kiln_device_type tls_meta_kernels = KILN_DEVICE_CPU;

void kiln_meta_kernels_set(kiln_device_type type) {
    KILN_ASSERT(type == KILN_DEVICE_CPU || type == KILN_DEVICE_CUDA);
    tls_meta_kernels = type;
}

kiln_device_type kiln_meta_kernels(void) { return tls_meta_kernels; }

static _Thread_local int tls_meta_index;

void kiln_meta_kernels_set_index(int index) { tls_meta_index = index; }

int kiln_meta_kernels_index(void) { return tls_meta_index; }

void kiln_backend_register(const kiln_backend *backend) {
    KILN_ASSERT(backend && (unsigned)backend->type < KILN_DEVICE_TYPE_COUNT);
    atomic_store(&backends[backend->type], backend);
}

const kiln_backend *kiln_backend_get(kiln_device_type type) {
    if ((unsigned)type >= KILN_DEVICE_TYPE_COUNT) return NULL;
    return atomic_load(&backends[type]);
}

static const char *type_name(kiln_device_type type) {
    return (unsigned)type < KILN_DEVICE_TYPE_COUNT ? type_names[type] : "invalid";
}

const char *kiln_device_str(kiln_device device, char *buf, size_t size) {
    if (device.type == KILN_DEVICE_CUDA) snprintf(buf, size, "cuda:%d", device.index);
    else if ((unsigned)device.type < KILN_DEVICE_TYPE_COUNT) snprintf(buf, size, "%s", type_name(device.type));
    else snprintf(buf, size, "invalid-device(%d)", (int)device.type);
    return buf;
}

int kiln_device_count(kiln_device_type type) {
    const kiln_backend *be = kiln_backend_get(type);
    if (!be) return 0;
    int n = be->device_count();
    return n > KILN_MAX_DEVICES ? KILN_MAX_DEVICES : n;
}

const char *kiln_device_absent_reason(kiln_device_type type) {
    const kiln_backend *be = kiln_backend_get(type);
    if (!be) {
        if (type == KILN_DEVICE_CUDA && kiln_cuda_module_reason()[0]) return kiln_cuda_module_reason();
        if (type == KILN_DEVICE_CUDA) return "this build has no CUDA backend (configure with -DKILN_WITH_CUDA=ON)";
        return "backend not registered (call kiln_init first)";
    }
    if (be->device_count() > 0 || !be->absent_reason) return "";
    return be->absent_reason();
}

bool kiln_device_equal(kiln_device a, kiln_device b) {
    /* cpu and meta have a single device: their index is not significant. */
    if (a.type != b.type) return false;
    return a.type == KILN_DEVICE_CUDA ? a.index == b.index : true;
}

bool kiln_device_is_available(kiln_device device) {
    if ((unsigned)device.type >= KILN_DEVICE_TYPE_COUNT || device.index < 0) return false;
    return device.index < kiln_device_count(device.type);
}

static kiln_status unavailable(kiln_device device) {
    char name[32];
    kiln_device_str(device, name, sizeof name);
    if ((unsigned)device.type >= KILN_DEVICE_TYPE_COUNT)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use KILN_CPU, KILN_META or KILN_CUDA(i)",
                          "invalid device type %d", (int)device.type);
    int n = kiln_device_count(device.type);
    if (n == 0) {
        return KILN_RAISE(KILN_ERR_DEVICE, "run `kiln info` to list devices, or use the cpu device",
                          "%s requested, but no %s device is visible: %s", name, type_name(device.type),
                          kiln_device_absent_reason(device.type));
    }
    return KILN_RAISE(KILN_ERR_DEVICE, "use an index below the device count (`kiln info` lists devices)",
                      "%s requested, %d %s device%s visible", name, n,
                      device.type == KILN_DEVICE_CUDA ? "CUDA" : type_name(device.type), n == 1 ? "" : "s");
}

const kiln_backend *kiln_backend_for(kiln_device device) {
    if (!kiln_device_is_available(device)) {
        unavailable(device);
        return NULL;
    }
    return kiln_backend_get(device.type);
}

kiln_status kiln_device_parse(const char *text, kiln_device *out) {
    static const char *hint = "write cpu, meta, cuda or cuda:N";
    if (!text || !out) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, hint, "device text is NULL");
    size_t len = strcspn(text, ":");
    kiln_device_type type = KILN_DEVICE_TYPE_COUNT;
    for (int t = 0; t < KILN_DEVICE_TYPE_COUNT; t++)
        if (strlen(type_names[t]) == len && strncmp(text, type_names[t], len) == 0) type = (kiln_device_type)t;
    if (type == KILN_DEVICE_TYPE_COUNT)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, hint, "invalid device \"%s\": unknown device type", text);
    kiln_device d = {type, 0};
    if (text[len] == ':') {
        const char *num = text + len + 1;
        char *end = NULL;
        errno = 0;
        long idx = isdigit((unsigned char)*num) ? strtol(num, &end, 10) : -1;
        if (idx < 0 || errno || *end != '\0' || idx >= KILN_MAX_DEVICES)
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, hint,
                              "invalid device \"%s\": the index must be a number from 0 to %d", text,
                              KILN_MAX_DEVICES - 1);
        if (type != KILN_DEVICE_CUDA && idx != 0)
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, hint,
                              "invalid device \"%s\": %s has a single device, index 0", text, type_names[type]);
        d.index = (int)idx;
    } else if (type == KILN_DEVICE_CUDA) {
        kiln_device cur = kiln_current_device();
        d.index = cur.type == KILN_DEVICE_CUDA ? cur.index : 0;
    }
    if (!kiln_device_is_available(d)) return unavailable(d);
    *out = d;
    return KILN_OK;
}

kiln_status kiln_device_name(kiln_device device, char *buf, size_t size) {
    const kiln_backend *be = kiln_backend_for(device);
    if (!be) return kiln_error_last()->status;
    return be->device_name(device.index, buf, size);
}

kiln_status kiln_device_mem_info(kiln_device device, size_t *free_bytes, size_t *total_bytes) {
    const kiln_backend *be = kiln_backend_for(device);
    if (!be) return kiln_error_last()->status;
    return be->mem_info(device.index, free_bytes, total_bytes);
}

/* KILN_DEVICE, read by kiln_init (kiln_device_default_from_env). */
static kiln_device env_default;
static _Atomic bool env_default_set;

kiln_status kiln_device_default_from_env(void) {
    atomic_store(&env_default_set, false);
    const char *text = getenv("KILN_DEVICE");
    if (!text || !*text) return KILN_OK;
    kiln_device d;
    if (kiln_device_parse(text, &d) != KILN_OK) {
        char why[sizeof kiln_error_last()->message];
        snprintf(why, sizeof why, "%s", kiln_error_last()->message);
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "unset it, or name a device `kiln info` lists (cpu, cuda:N)",
                          "KILN_DEVICE='%s': %s", text, why);
    }
    env_default = d;
    atomic_store(&env_default_set, true);
    return KILN_OK;
}

kiln_device kiln_default_device(void) {
    if (atomic_load(&env_default_set)) return env_default;
    const kiln_backend *cuda = kiln_backend_get(KILN_DEVICE_CUDA);
    if (cuda && !cuda->emulated && cuda->device_count() > 0) return KILN_CUDA(0);
    return KILN_CPU;
}

kiln_status kiln_set_device(kiln_device device) {
    if (!kiln_device_is_available(device)) return unavailable(device);
    if (device.type != KILN_DEVICE_CUDA) device.index = 0;
    tls_current.device = device;
    tls_current.set = true;
    return KILN_OK;
}

kiln_device kiln_current_device(void) {
    return tls_current.set ? tls_current.device : kiln_default_device();
}

kiln_status kiln_device_synchronize(kiln_device device) {
    const kiln_backend *be = kiln_backend_for(device);
    if (!be) return kiln_error_last()->status;
    uint64_t t0 = kiln_sync_enter();
    kiln_status st = be->synchronize(device.index);
    kiln_sync_leave("kiln_device_synchronize", t0);
    return st;
}

/* kiln_plan_*: the public calls of include/kiln/plan.h — options checked,
 * the step planned (plan_step.c) or measured, and the budget searches. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "plan/plan_internal.h"

#define PLAN_MAX_BATCH    ((int64_t)1 << 20)
#define PLAN_MAX_SIDE     65536
#define PLAN_MAX_SEGMENTS 64

static const char *const part_names[KILN_PLAN_PARTS] = {
    "parameters",  "gradients", "optimizer_state", "batch",
    "activations", "transient", "workspaces",      "weight_copies",
};

const char *kiln_plan_part_name(kiln_plan_part part) {
    return (unsigned)part < KILN_PLAN_PARTS ? part_names[part] : "invalid";
}

kiln_plan_opts kiln_plan_defaults(void) {
    return (kiln_plan_opts){.model = "models/tutorial_cnn_28x28x1.txt",
                            .batch = 128,
                            .device = KILN_CPU,
                            .amp = KILN_F32,
                            .accum = 1};
}

/* "_28x28x1" just before the extension: H x W x C. */
static bool dims_suffix(const char *base, int64_t *c, int64_t *h, int64_t *w) {
    const char *dot = strrchr(base, '.');
    size_t len = dot ? (size_t)(dot - base) : strlen(base);
    const char *us = NULL;
    for (size_t i = 0; i < len; i++)
        if (base[i] == '_') us = base + i;
    if (!us) return false;
    long long hh, ww, cc;
    int used = 0;
    char tail[64];
    size_t n = len - (size_t)(us + 1 - base);
    if (n == 0 || n >= sizeof tail) return false;
    memcpy(tail, us + 1, n);
    tail[n] = '\0';
    if (sscanf(tail, "%lldx%lldx%lld%n", &hh, &ww, &cc, &used) != 3 || (size_t)used != n) return false;
    if (hh < 1 || ww < 1 || cc < 1 || hh > PLAN_MAX_SIDE || ww > PLAN_MAX_SIDE || cc > PLAN_MAX_SIDE)
        return false;
    *h = hh, *w = ww, *c = cc;
    return true;
}

kiln_status kiln_plan_input_from_name(const char *path, int64_t *channels, int64_t *height, int64_t *width) {
    if (!path || !channels || !height || !width)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_plan_input_from_name: NULL argument");
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (dims_suffix(base, channels, height, width)) return KILN_OK;
    char lower[256];
    size_t i = 0;
    for (; base[i] && i + 1 < sizeof lower; i++) lower[i] = (char)tolower((unsigned char)base[i]);
    lower[i] = '\0';
    if (strstr(lower, "cifar")) {
        *channels = 3, *height = 32, *width = 32;
        return KILN_OK;
    }
    if (strstr(lower, "mnist")) {
        *channels = 1, *height = 28, *width = 28;
        return KILN_OK;
    }
    return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                      "give the input size (kiln plan --input CxHxW), or name the file ..._HxWxC.txt",
                      "%s: the model's input size is not in its name (no _HxWxC suffix, no cifar or mnist)",
                      path);
}

static kiln_status check_opts(const kiln_plan_opts *o, kiln_plan_opts *out, const char *fn) {
    if (!o) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "%s: opts is NULL", fn);
    *out = *o;
    if (!o->model) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "name a model spec file", "%s: no model", fn);
    if (!o->channels && !o->height && !o->width)
        KILN_TRY(kiln_plan_input_from_name(o->model, &out->channels, &out->height, &out->width));
    if (out->channels < 1 || out->height < 1 || out->width < 1 || out->channels > PLAN_MAX_SIDE ||
        out->height > PLAN_MAX_SIDE || out->width > PLAN_MAX_SIDE)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give each of C, H and W in 1..65536",
                          "%s: input %lldx%lldx%lld", fn, (long long)out->channels, (long long)out->height,
                          (long long)out->width);
    if (o->batch < 1 || o->batch > PLAN_MAX_BATCH)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give a batch of 1 to 1048576", "%s: batch %lld", fn,
                          (long long)o->batch);
    int64_t sample = out->channels * out->height * out->width;
    if (sample > ((int64_t)1 << 62) / (int64_t)sizeof(float) / o->batch)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use a smaller batch or input",
                          "%s: a batch of %lld inputs of %lld values overflows", fn, (long long)o->batch,
                          (long long)sample);
    if (o->amp != KILN_F32 && o->amp != KILN_F16 && o->amp != KILN_BF16)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use KILN_F32 (off), KILN_F16 or KILN_BF16",
                          "%s: amp dtype %s", fn, kiln_dtype_name(o->amp));
    if (o->checkpoint < 0 || o->checkpoint == 1 || o->checkpoint > PLAN_MAX_SEGMENTS)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give 0 (off) or 2 to 64 segments", "%s: checkpoint %d",
                          fn, o->checkpoint);
    if (o->accum < 0 || o->accum > o->batch)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give 1 to the batch size micro-batches",
                          "%s: accum %d with batch %lld", fn, o->accum, (long long)o->batch);
    if (o->steps < 0 || o->steps > 2)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give 1 (the first step) or 2 (and the steady state)",
                          "%s: steps %d", fn, o->steps);
    char dev[32];
    kiln_device_str(o->device, dev, sizeof dev);
    if (o->device.type != KILN_DEVICE_CPU && o->device.type != KILN_DEVICE_CUDA)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "plan for cpu or cuda:N",
                          "%s: device %s: a step runs on cpu or cuda", fn, dev);
    if (!kiln_device_is_available(o->device))
        return KILN_RAISE(KILN_ERR_DEVICE,
                          "plan for a device kiln info lists (a CUDA plan needs a CUDA build)",
                          "%s: device %s is not available", fn, dev);
    return KILN_OK;
}

static void name_memories(kiln_plan *p) {
    kiln_device_str(p->opts.device, p->memory[0].name, sizeof p->memory[0].name);
    snprintf(p->memory[1].name, sizeof p->memory[1].name, "pinned host");
    p->n_memories = 2;
}

static kiln_status plan_or_measure(const kiln_plan_opts *opts, bool measure, kiln_plan *out, const char *fn) {
    if (!out) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "%s: out is NULL", fn);
    memset(out, 0, sizeof *out);
    KILN_TRY(check_opts(opts, &out->opts, fn));
    name_memories(out);
    return plan_run(&out->opts, measure, out);
}

kiln_status kiln_plan_step(const kiln_plan_opts *opts, kiln_plan *out) {
    return plan_or_measure(opts, false, out, "kiln_plan_step");
}

kiln_status kiln_plan_measure(const kiln_plan_opts *opts, kiln_plan *out) {
    return plan_or_measure(opts, true, out, "kiln_plan_measure");
}

/* Whether the planned step fits: *fits; an error other than the plan's own. */
static kiln_status fits(const kiln_plan_opts *o, int64_t budget, bool *ok) {
    kiln_plan p;
    KILN_TRY(kiln_plan_step(o, &p));
    *ok = p.memory[0].reserved_peak <= budget;
    return KILN_OK;
}

kiln_status kiln_plan_max_batch(const kiln_plan_opts *opts, int64_t budget, int64_t max_batch,
                                int64_t *batch) {
    if (!batch || budget < 1)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give a budget of at least 1 byte",
                          "kiln_plan_max_batch: budget %lld", (long long)budget);
    *batch = 0;
    kiln_plan_opts o;
    KILN_TRY(check_opts(opts, &o, "kiln_plan_max_batch"));
    int64_t cap = max_batch > 0 && max_batch < PLAN_MAX_BATCH ? max_batch : PLAN_MAX_BATCH;
    /* Doubling to the first batch that does not fit, then bisection: a
     * step's peak grows with the batch. accum micro-batches need a batch of
     * at least accum. */
    int64_t lo = 0, hi = o.accum > 1 ? o.accum : 1;
    bool ok = false;
    for (;;) {
        o.batch = hi;
        KILN_TRY(fits(&o, budget, &ok));
        if (!ok) break;
        lo = hi;
        if (hi == cap) break;
        hi = hi * 2 < cap ? hi * 2 : cap;
    }
    if (ok) {
        *batch = lo;
        return KILN_OK;
    }
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (mid < (o.accum > 1 ? o.accum : 1)) break;
        o.batch = mid;
        KILN_TRY(fits(&o, budget, &ok));
        if (ok)
            lo = mid;
        else
            hi = mid;
    }
    *batch = lo;
    return KILN_OK;
}

kiln_status kiln_plan_min_checkpoint(const kiln_plan_opts *opts, int64_t budget, int *segments) {
    if (!segments || budget < 1)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give a budget of at least 1 byte",
                          "kiln_plan_min_checkpoint: budget %lld", (long long)budget);
    *segments = -1;
    kiln_plan_opts o;
    KILN_TRY(check_opts(opts, &o, "kiln_plan_min_checkpoint"));
    bool ok = false;
    o.checkpoint = 0;
    KILN_TRY(fits(&o, budget, &ok));
    if (ok) {
        *segments = 0;
        return KILN_OK;
    }
    int layers = 0;
    {
        kiln_device saved = kiln_current_device();
        kiln_module *m = NULL;
        kiln_status st = kiln_set_device(KILN_META);
        if (!st) st = plan_load_model(&o, &m);
        if (!st) layers = kiln_module_num_children(m);
        kiln_module_free(m);
        kiln_set_device(saved);
        KILN_TRY(st);
    }
    for (int s = 2; s <= layers && s <= PLAN_MAX_SEGMENTS; s++) {
        o.checkpoint = s;
        KILN_TRY(fits(&o, budget, &ok));
        if (ok) {
            *segments = s;
            return KILN_OK;
        }
    }
    return KILN_OK;
}

/* kiln plan: a training step's memory before it runs (include/kiln/plan.h,
 * docs/memory.md "Predicting a step's memory: kiln plan").
 *
 *   kiln plan [--model FILE] [--input CxHxW] [--batch N] [--device D]
 *             [--amp off|on|f16|bf16] [--checkpoint N] [--accum N]
 *             [--steps 1|2] [--budget SIZE] [--measure]
 *
 * Prints the predicted peaks per memory (the device; pinned host memory for
 * the loader's batches), where the device's peak happens and what it holds,
 * then one JSON line. --budget adds the largest batch whose step fits in
 * SIZE reserved on the device and the fewest checkpoint segments that make
 * --batch fit. --measure runs the step for real afterwards and prints the
 * measured peaks and the error beside the plan. Exit 0, 1 on a failed plan,
 * 2 on a bad flag. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan_command.h"
#include "train_run.h"

static double mib(int64_t b) { return (double)b / 1048576.0; }

static int usage_error(const char *flag, const char *value, const char *why) {
    fprintf(stderr, "kiln plan: %s %s: %s\n", flag, value ? value : "(missing)", why);
    return 2;
}

static bool parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end || errno || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool plan_parse_amp(const char *s, kiln_device dev, kiln_dtype *out) {
    if (!strcmp(s, "off"))
        *out = KILN_F32;
    else if (!strcmp(s, "f16"))
        *out = KILN_F16;
    else if (!strcmp(s, "bf16"))
        *out = KILN_BF16;
    else if (!strcmp(s, "on"))
        *out = dev.type == KILN_DEVICE_CUDA ? KILN_F16 : KILN_BF16;
    else
        return false;
    return true;
}

const char *plan_amp_name(kiln_dtype amp) { return amp == KILN_F32 ? "off" : kiln_dtype_name(amp); }

typedef struct plan_args {
    kiln_plan_opts o;
    const char *amp;
    int64_t budget;
    bool measure;
} plan_args;

static int parse_args(int argc, char **argv, plan_args *a) {
    a->o = kiln_plan_defaults();
    a->o.device = kiln_default_device();
    a->amp = "off";
    const char *device = NULL;
    for (int i = 0; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t n = 0;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            printf(
                "usage: kiln plan [--model FILE] [--input CxHxW] [--batch N] [--device D] [--amp "
                "off|on|f16|bf16]\n"
                "                 [--checkpoint N] [--accum N] [--steps 1|2] [--budget SIZE] [--measure]\n"
                "One training step of kiln train on the meta device: its peak memory per device, when it\n"
                "happens and what it holds, then a JSON line (docs/memory.md). --amp on: bf16 on the CPU,\n"
                "f16 on CUDA. --steps 2: the first step and the steady state after it (Adam's state alive),\n"
                "the peaks over both (kiln train plans this). SIZE: bytes or K/M/G/T (KiB...) or KB/MB/GB.\n"
                "--measure: run the step(s) too.\n");
            return -1;
        }
        if (!strcmp(f, "--measure")) {
            a->measure = true;
            continue;
        }
        if (!v) return usage_error(f, NULL, "needs a value (kiln plan --help)");
        if (!strcmp(f, "--model"))
            a->o.model = v;
        else if (!strcmp(f, "--input")) {
            long long c, h, w;
            int used = 0;
            if (sscanf(v, "%lldx%lldx%lld%n", &c, &h, &w, &used) != 3 || v[used] || c < 1 || h < 1 || w < 1 ||
                c > 65536 || h > 65536 || w > 65536)
                return usage_error(f, v, "give CxHxW, each 1 to 65536 (e.g. 3x32x32)");
            a->o.channels = c, a->o.height = h, a->o.width = w;
        } else if (!strcmp(f, "--batch")) {
            if (!parse_int(v, 1, (int64_t)1 << 20, &n))
                return usage_error(f, v, "give a whole number of 1 to 1048576");
            a->o.batch = n;
        } else if (!strcmp(f, "--device"))
            device = v;
        else if (!strcmp(f, "--amp"))
            a->amp = v;
        else if (!strcmp(f, "--checkpoint")) {
            if (!parse_int(v, 0, 64, &n) || n == 1)
                return usage_error(f, v, "give 0 (off) or 2 to 64 segments");
            a->o.checkpoint = (int)n;
        } else if (!strcmp(f, "--accum")) {
            if (!parse_int(v, 1, (int64_t)1 << 20, &n))
                return usage_error(f, v, "give a whole number of 1 or more");
            a->o.accum = (int)n;
        } else if (!strcmp(f, "--steps")) {
            if (!parse_int(v, 1, 2, &n))
                return usage_error(f, v, "give 1 (the first step) or 2 (the first and the steady state)");
            a->o.steps = (int)n;
        } else if (!strcmp(f, "--budget")) {
            if (!train_parse_size(v, &a->budget))
                return usage_error(
                    f, v, "give a size in bytes, or with K, M, G, T (KiB...) or KB, MB, GB (e.g. 512M)");
        } else {
            fprintf(stderr, "kiln plan: unknown option %s (kiln plan --help)\n", f);
            return 2;
        }
        i++;
    }
    if (device) {
        kiln_device d;
        if (kiln_device_parse(device, &d) != KILN_OK)
            return usage_error("--device", device, "give cpu, cuda or cuda:N as kiln info lists them");
        if (d.type == KILN_DEVICE_META)
            return usage_error("--device", device,
                               "meta is where the plan runs; give the device to plan for");
        if (!kiln_device_is_available(d))
            return usage_error("--device", device,
                               kiln_device_absent_reason(d.type)[0]
                                   ? kiln_device_absent_reason(d.type)
                                   : "not available (kiln info lists the devices)");
        a->o.device = d;
    }
    if (!plan_parse_amp(a->amp, a->o.device, &a->o.amp))
        return usage_error("--amp", a->amp, "give off, on, f16 or bf16");
    if (a->o.accum > a->o.batch) {
        fprintf(stderr,
                "kiln plan: --accum %d: must not exceed --batch %lld (one sample per micro-batch at least)\n",
                a->o.accum, (long long)a->o.batch);
        return 2;
    }
    if (!a->o.channels && kiln_plan_input_from_name(a->o.model, &a->o.channels, &a->o.height, &a->o.width)) {
        fprintf(stderr, "kiln plan: --model %s: %s (%s)\n", a->o.model, kiln_error_message(),
                kiln_error_last()->hint);
        return 2;
    }
    FILE *fp = fopen(a->o.model, "r");
    if (!fp) return usage_error("--model", a->o.model, strerror(errno));
    fclose(fp);
    return 0;
}

static void print_row(const char *what, const kiln_plan *p, int64_t (*get)(const kiln_plan_memory *, int)) {
    printf("  %-44s", what);
    for (int i = 0; i < p->n_memories; i++) printf(" %12.2f", mib(get(&p->memory[i], -1)));
    printf("\n");
}

static int64_t get_alloc(const kiln_plan_memory *m, int k) { return (void)k, m->allocated_peak; }
static int64_t get_reserved(const kiln_plan_memory *m, int k) { return (void)k, m->reserved_peak; }
static int64_t get_rounding(const kiln_plan_memory *m, int k) {
    return (void)k, m->allocated_peak - m->requested_at_peak;
}
static int64_t get_cache(const kiln_plan_memory *m, int k) {
    return (void)k, m->reserved_peak - m->allocated_peak;
}

void plan_print(const kiln_plan *p) {
    const kiln_plan_opts *o = &p->opts;
    char dev[32];
    printf("kiln plan: %s (input %lldx%lldx%lld, %lld parameters), batch %lld on %s, amp %s, ", o->model,
           (long long)o->channels, (long long)o->height, (long long)o->width, (long long)p->param_count,
           (long long)o->batch, kiln_device_str(o->device, dev, sizeof dev), plan_amp_name(o->amp));
    if (o->checkpoint)
        printf("%d checkpoint segments, ", o->checkpoint);
    else
        printf("no checkpointing, ");
    printf("%d micro-batch%s, %s\n", o->accum > 1 ? o->accum : 1, o->accum > 1 ? "es" : "",
           o->steps > 1 ? "the first step and the steady state" : "the first step");
    printf("  %-44s", "MiB");
    for (int i = 0; i < p->n_memories; i++) printf(" %12s", p->memory[i].name);
    printf("\n");
    print_row("peak allocated", p, get_alloc);
    print_row("peak reserved", p, get_reserved);
    const kiln_plan_memory *d = &p->memory[0];
    printf("  %s's peak: in the %s%s%s\n", d->name, d->phase, d->op[0] ? ", allocating for " : "", d->op);
    printf("  at that peak:\n");
    static const char *const what[KILN_PLAN_PARTS] = {"parameters (and buffers, their step snapshot)",
                                                      "gradients",
                                                      "optimizer state (Adam's moments)",
                                                      "the loader's batches",
                                                      "activations saved for backward",
                                                      "transient buffers",
                                                      "workspaces",
                                                      "kernels' copies of weights"};
    for (int k = 0; k < KILN_PLAN_PARTS; k++) {
        printf("    %-42s", what[k]);
        for (int i = 0; i < p->n_memories; i++) printf(" %12.2f", mib(p->memory[i].parts[k]));
        printf("\n");
    }
    print_row("  of which rounding (allocated - requested)", p, get_rounding);
    print_row("cache and fragmentation (reserved - allocated)", p, get_cache);
}

void plan_print_json_memories(const kiln_plan *p) {
    printf("\"memories\":[");
    for (int i = 0; i < p->n_memories; i++) {
        const kiln_plan_memory *m = &p->memory[i];
        printf("%s{\"name\":\"%s\",\"allocated_peak\":%" PRId64 ",\"reserved_peak\":%" PRId64
               ",\"requested_at_peak\":%" PRId64 ",\"phase\":\"%s\",\"op\":\"%s\",\"parts\":{",
               i ? "," : "", m->name, m->allocated_peak, m->reserved_peak, m->requested_at_peak, m->phase,
               m->op);
        for (int k = 0; k < KILN_PLAN_PARTS; k++)
            printf("%s\"%s\":%" PRId64, k ? "," : "", kiln_plan_part_name((kiln_plan_part)k), m->parts[k]);
        printf("}}");
    }
    printf("]");
}

static int fail(const char *what) {
    const kiln_error *e = kiln_error_last();
    fprintf(stderr, "kiln plan: %s: %s\n", what, e->message);
    if (e->hint[0]) fprintf(stderr, "  hint: %s\n", e->hint);
    return 1;
}

static double err_pct(int64_t pred, int64_t meas) {
    return meas ? 100.0 * (double)(pred - meas) / (double)meas : 0;
}

int kiln_cmd_plan(int argc, char **argv) {
    plan_args a = {0};
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    kiln_plan p, m;
    char what[1200];
    snprintf(what, sizeof what, "planning %s at batch %lld", a.o.model, (long long)a.o.batch);
    if (kiln_plan_step(&a.o, &p) != KILN_OK) return fail(what);
    plan_print(&p);
    int64_t max_batch = -1;
    int segs = -2;
    if (a.budget) {
        if (kiln_plan_max_batch(&a.o, a.budget, 0, &max_batch) != KILN_OK) return fail("--budget");
        if (kiln_plan_min_checkpoint(&a.o, a.budget, &segs) != KILN_OK) return fail("--budget");
        printf("budget %.2f MiB reserved on %s: ", mib(a.budget), p.memory[0].name);
        if (max_batch > 0)
            printf("the largest batch that fits is %lld", (long long)max_batch);
        else
            printf("not even batch 1 fits");
        if (segs == 0)
            printf("; batch %lld fits without checkpointing\n", (long long)a.o.batch);
        else if (segs > 0)
            printf("; batch %lld fits with --checkpoint %d\n", (long long)a.o.batch, segs);
        else
            printf("; no checkpoint setting makes batch %lld fit\n", (long long)a.o.batch);
    }
    if (a.measure) {
        if (kiln_plan_measure(&a.o, &m) != KILN_OK) return fail("--measure");
        for (int i = 0; i < m.n_memories; i++)
            printf("measured %-12s allocated %10.2f MiB (plan %+.2f%%), reserved %10.2f MiB (plan %+.2f%%)\n",
                   m.memory[i].name, mib(m.memory[i].allocated_peak),
                   err_pct(p.memory[i].allocated_peak, m.memory[i].allocated_peak),
                   mib(m.memory[i].reserved_peak),
                   err_pct(p.memory[i].reserved_peak, m.memory[i].reserved_peak));
    }
    char dev[32];
    printf("{\"plan\":{\"model\":\"%s\",\"input\":[%lld,%lld,%lld],\"batch\":%lld,\"device\":\"%s\",\"amp\":"
           "\"%s\","
           "\"checkpoint\":%d,\"accum\":%d,\"steps\":%d,\"parameters\":%lld,",
           a.o.model, (long long)p.opts.channels, (long long)p.opts.height, (long long)p.opts.width,
           (long long)a.o.batch, kiln_device_str(a.o.device, dev, sizeof dev), plan_amp_name(a.o.amp),
           a.o.checkpoint, a.o.accum > 1 ? a.o.accum : 1, a.o.steps > 1 ? a.o.steps : 1, (long long)p.param_count);
    plan_print_json_memories(&p);
    if (a.budget)
        printf(",\"budget\":%" PRId64 ",\"max_batch\":%lld,\"min_checkpoint\":%d", a.budget,
               (long long)max_batch, segs);
    if (a.measure)
        printf(",\"measured\":[{\"allocated_peak\":%" PRId64 ",\"reserved_peak\":%" PRId64
               "},{\"allocated_peak\":%" PRId64 ",\"reserved_peak\":%" PRId64 "}]",
               m.memory[0].allocated_peak, m.memory[0].reserved_peak, m.memory[1].allocated_peak,
               m.memory[1].reserved_peak);
    printf("}}\n");
    return 0;
}

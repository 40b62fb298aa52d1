/* `kiln bench checkpoint`: what gradient checkpointing of a model spec's
 * Sequential saves and costs (docs/performance.md, "Gradient
 * checkpointing").
 *
 * One model and one Adam; a training step is zero_grad(set_to_none),
 * forward, cross-entropy, backward, Adam step, on a fixed randn batch.
 * Each round runs one step of every configuration (no checkpointing, then
 * each --segments count), the order rotated from round to round so that a
 * shared machine's slow minutes spread over all of them. Per step:
 *   activation memory = allocator peak during the step
 *                       - allocated at its start (parameters, Adam state, batch)
 *                       - the gradients (the parameters' size)
 *   step time = wall time of the step (the host waits for the device).
 * Reported: medians over the rounds after --warmup untimed rounds, the
 * saving and the time cost against no checkpointing, and a last stdout
 * line of JSON.
 *
 *   kiln bench checkpoint [--model FILE] [--input CxHxW] [--batch N]
 *                         [--segments 2,3,4] [--steps N] [--warmup N]
 *                         [--placement memory|layers] [--snapshot PREFIX]
 *                         [--device D]
 * --device: cpu, cuda or cuda:N (default: KILN_DEVICE, else the first GPU,
 * else the CPU).
 * --placement: where segments start: by measured memory
 * (kiln_nn_sequential_checkpoint_by_memory, the default) or by layer count
 * (kiln_nn_sequential_set_checkpoint, PyTorch's checkpoint_sequential).
 * --snapshot writes each configuration's last step's memory snapshot
 * (kiln_memory_snapshot, with the allocator's history) to
 * PREFIX-<segments>.json, for tools/memory_peak.py. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "kiln/kiln.h"

#define MAX_CONFIGS 16
#define MAX_STEPS 64

/* "segments 3: layers [0, 3) [3, 4) [4, 9), nested: 3" */
static void print_plan(kiln_module *m, int asked) {
    int start[64], n = kiln_module_num_children(m);
    int count = kiln_nn_sequential_checkpoint_starts(m, start, 64);
    printf("segments %d: layers", asked);
    for (int k = 0; k < count; k++) printf(" [%d, %d)", start[k], k + 1 < count ? start[k + 1] : n);
    for (int i = 0; i < n; i++) {
        kiln_module *body = kiln_module_child(kiln_module_child_at(m, i, NULL), "body");
        if (body && kiln_nn_sequential_checkpoint_segments(body) > 1)
            printf(", layer %d's body in %d", i, kiln_nn_sequential_checkpoint_segments(body));
    }
    printf("\n");
}

static int fail(const char *what) {
    fprintf(stderr, "kiln bench checkpoint: %s: %s\n", what, kiln_error_message());
    return 1;
}

/* One training step; *act gets its activation memory. */
static kiln_status step(kiln_module *m, kiln_optimizer *opt, kiln_tensor *x, kiln_tensor *y, kiln_device dev,
                        int64_t grad_bytes, const char *snapshot, double *secs, int64_t *act) {
    if (snapshot && kiln_memory_record_history(dev, true, 0) != KILN_OK) return kiln_error_last()->status;
    double t0 = tool_now_s();
    kiln_status st = kiln_optimizer_zero_grad(opt, true);
    kiln_memory_stats s0, s1;
    if (!st) st = kiln_device_synchronize(dev);
    if (!st) st = kiln_memory_reset_peak(dev);
    if (!st) st = kiln_memory_stats_get(dev, &s0);
    kiln_scope_begin();
    kiln_tensor *logits = st ? NULL : kiln_module_forward(m, x);
    kiln_tensor *loss = logits ? kiln_cross_entropy(logits, y, NULL) : NULL;
    if (!st && !loss) st = kiln_error_last()->status;
    if (!st) st = kiln_backward(loss, NULL, false);
    kiln_scope_end();
    if (!st) st = kiln_optimizer_step(opt);
    if (!st) st = kiln_device_synchronize(dev);
    *secs = tool_now_s() - t0;
    if (!st) st = kiln_memory_stats_get(dev, &s1);
    if (snapshot) {
        if (!st) st = kiln_memory_snapshot(dev, snapshot);
        kiln_memory_record_history(dev, false, 0);
    }
    *act = s1.allocated_bytes[KILN_POOL_ALL].peak - s0.allocated_bytes[KILN_POOL_ALL].current - grad_bytes;
    return st;
}

int kiln_bench_checkpoint(int argc, char **argv) {
    const char *model = "models/resnet_small_cifar10.txt", *snapshot = NULL, *device = NULL;
    int64_t c = 3, h = 32, w = 32, batch = 512;
    bool by_memory = true;
    int steps = 5, warmup = 1, n_cfg = 1, segs[MAX_CONFIGS] = {0, 2, 3, 4};
    n_cfg = 4;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = v != NULL;
        if (!strcmp(o, "--model") && v) model = v;
        else if (!strcmp(o, "--input") && v) ok = sscanf(v, "%" SCNd64 "x%" SCNd64 "x%" SCNd64, &c, &h, &w) == 3 && c > 0 && h > 0 && w > 0;
        else if (!strcmp(o, "--batch") && v) ok = (batch = atol(v)) > 0;
        else if (!strcmp(o, "--steps") && v) ok = (steps = atoi(v)) > 0 && steps <= MAX_STEPS;
        else if (!strcmp(o, "--warmup") && v) ok = (warmup = atoi(v)) >= 0;
        else if (!strcmp(o, "--snapshot") && v) snapshot = v;
        else if (!strcmp(o, "--device") && v) device = v;
        else if (!strcmp(o, "--placement") && v) ok = (by_memory = !strcmp(v, "memory")) || !strcmp(v, "layers");
        else if (!strcmp(o, "--segments") && v) {
            n_cfg = 1;
            for (const char *p = v; ok && *p && n_cfg < MAX_CONFIGS;) {
                char *end;
                long s = strtol(p, &end, 10);
                ok = end != p && s >= 2;
                segs[n_cfg++] = (int)s;
                p = *end == ',' ? end + 1 : end;
                ok = ok && (*end == ',' || *end == '\0');
            }
        } else {
            fprintf(stderr,
                    "usage: kiln bench checkpoint [--model FILE] [--input CxHxW] [--batch N] [--segments 2,3,4] "
                    "[--steps N] [--warmup N] [--placement memory|layers] [--snapshot PREFIX] [--device D]\n");
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "kiln bench checkpoint: bad value for %s\n", o);
            return 2;
        }
        i++;
    }
    kiln_device dev = kiln_default_device();
    if (device && (kiln_device_parse(device, &dev) != KILN_OK || dev.type == KILN_DEVICE_META)) {
        fprintf(stderr, "kiln bench checkpoint: --device %s: %s (give cpu, cuda or cuda:N as kiln info lists them)\n",
                device, dev.type == KILN_DEVICE_META ? "meta tensors hold no data" : kiln_error_message());
        return 2;
    }
    kiln_manual_seed(0);
    kiln_module *m = NULL;
    if (kiln_model_spec_load(model, c, h, w, &m) != KILN_OK) return fail("model");
    if (kiln_module_to(m, dev) != KILN_OK) return fail("model");
    kiln_tensor **params = NULL;
    int np = 0;
    if (kiln_module_parameters(m, &params, &np) != KILN_OK) return fail("model");
    int64_t param_bytes = 0;
    for (int i = 0; i < np; i++) param_bytes += kiln_numel(params[i]) * (int64_t)kiln_dtype_size(kiln_dtype_of(params[i]));
    kiln_adam_opts ao = kiln_adam_defaults();
    kiln_optimizer *opt = kiln_adam(params, np, &ao);
    free(params);
    if (!opt) return fail("optimizer");
    kiln_tensor *x = kiln_randn(KILN_SHAPE(batch, c, h, w), KILN_F32, dev);
    kiln_tensor *y = x ? kiln_zeros(KILN_SHAPE(batch), KILN_I64, dev) : NULL;
    /* what kiln_nn_sequential_checkpoint_by_memory measures on */
    kiln_tensor *sample = y ? kiln_randn(KILN_SHAPE(2, c, h, w), KILN_F32, dev) : NULL;
    if (!sample) return fail("batch");
    char devs[32];
    printf("%s, input %ldx%ldx%ld, batch %ld on %s, %d layers, %.1f MiB of parameters; %d rounds after %d warm-up\n",
           model, (long)c, (long)h, (long)w, (long)batch, kiln_device_str(dev, devs, sizeof devs),
           kiln_module_num_children(m), (double)param_bytes / 1048576.0, steps, warmup);
    static double secs[MAX_CONFIGS][MAX_STEPS];
    static double act[MAX_CONFIGS][MAX_STEPS];
    for (int r = 0; r < warmup + steps; r++) {
        for (int k = 0; k < n_cfg; k++) {
            int cfg = (k + r) % n_cfg;
            double s = 0;
            int64_t a = 0;
            kiln_status ps = by_memory ? kiln_nn_sequential_checkpoint_by_memory(m, sample, segs[cfg], NULL)
                                       : kiln_nn_sequential_set_checkpoint(m, segs[cfg]);
            if (ps != KILN_OK) return fail("--segments");
            if (r == 0 && segs[cfg]) print_plan(m, segs[cfg]);
            char path[4096];
            const char *snap = NULL;
            if (snapshot && r == warmup + steps - 1) {
                snprintf(path, sizeof path, "%s-%d.json", snapshot, segs[cfg]);
                snap = path;
            }
            if (step(m, opt, x, y, dev, param_bytes, snap, &s, &a) != KILN_OK) return fail("step");
            if (r >= warmup) secs[cfg][r - warmup] = s, act[cfg][r - warmup] = (double)a;
        }
    }
    double t_med[MAX_CONFIGS], a_med[MAX_CONFIGS];
    printf("%-10s %16s %10s %12s %10s\n", "segments", "activations MiB", "saved", "step s (med)", "cost");
    for (int k = 0; k < n_cfg; k++) {
        double lo = secs[k][0], hi = secs[k][0];
        for (int i = 1; i < steps; i++) lo = secs[k][i] < lo ? secs[k][i] : lo, hi = secs[k][i] > hi ? secs[k][i] : hi;
        t_med[k] = tool_median(secs[k], steps);
        a_med[k] = tool_median(act[k], steps);
        char name[16];
        if (segs[k]) snprintf(name, sizeof name, "%d", segs[k]);
        else snprintf(name, sizeof name, "none");
        printf("%-10s %16.1f %9.1f%% %12.3f %9.1f%%   [%.3f-%.3f s]\n", name, a_med[k] / 1048576.0,
               100.0 * (1.0 - a_med[k] / a_med[0]), t_med[k], 100.0 * (t_med[k] / t_med[0] - 1.0), lo, hi);
    }
    printf("{\"bench\":\"checkpoint\",\"threads\":%d,\"model\":\"%s\",\"batch\":%ld,\"configs\":[", kiln_num_threads(), model, (long)batch);
    for (int k = 0; k < n_cfg; k++)
        printf("%s{\"segments\":%d,\"activation_bytes\":%.0f,\"step_s\":%.4f,\"saved\":%.4f,\"cost\":%.4f}",
               k ? "," : "", segs[k], a_med[k], t_med[k], 1.0 - a_med[k] / a_med[0], t_med[k] / t_med[0] - 1.0);
    printf("]}\n");
    kiln_release(x);
    kiln_release(y);
    kiln_release(sample);
    kiln_optimizer_free(opt);
    kiln_module_free(m);
    return 0;
}

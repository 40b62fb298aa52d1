/* `kiln bench dataparallel`: the load DataParallel puts on its output
 * device (docs/multi-device.md, "The main device's load").
 *
 * The tutorial CNN (1x28x28, --classes outputs) trains with SGD on a fixed
 * randn batch in three configurations:
 *   one      the model on the first device, the whole batch;
 *   dp       kiln_nn_data_parallel over the devices, the outputs gathered
 *            on the first device and the loss computed there (the
 *            tutorials' nn.DataParallel);
 *   dp-loss  the same with the loss inside each replica
 *            (kiln_nn_data_parallel_loss: one scalar per device gathered).
 * Per configuration, over --steps steps after --warmup untimed ones:
 *   peak MiB per device  the allocator's peak of allocated bytes during the
 *                        steps (parameters, gradients, activations, the
 *                        gathered outputs: everything live);
 *   device ms per device the profiler's device time per step on each
 *                        device (kiln_profiler_device_times);
 *   step ms              the median wall time of a step (the host waits).
 * On emulated devices the memory is exact and the times are the
 * emulator's (they mean nothing for a GPU).
 *
 *   kiln bench dataparallel [--devices cuda:0,cuda:1] [--batch N]
 *                           [--classes N] [--steps N] [--warmup N]
 * Exit 77 with the reason where fewer than two devices are given or
 * available. Prints a table, then one JSON line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "kiln/kiln.h"

#define DP_BENCH_MAX_DEVICES 8
#define DP_BENCH_MAX_STEPS 64

enum { CONFIG_ONE, CONFIG_DP, CONFIG_DP_LOSS, CONFIG_COUNT };
static const char *const config_names[CONFIG_COUNT] = {"one", "dp", "dp-loss"};

typedef struct dp_result {
    double peak_mib[DP_BENCH_MAX_DEVICES], device_ms[DP_BENCH_MAX_DEVICES], step_ms;
} dp_result;

/* OptimizedCNN on 1x28x28 with `classes` outputs, seeded. */
static kiln_module *make_cnn(int64_t classes) {
    kiln_manual_seed(42);
    kiln_module *l[] = {kiln_nn_conv2d(1, 32, 3, 1, 1, 1, 1, true),  kiln_nn_relu(), kiln_nn_max_pool2d(2, 2, 0),
                        kiln_nn_conv2d(32, 64, 3, 1, 1, 1, 1, true), kiln_nn_relu(), kiln_nn_max_pool2d(2, 2, 0),
                        kiln_nn_conv2d(64, 128, 3, 1, 1, 1, 1, true), kiln_nn_relu(), kiln_nn_max_pool2d(2, 2, 0),
                        kiln_nn_flatten(1, -1), kiln_nn_linear(128 * 3 * 3, 512, true), kiln_nn_relu(),
                        kiln_nn_linear(512, classes, true)};
    return kiln_nn_sequential(13, l);
}

static kiln_tensor *replica_loss(kiln_tensor *out, kiln_tensor *target, void *user) {
    (void)user;
    return kiln_cross_entropy(out, target, NULL);
}

/* One SGD step of the configuration; the host waits for every device. */
static kiln_status step(int config, kiln_module *model, kiln_optimizer *opt, kiln_tensor *x, kiln_tensor *y,
                        const kiln_device *devs, int n) {
    kiln_scope_begin();
    kiln_status st = kiln_optimizer_zero_grad(opt, true);
    kiln_tensor *loss = NULL;
    if (!st && config == CONFIG_DP_LOSS) loss = kiln_nn_data_parallel_loss(model, x, y, replica_loss, NULL);
    else if (!st) loss = kiln_cross_entropy(kiln_module_forward(model, x), y, NULL);
    if (!st) st = loss ? kiln_backward(loss, NULL, false) : kiln_error_last()->status;
    if (!st) st = kiln_optimizer_step(opt);
    for (int d = 0; d < n && !st; d++) st = kiln_device_synchronize(devs[d]);
    kiln_scope_end();
    return st;
}

static kiln_status run_config(int config, const kiln_device *devs, int n, int64_t batch, int64_t classes, int steps,
                              int warmup, dp_result *out) {
    kiln_module *model = make_cnn(classes);
    if (model && config != CONFIG_ONE) model = kiln_nn_data_parallel(model, devs, n, devs[0]);
    else if (model && kiln_module_to(model, devs[0])) {
        kiln_module_free(model);
        model = NULL;
    }
    if (!model) return kiln_error_last()->status;
    kiln_tensor **params = NULL;
    int np = 0;
    kiln_status st = kiln_module_parameters(model, &params, &np);
    kiln_sgd_opts so = kiln_sgd_defaults(0.01);
    kiln_optimizer *opt = st ? NULL : kiln_sgd(params, np, &so);
    if (!st && !opt) st = kiln_error_last()->status;
    kiln_scope_begin();
    kiln_manual_seed(7);
    kiln_tensor *x = kiln_to(kiln_randn(KILN_SHAPE(batch, 1, 28, 28), KILN_F32, KILN_CPU), devs[0], KILN_F32, 0);
    int64_t *labels = malloc(sizeof *labels * (size_t)batch);
    for (int64_t i = 0; labels && i < batch; i++) labels[i] = (i * 7919) % classes;
    kiln_tensor *y = labels ? kiln_to(kiln_from_data(KILN_SHAPE(batch), KILN_I64, KILN_CPU, labels), devs[0], KILN_I64, 0)
                            : NULL;
    free(labels);
    if (!st && (!x || !y)) st = kiln_error_last()->status;
    for (int i = 0; i < warmup && !st; i++) st = step(config, model, opt, x, y, devs, n);
    for (int d = 0; d < n && !st; d++) st = kiln_memory_reset_peak(devs[d]);
    double times[DP_BENCH_MAX_STEPS];
    if (!st) st = kiln_profiler_start(NULL);
    for (int i = 0; i < steps && !st; i++) {
        double t0 = tool_now_s();
        st = step(config, model, opt, x, y, devs, n);
        times[i] = (tool_now_s() - t0) * 1e3;
    }
    if (kiln_profiler_is_running()) {
        kiln_status stop = kiln_profiler_stop();
        if (!st) st = stop;
    }
    if (!st) {
        out->step_ms = tool_median(times, steps);
        kiln_device pd[DP_BENCH_MAX_DEVICES + 1];
        double pms[DP_BENCH_MAX_DEVICES + 1];
        int nd = kiln_profiler_device_times(pd, pms, DP_BENCH_MAX_DEVICES + 1);
        for (int d = 0; d < n; d++) {
            kiln_memory_stats ms;
            st = st ? st : kiln_memory_stats_get(devs[d], &ms);
            out->peak_mib[d] = st ? 0 : (double)ms.allocated_bytes[KILN_POOL_ALL].peak / (1024.0 * 1024.0);
            out->device_ms[d] = 0;
            for (int k = 0; k < nd && k <= DP_BENCH_MAX_DEVICES; k++)
                if (kiln_device_equal(pd[k], devs[d])) out->device_ms[d] = pms[k] / steps;
        }
    }
    kiln_scope_end();
    kiln_optimizer_free(opt);
    free(params);
    kiln_module_free(model);
    return st;
}

/* "cuda:0,cuda:1" into devs; the count, 0 on a bad list (message printed). */
static int parse_devices(const char *list, kiln_device *devs) {
    char buf[256];
    if (strlen(list) >= sizeof buf) return 0;
    strcpy(buf, list);
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == DP_BENCH_MAX_DEVICES) {
            fprintf(stderr, "kiln bench dataparallel: --devices: at most %d devices\n", DP_BENCH_MAX_DEVICES);
            return 0;
        }
        if (kiln_device_parse(tok, &devs[n]) != KILN_OK) {
            fprintf(stderr, "kiln bench dataparallel: --devices: %s\n", kiln_error_message());
            return 0;
        }
        n++;
    }
    return n;
}

int kiln_bench_dataparallel(int argc, char **argv) {
    int64_t batch = 64, classes = 10;
    int steps = 3, warmup = 1;
    const char *list = "cuda:0,cuda:1";
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = v != NULL;
        if (!strcmp(o, "--devices") && v) list = v;
        else if (!strcmp(o, "--batch") && v) ok = (batch = atol(v)) > 0;
        else if (!strcmp(o, "--classes") && v) ok = (classes = atol(v)) > 0;
        else if (!strcmp(o, "--steps") && v) ok = (steps = atoi(v)) > 0 && steps <= DP_BENCH_MAX_STEPS;
        else if (!strcmp(o, "--warmup") && v) ok = (warmup = atoi(v)) >= 0;
        else ok = false;
        if (!ok) {
            fprintf(stderr, "usage: kiln bench dataparallel [--devices cuda:0,cuda:1] [--batch N] [--classes N] "
                            "[--steps 1..%d] [--warmup N]\n(bad or incomplete option: %s)\n",
                    DP_BENCH_MAX_STEPS, o);
            return 2;
        }
        i++;
    }
    if (kiln_device_count(KILN_DEVICE_CUDA) < 2) {
        printf("SKIPPED: kiln bench dataparallel needs two CUDA devices (this build sees %d; the emulation build has "
               "cuda:0 and cuda:1)\n",
               kiln_device_count(KILN_DEVICE_CUDA));
        return 77;
    }
    kiln_device devs[DP_BENCH_MAX_DEVICES];
    int n = parse_devices(list, devs);
    if (n < 2) {
        if (n == 1) fprintf(stderr, "kiln bench dataparallel: --devices %s: give at least two devices\n", list);
        return 2;
    }
    char names[DP_BENCH_MAX_DEVICES][32];
    for (int d = 0; d < n; d++) kiln_device_str(devs[d], names[d], sizeof names[d]);
    dp_result r[CONFIG_COUNT] = {0};
    for (int c = 0; c < CONFIG_COUNT; c++) {
        if (run_config(c, devs, n, batch, classes, steps, warmup, &r[c])) {
            fprintf(stderr, "kiln bench dataparallel: %s: %s\n", config_names[c], kiln_error_message());
            return 1;
        }
    }
#ifdef KILN_CUDA_EMULATION
    bool emulated = true;
#else
    bool emulated = false;
#endif
    printf("DataParallel load, tutorial CNN 1x28x28 -> %lld classes, batch %lld, %d steps after %d%s\n",
           (long long)classes, (long long)batch, steps, warmup,
           emulated ? " (emulated devices: memory exact, times the emulator's)" : "");
    printf("%-8s", "config");
    for (int d = 0; d < n; d++) printf(" %9s MiB", names[d]);
    for (int d = 0; d < n; d++) printf(" %9s ms", names[d]);
    printf(" %9s\n", "step ms");
    for (int c = 0; c < CONFIG_COUNT; c++) {
        printf("%-8s", config_names[c]);
        for (int d = 0; d < n; d++) printf(" %13.2f", r[c].peak_mib[d]);
        for (int d = 0; d < n; d++) printf(" %12.1f", r[c].device_ms[d]);
        printf(" %9.1f\n", r[c].step_ms);
    }
    printf("{\"bench\":\"dataparallel\",\"threads\":%d,\"emulated\":%s,\"batch\":%lld,\"classes\":%lld,\"steps\":%d,"
           "\"devices\":[",
           kiln_num_threads(), emulated ? "true" : "false", (long long)batch, (long long)classes, steps);
    for (int d = 0; d < n; d++) printf("%s\"%s\"", d ? "," : "", names[d]);
    printf("],\"configs\":{");
    for (int c = 0; c < CONFIG_COUNT; c++) {
        printf("%s\"%s\":{\"peak_mib\":[", c ? "," : "", config_names[c]);
        for (int d = 0; d < n; d++) printf("%s%.3f", d ? "," : "", r[c].peak_mib[d]);
        printf("],\"device_ms\":[");
        for (int d = 0; d < n; d++) printf("%s%.3f", d ? "," : "", r[c].device_ms[d]);
        printf("],\"step_ms\":%.3f}", r[c].step_ms);
    }
    printf("}}\n");
    return 0;
}

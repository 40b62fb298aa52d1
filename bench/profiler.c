/* `kiln bench profiler`: the profiler's cost per op. kiln_add on two
 * 4-element tensors, N times, in three modes:
 *   none  the profiler's hook and observer unregistered (the dispatcher alone)
 *   off   registered, not profiling (what every program pays)
 *   on    profiling (records kept; the table is built after the loop)
 * Wall-clock ns/op are noisy on shared machines; for instruction counts run
 * one mode under callgrind, collecting only the loop:
 *   valgrind --tool=callgrind --toggle-collect=bench_profiler_loop \
 *       kiln bench profiler --mode off --n 10000
 * and divide the reported Ir by N (docs/diagnostics.md has the figures). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "diag/profiler_internal.h"
#include "kiln/kiln.h"
#include "ops/op_registry.h"
#include "runtime/counters.h"

/* Not inlined, so callgrind's --toggle-collect finds it by name. */
__attribute__((noinline)) void bench_profiler_loop(kiln_tensor *a, int n);

__attribute__((noinline)) void bench_profiler_loop(kiln_tensor *a, int n) {
    for (int i = 0; i < n; i++) kiln_release(kiln_add(a, a));
}

static void set_mode(const char *mode) {
    if (strcmp(mode, "none") == 0) {
        kiln_dispatch_set_hook(KILN_HOOK_PROFILER, NULL);
        kiln_dispatch_set_observer(NULL);
    } else {
        kiln_profiler_init();
    }
}

static double run_mode(const char *mode, kiln_tensor *a, int n) {
    set_mode(mode);
    bool on = strcmp(mode, "on") == 0;
    if (on && kiln_profiler_start(NULL)) return -1;
    uint64_t t0 = kiln_now_ns();
    bench_profiler_loop(a, n);
    uint64_t t1 = kiln_now_ns();
    if (on) kiln_profiler_stop();
    kiln_profiler_init();
    return (double)(t1 - t0) / n;
}

int kiln_bench_profiler(int argc, char **argv) {
    const char *only = NULL;
    int n = 100000;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--mode") == 0 && i + 1 < argc) only = argv[++i];
        else if (strcmp(argv[i], "--n") == 0 && i + 1 < argc) n = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: kiln bench profiler [--mode none|off|on] [--n N]\n");
            return 2;
        }
    }
    if (n <= 0) n = 1;
    if (kiln_init()) {
        fprintf(stderr, "kiln bench profiler: %s\n", kiln_error_message());
        return 1;
    }
    kiln_tensor *a = kiln_ones(KILN_SHAPE(4), KILN_F32, KILN_CPU);
    if (!a) {
        fprintf(stderr, "kiln bench profiler: %s\n", kiln_error_message());
        return 1;
    }
    bench_profiler_loop(a, 1000); /* warm the allocator's cache */
    const char *modes[] = {"none", "off", "on"};
    double ns[3] = {0, 0, 0};
    printf("%-6s %12s\n", "mode", "ns/op");
    for (int m = 0; m < 3; m++) {
        if (only && strcmp(only, modes[m]) != 0) continue;
        ns[m] = run_mode(modes[m], a, n);
        printf("%-6s %12.1f\n", modes[m], ns[m]);
    }
    kiln_release(a);
    printf("{\"bench\":\"profiler\",\"threads\":%d,\"n\":%d,\"ns_per_op_none\":%.1f,\"ns_per_op_off\":%.1f,\"ns_per_op_on\":%.1f}\n", kiln_num_threads(), n,
           ns[0], ns[1], ns[2]);
    return 0;
}

/* `kiln bench alloc`: allocate+free latency of the caching allocator against
 * plain malloc/free, on a training-like trace.
 *
 * The trace: each step allocates a "forward" of N activations (sizes drawn
 * log-uniformly from 64 B to 4 MiB, the same every step, as in training),
 * then a "backward" that walks the activations in reverse, allocating a
 * gradient of the same size, freeing the previous gradient and the
 * activation. One thread, statistics on (they always are). Each repeat
 * replays the whole trace after one warm-up replay, so the figures describe
 * the steady state of a training loop, not the first step. A replay takes
 * about half a millisecond; the median of 31 shrugs off the ones a busy
 * machine interrupts (the min and max show how busy it was). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "runtime/caching_allocator.h"

typedef struct trace_op {
    int slot;    /* which live pointer */
    size_t size; /* 0: free the slot */
} trace_op;

typedef struct bench_trace {
    trace_op *ops;
    size_t n_ops, n_pairs;
    int n_slots;
} bench_trace;

static uint64_t bench_rng_next(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return *s = x;
}

/* Log-uniform in [64 B, 4 MiB]. */
static size_t bench_draw_size(uint64_t *rng) {
    double u = (double)(bench_rng_next(rng) >> 11) / 9007199254740992.0;
    return (size_t)exp(log(64.0) + u * (log(4194304.0) - log(64.0)));
}

static bool trace_build(bench_trace *t, int steps, int tensors, uint64_t seed) {
    size_t cap = (size_t)steps * (size_t)tensors * 4 + 4;
    t->ops = malloc(cap * sizeof *t->ops);
    size_t *sizes = malloc((size_t)tensors * sizeof *sizes);
    if (!t->ops || !sizes) {
        free(t->ops);
        free(sizes);
        return false;
    }
    uint64_t rng = seed ? seed : 1;
    for (int i = 0; i < tensors; i++) sizes[i] = bench_draw_size(&rng);
    /* slots [0, tensors): activations; [tensors, 2*tensors): gradients */
    size_t n = 0;
    for (int s = 0; s < steps; s++) {
        for (int i = 0; i < tensors; i++) t->ops[n++] = (trace_op){i, sizes[i]};
        for (int i = tensors - 1; i >= 0; i--) {
            t->ops[n++] = (trace_op){tensors + i, sizes[i]};
            if (i + 1 < tensors) t->ops[n++] = (trace_op){tensors + i + 1, 0};
            t->ops[n++] = (trace_op){i, 0};
        }
        t->ops[n++] = (trace_op){tensors, 0};
    }
    t->n_ops = n;
    t->n_pairs = n / 2;
    t->n_slots = 2 * tensors;
    free(sizes);
    return true;
}

/* The thread's CPU time (user + system), not wall time: a busy CI machine
 * then slows the figures only through shared caches, not by preemption. */
static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static kiln_status host_alloc(void *ctx, size_t bytes, void **ptr) {
    (void)ctx;
    return posix_memalign(ptr, 256, bytes) == 0 ? KILN_OK : KILN_ERR_OUT_OF_MEMORY;
}

static void host_free(void *ctx, void *ptr, size_t bytes) {
    (void)ctx, (void)bytes;
    free(ptr);
}

static kiln_status host_mem_info(void *ctx, size_t *free_bytes, size_t *total_bytes) {
    (void)ctx;
    *free_bytes = *total_bytes = (size_t)64 << 30;
    return KILN_OK;
}

/* One replay through the caching allocator; ns per allocate+free pair, or
 * a negative value on failure. */
static double replay_caching(kiln_caching_allocator *a, const bench_trace *t, void **live) {
    double t0 = now_ns();
    for (size_t i = 0; i < t->n_ops; i++) {
        const trace_op *op = &t->ops[i];
        if (op->size) {
            if (kiln_caching_allocator_malloc(a, op->size, 1, &live[op->slot]) != KILN_OK) return -1;
        } else if (kiln_caching_allocator_free(a, live[op->slot]) != KILN_OK) {
            return -1;
        }
    }
    return (now_ns() - t0) / (double)t->n_pairs;
}

static double replay_malloc(const bench_trace *t, void **live) {
    double t0 = now_ns();
    for (size_t i = 0; i < t->n_ops; i++) {
        const trace_op *op = &t->ops[i];
        if (op->size) {
            live[op->slot] = malloc(op->size);
            if (!live[op->slot]) return -1;
        } else {
            free(live[op->slot]);
        }
    }
    return (now_ns() - t0) / (double)t->n_pairs;
}

static int bench_usage(void) {
    fprintf(stderr, "usage: kiln bench alloc [--steps N] [--tensors N] [--repeats N] [--seed N]\n"
                    "  steps: forward/backward passes per repeat (default 50)\n"
                    "  tensors: activations per forward (default 64)\n"
                    "  repeats: timed replays; the median is reported (default 31)\n");
    return 2;
}

int kiln_bench_alloc(int argc, char **argv) {
    int steps = 50, tensors = 64, repeats = 31;
    unsigned long long seed = 42;
    for (int i = 1; i < argc; i++) {
        int *target = strcmp(argv[i], "--steps") == 0     ? &steps
                      : strcmp(argv[i], "--tensors") == 0 ? &tensors
                      : strcmp(argv[i], "--repeats") == 0 ? &repeats
                                                          : NULL;
        if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
            seed = strtoull(argv[++i], NULL, 10);
        } else if (target && i + 1 < argc && atoi(argv[i + 1]) > 0) {
            *target = atoi(argv[++i]);
        } else {
            return bench_usage();
        }
    }
    bench_trace t = {0};
    void **live = calloc((size_t)tensors * 2, sizeof *live);
    double *caching = malloc((size_t)repeats * sizeof *caching);
    double *plain = malloc((size_t)repeats * sizeof *plain);
    kiln_raw_ops ops = {.device_name = "cpu",
                        .host_accessible = true,
                        .alloc = host_alloc,
                        .free = host_free,
                        .mem_info = host_mem_info};
    kiln_alloc_config cfg = kiln_alloc_config_default();
    kiln_caching_allocator *a = kiln_caching_allocator_create(&ops, &cfg);
    int rc = 1;
    if (!live || !caching || !plain || !a || !trace_build(&t, steps, tensors, seed)) {
        fprintf(stderr, "kiln bench alloc: out of host memory setting up\n");
        goto done;
    }
    if (replay_caching(a, &t, live) < 0 || replay_malloc(&t, live) < 0) goto failed; /* warm-up */
    /* Each side runs its repeats back to back: libc's replay maps and
     * unmaps its large blocks, which would leave the caches and TLB cold for
     * an interleaved caching replay. */
    for (int r = 0; r < repeats; r++)
        if ((caching[r] = replay_caching(a, &t, live)) < 0) goto failed;
    for (int r = 0; r < repeats; r++)
        if ((plain[r] = replay_malloc(&t, live)) < 0) goto failed;
    qsort(caching, (size_t)repeats, sizeof *caching, tool_cmp_double);
    qsort(plain, (size_t)repeats, sizeof *plain, tool_cmp_double);
    double c_med = caching[repeats / 2], p_med = plain[repeats / 2];
    kiln_memory_stats st;
    kiln_caching_allocator_stats(a, &st);
    printf("kiln bench alloc: %d steps x %d tensors (64 B - 4 MiB, log-uniform), %zu allocate+free "
           "pairs per repeat, %d repeats\n",
           steps, tensors, t.n_pairs, repeats);
    printf("%-22s %16s %14s %14s\n", "allocator", "median ns/pair", "min ns/pair", "max ns/pair");
    printf("%-22s %16.1f %14.1f %14.1f\n", "caching (kiln)", c_med, caching[0], caching[repeats - 1]);
    printf("%-22s %16.1f %14.1f %14.1f\n", "malloc/free (libc)", p_med, plain[0], plain[repeats - 1]);
    printf("caching/malloc ratio: %.2f; reserved peak %.1f MiB for %.1f MiB allocated peak; %lld raw "
           "allocations\n",
           c_med / p_med, (double)st.reserved_bytes[KILN_POOL_ALL].peak / 1048576.0,
           (double)st.allocated_bytes[KILN_POOL_ALL].peak / 1048576.0, (long long)st.num_device_alloc);
    printf("{\"bench\":\"alloc\",\"threads\":%d,\"caching_ns_median\":%.1f,\"malloc_ns_median\":%.1f,\"ratio\":%.3f,"
           "\"caching_ns_min\":%.1f,\"malloc_ns_min\":%.1f,\"pairs\":%zu,\"repeats\":%d,\"steps\":%d,"
           "\"tensors\":%d,\"reserved_peak_bytes\":%lld,\"allocated_peak_bytes\":%lld,"
           "\"device_allocs\":%lld}\n", kiln_num_threads(),
           c_med, p_med, c_med / p_med, caching[0], plain[0], t.n_pairs, repeats, steps, tensors,
           (long long)st.reserved_bytes[KILN_POOL_ALL].peak,
           (long long)st.allocated_bytes[KILN_POOL_ALL].peak, (long long)st.num_device_alloc);
    rc = 0;
    goto done;
failed:
    fprintf(stderr, "kiln bench alloc: %s\n", kiln_error_message());
done:
    kiln_caching_allocator_destroy(a);
    free(t.ops);
    free(live);
    free(caching);
    free(plain);
    return rc;
}

/* The CPU's model, flags and measured f32 FMA peak (cpu_peak.h).
 *
 * Why measure rather than multiply nominal figures: in a VM the clock is
 * whatever the host runs at (turbo, or throttled by its other tenants),
 * and whether a core has one or two 512-bit FMA units is not in cpuinfo.
 * The loop below is what a compute-bound kernel can at best reach, so a
 * GFLOP/s figure divided by it says how much of the machine a step used. */
#include "cpu_peak.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

static bool has_flag(const char *flags, const char *name) {
    size_t n = strlen(name);
    for (const char *p = flags; (p = strstr(p, name)) != NULL; p += n)
        if ((p == flags || p[-1] == ' ' || p[-1] == '\t') && (p[n] == ' ' || p[n] == '\n' || p[n] == '\0'))
            return true;
    return false;
}

/* "key<spaces/tabs>: value" -> value without its newline, or NULL. */
static const char *cpuinfo_value(char *line, const char *key) {
    size_t n = strlen(key);
    if (strncmp(line, key, n) != 0) return NULL;
    char *colon = strchr(line + n, ':');
    if (!colon) return NULL;
    char *v = colon + 1;
    while (*v == ' ') v++;
    v[strcspn(v, "\n")] = '\0';
    return v;
}

void bench_cpu_info_get(bench_cpu_info *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->model, sizeof out->model, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    /* The flags line of an AVX-512 server is about 1.5 kB. */
    char *line = malloc(16384);
    bool have_model = false, have_flags = false;
    while (f && line && !(have_model && have_flags) && fgets(line, 16384, f)) {
        const char *v;
        if (!have_model && (v = cpuinfo_value(line, "model name")) != NULL) {
            snprintf(out->model, sizeof out->model, "%s", v);
            have_model = true;
        } else if (!have_flags && (v = cpuinfo_value(line, "flags")) != NULL) {
            out->avx2 = has_flag(v, "avx2");
            out->fma = has_flag(v, "fma");
            out->avx512f = has_flag(v, "avx512f");
            out->avx512_bf16 = has_flag(v, "avx512_bf16");
            out->amx_bf16 = has_flag(v, "amx_bf16");
            have_flags = true;
        }
    }
    free(line);
    if (f) fclose(f);
    out->native_bf16 = out->avx512_bf16 || out->amx_bf16;
    const char *names[5] = {"avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"};
    bool on[5] = {out->avx2, out->fma, out->avx512f, out->avx512_bf16, out->amx_bf16};
    size_t len = 0;
    for (int i = 0; i < 5; i++)
        if (on[i])
            len +=
                (size_t)snprintf(out->flags + len, sizeof out->flags - len, "%s%s", len ? " " : "", names[i]);
    if (!len) snprintf(out->flags, sizeof out->flags, "none of avx2 fma avx512f avx512_bf16 amx_bf16");
}

/* ---- The FMA loop ------------------------------------------------------------------------ */

/* The calling thread's CPU time: the time it spent on a core, so that the
 * time other processes hold the core does not count against the rate. */
static double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define FMA_CHAINS 12   /* independent accumulators: 2 pipes x 4-5 cycles latency, with room */
#define FMA_BLOCK  4096 /* iterations between clock reads */

#if defined(__x86_64__)
/* One FMA on each of the 12 chains; the empty asm makes the compiler keep
 * every chain in a register and every FMA in the loop (it cannot see that
 * the values are never used). */
#define FMA_ROUND(fma)                                                                                       \
    do {                                                                                                     \
        c0 = fma(a, c0, b), c1 = fma(a, c1, b), c2 = fma(a, c2, b), c3 = fma(a, c3, b);                      \
        c4 = fma(a, c4, b), c5 = fma(a, c5, b), c6 = fma(a, c6, b), c7 = fma(a, c7, b);                      \
        c8 = fma(a, c8, b), c9 = fma(a, c9, b), c10 = fma(a, c10, b), c11 = fma(a, c11, b);                  \
        __asm__ volatile(""                                                                                  \
                         : "+x"(c0), "+x"(c1), "+x"(c2), "+x"(c3), "+x"(c4), "+x"(c5), "+x"(c6), "+x"(c7),   \
                           "+x"(c8), "+x"(c9), "+x"(c10), "+x"(c11));                                        \
    } while (0)

/* FMA_BLOCK-iteration blocks until `seconds` of the thread's CPU time have
 * passed; the FLOPs done and the CPU time taken. */
__attribute__((target("avx2,fma"))) static void fma_ymm(double seconds, double *flops, double *secs) {
    __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0, c8 = c0,
           c9 = c0, c10 = c0, c11 = c0;
    double t0 = thread_cpu_s(), t = t0;
    long blocks = 0;
    while (t - t0 < seconds) {
        for (int i = 0; i < FMA_BLOCK; i++) FMA_ROUND(_mm256_fmadd_ps);
        blocks++;
        t = thread_cpu_s();
    }
    *flops = (double)blocks * FMA_BLOCK * FMA_CHAINS * 8 * 2;
    *secs = t - t0;
}

__attribute__((target("avx512f"))) static void fma_zmm(double seconds, double *flops, double *secs) {
    __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0, c8 = c0,
           c9 = c0, c10 = c0, c11 = c0;
    double t0 = thread_cpu_s(), t = t0;
    long blocks = 0;
    while (t - t0 < seconds) {
        for (int i = 0; i < FMA_BLOCK; i++) FMA_ROUND(_mm512_fmadd_ps);
        blocks++;
        t = thread_cpu_s();
    }
    *flops = (double)blocks * FMA_BLOCK * FMA_CHAINS * 16 * 2;
    *secs = t - t0;
}
#endif

/* The threads wait for `go` so that they all run the loop at the same
 * time (a peak of one core at a time would miss shared clocks and power). */
typedef struct fma_start {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool go;
} fma_start;

typedef struct fma_thread {
    fma_start *start;
    double seconds, rate; /* rate: FLOP/s */
    bool zmm;
} fma_thread;

/* The thread's rate is the best of FMA_SLICES equal slices of its CPU
 * time: a slice that ran undisturbed (no interrupt, no core shared with a
 * hyperthread sibling or the hypervisor's other guests) shows what the
 * core can do. */
#define FMA_SLICES 20

static void *fma_thread_main(void *arg) {
    fma_thread *t = arg;
    pthread_mutex_lock(&t->start->mu);
    while (!t->start->go) pthread_cond_wait(&t->start->cv, &t->start->mu);
    pthread_mutex_unlock(&t->start->mu);
    t->rate = 0;
    for (int i = 0; i < FMA_SLICES; i++) {
        double flops = 0, secs = 0;
#if defined(__x86_64__)
        if (t->zmm)
            fma_zmm(t->seconds / FMA_SLICES, &flops, &secs);
        else
            fma_ymm(t->seconds / FMA_SLICES, &flops, &secs);
#endif
        if (secs > 0 && flops / secs > t->rate) t->rate = flops / secs;
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void bench_fma_peak_measure(int threads, double seconds, bench_fma_peak *out) {
    memset(out, 0, sizeof *out);
    out->isa = "none";
    if (threads < 1 || threads > 256 || !(seconds >= 0.05 && seconds <= 5)) return;
    out->threads = threads;
    bench_cpu_info cpu;
    bench_cpu_info_get(&cpu);
#if defined(__x86_64__)
    bool zmm = cpu.avx512f && __builtin_cpu_supports("avx512f");
    bool ymm = cpu.avx2 && cpu.fma && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    bool zmm = false, ymm = false;
#endif
    if (!zmm && !ymm) return;
    fma_thread *t = calloc((size_t)threads, sizeof *t);
    pthread_t *ids = calloc((size_t)threads, sizeof *ids);
    double *rates = calloc((size_t)threads, sizeof *rates);
    fma_start start = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .go = false};
    bool ok = t && ids && rates;
    int started = 0;
    /* Thread 0 is this one. A thread that cannot start fails the
     * measurement; the started ones still run and are joined. */
    for (int i = 0; ok && i < threads; i++)
        t[i] = (fma_thread){.start = &start, .seconds = seconds, .zmm = zmm};
    for (int i = 1; ok && i < threads; i++, started++)
        if (pthread_create(&ids[i], NULL, fma_thread_main, &t[i]) != 0) ok = false;
    pthread_mutex_lock(&start.mu);
    start.go = true;
    pthread_cond_broadcast(&start.cv);
    pthread_mutex_unlock(&start.mu);
    if (ok) fma_thread_main(&t[0]);
    for (int i = 1; i <= started; i++) pthread_join(ids[i], NULL);
    if (ok) {
        double sum = 0;
        for (int i = 0; i < threads; i++) sum += rates[i] = t[i].rate;
        qsort(rates, (size_t)threads, sizeof *rates, cmp_double);
        out->gflop_s = sum * 1e-9;
        out->per_thread = rates[threads / 2] * 1e-9;
        out->isa = zmm ? "zmm (AVX-512F)" : "ymm (AVX2+FMA)";
    }
    free(t), free(ids), free(rates);
}

/* ---- CPU time ------------------------------------------------------------------------------ */

/* CPU seconds all processes have been busy (from /proc/stat's "cpu" line:
 * user, nice, system, irq, softirq, steal), or a negative value. */
double bench_cpu_busy_s(void) {
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return -1;
    unsigned long long v[8] = {0};
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                   &v[6], &v[7]);
    fclose(f);
    if (n != 8) return -1;
    return (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / (double)sysconf(_SC_CLK_TCK);
}

/* CPU seconds of this process and its waited-for children (the peers). */
double bench_cpu_own_s(void) {
    struct rusage self, kids;
    getrusage(RUSAGE_SELF, &self);
    getrusage(RUSAGE_CHILDREN, &kids);
    double s = 0;
    const struct rusage *u[2] = {&self, &kids};
    for (int i = 0; i < 2; i++)
        s += (double)u[i]->ru_utime.tv_sec + 1e-6 * (double)u[i]->ru_utime.tv_usec +
             (double)u[i]->ru_stime.tv_sec + 1e-6 * (double)u[i]->ru_stime.tv_usec;
    return s;
}

/* What a CPU benchmark has to say about the machine it ran on: the CPU
 * model and the vector flags that decide which kernels run (from
 * /proc/cpuinfo), and the measured f32 FMA peak of the cores it uses,
 * against which `kiln bench cnn` states its GFLOP/s. */
#ifndef KILN_BENCH_CPU_PEAK_H
#define KILN_BENCH_CPU_PEAK_H
#include <stdbool.h>
#include <stddef.h>

typedef struct bench_cpu_info {
    char model[128]; /* /proc/cpuinfo "model name", or "unknown" */
    bool avx2, fma, avx512f, avx512_bf16, amx_bf16;
    bool native_bf16; /* avx512_bf16 or amx_bf16: bf16 arithmetic in hardware */
    char flags[96];   /* the flags above that are present, space-separated, or "none of ..." */
} bench_cpu_info;

/* Fill *out from /proc/cpuinfo (its first processor). Never fails: an
 * unreadable file leaves model "unknown" and every flag false. */
void bench_cpu_info_get(bench_cpu_info *out);

typedef struct bench_fma_peak {
    double gflop_s;    /* f32 FLOP/s of all `threads` together (an FMA is 2 FLOPs), in 1e9 */
    double per_thread; /* the median thread's share */
    int threads;
    const char *isa; /* "zmm (AVX-512F)", "ymm (AVX2+FMA)" or "none" */
} bench_fma_peak;

/* Measure the f32 FMA peak: `threads` threads (1..256), started together,
 * each runs independent chains of vector FMAs (enough to hide the latency
 * of two FMA pipes) on the widest vectors the CPU has for `seconds` (0.05
 * to 5) of its CPU time (CLOCK_THREAD_CPUTIME_ID: time other processes
 * hold the core does not count) in 20 slices, and the best slice's FLOP/s
 * of each thread are added: the rate of the cores while they compute, on
 * a shared machine too. Blocks for at least that long. gflop_s is 0 with isa "none" on a CPU without FMA (or
 * not x86-64), or when a thread cannot be started. */
void bench_fma_peak_measure(int threads, double seconds, bench_fma_peak *out);

/* CPU seconds all processes have been busy since boot (/proc/stat's "cpu"
 * line: user, nice, system, irq, softirq, steal), or -1 when unreadable;
 * with bench_cpu_own_s (this process and its waited-for children) the
 * difference over a run is the CPU other processes used meanwhile. */
double bench_cpu_busy_s(void);
double bench_cpu_own_s(void);
#endif

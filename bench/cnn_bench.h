/* `kiln bench cnn` on the CPU: the state shared by its driver (cnn_step.c:
 * the model, the steps, the interleaved rounds) and its report
 * (cnn_report.c: the FLOP count, the table and the JSON line). */
#ifndef KILN_BENCH_CNN_BENCH_H
#define KILN_BENCH_CNN_BENCH_H
#include <stdbool.h>

#include "bench.h"
#include "cpu_peak.h"
#include "kiln/kiln.h"

#define CNN_MAX_REPEATS 64
#define CNN_SIDE        32 /* input height and width */
#define CNN_PAD         1  /* every conv: 3x3, stride 1, this padding (the side is kept) */

enum { CNN_F32 = 0, CNN_BF16, CNN_PRECISIONS };
enum { CNN_TRAIN = 0, CNN_INFER, CNN_MODES };
/* Who ran a series: Kiln, PyTorch eager (NCHW, no_grad), PyTorch's best
 * setup (channels_last; inference also inference_mode + jit.trace + freeze). */
enum { CNN_KILN = 0, CNN_EAGER, CNN_BEST, CNN_WHO };
enum { CNN_DATA_NONE = 0, CNN_DATA_HOST, CNN_DATA_DEVICE };

typedef struct cnn_config {
    int batch, steps, repeats, warmup, workers, profile_rows;
    int data;                       /* CNN_DATA_* */
    bool mode[CNN_MODES];           /* --mode */
    bool precision[CNN_PRECISIONS]; /* --precision: which precisions run */
    bool bf16_emulated;             /* bf16 asked for on a CPU without native bf16 */
    bool peer;
    const char *python, *peer_script;
} cnn_config;

/* Images/s of each round, for one precision, mode and side. */
typedef struct cnn_series {
    double v[CNN_MAX_REPEATS];
    int n;
    bool missing; /* the peer gave no figure (reason printed) */
} cnn_series;

/* The passes whose rates the profiled step reports against the FMA peak
 * (the forward convolutions are conv2d_relu_max_pool2d on the CPU, conv2d
 * elsewhere: bench/cnn_step.c). */
#define CNN_PASSES     5
#define CNN_PASS_NAMES {"conv2d", "conv2d_relu_max_pool2d", "conv2d_grad_input", "conv2d_grad_weight", "mm"}

typedef struct cnn_results {
    cnn_series s[CNN_PRECISIONS][CNN_MODES][CNN_WHO];
    cnn_series train_pre; /* --data: the same f32 steps on the preloaded batch */
    double wait_frac;     /* --data: wait / timed training time; < 0 without --data */
    char peer_reason[600];
    char bf16_reason[300]; /* why bf16 did not run, or ran emulated ("" when it ran natively) */
    char torch_version[32];
    double load_before, load_after;
    double foreign_cores; /* CPU used by other processes during the rounds / wall time; < 0: unknown */
    double gflop_fwd, gflop_train; /* one forward / training step at the run's batch (cnn_flops) */
    bench_cpu_info cpu;
    bench_fma_peak peak;
    bool kiln_bf16_fast; /* Kiln's fast CPU kernels cover bf16 conv2d and mm */
    /* Peak resident sets, KiB (0: not measured): this process's at the end
     * of its rounds (every mode and precision it ran), and each peer
     * setup's largest over its rounds (wait4 on the peer process). */
    long kiln_rss_kib;
    long peer_rss_kib[CNN_PRECISIONS][CNN_MODES][CNN_WHO];
    /* The profiled training step's arithmetic per pass (CNN_PASS_NAMES):
     * GFLOP/s over the pass's kernel time; 0 when not profiled. */
    double pass_gflop_s[CNN_PASSES];
} cnn_results;


/* Direct-convolution FLOP equivalents of the model's forward and training
 * step at `batch`, from its weight shapes (conv1..conv3, fc1, fc2) and the
 * input side: a convolution is 2 * B * Cout * H * W * Cin * kh * kw, a
 * linear layer 2 * B * in * out. The training step is three forwards
 * (forward, data gradient, weight gradient) less the first convolution's
 * data gradient, which no one asks for (the input needs no gradient).
 * Elementwise work (ReLU, pooling, the loss, Adam) is not counted.
 * Returns KILN_OK, or the status of a missing weight. */
kiln_status cnn_flops(kiln_module *model, int batch, double *gflop_fwd, double *gflop_train);

/* The results table (stdout), with the ratios to PyTorch eager and best
 * per precision and mode, the bars, the machine and the peak. */
void cnn_print_table(const cnn_config *cfg, const cnn_results *r);
/* The last stdout line: one JSON object. */
void cnn_print_json(const cnn_config *cfg, const cnn_results *r);

double cnn_series_median(const cnn_series *s);
bool cnn_series_has_figures(const cnn_series *s);
#endif

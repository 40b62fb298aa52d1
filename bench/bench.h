/* Benchmarks run by `kiln bench NAME`. Each prints a human table, then one
 * last stdout line holding a JSON object with the figures, which starts
 * with the benchmark's name and Kiln's compute threads:
 * {"bench":"NAME","threads":N,...}. Clock and medians: tools/timing.h. */
#ifndef KILN_BENCH_BENCH_H
#define KILN_BENCH_BENCH_H

#include "../tools/timing.h"
#include "kiln/kiln.h"

int kiln_bench_alloc(int argc, char **argv);
int kiln_bench_cnn(int argc, char **argv);
int kiln_bench_loader(int argc, char **argv);
int kiln_bench_profiler(int argc, char **argv);
int kiln_bench_checkpoint(int argc, char **argv);
/* plan.c: kiln plan's predicted peaks against measured ones, the whole matrix. */
int kiln_bench_plan(int argc, char **argv);
/* data_parallel.c: DataParallel's load per device (exit 77 without two
 * CUDA devices). */
int kiln_bench_dataparallel(int argc, char **argv);
/* ddp.c: DDP across processes (mpirun) against PyTorch's DDP over gloo:
 * images/s of 1 and N processes, scaling efficiency, the all-reduce time
 * hidden behind backward (exit 77 without mpirun or MPI). `--worker` is
 * one rank of the measured job, started by the benchmark itself. */
int kiln_bench_ddp(int argc, char **argv);
/* exercises.c: the tutorial's five exercises as one page (exercises.html)
 * and exercises.json. */
int kiln_bench_exercises(int argc, char **argv);
/* main_job.c: Kiln's default `kiln train` against the same recipe in
 * PyTorch (bench/peer/fmnist_train.py), interleaved: training-loop seconds
 * per epoch and final test accuracy. */
int kiln_bench_main_job(int argc, char **argv);
/* gpu.c: GPU benchmarks (exit 77 with the reason without a CUDA device).
 * kiln_bench_cnn runs kiln_bench_cnn_device for --device cuda:N. */
int kiln_bench_cnn_device(int argc, char **argv);
int kiln_bench_copy(int argc, char **argv);
int kiln_bench_gemm(int argc, char **argv);
/* cnn_step.c: PyTorch's OptimizedCNN for 3x32x32 (parameter names and
 * order as PyTorch's), on the CPU; its forward calls the fused ops when
 * layer fusion is on. A new module the caller frees, or NULL. */
kiln_module *kiln_bench_cnn_model(void);
/* trace.c: eager against traced/replayed, inference and training step
 * (the tutorial CNN), per-op host overhead, PyTorch's frozen TorchScript
 * beside it when torch is installed. */
int kiln_bench_trace(int argc, char **argv);
/* bench_data.c: a CIFAR-sized synthetic u8 dataset (N, 3, 32, 32). */
kiln_dataset *kiln_bench_synthetic_cifar(int64_t n);
#endif

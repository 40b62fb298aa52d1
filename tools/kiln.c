/* The kiln command. Subcommands: info, train, eval, export, bench, ops,
 * smi, memory, version, help. Errors from
 * the library become a message on stderr and exit code 1; usage errors
 * exit 2. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../bench/bench.h"
#include "infer.h"
#include "diag_commands.h"
#include "kiln/kiln.h"
#include "ops/op_registry.h"
#include "runtime/cuda_module.h"
#include "plan_command.h"
#include "report.h"
#include "train.h"

static int fail(const char *what) {
    const kiln_error *e = kiln_error_last();
    fprintf(stderr, "kiln %s: %s\n", what, e->message);
    if (e->hint[0]) fprintf(stderr, "  hint: %s\n", e->hint);
    return 1;
}

static void print_device(kiln_device d) {
    char id[32], name[256] = "?";
    char fb[32], tb[32];
    size_t free_b = 0, total_b = 0;
    kiln_device_name(d, name, sizeof name);
    kiln_device_mem_info(d, &free_b, &total_b);
    printf("  %-7s %s\n", kiln_device_str(d, id, sizeof id), name);
    if (d.type != KILN_DEVICE_META) {
        /* Print in GiB with two decimals: what users compare against nvidia-smi. */
        snprintf(fb, sizeof fb, "%.2f GiB", (double)free_b / (1 << 30));
        snprintf(tb, sizeof tb, "%.2f GiB", (double)total_b / (1 << 30));
        printf("          memory: %s free of %s\n", fb, tb);
    }
#ifdef KILN_WITH_CUDA
    if (d.type == KILN_DEVICE_CUDA) {
        char props[512];
        if (kiln_cuda_device_properties(d.index, props, sizeof props) == KILN_OK) printf("          %s\n", props);
    }
#endif
}

static int cmd_info(void) {
    printf("kiln %s\n", kiln_version());
    printf("build: %s\n", kiln_build_options());
    char id[32];
    printf("default device: %s\n", kiln_device_str(kiln_default_device(), id, sizeof id));
    printf("devices:\n");
    print_device(KILN_CPU);
    int n_cuda = kiln_device_count(KILN_DEVICE_CUDA);
    for (int i = 0; i < n_cuda; i++) print_device(KILN_CUDA(i));
    if (n_cuda == 0) printf("  cuda    0 devices: %s\n", kiln_device_absent_reason(KILN_DEVICE_CUDA));
#ifdef KILN_WITH_CUDA
    int driver = 0, runtime = 0;
    kiln_cuda_versions(&driver, &runtime);
    printf("  cuda    driver %d.%d, runtime %d.%d\n", driver / 1000, (driver % 1000) / 10, runtime / 1000,
           (runtime % 1000) / 10);
    /* The CUDA module (docs/cuda.md): where it came from, or why it is not there. */
    if (kiln_cuda_module_path()[0])
        printf("  cuda    module %s\n", kiln_cuda_module_path());
    else if (kiln_cuda_module_reason()[0])
        printf("  cuda    module not loaded: %s\n", kiln_cuda_module_reason());
#endif
    print_device(KILN_META);
    printf("threads: %d compute, %d loader worker%s on auto (--threads N, KILN_NUM_THREADS)\n", kiln_num_threads(),
           kiln_num_loader_workers(), kiln_num_loader_workers() == 1 ? "" : "s");
    return 0;
}

/* --threads N, taken out of argv (any position after the command) and
 * applied before the command runs: the one flag every command that
 * computes shares. 0 applied or absent, 2 a usage error (printed). */
static int take_threads_flag(const char *cmd, int *argc, char **argv) {
    for (int i = 2; i < *argc; i++) {
        if (strcmp(argv[i], "--threads") != 0) continue;
        int n = 0;
        if (i + 1 >= *argc) {
            fprintf(stderr, "kiln %s: --threads needs a value (a whole number from 1 to %d)\n", cmd,
                    KILN_MAX_THREADS);
            return 2;
        }
        if (kiln_num_threads_parse(argv[i + 1], "--threads", &n) != KILN_OK || kiln_set_num_threads(n) != KILN_OK) {
            const kiln_error *e = kiln_error_last();
            fprintf(stderr, "kiln %s: %s (%s)\n", cmd, e->message, e->hint);
            return 2;
        }
        /* The flag is the variable (runtime.h): a command can tell a count
         * the user chose from the default (kiln train under mpirun). */
        setenv("KILN_NUM_THREADS", argv[i + 1], 1);
        for (int k = i; k + 2 <= *argc; k++) argv[k] = argv[k + 2];
        *argc -= 2;
        i--;
    }
    return 0;
}

/* host: the benchmark measures the host alone (what it runs on is its
 * subject), so it has no --device; the others take --device D themselves
 * (cnn: cpu or cuda:N; copy, gemm: cuda:N; checkpoint: any, default
 * KILN_DEVICE). */
typedef struct bench_entry {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *what;
    const char *host; /* NULL: takes --device; else why it has no device choice */
} bench_entry;

static const bench_entry benches[] = {
    {"alloc", kiln_bench_alloc, "caching allocator vs malloc, allocate+free latency",
     "it compares the caching allocator with malloc over host memory"},
    {"cnn", kiln_bench_cnn, "tutorial CNN 3x32x32: train/infer images/s vs PyTorch (interleaved); --device D", NULL},
    {"loader", kiln_bench_loader, "data loader pipeline: batches/s and MB/s for 0, 1, 2 workers",
     "it measures the loader's host pipeline"},
    {"profiler", kiln_bench_profiler, "profiler cost per op: unregistered, off, on",
     "it measures the profiler's host-side cost on CPU ops"},
    {"copy", kiln_bench_copy, "host-to-device copy GB/s, pageable vs pinned (--device cuda:N)", NULL},
    {"gemm", kiln_bench_gemm, "cuBLASLt mm TFLOP/s in f32/tf32/f16/bf16 vs the GPU's peak (--device cuda:N)", NULL},
    {"plan", kiln_bench_plan, "kiln plan's predicted step peaks vs measured, every model/batch/amp/checkpoint case",
     NULL},
    {"checkpoint", kiln_bench_checkpoint,
     "gradient checkpointing: activation memory saved, step time cost; --device D", NULL},
    {"dataparallel", kiln_bench_dataparallel,
     "DataParallel's load: peak memory and device time per device, loss gathered vs in the replicas",
     "it runs on the list given by --devices (default cuda:0,cuda:1)"},
    {"ddp", kiln_bench_ddp, "DDP over mpirun processes vs PyTorch DDP (gloo): img/s, scaling, all-reduce hidden",
     "it measures DDP on CPU tensors over MPI (CUDA tensors go through NCCL: mpirun -np N kiln train --device cuda)"},
    {"exercises", kiln_bench_exercises,
     "the tutorial's five exercises: one HTML page + JSON (--out DIR, --quick, --device D)", NULL},
    {"trace", kiln_bench_trace,
     "eager vs traced: tutorial CNN inference calls/s, training steps/s, host ns/op; PyTorch frozen beside; "
     "--device D (cuda: the replay is a CUDA graph)",
     NULL},
    {"main-job", kiln_bench_main_job,
     "kiln train's default recipe vs the same in PyTorch (interleaved): s/epoch, test accuracy",
     "it runs kiln train on the CPU with its default device choice"},
};

/* --device given to a benchmark that has no device choice: 2, said. */
static int refuse_device(const bench_entry *b, int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--device")) {
            fprintf(stderr,
                    "kiln bench %s: --device %s: this benchmark has no device choice (%s); drop --device (the "
                    "benchmarks that take one: cnn, copy, gemm, checkpoint, exercises, plan, trace)\n",
                    b->name, i + 1 < argc ? argv[i + 1] : "(no value)", b->host);
            return 2;
        }
    return 0;
}

static int cmd_bench(int argc, char **argv) {
    size_t n = sizeof benches / sizeof benches[0];
    if (argc < 1 || strcmp(argv[0], "--list") == 0) {
        printf("usage: kiln bench NAME [options]\nbenchmarks:\n");
        for (size_t i = 0; i < n; i++) printf("  %-10s %s\n", benches[i].name, benches[i].what);
        return argc < 1 ? 2 : 0;
    }
    for (size_t i = 0; i < n; i++)
        if (strcmp(argv[0], benches[i].name) == 0) {
            int rc = benches[i].host ? refuse_device(&benches[i], argc, argv) : 0;
            return rc ? rc : benches[i].run(argc, argv);
        }
    fprintf(stderr, "kiln bench: unknown benchmark '%s' (kiln bench --list shows them)\n", argv[0]);
    return 2;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: kiln COMMAND [args]\n"
            "commands:\n"
            "  info            version, build options, devices with memory, threads\n"
            "  train [opts]    train a model spec on Fashion-MNIST (kiln train --help)\n"
            "  eval --checkpoint FILE   test accuracy and loss of a checkpoint (kiln eval --help)\n"
            "  export --checkpoint FILE --out DIR   weights + model spec for inference (--traced --example\n"
            "                  NxCxHxW: DIR/model.kiln, a traced program)\n"
            "  infer --program FILE --input X.safetensors   run a traced program (kiln infer --help)\n"
            "  plan [opts]     a training step's peak memory, before it runs (kiln plan --help)\n"
            "  bench NAME      run a benchmark (kiln bench --list)\n"
            "  ops             the op list as a markdown table (docs/ops.md)\n"
            "  smi [--watch S] GPU utilisation, memory, power (host CPU/RSS of kiln without a GPU)\n"
            "  memory [DEVICE] allocator statistics of DEVICE (default cpu)\n"
            "  report RUN_DIR  RUN_DIR/report.html: plots of a run's metrics and memory (kiln report --help)\n"
            "  version         print the version\n"
            "  help            this text\n"
            "info, train, eval and bench take --threads N: the CPU compute threads (default: KILN_NUM_THREADS,\n"
            "else OMP_NUM_THREADS, else every core; docs/training.md)\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("kiln %s\n", kiln_version());
        return 0;
    }
    if (kiln_init() != KILN_OK) return fail("init");
    int rc = 0;
    if (!strcmp(cmd, "info") || !strcmp(cmd, "train") || !strcmp(cmd, "eval") || !strcmp(cmd, "bench"))
        rc = take_threads_flag(cmd, &argc, argv);
    if (rc) {
        kiln_shutdown();
        return rc;
    }
    if (strcmp(cmd, "info") == 0) rc = cmd_info();
    else if (strcmp(cmd, "train") == 0) rc = kiln_cmd_train(argc - 2, argv + 2);
    else if (strcmp(cmd, "eval") == 0) rc = kiln_cmd_eval(argc - 2, argv + 2);
    else if (strcmp(cmd, "export") == 0) rc = kiln_cmd_export(argc - 2, argv + 2);
    else if (strcmp(cmd, "infer") == 0) rc = kiln_cmd_infer(argc - 2, argv + 2);
    else if (strcmp(cmd, "plan") == 0) rc = kiln_cmd_plan(argc - 2, argv + 2);
    else if (strcmp(cmd, "bench") == 0) rc = cmd_bench(argc - 2, argv + 2);
    else if (strcmp(cmd, "smi") == 0) rc = kiln_cmd_smi(argc - 2, argv + 2);
    else if (strcmp(cmd, "memory") == 0) rc = kiln_cmd_memory(argc - 2, argv + 2);
    else if (strcmp(cmd, "report") == 0) rc = kiln_cmd_report(argc - 2, argv + 2);
    else if (strcmp(cmd, "ops") == 0) {
        char *md = kiln_ops_markdown();
        rc = md ? (fputs(md, stdout), 0) : fail("ops");
        free(md);
    }
    else {
        fprintf(stderr, "kiln: unknown command '%s'\n", cmd);
        usage(stderr);
        rc = 2;
    }
    kiln_shutdown();
    return rc;
}

/* kiln_plan_step against kiln_plan_measure: the planned peaks of allocated
 * and of reserved bytes within 5% of the measured ones (the same kiln
 * train step run for real), on the device and on the pinned pool of the
 * loader's batches; the breakdown adds up to the planned peak and names
 * the phase; the budget searches agree with the plans they are made of;
 * bad options are refused by name; a CUDA plan holds the stream's GEMM
 * workspace (the backend's, or the test override's).
 *
 * Cases. The whole matrix (every model in models/, batch 1, 32 and 128,
 * AMP off and on, checkpointing off and 2 segments, CPU and emulated
 * cuda:0) is `kiln bench plan` (docs/memory.md has its table). CI runs:
 *   - on a build without CUDA (the release and ASan tiers), the CPU cases:
 *     every model at batch 1 and 32 with all four AMP x checkpoint
 *     settings (the ResNet's bf16 at 32 only with 2 segments), and at batch
 *     128 the tutorial CNNs in all four and the ResNet in f32 (its bf16
 *     steps take 5-35 s each on a CPU without native bf16 arithmetic); in
 *     the ASan tier only the cases below batch 128, the ResNet at batch 1;
 *     and the steady state (steps 2: the first step and a second with
 *     Adam's state alive) for the tutorial CNNs and the ResNet at 32 (f32,
 *     checkpointing off and on) and at 128 (the 1x28x28 CNN, f32);
 *   - on the emulation build (the emu tier), the cuda:0 cases only (the
 *     CPU's are the release tier's): the tutorial CNN 1x28x28 at batch 1,
 *     32 and 128 (f32 and f16, with and without 2 segments), the 3x32x32
 *     CNN at 128 in f16 with 2 segments and the ResNet at batch 1 in f16
 *     with 2 segments; the steady state of the 1x28x28 CNN at 128 (f32)
 *     and 32 (f16, 2 segments). The emulator runs every kernel on the CPU: a ResNet
 *     step at batch 32 takes 45-65 s there, more than the tier's budget has
 *     left, so the ResNet's larger batches on cuda:0 are kiln bench plan's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kiln/kiln.h"
#include "plan/plan_internal.h"
#include "runtime/backend.h"
#include "test_util.h"

#define TOLERANCE 0.05

/* Under the sanitizers (the ASan tier) the large steps are left out: what
 * ASan checks here is the planner's own code, which the small ones run. */
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif

typedef struct plan_case {
    const char *model;
    int64_t batch;
    bool amp;
    int checkpoint;
    int steps; /* 0: the first step; 2: and the steady state */
} plan_case;

static int failures;

static double rel(int64_t pred, int64_t meas) {
    return meas ? fabs((double)(pred - meas)) / (double)meas : pred != 0;
}

static void run_case(kiln_device dev, const plan_case *c) {
    char path[1024];
    snprintf(path, sizeof path, "%s/models/%s", KILN_SOURCE_DIR, c->model);
    kiln_plan_opts o = kiln_plan_defaults();
    o.model = path;
    o.batch = c->batch;
    o.device = dev;
    o.amp = !c->amp ? KILN_F32 : dev.type == KILN_DEVICE_CUDA ? KILN_F16 : KILN_BF16;
    o.checkpoint = c->checkpoint;
    o.steps = c->steps;
    kiln_plan p, m;
    CHECK_OK(kiln_plan_step(&o, &p));
    CHECK_OK(kiln_plan_measure(&o, &m));
    for (int i = 0; i < p.n_memories; i++) {
        const kiln_plan_memory *a = &p.memory[i], *b = &m.memory[i];
        double ea = rel(a->allocated_peak, b->allocated_peak), er = rel(a->reserved_peak, b->reserved_peak);
        printf(
            "%-26s b%-4lld amp %-3s ckpt %d steps %d %-11s allocated %10.2f / %10.2f MiB (%5.2f%%)  reserved %10.2f / "
            "%10.2f MiB (%5.2f%%)\n",
            c->model, (long long)c->batch, c->amp ? "on" : "off", c->checkpoint, c->steps ? c->steps : 1, a->name,
            a->allocated_peak / 1048576.0, b->allocated_peak / 1048576.0, 100 * ea,
            a->reserved_peak / 1048576.0, b->reserved_peak / 1048576.0, 100 * er);
        if (ea > TOLERANCE || er > TOLERANCE) {
            printf("  FAIL: the plan misses the measured peak by more than 5%%\n");
            failures++;
        }
    }
    /* The breakdown is a partition of the planned peak. */
    int64_t sum = 0;
    for (int k = 0; k < KILN_PLAN_PARTS; k++) sum += p.memory[0].parts[k];
    CHECK(sum == p.memory[0].allocated_peak);
    CHECK(p.memory[0].parts[KILN_PLAN_PARAMETERS] >= p.param_count * 4);
    CHECK(p.memory[0].phase[0] != '\0');
    CHECK(p.memory[0].requested_at_peak <= p.memory[0].allocated_peak);
}

static void check_budget(kiln_device dev) {
    char path[1024];
    snprintf(path, sizeof path, "%s/models/tutorial_cnn_28x28x1.txt", KILN_SOURCE_DIR);
    kiln_plan_opts o = kiln_plan_defaults();
    o.model = path;
    o.device = dev;
    o.batch = 128;
    kiln_plan psmall, p128;
    o.batch = 128;
    CHECK_OK(kiln_plan_step(&o, &p128));
    /* A budget that a smaller batch's plan fits and 128's does not: the
     * reserved peak steps with the allocator's segments, so batch 64 may
     * reserve what 128 does (it does with nChw8c activations). */
    for (o.batch = 64; o.batch >= 1; o.batch /= 2) {
        CHECK_OK(kiln_plan_step(&o, &psmall));
        if (psmall.memory[0].reserved_peak < p128.memory[0].reserved_peak) break;
    }
    int64_t budget = psmall.memory[0].reserved_peak;
    CHECK(p128.memory[0].reserved_peak > budget);
    /* The answer fits and the next batch does not (the reserved peak
     * steps with segment sizes, so it need not be the only such batch). */
    int64_t best = 0;
    CHECK_OK(kiln_plan_max_batch(&o, budget, 0, &best));
    CHECK(best >= 1 && best < 128);
    kiln_plan pb, pb1;
    o.batch = best;
    CHECK_OK(kiln_plan_step(&o, &pb));
    CHECK(pb.memory[0].reserved_peak <= budget);
    o.batch = best + 1;
    CHECK_OK(kiln_plan_step(&o, &pb1));
    CHECK(pb1.memory[0].reserved_peak > budget);
    /* Checkpointing: with the planned peak of 2 segments as the budget the
     * answer is at most 2; with 1 byte none fits. */
    o.batch = 128;
    o.checkpoint = 2;
    kiln_plan pc;
    CHECK_OK(kiln_plan_step(&o, &pc));
    o.checkpoint = 0;
    int segs = -2;
    CHECK_OK(kiln_plan_min_checkpoint(&o, pc.memory[0].reserved_peak, &segs));
    CHECK(segs == 0 || segs == 2);
    CHECK_OK(kiln_plan_min_checkpoint(&o, 1, &segs));
    CHECK(segs == -1);
    CHECK_OK(kiln_plan_max_batch(&o, 1, 0, &best));
    CHECK(best == 0);
}

/* The stream's persistent GEMM workspace (cuBLASLt's 32 MiB on an H100,
 * runtime/backend.h stream_workspace_bytes): a CUDA plan holds it from the
 * first step's forward, in the "workspaces" part; a CPU plan never. The
 * override stands in for the real build's workspace in the emulation
 * build, whose backend has none; without it the plan is the backend's. */
static void check_stream_workspace(kiln_device dev) {
    const int64_t ws = (int64_t)24 << 20;
    char path[1024];
    snprintf(path, sizeof path, "%s/models/tutorial_cnn_28x28x1.txt", KILN_SOURCE_DIR);
    kiln_plan_opts o = kiln_plan_defaults();
    o.model = path;
    o.device = dev;
    o.batch = 8;
    kiln_plan none, with, own;
    plan_stream_workspace_override(0);
    CHECK_OK(kiln_plan_step(&o, &none));
    plan_stream_workspace_override(ws);
    CHECK_OK(kiln_plan_step(&o, &with));
    plan_stream_workspace_override(-1);
    CHECK_OK(kiln_plan_step(&o, &own));
    const kiln_plan_memory *a = &none.memory[0], *b = &with.memory[0], *c = &own.memory[0];
    int64_t expect = dev.type == KILN_DEVICE_CUDA ? ws : 0;
    CHECK_EQ_I(b->allocated_peak - a->allocated_peak, expect);
    CHECK_EQ_I(b->reserved_peak - a->reserved_peak, expect);
    CHECK_EQ_I(b->parts[KILN_PLAN_WORKSPACES] - a->parts[KILN_PLAN_WORKSPACES], expect);
    CHECK_EQ_I(b->parts[KILN_PLAN_ACTIVATIONS], a->parts[KILN_PLAN_ACTIVATIONS]);
    /* The pinned pool is the loader's, untouched. */
    CHECK_EQ_I(with.memory[1].allocated_peak, none.memory[1].allocated_peak);
    const kiln_backend *be = kiln_backend_get(dev.type);
    int64_t backend = dev.type == KILN_DEVICE_CUDA && be && be->stream_workspace_bytes
                          ? (int64_t)be->stream_workspace_bytes(dev.index)
                          : 0;
    CHECK_EQ_I((int64_t)plan_stream_workspace_bytes(dev), backend);
    CHECK_EQ_I(c->allocated_peak - a->allocated_peak, backend);
    printf("%s: the stream's GEMM workspace, %.2f MiB from the backend (override %.2f MiB: +%.2f MiB "
           "planned)\n",
           none.memory[0].name, backend / 1048576.0, ws / 1048576.0,
           (b->allocated_peak - a->allocated_peak) / 1048576.0);
}

static void check_refusals(void) {
    kiln_plan p;
    kiln_plan_opts o = kiln_plan_defaults();
    char path[1024];
    snprintf(path, sizeof path, "%s/models/tutorial_cnn_28x28x1.txt", KILN_SOURCE_DIR);
    o.model = path;
    o.batch = 0;
    CHECK(kiln_plan_step(&o, &p) == KILN_ERR_INVALID_ARGUMENT && strstr(kiln_error_message(), "batch 0"));
    o.batch = 8;
    o.checkpoint = 1;
    CHECK(kiln_plan_step(&o, &p) == KILN_ERR_INVALID_ARGUMENT &&
          strstr(kiln_error_message(), "checkpoint 1"));
    o.checkpoint = 0;
    o.device = KILN_META;
    CHECK(kiln_plan_step(&o, &p) == KILN_ERR_INVALID_ARGUMENT && strstr(kiln_error_message(), "device meta"));
    o.device = KILN_CPU;
    o.model = "no_size_here.txt";
    CHECK(kiln_plan_step(&o, &p) == KILN_ERR_INVALID_ARGUMENT &&
          strstr(kiln_error_message(), "no_size_here.txt"));
    int64_t c = 0, h = 0, w = 0;
    CHECK_OK(kiln_plan_input_from_name("models/tutorial_cnn_32x32x3.txt", &c, &h, &w));
    CHECK(c == 3 && h == 32 && w == 32);
    CHECK_OK(kiln_plan_input_from_name("x/resnet_small_cifar10.txt", &c, &h, &w));
    CHECK(c == 3 && h == 32 && w == 32);
}

static const plan_case cpu_cases[] = {
    {"tutorial_cnn_28x28x1.txt", 1, false, 0},   {"tutorial_cnn_28x28x1.txt", 1, false, 2},
    {"tutorial_cnn_28x28x1.txt", 1, true, 0},    {"tutorial_cnn_28x28x1.txt", 1, true, 2},
    {"tutorial_cnn_28x28x1.txt", 32, false, 0},  {"tutorial_cnn_28x28x1.txt", 32, false, 2},
    {"tutorial_cnn_28x28x1.txt", 32, true, 0},   {"tutorial_cnn_28x28x1.txt", 32, true, 2},
    {"tutorial_cnn_28x28x1.txt", 128, false, 0}, {"tutorial_cnn_28x28x1.txt", 128, false, 2},
    {"tutorial_cnn_28x28x1.txt", 128, true, 0},  {"tutorial_cnn_28x28x1.txt", 128, true, 2},
    {"tutorial_cnn_32x32x3.txt", 1, false, 0},   {"tutorial_cnn_32x32x3.txt", 1, false, 2},
    {"tutorial_cnn_32x32x3.txt", 1, true, 0},    {"tutorial_cnn_32x32x3.txt", 1, true, 2},
    {"tutorial_cnn_32x32x3.txt", 32, false, 0},  {"tutorial_cnn_32x32x3.txt", 32, false, 2},
    {"tutorial_cnn_32x32x3.txt", 32, true, 0},   {"tutorial_cnn_32x32x3.txt", 32, true, 2},
    {"tutorial_cnn_32x32x3.txt", 128, false, 0}, {"tutorial_cnn_32x32x3.txt", 128, false, 2},
    {"tutorial_cnn_32x32x3.txt", 128, true, 0},  {"tutorial_cnn_32x32x3.txt", 128, true, 2},
    {"resnet_small_cifar10.txt", 1, false, 0},   {"resnet_small_cifar10.txt", 1, false, 2},
    {"resnet_small_cifar10.txt", 1, true, 0},    {"resnet_small_cifar10.txt", 1, true, 2},
    {"resnet_small_cifar10.txt", 32, false, 0},  {"resnet_small_cifar10.txt", 32, false, 2},
    {"resnet_small_cifar10.txt", 32, true, 2},   {"resnet_small_cifar10.txt", 128, false, 0},
    {"resnet_small_cifar10.txt", 128, false, 2},
    /* The steady state: a second step, Adam's state alive throughout. */
    {"tutorial_cnn_28x28x1.txt", 128, false, 0, 2}, {"tutorial_cnn_32x32x3.txt", 32, true, 0, 2},
    {"resnet_small_cifar10.txt", 32, false, 0, 2},  {"resnet_small_cifar10.txt", 32, false, 2, 2},
};

static const plan_case cuda_cases[] = {
    {"tutorial_cnn_28x28x1.txt", 1, false, 0},   {"tutorial_cnn_28x28x1.txt", 1, true, 2},
    {"tutorial_cnn_28x28x1.txt", 32, false, 0},  {"tutorial_cnn_28x28x1.txt", 32, false, 2},
    {"tutorial_cnn_28x28x1.txt", 32, true, 0},   {"tutorial_cnn_28x28x1.txt", 32, true, 2},
    {"tutorial_cnn_28x28x1.txt", 128, false, 0}, {"tutorial_cnn_28x28x1.txt", 128, true, 2},
    {"tutorial_cnn_32x32x3.txt", 128, true, 2},  {"resnet_small_cifar10.txt", 1, true, 2},
    {"tutorial_cnn_28x28x1.txt", 128, false, 0, 2}, {"tutorial_cnn_28x28x1.txt", 32, true, 2, 2},
};

/* Each case in a process of its own, as kiln train's first step is: in a
 * long-lived process glibc's dynamic mmap threshold moves the CPU
 * segments' addresses from top-down to heap order, and the allocator's
 * lowest-address tie-break then fragments differently (docs/memory.md). */
static int in_child(kiln_device_type type, int which) {
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {
        kt_failed_ = kt_passed_ = 0; /* the child reports its own checks */
        if (kiln_init() != KILN_OK) _exit(1);
        kiln_device dev = type == KILN_DEVICE_CUDA ? KILN_CUDA(0) : KILN_CPU;
        if (which < 0) {
            check_refusals();
            check_budget(dev);
            check_stream_workspace(dev);
        } else {
            run_case(dev, type == KILN_DEVICE_CUDA ? &cuda_cases[which] : &cpu_cases[which]);
        }
        fflush(stdout);
        kiln_shutdown();
        exit(kt_failed_ || failures ? 1 : 0); /* exit: LeakSanitizer checks the child */
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return 1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

int main(void) {
    /* Which device: asked in a child, so that the parent never starts
     * Kiln's threads before forking. */
    pid_t pid = fork();
    if (pid == 0) {
        if (kiln_init() != KILN_OK) _exit(2);
        _exit(kiln_device_count(KILN_DEVICE_CUDA) > 0 ? 1 : 0);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) < 2);
    bool cuda = WIFEXITED(status) && WEXITSTATUS(status) == 1;
    kiln_device_type type = cuda ? KILN_DEVICE_CUDA : KILN_DEVICE_CPU;
    size_t n = cuda ? sizeof cuda_cases / sizeof *cuda_cases : sizeof cpu_cases / sizeof *cpu_cases;
    fflush(stdout);
    CHECK(in_child(type, -1) == 0);
    for (size_t i = 0; i < n; i++) {
        const plan_case *c = cuda ? &cuda_cases[i] : &cpu_cases[i];
        if (SANITIZED && (c->batch == 128 || (c->batch == 32 && strstr(c->model, "resnet")))) continue;
        CHECK_MSG(in_child(type, (int)i) == 0, "case %zu", i);
    }
    return kt_finish();
}

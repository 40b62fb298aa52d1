/* Every allocation may fail: kiln_memory_fail_nth walks a failure over
 * every allocation of
 *   - a first training step (forward, loss, backward, clipping, Adam's
 *     step creating its state), on a fresh model each time;
 *   - a steady-state step of a model that has trained;
 * each on the CPU, then with mixed precision (bf16 autocast on the CPU;
 * f16 with the grad scaler on CUDA) and gradient checkpointing (2
 * segments), and the same on cuda:0 where it exists (the emulation build);
 *   - a safetensors save and load;
 *   - the loader's batch assembly (pinned, no workers and two workers).
 * Each injected failure must come back as an error, KILN_ERR_OUT_OF_MEMORY
 * with the injected message (never a crash, an abort or another status),
 * or be absorbed by a fallback that still succeeds; the library must stay
 * usable (the next step, with allocation restored, succeeds and its loss
 * is finite; after a first step that failed, it is the clean run's first
 * or second loss: nothing was half applied) and every byte the caching allocator handed out must come
 * back (allocated bytes return to the baseline, which on a real GPU holds
 * the stream's persistent cuBLASLt workspace from the first clean step on;
 * LeakSanitizer checks the host side in the ASan tier). Prints the number of injection points. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "optim/optim_internal.h"
#include "runtime/backend.h"
#include "test_util.h"

#include <kiln/kiln.h>

#define BATCH 6

static const char spec[] = "conv 4 k3 p1\nbatchnorm\nrelu\nmaxpool 2\nflatten\nlinear 10\n";

/* How a step runs: where, in which precision, with checkpointing or not. */
typedef struct config {
    const char *name;
    kiln_device device;
    bool amp;         /* bf16 autocast on the CPU, f16 + grad scaler on CUDA */
    int checkpoint;   /* segments, 0: off */
    bool op_by_op;    /* the optimizer's op-by-op path (no fused kernels), as for dtypes they do not cover */
} config;

typedef struct net {
    const config *cfg;
    kiln_module *model;
    kiln_tensor **params;
    int n_params;
    kiln_optimizer *opt;
    kiln_grad_scaler *scaler;
} net;

static bool net_make(net *n, const config *cfg) {
    *n = (net){.cfg = cfg};
    kiln_manual_seed(3);
    if (kiln_model_spec_parse(spec, "faults.txt", 1, 8, 8, &n->model)) return false;
    if (kiln_module_to(n->model, cfg->device)) return false;
    if (cfg->checkpoint && kiln_nn_sequential_set_checkpoint(n->model, cfg->checkpoint)) return false;
    if (kiln_module_parameters(n->model, &n->params, &n->n_params)) return false;
    kiln_adam_opts ao = kiln_adam_defaults();
    ao.lr = 1e-2;
    n->opt = kiln_adam(n->params, n->n_params, &ao);
    if (cfg->amp && cfg->device.type == KILN_DEVICE_CUDA) {
        kiln_grad_scaler_opts so = kiln_grad_scaler_defaults();
        n->scaler = kiln_grad_scaler_create(&so);
        if (!n->scaler) return false;
    }
    return n->opt != NULL;
}

static void net_free(net *n) {
    kiln_grad_scaler_free(n->scaler);
    kiln_optimizer_free(n->opt);
    free(n->params);
    kiln_module_free(n->model);
    *n = (net){0};
}

/* One training step; its status, the loss in *loss when it succeeded. */
static kiln_status step(net *n, kiln_tensor *x, kiln_tensor *y, double *loss) {
    const config *c = n->cfg;
    kiln_status st = KILN_OK;
    kiln_scope_begin();
    if (c->amp) st = kiln_autocast_begin(c->device.type, c->device.type == KILN_DEVICE_CUDA ? KILN_F16 : KILN_BF16);
    kiln_tensor *logits = st ? NULL : kiln_module_forward(n->model, x);
    kiln_loss_opts lo = kiln_loss_defaults();
    kiln_tensor *l = logits ? kiln_cross_entropy(logits, y, &lo) : NULL;
    if (c->amp && !st) {
        kiln_status end = kiln_autocast_end();
        if (!st && end) st = end;
    }
    if (!st && !l) st = kiln_error_last()->status;
    if (!st) st = kiln_optimizer_zero_grad(n->opt, true);
    if (n->scaler) {
        kiln_tensor *scaled = st ? NULL : kiln_grad_scaler_scale(n->scaler, l);
        if (!st && !scaled) st = kiln_error_last()->status;
        if (!st) st = kiln_backward(scaled, NULL, false);
        if (!st) st = kiln_grad_scaler_unscale_(n->scaler, n->opt);
    } else if (!st) {
        st = kiln_backward(l, NULL, false);
    }
    if (!st && kiln_clip_grad_norm(n->params, n->n_params, 5.0, 2.0) < 0) st = kiln_error_last()->status;
    if (n->scaler) {
        bool stepped;
        if (!st) st = kiln_grad_scaler_step(n->scaler, n->opt, &stepped);
        if (!st) st = kiln_grad_scaler_update(n->scaler);
    } else if (!st) {
        st = kiln_optimizer_step(n->opt);
    }
    if (!st) st = kiln_item(l, loss);
    /* A failed iteration is abandoned: the retry unscales afresh. */
    if (st) kiln_grad_scaler_abandon_step(n->scaler);
    kiln_scope_end();
    return st;
}

/* The outcome of one injected failure: an error of the right kind, or a
 * success a fallback made; anything else is a failure of the test. */
static int check_outcome(kiln_status st, const char *what, int64_t at) {
    if (st == KILN_OK) return 0;
    CHECK_MSG(st == KILN_ERR_OUT_OF_MEMORY, "%s, allocation %lld: %s (%s), wanted out-of-memory", what,
              (long long)at, kiln_status_name(st), kiln_error_message());
    CHECK_MSG(strstr(kiln_error_message(), "out of memory") != NULL, "%s, allocation %lld: message '%s'",
              what, (long long)at, kiln_error_message());
    return 1;
}

/* One injection: allocation i of a step fails; the outcome is checked and
 * the next step, with allocation restored, must succeed with a finite
 * loss. A failed step is undone as kiln train undoes it (the model's
 * snapshot put back: BatchNorm's running statistics). With clean[0] and
 * clean[1] given (the first walk: the losses of a clean run's first two
 * steps), the next step's loss must be one of them: the failed step took
 * no effect, or took all of it (a failure after the optimizer step), never
 * part (the optimizer's step is all or nothing). Returns 1 when the failure
 * came back as an error. */
static int fail_then_recover(net *n, kiln_tensor *x, kiln_tensor *y, const char *phase, int64_t i,
                             const double *clean) {
    double loss = 0, after = NAN;
    kiln_step_snapshot *snap = kiln_step_snapshot_take(n->model);
    CHECK_MSG(snap != NULL, "snapshot: %s", kiln_error_message());
    kiln_memory_fail_nth(i);
    kiln_status st = step(n, x, y, &loss);
    kiln_memory_fail_nth(-1);
    int error = check_outcome(st, n->cfg->name, i);
    if (st && snap) CHECK_OK(kiln_step_snapshot_restore(snap));
    kiln_step_snapshot_free(snap);
    CHECK_MSG(step(n, x, y, &after) == KILN_OK, "%s %s, allocation %lld: the next step failed: %s", n->cfg->name,
              phase, (long long)i, kiln_error_message());
    CHECK_MSG(isfinite(after), "%s %s, allocation %lld: next loss %g", n->cfg->name, phase, (long long)i, after);
    if (clean) {
        bool none = fabs(after - clean[0]) <= 1e-5 * fabs(clean[0]), all = fabs(after - clean[1]) <= 1e-5 * fabs(clean[1]);
        CHECK_MSG(st ? (none || all) : all,
                  "%s %s, allocation %lld (%s): the next loss %.9g is neither the clean first step's %.9g nor its "
                  "second's %.9g: the failed step was half applied",
                  n->cfg->name, phase, (long long)i, st ? "failed" : "absorbed", after, clean[0], clean[1]);
    }
    return error;
}

/* What a device's first GEMM makes for good: the compute stream's cuBLASLt
 * workspace (runtime/backend.h stream_workspace_bytes), persistent per
 * stream and counted as allocated, as PyTorch counts cuBLAS's workspaces
 * (docs/memory.md). None on the CPU, in the emulation build, or with
 * KILN_CUDA_KERNELS=reference. */
static size_t stream_workspace(kiln_device d) {
    const kiln_backend *be = kiln_backend_get(d.type);
    return d.type == KILN_DEVICE_CUDA && be && be->stream_workspace_bytes
               ? be->stream_workspace_bytes(d.index)
               : 0;
}
static bool workspace_made[KILN_DEVICE_TYPE_COUNT];

static void test_first_step(const config *cfg, kiln_tensor *x, kiln_tensor *y) {
    size_t start = kiln_memory_allocated(cfg->device);
    net n;
    CHECK(net_make(&n, cfg));
    double clean[2] = {0, 0};
    kiln_memory_fail_nth(-1);
    CHECK_OK(step(&n, x, y, &clean[0]));
    int64_t count = kiln_memory_alloc_count();
    CHECK_OK(step(&n, x, y, &clean[1]));
    net_free(&n);
    /* The baseline: every byte back but the stream's workspace, which the
     * device's first clean step made (the model's linear layer is a GEMM). */
    size_t base = kiln_memory_allocated(cfg->device);
    size_t held = workspace_made[cfg->device.type] ? 0 : stream_workspace(cfg->device);
    workspace_made[cfg->device.type] = true;
    CHECK_MSG(base == start + held,
              "%s: %zu bytes still allocated after the clean steps, %zu before (%zu of the stream's GEMM "
              "workspace expected)",
              cfg->name, base, start, held);
    CHECK_MSG(count > 10, "a first step made only %lld allocations", (long long)count);
    int errors = 0;
    for (int64_t i = 0; i < count; i++) {
        net m;
        if (!net_make(&m, cfg)) {
            CHECK_MSG(false, "model setup failed: %s", kiln_error_message());
            break;
        }
        errors += fail_then_recover(&m, x, y, "first step", i, clean);
        net_free(&m);
        CHECK_MSG(kiln_memory_allocated(cfg->device) == base,
                  "%s first step, allocation %lld: %zu bytes still allocated after freeing everything (base %zu)",
                  cfg->name, (long long)i, kiln_memory_allocated(cfg->device), base);
    }
    printf("%s, first step: %lld injection points, %d errors, %lld absorbed\n", cfg->name, (long long)count, errors,
           (long long)count - errors);
}

static void test_steady_state(const config *cfg, kiln_tensor *x, kiln_tensor *y) {
    size_t base = kiln_memory_allocated(cfg->device);
    net n;
    CHECK(net_make(&n, cfg));
    double loss = 0;
    CHECK_OK(step(&n, x, y, &loss));
    CHECK_OK(step(&n, x, y, &loss));
    size_t trained = kiln_memory_allocated(cfg->device);
    kiln_memory_fail_nth(-1);
    CHECK_OK(step(&n, x, y, &loss));
    int64_t count = kiln_memory_alloc_count();
    int errors = 0;
    for (int64_t i = 0; i < count; i++) {
        errors += fail_then_recover(&n, x, y, "steady step", i, NULL);
        CHECK_MSG(kiln_memory_allocated(cfg->device) == trained,
                  "%s steady step, allocation %lld: %zu bytes allocated between steps, %zu before", cfg->name,
                  (long long)i, kiln_memory_allocated(cfg->device), trained);
    }
    net_free(&n);
    CHECK_EQ_I((int64_t)kiln_memory_allocated(cfg->device), (int64_t)base);
    printf("%s, steady step: %lld injection points, %d errors\n", cfg->name, (long long)count, errors);
}

/* Walk a failure over every allocation of fn(path, model); returns the
 * number of injection points. */
static int64_t walk_io(const char *what, kiln_status (*fn)(const char *, kiln_module *), const char *path,
                       kiln_module *m) {
    size_t base = kiln_memory_allocated(KILN_CPU);
    kiln_memory_fail_nth(-1);
    CHECK_OK(fn(path, m));
    int64_t points = kiln_memory_alloc_count();
    for (int64_t i = 0; i < points; i++) {
        kiln_memory_fail_nth(i);
        kiln_status st = fn(path, m);
        kiln_memory_fail_nth(-1);
        check_outcome(st, what, i);
        CHECK_EQ_I((int64_t)kiln_memory_allocated(KILN_CPU), (int64_t)base);
    }
    return points;
}

static void test_safetensors(void) {
    char path[] = "/tmp/kiln_faults_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    close(fd);
    static const config cpu = {"cpu", {KILN_DEVICE_CPU, 0}, false, 0};
    net n;
    CHECK(net_make(&n, &cpu));
    int64_t saves = walk_io("safetensors save", kiln_safetensors_save, path, n.model);
    CHECK_OK(kiln_safetensors_save(path, n.model));
    int64_t loads = walk_io("safetensors load", kiln_safetensors_load, path, n.model);
    /* The file a failed save left is still the last good one. */
    CHECK_OK(kiln_safetensors_load(path, n.model));
    net_free(&n);
    unlink(path);
    printf("safetensors: %lld save and %lld load injection points\n", (long long)saves, (long long)loads);
}

static void test_loader(kiln_tensor *x, kiln_tensor *y, int workers) {
    kiln_dataset *ds = NULL;
    CHECK_OK(kiln_dataset_from_tensors(x, y, 10, &ds));
    if (!ds) return;
    kiln_loader_opts o = kiln_loader_opts_default();
    o.batch_size = 4;
    o.shuffle = true;
    o.pin_memory = true;
    o.num_workers = workers;
    int64_t points = 0;
    for (int64_t i = -1; i < points || i < 0; i++) {
        kiln_loader *ld = NULL;
        CHECK_OK(kiln_loader_create(ds, &o, &ld));
        if (!ld) break;
        CHECK_OK(kiln_loader_epoch_begin(ld, 0));
        kiln_memory_fail_nth(i);
        kiln_status st = KILN_OK;
        int batches = 0;
        for (;;) {
            kiln_tensor *bx = NULL, *by = NULL;
            st = kiln_loader_next(ld, &bx, &by);
            if (st || !bx) break;
            batches++;
            kiln_release(bx);
            kiln_release(by);
        }
        if (i < 0) {
            points = kiln_memory_alloc_count();
            CHECK_OK(st);
            CHECK_EQ_I(batches, 2);
        } else {
            check_outcome(st, "loader batch", i);
        }
        kiln_memory_fail_nth(-1);
        /* A failed batch leaves the loader usable: the next epoch runs whole. */
        CHECK_OK(kiln_loader_epoch_begin(ld, 1));
        int again = 0;
        for (;;) {
            kiln_tensor *bx = NULL, *by = NULL;
            kiln_status s2 = kiln_loader_next(ld, &bx, &by);
            CHECK_MSG(s2 == KILN_OK, "loader (%d workers), allocation %lld: the next epoch failed: %s", workers,
                      (long long)i, kiln_error_message());
            if (s2 || !bx) break;
            again++;
            kiln_release(bx);
            kiln_release(by);
        }
        CHECK_EQ_I(again, 2);
        kiln_loader_free(ld);
    }
    kiln_dataset_free(ds);
    printf("loader (%d workers, pinned): %lld injection points\n", workers, (long long)points);
}

/* The walks of one configuration, on x and y moved to its device. */
static void walk(const config *cfg, kiln_tensor *x, kiln_tensor *y) {
    kiln_optim_use_fused(!cfg->op_by_op);
    kiln_scope_begin();
    kiln_tensor *dx = kiln_to(x, cfg->device, KILN_F32, 0), *dy = kiln_to(y, cfg->device, KILN_I64, 0);
    CHECK_MSG(dx && dy, "%s: %s", cfg->name, kiln_error_message());
    if (dx && dy) {
        test_first_step(cfg, dx, dy);
        test_steady_state(cfg, dx, dy);
    }
    kiln_scope_end();
    kiln_optim_use_fused(true);
}

int main(void) {
    CHECK_OK(kiln_init());
    kiln_manual_seed(1);
    kiln_tensor *x = kiln_randn(KILN_SHAPE(BATCH, 1, 8, 8), KILN_F32, KILN_CPU);
    int64_t labels[BATCH] = {0, 3, 5, 9, 1, 3};
    kiln_tensor *y = kiln_from_data(KILN_SHAPE(BATCH), KILN_I64, KILN_CPU, labels);
    CHECK(x && y);
    if (x && y) {
        const config configs[] = {
            {"cpu", {KILN_DEVICE_CPU, 0}, false, 0},
            {"cpu bf16 autocast + checkpointing", {KILN_DEVICE_CPU, 0}, true, 2},
            {"cpu, the optimizer op by op", {KILN_DEVICE_CPU, 0}, false, 0, true},
            {"cuda:0", {KILN_DEVICE_CUDA, 0}, false, 0},
            {"cuda:0 f16 + scaler + checkpointing", {KILN_DEVICE_CUDA, 0}, true, 2},
        };
        for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
            if (!kiln_device_is_available(configs[i].device)) {
                printf("%s: no such device in this build (the emulation tier walks it)\n", configs[i].name);
                continue;
            }
            walk(&configs[i], x, y);
        }
        test_safetensors();
        kiln_tensor *lx = kiln_randn(KILN_SHAPE(8, 1, 8, 8), KILN_F32, KILN_CPU);
        int64_t l8[8] = {0, 1, 2, 3, 4, 5, 6, 7};
        kiln_tensor *ly = kiln_from_data(KILN_SHAPE(8), KILN_I64, KILN_CPU, l8);
        test_loader(lx, ly, 0);
        test_loader(lx, ly, 2);
        kiln_release(lx);
        kiln_release(ly);
    }
    kiln_release(x);
    kiln_release(y);
    kiln_shutdown();
    return kt_finish();
}

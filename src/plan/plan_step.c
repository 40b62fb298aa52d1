/* The step a plan models and a measurement runs (include/kiln/plan.h): one
 * function for both, so the plan and the step it is held against are the
 * same library calls in the same order as kiln train's first step
 * (tools/train.c train_step, tools/train_amp.c, tools/train_oom.c). Only the
 * batch differs: a measurement takes it from kiln train's loader (pinned, 0
 * workers) over a dataset of zeros; a plan allocates what that loader
 * allocates (plan_batch). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "optim/optim_internal.h"
#include "plan/plan_internal.h"
#include "runtime/backend.h"
#include "runtime/runtime_internal.h"
#include "tensor/tensor_internal.h"

kiln_status plan_addrs_add(plan_addrs *s, const kiln_tensor *t) {
    if (!t || !t->storage || !t->storage->base) return KILN_OK;
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 64;
        uintptr_t *a = KILN_REALLOC(s->a, (size_t)cap * sizeof *a);
        if (!a) return KILN_ERR_OUT_OF_MEMORY;
        s->a = a, s->cap = cap;
    }
    s->a[s->n++] = (uintptr_t)t->storage->base;
    return KILN_OK;
}

void plan_addrs_free(plan_addrs *s) {
    free(s->a);
    *s = (plan_addrs){0};
}

kiln_status plan_load_model(const kiln_plan_opts *o, kiln_module **out) {
    if (o->model_text) return kiln_model_spec_parse(o->model_text, o->model, o->channels, o->height, o->width, out);
    return kiln_model_spec_load(o->model, o->channels, o->height, o->width, out);
}

/* Everything one step needs, made before it. */
typedef struct step_ctx {
    const kiln_plan_opts *o;
    bool measure;
    kiln_device dev; /* where it runs: meta for a plan */
    kiln_module *model;
    kiln_optimizer *opt;
    kiln_grad_scaler *scaler;
    kiln_step_snapshot *snapshot;
    kiln_dataset *data;
    kiln_loader *loader;
    /* a plan's batch: the simulated pinned pool, the CPU batch's own meta
     * stream, the CUDA loader's copy stream */
    kiln_raw_ops pinned_ops;
    kiln_caching_allocator *pinned;
    kiln_stream *side_stream;
    void *pinned_x, *pinned_y; /* the plan's batch in the pinned pool */
    void *gemm_workspace;      /* the plan's stream's GEMM workspace on meta */
} step_ctx;

static int64_t workspace_override = -1;

void plan_stream_workspace_override(int64_t bytes) { workspace_override = bytes < 0 ? -1 : bytes; }

size_t plan_stream_workspace_bytes(kiln_device device) {
    if (device.type != KILN_DEVICE_CUDA) return 0;
    if (workspace_override >= 0) return (size_t)workspace_override;
    const kiln_backend *be = kiln_backend_get(device.type);
    return be && be->stream_workspace_bytes ? be->stream_workspace_bytes(device.index) : 0;
}

/* The compute stream's persistent GEMM workspace (cuBLASLt's), made where
 * the real step makes it: at the first step's first GEMM, in its forward
 * (a block of its own: no earlier free block is that large), and held
 * from then on. A measurement needs nothing here: the device makes it. */
static kiln_status plan_gemm_workspace(step_ctx *c) {
    size_t bytes = plan_stream_workspace_bytes(c->o->device);
    if (!bytes || c->measure) return KILN_OK;
    plan_phase_set(PLAN_PHASE_STEP);
    plan_library_workspace_set(true);
    kiln_status st = kiln_memory_alloc(c->dev, bytes, NULL, &c->gemm_workspace);
    plan_library_workspace_set(false);
    return st;
}

/* A dataset of zeros labelled 0: the batch's memory is all a measurement
 * needs, and zeros keep the first f16 step finite, so Adam's state is
 * created as in the plan. */
static int64_t zeros_length(void *ctx) { return *(int64_t *)ctx; }
static kiln_status zeros_get(void *ctx, int64_t index, void *dst, int64_t *label) {
    (void)index;
    int64_t *n = ctx;
    memset(dst, 0, (size_t)n[1]);
    *label = 0;
    return KILN_OK;
}
static void zeros_free(void *ctx) { free(ctx); }

static kiln_status make_loader(step_ctx *c) {
    const kiln_plan_opts *o = c->o;
    int64_t *ctx = KILN_MALLOC(2 * sizeof *ctx);
    if (!ctx) return KILN_ERR_OUT_OF_MEMORY;
    /* Two batches, as in an epoch whose step is not its last. */
    ctx[0] = 2 * o->batch, ctx[1] = o->channels * o->height * o->width;
    kiln_sample_info info = {KILN_U8, (int)o->channels, (int)o->height, (int)o->width, 10};
    static const kiln_dataset_ops ops = {zeros_length, zeros_get, zeros_free};
    kiln_status st = kiln_dataset_create(&ops, ctx, info, &c->data);
    if (st) {
        free(ctx);
        return st;
    }
    kiln_loader_opts lo = kiln_loader_opts_default();
    lo.batch_size = o->batch;
    lo.num_workers = 0;
    lo.pin_memory = true;
    lo.device = o->device;
    KILN_TRY(kiln_loader_create(c->data, &lo, &c->loader));
    return kiln_loader_epoch_begin(c->loader, 0);
}

static kiln_status setup(step_ctx *c) {
    const kiln_plan_opts *o = c->o;
    plan_phase_set(PLAN_PHASE_SETUP);
    KILN_TRY(kiln_set_device(c->dev));
    KILN_TRY(plan_load_model(o, &c->model));
    if (o->checkpoint > 0) {
        kiln_tensor *sample = kiln_zeros(KILN_SHAPE(2, o->channels, o->height, o->width), KILN_F32, c->dev);
        if (!sample) return kiln_error_last()->status;
        kiln_status st = kiln_nn_sequential_checkpoint_by_memory(c->model, sample, o->checkpoint, NULL);
        kiln_release(sample);
        KILN_TRY(st);
    }
    kiln_tensor **params = NULL;
    int np = 0;
    KILN_TRY(kiln_module_parameters(c->model, &params, &np));
    kiln_adam_opts ao = kiln_adam_defaults();
    c->opt = kiln_adam(params, np, &ao);
    free(params);
    if (!c->opt) return kiln_error_last()->status;
    if (o->amp != KILN_F32) {
        kiln_grad_scaler_opts so = kiln_grad_scaler_defaults();
        so.enabled = o->amp == KILN_F16; /* bf16 has f32's range: no loss scaling */
        if (!(c->scaler = kiln_grad_scaler_create(&so))) return kiln_error_last()->status;
    }
    /* kiln train's out-of-memory recovery snapshot (copies of the buffers). */
    if (!(c->snapshot = kiln_step_snapshot_take(c->model))) return kiln_error_last()->status;
    if (c->measure) return make_loader(c);
    c->pinned_ops = kiln_simulated_raw_ops((size_t)1 << 40, "pinned host");
    kiln_alloc_config cfg = kiln_alloc_config_default();
    if (!(c->pinned = kiln_caching_allocator_create(&c->pinned_ops, &cfg))) return kiln_error_last()->status;
    return kiln_stream_create(c->dev, 0, &c->side_stream);
}

static void teardown(step_ctx *c) {
    if (c->gemm_workspace && kiln_memory_free(c->dev, c->gemm_workspace)) kiln_error_clear();
    kiln_loader_free(c->loader);
    kiln_dataset_free(c->data);
    kiln_step_snapshot_free(c->snapshot);
    kiln_grad_scaler_free(c->scaler);
    kiln_optimizer_free(c->opt);
    kiln_module_free(c->model);
    if (c->side_stream) kiln_stream_destroy(c->side_stream);
    if (c->pinned) kiln_caching_allocator_destroy(c->pinned);
    kiln_simulated_raw_ops_destroy(&c->pinned_ops);
}

/* One batch (x, y) on meta on `stream`, recorded on the compute stream. */
static kiln_status meta_batch(step_ctx *c, kiln_stream *stream, kiln_tensor **x, kiln_tensor **y) {
    const kiln_plan_opts *o = c->o;
    kiln_stream_guard g = kiln_stream_guard_begin(stream);
    *x = kiln_empty(KILN_SHAPE(o->batch, o->channels, o->height, o->width), KILN_F32, c->dev);
    *y = *x ? kiln_empty(KILN_SHAPE(o->batch), KILN_I64, c->dev) : NULL;
    kiln_stream_guard_end(&g);
    if (!*y) return kiln_error_last()->status;
    kiln_stream *compute = kiln_current_stream(c->dev);
    KILN_TRY(kiln_record_stream(*x, compute));
    return kiln_record_stream(*y, compute);
}

/* What kiln train's loader allocates for a batch (src/data/loader.c,
 * prefetch.c), 0 workers: one pinned buffer pair (x f32, y i64); on CUDA
 * the device copy of the batch, made on the copy stream. (With 0 workers
 * the prefetcher stages the next batch only when it is already made, which
 * it never is: making it would block. With workers it may be: up to one
 * more device batch.) On the CPU the step reads the pinned buffer itself: a batch on
 * a meta stream of its own stands for it (its blocks never share the
 * device's pools and are left out of the device's numbers). */
static kiln_status plan_batch(step_ctx *c, plan_sets *sets, kiln_tensor **x, kiln_tensor **y) {
    const kiln_plan_opts *o = c->o;
    size_t xb = (size_t)(o->batch * o->channels * o->height * o->width) * sizeof(float);
    size_t yb = (size_t)o->batch * sizeof(int64_t);
    kiln_alloc_stream host = 0;
    /* The batch before (steps 2) is done with: its buffers go back. */
    if (c->pinned_x) KILN_TRY(kiln_caching_allocator_free(c->pinned, c->pinned_x));
    if (c->pinned_y) KILN_TRY(kiln_caching_allocator_free(c->pinned, c->pinned_y));
    c->pinned_x = c->pinned_y = NULL;
    KILN_TRY(kiln_caching_allocator_malloc(c->pinned, xb, host, &c->pinned_x));
    KILN_TRY(kiln_caching_allocator_malloc(c->pinned, yb, host, &c->pinned_y));
    KILN_TRY(meta_batch(c, c->side_stream, x, y));
    if (o->device.type == KILN_DEVICE_CPU) sets->batch_stream = kiln_stream_id(c->side_stream);
    KILN_TRY(plan_addrs_add(&sets->batch, *x));
    return plan_addrs_add(&sets->batch, *y);
}

/* zero_grad, forward and backward over the micro-batches, the optimizer
 * step: tools/train.c train_step with train_oom_backward and train_amp_*. */
static kiln_status train_step(step_ctx *c, kiln_tensor *x, kiln_tensor *y) {
    const kiln_plan_opts *o = c->o;
    plan_phase_set(PLAN_PHASE_STEP);
    KILN_TRY(kiln_optimizer_zero_grad(c->opt, true));
    KILN_TRY(kiln_step_snapshot_retake(c->snapshot));
    kiln_tensor *loss = NULL, *hits = NULL;
    kiln_loss_opts lo = kiln_loss_defaults();
    int accum = o->accum < 1 ? 1 : o->accum;
    kiln_status st;
    if (o->amp == KILN_F32) {
        st = kiln_accumulate_backward(c->model, x, y, accum, &lo, &loss, &hits);
    } else {
        KILN_TRY(kiln_autocast_begin(c->dev.type, o->amp));
        st = kiln_accumulate_backward_scaled(c->model, x, y, accum, &lo, c->scaler, &loss, &hits);
        kiln_status end = kiln_autocast_end();
        if (!st) st = end;
    }
    plan_phase_set(PLAN_PHASE_OPTIMIZER);
    if (!st && !c->scaler) st = kiln_optimizer_step(c->opt);
    bool stepped = false;
    if (!st && c->scaler) st = kiln_grad_scaler_step(c->scaler, c->opt, &stepped);
    if (!st && c->scaler && kiln_grad_scaler_options(c->scaler)->enabled)
        st = kiln_grad_scaler_update(c->scaler);
    /* The scaler's step reads its inf flag with kiln_item, which on a CUDA
     * device stages the value through a 16-byte pinned block. */
    if (!st && !c->measure && c->scaler && kiln_grad_scaler_options(c->scaler)->enabled &&
        o->device.type == KILN_DEVICE_CUDA) {
        void *flag = NULL;
        st = kiln_caching_allocator_malloc(c->pinned, 16, 0, &flag);
        if (!st) st = kiln_caching_allocator_free(c->pinned, flag);
    }
    if (!st && c->scaler && !stepped)
        st = KILN_RAISE(KILN_ERR_STATE, "report it: the measured step's zeros should give finite gradients",
                        "kiln_plan_measure: the grad scaler skipped the step (inf/NaN gradients), so Adam's "
                        "state was not created");
    return st;
}

/* The step's peaks on `a` since its peak was reset. */
static void read_peaks(kiln_caching_allocator *a, kiln_plan_memory *m) {
    kiln_memory_stats s;
    kiln_caching_allocator_stats(a, &s);
    m->allocated_peak = s.allocated_bytes[KILN_POOL_ALL].peak;
    m->reserved_peak = s.reserved_bytes[KILN_POOL_ALL].peak;
}

static kiln_status collect_sets(step_ctx *c, plan_sets *sets) {
    kiln_optimizer *opt = c->opt;
    for (int i = 0; i < opt->n; i++) {
        kiln_tensor *g = kiln_grad(opt->params[i]);
        kiln_status st = plan_addrs_add(&sets->grads, g);
        kiln_release(g);
        KILN_TRY(st);
        for (int k = 0; k < KILN_OPTIM_STATES; k++)
            if (opt->state[k]) KILN_TRY(plan_addrs_add(&sets->optimizer_state, opt->state[k][i]));
    }
    return KILN_OK;
}

static kiln_status run_step(step_ctx *c, plan_sets *sets, kiln_plan *out) {
    KILN_TRY(setup(c));
    for (int i = 0; i < c->opt->n; i++) out->param_count += kiln_numel(c->opt->params[i]);
    kiln_caching_allocator *dev_alloc = kiln_device_allocator(c->dev);
    kiln_caching_allocator *pinned = c->measure ? kiln_pinned_allocator() : c->pinned;
    if (!dev_alloc || !pinned) return kiln_error_last()->status;
    KILN_TRY(kiln_device_synchronize(c->dev));
    KILN_TRY(kiln_empty_cache(c->dev));
    KILN_TRY(kiln_caching_allocator_empty_cache(pinned));
    KILN_TRY(kiln_memory_reset_peak(c->dev));
    kiln_caching_allocator_reset_peak(pinned);
    kiln_scope_begin();
    kiln_tensor *x = NULL, *y = NULL;
    kiln_status st = KILN_OK;
    int steps = c->o->steps > 1 ? c->o->steps : 1;
    for (int i = 0; i < steps && !st; i++) {
        if (i) { /* the batch of the step before goes back, as kiln train's scope ends it */
            kiln_release(x);
            kiln_release(y);
            x = y = NULL;
            plan_addrs_free(&sets->batch);
        }
        plan_phase_set(PLAN_PHASE_BATCH);
        st = c->measure ? kiln_loader_next(c->loader, &x, &y) : plan_batch(c, sets, &x, &y);
        if (!st && i == 0) st = plan_gemm_workspace(c);
        if (!st) st = train_step(c, x, y);
        if (!st) st = kiln_device_synchronize(c->dev);
    }
    if (!st && !c->measure) st = collect_sets(c, sets);
    if (!st) {
        read_peaks(dev_alloc, &out->memory[0]);
        read_peaks(pinned, &out->memory[1]);
    }
    /* Read while the gradients, Adam's state and the batch are alive. */
    if (!st && !c->measure) st = plan_breakdown_read(sets, sets->batch_stream, &out->memory[0]);
    kiln_release(x);
    kiln_release(y);
    kiln_scope_end();
    plan_phase_set(PLAN_PHASE_SETUP);
    return st;
}

kiln_status plan_run(const kiln_plan_opts *o, bool measure, kiln_plan *out) {
    step_ctx c = {.o = o, .measure = measure, .dev = measure ? o->device : KILN_META};
    plan_sets sets = {0};
    kiln_device saved = kiln_current_device();
    kiln_rng_positions rng;
    kiln_device_rng_save(&rng);
    kiln_device_type saved_kernels = kiln_meta_kernels();
    int saved_index = kiln_meta_kernels_index();
    kiln_status st = KILN_OK;
    /* The planner's meta allocator simulates the device's address range:
     * a limit set for every allocator (KILN_ALLOC_CONF=limit_mb) is the
     * device's to meet, not the plan's; put back afterwards. */
    kiln_memory_stats meta_stats;
    uint64_t meta_limit = 0;
    if (!measure && kiln_memory_stats_get(KILN_META, &meta_stats) == KILN_OK) meta_limit = meta_stats.limit_bytes;
    if (!measure && meta_limit) st = kiln_memory_set_limit(KILN_META, 0);
    if (!st && !measure) {
        kiln_meta_kernels_set(o->device.type);
        kiln_meta_kernels_set_index(o->device.index);
        st = kiln_empty_cache(KILN_META);
        if (!st) st = plan_breakdown_begin();
    }
    if (!st) st = run_step(&c, &sets, out);
    teardown(&c);
    if (!measure) {
        plan_breakdown_end();
        kiln_meta_kernels_set(saved_kernels);
        kiln_meta_kernels_set_index(saved_index);
        if (!st) st = kiln_empty_cache(KILN_META);
        /* The pinned pool's parts: the batch's buffers, all of it. */
        out->memory[1].requested_at_peak = out->memory[1].allocated_peak;
        out->memory[1].parts[KILN_PLAN_BATCH] = out->memory[1].allocated_peak;
        snprintf(out->memory[1].phase, sizeof out->memory[1].phase, "batch");
    }
    if (meta_limit) {
        kiln_status lim = kiln_memory_set_limit(KILN_META, (size_t)meta_limit);
        if (!st) st = lim;
    }
    plan_phase_set(PLAN_PHASE_NONE);
    plan_addrs_free(&sets.grads);
    plan_addrs_free(&sets.optimizer_state);
    plan_addrs_free(&sets.batch);
    kiln_device_rng_restore(&rng);
    kiln_set_device(saved);
    return st;
}

/* The dispatcher: every op call goes through kiln_dispatch.
 *
 *   validate -> hooks begin (profiler, autocast, autograd, anomaly) ->
 *   infer shapes and dtypes -> cast inputs to the dtypes inference asked
 *   for (as CAST ops, so gradients flow through the casts) -> allocate
 *   outputs and workspace on the current stream -> run the device's kernel
 *   -> hooks end (innermost first: autograd records the node here).
 *
 * The dispatcher runs at API depth >= 1, so the public functions it and the
 * hooks call never register with the user's scope. */
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "base/nvtx.h"
#include "kiln/autograd.h"
#include "ops/op_registry.h"
#include "runtime/counters.h"
#include "runtime/runtime_internal.h"
#include "tensor/scope.h"
#include "tensor/tensor_internal.h"

static kiln_dispatch_hook hooks[KILN_HOOK_KIND_COUNT];
static kiln_op_observer observer;
/* The innermost op this thread is dispatching (the memory history's op). */
static _Thread_local const char *current_op;
static _Thread_local const kiln_dispatch_recorder *recorder;

const kiln_dispatch_recorder *kiln_dispatch_set_recorder(const kiln_dispatch_recorder *r) {
    const kiln_dispatch_recorder *old = recorder;
    recorder = r;
    return old;
}

const char *kiln_dispatch_current_op(void) { return current_op; }

/* What the dispatcher is allocating besides outputs, for the memory
 * history's context (kiln_plan's breakdown). */
static _Thread_local kiln_dispatch_alloc_kind alloc_kind;

kiln_dispatch_alloc_kind kiln_dispatch_allocating(void) { return alloc_kind; }

void kiln_dispatch_set_observer(const kiln_op_observer *o) {
    if (o) observer = *o;
    else memset(&observer, 0, sizeof observer);
}

void kiln_dispatch_range_push(const char *name) {
    if (observer.range_push) observer.range_push(name);
}

void kiln_dispatch_range_pop(void) {
    if (observer.range_pop) observer.range_pop();
}

void kiln_dispatch_set_hook(kiln_hook_kind kind, const kiln_dispatch_hook *hook) {
    if ((unsigned)kind >= KILN_HOOK_KIND_COUNT) return;
    if (hook) hooks[kind] = *hook;
    else memset(&hooks[kind], 0, sizeof hooks[kind]);
}

static bool optional_input(const kiln_op_info *info, int i) {
    return (info->flags & OPF_VARIADIC) || (i >= 1 && i <= 4 && (info->flags & OPF_OPTIONAL(i)));
}

static kiln_status check_inputs(kiln_op_call *c, kiln_device creation_device) {
    const kiln_op_info *info = c->info;
    char fn[64];
    snprintf(fn, sizeof fn, "kiln_%s", info->name);
    if (info->flags & OPF_VARIADIC ? (c->n_in < 1 || c->n_in > info->n_in) : c->n_in != info->n_in)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "%s: %d inputs given, expected %s%d", fn, c->n_in,
                          info->flags & OPF_VARIADIC ? "1 to " : "", info->n_in);
    bool have_device = false;
    int first = -1;
    for (int i = 0; i < c->n_in; i++) {
        kiln_tensor *t = c->in[i];
        if (!t) {
            if (optional_input(info, i) && !(info->flags & OPF_VARIADIC)) continue;
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass a tensor", "%s: input %d is NULL", fn, i);
        }
        KILN_TRY(kiln_tensor_check(t, fn));
        kiln_device d = kiln_get_device(t);
        if (!have_device) {
            c->device = d, have_device = true, first = i;
        } else if (!kiln_device_equal(d, c->device)) {
            char a[32], b[32];
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "move them to one device with kiln_to",
                              "%s: input %d is on %s but input %d is on %s", fn, first,
                              kiln_device_str(c->device, a, sizeof a), i, kiln_device_str(d, b, sizeof b));
        }
    }
    if (!have_device) {
        if (!(info->flags & OPF_CREATION))
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "%s: no input tensor given", fn);
        if (!kiln_backend_for(creation_device)) return kiln_error_last()->status;
        c->device = creation_device;
    }
    return KILN_OK;
}

/* An input viewed with the output's shape: broadcast dims get stride 0. */
static kiln_strided broadcast_view(const kiln_tensor *t, const kiln_meta *out) {
    kiln_strided s = kiln_tensor_kernel_view(t);
    if (s.layout != KILN_LAYOUT_STRIDED) return s; /* only kernels that take it, same shape */
    kiln_strided b = s;
    b.ndim = out->ndim;
    int lead = out->ndim - s.ndim;
    for (int i = 0; i < out->ndim; i++) {
        b.shape[i] = out->shape[i];
        b.strides[i] = (i < lead || s.shape[i - lead] != out->shape[i]) ? 0 : s.strides[i - lead];
    }
    return b;
}

/* Cast input i to `dtype` through the CAST op, so autograd sees the cast. */
static kiln_status cast_input(kiln_op_call *c, int i, kiln_dtype dtype) {
    kiln_op_attrs a = {.dtype = dtype};
    kiln_tensor *out[KILN_OP_MAX_OUT] = {NULL};
    KILN_TRY(kiln_dispatch(KILN_OP_CAST, 1, &c->in[i], &a, c->device, out));
    if (c->in_owned[i]) kiln_tensor_drop(c->in[i]);
    c->in[i] = out[0];
    c->in_owned[i] = true;
    return KILN_OK;
}

/* The op's views: inputs (broadcast where the op broadcasts, in their
 * layouts), outputs. Outputs not allocated yet (c->out[i] NULL) are
 * described from inference: contiguous, strided, no data. On meta the data
 * pointers are NULL (workspace and supports fns read shapes, strides and
 * attributes only). */
static void build_args(const kiln_op_call *c, const kiln_meta *meta, bool on_meta, kiln_op_args *args) {
    const kiln_op_info *info = c->info;
    for (int i = 0; i < c->n_in; i++) {
        if (!c->in[i]) {
            args->in[i].ndim = -1; /* an absent optional input */
            continue;
        }
        args->in[i] = (info->flags & OPF_BROADCAST) ? broadcast_view(c->in[i], &meta[0]) : kiln_tensor_kernel_view(c->in[i]);
        if (on_meta) args->in[i].data = NULL;
    }
    for (int i = 0; i < c->n_out; i++) {
        if (c->out[i]) {
            args->out[i] = kiln_tensor_kernel_view(c->out[i]);
        } else if (i == 0 && (info->flags & OPF_INPLACE)) {
            args->out[0] = kiln_tensor_kernel_view(c->in[0]);
            args->out[0].data = NULL;
        } else {
            kiln_strided o = {.dtype = meta[i].dtype, .ndim = meta[i].ndim, .layout = KILN_LAYOUT_STRIDED};
            memcpy(o.shape, meta[i].shape, sizeof(int64_t) * (size_t)meta[i].ndim);
            kiln_contiguous_strides(o.ndim, o.shape, o.strides);
            args->out[i] = o;
        }
        if (on_meta) args->out[i].data = NULL;
    }
}

/* The kernel for the call (a fast table's when one takes the args, else the
 * reference) and its outputs' layouts. An input in an opaque layout that
 * the chosen kernel does not take is converted to strided first, and the
 * choice made again with the strided inputs. */
typedef struct kernel_choice {
    const kiln_op_kernel *k;
    bool fast;
    kiln_layout out_layout[KILN_OP_MAX_OUT];
} kernel_choice;

static kiln_status choose_kernel(kiln_op_call *c, const kiln_meta *meta, kernel_choice *ch) {
    bool on_meta = c->device.type == KILN_DEVICE_META;
    kiln_device_type type = on_meta ? kiln_meta_kernels() : c->device.type;
    kiln_dtype dt = c->n_out ? meta[0].dtype : KILN_F32;
    kiln_op_args args = {.n_in = c->n_in, .n_out = c->n_out, .attrs = c->attrs};
    build_args(c, meta, on_meta, &args);
    memset(ch, 0, sizeof *ch);
    ch->k = kiln_ops_select_kernel(type, c->op, dt, &args, &ch->fast);
    if (!ch->k || !ch->k->layout) {
        bool converted = false;
        for (int i = 0; i < c->n_in; i++)
            if (c->in[i] && kiln_layout_of(c->in[i]) != KILN_LAYOUT_STRIDED) {
                const void *old_base = c->in[i]->storage->base;
                kiln_layout old_layout = kiln_layout_of(c->in[i]);
                KILN_TRY(kiln_tensor_ensure_strided(c->in[i]));
                if (recorder) KILN_TRY(recorder->reorder(recorder->ctx, c->in[i], old_base, old_layout));
                converted = true;
            }
        if (converted) {
            build_args(c, meta, on_meta, &args);
            ch->k = kiln_ops_select_kernel(type, c->op, dt, &args, &ch->fast);
        }
    }
    /* Meta gives its results the layouts the device it stands for would
     * (kiln_meta_kernels), so a planned step allocates (and converts) as the
     * real one does. */
    if (ch->k && ch->k->layout) ch->k->layout(&args, ch->out_layout);
    return KILN_OK;
}

/* The kernel's prepared copy of one input (kernels/op_args.h), kept with
 * that input's storage and refilled when its version moved. */
typedef struct fill_ctx {
    const kiln_op_kernel *k;
    const kiln_op_args *args;
} fill_ctx;

static kiln_status fill_prepared(void *ctx, void *dst) {
    const fill_ctx *f = ctx;
    return f->k->fill(f->args, dst);
}

/* Meta keeps the same copies (simulated memory) and fills nothing. */
static kiln_status fill_nothing(void *ctx, void *dst) {
    (void)ctx, (void)dst;
    return KILN_OK;
}

static kiln_status prepare_input(kiln_op_call *c, const kiln_op_kernel *k, kiln_op_args *args, bool on_meta) {
    kiln_op_prepare p = {.input = -1};
    k->prepare(args, &p);
    if (p.input < 0 || p.input >= c->n_in || !c->in[p.input] || !p.bytes) return KILN_OK;
    fill_ctx f = {k, args};
    void *copy = NULL;
    alloc_kind = KILN_DISPATCH_ALLOC_PREPARED;
    kiln_status st = kiln_tensor_prepared(c->in[p.input], p.key, p.bytes, p.lazy,
                                          on_meta ? fill_nothing : fill_prepared, &f, &copy);
    alloc_kind = KILN_DISPATCH_ALLOC_OUTPUT;
    KILN_TRY(st);
    if (on_meta) return KILN_OK;
    args->prepared = copy;
    return KILN_OK;
}

static kiln_status run_kernel(kiln_op_call *c, const kiln_meta *meta, const kernel_choice *ch) {
    const kiln_op_info *info = c->info;
    kiln_dtype dt = c->n_out ? meta[0].dtype : KILN_F32;
    /* Meta runs no kernel, but it allocates (simulated) the workspace the
     * kernel it stands for would ask for, so a planned step's peak counts it
     * too. */
    bool on_meta = c->device.type == KILN_DEVICE_META;
    kiln_op_args args = {.n_in = c->n_in, .n_out = c->n_out, .attrs = c->attrs};
    build_args(c, meta, on_meta, &args);
    const kiln_op_kernel *k = ch->k;
    if (on_meta && (!k || !(k->dtypes & KILN_DT(dt)))) return KILN_OK;
    char dev[32];
    kiln_device_str(c->device, dev, sizeof dev);
    if (!k)
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "run it on the cpu device, or report the missing kernel",
                          "kiln_%s: this build has no %s kernel for it", info->name, dev);
    if (!(k->dtypes & KILN_DT(dt)))
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "cast the inputs with kiln_to to a supported dtype",
                          "kiln_%s: the %s kernel does not support dtype %s", info->name, dev, kiln_dtype_name(dt));
    if (!on_meta) KILN_TRY(kiln_tensor_kernel_stream(c->device, &args.stream));
    if (k->workspace) args.workspace_bytes = k->workspace(&args);
    if (args.workspace_bytes) {
        alloc_kind = KILN_DISPATCH_ALLOC_WORKSPACE;
        kiln_status ws = kiln_memory_alloc(c->device, args.workspace_bytes, NULL, &args.workspace);
        alloc_kind = KILN_DISPATCH_ALLOC_OUTPUT;
        KILN_TRY(ws);
    }
    /* Meta allocates (simulated) the prepared copies that kernel keeps, in
     * the real order: after the workspace. */
    kiln_status st = KILN_OK;
    if (k->prepare && k->fill) st = prepare_input(c, k, &args, on_meta);
    if (!st && !on_meta) {
        kiln_counter_add(KILN_COUNTER_KERNEL_LAUNCHES, 1);
        if (ch->fast) kiln_ops_count_fast_run(c->op);
        if (observer.kernel) observer.kernel(c, true);
        if (recorder) st = recorder->kernel(recorder->ctx, c, k, ch->fast, &args);
        if (!st) st = k->run(&args);
        if (observer.kernel) observer.kernel(c, false);
    }
    /* Freed in stream order: the next user of the block runs after the kernel. */
    if (args.workspace) kiln_memory_free(c->device, args.workspace);
    return st;
}

/* Whether output 0 may be written into the donated input (kiln_dispatch_donating). */
static bool can_take_donation(const kiln_op_call *c, const kiln_meta *meta, const kernel_choice *ch) {
    if (!c->donate || c->donate > c->n_in || (c->info->flags & OPF_INPLACE)) return false;
    const kiln_tensor *t = c->in[c->donate - 1];
    if (!t || atomic_load(&t->refcount) != 1 || atomic_load(&t->storage->refcount) != 1) return false;
    for (int i = 0; i < c->n_in; i++)
        if (c->in[i] && kiln_requires_grad(c->in[i])) return false;
    if (t->dtype != meta[0].dtype || t->ndim != meta[0].ndim || t->offset != 0 || !kiln_is_contiguous(t) ||
        memcmp(t->shape, meta[0].shape, sizeof(int64_t) * (size_t)t->ndim) || kiln_layout_of(t) != ch->out_layout[0] ||
        !kiln_device_equal(t->storage->device, c->device))
        return false;
    return true;
}

static kiln_status allocate_outputs(kiln_op_call *c, const kiln_meta *meta, const kernel_choice *ch) {
    char fn[64];
    snprintf(fn, sizeof fn, "kiln_%s", c->info->name);
    for (int i = 0; i < c->n_out; i++) {
        if (i == 0 && (c->info->flags & OPF_INPLACE)) {
            c->out[0] = kiln_retain(c->in[0]);
            continue;
        }
        if (i == 0 && can_take_donation(c, meta, ch)) {
            c->out[0] = kiln_retain(c->in[c->donate - 1]);
            kiln_tensor_bump_version(c->out[0]);
            continue;
        }
        kiln_shape s = {.ndim = meta[i].ndim};
        memcpy(s.d, meta[i].shape, sizeof(int64_t) * (size_t)meta[i].ndim);
        c->out[i] = kiln_tensor_alloc(fn, s, meta[i].dtype, c->device, false);
        if (!c->out[i]) return kiln_error_last()->status;
        if (ch->out_layout[i] != KILN_LAYOUT_STRIDED) kiln_tensor_set_layout(c->out[i], ch->out_layout[i]);
    }
    return KILN_OK;
}

static kiln_status dispatch_body(kiln_op_call *c) {
    const kiln_op_info *info = c->info;
    kiln_meta meta[KILN_OP_MAX_OUT];
    kiln_dtype in_dtype[KILN_OP_MAX_IN];
    memset(meta, 0, sizeof meta);
    for (int i = 0; i < c->n_in; i++) in_dtype[i] = c->in[i] ? kiln_dtype_of(c->in[i]) : KILN_F32;
    char fn[64];
    snprintf(fn, sizeof fn, "kiln_%s", info->name);
    if (!info->infer)
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "report this: every op needs one (tests/ops/test_op_coverage)",
                          "%s: this build has no shape inference for it", fn);
    KILN_TRY(info->infer(fn, c->attrs, c->n_in, c->in, meta, in_dtype));
    for (int i = 0; i < c->n_in; i++)
        if (c->in[i] && in_dtype[i] != kiln_dtype_of(c->in[i])) KILN_TRY(cast_input(c, i, in_dtype[i]));
    if (info->flags & OPF_INPLACE) {
        kiln_shape s0 = kiln_shape_of(c->in[0]);
        if (meta[0].ndim != s0.ndim || memcmp(meta[0].shape, s0.d, sizeof(int64_t) * (size_t)s0.ndim) ||
            meta[0].dtype != kiln_dtype_of(c->in[0]))
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use the out-of-place op",
                              "%s: the result's shape or dtype differs from the tensor written in place", fn);
    }
    kernel_choice ch;
    KILN_TRY(choose_kernel(c, meta, &ch));
    KILN_TRY(allocate_outputs(c, meta, &ch));
    KILN_TRY(run_kernel(c, meta, &ch));
    if (info->flags & OPF_INPLACE) kiln_tensor_bump_version(c->out[0]);
    if (c->op == KILN_OP_BATCH_NORM && c->attrs->training) {
        /* The running statistics were updated in place. */
        if (c->in[3]) kiln_tensor_bump_version(c->in[3]);
        if (c->in[4]) kiln_tensor_bump_version(c->in[4]);
    }
    return KILN_OK;
}

kiln_status kiln_dispatch(kiln_op_id op, int n_in, kiln_tensor *const *in, kiln_op_attrs *attrs, kiln_device device,
                          kiln_tensor **out) {
    return kiln_dispatch_donating(op, n_in, in, attrs, device, out, -1);
}

kiln_status kiln_dispatch_donating(kiln_op_id op, int n_in, kiln_tensor *const *in, kiln_op_attrs *attrs,
                                   kiln_device device, kiln_tensor **out, int donate) {
    const kiln_op_info *info = kiln_op_info_get(op);
    if (!info) return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "kiln_dispatch: unknown op %d", (int)op);
    if (n_in < 0 || n_in > KILN_OP_MAX_IN)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_%s: %d inputs (at most %d)", info->name, n_in,
                          KILN_OP_MAX_IN);
    kiln_op_attrs zero_attrs = {0};
    kiln_op_call c = {.op = op,
                      .info = info,
                      .n_in = n_in,
                      .n_out = info->n_out,
                      .attrs = attrs ? attrs : &zero_attrs,
                      .donate = donate >= 0 && donate < n_in ? donate + 1 : 0};
    for (int i = 0; i < n_in; i++) c.in[i] = in[i];
    kiln_api_enter();
    const char *outer_op = current_op;
    current_op = info->name;
    KILN_NVTX_PUSH(info->name);
    kiln_status st = check_inputs(&c, device);
    int begun = 0;
    for (; !st && begun < KILN_HOOK_KIND_COUNT; begun++)
        if (hooks[begun].begin) st = hooks[begun].begin(&c);
    if (!st) st = dispatch_body(&c);
    for (int h = begun - 1; h >= 0; h--) {
        if (!hooks[h].end) continue;
        kiln_status hs = hooks[h].end(&c, st);
        if (!st) st = hs;
    }
    for (int i = 0; i < n_in; i++)
        if (c.in_owned[i]) kiln_tensor_drop(c.in[i]);
    if (st) {
        for (int i = 0; i < c.n_out; i++)
            if (c.out[i]) kiln_tensor_drop(c.out[i]);
    } else {
        for (int i = 0; i < c.n_out; i++) out[i] = c.out[i];
    }
    KILN_NVTX_POP();
    current_op = outer_op;
    kiln_api_leave();
    return st;
}

kiln_tensor *kiln_dispatch_public(kiln_op_id op, int n_in, kiln_tensor *const *in, kiln_op_attrs *attrs,
                                  kiln_tensor **aux) {
    kiln_api_enter();
    kiln_tensor *out[KILN_OP_MAX_OUT] = {NULL};
    kiln_device none = {KILN_DEVICE_CPU, 0};
    if (kiln_dispatch(op, n_in, in, attrs, none, out)) return kiln_api_return(NULL);
    const kiln_op_info *info = kiln_op_info_get(op);
    kiln_tensor *result = kiln_api_return(out[0]);
    /* Auxiliary outputs handed to the caller follow the same scope rule as
     * the result: re-entering and returning registers them when this was
     * an outermost call. */
    for (int i = 1; i < info->n_out; i++) {
        if (!aux) {
            kiln_tensor_drop(out[i]);
            continue;
        }
        kiln_api_enter();
        aux[i - 1] = kiln_api_return(out[i]);
    }
    return result;
}

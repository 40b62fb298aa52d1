/* SGD, Adam and AdamW, following torch.optim's single-tensor ("foreach=False")
 * implementations operation by operation, so float64 runs agree with
 * PyTorch to rounding.
 *
 * Updates are written with public ops (they run on every device) under
 * no_grad inside an entered API region: temporaries are never registered
 * with the user's scope and die as soon as the next op has consumed them.
 * The parameters are written in place with kiln_copy_; state tensors are
 * replaced (the optimizer holds the only reference to them).
 *
 * Where the device has fused optimizer kernels (kernels/optim_kernels.h)
 * and a parameter, its gradient and its state are contiguous tensors of
 * one covered dtype, the update runs as one fused pass instead, writing the
 * parameter and the state in place. It computes the same bits as the
 * op-by-op path (tests/optim/test_fused_optim.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/optim_kernels.h"
#include "optim/optim_internal.h"
#include "runtime/runtime_internal.h"
#include "tensor/scope.h"
#include "tensor/tensor_internal.h"

/* ---- Consuming helpers: each takes ownership of its tensor arguments and
 * returns NULL without calling the op when an argument is already NULL, so
 * the first error stays the one reported. */

static kiln_tensor *c_add(kiln_tensor *a, kiln_tensor *b) {
    kiln_tensor *r = a && b ? kiln_add(a, b) : NULL;
    kiln_tensor_drop(a);
    kiln_tensor_drop(b);
    return r;
}
static kiln_tensor *c_sub(kiln_tensor *a, kiln_tensor *b) {
    kiln_tensor *r = a && b ? kiln_sub(a, b) : NULL;
    kiln_tensor_drop(a);
    kiln_tensor_drop(b);
    return r;
}
static kiln_tensor *c_mul(kiln_tensor *a, kiln_tensor *b) {
    kiln_tensor *r = a && b ? kiln_mul(a, b) : NULL;
    kiln_tensor_drop(a);
    kiln_tensor_drop(b);
    return r;
}
static kiln_tensor *c_div(kiln_tensor *a, kiln_tensor *b) {
    kiln_tensor *r = a && b ? kiln_div(a, b) : NULL;
    kiln_tensor_drop(a);
    kiln_tensor_drop(b);
    return r;
}
static kiln_tensor *c_muls(kiln_tensor *a, double s) {
    kiln_tensor *r = a ? kiln_mul_scalar(a, s) : NULL;
    kiln_tensor_drop(a);
    return r;
}
static kiln_tensor *c_adds(kiln_tensor *a, double s) {
    kiln_tensor *r = a ? kiln_add_scalar(a, s) : NULL;
    kiln_tensor_drop(a);
    return r;
}
static kiln_tensor *c_sqrt(kiln_tensor *a) {
    kiln_tensor *r = a ? kiln_sqrt(a) : NULL;
    kiln_tensor_drop(a);
    return r;
}
static kiln_tensor *c_neg(kiln_tensor *a) {
    kiln_tensor *r = a ? kiln_neg(a) : NULL;
    kiln_tensor_drop(a);
    return r;
}
/* Elementwise maximum (amsgrad). */
static kiln_tensor *c_maximum(kiln_tensor *a, kiln_tensor *b) {
    kiln_tensor *gt = a && b ? kiln_gt(a, b) : NULL;
    kiln_tensor *r = gt ? kiln_where(gt, a, b) : NULL;
    kiln_tensor_drop(gt);
    kiln_tensor_drop(a);
    kiln_tensor_drop(b);
    return r;
}
static kiln_tensor *ref(kiln_tensor *t) { return kiln_retain(t); }

/* *slot = v (consumed); false when v is NULL (an op failed). */
static bool set_state(kiln_tensor **slot, kiln_tensor *v) {
    if (!v) return false;
    kiln_tensor_drop(*slot);
    *slot = v;
    return true;
}

/* p <- v in place (v consumed). */
static kiln_status assign(kiln_tensor *p, kiln_tensor *v) {
    if (!v) return kiln_error_last()->status;
    kiln_status st = kiln_copy_(p, v, 0);
    kiln_tensor_drop(v);
    return st;
}

/* ---- Creation -------------------------------------------------------------------------------- */

kiln_sgd_opts kiln_sgd_defaults(double lr) { return (kiln_sgd_opts){.lr = lr}; }

kiln_adam_opts kiln_adam_defaults(void) {
    return (kiln_adam_opts){.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.0};
}

kiln_adam_opts kiln_adamw_defaults(void) {
    kiln_adam_opts o = kiln_adam_defaults();
    o.weight_decay = 1e-2;
    return o;
}

static kiln_optimizer *optimizer_new(const char *fn, kiln_optimizer_kind kind, kiln_tensor *const *params, int n,
                                     double lr) {
    if (n < 0 || (n > 0 && !params)) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "%s: %d parameters at %p", fn, n, (const void *)params);
        return NULL;
    }
    if (!(lr >= 0)) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use a learning rate >= 0", "%s: invalid learning rate %g", fn, lr);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (kiln_tensor_check(params[i], fn)) return NULL;
        if (!kiln_requires_grad(params[i]) || !kiln_is_leaf(params[i])) {
            KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "mark it with kiln_set_requires_grad (optimizers train leaves)",
                       "%s: parameter %d is not a leaf that requires grad", fn, i);
            return NULL;
        }
    }
    kiln_optimizer *o = KILN_CALLOC(1, sizeof *o);
    if (!o) return NULL;
    o->kind = kind;
    o->lr = lr;
    o->n = n;
    o->params = KILN_CALLOC((size_t)(n ? n : 1), sizeof *o->params);
    o->steps = KILN_CALLOC((size_t)(n ? n : 1), sizeof *o->steps);
    for (int k = 0; k < KILN_OPTIM_STATES; k++) o->state[k] = KILN_CALLOC((size_t)(n ? n : 1), sizeof *o->state[k]);
    bool ok = o->params && o->steps;
    for (int k = 0; k < KILN_OPTIM_STATES; k++) ok = ok && o->state[k];
    if (!ok) {
        kiln_optimizer_free(o);
        return NULL;
    }
    for (int i = 0; i < n; i++) o->params[i] = kiln_retain(params[i]);
    return o;
}

kiln_optimizer *kiln_sgd(kiln_tensor *const *params, int n, const kiln_sgd_opts *opts) {
    if (!opts) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass kiln_sgd_defaults(lr)", "kiln_sgd: opts is NULL (SGD has no default lr)");
        return NULL;
    }
    if (opts->momentum < 0 || opts->weight_decay < 0 || (opts->nesterov && (opts->momentum <= 0 || opts->dampening != 0))) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "nesterov needs momentum > 0 and dampening 0",
                   "kiln_sgd: momentum %g, dampening %g, weight_decay %g, nesterov %d", opts->momentum, opts->dampening,
                   opts->weight_decay, (int)opts->nesterov);
        return NULL;
    }
    kiln_optimizer *o = optimizer_new("kiln_sgd", KILN_OPTIM_SGD, params, n, opts->lr);
    if (o) o->sgd = *opts;
    return o;
}

static kiln_optimizer *adam_common(const char *fn, kiln_optimizer_kind kind, kiln_tensor *const *params, int n,
                                   const kiln_adam_opts *opts) {
    kiln_adam_opts o = opts ? *opts : (kind == KILN_OPTIM_ADAMW ? kiln_adamw_defaults() : kiln_adam_defaults());
    if (!(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1) || !(o.eps >= 0) || !(o.weight_decay >= 0)) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "betas in [0, 1), eps >= 0, weight_decay >= 0",
                   "%s: betas (%g, %g), eps %g, weight_decay %g", fn, o.beta1, o.beta2, o.eps, o.weight_decay);
        return NULL;
    }
    kiln_optimizer *opt = optimizer_new(fn, kind, params, n, o.lr);
    if (opt) opt->adam = o;
    return opt;
}

kiln_optimizer *kiln_adam(kiln_tensor *const *params, int n, const kiln_adam_opts *opts) {
    return adam_common("kiln_adam", KILN_OPTIM_ADAM, params, n, opts);
}

kiln_optimizer *kiln_adamw(kiln_tensor *const *params, int n, const kiln_adam_opts *opts) {
    return adam_common("kiln_adamw", KILN_OPTIM_ADAMW, params, n, opts);
}

void kiln_optimizer_free(kiln_optimizer *o) {
    if (!o) return;
    for (int i = 0; i < o->n; i++) {
        if (o->params) kiln_tensor_drop(o->params[i]);
        for (int k = 0; k < KILN_OPTIM_STATES; k++)
            if (o->state[k]) kiln_tensor_drop(o->state[k][i]);
    }
    for (int k = 0; k < KILN_OPTIM_STATES; k++) free(o->state[k]);
    free(o->params);
    free(o->steps);
    free(o);
}

/* ---- Updates ---------------------------------------------------------------------------------- */

static _Atomic bool fused_off;
static _Atomic uint64_t fused_updates;

void kiln_optim_use_fused(bool on) { fused_off = !on; }
bool kiln_optim_fused_enabled(void) { return !fused_off; }
uint64_t kiln_optim_fused_updates(void) { return fused_updates; }

/* The fused kernels for these tensors (NULL entries skipped), or NULL when
 * the update must run op by op: not all contiguous, dtypes or sizes differ,
 * or the device has no fused kernel for the dtype. */
static const kiln_optim_kernels *fused_for(kiln_tensor *const *t, int n) {
    if (fused_off) return NULL;
    kiln_device dev = kiln_get_device(t[0]);
    kiln_dtype dt = kiln_dtype_of(t[0]);
    /* Meta plans the step a real device runs: it takes the fused path too
     * (allocating nothing, as the kernels do) and launches nothing. */
    const kiln_optim_kernels *k =
        kiln_optim_kernels_for(dev.type == KILN_DEVICE_META ? kiln_meta_kernels() : dev.type);
    if (!k || !(k->dtypes & (1u << dt))) return NULL;
    int64_t numel = kiln_numel(t[0]);
    for (int i = 0; i < n; i++) {
        if (!t[i]) continue;
        kiln_device d = kiln_get_device(t[i]);
        if (d.type != dev.type || d.index != dev.index || kiln_dtype_of(t[i]) != dt || kiln_numel(t[i]) != numel ||
            !kiln_is_contiguous(t[i]))
            return NULL;
    }
    return k;
}

/* A fused kernel reads flat memory: tensors in an opaque layout (a weight
 * a oneDNN kernel left in nChw16c) are converted to strided first. The
 * conversion allocates, so it can run out of memory: an error to return. */
static kiln_status strided_all(kiln_tensor *const *t, int n) {
    for (int i = 0; i < n; i++)
        if (t[i]) KILN_TRY(kiln_tensor_ensure_strided(t[i]));
    return KILN_OK;
}

/* After strided_all. */
static void *data_of(kiln_tensor *t) {
    if (!t) return NULL;
    kiln_strided v = kiln_tensor_kernel_view(t);
    KILN_ASSERT(v.layout == KILN_LAYOUT_STRIDED);
    return v.data;
}

/* Fused updates waiting for their launch: up to KILN_OPTIM_MULTI
 * parameters of one device go in one call (one kernel on CUDA). The
 * gradients they read are held until then. */
typedef struct fused_batch {
    kiln_optimizer *o;
    const kiln_optim_kernels *k;
    kiln_device device;
    int n;
    kiln_adam_step adam[KILN_OPTIM_MULTI];
    kiln_sgd_step sgd[KILN_OPTIM_MULTI];
    kiln_tensor *hold[KILN_OPTIM_MULTI];
    int idx[KILN_OPTIM_MULTI]; /* the parameters' indices */
} fused_batch;

static _Thread_local kiln_optim_recorder_fn recorder;
static _Thread_local void *recorder_ctx;
/* kiln_optimizer_step_unless_found in progress: the flag every fused
 * update of this thread takes, and the scaler's skip counter. */
static _Thread_local const float *step_found_inf;
static _Thread_local int64_t *step_skipped;

bool kiln_optim_recording(void) { return recorder != NULL; }

const float *kiln_optim_found_inf(int64_t **skipped) {
    if (skipped) *skipped = step_skipped;
    return step_found_inf;
}

void kiln_optim_unstep(kiln_optimizer *o, const int *idx, int n) {
    for (int k = 0; k < n; k++) o->steps[idx[k]]--;
}

/* Steps made by kiln_optimizer_step_unless_found, not yet settled. */
typedef struct pending_found {
    kiln_optimizer *o;
    kiln_tensor *found; /* a reference */
    int64_t *steps;     /* o->steps before the step */
    int64_t *skipped;
} pending_found;
#define MAX_PENDING_FOUND 8
static _Thread_local pending_found pending[MAX_PENDING_FOUND];
static _Thread_local int n_pending;

kiln_status kiln_optim_settle_found(void) {
    kiln_status st = KILN_OK;
    for (int k = 0; k < n_pending; k++) {
        pending_found *f = &pending[k];
        double v = 0;
        kiln_status rs = kiln_get_device(f->found).type == KILN_DEVICE_META ? KILN_OK : kiln_item(f->found, &v);
        if (rs && !st) st = rs;
        if (!rs && v != 0) {
            memcpy(f->o->steps, f->steps, (size_t)f->o->n * sizeof *f->steps);
            if (f->skipped) (*f->skipped)++;
        }
        kiln_tensor_drop(f->found);
        free(f->steps);
    }
    n_pending = 0;
    return st;
}

void kiln_optim_set_recorder(kiln_optim_recorder_fn fn, void *ctx) {
    recorder = fn;
    recorder_ctx = ctx;
}

static _Atomic uint64_t fused_launches;

uint64_t kiln_optim_fused_launches(void) { return fused_launches; }

static kiln_status flush(fused_batch *b, bool adam) {
    if (!b->n) return KILN_OK;
    void *stream = NULL;
    kiln_status st = KILN_OK;
    for (int k = 0; step_found_inf && k < b->n; k++) {
        if (adam)
            b->adam[k].found_inf = step_found_inf;
        else
            b->sgd[k].found_inf = step_found_inf;
    }
    if (b->device.type != KILN_DEVICE_META) {
        st = kiln_tensor_kernel_stream(b->device, &stream);
        if (!st && recorder) st = recorder(recorder_ctx, b->o, b->k, adam, b->idx, b->hold, b->adam, b->sgd, b->n, stream);
        if (!st) st = adam ? b->k->adam(b->adam, b->n, stream) : b->k->sgd(b->sgd, b->n, stream);
        if (!st) fused_launches++;
    }
    for (int k = 0; k < b->n; k++) kiln_tensor_drop(b->hold[k]);
    b->n = 0;
    return st;
}

/* Room in the batch for one update on `device` with kernels k (flushing
 * what is there when the device or the table differs, or it is full). */
static kiln_status make_room(fused_batch *b, const kiln_optim_kernels *k, kiln_device device, bool adam) {
    if (b->n && (b->k != k || b->device.type != device.type || b->device.index != device.index ||
                 b->n == KILN_OPTIM_MULTI))
        KILN_TRY(flush(b, adam));
    b->k = k;
    b->device = device;
    return KILN_OK;
}

/* torch.optim.sgd._single_tensor_sgd for one parameter; g consumed. */
/* fresh: prepare() made the momentum buffer for this step (its first):
 * PyTorch then sets it to the gradient instead of blending. */
static kiln_status sgd_update(kiln_optimizer *o, int i, kiln_tensor *g, fused_batch *b, bool fresh) {
    const kiln_sgd_opts *s = &o->sgd;
    kiln_tensor *p = o->params[i];
    kiln_tensor **buf0 = &o->state[0][i];
    bool first = s->momentum != 0 && (fresh || !*buf0);
    if (first && fused_for((kiln_tensor *[]){p, g}, 2) && !set_state(buf0, kiln_new_zeros(p, kiln_shape_of(p)))) {
        kiln_tensor_drop(g);
        return kiln_error_last()->status;
    }
    const kiln_optim_kernels *fk = fused_for((kiln_tensor *[]){p, g, s->momentum != 0 ? *buf0 : NULL}, 3);
    if (fk && (s->momentum == 0 || *buf0)) {
        kiln_status rc = make_room(b, fk, kiln_get_device(p), false);
        if (!rc) rc = strided_all((kiln_tensor *[]){p, g, s->momentum != 0 ? *buf0 : NULL}, 3);
        if (rc) {
            kiln_tensor_drop(g);
            return rc;
        }
        b->sgd[b->n] = (kiln_sgd_step){.dtype = kiln_dtype_of(p), .n = kiln_numel(p), .p = data_of(p),
                                       .g = data_of(g), .buf = s->momentum != 0 ? data_of(*buf0) : NULL,
                                       .first = first, .nesterov = s->nesterov, .maximize = s->maximize,
                                       .lr = o->lr, .momentum = s->momentum, .dampening = s->dampening,
                                       .weight_decay = s->weight_decay};
        b->idx[b->n] = i;
        b->hold[b->n++] = g;
        kiln_tensor_bump_version(p);
        if (*buf0) kiln_tensor_bump_version(*buf0);
        fused_updates++;
        return KILN_OK;
    }
    if (s->maximize) g = c_neg(g);
    if (s->weight_decay != 0) g = c_add(g, c_muls(ref(p), s->weight_decay));
    if (s->momentum != 0) {
        kiln_tensor **buf = &o->state[0][i];
        kiln_tensor *nb = !*buf ? (g ? kiln_to(g, kiln_get_device(g), kiln_dtype_of(g), KILN_COPY) : NULL)
                                : c_add(c_muls(ref(*buf), s->momentum), c_muls(ref(g), 1.0 - s->dampening));
        if (!set_state(buf, nb)) {
            kiln_tensor_drop(g);
            return kiln_error_last()->status;
        }
        if (s->nesterov)
            g = c_add(g, c_muls(ref(*buf), s->momentum));
        else {
            kiln_tensor_drop(g);
            g = ref(*buf);
        }
    }
    return assign(p, c_add(ref(p), c_muls(g, -o->lr)));
}

/* torch.optim.adam._single_tensor_adam (AdamW: decoupled weight decay);
 * g consumed. */
static kiln_status adam_update(kiln_optimizer *o, int i, kiln_tensor *g, fused_batch *b) {
    const kiln_adam_opts *a = &o->adam;
    kiln_tensor *p = o->params[i];
    kiln_tensor **m = &o->state[0][i], **v = &o->state[1][i], **vmax = &o->state[2][i];
    if (!*m && !set_state(m, kiln_new_zeros(p, kiln_shape_of(p)))) goto fail;
    if (!*v && !set_state(v, kiln_new_zeros(p, kiln_shape_of(p)))) goto fail;
    if (a->amsgrad && !*vmax && !set_state(vmax, kiln_new_zeros(p, kiln_shape_of(p)))) goto fail;
    const kiln_optim_kernels *fk = fused_for((kiln_tensor *[]){p, g, *m, *v, a->amsgrad ? *vmax : NULL}, 5);
    /* The fused kernel negates the gradient itself: nothing to allocate. */
    if (!fk && a->maximize && !(g = c_neg(g))) return kiln_error_last()->status;
    int64_t step = ++o->steps[i];
    if (fk) {
        double bc1 = 1.0 - pow(a->beta1, (double)step), bc2 = 1.0 - pow(a->beta2, (double)step);
        kiln_status rc = make_room(b, fk, kiln_get_device(p), true);
        if (!rc) rc = strided_all((kiln_tensor *[]){p, g, *m, *v, a->amsgrad ? *vmax : NULL}, 5);
        if (rc) goto fail;
        b->adam[b->n] = (kiln_adam_step){.dtype = kiln_dtype_of(p), .n = kiln_numel(p), .p = data_of(p),
                                         .g = data_of(g), .m = data_of(*m), .v = data_of(*v),
                                         .vmax = a->amsgrad ? data_of(*vmax) : NULL,
                                         .adamw = o->kind == KILN_OPTIM_ADAMW, .amsgrad = a->amsgrad,
                                         .maximize = a->maximize, .lr = o->lr,
                                         .beta1 = a->beta1, .beta2 = a->beta2, .eps = a->eps,
                                         .weight_decay = a->weight_decay, .step_size = o->lr / bc1,
                                         .bc2_sqrt = sqrt(bc2)};
        b->idx[b->n] = i;
        b->hold[b->n++] = g;
        kiln_tensor_bump_version(p);
        kiln_tensor_bump_version(*m);
        kiln_tensor_bump_version(*v);
        if (a->amsgrad) kiln_tensor_bump_version(*vmax);
        fused_updates++;
        return KILN_OK;
    }
    if (a->weight_decay != 0) {
        if (o->kind == KILN_OPTIM_ADAMW) {
            kiln_status st = assign(p, c_muls(ref(p), 1.0 - o->lr * a->weight_decay));
            if (st) goto fail;
        } else {
            g = c_add(g, c_muls(ref(p), a->weight_decay));
        }
    }
    /* exp_avg.lerp_(grad, 1 - beta1): m + w (g - m) for w < 0.5, as
     * PyTorch's CPU lerp computes it (w >= 0.5: g - (g - m)(1 - w)). */
    double w = 1.0 - a->beta1;
    kiln_tensor *nm = w < 0.5 ? c_add(ref(*m), c_muls(c_sub(ref(g), ref(*m)), w))
                              : c_sub(ref(g), c_muls(c_sub(ref(g), ref(*m)), 1.0 - w));
    if (!set_state(m, nm)) goto fail;
    /* exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2) */
    kiln_tensor *nv = c_add(c_muls(ref(*v), a->beta2), c_mul(c_muls(ref(g), 1.0 - a->beta2), ref(g)));
    kiln_tensor_drop(g);
    g = NULL;
    if (!set_state(v, nv)) goto fail;
    double bc1 = 1.0 - pow(a->beta1, (double)step);
    double bc2 = 1.0 - pow(a->beta2, (double)step);
    double step_size = o->lr / bc1;
    double bc2_sqrt = sqrt(bc2);
    kiln_tensor *second = ref(*v);
    if (a->amsgrad) {
        if (!set_state(vmax, c_maximum(ref(*vmax), ref(*v)))) {
            kiln_tensor_drop(second);
            goto fail;
        }
        kiln_tensor_drop(second);
        second = ref(*vmax);
    }
    /* denom = (sqrt(v) / sqrt(bc2)) + eps;  p.addcdiv_(m, denom, -step_size) */
    kiln_tensor *denom = c_adds(c_muls(c_sqrt(second), 1.0 / bc2_sqrt), a->eps);
    return assign(p, c_add(ref(p), c_muls(c_div(ref(*m), denom), -step_size)));
fail:
    kiln_tensor_drop(g);
    return kiln_error_last()->status ? kiln_error_last()->status : KILN_ERR_INTERNAL;
}

/* Before any parameter moves: every state the fused updates need is made
 * and every tensor they read is in a strided layout, so the updates
 * themselves allocate nothing and an out-of-memory leaves the optimizer
 * and the parameters as they were (states made here are dropped again).
 * Parameters the op-by-op path updates (no fused kernel for their device
 * and dtype) make their state and temporaries as they go: step_body keeps
 * an undo log for them and updates them first, so a failure there puts
 * everything back (docs/memory.md). */
static kiln_status prepare(kiln_optimizer *o, bool adam, bool **fresh_out) {
    kiln_status st = KILN_OK;
    int i = 0;
    bool *fresh = KILN_CALLOC((size_t)o->n * KILN_OPTIM_STATES + 1, sizeof *fresh);
    *fresh_out = fresh;
    if (!fresh) return KILN_ERR_OUT_OF_MEMORY;
    for (; i < o->n && !st; i++) {
        kiln_tensor *p = o->params[i], *g = kiln_grad(p);
        kiln_error_clear();
        if (!g) continue;
        bool needs[KILN_OPTIM_STATES] = {adam || o->sgd.momentum != 0, adam, adam && o->adam.amsgrad};
        if (fused_for((kiln_tensor *[]){p, g}, 2)) {
            for (int k = 0; k < KILN_OPTIM_STATES && !st; k++) {
                if (!needs[k] || o->state[k][i]) continue;
                if (!set_state(&o->state[k][i], kiln_new_zeros(p, kiln_shape_of(p))))
                    st = kiln_error_last()->status ? kiln_error_last()->status : KILN_ERR_OUT_OF_MEMORY;
                else
                    fresh[(size_t)i * KILN_OPTIM_STATES + k] = true;
            }
            kiln_tensor *all[2 + KILN_OPTIM_STATES] = {p, g};
            for (int k = 0; k < KILN_OPTIM_STATES; k++) all[2 + k] = needs[k] ? o->state[k][i] : NULL;
            if (!st) st = strided_all(all, 2 + KILN_OPTIM_STATES);
        }
        kiln_tensor_drop(g);
    }
    if (st) {
        for (int j = 0; j < o->n; j++)
            for (int k = 0; k < KILN_OPTIM_STATES; k++)
                if (fresh[(size_t)j * KILN_OPTIM_STATES + k]) {
                    kiln_tensor_drop(o->state[k][j]);
                    o->state[k][j] = NULL;
                }
        free(fresh);
        *fresh_out = NULL;
    }
    return st;
}

/* What the op-by-op updates change, kept until the whole step succeeded
 * (the fused updates need none: prepare() made everything they allocate,
 * and they run after every op-by-op update). For each parameter the
 * op-by-op path updates: a copy of its values (it is written in place) and
 * the states it had (the path replaces them with new tensors); and every
 * parameter's step count. */
typedef struct undo_log {
    int64_t *steps;
    kiln_tensor **values;               /* [n]: NULL for parameters the fused path updates */
    kiln_tensor **states;               /* [n * KILN_OPTIM_STATES]: the states before (references) */
    bool *op_by_op;                     /* [n] */
} undo_log;

static void undo_free(kiln_optimizer *o, undo_log *u) {
    for (int i = 0; u->values && i < o->n; i++) kiln_tensor_drop(u->values[i]);
    for (int j = 0; u->states && j < o->n * KILN_OPTIM_STATES; j++) kiln_tensor_drop(u->states[j]);
    free(u->steps);
    free(u->values);
    free(u->states);
    free(u->op_by_op);
    *u = (undo_log){0};
}

/* The log made before anything moves; an out-of-memory here changes nothing. */
static kiln_status undo_begin(kiln_optimizer *o, undo_log *u) {
    *u = (undo_log){0};
    u->steps = KILN_MALLOC((size_t)(o->n ? o->n : 1) * sizeof *u->steps);
    u->values = KILN_CALLOC((size_t)(o->n ? o->n : 1), sizeof *u->values);
    u->states = KILN_CALLOC((size_t)(o->n ? o->n : 1) * KILN_OPTIM_STATES, sizeof *u->states);
    u->op_by_op = KILN_CALLOC((size_t)(o->n ? o->n : 1), sizeof *u->op_by_op);
    if (!u->steps || !u->values || !u->states || !u->op_by_op) {
        undo_free(o, u);
        return KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "kiln_optimizer_step: out of memory for its undo log");
    }
    memcpy(u->steps, o->steps, (size_t)o->n * sizeof *u->steps);
    for (int i = 0; i < o->n; i++) {
        kiln_tensor *p = o->params[i], *g = kiln_grad(p);
        kiln_error_clear();
        if (!g) continue;
        bool fused = fused_for((kiln_tensor *[]){p, g}, 2) != NULL;
        kiln_tensor_drop(g);
        if (fused) continue;
        u->op_by_op[i] = true;
        u->values[i] = kiln_to(p, kiln_get_device(p), kiln_dtype_of(p), KILN_COPY);
        if (!u->values[i]) {
            kiln_status st = kiln_error_last()->status;
            undo_free(o, u);
            return st ? st : KILN_ERR_OUT_OF_MEMORY;
        }
        for (int k = 0; k < KILN_OPTIM_STATES; k++)
            u->states[(size_t)i * KILN_OPTIM_STATES + k] = o->state[k][i] ? ref(o->state[k][i]) : NULL;
    }
    return KILN_OK;
}

/* Put back what the op-by-op updates changed: values copied in place (no
 * allocation), the states' tensors, the step counts. */
static void undo_apply(kiln_optimizer *o, undo_log *u) {
    for (int i = 0; i < o->n; i++) {
        o->steps[i] = u->steps[i];
        if (!u->op_by_op[i]) continue;
        kiln_status st = kiln_copy_(o->params[i], u->values[i], 0);
        if (st) kiln_error_clear(); /* a copy between buffers of one shape and dtype allocates nothing */
        else kiln_tensor_bump_version(o->params[i]);
        for (int k = 0; k < KILN_OPTIM_STATES; k++) {
            kiln_tensor **slot = &o->state[k][i], **old = &u->states[(size_t)i * KILN_OPTIM_STATES + k];
            if (*slot == *old) continue;
            kiln_tensor_drop(*slot);
            *slot = *old;
            *old = NULL;
        }
    }
}

/* The parameters' updates: the op-by-op ones first, then the fused ones,
 * whose launches only flush() completes. All or nothing: an error in an
 * op-by-op update puts back what the earlier ones changed and launches no
 * fused update (the order between parameters does not change any bit:
 * each update reads only its own parameter, gradient and states). */
static kiln_status step_body(kiln_optimizer *o) {
    fused_batch b = {.o = o, .n = 0};
    bool adam = o->kind != KILN_OPTIM_SGD;
    bool *fresh = NULL;
    KILN_TRY(prepare(o, adam, &fresh));
    undo_log u;
    kiln_status st = undo_begin(o, &u);
    for (int pass = 0; pass < 2 && !st; pass++) {
        for (int i = 0; i < o->n && !st; i++) {
            if (u.op_by_op[i] != (pass == 0)) continue;
            kiln_error_clear();
            kiln_tensor *g = kiln_grad(o->params[i]);
            if (!g) {
                st = kiln_error_last()->status;
                continue; /* no gradient: skipped, as in PyTorch */
            }
            if (!adam) {
                o->steps[i]++;
                st = sgd_update(o, i, g, &b, fresh[(size_t)i * KILN_OPTIM_STATES]);
            } else {
                st = adam_update(o, i, g, &b);
            }
        }
    }
    if (st && u.steps) {
        /* Nothing launched: the fused entries queued are dropped unlaunched. */
        undo_apply(o, &u);
        for (int k = 0; k < b.n; k++) kiln_tensor_drop(b.hold[k]);
        b.n = 0;
        for (int j = 0; j < o->n; j++)
            for (int k = 0; k < KILN_OPTIM_STATES; k++)
                if (fresh[(size_t)j * KILN_OPTIM_STATES + k]) {
                    kiln_tensor_drop(o->state[k][j]);
                    o->state[k][j] = NULL;
                }
    }
    kiln_status fs = flush(&b, adam);
    undo_free(o, &u);
    free(fresh);
    if (st || fs) return st ? st : fs;
    o->step_count++;
    return KILN_OK;
}

kiln_status kiln_optimizer_step(kiln_optimizer *o) {
    if (!o) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_optimizer_step: optimizer is NULL");
    kiln_api_enter();
    kiln_no_grad_begin();
    kiln_status st = step_body(o);
    kiln_grad_mode_end();
    kiln_api_leave();
    return st;
}

kiln_status kiln_optimizer_step_unless_found(kiln_optimizer *o, kiln_tensor *found, int64_t *skipped) {
    for (int i = 0; i < o->n; i++) {
        kiln_tensor *p = o->params[i], *g = kiln_grad(p);
        kiln_error_clear();
        if (!g) continue;
        bool fused = fused_for((kiln_tensor *[]){p, g}, 2) != NULL &&
                     kiln_device_equal(kiln_get_device(p), kiln_get_device(found));
        kiln_tensor_drop(g);
        if (!fused)
            return KILN_RAISE(KILN_ERR_UNSUPPORTED,
                              "keep the parameters contiguous f32 (or f64) on the scaler's device, or step the "
                              "scaler outside the traced call",
                              "kiln_grad_scaler_step under kiln_trace: parameter %d cannot take the fused "
                              "optimizer update, the only one that skips an inf/NaN step on the device",
                              i);
    }
    KILN_TRY(strided_all((kiln_tensor *[]){found}, 1));
    if (n_pending == MAX_PENDING_FOUND)
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "trace fewer optimizer steps in one call",
                          "kiln_grad_scaler_step under kiln_trace: more than %d optimizer steps in one call",
                          MAX_PENDING_FOUND);
    pending_found *f = &pending[n_pending];
    f->steps = KILN_MALLOC((size_t)(o->n ? o->n : 1) * sizeof *f->steps);
    if (!f->steps) return kiln_error_last()->status;
    memcpy(f->steps, o->steps, (size_t)o->n * sizeof *f->steps);
    f->o = o, f->found = ref(found), f->skipped = skipped;
    n_pending++;
    step_found_inf = data_of(found);
    step_skipped = skipped;
    kiln_status st = kiln_optimizer_step(o);
    step_found_inf = NULL;
    step_skipped = NULL;
    return st;
}

static kiln_status zero_grad_body(kiln_optimizer *o, bool set_to_none) {
    for (int i = 0; i < o->n; i++) KILN_TRY(kiln_zero_grad(o->params[i], set_to_none));
    return KILN_OK;
}

kiln_status kiln_optimizer_zero_grad(kiln_optimizer *o, bool set_to_none) {
    if (!o) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_optimizer_zero_grad: optimizer is NULL");
    kiln_api_enter();
    kiln_no_grad_begin();
    kiln_status st = zero_grad_body(o, set_to_none);
    kiln_grad_mode_end();
    kiln_api_leave();
    return st;
}

double kiln_optimizer_get_lr(const kiln_optimizer *o) { return o ? o->lr : NAN; }

kiln_status kiln_optimizer_set_lr(kiln_optimizer *o, double lr) {
    if (!o || !(lr >= 0))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use a learning rate >= 0",
                          "kiln_optimizer_set_lr: invalid learning rate %g", lr);
    o->lr = lr;
    return KILN_OK;
}

int64_t kiln_optimizer_step_count(const kiln_optimizer *o) { return o ? o->step_count : 0; }

kiln_tensor *kiln_optimizer_state(kiln_optimizer *o, int i, const char *name) {
    kiln_api_enter();
    kiln_tensor *t = NULL;
    static const char *const sgd_names[KILN_OPTIM_STATES] = {"momentum_buffer", "", ""};
    static const char *const adam_names[KILN_OPTIM_STATES] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
    if (!o || i < 0 || i >= o->n || !name) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_optimizer_state: bad optimizer, index %d or name", i);
    } else {
        const char *const *names = o->kind == KILN_OPTIM_SGD ? sgd_names : adam_names;
        int k = 0;
        while (k < KILN_OPTIM_STATES && strcmp(names[k], name) != 0) k++;
        if (k == KILN_OPTIM_STATES || !*name)
            KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "SGD: momentum_buffer; Adam: exp_avg, exp_avg_sq, max_exp_avg_sq",
                       "kiln_optimizer_state: no state named '%s'", name);
        else if (o->state[k][i])
            t = kiln_retain(o->state[k][i]);
    }
    return kiln_api_return(t);
}

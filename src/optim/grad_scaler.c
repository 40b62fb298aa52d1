/* Dynamic loss scaling: torch.amp.GradScaler's algorithm, composed of
 * public ops so that the inf/NaN check and the scale update run on the
 * gradients' device (CPU or CUDA kernels alike) and the only host
 * synchronisation per step is step()'s read of the found-inf flag.
 *
 *   unscale_: inv = 1 / scale; for every gradient g: g *= inv (in place),
 *             z += sum(g * 0). g * 0 is 0 for finite g and NaN for inf or
 *             NaN, so z is 0 or NaN; found = (z != z) as f32 (1: skip).
 *   update:   found_any = sum of the optimizers' flags != 0
 *             t = tracker + 1;  grow = (t == growth_interval)
 *             scale = found_any ? scale * backoff
 *                   : grow && isfinite(scale * growth) ? scale * growth : scale
 *             tracker = found_any || grow ? 0 : t
 * The tracker is an f32 0-dim tensor (exact for growth_interval <= 2^24,
 * which the options check). */
#include <math.h>
#include <stdlib.h>

#include "base/error.h"
#include "kernels/optim_kernels.h"
#include "kiln/amp.h"
#include "kiln/autograd.h"
#include "optim/optim_internal.h"
#include "runtime/runtime_internal.h"
#include "tensor/scope.h"
#include "tensor/tensor_internal.h"

#define SCALER_MAX_OPTIMIZERS 8
#define TRACKER_MAX_INTERVAL (INT64_C(1) << 24)

typedef enum scaler_stage { STAGE_UNSCALED = 1, STAGE_STEPPED } scaler_stage;

/* An optimizer seen since the last update. */
typedef struct opt_record {
    kiln_optimizer *opt; /* borrowed */
    scaler_stage stage;
    kiln_tensor *found; /* () f32 on the device: 1 when a gradient was inf/NaN; owned */
} opt_record;

struct kiln_grad_scaler {
    kiln_grad_scaler_opts o;
    kiln_tensor *scale;   /* () f32 on the device, owned; NULL before the first scale() */
    kiln_tensor *tracker; /* () f32 on the device, owned */
    double init_scale;    /* what the first scale() creates (opts, or a loaded state) */
    int64_t init_tracker;
    opt_record recs[SCALER_MAX_OPTIMIZERS];
    int n_recs;
    int64_t skipped;
};

kiln_grad_scaler_opts kiln_grad_scaler_defaults(void) {
    return (kiln_grad_scaler_opts){
        .init_scale = 65536.0, .growth_factor = 2.0, .backoff_factor = 0.5, .growth_interval = 2000, .enabled = true};
}

kiln_grad_scaler *kiln_grad_scaler_create(const kiln_grad_scaler_opts *opts) {
    kiln_grad_scaler_opts o = opts ? *opts : kiln_grad_scaler_defaults();
    const char *bad = NULL;
    if (!(isfinite(o.init_scale) && o.init_scale > 0)) bad = "init_scale must be finite and > 0";
    else if (!(o.growth_factor > 1.0 && isfinite(o.growth_factor))) bad = "growth_factor must be > 1";
    else if (!(o.backoff_factor > 0.0 && o.backoff_factor < 1.0)) bad = "backoff_factor must be in (0, 1)";
    else if (o.growth_interval < 1 || o.growth_interval > TRACKER_MAX_INTERVAL)
        bad = "growth_interval must be in [1, 2^24]";
    if (bad) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "start from kiln_grad_scaler_defaults()",
                   "kiln_grad_scaler_create: %s (init_scale %g, growth_factor %g, backoff_factor %g, "
                   "growth_interval %lld)",
                   bad, o.init_scale, o.growth_factor, o.backoff_factor, (long long)o.growth_interval);
        return NULL;
    }
    kiln_grad_scaler *s = calloc(1, sizeof *s);
    if (!s) {
        KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "kiln_grad_scaler_create: out of host memory");
        return NULL;
    }
    s->o = o;
    s->init_scale = o.init_scale;
    return s;
}

static void forget_records(kiln_grad_scaler *s) {
    for (int i = 0; i < s->n_recs; i++) kiln_tensor_drop(s->recs[i].found);
    s->n_recs = 0;
}

void kiln_grad_scaler_abandon_step(kiln_grad_scaler *s) {
    if (s) forget_records(s);
}

void kiln_grad_scaler_free(kiln_grad_scaler *s) {
    if (!s) return;
    forget_records(s);
    if (s->scale) kiln_tensor_drop(s->scale);
    if (s->tracker) kiln_tensor_drop(s->tracker);
    free(s);
}

const kiln_grad_scaler_opts *kiln_grad_scaler_options(const kiln_grad_scaler *s) { return s ? &s->o : NULL; }

int64_t kiln_grad_scaler_skipped_steps(const kiln_grad_scaler *s) { return s ? s->skipped : 0; }

/* Create the device state on `device` (first scale() call). */
static kiln_status ensure_state(kiln_grad_scaler *s, kiln_device device) {
    if (s->scale) return KILN_OK;
    s->scale = kiln_full(KILN_SHAPE(), s->init_scale, KILN_F32, device);
    s->tracker = s->scale ? kiln_full(KILN_SHAPE(), (double)s->init_tracker, KILN_F32, device) : NULL;
    if (s->scale && s->tracker) return KILN_OK;
    if (s->scale) kiln_tensor_drop(s->scale);
    s->scale = NULL;
    return kiln_error_last()->status;
}

kiln_tensor *kiln_grad_scaler_scale(kiln_grad_scaler *s, kiln_tensor *loss) {
    kiln_api_enter();
    if (!s) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_grad_scaler_scale: scaler is NULL");
        return kiln_api_return(NULL);
    }
    if (kiln_tensor_check(loss, "kiln_grad_scaler_scale")) return kiln_api_return(NULL);
    if (!s->o.enabled) return kiln_api_return(kiln_retain(loss));
    if (!kiln_dtype_is_floating(loss->dtype)) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass the floating loss",
                   "kiln_grad_scaler_scale: the loss is %s, not a floating tensor", kiln_dtype_name(loss->dtype));
        return kiln_api_return(NULL);
    }
    if (ensure_state(s, kiln_get_device(loss))) return kiln_api_return(NULL);
    kiln_tensor *scale = s->scale;
    if (!kiln_device_equal(kiln_get_device(loss), kiln_get_device(scale)) || loss->dtype != KILN_F32)
        scale = kiln_to(s->scale, kiln_get_device(loss), loss->dtype, 0);
    kiln_tensor *r = scale ? kiln_mul(loss, scale) : NULL;
    if (scale && scale != s->scale) kiln_tensor_drop(scale);
    return kiln_api_return(r);
}

static opt_record *find_record(kiln_grad_scaler *s, kiln_optimizer *opt) {
    for (int i = 0; i < s->n_recs; i++)
        if (s->recs[i].opt == opt) return &s->recs[i];
    return NULL;
}

/* One device's share of an unscale: 1/scale copied there once, and the sum
 * of g * 0 over its gradients (0, or NaN after an inf/NaN), as PyTorch's
 * scaler keeps a scale copy and a found-inf flag per device. */
#define SCALER_MAX_DEVICES 16
typedef struct device_share {
    kiln_device device;
    kiln_tensor *inv;   /* () f32 on device */
    kiln_tensor *total; /* () f32 on device, NULL before its first gradient */
} device_share;

static device_share *share_for(device_share *sh, int *n, kiln_tensor *inv0, kiln_device dev, kiln_status *st) {
    for (int k = 0; k < *n; k++)
        if (kiln_device_equal(sh[k].device, dev)) return &sh[k];
    if (*n == SCALER_MAX_DEVICES) {
        *st = KILN_RAISE(KILN_ERR_UNSUPPORTED, "split the parameters over fewer devices per optimizer",
                         "kiln_grad_scaler_unscale_: the gradients span more than %d devices", SCALER_MAX_DEVICES);
        return NULL;
    }
    kiln_tensor *inv = kiln_to(inv0, dev, KILN_F32, 0);
    if (!inv) {
        *st = kiln_error_last()->status;
        return NULL;
    }
    sh[*n] = (device_share){.device = dev, .inv = inv, .total = NULL};
    return &sh[(*n)++];
}

static _Atomic uint64_t fused_unscales;

uint64_t kiln_grad_scaler_fused_unscales(void) { return fused_unscales; }

/* The whole unscale as multi-tensor kernels (kiln_optim_kernels.unscale:
 * one launch per KILN_OPTIM_MULTI gradients on CUDA, against about five
 * ops per gradient below) where every gradient is f32 or f64, dense, on the
 * scale's device, and the device has the kernel; not under kiln_trace
 * (whose recorder sees ops and optimizer updates only) nor with the fused
 * optimizer kernels turned off. The gradients get the op-by-op path's bits
 * and *found the same 0 or 1. *done false: nothing was changed, take the
 * ops. On meta (a planned step) the flag is allocated and nothing runs. */
static kiln_status fused_unscale(kiln_grad_scaler *s, kiln_optimizer *opt, kiln_tensor *inv, kiln_tensor **found,
                                 bool *done) {
    *done = false;
    kiln_device dev = kiln_get_device(s->scale);
    if (!kiln_optim_fused_enabled() || kiln_optim_recording() || inv->dtype != KILN_F32) return KILN_OK;
    const kiln_optim_kernels *k =
        kiln_optim_kernels_for(dev.type == KILN_DEVICE_META ? kiln_meta_kernels() : dev.type);
    if (!k || !k->unscale) return KILN_OK;
    /* The gradients, held until their launch; any that does not qualify
     * sends the whole unscale to the ops. */
    kiln_tensor **g = calloc((size_t)opt->n + 1, sizeof *g);
    if (!g) return KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "kiln_grad_scaler_unscale_: out of host memory");
    int m = 0;
    bool ok = true;
    for (int i = 0; i < opt->n && ok; i++) {
        kiln_tensor *t = kiln_grad(opt->params[i]);
        if (!t) continue;
        g[m++] = t;
        ok = kiln_device_equal(kiln_get_device(t), dev) && (k->dtypes & (1u << t->dtype)) &&
             (t->dtype == KILN_F32 || t->dtype == KILN_F64) && kiln_is_contiguous(t);
    }
    kiln_tensor *flag = ok ? kiln_new_zeros(s->scale, KILN_SHAPE()) : NULL; /* () f32 */
    kiln_status st = ok && !flag ? kiln_error_last()->status : KILN_OK;
    void *stream = NULL;
    bool meta = dev.type == KILN_DEVICE_META;
    if (flag && !meta) st = kiln_tensor_kernel_stream(dev, &stream);
    const float *inv_data = kiln_tensor_kernel_view(inv).data;
    float *found_data = flag ? kiln_tensor_kernel_view(flag).data : NULL;
    for (int c = 0; flag && c < m && !st; c += KILN_OPTIM_MULTI) {
        kiln_unscale_step steps[KILN_OPTIM_MULTI];
        int n = m - c < KILN_OPTIM_MULTI ? m - c : KILN_OPTIM_MULTI;
        for (int j = 0; j < n && !st; j++) {
            st = kiln_tensor_ensure_strided(g[c + j]); /* a layout a CPU kernel left: flat memory first */
            steps[j] = (kiln_unscale_step){.dtype = g[c + j]->dtype,
                                           .n = kiln_numel(g[c + j]),
                                           .g = kiln_tensor_kernel_view(g[c + j]).data,
                                           .inv = inv_data,
                                           .found = found_data};
        }
        if (!st && !meta) st = k->unscale(steps, n, stream);
        if (!st) fused_unscales += (uint64_t)n;
    }
    for (int i = 0; i < m; i++) kiln_tensor_drop(g[i]);
    free(g);
    if (st && flag) kiln_tensor_drop(flag);
    if (st || !flag) return st;
    *found = flag;
    *done = true;
    return KILN_OK;
}

/* Multiply every gradient of opt by 1/scale (on the gradient's device) and
 * return the found-inf flag on the scale's device: the devices' sums are
 * brought there and added. */
static kiln_status unscale_grads(kiln_grad_scaler *s, kiln_optimizer *opt, kiln_tensor **found) {
    kiln_device dev = kiln_get_device(s->scale);
    kiln_tensor *one = kiln_new_ones(s->scale, KILN_SHAPE());
    kiln_tensor *inv = one ? kiln_div(one, s->scale) : NULL; /* () f32 */
    device_share sh[SCALER_MAX_DEVICES];
    int n_sh = 0;
    kiln_status st = inv ? KILN_OK : kiln_error_last()->status;
    bool fused = false;
    if (!st) st = fused_unscale(s, opt, inv, found, &fused);
    if (st || fused) {
        kiln_tensor_drop(inv);
        kiln_tensor_drop(one);
        return st;
    }
    for (int i = 0; i < opt->n && !st; i++) {
        kiln_tensor *g = kiln_grad(opt->params[i]);
        if (!g) continue;
        device_share *d = NULL;
        if (g->dtype == KILN_F16)
            st = KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                            "keep the parameters in f32 and run the forward under kiln_autocast_begin",
                            "kiln_grad_scaler_unscale_: parameter %d has an f16 gradient; attempting to unscale f16 "
                            "gradients (PyTorch refuses them too)",
                            i);
        else
            d = share_for(sh, &n_sh, inv, kiln_get_device(g), &st);
        kiln_tensor *inv_g = !d ? NULL : g->dtype == KILN_F32 ? kiln_retain(d->inv) : kiln_cast(d->inv, g->dtype);
        kiln_tensor *r = inv_g ? kiln_mul_(g, inv_g) : NULL;
        kiln_tensor *z = r ? kiln_mul_scalar(g, 0.0) : NULL;
        kiln_tensor *zs = z ? kiln_sum(z, 0, NULL, false) : NULL;
        kiln_tensor *zf = zs ? (zs->dtype == KILN_F32 ? kiln_retain(zs) : kiln_cast(zs, KILN_F32)) : NULL;
        kiln_tensor *t2 = zf ? (d->total ? kiln_add(d->total, zf) : kiln_retain(zf)) : NULL;
        if (!st && !t2) st = kiln_error_last()->status;
        kiln_tensor *tmp[] = {g, inv_g, r, z, zs, zf, d && t2 ? d->total : NULL};
        for (size_t k = 0; k < sizeof tmp / sizeof *tmp; k++)
            if (tmp[k]) kiln_tensor_drop(tmp[k]);
        if (d && t2) d->total = t2;
    }
    /* The devices' sums on the scale's device. */
    kiln_tensor *total = NULL;
    for (int k = 0; k < n_sh && !st; k++) {
        if (!sh[k].total) continue;
        kiln_tensor *here = kiln_to(sh[k].total, dev, KILN_F32, 0);
        kiln_tensor *t2 = here ? (total ? kiln_add(total, here) : kiln_retain(here)) : NULL;
        if (!t2) st = kiln_error_last()->status;
        if (here) kiln_tensor_drop(here);
        if (total) kiln_tensor_drop(total);
        total = t2;
    }
    kiln_tensor *flag = NULL;
    if (!st) {
        kiln_tensor *ne = total ? kiln_ne(total, total) : NULL;
        flag = ne ? kiln_cast(ne, KILN_F32) : total ? NULL : kiln_new_zeros(s->scale, KILN_SHAPE());
        if (ne) kiln_tensor_drop(ne);
        if (!flag) st = kiln_error_last()->status;
    }
    for (int k = 0; k < n_sh; k++) {
        kiln_tensor_drop(sh[k].inv);
        if (sh[k].total) kiln_tensor_drop(sh[k].total);
    }
    if (total) kiln_tensor_drop(total);
    if (inv) kiln_tensor_drop(inv);
    if (one) kiln_tensor_drop(one);
    *found = flag;
    return st;
}

static kiln_status unscale_body(kiln_grad_scaler *s, kiln_optimizer *opt, const char *fn, opt_record **out) {
    if (!s || !opt) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "%s: scaler or optimizer is NULL", fn);
    opt_record *r = find_record(s, opt);
    if (r && r->stage == STAGE_UNSCALED && out) { /* step after unscale_: already done */
        *out = r;
        return KILN_OK;
    }
    if (r)
        return KILN_RAISE(KILN_ERR_STATE, "call kiln_grad_scaler_update before the next unscale_ or step",
                          "%s: %s already called for this optimizer since the last update", fn,
                          r->stage == STAGE_UNSCALED ? "kiln_grad_scaler_unscale_ was" : "kiln_grad_scaler_step was");
    if (!s->scale)
        return KILN_RAISE(KILN_ERR_STATE, "scale the loss with kiln_grad_scaler_scale before backward",
                          "%s: the scaler has not scaled a loss yet", fn);
    if (s->n_recs == SCALER_MAX_OPTIMIZERS)
        return KILN_RAISE(KILN_ERR_STATE, "call kiln_grad_scaler_update after the optimizers' steps",
                          "%s: more than %d optimizers since the last update", fn, SCALER_MAX_OPTIMIZERS);
    kiln_tensor *found = NULL;
    KILN_TRY(unscale_grads(s, opt, &found));
    r = &s->recs[s->n_recs++];
    *r = (opt_record){.opt = opt, .stage = STAGE_UNSCALED, .found = found};
    if (out) *out = r;
    return KILN_OK;
}

kiln_status kiln_grad_scaler_unscale_(kiln_grad_scaler *s, kiln_optimizer *opt) {
    if (s && !s->o.enabled) return KILN_OK;
    kiln_api_enter();
    kiln_no_grad_begin();
    kiln_status st = unscale_body(s, opt, "kiln_grad_scaler_unscale_", NULL);
    kiln_grad_mode_end();
    kiln_api_leave();
    return st;
}

kiln_status kiln_grad_scaler_step(kiln_grad_scaler *s, kiln_optimizer *opt, bool *stepped) {
    if (stepped) *stepped = false;
    if (s && !s->o.enabled) {
        KILN_TRY(kiln_optimizer_step(opt));
        if (stepped) *stepped = true;
        return KILN_OK;
    }
    kiln_api_enter();
    kiln_no_grad_begin();
    opt_record *r = NULL;
    kiln_status st = unscale_body(s, opt, "kiln_grad_scaler_step", &r);
    if (!st && kiln_optim_recording()) {
        /* Under kiln_trace the host may not read the flag: the fused
         * kernels take it and skip the update on the device; the step
         * counts and the skip count are settled when the flag is read after
         * the traced call or the replay (optim_internal.h). */
        r->stage = STAGE_STEPPED;
        st = kiln_optimizer_step_unless_found(opt, r->found, &s->skipped);
        if (!st && stepped) *stepped = true;
        kiln_grad_mode_end();
        kiln_api_leave();
        return st;
    }
    double found = 0;
    /* A planned step (meta: no values) finds no inf and steps, as a step
     * that succeeds does: the optimizer's state is part of its memory. */
    if (!st && kiln_get_device(r->found).type != KILN_DEVICE_META)
        st = kiln_item(r->found, &found); /* the step's one host synchronisation */
    if (!st) {
        r->stage = STAGE_STEPPED;
        if (found == 0) st = kiln_optimizer_step(opt);
        else s->skipped++;
        if (!st && stepped) *stepped = found == 0;
    }
    kiln_grad_mode_end();
    kiln_api_leave();
    return st;
}

/* The new (scale, tracker) from the flags, as device ops. */
static kiln_status update_body(kiln_grad_scaler *s) {
    if (!s->n_recs)
        return KILN_RAISE(KILN_ERR_STATE, "call kiln_grad_scaler_step (or unscale_) before update",
                          "kiln_grad_scaler_update: no inf/NaN check was recorded since the last update");
    kiln_tensor *sum = kiln_retain(s->recs[0].found);
    for (int i = 1; i < s->n_recs && sum; i++) {
        kiln_tensor *t = kiln_add(sum, s->recs[i].found);
        kiln_tensor_drop(sum);
        sum = t;
    }
    kiln_tensor *zero = kiln_new_zeros(s->scale, KILN_SHAPE());
    kiln_tensor *interval = kiln_new_full(s->scale, KILN_SHAPE(), (double)s->o.growth_interval);
    kiln_tensor *found = sum && zero ? kiln_ne(sum, zero) : NULL;                      /* () bool */
    kiln_tensor *t1 = kiln_add_scalar(s->tracker, 1.0);                                /* () f32 */
    kiln_tensor *grow = t1 && interval ? kiln_eq(t1, interval) : NULL;                 /* () bool */
    kiln_tensor *cand = kiln_mul_scalar(s->scale, s->o.growth_factor);
    kiln_tensor *cand_ok = cand ? kiln_isfinite(cand) : NULL;
    kiln_tensor *grown = cand_ok ? kiln_where(cand_ok, cand, s->scale) : NULL;
    kiln_tensor *kept = grow && grown ? kiln_where(grow, grown, s->scale) : NULL;
    kiln_tensor *backed = kiln_mul_scalar(s->scale, s->o.backoff_factor);
    kiln_tensor *scale = found && backed && kept ? kiln_where(found, backed, kept) : NULL;
    kiln_tensor *t_kept = grow && zero && t1 ? kiln_where(grow, zero, t1) : NULL;
    kiln_tensor *tracker = found && t_kept ? kiln_where(found, zero, t_kept) : NULL;
    kiln_status st = scale && tracker ? KILN_OK : kiln_error_last()->status;
    kiln_tensor *tmp[] = {sum, zero, interval, found, t1, grow, cand, cand_ok, grown, kept, backed, t_kept};
    for (size_t k = 0; k < sizeof tmp / sizeof *tmp; k++)
        if (tmp[k]) kiln_tensor_drop(tmp[k]);
    if (st) {
        if (scale) kiln_tensor_drop(scale);
        if (tracker) kiln_tensor_drop(tracker);
        return st;
    }
    /* Written in place, so a traced step's replays update the state the
     * next replay reads (the same bits as replacing the tensors). */
    st = kiln_copy_(s->scale, scale, 0);
    if (!st) st = kiln_copy_(s->tracker, tracker, 0);
    kiln_tensor_drop(scale);
    kiln_tensor_drop(tracker);
    if (st) return st;
    forget_records(s);
    return KILN_OK;
}

kiln_status kiln_grad_scaler_update(kiln_grad_scaler *s) {
    if (!s) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_grad_scaler_update: scaler is NULL");
    if (!s->o.enabled) return KILN_OK;
    kiln_api_enter();
    kiln_no_grad_begin();
    kiln_status st = update_body(s);
    kiln_grad_mode_end();
    kiln_api_leave();
    return st;
}

static double read_scalar(kiln_tensor *t, double fallback) {
    if (!t) return fallback;
    double v = NAN;
    return kiln_item(t, &v) ? NAN : v;
}

double kiln_grad_scaler_get_scale(kiln_grad_scaler *s) {
    if (!s) return NAN;
    if (!s->o.enabled) return 1.0;
    return read_scalar(s->scale, s->init_scale);
}

int64_t kiln_grad_scaler_growth_tracker(kiln_grad_scaler *s) {
    if (!s || !s->o.enabled) return 0;
    double v = read_scalar(s->tracker, (double)s->init_tracker);
    return isfinite(v) ? (int64_t)v : -1;
}

kiln_status kiln_grad_scaler_load_state(kiln_grad_scaler *s, double scale, int64_t growth_tracker) {
    if (!s) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_grad_scaler_load_state: scaler is NULL");
    if (!(isfinite(scale) && scale > 0) || growth_tracker < 0 || growth_tracker >= s->o.growth_interval)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass a state saved from a scaler with the same options",
                          "kiln_grad_scaler_load_state: scale %g (must be finite and > 0) or growth tracker %lld "
                          "(must be in [0, %lld)) is out of range",
                          scale, (long long)growth_tracker, (long long)s->o.growth_interval);
    forget_records(s);
    if (s->scale) kiln_tensor_drop(s->scale);
    if (s->tracker) kiln_tensor_drop(s->tracker);
    s->scale = s->tracker = NULL;
    s->init_scale = scale;
    s->init_tracker = growth_tracker;
    return KILN_OK;
}

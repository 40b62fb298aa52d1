/* kiln train --amp auto|off|f16|bf16: which mixed precision a run uses and
 * why, and the AMP half of each step (autocast around the forwards, the
 * grad scaler around backward and the optimizer step). docs/training.md,
 * "Mixed precision". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kiln/kiln.h"
#include "train_run.h"
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

int train_amp_parse(const char *v, train_amp_mode *out) {
    static const char *const names[] = {"auto", "off", "f16", "bf16"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(v, names[i])) {
            *out = (train_amp_mode)i;
            return 1;
        }
    return 0;
}

/* Native bf16 arithmetic on this CPU: AVX512_BF16 (cpuid leaf 7 subleaf 1,
 * EAX bit 5) or AMX-BF16 (leaf 7 subleaf 0, EDX bit 22). */
static bool cpu_native_bf16(const char **which) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22 & 1)) {
        *which = "AMX-BF16";
        return true;
    }
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 5 & 1)) {
        *which = "AVX512_BF16";
        return true;
    }
#endif
    *which = NULL;
    return false;
}

/* Whether the CPU's fast kernel tables (oneDNN, then plain C) run conv2d
 * and mm in bf16; otherwise bf16 would take the portable reference
 * kernels, which are much slower than the fast f32 ones. */
static bool cpu_fast_bf16(void) {
    return kiln_kernels_fast_covers(KILN_DEVICE_CPU, "conv2d", KILN_BF16) &&
           kiln_kernels_fast_covers(KILN_DEVICE_CPU, "mm", KILN_BF16);
}

/* The compute capability of CUDA device `index` as major*10 + minor, or -1. */
static int cuda_capability(int index) {
    int major = 0, minor = 0;
    if (kiln_cuda_capability(index, &major, &minor) != KILN_OK) {
        kiln_error_clear();
        return -1;
    }
    return major * 10 + minor;
}

/* auto: CUDA with tensor cores (7.0+: f16; 8.0+ has bf16 too, f16 kept as
 * PyTorch's CUDA default); on the CPU bf16 only when the CPU has native
 * bf16 and Kiln's fast CPU kernels use it (so bf16 is actually faster). */
static kiln_dtype choose_auto(kiln_device dev, char *why, size_t size) {
    if (dev.type == KILN_DEVICE_CUDA) {
        int cc = cuda_capability(dev.index);
        if (cc >= 70) {
            snprintf(why, size, "cuda:%d has tensor cores (compute capability %d.%d)%s", dev.index, cc / 10, cc % 10,
                     cc >= 80 ? "; f16 is autocast's CUDA default (bf16 also runs natively: --amp bf16)" : "");
            return KILN_F16;
        }
        if (cc < 0) snprintf(why, size, "cuda:%d's compute capability is unknown (emulated device)", dev.index);
        else snprintf(why, size, "cuda:%d (compute capability %d.%d) has no tensor cores", dev.index, cc / 10, cc % 10);
        return KILN_F32;
    }
    const char *which = NULL;
    if (!cpu_native_bf16(&which)) {
        snprintf(why, size, "this CPU has no native bf16 (no AVX512_BF16 or AMX-BF16): bf16 would be emulated and slower");
        return KILN_F32;
    }
    if (!cpu_fast_bf16()) {
        snprintf(why, size,
                 "this CPU has native bf16 (%s), but this build's fast CPU kernels run no bf16 conv/matmul (built "
                 "without oneDNN): bf16 would run on the reference kernels, several times slower (docs/training.md)",
                 which);
        return KILN_F32;
    }
    snprintf(why, size, "this CPU has native bf16 (%s) and fast bf16 kernels", which);
    return KILN_BF16;
}

kiln_status train_amp_setup(train_run *r) {
    char why[320] = "";
    switch (r->a.amp) {
    case TRAIN_AMP_AUTO: r->amp = choose_auto(r->dev, why, sizeof why); break;
    case TRAIN_AMP_OFF: r->amp = KILN_F32, snprintf(why, sizeof why, "--amp off"); break;
    case TRAIN_AMP_F16: r->amp = KILN_F16, snprintf(why, sizeof why, "--amp f16"); break;
    case TRAIN_AMP_BF16: r->amp = KILN_BF16, snprintf(why, sizeof why, "--amp bf16"); break;
    }
    fprintf(stderr, "kiln train: mixed precision %s (%s)\n", r->amp == KILN_F32 ? "off" : kiln_dtype_name(r->amp), why);
    if (r->amp == KILN_F32) return KILN_OK;
    /* bf16 has f32's range: no loss scaling (as with PyTorch's bf16 autocast). */
    kiln_grad_scaler_opts o = kiln_grad_scaler_defaults();
    o.enabled = r->amp == KILN_F16;
    r->scaler = kiln_grad_scaler_create(&o);
    return r->scaler ? KILN_OK : kiln_error_last()->status;
}

kiln_status train_amp_backward(train_run *r, kiln_tensor *x, kiln_tensor *y, kiln_tensor **loss, kiln_tensor **hits) {
    /* The labels meet the output where it comes out (--split: the last stage). */
    kiln_status st = train_devices_labels(r, &y);
    if (st != KILN_OK) return st;
    if (r->amp == KILN_F32) return kiln_accumulate_backward(r->net, x, y, r->accum_live, &r->loss_opts, loss, hits);
    if ((st = kiln_autocast_begin(r->dev.type, r->amp)) != KILN_OK) return st;
    st = kiln_accumulate_backward_scaled(r->net, x, y, r->accum_live, &r->loss_opts, r->scaler, loss, hits);
    kiln_status end = kiln_autocast_end();
    return st != KILN_OK ? st : end;
}

kiln_status train_amp_step(train_run *r) {
    if (r->amp == KILN_F32) return kiln_optimizer_step(r->opt);
    bool stepped = false;
    kiln_status st = kiln_grad_scaler_step(r->scaler, r->opt, &stepped);
    if (st == KILN_OK && kiln_grad_scaler_options(r->scaler)->enabled) st = kiln_grad_scaler_update(r->scaler);
    return st;
}

void train_amp_save(train_run *r, kiln_train_state *s) {
    if (r->amp == KILN_F32) return;
    snprintf(s->amp, sizeof s->amp, "%s", kiln_dtype_name(r->amp));
    s->amp_scale = kiln_grad_scaler_get_scale(r->scaler);
    s->amp_growth_tracker = kiln_grad_scaler_growth_tracker(r->scaler);
}

kiln_status train_amp_resume(train_run *r, const kiln_train_state *s) {
    if (r->amp == KILN_F32 || !s->amp[0]) return KILN_OK;
    if (strcmp(s->amp, kiln_dtype_name(r->amp))) {
        fprintf(stderr, "kiln train: note: the checkpoint was trained with --amp %s, this run uses %s: the loss "
                        "scale starts afresh\n",
                s->amp, kiln_dtype_name(r->amp));
        return KILN_OK;
    }
    if (!kiln_grad_scaler_options(r->scaler)->enabled) return KILN_OK;
    return kiln_grad_scaler_load_state(r->scaler, s->amp_scale, s->amp_growth_tracker);
}

const char *train_amp_name(const train_run *r) { return r->amp == KILN_F32 ? "off" : kiln_dtype_name(r->amp); }

double train_amp_scale(train_run *r) {
    return r->amp == KILN_F32 ? 1.0 : kiln_grad_scaler_get_scale(r->scaler);
}

int64_t train_amp_skipped(const train_run *r) { return r->scaler ? kiln_grad_scaler_skipped_steps(r->scaler) : 0; }

/* One reduction and one host read per parameter (p * 0 is 0 for a finite
 * element and NaN otherwise): run only after a non-finite window loss. */
kiln_status train_amp_params_finite(train_run *r, bool *finite) {
    kiln_tensor **params = NULL;
    int np = 0;
    KILN_TRY(kiln_module_parameters(r->model, &params, &np));
    kiln_status st = KILN_OK;
    *finite = true;
    kiln_no_grad_begin();
    kiln_scope_begin();
    for (int i = 0; i < np && !st && *finite; i++) {
        double v = 0;
        kiln_tensor *z = kiln_sum(kiln_mul_scalar(params[i], 0.0), 0, NULL, false);
        st = z ? kiln_item(z, &v) : kiln_error_last()->status;
        if (!st && v != v) *finite = false;
    }
    kiln_status end = kiln_scope_end();
    kiln_grad_mode_end();
    free(params);
    return st ? st : end;
}

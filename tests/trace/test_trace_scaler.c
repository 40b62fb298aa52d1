/* A traced AMP training step with the grad scaler: under kiln_trace the
 * scaler's step does not read its found-inf flag on the host; the fused
 * optimizer kernels take it and skip the update on the device, and the
 * flag is read after the run to put back the step counts of a skipped step
 * (src/optim/optimizer.c kiln_optimizer_step_unless_found). Replayed on
 * fresh data, including a batch of infinities, each step equals an eager
 * twin's: the loss bit for bit on the finite steps, parameters, Adam's step
 * counts, the scale (backed off after the inf step on both) and the
 * skipped-step counts. On the CPU under bf16 autocast and on cuda:0 (emulated
 * in the emulation build: a CUDA graph) under f16. */
#include <math.h>
#include <string.h>

#include "optim/optim_internal.h"
#include "trace/trace_test_util.h"

typedef struct smodel {
    tt_model md;
    kiln_grad_scaler *sc;
} smodel;

static kiln_status scaled_step(void *user, kiln_tensor *const *in, kiln_tensor **out) {
    smodel *s = user;
    tt_model *md = &s->md;
    kiln_status st = kiln_optimizer_zero_grad(md->opt, true);
    if (st) return st;
    if ((st = kiln_autocast_begin(md->device.type, md->amp))) return st;
    kiln_tensor *y = kiln_module_forward(md->m, in[0]);
    kiln_tensor *loss = y ? kiln_cross_entropy(y, in[1], NULL) : NULL;
    kiln_autocast_end();
    kiln_release(y);
    if (!loss) return kiln_error_last()->status;
    kiln_tensor *scaled = kiln_grad_scaler_scale(s->sc, loss);
    st = scaled ? kiln_backward(scaled, NULL, false) : kiln_error_last()->status;
    kiln_release(scaled);
    bool stepped = false;
    if (!st) st = kiln_grad_scaler_step(s->sc, md->opt, &stepped);
    if (!st) st = kiln_grad_scaler_update(s->sc);
    if (st) {
        kiln_release(loss);
        return st;
    }
    out[0] = loss;
    return KILN_OK;
}

static smodel make(kiln_device dev, kiln_dtype amp) {
    smodel s = {.md = tt_make("tutorial_cnn_32x32x3.txt", dev, amp)};
    s.sc = kiln_grad_scaler_create(NULL);
    CHECK(s.sc != NULL);
    return s;
}

static bool same_steps(smodel *a, smodel *b) {
    if (a->md.opt->n != b->md.opt->n) return false;
    for (int i = 0; i < a->md.opt->n; i++)
        if (a->md.opt->steps[i] != b->md.opt->steps[i]) return false;
    return true;
}

static void check(kiln_device dev, kiln_dtype amp) {
    smodel a = make(dev, amp), b = make(dev, amp);
    if (!a.md.m || !b.md.m || !a.sc || !b.sc) return;
    char name[32];
    kiln_device_str(dev, name, sizeof name);
    kiln_manual_seed(3);
    kiln_tensor *in[2], *out = NULL;
    tt_batch(4, dev, &in[0], &in[1]);
    /* Warm-up: Adam's state and the scaler's exist before the trace. */
    CHECK_OK(scaled_step(&a, in, &out));
    kiln_release(out);
    CHECK_OK(scaled_step(&b, in, &out));
    kiln_release(out);
    kiln_program *p = NULL;
    kiln_tensor *traced = NULL;
    CHECK_OK(kiln_trace(scaled_step, &b, 2, in, 1, &traced, &p));
    CHECK_OK(scaled_step(&a, in, &out));
    CHECK_MSG(tt_same_bits(out, traced) && tt_same_state(a.md.m, b.md.m),
              "%s: the traced step differs from eager", name);
    kiln_release(out), kiln_release(traced);
    kiln_release(in[0]), kiln_release(in[1]);
    for (int s = 0; p && s < 4; s++) {
        tt_batch(4, dev, &in[0], &in[1]);
        bool inf_step = s == 1;
        if (inf_step) { /* every input infinite: the gradients are inf/NaN, the step is skipped */
            kiln_tensor *x = kiln_mul_scalar(in[0], INFINITY);
            kiln_release(in[0]);
            in[0] = x;
        }
        double scale_before = kiln_grad_scaler_get_scale(a.sc);
        kiln_tensor *lr = NULL, *le = NULL;
        CHECK_OK(kiln_program_run(p, 2, in, 1, &lr));
        CHECK_OK(scaled_step(&a, in, &le));
        if (!inf_step)
            CHECK_MSG(tt_same_bits(lr, le), "%s: replayed step %d: loss differs from eager", name, s);
        CHECK_MSG(tt_same_state(a.md.m, b.md.m), "%s: replayed step %d: parameters differ from eager", name,
                  s);
        CHECK_MSG(same_steps(&a, &b), "%s: replayed step %d: Adam's step counts differ from eager", name, s);
        double sa = kiln_grad_scaler_get_scale(a.sc), sb = kiln_grad_scaler_get_scale(b.sc);
        CHECK_MSG(sa == sb, "%s: replayed step %d: scale %g, eager %g", name, s, sb, sa);
        CHECK_MSG(!inf_step || sa == scale_before * 0.5, "%s: the inf step backed the scale off: %g -> %g",
                  name, scale_before, sa);
        int64_t ka = kiln_grad_scaler_skipped_steps(a.sc), kb = kiln_grad_scaler_skipped_steps(b.sc);
        CHECK_MSG(ka == kb && ka == (s >= 1 ? 1 : 0), "%s: replayed step %d: %lld skipped steps, eager %lld",
                  name, s, (long long)kb, (long long)ka);
        kiln_release(lr), kiln_release(le);
        kiln_release(in[0]), kiln_release(in[1]);
    }
    kiln_program_free(p);
    kiln_grad_scaler_free(a.sc), kiln_grad_scaler_free(b.sc);
    tt_free(&a.md), tt_free(&b.md);
}

int main(void) {
    if (kiln_init()) return 1;
    check(KILN_CPU, KILN_BF16);
    kiln_device cuda0 = {KILN_DEVICE_CUDA, 0};
    if (kiln_device_is_available(cuda0)) check(cuda0, KILN_F16);
    kiln_shutdown();
    return kt_finish();
}

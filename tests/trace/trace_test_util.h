/* What the trace tests share: a model with its Adam optimizer, the traced
 * training step (optionally under autocast), bitwise comparisons that also
 * insist on finite values (NaNs compare equal bit for bit), and the two
 * checks each device runs: inference replays and replayed training steps
 * against eager twins. */
#ifndef KILN_TESTS_TRACE_TRACE_TEST_UTIL_H
#define KILN_TESTS_TRACE_TRACE_TEST_UTIL_H

#include <math.h>
#include <string.h>

#include "test_util.h"

/* Replays per check (the emulated device runs fewer: its kernels are slow). */
static int tt_replays = 4;

typedef struct tt_model {
    kiln_module *m;
    kiln_optimizer *opt;
    kiln_dtype amp; /* KILN_F32: no autocast; else autocast to it inside the step */
    kiln_device device;
} tt_model;

static inline tt_model tt_make(const char *file, kiln_device device, kiln_dtype amp) {
    char path[1024];
    snprintf(path, sizeof path, "%s/models/%s", KILN_SOURCE_DIR, file);
    tt_model r = {.amp = amp, .device = device};
    kiln_manual_seed(11);
    CHECK_OK(kiln_model_spec_load(path, 3, 32, 32, &r.m));
    if (!r.m) return r;
    CHECK_OK(kiln_module_to(r.m, device));
    kiln_tensor **params = NULL;
    int n = 0;
    CHECK_OK(kiln_module_parameters(r.m, &params, &n));
    kiln_adam_opts o = kiln_adam_defaults();
    r.opt = kiln_adam(params, n, &o);
    CHECK(r.opt != NULL);
    free(params);
    return r;
}

/* The dropout MLP (3x8x8 input) of the random-op tests, seeded, with Adam,
 * on `device`, f32. */
static inline tt_model tt_dropout_model(kiln_device device) {
    tt_model r = {.amp = KILN_F32, .device = device};
    kiln_manual_seed(5);
    const char *spec = "flatten\nlinear 64\nrelu\ndropout 0.5\nlinear 10\n";
    CHECK_OK(kiln_model_spec_parse(spec, "dropout_mlp", 3, 8, 8, &r.m));
    if (!r.m) return r;
    CHECK_OK(kiln_module_to(r.m, device));
    kiln_tensor **params = NULL;
    int n = 0;
    CHECK_OK(kiln_module_parameters(r.m, &params, &n));
    kiln_adam_opts o = kiln_adam_defaults();
    r.opt = kiln_adam(params, n, &o);
    free(params);
    return r;
}

static inline void tt_free(tt_model *md) {
    kiln_optimizer_free(md->opt);
    kiln_module_free(md->m);
}

static inline kiln_status tt_step(void *user, kiln_tensor *const *in, kiln_tensor **out) {
    tt_model *md = user;
    kiln_status st = kiln_optimizer_zero_grad(md->opt, true);
    if (st) return st;
    if (md->amp != KILN_F32 && (st = kiln_autocast_begin(md->device.type, md->amp))) return st;
    kiln_tensor *y = kiln_module_forward(md->m, in[0]);
    kiln_tensor *loss = y ? kiln_cross_entropy(y, in[1], NULL) : NULL;
    if (md->amp != KILN_F32) kiln_autocast_end();
    kiln_release(y);
    if (!loss) return kiln_error_last()->status;
    st = kiln_backward(loss, NULL, false);
    if (!st) st = kiln_optimizer_step(md->opt);
    if (st) {
        kiln_release(loss);
        return st;
    }
    out[0] = loss;
    return KILN_OK;
}

static inline kiln_status tt_forward(void *user, kiln_tensor *const *in, kiln_tensor **out) {
    out[0] = kiln_module_forward((kiln_module *)user, in[0]);
    return out[0] ? KILN_OK : kiln_error_last()->status;
}

/* Bit-identical and finite (f32), read through the host. */
static inline bool tt_same_bits(kiln_tensor *a, kiln_tensor *b) {
    if (!a || !b || kiln_numel(a) != kiln_numel(b) || kiln_dtype_of(a) != kiln_dtype_of(b)) return false;
    kiln_device cpu = {KILN_DEVICE_CPU, 0};
    kiln_tensor *ha = kiln_to(a, cpu, kiln_dtype_of(a), KILN_COPY),
                *hb = kiln_to(b, cpu, kiln_dtype_of(b), KILN_COPY);
    kiln_tensor *ca = ha ? kiln_contiguous(ha) : NULL, *cb = hb ? kiln_contiguous(hb) : NULL;
    size_t bytes = (size_t)kiln_numel(a) * kiln_dtype_size(kiln_dtype_of(a));
    bool same = ca && cb && !memcmp(kiln_data_ptr(ca), kiln_data_ptr(cb), bytes);
    for (int64_t i = 0; same && kiln_dtype_of(a) == KILN_F32 && i < kiln_numel(a); i++)
        same = isfinite(((const float *)kiln_data_ptr(ca))[i]);
    kiln_release(ca), kiln_release(cb), kiln_release(ha), kiln_release(hb);
    return same;
}

/* Parameters and buffers (BatchNorm's running statistics). */
static inline bool tt_same_state(kiln_module *a, kiln_module *b) {
    kiln_named_tensor *x = NULL, *y = NULL;
    int nx = 0, ny = 0;
    bool same =
        !kiln_module_state_dict(a, &x, &nx) && !kiln_module_state_dict(b, &y, &ny) && nx == ny && nx > 0;
    for (int i = 0; same && i < nx; i++) same = tt_same_bits(x[i].tensor, y[i].tensor);
    free(x), free(y);
    return same;
}

static inline void tt_batch(int64_t n, kiln_device device, kiln_tensor **x, kiln_tensor **t) {
    *x = kiln_randn(KILN_SHAPE(n, 3, 32, 32), KILN_F32, device);
    int64_t labels[64];
    for (int64_t i = 0; i < n && i < 64; i++) labels[i] = (i * 7 + (int64_t)(kiln_numel(*x) % 5)) % 10;
    kiln_tensor *h = kiln_from_data(KILN_SHAPE(n), KILN_I64, (kiln_device){KILN_DEVICE_CPU, 0}, labels);
    *t = kiln_to(h, device, KILN_I64, 0);
    kiln_release(h);
}

/* Inference: traced once at batch 2, replayed 4 times on fresh data, each
 * bit-identical to eager; no allocator call after the first replay. */
static inline void tt_check_infer(const char *file, kiln_device device) {
    tt_model md = tt_make(file, device, KILN_F32);
    if (!md.m) return;
    kiln_module_train(md.m, false);
    kiln_no_grad_begin();
    kiln_manual_seed(7);
    kiln_tensor *x = kiln_randn(KILN_SHAPE(2, 3, 32, 32), KILN_F32, device);
    kiln_program *p = NULL;
    kiln_tensor *eager = NULL;
    CHECK_OK(kiln_trace(tt_forward, md.m, 1, &x, 1, &eager, &p));
    for (int round = 0; p && round < tt_replays; round++) {
        kiln_tensor *xi =
            round == 0 ? kiln_retain(x) : kiln_randn(KILN_SHAPE(2, 3, 32, 32), KILN_F32, device);
        kiln_tensor *y = NULL;
        int64_t before = kiln_memory_alloc_count();
        CHECK_OK(kiln_program_run(p, 1, &xi, 1, &y));
        if (round >= 1) CHECK_EQ_I(kiln_memory_alloc_count() - before, 0);
        kiln_tensor *ref = round == 0 ? kiln_retain(eager) : kiln_module_forward(md.m, xi);
        CHECK_MSG(tt_same_bits(y, ref), "%s: replay %d differs from eager", file, round);
        kiln_release(ref), kiln_release(y), kiln_release(xi);
    }
    kiln_program_free(p);
    kiln_release(eager), kiln_release(x);
    kiln_grad_mode_end();
    tt_free(&md);
}

/* Training: two identical models, one stepped eagerly, one by replays of a
 * step traced after an eager warm-up (Adam's state); losses, parameters
 * and buffers bit-identical after every step on fresh data; no allocator
 * call per replayed step. */
static inline void tt_check_train(const char *file, kiln_device device, kiln_dtype amp) {
    tt_model a = tt_make(file, device, amp), b = tt_make(file, device, amp);
    if (!a.m || !b.m) return;
    CHECK_MSG(tt_same_state(a.m, b.m), "%s: the two copies differ before training", file);
    kiln_manual_seed(3);
    kiln_tensor *in[2], *out = NULL;
    tt_batch(4, device, &in[0], &in[1]);
    CHECK_OK(tt_step(&a, in, &out));
    kiln_release(out);
    CHECK_OK(tt_step(&b, in, &out));
    kiln_release(out);
    kiln_program *p = NULL;
    kiln_tensor *traced_loss = NULL;
    CHECK_OK(kiln_trace(tt_step, &b, 2, in, 1, &traced_loss, &p));
    CHECK_OK(tt_step(&a, in, &out));
    CHECK_MSG(tt_same_bits(out, traced_loss) && tt_same_state(a.m, b.m),
              "%s (%s): the traced step differs from eager", file, kiln_dtype_name(amp));
    kiln_release(out), kiln_release(traced_loss);
    kiln_release(in[0]), kiln_release(in[1]);
    for (int s = 0; p && s < tt_replays - 1; s++) {
        tt_batch(4, device, &in[0], &in[1]);
        kiln_tensor *lr = NULL, *le = NULL;
        int64_t before = kiln_memory_alloc_count();
        CHECK_OK(kiln_program_run(p, 2, in, 1, &lr));
        if (s > 0) CHECK_EQ_I(kiln_memory_alloc_count() - before, 0);
        CHECK_OK(tt_step(&a, in, &le));
        CHECK_MSG(tt_same_bits(lr, le), "%s (%s): replayed step %d: loss differs from eager", file,
                  kiln_dtype_name(amp), s);
        CHECK_MSG(tt_same_state(a.m, b.m), "%s (%s): replayed step %d: parameters differ from eager", file,
                  kiln_dtype_name(amp), s);
        kiln_release(lr), kiln_release(le);
        kiln_release(in[0]), kiln_release(in[1]);
    }
    kiln_program_free(p);
    tt_free(&a), tt_free(&b);
}

#endif

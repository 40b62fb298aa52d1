/* A whole training step traced on the CPU: zero_grad, forward, cross
 * entropy, backward, Adam step (fused, in place on the parameters). Two
 * identical models: one stepped eagerly, one by replays of a program
 * traced from its second step (the first, eager, makes Adam's state).
 * After each step on fresh data the losses and every parameter and
 * buffer are bit-identical: the replayed Adam advances the step counts
 * its bias corrections use, BatchNorm's running statistics update in
 * place, prepared weight copies are refilled after each update. Zero
 * allocator calls per replayed step. The tutorial CNN and the small
 * ResNet (3 replayed steps each). Also (CNN): a step whose Adam state the traced call itself creates
 * is refused (warm-up), and so is a host read inside the call. */
#include <math.h>
#include <string.h>

#include "test_util.h"
#include "trace/trace_test_util.h"

typedef struct model {
    kiln_module *m;
    kiln_optimizer *opt;
} model;

static model make(const char *file) {
    char path[1024];
    snprintf(path, sizeof path, "%s/models/%s", KILN_SOURCE_DIR, file);
    model r = {0};
    kiln_manual_seed(11);
    CHECK_OK(kiln_model_spec_load(path, 3, 32, 32, &r.m));
    if (!r.m) return r;
    kiln_tensor **params = NULL;
    int n = 0;
    CHECK_OK(kiln_module_parameters(r.m, &params, &n));
    kiln_adam_opts o = kiln_adam_defaults();
    r.opt = kiln_adam(params, n, &o);
    CHECK(r.opt != NULL);
    free(params);
    return r;
}

static kiln_status step(void *user, kiln_tensor *const *in, kiln_tensor **out) {
    model *md = user;
    kiln_status zs = kiln_optimizer_zero_grad(md->opt, true);
    if (zs) return zs;
    kiln_tensor *y = kiln_module_forward(md->m, in[0]);
    if (!y) return kiln_error_last()->status;
    kiln_tensor *loss = kiln_cross_entropy(y, in[1], NULL);
    kiln_release(y);
    if (!loss) return kiln_error_last()->status;
    kiln_status st = kiln_backward(loss, NULL, false);
    if (!st) st = kiln_optimizer_step(md->opt);
    if (st) {
        kiln_release(loss);
        return st;
    }
    out[0] = loss;
    return KILN_OK;
}

/* A step that reads the loss on the host: not traceable. */
static kiln_status step_with_item(void *user, kiln_tensor *const *in, kiln_tensor **out) {
    kiln_status st = step(user, in, out);
    if (st) return st;
    double v;
    return kiln_item(out[0], &v);
}

/* Bit-identical and finite (NaNs compare equal bit for bit, so a run that
 * diverged would pass). */
static bool same_bits(kiln_tensor *a, kiln_tensor *b) {
    if (!a || !b || kiln_numel(a) != kiln_numel(b) || kiln_dtype_of(a) != kiln_dtype_of(b)) return false;
    kiln_tensor *ha = kiln_contiguous(a), *hb = kiln_contiguous(b);
    bool same = ha && hb &&
                !memcmp(kiln_data_ptr(ha), kiln_data_ptr(hb),
                        (size_t)kiln_numel(a) * kiln_dtype_size(kiln_dtype_of(a)));
    if (same && kiln_dtype_of(a) == KILN_F32) {
        const float *v = kiln_data_ptr(ha);
        for (int64_t i = 0; i < kiln_numel(a); i++)
            if (!isfinite(v[i])) same = false;
    }
    kiln_release(ha), kiln_release(hb);
    return same;
}

/* Parameters and buffers (BatchNorm's running statistics) of a and b. */
static bool same_state(kiln_module *a, kiln_module *b) {
    kiln_named_tensor *x = NULL, *y = NULL;
    int nx = 0, ny = 0;
    bool same =
        !kiln_module_state_dict(a, &x, &nx) && !kiln_module_state_dict(b, &y, &ny) && nx == ny && nx > 0;
    for (int i = 0; same && i < nx; i++) same = same_bits(x[i].tensor, y[i].tensor);
    free(x), free(y);
    return same;
}

static void batch(int64_t n, kiln_tensor **x, kiln_tensor **t) {
    *x = kiln_randn(KILN_SHAPE(n, 3, 32, 32), KILN_F32, KILN_CPU);
    int64_t labels[64];
    for (int64_t i = 0; i < n; i++) labels[i] = (i * 7 + (int64_t)(kiln_numel(*x) % 5)) % 10;
    *t = kiln_from_data(KILN_SHAPE(n), KILN_I64, KILN_CPU, labels);
}

static void check_model(const char *file, bool refusals) {
    model a = make(file), b = make(file);
    if (!a.m || !b.m) return;
    CHECK_MSG(same_state(a.m, b.m), "%s: the two copies differ before training", file);
    kiln_manual_seed(3);
    kiln_tensor *in[2], *out = NULL;
    /* Warm-up: one eager step each (Adam's state). */
    batch(4, &in[0], &in[1]);
    CHECK_OK(step(&a, in, &out));
    kiln_release(out);
    CHECK_OK(step(&b, in, &out));
    kiln_release(out);
    kiln_program *p = NULL;
    kiln_tensor *traced_loss = NULL;
    CHECK_OK(kiln_trace(step, &b, 2, in, 1, &traced_loss, &p));
    CHECK_OK(step(&a, in, &out));
    CHECK_MSG(same_bits(out, traced_loss) && same_state(a.m, b.m), "%s: the traced step differs from eager",
              file);
    kiln_release(out), kiln_release(traced_loss);
    kiln_release(in[0]), kiln_release(in[1]);
    for (int s = 0; p && s < 3; s++) {
        batch(4, &in[0], &in[1]);
        kiln_tensor *lr = NULL, *le = NULL;
        int64_t before = kiln_memory_alloc_count();
        CHECK_OK(kiln_program_run(p, 2, in, 1, &lr));
        if (s > 0) CHECK_EQ_I(kiln_memory_alloc_count() - before, 0);
        CHECK_OK(step(&a, in, &le));
        CHECK_MSG(same_bits(lr, le), "%s: replayed step %d: loss differs from eager", file, s);
        CHECK_MSG(same_state(a.m, b.m), "%s: replayed step %d: parameters differ from eager", file, s);
        kiln_release(lr), kiln_release(le);
        kiln_release(in[0]), kiln_release(in[1]);
    }
    CHECK_EQ_I(kiln_optimizer_step_count(a.opt) > 0, 1);
    kiln_program_free(p);
    if (refusals) {
        /* Refused: a host read inside the call. */
        batch(4, &in[0], &in[1]);
        CHECK_FAILS(kiln_trace(step_with_item, &b, 2, in, 1, NULL, &p), KILN_ERR_UNSUPPORTED, "the host");
        /* Refused: Adam's state made inside the traced call (no warm-up). */
        model c = make(file);
        CHECK_FAILS(kiln_trace(step, &c, 2, in, 1, NULL, &p), KILN_ERR_UNSUPPORTED,
                    "created by the traced call");
        kiln_release(in[0]), kiln_release(in[1]);
        kiln_optimizer_free(c.opt), kiln_module_free(c.m);
    }
    kiln_optimizer_free(a.opt), kiln_optimizer_free(b.opt);
    kiln_module_free(a.m), kiln_module_free(b.m);
}

int main(void) {
    CHECK_OK(kiln_init());
    check_model("tutorial_cnn_32x32x3.txt", true);
    check_model("resnet_small_cifar10.txt", false);
    /* Autocast to bf16 (the CPU's AMP dtype) inside the traced step. */
    tt_check_train("tutorial_cnn_32x32x3.txt", (kiln_device){KILN_DEVICE_CPU, 0}, KILN_BF16);
    kiln_shutdown();
    return kt_finish();
}

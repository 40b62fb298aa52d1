/* An AMP step of the tutorial CNN (models/tutorial_cnn_32x32x3.txt, built
 * by the model spec parser) on cuda:0 (the emulator's, or a real GPU)
 * against the f32 step on the same weights and batch: autocast f16 and
 * bf16 with the grad scaler; the loss within 1e-2 relative, the unscaled
 * gradients normwise within 2e-2 (f16) and 5e-2 (bf16) of the f32 ones,
 * and the scaled step taken, on a batch with a class signal after ten
 * f32 warm-up steps (see run()). Skipped (77) without a cuda:0 device. */
#include "test_util.h"

#define CUDA0 ((kiln_device){KILN_DEVICE_CUDA, 0})
#define BATCH 32
#define NOISE 0.5f
#define WARMUP 10

/* Every parameter's gradient copied to the host as f64, concatenated. */
static double *grads_host(kiln_tensor **params, int n, int64_t *total) {
    int64_t sum = 0;
    for (int i = 0; i < n; i++) sum += kiln_numel(params[i]);
    double *out = calloc((size_t)sum, sizeof *out);
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        kiln_tensor *g = kiln_grad(params[i]);
        kiln_tensor *g64 = g ? kiln_to(g, KILN_CPU, KILN_F64, 0) : NULL;
        CHECK(g64 != NULL);
        if (g64) kiln_to_host(g64, out + at, (size_t)kiln_numel(g64) * sizeof(double));
        at += kiln_numel(params[i]);
        kiln_release(g64);
        kiln_release(g);
    }
    *total = sum;
    return out;
}

/* Forward (under autocast when amp is f16/bf16), loss, backward; returns
 * the loss. With a scaler the backward starts from the scaled loss and the
 * gradients are unscaled before returning. */
static double step(kiln_module *m, kiln_optimizer *opt, kiln_tensor *x, kiln_tensor *y, kiln_dtype amp,
                   kiln_grad_scaler *scaler) {
    double lv = NAN;
    kiln_scope_begin();
    CHECK_OK(kiln_optimizer_zero_grad(opt, true));
    if (amp != KILN_F32) CHECK_OK(kiln_autocast_begin(KILN_DEVICE_CUDA, amp));
    kiln_tensor *logits = kiln_module_forward(m, x);
    CHECK_MSG(logits != NULL, "forward: %s", kiln_error_message());
    if (logits) CHECK_EQ_I(kiln_dtype_of(logits), amp);
    kiln_tensor *loss = logits ? kiln_cross_entropy(logits, y, NULL) : NULL;
    if (amp != KILN_F32) CHECK_OK(kiln_autocast_end());
    if (loss) {
        CHECK_EQ_I(kiln_dtype_of(loss), KILN_F32);
        kiln_tensor *root = scaler ? kiln_grad_scaler_scale(scaler, loss) : loss;
        CHECK_OK(kiln_backward(root, NULL, false));
        if (scaler) CHECK_OK(kiln_grad_scaler_unscale_(scaler, opt));
        CHECK_OK(kiln_item(loss, &lv));
    }
    kiln_scope_end();
    return lv;
}

static void run(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/models/tutorial_cnn_32x32x3.txt", KILN_SOURCE_DIR);
    kiln_module *m = NULL;
    CHECK_OK(kiln_model_spec_load(path, 3, 32, 32, &m));
    if (!m) return;
    kiln_manual_seed(7);
    CHECK_OK(kiln_module_to(m, CUDA0));
    kiln_tensor **params = NULL;
    int n = 0;
    CHECK_OK(kiln_module_parameters(m, &params, &n));
    kiln_optimizer *opt = kiln_adam(params, n, NULL);
    /* A batch with a signal, as real images have: each class a fixed
     * pattern, each sample its class's pattern plus noise. (Pure noise
     * inputs with arbitrary labels make every gradient a sum of terms of
     * random sign, whose relative error low precision blows up through
     * ReLU and max-pool decisions that flip.) */
    int64_t labels[BATCH];
    for (int i = 0; i < BATCH; i++) labels[i] = (i * 7 + 3) % 10;
    enum { IMG = 3 * 32 * 32 };
    float *host = malloc(sizeof(float) * BATCH * IMG), *pat = malloc(sizeof(float) * 10 * IMG);
    kiln_tensor *pt = kiln_randn(KILN_SHAPE(10, IMG), KILN_F32, KILN_CPU);
    kiln_tensor *nt = kiln_randn(KILN_SHAPE(BATCH, IMG), KILN_F32, KILN_CPU);
    CHECK_OK(kiln_to_host(pt, pat, sizeof(float) * 10 * IMG));
    CHECK_OK(kiln_to_host(nt, host, sizeof(float) * BATCH * IMG));
    for (int i = 0; i < BATCH; i++)
        for (int j = 0; j < IMG; j++) host[i * IMG + j] = pat[labels[i] * IMG + j] + NOISE * host[i * IMG + j];
    kiln_tensor *x = kiln_from_data(KILN_SHAPE(BATCH, 3, 32, 32), KILN_F32, CUDA0, host);
    free(host);
    free(pat);
    kiln_release(pt);
    kiln_release(nt);
    kiln_tensor *y = kiln_from_data(KILN_SHAPE(BATCH), KILN_I64, CUDA0, labels);

    /* Ten f32 Adam steps first (loss 2.30 -> ~0.6). At initialisation
     * (loss ~ ln 10) the gradient is a small sum of terms of both signs, so
     * ill-conditioned that merely rounding the weights and the input to
     * f16 (all arithmetic still f32) moves it by 2.4e-2 normwise, to bf16
     * by 6.4e-2: no low-precision step could meet the limits there. */
    for (int w = 0; w < WARMUP; w++) {
        step(m, opt, x, y, KILN_F32, NULL);
        CHECK_OK(kiln_optimizer_step(opt));
    }
    double ref_loss = step(m, opt, x, y, KILN_F32, NULL);
    int64_t total = 0;
    double *ref = grads_host(params, n, &total);
    double ref_norm = 0;
    for (int64_t i = 0; i < total; i++) ref_norm += ref[i] * ref[i];
    ref_norm = sqrt(ref_norm);
    CHECK(isfinite(ref_loss) && ref_norm > 0);

    const kiln_dtype amps[2] = {KILN_F16, KILN_BF16};
    const double tol[2] = {2e-2, 5e-2};
    for (int k = 0; k < 2; k++) {
        kiln_grad_scaler *s = kiln_grad_scaler_create(NULL);
        double loss = step(m, opt, x, y, amps[k], s);
        int64_t t2 = 0;
        double *g = grads_host(params, n, &t2);
        double diff = 0;
        for (int64_t i = 0; i < total && t2 == total; i++) diff += (g[i] - ref[i]) * (g[i] - ref[i]);
        double rel = sqrt(diff) / ref_norm, lrel = fabs(loss - ref_loss) / fabs(ref_loss);
        /* Per parameter, to show where the rounding goes. */
        int64_t at = 0;
        for (int i = 0; i < n && t2 == total; i++) {
            double d = 0, r2 = 0;
            for (int64_t j = at; j < at + kiln_numel(params[i]); j++)
                d += (g[j] - ref[j]) * (g[j] - ref[j]), r2 += ref[j] * ref[j];
            at += kiln_numel(params[i]);
            printf("  %s param %d (%lld): normwise rel %.2e\n", kiln_dtype_name(amps[k]), i,
                   (long long)kiln_numel(params[i]), r2 > 0 ? sqrt(d / r2) : sqrt(d));
        }
        printf("%s: loss %.6f vs f32 %.6f (rel %.2e), gradients normwise rel %.2e (limit %.0e)\n",
               kiln_dtype_name(amps[k]), loss, ref_loss, lrel, rel, tol[k]);
        CHECK_MSG(lrel <= 1e-2, "%s loss rel diff %g", kiln_dtype_name(amps[k]), lrel);
        CHECK_MSG(rel <= tol[k], "%s gradient normwise rel diff %g > %g", kiln_dtype_name(amps[k]), rel, tol[k]);
        /* The scaled gradients were finite: the step runs and the scale stays. */
        bool stepped = false;
        CHECK_OK(kiln_grad_scaler_step(s, opt, &stepped));
        CHECK(stepped);
        CHECK_OK(kiln_grad_scaler_update(s));
        CHECK(kiln_grad_scaler_get_scale(s) == 65536.0);
        free(g);
        kiln_grad_scaler_free(s);
        /* Restore the weights the f32 step saw: undo the SGD step exactly is
         * not possible, so the next dtype compares against a fresh f32 step. */
        if (k == 0) {
            free(ref);
            ref_loss = step(m, opt, x, y, KILN_F32, NULL);
            ref = grads_host(params, n, &total);
            ref_norm = 0;
            for (int64_t i = 0; i < total; i++) ref_norm += ref[i] * ref[i];
            ref_norm = sqrt(ref_norm);
        }
    }
    free(ref);
    kiln_optimizer_free(opt);
    free(params);
    kiln_release(x);
    kiln_release(y);
    kiln_module_free(m);
}

int main(void) {
    if (kiln_init()) return 1;
    if (!kiln_device_is_available(CUDA0)) {
        kiln_shutdown();
        kt_skip("no cuda:0 device (real or emulated) in this build");
    }
    run();
    kiln_shutdown();
    return kt_finish();
}

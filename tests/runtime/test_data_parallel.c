/* kiln_nn_data_parallel: the tutorial CNN (as one Sequential) over the
 * emulated cuda:0 and cuda:1 (or two GPUs), batch 7 split 4 + 3, gives the
 * loss and gradients of the same model on the CPU within f32 tolerance, for
 * two SGD steps (the replica follows the master's update), in eval mode
 * too; its state dict is PyTorch's ("module.<name>"); bad arguments are
 * refused by name. On the CPU alone: one device, identical to the module.
 * The two-device part skips visibly without two CUDA devices. */
#include <stdbool.h>

#include "test_util.h"

enum { BATCH = 7, NPARAM = 10, CAP = 700000 };
static double want[CAP], got[CAP];

static kiln_module *make_cnn(void) {
    kiln_manual_seed(42);
    kiln_module *l[] = {kiln_nn_conv2d(1, 32, 3, 1, 1, 1, 1, true),  kiln_nn_relu(), kiln_nn_max_pool2d(2, 2, 0),
                        kiln_nn_conv2d(32, 64, 3, 1, 1, 1, 1, true), kiln_nn_relu(), kiln_nn_max_pool2d(2, 2, 0),
                        kiln_nn_conv2d(64, 128, 3, 1, 1, 1, 1, true), kiln_nn_relu(), kiln_nn_max_pool2d(2, 2, 0),
                        kiln_nn_flatten(1, -1), kiln_nn_linear(128 * 3 * 3, 512, true), kiln_nn_relu(),
                        kiln_nn_linear(512, 10, true)};
    return kiln_nn_sequential(13, l);
}

/* Two SGD steps of cross_entropy(model(x_s), y) (x_s seeded per step);
 * loss[s] per step, and after the last backward every parameter's
 * gradient as doubles into g (state-dict order). Input on in_dev, labels
 * on out_dev. */
static void two_steps(kiln_module *model, kiln_device in_dev, kiln_device out_dev, double *loss, double *g,
                      int64_t *count) {
    kiln_tensor **params = NULL;
    int np = 0;
    CHECK_OK(kiln_module_parameters(model, &params, &np));
    CHECK_EQ_I(np, NPARAM);
    kiln_sgd_opts so = kiln_sgd_defaults(0.05);
    kiln_optimizer *opt = kiln_sgd(params, np, &so);
    int64_t labels[BATCH] = {3, 1, 4, 1, 5, 9, 2};
    for (int s = 0; s < 2; s++) {
        kiln_scope_begin();
        kiln_manual_seed(100 + (uint64_t)s);
        kiln_tensor *x = kiln_to(kiln_randn(KILN_SHAPE(BATCH, 1, 28, 28), KILN_F32, KILN_CPU), in_dev, KILN_F32, 0);
        kiln_tensor *y = kiln_to(kiln_from_data(KILN_SHAPE(BATCH), KILN_I64, KILN_CPU, labels), out_dev, KILN_I64, 0);
        CHECK_OK(kiln_optimizer_zero_grad(opt, true));
        kiln_tensor *logits = kiln_module_forward(model, x);
        CHECK_MSG(logits != NULL, "forward: %s", kiln_error_message());
        kiln_tensor *l = logits ? kiln_cross_entropy(logits, y, NULL) : NULL;
        if (l) CHECK_OK(kiln_backward(l, NULL, false));
        loss[s] = NAN;
        if (l) CHECK_OK(kiln_item(l, &loss[s]));
        if (s == 1) {
            *count = 0;
            for (int i = 0; i < np; i++) {
                kiln_tensor *gi = kiln_grad(params[i]);
                CHECK(gi != NULL);
                if (!gi) continue;
                kiln_tensor *h = kiln_to(gi, KILN_CPU, KILN_F64, 0);
                int64_t n = kiln_numel(h);
                if (*count + n <= CAP) CHECK_OK(kiln_to_host(h, g + *count, (size_t)n * sizeof(double)));
                *count += n;
            }
        }
        CHECK_OK(kiln_optimizer_step(opt));
        kiln_scope_end();
    }
    kiln_optimizer_free(opt);
    free(params);
}

static double rel_err(const double *a, const double *b, int64_t n) {
    double e = 0, s = 0;
    for (int64_t i = 0; i < n; i++) e += (a[i] - b[i]) * (a[i] - b[i]), s += b[i] * b[i];
    return s > 0 ? sqrt(e / s) : INFINITY;
}

static void compare(kiln_module *dp, kiln_device in_dev, kiln_device out_dev, const double *ref_loss, int64_t ref_n,
                    const char *what) {
    double loss[2];
    int64_t n = 0;
    two_steps(dp, in_dev, out_dev, loss, got, &n);
    CHECK_EQ_I(n, ref_n);
    for (int s = 0; s < 2; s++)
        CHECK_MSG(fabs(loss[s] - ref_loss[s]) <= 1e-5 * fabs(ref_loss[s]), "%s: step %d loss %.9g, one device %.9g",
                  what, s, loss[s], ref_loss[s]);
    double e = rel_err(got, want, n < ref_n ? n : ref_n);
    CHECK_MSG(e < 2e-5, "%s: step 2 gradients differ by %g (relative)", what, e);
}

int main(void) {
    CHECK_OK(kiln_init());
    kiln_module *ref = make_cnn();
    double ref_loss[2];
    int64_t ref_n = 0;
    two_steps(ref, KILN_CPU, KILN_CPU, ref_loss, want, &ref_n);
    kiln_module_free(ref);

    /* One device: the module itself, under PyTorch's state-dict names. */
    kiln_device cpu = KILN_CPU;
    kiln_module *dp1 = kiln_nn_data_parallel(make_cnn(), &cpu, 1, cpu);
    CHECK_MSG(dp1 != NULL, "%s", kiln_error_message());
    if (dp1) {
        kiln_tensor *w = kiln_module_state_get(dp1, "module.0.weight");
        CHECK_MSG(w != NULL, "no 'module.0.weight' in the state dict: %s", kiln_error_message());
        kiln_release(w);
        compare(dp1, cpu, cpu, ref_loss, ref_n, "DataParallel on the CPU alone");
        kiln_module_free(dp1);
    }
    /* Bad arguments, by name (the module is freed). */
    kiln_device twice[2] = {KILN_CPU, KILN_CPU};
    kiln_error_clear();
    CHECK(kiln_nn_data_parallel(make_cnn(), twice, 2, cpu) == NULL);
    CHECK_MSG(strstr(kiln_error_message(), "listed twice"), "%s", kiln_error_message());
    kiln_error_clear();
    CHECK(kiln_nn_data_parallel(make_cnn(), twice, 0, cpu) == NULL);
    CHECK_MSG(strstr(kiln_error_message(), "1..16 devices"), "%s", kiln_error_message());

    if (kiln_device_count(KILN_DEVICE_CUDA) < 2) {
        printf("SKIPPED the cuda:0/cuda:1 part: fewer than two CUDA devices (the CPU part ran)\n");
    } else {
        kiln_device devs[2] = {{KILN_DEVICE_CUDA, 0}, {KILN_DEVICE_CUDA, 1}};
        kiln_module *dp = kiln_nn_data_parallel(make_cnn(), devs, 2, devs[0]);
        CHECK_MSG(dp != NULL, "%s", kiln_error_message());
        if (dp) {
            compare(dp, devs[0], devs[0], ref_loss, ref_n, "DataParallel over cuda:0/cuda:1");
            /* Eval under no_grad (the replica's cached copies): it follows
             * the master's last update. */
            kiln_module_train(dp, false);
            kiln_no_grad_begin();
            kiln_scope_begin();
            kiln_manual_seed(5);
            kiln_tensor *x = kiln_randn(KILN_SHAPE(BATCH, 1, 28, 28), KILN_F32, KILN_CPU);
            kiln_module *master = kiln_module_child(dp, "module");
            kiln_tensor *a = kiln_to(kiln_module_forward(dp, kiln_to(x, devs[0], KILN_F32, 0)), KILN_CPU,
                                     KILN_F64, 0);
            kiln_tensor *b = kiln_to(kiln_module_forward(master, kiln_to(x, devs[0], KILN_F32, 0)), KILN_CPU,
                                     KILN_F64, 0);
            double va[BATCH * 10], vb[BATCH * 10];
            CHECK(a && b);
            if (a && b) {
                CHECK_OK(kiln_to_host(a, va, sizeof va));
                CHECK_OK(kiln_to_host(b, vb, sizeof vb));
                CHECK_MSG(rel_err(va, vb, BATCH * 10) < 1e-6, "eval outputs differ by %g", rel_err(va, vb, BATCH * 10));
            }
            kiln_scope_end();
            kiln_grad_mode_end();
            kiln_module_free(dp);
        }
    }
    kiln_shutdown();
    return kt_finish();
}

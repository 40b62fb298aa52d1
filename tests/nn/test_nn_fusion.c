/* Layer fusion in Sequential (src/nn/fusion.c):
 *   - the tutorial CNN of models/tutorial_cnn_28x28x1.txt and two models
 *     with odd shapes (strided/padded conv and pool, a non-contiguous
 *     input, a Dropout between Linear and ReLU, convs without bias) give
 *     the same output and the same gradient of every parameter (and of
 *     the input where it requires one) with fusion on and off: bitwise on
 *     the CPU reference kernels, and on the emulated or real cuda:0 when
 *     there is one (within 1e-6 normwise if not bitwise);
 *   - the fused ops really run when fusion is on and never when it is
 *     off (the profiler's table), kiln_nn_set_fusion and KILN_NN_FUSION;
 *   - the first conv's input gradient: conv2d_grad_input does not run for
 *     a conv whose input needs no gradient (the tutorial CNN's first conv
 *     on a plain batch), and runs for it when the input requires one. */
#include <stdlib.h>

#include "nn/nn_test_util.c"

/* ---- the profiler table: calls per row name ------------------------------------------------- */

/* The "# of Calls" of the row named exactly `name` in a profiler table
 * (names fill the first 55 columns, calls are the 8th field after them). */
static long long calls_in(const char *table, const char *name) {
    int rules = 0;
    for (const char *line = table; line && *line;) {
        const char *eol = strchr(line, '\n');
        size_t len = eol ? (size_t)(eol - line) : strlen(line);
        if (line[0] == '-') {
            rules++;
        } else if (rules == 2 && len > 55) {
            char row[56];
            snprintf(row, sizeof row, "%.55s", line);
            for (int k = (int)strlen(row) - 1; k >= 0 && row[k] == ' '; k--) row[k] = 0;
            char cols[8][32];
            if (strcmp(row, name) == 0 &&
                sscanf(line + 55, "%31s %31s %31s %31s %31s %31s %31s %31s", cols[0], cols[1], cols[2],
                       cols[3], cols[4], cols[5], cols[6], cols[7]) == 8)
                return atoll(cols[7]);
        }
        line += len + (eol ? 1 : 0);
    }
    return 0;
}

/* ---- one forward and backward -------------------------------------------------------------- */

#define MAX_PARAMS 16

typedef struct result {
    int n; /* arrays: [0] output, [1] input grad (or none), [2..] parameter grads */
    double *v[MAX_PARAMS + 2];
    int64_t len[MAX_PARAMS + 2];
    char *table; /* the profiler's table of the run */
} result;

static void result_free(result *r) {
    for (int i = 0; i < r->n; i++) free(r->v[i]);
    free(r->table);
    memset(r, 0, sizeof *r);
}

static void take(result *r, kiln_tensor *t) {
    r->len[r->n] = t ? kiln_numel(t) : -1;
    r->v[r->n++] = t ? kt_values(t) : NULL;
}

/* forward of m on x, backward with grad_output R; seed fixes dropout's draw. */
static bool run_once(kiln_module *m, kiln_tensor *x, kiln_tensor *R, bool fused, result *r) {
    memset(r, 0, sizeof *r);
    kiln_nn_set_fusion(fused);
    CHECK(kiln_nn_fusion_enabled() == fused);
    CHECK_OK(kiln_module_zero_grad(m, true));
    if (kiln_requires_grad(x)) CHECK_OK(kiln_set_grad(x, NULL));
    kiln_manual_seed(11);
    CHECK_OK(kiln_profiler_start(NULL));
    kiln_scope_begin();
    kiln_tensor *y = kiln_module_forward(m, x);
    CHECK_MSG(y != NULL, "forward (fusion %s): %s", fused ? "on" : "off", kiln_error_message());
    bool ok = y && kiln_backward(y, R, false) == KILN_OK;
    CHECK_MSG(ok, "backward (fusion %s): %s", fused ? "on" : "off", kiln_error_message());
    take(r, y);
    CHECK_OK(kiln_scope_end());
    CHECK_OK(kiln_profiler_stop());
    r->table = kiln_profiler_table(KILN_SORT_NAME, 0);
    CHECK(r->table != NULL);
    kiln_tensor *gx = kiln_requires_grad(x) ? kiln_grad(x) : NULL;
    take(r, gx);
    kiln_release(gx);
    kiln_tensor **ps = NULL;
    int np = 0;
    CHECK_OK(kiln_module_parameters(m, &ps, &np));
    CHECK(np <= MAX_PARAMS);
    for (int i = 0; i < np && i < MAX_PARAMS; i++) {
        kiln_tensor *g = kiln_grad(ps[i]);
        CHECK_MSG(g != NULL, "parameter %d has no gradient (fusion %s)", i, fused ? "on" : "off");
        take(r, g);
        kiln_release(g);
    }
    free(ps);
    return ok;
}

/* Same arrays bit for bit; else (when tol > 0) within tol normwise. */
static void compare(const char *what, const result *a, const result *b, double tol) {
    CHECK_EQ_I(a->n, b->n);
    double worst = 0;
    for (int i = 0; i < a->n && i < b->n; i++) {
        const char *name = i == 0 ? "output" : i == 1 ? "input grad" : "parameter grad";
        CHECK_MSG(a->len[i] == b->len[i], "%s: %s %d: %lld vs %lld elements", what, name, i,
                  (long long)a->len[i], (long long)b->len[i]);
        if (a->len[i] != b->len[i] || a->len[i] <= 0 || !a->v[i] || !b->v[i]) continue;
        size_t bytes = (size_t)a->len[i] * sizeof(double);
        if (memcmp(a->v[i], b->v[i], bytes) == 0) continue;
        double num = 0, den = 0;
        for (int64_t k = 0; k < a->len[i]; k++) {
            double d = a->v[i][k] - b->v[i][k];
            num += d * d, den += b->v[i][k] * b->v[i][k];
        }
        double rel = den > 0 ? sqrt(num / den) : sqrt(num);
        if (rel > worst) worst = rel;
        CHECK_MSG(tol > 0 && rel <= tol,
                  "%s: %s %d differs between fused and unfused (normwise %.3g, allowed %s)", what, name, i,
                  rel, tol > 0 ? "1e-6" : "bitwise");
    }
    if (worst > 0)
        printf("%s: fused vs unfused within %.3g normwise (output and gradients)\n", what, worst);
    else
        printf("%s: fused vs unfused bitwise equal (output and gradients)\n", what);
}

/* Fusion on vs off on one model; on: the fused ops named in `want` run
 * (each at least once), off: none of the fused ops runs. */
static void check_model(const char *what, kiln_module *m, kiln_tensor *x, const char *const *want, int n_want,
                        double tol) {
    kiln_shape ys;
    {
        kiln_nn_set_fusion(false);
        kiln_scope_begin();
        kiln_tensor *y = kiln_module_forward(m, x);
        CHECK_MSG(y != NULL, "%s: %s", what, kiln_error_message());
        ys = kiln_shape_of(y);
        CHECK_OK(kiln_scope_end());
    }
    kiln_tensor *R = kiln_randn(ys, KILN_F32, kiln_get_device(x));
    result off, on;
    if (run_once(m, x, R, false, &off) && run_once(m, x, R, true, &on)) {
        compare(what, &on, &off, tol);
        static const char *const fused_ops[] = {"conv2d_relu", "linear_act", "relu_max_pool2d",
                                                "relu_max_pool2d_backward", "conv2d_relu_max_pool2d",
                                                "relu_max_pool2d_backward_sum", "conv2d_relu_max_pool2d_grad_weight"};
        for (int i = 0; i < 7; i++)
            CHECK_MSG(calls_in(off.table, fused_ops[i]) == 0, "%s: %s ran with fusion off", what,
                      fused_ops[i]);
        for (int i = 0; i < n_want; i++)
            CHECK_MSG(calls_in(on.table, want[i]) > 0, "%s: %s did not run with fusion on", what, want[i]);
    }
    result_free(&off);
    result_free(&on);
    kiln_release(R);
}

/* ---- the models ------------------------------------------------------------------------------- */

static kiln_module *tutorial_cnn(void) {
    kiln_module *m = NULL;
    CHECK_OK(kiln_model_spec_load(KILN_SOURCE_DIR "/models/tutorial_cnn_28x28x1.txt", 1, 28, 28, &m));
    return m;
}

/* conv 3->5 k3 s2 p1, relu, maxpool k3 s2 p1, conv 5->4 k2 (no bias), relu,
 * flatten, linear 16->7, relu, linear 7->3 on (2, 3, 11, 9). */
static kiln_module *odd_model_a(void) {
    kiln_module *layers[] = {
        kiln_nn_conv2d(3, 5, 3, 2, 1, 1, 1, true),
        kiln_nn_relu(),
        kiln_nn_max_pool2d(3, 2, 1),
        kiln_nn_conv2d(5, 4, 2, 1, 0, 1, 1, false),
        kiln_nn_relu(),
        kiln_nn_flatten(1, -1),
        kiln_nn_linear(16, 7, true),
        kiln_nn_relu(),
        kiln_nn_linear(7, 3, true),
    };
    return kiln_nn_sequential((int)(sizeof layers / sizeof layers[0]), layers);
}

/* grouped conv 2->4 k3 p1 (groups 2, no bias), relu, flatten, linear
 * 80->6, dropout 0.5, relu, linear 6->2 (no bias) on a transposed (3, 2, 5, 4). */
static kiln_module *odd_model_b(void) {
    kiln_module *layers[] = {
        kiln_nn_conv2d(2, 4, 3, 1, 1, 1, 2, false),
        kiln_nn_relu(),
        kiln_nn_flatten(1, -1),
        kiln_nn_linear(80, 6, true),
        kiln_nn_dropout(0.5),
        kiln_nn_relu(),
        kiln_nn_linear(6, 2, false),
    };
    return kiln_nn_sequential((int)(sizeof layers / sizeof layers[0]), layers);
}

static void test_models(kiln_device dev, double tol) {
    char ds[32], what[96];
    kiln_device_str(dev, ds, sizeof ds);
    kiln_manual_seed(3);

    kiln_module *t = tutorial_cnn();
    kiln_module *a = odd_model_a();
    kiln_module *b = odd_model_b();
    CHECK(t && a && b);
    if (t && a && b) {
        CHECK_OK(kiln_module_to(t, dev));
        CHECK_OK(kiln_module_to(a, dev));
        CHECK_OK(kiln_module_to(b, dev));
        kiln_tensor *xt = kiln_randn(KILN_SHAPE(3, 1, 28, 28), KILN_F32, dev);
        snprintf(what, sizeof what, "tutorial CNN [%s]", ds);
        /* on the CPU the conv, ReLU, 2x2 pool runs are one op, whose backward takes the bias
         * gradient from the pooled gradients; elsewhere conv2d, relu_max_pool2d */
        static const char *const want_t_cpu[] = {"conv2d_relu_max_pool2d", "relu_max_pool2d_backward_sum",
                                                 "linear_act"};
        static const char *const want_t[] = {"relu_max_pool2d", "relu_max_pool2d_backward", "linear_act"};
        check_model(what, t, xt, dev.type == KILN_DEVICE_CPU ? want_t_cpu : want_t, 3, tol);

        kiln_tensor *xa = kiln_randn(KILN_SHAPE(2, 3, 11, 9), KILN_F32, dev);
        CHECK_OK(kiln_set_requires_grad(xa, true));
        snprintf(what, sizeof what, "odd model A [%s]", ds);
        static const char *const want_a[] = {"relu_max_pool2d", "conv2d_relu", "linear_act"};
        check_model(what, a, xa, want_a, 3, tol);

        kiln_tensor *xb0 = kiln_randn(KILN_SHAPE(3, 2, 4, 5), KILN_F32, dev);
        kiln_tensor *xb = kiln_transpose(xb0, 2, 3);
        CHECK(xb && !kiln_is_contiguous(xb));
        snprintf(what, sizeof what, "odd model B [%s]", ds);
        static const char *const want_b[] = {"conv2d_relu", "linear_act"};
        check_model(what, b, xb, want_b, 2, tol);
        kiln_release(xt);
        kiln_release(xa);
        kiln_release(xb0);
        kiln_release(xb);
    }
    kiln_module_free(t);
    kiln_module_free(a);
    kiln_module_free(b);
}

/* conv2d_grad_input runs for every conv but the tutorial CNN's first when
 * the batch needs no gradient (kiln_backward_conv2d checks needs_grad[0];
 * fused or not), and for all three when it does. Fused, a first layer
 * whose input needs no gradient gets its weight and bias gradients from
 * one op, conv2d_relu_max_pool2d_grad_weight. */
static void test_first_conv_input_grad(void) {
    kiln_module *t = tutorial_cnn();
    if (!t) return;
    for (int fused = 0; fused < 2; fused++)
        for (int xgrad = 0; xgrad < 2; xgrad++) {
            kiln_tensor *x = kiln_randn(KILN_SHAPE(2, 1, 28, 28), KILN_F32, KILN_CPU);
            if (xgrad) CHECK_OK(kiln_set_requires_grad(x, true));
            kiln_tensor *R = kiln_randn(KILN_SHAPE(2, 10), KILN_F32, KILN_CPU);
            result r;
            if (run_once(t, x, R, fused, &r)) {
                long long one = fused && !xgrad;
                CHECK_MSG(calls_in(r.table, "conv2d_grad_weight") == 3 - one,
                          "fusion %d, input %s grad: conv2d_grad_weight ran %lld times", fused,
                          xgrad ? "with" : "without", calls_in(r.table, "conv2d_grad_weight"));
                CHECK_MSG(calls_in(r.table, "conv2d_relu_max_pool2d_grad_weight") == one,
                          "fusion %d, input %s grad: conv2d_relu_max_pool2d_grad_weight ran %lld times", fused,
                          xgrad ? "with" : "without", calls_in(r.table, "conv2d_relu_max_pool2d_grad_weight"));
                long long gi = calls_in(r.table, "conv2d_grad_input");
                CHECK_MSG(gi == (xgrad ? 3 : 2), "fusion %d, input %s grad: conv2d_grad_input ran %lld times",
                          fused, xgrad ? "with" : "without", gi);
            }
            result_free(&r);
            kiln_release(x);
            kiln_release(R);
        }
    kiln_module_free(t);
}

/* The fused ops by hand against the chains they replace (public API). */
static void test_ops_match_chains(void) {
    kiln_manual_seed(5);
    kiln_tensor *x = kiln_randn(KILN_SHAPE(2, 3, 7, 6), KILN_F32, KILN_CPU);
    kiln_tensor *w = kiln_randn(KILN_SHAPE(4, 3, 3, 3), KILN_F32, KILN_CPU);
    kiln_tensor *b = kiln_randn(KILN_SHAPE(4), KILN_F32, KILN_CPU);
    kiln_conv2d_opts co = {.stride = {2, 1}, .padding = {1, 1}};
    kiln_pool2d_opts po = kiln_pool2d_defaults(2);
    kiln_scope_begin();
    kiln_tensor *c = kiln_conv2d(x, w, b, &co);
    double *fused = kt_values(kiln_conv2d_relu(x, w, b, &co)), *chain = kt_values(kiln_relu(c));
    CHECK(fused && chain && memcmp(fused, chain, sizeof(double) * (size_t)kiln_numel(c)) == 0);
    free(fused), free(chain);
    kiln_tensor *i1 = NULL, *i2 = NULL;
    kiln_tensor *p1 = kiln_relu_max_pool2d(c, &po, &i1), *p2 = kiln_max_pool2d(kiln_relu(c), &po, &i2);
    fused = kt_values(p1), chain = kt_values(p2);
    CHECK(fused && chain && memcmp(fused, chain, sizeof(double) * (size_t)kiln_numel(p2)) == 0);
    free(fused), free(chain);
    fused = kt_values(i1), chain = kt_values(i2);
    CHECK(fused && chain && memcmp(fused, chain, sizeof(double) * (size_t)kiln_numel(i2)) == 0);
    free(fused), free(chain);
    kiln_tensor *lw = kiln_randn(KILN_SHAPE(5, 126), KILN_F32, KILN_CPU);
    kiln_tensor *xt = kiln_transpose(x, 1, 3); /* non-contiguous (2, 6, 7, 3) */
    fused = kt_values(kiln_linear_act(xt, lw, NULL, KILN_ACT_RELU));
    chain = kt_values(kiln_relu(kiln_linear(kiln_flatten(xt, 1, -1), lw, NULL)));
    CHECK(fused && chain && memcmp(fused, chain, sizeof(double) * 10) == 0);
    free(fused), free(chain);
    CHECK_NULL_ERR(kiln_linear_act(x, lw, NULL, (kiln_activation)3), "activation 3");
    CHECK_NULL_ERR(kiln_conv2d_relu(kiln_randn(KILN_SHAPE(3, 7, 6), KILN_F32, KILN_CPU), w, b, &co),
                   "conv2d_relu");
    CHECK_OK(kiln_scope_end());
    kiln_release(x), kiln_release(w), kiln_release(b);
}

int main(void) {
    /* The comparisons are exact on the portable reference kernels (the
     * fast CPU kernels of unfused and fused ops may sum differently). */
    setenv("KILN_CPU_KERNELS", "reference", 1);
    /* KILN_NN_FUSION=0 starts fusion off; kiln_nn_set_fusion overrides it. */
    setenv("KILN_NN_FUSION", "0", 1);
    if (kiln_init()) return 1;
    CHECK(!kiln_nn_fusion_enabled());
    kiln_nn_set_fusion(true);
    CHECK(kiln_nn_fusion_enabled());
    test_ops_match_chains();
    test_models(KILN_CPU, 0);
    test_first_conv_input_grad();
    if (kiln_device_is_available(KILN_CUDA(0)))
        test_models(KILN_CUDA(0), 1e-6);
    else
        printf("no cuda:0: the CUDA comparison did not run\n");
    kiln_nn_set_fusion(true);
    kiln_shutdown();
    return kt_finish();
}

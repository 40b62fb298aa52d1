/* nn modules: names and shapes of the tutorial CNN, PyTorch's default
 * initialisation, to_dtype keeping BatchNorm in f32, the state dict round
 * trip and its errors, train/eval switching of BatchNorm and Dropout, the
 * residual blocks and every layer's forward. */
#include "nn/nn_test_util.c"
#include "nn/tutorial_cnn.c"

static void test_tutorial_names(void) {
    kiln_manual_seed(1);
    kiln_module *m = tcnn_new();
    CHECK(m != NULL);
    if (!m) return;
    static const struct {
        const char *name;
        kiln_shape shape;
    } want[] = {
        {"conv1.weight", KILN_SHAPE(32, 1, 3, 3)},   {"conv1.bias", KILN_SHAPE(32)},
        {"conv2.weight", KILN_SHAPE(64, 32, 3, 3)},  {"conv2.bias", KILN_SHAPE(64)},
        {"conv3.weight", KILN_SHAPE(128, 64, 3, 3)}, {"conv3.bias", KILN_SHAPE(128)},
        {"fc1.weight", KILN_SHAPE(512, 1152)},       {"fc1.bias", KILN_SHAPE(512)},
        {"fc2.weight", KILN_SHAPE(10, 512)},         {"fc2.bias", KILN_SHAPE(10)},
    };
    int nw = (int)(sizeof want / sizeof want[0]);
    kiln_named_tensor *items = NULL;
    int n = 0;
    CHECK_OK(kiln_module_named_parameters(m, &items, &n));
    CHECK_EQ_I(n, nw);
    for (int i = 0; i < n && i < nw; i++) {
        CHECK_MSG(strcmp(items[i].name, want[i].name) == 0, "%d: %s != %s", i, items[i].name, want[i].name);
        CHECK_MSG(kt_shape_is(items[i].tensor, want[i].shape), "%s has the wrong shape", items[i].name);
        CHECK(kiln_requires_grad(items[i].tensor) && kiln_is_leaf(items[i].tensor));
        CHECK(kiln_dtype_of(items[i].tensor) == KILN_F32);
    }
    free(items);
    CHECK_EQ_I(kiln_module_num_parameters(m), 320 + 18496 + 73856 + 590336 + 5130);
    CHECK(strcmp(kiln_module_kind(m), "OptimizedCNN") == 0);
    CHECK(strcmp(kiln_module_kind(kiln_module_child(m, "fc1")), "Linear") == 0);
    kiln_error_clear();
    CHECK(kiln_module_child(m, "fc3") == NULL && strstr(kiln_error_message(), "fc3"));
    CHECK_FAILS(kiln_module_add_child(m, "fc1", kiln_nn_relu()), KILN_ERR_INVALID_ARGUMENT, "fc1");
    kiln_tensor **ps = NULL;
    CHECK_OK(kiln_module_parameters(m, &ps, &n));
    CHECK_EQ_I(n, nw);
    free(ps);

    kiln_scope_begin();
    kiln_tensor *x = kiln_randn(KILN_SHAPE(2, 1, 28, 28), KILN_F32, KILN_CPU);
    kiln_tensor *y = kiln_module_forward(m, x);
    CHECK_MSG(kt_shape_is(y, KILN_SHAPE(2, 10)), "forward: %s", kiln_error_message());
    CHECK_OK(kiln_scope_end());
    kiln_module_free(m);
}

/* kaiming_uniform_(a=sqrt(5)) gives |w| <= 1/sqrt(fan_in); a uniform's
 * variance is bound^2 / 3. */
static void check_uniform(kiln_tensor *t, double bound, const char *what) {
    double *v = kt_values(t);
    CHECK(v != NULL);
    if (!v) return;
    int64_t n = kiln_numel(t);
    double mx = 0, mean = 0, var = 0;
    for (int64_t i = 0; i < n; i++) {
        mx = fmax(mx, fabs(v[i]));
        mean += v[i];
    }
    mean /= (double)n;
    for (int64_t i = 0; i < n; i++) var += (v[i] - mean) * (v[i] - mean);
    var /= (double)n;
    CHECK_MSG(mx <= bound && mx > 0.9 * bound, "%s: max |w| %g, bound %g", what, mx, bound);
    if (n >= 1000) {
        CHECK_MSG(fabs(mean) < 0.05 * bound, "%s: mean %g", what, mean);
        CHECK_MSG(fabs(var / (bound * bound / 3.0) - 1.0) < 0.1, "%s: variance %g vs %g", what, var,
                  bound * bound / 3.0);
    }
    free(v);
}

static void test_init(void) {
    kiln_manual_seed(2);
    kiln_module *m = tcnn_new();
    if (!m) return;
    kiln_scope_begin();
    check_uniform(kiln_module_state_get(m, "conv2.weight"), 1.0 / sqrt(32 * 9), "conv2.weight");
    check_uniform(kiln_module_state_get(m, "conv2.bias"), 1.0 / sqrt(32 * 9), "conv2.bias");
    check_uniform(kiln_module_state_get(m, "fc1.weight"), 1.0 / sqrt(1152), "fc1.weight");
    check_uniform(kiln_module_state_get(m, "fc1.bias"), 1.0 / sqrt(1152), "fc1.bias");
    check_uniform(kiln_module_state_get(m, "conv1.weight"), 1.0 / 3.0, "conv1.weight");
    /* Grouped conv: fan_in = in/groups * k * k. */
    kiln_module *g = kiln_nn_conv2d(8, 4, 3, 1, 0, 1, 2, true);
    CHECK(g && kt_shape_is(kiln_module_state_get(g, "weight"), KILN_SHAPE(4, 4, 3, 3)));
    if (g) check_uniform(kiln_module_state_get(g, "weight"), 1.0 / sqrt(36), "grouped weight");
    kiln_module_free(g);
    /* Reproducible with the seed. */
    kiln_manual_seed(2);
    kiln_module *m2 = tcnn_new();
    double *a = kt_values(kiln_module_state_get(m, "conv3.weight"));
    double *b = m2 ? kt_values(kiln_module_state_get(m2, "conv3.weight")) : NULL;
    CHECK(a && b && memcmp(a, b, 128 * 64 * 9 * sizeof(double)) == 0);
    free(a);
    free(b);
    kiln_module_free(m2);
    CHECK_OK(kiln_scope_end());
    kiln_module_free(m);
}

/* features = Sequential(Conv2d(1, 8, 3, padding 1, no bias), BatchNorm2d(8),
 * ReLU, MaxPool2d(2), Dropout(0.5), Flatten, Linear(8*14*14, 10)). */
static kiln_tensor *features_forward(kiln_module *m, kiln_tensor *x, void *user) {
    (void)user;
    return kiln_module_forward(kiln_module_child(m, "features"), x);
}

static kiln_module *bn_model_new(void) {
    kiln_module *layers[] = {
        kiln_nn_conv2d(1, 8, 3, 1, 1, 1, 1, false), kiln_nn_batch_norm2d(8, 1e-5, 0.1, true, true), kiln_nn_relu(),
        kiln_nn_max_pool2d(2, 0, 0), kiln_nn_dropout(0.5), kiln_nn_flatten(1, -1), kiln_nn_linear(8 * 14 * 14, 10, true),
    };
    kiln_module *m = kiln_nn_custom("Net", features_forward, NULL);
    if (m && kiln_module_add_child(m, "features", kiln_nn_sequential(7, layers))) {
        kiln_module_free(m);
        return NULL;
    }
    return m;
}

static bool keys_are(char *const *got, int n_got, const char *const *want, int n_want) {
    if (n_got != n_want) return false;
    for (int i = 0; i < n_got; i++)
        if (strcmp(got[i], want[i]) != 0) return false;
    return true;
}

/* PyTorch's load_state_dict return value: missing and unexpected keys,
 * for strict and non-strict loads; a strict error lists them all; a load
 * that matches nothing is an error. sd: b's n keys, in order. */
static void test_load_state_dict_keys(kiln_module *b, const kiln_named_tensor *sd, int n) {
    kiln_named_tensor items[10];
    for (int i = 0; i < n - 2; i++) items[i] = sd[i];
    items[n - 2] = (kiln_named_tensor){"fc.weight", sd[n - 2].tensor};
    items[n - 1] = (kiln_named_tensor){"fc.bias", sd[n - 1].tensor};
    static const char *const missing[] = {"features.6.weight", "features.6.bias"};
    static const char *const unexpected[] = {"fc.weight", "fc.bias"};
    kiln_incompatible_keys k = {0};
    CHECK_OK(kiln_module_load_state_dict(b, items, n, false, &k));
    CHECK(keys_are(k.missing_keys, k.n_missing, missing, 2));
    CHECK(keys_are(k.unexpected_keys, k.n_unexpected, unexpected, 2));
    kiln_incompatible_keys_free(&k);
    CHECK(k.n_missing == 0 && !k.missing_keys && !k.unexpected_keys);
    kiln_incompatible_keys_free(&k); /* a zeroed struct: no-op */

    /* Strict: every name in the message, the lists filled, nothing loaded. */
    kiln_tensor *w = kiln_module_state_get(b, "features.0.weight");
    uint64_t version = kiln_tensor_version(w);
    CHECK_FAILS(kiln_module_load_state_dict(b, items, n, true, &k), KILN_ERR_INVALID_ARGUMENT,
                "2 missing keys ('features.6.weight', 'features.6.bias') and 2 unexpected keys ('fc.weight', "
                "'fc.bias'); nothing was loaded");
    CHECK(keys_are(k.missing_keys, k.n_missing, missing, 2));
    CHECK(keys_are(k.unexpected_keys, k.n_unexpected, unexpected, 2));
    CHECK(kiln_tensor_version(w) == version);
    kiln_incompatible_keys_free(&k);

    /* A prefixed state dict matches nothing: an error even when not strict. */
    kiln_named_tensor prefixed[10];
    char names[10][64];
    for (int i = 0; i < n; i++) {
        snprintf(names[i], sizeof names[i], "module.%s", sd[i].name);
        prefixed[i] = (kiln_named_tensor){names[i], sd[i].tensor};
    }
    CHECK_FAILS(kiln_module_load_state_dict(b, prefixed, n, false, &k), KILN_ERR_INVALID_ARGUMENT,
                "no key of the state dict matches the module: 8 missing keys ('features.0.weight'");
    CHECK(strstr(kiln_error_message(), "'module.features.6.bias')") != NULL);
    CHECK(k.n_missing == n && k.n_unexpected == n);
    kiln_incompatible_keys_free(&k);
    CHECK_FAILS(kiln_module_load_state_dict(b, NULL, 0, false, NULL), KILN_ERR_INVALID_ARGUMENT,
                "no key of the state dict matches");
    CHECK(kiln_tensor_version(w) == version);
    kiln_release(w);
    CHECK_FAILS(kiln_module_load_state_dict(b, NULL, 3, false, NULL), KILN_ERR_INVALID_ARGUMENT, "items NULL");

    /* A strict error with more names than the message holds says how many
     * more there are. */
    kiln_named_tensor many[40];
    char long_names[40][48];
    for (int i = 0; i < 40; i++) {
        snprintf(long_names[i], sizeof long_names[i], "a.rather.long.prefix.of.layer.%02d.weight", i);
        many[i] = (kiln_named_tensor){long_names[i], sd[0].tensor};
    }
    CHECK_FAILS(kiln_module_load_state_dict(b, many, 40, true, &k), KILN_ERR_INVALID_ARGUMENT, " more)");
    CHECK(k.n_unexpected == 40 && k.n_missing == n);
    kiln_incompatible_keys_free(&k);
}

static void test_state_dict(void) {
    kiln_manual_seed(3);
    kiln_module *a = bn_model_new();
    kiln_manual_seed(4);
    kiln_module *b = bn_model_new();
    CHECK(a && b);
    if (!a || !b) return;
    static const char *const keys[] = {
        "features.0.weight",       "features.1.weight",       "features.1.bias",
        "features.1.running_mean", "features.1.running_var",  "features.1.num_batches_tracked",
        "features.6.weight",       "features.6.bias",
    };
    kiln_named_tensor *sd = NULL;
    int n = 0;
    CHECK_OK(kiln_module_state_dict(a, &sd, &n));
    CHECK_EQ_I(n, 8);
    for (int i = 0; i < n && i < 8; i++) CHECK_MSG(strcmp(sd[i].name, keys[i]) == 0, "%s != %s", sd[i].name, keys[i]);
    kiln_named_tensor *bufs = NULL;
    int nb = 0;
    CHECK_OK(kiln_module_named_buffers(a, &bufs, &nb));
    CHECK_EQ_I(nb, 3);
    free(bufs);

    kiln_scope_begin();
    CHECK_OK(kiln_module_load_state_dict(b, sd, n, true, NULL));
    for (int i = 0; i < n; i++) {
        double *va = kt_values(sd[i].tensor), *vb = kt_values(kiln_module_state_get(b, sd[i].name));
        CHECK_MSG(va && vb && memcmp(va, vb, (size_t)kiln_numel(sd[i].tensor) * sizeof(double)) == 0,
                  "%s differs after loading", sd[i].name);
        free(va);
        free(vb);
    }
    /* Loading copies in place: b's parameters are still its own tensors. */
    CHECK(!kiln_shares_storage(sd[0].tensor, kiln_module_state_get(b, "features.0.weight")));
    CHECK_FAILS(kiln_module_state_set(b, "features.6.bias", kiln_zeros(KILN_SHAPE(11), KILN_F32, KILN_CPU)),
                KILN_ERR_INVALID_ARGUMENT, "features.6.bias");
    CHECK_FAILS(kiln_module_state_set(b, "features.1.num_batches_tracked", kiln_zeros(KILN_SHAPE(), KILN_F32, KILN_CPU)),
                KILN_ERR_INVALID_ARGUMENT, "num_batches_tracked");
    CHECK_FAILS(kiln_module_state_set(b, "features.9.weight", kiln_zeros(KILN_SHAPE(1), KILN_F32, KILN_CPU)),
                KILN_ERR_INVALID_ARGUMENT, "features.9.weight");
    CHECK_FAILS(kiln_module_load_state_dict(b, sd, n - 1, true, NULL), KILN_ERR_INVALID_ARGUMENT,
                "features.6.bias");
    CHECK_OK(kiln_module_load_state_dict(b, sd, n - 1, false, NULL));
    CHECK_NULL_ERR(kiln_module_state_get(b, "features.1.nope"), "features.1.nope");
    CHECK_OK(kiln_scope_end());
    test_load_state_dict_keys(b, sd, n);
    free(sd);
    kiln_module_free(a);
    kiln_module_free(b);
}

static void test_to_dtype(void) {
    kiln_manual_seed(5);
    kiln_module *m = bn_model_new();
    if (!m) return;
    CHECK_OK(kiln_module_to_dtype(m, KILN_F16));
    kiln_scope_begin();
    CHECK(kiln_dtype_of(kiln_module_state_get(m, "features.0.weight")) == KILN_F16);
    CHECK(kiln_dtype_of(kiln_module_state_get(m, "features.6.weight")) == KILN_F16);
    CHECK(kiln_dtype_of(kiln_module_state_get(m, "features.1.weight")) == KILN_F32);
    CHECK(kiln_dtype_of(kiln_module_state_get(m, "features.1.running_var")) == KILN_F32);
    CHECK(kiln_dtype_of(kiln_module_state_get(m, "features.1.num_batches_tracked")) == KILN_I64);
    kiln_tensor *w = kiln_module_state_get(m, "features.0.weight");
    CHECK(kiln_requires_grad(w) && kiln_is_leaf(w));
    kiln_tensor *x = kiln_randn(KILN_SHAPE(2, 1, 28, 28), KILN_F16, KILN_CPU);
    kiln_tensor *y = kiln_module_forward(m, x);
    CHECK_MSG(y && kiln_dtype_of(y) == KILN_F16 && kt_shape_is(y, KILN_SHAPE(2, 10)), "f16 forward: %s",
              kiln_error_message());
    CHECK_FAILS(kiln_module_to_dtype(m, KILN_I32), KILN_ERR_INVALID_ARGUMENT, "i32");
    CHECK_OK(kiln_module_to(m, KILN_CPU));
    CHECK_OK(kiln_scope_end());
    kiln_module_free(m);
}

static void test_train_eval(void) {
    kiln_manual_seed(6);
    kiln_module *bn = kiln_nn_batch_norm2d(3, 1e-5, 0.1, true, true);
    CHECK(bn && kiln_module_is_training(bn));
    if (!bn) return;
    kiln_scope_begin();
    kiln_tensor *x = kiln_add_scalar(kiln_mul_scalar(kiln_randn(KILN_SHAPE(4, 3, 5, 5), KILN_F32, KILN_CPU), 2.0), 1.0);
    CHECK(kiln_module_forward(bn, x) != NULL);
    double *rm = kt_values(kiln_module_state_get(bn, "running_mean"));
    double *xv = kt_values(x), nbt = -1;
    CHECK_OK(kiln_item(kiln_module_state_get(bn, "num_batches_tracked"), &nbt));
    CHECK(nbt == 1.0);
    for (int c = 0; rm && xv && c < 3; c++) {
        double mean = 0;
        for (int nn = 0; nn < 4; nn++)
            for (int k = 0; k < 25; k++) mean += xv[(nn * 3 + c) * 25 + k];
        mean /= 100.0;
        CHECK_MSG(fabs(rm[c] - 0.1 * mean) < 1e-5, "running_mean[%d] %g, want %g", c, rm[c], 0.1 * mean);
    }
    free(rm);
    /* Eval: running statistics, no update. */
    kiln_module_train(bn, false);
    CHECK(!kiln_module_is_training(bn));
    kiln_tensor *y = kiln_module_forward(bn, x);
    double *rm2 = kt_values(kiln_module_state_get(bn, "running_mean"));
    double *rv2 = kt_values(kiln_module_state_get(bn, "running_var"));
    double *yv = kt_values(y);
    CHECK_OK(kiln_item(kiln_module_state_get(bn, "num_batches_tracked"), &nbt));
    CHECK(nbt == 1.0);
    for (int i = 0; yv && xv && rm2 && rv2 && i < 4 * 3 * 25; i++) {
        int c = (i / 25) % 3;
        double want = (xv[i] - rm2[c]) / sqrt(rv2[c] + 1e-5);
        if (fabs(yv[i] - want) > 1e-4 * (1 + fabs(want))) {
            CHECK_MSG(0, "eval bn[%d] %g, want %g", i, yv[i], want);
            break;
        }
    }
    free(rm2);
    free(rv2);
    free(yv);

    /* Dropout: identity in eval; zeros or x / (1 - p) in training. */
    kiln_module *drop = kiln_nn_dropout(0.5);
    kiln_module *seq = kiln_nn_sequential(1, &drop);
    kiln_module_train(seq, false);
    double *d_eval = kt_values(kiln_module_forward(seq, x));
    CHECK(d_eval && xv && memcmp(d_eval, xv, 300 * sizeof(double)) == 0);
    kiln_module_train(seq, true);
    CHECK(kiln_module_is_training(kiln_module_child(seq, "0")));
    double *d_train = kt_values(kiln_module_forward(seq, x));
    int zeros = 0, scaled = 0;
    for (int i = 0; d_train && xv && i < 300; i++) {
        if (d_train[i] == 0) zeros++;
        else if (fabs(d_train[i] - 2.0 * xv[i]) < 1e-5 * (1 + fabs(xv[i]))) scaled++;
    }
    CHECK_MSG(zeros + scaled == 300 && zeros > 100 && zeros < 200, "dropout: %d zeros, %d scaled", zeros, scaled);
    free(d_eval);
    free(d_train);
    free(xv);
    kiln_module_free(seq);
    CHECK_OK(kiln_scope_end());
    kiln_module_free(bn);
}

static void test_residual(void) {
    kiln_manual_seed(7);
    kiln_module *down = kiln_nn_basic_block(4, 8, 2), *same = kiln_nn_basic_block(8, 8, 1);
    CHECK(down && same);
    if (!down || !same) return;
    kiln_named_tensor *sd = NULL;
    int n = 0;
    CHECK_OK(kiln_module_state_dict(down, &sd, &n));
    /* conv1.weight, bn1 x5, conv2.weight, bn2 x5, shortcut.0.weight, shortcut.1 x5 */
    CHECK_EQ_I(n, 18);
    if (n == 18) {
        CHECK(strcmp(sd[0].name, "conv1.weight") == 0 && strcmp(sd[1].name, "bn1.weight") == 0);
        CHECK(strcmp(sd[12].name, "shortcut.0.weight") == 0 && kt_shape_is(sd[12].tensor, KILN_SHAPE(8, 4, 1, 1)));
        CHECK(strcmp(sd[15].name, "shortcut.1.running_mean") == 0);
    }
    free(sd);
    CHECK_OK(kiln_module_state_dict(same, &sd, &n));
    CHECK_EQ_I(n, 12);
    free(sd);
    kiln_scope_begin();
    kiln_tensor *x = kiln_randn(KILN_SHAPE(2, 4, 9, 9), KILN_F32, KILN_CPU);
    kiln_tensor *y = kiln_module_forward(down, x);
    CHECK_MSG(kt_shape_is(y, KILN_SHAPE(2, 8, 5, 5)), "basic block: %s", kiln_error_message());
    kiln_tensor *z = y ? kiln_module_forward(same, y) : NULL;
    CHECK(kt_shape_is(z, KILN_SHAPE(2, 8, 5, 5)));
    double *zv = kt_values(z);
    bool nonneg = zv != NULL;
    for (int i = 0; zv && i < 2 * 8 * 25; i++) nonneg = nonneg && zv[i] >= 0;
    CHECK(nonneg);
    free(zv);
    /* Generic residual with the identity: relu(tanh(x) + x). */
    kiln_module *r = kiln_nn_residual(kiln_nn_tanh(), NULL);
    double *rv = kt_values(kiln_module_forward(r, x)), *xv = kt_values(x);
    for (int i = 0; rv && xv && i < 5; i++) CHECK(fabs(rv[i] - fmax(0.0, tanh(xv[i]) + xv[i])) < 1e-5);
    free(rv);
    free(xv);
    kiln_module_free(r);
    CHECK_OK(kiln_scope_end());
    kiln_module_free(down);
    kiln_module_free(same);
}

static void test_layer_forwards(void) {
    kiln_manual_seed(8);
    kiln_scope_begin();
    kiln_tensor *x = kiln_randn(KILN_SHAPE(2, 4, 10, 10), KILN_F32, KILN_CPU);
    struct {
        kiln_module *m;
        kiln_shape out;
    } cases[] = {
        {kiln_nn_conv2d(4, 6, 3, 2, 1, 1, 1, true), KILN_SHAPE(2, 6, 5, 5)},
        {kiln_nn_conv2d(4, 6, 3, 1, 2, 2, 2, false), KILN_SHAPE(2, 6, 10, 10)},
        {kiln_nn_max_pool2d(3, 2, 1), KILN_SHAPE(2, 4, 5, 5)},
        {kiln_nn_avg_pool2d(2, 0, 0), KILN_SHAPE(2, 4, 5, 5)},
        {kiln_nn_adaptive_avg_pool2d(3, 1), KILN_SHAPE(2, 4, 3, 1)},
        {kiln_nn_flatten(1, -1), KILN_SHAPE(2, 400)},
        {kiln_nn_flatten(2, 3), KILN_SHAPE(2, 4, 100)},
        {kiln_nn_batch_norm2d(4, 1e-5, 0.1, false, false), KILN_SHAPE(2, 4, 10, 10)},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kiln_tensor *y = cases[i].m ? kiln_module_forward(cases[i].m, x) : NULL;
        CHECK_MSG(kt_shape_is(y, cases[i].out), "%s: %s", cases[i].m ? kiln_module_kind(cases[i].m) : "?",
                  kiln_error_message());
        kiln_module_free(cases[i].m);
    }
    kiln_tensor *lx = kiln_randn(KILN_SHAPE(3, 7), KILN_F32, KILN_CPU);
    kiln_module *lin = kiln_nn_linear(7, 5, false);
    CHECK(kt_shape_is(kiln_module_forward(lin, lx), KILN_SHAPE(3, 5)));
    kiln_named_tensor *items = NULL;
    int n = -1;
    CHECK_OK(kiln_module_named_parameters(lin, &items, &n));
    CHECK(n == 1);
    free(items);
    kiln_module_free(lin);

    double *xv = kt_values(lx);
    struct {
        kiln_module *m;
        int which;
    } acts[] = {{kiln_nn_relu(), 0}, {kiln_nn_gelu(false), 1}, {kiln_nn_silu(), 2}, {kiln_nn_sigmoid(), 3},
                {kiln_nn_tanh(), 4}, {kiln_nn_gelu(true), 5}};
    for (size_t k = 0; k < sizeof acts / sizeof acts[0]; k++) {
        double *yv = kt_values(kiln_module_forward(acts[k].m, lx));
        for (int i = 0; yv && xv && i < 21; i++) {
            double v = xv[i], want = 0;
            switch (acts[k].which) {
            case 0: want = v > 0 ? v : 0; break;
            case 1: want = 0.5 * v * (1 + erf(v / sqrt(2.0))); break;
            case 2: want = v / (1 + exp(-v)); break;
            case 3: want = 1 / (1 + exp(-v)); break;
            case 4: want = tanh(v); break;
            default: want = 0.5 * v * (1 + tanh(sqrt(2 / 3.14159265358979) * (v + 0.044715 * v * v * v))); break;
            }
            if (fabs(yv[i] - want) > 1e-5) {
                CHECK_MSG(0, "%s(%g) = %g, want %g", kiln_module_kind(acts[k].m), v, yv[i], want);
                break;
            }
        }
        CHECK(yv != NULL);
        free(yv);
        kiln_module_free(acts[k].m);
    }
    free(xv);
    CHECK(kiln_nn_conv2d(4, 6, 3, 1, 0, 1, 4, true) == NULL && strstr(kiln_error_message(), "groups"));
    CHECK(kiln_nn_dropout(1.5) == NULL);
    CHECK_OK(kiln_scope_end());
}

static bool same_values(kiln_tensor *a, kiln_tensor *b) {
    double *va = kt_values(a), *vb = kt_values(b);
    bool same = va && vb && kiln_numel(a) == kiln_numel(b) &&
                memcmp(va, vb, sizeof(double) * (size_t)kiln_numel(a)) == 0;
    free(va);
    free(vb);
    return same;
}

/* 0 means PyTorch's default in the constructors as in the op options. */
static void test_constructor_defaults(void) {
    kiln_scope_begin();
    kiln_tensor *x = kiln_add_scalar(kiln_randn(KILN_SHAPE(2, 4, 7, 7), KILN_F32, KILN_CPU), 1.0);
    kiln_manual_seed(11);
    kiln_module *c0 = kiln_nn_conv2d(4, 6, 3, 0, 1, 0, 0, true);
    kiln_manual_seed(11);
    kiln_module *c1 = kiln_nn_conv2d(4, 6, 3, 1, 1, 1, 1, true);
    CHECK_MSG(c0 && c1, "%s", kiln_error_message());
    if (c0 && c1) {
        kiln_tensor *y0 = kiln_module_forward(c0, x), *y1 = kiln_module_forward(c1, x);
        CHECK(y0 && kt_shape_is(y0, KILN_SHAPE(2, 6, 7, 7)) && same_values(y0, y1));
        CHECK(kt_shape_is(kiln_module_state_get(c0, "weight"), KILN_SHAPE(6, 4, 3, 3)));
    }
    kiln_module_free(c0);
    kiln_module_free(c1);
    CHECK(kiln_nn_conv2d(4, 6, 3, 1, 1, -1, 1, true) == NULL && strstr(kiln_error_message(), "dilation"));
    CHECK(kiln_nn_conv2d(4, 6, 3, 1, 1, 1, -2, true) == NULL && strstr(kiln_error_message(), "groups"));

    kiln_module *b0 = kiln_nn_batch_norm2d(4, 0, 0, true, true);
    kiln_module *b1 = kiln_nn_batch_norm2d(4, 1e-5, 0.1, true, true);
    CHECK_MSG(b0 && b1, "%s", kiln_error_message());
    if (b0 && b1) {
        CHECK(same_values(kiln_module_forward(b0, x), kiln_module_forward(b1, x)));
        CHECK(same_values(kiln_module_state_get(b0, "running_mean"), kiln_module_state_get(b1, "running_mean")));
        CHECK(same_values(kiln_module_state_get(b0, "running_var"), kiln_module_state_get(b1, "running_var")));
        /* eps shows in eval mode, where the variance is small. */
        kiln_module_train(b0, false);
        kiln_module_train(b1, false);
        kiln_tensor *tiny = kiln_mul_scalar(x, 1e-3);
        CHECK(same_values(kiln_module_forward(b0, tiny), kiln_module_forward(b1, tiny)));
    }
    kiln_module_free(b0);
    kiln_module_free(b1);
    /* A negative momentum keeps the running statistics (PyTorch's 0). */
    kiln_module *frozen = kiln_nn_batch_norm2d(4, 0, -1, true, true);
    CHECK(frozen != NULL);
    if (frozen) {
        CHECK(kiln_module_forward(frozen, x) != NULL);
        double *rm = kt_values(kiln_module_state_get(frozen, "running_mean")), nbt = -1;
        CHECK(rm && rm[0] == 0 && rm[3] == 0);
        free(rm);
        CHECK_OK(kiln_item(kiln_module_state_get(frozen, "num_batches_tracked"), &nbt));
        CHECK(nbt == 1.0);
    }
    kiln_module_free(frozen);
    CHECK(kiln_nn_batch_norm2d(4, -1e-5, 0.1, true, true) == NULL && strstr(kiln_error_message(), "eps -1e-05"));
    CHECK(kiln_nn_batch_norm2d(4, 1e-5, 1.5, true, true) == NULL && strstr(kiln_error_message(), "momentum 1.5"));
    CHECK_OK(kiln_scope_end());
}

static void test_zero_grad(void) {
    kiln_module *lin = kiln_nn_linear(3, 2, true);
    if (!lin) return;
    kiln_scope_begin();
    kiln_tensor *x = kiln_ones(KILN_SHAPE(4, 3), KILN_F32, KILN_CPU);
    CHECK_OK(kiln_backward(kiln_sum(kiln_module_forward(lin, x), 0, NULL, false), NULL, false));
    kiln_tensor *w = kiln_module_state_get(lin, "weight");
    kiln_tensor *g = kiln_grad(w);
    double *gv = kt_values(g);
    CHECK(gv && gv[0] == 4.0);
    free(gv);
    CHECK_OK(kiln_module_zero_grad(lin, false));
    gv = kt_values(kiln_grad(w));
    CHECK(gv && gv[0] == 0.0 && gv[5] == 0.0);
    free(gv);
    CHECK_OK(kiln_module_zero_grad(lin, true));
    kiln_error_clear();
    CHECK(kiln_grad(w) == NULL && kiln_error_last()->status == KILN_OK);
    CHECK_OK(kiln_scope_end());
    kiln_module_free(lin);
}

int main(void) {
    if (kiln_init()) return 1;
    test_tutorial_names();
    test_init();
    test_state_dict();
    test_to_dtype();
    test_train_eval();
    test_residual();
    test_layer_forwards();
    test_zero_grad();
    test_constructor_defaults();
    kiln_shutdown();
    return kt_finish();
}

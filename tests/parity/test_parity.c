/* PyTorch parity: two fixed-seed networks (the tutorial CNN, and a small
 * ResNet with BatchNorm and residual blocks) against golden files that
 * tests/parity/make_golden.py wrote with PyTorch (committed; this test does
 * not need torch). The parameters are loaded through the state dict API.
 *   f32: logits, loss, every parameter gradient and the BatchNorm running
 *        statistics after one forward/backward in train mode, each within a
 *        normwise relative error of 1e-5 (the golden values are computed in
 *        float64);
 *   f64: every parameter and buffer after three SGD steps (lr 0.05,
 *        momentum 0.9, nesterov, weight decay 1e-4) and, from the same
 *        start, after three Adam steps (lr 1e-3), within 1e-10. */
#include "nn/tutorial_cnn.c"
#include "parity/golden.c"

#define TOL_F32 1e-5
#define TOL_F64 1e-10

typedef kiln_module *(*net_builder)(void);

/* conv-bn-relu, BasicBlock(8, 8, 1) (identity shortcut), BasicBlock(8, 16,
 * 2) (projection shortcut), adaptive avg pool, flatten, linear: the
 * bn_resnet of make_golden.py. */
static kiln_module *bn_resnet_new(void) {
    kiln_module *mods[8] = {
        kiln_nn_conv2d(3, 8, 3, 1, 1, 1, 1, false),
        kiln_nn_batch_norm2d(8, 1e-5, 0.1, true, true),
        kiln_nn_relu(),
        kiln_nn_basic_block(8, 8, 1),
        kiln_nn_basic_block(8, 16, 2),
        kiln_nn_adaptive_avg_pool2d(1, 1),
        kiln_nn_flatten(1, -1),
        kiln_nn_linear(16, 10, true),
    };
    for (int i = 0; i < 8; i++) {
        if (!mods[i]) {
            for (int j = 0; j < 8; j++) kiln_module_free(mods[j]);
            return NULL;
        }
    }
    return kiln_nn_sequential(8, mods);
}

typedef struct net_case {
    const char *name;
    net_builder build;
    golden_file g;
    double max_fwd, max_grad, max_stats, max_sgd, max_adam;
    int n_stats; /* buffers compared after the forward */
} net_case;

/* Load every "param.<key>" of the golden file into m (strict: same keys). */
static bool load_params(kiln_module *m, const golden_file *g) {
    kiln_named_tensor *items = NULL;
    int n = 0, given = 0;
    if (kiln_module_state_dict(m, &items, &n)) return false;
    for (int i = 0; i < g->n; i++) given += !strncmp(g->t[i].name, "param.", 6);
    CHECK_MSG(given == n, "the golden file has %d state dict entries, the module %d", given, n);
    bool ok = given == n;
    kiln_named_tensor *vals = calloc((size_t)(n ? n : 1), sizeof *vals);
    kiln_scope_begin();
    for (int i = 0; ok && vals && i < n; i++) {
        const golden_tensor *t = gd_find(g, "param.", items[i].name);
        CHECK_MSG(t != NULL, "no golden value for %s", items[i].name);
        vals[i].name = items[i].name;
        vals[i].tensor = t ? gd_tensor(t, kiln_dtype_is_floating(kiln_dtype_of(items[i].tensor)) ? KILN_F32 : KILN_I64)
                           : NULL;
        ok = vals[i].tensor != NULL;
    }
    if (ok && vals) {
        kiln_status st = kiln_module_load_state_dict(m, vals, n, true, NULL);
        CHECK_MSG(st == KILN_OK, "load_state_dict: %s", kiln_error_message());
        ok = st == KILN_OK;
    }
    kiln_scope_end();
    free(vals);
    free(items);
    return ok && vals;
}

static double track(double *max, double err, const char *what, const char *key, double tol) {
    CHECK_MSG(err >= 0 && err <= tol, "%s %s: normwise relative error %.3g (tolerance %g)", what, key, err, tol);
    if (err < 0 || err > *max) *max = err < 0 ? INFINITY : err;
    return err;
}

/* One forward (train mode), cross-entropy and backward; *loss_out the loss. */
static kiln_tensor *train_forward(kiln_module *m, const golden_file *g, kiln_dtype dt, kiln_tensor **loss_out) {
    kiln_tensor *x = gd_tensor(gd_find(g, "", "input"), dt);
    kiln_tensor *y = gd_tensor(gd_find(g, "", "target"), KILN_I64);
    kiln_tensor *logits = x && y ? kiln_module_forward(m, x) : NULL;
    kiln_loss_opts lo = kiln_loss_defaults();
    kiln_tensor *loss = logits ? kiln_cross_entropy(logits, y, &lo) : NULL;
    kiln_status st = loss ? kiln_backward(loss, NULL, false) : kiln_error_last()->status;
    CHECK_MSG(st == KILN_OK, "forward/backward: %s", kiln_error_message());
    *loss_out = loss;
    return logits;
}

static void check_f32(net_case *c) {
    kiln_module *m = c->build();
    CHECK_MSG(m != NULL, "%s: %s", c->name, kiln_error_message());
    if (!m || !load_params(m, &c->g)) {
        kiln_module_free(m);
        return;
    }
    kiln_scope_begin();
    kiln_tensor *loss = NULL;
    kiln_tensor *logits = train_forward(m, &c->g, KILN_F32, &loss);
    track(&c->max_fwd, gd_relerr(logits, gd_find(&c->g, "", "logits")), c->name, "logits", TOL_F32);
    track(&c->max_fwd, gd_relerr(loss, gd_find(&c->g, "", "loss")), c->name, "loss", TOL_F32);
    kiln_named_tensor *items = NULL;
    int n = 0;
    CHECK_OK(kiln_module_named_parameters(m, &items, &n));
    for (int i = 0; i < n; i++) {
        const golden_tensor *gt = gd_find(&c->g, "grad.", items[i].name);
        CHECK_MSG(gt != NULL, "%s: no golden gradient for %s", c->name, items[i].name);
        if (gt) track(&c->max_grad, gd_relerr(kiln_grad(items[i].tensor), gt), c->name, items[i].name, TOL_F32);
    }
    free(items);
    items = NULL;
    CHECK_OK(kiln_module_named_buffers(m, &items, &n));
    for (int i = 0; i < n; i++) {
        const golden_tensor *gt = gd_find(&c->g, "after.", items[i].name);
        CHECK_MSG(gt != NULL, "%s: no golden buffer for %s", c->name, items[i].name);
        if (gt) track(&c->max_stats, gd_relerr(items[i].tensor, gt), c->name, items[i].name, TOL_F32);
        c->n_stats += gt != NULL;
    }
    free(items);
    kiln_scope_end();
    kiln_module_free(m);
}

/* Three steps of SGD or Adam in f64; every state dict entry against
 * "<prefix><key>". */
static void check_f64_steps(net_case *c, bool adam) {
    const char *prefix = adam ? "adam." : "sgd.";
    kiln_module *m = c->build();
    CHECK_MSG(m != NULL, "%s: %s", c->name, kiln_error_message());
    if (!m || kiln_module_to_dtype(m, KILN_F64) || !load_params(m, &c->g)) {
        CHECK_MSG(false, "%s: setup: %s", c->name, kiln_error_message());
        kiln_module_free(m);
        return;
    }
    kiln_tensor **params = NULL;
    int np = 0;
    kiln_optimizer *opt = NULL;
    if (!kiln_module_parameters(m, &params, &np)) {
        kiln_sgd_opts so = kiln_sgd_defaults(0.05);
        so.momentum = 0.9, so.nesterov = true, so.weight_decay = 1e-4;
        kiln_adam_opts ao = kiln_adam_defaults();
        ao.lr = 1e-3;
        opt = adam ? kiln_adam(params, np, &ao) : kiln_sgd(params, np, &so);
    }
    free(params);
    CHECK_MSG(opt != NULL, "%s: optimizer: %s", c->name, kiln_error_message());
    for (int step = 0; opt && step < 3; step++) {
        kiln_scope_begin();
        CHECK_OK(kiln_optimizer_zero_grad(opt, true));
        kiln_tensor *loss = NULL;
        train_forward(m, &c->g, KILN_F64, &loss);
        CHECK_OK(kiln_optimizer_step(opt));
        CHECK_OK(kiln_scope_end());
    }
    kiln_named_tensor *items = NULL;
    int n = 0;
    CHECK_OK(kiln_module_state_dict(m, &items, &n));
    for (int i = 0; i < n; i++) {
        const golden_tensor *gt = gd_find(&c->g, prefix, items[i].name);
        CHECK_MSG(gt != NULL, "%s: no golden %s%s", c->name, prefix, items[i].name);
        char what[64];
        snprintf(what, sizeof what, "%s %s", c->name, adam ? "Adam" : "SGD");
        if (gt) track(adam ? &c->max_adam : &c->max_sgd, gd_relerr(items[i].tensor, gt), what, items[i].name, TOL_F64);
    }
    free(items);
    kiln_optimizer_free(opt);
    kiln_module_free(m);
}

int main(void) {
    if (kiln_init()) return 1;
    net_case cases[2] = {{.name = "tutorial_cnn", .build = tcnn_new}, {.name = "bn_resnet", .build = bn_resnet_new}};
    for (int i = 0; i < 2; i++) {
        net_case *c = &cases[i];
        bool loaded = gd_load(c->name, &c->g);
        CHECK_MSG(loaded, "%s: golden file", c->name);
        if (!loaded) continue;
        check_f32(c);
        check_f64_steps(c, false);
        check_f64_steps(c, true);
        char stats[32] = "none";
        if (c->n_stats) snprintf(stats, sizeof stats, "%.2e", c->max_stats);
        printf("%-13s max normwise relative error: f32 logits/loss %.2e, grads %.2e, running stats %s; "
               "f64 SGD %.2e, Adam %.2e\n",
               c->name, c->max_fwd, c->max_grad, stats, c->max_sgd, c->max_adam);
        gd_free(&c->g);
    }
    kiln_shutdown();
    return kt_finish();
}

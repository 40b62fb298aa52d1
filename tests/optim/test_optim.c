/* Optimizers against hand-written float64 references of torch.optim's
 * update rules (3 steps each on a 3-element parameter, gradients of
 * sum(p^2) + c.p computed on the host), zero_grad in both modes, gradient
 * clipping and the LR schedules' closed forms. */
#include "nn/nn_test_util.c"

#define NP 3
static const double P0[NP] = {1.0, -2.0, 0.5};
static const double C[NP] = {0.3, -0.1, 0.8};

/* Set p's gradient to 2p + c from p's current values (host doubles). */
static void set_grad_from(kiln_tensor *p, const double *pv) {
    double g[NP];
    for (int i = 0; i < NP; i++) g[i] = 2.0 * pv[i] + C[i];
    kiln_tensor *gt = kt_tensor(KILN_SHAPE(NP), KILN_F64, g);
    CHECK_OK(kiln_set_grad(p, gt));
    kiln_release(gt);
}

static void check_close(const char *what, int step, const double *got, const double *want) {
    for (int i = 0; i < NP; i++)
        if (!(fabs(got[i] - want[i]) <= 1e-12 * (1.0 + fabs(want[i])))) {
            CHECK_MSG(0, "%s step %d: p[%d] = %.17g, want %.17g", what, step, i, got[i], want[i]);
            return;
        }
    CHECK(1);
}

typedef struct ref_sgd {
    double lr, mom, damp, wd;
    bool nesterov, maximize;
} ref_sgd;

static void run_sgd(const char *what, ref_sgd r) {
    kiln_tensor *p = kt_tensor(KILN_SHAPE(NP), KILN_F64, P0);
    CHECK_OK(kiln_set_requires_grad(p, true));
    kiln_sgd_opts o = kiln_sgd_defaults(r.lr);
    o.momentum = r.mom;
    o.dampening = r.damp;
    o.weight_decay = r.wd;
    o.nesterov = r.nesterov;
    o.maximize = r.maximize;
    kiln_optimizer *opt = kiln_sgd(&p, 1, &o);
    CHECK_MSG(opt != NULL, "%s: %s", what, kiln_error_message());
    double ref[NP], buf[NP] = {0};
    memcpy(ref, P0, sizeof ref);
    for (int t = 1; opt && t <= 3; t++) {
        set_grad_from(p, ref);
        for (int i = 0; i < NP; i++) {
            double g = 2.0 * ref[i] + C[i];
            if (r.maximize) g = -g;
            g += r.wd * ref[i];
            if (r.mom != 0) {
                buf[i] = t == 1 ? g : r.mom * buf[i] + (1.0 - r.damp) * g;
                g = r.nesterov ? g + r.mom * buf[i] : buf[i];
            }
            ref[i] = ref[i] - r.lr * g;
        }
        CHECK_OK(kiln_optimizer_step(opt));
        double *got = kt_values(p);
        if (got) check_close(what, t, got, ref);
        free(got);
    }
    if (opt && r.mom != 0) {
        kiln_tensor *b = kiln_optimizer_state(opt, 0, "momentum_buffer");
        double *bv = kt_values(b);
        CHECK(bv && fabs(bv[0] - buf[0]) < 1e-12);
        free(bv);
        kiln_release(b);
    }
    kiln_optimizer_free(opt);
    kiln_release(p);
}

typedef struct ref_adam {
    double lr, b1, b2, eps, wd;
    bool decoupled, amsgrad;
} ref_adam;

static void run_adam(const char *what, ref_adam r) {
    kiln_tensor *p = kt_tensor(KILN_SHAPE(NP), KILN_F64, P0);
    CHECK_OK(kiln_set_requires_grad(p, true));
    kiln_adam_opts o = r.decoupled ? kiln_adamw_defaults() : kiln_adam_defaults();
    o.lr = r.lr;
    o.weight_decay = r.wd;
    o.amsgrad = r.amsgrad;
    kiln_optimizer *opt = r.decoupled ? kiln_adamw(&p, 1, &o) : kiln_adam(&p, 1, &o);
    CHECK_MSG(opt != NULL, "%s: %s", what, kiln_error_message());
    double ref[NP], m[NP] = {0}, v[NP] = {0}, vmax[NP] = {0};
    memcpy(ref, P0, sizeof ref);
    for (int t = 1; opt && t <= 3; t++) {
        set_grad_from(p, ref);
        for (int i = 0; i < NP; i++) {
            double g = 2.0 * ref[i] + C[i];
            if (r.decoupled)
                ref[i] *= 1.0 - r.lr * r.wd;
            else
                g += r.wd * ref[i];
            m[i] = m[i] + (1.0 - r.b1) * (g - m[i]);
            v[i] = r.b2 * v[i] + (1.0 - r.b2) * g * g;
            vmax[i] = fmax(vmax[i], v[i]);
            double bc1 = 1.0 - pow(r.b1, t), bc2 = 1.0 - pow(r.b2, t);
            double denom = sqrt(r.amsgrad ? vmax[i] : v[i]) / sqrt(bc2) + r.eps;
            ref[i] -= r.lr / bc1 * m[i] / denom;
        }
        CHECK_OK(kiln_optimizer_step(opt));
        double *got = kt_values(p);
        if (got) check_close(what, t, got, ref);
        free(got);
    }
    CHECK_EQ_I(kiln_optimizer_step_count(opt), 3);
    kiln_optimizer_free(opt);
    kiln_release(p);
}

static void test_update_rules(void) {
    run_sgd("sgd plain", (ref_sgd){.lr = 0.1});
    run_sgd("sgd nesterov+wd", (ref_sgd){.lr = 0.1, .mom = 0.9, .wd = 0.1, .nesterov = true});
    run_sgd("sgd dampening", (ref_sgd){.lr = 0.05, .mom = 0.8, .damp = 0.3});
    run_sgd("sgd maximize", (ref_sgd){.lr = 0.1, .mom = 0.5, .maximize = true});
    run_adam("adam", (ref_adam){.lr = 0.1, .b1 = 0.9, .b2 = 0.999, .eps = 1e-8});
    run_adam("adam wd", (ref_adam){.lr = 0.1, .b1 = 0.9, .b2 = 0.999, .eps = 1e-8, .wd = 0.05});
    run_adam("adamw", (ref_adam){.lr = 0.1, .b1 = 0.9, .b2 = 0.999, .eps = 1e-8, .wd = 1e-2, .decoupled = true});
    run_adam("adam amsgrad", (ref_adam){.lr = 0.1, .b1 = 0.9, .b2 = 0.999, .eps = 1e-8, .amsgrad = true});
    kiln_adam_opts d = kiln_adamw_defaults();
    CHECK(d.lr == 1e-3 && d.beta1 == 0.9 && d.beta2 == 0.999 && d.eps == 1e-8 && d.weight_decay == 1e-2 && !d.amsgrad);
    CHECK(kiln_adam_defaults().weight_decay == 0.0);
    /* A parameter without a gradient is skipped. */
    kiln_tensor *p = kt_tensor(KILN_SHAPE(NP), KILN_F64, P0);
    kiln_set_requires_grad(p, true);
    kiln_optimizer *opt = kiln_adam(&p, 1, NULL);
    CHECK_OK(kiln_optimizer_step(opt));
    double *pv = kt_values(p);
    CHECK(pv && memcmp(pv, P0, sizeof P0) == 0);
    free(pv);
    kiln_error_clear();
    CHECK(kiln_optimizer_state(opt, 0, "exp_avg") == NULL && kiln_error_last()->status == KILN_OK);
    kiln_optimizer_free(opt);
    kiln_tensor *plain = kt_tensor(KILN_SHAPE(NP), KILN_F64, P0);
    kiln_error_clear();
    CHECK(kiln_adam(&plain, 1, NULL) == NULL && strstr(kiln_error_message(), "requires grad"));
    kiln_release(plain);
    kiln_release(p);
}

static void test_zero_grad(void) {
    kiln_tensor *p = kt_tensor(KILN_SHAPE(NP), KILN_F64, P0);
    kiln_set_requires_grad(p, true);
    kiln_optimizer *opt = kiln_sgd(&p, 1, &(kiln_sgd_opts){.lr = 0.1});
    set_grad_from(p, P0);
    kiln_tensor *g0 = kiln_grad(p);
    CHECK_OK(kiln_optimizer_zero_grad(opt, false));
    kiln_tensor *g1 = kiln_grad(p);
    CHECK(g1 == g0); /* zeroed in place: the same tensor */
    double *gv = kt_values(g1);
    CHECK(gv && gv[0] == 0 && gv[1] == 0 && gv[2] == 0);
    free(gv);
    kiln_release(g0);
    kiln_release(g1);
    CHECK_OK(kiln_optimizer_zero_grad(opt, true));
    kiln_error_clear();
    CHECK(kiln_grad(p) == NULL && kiln_error_last()->status == KILN_OK);
    kiln_optimizer_free(opt);
    kiln_release(p);
}

static void test_clip(void) {
    double a0[2] = {3.0, 4.0}, b0[1] = {12.0};
    kiln_tensor *p[3] = {kt_tensor(KILN_SHAPE(2), KILN_F64, a0), kt_tensor(KILN_SHAPE(1), KILN_F64, b0),
                         kt_tensor(KILN_SHAPE(1), KILN_F64, b0)};
    for (int i = 0; i < 3; i++) kiln_set_requires_grad(p[i], true);
    kiln_tensor *g0 = kt_tensor(KILN_SHAPE(2), KILN_F64, a0), *g1 = kt_tensor(KILN_SHAPE(1), KILN_F64, b0);
    kiln_set_grad(p[0], g0);
    kiln_set_grad(p[1], g1); /* p[2] has no gradient: skipped */
    kiln_release(g0);
    kiln_release(g1);
    kiln_scope_begin(); /* owns the gradient references kiln_grad returns below */
    double total = kiln_clip_grad_norm(p, 3, 100.0, 2.0);
    CHECK_MSG(fabs(total - 13.0) < 1e-12, "total %g: %s", total, kiln_error_message());
    double *g = kt_values(kiln_grad(p[0]));
    CHECK(g && g[0] == 3.0);
    free(g);
    total = kiln_clip_grad_norm(p, 3, 6.5, 2.0);
    CHECK(fabs(total - 13.0) < 1e-12);
    double coef = 6.5 / (13.0 + 1e-6);
    kiln_tensor *ga = kiln_grad(p[0]), *gb = kiln_grad(p[1]);
    double *va = kt_values(ga), *vb = kt_values(gb);
    CHECK(va && vb && fabs(va[0] - 3 * coef) < 1e-12 && fabs(va[1] - 4 * coef) < 1e-12 && fabs(vb[0] - 12 * coef) < 1e-12);
    free(va);
    free(vb);
    kiln_release(ga);
    kiln_release(gb);
    total = kiln_clip_grad_norm(p, 3, 1.0, INFINITY);
    CHECK_MSG(fabs(total - 12 * coef) < 1e-9, "inf norm %g", total);
    total = kiln_clip_grad_norm(p, 2, 1.0, 1.0);
    CHECK(fabs(total - 19 * coef / (12 * coef + 1e-6)) < 1e-9);
    CHECK(kiln_clip_grad_norm(p, 3, 1.0, 0.5) < 0);
    CHECK_OK(kiln_scope_end());
    for (int i = 0; i < 3; i++) kiln_release(p[i]);
}

static const double PI = 3.14159265358979323846;

static void check_schedule(const char *what, kiln_lr_scheduler *s, kiln_optimizer *opt, int n, double (*want)(int)) {
    CHECK_MSG(s != NULL, "%s: %s", what, kiln_error_message());
    for (int e = 0; s && e < n; e++) {
        if (e > 0) CHECK_OK(kiln_lr_scheduler_step(s));
        double got = kiln_lr_scheduler_get_lr(s), w = want(e);
        CHECK_MSG(fabs(got - w) <= 1e-15 * (1 + fabs(w)) && kiln_optimizer_get_lr(opt) == got,
                  "%s epoch %d: lr %.17g, want %.17g", what, e, got, w);
    }
}

static double want_step(int e) {
    static const double v[] = {0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025, 0.0125};
    return v[e];
}
static double want_cosine(int e) { return 0.001 + (0.1 - 0.001) * (1 + cos(PI * e / 10.0)) / 2; }
static double want_warmup(int e) { return 0.1 * (0.25 + 0.75 * (e < 4 ? e : 4) / 4.0); }
/* OneCycleLR(max_lr=1, total_steps=10): warm-up ends at step 0.3*10-1 = 2. */
static double want_one_cycle(int e) {
    double lo = 1.0 / 25, hi = 1.0, end = lo / 1e4;
    if (e <= 2) return hi + (lo - hi) / 2 * (cos(PI * e / 2.0) + 1);
    return end + (hi - end) / 2 * (cos(PI * (e - 2) / 7.0) + 1);
}

static void test_schedules(void) {
    kiln_tensor *p = kt_tensor(KILN_SHAPE(NP), KILN_F64, P0);
    kiln_set_requires_grad(p, true);
    kiln_optimizer *opt = kiln_sgd(&p, 1, &(kiln_sgd_opts){.lr = 0.1});
    kiln_lr_scheduler *s = kiln_lr_step_create(opt, 3, 0.5);
    check_schedule("step", s, opt, 10, want_step);
    kiln_lr_scheduler_free(s);
    kiln_optimizer_set_lr(opt, 0.1);
    s = kiln_lr_cosine_create(opt, 10, 0.001);
    check_schedule("cosine", s, opt, 15, want_cosine);
    kiln_lr_scheduler_free(s);
    kiln_optimizer_set_lr(opt, 0.1);
    s = kiln_lr_warmup_create(opt, 0.25, 4);
    check_schedule("warmup", s, opt, 8, want_warmup);
    kiln_lr_scheduler_free(s);
    s = kiln_lr_one_cycle_create(opt, 1.0, 10, 0.3, 25, 1e4);
    check_schedule("one-cycle", s, opt, 10, want_one_cycle);
    CHECK(fabs(kiln_lr_scheduler_get_lr(s) - 4e-6) < 1e-18);
    CHECK_OK(kiln_lr_scheduler_step(s)); /* step 10 == total_steps: allowed, as in PyTorch */
    CHECK_FAILS(kiln_lr_scheduler_step(s), KILN_ERR_STATE, "total_steps");
    kiln_lr_scheduler_free(s);
    CHECK(kiln_lr_one_cycle_create(opt, 1.0, 2, 0.3, 25, 1e4) == NULL);
    kiln_optimizer_free(opt);
    kiln_release(p);
}

int main(void) {
    if (kiln_init()) return 1;
    test_update_rules();
    test_zero_grad();
    test_clip();
    test_schedules();
    kiln_shutdown();
    return kt_finish();
}

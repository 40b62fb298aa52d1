/* The fused optimizer kernels (kernels/optim_kernels.h) against the
 * op-by-op updates of src/optim/optimizer.c: from the same parameters and
 * gradients, three steps of each configuration (SGD plain, momentum with
 * dampening, nesterov, weight decay, maximize; Adam with and without weight
 * decay, amsgrad, maximize; AdamW) must leave the same bits in the
 * parameters and every state tensor, in f32 and f64, for a small tensor and
 * one large enough for the parallel loop; and a model of 20 parameters of
 * mixed sizes and dtypes, whose updates must take two calls a step (up to
 * KILN_OPTIM_MULTI parameters per call: one kernel launch on CUDA). Where
 * cuda:0 exists (a GPU, or
 * the emulation build) the same runs there, and its results must also be
 * the CPU's, bit for bit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"
#include "optim/optim_internal.h"
#include "test_util.h"

typedef enum { OPT_SGD, OPT_ADAM, OPT_ADAMW } opt_kind;

typedef struct config {
    const char *name;
    opt_kind kind;
    kiln_sgd_opts sgd;
    kiln_adam_opts adam;
} config;

static const char *const state_names[3][3] = {
    {"momentum_buffer", NULL, NULL}, {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}, {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}};

/* Fill a host buffer with values of both signs and varied magnitude. */
static void fill(double *v, int64_t n, int salt) {
    for (int64_t i = 0; i < n; i++)
        v[i] = sin(0.37 * (double)(i + 1) * (salt + 1)) * pow(10.0, (double)((i * 7 + salt) % 5) - 3.0);
}

static kiln_tensor *tensor_of(const double *v, int64_t n, kiln_dtype dt, kiln_device dev) {
    kiln_tensor *t64 = kiln_from_data(KILN_SHAPE(n), KILN_F64, KILN_CPU, v);
    kiln_tensor *t = kiln_to(t64, dev, dt, KILN_COPY);
    kiln_release(t64);
    return t;
}

/* Runs three steps; copies the parameter and states (as f64) into out
 * (4 arrays of n; absent states left zero). */
static void run(const config *c, kiln_dtype dt, int64_t n, bool fused, kiln_device dev, double *out) {
    kiln_optim_use_fused(fused);
    uint64_t fused_before = kiln_optim_fused_updates();
    kiln_scope_begin();
    double *v = malloc(sizeof(double) * (size_t)n);
    fill(v, n, 1);
    kiln_tensor *p = tensor_of(v, n, dt, dev);
    CHECK_OK(kiln_set_requires_grad(p, true));
    kiln_optimizer *o = c->kind == OPT_SGD    ? kiln_sgd(&p, 1, &c->sgd)
                        : c->kind == OPT_ADAM ? kiln_adam(&p, 1, &c->adam)
                                              : kiln_adamw(&p, 1, &c->adam);
    CHECK_MSG(o != NULL, "%s: %s", c->name, kiln_error_message());
    for (int step = 0; o && step < 3; step++) {
        fill(v, n, 10 + step);
        kiln_tensor *g = tensor_of(v, n, dt, dev);
        CHECK_OK(kiln_set_grad(p, g));
        CHECK_OK(kiln_optimizer_step(o));
    }
    CHECK_MSG(kiln_optim_fused_updates() - fused_before == (fused ? 3u : 0u), "%s: %llu fused updates, expected %d",
              c->name, (unsigned long long)(kiln_optim_fused_updates() - fused_before), fused ? 3 : 0);
    memset(out, 0, sizeof(double) * (size_t)(4 * n));
    kiln_tensor *p64 = kiln_to(p, KILN_CPU, KILN_F64, KILN_COPY);
    CHECK_OK(kiln_to_host(p64, out, sizeof(double) * (size_t)n));
    for (int k = 0; o && k < 3; k++) {
        const char *name = state_names[c->kind][k];
        if (!name || (k == 2 && !c->adam.amsgrad) || (c->kind == OPT_SGD && c->sgd.momentum == 0)) continue;
        kiln_tensor *s = kiln_optimizer_state(o, 0, name);
        CHECK_MSG(s != NULL, "%s: no state %s", c->name, name);
        if (!s) continue;
        kiln_tensor *s64 = kiln_to(s, KILN_CPU, KILN_F64, KILN_COPY);
        CHECK_OK(kiln_to_host(s64, out + (k + 1) * n, sizeof(double) * (size_t)n));
    }
    kiln_optimizer_free(o);
    free(v);
    kiln_scope_end();
}

static void differ(const config *c, kiln_dtype dt, int64_t n, const char *what, const double *a, const double *b) {
    for (int64_t i = 0; i < 4 * n; i++)
        if (memcmp(&a[i], &b[i], sizeof(double))) {
            CHECK_MSG(false, "%s %s n=%lld: %s[%lld]: %s %.17g vs %.17g", c->name, kiln_dtype_name(dt), (long long)n,
                      i < n ? "param" : "state", (long long)(i % n), what, a[i], b[i]);
            return;
        }
}

static void compare(const config *c, kiln_dtype dt, int64_t n, bool cuda) {
    size_t bytes = sizeof(double) * (size_t)(4 * n);
    double *a = malloc(bytes), *b = malloc(bytes);
    run(c, dt, n, true, KILN_CPU, a);
    run(c, dt, n, false, KILN_CPU, b);
    differ(c, dt, n, "cpu fused vs op by op", a, b);
    if (cuda) {
        run(c, dt, n, true, KILN_CUDA(0), b);
        differ(c, dt, n, "cpu fused vs cuda:0 fused", a, b);
        run(c, dt, n, false, KILN_CUDA(0), b);
        differ(c, dt, n, "cpu fused vs cuda:0 op by op", a, b);
    }
    free(a);
    free(b);
}

/* 20 parameters (sizes 1..~9000, every third f64), 3 Adam steps; all
 * parameters and moments into out (f64), in order. Returns the values. */
static int64_t run_many(bool fused, kiln_device dev, double *out) {
    enum { P = 20 };
    kiln_optim_use_fused(fused);
    uint64_t launches = kiln_optim_fused_launches(), updates = kiln_optim_fused_updates();
    kiln_scope_begin();
    kiln_tensor *ps[P];
    int64_t sizes[P], total = 0;
    for (int k = 0; k < P; k++) {
        sizes[k] = 1 + (int64_t)k * k * 23;
        double *v = malloc(sizeof(double) * (size_t)sizes[k]);
        fill(v, sizes[k], k);
        ps[k] = tensor_of(v, sizes[k], k % 3 == 2 ? KILN_F64 : KILN_F32, dev);
        free(v);
        CHECK_OK(kiln_set_requires_grad(ps[k], true));
    }
    kiln_adam_opts ao = kiln_adam_defaults();
    ao.weight_decay = 1e-3;
    kiln_optimizer *o = kiln_adam(ps, P, &ao);
    for (int step = 0; o && step < 3; step++) {
        for (int k = 0; k < P; k++) {
            double *v = malloc(sizeof(double) * (size_t)sizes[k]);
            fill(v, sizes[k], 40 + k + step);
            CHECK_OK(kiln_set_grad(ps[k], tensor_of(v, sizes[k], kiln_dtype_of(ps[k]), dev)));
            free(v);
        }
        CHECK_OK(kiln_optimizer_step(o));
    }
    uint64_t calls = kiln_optim_fused_launches() - launches, n = kiln_optim_fused_updates() - updates;
    CHECK_MSG(calls == (fused ? 6u : 0u) && n == (fused ? 60u : 0u),
              "20 parameters x 3 steps: %llu fused updates in %llu calls, expected %s", (unsigned long long)n,
              (unsigned long long)calls, fused ? "60 in 6" : "none");
    for (int k = 0; o && k < P; k++) {
        kiln_tensor *parts[3] = {ps[k], kiln_optimizer_state(o, k, "exp_avg"), kiln_optimizer_state(o, k, "exp_avg_sq")};
        for (int j = 0; j < 3; j++) {
            kiln_tensor *t64 = kiln_to(parts[j], KILN_CPU, KILN_F64, KILN_COPY);
            CHECK_OK(kiln_to_host(t64, out + total, sizeof(double) * (size_t)sizes[k]));
            total += sizes[k];
        }
    }
    kiln_optimizer_free(o);
    kiln_scope_end();
    return total;
}

static void compare_many(bool cuda) {
    static double a[200000], b[200000];
    int64_t n = run_many(true, KILN_CPU, a);
    CHECK(run_many(false, KILN_CPU, b) == n);
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(double))) {
            CHECK_MSG(false, "adam, 20 parameters: value %lld fused %.17g, op by op %.17g", (long long)i, a[i], b[i]);
            break;
        }
    if (!cuda) return;
    CHECK(run_many(true, KILN_CUDA(0), b) == n);
    CHECK_MSG(!memcmp(a, b, sizeof(double) * (size_t)n), "adam, 20 parameters: cuda:0 fused differs from the cpu");
}

int main(void) {
    CHECK_OK(kiln_init());
    kiln_adam_opts adam = kiln_adam_defaults(), adamw = kiln_adamw_defaults();
    config configs[] = {
        {.name = "sgd", .kind = OPT_SGD, .sgd = kiln_sgd_defaults(0.1)},
        {.name = "sgd momentum dampening wd", .kind = OPT_SGD,
         .sgd = {.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 1e-4}},
        {.name = "sgd nesterov maximize", .kind = OPT_SGD,
         .sgd = {.lr = 0.05, .momentum = 0.8, .nesterov = true, .maximize = true}},
        {.name = "adam", .kind = OPT_ADAM, .adam = adam},
        {.name = "adam wd amsgrad", .kind = OPT_ADAM,
         .adam = {.lr = 3e-3, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 1e-2, .amsgrad = true}},
        {.name = "adam beta1 0.3 maximize", .kind = OPT_ADAM,
         .adam = {.lr = 1e-3, .beta1 = 0.3, .beta2 = 0.999, .eps = 1e-8, .maximize = true}},
        {.name = "adamw", .kind = OPT_ADAMW, .adam = adamw},
    };
    bool cuda = kiln_device_is_available(KILN_CUDA(0));
    printf("%s\n", cuda ? "cuda:0 present: comparing it too" : "no cuda:0: cpu only");
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++)
        for (int d = 0; d < 2; d++) {
            kiln_dtype dt = d ? KILN_F64 : KILN_F32;
            compare(&configs[i], dt, 37, cuda);
            compare(&configs[i], dt, 70001, cuda);
        }
    compare_many(cuda);
    kiln_optim_use_fused(true);
    kiln_shutdown();
    return kt_finish();
}

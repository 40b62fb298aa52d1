/* kiln_nn_data_parallel: the tutorial CNN (as one Sequential) over the
 * emulated cuda:0 and cuda:1 (or two GPUs), batch 7 split 4 + 3, gives the
 * loss and gradients of the same model on the CPU within f32 tolerance, for
 * two SGD steps (the replica follows the master's update), in eval mode
 * too, and with the loss inside each replica (kiln_nn_data_parallel_loss:
 * the uneven shares' losses weighted 4/7 and 3/7); the cuda:1 share runs on
 * a host thread of its own, with the caller's autocast; BatchNorm
 * normalises each share with its own statistics and only the master's
 * running statistics move; a replica's failure comes back naming its
 * device; its state dict is PyTorch's ("module.<name>"); bad arguments
 * (an absent device included) are refused by name. On the CPU alone: one
 * device, identical to the module. The two-device part skips visibly
 * without two CUDA devices. */
#include <pthread.h>
#include <stdbool.h>

#include "test_util.h"

enum { BATCH = 7, NPARAM = 10, CAP = 700000 };
static double want[CAP], got[CAP];

static kiln_module *make_cnn(void);
static kiln_module *kept;
/* A plain module, freed at the end (for calls that borrow it). */
static kiln_module *make_cnn_kept(void) { return kept = make_cnn(); }

static kiln_module *make_cnn(void) {
    kiln_manual_seed(42);
    kiln_module *l[] = {kiln_nn_conv2d(1, 32, 3, 1, 1, 1, 1, true),  kiln_nn_relu(), kiln_nn_max_pool2d(2, 2, 0),
                        kiln_nn_conv2d(32, 64, 3, 1, 1, 1, 1, true), kiln_nn_relu(), kiln_nn_max_pool2d(2, 2, 0),
                        kiln_nn_conv2d(64, 128, 3, 1, 1, 1, 1, true), kiln_nn_relu(), kiln_nn_max_pool2d(2, 2, 0),
                        kiln_nn_flatten(1, -1), kiln_nn_linear(128 * 3 * 3, 512, true), kiln_nn_relu(),
                        kiln_nn_linear(512, 10, true)};
    return kiln_nn_sequential(13, l);
}

/* The loss inside a replica; records the host thread and device of each
 * call, and fails on fail_on's share when set. */
typedef struct loss_probe {
    pthread_mutex_t mu;
    int calls;
    pthread_t thread[4];
    kiln_device dev[4];
    bool fail;
    kiln_device fail_on;
} loss_probe;

static kiln_tensor *replica_loss(kiln_tensor *out, kiln_tensor *target, void *user) {
    loss_probe *p = user;
    kiln_device d = kiln_get_device(out);
    if (p) {
        pthread_mutex_lock(&p->mu);
        if (p->calls < 4) p->thread[p->calls] = pthread_self(), p->dev[p->calls] = d;
        p->calls++;
        pthread_mutex_unlock(&p->mu);
        if (p->fail && kiln_device_equal(d, p->fail_on)) {
            kiln_tensor *bad = kiln_cross_entropy(out, out, NULL); /* float targets of the wrong shape: an error */
            if (bad) kiln_release(bad);
            return NULL;
        }
    }
    return kiln_cross_entropy(out, target, NULL);
}

/* Two SGD steps of cross_entropy(model(x_s), y) (x_s seeded per step);
 * loss[s] per step, and after the last backward every parameter's
 * gradient as doubles into g (state-dict order). Input on in_dev, labels
 * on out_dev. With parallel_loss the loss runs inside each replica. */
static loss_probe *probe_for_steps;
static bool parallel_loss;
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
        kiln_tensor *l = NULL;
        if (parallel_loss) {
            l = kiln_nn_data_parallel_loss(model, x, y, replica_loss, probe_for_steps);
            CHECK_MSG(l != NULL, "parallel loss: %s", kiln_error_message());
            if (l) CHECK(kiln_device_equal(kiln_get_device(l), out_dev));
        } else {
            kiln_tensor *logits = kiln_module_forward(model, x);
            CHECK_MSG(logits != NULL, "forward: %s", kiln_error_message());
            l = logits ? kiln_cross_entropy(logits, y, NULL) : NULL;
        }
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

/* The tutorial CNN with BatchNorm after its first conv. */
static kiln_module *make_bn_cnn(void) {
    kiln_manual_seed(43);
    kiln_module *l[] = {kiln_nn_conv2d(1, 8, 3, 1, 1, 1, 1, true), kiln_nn_batch_norm2d(8, 1e-5, 0.1, true, true),
                        kiln_nn_relu(), kiln_nn_max_pool2d(2, 2, 0), kiln_nn_flatten(1, -1),
                        kiln_nn_linear(8 * 14 * 14, 10, true)};
    return kiln_nn_sequential(6, l);
}

/* Copies of a 1-D buffer or gradient as doubles. */
static void host_doubles(kiln_tensor *t, double *out, int64_t n) {
    kiln_tensor *h = t ? kiln_to(t, KILN_CPU, KILN_F64, 0) : NULL;
    CHECK(h && kiln_numel(h) == n);
    if (h && kiln_numel(h) == n) CHECK_OK(kiln_to_host(h, out, (size_t)n * sizeof(double)));
    if (h) kiln_release(h);
}

/* BatchNorm under DataParallel, as PyTorch: each share (4 and 3 samples)
 * is normalised with its own batch statistics, so the loss is the
 * sample-weighted mean of the shares' losses run one by one on the CPU,
 * and the gradients their weighted sum; only the master's running mean
 * moves, by share 0's statistics. */
static void check_batch_norm(const kiln_device *devs) {
    kiln_scope_begin();
    kiln_manual_seed(11);
    kiln_tensor *x = kiln_randn(KILN_SHAPE(BATCH, 1, 28, 28), KILN_F32, KILN_CPU);
    int64_t labels[BATCH] = {3, 1, 4, 1, 5, 9, 2};
    kiln_tensor *y = kiln_from_data(KILN_SHAPE(BATCH), KILN_I64, KILN_CPU, labels);
    /* Reference: the shares one by one on the CPU. */
    kiln_module *ref = make_bn_cnn();
    kiln_module *ref0 = make_bn_cnn(); /* running statistics after share 0 alone */
    double ref_loss = 0;
    int64_t starts[2] = {0, 4}, lens[2] = {4, 3};
    for (int d = 0; d < 2; d++) {
        kiln_tensor *xs = kiln_narrow(x, 0, starts[d], lens[d]), *ys = kiln_narrow(y, 0, starts[d], lens[d]);
        kiln_tensor *l = kiln_cross_entropy(kiln_module_forward(ref, xs), ys, NULL);
        kiln_tensor *w = kiln_mul_scalar(l, (double)lens[d] / BATCH);
        CHECK_OK(kiln_backward(w, NULL, false));
        double v;
        CHECK_OK(kiln_item(w, &v));
        ref_loss += v;
        if (d == 0) kiln_module_forward(ref0, xs);
    }
    kiln_module *dp = kiln_nn_data_parallel(make_bn_cnn(), devs, 2, devs[0]);
    CHECK_MSG(dp != NULL, "%s", kiln_error_message());
    if (dp) {
        kiln_tensor *l = kiln_cross_entropy(kiln_module_forward(dp, kiln_to(x, devs[0], KILN_F32, 0)),
                                            kiln_to(y, devs[0], KILN_I64, 0), NULL);
        CHECK_MSG(l != NULL, "DataParallel with BatchNorm: %s", kiln_error_message());
        double v = NAN;
        if (l) CHECK_OK(kiln_backward(l, NULL, false));
        if (l) CHECK_OK(kiln_item(l, &v));
        CHECK_MSG(fabs(v - ref_loss) <= 1e-5 * fabs(ref_loss), "BatchNorm: loss %.9g, shares one by one %.9g", v,
                  ref_loss);
        const char *names[] = {"0.weight", "1.weight", "1.bias", "5.weight"};
        for (int i = 0; i < 4; i++) {
            char dpname[32];
            snprintf(dpname, sizeof dpname, "module.%s", names[i]);
            kiln_tensor *pa = kiln_module_state_get(dp, dpname), *pb = kiln_module_state_get(ref, names[i]);
            int64_t n = pb ? kiln_numel(pb) : 0;
            double *ga = calloc((size_t)n + 1, sizeof(double)), *gb = calloc((size_t)n + 1, sizeof(double));
            host_doubles(pa ? kiln_grad(pa) : NULL, ga, n);
            host_doubles(pb ? kiln_grad(pb) : NULL, gb, n);
            double e = rel_err(ga, gb, n);
            CHECK_MSG(e < 2e-5, "BatchNorm: gradient of %s differs by %g (relative)", names[i], e);
            free(ga), free(gb);
        }
        double ma[8], mb[8];
        host_doubles(kiln_module_state_get(dp, "module.1.running_mean"), ma, 8);
        host_doubles(kiln_module_state_get(ref0, "1.running_mean"), mb, 8);
        CHECK_MSG(rel_err(ma, mb, 8) < 1e-6, "BatchNorm: the master's running mean is not share 0's update (%g)",
                  rel_err(ma, mb, 8));
        kiln_module_free(dp);
    }
    kiln_module_free(ref);
    kiln_module_free(ref0);
    kiln_scope_end();
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
    kiln_device absent[2] = {KILN_CPU, {KILN_DEVICE_CUDA, 7}};
    kiln_error_clear();
    CHECK(kiln_nn_data_parallel(make_cnn(), absent, 2, cpu) == NULL);
    CHECK_MSG(strstr(kiln_error_message(), "a device is not available (cuda:7)"), "%s", kiln_error_message());
    kiln_error_clear();
    CHECK(kiln_nn_data_parallel_loss(make_cnn_kept(), NULL, NULL, replica_loss, NULL) == NULL);
    CHECK_MSG(strstr(kiln_error_message(), "not DataParallel"), "%s", kiln_error_message());

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
        /* The loss inside each replica: the same steps; the cuda:1 share
         * ran on another host thread than the caller's. */
        loss_probe probe = {.mu = PTHREAD_MUTEX_INITIALIZER};
        dp = kiln_nn_data_parallel(make_cnn(), devs, 2, devs[0]);
        CHECK_MSG(dp != NULL, "%s", kiln_error_message());
        if (dp) {
            parallel_loss = true, probe_for_steps = &probe;
            compare(dp, devs[0], devs[0], ref_loss, ref_n, "DataParallel over cuda:0/cuda:1, loss in the replicas");
            parallel_loss = false, probe_for_steps = NULL;
            CHECK_EQ_I(probe.calls, 4);
            for (int i = 0; i < probe.calls && i < 4; i++) {
                bool caller = pthread_equal(probe.thread[i], pthread_self());
                CHECK_MSG(caller == (probe.dev[i].index == 0), "call %d: the cuda:%d share ran on %s thread", i,
                          probe.dev[i].index, caller ? "the calling" : "another");
            }
            /* A replica's failure is the forward's error, naming the device. */
            probe = (loss_probe){.mu = PTHREAD_MUTEX_INITIALIZER, .fail = true, .fail_on = devs[1]};
            kiln_scope_begin();
            kiln_tensor *x = kiln_zeros(KILN_SHAPE(BATCH, 1, 28, 28), KILN_F32, devs[0]);
            kiln_tensor *t = kiln_zeros(KILN_SHAPE(BATCH), KILN_I64, devs[0]);
            kiln_error_clear();
            CHECK(kiln_nn_data_parallel_loss(dp, x, t, replica_loss, &probe) == NULL);
            CHECK_MSG(strstr(kiln_error_message(), "DataParallel: the replica on cuda:1 failed: kiln_nll_loss: target must hold class indices"),
                      "%s", kiln_error_message());
            /* The profiler sees both devices' work, the worker thread's too. */
            CHECK_OK(kiln_profiler_start(NULL));
            kiln_tensor *p = kiln_module_forward(dp, x);
            CHECK(p != NULL);
            CHECK_OK(kiln_profiler_stop());
            kiln_device pd[4];
            double pms[4] = {0};
            int nd = kiln_profiler_device_times(pd, pms, 4);
            bool seen[2] = {false, false};
            for (int i = 0; i < nd && i < 4; i++)
                if (pd[i].type == KILN_DEVICE_CUDA && pd[i].index < 2) seen[pd[i].index] = pms[i] > 0;
            CHECK_MSG(seen[0] && seen[1], "profiled device time: cuda:0 %s, cuda:1 %s", seen[0] ? "yes" : "no",
                      seen[1] ? "yes" : "no");
            /* Autocast reaches the replicas' threads: both shares in f16. */
            CHECK_OK(kiln_autocast_begin(KILN_DEVICE_CUDA, KILN_F16));
            kiln_tensor *h = kiln_module_forward(dp, x);
            CHECK_MSG(h && kiln_dtype_of(h) == KILN_F16, "DataParallel under f16 autocast: %s",
                      h ? kiln_dtype_name(kiln_dtype_of(h)) : kiln_error_message());
            CHECK_OK(kiln_autocast_end());
            kiln_scope_end();
            kiln_module_free(dp);
        }
        check_batch_norm(devs);
    }
    kiln_module_free(kept);
    kiln_shutdown();
    return kt_finish();
}

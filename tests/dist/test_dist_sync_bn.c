/* SyncBatchNorm2d (kiln_nn_sync_batch_norm2d), as a singleton and as 2 ranks
 * under mpirun (tests/CMakeLists.txt).
 *
 * A conv -> BatchNorm -> ReLU -> linear model. The reference is one process
 * with plain BatchNorm2d training on the whole batch of 128; under DDP each
 * rank trains the SyncBatchNorm model on its 64 (from a different seed per
 * rank: the broadcast at wrap makes them equal). After 5 Adam steps the
 * parameters and the running statistics must match the reference within
 * 2e-5 normwise. The same DDP with plain BatchNorm (per-rank statistics)
 * must be measurably off, so the test tells the two apart. Eval mode
 * matches plain BatchNorm's eval with the same buffers. */
#include "test_util.h"

#define N_ALL 128
#define STEPS 5

static kiln_dist_group *world;
static int rank, size;

static void full_batch(kiln_tensor **x, kiln_tensor **y) {
    static float xs[N_ALL * 3 * 36];
    int64_t ys[N_ALL];
    for (int i = 0; i < N_ALL * 3 * 36; i++) xs[i] = sinf((float)i * 0.37f) + 0.3f * (float)(i % 5) + 0.5f;
    for (int i = 0; i < N_ALL; i++) ys[i] = (i * 7 + i / 3) % 4;
    *x = kiln_from_data(KILN_SHAPE(N_ALL, 3, 6, 6), KILN_F32, KILN_CPU, xs);
    *y = kiln_from_data(KILN_SHAPE(N_ALL), KILN_I64, KILN_CPU, ys);
}

typedef struct net {
    kiln_module *m;
    kiln_tensor **params;
    int n;
    kiln_optimizer *opt;
    kiln_ddp *ddp;
} net;

static net make(uint64_t seed, bool sync, bool wrap) {
    net r = {0};
    kiln_manual_seed(seed);
    kiln_module *layers[] = {kiln_nn_conv2d(3, 4, 3, 1, 1, 1, 1, false),
                             sync ? kiln_nn_sync_batch_norm2d(4, 1e-5, 0.1, world)
                                  : kiln_nn_batch_norm2d(4, 1e-5, 0.1, true, true),
                             kiln_nn_relu(), kiln_nn_flatten(1, -1), kiln_nn_linear(4 * 36, 4, true)};
    r.m = kiln_nn_sequential(5, layers);
    CHECK(r.m != NULL);
    CHECK_OK(kiln_module_parameters(r.m, &r.params, &r.n));
    if (wrap) CHECK_OK(kiln_ddp_wrap(r.m, world, NULL, &r.ddp));
    kiln_adam_opts o = kiln_adam_defaults();
    o.lr = 1e-2;
    r.opt = kiln_adam(r.params, r.n, &o);
    CHECK(r.opt != NULL);
    return r;
}

static void drop(net *r) {
    kiln_ddp_free(r->ddp);
    kiln_optimizer_free(r->opt);
    free(r->params);
    kiln_module_free(r->m);
}

static void train_step(net *r, int64_t lo, int64_t hi) {
    kiln_scope_begin();
    kiln_tensor *x, *y;
    full_batch(&x, &y);
    CHECK_OK(kiln_optimizer_zero_grad(r->opt, true));
    kiln_tensor *xs = kiln_narrow(x, 0, lo, hi - lo), *ys = kiln_narrow(y, 0, lo, hi - lo);
    kiln_tensor *out = r->ddp ? kiln_ddp_forward(r->ddp, xs) : kiln_module_forward(r->m, xs);
    CHECK(out != NULL);
    CHECK_OK(kiln_backward(kiln_cross_entropy(out, ys, NULL), NULL, false));
    if (r->ddp) CHECK_OK(kiln_ddp_finish_grads(r->ddp));
    CHECK_OK(kiln_optimizer_step(r->opt));
    kiln_scope_end();
}

/* ||a - b|| / ||a|| over the given tensors. */
static double rel(kiln_tensor *const *a, kiln_tensor *const *b, int n) {
    double d2 = 0, a2 = 0;
    kiln_scope_begin();
    for (int i = 0; i < n; i++) {
        const double *p = kiln_data_ptr(kiln_to(a[i], KILN_CPU, KILN_F64, KILN_COPY));
        const double *q = kiln_data_ptr(kiln_to(b[i], KILN_CPU, KILN_F64, KILN_COPY));
        for (int64_t j = 0; j < kiln_numel(a[i]); j++) d2 += (p[j] - q[j]) * (p[j] - q[j]), a2 += p[j] * p[j];
    }
    kiln_scope_end();
    return sqrt(d2) / (sqrt(a2) + 1e-30);
}

static double buffers_rel(net *a, net *b) {
    kiln_scope_begin();
    kiln_tensor *ta[2] = {kiln_module_state_get(a->m, "1.running_mean"),
                          kiln_module_state_get(a->m, "1.running_var")};
    kiln_tensor *tb[2] = {kiln_module_state_get(b->m, "1.running_mean"),
                          kiln_module_state_get(b->m, "1.running_var")};
    CHECK(ta[0] && ta[1] && tb[0] && tb[1]);
    double d = rel(ta, tb, 2);
    kiln_scope_end();
    return d;
}

/* DDP (SyncBatchNorm or plain) on this rank's slice against one process with
 * BatchNorm on the whole batch; *buf gets the running statistics' distance. */
static double versus_one_process(bool sync, double *buf) {
    net ref = make(7, false, false);
    net dp = make(7 + (uint64_t)rank * 1000, sync, true);
    int64_t lo = (int64_t)N_ALL * rank / size, hi = (int64_t)N_ALL * (rank + 1) / size;
    for (int s = 0; s < STEPS; s++) {
        train_step(&ref, 0, N_ALL);
        train_step(&dp, lo, hi);
    }
    double d = rel(ref.params, dp.params, ref.n);
    *buf = buffers_rel(&ref, &dp);
    /* Eval: the running statistics, no communication; same as BatchNorm's. */
    kiln_module_train(ref.m, false), kiln_module_train(dp.m, false);
    kiln_scope_begin();
    kiln_tensor *x, *y;
    full_batch(&x, &y);
    kiln_tensor *oa = kiln_module_forward(ref.m, x), *ob = kiln_module_forward(dp.m, x);
    CHECK(oa && ob);
    double e = oa && ob ? rel(&oa, &ob, 1) : 1;
    kiln_scope_end();
    if (sync) CHECK_MSG(e < 2e-5, "eval outputs differ by %g", e);
    drop(&ref);
    drop(&dp);
    return d;
}

int main(void) {
    if (kiln_init()) return 1;
    CHECK_OK(kiln_dist_init(&world));
    if (!world) return kt_finish();
    rank = kiln_dist_rank(world);
    size = kiln_dist_world_size(world);
    CHECK_OK(kiln_dist_group_set_timeout(world, 60.0));
    kiln_scope_begin();
    double buf = 0, d = versus_one_process(true, &buf);
    printf("rank %d: DDP + SyncBatchNorm vs one process with BatchNorm on the whole batch: parameters %.3g, "
           "running statistics %.3g\n",
           rank, d, buf);
    CHECK_MSG(d < 2e-5, "parameters differ by %g", d);
    CHECK_MSG(buf < 2e-5, "running statistics differ by %g", buf);
    if (size == 2) {
        double pbuf = 0, plain = versus_one_process(false, &pbuf);
        printf("rank %d: DDP + plain BatchNorm (per-rank statistics): parameters %.3g, running statistics "
               "%.3g\n",
               rank, plain, pbuf);
        CHECK_MSG(plain > 20 * 2e-5, "plain BatchNorm should differ, got %g", plain);
    }
    kiln_module *bad = kiln_nn_sync_batch_norm2d(0, 1e-5, 0.1, world);
    CHECK(bad == NULL && strstr(kiln_error_message(), "num_features") != NULL);
    kiln_scope_end();
    CHECK_OK(kiln_dist_shutdown());
    kiln_shutdown();
    return kt_finish();
}

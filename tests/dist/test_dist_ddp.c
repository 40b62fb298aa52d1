/* DDP, run as a singleton and as 2 ranks under mpirun (tests/CMakeLists.txt).
 *
 * One deterministic batch of 128. The reference is one process training on
 * all of it; under DDP rank r trains on its slice (64 + 64, or 70 + 58 with
 * sample-weighted averaging), from a model initialised with a different
 * seed per rank (so the broadcast at wrap matters). After 5 Adam steps the
 * parameters must match the reference normwise, for an MLP and a CNN. The
 * uneven split without the sample counts (plain average) is measurably
 * different, so the weighting is what makes it pass. An f64 model
 * (f64 buckets) matches to 1e-12. Also: no_sync
 * accumulation over two micro-batches equals one synchronised step on
 * their union; an unused parameter is named (and reduced as zeros with
 * find_unused_parameters); ranks with different models fail at wrap on
 * every rank; BatchNorm buffers are rank 0's after the broadcast; with
 * small buckets the first bucket's all-reduce starts from a hook, before
 * backward is over; after the first step the buckets are rebuilt in the
 * order the gradients arrived in (a model applying its layers in another
 * order than it registers them). */
#include "diag/profiler_internal.h"
#include "test_util.h"

#define N_ALL 128
#define STEPS 5

static kiln_dist_group *world;
static int rank, size;
static kiln_dtype train_dtype = KILN_F32; /* what make() converts models to */

/* x (128, 1, 6, 6), y (128): the same on every rank. */
static void full_batch(kiln_tensor **x, kiln_tensor **y) {
    static float xs[N_ALL * 36];
    int64_t ys[N_ALL];
    for (int i = 0; i < N_ALL * 36; i++) xs[i] = sinf((float)i * 0.37f) + 0.1f * (float)(i % 7);
    for (int i = 0; i < N_ALL; i++) ys[i] = (i * 7 + i / 3) % 4;
    *x = kiln_from_data(KILN_SHAPE(N_ALL, 1, 6, 6), KILN_F32, KILN_CPU, xs);
    *y = kiln_from_data(KILN_SHAPE(N_ALL), KILN_I64, KILN_CPU, ys);
}

typedef enum arch { MLP, CNN, CNN_BN, DEEP_MLP } arch;

static kiln_module *build(arch a, uint64_t seed) {
    kiln_manual_seed(seed);
    kiln_module *layers[6];
    int n = 0;
    switch (a) {
    case MLP:
        layers[n++] = kiln_nn_flatten(1, -1);
        layers[n++] = kiln_nn_linear(36, 16, true);
        layers[n++] = kiln_nn_relu();
        layers[n++] = kiln_nn_linear(16, 4, true);
        break;
    case DEEP_MLP:
        layers[n++] = kiln_nn_flatten(1, -1);
        layers[n++] = kiln_nn_linear(36, 32, true);
        layers[n++] = kiln_nn_relu();
        layers[n++] = kiln_nn_linear(32, 32, true);
        layers[n++] = kiln_nn_relu();
        layers[n++] = kiln_nn_linear(32, 4, true);
        break;
    case CNN:
        layers[n++] = kiln_nn_conv2d(1, 4, 3, 1, 1, 1, 1, true);
        layers[n++] = kiln_nn_relu();
        layers[n++] = kiln_nn_flatten(1, -1);
        layers[n++] = kiln_nn_linear(4 * 36, 4, true);
        break;
    case CNN_BN:
        layers[n++] = kiln_nn_conv2d(1, 4, 3, 1, 1, 1, 1, false);
        layers[n++] = kiln_nn_batch_norm2d(4, 1e-5, 0.1, true, true);
        layers[n++] = kiln_nn_relu();
        layers[n++] = kiln_nn_flatten(1, -1);
        layers[n++] = kiln_nn_linear(4 * 36, 4, true);
        break;
    }
    return kiln_nn_sequential(n, layers);
}

typedef struct net {
    kiln_module *m;
    kiln_tensor **params;
    int n;
    kiln_optimizer *opt;
    kiln_ddp *ddp;
} net;

static net make(arch a, uint64_t seed, const kiln_ddp_opts *ddp_opts, bool wrap) {
    net r = {0};
    r.m = build(a, seed);
    CHECK(r.m != NULL);
    if (train_dtype != KILN_F32) CHECK_OK(kiln_module_to_dtype(r.m, train_dtype));
    CHECK_OK(kiln_module_parameters(r.m, &r.params, &r.n));
    kiln_adam_opts o = kiln_adam_defaults();
    o.lr = 1e-2;
    if (wrap) CHECK_OK(kiln_ddp_wrap(r.m, world, ddp_opts, &r.ddp));
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

/* One step on rows [lo, hi) of the batch; with DDP, weighted says whether
 * the rank passes its sample count. */
static void train_step(net *r, int64_t lo, int64_t hi, bool weighted) {
    kiln_scope_begin();
    kiln_tensor *x, *y;
    full_batch(&x, &y);
    CHECK_OK(kiln_optimizer_zero_grad(r->opt, true));
    kiln_tensor *xs = kiln_to(kiln_narrow(x, 0, lo, hi - lo), KILN_CPU, train_dtype, 0);
    kiln_tensor *ys = kiln_narrow(y, 0, lo, hi - lo);
    if (r->ddp && weighted) CHECK_OK(kiln_ddp_set_sample_count(r->ddp, hi - lo));
    kiln_tensor *out = r->ddp ? kiln_ddp_forward(r->ddp, xs) : kiln_module_forward(r->m, xs);
    CHECK(out != NULL);
    kiln_tensor *loss = kiln_cross_entropy(out, ys, NULL);
    kiln_range_push("backward"); /* what check_profiled_overlap measures against */
    CHECK_OK(kiln_backward(loss, NULL, false));
    kiln_range_pop();
    if (r->ddp) CHECK_OK(kiln_ddp_finish_grads(r->ddp));
    CHECK_OK(kiln_optimizer_step(r->opt));
    kiln_scope_end();
}

/* ||a - b|| / ||a|| over all parameters (or their gradients). */
static double rel_distance(const net *a, const net *b, bool grads) {
    double d2 = 0, a2 = 0;
    kiln_scope_begin();
    for (int i = 0; i < a->n; i++) {
        kiln_tensor *ta = grads ? kiln_grad(a->params[i]) : a->params[i];
        kiln_tensor *tb = grads ? kiln_grad(b->params[i]) : b->params[i];
        CHECK(ta && tb);
        if (!ta || !tb) continue;
        const double *p = kiln_data_ptr(kiln_to(ta, KILN_CPU, KILN_F64, KILN_COPY));
        const double *q = kiln_data_ptr(kiln_to(tb, KILN_CPU, KILN_F64, KILN_COPY));
        for (int64_t j = 0; j < kiln_numel(ta); j++) {
            d2 += (p[j] - q[j]) * (p[j] - q[j]);
            a2 += p[j] * p[j];
        }
    }
    kiln_scope_end();
    return sqrt(d2) / (sqrt(a2) + 1e-30);
}

static void rank_slice(bool uneven, int64_t *lo, int64_t *hi) {
    if (uneven && size == 2) {
        *lo = rank == 0 ? 0 : 70;
        *hi = rank == 0 ? 70 : N_ALL;
        return;
    }
    *lo = (int64_t)N_ALL * rank / size;
    *hi = (int64_t)N_ALL * (rank + 1) / size;
}

/* DDP on this rank's slice against one process on the whole batch: the
 * parameters after STEPS Adam steps, and (*grad_diff) the last step's
 * gradients, which catch what Adam's scale invariance would hide (a
 * gradient averaged by a wrong count). small_buckets: one parameter per
 * bucket, so several all-reduces are in flight. */
static double ddp_vs_single(arch a, bool uneven, bool weighted, bool small_buckets, double *grad_diff) {
    kiln_ddp_opts o = kiln_ddp_opts_default();
    if (small_buckets) o.bucket_cap_mb = o.first_bucket_mb = 1e-9;
    net ref = make(a, 7, NULL, false);
    net dp = make(a, 7 + (uint64_t)rank * 1000, &o, true);
    int64_t lo, hi;
    rank_slice(uneven, &lo, &hi);
    for (int s = 0; s < STEPS; s++) {
        train_step(&ref, 0, N_ALL, false);
        train_step(&dp, lo, hi, weighted);
    }
    kiln_ddp_stats st;
    CHECK_OK(kiln_ddp_stats_get(dp.ddp, &st));
    CHECK(small_buckets ? st.num_buckets == dp.n : st.num_buckets == 1);
    double d = rel_distance(&ref, &dp, false);
    *grad_diff = rel_distance(&ref, &dp, true);
    drop(&ref);
    drop(&dp);
    return d;
}

static void test_matches_single_process(void) {
    const double tol = 2e-5;
    struct {
        const char *name;
        arch a;
        bool uneven, small_buckets;
        kiln_dtype dtype;
    } cases[] = {
        {"mlp 64+64", MLP, false, false},
        {"cnn 64+64", CNN, false, false},
        {"cnn 64+64, a bucket per parameter", CNN, false, true},
        {"mlp 70+58 weighted", MLP, true, false},
        {"cnn 70+58 weighted, a bucket per parameter", CNN, true, true},
        {"f64 cnn 70+58 weighted, a bucket per parameter", CNN, true, true, KILN_F64},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        train_dtype = cases[i].dtype;
        double g = 0, p = ddp_vs_single(cases[i].a, cases[i].uneven, true, cases[i].small_buckets, &g);
        train_dtype = KILN_F32;
        printf("rank %d: DDP vs one process, %s: parameters after %d Adam steps %.3g, last gradients %.3g\n",
               rank, cases[i].name, STEPS, p, g);
        double want = cases[i].dtype == KILN_F64 ? 1e-12 : tol;
        CHECK_MSG(p < want, "%s: parameters differ by %g", cases[i].name, p);
        CHECK_MSG(g < want, "%s: gradients differ by %g", cases[i].name, g);
    }
    if (size == 2) {
        /* The plain average of an uneven split is not the full batch's gradient. */
        double g = 0, plain = ddp_vs_single(MLP, true, false, false, &g);
        printf("rank %d: 70+58 with the plain average: parameters %.3g, gradients %.3g\n", rank, plain, g);
        CHECK_MSG(plain > 20 * tol && g > 20 * tol, "the unweighted uneven split should differ, got %g / %g",
                  plain, g);
    }
}

/* no_sync over two micro-batches (mean loss x 1/2 each) = one synchronised
 * backward on their union, gradient for gradient. */
static void test_no_sync(void) {
    net acc = make(MLP, 11, NULL, true), one = make(MLP, 11, NULL, true);
    int64_t lo, hi;
    rank_slice(false, &lo, &hi);
    int64_t mid = (lo + hi) / 2;
    kiln_scope_begin();
    kiln_tensor *x, *y;
    full_batch(&x, &y);
    CHECK_OK(kiln_ddp_set_sync(acc.ddp, false));
    CHECK(!kiln_ddp_is_sync(acc.ddp));
    kiln_tensor *o1 = kiln_ddp_forward(acc.ddp, kiln_narrow(x, 0, lo, mid - lo));
    CHECK_OK(kiln_backward(
        kiln_mul_scalar(kiln_cross_entropy(o1, kiln_narrow(y, 0, lo, mid - lo), NULL), 0.5), NULL, false));
    CHECK_OK(kiln_ddp_finish_grads(acc.ddp)); /* no_sync: nothing to do */
    CHECK_OK(kiln_ddp_set_sync(acc.ddp, true));
    kiln_tensor *o2 = kiln_ddp_forward(acc.ddp, kiln_narrow(x, 0, mid, hi - mid));
    CHECK_OK(kiln_backward(
        kiln_mul_scalar(kiln_cross_entropy(o2, kiln_narrow(y, 0, mid, hi - mid), NULL), 0.5), NULL, false));
    CHECK_OK(kiln_ddp_finish_grads(acc.ddp));
    kiln_tensor *o = kiln_ddp_forward(one.ddp, kiln_narrow(x, 0, lo, hi - lo));
    CHECK_OK(kiln_backward(kiln_cross_entropy(o, kiln_narrow(y, 0, lo, hi - lo), NULL), NULL, false));
    CHECK_OK(kiln_ddp_finish_grads(one.ddp));
    kiln_scope_end();
    double d = rel_distance(&one, &acc, true);
    printf("rank %d: no_sync accumulation vs one step: %.3g\n", rank, d);
    CHECK_MSG(d < 1e-5, "no_sync gradients differ by %g", d);
    kiln_ddp_stats st;
    CHECK_OK(kiln_ddp_stats_get(acc.ddp, &st));
    CHECK_EQ_I(st.synced_steps, 1);
    CHECK_EQ_I(st.hooks_fired, acc.n);
    drop(&acc);
    drop(&one);
}

/* A custom module whose child "unused" never takes part in the forward. */
static kiln_tensor *used_only(kiln_module *m, kiln_tensor *x, void *user) {
    (void)user;
    return kiln_module_forward(kiln_module_child(m, "used"), x);
}

static kiln_module *two_heads(void) {
    kiln_manual_seed(3);
    kiln_module *m = kiln_nn_custom("TwoHeads", used_only, NULL);
    CHECK_OK(kiln_module_add_child(m, "used", kiln_nn_linear(8, 3, true)));
    CHECK_OK(kiln_module_add_child(m, "unused", kiln_nn_linear(8, 3, true)));
    return m;
}

static void backward_two_heads(kiln_ddp *d) {
    kiln_scope_begin();
    kiln_tensor *x = kiln_full(KILN_SHAPE(4, 8), 0.5 + rank, KILN_F32, KILN_CPU);
    kiln_tensor *out = kiln_ddp_forward(d, x);
    CHECK_OK(kiln_backward(kiln_sum(out, 0, NULL, false), NULL, false));
    kiln_scope_end();
}

static void test_unused_parameters(void) {
    kiln_module *m = two_heads();
    kiln_ddp *d = NULL;
    CHECK_OK(kiln_ddp_wrap(m, world, NULL, &d));
    backward_two_heads(d);
    CHECK_FAILS(kiln_ddp_finish_grads(d), KILN_ERR_STATE, "'unused.weight'");
    CHECK_MSG(strstr(kiln_error_message(), "'unused.bias'") && !strstr(kiln_error_message(), "'used."),
              "error: %s", kiln_error_message());
    CHECK_FAILS(kiln_ddp_finish_grads(d), KILN_ERR_STATE, "no synchronised backward");
    kiln_ddp_free(d);
    kiln_module_free(m);

    m = two_heads();
    kiln_ddp_opts o = kiln_ddp_opts_default();
    o.find_unused_parameters = true;
    CHECK_OK(kiln_ddp_wrap(m, world, &o, &d));
    /* A .grad left from an earlier step is not what this backward produced:
     * the unused parameter's slot is zeros all the same. */
    kiln_scope_begin();
    kiln_tensor *uw = kiln_module_state_get(m, "unused.weight");
    CHECK_OK(kiln_set_grad(uw, kiln_ones(kiln_shape_of(uw), KILN_F32, KILN_CPU)));
    kiln_scope_end();
    backward_two_heads(d);
    CHECK_OK(kiln_ddp_finish_grads(d));
    kiln_scope_begin();
    kiln_tensor *gu = kiln_grad(kiln_module_state_get(m, "unused.weight"));
    kiln_tensor *gb = kiln_grad(kiln_module_state_get(m, "used.bias"));
    CHECK(gu && gb);
    if (gu && gb) {
        double su = 0, sb = 0;
        CHECK_OK(kiln_item(kiln_sum(kiln_abs(gu), 0, NULL, false), &su));
        CHECK_OK(kiln_item(kiln_sum(gb, 0, NULL, false), &sb));
        CHECK(su == 0.0);
        CHECK_MSG(fabs(sb - 12.0) < 1e-5, "used.bias grad sum %g, want 12 (4 rows x 3 outputs)", sb);
    }
    kiln_scope_end();
    kiln_ddp_free(d);
    kiln_module_free(m);
}

/* Rank 1 builds a wider layer: the wrap fails on every rank, naming it. */
static void test_model_mismatch(void) {
    if (size < 2) return;
    kiln_manual_seed(5);
    kiln_module *m = kiln_nn_linear(8, rank == 1 ? 5 : 4, true);
    kiln_ddp *d = NULL;
    CHECK_FAILS(kiln_ddp_wrap(m, world, NULL, &d), KILN_ERR_INVALID_ARGUMENT, "differs between ranks");
    CHECK(d == NULL);
    CHECK_MSG(strstr(kiln_error_message(),
                     "rank 0 has 'parameter weight f32 [4, 8]', rank 1 has 'parameter weight "
                     "f32 [5, 8]'") != NULL,
              "error: %s", kiln_error_message());
    kiln_module_free(m);
    /* The group is still in step afterwards. */
    CHECK_OK(kiln_dist_barrier(world, NULL));
}

/* One value per rank of the buffer `key`, gathered: (size, numel). */
static bool buffer_same_as_rank0(kiln_module *m, const char *key) {
    kiln_tensor *b = kiln_to(kiln_module_state_get(m, key), KILN_CPU, KILN_F64, 0);
    int64_t n = kiln_numel(b);
    kiln_tensor *all = kiln_zeros(KILN_SHAPE(size, n), KILN_F64, KILN_CPU);
    CHECK_OK(kiln_dist_all_gather(world, all, b, NULL));
    const double *v = kiln_data_ptr(all);
    bool same = true;
    for (int r = 1; r < size; r++)
        for (int64_t j = 0; j < n; j++) same &= v[r * n + j] == v[j];
    return same;
}

/* BatchNorm: each rank's forward updates the running statistics with its
 * own batch (DDP without SyncBatchNorm), so they drift apart; the broadcast
 * makes them rank 0's again. */
static void test_batchnorm_buffers(void) {
    kiln_scope_begin();
    net dp = make(CNN_BN, 9 + (uint64_t)rank, NULL, true);
    CHECK(buffer_same_as_rank0(dp.m, "1.running_mean"));
    int64_t lo, hi;
    rank_slice(false, &lo, &hi);
    kiln_tensor *x, *y;
    full_batch(&x, &y);
    kiln_tensor *xs = kiln_narrow(x, 0, lo, hi - lo);
    CHECK(kiln_module_forward(dp.m, xs) != NULL);
    if (size > 1) CHECK(!buffer_same_as_rank0(dp.m, "1.running_mean"));
    CHECK_OK(kiln_ddp_broadcast_buffers(dp.ddp));
    CHECK(buffer_same_as_rank0(dp.m, "1.running_mean"));
    CHECK(buffer_same_as_rank0(dp.m, "1.running_var"));
    CHECK(buffer_same_as_rank0(dp.m, "1.num_batches_tracked"));
    /* kiln_ddp_forward broadcasts first: in eval mode (no update) the
     * buffers stay rank 0's. */
    CHECK(kiln_module_forward(dp.m, xs) != NULL);
    if (size > 1) CHECK(!buffer_same_as_rank0(dp.m, "1.running_var"));
    kiln_module_train(dp.m, false);
    CHECK(kiln_ddp_forward(dp.ddp, xs) != NULL);
    CHECK(buffer_same_as_rank0(dp.m, "1.running_var"));
    drop(&dp);
    kiln_scope_end();
}

/* The profiler's record of the step just profiled: one "mpi:all_reduce"
 * per bucket (6), each starting inside backward (train_step's
 * "backward" range), and all but two before backward's last op (the
 * first layer's weight and bias gradients are what its last two ops
 * produce, so their buckets can only start after); with no self CPU time of their own, so the table's
 * self CPU total is not inflated by time spent waiting on the network. */
static void check_profiled_overlap(void) {
    const prof_result *res = kiln_profiler_result_lock();
    const prof_record *bw = NULL;
    int n_ar = 0, in_backward = 0, before_end = 0;
    for (size_t i = 0; i < res->n; i++)
        if (!bw && !strcmp(res->rec[i].name, "backward") && res->rec[i].kind == PROF_RANGE) bw = &res->rec[i];
    CHECK_MSG(bw != NULL, "no 'backward' range among %zu records", res->n);
    uint64_t last_op_end = 0; /* of the ops inside backward */
    for (size_t i = 0; bw && i < res->n; i++) {
        const prof_record *r = &res->rec[i];
        if (r->kind == PROF_OP && r->start_ns >= bw->start_ns && r->end_ns <= bw->end_ns &&
            r->end_ns > last_op_end)
            last_op_end = r->end_ns;
    }
    for (size_t i = 0; bw && i < res->n; i++) {
        const prof_record *r = &res->rec[i];
        if (strcmp(r->name, "mpi:all_reduce")) continue;
        n_ar++;
        CHECK(r->kind == PROF_ASYNC && r->parent == -1 && r->end_ns >= r->start_ns);
        in_backward += r->start_ns >= bw->start_ns && r->start_ns <= bw->end_ns;
        before_end += r->start_ns < last_op_end;
    }
    kiln_profiler_result_unlock();
    CHECK_EQ_I(n_ar, 6);
    CHECK_EQ_I(in_backward, 6);
    CHECK_MSG(before_end >= 4, "%d of 6 all-reduces started before backward's last op", before_end);
    char *table = kiln_profiler_table(KILN_SORT_NAME, 0);
    CHECK(table != NULL && strstr(table, "mpi:all_reduce") != NULL);
    free(table);
}

/* With one parameter per bucket, every bucket starts from a hook and the
 * first one starts after the first hook, long before the last. */
static void test_overlap(void) {
    kiln_ddp_opts o = kiln_ddp_opts_default();
    o.bucket_cap_mb = 1e-9;
    o.first_bucket_mb = 1e-9;
    net dp = make(DEEP_MLP, 13, &o, true);
    /* Reverse order at wrap: the last parameter is in bucket 0 (rebuilt
     * after the first step: test_bucket_rebuild). */
    CHECK_EQ_I(kiln_ddp_bucket_of(dp.ddp, 5), 0);
    CHECK_EQ_I(kiln_ddp_bucket_of(dp.ddp, 0), 5);
    int64_t lo, hi;
    rank_slice(false, &lo, &hi);
    CHECK_OK(kiln_profiler_start(NULL));
    train_step(&dp, lo, hi, true);
    CHECK_OK(kiln_profiler_stop());
    check_profiled_overlap();
    kiln_ddp_stats st;
    CHECK_OK(kiln_ddp_stats_get(dp.ddp, &st));
    printf("rank %d: %d buckets, %lld hooks, first bucket started after %lld hooks, %d started in backward\n",
           rank, st.num_buckets, (long long)st.hooks_fired, (long long)st.hooks_before_first_start,
           st.buckets_started_in_backward);
    CHECK_EQ_I(st.num_parameters, 6);
    CHECK_EQ_I(st.num_buckets, 6);
    CHECK_EQ_I(st.hooks_fired, 6);
    CHECK_MSG(st.hooks_before_first_start >= 1 && st.hooks_before_first_start <= 2,
              "bucket 0 started after %lld hooks", (long long)st.hooks_before_first_start);
    CHECK_EQ_I(st.buckets_started_in_backward, 6);
    drop(&dp);

    /* Defaults: a model this small is one bucket. */
    net one = make(DEEP_MLP, 13, NULL, true);
    kiln_ddp *twice = NULL;
    CHECK_FAILS(kiln_ddp_wrap(one.m, world, NULL, &twice), KILN_ERR_STATE, "already wrapped");
    CHECK(twice == NULL);
    CHECK_OK(kiln_ddp_stats_get(one.ddp, &st));
    CHECK_EQ_I(st.num_buckets, 1);
    CHECK_FAILS(kiln_ddp_set_sample_count(one.ddp, 0), KILN_ERR_INVALID_ARGUMENT, "not in [1,");
    CHECK_FAILS(kiln_ddp_finish_grads(one.ddp), KILN_ERR_STATE, "no synchronised backward");
    drop(&one);
}

/* A rank that never runs its backward: the other rank's finish fails after
 * the group's timeout, naming the bucket's all-reduce, instead of hanging;
 * when the late rank catches up, the stuck work completes and everything
 * is freed. */
static void test_rank_skips_backward(void) {
    if (size < 2) return;
    kiln_dist_group *g = NULL;
    CHECK_OK(kiln_dist_group_dup(world, &g));
    kiln_dist_group_set_debug(g, false);
    kiln_module *m = build(MLP, 21);
    kiln_ddp *d = NULL;
    /* Rank 0's first step fails and rank 1's succeeds: the bucket rebuild
     * after a first step (a broadcast) would have no partner on rank 0. */
    kiln_ddp_opts o = kiln_ddp_opts_default();
    o.static_bucket_order = true;
    CHECK_OK(kiln_ddp_wrap(m, g, &o, &d));
    /* Short only for the wait that is meant to time out: every other wait
     * keeps the generous bound, so a loaded machine cannot fail the test. */
    CHECK_OK(kiln_dist_group_set_timeout(g, 2.0));
    kiln_scope_begin();
    kiln_tensor *x, *y;
    full_batch(&x, &y);
    if (rank == 0) {
        CHECK_OK(kiln_backward(kiln_cross_entropy(kiln_ddp_forward(d, x), y, NULL), NULL, false));
        /* wrap used collectives #0 (the model check) and #1-#4 (the broadcasts);
         * the one bucket holds 660 gradients and the sample count. */
        CHECK_FAILS(kiln_ddp_finish_grads(d), KILN_ERR_DEVICE,
                    "all_reduce #5 of f32 [661] (sum) did not complete");
        CHECK_MSG(strstr(kiln_error_message(), "waiting on rank 1") != NULL, "error: %s",
                  kiln_error_message());
        CHECK_FAILS(kiln_ddp_finish_grads(d), KILN_ERR_STATE, "timed out");
    }
    CHECK_OK(kiln_dist_group_set_timeout(g, 60.0));
    CHECK_OK(kiln_dist_barrier(world, NULL));
    if (rank != 0) {
        CHECK_OK(kiln_backward(kiln_cross_entropy(kiln_ddp_forward(d, x), y, NULL), NULL, false));
        CHECK_OK(kiln_ddp_finish_grads(d));
    }
    kiln_scope_end();
    kiln_ddp_free(d); /* rank 0: the late all-reduce completes here */
    kiln_module_free(m);
    CHECK_OK(kiln_dist_group_free(g));
}

/* ---- Bucket rebuild from the first backward's order ---- */

/* Registered as "first", "second", "head" but applied as second, first,
 * head: backward delivers first's gradients before second's, unlike the
 * reverse registration order the buckets start with. */
static kiln_tensor *swapped_forward(kiln_module *m, kiln_tensor *x, void *user) {
    (void)user;
    kiln_tensor *a = kiln_module_forward(kiln_module_child(m, "second"), x);
    kiln_tensor *b = a ? kiln_relu(a) : NULL;
    kiln_tensor *c = b ? kiln_module_forward(kiln_module_child(m, "first"), b) : NULL;
    kiln_tensor *d = c ? kiln_relu(c) : NULL;
    kiln_tensor *e = d ? kiln_module_forward(kiln_module_child(m, "head"), d) : NULL;
    kiln_release(a), kiln_release(b), kiln_release(c), kiln_release(d);
    return e;
}

static int arrival[16], n_arrival;
static void record_arrival(kiln_tensor *leaf, void *user) {
    (void)leaf;
    if (n_arrival < 16) arrival[n_arrival++] = (int)(intptr_t)user;
}

static void test_bucket_rebuild(void) {
    kiln_manual_seed(3 + (uint64_t)rank);
    kiln_module *m = kiln_nn_custom("Swapped", swapped_forward, NULL);
    CHECK(m != NULL);
    CHECK_OK(kiln_module_add_child(m, "first", kiln_nn_linear(16, 16, true)));
    CHECK_OK(kiln_module_add_child(m, "second", kiln_nn_linear(16, 16, true)));
    CHECK_OK(kiln_module_add_child(m, "head", kiln_nn_linear(16, 4, true)));
    kiln_tensor **params = NULL;
    int np = 0;
    CHECK_OK(kiln_module_parameters(m, &params, &np));
    CHECK(np == 6);
    for (int i = 0; i < np; i++)
        CHECK_OK(kiln_register_post_accumulate_hook(params[i], record_arrival, (void *)(intptr_t)i));
    kiln_ddp_opts o = kiln_ddp_opts_default();
    o.bucket_cap_mb = o.first_bucket_mb = 1e-9; /* a bucket per parameter: the bucket index is the order */
    kiln_ddp *d = NULL;
    CHECK_OK(kiln_ddp_wrap(m, world, &o, &d));
    for (int i = 0; i < np; i++) CHECK(kiln_ddp_bucket_of(d, i) == np - 1 - i);
    kiln_scope_begin();
    kiln_tensor *x = kiln_randn(KILN_SHAPE(8, 16), KILN_F32, KILN_CPU);
    kiln_tensor *y = kiln_zeros(KILN_SHAPE(8), KILN_I64, KILN_CPU);
    int seen[16], n_seen = 0;
    for (int step = 0; step < 3; step++) {
        n_arrival = 0;
        CHECK_OK(kiln_backward(kiln_cross_entropy(kiln_ddp_forward(d, x), y, NULL), NULL, false));
        CHECK_OK(kiln_ddp_finish_grads(d));
        if (step == 0) memcpy(seen, arrival, sizeof arrival), n_seen = n_arrival;
    }
    kiln_scope_end();
    CHECK(n_seen == np);
    /* first's parameters (0, 1) arrive before second's (2, 3). */
    int pos_first = -1, pos_second = -1;
    for (int j = 0; j < n_seen; j++) {
        if (seen[j] == 0 && pos_first < 0) pos_first = j;
        if (seen[j] == 2 && pos_second < 0) pos_second = j;
    }
    CHECK_MSG(pos_first >= 0 && pos_second >= 0 && pos_first < pos_second,
              "the model should deliver first's gradient before second's");
    kiln_ddp_stats st;
    CHECK_OK(kiln_ddp_stats_get(d, &st));
    CHECK(st.buckets_rebuilt);
    for (int j = 0; j < n_seen; j++)
        CHECK_MSG(kiln_ddp_bucket_of(d, seen[j]) == j, "parameter %d arrived %d-th but is in bucket %d",
                  seen[j], j, kiln_ddp_bucket_of(d, seen[j]));
    /* Rebuilt, the first bucket starts at the first hook. */
    CHECK_MSG(st.hooks_before_first_start == 1, "bucket 0 started after %lld hooks",
              (long long)st.hooks_before_first_start);
    printf("rank %d: buckets rebuilt in the first backward's order:", rank);
    for (int j = 0; j < n_seen; j++) printf(" %d", seen[j]);
    printf("\n");
    kiln_ddp_free(d);
    free(params);
    kiln_module_free(m);
}

int main(void) {
    if (kiln_init()) return 1;
    CHECK_OK(kiln_dist_init(&world));
    if (!world) return kt_finish();
    rank = kiln_dist_rank(world);
    size = kiln_dist_world_size(world);
    CHECK_OK(kiln_dist_group_set_timeout(world, 60.0));
    kiln_scope_begin();
    test_matches_single_process();
    test_no_sync();
    test_unused_parameters();
    test_model_mismatch();
    test_batchnorm_buffers();
    test_overlap();
    test_rank_skips_backward();
    test_bucket_rebuild();
    kiln_scope_end();
    CHECK_OK(kiln_dist_shutdown());
    kiln_shutdown();
    return kt_finish();
}

/* A training loop over the public API: the tutorial CNN memorises a fixed
 * random dataset (32 samples of 1x28x28, 10 classes: noise around a
 * random pattern per class) with Adam, 100 steps of
 * batch 4, each inside its own scope. The loss must fall by 30%; the
 * optimizer state and gradients must survive the scopes; a step's peak
 * allocated bytes must be the same with and without a scope; the ASan
 * build's LeakSanitizer checks that nothing leaks. */
#include "nn/nn_test_util.c"
#include "nn/tutorial_cnn.c"

#define N_SAMPLES 32
#define BATCH 4
#define STEPS 100

typedef struct loop {
    kiln_module *model;
    kiln_optimizer *opt;
    kiln_tensor *x, *y; /* (32, 1, 28, 28) f32, (32) i64 */
} loop;

/* One step on batch b; *loss gets its value. Without a scope the caller
 * releases what the step returned, in the same places a scope would. */
static kiln_status train_step(loop *L, int b, double *loss, bool scoped) {
    if (scoped) kiln_scope_begin();
    kiln_tensor *xb = kiln_narrow(L->x, 0, (int64_t)b * BATCH, BATCH);
    kiln_tensor *yb = kiln_narrow(L->y, 0, (int64_t)b * BATCH, BATCH);
    kiln_tensor *logits = kiln_module_forward(L->model, xb);
    kiln_loss_opts lo = kiln_loss_defaults();
    kiln_tensor *l = logits ? kiln_cross_entropy(logits, yb, &lo) : NULL;
    kiln_status st = l ? kiln_item(l, loss) : kiln_error_last()->status;
    if (!st) st = kiln_optimizer_zero_grad(L->opt, true);
    if (!st) st = kiln_backward(l, NULL, false);
    if (!st) st = kiln_optimizer_step(L->opt);
    if (scoped) {
        kiln_status end = kiln_scope_end();
        if (!st) st = end;
    } else {
        kiln_release(l);
        kiln_release(logits);
        kiln_release(yb);
        kiln_release(xb);
    }
    return st;
}

static bool setup(loop *L) {
    kiln_manual_seed(1234);
    L->model = tcnn_new();
    int64_t labels[N_SAMPLES];
    uint64_t s = 88172645463325252ull;
    for (int i = 0; i < N_SAMPLES; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        labels[i] = (int64_t)(s % 10);
    }
    /* Each sample is noise plus a random pattern of its class: the set is
     * random but learnable, so the steps show a clear fall of the loss. */
    kiln_tensor *noise = kiln_randn(KILN_SHAPE(N_SAMPLES, 1, 28, 28), KILN_F32, KILN_CPU);
    kiln_tensor *patterns = kiln_randn(KILN_SHAPE(10, 28 * 28), KILN_F32, KILN_CPU);
    double *xv = kt_values(noise), *pv = kt_values(patterns);
    for (int i = 0; xv && pv && i < N_SAMPLES * 28 * 28; i++) xv[i] += pv[labels[i / (28 * 28)] * 28 * 28 + i % (28 * 28)];
    L->x = xv && pv ? kt_tensor(KILN_SHAPE(N_SAMPLES, 1, 28, 28), KILN_F32, xv) : NULL;
    free(xv);
    free(pv);
    kiln_release(noise);
    kiln_release(patterns);
    L->y = kiln_from_data(KILN_SHAPE(N_SAMPLES), KILN_I64, KILN_CPU, labels);
    kiln_tensor **params = NULL;
    int n = 0;
    if (L->model && !kiln_module_parameters(L->model, &params, &n)) L->opt = kiln_adam(params, n, NULL);
    free(params);
    CHECK_MSG(L->model && L->x && L->y && L->opt, "setup: %s", kiln_error_message());
    return L->model && L->x && L->y && L->opt;
}

static void teardown(loop *L) {
    kiln_optimizer_free(L->opt);
    kiln_module_free(L->model);
    kiln_release(L->x);
    kiln_release(L->y);
}

static int64_t peak_of_step(loop *L, bool scoped, int64_t *base) {
    kiln_memory_stats ms;
    *base = (int64_t)kiln_memory_allocated(KILN_CPU);
    kiln_memory_reset_peak(KILN_CPU);
    double loss;
    CHECK_OK(train_step(L, 0, &loss, scoped));
    CHECK_OK(kiln_memory_stats_get(KILN_CPU, &ms));
    return ms.allocated_bytes[KILN_POOL_ALL].peak;
}

int main(void) {
    if (kiln_init()) return 1;
    loop L = {0};
    if (setup(&L)) {
        double losses[STEPS];
        int done = 0;
        for (int step = 0; step < STEPS; step++) {
            kiln_status st = train_step(&L, step % (N_SAMPLES / BATCH), &losses[step], true);
            CHECK_MSG(st == KILN_OK, "step %d: %s", step, kiln_error_message());
            if (st) break;
            done++;
            if (step % 10 == 0 || step == STEPS - 1) printf("step %2d  loss %.4f\n", step, losses[step]);
        }
        if (done == STEPS) {
            double last = 0;
            const int epoch = N_SAMPLES / BATCH;
            for (int i = STEPS - epoch; i < STEPS; i++) last += losses[i] / epoch;
            printf("loss %.4f at the first step, %.4f over the last epoch\n", losses[0], last);
            CHECK_MSG(last <= 0.7 * losses[0], "loss %.4f -> %.4f (mean of the last epoch): not 30%% lower",
                      losses[0], last);
            /* State and gradients belong to the optimizer and the leaves, not to scopes. */
            CHECK_EQ_I(kiln_optimizer_step_count(L.opt), STEPS);
            kiln_tensor *m = kiln_optimizer_state(L.opt, 6, "exp_avg");
            CHECK(kt_shape_is(m, KILN_SHAPE(512, 1152)));
            kiln_release(m);
            kiln_tensor *w = kiln_module_state_get(L.model, "fc2.weight");
            kiln_tensor *g = kiln_grad(w);
            CHECK(kt_shape_is(g, KILN_SHAPE(10, 512)));
            kiln_release(g);
            kiln_release(w);

            int64_t base_a, base_b;
            int64_t with_scope = peak_of_step(&L, true, &base_a);
            int64_t without = peak_of_step(&L, false, &base_b);
            printf("peak allocated bytes of one step: %lld with a scope, %lld without\n", (long long)with_scope,
                   (long long)without);
            CHECK_EQ_I(base_a, base_b);
            CHECK_EQ_I(with_scope, without);
        }
    }
    teardown(&L);
    kiln_shutdown();
    return kt_finish();
}

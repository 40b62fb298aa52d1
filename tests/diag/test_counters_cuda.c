/* The efficiency counters and the profiler's device times on cuda:0 (a
 * GPU, or the emulation build's emulated device, whose streams run
 * asynchronously): after a first step has filled the caches, a training
 * step of a small CNN (conv2d, relu, max pool, linear, cross entropy,
 * backward, Adam; data already on the device) makes no raw device
 * allocation, no pageable copy and exactly one host synchronisation (the
 * loss read with kiln_item); and the profiler records a device time for the
 * ops that ran on the device. Skips (77) without cuda:0. */
#include "diag/profiler_internal.h"
#include "test_util.h"

typedef struct model {
    kiln_tensor *x, *y, *cw, *cb, *lw, *lb;
    kiln_optimizer *opt;
} model;

static kiln_tensor *on_device(kiln_tensor *t) {
    kiln_tensor *d = t ? kiln_to(t, KILN_CUDA(0), kiln_dtype_of(t), 0) : NULL;
    kiln_release(t);
    return d;
}

static bool model_init(model *m) {
    kiln_manual_seed(11);
    int64_t labels[6] = {1, 3, 5, 7, 9, 2};
    m->x = on_device(kiln_randn(KILN_SHAPE(6, 2, 9, 9), KILN_F32, KILN_CPU));
    m->y = on_device(kiln_from_data(KILN_SHAPE(6), KILN_I64, KILN_CPU, labels));
    m->cw = on_device(kiln_randn(KILN_SHAPE(5, 2, 3, 3), KILN_F32, KILN_CPU));
    m->cb = on_device(kiln_zeros(KILN_SHAPE(5), KILN_F32, KILN_CPU));
    m->lw = on_device(kiln_randn(KILN_SHAPE(10, 5 * 3 * 3), KILN_F32, KILN_CPU));
    m->lb = on_device(kiln_zeros(KILN_SHAPE(10), KILN_F32, KILN_CPU));
    kiln_tensor *params[4] = {m->cw, m->cb, m->lw, m->lb};
    for (int i = 0; i < 4; i++)
        if (!params[i] || kiln_set_requires_grad(params[i], true)) return false;
    m->opt = kiln_adam(params, 4, NULL);
    return m->x && m->y && m->opt;
}

static void model_free(model *m) {
    kiln_optimizer_free(m->opt);
    kiln_tensor *all[6] = {m->x, m->y, m->cw, m->cb, m->lw, m->lb};
    for (int i = 0; i < 6; i++) kiln_release(all[i]);
}

static kiln_status train_step(model *m, double *loss) {
    kiln_scope_begin();
    kiln_range_push("forward");
    kiln_pool2d_opts po = kiln_pool2d_defaults(2);
    kiln_tensor *h = kiln_max_pool2d(kiln_relu(kiln_conv2d(m->x, m->cw, m->cb, NULL)), &po, NULL);
    kiln_tensor *logits = kiln_linear(kiln_flatten(h, 1, -1), m->lw, m->lb);
    kiln_loss_opts lo = kiln_loss_defaults();
    kiln_tensor *l = kiln_cross_entropy(logits, m->y, &lo);
    kiln_range_pop();
    kiln_status st = l ? KILN_OK : kiln_error_last()->status;
    if (!st) st = kiln_optimizer_zero_grad(m->opt, true);
    if (!st) st = kiln_backward(l, NULL, false);
    if (!st) st = kiln_optimizer_step(m->opt);
    if (!st) st = kiln_item(l, loss); /* the step's one host synchronisation */
    kiln_status end = kiln_scope_end();
    return st ? st : end;
}

int main(void) {
    if (kiln_init()) return 1;
    if (!kiln_device_is_available(KILN_CUDA(0))) {
        kiln_shutdown();
        kt_skip("no cuda:0 (a GPU, or the emulation build -DKILN_CUDA_EMULATION=ON)");
    }
    model m = {0};
    CHECK_MSG(model_init(&m), "model on cuda:0: %s", kiln_error_message());
    double loss = 0, first = 0;
    CHECK_OK(train_step(&m, &first)); /* fills the allocator's cache */
    for (int s = 0; s < 3; s++) {
        kiln_counters a, b, d;
        kiln_counters_get(&a);
        CHECK_OK(train_step(&m, &loss));
        kiln_counters_get(&b);
        kiln_counters_diff(&b, &a, &d);
        CHECK_EQ_I(d.raw_allocs, 0);
        CHECK_EQ_I(d.pageable_copies, 0);
        CHECK_EQ_I(d.host_syncs, 1);
        CHECK(d.kernel_launches > 10);
    }
    CHECK_MSG(loss < first, "Adam did not lower the loss: %g then %g", first, loss);

    /* Device time from events on the op's stream, resolved at collection. */
    CHECK_OK(kiln_profiler_start(NULL));
    CHECK_OK(train_step(&m, &loss));
    CHECK_OK(kiln_profiler_step());
    CHECK_OK(kiln_profiler_stop());
    const prof_result *r = kiln_profiler_result_lock();
    int conv_with_device_time = 0, convs = 0;
    for (size_t i = 0; i < r->n; i++) {
        if (!r->rec[i].name || strcmp(r->rec[i].name, "conv2d")) continue;
        convs++;
        conv_with_device_time += r->rec[i].dev_end_ns > r->rec[i].dev_start_ns;
    }
    kiln_profiler_result_unlock();
    CHECK_EQ_I(convs, 1);
    CHECK_EQ_I(conv_with_device_time, 1);
    model_free(&m);
    kiln_shutdown();
    return kt_finish();
}

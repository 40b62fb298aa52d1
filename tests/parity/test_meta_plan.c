/* The meta device plans memory: one full training step of the tutorial CNN
 * (batch 32: forward, cross-entropy, backward, Adam's first step) on `meta`,
 * where the allocator simulates, must predict the peak allocated bytes of
 * the same step on the CPU within 10%. Both runs go through exactly the
 * same code: the model, the batch and the optimizer are created with the
 * device made current by kiln_set_device. Initialisation (random ops) on
 * meta draws no data. */
#include "nn/nn_test_util.c"
#include "nn/tutorial_cnn.c"

#define BATCH 32

typedef struct step_mem {
    int64_t base;  /* allocated bytes before the step (model, batch) */
    int64_t peak;  /* allocated_bytes[ALL].peak during the step */
    int64_t after; /* allocated bytes after the step (with Adam's state) */
} step_mem;

static bool one_step(kiln_device dev, step_mem *r) {
    kiln_memory_stats ms;
    bool ok = false;
    CHECK_OK(kiln_set_device(dev));
    kiln_manual_seed(7);
    kiln_scope_begin();
    kiln_module *m = tcnn_new();
    kiln_tensor *x = kiln_randn(KILN_SHAPE(BATCH, 1, 28, 28), KILN_F32, dev);
    kiln_tensor *y = kiln_zeros(KILN_SHAPE(BATCH), KILN_I64, dev);
    kiln_tensor **params = NULL;
    int n = 0;
    kiln_optimizer *opt = NULL;
    if (m && !kiln_module_parameters(m, &params, &n)) opt = kiln_adam(params, n, NULL);
    free(params);
    CHECK_MSG(m && x && y && opt, "setup on %s: %s", dev.type == KILN_DEVICE_META ? "meta" : "cpu",
              kiln_error_message());
    if (m && x && y && opt) {
        r->base = (int64_t)kiln_memory_allocated(dev);
        CHECK_OK(kiln_memory_reset_peak(dev));
        kiln_scope_begin();
        kiln_tensor *logits = kiln_module_forward(m, x);
        kiln_loss_opts lo = kiln_loss_defaults();
        kiln_tensor *loss = logits ? kiln_cross_entropy(logits, y, &lo) : NULL;
        kiln_status st = loss ? kiln_backward(loss, NULL, false) : kiln_error_last()->status;
        if (!st) st = kiln_optimizer_step(opt);
        CHECK_MSG(st == KILN_OK, "step: %s", kiln_error_message());
        CHECK_OK(kiln_scope_end());
        CHECK_OK(kiln_memory_stats_get(dev, &ms));
        r->peak = ms.allocated_bytes[KILN_POOL_ALL].peak;
        r->after = (int64_t)kiln_memory_allocated(dev);
        ok = st == KILN_OK;
    }
    kiln_optimizer_free(opt);
    kiln_module_free(m);
    CHECK_OK(kiln_scope_end());
    CHECK_OK(kiln_set_device(KILN_CPU));
    return ok;
}

/* A random op on meta runs no kernel and leaves the generator where the
 * same op on the CPU leaves it (cpu and meta share one stream). */
static void test_meta_random_ops(void) {
    kiln_manual_seed(11);
    kiln_tensor *a = kiln_randn(KILN_SHAPE(1000), KILN_F32, KILN_META);
    kiln_tensor *d = a ? kiln_dropout(a, 0.5, true) : NULL;
    CHECK(a && d);
    CHECK(kiln_get_device(d).type == KILN_DEVICE_META);
    kiln_tensor *after_meta = kiln_randn(KILN_SHAPE(4), KILN_F32, KILN_CPU);
    kiln_manual_seed(11);
    kiln_tensor *b = kiln_randn(KILN_SHAPE(1000), KILN_F32, KILN_CPU);
    kiln_tensor *e = b ? kiln_dropout(b, 0.5, true) : NULL;
    kiln_tensor *after_cpu = kiln_randn(KILN_SHAPE(4), KILN_F32, KILN_CPU);
    double *u = kt_values(after_meta), *v = kt_values(after_cpu);
    CHECK(u && v && !memcmp(u, v, 4 * sizeof *u));
    free(u);
    free(v);
    kiln_release(a);
    kiln_release(d);
    kiln_release(b);
    kiln_release(e);
    kiln_release(after_meta);
    kiln_release(after_cpu);
}

/* A kernel's workspace counts on meta too: the peak of one convolution
 * (forward and both backward kernels) is the same on meta and on the CPU. */
static int64_t conv_peak(kiln_device dev) {
    kiln_memory_stats ms = {0};
    kiln_scope_begin();
    kiln_tensor *x = kiln_zeros(KILN_SHAPE(4, 16, 30, 30), KILN_F32, dev);
    kiln_tensor *w = kiln_zeros(KILN_SHAPE(32, 16, 3, 3), KILN_F32, dev);
    kiln_conv2d_opts co = {.stride = {1, 1}, .padding = {1, 1}, .dilation = {1, 1}, .groups = 1};
    CHECK_OK(kiln_set_requires_grad(x, true));
    CHECK_OK(kiln_set_requires_grad(w, true));
    CHECK_OK(kiln_memory_reset_peak(dev));
    kiln_tensor *y = kiln_conv2d(x, w, NULL, &co);
    kiln_tensor *s = y ? kiln_sum(y, 0, NULL, false) : NULL;
    CHECK_OK(s ? kiln_backward(s, NULL, false) : kiln_error_last()->status);
    CHECK_OK(kiln_memory_stats_get(dev, &ms));
    CHECK_OK(kiln_scope_end());
    return ms.allocated_bytes[KILN_POOL_ALL].peak;
}

static void test_meta_workspace(void) {
    int64_t cpu = conv_peak(KILN_CPU), meta = conv_peak(KILN_META);
    printf("one convolution, forward and backward: peak %lld bytes on the cpu, %lld on meta\n", (long long)cpu,
           (long long)meta);
    CHECK_EQ_I(meta, cpu);
}

int main(void) {
    if (kiln_init()) return 1;
    test_meta_random_ops();
    test_meta_workspace();
    step_mem meta = {0}, cpu = {0};
    /* The CPU first, so its pools are warm like a training loop's; the
     * peak counts allocated bytes, which do not depend on caching. */
    bool ok = one_step(KILN_CPU, &cpu) && one_step(KILN_META, &meta);
    if (ok) {
        printf("allocated bytes      cpu          meta\n");
        printf("  before the step    %-12lld %lld\n", (long long)cpu.base, (long long)meta.base);
        printf("  peak of the step   %-12lld %lld\n", (long long)cpu.peak, (long long)meta.peak);
        printf("  after the step     %-12lld %lld\n", (long long)cpu.after, (long long)meta.after);
        double rel = fabs((double)(meta.peak - cpu.peak)) / (double)cpu.peak;
        double rel_step = fabs((double)((meta.peak - meta.base) - (cpu.peak - cpu.base))) / (double)(cpu.peak - cpu.base);
        printf("meta's prediction of the peak is off by %.2f%% (%.2f%% of the step's own allocations)\n",
               100 * rel, 100 * rel_step);
        CHECK_MSG(rel <= 0.10, "meta predicted a peak of %lld bytes, the cpu reached %lld", (long long)meta.peak,
                  (long long)cpu.peak);
        CHECK_MSG(rel_step <= 0.10, "meta predicted the step to add %lld bytes at its peak, the cpu added %lld",
                  (long long)(meta.peak - meta.base), (long long)(cpu.peak - cpu.base));
    }
    kiln_shutdown();
    return kt_finish();
}

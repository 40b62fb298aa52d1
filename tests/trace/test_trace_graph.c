/* On cuda:0 a replay is one CUDA graph (emulated in the emulation build,
 * which the emu tier runs; skipped where the build sees no CUDA device):
 *   - the tutorial CNN's inference and its Adam training step, replayed on
 *     fresh data, bit-identical to eager twins, and each replay after the
 *     first is one graph launch and no kernel launched by the host (the
 *     emulator's counters), with no allocator call;
 *   - dropout under the graph: the generator's position is a device-side
 *     input, so replays draw fresh masks, equal to eager's from the same
 *     generator state, and leave the generator where eager leaves it;
 *   - refused at capture time, naming the step: a random fill that takes
 *     its generator position by value, and a kernel that synchronises the
 *     host while being captured (launch blocking). */
#include <math.h>
#include <string.h>

#include "trace/trace_test_util.h"
#ifdef KILN_CUDA_EMULATION
#include "emu/kiln_emu_api.h"
#endif

typedef struct counts {
    unsigned long long graphs, direct, captured, run;
} counts;

static counts now(kiln_device d) {
    CHECK_OK(kiln_device_synchronize(d));
    counts c = {0, 0, 0, 0};
#ifdef KILN_CUDA_EMULATION
    kiln_emu_stats s;
    kiln_emu_get_stats(&s);
    c = (counts){s.graph_launches, s.direct_launches, s.captured_launches, s.launches};
#endif
    return c;
}

/* One replay's counters against the capture's: one graph launch, no
 * kernel launched by the host, every captured kernel run. */
static void check_one_graph(const char *what, int round, counts before, counts after,
                            unsigned long long nodes) {
#ifdef KILN_CUDA_EMULATION
    CHECK_MSG(
        after.graphs - before.graphs == 1 && after.direct == before.direct &&
            after.run - before.run == nodes && nodes > 0,
        "%s replay %d: %llu graph launches, %llu kernels launched by the host, %llu run of %llu captured",
        what, round, after.graphs - before.graphs, after.direct - before.direct, after.run - before.run,
        nodes);
#else
    (void)what, (void)round, (void)before, (void)after, (void)nodes;
#endif
}

static void check_infer(kiln_device dev) {
    tt_model md = tt_make("tutorial_cnn_32x32x3.txt", dev, KILN_F32);
    if (!md.m) return;
    kiln_module_train(md.m, false);
    kiln_no_grad_begin();
    kiln_manual_seed(7);
    kiln_tensor *x = kiln_randn(KILN_SHAPE(2, 3, 32, 32), KILN_F32, dev);
    kiln_program *p = NULL;
    CHECK_OK(kiln_trace(tt_forward, md.m, 1, &x, 1, NULL, &p));
    unsigned long long nodes = 0;
    for (int round = 0; p && round < 3; round++) {
        kiln_tensor *xi = kiln_randn(KILN_SHAPE(2, 3, 32, 32), KILN_F32, dev), *y = NULL;
        counts c0 = now(dev);
        int64_t allocs = kiln_memory_alloc_count();
        CHECK_OK(kiln_program_run(p, 1, &xi, 1, &y));
        counts c1 = now(dev);
        if (round == 0) {
            nodes = c1.captured - c0.captured;
        } else {
            CHECK_EQ_I(kiln_memory_alloc_count() - allocs, 0);
            check_one_graph("inference", round, c0, c1, nodes);
        }
        kiln_tensor *ref = kiln_module_forward(md.m, xi);
        CHECK_MSG(tt_same_bits(y, ref), "inference replay %d differs from eager", round);
        kiln_release(ref), kiln_release(y), kiln_release(xi);
    }
    kiln_program_free(p);
    kiln_release(x);
    kiln_grad_mode_end();
    tt_free(&md);
}

/* The Adam step: lr and the bias corrections of each replay's step come
 * from the graph's device-side parameter block. A learning-rate change
 * between replays is followed (an LR schedule). */
static void check_train(kiln_device dev) {
    tt_model a = tt_make("tutorial_cnn_32x32x3.txt", dev, KILN_F32);
    tt_model b = tt_make("tutorial_cnn_32x32x3.txt", dev, KILN_F32);
    if (!a.m || !b.m) return;
    kiln_manual_seed(3);
    kiln_tensor *in[2], *out = NULL;
    tt_batch(4, dev, &in[0], &in[1]);
    CHECK_OK(tt_step(&a, in, &out));
    kiln_release(out);
    CHECK_OK(tt_step(&b, in, &out));
    kiln_release(out);
    kiln_program *p = NULL;
    CHECK_OK(kiln_trace(tt_step, &b, 2, in, 1, NULL, &p));
    CHECK_OK(tt_step(&a, in, &out));
    kiln_release(out);
    kiln_release(in[0]), kiln_release(in[1]);
    unsigned long long nodes = 0;
    for (int s = 0; p && s < 3; s++) {
        if (s == 2) {
            CHECK_OK(kiln_optimizer_set_lr(a.opt, 3e-4));
            CHECK_OK(kiln_optimizer_set_lr(b.opt, 3e-4));
        }
        tt_batch(4, dev, &in[0], &in[1]);
        kiln_tensor *lr = NULL, *le = NULL;
        counts c0 = now(dev);
        int64_t allocs = kiln_memory_alloc_count();
        CHECK_OK(kiln_program_run(p, 2, in, 1, &lr));
        counts c1 = now(dev);
        if (s == 0) {
            nodes = c1.captured - c0.captured;
        } else {
            CHECK_EQ_I(kiln_memory_alloc_count() - allocs, 0);
            check_one_graph("training", s, c0, c1, nodes);
        }
        CHECK_OK(tt_step(&a, in, &le));
        CHECK_MSG(tt_same_bits(lr, le), "replayed step %d: loss differs from eager", s);
        CHECK_MSG(tt_same_state(a.m, b.m), "replayed step %d: parameters differ from eager", s);
        kiln_release(lr), kiln_release(le);
        kiln_release(in[0]), kiln_release(in[1]);
    }
    kiln_program_free(p);
    tt_free(&a), tt_free(&b);
}

static double value(kiln_tensor *t) {
    double v = NAN;
    CHECK_OK(kiln_item(t, &v));
    return v;
}

static void check_dropout(kiln_device dev) {
    tt_model a = tt_dropout_model(dev), b = tt_dropout_model(dev);
    if (!a.m || !b.m) return;
    kiln_tensor *in[2];
    in[0] = kiln_randn(KILN_SHAPE(16, 3, 8, 8), KILN_F32, dev);
    int64_t labels[16];
    for (int i = 0; i < 16; i++) labels[i] = i % 10;
    kiln_tensor *h = kiln_from_data(KILN_SHAPE(16), KILN_I64, KILN_CPU, labels);
    in[1] = kiln_to(h, dev, KILN_I64, 0);
    kiln_release(h);
    kiln_tensor *l = NULL;
    kiln_manual_seed(50);
    CHECK_OK(tt_step(&a, in, &l));
    kiln_release(l);
    kiln_manual_seed(50);
    CHECK_OK(tt_step(&b, in, &l));
    kiln_release(l);
    kiln_program *p = NULL;
    kiln_manual_seed(100);
    CHECK_OK(kiln_trace(tt_step, &b, 2, in, 1, NULL, &p));
    kiln_manual_seed(100);
    CHECK_OK(tt_step(&a, in, &l));
    kiln_release(l);
    double prev = NAN;
    for (int s = 0; p && s < 3; s++) {
        kiln_manual_seed(200 + (uint64_t)s);
        kiln_tensor *lr = NULL, *le = NULL;
        counts c0 = now(dev);
        CHECK_OK(kiln_program_run(p, 2, in, 1, &lr));
        counts c1 = now(dev);
        if (s > 0) check_one_graph("dropout", s, c0, c1, c1.run - c0.run);
        kiln_tensor *r1 = kiln_rand(KILN_SHAPE(1), KILN_F32, dev); /* where the generator ended */
        kiln_manual_seed(200 + (uint64_t)s);
        CHECK_OK(tt_step(&a, in, &le));
        kiln_tensor *r2 = kiln_rand(KILN_SHAPE(1), KILN_F32, dev);
        double vr = value(lr), ve = value(le);
        CHECK_MSG(vr == ve && isfinite(vr), "dropout step %d: replayed loss %.9g, eager %.9g", s, vr, ve);
        CHECK_MSG(tt_same_state(a.m, b.m), "dropout step %d: parameters differ from eager", s);
        CHECK_MSG(value(r1) == value(r2), "dropout step %d: the generator ended elsewhere after the replay",
                  s);
        CHECK_MSG(vr != prev, "dropout step %d: the replay drew the previous step's mask", s);
        prev = vr;
        kiln_release(lr), kiln_release(le), kiln_release(r1), kiln_release(r2);
    }
    kiln_program_free(p);
    kiln_release(in[0]), kiln_release(in[1]);
    tt_free(&a), tt_free(&b);
}

static kiln_status noisy(void *user, kiln_tensor *const *in, kiln_tensor **out) {
    kiln_device dev = *(const kiln_device *)user;
    kiln_tensor *y = kiln_mul_scalar(in[0], 2.0); /* a kernel first: it names the device for the trace */
    kiln_tensor *r = y ? kiln_rand(KILN_SHAPE(4, 5), KILN_F32, dev) : NULL;
    out[0] = r ? kiln_add(y, r) : NULL;
    kiln_release(r), kiln_release(y);
    return out[0] ? KILN_OK : kiln_error_last()->status;
}

static kiln_status relu_call(void *user, kiln_tensor *const *in, kiln_tensor **out) {
    (void)user;
    out[0] = kiln_relu(in[0]);
    return out[0] ? KILN_OK : kiln_error_last()->status;
}

static void check_refusals(kiln_device dev) {
    kiln_no_grad_begin();
    kiln_tensor *x = kiln_randn(KILN_SHAPE(4, 5), KILN_F32, dev), *y = NULL;
    kiln_program *p = NULL;
    CHECK_OK(kiln_trace(noisy, &dev, 1, &x, 1, NULL, &p));
    for (int k = 0; p && k < 2; k++) {
        kiln_status st = kiln_program_run(p, 1, &x, 1, &y);
        const char *msg = kiln_error_message();
        CHECK_MSG(st == KILN_ERR_UNSUPPORTED && strstr(msg, "random fill") && strstr(msg, "CUDA graph") &&
                      strstr(msg, "cannot be captured"),
                  "a random fill under a graph: status %d, '%s'", (int)st, msg);
    }
    kiln_program_free(p);
    p = NULL;
    CHECK_OK(kiln_trace(relu_call, NULL, 1, &x, 1, NULL, &p));
    kiln_set_launch_blocking(true);
    kiln_status st = p ? kiln_program_run(p, 1, &x, 1, &y) : KILN_OK;
    kiln_set_launch_blocking(false);
    const char *msg = kiln_error_message();
    CHECK_MSG(st != KILN_OK && strstr(msg, "step 0 (relu) cannot be captured") &&
                  strstr(msg, "cudaErrorStreamCaptureUnsupported"),
              "a synchronising kernel under capture: status %d, '%s'", (int)st, msg);
    st = p ? kiln_program_run(p, 1, &x, 1, &y) : KILN_OK;
    CHECK_MSG(st == KILN_ERR_STATE, "a program whose capture failed stays refused: status %d", (int)st);
    kiln_program_free(p);
    kiln_release(x);
    kiln_grad_mode_end();
}

int main(void) {
    if (kiln_init()) return 1;
    kiln_device cuda0 = {KILN_DEVICE_CUDA, 0};
    if (!kiln_device_is_available(cuda0)) {
        kiln_shutdown();
        kt_skip("no cuda:0 device (real or emulated) in this build");
    }
    /* Bit-identical to eager holds between run-to-run deterministic
     * kernels: on a GPU cuDNN's default backward convolutions may use
     * atomics (on the H100 the replayed and the eager training steps
     * differed, inference did not), so the comparison runs as under
     * torch.use_deterministic_algorithms. No effect in the emulator. */
    kiln_set_deterministic(true);
    check_infer(cuda0);
    check_train(cuda0);
    check_dropout(cuda0);
    check_refusals(cuda0);
    kiln_shutdown();
    return kt_finish();
}

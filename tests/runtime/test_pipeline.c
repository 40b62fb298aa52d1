/* kiln_nn_pipeline: the tutorial CNN in two stages (the first two conv
 * blocks; the third, the classifier) gives the loss and gradients of the
 * unsplit model within f32 tolerance, with 1 and 4 micro-batches (6
 * samples: micro-batches of 2, 2, 1, 1):
 *   - on the CPU, both stages on the CPU (the schedule and the sums);
 *   - on the emulated cuda:0 / cuda:1 (or two GPUs): stage 0 on cuda:0,
 *     stage 1 on cuda:1, gradients back on each stage's device;
 * the same for one flat Sequential placed in the same two stages with
 * kiln_nn_sequential_place (names unchanged, checkpointing refused); and
 * bad arguments are refused by name. The device part skips visibly
 * without two CUDA devices. */
#include <stdbool.h>
#include <stdlib.h>

#include "test_util.h"
#ifdef KILN_CUDA_EMULATION
#include "emu/kiln_emu_api.h"
#endif

enum { BATCH = 6, NPARAM = 10 };

/* Stage 0: conv1 relu pool conv2 relu pool; stage 1: conv3 relu pool
 * flatten fc1 relu fc2 (OptimizedCNN on 1x28x28). Seeded: the same weights
 * every call. */
static void make_layers(kiln_module **l) {
    kiln_manual_seed(42);
    kiln_module *a[] = {kiln_nn_conv2d(1, 32, 3, 1, 1, 1, 1, true), kiln_nn_relu(), kiln_nn_max_pool2d(2, 2, 0),
                        kiln_nn_conv2d(32, 64, 3, 1, 1, 1, 1, true), kiln_nn_relu(), kiln_nn_max_pool2d(2, 2, 0),
                        kiln_nn_conv2d(64, 128, 3, 1, 1, 1, 1, true), kiln_nn_relu(), kiln_nn_max_pool2d(2, 2, 0),
                        kiln_nn_flatten(1, -1), kiln_nn_linear(128 * 3 * 3, 512, true), kiln_nn_relu(),
                        kiln_nn_linear(512, 10, true)};
    memcpy(l, a, sizeof a);
}
static void make_stages(kiln_module **s0, kiln_module **s1) {
    kiln_module *l[13];
    make_layers(l);
    *s0 = kiln_nn_sequential(6, l);
    *s1 = kiln_nn_sequential(7, l + 6);
}

/* Loss and every parameter's gradient (as doubles, in state-dict order)
 * of cross_entropy(model(x), y) on the last stage's device. */
static double loss_and_grads(kiln_module *model, kiln_device out_dev, double *g, int64_t cap, int64_t *count) {
    kiln_scope_begin();
    kiln_manual_seed(7);
    kiln_tensor *x = kiln_randn(KILN_SHAPE(BATCH, 1, 28, 28), KILN_F32, KILN_CPU);
    int64_t labels[BATCH] = {3, 1, 4, 1, 5, 9};
    kiln_tensor *y = kiln_to(kiln_from_data(KILN_SHAPE(BATCH), KILN_I64, KILN_CPU, labels), out_dev, KILN_I64, 0);
    kiln_device in_dev = KILN_CPU;
    kiln_module *first = kiln_module_child_at(model, 0, NULL);
    kiln_tensor *w = kiln_module_state_get(first, "0.weight");
    if (w) in_dev = kiln_get_device(w);
    kiln_release(w);
    if (kiln_nn_sequential_placement(model, NULL, 0, NULL) > 0) in_dev = KILN_CPU; /* the forward moves it */
    kiln_tensor *logits = kiln_module_forward(model, kiln_to(x, in_dev, KILN_F32, 0));
    CHECK_MSG(logits != NULL, "forward: %s", kiln_error_message());
    double loss = NAN;
    if (logits) {
        CHECK(kiln_device_equal(kiln_get_device(logits), out_dev));
        kiln_tensor *l = kiln_cross_entropy(logits, y, NULL);
        CHECK_OK(kiln_backward(l, NULL, false));
        CHECK_OK(kiln_item(l, &loss));
    }
    kiln_named_tensor *ps = NULL;
    int np = 0;
    CHECK_OK(kiln_module_named_parameters(model, &ps, &np));
    CHECK_EQ_I(np, NPARAM);
    *count = 0;
    for (int i = 0; i < np; i++) {
        kiln_tensor *gi = kiln_grad(ps[i].tensor);
        CHECK_MSG(gi != NULL, "parameter %s got no gradient", ps[i].name);
        if (!gi) continue;
        CHECK(kiln_device_equal(kiln_get_device(gi), kiln_get_device(ps[i].tensor)));
        kiln_tensor *h = kiln_to(gi, KILN_CPU, KILN_F64, 0);
        int64_t n = kiln_numel(h);
        if (*count + n <= cap) CHECK_OK(kiln_to_host(h, g + *count, (size_t)n * sizeof(double)));
        *count += n;
        kiln_release(h);
        kiln_release(gi);
    }
    free(ps);
    kiln_scope_end();
    return loss;
}

static double rel_err(const double *a, const double *b, int64_t n) {
    double e = 0, s = 0;
    for (int64_t i = 0; i < n; i++) e += (a[i] - b[i]) * (a[i] - b[i]), s += b[i] * b[i];
    return s > 0 ? sqrt(e / s) : INFINITY;
}

enum { CAP = 700000 };
static double want[CAP], got[CAP];

static void check_split(const kiln_device *devs, int micro, const char *what, double ref_loss, int64_t ref_n) {
    kiln_module *s[2];
    make_stages(&s[0], &s[1]);
    kiln_module *p = kiln_nn_pipeline(2, s, devs, micro);
    CHECK_MSG(p != NULL, "%s: %s", what, kiln_error_message());
    if (!p) return;
    int64_t n = 0;
    double loss = loss_and_grads(p, devs ? devs[1] : KILN_CPU, got, CAP, &n);
    CHECK_EQ_I(n, ref_n);
    CHECK_MSG(fabs(loss - ref_loss) <= 1e-5 * fabs(ref_loss), "%s, %d micro-batches: loss %.9g, unsplit %.9g", what,
              micro, loss, ref_loss);
    double e = rel_err(got, want, n < ref_n ? n : ref_n);
    CHECK_MSG(e < 2e-5, "%s, %d micro-batches: gradients differ by %g (relative)", what, micro, e);
    kiln_module_free(p);
}

/* The same layers as one flat Sequential placed in two stages (layers 0..5
 * on devs[0], 6..12 on devs[1]) with kiln_nn_sequential_place: the state
 * dict keeps the flat names, the step is the unsplit one. */
static void check_place(const kiln_device *devs, int micro, const char *what, double ref_loss, int64_t ref_n) {
    kiln_module *l[13];
    make_layers(l);
    kiln_module *seq = kiln_nn_sequential(13, l);
    int first[2] = {0, 6};
    CHECK_OK(kiln_nn_sequential_place(seq, 2, first, devs, micro));
    int got_first[2] = {-1, -1}, got_micro = 0;
    CHECK_EQ_I(kiln_nn_sequential_placement(seq, got_first, 2, &got_micro), 2);
    CHECK(got_first[0] == 0 && got_first[1] == 6 && got_micro == micro);
    kiln_tensor *w = kiln_module_state_get(seq, "10.weight"); /* fc1: the flat name, on stage 1's device */
    CHECK(w && kiln_device_equal(kiln_get_device(w), devs[1]));
    kiln_release(w);
    int64_t n = 0;
    double loss = loss_and_grads(seq, devs[1], got, CAP, &n);
    CHECK_EQ_I(n, ref_n);
    CHECK_MSG(fabs(loss - ref_loss) <= 1e-5 * fabs(ref_loss), "placed %s, %d micro-batches: loss %.9g, unsplit %.9g",
              what, micro, loss, ref_loss);
    double e = rel_err(got, want, n < ref_n ? n : ref_n);
    CHECK_MSG(e < 2e-5, "placed %s, %d micro-batches: gradients differ by %g (relative)", what, micro, e);
    /* Checkpointing a placed Sequential is refused by name; removing the
     * placement leaves the layers where they are. */
    kiln_error_clear();
    CHECK(kiln_nn_sequential_set_checkpoint(seq, 2) == KILN_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(kiln_error_message(), "placed on devices"), "%s", kiln_error_message());
    CHECK_OK(kiln_nn_sequential_place(seq, 0, NULL, NULL, 1));
    CHECK_EQ_I(kiln_nn_sequential_placement(seq, NULL, 0, NULL), 0);
    kiln_module_free(seq);
}

#ifdef KILN_CUDA_EMULATION
static int by_start(const void *a, const void *b) {
    double x = ((const kiln_emu_interval *)a)->start_s, y = ((const kiln_emu_interval *)b)->start_s;
    return (x > y) - (x < y);
}

/* The union of device d's intervals (sorted by start) as disjoint runs
 * into u; returns their count. */
static int busy_runs(const kiln_emu_interval *iv, int n, int d, double (*u)[2]) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (iv[i].device != d) continue;
        if (k > 0 && iv[i].start_s <= u[k - 1][1]) {
            if (iv[i].end_s > u[k - 1][1]) u[k - 1][1] = iv[i].end_s;
        } else {
            u[k][0] = iv[i].start_s, u[k][1] = iv[i].end_s, k++;
        }
    }
    return k;
}

/* The time both devices were busy at once in the timeline's intervals,
 * and each one's busy time. */
static double overlap_in(kiln_emu_interval *iv, int n, double *busy0, double *busy1);

/* The forward of a training step of the model split over cuda:0/cuda:1
 * with `micro` micro-batches, on the emulator's timeline (the backward
 * runs after, off the timeline): the time both devices were busy at once,
 * and each one's busy time. */
static double overlap_of(int micro, double *busy0, double *busy1) {
    kiln_device devs[2] = {{KILN_DEVICE_CUDA, 0}, {KILN_DEVICE_CUDA, 1}};
    kiln_module *l[13];
    make_layers(l);
    kiln_module *seq = kiln_nn_sequential(13, l);
    int first[2] = {0, 6};
    CHECK_OK(kiln_nn_sequential_place(seq, 2, first, devs, micro));
    enum { B = 64, CAP_IV = 1 << 16 };
    kiln_scope_begin();
    kiln_tensor *x = kiln_randn(KILN_SHAPE(B, 1, 28, 28), KILN_F32, devs[0]);
    kiln_tensor *y = kiln_zeros(KILN_SHAPE(B), KILN_I64, devs[1]);
    CHECK_OK(kiln_device_synchronize(devs[0]));
    CHECK_OK(kiln_device_synchronize(devs[1]));
    kiln_emu_timeline_start();
    kiln_tensor *loss = kiln_cross_entropy(kiln_module_forward(seq, x), y, NULL);
    CHECK_OK(kiln_device_synchronize(devs[0]));
    CHECK_OK(kiln_device_synchronize(devs[1]));
    kiln_emu_interval *iv = malloc(sizeof *iv * CAP_IV);
    int n = kiln_emu_timeline_stop(iv, CAP_IV);
    CHECK(n > 0 && n <= CAP_IV);
    if (n > CAP_IV) n = CAP_IV;
    double both = overlap_in(iv, n, busy0, busy1);
    CHECK_OK(kiln_backward(loss, NULL, false));
    free(iv);
    kiln_scope_end();
    kiln_module_free(seq);
    return both;
}

static double overlap_in(kiln_emu_interval *iv, int n, double *busy0, double *busy1) {
    double(*u0)[2] = malloc(sizeof *u0 * (size_t)n), (*u1)[2] = malloc(sizeof *u1 * (size_t)n);
    qsort(iv, (size_t)n, sizeof *iv, by_start);
    int n0 = busy_runs(iv, n, 0, u0), n1 = busy_runs(iv, n, 1, u1);
    double both = 0;
    *busy0 = *busy1 = 0;
    for (int i = 0; i < n0; i++) *busy0 += u0[i][1] - u0[i][0];
    for (int j = 0; j < n1; j++) *busy1 += u1[j][1] - u1[j][0];
    for (int i = 0, j = 0; i < n0 && j < n1;) {
        double a = u0[i][0] > u1[j][0] ? u0[i][0] : u1[j][0], b = u0[i][1] < u1[j][1] ? u0[i][1] : u1[j][1];
        if (b > a) both += b - a;
        if (u0[i][1] < u1[j][1]) i++;
        else j++;
    }
    free(u0), free(u1);
    return both;
}

/* The pipeline's streams run at the same time: with 4 micro-batches the
 * two devices are busy together for part of the forward (stage 0 computes
 * micro-batch k+1 while stage 1 computes k), more than with 1 micro-batch,
 * where stage 1 waits for stage 0. Printed for docs/multi-device.md. */
static void check_overlap(void) {
    double b0, b1, one = overlap_of(1, &b0, &b1);
    printf("pipeline on emulated cuda:0/cuda:1, batch 64, forward, 1 micro-batch: busy %.1f / %.1f ms, both at once %.1f ms\n",
           b0 * 1e3, b1 * 1e3, one * 1e3);
    double four = overlap_of(4, &b0, &b1);
    printf("pipeline on emulated cuda:0/cuda:1, batch 64, forward, 4 micro-batches: busy %.1f / %.1f ms, both at once %.1f ms "
           "(%.0f%% of the shorter)\n",
           b0 * 1e3, b1 * 1e3, four * 1e3, 100 * four / (b0 < b1 ? b0 : b1));
    CHECK_MSG(four > 0 && four > one, "no overlap: 4 micro-batches %.3f ms both busy, 1 micro-batch %.3f ms",
              four * 1e3, one * 1e3);
}
#endif

int main(void) {
    CHECK_OK(kiln_init());
    /* The unsplit model: both stages as one Sequential on the CPU. */
    kiln_module *s[2];
    make_stages(&s[0], &s[1]);
    kiln_module *whole = kiln_nn_sequential(2, s);
    int64_t ref_n = 0;
    double ref_loss = loss_and_grads(whole, KILN_CPU, want, CAP, &ref_n);
    CHECK(ref_n > 0 && ref_n <= CAP && isfinite(ref_loss));
    kiln_module_free(whole);

    check_split(NULL, 1, "cpu/cpu", ref_loss, ref_n);
    check_split(NULL, 4, "cpu/cpu", ref_loss, ref_n);
    kiln_device cpus[2] = {KILN_CPU, KILN_CPU};
    check_place(cpus, 1, "cpu/cpu", ref_loss, ref_n);
    check_place(cpus, 4, "cpu/cpu", ref_loss, ref_n);

    /* Bad arguments, refused by name (the stages are freed). */
    make_stages(&s[0], &s[1]);
    kiln_error_clear();
    CHECK(kiln_nn_pipeline(2, s, NULL, 17) == NULL);
    CHECK_MSG(strstr(kiln_error_message(), "micro_batches must be 1..16"), "%s", kiln_error_message());
    kiln_module *none[1] = {NULL};
    kiln_error_clear();
    CHECK(kiln_nn_pipeline(1, none, NULL, 2) == NULL);
    CHECK_MSG(strstr(kiln_error_message(), "a stage is NULL"), "%s", kiln_error_message());
    /* A bad placement names the stage, its layer and the layer count. */
    kiln_module *l[13];
    make_layers(l);
    kiln_module *seq = kiln_nn_sequential(13, l);
    int bad_first[2] = {0, 13};
    kiln_error_clear();
    CHECK(kiln_nn_sequential_place(seq, 2, bad_first, cpus, 2) == KILN_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(kiln_error_message(), "stage 1: layer 13 on cpu; the Sequential has 13 layers"), "%s",
              kiln_error_message());
    CHECK_OK(kiln_nn_sequential_set_checkpoint(seq, 2));
    kiln_error_clear();
    int ok_first[2] = {0, 6};
    CHECK(kiln_nn_sequential_place(seq, 2, ok_first, cpus, 2) == KILN_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(kiln_error_message(), "checkpointed"), "%s", kiln_error_message());
    CHECK_EQ_I(kiln_nn_sequential_placement(seq, NULL, 0, NULL), 0);
    kiln_module_free(seq);

    if (kiln_device_count(KILN_DEVICE_CUDA) < 2) {
        printf("SKIPPED the cuda:0/cuda:1 part: fewer than two CUDA devices (the CPU part ran)\n");
    } else {
        kiln_device devs[2] = {{KILN_DEVICE_CUDA, 0}, {KILN_DEVICE_CUDA, 1}};
        check_split(devs, 1, "cuda:0/cuda:1", ref_loss, ref_n);
        check_split(devs, 4, "cuda:0/cuda:1", ref_loss, ref_n);
        check_place(devs, 1, "cuda:0/cuda:1", ref_loss, ref_n);
        check_place(devs, 4, "cuda:0/cuda:1", ref_loss, ref_n);
#ifdef KILN_CUDA_EMULATION
        check_overlap();
#endif
        /* A wrong placement: fc1 (layer 10, stage 1 on cuda:1) moved to
         * cuda:0 by hand. The op's device error comes back saying the model
         * spans devices and pointing at the placement. */
        kiln_module *wl[13];
        make_layers(wl);
        kiln_module *wrong = kiln_nn_sequential(13, wl);
        int first[2] = {0, 6};
        CHECK_OK(kiln_nn_sequential_place(wrong, 2, first, devs, 2));
        CHECK_OK(kiln_module_to(kiln_module_child_at(wrong, 10, NULL), devs[0]));
        kiln_scope_begin();
        kiln_error_clear();
        CHECK(kiln_module_forward(wrong, kiln_zeros(KILN_SHAPE(4, 1, 28, 28), KILN_F32, KILN_CPU)) == NULL);
        CHECK_MSG(strstr(kiln_error_message(), "the Sequential spans devices and one of its layers is on another device"),
                  "%s", kiln_error_message());
        CHECK_MSG(strstr(kiln_error_message(), "is on cuda:1 but input 1 is on cuda:0"), "%s", kiln_error_message());
        CHECK_MSG(strstr(kiln_error_last()->hint, "check the placement"), "%s", kiln_error_last()->hint);
        kiln_scope_end();
        kiln_module_free(wrong);
    }
    kiln_shutdown();
    return kt_finish();
}

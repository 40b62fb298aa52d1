/* Random ops replay with fresh numbers: a traced training step of a model
 * with dropout takes the device generator's position on each run, in the
 * order the eager step reserved its draws, so (1) two replays draw
 * different masks, (2) a replay and an eager step started from the same
 * generator state are bit-identical, forward and backward (the backward
 * reuses the forward's draw, not a new one), and (3) the generator ends at
 * the same position. */
#include <math.h>
#include <string.h>

#include "trace/trace_test_util.h"

static double value(kiln_tensor *t) {
    double v = NAN;
    CHECK_OK(kiln_item(t, &v));
    return v;
}

static bool same_params(kiln_module *a, kiln_module *b) {
    kiln_named_tensor *x = NULL, *y = NULL;
    int nx = 0, ny = 0;
    bool same = !kiln_module_state_dict(a, &x, &nx) && !kiln_module_state_dict(b, &y, &ny) && nx == ny;
    for (int i = 0; same && i < nx; i++) {
        kiln_tensor *p = kiln_contiguous(x[i].tensor), *q = kiln_contiguous(y[i].tensor);
        same = !memcmp(kiln_data_ptr(p), kiln_data_ptr(q), (size_t)kiln_numel(p) * 4);
        for (int64_t j = 0; same && j < kiln_numel(p); j++) same = isfinite(((float *)kiln_data_ptr(p))[j]);
        kiln_release(p), kiln_release(q);
    }
    free(x), free(y);
    return same;
}

int main(void) {
    CHECK_OK(kiln_init());
    tt_model a = tt_dropout_model(KILN_CPU), b = tt_dropout_model(KILN_CPU);
    if (!a.m || !b.m) return kt_finish();
    kiln_tensor *in[2];
    in[0] = kiln_randn(KILN_SHAPE(16, 3, 8, 8), KILN_F32, KILN_CPU);
    int64_t labels[16];
    for (int i = 0; i < 16; i++) labels[i] = i % 10;
    in[1] = kiln_from_data(KILN_SHAPE(16), KILN_I64, KILN_CPU, labels);
    kiln_tensor *l = NULL;
    kiln_manual_seed(50);
    CHECK_OK(tt_step(&a, in, &l)); /* warm-up: Adam's state */
    kiln_release(l);
    kiln_manual_seed(50);
    CHECK_OK(tt_step(&b, in, &l));
    kiln_release(l);
    kiln_program *p = NULL;
    kiln_manual_seed(100);
    CHECK_OK(kiln_trace(tt_step, &b, 2, in, 1, NULL, &p));
    if (getenv("TRACE_PRINT")) kiln_program_print(p, stdout);
    kiln_manual_seed(100);
    CHECK_OK(tt_step(&a, in, &l));
    kiln_release(l);
    CHECK_MSG(same_params(a.m, b.m), "the traced step differs from eager");
    double prev = NAN;
    for (int s = 0; p && s < 3; s++) {
        kiln_manual_seed(200 + (uint64_t)s);
        kiln_tensor *lr = NULL, *le = NULL;
        CHECK_OK(kiln_program_run(p, 2, in, 1, &lr));
        kiln_tensor *r1 = kiln_rand(KILN_SHAPE(1), KILN_F32, KILN_CPU); /* where the generator ended */
        kiln_manual_seed(200 + (uint64_t)s);
        CHECK_OK(tt_step(&a, in, &le));
        kiln_tensor *r2 = kiln_rand(KILN_SHAPE(1), KILN_F32, KILN_CPU);
        double vr = value(lr), ve = value(le);
        CHECK_MSG(vr == ve && isfinite(vr), "step %d: replayed loss %.9g, eager %.9g", s, vr, ve);
        CHECK_MSG(same_params(a.m, b.m), "step %d: parameters differ from eager", s);
        CHECK_MSG(value(r1) == value(r2), "step %d: the generator ended elsewhere after the replay", s);
        /* Same data, parameters moved a little: a loss equal to the last
         * bit would mean the same mask again. */
        CHECK_MSG(vr != prev, "step %d: the replay drew the previous step's mask", s);
        prev = vr;
        kiln_release(lr), kiln_release(le), kiln_release(r1), kiln_release(r2);
    }
    kiln_program_free(p);
    kiln_release(in[0]), kiln_release(in[1]);
    tt_free(&a), tt_free(&b);
    kiln_shutdown();
    return kt_finish();
}

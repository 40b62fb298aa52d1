/* kiln_step_snapshot: a training forward changes BatchNorm's running
 * statistics and advances dropout's generator; after a restore, the same
 * forward gives the same output bit for bit (the same dropout mask) and
 * the same running statistics as the first, as if it had not run before.
 * Without the restore it does not (the check is not vacuous). A retake
 * saves the new state; a buffer moved since the snapshot is refused by
 * name. On the CPU and, where there is one, on cuda:0 (the emulated one in
 * the emulation build). */
#include <stdbool.h>

#include "test_util.h"

enum { B = 5, C = 3, H = 6, W = 6, K = 4 };

/* conv -> BN -> relu -> dropout(0.5) -> flatten -> linear, training mode. */
static kiln_module *make_model(kiln_device dev) {
    kiln_manual_seed(21);
    kiln_module *l[] = {kiln_nn_conv2d(C, K, 3, 1, 1, 1, 1, true), kiln_nn_batch_norm2d(K, 1e-5, 0.1, true, true),
                        kiln_nn_relu(),  kiln_nn_dropout(0.5), kiln_nn_flatten(1, -1),
                        kiln_nn_linear(K * H * W, 7, true)};
    kiln_module *m = kiln_nn_sequential(6, l);
    CHECK_OK(kiln_module_to(m, dev));
    return m;
}

/* Output and running mean (as doubles) of one training forward. */
static void forward(kiln_module *m, kiln_tensor *x, double *out, double *mean) {
    kiln_scope_begin();
    kiln_tensor *y = kiln_module_forward(m, x);
    CHECK_MSG(y != NULL, "forward: %s", kiln_error_message());
    kiln_tensor *h = y ? kiln_to(y, KILN_CPU, KILN_F64, 0) : NULL;
    if (h) CHECK_OK(kiln_to_host(h, out, sizeof(double) * B * 7));
    kiln_tensor *rm = kiln_to(kiln_module_state_get(m, "1.running_mean"), KILN_CPU, KILN_F64, 0);
    CHECK(rm != NULL);
    if (rm) CHECK_OK(kiln_to_host(rm, mean, sizeof(double) * K));
    kiln_scope_end();
}

static bool same(const double *a, const double *b, int n) {
    for (int i = 0; i < n; i++)
        if (a[i] != b[i]) return false;
    return true;
}

static void check_on(kiln_device dev) {
    char name[32];
    kiln_device_str(dev, name, sizeof name);
    kiln_module *m = make_model(dev);
    kiln_scope_begin();
    kiln_manual_seed(5);
    kiln_tensor *x = kiln_to(kiln_randn(KILN_SHAPE(B, C, H, W), KILN_F32, KILN_CPU), dev, KILN_F32, 0);
    double y1[B * 7], m1[K], y2[B * 7], m2[K], y3[B * 7], m3[K], m0[K];
    kiln_tensor *rm0 = kiln_to(kiln_module_state_get(m, "1.running_mean"), KILN_CPU, KILN_F64, 0);
    CHECK_OK(kiln_to_host(rm0, m0, sizeof m0));

    kiln_step_snapshot *s = kiln_step_snapshot_take(m);
    CHECK_MSG(s != NULL, "%s: take: %s", name, kiln_error_message());
    forward(m, x, y1, m1);
    CHECK_MSG(!same(m0, m1, K), "%s: the forward did not move the running mean", name);
    /* Without a restore the second forward differs: new dropout draws, a
     * second running-statistics update. */
    forward(m, x, y3, m3);
    CHECK_MSG(!same(y1, y3, B * 7) && !same(m1, m3, K), "%s: a repeated forward gave the same output", name);
    /* Restored: the first forward again, bit for bit. */
    CHECK_OK(kiln_step_snapshot_restore(s));
    forward(m, x, y2, m2);
    CHECK_MSG(same(y1, y2, B * 7), "%s: the output after the restore differs from the first forward's", name);
    CHECK_MSG(same(m1, m2, K), "%s: the running mean after the restore differs from the first forward's", name);
    /* A retake saves the state after that forward. */
    CHECK_OK(kiln_step_snapshot_retake(s));
    forward(m, x, y3, m3);
    CHECK_OK(kiln_step_snapshot_restore(s));
    double y4[B * 7], m4[K];
    forward(m, x, y4, m4);
    CHECK_MSG(same(y3, y4, B * 7) && same(m3, m4, K), "%s: a restore after a retake is not the retaken state", name);
    /* A model moved since the snapshot: refused by name. */
    if (dev.type != KILN_DEVICE_CPU) {
        CHECK_OK(kiln_module_to(m, KILN_CPU));
        kiln_error_clear();
        CHECK(kiln_step_snapshot_restore(s) == KILN_ERR_STATE);
        CHECK_MSG(strstr(kiln_error_message(), "changed shape or device since the snapshot"), "%s",
                  kiln_error_message());
    }
    kiln_step_snapshot_free(s);
    kiln_scope_end();
    kiln_module_free(m);
}

int main(void) {
    CHECK_OK(kiln_init());
    check_on(KILN_CPU);
    kiln_error_clear();
    CHECK(kiln_step_snapshot_take(NULL) == NULL);
    CHECK_MSG(strstr(kiln_error_message(), "the module is NULL"), "%s", kiln_error_message());
    if (kiln_device_count(KILN_DEVICE_CUDA) < 1) printf("SKIPPED the cuda:0 part: no CUDA device (the CPU part ran)\n");
    else check_on(KILN_CUDA(0));
    kiln_shutdown();
    return kt_finish();
}

/* kiln_module_to and kiln_module_to_dtype keep each parameter's identity,
 * as PyTorch's module.to() does: an optimizer created before the move
 * still trains the model. Checked by training the same model twice, once
 * with the optimizer created before the move and once after: the losses are
 * identical, and they fall. The handles a caller held before the move are
 * the module's parameters afterwards, on the new device and dtype, with
 * their gradient moved too.
 *   - on the CPU: kiln_module_to_dtype(f64);
 *   - on the emulated cuda:0 (or a GPU): kiln_module_to(cuda:0) from the CPU;
 *     skipped visibly without a CUDA device. */
#include <stdbool.h>

#include "test_util.h"

enum { B = 12, IN = 5, HID = 7, OUT = 3, STEPS = 6 };

static kiln_module *make_model(void) {
    kiln_manual_seed(5);
    kiln_module *layers[] = {kiln_nn_linear(IN, HID, true), kiln_nn_relu(), kiln_nn_linear(HID, OUT, true)};
    return kiln_nn_sequential(3, layers);
}

/* STEPS SGD steps of mse(model(x), y) on `dev` in `dt`; the optimizer is
 * created before the move when `early`. Losses into out. */
static void train(bool early, bool by_device, kiln_device dev, kiln_dtype dt, double *out) {
    kiln_scope_begin(); /* owns the tensors made here */
    kiln_module *m = make_model();
    kiln_tensor **params = NULL;
    int np = 0;
    CHECK_OK(kiln_module_parameters(m, &params, &np));
    kiln_tensor *held = kiln_module_state_get(m, "0.weight");
    kiln_sgd_opts so = kiln_sgd_defaults(0.1);
    kiln_optimizer *opt = early ? kiln_sgd(params, np, &so) : NULL;
    /* A gradient present at the move travels with the parameter. */
    kiln_tensor *g0 = kiln_full(kiln_shape_of(held), 0.25, KILN_F32, KILN_CPU);
    CHECK_OK(kiln_set_grad(held, g0));
    CHECK_OK(by_device ? kiln_module_to(m, dev) : kiln_module_to_dtype(m, dt));
    kiln_tensor *after = kiln_module_state_get(m, "0.weight");
    CHECK_MSG(after == held, "the parameter handle changed in the move");
    CHECK(kiln_device_equal(kiln_get_device(held), dev) && kiln_dtype_of(held) == dt);
    kiln_tensor *g = kiln_grad(held);
    double gv = 0;
    CHECK(g && kiln_device_equal(kiln_get_device(g), dev) && kiln_dtype_of(g) == dt);
    if (g) {
        kiln_tensor *g00 = kiln_narrow(kiln_narrow(g, 0, 0, 1), 1, 0, 1);
        CHECK_OK(kiln_item(g00, &gv));
        CHECK(gv == 0.25);
    }
    if (!early) {
        free(params);
        CHECK_OK(kiln_module_parameters(m, &params, &np));
        opt = kiln_sgd(params, np, &so);
    }
    kiln_manual_seed(9);
    kiln_tensor *x = kiln_to(kiln_randn(KILN_SHAPE(B, IN), KILN_F32, KILN_CPU), dev, dt, 0);
    kiln_tensor *y = kiln_to(kiln_randn(KILN_SHAPE(B, OUT), KILN_F32, KILN_CPU), dev, dt, 0);
    for (int s = 0; s < STEPS; s++) {
        kiln_scope_begin();
        CHECK_OK(kiln_optimizer_zero_grad(opt, true));
        kiln_tensor *loss = kiln_mse_loss(kiln_module_forward(m, x), y, KILN_LOSS_MEAN);
        CHECK_OK(kiln_backward(loss, NULL, false));
        CHECK_OK(kiln_optimizer_step(opt));
        CHECK_OK(kiln_item(loss, &out[s]));
        kiln_scope_end();
    }
    kiln_scope_end();
    kiln_optimizer_free(opt);
    free(params);
    kiln_module_free(m);
}

static void check_same(bool by_device, kiln_device dev, kiln_dtype dt, const char *what) {
    double early[STEPS], late[STEPS];
    train(true, by_device, dev, dt, early);
    train(false, by_device, dev, dt, late);
    for (int s = 0; s < STEPS; s++)
        CHECK_MSG(early[s] == late[s], "%s: step %d loss %.9g with the optimizer made before the move, %.9g after",
                  what, s, early[s], late[s]);
    CHECK_MSG(early[STEPS - 1] < 0.9 * early[0], "%s: the loss did not fall (%g -> %g)", what, early[0],
              early[STEPS - 1]);
}

/* Forgetting to move the model: the error names the parameter by its
 * state-dict name and the module, and the hint says kiln_module_to with
 * the input's device; the hint is not repeated inside the message. */
static void test_mismatch_names_parameter(kiln_device dev) {
    kiln_scope_begin();
    kiln_module *m = make_model(); /* on the CPU */
    kiln_tensor *x = kiln_zeros(KILN_SHAPE(B, IN), KILN_F32, dev);
    kiln_error_clear();
    CHECK(kiln_module_forward(m, x) == NULL);
    const kiln_error *e = kiln_error_last();
    CHECK_MSG(strstr(e->message, "parameter '0.weight' of the Sequential is on cpu") != NULL, "message: %s",
              e->message);
    CHECK_MSG(strstr(e->hint, "kiln_module_to(model, cuda:0)") != NULL, "hint: %s", e->hint);
    CHECK_MSG(strstr(e->message, "move them") == NULL, "the hint is repeated in the message: %s", e->message);
    kiln_module_free(m);
    kiln_scope_end();
}

int main(void) {
    CHECK_OK(kiln_init());
    check_same(false, KILN_CPU, KILN_F64, "kiln_module_to_dtype(f64)");
    if (kiln_device_count(KILN_DEVICE_CUDA) < 1) {
        printf("SKIPPED the cuda:0 part: no CUDA device (the CPU part ran)\n");
    } else {
        kiln_device c0 = {KILN_DEVICE_CUDA, 0};
        check_same(true, c0, KILN_F32, "kiln_module_to(cuda:0)");
        test_mismatch_names_parameter(c0);
    }
    kiln_shutdown();
    return kt_finish();
}

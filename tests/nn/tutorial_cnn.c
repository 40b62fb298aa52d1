/* The tutorial CNN (OptimizedCNN of the PyTorch CUDA optimisation guide),
 * adapted to 1x28x28 inputs: three conv(3x3, padding 1) + relu + maxpool(2)
 * stages take 28 -> 14 -> 7 -> 3, so fc1 sees 128 * 3 * 3 features.
 * Included by the tests that need it (not a test itself). */
#include "kiln/kiln.h"

#define TCNN_FLAT (128 * 3 * 3)

/* x = pool(relu(conv_i(x))) three times; view(-1, 1152); relu(fc1); fc2. */
static kiln_tensor *tcnn_forward(kiln_module *m, kiln_tensor *x, void *user) {
    (void)user;
    static const char *const convs[3] = {"conv1", "conv2", "conv3"};
    kiln_module *pool = kiln_module_child(m, "pool"), *relu = kiln_module_child(m, "relu");
    kiln_tensor *h = kiln_retain(x);
    for (int i = 0; i < 3 && h; i++) {
        kiln_tensor *c = kiln_module_forward(kiln_module_child(m, convs[i]), h);
        kiln_release(h);
        kiln_tensor *r = c ? kiln_module_forward(relu, c) : NULL;
        kiln_release(c);
        h = r ? kiln_module_forward(pool, r) : NULL;
        kiln_release(r);
    }
    if (!h) return NULL;
    kiln_tensor *flat = kiln_view(h, KILN_SHAPE(-1, TCNN_FLAT));
    kiln_release(h);
    kiln_tensor *f1 = flat ? kiln_module_forward(kiln_module_child(m, "fc1"), flat) : NULL;
    kiln_release(flat);
    kiln_tensor *r1 = f1 ? kiln_module_forward(relu, f1) : NULL;
    kiln_release(f1);
    kiln_tensor *out = r1 ? kiln_module_forward(kiln_module_child(m, "fc2"), r1) : NULL;
    kiln_release(r1);
    return out;
}

/* Children in the order OptimizedCNN.__init__ creates them, so the state
 * dict's names and order are PyTorch's. NULL on failure. */
static kiln_module *tcnn_new(void) {
    kiln_module *m = kiln_nn_custom("OptimizedCNN", tcnn_forward, NULL);
    if (!m) return NULL;
    kiln_status st = kiln_module_add_child(m, "conv1", kiln_nn_conv2d(1, 32, 3, 1, 1, 1, 1, true));
    if (!st) st = kiln_module_add_child(m, "conv2", kiln_nn_conv2d(32, 64, 3, 1, 1, 1, 1, true));
    if (!st) st = kiln_module_add_child(m, "conv3", kiln_nn_conv2d(64, 128, 3, 1, 1, 1, 1, true));
    if (!st) st = kiln_module_add_child(m, "pool", kiln_nn_max_pool2d(2, 2, 0));
    if (!st) st = kiln_module_add_child(m, "fc1", kiln_nn_linear(TCNN_FLAT, 512, true));
    if (!st) st = kiln_module_add_child(m, "fc2", kiln_nn_linear(512, 10, true));
    if (!st) st = kiln_module_add_child(m, "relu", kiln_nn_relu());
    if (st) {
        kiln_module_free(m);
        return NULL;
    }
    return m;
}

/* Model specs: every shipped model parses with the right parameter count
 * and runs forward to the right output shape; the tutorial spec's
 * parameters have the tutorial CNN's shapes; bad lines, unknown layers,
 * bad arguments, shape mismatches and unbalanced residual blocks give
 * errors with file:line. */
#include "test_util.h"

static kiln_module *load(const char *file, int64_t c, int64_t h, int64_t w) {
    char path[1024];
    snprintf(path, sizeof path, "%s/models/%s", KILN_SOURCE_DIR, file);
    kiln_module *m = NULL;
    CHECK_OK(kiln_model_spec_load(path, c, h, w, &m));
    return m;
}

/* Forward a (2, c, h, w) batch in eval mode; the output must be (2, 10). */
static void check_forward(kiln_module *m, int64_t c, int64_t h, int64_t w) {
    kiln_scope_begin();
    kiln_module_train(m, false);
    kiln_tensor *x = kiln_randn(KILN_SHAPE(2, c, h, w), KILN_F32, KILN_CPU);
    kiln_tensor *y = kiln_module_forward(m, x);
    CHECK_MSG(y != NULL, "%s", kiln_error_message());
    if (y) CHECK(kiln_ndim(y) == 2 && kiln_size(y, 0) == 2 && kiln_size(y, 1) == 10);
    kiln_scope_end();
}

static void test_shipped(void) {
    kiln_module *m = load("tutorial_cnn_28x28x1.txt", 1, 28, 28);
    if (m) {
        CHECK_EQ_I(kiln_module_num_parameters(m), 688138);
        kiln_named_tensor *items = NULL;
        int n = 0;
        CHECK_OK(kiln_module_named_parameters(m, &items, &n));
        CHECK_EQ_I(n, 10);
        if (n == 10) {
            CHECK(strcmp(items[0].name, "0.weight") == 0 && kiln_size(items[0].tensor, 1) == 1);
            CHECK(strcmp(items[6].name, "10.weight") == 0 && kiln_size(items[6].tensor, 1) == 1152);
        }
        free(items);
        check_forward(m, 1, 28, 28);
    }
    kiln_module_free(m);
    m = load("tutorial_cnn_32x32x3.txt", 3, 32, 32);
    if (m) {
        CHECK_EQ_I(kiln_module_num_parameters(m), 1147466);
        check_forward(m, 3, 32, 32);
    }
    kiln_module_free(m);
    m = load("resnet_small_cifar10.txt", 3, 32, 32);
    if (m) {
        CHECK_EQ_I(kiln_module_num_parameters(m), 1227594);
        kiln_tensor *t = kiln_module_state_get(m, "4.shortcut.0.weight");
        CHECK_MSG(t != NULL, "%s", kiln_error_message());
        if (t) CHECK(kiln_size(t, 0) == 128 && kiln_size(t, 1) == 64 && kiln_size(t, 2) == 1);
        kiln_release(t);
        check_forward(m, 3, 32, 32);
    }
    kiln_module_free(m);
}

/* text must fail with every needle in the message; *out stays NULL. */
static void expect_error(const char *text, const char *n1, const char *n2) {
    kiln_module *m = (kiln_module *)1;
    kiln_error_clear();
    kiln_status st = kiln_model_spec_parse(text, "net.txt", 1, 28, 28, &m);
    CHECK_MSG(st == KILN_ERR_INVALID_ARGUMENT, "'%s' -> %s", text, kiln_status_name(st));
    CHECK(m == NULL);
    const char *msg = kiln_error_message();
    CHECK_MSG(strstr(msg, n1) != NULL, "error '%s' lacks '%s'", msg, n1);
    if (n2) CHECK_MSG(strstr(msg, n2) != NULL, "error '%s' lacks '%s'", msg, n2);
}

static void test_errors(void) {
    expect_error("conv 8 k3\nrelu\nsoftmax\n", "net.txt:3: unknown layer in 'softmax'", "expected: one of conv");
    expect_error("conv eight k3\n", "net.txt:1: bad arguments", "expected: conv OUT kK");
    expect_error("conv 8 p1\n", "net.txt:1: missing kernel size", "conv OUT kK");
    expect_error("# c\n\nconv 8 k3 q2\n", "net.txt:3: bad argument", "conv OUT");
    expect_error("dropout 1.5\n", "net.txt:1: bad probability", "0 <= P < 1");
    expect_error("maxpool\n", "net.txt:1:", "maxpool K");
    expect_error("relu 3\n", "net.txt:1: unexpected arguments", NULL);
    /* A linear on an image: both lines and the shape. */
    expect_error("conv 8 k3 p1\nmaxpool 2\nlinear 10\n", "net.txt:3: 'linear 10' needs flat features",
                 "line 2 'maxpool 2' gives (8, 14, 14)");
    expect_error("flatten\nconv 8 k3\n", "net.txt:2: 'conv 8 k3' needs an image input",
                 "line 1 'flatten' gives (784 features)");
    expect_error("linear 10\n", "net.txt:1: 'linear 10' needs flat features", "the model input is (1, 28, 28)");
    expect_error("conv 8 k29\n", "net.txt:1: 'conv 8 k29' needs an image of at least 29x29", NULL);
    expect_error("residual {\nconv 8 k3 p1\n", "net.txt:1: 'residual {' is never closed", NULL);
    expect_error("relu\n}\n", "net.txt:2: '}' without an open 'residual {'", NULL);
    expect_error("residual {\nconv 8 k3\n}\n", "net.txt:3:", "no 1x1 strided shortcut fits");
    expect_error("residual {\nflatten\n}\n", "net.txt:3:", "must end in an image shape");
    expect_error("# only a comment\n", "no layers", NULL);
    kiln_module *m = NULL;
    CHECK_FAILS(kiln_model_spec_parse_n("relu\nre\0lu\n", 10, "nul.txt", 1, 28, 28, &m), KILN_ERR_INVALID_ARGUMENT,
                "nul.txt:2: a NUL byte");
    CHECK_FAILS(kiln_model_spec_load("/nonexistent/net.txt", 1, 28, 28, &(kiln_module *){NULL}), KILN_ERR_IO,
                "/nonexistent/net.txt");
}

static void test_residual_shortcuts(void) {
    kiln_module *m = NULL;
    CHECK_OK(kiln_model_spec_parse("conv 8 k3 p1\nresidual {\n  conv 8 k3 p1\n  relu  # inner\n}\n"
                                   "residual {\n conv 16 k3 p1 s2\n}\nadaptiveavgpool 1\nflatten\nlinear 10\n",
                                   "r.txt", 1, 28, 28, &m));
    if (!m) return;
    kiln_tensor *t = kiln_module_state_get(m, "1.shortcut.0.weight");
    CHECK(t == NULL); /* identity shortcut */
    kiln_error_clear();
    t = kiln_module_state_get(m, "2.shortcut.1.running_mean");
    CHECK_MSG(t != NULL, "%s", kiln_error_message());
    kiln_release(t);
    check_forward(m, 1, 28, 28);
    kiln_module_free(m);
}

int main(void) {
    if (kiln_init() != KILN_OK) return 1;
    test_shipped();
    test_errors();
    test_residual_shortcuts();
    kiln_shutdown();
    return kt_finish();
}

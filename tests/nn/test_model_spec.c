/* Model specs: every shipped model parses with the right parameter count
 * and runs forward to the right output shape; the tutorial spec's
 * parameters have the tutorial CNN's shapes; bad lines, unknown layers,
 * bad arguments, shape mismatches and unbalanced residual blocks give
 * errors with file:line; a parameter budget refuses the layer that
 * crosses it, counted exactly as kiln_module_num_parameters counts. */
#include <unistd.h>

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

/* The whole text of models/<file>, malloc'd; NULL on failure (checked). */
static char *read_model(const char *file, size_t *size) {
    char path[1024];
    snprintf(path, sizeof path, "%s/models/%s", KILN_SOURCE_DIR, file);
    FILE *f = fopen(path, "rb");
    CHECK_MSG(f != NULL, "cannot open %s", path);
    if (!f) return NULL;
    char *text = malloc(1 << 20);
    *size = text ? fread(text, 1, 1 << 20, f) : 0;
    fclose(f);
    return text;
}

/* With max_parameters equal to the model's count the spec parses; one less
 * and the line that crosses it is refused; a layer of 2^40 parameters is
 * refused before anything of it is allocated (allocating would fail with
 * KILN_ERR_OUT_OF_MEMORY, not this message). */
static void test_parameter_limit(void) {
    static const struct {
        const char *file;
        int64_t c, hw, params, largest; /* largest: the widest layer output, values per sample */
        const char *last_line;          /* the line whose layer crosses params - 1 */
    } models[] = {{"tutorial_cnn_28x28x1.txt", 1, 28, 688138, 32 * 28 * 28, "linear 10"},
                  {"tutorial_cnn_32x32x3.txt", 3, 32, 1147466, 32 * 32 * 32, "linear 10"},
                  {"resnet_small_cifar10.txt", 3, 32, 1227594, 64 * 32 * 32, "linear 10"}};
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        size_t size = 0;
        char *text = read_model(models[i].file, &size);
        if (!text) continue;
        kiln_module *m = NULL;
        kiln_model_spec_budget b = {.max_parameters = models[i].params};
        CHECK_OK(kiln_model_spec_parse_limited(text, size, models[i].file, models[i].c, models[i].hw, models[i].hw, &b,
                                               &m));
        CHECK_EQ_I(b.parameters, models[i].params);
        CHECK_EQ_I(b.largest_activation, models[i].largest);
        if (m) CHECK_EQ_I(kiln_module_num_parameters(m), models[i].params);
        kiln_module_free(m);
        m = (kiln_module *)1;
        kiln_error_clear();
        b = (kiln_model_spec_budget){.max_parameters = models[i].params - 1};
        kiln_status st =
            kiln_model_spec_parse_limited(text, size, models[i].file, models[i].c, models[i].hw, models[i].hw, &b, &m);
        CHECK(st == KILN_ERR_INVALID_ARGUMENT && m == NULL);
        char want[128];
        snprintf(want, sizeof want, "taking the model to %lld, above the limit of %lld", (long long)models[i].params,
                 (long long)models[i].params - 1);
        CHECK_MSG(strstr(kiln_error_message(), want) != NULL, "%s: '%s' lacks '%s'", models[i].file,
                  kiln_error_message(), want);
        CHECK_MSG(strstr(kiln_error_message(), models[i].last_line) != NULL, "'%s' does not name '%s'",
                  kiln_error_message(), models[i].last_line);
        free(text);
    }
    static const char huge[] = "conv 8 k3 p1\nflatten\nlinear 1073741824\n";
    kiln_module *m = NULL;
    kiln_model_spec_budget b = {.max_parameters = 1 << 20};
    CHECK_FAILS(kiln_model_spec_parse_limited(huge, sizeof huge - 1, "huge.txt", 1, 28, 28, &b, &m),
                KILN_ERR_INVALID_ARGUMENT,
                "huge.txt:3: 'linear 1073741824' adds 6735582461952 parameters, taking the model to 6735582462032");
    CHECK(m == NULL);
    CHECK_EQ_I(b.parameters, 6735582462032); /* the counts up to and including the refused line */
    /* One sample's output: 'conv 8 k3 p1' gives 8*28*28 values. */
    b = (kiln_model_spec_budget){.max_activation = 8 * 28 * 28 - 1};
    CHECK_FAILS(kiln_model_spec_parse_limited(huge, sizeof huge - 1, "huge.txt", 1, 28, 28, &b, &m),
                KILN_ERR_INVALID_ARGUMENT,
                "huge.txt:1: 'conv 8 k3 p1' gives (8, 28, 28), 6272 values per sample, above the limit of 6271");
    CHECK(m == NULL);
    /* A residual block's 1x1 shortcut and its BatchNorm count too: 8*16 + 2*16. */
    static const char res[] = "residual {\nconv 16 k1 nobias\n}\n";
    b = (kiln_model_spec_budget){.max_parameters = 128 + 159};
    CHECK_FAILS(kiln_model_spec_parse_limited(res, sizeof res - 1, "res.txt", 8, 4, 4, &b, &m),
                KILN_ERR_INVALID_ARGUMENT, "res.txt:3: '}' adds 160 parameters, taking the model to 288");
    b.max_parameters = 288;
    CHECK_OK(kiln_model_spec_parse_limited(res, sizeof res - 1, "res.txt", 8, 4, 4, &b, &m));
    if (m) CHECK_EQ_I(kiln_module_num_parameters(m), 288);
    kiln_module_free(m);
    m = NULL;
    b = (kiln_model_spec_budget){.max_activation = -1};
    CHECK_FAILS(kiln_model_spec_parse_limited(res, sizeof res - 1, "res.txt", 8, 4, 4, &b, &m),
                KILN_ERR_INVALID_ARGUMENT, "max_activation (-1) is negative");
    /* An input shape from a damaged checkpoint: refused, not overflowed in
     * the window arithmetic (UBSan saw h + 2 * pad - k overflow here). */
    const char conv[] = "conv 4 k3 p1\n";
    CHECK_FAILS(kiln_model_spec_parse_limited(conv, sizeof conv - 1, "conv.txt", 1, INT64_MAX, 28, NULL, &m),
                KILN_ERR_INVALID_ARGUMENT, "each size must be 1..1073741824");
    CHECK_FAILS(kiln_model_spec_parse_limited(conv, sizeof conv - 1, "conv.txt", 1, 28, (1LL << 30) + 1, NULL, &m),
                KILN_ERR_INVALID_ARGUMENT, "conv.txt: input shape (1, 28, 1073741825)");
    CHECK_OK(kiln_model_spec_parse_limited(conv, sizeof conv - 1, "conv.txt", 1, 28, 28, NULL, &m));
    kiln_module_free(m);
    m = NULL;
    /* A NUL byte is an error at its line and column, not the spec's end. */
    const char nul[] = "conv 4 k3 p1\nrelu\0linear 10\n";
    CHECK_FAILS(kiln_model_spec_parse_limited(nul, sizeof nul - 1, "nul.txt", 1, 28, 28, NULL, &m),
                KILN_ERR_INVALID_ARGUMENT, "nul.txt:2: a NUL byte at column 5");
}

/* kiln_model_spec_load looks at what the path is before reading it. */
static void test_load_files(void) {
    kiln_module *m = NULL;
    CHECK_FAILS(kiln_model_spec_load("/tmp", 1, 28, 28, &m), KILN_ERR_IO, "model spec /tmp is a directory");
    CHECK_FAILS(kiln_model_spec_load("/dev/zero", 1, 28, 28, &m), KILN_ERR_IO, "not a regular file");
    char path[] = "/tmp/kiln_spec_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    /* 1.5 MiB of comments: over the 1 MiB limit the message states. */
    static char big[3 << 19];
    memset(big, '#', sizeof big);
    CHECK(write(fd, big, sizeof big) == (ssize_t)sizeof big);
    close(fd);
    CHECK_FAILS(kiln_model_spec_load(path, 1, 28, 28, &m), KILN_ERR_IO, "is 1572864 bytes, more than the 1 MiB");
    unlink(path);
    CHECK(m == NULL);
}

int main(void) {
    if (kiln_init() != KILN_OK) return 1;
    test_shipped();
    test_errors();
    test_residual_shortcuts();
    test_parameter_limit();
    test_load_files();
    kiln_shutdown();
    return kt_finish();
}

/* Model-spec limits (issue 20): the layer count bound
 * (KILN_MODEL_SPEC_MAX_LAYERS) at its edge, in checking and building
 * alike; kiln_model_spec_check agreeing with kiln_model_spec_parse_limited
 * on every outcome, message and count while allocating nothing from the
 * device allocator; the parameter and activation messages giving the size
 * in bytes; and shape arithmetic at the largest sizes a spec or an input
 * may give (UBSan saw window_out overflow on a stored input shape of
 * 9223372036854775807). */
#include <unistd.h>

#include "nn/nn_test_util.c"

/* n lines: a conv, then "relu" lines, then `tail` (may be ""). */
static char *relu_spec(int n, const char *tail, size_t *size) {
    size_t cap = (size_t)n * 5 + strlen(tail) + 32;
    char *t = malloc(cap);
    if (!t) return NULL;
    size_t len = (size_t)snprintf(t, cap, "conv 2 k3 p1\n");
    for (int i = 1; i < n; i++) len += (size_t)snprintf(t + len, cap - len, "relu\n");
    len += (size_t)snprintf(t + len, cap - len, "%s", tail);
    *size = len;
    return t;
}

static void test_layer_bound(void) {
    size_t size = 0;
    char *at = relu_spec(KILN_MODEL_SPEC_MAX_LAYERS, "", &size);
    CHECK(at != NULL);
    if (!at) return;
    CHECK_OK(kiln_model_spec_check(at, size, "max.txt", 1, 4, 4, NULL));
    free(at);
    /* One past: line 65537 is named, with the limit. */
    char *past = relu_spec(KILN_MODEL_SPEC_MAX_LAYERS + 1, "", &size);
    CHECK(past != NULL);
    if (!past) return;
    char want[128];
    snprintf(want, sizeof want, "max.txt:%d: 'relu' is layer %d, past the %d layers a model spec may hold",
             KILN_MODEL_SPEC_MAX_LAYERS + 1, KILN_MODEL_SPEC_MAX_LAYERS + 1, KILN_MODEL_SPEC_MAX_LAYERS);
    CHECK_FAILS(kiln_model_spec_check(past, size, "max.txt", 1, 4, 4, NULL), KILN_ERR_INVALID_ARGUMENT, want);
    kiln_module *m = (kiln_module *)1;
    CHECK_FAILS(kiln_model_spec_parse_limited(past, size, "max.txt", 1, 4, 4, NULL, &m), KILN_ERR_INVALID_ARGUMENT,
                want);
    CHECK(m == NULL);
    free(past);
    /* A residual block and each layer of its body count one each: the
     * block's '}' is the layer past the bound here. */
    char *res = relu_spec(KILN_MODEL_SPEC_MAX_LAYERS - 2, "residual {\nconv 2 k3 p1\nrelu\n}\n", &size);
    CHECK(res != NULL);
    if (!res) return;
    snprintf(want, sizeof want, ":%d: '}' is layer %d", KILN_MODEL_SPEC_MAX_LAYERS + 2,
             KILN_MODEL_SPEC_MAX_LAYERS + 1);
    CHECK_FAILS(kiln_model_spec_check(res, size, "res.txt", 1, 4, 4, NULL), KILN_ERR_INVALID_ARGUMENT, want);
    free(res);
}

/* Check and build agree: status, message and counts, for good specs,
 * each kind of error and each limit. */
static void test_check_agrees_with_build(void) {
    static const struct {
        const char *text;
        int64_t max_parameters, max_activation;
    } specs[] = {
        {"conv 8 k3 p1\nbatchnorm\nrelu\nmaxpool 2\nflatten\nlinear 10\n", 0, 0},
        {"conv 8 k3 p1\nresidual {\n conv 16 k3 p1 s2\n relu\n}\nadaptiveavgpool 1\nflatten\ndropout 0.5\nlinear 3\n",
         0, 0},
        {"conv 8 k3 p1\nresidual {\n conv 16 k3 p1 s2\n}\n", 1500, 0},  /* 296 + 1168, the shortcut's 160 pass */
        {"conv 8 k3 p1\nflatten\nlinear 1000000\n", 1 << 20, 0},        /* linear passes the limit */
        {"conv 8 k3 p1\nflatten\nlinear 4\n", 0, 100},                  /* conv's output passes the limit */
        {"conv 8 k3 p1\nlinear 4\n", 0, 0},                             /* needs flatten */
        {"residual {\nrelu\n", 0, 0},                                   /* never closed */
        {"residual {\n}\n", 0, 0},                                      /* empty */
        {"}\n", 0, 0},                                                  /* no open block */
        {"conv 4 k9\n", 0, 0},                                          /* image too small */
        {"residual {\nconv 3 k3 s2\n}\n", 0, 0},                         /* no shortcut fits (8 to 3) */
        {"residual {\nflatten\n}\n", 0, 0},                             /* ends flat */
        {"# nothing\n\n", 0, 0},                                        /* no layers */
        {"gelu gelu\n", 0, 0},                                          /* arguments */
        {"dropout 1.5\n", 0, 0},                                        /* probability */
        {"maxpool 1 s2 p1\n", 0, 0},                                    /* padding past half the kernel (fuzzed) */
        {"avgpool 3 p2\n", 0, 0},
        {"conv 1073741824 k1\n", 0, 0},                                 /* huge, unbounded: counted, not built */
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        const char *t = specs[i].text;
        kiln_model_spec_budget bc = {.max_parameters = specs[i].max_parameters,
                                     .max_activation = specs[i].max_activation},
                               bb = bc;
        kiln_error_clear();
        kiln_status sc = kiln_model_spec_check(t, strlen(t), "s.txt", 4, 8, 8, &bc);
        char msg[512];
        snprintf(msg, sizeof msg, "%s", kiln_error_message());
        CHECK_MSG(sc == KILN_OK || strstr(msg, "s.txt:"), "spec %zu: '%s' names no file", i, msg);
        kiln_module *m = NULL;
        kiln_error_clear();
        /* The last spec would build 2^30 channels' parameters: check only. */
        if (i + 1 == sizeof specs / sizeof specs[0]) {
            CHECK_MSG(sc == KILN_OK && bc.parameters == (INT64_C(1) << 32) + (INT64_C(1) << 30),
                      "unbounded huge conv: %s, %lld parameters", kiln_status_name(sc), (long long)bc.parameters);
            continue;
        }
        kiln_status sb = kiln_model_spec_parse_limited(t, strlen(t), "s.txt", 4, 8, 8, &bb, &m);
        CHECK_MSG(sc == sb, "spec %zu: check %s, build %s", i, kiln_status_name(sc), kiln_status_name(sb));
        CHECK_MSG(strcmp(msg, kiln_error_message()) == 0, "spec %zu: check '%s', build '%s'", i, msg,
                  kiln_error_message());
        CHECK_MSG(bc.parameters == bb.parameters && bc.largest_activation == bb.largest_activation,
                  "spec %zu: check counts %lld/%lld, build %lld/%lld", i, (long long)bc.parameters,
                  (long long)bc.largest_activation, (long long)bb.parameters, (long long)bb.largest_activation);
        if (m) CHECK_EQ_I(kiln_module_num_parameters(m), bb.parameters);
        kiln_module_free(m);
    }
}

/* Checking allocates no tensor: the CPU allocator sees no new block. */
static void test_check_allocates_nothing(void) {
    static const char spec[] = "conv 64 k3 p1\nbatchnorm\nrelu\nflatten\nlinear 1000\n";
    kiln_memory_stats before, after;
    CHECK_OK(kiln_memory_stats_get(KILN_CPU, &before));
    kiln_model_spec_budget b = {0};
    CHECK_OK(kiln_model_spec_check(spec, sizeof spec - 1, "c.txt", 3, 32, 32, &b));
    CHECK_EQ_I(b.parameters, 64 * 3 * 9 + 64 + 128 + 64 * 32 * 32 * 1000 + 1000);
    CHECK_OK(kiln_memory_stats_get(KILN_CPU, &after));
    CHECK_EQ_I(after.allocation[KILN_POOL_ALL].allocated, before.allocation[KILN_POOL_ALL].allocated);
    /* Building the same spec does allocate: the statistic can tell. */
    kiln_module *m = NULL;
    CHECK_OK(kiln_model_spec_parse_limited(spec, sizeof spec - 1, "c.txt", 3, 32, 32, NULL, &m));
    CHECK_OK(kiln_memory_stats_get(KILN_CPU, &after));
    CHECK(after.allocation[KILN_POOL_ALL].allocated > before.allocation[KILN_POOL_ALL].allocated);
    kiln_module_free(m);
    CHECK_FAILS(kiln_model_spec_parse_limited(spec, sizeof spec - 1, "c.txt", 3, 32, 32, NULL, NULL),
                KILN_ERR_INVALID_ARGUMENT, "out is NULL");
}

/* The messages give the size in bytes too. */
static void test_messages(void) {
    static const char wide[] = "flatten\nlinear 5120000\n";
    kiln_model_spec_budget b = {.max_parameters = KILN_MODEL_SPEC_DEFAULT_MAX_PARAMETERS};
    CHECK_FAILS(kiln_model_spec_check(wide, sizeof wide - 1, "w.txt", 1, 28, 28, &b), KILN_ERR_INVALID_ARGUMENT,
                "w.txt:2: 'linear 5120000' adds 4019200000 parameters, taking the model to 4019200000, above the "
                "limit of 268435456 (14.97 GiB of f32 weights against 1.00 GiB)");
    b = (kiln_model_spec_budget){.max_parameters = 100};
    CHECK_FAILS(kiln_model_spec_check(wide, sizeof wide - 1, "w.txt", 1, 2, 3, &b), KILN_ERR_INVALID_ARGUMENT,
                "above the limit of 100 (136.72 MiB of f32 weights against 400 bytes)");
    b = (kiln_model_spec_budget){.max_activation = KILN_MODEL_SPEC_DEFAULT_MAX_ACTIVATION};
    static const char big[] = "conv 4096 k1\n";
    CHECK_FAILS(kiln_model_spec_check(big, sizeof big - 1, "b.txt", 1, 256, 256, &b), KILN_ERR_INVALID_ARGUMENT,
                "b.txt:1: 'conv 4096 k1' gives (4096, 256, 256), 268435456 values per sample, above the limit of "
                "67108864 (1.00 GiB of f32 per sample against 256.00 MiB)");
}

/* The largest numbers the grammar and the input allow: shapes grow or
 * saturate, never overflow (run under UBSan in the asan tier). */
static void test_extreme_shapes(void) {
    const int64_t big = INT64_C(1) << 30;
    /* An input shape from a damaged checkpoint is refused before any
     * arithmetic: the 9223372036854775807 (without the bound,
     * h + 2 * pad overflows here: UBSan's report in the issue). */
    kiln_model_spec_budget b = {0};
    CHECK_FAILS(kiln_model_spec_check("conv 4 k3 p1\n", 13, "ck.txt", 1, INT64_MAX, INT64_MAX, &b),
                KILN_ERR_INVALID_ARGUMENT, "input shape (1, 9223372036854775807, 9223372036854775807)");
    CHECK_FAILS(kiln_model_spec_check("conv 4 k3\n", 10, "ck.txt", INT64_MIN, 4, 4, &b), KILN_ERR_INVALID_ARGUMENT,
                "each size must be 1..1073741824");
    /* Padding 2^30 on a 2^30 image, 64 times: the height grows by 2^31
     * each line, to about 2^37, and the flattened size saturates. */
    size_t cap = 64 * 32 + 64, len = 0;
    char *t = malloc(cap);
    CHECK(t != NULL);
    if (!t) return;
    for (int i = 0; i < 64; i++) len += (size_t)snprintf(t + len, cap - len, "conv 1073741824 k1 p1073741824\n");
    len += (size_t)snprintf(t + len, cap - len, "flatten\nlinear 1073741824\n");
    b = (kiln_model_spec_budget){0};
    CHECK_OK(kiln_model_spec_check(t, len, "grow.txt", big, big, big, &b));
    CHECK_EQ_I(b.parameters, INT64_MAX);
    CHECK_EQ_I(b.largest_activation, INT64_MAX);
    /* Windows and strides at their extremes. */
    static const char win[] = "maxpool 1073741824 s1073741824 p536870912\navgpool 1 s1073741824\n"
                              "conv 1 k1073741824 p1073741824 s1\n";
    b = (kiln_model_spec_budget){0};
    CHECK_OK(kiln_model_spec_check(win, sizeof win - 1, "win.txt", 1, big, big, &b));
    free(t);
}

int main(void) {
    if (kiln_init() != KILN_OK) return 1;
    test_layer_bound();
    test_check_agrees_with_build();
    test_check_allocates_nothing();
    test_messages();
    test_extreme_shapes();
    kiln_shutdown();
    return kt_finish();
}

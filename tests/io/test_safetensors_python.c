/* A Kiln training checkpoint read by the reference safetensors reader:
 * the Python package `safetensors` (installed by scripts/setup.sh) opens
 * the file and tests/io/check_safetensors.py compares every tensor's name,
 * dtype, shape and bytes with what Kiln holds in memory (dumped here as
 * JSON): the state dict, the Adam moments and the step counts. Skipped
 * as a failure when python3 or the package is missing: setup installs them. */
#include <unistd.h>

#include "test_util.h"

static const char spec[] = "conv 4 k3 p1\nbatchnorm\nrelu\nmaxpool 2\nflatten\nlinear 5\n";

static const char *st_dtype(kiln_dtype dt) {
    switch (dt) {
    case KILN_F32: return "F32";
    case KILN_I64: return "I64";
    case KILN_F64: return "F64";
    case KILN_F16: return "F16";
    case KILN_BF16: return "BF16";
    case KILN_I32: return "I32";
    case KILN_U8: return "U8";
    case KILN_BOOL: return "BOOL";
    default: return "?";
    }
}

static bool first = true;

static void dump(FILE *f, const char *name, kiln_tensor *t) {
    kiln_shape s = kiln_shape_of(t);
    size_t bytes = (size_t)kiln_numel(t) * kiln_dtype_size(kiln_dtype_of(t));
    unsigned char *buf = malloc(bytes + 1);
    CHECK_OK(kiln_to_host(t, buf, bytes));
    fprintf(f, "%s{\"name\":\"%s\",\"dtype\":\"%s\",\"shape\":[", first ? "" : ",\n", name,
            st_dtype(kiln_dtype_of(t)));
    for (int d = 0; d < s.ndim; d++) fprintf(f, "%s%lld", d ? "," : "", (long long)s.d[d]);
    fprintf(f, "],\"hex\":\"");
    for (size_t i = 0; i < bytes; i++) fprintf(f, "%02x", buf[i]);
    fprintf(f, "\"}");
    free(buf);
    first = false;
}

int main(void) {
    if (system("python3 -c 'import safetensors' > /dev/null 2>&1") != 0)
        kt_missing("the Python package safetensors is not importable (scripts/setup.sh installs it with pip)");
    if (kiln_init()) return 1;
    char dir[] = "/tmp/kiln_stpy_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char path[256], json[256];
    snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
    snprintf(json, sizeof json, "%s/expected.json", dir);

    kiln_manual_seed(3);
    kiln_module *m = NULL;
    CHECK_OK(kiln_model_spec_parse(spec, "py.txt", 1, 6, 6, &m));
    kiln_tensor **params = NULL;
    int np = 0;
    CHECK_OK(kiln_module_parameters(m, &params, &np));
    kiln_optimizer *opt = kiln_adam(params, np, NULL);
    free(params);
    /* One training step, so the moments and the BatchNorm statistics are
     * not their initial values. */
    kiln_scope_begin();
    kiln_tensor *x = kiln_randn(KILN_SHAPE(4, 1, 6, 6), KILN_F32, KILN_CPU);
    int64_t ys[4] = {0, 3, 1, 4};
    kiln_tensor *y = kiln_from_data(KILN_SHAPE(4), KILN_I64, KILN_CPU, ys);
    CHECK_OK(kiln_accumulate_backward(m, x, y, 2, NULL, NULL, NULL));
    CHECK_OK(kiln_optimizer_step(opt));
    kiln_scope_end();
    kiln_train_state st = {.epoch = 1, .step = 1, .data_seed = 9, .model_spec = (char *)spec};
    CHECK_OK(kiln_checkpoint_save(path, m, opt, &st));

    FILE *f = fopen(json, "w");
    CHECK(f != NULL);
    if (!f) return kt_finish();
    fprintf(f, "{\"tensors\":[\n");
    kiln_named_tensor *sd = NULL, *named = NULL;
    int n = 0, nn = 0;
    CHECK_OK(kiln_module_state_dict(m, &sd, &n));
    for (int i = 0; i < n; i++) dump(f, sd[i].name, sd[i].tensor);
    CHECK_OK(kiln_module_named_parameters(m, &named, &nn));
    int64_t steps[64];
    for (int i = 0; i < nn && i < 64; i++) {
        static const char *const slots[] = {"exp_avg", "exp_avg_sq"};
        for (int k = 0; k < 2; k++) {
            kiln_tensor *s = kiln_optimizer_state(opt, i, slots[k]);
            CHECK(s != NULL);
            char name[256];
            snprintf(name, sizeof name, "optimizer.%s.%s", named[i].name, slots[k]);
            if (s) dump(f, name, s);
            kiln_release(s);
        }
        steps[i] = 1;
    }
    kiln_tensor *steps_t = kiln_from_data(KILN_SHAPE(nn), KILN_I64, KILN_CPU, steps);
    dump(f, "optimizer.steps", steps_t);
    kiln_release(steps_t);
    fprintf(f, "],\n\"metadata\":{\"format\":\"pt\",\"kiln.checkpoint\":\"%d\",\"kiln.epoch\":\"1\","
               "\"kiln.step\":\"1\",\"kiln.data_seed\":\"9\",\"kiln.optimizer\":\"adam\","
               "\"kiln.optimizer.step_count\":\"1\",\"kiln.model_spec\":\"", KILN_CHECKPOINT_FORMAT);
    for (const char *c = spec; *c; c++) {
        if (*c == '\n') fputs("\\n", f);
        else fputc(*c, f);
    }
    fprintf(f, "\"}}\n");
    fclose(f);
    free(sd);
    free(named);

    char cmd[1024];
    snprintf(cmd, sizeof cmd, "python3 '%s/tests/io/check_safetensors.py' '%s' '%s'", KILN_SOURCE_DIR, path, json);
    int rc = system(cmd);
    CHECK_MSG(rc == 0, "the reference reader disagrees with Kiln (%s)", cmd);

    kiln_optimizer_free(opt);
    kiln_module_free(m);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    kiln_shutdown();
    return kt_finish();
}

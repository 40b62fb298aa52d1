/* Training checkpoints: a save/load round trip restores the weights, every
 * Adam moment and step count, the lr, the training position and the
 * device generator, so the next step after loading is bit-identical to
 * the next step of the run that saved; another model's checkpoint is an
 * error listing the mismatched names; a shape mismatch names both shapes;
 * a weights-only file is refused as a training checkpoint; saving leaves
 * no temporary file and a failed save leaves nothing. */
#include <dirent.h>
#include <unistd.h>

#include "test_util.h"

static const char spec[] = "conv 4 k3 p1\nbatchnorm\nrelu\nflatten\ndropout 0.25\nlinear 3\n";

typedef struct run {
    kiln_module *m;
    kiln_optimizer *opt;
} run;

static run make(const char *text, uint64_t seed) {
    run r = {0};
    kiln_manual_seed(seed);
    CHECK_OK(kiln_model_spec_parse(text, "t.txt", 1, 4, 4, &r.m));
    kiln_tensor **params = NULL;
    int n = 0;
    CHECK_OK(kiln_module_parameters(r.m, &params, &n));
    kiln_adam_opts o = kiln_adam_defaults();
    o.lr = 0.01;
    r.opt = kiln_adam(params, n, &o);
    CHECK(r.opt != NULL);
    free(params);
    return r;
}

static void drop(run *r) {
    kiln_optimizer_free(r->opt);
    kiln_module_free(r->m);
}

/* One Adam step on a fixed batch (dropout draws from the generator). */
static void step(run *r, int k) {
    kiln_scope_begin();
    float xs[6 * 16];
    int64_t ys[6];
    for (int i = 0; i < 6 * 16; i++) xs[i] = (float)((i * 37 + k * 11) % 17) / 17.0f - 0.5f;
    for (int i = 0; i < 6; i++) ys[i] = (i + k) % 3;
    kiln_tensor *x = kiln_from_data(KILN_SHAPE(6, 1, 4, 4), KILN_F32, KILN_CPU, xs);
    kiln_tensor *y = kiln_from_data(KILN_SHAPE(6), KILN_I64, KILN_CPU, ys);
    CHECK_OK(kiln_optimizer_zero_grad(r->opt, true));
    CHECK_OK(kiln_accumulate_backward(r->m, x, y, 1, NULL, NULL, NULL));
    CHECK_OK(kiln_optimizer_step(r->opt));
    kiln_scope_end();
}

static bool same_bits(kiln_tensor *a, kiln_tensor *b) {
    if (!a || !b) return a == b;
    size_t n = (size_t)kiln_numel(a) * kiln_dtype_size(kiln_dtype_of(a));
    if (n != (size_t)kiln_numel(b) * kiln_dtype_size(kiln_dtype_of(b))) return false;
    char *p = malloc(n + 1), *q = malloc(n + 1);
    bool same = kiln_to_host(a, p, n) == KILN_OK && kiln_to_host(b, q, n) == KILN_OK && memcmp(p, q, n) == 0;
    free(p);
    free(q);
    return same;
}

static bool same_run(run *a, run *b) {
    kiln_named_tensor *x = NULL, *y = NULL;
    int nx = 0, ny = 0;
    bool same = kiln_module_state_dict(a->m, &x, &nx) == KILN_OK && kiln_module_state_dict(b->m, &y, &ny) == KILN_OK &&
                nx == ny;
    for (int i = 0; same && i < nx; i++) same = !strcmp(x[i].name, y[i].name) && same_bits(x[i].tensor, y[i].tensor);
    free(x);
    free(y);
    static const char *const slots[] = {"exp_avg", "exp_avg_sq"};
    kiln_tensor **pa = NULL;
    int np = 0;
    if (kiln_module_parameters(a->m, &pa, &np) != KILN_OK) return false;
    free(pa);
    for (int i = 0; same && i < np; i++)
        for (int k = 0; same && k < 2; k++) {
            kiln_tensor *s = kiln_optimizer_state(a->opt, i, slots[k]), *t = kiln_optimizer_state(b->opt, i, slots[k]);
            same = same_bits(s, t);
            kiln_release(s);
            kiln_release(t);
        }
    return same && kiln_optimizer_step_count(a->opt) == kiln_optimizer_step_count(b->opt) &&
           kiln_optimizer_get_lr(a->opt) == kiln_optimizer_get_lr(b->opt);
}

static int count_tmp(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strstr(e->d_name, ".tmp") != NULL;
    if (d) closedir(d);
    return n;
}

static void test_round_trip(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
    run a = make(spec, 1), b = make(spec, 2);
    step(&a, 0);
    step(&a, 1);
    CHECK_OK(kiln_optimizer_set_lr(a.opt, 0.005));
    kiln_train_state s = {.epoch = 3, .step = 2, .batch_in_epoch = 1, .epochs_done = 3, .data_seed = 42,
                          .input_c = 1, .input_h = 4, .input_w = 4, .model_spec = (char *)spec};
    CHECK_OK(kiln_checkpoint_save(path, a.m, a.opt, &s));
    CHECK_EQ_I(count_tmp(dir), 0);
    /* The generator after the save: the next draws of the saving run. */
    kiln_tensor *ra = kiln_rand(KILN_SHAPE(8), KILN_F32, KILN_CPU);

    CHECK(!same_run(&a, &b));
    kiln_train_state t;
    memset(&t, 0xab, sizeof t);
    CHECK_OK(kiln_checkpoint_load(path, b.m, b.opt, &t));
    kiln_tensor *rb = kiln_rand(KILN_SHAPE(8), KILN_F32, KILN_CPU);
    CHECK_MSG(same_bits(ra, rb), "the generator was not restored");
    kiln_release(ra);
    kiln_release(rb);
    CHECK(same_run(&a, &b));
    CHECK_EQ_I(t.epoch, 3);
    CHECK_EQ_I(t.step, 2);
    CHECK_EQ_I(t.batch_in_epoch, 1);
    CHECK_EQ_I(t.epochs_done, 3);
    CHECK_EQ_I(t.data_seed, 42);
    CHECK_EQ_I(t.input_c * 100 + t.input_h * 10 + t.input_w, 144);
    CHECK(t.model_spec && !strcmp(t.model_spec, spec));
    CHECK(!strcmp(t.cpu_kernels, "fast") || !strcmp(t.cpu_kernels, "reference"));
    CHECK(t.deterministic == kiln_deterministic());
    free(t.model_spec);

    /* The next step (dropout included) is the same in both runs: the
     * per-parameter step counts and the generator came back too. Both
     * runs draw from the one process generator, so restore it before each. */
    kiln_train_state u;
    CHECK_OK(kiln_checkpoint_load(path, a.m, a.opt, &u));
    free(u.model_spec);
    step(&a, 2);
    CHECK_OK(kiln_checkpoint_load(path, b.m, b.opt, &u));
    free(u.model_spec);
    step(&b, 2);
    CHECK(same_run(&a, &b));

    char *value = NULL;
    CHECK_OK(kiln_checkpoint_read_meta(path, "kiln.model_spec", &value));
    CHECK(value && !strcmp(value, spec));
    free(value);
    CHECK_OK(kiln_checkpoint_read_meta(path, "kiln.conv_autotune", &value));
    CHECK(value && !strcmp(value, kiln_is_conv_autotune() ? "true" : "false"));
    free(value);
    CHECK_OK(kiln_checkpoint_read_meta(path, "kiln.no_such_key", &value));
    CHECK(value == NULL);

    /* Weights only (no optimizer, no state) into a fresh model. */
    run c = make(spec, 3);
    CHECK_OK(kiln_checkpoint_load(path, c.m, NULL, NULL));
    kiln_named_tensor *x = NULL, *y = NULL;
    int nx = 0, ny = 0;
    CHECK_OK(kiln_module_state_dict(a.m, &x, &nx));
    CHECK_OK(kiln_module_state_dict(c.m, &y, &ny));
    CHECK_EQ_I(nx, ny);
    CHECK_OK(kiln_checkpoint_load(path, a.m, NULL, NULL));
    for (int i = 0; i < nx && i < ny; i++) CHECK_MSG(same_bits(x[i].tensor, y[i].tensor), "%s", x[i].name);
    free(x);
    free(y);
    drop(&c);
    drop(&a);
    drop(&b);
}

static void test_mismatch(const char *dir) {
    char path[512], weights[512];
    snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
    snprintf(weights, sizeof weights, "%s/weights.safetensors", dir);
    run a = make(spec, 1);
    step(&a, 0);
    CHECK_OK(kiln_checkpoint_save(path, a.m, a.opt, NULL));
    /* Another architecture: the names that differ are listed. */
    run other = make("conv 4 k3 p1\nrelu\nflatten\nlinear 3\n", 1);
    CHECK_FAILS(kiln_checkpoint_load(path, other.m, NULL, NULL), KILN_ERR_IO, "does not match the model");
    CHECK_MSG(strstr(kiln_error_message(), "missing") && strstr(kiln_error_message(), "unexpected") &&
                  strstr(kiln_error_message(), "'1.running_mean'"),
              "%s", kiln_error_message());
    /* Same names, another shape. */
    run wide = make("conv 4 k3 p1\nbatchnorm\nrelu\nflatten\ndropout 0.25\nlinear 5\n", 1);
    CHECK_FAILS(kiln_checkpoint_load(path, wide.m, NULL, NULL), KILN_ERR_IO, "shape");
    CHECK_MSG(strstr(kiln_error_message(), "5.weight"), "%s", kiln_error_message());
    /* Another optimizer kind. */
    kiln_tensor **params = NULL;
    int n = 0;
    CHECK_OK(kiln_module_parameters(a.m, &params, &n));
    kiln_sgd_opts so = kiln_sgd_defaults(0.1);
    kiln_optimizer *sgd = kiln_sgd(params, n, &so);
    free(params);
    CHECK_FAILS(kiln_checkpoint_load(path, a.m, sgd, NULL), KILN_ERR_IO, "adam state but the optimizer is sgd");
    kiln_optimizer_free(sgd);
    /* A weights-only file is not a training checkpoint. */
    CHECK_OK(kiln_safetensors_save(weights, a.m));
    kiln_train_state s;
    CHECK_FAILS(kiln_checkpoint_load(weights, a.m, a.opt, &s), KILN_ERR_IO, "weights-only");
    CHECK_OK(kiln_checkpoint_load(weights, a.m, NULL, NULL));
    /* A truncated checkpoint is refused before anything is copied. */
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL);
    if (f) {
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        fclose(f);
        CHECK(truncate(path, len - 4) == 0);
    }
    CHECK_FAILS(kiln_checkpoint_load(path, a.m, a.opt, &s), KILN_ERR_IO, "outside the");
    /* A save into a missing directory fails and leaves nothing. */
    char bad[600];
    snprintf(bad, sizeof bad, "%s/no/such/dir/c.safetensors", dir);
    CHECK_FAILS(kiln_checkpoint_save(bad, a.m, a.opt, NULL), KILN_ERR_IO, "cannot create");
    CHECK_EQ_I(count_tmp(dir), 0);
    drop(&wide);
    drop(&other);
    drop(&a);
}

int main(void) {
    if (kiln_init()) return 1;
    char dir[] = "/tmp/kiln_ckpt_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    test_round_trip(dir);
    test_mismatch(dir);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    kiln_shutdown();
    return kt_finish();
}

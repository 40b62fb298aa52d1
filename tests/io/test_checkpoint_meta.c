/* A checkpoint's metadata is untrusted: every field is range-checked on
 * load, and the error names the file, the key and the value. Each case
 * takes a good checkpoint, edits one thing (a metadata value, a key
 * removed, an optimizer step count, bytes appended) and loads it into a
 * model + Adam + training state. A failed load changes nothing: the
 * weights are those from before. Save refuses a state load would refuse.
 * Format 1 checkpoints (no running sums, no run configuration) still
 * load; an unknown format version does not. */
#include <cjson/cJSON.h>
#include <math.h>
#include <unistd.h>

#include "io/safetensors_internal.h"
#include "test_util.h"

static const char spec[] = "conv 2 k3 p1\nrelu\nflatten\nlinear 3\n";
static char dir[] = "/tmp/kiln_ckpt_meta_XXXXXX";
static char good[600], bad[600];

typedef struct run {
    kiln_module *m;
    kiln_optimizer *opt;
} run;

static run make(uint64_t seed) {
    run r = {0};
    kiln_manual_seed(seed);
    CHECK_OK(kiln_model_spec_parse(spec, "t.txt", 1, 4, 4, &r.m));
    kiln_tensor **params = NULL;
    int n = 0;
    CHECK_OK(kiln_module_parameters(r.m, &params, &n));
    kiln_adam_opts o = kiln_adam_defaults();
    r.opt = kiln_adam(params, n, &o);
    CHECK(r.opt != NULL);
    free(params);
    return r;
}

static void drop(run *r) {
    kiln_optimizer_free(r->opt);
    kiln_module_free(r->m);
}

static void train_step(run *r) {
    kiln_scope_begin();
    float xs[4 * 16];
    int64_t ys[4] = {0, 1, 2, 1};
    for (int i = 0; i < 4 * 16; i++) xs[i] = (float)(i % 7) / 7.0f - 0.5f;
    kiln_tensor *x = kiln_from_data(KILN_SHAPE(4, 1, 4, 4), KILN_F32, KILN_CPU, xs);
    kiln_tensor *y = kiln_from_data(KILN_SHAPE(4), KILN_I64, KILN_CPU, ys);
    CHECK_OK(kiln_optimizer_zero_grad(r->opt, true));
    CHECK_OK(kiln_accumulate_backward(r->m, x, y, 1, NULL, NULL, NULL));
    CHECK_OK(kiln_optimizer_step(r->opt));
    kiln_scope_end();
}

static kiln_train_state good_state(void) {
    return (kiln_train_state){.epoch = 2, .step = 10, .batch_in_epoch = 3, .epochs_done = 2, .data_seed = 7,
                              .input_c = 1, .input_h = 4, .input_w = 4, .model_spec = (char *)spec,
                              .epoch_loss_sum = 0.1 + 0.2, .epoch_correct = 5, .epoch_images = 12,
                              .window_steps = 1, .window_images = 4, .window_loss_sum = 1.0 / 3.0,
                              .window_correct = 2, .run_config = "{\"batch\":4}"};
}

/* The file's bytes: *n of them, malloc'd. */
static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)len + 1);
    CHECK(fread(b, 1, (size_t)len, f) == (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return b;
}

/* `bad` = `good` with metadata `key` set to `value` (NULL: removed) and
 * `extra` bytes appended after the data. */
static void edit(const char *key, const char *value, size_t extra) {
    size_t n = 0;
    uint8_t *b = slurp(good, &n);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | b[i];
    cJSON *root = cJSON_ParseWithLength((const char *)b + 8, (size_t)hl);
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
    CHECK(meta != NULL);
    if (key) {
        cJSON_DeleteItemFromObjectCaseSensitive(meta, key);
        if (value) cJSON_AddStringToObject(meta, key, value);
    }
    char *text = cJSON_PrintUnformatted(root);
    size_t tl = strlen(text), padded = (tl + 7) / 8 * 8;
    FILE *f = fopen(bad, "wb");
    for (int i = 0; i < 8; i++) fputc((int)(padded >> (8 * i) & 0xff), f);
    fputs(text, f);
    for (size_t i = tl; i < padded; i++) fputc(' ', f);
    fwrite(b + 8 + hl, 1, n - 8 - hl, f);
    for (size_t i = 0; i < extra; i++) fputc(0x5a, f);
    fclose(f);
    free(text);
    cJSON_Delete(root);
    free(b);
}

static bool same_weights(kiln_module *a, const float *before, size_t n) {
    kiln_named_tensor *sd = NULL;
    int k = 0;
    CHECK_OK(kiln_module_state_dict(a, &sd, &k));
    float *now = malloc(n * sizeof *now);
    size_t at = 0;
    for (int i = 0; i < k; i++) {
        size_t m = (size_t)kiln_numel(sd[i].tensor);
        CHECK_OK(kiln_to_host(sd[i].tensor, now + at, m * sizeof *now));
        at += m;
    }
    bool same = at == n && memcmp(now, before, n * sizeof *now) == 0;
    free(now);
    free(sd);
    return same;
}

static size_t weights(kiln_module *a, float **out) {
    kiln_named_tensor *sd = NULL;
    int k = 0;
    CHECK_OK(kiln_module_state_dict(a, &sd, &k));
    size_t n = 0;
    for (int i = 0; i < k; i++) n += (size_t)kiln_numel(sd[i].tensor);
    *out = malloc(n * sizeof **out);
    size_t at = 0;
    for (int i = 0; i < k; i++) {
        size_t m = (size_t)kiln_numel(sd[i].tensor);
        CHECK_OK(kiln_to_host(sd[i].tensor, *out + at, m * sizeof **out));
        at += m;
    }
    free(sd);
    return n;
}

/* Loading `bad` fails naming the file and `needle`; the model keeps its
 * weights and the state's strings are NULL. */
static void load_fails(const char *needle) {
    run r = make(99);
    float *before = NULL;
    size_t n = weights(r.m, &before);
    kiln_train_state s;
    memset(&s, 0xab, sizeof s);
    CHECK_FAILS(kiln_checkpoint_load(bad, r.m, r.opt, &s), KILN_ERR_IO, needle);
    CHECK_MSG(strstr(kiln_error_message(), bad) != NULL, "the error does not name the file: %s",
              kiln_error_message());
    CHECK_MSG(same_weights(r.m, before, n), "a failed load (%s) changed the weights", needle);
    CHECK(s.model_spec == NULL && s.run_config == NULL);
    CHECK_EQ_I(kiln_optimizer_step_count(r.opt), 0);
    free(before);
    drop(&r);
}

static void meta_fails(const char *key, const char *value, const char *needle) {
    edit(key, value, 0);
    load_fails(needle);
}

static void test_round_trip(void) {
    run a = make(1);
    train_step(&a);
    train_step(&a);
    kiln_train_state s = good_state();
    CHECK_OK(kiln_checkpoint_save(good, a.m, a.opt, &s));
    run b = make(2);
    kiln_train_state t;
    memset(&t, 0xab, sizeof t);
    CHECK_OK(kiln_checkpoint_load(good, b.m, b.opt, &t));
    CHECK_EQ_I(t.format_version, KILN_CHECKPOINT_FORMAT);
    CHECK(t.epoch_loss_sum == s.epoch_loss_sum && t.window_loss_sum == s.window_loss_sum);
    CHECK(t.epoch_correct == 5 && t.window_correct == 2);
    CHECK_EQ_I(t.epoch_images, 12);
    CHECK_EQ_I(t.window_steps, 1);
    CHECK_EQ_I(t.window_images, 4);
    CHECK(t.run_config && !strcmp(t.run_config, s.run_config));
    CHECK_EQ_I(kiln_optimizer_step_count(b.opt), 2);
    free(t.model_spec);
    free(t.run_config);
    /* A loss sum that overflowed (f16) still saves and loads. */
    s.epoch_loss_sum = INFINITY, s.window_loss_sum = NAN;
    CHECK_OK(kiln_checkpoint_save(bad, a.m, a.opt, &s));
    CHECK_OK(kiln_checkpoint_load(bad, b.m, b.opt, &t));
    CHECK(isinf(t.epoch_loss_sum) && isnan(t.window_loss_sum));
    free(t.model_spec);
    free(t.run_config);
    drop(&b);
    drop(&a);
}

static void test_bad_metadata(void) {
    /* The training position. */
    meta_fails("kiln.epoch", "-4", "metadata 'kiln.epoch' is -4, outside 0..1000000");
    meta_fails("kiln.epoch", "2147483647", "metadata 'kiln.epoch' is 2147483647, outside 0..1000000");
    meta_fails("kiln.epoch", "99999999999999999999", "metadata 'kiln.epoch' is '99999999999999999999', expected an integer");
    meta_fails("kiln.epoch", "3x", "'kiln.epoch' is '3x', expected an integer");
    meta_fails("kiln.epoch", " 3", "'kiln.epoch' is ' 3', expected an integer");
    meta_fails("kiln.epoch", NULL, "metadata 'kiln.epoch' is missing");
    meta_fails("kiln.epochs_done", "3", "metadata 'kiln.epochs_done' is 3, outside 0..2 (kiln.epoch)");
    meta_fails("kiln.epochs_done", "-1", "'kiln.epochs_done' is -1");
    meta_fails("kiln.step", "-1", "metadata 'kiln.step' is -1, outside 0..");
    meta_fails("kiln.batch_in_epoch", "-2", "metadata 'kiln.batch_in_epoch' is -2");
    meta_fails("kiln.data_seed", "-1", "'kiln.data_seed' is '-1', expected an unsigned integer");
    meta_fails("kiln.generator.offset", "18446744073709551615", "'kiln.generator.offset' is 18446744073709551615");
    meta_fails("kiln.deterministic", "yes", "'kiln.deterministic' is 'yes', expected true or false");
    meta_fails("kiln.cpu_kernels", "\x1b[31mred", "expected fast or reference");
    meta_fails("kiln.input", "0x4x4", "metadata 'kiln.input' is '0x4x4', expected CxHxW");
    meta_fails("kiln.input", "1x4", "'kiln.input' is '1x4', expected CxHxW");
    meta_fails("kiln.input", "1x4x4x", "expected CxHxW");
    meta_fails("kiln.input", "1x4x2000000", "'kiln.input (width)' is 2000000, outside 1..1048576");
    /* The running sums. */
    meta_fails("kiln.epoch_loss_sum", "1.5.2", "'kiln.epoch_loss_sum' is '1.5.2', expected a number");
    meta_fails("kiln.epoch_loss_sum", NULL, "'kiln.epoch_loss_sum' is missing, expected a number");
    meta_fails("kiln.epoch_images", "-1", "'kiln.epoch_images' is -1");
    meta_fails("kiln.window_images", "13", "'kiln.window_images' is 13, outside 0..12 (kiln.epoch_images)");
    meta_fails("kiln.window_steps", "4", "'kiln.window_steps' is 4, outside 0..3 (kiln.batch_in_epoch)");
    meta_fails("kiln.epoch_correct", "9", "'kiln.epoch_correct' is 9, outside 0..kiln.epoch_images - kiln.window_images");
    meta_fails("kiln.window_correct", "-1", "'kiln.window_correct' is -1");
    /* The optimizer. */
    meta_fails("kiln.optimizer.step_count", "-3", "metadata 'kiln.optimizer.step_count' is -3, outside 0..");
    meta_fails("kiln.optimizer.lr", "inf", "metadata 'kiln.optimizer.lr' is inf, outside the finite numbers >= 0");
    meta_fails("kiln.optimizer.lr", "nan", "'kiln.optimizer.lr' is nan");
    meta_fails("kiln.optimizer.lr", "-0.1", "'kiln.optimizer.lr' is -0.10000000000000001");
    meta_fails("kiln.optimizer.lr", "1e3x", "'kiln.optimizer.lr' is '1e3x', expected a number");
    /* Mixed precision. */
    meta_fails("kiln.amp", "f8", "metadata 'kiln.amp' is 'f8', expected f16 or bf16");
    edit("kiln.amp", "f16", 0);
    load_fails("metadata 'kiln.amp.scale' is missing");
    /* The format version. */
    meta_fails("kiln.checkpoint", "3", "metadata 'kiln.checkpoint' is format version '3'; this Kiln reads versions 1 to 2");
    meta_fails("kiln.checkpoint", "two", "format version 'two'");
    meta_fails("kiln.checkpoint", NULL, "is a weights-only safetensors file, not a Kiln training checkpoint");
    /* Bytes after the data section. */
    edit(NULL, NULL, 5);
    load_fails("5 bytes after the data section's last tensor");
}

/* A negative update count in the optimizer.steps tensor (Adam's bias
 * correction then gave a loss of -nan). */
static void test_bad_optimizer_steps(void) {
    size_t n = 0;
    uint8_t *b = slurp(good, &n);
    kiln_st_index idx;
    CHECK_OK(kiln_st_index_parse(good, b, n, &idx));
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | b[i];
    const kiln_st_entry *e = NULL;
    for (int i = 0; i < idx.n; i++)
        if (!strcmp(idx.items[i].name, "optimizer.steps")) e = &idx.items[i];
    CHECK(e != NULL);
    if (e) {
        int64_t minus = -5;
        memcpy(b + 8 + hl + e->begin + sizeof minus, &minus, sizeof minus);
        FILE *f = fopen(bad, "wb");
        fwrite(b, 1, n, f);
        fclose(f);
        load_fails("'optimizer.steps'[1] (parameter 1's update count) is -5, outside 0..9007199254740992");
        int64_t huge = INT64_MAX;
        memcpy(b + 8 + hl + e->begin, &huge, sizeof huge);
        f = fopen(bad, "wb");
        fwrite(b, 1, n, f);
        fclose(f);
        load_fails("'optimizer.steps'[0] (parameter 0's update count) is 9223372036854775807");
    }
    kiln_st_index_free(&idx);
    free(b);
}

/* An amp scale that is not a finite positive number. */
static void test_bad_amp(void) {
    run a = make(1);
    kiln_train_state s = good_state();
    snprintf(s.amp, sizeof s.amp, "f16");
    s.amp_scale = 65536;
    CHECK_OK(kiln_checkpoint_save(good, a.m, a.opt, &s));
    meta_fails("kiln.amp.scale", "inf", "metadata 'kiln.amp.scale' is inf, outside the finite numbers > 0");
    meta_fails("kiln.amp.scale", "0", "'kiln.amp.scale' is 0");
    meta_fails("kiln.amp.scale", "-nan", "'kiln.amp.scale' is -nan");
    meta_fails("kiln.amp.growth_tracker", "-1", "'kiln.amp.growth_tracker' is -1");
    drop(&a);
}

/* Format 1: no running sums, no run configuration; they load as 0 and
 * NULL. */
static void test_format_1(void) {
    run a = make(1);
    kiln_train_state s = good_state();
    s.epoch_loss_sum = s.epoch_correct = s.window_loss_sum = s.window_correct = 0;
    s.epoch_images = s.window_steps = s.window_images = 0;
    s.run_config = NULL;
    CHECK_OK(kiln_checkpoint_save(good, a.m, a.opt, &s));
    drop(&a);
    edit("kiln.checkpoint", "1", 0);
    static const char *const v2[] = {"kiln.epoch_loss_sum", "kiln.epoch_correct", "kiln.epoch_images",
                                     "kiln.window_steps", "kiln.window_images", "kiln.window_loss_sum",
                                     "kiln.window_correct"};
    for (size_t i = 0; i < sizeof v2 / sizeof v2[0]; i++) {
        rename(bad, good);
        edit(v2[i], NULL, 0);
    }
    run r = make(3);
    kiln_train_state t;
    CHECK_OK(kiln_checkpoint_load(bad, r.m, r.opt, &t));
    CHECK_EQ_I(t.format_version, 1);
    CHECK_EQ_I(t.epoch, 2);
    CHECK(t.epoch_loss_sum == 0 && t.epoch_images == 0 && t.window_steps == 0 && t.run_config == NULL);
    free(t.model_spec);
    drop(&r);
}

/* Save refuses what load would refuse, and leaves no file. */
static void test_save_refuses(void) {
    run a = make(1);
    char path[640];
    snprintf(path, sizeof path, "%s/refused.safetensors", dir);
    struct {
        kiln_train_state s;
        const char *needle;
    } cases[6];
    for (int i = 0; i < 6; i++) cases[i].s = good_state();
    cases[0].s.epoch = -1, cases[0].needle = "the state's 'kiln.epoch' is -1, outside 0..1000000";
    cases[1].s.step = -1, cases[1].needle = "the state's 'kiln.step' is -1";
    cases[2].s.epochs_done = 3, cases[2].needle = "'kiln.epochs_done' is 3, outside 0..2 (kiln.epoch)";
    cases[3].s.window_correct = 5, cases[3].needle = "'kiln.window_correct' is 5, outside 0..kiln.window_images";
    snprintf(cases[4].s.amp, sizeof cases[4].s.amp, "f16");
    cases[4].s.amp_scale = INFINITY, cases[4].needle = "'kiln.amp.scale' is inf";
    cases[5].s.epoch = KILN_CHECKPOINT_MAX_EPOCH + 1, cases[5].needle = "'kiln.epoch' is 1000001";
    for (int i = 0; i < 6; i++) {
        CHECK_FAILS(kiln_checkpoint_save(path, a.m, a.opt, &cases[i].s), KILN_ERR_INVALID_ARGUMENT, cases[i].needle);
        CHECK_MSG(access(path, F_OK) != 0, "a refused save (%s) left %s", cases[i].needle, path);
    }
    drop(&a);
}

int main(void) {
    if (kiln_init()) return 1;
    if (!mkdtemp(dir)) return 1;
    snprintf(good, sizeof good, "%s/good.safetensors", dir);
    snprintf(bad, sizeof bad, "%s/bad.safetensors", dir);
    test_round_trip();
    test_bad_metadata();
    test_bad_optimizer_steps();
    test_bad_amp();
    test_format_1();
    test_save_refuses();
    unlink(good);
    unlink(bad);
    rmdir(dir);
    kiln_shutdown();
    return kt_finish();
}

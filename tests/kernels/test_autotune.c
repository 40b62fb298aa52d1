/* The convolution autotuner (src/kernels/autotune.h) driven by a scripted
 * fake provider: each candidate has a run time (a fake clock advances by
 * it on every run), may fail to build or to run, needs a given workspace
 * and is or is not deterministic. Covers the candidate order, failure
 * skipping, workspace limits, deterministic and default modes, the cache
 * keys, persistence across tuners (no re-timing, counted), corrupt and
 * foreign cache files, planning without buffers and concurrent choices. */
#include <dirent.h>
#include <pthread.h>
#include <unistd.h>

#include "base/error.h"
#include "kernels/autotune.h"
#include "test_util.h"

typedef struct fake_candidate {
    const char *name;
    double ms;
    bool fail_build, fail_run, deterministic, is_default;
    size_t workspace;
    const double *seq; /* when set: the ms of run k is seq[k % seq_n] instead of ms */
    int seq_n, ran;
} fake_candidate;

typedef struct fake {
    fake_candidate c[8];
    int n;
    size_t limit;
    const char *device, *versions;
    double clock, started;
    int builds, runs, allocs, bad_workspace;
    size_t largest_alloc;
    pthread_mutex_t mutex; /* the concurrency test shares one fake */
} fake;

static void fake_identity(void *self, void *ctx, char *device, size_t ds, char *versions, size_t vs) {
    (void)ctx;
    fake *f = self;
    snprintf(device, ds, "%s", f->device ? f->device : "Fake GPU 80GB");
    snprintf(versions, vs, "%s", f->versions ? f->versions : "fakelib 1.2.3");
}

static kiln_status fake_candidates(void *self, const kiln_autotune_conv *cfg, void *ctx,
                                   kiln_autotune_candidate *out, int max, int *n) {
    (void)cfg, (void)ctx;
    fake *f = self;
    *n = 0;
    for (int i = 0; i < f->n && i < max; i++) {
        memset(&out[i], 0, sizeof out[i]);
        snprintf(out[i].name, sizeof out[i].name, "%s", f->c[i].name);
        out[i].deterministic = f->c[i].deterministic;
        out[i].is_default = f->c[i].is_default;
        *n = i + 1;
    }
    return KILN_OK;
}

static kiln_status fake_build(void *self, const kiln_autotune_conv *cfg, void *ctx, int i, size_t *ws) {
    (void)cfg, (void)ctx;
    fake *f = self;
    pthread_mutex_lock(&f->mutex);
    f->builds++;
    pthread_mutex_unlock(&f->mutex);
    if (f->c[i].fail_build)
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, NULL, "fake %s: unimplemented", f->c[i].name);
    *ws = f->c[i].workspace;
    return KILN_OK;
}

static kiln_status fake_run(void *self, const kiln_autotune_conv *cfg, void *ctx, int i, void *ws,
                            size_t ws_bytes) {
    (void)cfg, (void)ctx;
    fake *f = self;
    pthread_mutex_lock(&f->mutex);
    f->runs++;
    if (f->c[i].workspace && (!ws || ws_bytes < f->c[i].workspace)) f->bad_workspace++;
    fake_candidate *c = &f->c[i];
    f->clock += c->seq ? c->seq[c->ran % c->seq_n] : c->ms;
    c->ran++;
    pthread_mutex_unlock(&f->mutex);
    return c->fail_run ? KILN_RAISE(KILN_ERR_DEVICE, NULL, "fake %s: launch failed", c->name) : KILN_OK;
}

static kiln_status fake_timer_start(void *self, void *ctx) {
    (void)ctx;
    fake *f = self;
    f->started = f->clock;
    return KILN_OK;
}

static kiln_status fake_timer_stop(void *self, void *ctx, double *ms) {
    (void)ctx;
    fake *f = self;
    *ms = f->clock - f->started;
    return KILN_OK;
}

static size_t fake_limit(void *self, void *ctx) {
    (void)ctx;
    fake *f = self;
    return f->limit ? f->limit : SIZE_MAX;
}

static kiln_status fake_alloc(void *self, void *ctx, size_t bytes, void **ptr) {
    (void)ctx;
    fake *f = self;
    f->allocs++;
    if (bytes > f->largest_alloc) f->largest_alloc = bytes;
    *ptr = malloc(bytes);
    return *ptr ? KILN_OK : KILN_ERR_OUT_OF_MEMORY;
}

static void fake_free(void *self, void *ctx, void *ptr) {
    (void)self, (void)ctx;
    free(ptr);
}

static kiln_autotune_provider provider_of(fake *f) {
    return (kiln_autotune_provider){.name = "fake",
                                    .self = f,
                                    .identity = fake_identity,
                                    .candidates = fake_candidates,
                                    .build = fake_build,
                                    .run = fake_run,
                                    .timer_start = fake_timer_start,
                                    .timer_stop = fake_timer_stop,
                                    .workspace_limit = fake_limit,
                                    .workspace_alloc = fake_alloc,
                                    .workspace_free = fake_free};
}

/* conv2 of the tutorial CNN at batch 128. */
static kiln_autotune_conv base_cfg(void) {
    return (kiln_autotune_conv){.pass = KILN_AUTOTUNE_CONV_FWD,
                                .x_dtype = KILN_F32,
                                .w_dtype = KILN_F32,
                                .y_dtype = KILN_F32,
                                .x = {128, 32, 16, 16},
                                .w = {64, 32, 3, 3},
                                .y = {128, 64, 16, 16},
                                .stride = {1, 1},
                                .padding = {1, 1},
                                .dilation = {1, 1},
                                .groups = 1,
                                .bias = true,
                                .layout = "nchw",
                                .math = "f32"};
}

static void three(fake *f) {
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->mutex, NULL);
    f->c[0] = (fake_candidate){.name = "a", .ms = 5, .deterministic = true, .is_default = true};
    f->c[1] = (fake_candidate){.name = "b", .ms = 2, .deterministic = false, .workspace = 1000};
    f->c[2] = (fake_candidate){.name = "c", .ms = 3, .deterministic = true, .workspace = 10};
    f->n = 3;
}

static const kiln_autotune_mode TIMED = {.timing = true, .deterministic = false};
static const kiln_autotune_mode DEFAULT = {.timing = false, .deterministic = false};
static const kiln_autotune_mode DETERMINISTIC = {.timing = true, .deterministic = true};

static void test_fastest_and_order(void) {
    fake f;
    three(&f);
    kiln_autotune_provider p = provider_of(&f);
    kiln_autotuner *t = kiln_autotuner_create(NULL, 2, 3);
    kiln_autotune_conv cfg = base_cfg();
    kiln_autotune_choice ch;
    CHECK_OK(kiln_autotune_choose(t, &p, &cfg, NULL, TIMED, true, &ch));
    CHECK_EQ_I(ch.index, 1);
    CHECK(!strcmp(ch.name, "b") && ch.ms == 2 && !ch.from_cache);
    CHECK_EQ_I(f.runs, 3 * (2 + 3)); /* every candidate: 2 warm-up + 3 timed runs */
    CHECK_EQ_I(f.bad_workspace, 0);
    CHECK_EQ_I(f.largest_alloc, 1000);
    kiln_autotune_stats s;
    kiln_autotune_stats_get(t, &s);
    CHECK_EQ_I(s.tunings, 1);
    CHECK_EQ_I(s.timed_runs, 9);
    /* Asked again: the cached pick, nothing runs. */
    f.runs = 0;
    CHECK_OK(kiln_autotune_choose(t, &p, &cfg, NULL, TIMED, true, &ch));
    CHECK(ch.index == 1 && ch.from_cache && f.runs == 0);
    kiln_autotune_stats_get(t, &s);
    CHECK_EQ_I(s.cache_hits, 1);
    kiln_autotuner_free(t);

    /* Ties go to the provider's earlier candidate. */
    three(&f);
    f.c[2].ms = 2;
    t = kiln_autotuner_create(NULL, 1, 1);
    CHECK_OK(kiln_autotune_choose(t, &p, &cfg, NULL, TIMED, true, &ch));
    CHECK_EQ_I(ch.index, 1);
    kiln_autotuner_free(t);
    /* The fastest run counts (noise only adds time): b's timed runs take
     * 9, 9 and 2.5 ms (two of them preempted; its warm-up 1 ms), c's a
     * steady 3 ms: b wins with 2.5, where a median (9) would pick c. */
    three(&f);
    static const double b_runs[] = {1, 9, 9, 2.5};
    f.c[1].seq = b_runs;
    f.c[1].seq_n = 4;
    t = kiln_autotuner_create(NULL, 1, 3);
    CHECK_OK(kiln_autotune_choose(t, &p, &cfg, NULL, TIMED, true, &ch));
    CHECK(!strcmp(ch.name, "b") && ch.ms == 2.5);
    kiln_autotuner_free(t);
    /* Defaults: 1 warm-up and 5 timed runs per candidate. */
    three(&f);
    t = kiln_autotuner_create(NULL, 0, 0);
    CHECK_OK(kiln_autotune_choose(t, &p, &cfg, NULL, TIMED, true, &ch));
    CHECK_EQ_I(f.runs, 3 * (1 + 5));
    kiln_autotuner_free(t);
}

static void test_failures_and_workspace(void) {
    fake f;
    kiln_autotune_conv cfg = base_cfg();
    kiln_autotune_choice ch;
    kiln_autotune_provider p = provider_of(&f);

    three(&f); /* b fails to build: c (3 ms) beats a (5 ms) */
    f.c[1].fail_build = true;
    kiln_autotuner *t = kiln_autotuner_create(NULL, 1, 3);
    CHECK_OK(kiln_autotune_choose(t, &p, &cfg, NULL, TIMED, true, &ch));
    CHECK(!strcmp(ch.name, "c"));
    CHECK_EQ_I(f.runs, 2 * 4);
    kiln_autotuner_free(t);

    three(&f); /* b fails when run */
    f.c[1].fail_run = true;
    t = kiln_autotuner_create(NULL, 1, 3);
    CHECK_OK(kiln_autotune_choose(t, &p, &cfg, NULL, TIMED, true, &ch));
    CHECK(!strcmp(ch.name, "c"));
    kiln_autotuner_free(t);

    three(&f); /* b needs more workspace than the allocator can give: never run, never allocated */
    f.limit = 999;
    t = kiln_autotuner_create(NULL, 1, 3);
    CHECK_OK(kiln_autotune_choose(t, &p, &cfg, NULL, TIMED, true, &ch));
    CHECK(!strcmp(ch.name, "c"));
    CHECK_EQ_I(f.largest_alloc, 10);
    CHECK_EQ_I(f.runs, 2 * 4);
    kiln_autotuner_free(t);

    three(&f); /* nothing can run: an error naming each reason */
    f.c[0].fail_build = f.c[2].fail_run = true;
    f.limit = 100;
    t = kiln_autotuner_create(NULL, 1, 3);
    CHECK_FAILS(kiln_autotune_choose(t, &p, &cfg, NULL, TIMED, true, &ch), KILN_ERR_UNSUPPORTED,
                "no candidate");
    CHECK(strstr(kiln_error_message(), "a: does not build") != NULL);
    CHECK(strstr(kiln_error_message(), "b: needs 1000 bytes") != NULL);
    CHECK(strstr(kiln_error_message(), "c: failed when run") != NULL);
    CHECK(strstr(kiln_error_message(), "x=128x32x16x16") != NULL);
    kiln_autotuner_free(t);
}

static void test_modes(void) {
    fake f;
    kiln_autotune_conv cfg = base_cfg();
    kiln_autotune_choice ch;
    kiln_autotune_provider p = provider_of(&f);

    /* Deterministic: the first deterministic candidate that builds, no run. */
    three(&f);
    f.c[0].deterministic = false;
    kiln_autotuner *t = kiln_autotuner_create(NULL, 1, 3);
    CHECK_OK(kiln_autotune_choose(t, &p, &cfg, NULL, DETERMINISTIC, true, &ch));
    CHECK(!strcmp(ch.name, "c") && ch.ms < 0);
    CHECK_EQ_I(f.runs, 0);
    kiln_autotune_stats s;
    kiln_autotune_stats_get(t, &s);
    CHECK_EQ_I(s.tunings, 0);
    CHECK_EQ_I(s.entries, 0); /* not a timed pick: never written to the file */
    f.c[2].fail_build = true; /* cached: asked again, the same answer without building */
    f.builds = 0;
    uint64_t g = kiln_autotune_generation();
    CHECK_OK(kiln_autotune_choose(t, &p, &cfg, NULL, DETERMINISTIC, true, &ch));
    CHECK(!strcmp(ch.name, "c") && ch.from_cache && f.builds == 0);
    /* the generation (what the oneDNN provider's per-thread memo of picks
     * keys on) stays while answers come from the cache, and moves with
     * every change to the entries: a new pick, a parsed cache, a free */
    CHECK(kiln_autotune_generation() == g);
    kiln_autotune_conv other = cfg;
    other.groups = 2;
    f.c[2].fail_build = false;
    CHECK_OK(kiln_autotune_choose(t, &p, &other, NULL, DETERMINISTIC, true, &ch));
    CHECK(kiln_autotune_generation() != g);
    g = kiln_autotune_generation();
    static const char header[] = "kiln-autotune-cache 1\n";
    CHECK_OK(kiln_autotune_parse(t, header, sizeof header - 1));
    CHECK(kiln_autotune_generation() != g);
    g = kiln_autotune_generation();
    kiln_autotuner_free(t);
    CHECK(kiln_autotune_generation() != g);

    three(&f); /* the first deterministic one does not build: the next */
    f.c[0].fail_build = true;
    t = kiln_autotuner_create(NULL, 1, 3);
    CHECK_OK(kiln_autotune_choose(t, &p, &cfg, NULL, DETERMINISTIC, true, &ch));
    CHECK(!strcmp(ch.name, "c") && f.runs == 0);
    kiln_autotuner_free(t);

    three(&f); /* none deterministic */
    f.c[0].deterministic = f.c[2].deterministic = false;
    t = kiln_autotuner_create(NULL, 1, 3);
    CHECK_FAILS(kiln_autotune_choose(t, &p, &cfg, NULL, DETERMINISTIC, true, &ch), KILN_ERR_UNSUPPORTED,
                "deterministic mode");
    CHECK(strstr(kiln_error_last()->hint, "kiln_set_deterministic(false)") != NULL);
    kiln_autotuner_free(t);

    /* Timing off: the provider's default; if it cannot run, the next one
     * after it in the provider's order (wrapping). */
    three(&f);
    f.c[0].is_default = false;
    f.c[2].is_default = true;
    t = kiln_autotuner_create(NULL, 1, 3);
    CHECK_OK(kiln_autotune_choose(t, &p, &cfg, NULL, DEFAULT, true, &ch));
    CHECK(!strcmp(ch.name, "c") && f.runs == 0);
    kiln_autotuner_free(t);
    f.c[2].fail_build = true;
    t = kiln_autotuner_create(NULL, 1, 3);
    CHECK_OK(kiln_autotune_choose(t, &p, &cfg, NULL, DEFAULT, true, &ch));
    CHECK(!strcmp(ch.name, "a") && f.runs == 0);
    kiln_autotuner_free(t);

    /* Timing wanted but no buffers (planning on meta): the default, not
     * cached as timed; the first call with buffers times. */
    three(&f);
    t = kiln_autotuner_create(NULL, 1, 3);
    CHECK_OK(kiln_autotune_choose(t, &p, &cfg, NULL, TIMED, false, &ch));
    CHECK(!strcmp(ch.name, "a") && f.runs == 0);
    CHECK_OK(kiln_autotune_choose(t, &p, &cfg, NULL, TIMED, true, &ch));
    CHECK(!strcmp(ch.name, "b") && f.runs == 12);
    CHECK_OK(kiln_autotune_choose(t, &p, &cfg, NULL, TIMED, false, &ch));
    CHECK(!strcmp(ch.name, "b") && ch.from_cache); /* now the timed pick serves planning too */
    kiln_autotuner_free(t);

    /* The public settings. */
    kiln_set_deterministic(false);
    kiln_set_conv_autotune(true);
    kiln_set_cudnn_benchmark(false);
    kiln_autotune_mode m = kiln_autotune_mode_current(KILN_DEVICE_CPU);
    CHECK(m.timing && !m.deterministic);
    m = kiln_autotune_mode_current(KILN_DEVICE_CUDA);
    CHECK(!m.timing && !m.deterministic);
    kiln_set_cudnn_benchmark(true);
    CHECK(kiln_autotune_mode_current(KILN_DEVICE_CUDA).timing && kiln_is_cudnn_benchmark());
    kiln_set_deterministic(true);
    m = kiln_autotune_mode_current(KILN_DEVICE_CPU);
    CHECK(!m.timing && m.deterministic && kiln_deterministic());
    kiln_set_deterministic(false);
    kiln_set_conv_autotune(false);
    kiln_set_cudnn_benchmark(false);
    CHECK(!kiln_is_conv_autotune() && !kiln_autotune_mode_current(KILN_DEVICE_CPU).timing);
}

/* kiln_autotune_choose keeps its untimed answers per thread: asked again
 * for the same configuration on another device (the provider's identity
 * for the call), it asks the tuner, which picks for that device. */
static void test_memo_identity(void) {
    fake f;
    kiln_autotune_conv cfg = base_cfg();
    kiln_autotune_choice ch;
    kiln_autotune_provider p = provider_of(&f);
    three(&f);
    kiln_autotuner *t = kiln_autotuner_create(NULL, 1, 3);
    CHECK_OK(kiln_autotune_choose(t, &p, &cfg, NULL, DEFAULT, false, &ch));
    CHECK(!strcmp(ch.name, "a"));
    CHECK_OK(kiln_autotune_choose(t, &p, &cfg, NULL, DEFAULT, false, &ch)); /* the same device: the same answer */
    CHECK(!strcmp(ch.name, "a") && ch.from_cache);
    f.device = "Other GPU 40GB";
    f.c[0].is_default = false;
    f.c[2].is_default = true;
    CHECK_OK(kiln_autotune_choose(t, &p, &cfg, NULL, DEFAULT, false, &ch));
    CHECK_MSG(!strcmp(ch.name, "c"), "another device got %s, the first device's pick", ch.name);
    kiln_autotuner_free(t);
}

static void test_keys(void) {
    enum { VARIANTS = 24 };
    kiln_autotune_conv v[VARIANTS];
    for (int i = 0; i < VARIANTS; i++) v[i] = base_cfg();
    int k = 1;
    v[k++].pass = KILN_AUTOTUNE_CONV_BWD_DATA;
    v[k++].pass = KILN_AUTOTUNE_CONV_BWD_WEIGHT;
    v[k++].x_dtype = KILN_F16;
    v[k++].w_dtype = KILN_BF16;
    v[k++].y_dtype = KILN_F16;
    v[k++].x[0] = 64; /* batch */
    v[k++].x[1] = 16;
    v[k++].x[2] = 17;
    v[k++].x[3] = 15;
    v[k++].w[0] = 32;
    v[k++].w[2] = 5;
    v[k++].w[3] = 1;
    v[k++].y[2] = 8;
    v[k++].stride[0] = 2;
    v[k++].stride[1] = 2;
    v[k++].padding[0] = 0;
    v[k++].padding[1] = 2;
    v[k++].dilation[0] = 2;
    v[k++].dilation[1] = 3;
    v[k++].groups = 2;
    v[k++].bias = false;
    v[k++].layout = "nhwc";
    v[k++].math = "tf32";
    CHECK_EQ_I(k, VARIANTS);
    char keys[VARIANTS][512];
    for (int i = 0; i < VARIANTS; i++) kiln_autotune_key_format(&v[i], keys[i], sizeof keys[i]);
    for (int i = 0; i < VARIANTS; i++)
        for (int j = i + 1; j < VARIANTS; j++)
            CHECK_MSG(strcmp(keys[i], keys[j]), "variants %d and %d: %s", i, j, keys[i]);

    /* Each variant is a configuration of its own: timed once each. */
    fake f;
    three(&f);
    kiln_autotune_provider p = provider_of(&f);
    kiln_autotuner *t = kiln_autotuner_create(NULL, 1, 1);
    kiln_autotune_choice ch;
    for (int i = 0; i < VARIANTS; i++) CHECK_OK(kiln_autotune_choose(t, &p, &v[i], NULL, TIMED, true, &ch));
    for (int i = 0; i < VARIANTS; i++) CHECK_OK(kiln_autotune_choose(t, &p, &v[i], NULL, TIMED, true, &ch));
    kiln_autotune_stats s;
    kiln_autotune_stats_get(t, &s);
    CHECK_EQ_I(s.tunings, VARIANTS);
    CHECK_EQ_I(s.cache_hits, VARIANTS);
    /* Another device or library version: new keys too. */
    f.device = "Fake GPU 40GB";
    CHECK_OK(kiln_autotune_choose(t, &p, &v[0], NULL, TIMED, true, &ch));
    f.versions = "fakelib 1.2.4";
    CHECK_OK(kiln_autotune_choose(t, &p, &v[0], NULL, TIMED, true, &ch));
    kiln_autotune_stats_get(t, &s);
    CHECK_EQ_I(s.tunings, VARIANTS + 2);
    kiln_autotuner_free(t);
}

static char tmpdir[256];

static int count_tmp_files(void) {
    DIR *d = opendir(tmpdir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, ".tmp.")) n++;
    if (d) closedir(d);
    return n;
}

static char *read_text(const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    char *buf = calloc(1, 1 << 16);
    if (buf) (void)!fread(buf, 1, (1 << 16) - 1, fp);
    fclose(fp);
    return buf;
}

static void write_text(const char *path, const char *text) {
    FILE *fp = fopen(path, "wb");
    if (!fp) return;
    fputs(text, fp);
    fclose(fp);
}

static int warnings;
static char last_warning[512];
static void count_warnings(kiln_log_level level, const char *message, void *user) {
    (void)user;
    if (level >= KILN_LOG_WARN) {
        warnings++;
        snprintf(last_warning, sizeof last_warning, "%s", message);
    }
}

static void test_persistence(void) {
    char path[300];
    snprintf(path, sizeof path, "%s/sub/dir/autotune.txt", tmpdir); /* directories are created */
    fake f;
    three(&f);
    kiln_autotune_provider p = provider_of(&f);
    kiln_autotune_conv a = base_cfg(), b = base_cfg();
    b.pass = KILN_AUTOTUNE_CONV_BWD_WEIGHT;
    kiln_autotune_choice ch;

    kiln_autotuner *t = kiln_autotuner_create(path, 1, 3);
    CHECK_OK(kiln_autotune_choose(t, &p, &a, NULL, TIMED, true, &ch));
    f.c[1].ms = 9; /* for b, c is fastest */
    CHECK_OK(kiln_autotune_choose(t, &p, &b, NULL, TIMED, true, &ch));
    CHECK(!strcmp(ch.name, "c"));
    kiln_autotune_stats s;
    kiln_autotune_stats_get(t, &s);
    CHECK_EQ_I(s.saves, 2);
    kiln_autotuner_free(t);
    CHECK_EQ_I(count_tmp_files(), 0);
    char *text = read_text(path);
    CHECK(text && !strncmp(text, "kiln-autotune-cache 1\n", 22));
    CHECK(text && strstr(text, "fake\tFake GPU 80GB\tfakelib 1.2.3\tfwd x=128x32x16x16") != NULL);
    free(text);

    /* A fresh tuner (a second run) reads the file and times nothing. */
    three(&f);
    t = kiln_autotuner_create(path, 1, 3);
    CHECK_OK(kiln_autotune_choose(t, &p, &a, NULL, TIMED, true, &ch));
    CHECK(!strcmp(ch.name, "b") && ch.from_cache && ch.ms == 2);
    CHECK_OK(kiln_autotune_choose(t, &p, &b, NULL, TIMED, true, &ch));
    CHECK(!strcmp(ch.name, "c") && ch.from_cache);
    CHECK_EQ_I(f.runs, 0);
    kiln_autotune_stats_get(t, &s);
    CHECK_EQ_I(s.loaded, 2);
    CHECK_EQ_I(s.tunings, 0);
    CHECK_EQ_I(s.timed_runs, 0);
    CHECK_EQ_I(s.cache_hits, 2);
    /* Another device: its own timing; the other device's entries stay in the file. */
    f.device = "Fake GPU 40GB";
    CHECK_OK(kiln_autotune_choose(t, &p, &a, NULL, TIMED, true, &ch));
    CHECK(!ch.from_cache && f.runs > 0);
    kiln_autotune_stats_get(t, &s);
    CHECK_EQ_I(s.entries, 3);
    kiln_autotuner_free(t);

    /* A cached name the provider no longer offers is timed again. */
    three(&f);
    f.c[1].name = "b2";
    t = kiln_autotuner_create(path, 1, 3);
    CHECK_OK(kiln_autotune_choose(t, &p, &a, NULL, TIMED, true, &ch));
    CHECK(!strcmp(ch.name, "b2") && !ch.from_cache);
    kiln_autotuner_free(t);

    /* Corrupt files: ignored with one warning line, then rewritten. */
    static const char *const corrupt[] = {
        "",
        "garbage\n",
        "kiln-autotune-cache 2\n",
        "kiln-autotune-cache 1\nfake\tdev\tver\tcfg\tb\n",
        "kiln-autotune-cache 1\nfake\tdev\tver\tcfg\tb\t1\textra\n",
        "kiln-autotune-cache 1\nfake\tdev\tver\tcfg\tb\tnan\n",
        "kiln-autotune-cache 1\nfake\tdev\tver\tcfg\tb\t-1\n",
        "kiln-autotune-cache 1\nfake\tdev\tver\tcfg\tb\t1ms\n",
        "kiln-autotune-cache 1\nfake\t\tver\tcfg\tb\t1\n",
        "kiln-autotune-cache 1\nfa\x01ke\tdev\tver\tcfg\tb\t1\n",
    };
    kiln_log_set_sink(count_warnings, NULL);
    for (size_t i = 0; i < sizeof corrupt / sizeof corrupt[0]; i++) {
        write_text(path, corrupt[i]);
        three(&f);
        warnings = 0;
        t = kiln_autotuner_create(path, 1, 1);
        CHECK_OK(kiln_autotune_choose(t, &p, &a, NULL, TIMED, true, &ch));
        CHECK(!strcmp(ch.name, "b") && !ch.from_cache);
        CHECK_MSG(warnings == 1, "corrupt file %zu: %d warnings", i, warnings);
        CHECK(strstr(last_warning, "ignored") != NULL);
        kiln_autotune_stats_get(t, &s);
        CHECK(s.load_rejected && s.loaded == 0 && s.entries == 1);
        kiln_autotuner_free(t);
        /* rewritten: the next tuner loads it cleanly */
        warnings = 0;
        t = kiln_autotuner_create(path, 1, 1);
        CHECK_OK(kiln_autotune_choose(t, &p, &a, NULL, TIMED, true, &ch));
        CHECK(ch.from_cache && warnings == 0);
        kiln_autotuner_free(t);
    }
    kiln_log_set_sink(NULL, NULL);
    remove(path);
}

static void test_parse_roundtrip(void) {
    kiln_autotuner *t = kiln_autotuner_create(NULL, 1, 1);
    const char *text = "kiln-autotune-cache 1\n"
                       "p\td\tv\tfwd x=1\tdirect\t0.5\n"
                       "\n"
                       "p\td\tv\tfwd x=2\twinograd\t1e-3\n";
    CHECK_OK(kiln_autotune_parse(t, text, strlen(text)));
    kiln_autotune_stats s;
    kiln_autotune_stats_get(t, &s);
    CHECK_EQ_I(s.entries, 2);
    char *out = kiln_autotune_serialize(t);
    CHECK(out && strstr(out, "p\td\tv\tfwd x=2\twinograd\t0.001\n"));
    kiln_autotuner *u = kiln_autotuner_create(NULL, 1, 1);
    CHECK_OK(kiln_autotune_parse(u, out, out ? strlen(out) : 0));
    kiln_autotune_stats_get(u, &s);
    CHECK_EQ_I(s.entries, 2);
    CHECK_FAILS(kiln_autotune_parse(u, "kiln-autotune-cache 1\nx\n", 24), KILN_ERR_INVALID_ARGUMENT,
                "line 2");
    kiln_autotune_stats_get(u, &s);
    CHECK_EQ_I(s.entries, 0);
    free(out);
    kiln_autotuner_free(t);
    kiln_autotuner_free(u);
}

typedef struct race {
    kiln_autotuner *t;
    const kiln_autotune_provider *p;
    int index;
    kiln_status st;
} race;

static void *race_main(void *arg) {
    race *r = arg;
    kiln_autotune_conv cfg = base_cfg();
    kiln_autotune_choice ch = {.index = -1};
    for (int i = 0; i < 50 && !r->st; i++)
        r->st = kiln_autotune_choose(r->t, r->p, &cfg, NULL, TIMED, true, &ch);
    r->index = ch.index;
    return NULL;
}

static void test_threads(void) {
    fake f;
    three(&f);
    kiln_autotune_provider p = provider_of(&f);
    kiln_autotuner *t = kiln_autotuner_create(NULL, 1, 3);
    race r[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        r[i] = (race){.t = t, .p = &p};
        pthread_create(&th[i], NULL, race_main, &r[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(r[i].st == KILN_OK && r[i].index == 1);
    }
    kiln_autotune_stats s;
    kiln_autotune_stats_get(t, &s);
    CHECK_EQ_I(s.tunings, 1);
    CHECK_EQ_I(s.cache_hits, 4 * 50 - 1);
    kiln_autotuner_free(t);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kiln_test_autotune_XXXXXX");
    if (!mkdtemp(tmpdir)) kt_missing("cannot create a temporary directory under /tmp");
    test_fastest_and_order();
    test_failures_and_workspace();
    test_modes();
    test_memo_identity();
    test_keys();
    test_persistence();
    test_parse_roundtrip();
    test_threads();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmpdir);
    return kt_finish();
}

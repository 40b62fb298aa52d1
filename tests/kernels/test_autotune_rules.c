/* The autotuner's rules as the CUDA fast path (src/kernels/cuda/
 * cudnn_ops_cudnn.c) relies on them, with a scripted fake provider; what
 * test_autotune.c does not already cover:
 *   - deterministic mode obeys the workspace limit too (a deterministic
 *     candidate that needs more than the allocator can give is skipped),
 *     and never starts a timer;
 *   - timing off: a default candidate over the limit gives way to the next
 *     one in the provider's order;
 *   - the modes keep separate picks: a timed (non-deterministic) pick never
 *     answers a deterministic query, and turning deterministic mode off again
 *     finds the timed pick without timing;
 *   - a provider whose candidate listing fails: the error comes back, nothing
 *     is cached, and the next call lists again;
 *   - the limit is read at each new choice (memory freed later lets a
 *     bigger candidate run), while a cached pick stays as it was;
 *   - the cache file: only timed picks are written, one line per
 *     configuration, keyed by provider, device and versions; a second tuner
 *     on the file with another library version times again and keeps both. */
#include <unistd.h>

#include "base/error.h"
#include "kernels/autotune.h"
#include "test_util.h"

typedef struct cand {
    const char *name;
    double ms;
    size_t workspace;
    bool deterministic, is_default;
} cand;

typedef struct fake {
    cand c[4];
    int n;
    size_t limit;
    const char *versions;
    bool fail_listing;
    double clock, started;
    int listings, runs, timers;
} fake;

static void f_identity(void *self, void *ctx, char *device, size_t ds, char *versions, size_t vs) {
    (void)ctx;
    fake *f = self;
    snprintf(device, ds, "Fake H100 80GB sm_90");
    snprintf(versions, vs, "%s", f->versions ? f->versions : "cudnn 91000 cudart 13000");
}

static kiln_status f_candidates(void *self, const kiln_autotune_conv *cfg, void *ctx,
                                kiln_autotune_candidate *out, int max, int *n) {
    (void)cfg, (void)ctx;
    fake *f = self;
    f->listings++;
    *n = 0;
    if (f->fail_listing) return KILN_RAISE(KILN_ERR_DEVICE, NULL, "fake: heuristics query failed");
    for (int i = 0; i < f->n && i < max; i++) {
        memset(&out[i], 0, sizeof out[i]);
        snprintf(out[i].name, sizeof out[i].name, "%s", f->c[i].name);
        out[i].deterministic = f->c[i].deterministic;
        out[i].is_default = f->c[i].is_default;
        *n = i + 1;
    }
    return KILN_OK;
}

static kiln_status f_build(void *self, const kiln_autotune_conv *cfg, void *ctx, int i, size_t *ws) {
    (void)cfg, (void)ctx;
    *ws = ((fake *)self)->c[i].workspace;
    return KILN_OK;
}

static kiln_status f_run(void *self, const kiln_autotune_conv *cfg, void *ctx, int i, void *ws,
                         size_t bytes) {
    (void)cfg, (void)ctx, (void)ws, (void)bytes;
    fake *f = self;
    f->runs++;
    f->clock += f->c[i].ms;
    return KILN_OK;
}

static kiln_status f_start(void *self, void *ctx) {
    (void)ctx;
    fake *f = self;
    f->timers++;
    f->started = f->clock;
    return KILN_OK;
}

static kiln_status f_stop(void *self, void *ctx, double *ms) {
    (void)ctx;
    fake *f = self;
    *ms = f->clock - f->started;
    return KILN_OK;
}

static size_t f_limit(void *self, void *ctx) {
    (void)ctx;
    fake *f = self;
    return f->limit ? f->limit : SIZE_MAX;
}

static kiln_autotune_provider provider(fake *f) {
    return (kiln_autotune_provider){.name = "cudnn",
                                    .self = f,
                                    .identity = f_identity,
                                    .candidates = f_candidates,
                                    .build = f_build,
                                    .run = f_run,
                                    .timer_start = f_start,
                                    .timer_stop = f_stop,
                                    .workspace_limit = f_limit};
}

/* cuDNN-like: the heuristics' first (default) is deterministic but slow;
 * the fastest is not deterministic; a deterministic one needs workspace. */
static void setup(fake *f) {
    memset(f, 0, sizeof *f);
    f->c[0] = (cand){.name = "implicit_gemm/fma", .ms = 4, .deterministic = true, .is_default = true};
    f->c[1] = (cand){.name = "winograd/fma", .ms = 1, .workspace = 4096, .deterministic = true};
    f->c[2] = (cand){.name = "fft/fma", .ms = 0.5, .workspace = 1 << 20, .deterministic = false};
    f->n = 3;
}

static kiln_autotune_conv config(void) {
    return (kiln_autotune_conv){.pass = KILN_AUTOTUNE_CONV_BWD_WEIGHT,
                                .x_dtype = KILN_F16,
                                .w_dtype = KILN_F16,
                                .y_dtype = KILN_F16,
                                .x = {64, 64, 16, 16},
                                .w = {128, 64, 3, 3},
                                .y = {64, 128, 16, 16},
                                .stride = {1, 1},
                                .padding = {1, 1},
                                .dilation = {1, 1},
                                .groups = 1,
                                .layout = "nchw",
                                .math = "f16-acc-f32"};
}

static const kiln_autotune_mode TIMED = {.timing = true};
static const kiln_autotune_mode DEFAULT = {.timing = false};
static const kiln_autotune_mode DETERMINISTIC = {.deterministic = true};

static void test_deterministic_limits(void) {
    fake f;
    setup(&f);
    kiln_autotune_provider p = provider(&f);
    kiln_autotune_conv cfg = config();
    kiln_autotune_choice ch;
    /* implicit_gemm not deterministic here; winograd, the only deterministic
     * one, needs 4096 bytes, over the limit: nothing can run. */
    f.c[0].deterministic = false;
    f.limit = 4000;
    kiln_autotuner *t = kiln_autotuner_create(NULL, 1, 3);
    CHECK_FAILS(kiln_autotune_choose(t, &p, &cfg, NULL, DETERMINISTIC, true, &ch), KILN_ERR_UNSUPPORTED,
                "deterministic mode");
    CHECK(strstr(kiln_error_message(), "winograd/fma: needs 4096 bytes") != NULL);
    CHECK(strstr(kiln_error_message(), "fft/fma: not deterministic") != NULL);
    CHECK_EQ_I(f.timers, 0);
    kiln_autotuner_free(t);
    /* With room: winograd, still without a timer or a run. */
    f.limit = 8192;
    t = kiln_autotuner_create(NULL, 1, 3);
    CHECK_OK(kiln_autotune_choose(t, &p, &cfg, NULL, DETERMINISTIC, true, &ch));
    CHECK(!strcmp(ch.name, "winograd/fma") && ch.ms < 0);
    CHECK(f.timers == 0 && f.runs == 0);
    kiln_autotuner_free(t);
}

static void test_default_over_limit(void) {
    fake f;
    setup(&f);
    kiln_autotune_provider p = provider(&f);
    kiln_autotune_conv cfg = config();
    kiln_autotune_choice ch;
    f.c[0].is_default = false;
    f.c[2].is_default = true; /* the default is fft, 1 MiB */
    f.limit = 1 << 16;
    kiln_autotuner *t = kiln_autotuner_create(NULL, 1, 3);
    CHECK_OK(kiln_autotune_choose(t, &p, &cfg, NULL, DEFAULT, true, &ch));
    CHECK_MSG(!strcmp(ch.name, "implicit_gemm/fma"), "got %s (after the default, wrapping: the first)",
              ch.name);
    CHECK(f.timers == 0 && f.runs == 0);
    kiln_autotuner_free(t);
}

static void test_modes_separate(void) {
    fake f;
    setup(&f);
    kiln_autotune_provider p = provider(&f);
    kiln_autotune_conv cfg = config();
    kiln_autotune_choice ch;
    kiln_autotuner *t = kiln_autotuner_create(NULL, 1, 2);
    CHECK_OK(kiln_autotune_choose(t, &p, &cfg, NULL, TIMED, true, &ch));
    CHECK(!strcmp(ch.name, "fft/fma") && !ch.from_cache);
    int runs = f.runs;
    CHECK_OK(kiln_autotune_choose(t, &p, &cfg, NULL, DETERMINISTIC, true, &ch));
    CHECK_MSG(!strcmp(ch.name, "implicit_gemm/fma"), "deterministic mode got %s", ch.name);
    CHECK_EQ_I(f.runs, runs);
    CHECK_OK(kiln_autotune_choose(t, &p, &cfg, NULL, TIMED, true, &ch));
    CHECK(!strcmp(ch.name, "fft/fma") && ch.from_cache && f.runs == runs);
    CHECK_OK(kiln_autotune_choose(t, &p, &cfg, NULL, DEFAULT, true, &ch));
    CHECK(!strcmp(ch.name, "implicit_gemm/fma"));
    kiln_autotune_stats s;
    kiln_autotune_stats_get(t, &s);
    CHECK_EQ_I(s.tunings, 1);
    kiln_autotuner_free(t);
}

static void test_listing_failure(void) {
    fake f;
    setup(&f);
    kiln_autotune_provider p = provider(&f);
    kiln_autotune_conv cfg = config();
    kiln_autotune_choice ch;
    kiln_autotuner *t = kiln_autotuner_create(NULL, 1, 2);
    f.fail_listing = true;
    CHECK_FAILS(kiln_autotune_choose(t, &p, &cfg, NULL, TIMED, true, &ch), KILN_ERR_DEVICE, "heuristics");
    kiln_autotune_stats s;
    kiln_autotune_stats_get(t, &s);
    CHECK(s.entries == 0 && s.tunings == 0);
    f.fail_listing = false;
    CHECK_OK(kiln_autotune_choose(t, &p, &cfg, NULL, TIMED, true, &ch));
    CHECK(!strcmp(ch.name, "fft/fma") && f.listings == 2);
    kiln_autotuner_free(t);
}

static void test_limit_per_choice(void) {
    fake f;
    setup(&f);
    kiln_autotune_provider p = provider(&f);
    kiln_autotune_conv a = config(), b = config();
    b.x[0] = b.y[0] = 32; /* another batch: another configuration */
    kiln_autotune_choice ch;
    kiln_autotuner *t = kiln_autotuner_create(NULL, 1, 2);
    f.limit = 8192; /* fft does not fit */
    CHECK_OK(kiln_autotune_choose(t, &p, &a, NULL, TIMED, true, &ch));
    CHECK(!strcmp(ch.name, "winograd/fma"));
    f.limit = 0; /* memory freed: no limit now */
    CHECK_OK(kiln_autotune_choose(t, &p, &b, NULL, TIMED, true, &ch));
    CHECK(!strcmp(ch.name, "fft/fma"));
    CHECK_OK(kiln_autotune_choose(t, &p, &a, NULL, TIMED, true, &ch));
    CHECK(!strcmp(ch.name, "winograd/fma") && ch.from_cache); /* a pick stays as made */
    kiln_autotuner_free(t);
}

static int count_lines(const char *text) {
    int n = 0;
    for (; text && *text; text++) n += *text == '\n';
    return n;
}

static void test_file(void) {
    char dir[] = "/tmp/kiln_test_autotune_rules_XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK_MSG(false, "no temporary directory");
        return;
    }
    char path[128];
    snprintf(path, sizeof path, "%s/autotune.txt", dir);
    fake f;
    setup(&f);
    kiln_autotune_provider p = provider(&f);
    kiln_autotune_conv a = config(), b = config();
    b.math = "tf32";
    b.x_dtype = b.w_dtype = b.y_dtype = KILN_F32;
    kiln_autotune_choice ch;
    kiln_autotuner *t = kiln_autotuner_create(path, 1, 2);
    CHECK_OK(kiln_autotune_choose(t, &p, &a, NULL, TIMED, true, &ch));
    CHECK_OK(kiln_autotune_choose(t, &p, &b, NULL, DETERMINISTIC, true, &ch)); /* not written */
    CHECK_OK(kiln_autotune_choose(t, &p, &b, NULL, DEFAULT, true, &ch));       /* not written */
    char *text = kiln_autotune_serialize(t);
    CHECK_MSG(count_lines(text) == 2, "cache text:\n%s", text ? text : "(null)");
    CHECK(text && strstr(text, "cudnn\tFake H100 80GB sm_90\tcudnn 91000 cudart 13000\tbwd_weight") != NULL);
    free(text);
    kiln_autotuner_free(t);
    /* Another library version: timed again, both lines kept. */
    f.versions = "cudnn 91100 cudart 13000";
    int runs = f.runs;
    t = kiln_autotuner_create(path, 1, 2);
    CHECK_OK(kiln_autotune_choose(t, &p, &a, NULL, TIMED, true, &ch));
    CHECK(!ch.from_cache && f.runs > runs);
    kiln_autotune_stats s;
    kiln_autotune_stats_get(t, &s);
    CHECK(s.loaded == 1 && s.entries == 2);
    kiln_autotuner_free(t);
    /* The old version again: answered from the file. */
    f.versions = NULL;
    runs = f.runs;
    t = kiln_autotuner_create(path, 1, 2);
    CHECK_OK(kiln_autotune_choose(t, &p, &a, NULL, TIMED, true, &ch));
    CHECK(ch.from_cache && f.runs == runs && !strcmp(ch.name, "fft/fma"));
    kiln_autotuner_free(t);
    remove(path);
    rmdir(dir);
}

int main(void) {
    test_deterministic_limits();
    test_default_over_limit();
    test_modes_separate();
    test_listing_failure();
    test_limit_per_choice();
    test_file();
    return kt_finish();
}

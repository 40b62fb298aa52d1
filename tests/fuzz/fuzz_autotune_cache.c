/* libFuzzer target for the autotuner's cache file (src/kernels/autotune.c).
 *
 * The input is a cache file's text. It goes through kiln_autotune_parse as
 * the file's bytes do when a tuner loads it; a text that parses must
 * serialise and parse back to the same number of entries (so what the
 * tuner writes it can read), and a choice on a tuner holding those entries
 * must not crash (a cached pick whose name is not a candidate is timed
 * again). Any crash, sanitizer report or leak is a finding; an error
 * return is the expected outcome for most inputs. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/autotune.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void identity(void *self, void *ctx, char *device, size_t ds, char *versions, size_t vs) {
    (void)self, (void)ctx;
    snprintf(device, ds, "fuzz device");
    snprintf(versions, vs, "fuzz 1");
}

static kiln_status candidates(void *self, const kiln_autotune_conv *cfg, void *ctx,
                              kiln_autotune_candidate *out, int max, int *n) {
    (void)self, (void)cfg, (void)ctx;
    static const char *names[] = {"direct", "winograd"};
    *n = 0;
    for (int i = 0; i < 2 && i < max; i++) {
        memset(&out[i], 0, sizeof out[i]);
        snprintf(out[i].name, sizeof out[i].name, "%s", names[i]);
        out[i].deterministic = true;
        out[i].is_default = i == 0;
        *n = i + 1;
    }
    return KILN_OK;
}

static kiln_status build(void *self, const kiln_autotune_conv *cfg, void *ctx, int index, size_t *ws) {
    (void)self, (void)cfg, (void)ctx, (void)index;
    *ws = 0;
    return KILN_OK;
}

static double clock_ms;
static kiln_status run(void *self, const kiln_autotune_conv *cfg, void *ctx, int index, void *ws,
                       size_t bytes) {
    (void)self, (void)cfg, (void)ctx, (void)ws, (void)bytes;
    clock_ms += index + 1;
    return KILN_OK;
}
static double started;
static kiln_status timer_start(void *self, void *ctx) {
    (void)self, (void)ctx;
    started = clock_ms;
    return KILN_OK;
}
static kiln_status timer_stop(void *self, void *ctx, double *ms) {
    (void)self, (void)ctx;
    *ms = clock_ms - started;
    return KILN_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kiln_autotuner *t = kiln_autotuner_create(NULL, 1, 1);
    if (!t) return 0;
    if (kiln_autotune_parse(t, (const char *)data, size) == KILN_OK) {
        kiln_autotune_stats a, b;
        kiln_autotune_stats_get(t, &a);
        char *text = kiln_autotune_serialize(t);
        kiln_autotuner *u = kiln_autotuner_create(NULL, 1, 1);
        if (!text || !u || kiln_autotune_parse(u, text, strlen(text)) != KILN_OK) abort();
        kiln_autotune_stats_get(u, &b);
        if (a.entries != b.entries) abort();
        kiln_autotuner_free(u);
        free(text);
    }
    kiln_autotune_provider p = {.name = "fuzz",
                                .identity = identity,
                                .candidates = candidates,
                                .build = build,
                                .run = run,
                                .timer_start = timer_start,
                                .timer_stop = timer_stop};
    kiln_autotune_conv cfg = {.pass = KILN_AUTOTUNE_CONV_FWD,
                              .x = {1, 1, 4, 4},
                              .w = {1, 1, 3, 3},
                              .y = {1, 1, 4, 4},
                              .stride = {1, 1},
                              .padding = {1, 1},
                              .dilation = {1, 1},
                              .groups = 1,
                              .layout = "nchw",
                              .math = "f32"};
    kiln_autotune_choice ch;
    kiln_autotune_mode timed = {.timing = true};
    if (kiln_autotune_choose(t, &p, &cfg, NULL, timed, true, &ch) != KILN_OK) abort();
    kiln_autotuner_free(t);
    return 0;
}

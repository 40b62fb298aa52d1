/* The convolution autotuner: picks one algorithm per convolution
 * configuration, by timing the candidates a provider offers, and keeps the
 * picks in a file so later runs do not time again. Device-independent: a
 * provider (oneDNN on the CPU, cuDNN on a GPU, a scripted fake in the
 * tests) supplies the candidates and runs and times them.
 *
 * One choice (kiln_autotune_choose):
 *   1. The configuration's key (kiln_autotune_key_format): provider name,
 *      device model, library versions, the pass (forward, backward-data,
 *      backward-weights), dtypes, every shape (batch included), stride,
 *      padding, dilation, groups, bias, layout and math mode. Two
 *      configurations that differ in any of them have different keys.
 *   2. A pick for the key and mode made before (in memory, or loaded from
 *      the cache file) is returned as is.
 *   3. Otherwise the provider lists its candidates, in its own order of
 *      preference. A candidate that fails to build, or needs more workspace
 *      than the provider's allocator can give (its workspace_limit
 *      callback), is skipped.
 *        - deterministic mode (kiln_set_deterministic(true)): only
 *          candidates marked deterministic, and no timing: the first one
 *          that builds and fits;
 *        - timing off (kiln_set_conv_autotune(false) on the CPU,
 *          kiln_set_cudnn_benchmark(false) on CUDA): the provider's default
 *          candidate, or the first usable one after it in the provider's
 *          order when it cannot run;
 *        - timing on: every usable candidate runs on the real shapes
 *          (`warmup` untimed runs, then `repeats` timed ones), the one with
 *          the fastest run wins (on a shared machine noise only ever adds
 *          time, so the minimum is the estimate least disturbed by it);
 *          the pick is cached and the cache file
 *          rewritten.
 *      Timing needs real buffers: a caller that has none (planning on the
 *      meta device) passes can_time = false and gets the cached timed pick
 *      when there is one, else the default, which is then not cached.
 *
 * The cache file is text (docs/performance.md, "Autotuning"): a header line
 * `kiln-autotune-cache 1`, then one line per timed pick with its key
 * (provider, device, versions, configuration), the candidate's name and its
 * fastest run's time. Entries of other devices or library versions are kept when
 * the file is rewritten but never match. A file that does not parse is
 * ignored with one warning line and replaced at the next save. Saves write a
 * temporary file beside it and rename it over the old one.
 *
 * Thread-safe: lookups take a mutex; timing runs are serialised by a second
 * one, so two threads never time at once. */
#ifndef KILN_SRC_KERNELS_AUTOTUNE_H
#define KILN_SRC_KERNELS_AUTOTUNE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/base.h"
#include "kiln/runtime.h"
#include "kiln/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kiln_autotune_pass {
    KILN_AUTOTUNE_CONV_FWD = 0,
    KILN_AUTOTUNE_CONV_BWD_DATA,
    KILN_AUTOTUNE_CONV_BWD_WEIGHT,
} kiln_autotune_pass;

/* One convolution configuration, in forward terms whichever pass it is:
 * x (N, C, H, W), w (O, C/groups, kH, kW), y (N, O, OH, OW). */
typedef struct kiln_autotune_conv {
    kiln_autotune_pass pass;
    kiln_dtype x_dtype, w_dtype, y_dtype;
    int64_t x[4], w[4], y[4];
    int64_t stride[2], padding[2], dilation[2], groups;
    bool bias;
    const char *layout; /* "nchw" */
    const char *math;   /* "f32", "tf32", "f16-acc-f32", ... */
} kiln_autotune_conv;

#define KILN_AUTOTUNE_NAME_MAX       64
#define KILN_AUTOTUNE_MAX_CANDIDATES 32

/* A candidate as the provider lists it. */
typedef struct kiln_autotune_candidate {
    char name[KILN_AUTOTUNE_NAME_MAX]; /* stable across runs: it is what the cache stores */
    bool deterministic;                /* bitwise the same result run to run */
    bool is_default;                   /* the pick when timing is off */
} kiln_autotune_candidate;

/* What a provider does for the tuner. `self` is the provider's state;
 * `ctx` is what the caller passed to kiln_autotune_choose (the op's
 * arguments, say). Every callback but workspace_alloc/free may be called
 * with the tuner's timing mutex held: none may call back into the tuner. */
typedef struct kiln_autotune_provider {
    const char *name; /* "onednn", "cudnn", ... (a key field) */
    void *self;
    /* Device model and library versions for the keys ("Intel Xeon ...",
     * "onednn 2.6.3"); no tabs or newlines (they are replaced). */
    void (*identity)(void *self, void *ctx, char *device, size_t device_size, char *versions,
                     size_t versions_size);
    /* Candidates for cfg, in the provider's order of preference: writes at
     * most `max`, sets *n. */
    kiln_status (*candidates)(void *self, const kiln_autotune_conv *cfg, void *ctx,
                              kiln_autotune_candidate *out, int max, int *n);
    /* Prepare candidate `index` and report its workspace; a failure means
     * the candidate is skipped (its error is not kept). */
    kiln_status (*build)(void *self, const kiln_autotune_conv *cfg, void *ctx, int index,
                         size_t *workspace_bytes);
    /* Run candidate `index` once on ctx's buffers with `workspace`. May be
     * asynchronous: timing brackets runs with timer_start / timer_stop. */
    kiln_status (*run)(void *self, const kiln_autotune_conv *cfg, void *ctx, int index, void *workspace,
                       size_t workspace_bytes);
    /* Start a timer before one run; timer_stop waits for the run and gives
     * the elapsed milliseconds (host clock on the CPU, events on a GPU). */
    kiln_status (*timer_start)(void *self, void *ctx);
    kiln_status (*timer_stop)(void *self, void *ctx, double *ms);
    /* The most workspace the allocator can give now (SIZE_MAX: no limit). */
    size_t (*workspace_limit)(void *self, void *ctx);
    /* Workspace for timing runs (NULL callbacks: runs get none). */
    kiln_status (*workspace_alloc)(void *self, void *ctx, size_t bytes, void **ptr);
    void (*workspace_free)(void *self, void *ctx, void *ptr);
} kiln_autotune_provider;

/* How a choice is made (kiln_autotune_mode_current reads the settings). */
typedef struct kiln_autotune_mode {
    bool timing;        /* time the candidates (benchmark mode) */
    bool deterministic; /* deterministic candidates only; no timing */
} kiln_autotune_mode;

/* The mode the public settings select for convolutions on a device type:
 * CUDA reads kiln_set_cudnn_benchmark, the CPU kiln_set_conv_autotune;
 * both read kiln_set_deterministic. */
kiln_autotune_mode kiln_autotune_mode_current(kiln_device_type type);

/* What `device`'s caching allocator can give now: its free cached bytes
 * plus the device's free memory, capped by the allocator's limit
 * (kiln_memory_set_limit). The workspace_limit of the real providers. */
size_t kiln_autotune_allocator_headroom(kiln_device device);
/* The largest workspace `device`'s caching allocator can surely give now:
 * its free cached bytes, or a request whose new segment fits under the
 * limit and the device's free memory. A request that takes a new segment
 * takes a whole one (2 MiB for up to 1 MiB, 20 MiB for up to 10 MiB), so
 * under a tight limit a 2 MiB workspace can fail where the headroom says
 * it fits. The CPU (oneDNN) provider's workspace_limit. */
size_t kiln_autotune_allocator_fit(kiln_device device);

/* The pick. */
typedef struct kiln_autotune_choice {
    int index; /* into the provider's candidate list */
    char name[KILN_AUTOTUNE_NAME_MAX];
    double ms;       /* fastest timed run of the pick; < 0 when it was not timed */
    bool from_cache; /* made before (memory or file), nothing ran now */
} kiln_autotune_choice;

typedef struct kiln_autotuner kiln_autotuner;

/* A tuner whose cache file is `cache_path` (NULL or "": memory only). The
 * file is read at the first choice. `warmup` untimed and `repeats` timed
 * runs per candidate (<= 0: 1 and 5; at most 64 timed). The caller frees it with
 * kiln_autotuner_free. NULL with an error when out of memory. */
kiln_autotuner *kiln_autotuner_create(const char *cache_path, int warmup, int repeats);
void kiln_autotuner_free(kiln_autotuner *t);

/* The process-wide tuner the kernels use, created on first use with the
 * cache file named by KILN_AUTOTUNE_CACHE ("off" or empty: memory only),
 * else $XDG_CACHE_HOME/kiln/autotune.txt, else ~/.cache/kiln/autotune.txt.
 * kiln_autotune_global_free frees it (kiln_shutdown); the next use creates
 * it again. */
kiln_autotuner *kiln_autotune_global(void);
void kiln_autotune_global_free(void);

/* A count that changes whenever any tuner's entries do (an entry added,
 * overwritten or removed, a cache parsed or cleared, a tuner freed):
 * kiln_autotune_choose's per-thread memo of untimed answers is dropped
 * when it moves. */
uint64_t kiln_autotune_generation(void);

/* Choose a candidate for cfg (module comment). Blocks the host while it
 * times. Fails when no candidate can run (the message names the
 * configuration and each candidate's reason), or when the provider fails. */
kiln_status kiln_autotune_choose(kiln_autotuner *t, const kiln_autotune_provider *p,
                                 const kiln_autotune_conv *cfg, void *ctx, kiln_autotune_mode mode,
                                 bool can_time, kiln_autotune_choice *out);

/* The configuration part of a key ("fwd x=128x3x32x32 w=...") into buf;
 * the provider, device and versions are the key's other fields. */
void kiln_autotune_key_format(const kiln_autotune_conv *cfg, char *buf, size_t size);

/* What the tuner has done since it was created. */
typedef struct kiln_autotune_stats {
    int64_t tunings;    /* configurations timed */
    int64_t timed_runs; /* candidate runs timed (warm-up runs excluded) */
    int64_t cache_hits; /* choices answered from a timed pick made before */
    int64_t entries;    /* timed picks held (file entries of other devices included) */
    int64_t loaded;     /* entries read from the cache file */
    int64_t saves;      /* cache file writes */
    bool load_rejected; /* the cache file was there but did not parse */
} kiln_autotune_stats;
void kiln_autotune_stats_get(kiln_autotuner *t, kiln_autotune_stats *out);

/* Replace the tuner's entries with the cache file text `text` (len bytes,
 * need not be NUL-terminated). A text that does not parse leaves no entry
 * and returns KILN_ERR_INVALID_ARGUMENT naming the line. The fuzz target
 * calls it directly. */
kiln_status kiln_autotune_parse(kiln_autotuner *t, const char *text, size_t len);
/* The cache file text of the tuner's entries; the caller frees it. */
char *kiln_autotune_serialize(kiln_autotuner *t);

#ifdef __cplusplus
}
#endif
#endif

/* Memory history and snapshots (kiln_memory_record_history,
 * kiln_memory_snapshot): the snapshot parses; replaying its baseline and
 * trace gives the allocator's statistics exactly (allocated, requested,
 * reserved, allocations and segments: current, peak, totals; raw
 * allocations and frees, OOMs) after a training step, frees, a
 * record_stream free, empty_cache, an OOM, statistics resets and a ring
 * wrap; live blocks name the op and the user's line that allocated them;
 * the same on the meta device's simulated allocator. */
#include <errno.h>
#include <stdarg.h>
#include <unistd.h>

#include "diag/json.h"
#include "test_util.h"

/* ---- Replay: an independent restatement of the allocator's updates ---------------- */

enum { S_ALLOC_B, S_REQ_B, S_RES_B, S_ALLOCS, S_SEGS, S_ACTIVE, S_ACTIVE_B, S_N };
static const char *const snames[S_N] = {"allocated_bytes", "requested_bytes", "reserved_bytes", "allocation",
                                        "segment",         "active",          "active_bytes"};

typedef struct rstate {
    int64_t cur[S_N][2], tot[S_N][2], peak[S_N][3];
    int64_t dev_alloc, dev_free, ooms;
} rstate;

static bool load_state(const cJSON *j, rstate *s) {
    memset(s, 0, sizeof *s);
    if (!j) return false;
    static const char *const pools[3] = {"large", "small", "all"};
    for (int st = 0; st < S_N; st++) {
        for (int p = 0; p < 3; p++) {
            const cJSON *o = kiln_json_path(j, snames[st], pools[p], NULL);
            if (!o) return false;
            if (p < 2) {
                s->cur[st][p] = kiln_json_int(kiln_json_get(o, "current"), -1);
                s->tot[st][p] = kiln_json_int(kiln_json_get(o, "allocated"), -1);
            }
            s->peak[st][p] = kiln_json_int(kiln_json_get(o, "peak"), 0);
        }
    }
    s->dev_alloc = kiln_json_int(kiln_json_get(j, "num_device_alloc"), -1);
    s->dev_free = kiln_json_int(kiln_json_get(j, "num_device_free"), -1);
    s->ooms = kiln_json_int(kiln_json_get(j, "num_ooms"), -1);
    return true;
}

static void inc(rstate *s, int st, int p, int64_t n) {
    s->cur[st][p] += n;
    s->tot[st][p] += n;
    if (s->cur[st][p] > s->peak[st][p]) s->peak[st][p] = s->cur[st][p];
    if (s->cur[st][0] + s->cur[st][1] > s->peak[st][2]) s->peak[st][2] = s->cur[st][0] + s->cur[st][1];
}

typedef struct replay_out {
    rstate s;
    size_t n_events, n_alloc, n_free_req, n_free_done, n_seg_alloc, n_seg_free, n_oom, n_with_site;
    int64_t first_seq, last_seq;
    bool seq_ok;
} replay_out;

static bool replay(const cJSON *root, replay_out *r) {
    memset(r, 0, sizeof *r);
    if (!load_state(kiln_json_path(root, "history", "baseline", NULL), &r->s)) return false;
    const cJSON *trace = kiln_json_at(kiln_json_get(root, "device_traces"), 0);
    if (!cJSON_IsArray(trace)) return false;
    r->seq_ok = true;
    const cJSON *e;
    size_t i = 0;
    cJSON_ArrayForEach(e, trace) {
        const char *act = kiln_json_string(kiln_json_get(e, "action"), "?");
        int p = strcmp(kiln_json_string(kiln_json_get(e, "pool"), "?"), "small") == 0;
        int64_t size = kiln_json_int(kiln_json_get(e, "size"), 0);
        int64_t req = kiln_json_int(kiln_json_get(e, "requested_size"), 0);
        int64_t seq = kiln_json_int(kiln_json_get(e, "seq"), -1);
        if (i++ == 0)
            r->first_seq = seq;
        else if (seq != r->last_seq + 1)
            r->seq_ok = false;
        r->last_seq = seq;
        if (kiln_json_get(e, "frames")) r->n_with_site++;
        r->n_events++;
        rstate *s = &r->s;
        if (!strcmp(act, "alloc")) {
            r->n_alloc++;
            inc(s, S_ALLOCS, p, 1), inc(s, S_ALLOC_B, p, size), inc(s, S_REQ_B, p, req);
            inc(s, S_ACTIVE, p, 1), inc(s, S_ACTIVE_B, p, size);
        } else if (!strcmp(act, "free_requested")) {
            r->n_free_req++;
            s->cur[S_ALLOCS][p]--, s->cur[S_ALLOC_B][p] -= size;
        } else if (!strcmp(act, "free_completed")) {
            r->n_free_done++;
            s->cur[S_REQ_B][p] -= req, s->cur[S_ACTIVE][p]--, s->cur[S_ACTIVE_B][p] -= size;
        } else if (!strcmp(act, "segment_alloc")) {
            r->n_seg_alloc++;
            inc(s, S_SEGS, p, 1), inc(s, S_RES_B, p, size), s->dev_alloc++;
        } else if (!strcmp(act, "segment_free")) {
            r->n_seg_free++;
            s->cur[S_SEGS][p]--, s->cur[S_RES_B][p] -= size, s->dev_free++;
        } else if (!strcmp(act, "oom")) {
            r->n_oom++;
            s->ooms++;
        } else if (!strcmp(act, "reset_peak")) {
            for (int st = 0; st < S_N; st++) {
                s->peak[st][0] = s->cur[st][0], s->peak[st][1] = s->cur[st][1];
                s->peak[st][2] = s->cur[st][0] + s->cur[st][1];
            }
        } else if (!strcmp(act, "reset_accumulated")) {
            memset(s->tot, 0, sizeof s->tot);
            s->dev_alloc = s->dev_free = s->ooms = 0;
        } else {
            return false;
        }
    }
    return true;
}

/* The replayed state against kiln_memory_stats_get, field by field. */
static void check_against_stats(kiln_device d, const rstate *s, const char *what) {
    kiln_memory_stats ms;
    CHECK_OK(kiln_memory_stats_get(d, &ms));
    const kiln_stat *arrs[S_N] = {ms.allocated_bytes, ms.requested_bytes, ms.reserved_bytes, ms.allocation,
                                  ms.segment,         ms.active,          ms.active_bytes};
    for (int st = 0; st < S_N; st++) {
        const kiln_stat *a = arrs[st];
        bool active = st == S_ACTIVE || st == S_ACTIVE_B;
        for (int p = 0; p < 2; p++) {
            const kiln_stat *x = &a[KILN_POOL_LARGE + p];
            CHECK_MSG(s->cur[st][p] == x->current, "%s: %s[%s].current replayed %lld, allocator %lld", what,
                      snames[st], p ? "small" : "large", (long long)s->cur[st][p], (long long)x->current);
            CHECK_MSG(s->tot[st][p] == x->allocated, "%s: %s[%s].allocated replayed %lld, allocator %lld",
                      what, snames[st], p ? "small" : "large", (long long)s->tot[st][p],
                      (long long)x->allocated);
            if (!active)
                CHECK_MSG(s->peak[st][p] == x->peak, "%s: %s[%s].peak replayed %lld, allocator %lld", what,
                          snames[st], p ? "small" : "large", (long long)s->peak[st][p], (long long)x->peak);
        }
        if (!active)
            CHECK_MSG(s->peak[st][2] == a[KILN_POOL_ALL].peak,
                      "%s: %s[all].peak replayed %lld, allocator %lld", what, snames[st],
                      (long long)s->peak[st][2], (long long)a[KILN_POOL_ALL].peak);
        CHECK_MSG(s->cur[st][0] + s->cur[st][1] == a[KILN_POOL_ALL].current, "%s: %s[all].current", what,
                  snames[st]);
    }
    CHECK_MSG(s->dev_alloc == ms.num_device_alloc, "%s: num_device_alloc replayed %lld, allocator %lld", what,
              (long long)s->dev_alloc, (long long)ms.num_device_alloc);
    CHECK_MSG(s->dev_free == ms.num_device_free, "%s: num_device_free replayed %lld, allocator %lld", what,
              (long long)s->dev_free, (long long)ms.num_device_free);
    CHECK_MSG(s->ooms == ms.num_ooms, "%s: num_ooms replayed %lld, allocator %lld", what, (long long)s->ooms,
              (long long)ms.num_ooms);
}

static cJSON *snapshot(kiln_device d, const char *path) {
    CHECK_OK(kiln_memory_snapshot(d, path));
    size_t len = 0;
    char *text = kiln_json_read_file(path, &len);
    CHECK_MSG(text != NULL, "cannot read %s", path);
    char err[128];
    cJSON *root = kiln_json_parse(text, len, err, sizeof err);
    CHECK_MSG(root != NULL, "%s does not parse: %s", path, err);
    free(text);
    return root;
}

/* Snapshot, parse, replay, compare; returns the replay's counts. */
static replay_out snapshot_and_replay(kiln_device d, const char *path, const char *what) {
    replay_out r;
    memset(&r, 0, sizeof r);
    cJSON *root = snapshot(d, path);
    if (!root) return r;
    CHECK_MSG(replay(root, &r), "%s: the trace does not replay (unknown action or missing baseline)", what);
    CHECK_MSG(r.seq_ok, "%s: trace sequence numbers are not consecutive", what);
    check_against_stats(d, &r.s, what);
    /* The snapshot's own "stats" agree with the API's too. */
    rstate now;
    CHECK(load_state(kiln_json_get(root, "stats"), &now));
    check_against_stats(d, &now, "snapshot stats");
    cJSON_Delete(root);
    return r;
}

/* A live block of the snapshot at `addr` and its first frame (or NULL). */
static const cJSON *find_block(const cJSON *root, uint64_t addr, const cJSON **frame) {
    const cJSON *segs = kiln_json_get(root, "segments");
    const cJSON *seg;
    cJSON_ArrayForEach(seg, segs) {
        uint64_t base = (uint64_t)kiln_json_int(kiln_json_get(seg, "address"), 0);
        const cJSON *blocks = kiln_json_get(seg, "blocks");
        const cJSON *b;
        cJSON_ArrayForEach(b, blocks) {
            uint64_t a = (uint64_t)kiln_json_int(kiln_json_get(b, "address"), 0);
            CHECK(a - base == (uint64_t)kiln_json_int(kiln_json_get(b, "offset"), -1));
            if (a != addr) continue;
            *frame = kiln_json_at(kiln_json_get(b, "frames"), 0);
            return b;
        }
    }
    *frame = NULL;
    return NULL;
}

static bool frame_is(const cJSON *f, const char *op, int line) {
    const char *file = kiln_json_string(kiln_json_get(f, "filename"), "");
    const char *name = kiln_json_string(kiln_json_get(f, "name"), "");
    return f && strstr(file, "test_memory_history.c") &&
           kiln_json_int(kiln_json_get(f, "line"), -1) == line && (!op || !strcmp(name, op));
}

/* ---- Scenarios ------------------------------------------------------------------ */

static int linear_line, relu_line;

/* One SGD step of a two-layer MLP on `d`; returns the hidden activation
 * (kept alive for the site check) through *hidden. */
static void train_step(kiln_device d, kiln_optimizer *opt, kiln_tensor *w1, kiln_tensor *w2,
                       kiln_tensor **hidden) {
    kiln_tensor *x = kiln_randn(KILN_SHAPE(64, 256), KILN_F32, d);
    kiln_tensor *y = kiln_randn(KILN_SHAPE(64, 10), KILN_F32, d);
    CHECK_OK(kiln_optimizer_zero_grad(opt, true));
    linear_line = __LINE__ + 1;
    kiln_tensor *h = kiln_linear(x, w1, NULL);
    relu_line = __LINE__ + 1;
    kiln_tensor *a = kiln_relu(h);
    kiln_tensor *out = kiln_linear(a, w2, NULL);
    kiln_tensor *loss = kiln_mse_loss(out, y, KILN_LOSS_MEAN);
    CHECK(loss != NULL);
    CHECK_OK(kiln_backward(loss, NULL, false));
    CHECK_OK(kiln_optimizer_step(opt));
    *hidden = a;
    kiln_release(x), kiln_release(y), kiln_release(h), kiln_release(out), kiln_release(loss);
}

static void scenario(kiln_device d, const char *tag) {
    char path[256];
    snprintf(path, sizeof path, "test_memory_history_%s_%d.json", tag, (int)getpid());
    bool real = d.type != KILN_DEVICE_META;

    /* Memory from before the history: the baseline must carry it. */
    kiln_tensor *before = kiln_zeros(KILN_SHAPE(1000, 300), KILN_F32, d);
    void *raw_before = NULL;
    CHECK_OK(kiln_memory_alloc(d, 5000, NULL, &raw_before));
    CHECK(!kiln_memory_history_enabled(d));
    CHECK_OK(kiln_memory_record_history(d, true, 0));
    CHECK(kiln_memory_history_enabled(d));

    kiln_tensor *w1 = kiln_randn(KILN_SHAPE(128, 256), KILN_F32, d);
    kiln_tensor *w2 = kiln_randn(KILN_SHAPE(10, 128), KILN_F32, d);
    CHECK_OK(kiln_set_requires_grad(w1, true));
    CHECK_OK(kiln_set_requires_grad(w2, true));
    kiln_tensor *params[2] = {w1, w2};
    kiln_sgd_opts so = kiln_sgd_defaults(0.01);
    so.momentum = 0.9;
    kiln_optimizer *opt = kiln_sgd(params, 2, &so);
    CHECK(opt != NULL);
    kiln_tensor *hidden = NULL, *hidden2 = NULL;
    train_step(d, opt, w1, w2, &hidden);
    train_step(d, opt, w1, w2, &hidden2);
    replay_out r = snapshot_and_replay(d, path, tag);
    CHECK_MSG(r.n_alloc > 10 && r.n_free_req > 5, "%s: %zu allocs, %zu frees", tag, r.n_alloc, r.n_free_req);
    CHECK_EQ_I(r.n_free_req, r.n_free_done);
    CHECK_EQ_I(r.first_seq, 0);
    CHECK_MSG(r.n_with_site > 0, "%s: no event names a site", tag);

    /* Live blocks: the hidden activation (allocated by the relu at
     * relu_line), an older block without a context. */
    cJSON *root = snapshot(d, path);
    const cJSON *frame = NULL;
    if (real) {
        const cJSON *b = find_block(root, (uint64_t)(uintptr_t)kiln_data_ptr(hidden2), &frame);
        CHECK_MSG(b != NULL, "%s: the live activation's block is not in the snapshot", tag);
        CHECK_MSG(frame_is(frame, "relu", relu_line),
                  "%s: the activation's block does not name relu at line %d", tag, relu_line);
        CHECK(!strcmp(kiln_json_string(kiln_json_get(b, "state"), ""), "active_allocated"));
        b = find_block(root, (uint64_t)(uintptr_t)kiln_data_ptr(before), &frame);
        CHECK_MSG(b != NULL && frame == NULL, "%s: a block from before the history has a site", tag);
    }
    /* On every device: some live block names relu at relu_line, and the
     * trace has an alloc by linear at linear_line. */
    bool relu_live = false, linear_traced = false;
    const cJSON *segs = kiln_json_get(root, "segments");
    const cJSON *seg, *b, *e;
    cJSON_ArrayForEach(seg, segs) {
        const cJSON *blocks = kiln_json_get(seg, "blocks");
        cJSON_ArrayForEach(b, blocks) relu_live |=
            frame_is(kiln_json_at(kiln_json_get(b, "frames"), 0), "relu", relu_line);
    }
    const cJSON *trace = kiln_json_at(kiln_json_get(root, "device_traces"), 0);
    cJSON_ArrayForEach(e, trace) {
        if (strcmp(kiln_json_string(kiln_json_get(e, "action"), ""), "alloc")) continue;
        const cJSON *f = kiln_json_at(kiln_json_get(e, "frames"), 0);
        linear_traced |= frame_is(f, NULL, linear_line);
    }
    CHECK_MSG(relu_live, "%s: no live block names relu at line %d", tag, relu_line);
    CHECK_MSG(linear_traced, "%s: no alloc event names line %d", tag, linear_line);
    CHECK(!strcmp(kiln_json_string(kiln_json_get(root, "device"), ""), tag));
    cJSON_Delete(root);

    /* Frees, a block used on a second stream (freed after its event),
     * statistics resets, empty_cache. */
    kiln_release(hidden);
    kiln_release(before);
    CHECK_OK(kiln_memory_free(d, raw_before));
    kiln_stream *side = NULL;
    CHECK_OK(kiln_stream_create(d, 0, &side));
    void *shared = NULL;
    CHECK_OK(kiln_memory_alloc(d, 3 << 20, NULL, &shared));
    CHECK_OK(kiln_memory_record_stream(d, shared, side));
    CHECK_OK(kiln_memory_free(d, shared));
    void *later = NULL;
    CHECK_OK(kiln_memory_alloc(d, 700, NULL, &later)); /* polls the side stream's event */
    CHECK_OK(kiln_memory_reset_peak(d));
    CHECK_OK(kiln_memory_free(d, later));
    CHECK_OK(kiln_empty_cache(d));
    CHECK_OK(kiln_memory_reset_accumulated(d));
    kiln_tensor *again = kiln_ones(KILN_SHAPE(3, 1 << 20), KILN_F32, d);
    r = snapshot_and_replay(d, path, tag);
    CHECK(r.n_seg_free >= 1 && r.n_seg_alloc >= 1);

    /* An OOM under a limit: recorded, and counted the same. */
    CHECK_OK(kiln_memory_set_limit(d, (size_t)64 << 20));
    void *huge = NULL;
    CHECK_FAILS(kiln_memory_alloc(d, (size_t)512 << 20, NULL, &huge), KILN_ERR_OUT_OF_MEMORY,
                "out of memory");
    CHECK_OK(kiln_memory_set_limit(d, 0));
    r = snapshot_and_replay(d, path, tag);
    CHECK_EQ_I(r.n_oom, 1);

    /* A small ring: old entries fold into the baseline, the replay still
     * agrees, and the trace keeps the newest max_entries. */
    CHECK_OK(kiln_memory_record_history(d, true, 16));
    for (int i = 0; i < 40; i++) {
        void *p = NULL;
        CHECK_OK(kiln_memory_alloc(d, (size_t)(i + 1) * 1000, NULL, &p));
        if (i % 3 == 0) CHECK_OK(kiln_memory_record_stream(d, p, side));
        CHECK_OK(kiln_memory_free(d, p));
    }
    kiln_tensor *tail = kiln_zeros(KILN_SHAPE(5000), KILN_F32, d);
    r = snapshot_and_replay(d, path, tag);
    CHECK_EQ_I(r.n_events, 16);
    CHECK(r.first_seq > 0);
    root = snapshot(d, path);
    CHECK(kiln_json_int(kiln_json_path(root, "history", "dropped", NULL), -1) ==
          kiln_json_int(kiln_json_path(root, "history", "recorded", NULL), -2) - 16);
    cJSON_Delete(root);

    /* Off: the trace is gone; the snapshot still lists the segments. */
    CHECK_OK(kiln_memory_record_history(d, false, 0));
    CHECK(!kiln_memory_history_enabled(d));
    root = snapshot(d, path);
    CHECK(kiln_json_path(root, "history", "enabled", NULL) &&
          cJSON_IsFalse(kiln_json_path(root, "history", "enabled", NULL)));
    CHECK_EQ_I(cJSON_GetArraySize(kiln_json_at(kiln_json_get(root, "device_traces"), 0)), 0);
    CHECK(cJSON_GetArraySize(kiln_json_get(root, "segments")) >= 1);
    cJSON_Delete(root);

    kiln_release(tail), kiln_release(again), kiln_release(hidden2);
    kiln_optimizer_free(opt);
    kiln_release(w1), kiln_release(w2);
    CHECK_OK(kiln_stream_destroy(side));
    unlink(path);
}

int main(void) {
    if (kiln_init() != KILN_OK) {
        fprintf(stderr, "kiln_init: %s\n", kiln_error_message());
        return 1;
    }
    scenario(KILN_CPU, "cpu");
    scenario(KILN_META, "meta");

    /* Bad arguments are named. */
    CHECK_FAILS(kiln_memory_snapshot(KILN_CPU, "/proc/kiln_no_such_dir/x.json"), KILN_ERR_IO, "cannot write");
    CHECK_FAILS(kiln_memory_snapshot(KILN_CPU, NULL), KILN_ERR_INVALID_ARGUMENT, "path");
    CHECK_FAILS(kiln_memory_record_history(KILN_CPU, true, SIZE_MAX), KILN_ERR_INVALID_ARGUMENT, "too large");
    kiln_shutdown();
    return kt_finish();
}

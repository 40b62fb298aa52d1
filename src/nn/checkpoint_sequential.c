/* Gradient checkpointing of a Sequential in segments (kiln/nn.h). */
#include <string.h>

#include <stdlib.h>

#include "autograd/autograd_internal.h"
#include "base/error.h"
#include "nn/module_internal.h"
#include "runtime/runtime_internal.h"
#include "tensor/tensor_internal.h"

static bool is_sequential(const kiln_module *m) {
    return m && !m->user_forward && m->kind && strcmp(m->kind, "Sequential") == 0;
}


/* Children [begin, end) of the Sequential (with its layer fusion): the
 * checkpointed function. */
static kiln_status run_segment(void *ctx, int n_in, kiln_tensor *const *in, int n_out, kiln_tensor **out) {
    (void)n_in, (void)n_out;
    const struct kiln_checkpoint_segment *s = ctx;
    kiln_tensor *h = kiln_nn_sequential_run(s->seq, s->begin, s->end, in[0]);
    if (!h) return kiln_error_last()->status ? kiln_error_last()->status : KILN_ERR_OUT_OF_MEMORY;
    out[0] = h;
    return KILN_OK;
}

static bool kind_is(kiln_module *seq, int i, const char *kind) {
    kiln_module *c = i >= 0 && i < seq->children.n ? seq->children.items[i].u.child : NULL;
    return c && !c->user_forward && c->kind && strcmp(c->kind, kind) == 0;
}

/* A boundary before child b would split a run the Sequential fuses into
 * one op (fusion.c: conv+relu[+maxpool], [flatten+]linear[+relu]): the
 * segments would then compute those layers unfused, with other rounding
 * than the plain forward. */
static bool splits_fused_run(kiln_module *seq, int b) {
    return (kind_is(seq, b - 1, "Conv2d") && kind_is(seq, b, "ReLU")) ||
           (kind_is(seq, b - 2, "Conv2d") && kind_is(seq, b - 1, "ReLU") && kind_is(seq, b, "MaxPool2d")) ||
           (kind_is(seq, b - 1, "Flatten") && kind_is(seq, b, "Linear")) ||
           (kind_is(seq, b - 1, "Linear") && kind_is(seq, b, "ReLU"));
}

/* Checkpointing a placed Sequential (kiln_nn_sequential_place) is refused. */
static kiln_status placed(const char *fn, const kiln_module *seq) {
    return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "remove the placement (kiln_nn_sequential_place(seq, 0, ...)) first",
                      "%s: the Sequential is placed on devices in %d stages; checkpointing a placed Sequential is "
                      "not supported",
                      fn, seq->cfg.place_stages);
}

static kiln_status not_sequential(const char *fn, const kiln_module *seq) {
    return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "checkpoint a Sequential (kiln_nn_sequential, a model spec)",
                      "%s: the module is %s, not a Sequential", fn, seq ? kiln_module_kind(seq) : "NULL");
}

/* Starts of `segments` segments of nearly equal layer counts: segment k
 * starts near child k*n/segments, moved forward past a fused run (so there
 * may be fewer). Returns their count. */
static int even_starts(kiln_module *seq, int segments, int *start) {
    int n = seq->children.n, count = 0;
    for (int k = 0; k < segments; k++) {
        int b = (int)((int64_t)k * n / segments);
        while (b > 0 && b < n && splits_fused_run(seq, b)) b++;
        if (b < n && (count == 0 || b > start[count - 1])) start[count++] = b;
    }
    return count;
}

kiln_status kiln_nn_sequential_set_checkpoint(kiln_module *seq, int segments) {
    if (!is_sequential(seq)) return not_sequential("kiln_nn_sequential_set_checkpoint", seq);
    if (segments > 1 && seq->cfg.place_stages > 0) return placed("kiln_nn_sequential_set_checkpoint", seq);
    int n = seq->children.n;
    if (segments < 0 || segments > KILN_NN_MAX_CHECKPOINT_SEGMENTS || (segments > 1 && segments > n))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use 0 or 1 (off) up to the number of layers",
                          "kiln_nn_sequential_set_checkpoint: %d segments for a Sequential of %d layers (at most "
                          "%d segments, and at most one per layer)",
                          segments, n, KILN_NN_MAX_CHECKPOINT_SEGMENTS);
    int start[KILN_NN_MAX_CHECKPOINT_SEGMENTS];
    int count = segments > 1 ? even_starts(seq, segments, start) : 0;
    seq->cfg.checkpoint_segments = count > 1 ? count : 0;
    memcpy(seq->cfg.checkpoint_start, start, sizeof(int) * (size_t)(count > 1 ? count : 0));
    return KILN_OK;
}

kiln_status kiln_nn_sequential_set_checkpoint_starts(kiln_module *seq, int count, const int *starts) {
    const char *fn = "kiln_nn_sequential_set_checkpoint_starts";
    if (!is_sequential(seq)) return not_sequential(fn, seq);
    if (count > 1 && seq->cfg.place_stages > 0) return placed(fn, seq);
    int n = seq->children.n;
    if (count < 0 || count > KILN_NN_MAX_CHECKPOINT_SEGMENTS || (count > 0 && !starts))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass 0 (off) or up to KILN_NN_MAX_CHECKPOINT_SEGMENTS starts",
                          "%s: %d segments (at most %d)", fn, count, KILN_NN_MAX_CHECKPOINT_SEGMENTS);
    for (int k = 0; k < count; k++) {
        int b = starts[k];
        if ((k == 0 && b != 0) || (k > 0 && (b <= starts[k - 1] || b >= n)))
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                              "the first segment starts at child 0, the others at increasing children below the count",
                              "%s: segment %d starts at child %d of a Sequential of %d layers%s", fn, k, b, n,
                              k == 0 ? " (the first must start at 0)" : "");
        if (k > 0 && splits_fused_run(seq, b))
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "start the segment after the fused run",
                              "%s: a segment starting at child %d splits layers the Sequential runs as one fused op "
                              "(conv+relu[+maxpool], [flatten+]linear[+relu]); start it a child later",
                              fn, b);
    }
    seq->cfg.checkpoint_segments = count > 1 ? count : 0;
    if (count > 1) memcpy(seq->cfg.checkpoint_start, starts, sizeof(int) * (size_t)count);
    return KILN_OK;
}

int kiln_nn_sequential_checkpoint_segments(const kiln_module *seq) {
    return is_sequential(seq) ? seq->cfg.checkpoint_segments : 0;
}

int kiln_nn_sequential_checkpoint_starts(const kiln_module *seq, int *starts, int cap) {
    int count = kiln_nn_sequential_checkpoint_segments(seq);
    for (int k = 0; k < count && k < cap && starts; k++) starts[k] = seq->cfg.checkpoint_start[k];
    return count;
}

/* All but the last segment are checkpointed (the last one's activations
 * are needed at once by the backward, so recomputing them would save
 * nothing). */
kiln_tensor *kiln_sequential_checkpoint_forward(kiln_module *m, kiln_tensor *x) {
    int n = m->children.n, segs = m->cfg.checkpoint_segments;
    for (int k = 0; k < segs; k++)
        m->cfg.segment[k] = (struct kiln_checkpoint_segment){m, m->cfg.checkpoint_start[k],
                                                            k + 1 < segs ? m->cfg.checkpoint_start[k + 1] : n};
    kiln_tensor *h = kiln_retain(x);
    for (int k = 0; h && k < segs; k++) {
        struct kiln_checkpoint_segment *s = &m->cfg.segment[k];
        kiln_tensor *next = NULL;
        if (k + 1 < segs) {
            if (kiln_checkpoint(run_segment, s, 1, &h, 1, &next) != KILN_OK) next = NULL;
            kiln_tensor_drop(h);
        } else { /* the input goes as soon as the segment's first layer has run */
            next = kiln_nn_sequential_run_take(m, s->begin, s->end, h);
        }
        h = next;
    }
    return h;
}

/* ---- Segments placed by memory ---------------------------------------------------------- */

/* The Sequential body of a residual block (a built-in layer with a
 * Sequential child "body" of two layers or more), or NULL. */
static kiln_module *residual_body(kiln_module *layer) {
    if (!layer || layer->user_forward) return NULL;
    kiln_module *b = kiln_module_child(layer, "body");
    return is_sequential(b) && b->children.n >= 2 ? b : NULL;
}

/* The allocator's allocated bytes on `dev` now. */
static kiln_status allocated_now(kiln_device dev, int64_t *bytes) {
    kiln_memory_stats s;
    KILN_TRY(kiln_memory_stats_get(dev, &s));
    *bytes = s.allocated_bytes[KILN_POOL_ALL].current;
    return KILN_OK;
}

/* What the first of a body's two segments (kiln_nn_sequential_set_checkpoint
 * (body, 2)) keeps and outputs, run on x with grad mode on; freed after. */
static kiln_status probe_half(kiln_module *body, kiln_tensor *x, kiln_device dev, int64_t *kept, int64_t *out) {
    int start[2];
    int split = even_starts(body, 2, start) == 2 ? start[1] : body->children.n;
    int64_t before = 0, after = 0;
    KILN_TRY(allocated_now(dev, &before));
    kiln_tensor *h = kiln_nn_sequential_run(body, 0, split, x);
    if (!h) return kiln_error_last()->status ? kiln_error_last()->status : KILN_ERR_OUT_OF_MEMORY;
    kiln_status st = allocated_now(dev, &after);
    *kept = after - before;
    *out = kiln_numel(h) * (int64_t)kiln_dtype_size(kiln_dtype_of(h));
    kiln_tensor_drop(h);
    return st;
}

/* One forward of sample through seq, unit by unit (a unit: a child, or a
 * run of children the Sequential fuses), with grad mode on: grown[u] is
 * what unit u added to the allocated bytes (its output and what it saved
 * for backward, less the input it let go), out[u] its output's bytes,
 * units[u] its first child; for a unit that is one residual block,
 * half_kept[u] and half_out[u] are those of its body's first half (the
 * segment a split body checkpoints), else 0.
 * Running statistics and generators are left as they were. */
static kiln_status probe(kiln_module *seq, kiln_tensor *sample, int *units, int64_t *grown, int64_t *out,
                         int64_t *half_kept, int64_t *half_out, int *n_units) {
    int n = seq->children.n, count = 0;
    for (int b = 0; b < n; b++)
        if (b == 0 || !splits_fused_run(seq, b)) units[count++] = b;
    *n_units = count;
    kiln_device dev = kiln_get_device(sample), cpu = {KILN_DEVICE_CPU, 0};
    kiln_rng rng_dev = kiln_device_rng_reserve(dev, 0), rng_cpu = kiln_device_rng_reserve(cpu, 0);
    kiln_checkpoint_probe_begin();
    kiln_enable_grad_begin();
    kiln_status st = KILN_OK;
    kiln_tensor *h = kiln_retain(sample);
    int64_t before = 0, after = 0;
    st = allocated_now(dev, &before);
    for (int u = 0; u < count && !st; u++) {
        int end = u + 1 < count ? units[u + 1] : n;
        half_kept[u] = half_out[u] = 0;
        kiln_module *body = end == units[u] + 1 ? residual_body(seq->children.items[units[u]].u.child) : NULL;
        if (body) st = probe_half(body, h, dev, &half_kept[u], &half_out[u]);
        if (!st) st = allocated_now(dev, &before);
        if (st) break;
        h = kiln_nn_sequential_run_take(seq, units[u], end, h);
        if (!h) st = kiln_error_last()->status ? kiln_error_last()->status : KILN_ERR_OUT_OF_MEMORY;
        if (!st) st = allocated_now(dev, &after);
        grown[u] = after - before;
        out[u] = h ? kiln_numel(h) * (int64_t)kiln_dtype_size(kiln_dtype_of(h)) : 0;
        before = after;
    }
    if (h) kiln_tensor_drop(h);
    kiln_grad_mode_end();
    kiln_checkpoint_probe_end();
    kiln_device_rng_set(dev, rng_dev);
    kiln_device_rng_set(cpu, rng_cpu);
    return st;
}

/* ---- Placing the segments -----------------------------------------------------------------
 *
 * From the probe: per unit u, grown[u] (bytes it keeps: output and saved
 * tensors) and out[u] (its output's bytes). For segments starting at units
 * cut[0] = 0 < cut[1] < ... < cut[K-1], the step's peak is estimated as the
 * larger of
 *   - each checkpointed segment k's backward: the outputs of the segments
 *     before it (the inputs still held) + the gradient of its own output +
 *     what it keeps when recomputed (a lone residual block, whose body
 *     is split when that keeps less: the larger of its two phases) + one
 *     more gradient of its largest output's size in flight (ReLU's
 *     backward and the sums of two branches reuse the incoming gradient's
 *     buffer, docs/architecture.md);
 *   - the last segment's backward: the checkpointed segments' outputs +
 *     what the last segment keeps + one gradient in flight.
 * The plan with the lowest estimate wins, ties going to the lowest sum of
 * the terms (every placement is tried while
 * there are at most PLACE_MAX_TRIES; beyond, segments start where the
 * current one would pass 1/K of the kept bytes). */
#define PLACE_MAX_TRIES 1000000

typedef struct placement {
    int n, k;
    const int64_t *out, *prefix; /* prefix[u] = grown[0] + ... + grown[u-1] */
    const int64_t *half_kept, *half_out;
    int cut[KILN_NN_MAX_CHECKPOINT_SEGMENTS], best_cut[KILN_NN_MAX_CHECKPOINT_SEGMENTS];
    int64_t best, best_sum;
} placement;

static int64_t max_out(const placement *p, int a, int b) {
    int64_t m = 0;
    for (int u = a; u < b; u++) m = p->out[u] > m ? p->out[u] : m;
    return m;
}

/* What lone residual unit a keeps while its backward recomputes it with
 * its body split: the larger of the two phases (the body's first half
 * only as its output, then that half recomputed). */
static int64_t split_kept(const placement *p, int a) {
    int64_t kept = p->prefix[a + 1] - p->prefix[a];
    int64_t second = kept - p->half_kept[a] + p->half_out[a], first = p->half_kept[a];
    return second > first ? second : first;
}

/* Whether checkpointed segment [a, b) is one residual block whose body is
 * split (needs_split). */
static bool splits(const placement *p, int a, int b) {
    return b == a + 1 && p->half_out[a] && split_kept(p, a) < p->prefix[b] - p->prefix[a];
}

/* What checkpointed segment [a, b) keeps while its backward recomputes
 * it: all of it, or for a split residual block, its larger phase. */
static int64_t recompute_kept(const placement *p, int a, int b) {
    return splits(p, a, b) ? split_kept(p, a) : p->prefix[b] - p->prefix[a];
}

/* The plan's estimated peak; *sum gets the sum of its terms (the tie-break). */
static int64_t estimate(const placement *p, int64_t *sum) {
    int64_t held = 0, peak = 0;
    *sum = 0;
    for (int j = 0; j < p->k; j++) {
        int a = p->cut[j], b = j + 1 < p->k ? p->cut[j + 1] : p->n;
        int64_t flight = max_out(p, a, b);
        int64_t here = j + 1 < p->k ? held + p->out[b - 1] + recompute_kept(p, a, b) + flight
                                    : held + p->prefix[b] - p->prefix[a] + flight;
        peak = here > peak ? here : peak;
        *sum += here;
        held += p->out[b - 1];
    }
    return peak;
}

static void try_all(placement *p, int j) {
    if (j == p->k) {
        int64_t sum = 0, e = estimate(p, &sum);
        if (e < p->best || (e == p->best && sum < p->best_sum)) {
            p->best = e, p->best_sum = sum;
            memcpy(p->best_cut, p->cut, sizeof(int) * (size_t)p->k);
        }
        return;
    }
    for (int u = p->cut[j - 1] + 1; u <= p->n - (p->k - j); u++) {
        p->cut[j] = u;
        try_all(p, j + 1);
    }
}

/* C(n, r), saturating above PLACE_MAX_TRIES. */
static double tries(int n, int r) {
    double c = 1;
    for (int i = 1; i <= r && c <= PLACE_MAX_TRIES; i++) c = c * (double)(n - r + i) / (double)i;
    return c;
}

/* Whether checkpointed segment k of the chosen plan (not the last) is a
 * lone residual block whose body is split: whenever its recompute would
 * keep less so, at the cost of one more forward of the body's first half.
 * Judged by the segment's own backward, not by the plan's estimated peak,
 * whose terms are too coarse to rank two blocks' backwards: on the small
 * ResNet at batch 512 in 4 segments the estimate ranked the first block's
 * above the second's, so the second stayed whole, and the planned step
 * peaked in its backward at 720.8 MiB (658.6 MiB split; docs/memory.md). */
static bool needs_split(const placement *p, int k) {
    int a = p->cut[k], b = k + 1 < p->k ? p->cut[k + 1] : p->n;
    return k + 1 < p->k && splits(p, a, b);
}

/* The segments' first units into cut, and for each whether its body is
 * split (nest); returns their count, -1 without memory. */
static int place(int n, const int64_t *grown, const int64_t *out, const int64_t *half_kept, const int64_t *half_out,
                 int k, int *cut, bool *nest) {
    int64_t *prefix = malloc(sizeof(int64_t) * (size_t)(n + 1));
    if (!prefix) return -1;
    prefix[0] = 0;
    for (int u = 0; u < n; u++) prefix[u + 1] = prefix[u] + grown[u];
    placement p = {.n = n,
                   .k = k,
                   .out = out,
                   .prefix = prefix,
                   .half_kept = half_kept,
                   .half_out = half_out,
                   .best = INT64_MAX,
                   .best_sum = INT64_MAX};
    p.cut[0] = 0;
    if (tries(n - 1, k - 1) <= PLACE_MAX_TRIES) {
        try_all(&p, 1);
        memcpy(cut, p.best_cut, sizeof(int) * (size_t)k);
        memcpy(p.cut, p.best_cut, sizeof(int) * (size_t)k);
        for (int j = 0; j < k; j++) nest[j] = needs_split(&p, j);
        free(prefix);
        return k;
    }
    int64_t total = 0, share = 0;
    for (int u = 0; u < n; u++) total += grown[u] > 0 ? grown[u] : 0;
    int count = 1, first = 0;
    cut[0] = 0;
    for (int u = 0; u < n; u++) {
        int64_t g = grown[u] > 0 ? grown[u] : 0;
        if (u > first && count < k && (share + g) * k > total) cut[count++] = u, first = u, share = 0;
        share += g;
    }
    p.k = count;
    memcpy(p.cut, cut, sizeof(int) * (size_t)count);
    for (int j = 0; j < count; j++) nest[j] = needs_split(&p, j);
    free(prefix);
    return count;
}

kiln_status kiln_nn_sequential_checkpoint_by_memory(kiln_module *seq, kiln_tensor *sample, int segments,
                                                    int64_t *layer_bytes) {
    const char *fn = "kiln_nn_sequential_checkpoint_by_memory";
    if (!is_sequential(seq)) return not_sequential(fn, seq);
    KILN_TRY(kiln_tensor_check(sample, fn));
    int n = seq->children.n;
    if (segments < 0 || segments > KILN_NN_MAX_CHECKPOINT_SEGMENTS || (segments > 1 && segments > n))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use 0 or 1 (off) up to the number of layers",
                          "%s: %d segments for a Sequential of %d layers (at most %d segments, and at most one "
                          "per layer)",
                          fn, segments, n, KILN_NN_MAX_CHECKPOINT_SEGMENTS);
    for (int i = 0; i < n; i++) { /* bodies this call checkpointed before */
        kiln_module *body = residual_body(seq->children.items[i].u.child);
        if (body) body->cfg.checkpoint_segments = 0;
    }
    seq->cfg.checkpoint_segments = 0;
    if (segments <= 1 && !layer_bytes) return KILN_OK; /* off: nothing to measure */
    int *units = malloc(sizeof(int) * (size_t)(n ? n : 1));
    size_t cells = (size_t)(n ? n : 1);
    int64_t *grown = malloc(sizeof(int64_t) * 4 * cells), *out = grown ? grown + cells : NULL;
    int64_t *half_kept = grown ? grown + 2 * cells : NULL, *half_out = grown ? grown + 3 * cells : NULL;
    if (!units || !grown) {
        free(units), free(grown);
        return KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "%s: no memory for %d layers", fn, n);
    }
    int n_units = 0;
    /* Three times, the last measured: the forwards before it make what a
     * model keeps from its first forwards on (the kernels' prepared weight
     * copies, kernels/op_args.h; a lazy one from the second call at one
     * version), so the placement is the same for a fresh model (kiln
     * plan's) and one that has already run (kiln train's, after its
     * one-image check), and counts no copy as a layer's activations. With
     * two, linear_act's lazy copy of fc1 (2.25 MiB) was measured as the
     * classifier's, and the 28x28x1 CNN at batch 128 in 2 segments was cut
     * after layer 9, not 3: 40.69 MiB planned and measured, not 31.87. */
    kiln_status st = KILN_OK;
    for (int round = 0; round < 3 && !st; round++)
        st = probe(seq, sample, units, grown, out, half_kept, half_out, &n_units);
    if (!st && layer_bytes) {
        for (int i = 0; i < n; i++) layer_bytes[i] = 0;
        for (int u = 0; u < n_units; u++) layer_bytes[units[u]] = grown[u];
    }
    if (!st && segments > 1 && n_units > 1) {
        int cut[KILN_NN_MAX_CHECKPOINT_SEGMENTS], start[KILN_NN_MAX_CHECKPOINT_SEGMENTS];
        bool nest[KILN_NN_MAX_CHECKPOINT_SEGMENTS] = {false};
        int count =
            place(n_units, grown, out, half_kept, half_out, segments < n_units ? segments : n_units, cut, nest);
        if (count < 0) {
            st = KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "%s: no memory to place segments", fn);
            count = 0;
        }
        for (int k = 0; k < count; k++) start[k] = units[cut[k]];
        seq->cfg.checkpoint_segments = count > 1 ? count : 0;
        memcpy(seq->cfg.checkpoint_start, start, sizeof(int) * (size_t)count);
        /* A checkpointed segment of one residual block whose recompute
         * would hold too much of the block at once: its body is split too. */
        for (int k = 0; count > 1 && k + 1 < count && !st; k++) {
            kiln_module *body = nest[k] ? residual_body(seq->children.items[start[k]].u.child) : NULL;
            if (body) st = kiln_nn_sequential_set_checkpoint(body, 2);
        }
    }
    free(units), free(grown);
    return st;
}

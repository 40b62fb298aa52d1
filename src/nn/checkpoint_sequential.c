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

static kiln_status not_sequential(const char *fn, const kiln_module *seq) {
    return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "checkpoint a Sequential (kiln_nn_sequential, a model spec)",
                      "%s: the module is %s, not a Sequential", fn, seq ? kiln_module_kind(seq) : "NULL");
}

/* Segment k starts near child k*n/S, moved forward past a fused run. */
kiln_status kiln_nn_sequential_set_checkpoint(kiln_module *seq, int segments) {
    if (!is_sequential(seq)) return not_sequential("kiln_nn_sequential_set_checkpoint", seq);
    int n = seq->children.n;
    if (segments < 0 || segments > KILN_NN_MAX_CHECKPOINT_SEGMENTS || (segments > 1 && segments > n))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use 0 or 1 (off) up to the number of layers",
                          "kiln_nn_sequential_set_checkpoint: %d segments for a Sequential of %d layers (at most "
                          "%d segments, and at most one per layer)",
                          segments, n, KILN_NN_MAX_CHECKPOINT_SEGMENTS);
    int start[KILN_NN_MAX_CHECKPOINT_SEGMENTS], count = 0;
    for (int k = 0; segments > 1 && k < segments; k++) {
        int b = (int)((int64_t)k * n / segments);
        while (b > 0 && b < n && splits_fused_run(seq, b)) b++;
        if (b < n && (count == 0 || b > start[count - 1])) start[count++] = b;
    }
    seq->cfg.checkpoint_segments = count > 1 ? count : 0;
    memcpy(seq->cfg.checkpoint_start, start, sizeof(int) * (size_t)(count > 1 ? count : 0));
    return KILN_OK;
}

kiln_status kiln_nn_sequential_set_checkpoint_starts(kiln_module *seq, int count, const int *starts) {
    const char *fn = "kiln_nn_sequential_set_checkpoint_starts";
    if (!is_sequential(seq)) return not_sequential(fn, seq);
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

/* One forward of sample through seq, unit by unit (a unit: a child, or a
 * run of children the Sequential fuses), with grad mode on: grown[u] is
 * what unit u added to the allocated bytes (its output and what it saved
 * for backward, less the input it let go), units[u] its first child.
 * Running statistics and generators are left as they were. */
static kiln_status probe(kiln_module *seq, kiln_tensor *sample, int *units, int64_t *grown, int *n_units) {
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
        h = kiln_nn_sequential_run_take(seq, units[u], end, h);
        if (!h) st = kiln_error_last()->status ? kiln_error_last()->status : KILN_ERR_OUT_OF_MEMORY;
        if (!st) st = allocated_now(dev, &after);
        grown[u] = after - before;
        before = after;
    }
    if (h) kiln_tensor_drop(h);
    kiln_grad_mode_end();
    kiln_checkpoint_probe_end();
    kiln_device_rng_set(dev, rng_dev);
    kiln_device_rng_set(cpu, rng_cpu);
    return st;
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
    int *units = malloc(sizeof(int) * (size_t)(n ? n : 1));
    int64_t *grown = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    if (!units || !grown) {
        free(units), free(grown);
        return KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "%s: no memory for %d layers", fn, n);
    }
    int n_units = 0;
    kiln_status st = probe(seq, sample, units, grown, &n_units);
    if (!st && layer_bytes) {
        for (int i = 0; i < n; i++) layer_bytes[i] = 0;
        for (int u = 0; u < n_units; u++) layer_bytes[units[u]] = grown[u];
    }
    if (!st && segments > 1) {
        /* A new segment starts before the unit that would carry the current
         * one past 1/segments of the whole (a segment has at least one unit;
         * the last one takes what is left). */
        int64_t total = 0;
        for (int u = 0; u < n_units; u++) total += grown[u] > 0 ? grown[u] : 0;
        int start[KILN_NN_MAX_CHECKPOINT_SEGMENTS], count = 1, first = 0;
        int64_t share = 0;
        start[0] = 0;
        for (int u = 0; u < n_units; u++) {
            int64_t g = grown[u] > 0 ? grown[u] : 0;
            if (u > first && count < segments && (share + g) * segments > total) {
                start[count++] = units[u];
                first = u;
                share = 0;
            }
            share += g;
        }
        seq->cfg.checkpoint_segments = count > 1 ? count : 0;
        memcpy(seq->cfg.checkpoint_start, start, sizeof(int) * (size_t)count);
        /* A checkpointed segment of one residual block: its recompute holds
         * the whole block's activations unless the body is split too. */
        for (int k = 0; count > 1 && k + 1 < count; k++) {
            if (start[k + 1] - start[k] != 1) continue;
            kiln_module *body = residual_body(seq->children.items[start[k]].u.child);
            if (body) st = kiln_nn_sequential_set_checkpoint(body, 2);
        }
    }
    free(units), free(grown);
    return st;
}

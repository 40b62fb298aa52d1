/* Gradient checkpointing of a Sequential in segments (kiln/nn.h). */
#include <string.h>

#include "base/error.h"
#include "nn/module_internal.h"
#include "tensor/tensor_internal.h"

static bool is_sequential(const kiln_module *m) {
    return m && !m->user_forward && m->kind && strcmp(m->kind, "Sequential") == 0;
}

kiln_status kiln_nn_sequential_set_checkpoint(kiln_module *seq, int segments) {
    if (!is_sequential(seq))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "checkpoint a Sequential (kiln_nn_sequential, a model spec)",
                          "kiln_nn_sequential_set_checkpoint: the module is %s, not a Sequential",
                          seq ? kiln_module_kind(seq) : "NULL");
    int n = seq->children.n;
    if (segments < 0 || segments > KILN_NN_MAX_CHECKPOINT_SEGMENTS || (segments > 1 && segments > n))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use 0 or 1 (off) up to the number of layers",
                          "kiln_nn_sequential_set_checkpoint: %d segments for a Sequential of %d layers (at most "
                          "%d segments, and at most one per layer)",
                          segments, n, KILN_NN_MAX_CHECKPOINT_SEGMENTS);
    seq->cfg.checkpoint_segments = segments > 1 ? segments : 0;
    return KILN_OK;
}

int kiln_nn_sequential_checkpoint_segments(const kiln_module *seq) {
    return is_sequential(seq) ? seq->cfg.checkpoint_segments : 0;
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

/* Segment k starts near child k*n/S, moved forward past a fused run; all
 * but the last are checkpointed (the last one's activations are needed at
 * once by the backward, so recomputing them would save nothing). */
kiln_tensor *kiln_sequential_checkpoint_forward(kiln_module *m, kiln_tensor *x) {
    int n = m->children.n, want = m->cfg.checkpoint_segments < n ? m->cfg.checkpoint_segments : n, segs = 0;
    int prev = 0;
    for (int k = 0; k < want; k++) {
        int end = (int)((int64_t)(k + 1) * n / want);
        while (end < n && splits_fused_run(m, end)) end++;
        if (end <= prev) continue;
        m->cfg.segment[segs++] = (struct kiln_checkpoint_segment){m, prev, end};
        prev = end;
    }
    kiln_tensor *h = kiln_retain(x);
    for (int k = 0; h && k < segs; k++) {
        struct kiln_checkpoint_segment *s = &m->cfg.segment[k];
        kiln_tensor *next = NULL;
        if (k + 1 < segs) {
            if (kiln_checkpoint(run_segment, s, 1, &h, 1, &next) != KILN_OK) next = NULL;
        } else if (run_segment(s, 1, &h, 1, &next) != KILN_OK) {
            next = NULL;
        }
        kiln_tensor_drop(h);
        h = next;
    }
    return h;
}

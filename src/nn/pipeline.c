/* Model parallelism with a pipelined schedule (GPipe's, the "split size"
 * schedule of PyTorch's model-parallel tutorial): the stages live on their
 * devices; forward splits the batch into micro-batches and runs each
 * through the stages in turn, moving the activations with kiln_to (which
 * autograd records, so backward returns each gradient to its stage's
 * device). The host only queues work: device 0 computes micro-batch k+1
 * while device 1 computes micro-batch k. The outputs are concatenated on
 * the last stage's device; backward runs the micro-batches' graphs and the
 * parameters' gradients sum over them. */
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "nn/module_internal.h"
#include "tensor/tensor_internal.h"

#define PIPELINE_MAX_MICRO_BATCHES 16 /* kiln_cat's limit */
#define PIPELINE_MAX_STAGES 64

/* The device of a module's first parameter or buffer, depth first; false
 * when it holds none (relu, pooling: the activation stays where it is). */
static bool module_device(const kiln_module *m, kiln_device *out) {
    const kiln_module_slots *sets[2] = {&m->params, &m->buffers};
    for (int k = 0; k < 2; k++) {
        if (sets[k]->n) {
            *out = kiln_get_device(sets[k]->items[0].u.tensor);
            return true;
        }
    }
    for (int i = 0; i < m->children.n; i++)
        if (module_device(m->children.items[i].u.child, out)) return true;
    return false;
}

/* h (taken) moved to dev; NULL on failure. */
static kiln_tensor *move_to(kiln_tensor *h, kiln_device dev) {
    if (kiln_device_equal(dev, kiln_get_device(h))) return h;
    kiln_tensor *moved = kiln_to(h, dev, kiln_dtype_of(h), 0);
    kiln_tensor_drop(h);
    return moved;
}

/* Micro-batch x through every stage: a new reference, or NULL. */
static kiln_tensor *run_stages(kiln_module *m, kiln_tensor *x) {
    kiln_tensor *h = kiln_retain(x);
    for (int s = 0; s < m->children.n && h; s++) {
        kiln_module *stage = m->children.items[s].u.child;
        kiln_device dev;
        if (module_device(stage, &dev) && !(h = move_to(h, dev))) return NULL;
        kiln_tensor *y = kiln_module_forward(stage, h);
        kiln_tensor_drop(h);
        h = y;
    }
    return h;
}

/* Micro-batch x through a placed Sequential's stages. */
static kiln_tensor *run_placed(kiln_module *m, kiln_tensor *x) {
    kiln_tensor *h = kiln_retain(x);
    for (int s = 0; s < m->cfg.place_stages && h; s++) {
        int begin = m->cfg.place_start[s];
        int end = s + 1 < m->cfg.place_stages ? m->cfg.place_start[s + 1] : m->children.n;
        kiln_device dev;
        bool found = false;
        for (int c = begin; c < end && !found; c++) found = module_device(m->children.items[c].u.child, &dev);
        if (found && !(h = move_to(h, dev))) return NULL;
        h = kiln_nn_sequential_run_take(m, begin, end, h);
    }
    return h;
}

/* GPipe's schedule: x split along dim 0 into m->cfg.micro_batches, each
 * run through the stages by `run`, the outputs concatenated. */
static kiln_tensor *pipelined(kiln_module *m, kiln_tensor *x, const char *what,
                              kiln_tensor *(*run)(kiln_module *, kiln_tensor *)) {
    if (kiln_tensor_check(x, what)) return NULL;
    if (x->ndim < 1) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass a batch: dim 0 is split into micro-batches",
                   "%s: the input is a scalar", what);
        return NULL;
    }
    int64_t n = x->shape[0];
    int k = m->cfg.micro_batches;
    if (n < k) k = n > 0 ? (int)n : 1;
    if (k == 1) return run(m, x);
    kiln_tensor *outs[PIPELINE_MAX_MICRO_BATCHES] = {NULL};
    kiln_tensor *y = NULL;
    int j = 0;
    for (; j < k; j++) {
        int64_t start, len;
        kiln_nn_batch_chunk(n, k, j, &start, &len);
        kiln_tensor *xj = kiln_narrow(x, 0, start, len);
        outs[j] = xj ? run(m, xj) : NULL;
        if (xj) kiln_tensor_drop(xj);
        if (!outs[j]) break;
    }
    if (j == k) y = kiln_cat(k, outs, 0);
    for (int i = 0; i < k; i++)
        if (outs[i]) kiln_tensor_drop(outs[i]);
    return y;
}

static kiln_tensor *pipeline_forward(kiln_module *m, kiln_tensor *x) { return pipelined(m, x, "Pipeline", run_stages); }

kiln_tensor *kiln_nn_placed_forward(kiln_module *m, kiln_tensor *x) {
    return pipelined(m, x, "Sequential (placed)", run_placed);
}

static bool is_sequential(const kiln_module *m) {
    return m && !m->user_forward && m->kind && strcmp(m->kind, "Sequential") == 0;
}

kiln_status kiln_nn_sequential_place(kiln_module *seq, int n, const int *first, const kiln_device *devices,
                                     int micro_batches) {
    const char *bad = NULL;
    int bad_index = -1;
    if (!is_sequential(seq)) bad = "the module is not a Sequential (kiln_nn_sequential, a model spec)";
    else if (n == 0) {
        seq->cfg.place_stages = 0;
        seq->spans_devices = false;
        return KILN_OK;
    } else if (n < 0 || n > KILN_NN_MAX_PLACE_STAGES || !first || !devices)
        bad = "give 1..64 stages with their first layers and devices";
    else if (micro_batches < 1 || micro_batches > PIPELINE_MAX_MICRO_BATCHES) bad = "micro_batches must be 1..16";
    else if (seq->cfg.checkpoint_segments > 1)
        bad = "the Sequential is checkpointed (turn it off with kiln_nn_sequential_set_checkpoint(seq, 0))";
    else if (first[0] != 0) bad = "the first stage must start at layer 0";
    for (int i = 1; !bad && i < n; i++)
        if (first[i] <= first[i - 1] || first[i] >= seq->children.n) {
            bad = "the stages' first layers must increase and stay below the number of layers";
            bad_index = i;
        }
    for (int i = 0; !bad && i < n; i++)
        if (!kiln_device_is_available(devices[i]) || devices[i].type == KILN_DEVICE_META) {
            bad = "a stage's device is not available";
            bad_index = i;
        }
    if (bad) {
        if (bad_index < 0)
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "see kiln_nn_sequential_place in kiln/nn.h",
                              "kiln_nn_sequential_place: %s", bad);
        char dev[32];
        kiln_device_str(devices[bad_index], dev, sizeof dev);
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "see kiln_nn_sequential_place in kiln/nn.h",
                          "kiln_nn_sequential_place: %s (stage %d: layer %d on %s; the Sequential has %d layers)", bad,
                          bad_index, first[bad_index], dev, seq->children.n);
    }
    for (int i = 0; i < n; i++) {
        int end = i + 1 < n ? first[i + 1] : seq->children.n;
        for (int c = first[i]; c < end; c++) KILN_TRY(kiln_module_to(seq->children.items[c].u.child, devices[i]));
    }
    seq->cfg.place_stages = n;
    seq->spans_devices = true;
    memcpy(seq->cfg.place_start, first, sizeof(int) * (size_t)n);
    seq->cfg.micro_batches = micro_batches;
    return KILN_OK;
}

int kiln_nn_sequential_placement(const kiln_module *seq, int *first, int cap, int *micro_batches) {
    int n = is_sequential(seq) ? seq->cfg.place_stages : 0;
    for (int i = 0; i < n && i < cap && first; i++) first[i] = seq->cfg.place_start[i];
    if (micro_batches) *micro_batches = n ? seq->cfg.micro_batches : 0;
    return n;
}

kiln_module *kiln_nn_pipeline(int n, kiln_module *const *stages, const kiln_device *devices, int micro_batches) {
    const char *bad = NULL;
    if (n < 1 || n > PIPELINE_MAX_STAGES || !stages) bad = "the stage count must be 1..64, with the stages given";
    else if (micro_batches < 1 || micro_batches > PIPELINE_MAX_MICRO_BATCHES) bad = "micro_batches must be 1..16";
    for (int i = 0; !bad && i < n; i++)
        if (!stages[i]) bad = "a stage is NULL (check its constructor's error)";
    for (int i = 0; !bad && devices && i < n; i++)
        if (!kiln_device_is_available(devices[i])) bad = "a stage's device is not available";
    kiln_module *m = bad ? NULL : kiln_module_new("Pipeline", pipeline_forward);
    if (!bad && !m) bad = "out of host memory";
    kiln_status st = KILN_OK;
    for (int i = 0; i < n && stages; i++) {
        if (bad || st) {
            kiln_module_free(stages[i]);
            continue;
        }
        if (devices && (st = kiln_module_to(stages[i], devices[i]))) {
            kiln_module_free(stages[i]);
            continue;
        }
        char name[24];
        snprintf(name, sizeof name, "%d", i);
        st = kiln_module_add_child(m, name, stages[i]);
    }
    if (bad) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "see kiln_nn_pipeline in kiln/nn.h",
                   "kiln_nn_pipeline: %s (stages %d, micro_batches %d)", bad, n, micro_batches);
        kiln_module_free(m);
        return NULL;
    }
    if (st) {
        kiln_module_free(m);
        return NULL;
    }
    m->cfg.micro_batches = micro_batches;
    m->spans_devices = true;
    return m;
}

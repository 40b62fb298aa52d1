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

/* Micro-batch x through every stage: a new reference, or NULL. */
static kiln_tensor *run_stages(kiln_module *m, kiln_tensor *x) {
    kiln_tensor *h = kiln_retain(x);
    for (int s = 0; s < m->children.n && h; s++) {
        kiln_module *stage = m->children.items[s].u.child;
        kiln_device dev;
        if (module_device(stage, &dev) && !kiln_device_equal(dev, kiln_get_device(h))) {
            kiln_tensor *moved = kiln_to(h, dev, kiln_dtype_of(h), 0);
            kiln_tensor_drop(h);
            if (!(h = moved)) return NULL;
        }
        kiln_tensor *y = kiln_module_forward(stage, h);
        kiln_tensor_drop(h);
        h = y;
    }
    return h;
}

static kiln_tensor *pipeline_forward(kiln_module *m, kiln_tensor *x) {
    if (kiln_tensor_check(x, "Pipeline")) return NULL;
    if (x->ndim < 1) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass a batch: dim 0 is split into micro-batches",
                   "Pipeline: the input is a scalar");
        return NULL;
    }
    int64_t n = x->shape[0];
    int k = m->cfg.micro_batches;
    if (n < k) k = n > 0 ? (int)n : 1;
    if (k == 1) return run_stages(m, x);
    kiln_tensor *outs[PIPELINE_MAX_MICRO_BATCHES] = {NULL};
    kiln_tensor *y = NULL;
    int j = 0;
    for (; j < k; j++) {
        int64_t start, len;
        kiln_nn_batch_chunk(n, k, j, &start, &len);
        kiln_tensor *xj = kiln_narrow(x, 0, start, len);
        outs[j] = xj ? run_stages(m, xj) : NULL;
        if (xj) kiln_tensor_drop(xj);
        if (!outs[j]) break;
    }
    if (j == k) y = kiln_cat(k, outs, 0);
    for (int i = 0; i < k; i++)
        if (outs[i]) kiln_tensor_drop(outs[i]);
    return y;
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
    return m;
}

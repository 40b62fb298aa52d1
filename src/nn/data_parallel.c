/* DataParallel (PyTorch's nn.DataParallel): one process, several devices.
 * The master module lives on devices[0]. Each forward
 *   1. scatters the input along dim 0 (uneven splits allowed: the first
 *      n % k chunks get one more sample), with kiln_to;
 *   2. brings each replica's parameters up to date: a kiln_to of the
 *      master's parameter, recorded by autograd, so backward returns every
 *      replica's gradient to the master's device, where the leaf sums them
 *      (the reduce); buffers are copied from the master when its version
 *      changed. Without grad mode a replica's copies are kept while the
 *      master's versions are unchanged, so inference copies once per update;
 *   3. runs the replicas: device 0 runs the master itself; the others run
 *      persistent replicas (the module's structure cloned once);
 *   4. gathers the outputs on output_device with kiln_to and kiln_cat.
 * The work is queued from the calling thread: each device runs its share
 * asynchronously on its own stream, so the devices compute concurrently
 * (there is no host thread per device). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "nn/module_internal.h"
#include "tensor/tensor_internal.h"

#define DP_MAX_DEVICES 16 /* kiln_cat's limit */

typedef struct dp_state {
    int n;
    kiln_device devices[DP_MAX_DEVICES];
    kiln_device output;
    kiln_module *replicas[DP_MAX_DEVICES]; /* [0] NULL: the master runs there */
} dp_state;

static void dp_free(void *p) {
    dp_state *s = p;
    if (!s) return;
    for (int i = 0; i < s->n; i++) kiln_module_free(s->replicas[i]);
    free(s);
}

/* The master's structure with no-grad copies of its tensors on `dev`. */
static kiln_module *clone_on(const kiln_module *m, kiln_device dev) {
    kiln_module *r = kiln_module_new(m->kind, m->forward);
    if (!r) return NULL;
    if (m->kind_owned) {
        char *k = malloc(strlen(m->kind) + 1);
        if (!k) {
            kiln_module_free(r);
            return NULL;
        }
        strcpy(k, m->kind);
        r->kind = k, r->kind_owned = true;
    }
    r->training = m->training, r->keep_f32 = m->keep_f32, r->cfg = m->cfg;
    r->user_forward = m->user_forward, r->user = m->user;
    /* The master's version of each parameter and buffer at the last copy. */
    r->state = calloc((size_t)(m->params.n + m->buffers.n) + 1, sizeof(uint64_t));
    r->free_state = free;
    kiln_status st = r->state ? KILN_OK : KILN_ERR_OUT_OF_MEMORY;
    for (int k = 0; k < 2 && !st; k++) {
        const kiln_module_slots *set = k == 0 ? &m->params : &m->buffers;
        for (int i = 0; i < set->n && !st; i++) {
            kiln_tensor *t = set->items[i].u.tensor;
            kiln_tensor *c = kiln_to(t, dev, kiln_dtype_of(t), KILN_COPY);
            if (!c) {
                st = kiln_error_last()->status;
                break;
            }
            ((uint64_t *)r->state)[(k == 0 ? 0 : m->params.n) + i] = kiln_tensor_version(t);
            st = k == 0 ? kiln_module_add_parameter(r, set->items[i].name, c)
                        : kiln_module_add_buffer(r, set->items[i].name, c);
            kiln_tensor_drop(c);
        }
    }
    for (int i = 0; i < m->children.n && !st; i++) {
        kiln_module *c = clone_on(m->children.items[i].u.child, dev);
        st = c ? kiln_module_add_child(r, m->children.items[i].name, c) : kiln_error_last()->status;
    }
    if (st) {
        kiln_module_free(r);
        return NULL;
    }
    return r;
}

/* Replica r (same structure as m) brought up to date: parameters as
 * recorded copies of the master's under grad mode (else refreshed only
 * when the master's version moved), buffers when their version moved;
 * the mode follows the master's. */
static kiln_status refresh(const kiln_module *m, kiln_module *r, kiln_device dev) {
    r->training = m->training;
    bool grad = kiln_is_grad_enabled();
    for (int k = 0; k < 2; k++) {
        const kiln_module_slots *set = k == 0 ? &m->params : &m->buffers;
        kiln_module_slots *rset = k == 0 ? &r->params : &r->buffers;
        for (int i = 0; i < set->n; i++) {
            kiln_tensor *t = set->items[i].u.tensor, **slot = &rset->items[i].u.tensor;
            uint64_t *seen = &((uint64_t *)r->state)[(k == 0 ? 0 : m->params.n) + i];
            bool recorded = k == 0 && grad;
            if (!recorded && *seen == kiln_tensor_version(t)) continue; /* unchanged since the last copy */
            kiln_tensor *c;
            if (recorded) {
                c = kiln_to(t, dev, kiln_dtype_of(t), 0);
            } else {
                kiln_no_grad_begin();
                c = kiln_to(t, dev, kiln_dtype_of(t), 0);
                kiln_grad_mode_end();
            }
            if (!c) return kiln_error_last()->status;
            kiln_tensor_drop(*slot);
            *slot = c;
            *seen = kiln_tensor_version(t);
        }
    }
    for (int i = 0; i < m->children.n; i++)
        KILN_TRY(refresh(m->children.items[i].u.child, r->children.items[i].u.child, dev));
    return KILN_OK;
}

/* After a replica's forward: its recorded parameter copies become plain
 * aliases (the ops saved what backward needs), so the replica keeps the
 * data between steps but no autograd node outlives the step. */
static kiln_status detach_params(kiln_module *r) {
    for (int i = 0; i < r->params.n; i++) {
        kiln_tensor **slot = &r->params.items[i].u.tensor;
        if (!kiln_grad_fn_name(*slot)) continue;
        kiln_tensor *d = kiln_detach(*slot);
        if (!d) return kiln_error_last()->status;
        kiln_tensor_drop(*slot);
        *slot = d;
    }
    for (int i = 0; i < r->children.n; i++) KILN_TRY(detach_params(r->children.items[i].u.child));
    return KILN_OK;
}

static kiln_tensor *dp_forward(kiln_module *m, kiln_tensor *x) {
    dp_state *s = m->state;
    kiln_module *master = m->children.items[0].u.child;
    if (kiln_tensor_check(x, "DataParallel")) return NULL;
    if (x->ndim < 1) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass a batch: dim 0 is scattered over the devices",
                   "DataParallel: the input is a scalar");
        return NULL;
    }
    int64_t n = x->shape[0];
    int k = s->n < n ? s->n : (int)(n > 0 ? n : 1);
    kiln_tensor *outs[DP_MAX_DEVICES] = {NULL};
    int done = 0;
    for (; done < k; done++) {
        int64_t start, len;
        kiln_nn_batch_chunk(n, k, done, &start, &len);
        kiln_module *run = master;
        if (done > 0) {
            if (!s->replicas[done] && !(s->replicas[done] = clone_on(master, s->devices[done]))) break;
            if (refresh(master, s->replicas[done], s->devices[done])) break;
            run = s->replicas[done];
        }
        kiln_tensor *xj = kiln_narrow(x, 0, start, len);
        kiln_tensor *xd = xj ? kiln_to(xj, s->devices[done], kiln_dtype_of(xj), 0) : NULL;
        if (xj) kiln_tensor_drop(xj);
        kiln_tensor *yj = xd ? kiln_module_forward(run, xd) : NULL;
        if (xd) kiln_tensor_drop(xd);
        if (run != master && detach_params(run) && yj) {
            kiln_tensor_drop(yj);
            yj = NULL;
        }
        outs[done] = yj ? kiln_to(yj, s->output, kiln_dtype_of(yj), 0) : NULL;
        if (yj) kiln_tensor_drop(yj);
        if (!outs[done]) break;
    }
    kiln_tensor *y = done == k ? (k == 1 ? kiln_retain(outs[0]) : kiln_cat(k, outs, 0)) : NULL;
    for (int i = 0; i < k; i++)
        if (outs[i]) kiln_tensor_drop(outs[i]);
    return y;
}

kiln_module *kiln_nn_data_parallel(kiln_module *module, const kiln_device *devices, int n, kiln_device output_device) {
    const char *bad = NULL;
    if (!module) bad = "the module is NULL (check its constructor's error)";
    else if (n < 1 || n > DP_MAX_DEVICES || !devices) bad = "give 1..16 devices";
    for (int i = 0; !bad && i < n; i++) {
        if (!kiln_device_is_available(devices[i]) || devices[i].type == KILN_DEVICE_META)
            bad = "a device is not available";
        for (int j = 0; !bad && j < i; j++)
            if (kiln_device_equal(devices[i], devices[j])) bad = "a device is listed twice";
    }
    if (!bad && !kiln_device_is_available(output_device)) bad = "the output device is not available";
    if (bad) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "see kiln_nn_data_parallel in kiln/nn.h", "kiln_nn_data_parallel: %s",
                   bad);
        kiln_module_free(module);
        return NULL;
    }
    dp_state *s = calloc(1, sizeof *s);
    kiln_module *m = s ? kiln_module_new("DataParallel", dp_forward) : NULL;
    if (!m) {
        free(s);
        kiln_module_free(module);
        KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "kiln_nn_data_parallel: out of host memory");
        return NULL;
    }
    m->state = s, m->free_state = dp_free;
    s->n = n, s->output = output_device;
    memcpy(s->devices, devices, sizeof(kiln_device) * (size_t)n);
    kiln_status st = kiln_module_to(module, devices[0]);
    if (st) kiln_module_free(module);
    else st = kiln_module_add_child(m, "module", module);
    if (st) {
        kiln_module_free(m);
        return NULL;
    }
    m->training = module->training;
    return m;
}

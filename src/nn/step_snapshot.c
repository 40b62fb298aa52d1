/* What a training step's forward changes outside its graph, saved so that
 * a failed step can run again as if it had not (kiln/nn.h,
 * kiln_step_snapshot): a copy of every buffer of the module and every
 * device generator's position. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "nn/module_internal.h"
#include "runtime/runtime_internal.h"
#include "tensor/scope.h"
#include "tensor/tensor_internal.h"

struct kiln_step_snapshot {
    kiln_module *module;
    int n;
    kiln_tensor **live;  /* the module's buffers (borrowed: the handles survive moves) */
    kiln_tensor **saved; /* their copies, owned */
    kiln_rng_positions rng;
};

void kiln_step_snapshot_free(kiln_step_snapshot *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++)
        if (s->saved[i]) kiln_tensor_drop(s->saved[i]);
    free(s->live);
    free(s->saved);
    free(s);
}

/* The buffers' copies refreshed (allocated when missing or when a buffer
 * changed shape, dtype or device) and the generators' positions saved. */
static kiln_status save(kiln_step_snapshot *s) {
    for (int i = 0; i < s->n; i++) {
        kiln_tensor *b = s->live[i], **c = &s->saved[i];
        kiln_shape sb = kiln_shape_of(b);
        if (*c) {
            kiln_shape sc = kiln_shape_of(*c);
            bool same = sb.ndim == sc.ndim && !memcmp(sb.d, sc.d, sizeof(int64_t) * (size_t)sb.ndim) &&
                        kiln_dtype_of(b) == kiln_dtype_of(*c) && kiln_device_equal(kiln_get_device(b), kiln_get_device(*c));
            if (!same) {
                kiln_tensor_drop(*c);
                *c = NULL;
            }
        }
        if (!*c) {
            if (!(*c = kiln_empty(sb, kiln_dtype_of(b), kiln_get_device(b)))) return kiln_error_last()->status;
        }
        KILN_TRY(kiln_copy_(*c, b, 0));
    }
    kiln_device_rng_save(&s->rng);
    return KILN_OK;
}

kiln_step_snapshot *kiln_step_snapshot_take(kiln_module *m) {
    if (!m) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass the model", "kiln_step_snapshot_take: the module is NULL");
        return NULL;
    }
    kiln_step_snapshot *s = KILN_CALLOC(1, sizeof *s);
    if (!s) return NULL;
    s->module = m;
    kiln_named_tensor *items = NULL;
    kiln_status st = kiln_module_named_buffers(m, &items, &s->n);
    if (!st && s->n > 0) {
        s->live = KILN_CALLOC((size_t)s->n, sizeof *s->live);
        s->saved = KILN_CALLOC((size_t)s->n, sizeof *s->saved);
        if (!s->live || !s->saved) st = KILN_ERR_OUT_OF_MEMORY;
        for (int i = 0; !st && i < s->n; i++) s->live[i] = items[i].tensor;
    }
    free(items);
    kiln_api_enter();
    if (!st) st = save(s);
    kiln_api_leave();
    if (st) {
        if (!s->live || !s->saved) s->n = 0;
        kiln_step_snapshot_free(s);
        return NULL;
    }
    return s;
}

kiln_status kiln_step_snapshot_retake(kiln_step_snapshot *s) {
    if (!s) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_step_snapshot_retake: the snapshot is NULL");
    kiln_api_enter();
    kiln_status st = save(s);
    kiln_api_leave();
    return st;
}

kiln_status kiln_step_snapshot_restore(kiln_step_snapshot *s) {
    if (!s) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_step_snapshot_restore: the snapshot is NULL");
    kiln_api_enter();
    kiln_status st = KILN_OK;
    kiln_no_grad_begin();
    for (int i = 0; i < s->n && !st; i++) {
        kiln_shape a = kiln_shape_of(s->live[i]), b = kiln_shape_of(s->saved[i]);
        if (a.ndim != b.ndim || memcmp(a.d, b.d, sizeof(int64_t) * (size_t)a.ndim) ||
            !kiln_device_equal(kiln_get_device(s->live[i]), kiln_get_device(s->saved[i])))
            st = KILN_RAISE(KILN_ERR_STATE, "retake the snapshot after moving or reshaping the model",
                            "kiln_step_snapshot_restore: buffer %d changed shape or device since the snapshot", i);
        else
            st = kiln_copy_(s->live[i], s->saved[i], 0);
    }
    kiln_grad_mode_end();
    if (!st) kiln_device_rng_restore(&s->rng);
    kiln_api_leave();
    return st;
}

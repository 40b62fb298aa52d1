/* Layer fusion in a Sequential: runs of built-in layers that one fused op
 * computes (ops.def's fused ops) are run as that op.
 *
 *   Conv2d, ReLU, MaxPool2d     conv2d_relu_max_pool2d on the CPU for a
 *                               k x k window at stride k without padding
 *                               (nn.MaxPool2d(k)); else conv2d, then
 *                               relu_max_pool2d (on CUDA the two ops run
 *                               cuDNN's convolution and one pooling kernel;
 *                               the fused op there is the same two kernels)
 *   Conv2d, ReLU                conv2d_relu
 *   Flatten(1, -1), Linear[, ReLU]  linear_act (the flatten folded in)
 *   Linear[, ReLU] on (N, in)   linear_act
 *
 * A run fuses only when its layers are the plain built-ins (not custom
 * modules of the same kind), consecutive (nothing, e.g. a Dropout, in
 * between) and the input fits the fused op (4-d for the convolution, a
 * 2-d input or a Flatten from dim 1 to the end for Linear, and the
 * Linear's in_features matching); anything else runs layer by layer, so
 * errors keep the unfused layers' messages. Kiln modules have no forward
 * hooks, so no run is skipped for one. The fused ops give the same values
 * and gradients as the layers one by one (tests/nn/test_nn_fusion.c checks
 * forward and every gradient on the CPU reference kernels). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "nn/module_internal.h"
#include "runtime/runtime_internal.h"
#include "tensor/tensor_internal.h"

/* -1: not decided yet (KILN_NN_FUSION is read on first use), 0 off, 1 on. */
static _Atomic int fusion_state = -1;

void kiln_nn_set_fusion(bool enabled) { atomic_store(&fusion_state, enabled ? 1 : 0); }

bool kiln_nn_fusion_enabled(void) {
    int s = atomic_load(&fusion_state);
    if (s < 0) {
        const char *env = getenv("KILN_NN_FUSION");
        int want =
            env && (strcmp(env, "0") == 0 || strcmp(env, "off") == 0 || strcmp(env, "false") == 0) ? 0 : 1;
        int expected = -1;
        atomic_compare_exchange_strong(&fusion_state, &expected, want);
        s = atomic_load(&fusion_state);
    }
    return s == 1;
}

/* A built-in layer of `kind` (constructed by kiln_nn_*, not kiln_nn_custom). */
static bool is_layer(const kiln_module *m, const char *kind) {
    return m && m->forward && !m->user_forward && m->kind && strcmp(m->kind, kind) == 0;
}

static kiln_module *child_at(kiln_module *seq, int i, int end) {
    return i < end ? seq->children.items[i].u.child : NULL;
}

/* in_features of a Linear (its weight's dim 1), or -1. */
static int64_t linear_in(const kiln_module *lin) {
    const kiln_tensor *w = kiln_module_own_tensor(lin, "weight");
    return w && w->ndim == 2 ? w->shape[1] : -1;
}

/* Whether x's ops run CPU kernels (on meta: while a plan models the CPU). */
static bool on_cpu(const kiln_tensor *x) {
    kiln_device_type t = kiln_get_device(x).type;
    return t == KILN_DEVICE_CPU || (t == KILN_DEVICE_META && kiln_meta_kernels() == KILN_DEVICE_CPU);
}

/* A square window at stride equal to it, no padding, floor: what
 * conv2d_relu_max_pool2d pools (nn.MaxPool2d(k)). */
static bool window_pool(const kiln_pool2d_opts *p) {
    int64_t k = p->kernel[0];
    return k >= 1 && p->kernel[1] == k && (p->stride[0] == 0 || p->stride[0] == k) &&
           (p->stride[1] == 0 || p->stride[1] == k) && p->padding[0] == 0 && p->padding[1] == 0 && !p->ceil_mode;
}

/* The fused run starting at child i, if any: its result in *y (NULL on
 * error) and the number of children it covers; 0 when none starts here. */
static int fused_run(kiln_module *seq, int i, int end, kiln_tensor *x, kiln_tensor **y) {
    kiln_module *a = child_at(seq, i, end), *b = child_at(seq, i + 1, end), *c = child_at(seq, i + 2, end);
    *y = NULL;
    if (is_layer(a, "Conv2d") && is_layer(b, "ReLU") && x->ndim == 4) {
        kiln_tensor *w = kiln_module_own_tensor(a, "weight"), *bias = kiln_module_own_tensor(a, "bias");
        if (is_layer(c, "MaxPool2d")) {
            if (window_pool(&c->cfg.pool) && on_cpu(x)) {
                *y = kiln_conv2d_relu_max_pool2d(x, w, bias, &a->cfg.conv, c->cfg.pool.kernel[0], NULL);
                return 3;
            }
            kiln_tensor *h = kiln_conv2d(x, w, bias, &a->cfg.conv);
            *y = h ? kiln_relu_max_pool2d(h, &c->cfg.pool, NULL) : NULL;
            kiln_tensor_drop(h);
            return 3;
        }
        *y = kiln_conv2d_relu(x, w, bias, &a->cfg.conv);
        return 2;
    }
    /* Flatten(1, -1) folded into the Linear that follows it */
    int lin_at = -1;
    if (is_layer(a, "Flatten") && is_layer(b, "Linear") && x->ndim >= 2 && a->cfg.start_dim == 1 &&
        (a->cfg.end_dim == -1 || a->cfg.end_dim == x->ndim - 1)) {
        int64_t K = 1;
        for (int d = 1; d < x->ndim; d++) K *= x->shape[d];
        if (K == linear_in(b)) lin_at = i + 1;
    } else if (is_layer(a, "Linear") && x->ndim == 2 && x->shape[1] == linear_in(a)) {
        lin_at = i;
    }
    if (lin_at < 0) return 0;
    kiln_module *lin = child_at(seq, lin_at, end);
    bool relu = is_layer(child_at(seq, lin_at + 1, end), "ReLU");
    *y = kiln_linear_act(x, kiln_module_own_tensor(lin, "weight"), kiln_module_own_tensor(lin, "bias"),
                         relu ? KILN_ACT_RELU : KILN_ACT_NONE);
    return lin_at - i + 1 + (relu ? 1 : 0);
}

kiln_tensor *kiln_nn_sequential_run(kiln_module *seq, int begin, int end, kiln_tensor *x) {
    return kiln_nn_sequential_run_take(seq, begin, end, kiln_retain(x));
}

kiln_tensor *kiln_nn_sequential_run_take(kiln_module *seq, int begin, int end, kiln_tensor *x) {
    bool fuse = kiln_nn_fusion_enabled();
    kiln_tensor *h = x;
    int i = begin;
    while (h && i < end) {
        kiln_tensor *next = NULL;
        int used = fuse ? fused_run(seq, i, end, h, &next) : 0;
        if (!used) {
            next = kiln_module_forward(seq->children.items[i].u.child, h);
            used = 1;
        }
        kiln_tensor_drop(h);
        h = next;
        i += used;
    }
    return h;
}

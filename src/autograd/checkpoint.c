/* Gradient checkpointing (torch.utils.checkpoint, the reentrant form).
 *
 * Forward: the function runs under no_grad, so none of its intermediates is
 * kept; one function node saves the inputs, the generator positions of the
 * devices involved and the autocast state. Backward: that node puts the
 * generators and autocast back where they were, reruns the function with
 * grad mode on over detached copies of the inputs (the "recomputing" flag
 * set, so BatchNorm does not update its running statistics again), runs a
 * nested backward through the recomputed graph (parameters the function
 * used get their gradients there) and hands the inputs' gradients on. */
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd_internal.h"
#include "base/error.h"
#include "kiln/amp.h"
#include "kiln/ops.h"
#include "runtime/runtime_internal.h"
#include "tensor/scope.h"

/* Generators saved: the CPU one and each device's among the inputs and
 * the current device (a function drawing from another device's generator
 * is not replayed exactly; PyTorch has the same rule). */
#define CKPT_MAX_RNG 8

typedef struct ckpt_state {
    kiln_checkpoint_fn fn;
    void *ctx;
    int n_rng;
    kiln_device rng_device[CKPT_MAX_RNG];
    kiln_rng rng[CKPT_MAX_RNG];
    kiln_dtype autocast[KILN_DEVICE_TYPE_COUNT]; /* the forward's autocast dtype per device type (F32: off) */
} ckpt_state;

static _Thread_local int recompute_depth;

bool kiln_checkpoint_recomputing(void) { return recompute_depth > 0; }
void kiln_checkpoint_probe_begin(void) { recompute_depth++; }
void kiln_checkpoint_probe_end(void) { recompute_depth--; }

static void state_free(void *p) { free(p); }

/* The forward's autocast state over the recompute: one region per device
 * type (F32 regions turn it off), above the backward's suspension. */
static kiln_status autocast_enter(const ckpt_state *s, int *opened) {
    *opened = 0;
    for (int t = 0; t < KILN_DEVICE_TYPE_COUNT; t++) {
        KILN_TRY(kiln_autocast_begin((kiln_device_type)t, s->autocast[t]));
        ++*opened;
    }
    return KILN_OK;
}

static void autocast_leave(int opened) {
    while (opened-- > 0) kiln_autocast_end();
}

static void add_rng_device(ckpt_state *s, kiln_device d) {
    if (d.type == KILN_DEVICE_META) d = (kiln_device){KILN_DEVICE_CPU, 0}; /* meta shares cpu's generator */
    if (d.type == KILN_DEVICE_CPU) d.index = 0;
    for (int i = 0; i < s->n_rng; i++)
        if (kiln_device_equal(s->rng_device[i], d)) return;
    if (s->n_rng == CKPT_MAX_RNG) return;
    s->rng_device[s->n_rng] = d;
    s->rng[s->n_rng++] = kiln_device_rng_reserve(d, 0);
}

/* Swap the generators with the saved positions (twice: back again). */
static void rng_swap(ckpt_state *s) {
    for (int i = 0; i < s->n_rng; i++) {
        kiln_rng now = kiln_device_rng_reserve(s->rng_device[i], 0);
        kiln_device_rng_set(s->rng_device[i], s->rng[i]);
        s->rng[i] = now;
    }
}

static kiln_status check_outputs(const char *fn, int n_out, kiln_tensor *const *out) {
    for (int k = 0; k < n_out; k++) {
        if (!out[k])
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "the function must write a new reference to every output",
                              "%s: the function returned KILN_OK but output %d is NULL", fn, k);
        KILN_TRY(kiln_tensor_check(out[k], fn));
    }
    return KILN_OK;
}

static void drop_all(int n, kiln_tensor **t) {
    for (int i = 0; i < n; i++)
        if (t[i]) kiln_tensor_drop(t[i]), t[i] = NULL;
}

/* Backward: recompute, then backpropagate through the recomputed graph. */
static kiln_status checkpoint_backward(kiln_node *n, kiln_tensor **grad_out, kiln_tensor **grad_in) {
    ckpt_state *s = n->fn_state;
    kiln_tensor *in[KILN_OP_MAX_IN] = {NULL}, *out[KILN_OP_MAX_OUT] = {NULL};
    kiln_status st = KILN_OK;
    bool any_grad = false;
    int roots = 0, last = -1, opened = 0;
    for (int k = 0; k < n->n_out; k++) any_grad |= grad_out[k] != NULL;
    if (!any_grad) return KILN_OK; /* nothing flows back: no recompute */
    for (int i = 0; i < n->n_in && !st; i++) {
        kiln_tensor *t = n->saved_in[i];
        if (!t) continue;
        in[i] = kiln_tensor_alias(t, t->ndim, t->shape, t->strides, t->offset);
        if (!in[i]) st = kiln_error_last()->status ? kiln_error_last()->status : KILN_ERR_OUT_OF_MEMORY;
        else if (n->needs_grad[i]) in[i]->requires_grad = true;
    }
    if (st) goto done;

    /* Replay the forward's random draws and precision, flag the recompute. */
    st = autocast_enter(s, &opened);
    rng_swap(s);
    recompute_depth++;
    kiln_enable_grad_begin();
    if (!st) st = s->fn(s->ctx, n->n_in, in, n->n_out, out);
    kiln_grad_mode_end();
    recompute_depth--;
    rng_swap(s);
    autocast_leave(opened);
    if (!st) st = check_outputs("kiln_checkpoint (recompute)", n->n_out, out);
    for (int k = 0; k < n->n_out && !st; k++) {
        const kiln_meta *m = &n->out_meta[k];
        if (out[k]->dtype != m->dtype || out[k]->ndim != m->ndim ||
            memcmp(out[k]->shape, m->shape, sizeof(int64_t) * (size_t)m->ndim) != 0)
            st = KILN_RAISE(KILN_ERR_STATE,
                            "the function must compute the same thing from the same inputs each time it runs",
                            "kiln_checkpoint: the recompute's output %d differs in shape or dtype from the "
                            "forward's",
                            k);
    }
    if (st) goto done;

    /* Backpropagate: one output directly; several through one scalar
     * sum_k sum(out_k * grad_k), whose gradient into out_k is grad_k. */
    for (int k = 0; k < n->n_out; k++)
        if (grad_out[k] && kiln_autograd_tracks(out[k])) roots++, last = k;
    kiln_autograd_meta *root_meta = roots == 1 ? out[last]->autograd : NULL;
    if (root_meta && root_meta->grad_fn) {
        /* Neither the recomputed output (unless its node saved it) nor the
         * outer gradient outlives the start of the walk: a plain backward
         * would have freed them there too. */
        kiln_node *root = root_meta->grad_fn;
        int output_nr = root_meta->output_nr;
        kiln_tensor *g = grad_out[last];
        grad_out[last] = NULL;
        kiln_node_retain(root);
        drop_all(n->n_out, out);
        st = kiln_backward_node(root, output_nr, g);
        kiln_node_release(root);
    } else if (roots == 1) { /* the output is a leaf (an input returned as is) */
        st = kiln_backward(out[last], grad_out[last], false);
    } else if (roots > 1) {
        kiln_tensor *total = NULL;
        kiln_enable_grad_begin();
        for (int k = 0; k < n->n_out && !st; k++) {
            if (!(grad_out[k] && kiln_autograd_tracks(out[k]))) continue;
            kiln_tensor *p = kiln_mul(out[k], grad_out[k]);
            kiln_tensor *sum = p ? kiln_sum(p, 0, NULL, false) : NULL;
            kiln_tensor *acc = sum && total ? kiln_add(total, sum) : sum;
            if (!acc) st = kiln_error_last()->status;
            if (p) kiln_tensor_drop(p);
            if (sum && acc != sum) kiln_tensor_drop(sum);
            if (total && acc) kiln_tensor_drop(total);
            if (acc) total = acc;
        }
        kiln_grad_mode_end();
        if (!st) st = kiln_backward(total, NULL, false);
        if (total) kiln_tensor_drop(total);
    }
    drop_all(n->n_out, out); /* what is left of the recomputed graph */
    for (int i = 0; i < n->n_in && !st; i++) {
        if (!n->needs_grad[i] || !in[i]) continue;
        kiln_autograd_meta *m = in[i]->autograd;
        if (m && m->grad) grad_in[i] = kiln_retain(m->grad);
    }
done:
    drop_all(n->n_out, out);
    drop_all(n->n_in, in);
    return st;
}

static const kiln_node_fn checkpoint_node = {"checkpoint", "checkpoint_backward", checkpoint_backward, state_free};

static kiln_status checkpoint_body(kiln_checkpoint_fn fn, void *ctx, int n_in, kiln_tensor *const *inputs, int n_out,
                                   kiln_tensor **outputs) {
    if (!fn)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass the function to checkpoint", "kiln_checkpoint: fn is NULL");
    if (n_in < 0 || n_in > KILN_OP_MAX_IN || (n_in > 0 && !inputs))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pack the inputs into at most 16 tensors (kiln_cat, kiln_stack)",
                          "kiln_checkpoint: %d inputs (inputs %s); 0 to %d are supported", n_in,
                          inputs ? "given" : "NULL", KILN_OP_MAX_IN);
    if (n_out < 1 || n_out > KILN_OP_MAX_OUT || !outputs)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                          "checkpoint functions return 1 to 4 tensors; split a larger function in two checkpoints",
                          "kiln_checkpoint: %d outputs (outputs %s); 1 to %d are supported", n_out,
                          outputs ? "given" : "NULL", KILN_OP_MAX_OUT);
    for (int i = 0; i < n_in; i++)
        if (inputs[i]) KILN_TRY(kiln_tensor_check(inputs[i], "kiln_checkpoint"));
    kiln_tensor *out[KILN_OP_MAX_OUT] = {NULL};
    if (!kiln_is_grad_enabled()) { /* nothing would be kept anyway: a plain call */
        kiln_status st = fn(ctx, n_in, inputs, n_out, out);
        if (!st) st = check_outputs("kiln_checkpoint", n_out, out);
        if (st) drop_all(n_out, out);
        else memcpy(outputs, out, sizeof(kiln_tensor *) * (size_t)n_out);
        return st;
    }
    ckpt_state *s = KILN_CALLOC(1, sizeof *s);
    if (!s) return KILN_ERR_OUT_OF_MEMORY;
    s->fn = fn, s->ctx = ctx;
    kiln_device device = kiln_current_device();
    bool device_set = false, tracked = false;
    add_rng_device(s, (kiln_device){KILN_DEVICE_CPU, 0});
    uint64_t version[KILN_OP_MAX_IN] = {0};
    for (int i = 0; i < n_in; i++) {
        if (!inputs[i]) continue;
        kiln_device d = kiln_get_device(inputs[i]);
        if (!device_set) device = d, device_set = true;
        add_rng_device(s, d);
        version[i] = kiln_tensor_version(inputs[i]);
        tracked |= kiln_dtype_is_floating(inputs[i]->dtype) && kiln_autograd_tracks(inputs[i]);
    }
    add_rng_device(s, kiln_current_device());
    for (int t = 0; t < KILN_DEVICE_TYPE_COUNT; t++) s->autocast[t] = kiln_autocast_dtype((kiln_device_type)t);

    kiln_no_grad_begin();
    bool prev = kiln_autograd_probe_begin();
    kiln_status st = fn(ctx, n_in, inputs, n_out, out);
    tracked |= kiln_autograd_probe_end(prev);
    kiln_grad_mode_end();
    if (!st) st = check_outputs("kiln_checkpoint", n_out, out);
    for (int i = 0; i < n_in && !st; i++)
        if (inputs[i] && kiln_tensor_version(inputs[i]) != version[i])
            st = KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                            "the recompute needs the inputs as they were: use out-of-place ops on them",
                            "kiln_checkpoint: the function wrote into its input %d in place", i);
    if (st) {
        drop_all(n_out, out);
        state_free(s);
        return st;
    }
    if (!tracked) { /* nothing requires grad: no node, as PyTorch (which warns) */
        state_free(s);
        memcpy(outputs, out, sizeof(kiln_tensor *) * (size_t)n_out);
        return KILN_OK;
    }
    /* The outputs the caller gets are fresh aliases: an output that is an
     * input (or a parameter) itself must not get the node as its grad_fn. */
    kiln_tensor *fresh[KILN_OP_MAX_OUT] = {NULL};
    for (int k = 0; k < n_out && !st; k++) {
        kiln_tensor *t = out[k];
        if (!(fresh[k] = kiln_tensor_alias(t, t->ndim, t->shape, t->strides, t->offset)))
            st = kiln_error_last()->status ? kiln_error_last()->status : KILN_ERR_OUT_OF_MEMORY;
    }
    drop_all(n_out, out);
    if (!device_set) device = kiln_get_device(fresh[0] ? fresh[0] : inputs[0]);
    if (!st) st = kiln_node_record_fn(&checkpoint_node, s, n_in, inputs, n_out, fresh, device);
    else state_free(s);
    if (st) {
        drop_all(n_out, fresh);
        return st;
    }
    memcpy(outputs, fresh, sizeof(kiln_tensor *) * (size_t)n_out);
    return KILN_OK;
}

kiln_status kiln_checkpoint(kiln_checkpoint_fn fn, void *ctx, int n_inputs, kiln_tensor *const *inputs,
                            int n_outputs, kiln_tensor **outputs) {
    if (outputs && n_outputs > 0 && n_outputs <= KILN_OP_MAX_OUT)
        memset(outputs, 0, sizeof(kiln_tensor *) * (size_t)n_outputs);
    kiln_api_enter();
    kiln_status st = checkpoint_body(fn, ctx, n_inputs, inputs, n_outputs, outputs);
    kiln_api_leave();
    /* Results follow the scope rule of every public call: registered with
     * the innermost scope when the user called. */
    for (int k = 0; !st && k < n_outputs; k++) {
        kiln_api_enter();
        outputs[k] = kiln_api_return(outputs[k]);
    }
    return st;
}

/* Recording the graph: the dispatcher's autograd hook, the tensor layer's
 * view hook, nodes and the per-tensor autograd data. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd_internal.h"
#include "base/error.h"
#include "tensor/scope.h"

static _Atomic uint64_t next_seq = 1;

/* The live-node registry: every node from the moment it is complete until
 * it is freed, so the leak detector can find graphs that outlive a step. */
static pthread_mutex_t registry_mutex = PTHREAD_MUTEX_INITIALIZER;
static kiln_node *registry_head;
static atomic_int_fast64_t live_nodes;
static _Atomic uint64_t live_saved_bytes;

static uint64_t tensor_bytes(const kiln_tensor *t) {
    return t ? (uint64_t)kiln_numel(t) * kiln_dtype_size(t->dtype) : 0;
}

static void registry_add(kiln_node *n) {
    uint64_t bytes = 0;
    for (int i = 0; i < KILN_OP_MAX_IN; i++) bytes += tensor_bytes(n->saved_in[i]);
    for (int i = 0; i < KILN_OP_MAX_OUT; i++) bytes += tensor_bytes(n->saved_out[i]);
    atomic_store(&n->saved_bytes, bytes);
    atomic_fetch_add(&live_saved_bytes, bytes);
    atomic_fetch_add(&live_nodes, 1);
    pthread_mutex_lock(&registry_mutex);
    n->reg_next = registry_head;
    if (registry_head) registry_head->reg_prev = n;
    registry_head = n;
    n->registered = true;
    pthread_mutex_unlock(&registry_mutex);
}

static void registry_remove(kiln_node *n) {
    if (!n->registered) return;
    pthread_mutex_lock(&registry_mutex);
    if (n->reg_prev) n->reg_prev->reg_next = n->reg_next;
    else registry_head = n->reg_next;
    if (n->reg_next) n->reg_next->reg_prev = n->reg_prev;
    n->registered = false;
    pthread_mutex_unlock(&registry_mutex);
    atomic_fetch_sub(&live_nodes, 1);
}

void kiln_node_live_stats(int64_t *nodes, uint64_t *saved_bytes) {
    if (nodes) *nodes = (int64_t)atomic_load(&live_nodes);
    if (saved_bytes) *saved_bytes = atomic_load(&live_saved_bytes);
}

void kiln_node_registry_lock(void) { pthread_mutex_lock(&registry_mutex); }
void kiln_node_registry_unlock(void) { pthread_mutex_unlock(&registry_mutex); }
kiln_node *kiln_node_registry_first(void) { return registry_head; }

kiln_autograd_meta *kiln_autograd_meta_get(kiln_tensor *t, bool create) {
    if (!t->autograd && create) t->autograd = KILN_CALLOC(1, sizeof(kiln_autograd_meta));
    return t->autograd;
}

static void meta_free(kiln_tensor *t) {
    kiln_autograd_meta *m = t->autograd;
    if (!m) return;
    t->autograd = NULL;
    if (m->grad_fn) kiln_node_release(m->grad_fn);
    if (m->grad) kiln_tensor_drop(m->grad);
    free(m->hooks);
    free(m);
}

bool kiln_autograd_tracks(const kiln_tensor *t) {
    if (!t) return false;
    const kiln_autograd_meta *m = t->autograd;
    return t->requires_grad || (m && m->grad_fn);
}

void kiln_node_retain(kiln_node *n) { atomic_fetch_add_explicit(&n->refcount, 1, memory_order_relaxed); }

void kiln_node_release_saved(kiln_node *n) {
    atomic_fetch_sub(&live_saved_bytes, atomic_exchange(&n->saved_bytes, 0));
    for (int i = 0; i < KILN_OP_MAX_IN; i++)
        if (n->saved_in[i]) kiln_tensor_drop(n->saved_in[i]), n->saved_in[i] = NULL;
    for (int i = 0; i < KILN_OP_MAX_OUT; i++)
        if (n->saved_out[i]) kiln_tensor_drop(n->saved_out[i]), n->saved_out[i] = NULL;
}

/* Releasing a long chain recursively could overflow the stack (a graph of
 * 100k ops); an explicit work list keeps it iterative. */
void kiln_node_release(kiln_node *n) {
    kiln_node **work = NULL;
    size_t count = 0, cap = 0;
    kiln_node *cur = n;
    for (;;) {
        if (cur && atomic_fetch_sub_explicit(&cur->refcount, 1, memory_order_acq_rel) == 1) {
            registry_remove(cur);
            kiln_node_release_saved(cur);
            for (int i = 0; i < cur->n_in; i++) {
                if (cur->next[i].leaf) kiln_tensor_drop(cur->next[i].leaf);
                if (!cur->next[i].node) continue;
                if (count == cap) {
                    size_t nc = cap ? cap * 2 : 32;
                    kiln_node **w = realloc(work, nc * sizeof *w);
                    KILN_ASSERT_MSG(w, "out of host memory while freeing an autograd graph");
                    work = w, cap = nc;
                }
                work[count++] = cur->next[i].node;
            }
            free(cur->hooks);
            free(cur->hook_output);
            if (cur->fn && cur->fn->free_state) cur->fn->free_state(cur->fn_state);
            free(cur);
        }
        if (count == 0) break;
        cur = work[--count];
    }
    free(work);
}

/* An alias of t outside the graph: what a node saves, so a saved output
 * does not hold its own grad_fn (a cycle). */
static kiln_tensor *save_alias(kiln_tensor *t, uint64_t *version) {
    *version = kiln_tensor_version(t);
    return kiln_tensor_alias(t, t->ndim, t->shape, t->strides, t->offset);
}

static bool input_wants_grad(const kiln_tensor *t) {
    return t && kiln_dtype_is_floating(t->dtype) && kiln_autograd_tracks(t);
}

static kiln_edge edge_to(kiln_tensor *t) {
    kiln_edge e = {NULL, 0, NULL};
    kiln_autograd_meta *m = t->autograd;
    if (m && m->grad_fn) {
        e.node = m->grad_fn;
        e.output_nr = m->output_nr;
        kiln_node_retain(e.node);
    } else if (t->requires_grad) {
        e.leaf = kiln_retain(t);
    }
    return e;
}

/* Build a node for an op whose inputs (some) need grad, and attach it to
 * the outputs. `save` is the op's mask. A function node (fn) takes
 * `state`, also on failure. */
static kiln_status record(kiln_op_id op, const kiln_op_attrs *attrs, int n_in, kiln_tensor *const *in, int n_out,
                          kiln_tensor *const *out, uint32_t save, kiln_device device, bool is_view,
                          const kiln_node_fn *fn, void *state) {
    kiln_node *n = KILN_CALLOC(1, sizeof *n);
    if (!n) {
        if (fn && fn->free_state) fn->free_state(state);
        return KILN_ERR_OUT_OF_MEMORY;
    }
    atomic_init(&n->refcount, 0);
    n->fn = fn, n->fn_state = state;
    n->op = op;
    n->attrs = *attrs;
    n->seq = atomic_fetch_add(&next_seq, 1);
    n->n_in = n_in, n->n_out = n_out;
    n->device = device;
    n->file = kiln_site_get(&n->line);
    for (int i = 0; i < n_in; i++) {
        if (!in[i]) continue;
        kiln_meta *m = &n->in_meta[i];
        m->dtype = in[i]->dtype, m->ndim = in[i]->ndim;
        memcpy(m->shape, in[i]->shape, sizeof m->shape);
        if (input_wants_grad(in[i])) {
            n->needs_grad[i] = true;
            n->next[i] = edge_to(in[i]);
        }
        if ((save & S_IN(i)) && !(n->saved_in[i] = save_alias(in[i], &n->saved_in_version[i]))) goto fail;
    }
    for (int i = 0; i < n_out; i++) {
        kiln_meta *m = &n->out_meta[i];
        m->dtype = out[i]->dtype, m->ndim = out[i]->ndim;
        memcpy(m->shape, out[i]->shape, sizeof m->shape);
        if ((save & S_OUT(i)) && !(n->saved_out[i] = save_alias(out[i], &n->saved_out_version[i]))) goto fail;
    }
    registry_add(n);
    for (int i = 0; i < n_out; i++) {
        if (!kiln_dtype_is_floating(out[i]->dtype)) continue; /* indices carry no gradient */
        kiln_autograd_meta *m = kiln_autograd_meta_get(out[i], true);
        if (!m) goto fail;
        if (m->grad_fn) kiln_node_release(m->grad_fn); /* in place: the old node is in next[] */
        kiln_node_retain(n);
        m->grad_fn = n;
        m->output_nr = i;
        m->is_view = is_view;
    }
    if (atomic_load(&n->refcount) == 0) { /* no output can carry a gradient */
        kiln_node_retain(n);
        kiln_node_release(n);
    }
    return KILN_OK;
fail:
    kiln_node_retain(n);
    kiln_node_release(n);
    return kiln_error_last()->status ? kiln_error_last()->status : KILN_ERR_OUT_OF_MEMORY;
}

static bool any_input_tracked(int n_in, kiln_tensor *const *in) {
    for (int i = 0; i < n_in; i++)
        if (input_wants_grad(in[i])) return true;
    return false;
}

/* The probe of a checkpointed forward (kiln_autograd_probe_begin). */
static _Thread_local int probe_depth;
static _Thread_local bool probe_hit;

bool kiln_autograd_probe_begin(void) {
    bool prev = probe_hit;
    probe_hit = false;
    probe_depth++;
    return prev;
}

bool kiln_autograd_probe_end(bool previous) {
    bool hit = probe_hit;
    probe_depth--;
    probe_hit = previous || hit; /* an inner hit is a hit of the outer function too */
    return hit;
}

static void probe(int n_in, kiln_tensor *const *in) {
    if (probe_depth && !probe_hit && any_input_tracked(n_in, in)) probe_hit = true;
}

/* Refuse in-place writes that would corrupt a gradient before the kernel
 * runs (the data is still intact then). */
static kiln_status autograd_begin(kiln_op_call *c) {
    if (!(c->info->flags & OPF_INPLACE) || !kiln_is_grad_enabled()) return KILN_OK;
    kiln_tensor *t = c->in[0];
    kiln_autograd_meta *m = t->autograd;
    if (t->requires_grad && !(m && m->grad_fn))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                          "use the out-of-place op, or wrap the update in kiln_no_grad_begin/end",
                          "kiln_%s: a leaf tensor that requires grad is used in an in-place operation", c->info->name);
    if (m && m->is_view && m->grad_fn)
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "use the out-of-place op on the view",
                          "kiln_%s: in-place write to a view of a tensor that requires grad", c->info->name);
    if (c->op == KILN_OP_MUL_ && input_wants_grad(c->in[1]))
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "use kiln_mul, which keeps both operands for backward",
                          "kiln_mul_: the other operand requires grad, but the in-place product overwrites "
                          "the value its gradient needs");
    return KILN_OK;
}

static kiln_status autograd_end(kiln_op_call *c, kiln_status status) {
    if (status || (c->info->flags & OPF_NONDIFF)) return KILN_OK;
    if (!kiln_is_grad_enabled()) {
        probe(c->n_in, c->in);
        return KILN_OK;
    }
    if (!any_input_tracked(c->n_in, c->in)) return KILN_OK;
    return record(c->op, c->attrs, c->n_in, c->in, c->n_out, c->out, c->info->save, c->device, false, NULL, NULL);
}

kiln_status kiln_node_record_fn(const kiln_node_fn *fn, void *state, int n_in, kiln_tensor *const *in, int n_out,
                                kiln_tensor *const *out, kiln_device device) {
    KILN_ASSERT(n_in >= 0 && n_in <= KILN_OP_MAX_IN && n_out >= 1 && n_out <= KILN_OP_MAX_OUT);
    uint32_t save = 0;
    for (int i = 0; i < n_in; i++) save |= S_IN(i);
    const kiln_op_attrs none = {0};
    return record(KILN_OP_COUNT, &none, n_in, in, n_out, out, save, device, false, fn, state);
}

const char *kiln_node_name(const kiln_node *n) { return n->fn ? n->fn->name : kiln_op_info_get(n->op)->name; }

const char *kiln_node_backward_name(const kiln_node *n) {
    return n->fn ? n->fn->backward_name : kiln_op_info_get(n->op)->backward_name;
}

static const kiln_op_id view_ops[] = {
    [KILN_VIEW_KIND_VIEW] = KILN_OP_VIEW,     [KILN_VIEW_KIND_PERMUTE] = KILN_OP_PERMUTE,
    [KILN_VIEW_KIND_NARROW] = KILN_OP_NARROW, [KILN_VIEW_KIND_EXPAND] = KILN_OP_EXPAND,
    [KILN_VIEW_KIND_COPY] = KILN_OP_COPY,
};

static kiln_tensor *view_hook(kiln_view_kind kind, kiln_tensor *in, kiln_tensor *out, const kiln_op_attrs *attrs) {
    if (!kiln_is_grad_enabled()) probe(1, &in);
    if (!kiln_is_grad_enabled() || !input_wants_grad(in)) return out;
    if (record(view_ops[kind], attrs, 1, &in, 1, &out, 0, kiln_get_device(in), kind != KILN_VIEW_KIND_COPY, NULL,
               NULL)) {
        kiln_tensor_drop(out);
        return NULL;
    }
    return out;
}

void kiln_autograd_init(void) {
    static const kiln_dispatch_hook hook = {autograd_begin, autograd_end};
    kiln_dispatch_set_hook(KILN_HOOK_AUTOGRAD, &hook);
    kiln_tensor_set_view_hook(view_hook);
    kiln_tensor_set_autograd_free_hook(meta_free);
}

/* ---- Public queries ------------------------------------------------------------------ */

kiln_status kiln_set_requires_grad(kiln_tensor *t, bool requires_grad) {
    KILN_TRY(kiln_tensor_check(t, "kiln_set_requires_grad"));
    kiln_autograd_meta *m = t->autograd;
    if (m && m->grad_fn)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "call it on a leaf, or use kiln_detach first",
                          "kiln_set_requires_grad: the tensor was produced by kiln_%s; only leaves can be marked",
                          kiln_node_name(m->grad_fn));
    if (requires_grad && !kiln_dtype_is_floating(t->dtype))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "convert it to a floating dtype with kiln_to",
                          "kiln_set_requires_grad: only floating tensors can require grad, this one is %s",
                          kiln_dtype_name(t->dtype));
    t->requires_grad = requires_grad;
    return KILN_OK;
}

bool kiln_requires_grad(const kiln_tensor *t) { return kiln_autograd_tracks(t); }

bool kiln_is_leaf(const kiln_tensor *t) {
    const kiln_autograd_meta *m = t ? t->autograd : NULL;
    return !(m && m->grad_fn);
}

kiln_tensor *kiln_grad(kiln_tensor *t) {
    kiln_api_enter();
    if (kiln_tensor_check(t, "kiln_grad")) return kiln_api_return(NULL);
    kiln_autograd_meta *m = t->autograd;
    return kiln_api_return(m && m->grad ? kiln_retain(m->grad) : NULL);
}

kiln_status kiln_set_grad(kiln_tensor *t, kiln_tensor *grad) {
    KILN_TRY(kiln_tensor_check(t, "kiln_set_grad"));
    if (grad) {
        KILN_TRY(kiln_tensor_check(grad, "kiln_set_grad"));
        kiln_shape a = kiln_shape_of(t), b = kiln_shape_of(grad);
        if (a.ndim != b.ndim || memcmp(a.d, b.d, sizeof(int64_t) * (size_t)a.ndim) || grad->dtype != t->dtype ||
            !kiln_device_equal(kiln_get_device(t), kiln_get_device(grad))) {
            char sa[96], sb[96];
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give a gradient with the tensor's shape, dtype and device",
                              "kiln_set_grad: tensor %s %s, gradient %s %s", kiln_shape_format(a.ndim, a.d, sa, sizeof sa),
                              kiln_dtype_name(t->dtype), kiln_shape_format(b.ndim, b.d, sb, sizeof sb),
                              kiln_dtype_name(grad->dtype));
        }
    }
    kiln_autograd_meta *m = kiln_autograd_meta_get(t, grad != NULL);
    if (!m) return grad ? KILN_ERR_OUT_OF_MEMORY : KILN_OK;
    kiln_tensor *old = m->grad;
    m->grad = grad ? kiln_retain(grad) : NULL;
    if (old) kiln_tensor_drop(old);
    return KILN_OK;
}

kiln_status kiln_zero_grad(kiln_tensor *t, bool set_to_none) {
    KILN_TRY(kiln_tensor_check(t, "kiln_zero_grad"));
    if (set_to_none) return kiln_set_grad(t, NULL);
    kiln_autograd_meta *m = t->autograd;
    if (!m || !m->grad) return KILN_OK;
    kiln_api_enter();
    kiln_tensor *z = kiln_new_zeros(m->grad, kiln_shape_of(m->grad));
    kiln_status st = z ? kiln_copy_(m->grad, z, 0) : kiln_error_last()->status;
    if (z) kiln_tensor_drop(z);
    kiln_api_leave();
    return st;
}

kiln_tensor *kiln_detach(kiln_tensor *t) {
    kiln_api_enter();
    if (kiln_tensor_check(t, "kiln_detach")) return kiln_api_return(NULL);
    return kiln_api_return(kiln_tensor_alias(t, t->ndim, t->shape, t->strides, t->offset));
}

/* A hook on a non-leaf tensor lives on the node that produces it, keyed by
 * the output it watches: the tensor itself may be gone by backward time. */
static kiln_status add_node_hook(kiln_node *n, int output_nr, kiln_hook_entry e) {
    if (n->n_hooks == n->cap_hooks) {
        int cap = n->cap_hooks ? n->cap_hooks * 2 : 2;
        kiln_hook_entry *h = KILN_REALLOC(n->hooks, (size_t)cap * sizeof *h);
        if (!h) return KILN_ERR_OUT_OF_MEMORY;
        n->hooks = h;
        int *o = KILN_REALLOC(n->hook_output, (size_t)cap * sizeof *o);
        if (!o) return KILN_ERR_OUT_OF_MEMORY;
        n->hook_output = o;
        n->cap_hooks = cap;
    }
    n->hooks[n->n_hooks] = e;
    n->hook_output[n->n_hooks++] = output_nr;
    return KILN_OK;
}

static kiln_status add_hook(kiln_tensor *t, kiln_hook_entry e, const char *fn) {
    KILN_TRY(kiln_tensor_check(t, fn));
    if (!kiln_autograd_tracks(t))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "call kiln_set_requires_grad first",
                          "%s: the tensor does not require grad", fn);
    kiln_autograd_meta *m = kiln_autograd_meta_get(t, true);
    if (!m) return KILN_ERR_OUT_OF_MEMORY;
    if (m->grad_fn && e.grad) return add_node_hook(m->grad_fn, m->output_nr, e);
    if (m->n_hooks == m->cap_hooks) {
        int cap = m->cap_hooks ? m->cap_hooks * 2 : 4;
        kiln_hook_entry *h = KILN_REALLOC(m->hooks, (size_t)cap * sizeof *h);
        if (!h) return KILN_ERR_OUT_OF_MEMORY;
        m->hooks = h, m->cap_hooks = cap;
    }
    m->hooks[m->n_hooks++] = e;
    return KILN_OK;
}

kiln_status kiln_register_hook(kiln_tensor *t, kiln_grad_hook hook, void *user) {
    if (!hook) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_register_hook: hook is NULL");
    return add_hook(t, (kiln_hook_entry){hook, NULL, user}, "kiln_register_hook");
}

kiln_status kiln_register_post_accumulate_hook(kiln_tensor *leaf, kiln_post_accumulate_hook hook, void *user) {
    if (!hook) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_register_post_accumulate_hook: hook is NULL");
    if (leaf && !kiln_is_leaf(leaf))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "register it on a parameter (a leaf)",
                          "kiln_register_post_accumulate_hook: the tensor is not a leaf");
    return add_hook(leaf, (kiln_hook_entry){NULL, hook, user}, "kiln_register_post_accumulate_hook");
}

const char *kiln_grad_fn_name(const kiln_tensor *t) {
    const kiln_autograd_meta *m = t ? t->autograd : NULL;
    return m && m->grad_fn ? kiln_node_name(m->grad_fn) : NULL;
}

const char *kiln_grad_fn_site(const kiln_tensor *t, int *line) {
    const kiln_autograd_meta *m = t ? t->autograd : NULL;
    if (!(m && m->grad_fn)) {
        if (line) *line = 0;
        return "(unknown)";
    }
    if (line) *line = m->grad_fn->line;
    return m->grad_fn->file;
}

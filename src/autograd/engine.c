/* The backward engine: discover the graph reachable from the root, count
 * each node's pending gradient producers, then run nodes in reverse
 * creation order as their gradients become complete, accumulating into
 * leaves and firing hooks. */
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd_internal.h"
#include "kiln/ops.h"
#include "base/error.h"
#include "ops/autocast.h"
#include "ops/op_registry.h"
#include "tensor/scope.h"

/* Per-node state of one backward run, in an open-addressing table keyed by
 * the node's address. */
typedef struct run_slot {
    kiln_node *node;
    int pending;                          /* producers yet to deliver */
    kiln_tensor *grads[KILN_OP_MAX_OUT]; /* summed gradients of its outputs */
} run_slot;

typedef struct run_table {
    run_slot *slots;
    size_t cap, count;
    /* Leaves whose .grad is, for now, a gradient another branch of the
     * walk still holds (accumulate_leaf): held references, settled at the
     * end of the walk. */
    kiln_tensor **shared_leaves;
    int n_shared, cap_shared;
} run_table;

static size_t hash_ptr(const void *p, size_t cap) {
    uintptr_t x = (uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x & (cap - 1);
}

static run_slot *table_find(run_table *t, kiln_node *n, bool insert);

static kiln_status table_grow(run_table *t) {
    run_table bigger = {KILN_CALLOC(t->cap ? t->cap * 2 : 64, sizeof(run_slot)), t->cap ? t->cap * 2 : 64, 0};
    if (!bigger.slots) return KILN_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; i < t->cap; i++) {
        if (!t->slots[i].node) continue;
        run_slot *s = table_find(&bigger, t->slots[i].node, true);
        *s = t->slots[i];
    }
    free(t->slots);
    *t = bigger;
    return KILN_OK;
}

static run_slot *table_find(run_table *t, kiln_node *n, bool insert) {
    if (insert && (t->count + 1) * 2 > t->cap && table_grow(t)) return NULL;
    for (size_t i = hash_ptr(n, t->cap);; i = (i + 1) & (t->cap - 1)) {
        if (t->slots[i].node == n) return &t->slots[i];
        if (!t->slots[i].node) {
            if (!insert) return NULL;
            t->slots[i].node = n;
            t->count++;
            return &t->slots[i];
        }
    }
}

static void table_free(run_table *t) {
    for (size_t i = 0; i < t->cap; i++)
        for (int k = 0; k < KILN_OP_MAX_OUT; k++)
            if (t->slots[i].grads[k]) kiln_tensor_drop(t->slots[i].grads[k]);
    free(t->slots);
}

/* Count, for each reachable node, how many edges point at it. */
static kiln_status discover(run_table *t, kiln_node *root) {
    kiln_node **stack = NULL;
    size_t count = 0, cap = 0;
    kiln_status st = KILN_OK;
    if (!table_find(t, root, true)) return KILN_ERR_OUT_OF_MEMORY;
    kiln_node *cur = root;
    for (;;) {
        for (int i = 0; i < cur->n_in; i++) {
            kiln_node *nx = cur->next[i].node;
            if (!nx) continue;
            bool seen = table_find(t, nx, false) != NULL;
            run_slot *s = table_find(t, nx, true);
            if (!s) {
                st = KILN_ERR_OUT_OF_MEMORY;
                goto done;
            }
            s->pending++;
            if (seen) continue;
            if (count == cap) {
                size_t nc = cap ? cap * 2 : 64;
                kiln_node **w = KILN_REALLOC(stack, nc * sizeof *w);
                if (!w) {
                    st = KILN_ERR_OUT_OF_MEMORY;
                    goto done;
                }
                stack = w, cap = nc;
            }
            stack[count++] = nx;
        }
        if (count == 0) break;
        cur = stack[--count];
    }
done:
    free(stack);
    return st;
}

/* Max-heap of ready nodes by creation order. */
typedef struct ready_heap {
    kiln_node **items;
    size_t count, cap;
} ready_heap;

static kiln_status heap_push(ready_heap *h, kiln_node *n) {
    if (h->count == h->cap) {
        size_t nc = h->cap ? h->cap * 2 : 64;
        kiln_node **w = KILN_REALLOC(h->items, nc * sizeof *w);
        if (!w) return KILN_ERR_OUT_OF_MEMORY;
        h->items = w, h->cap = nc;
    }
    size_t i = h->count++;
    h->items[i] = n;
    while (i > 0 && h->items[(i - 1) / 2]->seq < h->items[i]->seq) {
        kiln_node *tmp = h->items[i];
        h->items[i] = h->items[(i - 1) / 2];
        h->items[(i - 1) / 2] = tmp;
        i = (i - 1) / 2;
    }
    return KILN_OK;
}

static kiln_node *heap_pop(ready_heap *h) {
    kiln_node *top = h->items[0];
    h->items[0] = h->items[--h->count];
    for (size_t i = 0;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->count && h->items[l]->seq > h->items[m]->seq) m = l;
        if (r < h->count && h->items[r]->seq > h->items[m]->seq) m = r;
        if (m == i) break;
        kiln_node *tmp = h->items[i];
        h->items[i] = h->items[m];
        h->items[m] = tmp;
        i = m;
    }
    return top;
}

/* a + b, written into a's buffer when the caller holds the only reference
 * to it (kiln_dispatch_donating), else into a new one; NULL on error. */
static kiln_tensor *add_into(kiln_tensor *a, kiln_tensor *b) {
    kiln_tensor *out[KILN_OP_MAX_OUT] = {NULL};
    if (kiln_dispatch_donating(KILN_OP_ADD, 2, (kiln_tensor *[]){a, b}, NULL, kiln_get_device(a), out, 0))
        return NULL;
    return out[0];
}

/* *slot += g (slot takes the reference to g). The sum goes into the
 * slot's tensor when the engine holds the only reference to it
 * (kiln_dispatch_donating), else into a new one. */
static kiln_status accumulate(kiln_tensor **slot, kiln_tensor *g) {
    if (!*slot) {
        *slot = g;
        return KILN_OK;
    }
    kiln_tensor *sum = add_into(*slot, g);
    kiln_tensor_drop(g);
    if (!sum) return kiln_error_last()->status;
    kiln_tensor_drop(*slot);
    *slot = sum;
    return KILN_OK;
}

static kiln_status run_grad_hooks(kiln_tensor *t, kiln_tensor **g) {
    kiln_autograd_meta *m = t->autograd;
    for (int i = 0; m && i < m->n_hooks; i++) {
        if (!m->hooks[i].grad) continue;
        kiln_tensor *r = m->hooks[i].grad(*g, m->hooks[i].user);
        if (r) {
            kiln_tensor_drop(*g);
            *g = r;
        }
    }
    return KILN_OK;
}

static bool leaf_grad_shared(const run_table *tab, const kiln_tensor *leaf) {
    for (int i = 0; tab && i < tab->n_shared; i++)
        if (tab->shared_leaves[i] == leaf) return true;
    return false;
}

/* leaf.grad += g, then post-accumulate hooks. Takes g. A fresh gradient no
 * one else holds becomes .grad itself. One that another branch of the walk
 * still holds (a sum's gradient goes to both its inputs) becomes .grad as
 * well when the leaf has no hooks, and the leaf is noted in tab: sums into
 * it are then out of place until the other holders let go (the engine's
 * own tensors, dropped as their nodes run), and at the end of the walk a
 * .grad still shared is copied, so no .grad ever shares its buffer with
 * another tensor. Otherwise a shared gradient is copied at once, so that a
 * later in-place accumulation cannot write into another leaf's gradient.
 * tab NULL: no walk (the root is the leaf). */
static kiln_status accumulate_leaf(run_table *tab, kiln_tensor *leaf, kiln_tensor *g) {
    KILN_TRY(run_grad_hooks(leaf, &g));
    kiln_autograd_meta *m = kiln_autograd_meta_get(leaf, true);
    if (!m) {
        kiln_tensor_drop(g);
        return KILN_ERR_OUT_OF_MEMORY;
    }
    kiln_status st = KILN_OK;
    if (g->dtype != leaf->dtype) {
        kiln_tensor *c = kiln_to(g, kiln_get_device(leaf), leaf->dtype, 0);
        kiln_tensor_drop(g);
        if (!c) return kiln_error_last()->status;
        g = c;
    }
    if (!m->grad) {
        bool shared = kiln_refcount(g) > 1 || atomic_load(&g->storage->refcount) > 1 || !kiln_is_contiguous(g);
        bool defer = shared && tab && m->n_hooks == 0 && kiln_is_contiguous(g) && !kiln_requires_grad(g) &&
                     !leaf_grad_shared(tab, leaf);
        if (defer && tab->n_shared == tab->cap_shared) {
            int cap = tab->cap_shared ? 2 * tab->cap_shared : 8;
            kiln_tensor **items = realloc(tab->shared_leaves, sizeof *items * (size_t)cap);
            if (items) tab->shared_leaves = items, tab->cap_shared = cap;
            else defer = false;
        }
        if (defer) {
            tab->shared_leaves[tab->n_shared++] = kiln_retain(leaf);
        } else if (shared) {
            kiln_tensor *c = kiln_to(g, kiln_get_device(g), g->dtype, KILN_COPY);
            kiln_tensor_drop(g);
            if (!c) return kiln_error_last()->status;
            g = c;
        }
        m->grad = g;
    } else if (leaf_grad_shared(tab, leaf)) {
        kiln_tensor *sum = add_into(m->grad, g);
        kiln_tensor_drop(g);
        if (!sum) return kiln_error_last()->status;
        kiln_tensor_drop(m->grad);
        m->grad = sum;
    } else {
        kiln_tensor *r = kiln_add_(m->grad, g);
        kiln_tensor_drop(g);
        if (!r) return kiln_error_last()->status;
        kiln_tensor_drop(r);
    }
    for (int i = 0; i < m->n_hooks && !st; i++)
        if (m->hooks[i].post) m->hooks[i].post(leaf, m->hooks[i].user);
    return st;
}

/* The end of a walk: every .grad still sharing its buffer gets its own copy. */
static kiln_status settle_shared_leaves(run_table *tab) {
    kiln_status st = KILN_OK;
    for (int i = 0; i < tab->n_shared; i++) {
        kiln_tensor *leaf = tab->shared_leaves[i];
        kiln_autograd_meta *m = leaf->autograd;
        if (!st && m && m->grad && !kiln_tensor_sole_owner(m->grad)) {
            kiln_tensor *c = kiln_to(m->grad, kiln_get_device(m->grad), m->grad->dtype, KILN_COPY);
            if (!c) st = kiln_error_last()->status;
            else kiln_tensor_drop(m->grad), m->grad = c;
        }
        kiln_tensor_drop(leaf);
    }
    free(tab->shared_leaves);
    tab->shared_leaves = NULL;
    tab->n_shared = tab->cap_shared = 0;
    return st;
}

static kiln_status check_saved(const kiln_node *n) {
    const char *name = kiln_node_name(n);
    if (n->released)
        return KILN_RAISE(KILN_ERR_STATE, "pass retain_graph=true to the first kiln_backward to go through it twice",
                          "kiln_backward: the graph of kiln_%s (%s:%d) was already freed by an earlier backward; "
                          "pass retain_graph=true to the first kiln_backward to run backward through it twice",
                          name, n->file, n->line);
    for (int i = 0; i < KILN_OP_MAX_IN + KILN_OP_MAX_OUT; i++) {
        bool is_in = i < KILN_OP_MAX_IN;
        kiln_tensor *t = is_in ? n->saved_in[i] : n->saved_out[i - KILN_OP_MAX_IN];
        uint64_t v = is_in ? n->saved_in_version[i] : n->saved_out_version[i - KILN_OP_MAX_IN];
        if (t && kiln_tensor_version(t) != v)
            return KILN_RAISE(KILN_ERR_STATE, "work on a copy (kiln_to with KILN_COPY) before writing in place",
                              "kiln_backward: %s %d of kiln_%s (called at %s:%d) was modified in place after it was "
                              "saved for backward (version %llu, saved at version %llu)",
                              is_in ? "input" : "output", is_in ? i : i - KILN_OP_MAX_IN, name, n->file, n->line,
                              (unsigned long long)kiln_tensor_version(t), (unsigned long long)v);
    }
    return KILN_OK;
}

static _Thread_local const kiln_node *running_node;

const kiln_node *kiln_backward_running_node(void) { return running_node; }

static kiln_status run_node(run_table *tab, ready_heap *ready, kiln_node *n, bool retain_graph) {
    run_slot *slot = table_find(tab, n, false);
    kiln_tensor *grad_in[KILN_OP_MAX_IN] = {NULL};
    bool any = false;
    for (int i = 0; i < n->n_in; i++) any |= n->needs_grad[i];
    kiln_status st = KILN_OK;
    for (int h = 0; h < n->n_hooks; h++) { /* hooks on the tensors this node produced */
        kiln_tensor **g = &slot->grads[n->hook_output[h]];
        if (!*g) continue;
        kiln_tensor *r = n->hooks[h].grad(*g, n->hooks[h].user);
        if (r) {
            kiln_tensor_drop(*g);
            *g = r;
        }
    }
    if (n->fn) { /* a function node runs even when no input needs a gradient */
        st = check_saved(n);
        if (!st) {
            const kiln_node *outer = running_node;
            running_node = n;
            kiln_dispatch_range_push(n->fn->backward_name);
            st = n->fn->backward(n, slot->grads, grad_in);
            kiln_dispatch_range_pop();
            running_node = outer;
        }
    } else if (any) {
        const kiln_op_info *info = kiln_op_info_get(n->op);
        st = check_saved(n);
        kiln_backward_ctx ctx = {.op = n->op, .attrs = &n->attrs, .n_in = n->n_in, .n_out = n->n_out,
                                 .in = n->saved_in, .out = n->saved_out, .in_meta = n->in_meta,
                                 .out_meta = n->out_meta, .device = n->device, .needs_grad = n->needs_grad};
        if (!st && !info->backward)
            st = KILN_RAISE(KILN_ERR_UNSUPPORTED, "report this: tests/ops/test_op_coverage lists it",
                            "kiln_backward: op %s has no backward formula in this build", info->name);
        if (!st) {
            const kiln_node *outer = running_node;
            running_node = n;
            kiln_dispatch_range_push(info->backward_name);
            st = info->backward(&ctx, slot->grads, grad_in);
            kiln_dispatch_range_pop();
            running_node = outer;
        }
    }
    for (int k = 0; k < KILN_OP_MAX_OUT; k++)
        if (slot->grads[k]) kiln_tensor_drop(slot->grads[k]), slot->grads[k] = NULL;
    if (!retain_graph) {
        /* Only a node that saved something is spent (PyTorch's rule): one
         * that saved nothing (a cast, a view) can be gone through again, as
         * autocast's cached weight casts are by each micro-batch of an
         * accumulation inside one region. */
        bool saved = n->fn != NULL;
        for (int k = 0; k < KILN_OP_MAX_IN && !saved; k++) saved = n->saved_in[k] != NULL;
        for (int k = 0; k < KILN_OP_MAX_OUT && !saved; k++) saved = n->saved_out[k] != NULL;
        kiln_node_release_saved(n);
        if (saved) n->released = true;
    }
    for (int i = 0; i < n->n_in; i++) {
        kiln_edge *e = &n->next[i];
        kiln_tensor *g = grad_in[i];
        grad_in[i] = NULL;
        /* After a failure (the formula's, or an earlier input's
         * accumulation) the gradients are dropped, but a node input still
         * counts as delivered, so the walk's bookkeeping stays whole. */
        if (st || !n->needs_grad[i]) {
            kiln_tensor_drop(g);
            g = NULL;
            if (!e->node) continue;
        }
        if (e->leaf) {
            if (g) st = accumulate_leaf(tab, e->leaf, g);
            continue;
        }
        if (!e->node) {
            kiln_tensor_drop(g);
            continue;
        }
        run_slot *s = table_find(tab, e->node, false);
        if (g) st = accumulate(&s->grads[e->output_nr], g);
        if (--s->pending == 0 && !st) st = heap_push(ready, e->node);
    }
    return st;
}

/* The graph walk from one node output, taking grad. */
static kiln_status backward_from(kiln_node *node, int output_nr, kiln_tensor *g, bool retain_graph) {
    run_table tab = {0};
    ready_heap ready = {0};
    kiln_status st = table_grow(&tab);
    if (!st) st = discover(&tab, node);
    if (!st) {
        run_slot *s = table_find(&tab, node, false);
        s->grads[output_nr] = g;
        g = NULL;
        st = heap_push(&ready, node);
    }
    while (!st && ready.count) st = run_node(&tab, &ready, heap_pop(&ready), retain_graph);
    if (g) kiln_tensor_drop(g);
    table_free(&tab); /* drops the gradients still held, before the shared .grads are settled */
    kiln_status settled = settle_shared_leaves(&tab);
    if (!st) st = settled;
    free(ready.items);
    return st;
}

static kiln_status backward_body(kiln_tensor *root, kiln_tensor *grad_output, bool retain_graph) {
    KILN_TRY(kiln_tensor_check(root, "kiln_backward"));
    if (!kiln_autograd_tracks(root))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                          "mark the parameters with kiln_set_requires_grad, and do not compute the loss under no_grad",
                          "kiln_backward: the tensor does not require grad and has no grad_fn");
    kiln_tensor *g;
    if (grad_output) {
        KILN_TRY(kiln_tensor_check(grad_output, "kiln_backward"));
        g = kiln_retain(grad_output);
    } else {
        if (kiln_numel(root) != 1) {
            char b[96];
            kiln_shape s = kiln_shape_of(root);
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass grad_output, or reduce the output to one element first",
                              "kiln_backward: grad_output may be NULL only for a one-element tensor, this one is %s",
                              kiln_shape_format(s.ndim, s.d, b, sizeof b));
        }
        g = kiln_new_ones(root, kiln_shape_of(root));
        if (!g) return kiln_error_last()->status;
    }
    kiln_autograd_meta *m = root->autograd;
    if (!(m && m->grad_fn)) return accumulate_leaf(NULL, root, g);
    return backward_from(m->grad_fn, m->output_nr, g, retain_graph);
}

kiln_status kiln_backward_node(kiln_node *node, int output_nr, kiln_tensor *grad) {
    kiln_api_enter();
    kiln_no_grad_begin();
    kiln_autocast_suspend();
    kiln_status st = backward_from(node, output_nr, grad, false);
    kiln_autocast_resume();
    kiln_grad_mode_end();
    kiln_api_leave();
    return st;
}

kiln_status kiln_backward(kiln_tensor *root, kiln_tensor *grad_output, bool retain_graph) {
    kiln_api_enter();
    kiln_no_grad_begin();
    kiln_autocast_suspend(); /* formulas run in their inputs' dtypes */
    kiln_status st = backward_body(root, grad_output, retain_graph);
    kiln_autocast_resume();
    kiln_grad_mode_end();
    kiln_api_leave();
    return st;
}

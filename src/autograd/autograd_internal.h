/* Autograd records: the per-tensor autograd data and graph nodes. */
#ifndef KILN_SRC_AUTOGRAD_AUTOGRAD_INTERNAL_H
#define KILN_SRC_AUTOGRAD_AUTOGRAD_INTERNAL_H

#include <stdatomic.h>

#include "kiln/autograd.h"
#include "ops/op_registry.h"
#include "tensor/tensor_internal.h"

typedef struct kiln_node kiln_node;

/* Where a gradient goes: into output `output_nr` of `node`, or into the
 * .grad of `leaf`. Both NULL: nowhere (the input needs no gradient). */
typedef struct kiln_edge {
    kiln_node *node; /* strong */
    int output_nr;
    kiln_tensor *leaf; /* strong */
} kiln_edge;

typedef struct kiln_hook_entry {
    kiln_grad_hook grad;
    kiln_post_accumulate_hook post;
    void *user;
} kiln_hook_entry;

/* t->autograd. */
typedef struct kiln_autograd_meta {
    kiln_node *grad_fn; /* strong; NULL for leaves */
    int output_nr;
    kiln_tensor *grad; /* leaves: the accumulated gradient */
    bool is_view;      /* produced by a view op (in-place writes refused) */
    kiln_hook_entry *hooks;
    int n_hooks, cap_hooks;
} kiln_autograd_meta;

struct kiln_node {
    atomic_int refcount;
    kiln_op_id op;
    kiln_op_attrs attrs;
    uint64_t seq; /* creation order: backward runs later nodes first */
    int n_in, n_out;
    kiln_device device;
    kiln_edge next[KILN_OP_MAX_IN];
    bool needs_grad[KILN_OP_MAX_IN];
    kiln_tensor *saved_in[KILN_OP_MAX_IN];
    kiln_tensor *saved_out[KILN_OP_MAX_OUT];
    uint64_t saved_in_version[KILN_OP_MAX_IN];
    uint64_t saved_out_version[KILN_OP_MAX_OUT];
    kiln_meta in_meta[KILN_OP_MAX_IN];
    kiln_meta out_meta[KILN_OP_MAX_OUT];
    kiln_hook_entry *hooks; /* gradient hooks on its outputs (non-leaf tensors) */
    int *hook_output;       /* the output each hook watches */
    int n_hooks, cap_hooks;
    const char *file; /* the user's call site */
    int line;
    bool released; /* saved tensors freed by a backward without retain_graph */
    /* The live-node registry (for the leak detector): a list under the
     * registry lock; saved_bytes is what saved_in/saved_out hold now. */
    kiln_node *reg_prev, *reg_next;
    bool registered;
    _Atomic uint64_t saved_bytes;
};

/* The autograd data of t, created on demand (NULL on allocation failure). */
kiln_autograd_meta *kiln_autograd_meta_get(kiln_tensor *t, bool create);
void kiln_node_retain(kiln_node *n);
void kiln_node_release(kiln_node *n);
/* Drop the node's saved tensors. */
void kiln_node_release_saved(kiln_node *n);
/* True when t takes part in autograd (a leaf requiring grad, or a grad_fn). */
bool kiln_autograd_tracks(const kiln_tensor *t);

/* ---- The live-node registry (node.c), read by the diag layer ---------------------- */

/* Nodes alive right now and the bytes their saved tensors hold (atomic
 * counters: no lock, no blocking). */
void kiln_node_live_stats(int64_t *nodes, uint64_t *saved_bytes);
/* Lock the registry: while held no node can be freed, so the list from
 * kiln_node_registry_first (following reg_next) and the edges of its nodes
 * may be walked. Do not create, retain or release nodes (or run ops) while
 * holding it. */
void kiln_node_registry_lock(void);
void kiln_node_registry_unlock(void);
kiln_node *kiln_node_registry_first(void);

/* The node whose backward formula is running on this thread (NULL outside
 * backward): what the anomaly check names for ops run inside backward. */
const kiln_node *kiln_backward_running_node(void);

/* Registration with the dispatcher and the tensor layer (kiln_init). */
void kiln_autograd_init(void);

#endif

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

/* A node whose backward is not an op's formula but a function of the node
 * itself (gradient checkpointing: recompute, then backpropagate through the
 * recomputed graph). Such a node's `op` is KILN_OP_COUNT: name it with
 * kiln_node_name. */
typedef struct kiln_node_fn {
    const char *name;          /* "checkpoint" */
    const char *backward_name; /* "checkpoint_backward" */
    /* Like a kiln_backward_fn, with the node (saved_in, needs_grad, in_meta,
     * out_meta, state): called even when no input needs a gradient, since
     * it may deliver gradients to leaves it reaches itself. It may take
     * the reference of a grad_out entry (setting it to NULL), to free that
     * gradient as early as a plain backward would. */
    kiln_status (*backward)(kiln_node *n, kiln_tensor **grad_out, kiln_tensor **grad_in);
    void (*free_state)(void *state); /* when the node is freed (may be NULL) */
} kiln_node_fn;

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
    const kiln_node_fn *fn; /* NULL for op nodes */
    void *fn_state;         /* owned: fn->free_state releases it */
};

/* The autograd data of t, created on demand (NULL on allocation failure). */
kiln_autograd_meta *kiln_autograd_meta_get(kiln_tensor *t, bool create);
void kiln_node_retain(kiln_node *n);
void kiln_node_release(kiln_node *n);
/* Drop the node's saved tensors. */
void kiln_node_release_saved(kiln_node *n);
/* The op's name ("mul"), or the function node's ("checkpoint"). */
const char *kiln_node_name(const kiln_node *n);
const char *kiln_node_backward_name(const kiln_node *n);
/* Record a function node over inputs in[0..n_in) (n_in <= KILN_OP_MAX_IN,
 * entries may be NULL; each non-NULL one is saved, with its version) and
 * attach it to the floating outputs out[0..n_out) (n_out <=
 * KILN_OP_MAX_OUT), which must be fresh tensors outside any graph. Takes
 * `state` (freed with fn->free_state on failure too). The node carries a
 * gradient even when no input requires one. */
kiln_status kiln_node_record_fn(const kiln_node_fn *fn, void *state, int n_in, kiln_tensor *const *in, int n_out,
                                kiln_tensor *const *out, kiln_device device);
/* Ops that would have been recorded had grad mode been on: a checkpointed
 * forward runs under no_grad and asks whether its function used a tensor
 * that requires grad (a parameter). begin returns the previous probe state
 * for end to restore (the probes nest); end returns whether an op with a
 * tracked input ran since begin. */
bool kiln_autograd_probe_begin(void);
bool kiln_autograd_probe_end(bool previous);
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

/* kiln_backward from output `output_nr` of `node` with gradient `grad`
 * (taken, not NULL), without retain_graph: the tensor that output was
 * need not be alive any more (a checkpoint's recompute drops it first). */
kiln_status kiln_backward_node(kiln_node *node, int output_nr, kiln_tensor *grad);

/* The node whose backward formula is running on this thread (NULL outside
 * backward): what the anomaly check names for ops run inside backward. */
const kiln_node *kiln_backward_running_node(void);

/* Between these, kiln_checkpoint_recomputing() is true on this thread:
 * a measuring forward (kiln_nn_sequential_checkpoint_by_memory) leaves
 * BatchNorm's running statistics alone, as a recompute does. Nestable. */
void kiln_checkpoint_probe_begin(void);
void kiln_checkpoint_probe_end(void);

/* Registration with the dispatcher and the tensor layer (kiln_init). */
void kiln_autograd_init(void);

#endif

/* Kiln autograd: gradients of tensors that require them.
 *
 * A floating tensor marked with kiln_set_requires_grad is a *leaf*; every
 * op on tensors that require grad (with grad mode on) records a node
 * holding what its backward needs, and its outputs require grad.
 * kiln_backward walks the recorded graph and accumulates into each leaf's
 * .grad. Nodes hold their saved tensors by the library's own references,
 * so scopes never free them; they are released when backward is done with
 * them (unless retain_graph) or when the outputs that own the graph die.
 *
 * Grad mode, like the current device, is per thread. */
#ifndef KILN_AUTOGRAD_H
#define KILN_AUTOGRAD_H

#include "kiln/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Mark a leaf (a tensor no op produced) as requiring grad, or not. Only
 * floating dtypes can require grad. Does not block. */
kiln_status kiln_set_requires_grad(kiln_tensor *t, bool requires_grad);
bool kiln_requires_grad(const kiln_tensor *t);
/* True for tensors no recorded op produced. */
bool kiln_is_leaf(const kiln_tensor *t);

/* The accumulated gradient of a leaf: a new reference, or NULL with no
 * error set (kiln_error_last()->status == KILN_OK) when there is none yet. */
kiln_tensor *kiln_grad(kiln_tensor *t);
/* Replace a leaf's gradient (NULL clears it, freeing its memory: what
 * zero_grad does by default). The leaf takes its own reference. */
kiln_status kiln_set_grad(kiln_tensor *t, kiln_tensor *grad);

/* Clear a leaf's gradient: drop it (set_to_none, which frees its memory:
 * PyTorch's default) or write zeros into it in place, keeping the buffer
 * (and any view of it, such as a DDP bucket) alive. No-op without one.
 * Queued on the current stream; does not block. */
kiln_status kiln_zero_grad(kiln_tensor *t, bool set_to_none);

/* Backpropagate from `root`. grad_output: the gradient of root (NULL means
 * ones, allowed only when root has one element). Leaves accumulate into
 * .grad. Without retain_graph the nodes' saved tensors are released as
 * backward passes them, and a second backward through them is an error.
 * Runs with grad mode and autocast off. Queues work on the devices'
 * current streams; does not block the host beyond what the ops do. */
kiln_status kiln_backward(kiln_tensor *root, kiln_tensor *grad_output, bool retain_graph);

/* A new tensor sharing t's storage, outside any graph (requires_grad off). */
kiln_tensor *kiln_detach(kiln_tensor *t);

/* Grad mode, nestable: begin pushes a mode, end pops it. With grad mode off
 * no op records a node (the C form of torch.no_grad()). */
void kiln_no_grad_begin(void);
void kiln_enable_grad_begin(void);
kiln_status kiln_grad_mode_end(void);
bool kiln_is_grad_enabled(void);

/* A hook on the gradient flowing into tensor t (leaf or not). It may
 * return a replacement gradient (a new reference, which Kiln takes) or NULL
 * to keep the one it was given. Called during backward, before a leaf's
 * accumulation. */
typedef kiln_tensor *(*kiln_grad_hook)(kiln_tensor *grad, void *user);
kiln_status kiln_register_hook(kiln_tensor *t, kiln_grad_hook hook, void *user);
/* A hook on a leaf, called after its gradient has been accumulated into
 * .grad (where DDP starts communicating a bucket). `leaf` is borrowed. */
typedef void (*kiln_post_accumulate_hook)(kiln_tensor *leaf, void *user);
kiln_status kiln_register_post_accumulate_hook(kiln_tensor *leaf, kiln_post_accumulate_hook hook, void *user);

/* The name of the op that produced t ("mul"), or NULL for a leaf or a
 * tensor outside any graph. Static string. */
const char *kiln_grad_fn_name(const kiln_tensor *t);
/* The user's file:line where that op was called ("(unknown)" if the call
 * did not go through the public headers' macros). */
const char *kiln_grad_fn_site(const kiln_tensor *t, int *line);

/* ---- Gradient checkpointing -----------------------------------------------------------
 * kiln_checkpoint(fn, ctx, ...) computes fn(inputs) without keeping its
 * intermediate activations (torch.utils.checkpoint): fn runs under no_grad;
 * the inputs (by reference), the generator positions of the CPU, of the
 * inputs' devices and of the current device, and the autocast state are
 * saved; in backward fn runs again on detached copies of the inputs with
 * grad mode on, replaying the same random draws (dropout masks are
 * identical), and the gradient flows through that recomputed graph: into
 * the inputs that require grad and into the parameters fn uses (their
 * .grad accumulates during the recompute's backward). While it
 * recomputes, kiln_checkpoint_recomputing() is true: BatchNorm does not
 * update its running statistics a second time.
 *
 * fn gets ctx, the inputs (borrowed; entries may be NULL as given) and
 * writes n_outputs new references into outputs; it runs inside the library
 * (results of public calls it makes are not registered with scopes, so it
 * releases its intermediates with kiln_release). It must compute the same
 * thing each time it runs from the same inputs, must not write into its
 * inputs in place (an error), and ctx must stay valid until the backward
 * through the outputs is done (or the outputs are freed). It may call
 * kiln_checkpoint itself (nesting). Inputs that do not require grad are
 * fine; when neither an input nor anything fn uses requires grad, or
 * grad mode is off, it is a plain call of fn.
 *
 * 0 to 16 inputs, 1 to 4 outputs (KILN_ERR_INVALID_ARGUMENT beyond). On
 * success outputs[0..n_outputs) are new references (owned by the innermost
 * scope when the user called), views of what fn returned; on failure they
 * are NULL. Queues work on the current stream and blocks only where fn's
 * ops do; the backward recomputes fn once per kiln_backward through it. */
typedef kiln_status (*kiln_checkpoint_fn)(void *ctx, int n_inputs, kiln_tensor *const *inputs, int n_outputs,
                                          kiln_tensor **outputs);
kiln_status kiln_checkpoint(kiln_checkpoint_fn fn, void *ctx, int n_inputs, kiln_tensor *const *inputs,
                            int n_outputs, kiln_tensor **outputs);
/* True on this thread while a checkpoint's backward reruns its function. */
bool kiln_checkpoint_recomputing(void);

#ifdef __cplusplus
}
#endif
#endif

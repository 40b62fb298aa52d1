/* Kiln trace: a call recorded once and replayed without the framework.
 *
 * kiln_trace runs a function once, eagerly, on example inputs, and writes
 * down every kernel the dispatcher ran for it: the kernel chosen (fast or
 * reference, the algorithm its args select), the views it saw (shapes,
 * strides, dtypes, layouts), its attributes, its workspace size and the
 * prepared parameter copy it used. The result is a kiln_program:
 *
 *   - ops: that kernel list;
 *   - a static memory plan: every block the call allocated (outputs of
 *     intermediate ops, workspaces) becomes an offset in one arena, blocks
 *     whose lifetimes do not overlap sharing bytes (first fit on the
 *     interval graph of their first and last use). Tensors that existed
 *     before the trace (parameters, buffers, gradients, optimizer state)
 *     stay where they are and are used in place;
 *   - guards: each input's shape, strides, dtype and device, grad mode,
 *     the autocast state, and the storage identity of every tensor used in
 *     place. kiln_program_run checks them and fails with a message naming
 *     what changed; the fix is to trace again (retrace).
 *
 * kiln_program_run calls the recorded kernels directly: no dispatcher, no
 * hooks (autograd, autocast, profiler), no scopes, and after its first run
 * no allocator calls. For the same inputs the results are bit-identical to
 * the eager call's, because they are the same kernels on the same views.
 *
 * What can be traced: any call whose work is dispatcher kernels over
 * tensors that exist before it or that it allocates itself: inference
 * forwards, losses, backward, fused optimizer steps. What cannot, refused
 * at trace time with an error: host synchronisations inside the call
 * (kiln_item, blocking copies: data-dependent control flow cannot be
 * replayed), work the dispatcher did not see that a recorded kernel then
 * reads (a block read before any recorded kernel wrote it), several
 * devices in one call, and outputs that are not contiguous tensors the
 * call allocated. Values the call computed on the host (shapes, Python
 * style constants) are frozen, as in torch.jit.trace. The grad scaler's
 * step is traced without its host read: the fused optimizer kernels take
 * the found-inf flag and skip on the device, and each run reads the flag
 * after its steps to put back a skipped step's counts (docs/trace.md).
 *
 * On CUDA a replay is one CUDA graph (docs/trace.md, "CUDA graphs"): the
 * first kiln_program_run captures the steps (stream capture, instantiate)
 * reading the program's static copies of the inputs and a small device
 * parameter block; each run copies the inputs in, writes that block (the
 * random draws' generator positions, the optimizer's lr and bias
 * corrections) with one async copy, and launches the graph.
 *
 * Threads: a program is used by one thread at a time; tracing records the
 * calling thread only. */
#ifndef KILN_TRACE_H
#define KILN_TRACE_H

#include <stdio.h>

#include "kiln/base.h"
#include "kiln/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_program kiln_program;

/* The function kiln_trace records. It reads inputs[0..n_inputs) and writes
 * n_outputs new references to outputs[] (tensors it computed: the caller
 * of kiln_trace takes them). Return KILN_OK or an error. */
typedef kiln_status (*kiln_trace_fn)(void *user, kiln_tensor *const *inputs, kiln_tensor **outputs);

/* Runs fn(user, inputs, outputs) once on the calling thread, eagerly,
 * recording it, and builds *out, a program the caller frees with
 * kiln_program_free. eager_outputs (may be NULL) receives the eager call's
 * n_outputs results as new references; otherwise they are released.
 * The program holds a reference to every tensor it uses in place; those
 * must keep their storage (guarded). Blocks (runs the call). Errors: fn's
 * own, and the untraceable cases listed above, each naming the op and
 * step; *out is NULL then and the eager call's effects remain. */
kiln_status kiln_trace(kiln_trace_fn fn, void *user, int n_inputs, kiln_tensor *const *inputs, int n_outputs,
                       kiln_tensor **eager_outputs, kiln_program **out);

/* Replays the program on inputs[0..n_inputs), which must match the traced
 * inputs' shapes, strides, dtypes and devices. outputs[0..n_outputs)
 * receive new references to the program's output tensors: the same
 * tensors every run, overwritten by the next run (copy what you keep, as
 * with CUDA graphs' static outputs). The first run allocates the arena and
 * the outputs; later runs allocate nothing. A guard that fails returns
 * KILN_ERR_INVALID_ARGUMENT naming what changed, and nothing runs.
 * Blocks the host until the CPU kernels have run. On CUDA: the first run
 * also allocates the static inputs and the parameter block and captures
 * the CUDA graph; a step that cannot be captured (it runs on the host,
 * takes its random position by value, or synchronises or allocates while
 * captured) is KILN_ERR_UNSUPPORTED or the backend's error naming the step
 * and op, and the program stays refused (KILN_ERR_STATE: retrace). Every
 * run queues the input copies, the parameter copy and the graph launch on
 * the recorded stream and returns; the host waits only for the parameter
 * copy of two runs back, so it runs at most two replays ahead. A program
 * with a grad scaler's step then reads the found-inf flag (one host
 * synchronisation per run, as the eager scaler's step makes). */
kiln_status kiln_program_run(kiln_program *p, int n_inputs, kiln_tensor *const *inputs, int n_outputs,
                             kiln_tensor **outputs);

/* What a program holds (kiln bench trace and the tests print it). */
typedef struct kiln_program_stats {
    int n_steps;            /* kernels and conversions replayed per run */
    int n_buffers;          /* blocks the trace allocated, planned into the arena */
    int n_external;         /* tensors used in place */
    size_t arena_bytes;     /* the arena the plan needs */
    size_t unplanned_bytes; /* the sum of the planned blocks' sizes (no reuse) */
} kiln_program_stats;
kiln_status kiln_program_stats_get(const kiln_program *p, kiln_program_stats *out);

/* The shape and dtype program input i was traced with (what
 * kiln_program_run's guard expects). KILN_ERR_INVALID_ARGUMENT for a bad i. */
kiln_status kiln_program_input_info(const kiln_program *p, int i, kiln_shape *shape, kiln_dtype *dtype);

/* One line per step, "step 3: conv2d (fast) in [1, 3, 32, 32] f32 ..." into
 * f (for `kiln export --traced --verbose` and debugging). */
void kiln_program_print(const kiln_program *p, FILE *f);

/* Saving and loading inference programs (docs/trace.md, "File format").
 *
 * kiln_program_save writes p to `path` as one safetensors file: the
 * tensors the program uses in place (named as names_from's state dict
 * names them when names_from is not NULL, else "const.N") and the
 * versioned program description in its metadata. CPU inference programs
 * only (no optimizer step, no random draw); atomic (temporary file,
 * fsync, rename). Borrows p. Blocks. */
typedef struct kiln_module kiln_module;
kiln_status kiln_program_save(const kiln_program *p, const char *path, kiln_module *names_from);

/* Loads a program kiln_program_save wrote, validating everything first
 * (counts, shapes, every view inside the memory it names, each step
 * against the op's shape inference and against the kernel this build
 * picks, the arena plan, the tensors' dtypes and shapes): errors are
 * KILN_ERR_IO naming the file and the step. Needs no model spec and no
 * autograd; *out runs with kiln_program_run (no grad-mode or autocast
 * guard: there is no eager call it stands for) and is freed with
 * kiln_program_free. Blocks (reads the file). */
kiln_status kiln_program_load(const char *path, kiln_program **out);

/* Frees the program: its arena, its outputs (references handed out stay
 * valid until released) and its references to tensors used in place.
 * NULL is a no-op. */
void kiln_program_free(kiln_program *p);

#ifdef __cplusplus
}
#endif
#endif

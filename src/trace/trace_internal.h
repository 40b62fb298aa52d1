/* The trace layer's records: what kiln_trace wrote down (record.c), the
 * memory plan over it (memory_plan.c) and the replay (program.c). */
#ifndef KILN_SRC_TRACE_TRACE_INTERNAL_H
#define KILN_SRC_TRACE_TRACE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/op_args.h"
#include "kiln/trace.h"
#include "ops/op_registry.h"

/* Where a data pointer of a recorded kernel lies. */
typedef enum trace_ref_kind {
    TRACE_REF_NONE = 0, /* no data (absent optional input, empty tensor) */
    TRACE_REF_BUFFER,   /* a block the traced call allocated: index = buffer */
    TRACE_REF_INPUT,    /* a program input: offset from its data pointer */
    TRACE_REF_EXTERNAL, /* a tensor used in place: offset from its storage's base */
} trace_ref_kind;

typedef struct trace_ref {
    int32_t kind;
    int32_t index;
    int64_t offset; /* bytes */
} trace_ref;

typedef enum trace_step_kind {
    TRACE_STEP_KERNEL = 0, /* an op kernel */
    TRACE_STEP_REORDER,    /* nChw<block>c -> strided, as kiln_tensor_ensure_strided */
    TRACE_STEP_FILL,       /* tensor layer: out[0] = scalar (attrs.scalar[0]) */
    TRACE_STEP_COPY,       /* tensor layer: out[0] = convert(in[0]) */
    TRACE_STEP_ARANGE,     /* tensor layer: out[0] = start + i*step */
    TRACE_STEP_RAND,       /* tensor layer: uniform (flag 0) or normal (flag 1) draw */
    TRACE_STEP_OPTIM,      /* a fused optimizer launch (trace_optim) */
} trace_step_kind;

/* A fused optimizer launch: up to KILN_OPTIM_MULTI updates. Per update the
 * refs of p, g, m (SGD: momentum buffer), v, vmax; the step structs as
 * recorded, whose pointers and (Adam) bias corrections each run rebuilds
 * from the optimizer's live lr and step counters. */
struct kiln_optimizer;
typedef struct trace_optim {
    struct kiln_optimizer *o;
    const struct kiln_optim_kernels *k;
    bool adam;
    int n;
    int idx[16];
    trace_ref ref[16][5];
    struct kiln_adam_step *as; /* n, when adam */
    struct kiln_sgd_step *ss;  /* n, when sgd */
    /* CUDA graph replay: the first 8-byte word of this launch's per-update
     * scalars in the graph's parameter block (program_graph.c) */
    size_t word;
    /* a grad scaler's step (kiln_optimizer_step_unless_found): the found-inf
     * flag the kernels take, read after each run to put back a skipped
     * step's counts and count it in *skipped */
    bool has_found;
    trace_ref found;
    int64_t *skipped;
} trace_optim;

typedef struct trace_step {
    int kind;
    kiln_op_id op;
    bool fast;
    const kiln_op_kernel *k;
    kiln_op_args args; /* the recorded views; data pointers patched on each run */
    kiln_op_attrs attrs;
    trace_ref in[KILN_OP_MAX_IN], out[KILN_OP_MAX_OUT], ws;
    /* The kernel's prepared copy: of which external tensor (-1: none). */
    int prep_external;
    int prep_input;
    uint64_t prep_key;
    size_t prep_bytes;
    bool prep_lazy; /* kiln_op_prepare.lazy: the replay may run without the copy */
    /* reorder: the 4-D shape, element size and channels per block; in[0] -> out[0] */
    size_t elem;
    int block;
    int64_t shape[4];
    /* the inputs as the op saw them before broadcasting (ndim -1: absent),
     * for checking a loaded step against the op's shape inference */
    int in_ndim[KILN_OP_MAX_IN];
    kiln_dtype in_dtype[KILN_OP_MAX_IN];
    int64_t in_shape[KILN_OP_MAX_IN][KILN_MAX_DIMS];
    /* random ops: the draw (program's draw list) whose position a run
     * takes from the device's generator; -1: none */
    int draw;
    /* arange / rand: element count */
    int64_t n;
    trace_optim *optim;
} trace_step;

/* One draw from a device generator: how many words it advances it. */
typedef struct trace_draw {
    kiln_rng recorded; /* the position at trace time */
    uint64_t words;
} trace_draw;

/* A block the traced call allocated and a recorded step used. */
typedef struct trace_buffer {
    size_t bytes;
    int first, last;   /* steps of first and last use */
    int output;        /* program output index, or -1: planned in the arena */
    bool written;      /* (recording) a recorded step has written it */
    int layout;        /* (recording) the layout a kernel last wrote it in */
    int64_t shape4[4]; /* (recording) and the (N, C, H, W) it wrote, when blocked */
    size_t offset;     /* in the arena (plan) */
} trace_buffer;

/* A tensor used in place, and what the guard expects of it. */
typedef struct trace_external {
    kiln_tensor *t; /* a reference the program holds (NULL while a loaded program is being validated) */
    const void *storage;
    const void *base;
    int first_step;
    /* A loaded program's: the tensor's name in the file, dtype and shape. */
    char *name;
    kiln_dtype dtype;
    kiln_shape shape;
} trace_external;

typedef struct trace_input_guard {
    kiln_dtype dtype;
    kiln_device device;
    int ndim;
    int64_t shape[KILN_MAX_DIMS], strides[KILN_MAX_DIMS];
} trace_input_guard;

struct kiln_program {
    kiln_device device;
    void *stream; /* the backend stream handle the kernels ran on */
    trace_step *steps;
    int n_steps, cap_steps;
    trace_buffer *buffers;
    int n_buffers, cap_buffers;
    trace_external *ext;
    int n_ext, cap_ext;
    int n_inputs, n_outputs;
    trace_input_guard *inputs;
    trace_draw *draws;
    int n_draws, cap_draws;
    bool loaded; /* from a file: no eager call to stand for, so no grad-mode or autocast guard */
    /* guards on the thread's state */
    bool grad_enabled;
    bool autocast;
    kiln_dtype autocast_dtype;
    /* plan and run state */
    size_t arena_bytes;
    void *arena;           /* from kiln_memory_alloc at the first run */
    kiln_tensor **outputs; /* n_outputs, allocated at the first run */
    kiln_shape *out_shape; /* n_outputs */
    kiln_dtype *out_dtype;
    void **base;       /* per buffer, resolved at the first run */
    void **in_data;    /* per input, this run's data pointers */
    kiln_rng *rng_now; /* per draw, this run's position */
    /* How run steps behave (program_graph.c): TRACE_RUN_EAGER runs them;
     * TRACE_RUN_CAPTURE queues them on run_stream (a CUDA capture stream)
     * with the per-run values read from the graph's device parameter
     * block; the graph's per-replay host pass does only the host's share
     * of the optimizer steps (step counts, scalars, versions). */
    int run_mode;
    void *run_stream;           /* where steps are queued: stream, or the capture stream */
    struct trace_graph *graph;  /* CUDA: the captured replay, from the first run */
};

enum { TRACE_RUN_EAGER = 0, TRACE_RUN_CAPTURE, TRACE_RUN_HOST };

/* A block the traced call allocated (memory observer). */
typedef struct trace_block {
    kiln_device device;
    const char *base;
    size_t bytes;
    bool live;
    int buffer; /* -1 until a recorded step uses it */
    /* The block this one may hold the strided copy of: a block of the same
     * size freed right after this one was allocated, as the tensor layer's
     * layout conversion does (kiln_tensor_ensure_strided); -1: none. */
    int converted_from;
} trace_block;

/* The state of one kiln_trace (record.c), reached by the recorders. */
typedef struct trace_recording {
    kiln_program *p;
    kiln_tensor *const *inputs;
    trace_block *blocks;
    int n_blocks, cap_blocks;
    bool have_device;
    int last_alloc;     /* the block of the last memory event when it was an allocation, else -1 */
    kiln_status failed; /* an observer's failure, reported after the call */
} trace_recording;

/* record.c, for the other recorders: a new step (zeroed, draw -1,
 * prep_external -1; p->n_steps counts it already), the step's device and
 * stream (all steps share one), and where a pointer lies: t is the
 * tensor it belongs to, or NULL for a raw pointer (tensor-layer work,
 * workspaces), which must lie in a block the call made or in an input. */
kiln_status kiln_trace_new_step(trace_recording *r, trace_step **out, int *index);
kiln_status kiln_trace_step_device(trace_recording *r, kiln_device d, void *stream);
kiln_status kiln_trace_classify(trace_recording *r, const kiln_tensor *t, const void *data, int step,
                                bool write, trace_ref *ref);
/* The draw index for a random step whose attrs carry `rng` on `device`
 * (a new draw when not seen before: the forward; the backward reuses it). */
kiln_status kiln_trace_draw(trace_recording *r, kiln_device device, kiln_rng rng, int *out);

/* record_tensor.c: install / remove the tensor-layer and optimizer
 * recorders on this thread for recording r (NULL removes). */
void kiln_trace_extra_recorders(trace_recording *r);

/* program_file.c / program_check.c: the versioned description of an
 * inference program (docs/trace.md), and its validation. */
#define KILN_PROGRAM_FORMAT  "kiln.program"
#define KILN_PROGRAM_VERSION 1
/* Parses and validates a description (len bytes, need not end in NUL):
 * every count, shape, stride, offset, reference and attribute, the kernel
 * this build picks for each step against the one recorded, each step's
 * shapes against the op's inference, workspaces and the arena plan. *out
 * is a program whose externals are described (name, dtype, shape) but not
 * loaded. `file` names the source in errors. KILN_ERR_IO on a bad one. */
kiln_status kiln_program_parse(const char *file, const char *text, size_t len, kiln_program **out);

/* program.c: the channels per block of an opaque CPU layout (oneDNN's
 * nChw16c: 16; nChw8c, the layout after it where a build has it: 8), 0
 * for any other; and the conversion of a contiguous (N, C, H, W) tensor
 * of elem-byte elements (1, 2, 4, 8) from that blocked layout to strided, as the tensor
 * layer's (a permutation: the same bits however it is done). */
int kiln_trace_layout_block(kiln_layout layout);
void kiln_trace_unblock(void *dst, const void *src, size_t elem, const int64_t *shape, int block);

/* program.c: one step as kiln_program_run runs it, in p->run_mode. */
kiln_status kiln_trace_run_step(kiln_program *p, trace_step *s);
/* program.c: after a run, the grad scaler's found-inf flags read (a host
 * synchronisation) and a skipped step's counts put back. */
kiln_status kiln_trace_settle_found(kiln_program *p);

/* program_graph.c: on CUDA a replay is one CUDA graph. kiln_trace_graph_run
 * does a run after the guards and the first run's allocations: on the
 * first, the check that every step can be captured, the static inputs and
 * parameter block, and the capture; then, each run, the inputs copied into
 * the static ones, the per-run values (random draws' positions, optimizer
 * scalars) copied into the parameter block, and the graph's launch.
 * kiln_trace_graph_free frees what it made (NULL-safe). */
kiln_status kiln_trace_graph_run(kiln_program *p, kiln_tensor *const *inputs);
void kiln_trace_graph_free(kiln_program *p);
/* The parameter block (8-byte words): on the device (what captured
 * kernels read), this run's host staging (what the host pass writes), and
 * draw d's position on the device. */
const void *kiln_trace_graph_params(const kiln_program *p);
double *kiln_trace_graph_host_params(const kiln_program *p);
const kiln_rng *kiln_trace_graph_draw(const kiln_program *p, int d);

/* memory_plan.c: assigns every non-output buffer an arena offset (first fit
 * on lifetime intervals, aligned) and sets p->arena_bytes. */
kiln_status kiln_trace_plan_memory(kiln_program *p);
/* The arena bytes if no two buffers shared memory. */
size_t kiln_trace_unplanned_bytes(const kiln_program *p);

#endif

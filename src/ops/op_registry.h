/* The op registry: ids, static information generated from ops.def, the
 * per-backend kernel tables, and the dispatcher's hook chain. */
#ifndef KILN_SRC_OPS_OP_REGISTRY_H
#define KILN_SRC_OPS_OP_REGISTRY_H

#include "kernels/op_args.h"
#include "kiln/tensor.h"

typedef enum kiln_op_id {
#define KILN_OP(ID, name, n_in, n_out, prec, flags, save, infer, backward) KILN_OP_##ID,
#include "ops/ops.def"
#undef KILN_OP
    KILN_OP_COUNT
} kiln_op_id;

typedef enum kiln_precision {
    KILN_PREC_ASIS = 0, /* runs in its input dtype */
    KILN_PREC_LOWER,    /* f16/bf16 under autocast */
    KILN_PREC_F32,      /* f32 under autocast */
    KILN_PREC_PROMOTE,  /* widest input type under autocast */
} kiln_precision;

enum {
    OPF_BROADCAST = 1u << 0,  /* inputs broadcast to out[0]'s shape */
    OPF_NONDIFF = 1u << 1,    /* no gradient flows through */
    OPF_VIEW = 1u << 2,       /* out[0] is a view of in[0]: no kernel */
    OPF_INPLACE = 1u << 3,    /* out[0] is in[0], written in place */
    OPF_VARIADIC = 1u << 4,   /* n_in is a maximum; any count >= 1 */
    OPF_CREATION = 1u << 5,   /* no tensor inputs; device from attrs */
    OPF_OPTIONAL_1 = 1u << 8, /* input i may be NULL */
    OPF_OPTIONAL_2 = 1u << 9,
    OPF_OPTIONAL_3 = 1u << 10,
    OPF_OPTIONAL_4 = 1u << 11,
};
#define OPF_OPTIONAL(i) (1u << (7 + (i)))

#define S_IN(i) (1u << (i))
#define S_OUT(i) (1u << (16 + (i)))

/* What inference reports for one output. */
typedef struct kiln_meta {
    kiln_dtype dtype;
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
} kiln_meta;

/* Shape and dtype inference. `in` holds n_in tensors (optional ones may be
 * NULL). Fills out[0..n_out) and in_dtype[0..n_in): the dtype each input
 * must have when the kernel runs (the dispatcher casts where it differs;
 * preset to each input's own dtype). Errors name the op and the shapes. */
typedef kiln_status (*kiln_infer_fn)(const char *op, const kiln_op_attrs *attrs, int n_in,
                                     kiln_tensor *const *in, kiln_meta *out, kiln_dtype *in_dtype);

/* What a backward formula sees. Inputs and outputs the op's save mask did
 * not ask for are NULL; their shapes and dtypes are always there. */
typedef struct kiln_backward_ctx {
    kiln_op_id op;
    const kiln_op_attrs *attrs;
    int n_in, n_out;
    kiln_tensor *const *in;  /* saved inputs (NULL unless saved) */
    kiln_tensor *const *out; /* saved outputs (NULL unless saved) */
    const kiln_meta *in_meta;
    const kiln_meta *out_meta;
    kiln_device device;
    const bool *needs_grad; /* per input */
} kiln_backward_ctx;

/* grad_out[i] may be NULL (that output got no gradient: treat as zeros).
 * Write a new reference (or NULL for "no gradient") to grad_in[i] for each
 * input with needs_grad[i]; shapes and dtypes must equal the inputs'. Runs
 * with grad mode and autocast off, using public ops. */
typedef kiln_status (*kiln_backward_fn)(const kiln_backward_ctx *ctx, kiln_tensor *const *grad_out,
                                        kiln_tensor **grad_in);

typedef struct kiln_op_info {
    const char *name;
    int n_in, n_out;
    kiln_precision precision;
    unsigned flags;
    uint32_t save;
    kiln_infer_fn infer;
    kiln_backward_fn backward; /* NULL for OPF_NONDIFF ops */
    const char *backward_name; /* "backward_add", or "NONE" */
} kiln_op_info;

/* The markdown table of docs/ops.md, generated from the op list (a test
 * keeps the file in sync). Caller frees with free(). */
char *kiln_ops_markdown(void);

const kiln_op_info *kiln_op_info_get(kiln_op_id op);
const char *kiln_precision_name(kiln_precision p);

/* ---- Kernel tables ---------------------------------------------------------------- */

/* Register a backend's kernels (an array of KILN_OP_COUNT entries, static
 * storage). View ops need none. Called from kiln_init. */
void kiln_ops_register_kernels(kiln_device_type type, const kiln_op_kernel *table);
/* The reference kernel for op on a device type (the table given to
 * kiln_ops_register_kernels); NULL if none is registered. */
const kiln_op_kernel *kiln_ops_kernel(kiln_device_type type, kiln_op_id op);

/* Fast kernel tables, consulted before the reference table in the order
 * they were registered (registering a table twice keeps one entry). An
 * entry is used when it has a run fn, its dtypes cover the output dtype
 * and its supports fn (if any) accepts the args; otherwise the next table
 * is tried, and the reference table last. kiln_init clears and refills
 * them (KILN_CPU_KERNELS=reference registers none). */
#define KILN_OPS_MAX_FAST_TABLES 4
void kiln_ops_register_fast_kernels(kiln_device_type type, const kiln_op_kernel *table);
void kiln_ops_clear_fast_kernels(kiln_device_type type);
/* How many fast tables are registered for `type` (0 for a bad type). */
int kiln_ops_fast_table_count(kiln_device_type type);
/* Whether a registered fast table of `type` has a kernel for op in dtype. */
bool kiln_ops_fast_covers(kiln_device_type type, kiln_op_id op, kiln_dtype dtype);
/* The kernel the dispatcher runs for op with these args and output dtype:
 * the first fast entry that takes them, else the reference entry (which
 * may be NULL or not cover dtype: the caller reports that). *fast says
 * which it was. With an input in an opaque layout only fast entries that
 * take layouts (kiln_op_kernel.layout) are asked; then the reference entry
 * is returned, and the dispatcher converts the input and asks again. */
const kiln_op_kernel *kiln_ops_select_kernel(kiln_device_type type, kiln_op_id op, kiln_dtype dtype,
                                             const kiln_op_args *args, bool *fast);
/* How many times the dispatcher has run a fast-table kernel for op since
 * the process started (tests check the fast path was really taken). */
uint64_t kiln_ops_fast_runs(kiln_op_id op);
void kiln_ops_count_fast_run(kiln_op_id op);
/* The CPU reference table (kernels/cpu), filled by the op groups. */
const kiln_op_kernel *kiln_cpu_op_kernels(void);

/* ---- The dispatcher ----------------------------------------------------------------- */

/* One op call as the hooks see it. Hooks may replace in[] entries (autocast
 * casts inputs): a replaced entry is a new reference the dispatcher drops
 * after the call. */
typedef struct kiln_op_call {
    kiln_op_id op;
    const kiln_op_info *info;
    int n_in, n_out;
    kiln_tensor *in[KILN_OP_MAX_IN];
    bool in_owned[KILN_OP_MAX_IN];
    kiln_tensor *out[KILN_OP_MAX_OUT];
    kiln_op_attrs *attrs;
    kiln_device device;
    void *hook_state[4]; /* one slot per hook kind, for begin -> end */
    int donate;          /* 1 + the input output 0 may be written into (kiln_dispatch_donating); 0: none */
} kiln_op_call;

typedef enum kiln_hook_kind {
    KILN_HOOK_PROFILER = 0, /* outermost */
    KILN_HOOK_AUTOCAST,
    KILN_HOOK_AUTOGRAD,
    KILN_HOOK_ANOMALY,
    KILN_HOOK_KIND_COUNT
} kiln_hook_kind;

/* begin runs before inference (outermost first); end runs after the kernel
 * (innermost first) with the outputs in place; `status` is the call's
 * status so far. Either may be NULL. */
typedef struct kiln_dispatch_hook {
    kiln_status (*begin)(kiln_op_call *call);
    kiln_status (*end)(kiln_op_call *call, kiln_status status);
} kiln_dispatch_hook;

/* Higher layers register their hook at kiln_init (includes point down). */
void kiln_dispatch_set_hook(kiln_hook_kind kind, const kiln_dispatch_hook *hook);

/* What the profiler observes beyond begin/end, registered at kiln_init.
 * kernel runs just before (before = true) and just after a dispatched
 * kernel; range_push/pop bracket each backward formula the autograd engine
 * runs, so the ops a formula calls nest under it. Any entry may be NULL. */
typedef struct kiln_op_observer {
    void (*kernel)(kiln_op_call *call, bool before);
    void (*range_push)(const char *name);
    void (*range_pop)(void);
} kiln_op_observer;
void kiln_dispatch_set_observer(const kiln_op_observer *observer);
/* Called by layers below the profiler (autograd) to open and close a range. */
void kiln_dispatch_range_push(const char *name);
void kiln_dispatch_range_pop(void);

/* The trace layer's recorder (src/trace/), installed on one thread while
 * kiln_trace records and NULL otherwise: the dispatcher pays one
 * predictable branch per kernel for it. `kernel` sees each kernel just
 * before it runs, with its final args (data pointers, workspace, prepared
 * copy); `reorder` sees the dispatcher convert an input of a kernel from
 * an opaque layout to strided (old_base: the storage's block before, now
 * freed; the storage holds the new one). A non-OK status fails the call. */
typedef struct kiln_dispatch_recorder {
    void *ctx;
    kiln_status (*kernel)(void *ctx, const kiln_op_call *call, const kiln_op_kernel *k, bool fast,
                          const kiln_op_args *args);
    kiln_status (*reorder)(void *ctx, const kiln_tensor *t, const void *old_base, kiln_layout old_layout);
} kiln_dispatch_recorder;
/* Install (NULL: remove) this thread's recorder; returns the previous one. */
const kiln_dispatch_recorder *kiln_dispatch_set_recorder(const kiln_dispatch_recorder *r);

/* The name of the innermost op this thread is dispatching, or NULL. */
const char *kiln_dispatch_current_op(void);
/* What the dispatcher of this thread is allocating: an op's outputs (or
 * nothing), a kernel's workspace, or a kernel's prepared copy of an input. */
typedef enum kiln_dispatch_alloc_kind {
    KILN_DISPATCH_ALLOC_OUTPUT = 0,
    KILN_DISPATCH_ALLOC_WORKSPACE,
    KILN_DISPATCH_ALLOC_PREPARED,
} kiln_dispatch_alloc_kind;
kiln_dispatch_alloc_kind kiln_dispatch_allocating(void);
/* Register the memory history's context provider (the op above and the
 * user's call site); kiln_init calls it. memory_context.c. */
void kiln_memory_context_register(void);
/* The context that provider gives (the op and the user's line), for a
 * provider that adds to it (kiln_plan's). */
struct kiln_alloc_context;
void kiln_memory_context_fill(struct kiln_alloc_context *out);

/* Run op: n_in inputs (NULL allowed where the op says optional), attrs.
 * On success out[0..n_out) are new references (never scope-registered:
 * public wrappers do that through kiln_api_return). `device` is used only
 * by creation ops. */
kiln_status kiln_dispatch(kiln_op_id op, int n_in, kiln_tensor *const *in, kiln_op_attrs *attrs,
                          kiln_device device, kiln_tensor **out);
/* kiln_dispatch, letting output 0 take input `donate`'s storage instead
 * of a new block when nothing else can see that input: the call holds the
 * only reference to the tensor and to its storage, the input is
 * contiguous at offset 0 with exactly the result's shape, dtype and
 * layout, and no input requires grad (nothing records the call). out[0]
 * is then a new reference to that input, written in place (its version
 * bumped). For ops whose kernels, on every backend, read each element of
 * that input before writing the same element of the output (elementwise
 * ops): the backward formulas donate the incoming gradient, which the
 * engine drops right after, so a ReLU's or an accumulation's gradient
 * needs no second buffer of the activation's size. */
kiln_status kiln_dispatch_donating(kiln_op_id op, int n_in, kiln_tensor *const *in, kiln_op_attrs *attrs,
                                   kiln_device device, kiln_tensor **out, int donate);
/* Convenience for public wrappers: enter the API, dispatch, return out[0]
 * through kiln_api_return (auxiliary outputs dropped, or written to `aux`
 * when not NULL, as new references). */
kiln_tensor *kiln_dispatch_public(kiln_op_id op, int n_in, kiln_tensor *const *in, kiln_op_attrs *attrs,
                                  kiln_tensor **aux);

#endif

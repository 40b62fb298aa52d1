/* What an op kernel receives: strided views of its inputs and outputs, the
 * op's attributes, a workspace and a stream. Kernels are arithmetic only:
 * they never allocate, never see a kiln_tensor, and run on data whose
 * dtypes the dispatcher has already made what the op's inference said.
 * Broadcasting has been applied: an input of a broadcasting op arrives
 * expanded to the output's shape (stride 0 on broadcast dims). */
#ifndef KILN_SRC_KERNELS_OP_ARGS_H
#define KILN_SRC_KERNELS_OP_ARGS_H

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_OP_MAX_IN 16 /* cat takes up to 16 inputs (ops.def) */
#define KILN_OP_MAX_OUT 4

typedef enum kiln_reduction {
    KILN_REDUCTION_NONE = 0,
    KILN_REDUCTION_MEAN,
    KILN_REDUCTION_SUM,
} kiln_reduction;

/* Attributes of one op call. Each op reads only the members its row in
 * ops.def documents; the rest stay zero. Grouped by the ops that use them. */
typedef struct kiln_op_attrs {
    /* scalars: add/sub alpha, scalar operands, clamp bounds, leaky slope,
     * pow exponent, dropout probability, fill values */
    double scalar[3];
    int flag; /* op-specific switch: gelu tanh, clamp has_min|has_max<<1, ... */
    /* dims: reductions, softmax, cat/stack, gather, flip, narrow, transpose */
    int n_dims;
    int dims[KILN_MAX_DIMS];
    bool keepdim;
    int64_t ints[KILN_MAX_DIMS * 2]; /* shapes (view), pad widths, narrow start/len */
    int n_ints;
    /* conv2d and pooling: (H, W) pairs */
    int64_t kernel[2], stride[2], padding[2], dilation[2];
    int64_t groups;
    bool ceil_mode;
    bool count_include_pad;
    /* losses */
    kiln_reduction reduction;
    int64_t ignore_index;
    double label_smoothing;
    /* batch norm */
    bool training;
    double momentum, eps;
    /* cast */
    kiln_dtype dtype;
    /* random ops (dropout, randperm): the draw keyed so a recompute
     * reproduces it */
    kiln_rng rng;
    /* dropout on CUDA: when not NULL, the draw is read from this device
     * memory when the kernel runs instead of `rng` (a CUDA graph's
     * per-replay generator position: src/trace/program_graph.c) */
    const kiln_rng *rng_dev;
} kiln_op_attrs;

typedef struct kiln_op_args {
    int n_in, n_out;
    kiln_strided in[KILN_OP_MAX_IN];
    kiln_strided out[KILN_OP_MAX_OUT];
    const kiln_op_attrs *attrs;
    void *workspace; /* workspace_bytes() bytes from the caching allocator */
    size_t workspace_bytes;
    void *stream; /* backend stream handle */
    /* The kernel's prepared copy of one input (kiln_op_prepare below), up
     * to date with that input's values; NULL when the kernel has none. */
    const void *prepared;
} kiln_op_args;

/* A converted copy of one input that a kernel keeps across calls — a
 * weight in the layout a library wants, a permuted weight matrix — the
 * CPU counterpart of a cached cuDNN filter. The kernel's prepare fn says,
 * for these args, which input (-1: none), the conversion's key (the same
 * key and bytes mean the same conversion) and the copy's size; the
 * dispatcher keeps the copy with that input's storage (from the caching
 * allocator, so it shows in the statistics), refills it with the kernel's
 * fill fn when the storage's version has changed since, frees it with the
 * storage, and hands it to the kernel in args->prepared. The fill fn may
 * use args->workspace.
 *
 * A lazy copy (lazy set) is filled only once the input has been seen at
 * the same version by two calls in a row; a call that finds it out of date
 * runs without it (its block stays allocated for the next fill): a weight
 * the optimizer moves between every call is then never copied, an
 * unchanged one (inference, an evaluation) from its second call on. The
 * kernel must run without the copy (args->prepared NULL) with the same
 * bits, and its workspace must cover that path. */
typedef struct kiln_op_prepare {
    int input;
    uint64_t key;
    size_t bytes;
    bool lazy;
} kiln_op_prepare;
typedef void (*kiln_op_prepare_fn)(const kiln_op_args *args, kiln_op_prepare *p);
typedef kiln_status (*kiln_op_fill_fn)(const kiln_op_args *args, void *dst);

typedef kiln_status (*kiln_op_kernel_fn)(const kiln_op_args *args);
/* Scratch bytes a kernel needs for these args (optional; NULL = none). */
typedef size_t (*kiln_op_workspace_fn)(const kiln_op_args *args);

/* Whether a kernel handles these args (shapes, strides, attributes; data
 * pointers may be NULL, as for workspace fns). Optional: NULL = every call
 * whose dtype is in `dtypes`. Fast kernels use it to decline layouts or
 * parameters they do not cover; the dispatcher then tries the next table. */
typedef bool (*kiln_op_supports_fn)(const kiln_op_args *args);

/* The layouts of a kernel's outputs (kiln/tensor.h, kiln_layout), for a
 * kernel that takes opaque layouts. Called after its supports fn accepted
 * the args, with the inputs as they are (args->in[i].layout) and the
 * outputs described by shape and dtype only (data NULL, layout strided,
 * contiguous strides); fills out_layouts[0..n_out), preset to strided.
 * An output given an opaque layout must be one that layout can describe. */
typedef void (*kiln_op_layout_fn)(const kiln_op_args *args, kiln_layout *out_layouts);

/* One backend's kernel for one op. `dtypes` is a bit mask (1u << dtype)
 * of the dtypes of out[0] the kernel handles. `layout` NULL (the rule):
 * the kernel sees strided tensors only — the dispatcher converts an input
 * in an opaque layout before asking its supports fn — and its outputs are
 * strided. Non-NULL: its supports fn sees inputs in any layout and declines
 * the ones it does not handle, and `layout` picks the outputs' layouts. */
typedef struct kiln_op_kernel {
    kiln_op_kernel_fn run;
    kiln_op_workspace_fn workspace;
    uint32_t dtypes;
    kiln_op_supports_fn supports; /* optional */
    kiln_op_layout_fn layout;     /* optional */
    kiln_op_prepare_fn prepare;   /* optional, with fill */
    kiln_op_fill_fn fill;
} kiln_op_kernel;

#define KILN_DT(d) (1u << (d))
#define KILN_DT_FLOAT (KILN_DT(KILN_F32) | KILN_DT(KILN_F64) | KILN_DT(KILN_F16) | KILN_DT(KILN_BF16))
#define KILN_DT_INT (KILN_DT(KILN_I32) | KILN_DT(KILN_I64) | KILN_DT(KILN_U8))
#define KILN_DT_ALL (KILN_DT_FLOAT | KILN_DT_INT | KILN_DT(KILN_BOOL))

#ifdef __cplusplus
}
#endif
#endif

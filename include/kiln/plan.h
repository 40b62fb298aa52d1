/* The memory plan of a training step (docs/memory.md, "Predicting a step's
 * memory: kiln plan"): one whole step of `kiln train` run on the meta
 * device, where every op infers its shapes, allocates (simulated) its
 * outputs and the workspace and prepared copies of the kernel the real
 * device would run, and the real caching allocator rounds, splits and
 * caches them over a simulated address range. Nothing is computed and no
 * device or host memory is touched beyond the planner's bookkeeping.
 *
 * The step is the first one of a run, as `kiln train` takes it:
 *   1. the loader's batch, as a loader with 0 workers makes it: pinned
 *      host buffers (kiln train pins them on every device), and on CUDA the
 *      device copy made on the loader's copy stream (with N workers, up to
 *      N * prefetch_factor more pinned batches and one more device batch
 *      can be alive, depending on timing: not planned);
 *   2. zero_grad (set to none), then kiln_accumulate_backward_scaled over
 *      `accum` micro-batches (autocast and the grad scaler with --amp;
 *      checkpoint segments placed by kiln_nn_sequential_checkpoint_by_memory
 *      on a batch of 2, as kiln train places them);
 *   3. the Adam step (kiln_adam_defaults), which creates its state, through
 *      the grad scaler's step and update where --amp f16 uses one;
 *   4. with steps 2, the next batch and a second step like it, where Adam's
 *      state is alive from the start: every later step is this one.
 * Before the step the model's parameters (and any prepared copies the
 * segment placement left) are allocated and the cache is emptied. */
#ifndef KILN_PLAN_H
#define KILN_PLAN_H

#include "kiln/base.h"
#include "kiln/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The parts of a step's memory at its peak of allocated bytes. Each block
 * alive then counts once, at its rounded (allocated) size, in the first
 * part it belongs to; the parts sum to the allocated peak. */
typedef enum kiln_plan_part {
    KILN_PLAN_PARAMETERS = 0,  /* the model's parameters and buffers */
    KILN_PLAN_GRADIENTS,       /* the parameters' .grad */
    KILN_PLAN_OPTIMIZER_STATE, /* Adam's moments */
    KILN_PLAN_BATCH,           /* the loader's batches (pinned host, device copies) */
    KILN_PLAN_ACTIVATIONS, /* forward results still alive (saved for backward), recomputed ones included */
    KILN_PLAN_TRANSIENT,  /* everything else: gradients flowing back, the loss, the optimizer's temporaries */
    KILN_PLAN_WORKSPACES, /* kernels' scratch for the op running; on CUDA the stream's persistent cuBLASLt workspace */
    KILN_PLAN_WEIGHT_COPIES, /* kernels' prepared copies of weights (e.g. oneDNN's blocked layouts) */
    KILN_PLAN_PARTS
} kiln_plan_part;

/* "parameters", "gradients", ...: the names the table and the JSON use. */
const char *kiln_plan_part_name(kiln_plan_part part);

typedef struct kiln_plan_opts {
    const char *model;               /* a model spec file (kiln/nn.h); with model_text, only its name */
    const char *model_text;          /* NULL, or the spec's text itself (kiln train's, which may come from a
                                      * checkpoint); the caller keeps it alive for the call */
    int64_t channels, height, width; /* the input; 0: from the file name (kiln_plan_input_from_name) */
    int64_t batch;                   /* >= 1 */
    kiln_device device;              /* cpu or cuda:N (needs a CUDA or emulated-CUDA build) */
    kiln_dtype amp;                  /* KILN_F32: off; KILN_F16 (with the grad scaler) or KILN_BF16 */
    int checkpoint;                  /* checkpoint segments; 0: off */
    int accum;                       /* micro-batches per step; 0 or 1: none */
    int steps; /* 0 or 1: the first step; 2: the first and the second (the steady state: Adam's state
                * alive through the forward and backward), the peaks over both */
} kiln_plan_opts;

/* kiln_plan_opts for the tutorial CNN at batch 128 on the CPU, f32. */
kiln_plan_opts kiln_plan_defaults(void);

/* The input CxHxW from a model file's name: "..._HxWxC.txt" (as
 * tutorial_cnn_28x28x1.txt), or a dataset named in it (cifar: 3x32x32,
 * mnist: 1x28x28). KILN_ERR_INVALID_ARGUMENT naming the file otherwise. */
kiln_status kiln_plan_input_from_name(const char *path, int64_t *channels, int64_t *height, int64_t *width);

/* One allocator's view of the step. */
typedef struct kiln_plan_memory {
    char name[32];             /* "cpu", "cuda:0", "pinned host" */
    int64_t allocated_peak;    /* bytes, rounded sizes */
    int64_t reserved_peak;     /* bytes in segments */
    int64_t requested_at_peak; /* what the live blocks asked for at the allocated peak */
    /* Where the allocated peak happens: the phase ("batch", "forward",
     * "backward", "backward (recompute)", "optimizer") and the op that was
     * allocating (empty where no op was, as in the batch's buffers).
     * Empty in a measurement. */
    char phase[32], op[48];
    int64_t parts[KILN_PLAN_PARTS]; /* at the allocated peak; 0 in a measurement */
} kiln_plan_memory;

typedef struct kiln_plan {
    kiln_plan_opts opts; /* as planned, the input size filled in (opts.model points to the caller's string) */
    int64_t param_count;
    int n_memories;             /* 1 on the CPU (its batch is pinned: [1]), 2 on CUDA */
    kiln_plan_memory memory[2]; /* [0]: the device; [1]: pinned host memory */
} kiln_plan;

/* Plan one step (above) on the meta device. *out is filled; errors name
 * the option at fault or the op that failed. Uses the meta device's
 * allocator and its memory history for the time of the call (do not use
 * meta from another thread meanwhile); meta's cache is emptied first.
 * Does not block; allocates only host bookkeeping. */
kiln_status kiln_plan_step(const kiln_plan_opts *opts, kiln_plan *out);

/* The same step for real on opts->device, with kiln train's loader (0
 * workers, pinned) over a dataset of zeros, to hold a plan against: the
 * allocator's peaks of allocated and of reserved bytes from the start of
 * the step (the device's cache emptied and its peak reset first; the
 * pinned pool's peak reset) to its end. Runs the kernels; blocks until
 * the device is done. parts, phase and op stay empty. */
kiln_status kiln_plan_measure(const kiln_plan_opts *opts, kiln_plan *out);

/* With a budget of `budget` bytes reserved on the device: the largest
 * batch whose planned step fits, in *batch (0: not even batch 1 fits), at
 * most `max_batch` (0: 1 << 20). Found by doubling, then bisection, so the
 * answer fits and the batch above it does not; the reserved peak steps
 * with segment sizes and is not strictly monotonic in the batch, so a
 * larger batch elsewhere may fit too. */
kiln_status kiln_plan_max_batch(const kiln_plan_opts *opts, int64_t budget, int64_t max_batch,
                                int64_t *batch);
/* The fewest checkpoint segments (2 and up, at most the Sequential's
 * layers) that make opts' step fit, in *segments: 0 when it fits without
 * checkpointing, -1 when no count does. */
kiln_status kiln_plan_min_checkpoint(const kiln_plan_opts *opts, int64_t budget, int *segments);

#ifdef __cplusplus
}
#endif

#endif

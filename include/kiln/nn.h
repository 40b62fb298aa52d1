/* Kiln nn: modules (layers with parameters, buffers and children) in the
 * shape of torch.nn.
 *
 * A module owns its parameters (leaf tensors that require grad), its
 * buffers (BatchNorm's running statistics) and its children, each by its
 * own reference: scopes never free them. kiln_module_free releases the
 * whole tree. Containers (Sequential, the residual blocks, custom modules)
 * take ownership of the children they are given, also on failure.
 *
 * Names follow PyTorch's state dict: a parameter `weight` of the child "0"
 * of the child "features" is "features.0.weight"; for each module its
 * parameters come first, then its buffers, then its children in the order
 * they were added.
 *
 * Initialisation is PyTorch's default, drawn from the device generator
 * (kiln_manual_seed makes it reproducible): Conv2d and Linear weights
 * U(-b, b) with b = gain * sqrt(3 / fan_in), gain = sqrt(2 / (1 + a^2)),
 * a = sqrt(5) (kaiming_uniform_), biases U(-1/sqrt(fan_in), 1/sqrt(fan_in));
 * BatchNorm weight 1, bias 0, running_mean 0, running_var 1.
 *
 * Modules are created on kiln_current_device() in f32; move them with
 * kiln_module_to / kiln_module_to_dtype. A move keeps each parameter's
 * and buffer's handle (its data is replaced, as `param.data = ...` would),
 * so an optimizer created before the move still trains the model, as in
 * PyTorch; an optimizer whose state (momentum, Adam's moments) already
 * exists keeps that state where it was, and its next step fails on the
 * device mismatch: move before the first step.
 *
 * Not thread-safe: one module is used from one thread at a time. */
#ifndef KILN_NN_H
#define KILN_NN_H

#include "kiln/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_module kiln_module;

/* A name and a borrowed tensor (valid while the module lives; a move with
 * kiln_module_to / kiln_module_to_dtype keeps the handle). */
typedef struct kiln_named_tensor {
    const char *name;
    kiln_tensor *tensor;
} kiln_named_tensor;

/* ---- Layers (new modules; NULL with an error on bad arguments) ----------------------- */

/* Constructors take 0 for "the default" wherever an op option does
 * (kiln_conv2d_opts, kiln_loss_opts): PyTorch's default value. */

/* Conv2d: weight (out, in/groups, k, k), bias (out) when `bias`. stride,
 * dilation and groups 0 mean PyTorch's 1; negative values are errors. */
kiln_module *kiln_nn_conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride,
                            int64_t padding, int64_t dilation, int64_t groups, bool bias);
/* Linear: weight (out, in), bias (out) when `bias`. */
kiln_module *kiln_nn_linear(int64_t in_features, int64_t out_features, bool bias);
#define KILN_NN_BN_EPS_DEFAULT      1e-5
#define KILN_NN_BN_MOMENTUM_DEFAULT 0.1
/* BatchNorm2d. eps and momentum 0 mean PyTorch's defaults (1e-5, 0.1); a
 * negative momentum keeps the running statistics fixed (PyTorch's
 * momentum=0; num_batches_tracked still counts). PyTorch's other defaults
 * are affine and track_running_stats true. Parameters weight/bias (C) when affine;
 * buffers running_mean/running_var (C, f32) and num_batches_tracked (i64
 * scalar) when tracking. Without running statistics it normalises with
 * batch statistics in eval mode too. */
kiln_module *kiln_nn_batch_norm2d(int64_t num_features, double eps, double momentum, bool affine,
                                  bool track_running_stats);
kiln_module *kiln_nn_relu(void);
/* approximate_tanh false: the exact erf form (PyTorch's default). */
kiln_module *kiln_nn_gelu(bool approximate_tanh);
kiln_module *kiln_nn_silu(void);
kiln_module *kiln_nn_sigmoid(void);
kiln_module *kiln_nn_tanh(void);
/* stride 0 = kernel (PyTorch's default). */
kiln_module *kiln_nn_max_pool2d(int64_t kernel, int64_t stride, int64_t padding);
kiln_module *kiln_nn_avg_pool2d(int64_t kernel, int64_t stride, int64_t padding);
kiln_module *kiln_nn_adaptive_avg_pool2d(int64_t out_h, int64_t out_w);
/* Identity in eval mode; inverted dropout with probability p in training. */
kiln_module *kiln_nn_dropout(double p);
/* nn.Flatten(start_dim=1, end_dim=-1) by default. */
kiln_module *kiln_nn_flatten(int start_dim, int end_dim);
/* Children named "0", "1", ...; takes ownership of the n modules (n may be 0:
 * the identity). */
kiln_module *kiln_nn_sequential(int n, kiln_module *const *modules);
/* Model parallelism, pipelined (GPipe; PyTorch's model-parallel tutorial's
 * "split size" schedule): stage i (children "0", "1", ...) is moved to
 * devices[i] (devices NULL: the stages stay where they are). Forward splits
 * dim 0 of the input into `micro_batches` (1..16; the first n % k get one
 * more sample) and runs each through the stages, moving activations with
 * kiln_to (differentiable: backward returns each gradient to its stage's
 * device); the host only queues work, so on devices with streams stage 0
 * computes micro-batch k+1 while stage 1 computes micro-batch k. The
 * outputs are concatenated on the last stage's device; the parameters'
 * gradients sum over the micro-batches, so the step equals the whole
 * batch's, except that BatchNorm in training normalises each micro-batch
 * with its own statistics (as GPipe does). Takes ownership of the stages,
 * also on failure; NULL with an error on bad arguments. Does not block. */
kiln_module *kiln_nn_pipeline(int n, kiln_module *const *stages, const kiln_device *devices, int micro_batches);
/* Model parallelism inside a Sequential (the placement call; kiln train
 * --split): stage i is children [first[i], first[i+1]) (the last one to
 * the end), moved to devices[i]; first[0] is 0, the others increase and
 * stay below the number of children, at most KILN_NN_MAX_PLACE_STAGES.
 * Forward then runs kiln_nn_pipeline's schedule with `micro_batches`
 * (1..16): each micro-batch goes through the stages in turn, its
 * activations moved with kiln_to to the device of the stage's first
 * parameter or buffer. The children keep their names, so the state dict
 * and checkpoints are those of the unplaced model. n 0 (first and devices
 * may be NULL) removes the placement, leaving the layers where they are.
 * Refused on a checkpointed Sequential, and kiln_nn_sequential_set_checkpoint
 * refuses a placed one (KILN_ERR_INVALID_ARGUMENT). A failure leaves the
 * placement unchanged, though layers already moved stay moved. Does not
 * block. */
#define KILN_NN_MAX_PLACE_STAGES 64
kiln_status kiln_nn_sequential_place(kiln_module *seq, int n, const int *first, const kiln_device *devices,
                                     int micro_batches);
/* The placed stages' first children (up to cap into first, which may be
 * NULL with cap 0) and the micro-batches (micro_batches may be NULL);
 * returns the stage count (0: not placed, or not a Sequential). */
int kiln_nn_sequential_placement(const kiln_module *seq, int *first, int cap, int *micro_batches);
/* DataParallel (PyTorch's nn.DataParallel): `module` (taken, also on
 * failure) becomes child "module", moved to devices[0] (the state dict's
 * names are "module.<name>", as PyTorch's). Forward scatters dim 0 over
 * the n devices (1..16, distinct; uneven splits: the first n % k get one
 * more sample), brings the persistent replicas on devices 1.. up to date
 * (their parameters are differentiable copies of the master's, so
 * backward sums every device's gradient into the master's .grad; their
 * buffers are refreshed when the master's change), then runs the shares
 * in parallel, one host thread per device: the calling thread runs the
 * master on devices[0], a persistent worker thread per other device runs
 * its replica with the caller's grad mode, autocast regions and current
 * streams. The outputs are gathered on output_device. A replica's error
 * comes back as the forward's, naming the device. BatchNorm in training
 * normalises each device's share with its own statistics, and only the
 * master's running statistics are updated (PyTorch's rule). The module
 * must not be run from two threads at once. Does not block beyond the
 * host work of the shares (the devices run asynchronously). */
kiln_module *kiln_nn_data_parallel(kiln_module *module, const kiln_device *devices, int n, kiln_device output_device);
/* A loss computed inside a replica: output and target are the share's, on
 * its device (borrowed); returns the share's mean loss, a one-element
 * tensor (a new reference), or NULL with an error. Runs on the replica's
 * host thread: it must not touch state other threads use. */
typedef kiln_tensor *(*kiln_nn_dp_loss_fn)(kiln_tensor *output, kiln_tensor *target, void *user);
/* DataParallel's forward with the loss computed in each replica (the
 * tutorials' remedy for the output device's load: only one scalar per
 * device is gathered, not the outputs). `target` is scattered along dim 0
 * as x is (same length). Returns sum_d (n_d / n) * loss_d on the output
 * device: the whole batch's mean loss for uneven shares too, so its
 * backward equals that of loss(dp(x), target) for a mean-reduced loss.
 * dp is a module from kiln_nn_data_parallel; x, target borrowed. */
kiln_tensor *kiln_nn_data_parallel_loss(kiln_module *dp, kiln_tensor *x, kiln_tensor *target, kiln_nn_dp_loss_fn loss,
                                        void *user);
/* What a training step's forward changes outside its graph, saved so that
 * a failed step (out of memory in forward or backward) can run again as if
 * it had not run: a copy of every buffer of the module (BatchNorm's running
 * statistics and batch count) and the seed and position of every device's
 * generator (dropout's draws). Parameters and optimizer state are not
 * saved: forward and backward do not change them. Gradients are not
 * saved: zero them before the retry. kiln train's out-of-memory recovery
 * takes one before each step (retake: no allocation after the first) and
 * restores it before running the step again with a smaller micro-batch.
 * take: NULL with an error when m is NULL or the copies cannot be made;
 * the module must outlive the snapshot. restore: KILN_ERR_STATE when a
 * buffer changed shape or device since (retake after moving the model).
 * The copies are queued on the buffers' devices; none blocks. */
typedef struct kiln_step_snapshot kiln_step_snapshot;
kiln_step_snapshot *kiln_step_snapshot_take(kiln_module *m);
kiln_status kiln_step_snapshot_retake(kiln_step_snapshot *s);
kiln_status kiln_step_snapshot_restore(kiln_step_snapshot *s);
void kiln_step_snapshot_free(kiln_step_snapshot *s);
/* Append `child` to a Sequential under the next index; takes ownership. */
kiln_status kiln_nn_sequential_append(kiln_module *seq, kiln_module *child);
/* Layer fusion in Sequential forwards (on by default; environment
 * KILN_NN_FUSION=0 starts it off): Conv2d, ReLU, MaxPool2d runs as
 * kiln_conv2d_relu_max_pool2d on the CPU when the pooling is a k x k
 * window at stride k without padding (nn.MaxPool2d(k)), else as conv2d +
 * kiln_relu_max_pool2d; Conv2d, ReLU as kiln_conv2d_relu; [Flatten(1,
 * -1),] Linear[, ReLU] as kiln_linear_act, when the layers are plain
 * built-ins with nothing in between. Results and gradients are those of
 * the layers run one by one. Process-wide; takes effect at the next
 * forward. Neither call blocks. */
void kiln_nn_set_fusion(bool enabled);
bool kiln_nn_fusion_enabled(void);
/* Gradient checkpointing of a Sequential (torch.utils.checkpoint.
 * checkpoint_sequential, kept on the module): with segments >= 2 each
 * forward with grad mode on splits the children into `segments` runs of
 * nearly equal length (a boundary never splits layers the Sequential fuses
 * into one op, so there may be fewer) and runs all but the last through
 * kiln_checkpoint (kiln/autograd.h), keeping only the segments' inputs;
 * their activations are recomputed in backward. Gradients, losses and
 * running statistics are those of the plain forward (bit for bit with
 * deterministic kernels). 0 or 1 turns it off. At most
 * KILN_NN_MAX_CHECKPOINT_SEGMENTS and at most the number of children
 * (KILN_ERR_INVALID_ARGUMENT naming both). Do not change it between a
 * forward and the backward through it. Does not block. */
#define KILN_NN_MAX_CHECKPOINT_SEGMENTS 64
kiln_status kiln_nn_sequential_set_checkpoint(kiln_module *seq, int segments);
/* The segments set (0 when off, or when m is not a Sequential). */
int kiln_nn_sequential_checkpoint_segments(const kiln_module *seq);
/* Checkpointing with the segments placed by the caller: segment k runs
 * children [starts[k], starts[k+1]) (the last one to the end); starts[0]
 * is 0, the others increase and stay below the number of children, and
 * none splits a fused run (KILN_ERR_INVALID_ARGUMENT naming the child).
 * count 0 or 1 turns it off. All but the last segment are checkpointed.
 * Does not block. */
kiln_status kiln_nn_sequential_set_checkpoint_starts(kiln_module *seq, int count, const int *starts);
/* The segments' first children (up to cap of them into starts); returns
 * the segment count (0: off). Does not block. */
int kiln_nn_sequential_checkpoint_starts(const kiln_module *seq, int *starts, int cap);
/* Checkpointing in `segments` segments placed by memory rather than by
 * layer count. A forward of `sample` (a batch of a few inputs of the
 * training shape on the training device; its values do not matter) with
 * grad mode on measures what each layer, or each run of layers the
 * Sequential fuses, keeps in the allocator (its output and what it saves
 * for backward) and the size of its output. It runs twice and the second
 * is measured: the first makes what a model keeps from its first forward
 * on (the kernels' prepared weight copies), so a fresh model and one that
 * has already run get the same placement. Every placement of the
 * segments is then scored by an estimate of the step's peak (the largest
 * of: each checkpointed segment's recompute with the inputs still held
 * and the gradients in flight, the last segment's backward with every
 * checkpointed segment's input held) and the lowest wins, so layers with
 * large activations get segments of their own (more placements than a
 * million: segments start where the current one would pass 1/segments of
 * the kept bytes). A checkpointed segment that is one residual block (a
 * layer with a Sequential child "body" of two or more layers:
 * kiln_nn_residual, `residual { }` in a model spec) has that body
 * checkpointed in 2 segments as well when keeping the block whole during
 * its recompute would raise the estimate (the split costs one more forward
 * of the body's first half); this call first turns off such body
 * checkpointing it may have set before. The measuring forward updates no
 * running statistics, leaves the generators where they were and frees
 * what it made; it runs in the caller's autocast state and blocks like a
 * forward. layer_bytes (NULL, or one entry per child) gets the measured
 * kept bytes per child (0 for a child inside a fused run: its run's first
 * child has the run's). segments 0 or 1: off; more segments than children
 * is KILN_ERR_INVALID_ARGUMENT. */
kiln_status kiln_nn_sequential_checkpoint_by_memory(kiln_module *seq, kiln_tensor *sample, int segments,
                                                    int64_t *layer_bytes);
/* PyTorch's CIFAR BasicBlock: children conv1 (3x3, stride, no bias), bn1,
 * conv2 (3x3, no bias), bn2, shortcut (an empty Sequential, or a Sequential
 * of a 1x1 conv with `stride` and a BatchNorm2d when stride != 1 or
 * in != out). Output relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)). */
kiln_module *kiln_nn_basic_block(int64_t in_channels, int64_t out_channels, int64_t stride);
/* A generic residual block: relu(body(x) + shortcut(x)), children "body"
 * and "shortcut" (shortcut NULL: the identity, an empty Sequential). Takes
 * ownership of both. */
kiln_module *kiln_nn_residual(kiln_module *body, kiln_module *shortcut);

/* A module with a user-written forward (a PyTorch subclass of nn.Module).
 * forward receives the module, a borrowed input and `user`; it returns a new
 * reference. It runs inside the library: results of public calls it makes
 * are not registered with scopes, so it releases its intermediates with
 * kiln_release. Add children (kiln_module_add_child) and parameters
 * (kiln_module_add_parameter) after creating it. */
typedef kiln_tensor *(*kiln_module_forward_fn)(kiln_module *m, kiln_tensor *x, void *user);
kiln_module *kiln_nn_custom(const char *kind, kiln_module_forward_fn forward, void *user);

/* ---- Structure --------------------------------------------------------------------- */

/* Release the module, its children, parameters and buffers (NULL: no-op).
 * Tensors the user still holds references to stay alive. */
void kiln_module_free(kiln_module *m);
/* "Conv2d", "Linear", "BatchNorm2d", "Sequential", ... (the kind given to a
 * custom module). Borrowed. */
const char *kiln_module_kind(const kiln_module *m);
/* Add a named child (names are unique across a module's children,
 * parameters and buffers, and contain no '.'); takes ownership of child,
 * also on failure. Names are hashed: adding or finding a member by name
 * costs O(1) however many the module has. */
kiln_status kiln_module_add_child(kiln_module *m, const char *name, kiln_module *child);
/* Register t as a parameter named `name`: the module takes its own
 * reference and marks it requires_grad. */
kiln_status kiln_module_add_parameter(kiln_module *m, const char *name, kiln_tensor *t);
/* Register t as a buffer (not trained, saved in the state dict). */
kiln_status kiln_module_add_buffer(kiln_module *m, const char *name, kiln_tensor *t);
/* The direct child named `name` ("0" in a Sequential), borrowed; NULL
 * with an error when there is none. */
kiln_module *kiln_module_child(kiln_module *m, const char *name);
int kiln_module_num_children(const kiln_module *m);
/* The i-th child, borrowed; *name (if not NULL) gets its name. */
kiln_module *kiln_module_child_at(kiln_module *m, int i, const char **name);

/* ---- Forward and modes ---------------------------------------------------------------- */

/* Run the module on x: a new reference (owned by the innermost scope when
 * called by the user). Queues work on the current stream; does not block. */
kiln_tensor *kiln_module_forward(kiln_module *m, kiln_tensor *x);
/* Set training (true) or eval (false) mode on m and all its descendants.
 * Modules start in training mode. */
void kiln_module_train(kiln_module *m, bool training);
bool kiln_module_is_training(const kiln_module *m);

/* ---- Parameters, buffers and the state dict --------------------------------------------
 * The listing functions return one malloc'd block (names included) that the
 * caller frees with free(); the tensors are borrowed. */

kiln_status kiln_module_named_parameters(kiln_module *m, kiln_named_tensor **items, int *n);
kiln_status kiln_module_named_buffers(kiln_module *m, kiln_named_tensor **items, int *n);
/* Parameters then buffers of each module, depth first: PyTorch's order. */
kiln_status kiln_module_state_dict(kiln_module *m, kiln_named_tensor **items, int *n);
/* The parameters as an array of borrowed tensors (for an optimizer); free
 * the array with free(). */
kiln_status kiln_module_parameters(kiln_module *m, kiln_tensor ***params, int *n);
/* Total number of parameter elements. */
int64_t kiln_module_num_parameters(kiln_module *m);
/* The parameter or buffer named `key` ("features.0.weight"): a new
 * reference; NULL with an error naming the key when there is none. */
kiln_tensor *kiln_module_state_get(kiln_module *m, const char *key);
/* Copy `value` into the parameter or buffer `key` (under no_grad, in
 * place, so optimizers keep working). The shape must match exactly;
 * floating values convert between floating dtypes, integer buffers take
 * integer values only. Errors name the key, both shapes or dtypes. Copies
 * from host memory block. */
kiln_status kiln_module_state_set(kiln_module *m, const char *key, kiln_tensor *value);
/* What a state dict and a module disagree on, PyTorch's _IncompatibleKeys:
 * the module's keys the state dict does not give (missing_keys) and the
 * state dict's keys the module does not have (unexpected_keys), each a
 * malloc'd array of malloc'd names, in the module's and the state dict's
 * order. The caller owns them: kiln_incompatible_keys_free. */
typedef struct kiln_incompatible_keys {
    char **missing_keys;
    int n_missing;
    char **unexpected_keys;
    int n_unexpected;
} kiln_incompatible_keys;
/* Free both lists and zero *keys (NULL and a zeroed struct are no-ops). */
void kiln_incompatible_keys_free(kiln_incompatible_keys *keys);
/* Load a state dict (items borrowed; values copied in place as
 * kiln_module_state_set does, which blocks for copies from host memory).
 * strict: every key of the module must be given and no other key may
 * appear; otherwise the error lists every missing and unexpected key (as
 * many as the message holds) and nothing is loaded. Not strict: the keys
 * that match are loaded, the rest reported in *result; loading nothing at
 * all (no key matches, while the module or the state dict has keys) is an
 * error, since it is a renamed or prefixed state dict more often than an
 * intent. result may be NULL: then keys left out are logged as a warning.
 * Where given, *result is filled in every case (on errors too, except when
 * the lists themselves could not be allocated): the caller frees it with
 * kiln_incompatible_keys_free. */
kiln_status kiln_module_load_state_dict(kiln_module *m, const kiln_named_tensor *items, int n, bool strict,
                                        kiln_incompatible_keys *result);
/* Free (set_to_none, PyTorch's default) or zero every parameter's grad. */
kiln_status kiln_module_zero_grad(kiln_module *m, bool set_to_none);

/* ---- Devices and dtypes ------------------------------------------------------------------ */

/* Move every parameter, buffer (and existing gradient) to `device`, in
 * place: the handles stay the same (kiln_named_tensor pointers and an
 * optimizer's parameters remain valid). Copies between host and device
 * block unless the backend queues them. */
kiln_status kiln_module_to(kiln_module *m, kiln_device device);
/* Convert floating parameters and buffers to `dtype` (a floating dtype).
 * Under f16/bf16, BatchNorm's parameters and running statistics stay f32
 * (BatchNorm in float32, its output follows its input's dtype); f64
 * converts them too, as PyTorch's .double() does. */
kiln_status kiln_module_to_dtype(kiln_module *m, kiln_dtype dtype);

/* ---- Model specs ----------------------------------------------------------------------
 * A plain-text model, one layer per line ('#' starts a comment):
 *   conv OUT kK [pP] [sS] [nobias]   Conv2d (in-channels inferred), padding 0, stride 1 by default
 *   relu | gelu                       activations
 *   maxpool K [sS] [pP]              MaxPool2d (stride K by default); avgpool likewise
 *   adaptiveavgpool N                AdaptiveAvgPool2d to N x N
 *   flatten                          (C, H, W) -> C*H*W features
 *   linear OUT [nobias]              Linear (in-features inferred; needs flat input)
 *   dropout P                        Dropout, 0 <= P < 1
 *   batchnorm                        BatchNorm2d over the current channels
 *   residual {  ...  }              relu(body(x) + shortcut(x)) (kiln_nn_residual): the
 *                                    shortcut is the identity when the body keeps the shape,
 *                                    else a 1x1 conv (no bias, stride from the sizes) + BatchNorm
 * The result is a Sequential (children "0", "1", ...; a residual block's
 * children "body" and "shortcut") for inputs (N, channels, height, width).
 * Every number in a spec, and each input size, is 1..2^30 (padding
 * 0..2^30), and a spec holds at most KILN_MODEL_SPEC_MAX_LAYERS layers (a
 * residual block and each layer of its body count one each).
 * Errors (KILN_ERR_INVALID_ARGUMENT) read "NAME:LINE: ..." with the line's
 * text and the expected form; a shape mismatch names both lines and the
 * shape. On success *out is a new module the caller frees with
 * kiln_module_free; on failure *out is NULL. Does not block. */
kiln_status kiln_model_spec_parse(const char *text, const char *name, int64_t channels, int64_t height, int64_t width,
                                  kiln_module **out);
/* The same over `size` bytes of text that need not end in NUL (a NUL byte
 * inside is an error). */
kiln_status kiln_model_spec_parse_n(const char *text, size_t size, const char *name, int64_t channels, int64_t height,
                                    int64_t width, kiln_module **out);
/* The most layers a model spec may hold: an order of magnitude above the
 * deepest published CNN written as a spec (ResNet-1202, about 4,800
 * lines), and a quarter of what the 1 MiB a spec file may hold could ask
 * for ("relu" lines), so that untrusted text cannot make hundreds of
 * thousands of modules. */
#define KILN_MODEL_SPEC_MAX_LAYERS 65536
/* The default limits of kiln_model_spec_budget that the kiln command
 * applies to every spec it parses (--model or a checkpoint's), raised
 * with KILN_MAX_PARAMETERS and KILN_MAX_ACTIVATION: 2^28 parameters
 * (1 GiB of f32 weights, 4 GiB with gradients and Adam's two moments;
 * VGG-16 has 138 M) and 2^26 values in one sample's largest layer output
 * (256 MiB of f32 per sample; VGG-16 on 224x224 images needs 3.2 M). */
#define KILN_MODEL_SPEC_DEFAULT_MAX_PARAMETERS (INT64_C(1) << 28)
#define KILN_MODEL_SPEC_DEFAULT_MAX_ACTIVATION (INT64_C(1) << 26)
/* Limits on a spec, and what the spec parsed needs. */
typedef struct kiln_model_spec_budget {
    /* In (0: no limit): the model's parameters (kiln_module_num_parameters'
     * count), and the values of one sample of any layer's output (C*H*W,
     * or the features once flat). */
    int64_t max_parameters, max_activation;
    /* Out (INT64_MAX where a count overflows): the model's parameters and
     * its largest layer output per sample; on failure, the counts up to
     * and including the line that failed, so a count above its limit says
     * which limit refused the spec. */
    int64_t parameters, largest_activation;
} kiln_model_spec_budget;
/* kiln_model_spec_parse_n within a budget (NULL: none). The first layer
 * past a limit is an error naming its line, its count and the limit; a
 * layer's parameters are counted before any of it is allocated, so a
 * mistyped width ('linear 5120000') or untrusted text costs nothing. A
 * negative limit is an error. Does not block. */
kiln_status kiln_model_spec_parse_limited(const char *text, size_t size, const char *name, int64_t channels,
                                          int64_t height, int64_t width, kiln_model_spec_budget *budget,
                                          kiln_module **out);
/* kiln_model_spec_parse_limited without building: the same checks, the
 * same errors and the same counts in *budget (NULL: no limits), but no
 * module is made and no parameter storage allocated (the parser's few
 * KiB only). For validating untrusted text before paying for the model,
 * and for fuzzing the parser alone. KILN_OK means parse_limited would
 * accept the text, unless memory runs out while it builds. Does not
 * block. */
kiln_status kiln_model_spec_check(const char *text, size_t size, const char *name, int64_t channels, int64_t height,
                                  int64_t width, kiln_model_spec_budget *budget);
/* Read the spec file `path` (at most 1 MiB) and parse it; errors name the
 * path. KILN_ERR_IO when it cannot be read. */
kiln_status kiln_model_spec_load(const char *path, int64_t channels, int64_t height, int64_t width,
                                 kiln_module **out);

#ifdef __cplusplus
}
#endif

/* The forward records the caller's line (kiln/ops.h's call-site macros),
 * so the ops a module runs, and the ops around it, name the user's line. */
#if !defined(KILN_NO_SITE_MACROS)
#define kiln_module_forward(...) KILN_SITE_CALL(kiln_module_forward, __VA_ARGS__)
#define kiln_nn_data_parallel_loss(...) KILN_SITE_CALL(kiln_nn_data_parallel_loss, __VA_ARGS__)
#endif
#endif /* KILN_NN_H */

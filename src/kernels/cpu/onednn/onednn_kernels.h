/* The oneDNN kernels of the fast CPU table (src/ops/cpu_fast_table.c):
 * f32 convolution (forward with bias, input gradient, weight gradient)
 * on contiguous NCHW / OIHW tensors, and f32 mm / bmm / linear on operands
 * whose matrices are row- or column-major (transposed views included).
 * Each op has run, workspace (oneDNN's scratchpad size) and supports
 * (declines what it does not cover, so the dispatcher falls back to the
 * reference kernel). Compiled with KILN_WITH_ONEDNN only. */
#ifndef KILN_SRC_KERNELS_CPU_ONEDNN_ONEDNN_KERNELS_H
#define KILN_SRC_KERNELS_CPU_ONEDNN_ONEDNN_KERNELS_H

#ifdef KILN_WITH_ONEDNN
#include "kernels/op_args.h"

kiln_status kiln_onednn_conv2d(const kiln_op_args *a);
size_t kiln_onednn_conv2d_workspace(const kiln_op_args *a);
bool kiln_onednn_conv2d_supports(const kiln_op_args *a);
kiln_status kiln_onednn_conv2d_grad_input(const kiln_op_args *a);
size_t kiln_onednn_conv2d_grad_input_workspace(const kiln_op_args *a);
bool kiln_onednn_conv2d_grad_input_supports(const kiln_op_args *a);
kiln_status kiln_onednn_conv2d_grad_weight(const kiln_op_args *a);
size_t kiln_onednn_conv2d_grad_weight_workspace(const kiln_op_args *a);
bool kiln_onednn_conv2d_grad_weight_supports(const kiln_op_args *a);

/* Layout fns (op_args.h): the forward's output and the input gradient in
 * nChw16c where oneDNN chose that layout; the weight gradient strided. */
void kiln_onednn_conv2d_layout(const kiln_op_args *a, kiln_layout *out);
void kiln_onednn_conv2d_grad_input_layout(const kiln_op_args *a, kiln_layout *out);
void kiln_onednn_conv2d_grad_weight_layout(const kiln_op_args *a, kiln_layout *out);

/* conv2d_relu: the forward convolution with ReLU fused (a oneDNN post-op). */
kiln_status kiln_onednn_conv2d_relu(const kiln_op_args *a);
size_t kiln_onednn_conv2d_relu_workspace(const kiln_op_args *a);
bool kiln_onednn_conv2d_relu_supports(const kiln_op_args *a);
void kiln_onednn_conv2d_relu_layout(const kiln_op_args *a, kiln_layout *out);

/* Prepared weights (op_args.h, kiln_op_prepare): the weights in the layout
 * each pass's convolution chose, kept with the weight tensor. */
void kiln_onednn_conv2d_prepare(const kiln_op_args *a, kiln_op_prepare *p);
kiln_status kiln_onednn_conv2d_fill(const kiln_op_args *a, void *dst);
void kiln_onednn_conv2d_grad_input_prepare(const kiln_op_args *a, kiln_op_prepare *p);
kiln_status kiln_onednn_conv2d_grad_input_fill(const kiln_op_args *a, void *dst);
void kiln_onednn_conv2d_relu_prepare(const kiln_op_args *a, kiln_op_prepare *p);
kiln_status kiln_onednn_conv2d_relu_fill(const kiln_op_args *a, void *dst);

/* conv2d_relu_max_pool2d (onednn_conv_pool.c): conv2d's entry points on
 * the convolution's args (kernels/conv_pool.h), called in pool mode. */
kiln_status kiln_onednn_conv2d_relu_max_pool2d(const kiln_op_args *a);
size_t kiln_onednn_conv2d_relu_max_pool2d_workspace(const kiln_op_args *a);
bool kiln_onednn_conv2d_relu_max_pool2d_supports(const kiln_op_args *a);
void kiln_onednn_conv2d_relu_max_pool2d_layout(const kiln_op_args *a, kiln_layout *out);
void kiln_onednn_conv2d_relu_max_pool2d_prepare(const kiln_op_args *a, kiln_op_prepare *p);
kiln_status kiln_onednn_conv2d_relu_max_pool2d_fill(const kiln_op_args *a, void *dst);
/* Pool mode, for this thread's calls of the conv2d entry points until it
 * is turned off: the algorithm is the autotuner's default pick, never a
 * timed one (the fused op's workspace is sized before its run, and a pick
 * timed or cached in between could need more), chosen for a forward whose
 * output only a window x window pooling reads; with y and ix, a forward that
 * kiln_onednn_conv2d_pools accepts writes no output but the 2x2 pooling
 * of relu(y) into y and ix (onednn_winograd.h, pool_y). */
void kiln_onednn_conv2d_pool_mode(bool on, int64_t window, float *y, int64_t *ix);
/* In pool mode: whether the forward's algorithm pools its own output
 * (Kiln's Winograd into a blocked output, its tiles; the small-channel
 * forward into nChw8c, each image's planes in the workspace). */
bool kiln_onednn_conv2d_pools(const kiln_op_args *a);
/* Pool mode for the weight gradient: kiln_onednn_conv2d_grad_weight
 * reads the gradient of its output through the pooling instead of its
 * input 0 (go, y, ix: relu_max_pool2d's pooled gradient, values and
 * indices) and writes each (n, k) plane's gradient sum into part (N x K
 * doubles), where kiln_onednn_conv2d_grad_weight_pools accepts the call
 * (the small-channel weight gradient with an nChw8c gradient); NULLs turn
 * it back into plain pool mode. */
void kiln_onednn_conv2d_grad_weight_pool_inputs(const float *go, const float *y, const int64_t *ix, double *part);
bool kiln_onednn_conv2d_grad_weight_pools(const kiln_op_args *a);
/* For the bf16 fused op: whether the forward's plan computes into NHWC
 * (oneDNN's choice for bf16 on AMX and AVX512-BF16) and reorders that to the
 * NCHW output. Where it does (the caller asks first: the plan is not
 * checked again on this hot path), kiln_onednn_conv2d_nhwc runs the
 * convolution without the reorder and sets *nhwc to its NHWC output, which
 * lies in the workspace. Blocks the host. */
bool kiln_onednn_conv2d_nhwc_out(const kiln_op_args *a);
kiln_status kiln_onednn_conv2d_nhwc(const kiln_op_args *a, const void **nhwc);

/* conv2d_relu_max_pool2d_grad_weight (onednn_conv_pool.c). */
kiln_status kiln_onednn_conv2d_relu_max_pool2d_grad_weight(const kiln_op_args *a);
size_t kiln_onednn_conv2d_relu_max_pool2d_grad_weight_workspace(const kiln_op_args *a);
bool kiln_onednn_conv2d_relu_max_pool2d_grad_weight_supports(const kiln_op_args *a);
void kiln_onednn_conv2d_relu_max_pool2d_grad_weight_layout(const kiln_op_args *a, kiln_layout *out);

kiln_status kiln_onednn_mm(const kiln_op_args *a);
kiln_status kiln_onednn_bmm(const kiln_op_args *a);
kiln_status kiln_onednn_linear(const kiln_op_args *a);
size_t kiln_onednn_mm_workspace(const kiln_op_args *a);
size_t kiln_onednn_bmm_workspace(const kiln_op_args *a);
size_t kiln_onednn_linear_workspace(const kiln_op_args *a);
bool kiln_onednn_mm_supports(const kiln_op_args *a);
bool kiln_onednn_bmm_supports(const kiln_op_args *a);
bool kiln_onednn_linear_supports(const kiln_op_args *a);
/* linear_act (x (N, *) flattened, weight, bias?, attrs.flag 0 none / 1
 * ReLU); x strided-contiguous or nChw16c; the output strided. */
kiln_status kiln_onednn_linear_act(const kiln_op_args *a);
size_t kiln_onednn_linear_act_workspace(const kiln_op_args *a);
bool kiln_onednn_linear_act_supports(const kiln_op_args *a);
void kiln_onednn_linear_act_layout(const kiln_op_args *a, kiln_layout *out);
/* With an nChw16c x: the weight's columns permuted to x's blocked order,
 * kept with the weight, so the matmul reads x as it is. */
void kiln_onednn_linear_act_prepare(const kiln_op_args *a, kiln_op_prepare *p);
kiln_status kiln_onednn_linear_act_fill(const kiln_op_args *a, void *dst);

/* The convolution's autotuner provider (kernels/autotune.h): candidates
 * "direct" (the default), "direct_plain" and "winograd"
 * (onednn_conv.c). Its ctx is internal to onednn_conv.c: only the conv
 * kernels above call the tuner with it. */
struct kiln_autotune_provider;
const struct kiln_autotune_provider *kiln_onednn_conv_provider(void);
/* Tests and measurements: make every oneDNN convolution use algorithm
 * `name` ("direct", "direct_plain", "winograd"), bypassing the
 * autotuner; where it does not build, the kernels decline and the
 * reference kernels run. NULL: back to the autotuner. Process-wide. */
kiln_status kiln_onednn_conv_force_algorithm(const char *name);

/* Destroys every cached primitive, the stream and the engine (called by
 * kiln_shutdown; the next call creates them again). */
void kiln_onednn_shutdown(void);
#endif
#endif

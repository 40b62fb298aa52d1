/* Harness cases of the fused ops: conv2d_relu, linear_act,
 * relu_max_pool2d, relu_max_pool2d_backward (and its _sum) and conv2d_relu_max_pool2d. The references are the
 * unfused chains' float64 references (cases_nn.c's conv2d and pooling
 * loops, which must be included first) followed or preceded by relu, and
 * plain loops for linear_act and the fused backward. Inputs of the relu
 * ops stay away from relu's kink where finite differences look (normal
 * values for the convolution, +-[0.5, 1.5) before the pooling). Every
 * file-scope name starts with fused_ (harness.h's naming rule). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/harness.h"

static double fused_relu1(double v) { return v > 0 || isnan(v) ? v : 0.0; }

/* ---- conv2d_relu ----------------------------------------------------------------- */

static kiln_tensor *fused_run_conv2d_relu(kh_run *r) {
    const kiln_op_attrs *a = r->attrs;
    kiln_conv2d_opts o = {.stride = {a->stride[0], a->stride[1]},
                          .padding = {a->padding[0], a->padding[1]},
                          .dilation = {a->dilation[0], a->dilation[1]},
                          .groups = a->groups};
    return kiln_conv2d_relu(r->in[0], r->in[1], r->in[2], &o);
}

static void fused_ref_conv2d_relu(kh_ref *r) {
    nn_ref_conv2d(r);
    int64_t n = kh_numel(r->out_shape[0]);
    for (int64_t i = 0; i < n; i++) r->out[0][i] = fused_relu1(r->out[0][i]);
}

/* ---- linear_act -------------------------------------------------------------------- */

static kiln_tensor *fused_run_linear_act(kh_run *r) {
    return kiln_linear_act(r->in[0], r->in[1], r->in[2], (kiln_activation)r->attrs->flag);
}

/* x (N, ...) read row-major as (N, K). */
static void fused_ref_linear_act(kh_ref *r) {
    kiln_shape xs = r->shape[0];
    int64_t N = xs.d[0], K = kh_numel(xs) / (N ? N : 1), O = r->shape[1].d[0];
    double *y = kh_out(r, 0, KILN_SHAPE(N, O), 0);
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < O; o++) {
            double s = r->in[2] ? r->in[2][o] : 0;
            for (int64_t k = 0; k < K; k++) s += r->in[0][n * K + k] * r->in[1][o * K + k];
            y[n * O + o] = r->attrs->flag == 1 ? fused_relu1(s) : s;
        }
}

/* ---- relu_max_pool2d -------------------------------------------------------------- */

static kiln_tensor *fused_run_relu_max_pool2d(kh_run *r) {
    kiln_pool2d_opts o = nn_pool_opts(r->attrs);
    return kiln_relu_max_pool2d(r->in[0], &o, &r->aux[0]);
}

/* max_pool2d's reference on relu(x): values and indices. */
static void fused_ref_relu_max_pool2d(kh_ref *r) {
    int64_t n = kh_numel(r->shape[0]);
    double *x = malloc((size_t)(n ? n : 1) * sizeof(double));
    if (!x) abort();
    for (int64_t i = 0; i < n; i++) x[i] = fused_relu1(r->in[0][i]);
    const double *orig = r->in[0];
    r->in[0] = x;
    nn_ref_max_pool2d(r);
    r->in[0] = orig;
    free(x);
}

/* (grad_out, y, indices) -> grad_input, input shape in attrs.ints: the
 * gradients whose y > 0 summed at their index within the plane. */
static kiln_tensor *fused_run_relu_pool_backward(kh_run *r) {
    return nn_run_direct(r, KILN_OP_RELU_MAX_POOL2D_BACKWARD);
}

static void fused_ref_relu_pool_backward(kh_ref *r) {
    const kiln_op_attrs *a = r->attrs;
    kiln_shape xs = {.ndim = a->n_ints};
    for (int i = 0; i < a->n_ints; i++) xs.d[i] = a->ints[i];
    double *dx = kh_out(r, 0, xs, 0);
    int64_t P, H, W, Ho, Wo, Pg;
    nn_planes(xs, &P, &H, &W);
    nn_planes(r->shape[0], &Pg, &Ho, &Wo);
    for (int64_t p = 0; p < P; p++)
        for (int64_t i = 0; i < Ho * Wo; i++) {
            int64_t o = p * Ho * Wo + i;
            if (!(r->in[1][o] > 0)) continue;
            dx[p * H * W + (int64_t)r->in[2][o]] += r->in[0][o];
        }
}

/* (grad_out, y, indices) -> (grad_input, its sums over N, H, W per channel). */
static kiln_tensor *fused_run_relu_pool_backward_sum(kh_run *r) {
    kiln_op_attrs at = *r->attrs;
    kiln_tensor *out[KILN_OP_MAX_OUT] = {NULL};
    if (kiln_dispatch(KILN_OP_RELU_MAX_POOL2D_BACKWARD_SUM, r->n_in, r->in, &at, r->device, out)) return NULL;
    r->aux[0] = out[1];
    return out[0];
}

static void fused_ref_relu_pool_backward_sum(kh_ref *r) {
    fused_ref_relu_pool_backward(r);
    const kiln_op_attrs *a = r->attrs;
    int64_t N = a->ints[0], C = a->ints[1], HW = a->ints[2] * a->ints[3];
    double *sums = kh_out(r, 1, KILN_SHAPE(C), 0);
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t i = 0; i < HW; i++) sums[c] += r->out[0][(n * C + c) * HW + i];
}

/* ---- conv2d_relu_max_pool2d_grad_weight ----------------------------------------------- */

/* The convolution's output size for x (N, C, H, W) and the weight shape in attrs.ints. */
static void fused_conv_out(const kiln_op_attrs *a, kiln_shape xs, int64_t *oh, int64_t *ow) {
    *oh = (xs.d[2] + 2 * a->padding[0] - a->dilation[0] * (a->ints[2] - 1) - 1) / a->stride[0] + 1;
    *ow = (xs.d[3] + 2 * a->padding[1] - a->dilation[1] * (a->ints[3] - 1) - 1) / a->stride[1] + 1;
}

/* Input 2 holds each window's argmax as a position in [0, p * p): as a
 * plane index of the convolution's output (what the forward gives; CUDA's
 * backward looks for an element's gradient only in its own windows). */
static int64_t fused_window_index(double pos, int64_t i, int64_t pw, int64_t p, int64_t ow) {
    int64_t q = (int64_t)pos, oh = i / pw, w = i % pw;
    return (oh * p + q / p) * ow + w * p + q % p;
}

/* (grad_out, y, indices, x) -> (grad_weight, grad_bias): the fused op's
 * attrs, attrs.ints the weight's shape. */
static kiln_tensor *fused_run_conv_pool_wgrad(kh_run *r) {
    kiln_op_attrs at = *r->attrs;
    kiln_shape ps = kiln_shape_of(r->in[2]);
    int64_t n = kiln_numel(r->in[2]), plane = ps.d[2] * ps.d[3], oh, ow;
    fused_conv_out(&at, kiln_shape_of(r->in[3]), &oh, &ow);
    int64_t *ix = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    kiln_tensor *ic = kiln_contiguous(r->in[2]);
    if (!ix || !ic || kiln_to_host(ic, ix, sizeof(int64_t) * (size_t)n)) {
        free(ix);
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) ix[i] = fused_window_index((double)ix[i], i % plane, ps.d[3], at.kernel[0], ow);
    kiln_tensor *in[4] = {r->in[0], r->in[1], kiln_from_data(ps, KILN_I64, r->device, ix), r->in[3]};
    free(ix);
    kiln_tensor *out[KILN_OP_MAX_OUT] = {NULL};
    if (!in[2] || kiln_dispatch(KILN_OP_CONV2D_RELU_MAX_POOL2D_GRAD_WEIGHT, 4, in, &at, r->device, out)) return NULL;
    r->aux[0] = out[1];
    return out[0];
}

/* The scatter of the pooled gradient (y > 0) into the convolution's
 * output g, then conv2d's weight gradient loops on g, and g's sums.
 * in_window: input 2 holds positions in the window (fused_window_index),
 * else plane indices. */
static void fused_ref_conv_pool_wgrad_as(kh_ref *r, bool in_window) {
    const kiln_op_attrs *a = r->attrs;
    kiln_shape xs = r->shape[3], ps = r->shape[0];
    int64_t N = xs.d[0], K = a->ints[0], OH, OW;
    fused_conv_out(a, xs, &OH, &OW);
    int64_t P = ps.d[2] * ps.d[3];
    double *g = calloc((size_t)(N * K * OH * OW), sizeof(double));
    for (int64_t p = 0; p < N * K; p++)
        for (int64_t i = 0; i < P; i++)
            if (r->in[1][p * P + i] > 0) {
                double v = r->in[2][p * P + i];
                int64_t k = in_window ? fused_window_index(v, i, ps.d[3], a->kernel[0], OW) : (int64_t)v;
                g[p * OH * OW + k] += r->in[0][p * P + i];
            }
    /* conv2d's weight gradient reference on g and x, then g's sums */
    kh_ref q = *r;
    q.n_in = 2;
    q.in[0] = g, q.in[1] = r->in[3];
    q.shape[0] = KILN_SHAPE(N, K, OH, OW), q.shape[1] = xs;
    for (int i = 0; i < KH_MAX_OUT; i++) q.out[i] = NULL;
    nn_ref_conv_grad(&q, false);
    r->out[0] = q.out[0], r->out_shape[0] = q.out_shape[0], r->out_dtype[0] = q.out_dtype[0];
    double *db = kh_out(r, 1, KILN_SHAPE(K), 0);
    for (int64_t p = 0; p < N * K; p++)
        for (int64_t i = 0; i < OH * OW; i++) db[p % K] += g[p * OH * OW + i];
    free(g);
}

static void fused_ref_conv_pool_wgrad(kh_ref *r) { fused_ref_conv_pool_wgrad_as(r, true); }
static void fused_ref_conv_pool_wgrad_plane(kh_ref *r) { fused_ref_conv_pool_wgrad_as(r, false); }

/* The plane indices as they are (for the kernel-level check, which calls
 * the kernels on the case's inputs): cases with one window row as wide as
 * the plane, so every index in [0, p * p) is inside its window. */
static kiln_tensor *fused_run_conv_pool_wgrad_plane(kh_run *r) {
    kiln_op_attrs at = *r->attrs;
    kiln_tensor *out[KILN_OP_MAX_OUT] = {NULL};
    if (kiln_dispatch(KILN_OP_CONV2D_RELU_MAX_POOL2D_GRAD_WEIGHT, r->n_in, r->in, &at, r->device, out)) return NULL;
    r->aux[0] = out[1];
    return out[0];
}

/* ---- conv2d_relu_max_pool2d ------------------------------------------------------- */

static kiln_tensor *fused_run_conv_pool(kh_run *r) {
    const kiln_op_attrs *a = r->attrs;
    kiln_conv2d_opts o = {.stride = {a->stride[0], a->stride[1]},
                          .padding = {a->padding[0], a->padding[1]},
                          .dilation = {a->dilation[0], a->dilation[1]},
                          .groups = a->groups};
    return kiln_conv2d_relu_max_pool2d(r->in[0], r->in[1], r->in[2], &o, a->kernel[0], &r->aux[0]);
}

/* conv2d's reference, relu, then max_pool2d's over k x k windows at
 * stride k without padding: values and indices. */
static void fused_ref_conv_pool(kh_ref *r) {
    nn_ref_conv2d(r);
    kiln_shape cs = r->out_shape[0];
    double *c = r->out[0];
    r->out[0] = NULL;
    for (int64_t i = 0; i < kh_numel(cs); i++) c[i] = fused_relu1(c[i]);
    int64_t k = r->attrs->kernel[0];
    kiln_op_attrs pa = {.kernel = {k, k}, .stride = {k, k}};
    kh_ref q = *r;
    q.attrs = &pa;
    q.in[0] = c;
    q.shape[0] = cs;
    for (int i = 0; i < KH_MAX_OUT; i++) q.out[i] = NULL;
    nn_ref_max_pool2d(&q);
    for (int i = 0; i < 2; i++) r->out[i] = q.out[i], r->out_shape[i] = q.out_shape[i], r->out_dtype[i] = q.out_dtype[i];
    free(c);
}

/* ---- the table ---------------------------------------------------------------------- */

#define FUSED_X(...)  {.shape = KILN_SHAPE(__VA_ARGS__), .fill = KH_NORMAL, .grad = true}
#define FUSED_XT(...) {.shape = KILN_SHAPE(__VA_ARGS__), .fill = KH_NORMAL, .layout = KH_TRANSPOSED, .grad = true}
#define FUSED_XS(...) {.shape = KILN_SHAPE(__VA_ARGS__), .fill = KH_NORMAL, .layout = KH_STRIDED, .grad = true}
#define FUSED_AWAY(layout_, ...) \
    {.shape = KILN_SHAPE(__VA_ARGS__), .fill = KH_AWAY, .layout = layout_, .grad = true}
#define FUSED_NG(layout_, ...) {.shape = KILN_SHAPE(__VA_ARGS__), .fill = KH_NORMAL, .layout = layout_}
#define FUSED_IDX(hi_, ...) \
    {.shape = KILN_SHAPE(__VA_ARGS__), .fill = KH_INDEX, .lo = 0, .hi = hi_, .as = KH_AS(KILN_I64)}
#define FUSED_ABSENT {.absent = true}
#define FUSED_F32_F64 (KILN_DT(KILN_F32) | KILN_DT(KILN_F64))
#define FUSED_CONV(s0, s1, p0, p1, d0, d1, g) \
    {.stride = {s0, s1}, .padding = {p0, p1}, .dilation = {d0, d1}, .groups = g}
#define FUSED_POOL(k0, k1, s0, s1, p0, p1, ceil_) \
    {.kernel = {k0, k1}, .stride = {s0, s1}, .padding = {p0, p1}, .ceil_mode = ceil_, .count_include_pad = true}

static const kh_case fused_cases[] = {
    /* conv2d_relu: conv2d's geometry variants, odd shapes, non-contiguous inputs */
    {.name = "conv2d_relu", .params = "2x3x5x6 w4x3x3x2 bias s1,2 p1,0 T", .dtypes = KH_FLOAT, .n_in = 3,
     .in = {FUSED_XT(2, 3, 5, 6), FUSED_X(4, 3, 3, 2), FUSED_X(4)}, .attrs = FUSED_CONV(1, 2, 1, 0, 1, 1, 1),
     .op = KH_OP(KILN_OP_CONV2D_RELU), .run = fused_run_conv2d_relu, .reference = fused_ref_conv2d_relu},
    {.name = "conv2d_relu", .params = "1x4x7x7 w6x2x2x3 groups2 s2 p1,2 d2,1 nobias S", .dtypes = KH_FLOAT,
     .n_in = 3, .in = {FUSED_X(1, 4, 7, 7), FUSED_XS(6, 2, 2, 3), FUSED_ABSENT},
     .attrs = FUSED_CONV(2, 2, 1, 2, 2, 1, 2), .op = KH_OP(KILN_OP_CONV2D_RELU), .run = fused_run_conv2d_relu,
     .reference = fused_ref_conv2d_relu},
    {.name = "conv2d_relu", .params = "3x1x5x3 w2x1x3x3 p1 bias S", .dtypes = KH_FLOAT, .n_in = 3,
     .in = {FUSED_XS(3, 1, 5, 3), FUSED_X(2, 1, 3, 3), FUSED_X(2)}, .attrs = FUSED_CONV(1, 1, 1, 1, 1, 1, 1),
     .op = KH_OP(KILN_OP_CONV2D_RELU), .run = fused_run_conv2d_relu, .reference = fused_ref_conv2d_relu},
    {.name = "conv2d_relu", .params = "groups mismatch", .dtypes = KILN_DT(KILN_F32), .n_in = 3,
     .in = {FUSED_X(3, 2, 4, 4), FUSED_X(3, 1, 1, 1), FUSED_ABSENT}, .attrs = FUSED_CONV(1, 1, 0, 0, 1, 1, 2),
     .run = fused_run_conv2d_relu, .expect_error = "conv2d_relu: x"},

    /* linear_act: x flattened from dim 1 (dims that do not merge into one
     * stride when transposed), relu or none, bias or not */
    {.name = "linear_act", .params = "3x2x5 w4x10 bias relu T", .dtypes = KH_FLOAT, .n_in = 3,
     .in = {FUSED_XT(3, 2, 5), FUSED_X(4, 10), FUSED_X(4)}, .attrs = {.flag = 1},
     .op = KH_OP(KILN_OP_LINEAR_ACT), .run = fused_run_linear_act, .reference = fused_ref_linear_act},
    {.name = "linear_act", .params = "2x3x2x2 w5x12 nobias relu S", .dtypes = KH_FLOAT, .n_in = 3,
     .in = {FUSED_XS(2, 3, 2, 2), FUSED_XT(5, 12), FUSED_ABSENT}, .attrs = {.flag = 1},
     .op = KH_OP(KILN_OP_LINEAR_ACT), .run = fused_run_linear_act, .reference = fused_ref_linear_act},
    {.name = "linear_act", .params = "5x7 w3x7 bias none", .dtypes = KH_FLOAT, .n_in = 3,
     .in = {FUSED_X(5, 7), FUSED_X(3, 7), FUSED_X(3)}, .attrs = {.flag = 0},
     .op = KH_OP(KILN_OP_LINEAR_ACT), .run = fused_run_linear_act, .reference = fused_ref_linear_act},
    {.name = "linear_act", .params = "4x1x3x1 w6x3 bias relu T", .dtypes = KH_FLOAT, .n_in = 3,
     .in = {FUSED_XT(4, 1, 3, 1), FUSED_X(6, 3), FUSED_XS(6)}, .attrs = {.flag = 1},
     .op = KH_OP(KILN_OP_LINEAR_ACT), .run = fused_run_linear_act, .reference = fused_ref_linear_act},
    /* 16 outputs and more: Kiln's AVX2 product on AVX2 CPUs (the weight
     * transposed as the prepared copy), with a column tail (17) */
    {.name = "linear_act", .params = "3x2x5 w20x10 bias relu", .dtypes = KH_FLOAT, .n_in = 3,
     .in = {FUSED_X(3, 2, 5), FUSED_X(20, 10), FUSED_X(20)}, .attrs = {.flag = 1},
     .op = KH_OP(KILN_OP_LINEAR_ACT), .run = fused_run_linear_act, .reference = fused_ref_linear_act},
    {.name = "linear_act", .params = "7x3x2x2 w17x12 nobias none", .dtypes = KH_FLOAT, .n_in = 3,
     .in = {FUSED_X(7, 3, 2, 2), FUSED_X(17, 12), FUSED_ABSENT}, .attrs = {.flag = 0},
     .op = KH_OP(KILN_OP_LINEAR_ACT), .run = fused_run_linear_act, .reference = fused_ref_linear_act},
    {.name = "linear_act", .params = "in features mismatch", .dtypes = KILN_DT(KILN_F32), .n_in = 3,
     .in = {FUSED_X(2, 3, 2), FUSED_X(4, 5), FUSED_ABSENT}, .attrs = {.flag = 1}, .run = fused_run_linear_act,
     .expect_error = "linear_act: shapes"},
    {.name = "linear_act", .params = "1-d x", .dtypes = KILN_DT(KILN_F32), .n_in = 3,
     .in = {FUSED_X(5), FUSED_X(4, 5), FUSED_ABSENT}, .attrs = {.flag = 0}, .run = fused_run_linear_act,
     .expect_error = "linear_act: shapes"},
    {.name = "linear_act", .params = "unknown activation", .dtypes = KILN_DT(KILN_F32), .n_in = 3,
     .in = {FUSED_X(2, 5), FUSED_X(4, 5), FUSED_ABSENT}, .attrs = {.flag = 7}, .run = fused_run_linear_act,
     .expect_error = "activation 7"},

    /* relu_max_pool2d: indices are output 1 */
    {.name = "relu_max_pool2d", .params = "2x2x7x6 k3 s2 p1 ceil", .dtypes = KH_FLOAT, .n_in = 1,
     .in = {FUSED_AWAY(KH_CONTIG, 2, 2, 7, 6)}, .attrs = FUSED_POOL(3, 3, 2, 2, 1, 1, true),
     .op = KH_OP(KILN_OP_RELU_MAX_POOL2D), .run = fused_run_relu_max_pool2d,
     .reference = fused_ref_relu_max_pool2d},
    {.name = "relu_max_pool2d", .params = "3x5x7 k2,3 s1,2 3d S", .dtypes = KH_FLOAT, .n_in = 1,
     .in = {FUSED_AWAY(KH_STRIDED, 3, 5, 7)}, .attrs = FUSED_POOL(2, 3, 1, 2, 0, 0, false),
     .op = KH_OP(KILN_OP_RELU_MAX_POOL2D), .run = fused_run_relu_max_pool2d,
     .reference = fused_ref_relu_max_pool2d},
    {.name = "relu_max_pool2d", .params = "1x3x5x5 k2 s2 p1 ceil T", .dtypes = KH_FLOAT, .n_in = 1,
     .in = {FUSED_AWAY(KH_TRANSPOSED, 1, 3, 5, 5)}, .attrs = FUSED_POOL(2, 2, 2, 2, 1, 1, true),
     .op = KH_OP(KILN_OP_RELU_MAX_POOL2D), .run = fused_run_relu_max_pool2d,
     .reference = fused_ref_relu_max_pool2d},
    {.name = "relu_max_pool2d", .params = "2x3x4x4 k2 s2 normal", .dtypes = KH_FLOAT, .n_in = 1,
     .in = {FUSED_X(2, 3, 4, 4)}, .attrs = FUSED_POOL(2, 2, 2, 2, 0, 0, false),
     .op = KH_OP(KILN_OP_RELU_MAX_POOL2D), .run = fused_run_relu_max_pool2d,
     .reference = fused_ref_relu_max_pool2d},
    {.name = "relu_max_pool2d", .params = "pad over half kernel", .dtypes = KILN_DT(KILN_F32), .n_in = 1,
     .in = {FUSED_X(1, 1, 4, 4)}, .attrs = FUSED_POOL(2, 2, 2, 2, 2, 2, false), .run = fused_run_relu_max_pool2d,
     .expect_error = "more than half"},

    /* conv2d_relu_max_pool2d: indices are output 1; a first layer (3
     * channels, floor drops the last row), a Winograd-sized one (8 -> 8,
     * 3x3 s1 p1, blocked on the fast path), an odd one (groups, stride,
     * a 3x3 window, a non-contiguous input). f32 and f64 only: rounded to
     * f16 or bf16, two outputs of a window can tie where the float64
     * reference's differ, and the index then names the other one. */
    {.name = "conv2d_relu_max_pool2d", .params = "2x3x9x8 w8x3x3x3 bias p1 k2", .dtypes = FUSED_F32_F64, .n_in = 3,
     .in = {FUSED_X(2, 3, 9, 8), FUSED_X(8, 3, 3, 3), FUSED_X(8)},
     .attrs = {.stride = {1, 1}, .padding = {1, 1}, .dilation = {1, 1}, .groups = 1, .kernel = {2, 2}},
     .op = KH_OP(KILN_OP_CONV2D_RELU_MAX_POOL2D), .run = fused_run_conv_pool, .reference = fused_ref_conv_pool},
    {.name = "conv2d_relu_max_pool2d", .params = "2x8x6x7 w8x8x3x3 nobias p1 k2 T", .dtypes = FUSED_F32_F64, .n_in = 3,
     .in = {FUSED_XT(2, 8, 7, 6), FUSED_X(8, 8, 3, 3), FUSED_ABSENT},
     .attrs = {.stride = {1, 1}, .padding = {1, 1}, .dilation = {1, 1}, .groups = 1, .kernel = {2, 2}},
     .op = KH_OP(KILN_OP_CONV2D_RELU_MAX_POOL2D), .run = fused_run_conv_pool, .reference = fused_ref_conv_pool},
    {.name = "conv2d_relu_max_pool2d", .params = "1x4x9x8 w6x2x2x3 groups2 s2,1 p1,0 k3 S", .dtypes = FUSED_F32_F64,
     .n_in = 3, .in = {FUSED_XS(1, 4, 9, 8), FUSED_X(6, 2, 2, 3), FUSED_X(6)},
     .attrs = {.stride = {2, 1}, .padding = {1, 0}, .dilation = {1, 1}, .groups = 2, .kernel = {3, 3}},
     .op = KH_OP(KILN_OP_CONV2D_RELU_MAX_POOL2D), .run = fused_run_conv_pool, .reference = fused_ref_conv_pool},
    /* contiguous, so the fast CPU path takes them: Kiln's Winograd pools
     * its tiles (F(2x2) below 16 tiles of 4x4, F(4x4) from there; the odd
     * sizes leave partial tiles and a dropped last row and column) */
    {.name = "conv2d_relu_max_pool2d", .params = "1x8x7x9 w8x8x3x3 bias p1 k2 contig", .dtypes = FUSED_F32_F64,
     .n_in = 3, .in = {FUSED_X(1, 8, 7, 9), FUSED_X(8, 8, 3, 3), FUSED_X(8)},
     .attrs = {.stride = {1, 1}, .padding = {1, 1}, .dilation = {1, 1}, .groups = 1, .kernel = {2, 2}},
     .op = KH_OP(KILN_OP_CONV2D_RELU_MAX_POOL2D), .run = fused_run_conv_pool, .reference = fused_ref_conv_pool},
    {.name = "conv2d_relu_max_pool2d", .params = "2x8x14x11 w16x8x3x3 nobias p1 k2 contig", .dtypes = FUSED_F32_F64,
     .n_in = 3, .in = {FUSED_X(2, 8, 14, 11), FUSED_X(16, 8, 3, 3), FUSED_ABSENT},
     .attrs = {.stride = {1, 1}, .padding = {1, 1}, .dilation = {1, 1}, .groups = 1, .kernel = {2, 2}},
     .op = KH_OP(KILN_OP_CONV2D_RELU_MAX_POOL2D), .run = fused_run_conv_pool, .reference = fused_ref_conv_pool},
    {.name = "conv2d_relu_max_pool2d", .params = "window larger than the output", .dtypes = KILN_DT(KILN_F32),
     .n_in = 3, .in = {FUSED_X(1, 2, 3, 3), FUSED_X(4, 2, 3, 3), FUSED_ABSENT},
     .attrs = {.stride = {1, 1}, .dilation = {1, 1}, .groups = 1, .kernel = {2, 2}}, .run = fused_run_conv_pool,
     .expect_error = "does not fit the convolution's 1x1 output"},
    {.name = "conv2d_relu_max_pool2d", .params = "window 0", .dtypes = KILN_DT(KILN_F32), .n_in = 3,
     .in = {FUSED_X(1, 2, 5, 5), FUSED_X(4, 2, 3, 3), FUSED_ABSENT},
     .attrs = {.stride = {1, 1}, .dilation = {1, 1}, .groups = 1, .kernel = {0, 0}}, .run = fused_run_conv_pool,
     .expect_error = "pooling window 0x0"},
    {.name = "conv2d_relu_max_pool2d", .params = "channel mismatch", .dtypes = KILN_DT(KILN_F32), .n_in = 3,
     .in = {FUSED_X(1, 3, 5, 5), FUSED_X(4, 2, 3, 3), FUSED_ABSENT},
     .attrs = {.stride = {1, 1}, .dilation = {1, 1}, .groups = 1, .kernel = {2, 2}}, .run = fused_run_conv_pool,
     .expect_error = "conv2d_relu_max_pool2d: x"},

    /* relu_max_pool2d_backward on its own (guard bytes, every dtype): y of
     * both signs, indices anywhere in the plane (no window geometry in the
     * attrs, so every backend scans the whole plane), repeated indices sum */
    {.name = "relu_max_pool2d_backward", .params = "g2x3x2x3 -> 2x3x4x5 T", .dtypes = KH_FLOAT, .n_in = 3,
     .in = {FUSED_NG(KH_TRANSPOSED, 2, 3, 2, 3), FUSED_NG(KH_CONTIG, 2, 3, 2, 3), FUSED_IDX(20, 2, 3, 2, 3)},
     .attrs = {.ints = {2, 3, 4, 5}, .n_ints = 4}, .op = KH_OP(KILN_OP_RELU_MAX_POOL2D_BACKWARD),
     .run = fused_run_relu_pool_backward, .reference = fused_ref_relu_pool_backward},
    {.name = "relu_max_pool2d_backward", .params = "g3x3x2 -> 3x5x3 3d S", .dtypes = KH_FLOAT, .n_in = 3,
     .in = {FUSED_NG(KH_CONTIG, 3, 3, 2), FUSED_NG(KH_STRIDED, 3, 3, 2), FUSED_IDX(15, 3, 3, 2)},
     .attrs = {.ints = {3, 5, 3}, .n_ints = 3}, .op = KH_OP(KILN_OP_RELU_MAX_POOL2D_BACKWARD),
     .run = fused_run_relu_pool_backward, .reference = fused_ref_relu_pool_backward},
    /* relu_max_pool2d_backward_sum: the same scatter and the per-channel sums; odd sizes,
     * a transposed grad_out, repeated indices */
    {.name = "relu_max_pool2d_backward_sum", .params = "g2x3x2x3 -> 2x3x4x5 T", .dtypes = KH_FLOAT, .n_in = 3,
     .in = {FUSED_NG(KH_TRANSPOSED, 2, 3, 2, 3), FUSED_NG(KH_CONTIG, 2, 3, 2, 3), FUSED_IDX(20, 2, 3, 2, 3)},
     .attrs = {.ints = {2, 3, 4, 5}, .n_ints = 4}, .op = KH_OP(KILN_OP_RELU_MAX_POOL2D_BACKWARD_SUM),
     .run = fused_run_relu_pool_backward_sum, .reference = fused_ref_relu_pool_backward_sum},
    {.name = "relu_max_pool2d_backward_sum", .params = "g3x5x3x2 -> 3x5x7x5 S", .dtypes = KH_FLOAT, .n_in = 3,
     .in = {FUSED_NG(KH_CONTIG, 3, 5, 3, 2), FUSED_NG(KH_STRIDED, 3, 5, 3, 2), FUSED_IDX(35, 3, 5, 3, 2)},
     .attrs = {.ints = {3, 5, 7, 5}, .n_ints = 4}, .op = KH_OP(KILN_OP_RELU_MAX_POOL2D_BACKWARD_SUM),
     .run = fused_run_relu_pool_backward_sum, .reference = fused_ref_relu_pool_backward_sum},
    {.name = "relu_max_pool2d_backward_sum", .params = "g2x4x3x3 -> 2x4x6x7 C", .dtypes = KH_FLOAT, .n_in = 3,
     .in = {FUSED_NG(KH_CONTIG, 2, 4, 3, 3), FUSED_NG(KH_CONTIG, 2, 4, 3, 3), FUSED_IDX(42, 2, 4, 3, 3)},
     .attrs = {.ints = {2, 4, 6, 7}, .n_ints = 4}, .op = KH_OP(KILN_OP_RELU_MAX_POOL2D_BACKWARD_SUM),
     .run = fused_run_relu_pool_backward_sum, .reference = fused_ref_relu_pool_backward_sum},
    {.name = "relu_max_pool2d_backward_sum", .params = "3-d refused", .dtypes = KILN_DT(KILN_F32), .n_in = 3,
     .in = {FUSED_NG(KH_CONTIG, 3, 3, 2), FUSED_NG(KH_CONTIG, 3, 3, 2), FUSED_IDX(15, 3, 3, 2)},
     .attrs = {.ints = {3, 5, 3}, .n_ints = 3}, .run = fused_run_relu_pool_backward_sum,
     .expect_error = "relu_max_pool2d_backward_sum: grad_out is"},
    /* conv2d_relu_max_pool2d_grad_weight: each window's argmax anywhere in it (input 2: its
     * position in the window, fused_window_index), y of both signs; odd sizes (rows and columns
     * no window covers), a transposed x, stride and groups, every dtype */
    {.name = "conv2d_relu_max_pool2d_grad_weight", .params = "g2x8x3x4 x2x3x7x9 w8x3x3x3 p1 k2", .dtypes = KH_FLOAT,
     .n_in = 4,
     .in = {FUSED_NG(KH_CONTIG, 2, 8, 3, 4), FUSED_NG(KH_CONTIG, 2, 8, 3, 4), FUSED_IDX(4, 2, 8, 3, 4),
            FUSED_NG(KH_CONTIG, 2, 3, 7, 9)},
     .attrs = {.stride = {1, 1}, .padding = {1, 1}, .dilation = {1, 1}, .groups = 1, .kernel = {2, 2},
               .ints = {8, 3, 3, 3}, .n_ints = 4},
     .run = fused_run_conv_pool_wgrad, .reference = fused_ref_conv_pool_wgrad},
    {.name = "conv2d_relu_max_pool2d_grad_weight", .params = "g1x4x2x1 x1x2x9x8 T w4x2x3x3 s2 k2", .dtypes = KH_FLOAT,
     .n_in = 4,
     .in = {FUSED_NG(KH_CONTIG, 1, 4, 2, 1), FUSED_NG(KH_STRIDED, 1, 4, 2, 1), FUSED_IDX(4, 1, 4, 2, 1),
            FUSED_NG(KH_TRANSPOSED, 1, 2, 9, 8)},
     .attrs = {.stride = {2, 2}, .padding = {0, 0}, .dilation = {1, 1}, .groups = 1, .kernel = {2, 2},
               .ints = {4, 2, 3, 3}, .n_ints = 4},
     .run = fused_run_conv_pool_wgrad, .reference = fused_ref_conv_pool_wgrad},
    {.name = "conv2d_relu_max_pool2d_grad_weight", .params = "g1x4x2x2 x1x4x6x6 w4x2x3x3 groups2 p1 k3",
     .dtypes = KH_FLOAT, .n_in = 4,
     .in = {FUSED_NG(KH_CONTIG, 1, 4, 2, 2), FUSED_NG(KH_CONTIG, 1, 4, 2, 2), FUSED_IDX(9, 1, 4, 2, 2),
            FUSED_NG(KH_CONTIG, 1, 4, 6, 6)},
     .attrs = {.stride = {1, 1}, .padding = {1, 1}, .dilation = {1, 1}, .groups = 2, .kernel = {3, 3},
               .ints = {4, 2, 3, 3}, .n_ints = 4},
     .run = fused_run_conv_pool_wgrad, .reference = fused_ref_conv_pool_wgrad},
    /* the kernels called directly too (guard bytes): a 4-wide plane with 4x4 windows, and a
     * strided 2-wide one with 2x2, each with a row no window covers */
    {.name = "conv2d_relu_max_pool2d_grad_weight", .params = "g2x8x1x1 x2x3x5x4 w8x3x3x3 p1 k4 plane",
     .dtypes = KH_FLOAT, .n_in = 4,
     .in = {FUSED_NG(KH_CONTIG, 2, 8, 1, 1), FUSED_NG(KH_CONTIG, 2, 8, 1, 1), FUSED_IDX(16, 2, 8, 1, 1),
            FUSED_NG(KH_CONTIG, 2, 3, 5, 4)},
     .attrs = {.stride = {1, 1}, .padding = {1, 1}, .dilation = {1, 1}, .groups = 1, .kernel = {4, 4},
               .ints = {8, 3, 3, 3}, .n_ints = 4},
     .op = KH_OP(KILN_OP_CONV2D_RELU_MAX_POOL2D_GRAD_WEIGHT), .run = fused_run_conv_pool_wgrad_plane,
     .reference = fused_ref_conv_pool_wgrad_plane},
    {.name = "conv2d_relu_max_pool2d_grad_weight", .params = "g3x4x1x1 x3x2x7x6 w4x2x3x3 s2 k2 plane",
     .dtypes = KH_FLOAT, .n_in = 4,
     .in = {FUSED_NG(KH_CONTIG, 3, 4, 1, 1), FUSED_NG(KH_CONTIG, 3, 4, 1, 1), FUSED_IDX(4, 3, 4, 1, 1),
            FUSED_NG(KH_CONTIG, 3, 2, 7, 6)},
     .attrs = {.stride = {2, 2}, .padding = {0, 0}, .dilation = {1, 1}, .groups = 1, .kernel = {2, 2},
               .ints = {4, 2, 3, 3}, .n_ints = 4},
     .op = KH_OP(KILN_OP_CONV2D_RELU_MAX_POOL2D_GRAD_WEIGHT), .run = fused_run_conv_pool_wgrad_plane,
     .reference = fused_ref_conv_pool_wgrad_plane},
    {.name = "conv2d_relu_max_pool2d_grad_weight", .params = "grad_out of another shape", .dtypes = KILN_DT(KILN_F32),
     .n_in = 4,
     .in = {FUSED_NG(KH_CONTIG, 2, 8, 3, 3), FUSED_NG(KH_CONTIG, 2, 8, 3, 3), FUSED_IDX(4, 2, 8, 3, 3),
            FUSED_NG(KH_CONTIG, 2, 3, 7, 9)},
     .attrs = {.stride = {1, 1}, .padding = {1, 1}, .dilation = {1, 1}, .groups = 1, .kernel = {2, 2},
               .ints = {8, 3, 3, 3}, .n_ints = 4},
     .run = fused_run_conv_pool_wgrad, .expect_error = "conv2d_relu_max_pool2d_grad_weight: grad_out is"},
    {.name = "relu_max_pool2d_backward", .params = "y shape mismatch", .dtypes = KILN_DT(KILN_F32), .n_in = 3,
     .in = {FUSED_NG(KH_CONTIG, 1, 2, 2, 2), FUSED_NG(KH_CONTIG, 1, 2, 2, 3), FUSED_IDX(4, 1, 2, 2, 2)},
     .attrs = {.ints = {1, 2, 4, 4}, .n_ints = 4}, .run = fused_run_relu_pool_backward,
     .expect_error = "relu_max_pool2d_backward: y is"},
};

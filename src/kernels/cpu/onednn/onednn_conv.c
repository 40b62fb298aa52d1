/* oneDNN convolution: forward (with bias), input gradient and weight
 * gradient, f32, OIHW weights (goihw when grouped), activations either
 * plain NCHW or in Kiln's nChw16c layout (kiln/tensor.h): the tensors'
 * layouts are part of each primitive's key. The bias gradient stays with
 * the sum op (backward_conv2d sums grad_out, which the fast sum does on
 * either layout; CONV2D_GRAD_WEIGHT has one output).
 *
 * Seven algorithms, chosen per configuration by the autotuner
 * (kernels/autotune.h) through the provider at the end of this file:
 *   - "direct": oneDNN's direct convolution in the layouts it prefers
 *     (nChw16c activations when the channels allow, blocked weights).
 *     Activations already in that layout are read and written in place;
 *     others (and the OIHW weights) are reordered through the workspace.
 *     The convolutions' outputs are given the layout oneDNN chose
 *     (kiln_onednn_conv2d_layout), so the next layer needs no reorder. The
 *     one deterministic mode uses: the configuration the parity tests use.
 *   - "direct_plain": direct convolution on plain NCHW (on this oneDNN its
 *     im2col + GEMM implementation), reorders for blocked tensors.
 *   - "winograd": Winograd F(4x4, 3x3) (oneDNN's jit_wino_4x3), blocked
 *     layouts as "direct". oneDNN implements it for 3x3 stride-1 kernels
 *     only (on CPUs with AVX-512); elsewhere building it fails and the tuner
 *     skips it. Its numerics differ from the direct algorithm beyond f32
 *     rounding (tests/kernels/test_onednn_conv_algorithms.c holds it to its
 *     own tolerance).
 *   - "winograd_2x2", "winograd_4x4", "winograd_6x6", "winograd_4x4_6x6":
 *     Kiln's F(2x2, 3x3), F(4x4, 3x3), F(6x6, 3x3) and the two together
 *     (each side cut into 4s then 6s) for AVX2 (onednn_winograd.c);
 *   - "small_c": Kiln's kernels for 1-4 input channels (onednn_smallc.c).
 *     These two are the defaults where they apply on AVX2 CPUs, AVX-512
 *     ones included (deterministic mode keeps "direct"). */
#ifdef KILN_WITH_ONEDNN
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/autotune.h"
#include "kernels/cpu/fast/gemm_avx2.h"
#include "kernels/cpu/onednn/onednn_conv_key.h"
#include "kernels/cpu/onednn/onednn_internal.h"
#include "kernels/cpu/onednn/onednn_smallc.h"
#include "kernels/cpu/onednn/onednn_winograd.h"
#include "kernels/nn_geometry.h"
#include "kiln/runtime.h"

static const char *const alg_names[ALG_COUNT] = {"direct",       "direct_plain", "winograd",        "winograd_2x2",
                                                 "small_c",      "winograd_4x4", "winograd_6x6",    "winograd_4x4_6x6"};

/* x (N, C, H, W), w (O, C/G, kH, kW), y (N, O, OH, OW): the forward names
 * of the three tensors, whichever pass's inputs and outputs they are. */
static bool conv_key(kiln_onednn_kind kind, const kiln_strided *x, const kiln_strided *w,
                     const kiln_strided *y, const kiln_strided *bias, const kiln_op_attrs *attrs,
                     kiln_onednn_key *key) {
    if (x->ndim != 4 || w->ndim != 4 || y->ndim != 4) return false;
    /* all f32, or all bf16 (autocast's convolutions: oneDNN's bf16 kernels, AMX or AVX512-BF16
     * where the CPU has them, declined where oneDNN has none) */
    kiln_dtype dt = x->dtype;
    if ((dt != KILN_F32 && dt != KILN_BF16) || w->dtype != dt || y->dtype != dt) return false;
    if (!kiln_onednn_is_contiguous(x) || !kiln_onednn_is_contiguous(w) || !kiln_onednn_is_contiguous(y))
        return false;
    if (bias && (bias->ndim != 1 || bias->dtype != dt || !kiln_onednn_is_contiguous(bias)))
        return false;
    /* bf16 activations stay plain NCHW: the blocked layouts are f32-only here */
    if (dt == KILN_BF16 && (x->layout != KILN_LAYOUT_STRIDED || y->layout != KILN_LAYOUT_STRIDED)) return false;
    /* The weights and bias are always strided; blocked activations (nChw16c,
     * nChw8c) have a channel count divisible by the block (the tensor layer
     * guarantees it). */
    if (w->layout != KILN_LAYOUT_STRIDED || (bias && bias->layout != KILN_LAYOUT_STRIDED)) return false;
    if ((x->layout != KILN_LAYOUT_STRIDED && !kiln_layout_block(x->layout)) ||
        (y->layout != KILN_LAYOUT_STRIDED && !kiln_layout_block(y->layout)))
        return false;
    kiln_conv_geom g = kiln_conv_geom_of(attrs);
    if (g.groups < 1 || x->shape[1] != w->shape[1] * g.groups || w->shape[0] % g.groups) return false;
    /* The gradient ops take their shapes from the caller: leave sizes that
     * are not a forward convolution's to the reference kernels. */
    if (y->shape[2] !=
            kiln_conv_out_size(x->shape[2], w->shape[2], g.stride[0], g.padding[0], g.dilation[0]) ||
        y->shape[3] != kiln_conv_out_size(x->shape[3], w->shape[3], g.stride[1], g.padding[1], g.dilation[1]))
        return false;
    memset(key, 0, sizeof *key);
    key->kind = kind;
    int64_t *v = key->v;
    v[K_N] = x->shape[0], v[K_C] = x->shape[1], v[K_H] = x->shape[2], v[K_W] = x->shape[3];
    v[K_O] = w->shape[0], v[K_KH] = w->shape[2], v[K_KW] = w->shape[3];
    v[K_OH] = y->shape[2], v[K_OW] = y->shape[3];
    v[K_SH] = g.stride[0], v[K_SW] = g.stride[1], v[K_PH] = g.padding[0], v[K_PW] = g.padding[1];
    v[K_DH] = g.dilation[0], v[K_DW] = g.dilation[1], v[K_G] = g.groups, v[K_BIAS] = bias != NULL;
    v[K_LX] = kiln_layout_block(x->layout), v[K_LY] = kiln_layout_block(y->layout);
    v[K_DT] = dt == KILN_BF16;
    return y->shape[0] == x->shape[0] && y->shape[1] == w->shape[0];
}

static const int reorder_args[] = {DNNL_ARG_FROM, DNNL_ARG_TO};

#define ALIGN 64
static size_t align_up(size_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

/* One pass with one algorithm: the convolution and, for the blocked
 * algorithms, the reorders of the arguments whose layout differs from the
 * plain tensors. Workspace: the convolution's scratchpad at 0, each
 * blocked buffer at offset[pos], the reorders' scratchpad at
 * reorder_scratch_at. */
typedef struct conv_plan {
    bool wino; /* Kiln's Winograd (onednn_winograd.c) instead of a oneDNN primitive */
    kiln_wino_pass wino_pass;
    kiln_wino_shape wino_shape;
    bool smallc; /* Kiln's small-channel kernels (onednn_smallc.c) */
    kiln_smallc_pass sc_pass;
    kiln_smallc_shape sc_shape;
    bool relu;
    int64_t conv_key_v[K_COUNT]; /* the key's values (oneDNN plans) */
    kiln_onednn_prim *conv;
    kiln_onednn_prim *reorder[3];
    size_t offset[3];
    size_t reorder_scratch_at;
    size_t workspace;
} conv_plan;

/* The Winograd candidate: 3x3, stride 1, padding 1, no dilation or groups,
 * channels divisible by 8, on an AVX2 CPU; else it does not build. */
static bool wino_geometry(const int64_t *v) {
    return v[K_KH] == 3 && v[K_KW] == 3 && v[K_SH] == 1 && v[K_SW] == 1 && v[K_PH] == 1 && v[K_PW] == 1 &&
           v[K_DH] == 1 && v[K_DW] == 1 && v[K_G] == 1 && v[K_OH] == v[K_H] && v[K_OW] == v[K_W];
}

static kiln_status wino_plan_build(kiln_onednn_kind kind, const kiln_onednn_key *key, conv_plan *plan) {
    const int64_t *v = key->v;
    int m = v[K_ALG] == ALG_WINO46 ? 46 : v[K_ALG] == ALG_WINO6 ? 6 : v[K_ALG] == ALG_WINO4 ? 4 : 2;
    kiln_wino_shape s = {v[K_N],        v[K_C],        v[K_H], v[K_W], v[K_O], (int)v[K_LX],
                         (int)v[K_LY], m, kind != KILN_ONEDNN_CONV_FWD ? (int)v[K_POOL] : 0};
    if (!kiln_wino_cpu_ok())
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, NULL, "Winograd: the CPU has no AVX2 and FMA");
    if (v[K_DT]) return KILN_RAISE(KILN_ERR_UNSUPPORTED, NULL, "Winograd: f32 only");
    if (!wino_geometry(v) || !kiln_wino_shape_ok(&s))
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, NULL,
                          "Winograd: only 3x3 stride-1 padding-1 convolutions with channels divisible by 8");
    plan->wino = true;
    plan->wino_pass = kind == KILN_ONEDNN_CONV_FWD        ? KILN_WINO_FWD
                      : kind == KILN_ONEDNN_CONV_BWD_DATA ? KILN_WINO_BWD_DATA
                                                          : KILN_WINO_BWD_WEIGHTS;
    plan->wino_shape = s;
    plan->relu = v[K_RELU] != 0;
    plan->workspace = kiln_wino_workspace(plan->wino_pass, &s);
    return KILN_OK;
}

/* The small-channel candidate: the forward or weight gradient of a 3x3
 * ungrouped convolution of a plain input with 1-4 channels, on an AVX2 CPU. */
static bool smallc_shape(kiln_onednn_kind kind, const int64_t *v, kiln_smallc_shape *s) {
    *s = (kiln_smallc_shape){v[K_N], v[K_C], v[K_H], v[K_W], v[K_O], v[K_OH], v[K_OW],
                             (int)v[K_SH], (int)v[K_SW], (int)v[K_PH], (int)v[K_PW], (int)v[K_LY]};
    return kind != KILN_ONEDNN_CONV_BWD_DATA && !v[K_DT] && v[K_KH] == 3 && v[K_KW] == 3 && v[K_DH] == 1 &&
           v[K_DW] == 1 && v[K_G] == 1 && v[K_LX] == 0 && kiln_cpu_gemm_avx2_ok() && kiln_smallc_shape_ok(s);
}

static kiln_status plan_build(kiln_onednn_kind kind, const kiln_onednn_key *key, int n_args,
                              conv_plan *plan) {
    memset(plan, 0, sizeof *plan);
    if (key->v[K_ALG] == ALG_WINO2 || key->v[K_ALG] == ALG_WINO4 || key->v[K_ALG] == ALG_WINO6 ||
        key->v[K_ALG] == ALG_WINO46)
        return wino_plan_build(kind, key, plan);
    if (key->v[K_ALG] == ALG_SMALLC) {
        if (!smallc_shape(kind, key->v, &plan->sc_shape))
            return KILN_RAISE(KILN_ERR_UNSUPPORTED, NULL,
                              "small_c: only the forward and weight gradient of 3x3 convolutions of 1-4 plain "
                              "input channels, on an AVX2 CPU");
        plan->smallc = true;
        plan->sc_pass = kind == KILN_ONEDNN_CONV_FWD ? KILN_SMALLC_FWD : KILN_SMALLC_BWD_WEIGHTS;
        plan->relu = key->v[K_RELU] != 0;
        plan->workspace = kiln_smallc_workspace(plan->sc_pass, &plan->sc_shape);
        return KILN_OK;
    }
    KILN_TRY(kiln_onednn_get(key, kiln_onednn_conv_build, n_args, kiln_onednn_conv_args(kind), &plan->conv));
    memcpy(plan->conv_key_v, key->v, sizeof plan->conv_key_v);
    size_t at = align_up(plan->conv->scratch_bytes), reorder_scratch = 0;
    for (int pos = 0; pos < 3; pos++) {
        dnnl_memory_desc_t plain;
        const dnnl_memory_desc_t *chosen = NULL;
        KILN_TRY(kiln_onednn_conv_plain_md(kind, key->v, pos, &plain));
        KILN_DNNL_CHECK(dnnl_memory_get_memory_desc(plan->conv->mem[pos], &chosen));
        if (dnnl_memory_desc_equal(&plain, chosen)) continue; /* oneDNN reads the plain tensor itself */
        kiln_onednn_key rk = *key;
        rk.kind = KILN_ONEDNN_CONV_REORDER;
        rk.v[K_CONV_KIND] = kind;
        rk.v[K_REORDER_POS] = pos;
        KILN_TRY(kiln_onednn_get(&rk, kiln_onednn_conv_build_reorder, 2, reorder_args, &plan->reorder[pos]));
        plan->offset[pos] = at;
        at += align_up(dnnl_memory_desc_get_size(chosen));
        if (plan->reorder[pos]->scratch_bytes > reorder_scratch)
            reorder_scratch = plan->reorder[pos]->scratch_bytes;
    }
    plan->reorder_scratch_at = at;
    plan->workspace = at + reorder_scratch;
    return KILN_OK;
}

/* conv2d_relu_max_pool2d's mode (kiln_onednn_conv2d_pool_mode): plans
 * untimed; the Winograd forward pools its tiles into y and ix if set. */
static _Thread_local struct {
    bool on;
    int64_t window; /* the fused op's pooling window */
    float *y;
    int64_t *ix;
    const float *go, *wy; /* the weight gradient's pooled inputs (kiln_onednn_conv2d_grad_weight_pool_inputs) */
    const int64_t *wix;
    double *part;
} fwd_pool;

/* kiln_onednn_conv2d_nhwc: the forward's output is left in the plan's own
 * layout in the workspace (no output reorder), and its address put here. */
static _Thread_local struct {
    bool on;
    const void *out;
} native_out;

/* data[pos]: the op's buffers (position 3: the forward bias, or NULL).
 * weights: the weights already in the convolution's layout (the
 * dispatcher's prepared copy), or NULL to reorder them here. */
static kiln_status plan_execute(const conv_plan *plan, void *const *data, void *workspace, size_t workspace_bytes,
                                const void *weights) {
    if (workspace_bytes < plan->workspace || (plan->workspace && !workspace))
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL,
                          "oneDNN convolution: workspace of %zu bytes, the plan needs %zu", workspace_bytes,
                          plan->workspace);
    if (plan->wino) {
        /* data in the op's order: forward (x, w, y, bias), input gradient
         * (grad_out, w, grad_input), weight gradient (grad_out, x, grad_w). */
        kiln_wino_buffers b = {0};
        b.relu = plan->relu;
        b.u = weights; /* the transformed filters, when prepared */
        b.pool_y = fwd_pool.y, b.pool_ix = fwd_pool.ix;
        if (plan->wino_pass == KILN_WINO_FWD) b.x = data[0], b.w = data[1], b.y = data[2], b.bias = data[3];
        else if (plan->wino_pass == KILN_WINO_BWD_DATA) b.y = data[0], b.w = data[1], b.x = data[2];
        else b.y = data[0], b.x = data[1], b.w_out = data[2];
        return kiln_wino_run(plan->wino_pass, &plan->wino_shape, &b, workspace, workspace_bytes);
    }
    if (plan->smallc) { /* forward (x, w, y, bias), weight gradient (grad_out, x, grad_w) */
        kiln_smallc_buffers b = {.relu = plan->relu, .pool_y = fwd_pool.y, .pool_ix = fwd_pool.ix};
        if (plan->sc_pass == KILN_SMALLC_FWD) b.x = data[0], b.w = data[1], b.y = data[2], b.bias = data[3];
        else b.y = data[0], b.x = data[1], b.w_out = data[2];
        if (plan->sc_pass == KILN_SMALLC_BWD_WEIGHTS && fwd_pool.go) /* the pooled gradient */
            b.pool_go = fwd_pool.go, b.pool_y = (float *)fwd_pool.wy, b.pool_ix = (int64_t *)fwd_pool.wix,
            b.bias_part = fwd_pool.part;
        return kiln_smallc_run(plan->sc_pass, &plan->sc_shape, &b, workspace, workspace_bytes);
    }
    char *ws = workspace;
    void *conv_data[4] = {data[0], data[1], data[2], data[3]};
    for (int pos = 0; pos < 3; pos++)
        if (plan->reorder[pos]) conv_data[pos] = ws + plan->offset[pos];
    bool prepared = weights && plan->reorder[1] && plan->conv->n_args >= 2;
    if (prepared) conv_data[1] = (void *)weights;
    for (int pos = 0; pos < 2; pos++) {
        if (!plan->reorder[pos] || (pos == 1 && prepared)) continue;
        void *io[2] = {data[pos], conv_data[pos]};
        KILN_TRY(kiln_onednn_execute(plan->reorder[pos], io, ws ? ws + plan->reorder_scratch_at : NULL,
                                     workspace_bytes - plan->reorder_scratch_at));
    }
    KILN_TRY(kiln_onednn_execute(plan->conv, conv_data, workspace, workspace_bytes));
    if (native_out.on) {
        native_out.out = conv_data[2];
        return KILN_OK;
    }
    if (plan->reorder[2]) {
        void *io[2] = {conv_data[2], data[2]};
        KILN_TRY(kiln_onednn_execute(plan->reorder[2], io, ws + plan->reorder_scratch_at,
                                     workspace_bytes - plan->reorder_scratch_at));
    }
    return KILN_OK;
}

/* ---- The autotuner's provider ------------------------------------------------------ */

/* One op call as the provider sees it. */
typedef struct conv_call {
    kiln_onednn_kind kind;
    kiln_onednn_key key; /* K_ALG unset */
    int n_args;
    const kiln_op_args *a;
    struct timespec t0;
} conv_call;

static void buffers_of(const conv_call *c, void *data[4]) {
    const kiln_op_args *a = c->a;
    data[0] = a->in[0].data, data[1] = a->in[1].data, data[2] = a->out[0].data;
    data[3] = c->kind == KILN_ONEDNN_CONV_FWD && a->n_in > 2 && a->in[2].ndim >= 0 ? a->in[2].data : NULL;
}

/* The window p of the pooling a pass is tiled for (0: none): the forward
 * of conv2d_relu_max_pool2d into a blocked output, which pools its own
 * tiles (2), and the gradients under its backward (K_POOL). */
static int64_t pooled_call(const conv_call *c) {
    const int64_t *v = c->key.v;
    if (c->kind == KILN_ONEDNN_CONV_FWD) return fwd_pool.on && fwd_pool.window == 2 && v[K_LY] ? 2 : 0;
    return v[K_POOL];
}

/* The default without timing (0: none): Kiln's Winograd where it measured
 * faster than oneDNN's direct convolution on an AVX2 CPU (docs/performance.md,
 * "Winograd for AVX2"), for a 3x3 stride-1 padding-1 convolution with
 * channels divisible by 8: the forward and the input gradient at every
 * batch (their filters are transformed once per weight version, the
 * prepared copy), the weight gradient from C * K / 256 2x2 tiles (its
 * per-call sums cost more than they save below: the tutorial CNN's conv3
 * at batch 1). F(4x4) from 16 of its tiles, F(2x2) below (fewer tiles than
 * chunks for the threads: conv3 at batch 1). A pass tiled for a pooling
 * (pooled_call) takes F(6x6) where its products are at most 0.8 of
 * F(4x4)'s over the rows and columns the pooling reads: 64 planes a 6x6
 * tile against 36 a 4x4 one, so a 7x7 output (the pooling reads 6x6) has
 * 64 against 144 (the 28x28x1 tutorial CNN's conv3: 1.47 against 2.96 ms
 * for its pooled forward at batch 128), 12x12 256 against 324 (0.51
 * against 0.76 ms at 16 -> 32 channels); 14x14 (576 both: F(6x6) 1.15x
 * slower) and 28x28 (0.91: the same time) stay F(4x4), whose transforms
 * are cheaper and round less. Any other pass takes the mixed tiling (4s
 * then 6s on each side) where its products are at most 0.8 of F(4x4)'s:
 * a 14x14 plane (400 against 576: the 28x28x1 CNN's conv2, every pass),
 * not 16x16 or 32x32 (0.84). The same on AVX-512 CPUs, where these
 * measured faster than oneDNN's AVX-512 direct convolutions
 * (kiln_cpu_avx2_kernels_default); the tuner can still pick oneDNN's. */
static int wino_default(const conv_call *c) {
    const int64_t *v = c->key.v;
    if (!kiln_cpu_avx2_kernels_default() || v[K_DT] || !wino_geometry(v) || v[K_C] % 8 || v[K_O] % 8) return 0;
    int64_t tiles = v[K_N] * ((v[K_H] + 1) / 2) * ((v[K_W] + 1) / 2);
    if (c->kind == KILN_ONEDNN_CONV_BWD_WEIGHTS && tiles * 256 < v[K_C] * v[K_O]) return 0;
    int alg = v[K_N] * ((v[K_H] + 3) / 4) * ((v[K_W] + 3) / 4) >= 16 ? ALG_WINO4 : ALG_WINO2;
    int64_t p = pooled_call(c);
    if (alg != ALG_WINO4) return alg;
    kiln_wino_shape s = {1, v[K_C], v[K_H], v[K_W], v[K_O], 8, 8, 4, (int)p};
    int64_t f4 = kiln_wino_products(&s);
    s.m = 6;
    if (p && 5 * kiln_wino_products(&s) <= 4 * f4) return ALG_WINO6;
    s.m = 46;
    return 5 * kiln_wino_products(&s) <= 4 * f4 ? ALG_WINO46 : ALG_WINO4;
}

static kiln_status onednn_candidates(void *self, const kiln_autotune_conv *cfg, void *ctx,
                                     kiln_autotune_candidate *out, int max, int *n) {
    (void)self, (void)cfg;
    *n = 0;
    /* oneDNN's CPU convolutions, and Kiln's Winograd, give the same bits
     * run to run for a fixed thread count, so all are deterministic;
     * deterministic mode still picks "direct", the provider's first. */
    int wino = wino_default(ctx);
    kiln_smallc_shape sc;
    const conv_call *c = ctx;
    /* the small-channel kernels: the default where Kiln's AVX2 kernels are. The weight
     * gradient (batch 128, 2 threads: 0.56 against 7.4 ms for 1 channel; 2.4 against oneDNN's
     * 1.7 for 3 alone, but as conv2d_relu_max_pool2d_grad_weight it scatters the pooled
     * gradient itself: the bench CNN trains 1.06-1.17x faster; docs/performance.md). The
     * forward: as fast as oneDNN's alone, and conv2d_relu_max_pool2d pools its output in the
     * workspace (3x32x32 -> 32 at batch 128: 2.2-2.4 ms against 3.6 for oneDNN's forward and
     * the pooling), with conv2d's bits. */
    bool sc_def = c->kind == KILN_ONEDNN_CONV_FWD || c->kind == KILN_ONEDNN_CONV_BWD_WEIGHTS;
    int def = sc_def && kiln_cpu_avx2_kernels_default() && smallc_shape(c->kind, c->key.v, &sc) ? ALG_SMALLC
              : wino                                                              ? wino
                                                                                  : ALG_DIRECT;
    for (int i = 0; i < ALG_COUNT && i < max; i++) {
        memset(&out[i], 0, sizeof out[i]);
        snprintf(out[i].name, sizeof out[i].name, "%s", alg_names[i]);
        out[i].deterministic = true;
        out[i].is_default = i == def;
        *n = i + 1;
    }
    return KILN_OK;
}

static kiln_status plan_of(const conv_call *c, int alg, conv_plan *plan) {
    kiln_onednn_key key = c->key;
    key.v[K_ALG] = alg;
    return plan_build(c->kind, &key, c->n_args, plan);
}

static kiln_status onednn_build(void *self, const kiln_autotune_conv *cfg, void *ctx, int index,
                                size_t *workspace_bytes) {
    (void)self, (void)cfg;
    conv_plan plan;
    KILN_TRY(plan_of(ctx, index, &plan));
    *workspace_bytes = plan.workspace;
    return KILN_OK;
}

static kiln_status onednn_run(void *self, const kiln_autotune_conv *cfg, void *ctx, int index,
                              void *workspace, size_t workspace_bytes) {
    (void)self, (void)cfg;
    conv_call *c = ctx;
    conv_plan plan;
    KILN_TRY(plan_of(c, index, &plan));
    void *data[4];
    buffers_of(c, data);
    return plan_execute(&plan, data, workspace, workspace_bytes, NULL);
}

static kiln_status onednn_timer_start(void *self, void *ctx) {
    (void)self;
    clock_gettime(CLOCK_MONOTONIC, &((conv_call *)ctx)->t0);
    return KILN_OK;
}

static kiln_status onednn_timer_stop(void *self, void *ctx, double *ms) {
    (void)self;
    const conv_call *c = ctx;
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1); /* the runs are synchronous */
    *ms = (double)(t1.tv_sec - c->t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - c->t0.tv_nsec) * 1e-6;
    return KILN_OK;
}

static const kiln_autotune_provider onednn_provider = {
    .name = "onednn",
    .identity = kiln_onednn_tune_identity,
    .candidates = onednn_candidates,
    .build = onednn_build,
    .run = onednn_run,
    .timer_start = onednn_timer_start,
    .timer_stop = onednn_timer_stop,
    .workspace_limit = kiln_onednn_tune_workspace_limit,
    .workspace_alloc = kiln_onednn_tune_workspace_alloc,
    .workspace_free = kiln_onednn_tune_workspace_free,
};

/* The activations' layouts as the autotuner's configuration names them:
 * [x][y], each 0 NCHW, 1 nChw16c, 2 nChw8c. */
static const char *const layout_names[3][3] = {
    {"nchw", "x=nchw,y=nChw16c", "x=nchw,y=nChw8c"},
    {"x=nChw16c,y=nchw", "x=nChw16c,y=nChw16c", "x=nChw16c,y=nChw8c"},
    {"x=nChw8c,y=nchw", "x=nChw8c,y=nChw16c", "x=nChw8c,y=nChw8c"},
};

static kiln_autotune_conv tune_config(const conv_call *c) {
    const int64_t *v = c->key.v;
    kiln_autotune_conv cfg = {
        .pass = c->kind == KILN_ONEDNN_CONV_FWD        ? KILN_AUTOTUNE_CONV_FWD
                : c->kind == KILN_ONEDNN_CONV_BWD_DATA ? KILN_AUTOTUNE_CONV_BWD_DATA
                                                       : KILN_AUTOTUNE_CONV_BWD_WEIGHT,
        .x_dtype = v[K_DT] ? KILN_BF16 : KILN_F32,
        .w_dtype = v[K_DT] ? KILN_BF16 : KILN_F32,
        .y_dtype = v[K_DT] ? KILN_BF16 : KILN_F32,
        .x = {v[K_N], v[K_C], v[K_H], v[K_W]},
        .w = {v[K_O], v[K_C] / v[K_G], v[K_KH], v[K_KW]},
        .y = {v[K_N], v[K_O], v[K_OH], v[K_OW]},
        .stride = {v[K_SH], v[K_SW]},
        .padding = {v[K_PH], v[K_PW]},
        .dilation = {v[K_DH], v[K_DW]},
        .groups = v[K_G],
        .bias = v[K_BIAS] != 0,
        .layout = layout_names[v[K_LX] == 16 ? 1 : v[K_LX] == 8 ? 2 : 0][v[K_LY] == 16 ? 1 : v[K_LY] == 8 ? 2 : 0],
        /* a pass tiled for a pooling has its own choice (wino_default) */
        .math = v[K_DT] ? "bf16" : pooled_call(c) ? "f32-pooled" : "f32",
    };
    return cfg;
}

const kiln_autotune_provider *kiln_onednn_conv_provider(void) { return &onednn_provider; }

/* ---- The kernels ------------------------------------------------------------------ */

/* -1: the autotuner chooses; else the algorithm every convolution uses. */
static atomic_int forced_alg = -1;

kiln_status kiln_onednn_conv_force_algorithm(const char *name) {
    if (!name) {
        atomic_store(&forced_alg, -1);
        return KILN_OK;
    }
    for (int i = 0; i < ALG_COUNT; i++)
        if (!strcmp(name, alg_names[i])) {
            atomic_store(&forced_alg, i);
            return KILN_OK;
        }
    return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                      "use direct, direct_plain, winograd, winograd_2x2, winograd_4x4, winograd_6x6, "
                      "winograd_4x4_6x6 or small_c",
                      "oneDNN convolution: no algorithm '%s'", name);
}

/* The forward pass fuses ReLU (conv2d_relu) when this is set: the
 * kernels below are shared, the entry points say which op they serve. */
static _Thread_local bool fwd_relu;

/* The call's key; false when the args are outside what these kernels cover. */
static bool call_of(kiln_onednn_kind kind, const kiln_op_args *a, conv_call *c) {
    memset(c, 0, sizeof *c);
    c->kind = kind;
    c->a = a;
    if (kind == KILN_ONEDNN_CONV_FWD) {
        const kiln_strided *bias = a->n_in > 2 && a->in[2].ndim >= 0 ? &a->in[2] : NULL;
        c->n_args = bias ? 4 : 3;
        bool ok = conv_key(kind, &a->in[0], &a->in[1], &a->out[0], bias, a->attrs, &c->key);
        c->key.v[K_RELU] = fwd_relu;
        return ok;
    }
    c->n_args = 3;
    /* (grad_out, weight) -> grad_input, (grad_out, input) -> grad_weight;
     * conv2d_relu_max_pool2d's backward passes its pooling window in
     * attrs.kernel (ops.def): grad_out is zero where no window reads */
    bool ok = kind == KILN_ONEDNN_CONV_BWD_DATA
                  ? conv_key(kind, &a->out[0], &a->in[1], &a->in[0], NULL, a->attrs, &c->key)
                  : conv_key(kind, &a->in[1], &a->out[0], &a->in[0], NULL, a->attrs, &c->key);
    if (ok && a->attrs->kernel[0] >= 2 && a->attrs->kernel[0] == a->attrs->kernel[1] &&
        c->key.v[K_OH] >= a->attrs->kernel[0] && c->key.v[K_OW] >= a->attrs->kernel[0])
        c->key.v[K_POOL] = a->attrs->kernel[0];
    return ok;
}

/* The pass's plan with the algorithm the autotuner picks (autotune.h:
 * the settings' mode; timing only when the args carry buffers). *ok stays
 * false when the args are outside what these kernels cover (not an error). */
static kiln_status conv_prepare(kiln_onednn_kind kind, const kiln_op_args *a, conv_plan *plan, bool *ok) {
    *ok = false;
    conv_call c;
    if (!call_of(kind, a, &c)) return KILN_OK;
    int forced = atomic_load(&forced_alg);
    if (forced >= 0) {
        /* A forced algorithm that does not build declines (the reference runs). */
        if (plan_of(&c, forced, plan) != KILN_OK) return KILN_OK;
        *ok = true;
        return KILN_OK;
    }
    kiln_autotuner *tuner = kiln_autotune_global();
    if (!tuner) return kiln_error_last()->status;
    kiln_autotune_conv cfg = tune_config(&c);
    bool can_time = a->in[0].data && a->in[1].data && a->out[0].data;
    kiln_autotune_mode mode = kiln_autotune_mode_current(KILN_DEVICE_CPU);
    /* pool mode: the default pick, never a timed one (one could be cached
     * between the fused op's workspace fn and its run, needing more) */
    if (fwd_pool.on) mode.timing = false, can_time = false;
    kiln_autotune_choice choice;
    KILN_TRY(kiln_autotune_choose(tuner, &onednn_provider, &cfg, &c, mode, can_time, &choice));
    KILN_TRY(plan_of(&c, choice.index, plan));
    *ok = true;
    return KILN_OK;
}

/* Runs the pass's plan, made by conv_prepare for these args. */
static kiln_status conv_execute(kiln_onednn_kind kind, const kiln_op_args *a, const conv_plan *plan) {
    conv_call c;
    call_of(kind, a, &c);
    void *data[4];
    buffers_of(&c, data);
    /* the weights are input 1 of the forward and of the input gradient */
    const void *weights = kind != KILN_ONEDNN_CONV_BWD_WEIGHTS ? a->prepared : NULL;
    return plan_execute(plan, data, a->workspace, a->workspace_bytes, weights);
}

static kiln_status conv_run(kiln_onednn_kind kind, const kiln_op_args *a, const char *op) {
    conv_plan plan;
    bool ok;
    KILN_TRY(conv_prepare(kind, a, &plan, &ok));
    if (!ok)
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "%s: the oneDNN kernel was given arguments it declines",
                          op);
    return conv_execute(kind, a, &plan);
}

/* The weights in the layout the pass's convolution chose, as a prepared
 * copy (kernels/op_args.h) kept with the weight tensor and refilled when it
 * changes (once per optimizer step), instead of a reorder in every call.
 * The key is a hash of the chosen layout's descriptor. */
static uint64_t md_hash(const dnnl_memory_desc_t *md) {
    const unsigned char *b = (const unsigned char *)md;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < sizeof *md; i++) h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

static void conv_prepare_weights(kiln_onednn_kind kind, const kiln_op_args *a, kiln_op_prepare *p) {
    p->input = -1;
    /* bf16 weights are autocast's casts, new every step: a prepared copy would be refilled as often as
     * the reorder runs, and a traced step could not keep it (kiln_trace) */
    if (a->in[1].dtype == KILN_BF16) return;
    conv_plan plan;
    bool ok;
    if (kind == KILN_ONEDNN_CONV_BWD_WEIGHTS || conv_prepare(kind, a, &plan, &ok) != KILN_OK || !ok) {
        kiln_error_clear();
        return;
    }
    if (plan.wino) { /* the transformed filters (planes x C x K), keyed by the pass and shape */
        p->input = 1;
        /* a pooled input gradient's copy may have edge filters after the tiles' */
        kiln_wino_shape plain = plan.wino_shape;
        plain.pool = 0;
        bool edges =
            kiln_wino_weights_size(plan.wino_pass, &plan.wino_shape) != kiln_wino_weights_size(plan.wino_pass, &plain);
        p->key = 0x77696e6f32000000ULL ^ ((uint64_t)plan.wino_shape.m << 56) ^ ((uint64_t)plan.wino_pass << 44) ^
                 ((uint64_t)edges << 40) ^ ((uint64_t)plan.wino_shape.c << 22) ^ (uint64_t)plan.wino_shape.k;
        p->bytes = kiln_wino_weights_size(plan.wino_pass, &plan.wino_shape) * sizeof(float);
        return;
    }
    const dnnl_memory_desc_t *chosen = NULL;
    if (!plan.reorder[1] || dnnl_memory_get_memory_desc(plan.conv->mem[1], &chosen) != dnnl_success) return;
    p->input = 1;
    p->key = md_hash(chosen);
    p->bytes = dnnl_memory_desc_get_size(chosen);
}

static kiln_status conv_fill_weights(kiln_onednn_kind kind, const kiln_op_args *a, void *dst) {
    conv_plan plan;
    bool ok;
    KILN_TRY(conv_prepare(kind, a, &plan, &ok));
    if (ok && plan.wino) {
        kiln_wino_weights(plan.wino_pass, &plan.wino_shape, a->in[1].data, dst);
        return KILN_OK;
    }
    if (!ok || !plan.reorder[1])
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "oneDNN convolution: no weight reorder to prepare");
    void *io[2] = {a->in[1].data, dst};
    char *ws = a->workspace;
    return kiln_onednn_execute(plan.reorder[1], io, ws ? ws + plan.reorder_scratch_at : NULL,
                               a->workspace_bytes > plan.reorder_scratch_at ? a->workspace_bytes - plan.reorder_scratch_at
                                                                              : 0);
}

void kiln_onednn_conv2d_prepare(const kiln_op_args *a, kiln_op_prepare *p) {
    conv_prepare_weights(KILN_ONEDNN_CONV_FWD, a, p);
}
kiln_status kiln_onednn_conv2d_fill(const kiln_op_args *a, void *dst) {
    return conv_fill_weights(KILN_ONEDNN_CONV_FWD, a, dst);
}
void kiln_onednn_conv2d_grad_input_prepare(const kiln_op_args *a, kiln_op_prepare *p) {
    conv_prepare_weights(KILN_ONEDNN_CONV_BWD_DATA, a, p);
}
kiln_status kiln_onednn_conv2d_grad_input_fill(const kiln_op_args *a, void *dst) {
    return conv_fill_weights(KILN_ONEDNN_CONV_BWD_DATA, a, dst);
}
void kiln_onednn_conv2d_relu_prepare(const kiln_op_args *a, kiln_op_prepare *p) {
    fwd_relu = true;
    conv_prepare_weights(KILN_ONEDNN_CONV_FWD, a, p);
    fwd_relu = false;
}
kiln_status kiln_onednn_conv2d_relu_fill(const kiln_op_args *a, void *dst) {
    fwd_relu = true;
    kiln_status st = conv_fill_weights(KILN_ONEDNN_CONV_FWD, a, dst);
    fwd_relu = false;
    return st;
}

/* A build failure makes supports false (the reference kernel runs) and
 * the workspace 0; it is cached, so it costs one attempt per shape. */
static size_t conv_workspace(kiln_onednn_kind kind, const kiln_op_args *a) {
    conv_plan plan;
    bool ok;
    return conv_prepare(kind, a, &plan, &ok) == KILN_OK && ok ? plan.workspace : 0;
}

static bool conv_supports(kiln_onednn_kind kind, const kiln_op_args *a) {
    conv_plan plan;
    bool ok;
    return conv_prepare(kind, a, &plan, &ok) == KILN_OK && ok;
}

/* The layout oneDNN chose for the pass's output (position 2): nChw16c or
 * nChw8c when it is exactly Kiln's layout of that name for that shape (and
 * opaque layouts are on), else strided. The weight gradient is always
 * strided (OIHW). */
static void conv_out_layout(kiln_onednn_kind kind, const kiln_op_args *a, kiln_layout *out) {
    out[0] = KILN_LAYOUT_STRIDED;
    if (kind == KILN_ONEDNN_CONV_BWD_WEIGHTS || !kiln_cpu_layouts() || a->out[0].dtype != KILN_F32) return;
    const kiln_strided *y = &a->out[0];
    if (y->ndim != 4 || y->shape[1] % 8) return;
    conv_plan plan;
    bool ok;
    if (conv_prepare(kind, a, &plan, &ok) != KILN_OK || !ok) {
        kiln_error_clear();
        return;
    }
    if (plan.wino) { /* it writes any layout: blocked as its input, else nChw8c, saves a copy */
        bool fwd = kind == KILN_ONEDNN_CONV_FWD;
        int in = fwd ? plan.wino_shape.xb : plan.wino_shape.yb, cur = fwd ? plan.wino_shape.yb : plan.wino_shape.xb;
        int block = cur ? cur : in ? in : 8;
        out[0] = block == 16 ? KILN_LAYOUT_NCHW16C : KILN_LAYOUT_NCHW8C;
        return;
    }
    if (plan.smallc) { /* it writes any layout: blocked, nChw8c unless asked for nChw16c */
        out[0] = plan.sc_shape.yb == 16 ? KILN_LAYOUT_NCHW16C : KILN_LAYOUT_NCHW8C;
        return;
    }
    const dnnl_memory_desc_t *chosen = NULL;
    dnnl_dims_t dims = {y->shape[0], y->shape[1], y->shape[2], y->shape[3]};
    if (dnnl_memory_get_memory_desc(plan.conv->mem[2], &chosen) != dnnl_success) return;
    static const struct {
        dnnl_format_tag_t tag;
        int block;
        kiln_layout layout;
    } blocked[] = {{dnnl_nChw16c, 16, KILN_LAYOUT_NCHW16C}, {dnnl_nChw8c, 8, KILN_LAYOUT_NCHW8C}};
    for (size_t i = 0; i < sizeof blocked / sizeof blocked[0]; i++) {
        dnnl_memory_desc_t md;
        if (y->shape[1] % blocked[i].block ||
            dnnl_memory_desc_init_by_tag(&md, 4, dims, dnnl_f32, blocked[i].tag) != dnnl_success)
            continue;
        if (dnnl_memory_desc_equal(&md, chosen)) {
            out[0] = blocked[i].layout;
            return;
        }
    }
}

void kiln_onednn_conv2d_layout(const kiln_op_args *a, kiln_layout *out) {
    conv_out_layout(KILN_ONEDNN_CONV_FWD, a, out);
}
void kiln_onednn_conv2d_grad_input_layout(const kiln_op_args *a, kiln_layout *out) {
    conv_out_layout(KILN_ONEDNN_CONV_BWD_DATA, a, out);
}
void kiln_onednn_conv2d_grad_weight_layout(const kiln_op_args *a, kiln_layout *out) {
    conv_out_layout(KILN_ONEDNN_CONV_BWD_WEIGHTS, a, out);
}

kiln_status kiln_onednn_conv2d(const kiln_op_args *a) {
    return conv_run(KILN_ONEDNN_CONV_FWD, a, "kiln_conv2d");
}
size_t kiln_onednn_conv2d_workspace(const kiln_op_args *a) { return conv_workspace(KILN_ONEDNN_CONV_FWD, a); }
bool kiln_onednn_conv2d_supports(const kiln_op_args *a) { return conv_supports(KILN_ONEDNN_CONV_FWD, a); }

/* conv2d_relu: the forward with oneDNN's ReLU post-op (relu(x) = max(x, 0):
 * a NaN result may come out as 0 where the reference passes NaN). */
#define WITH_RELU(expr)                                                                                      \
    do {                                                                                                     \
        fwd_relu = true;                                                                                     \
        __typeof__(expr) r_ = (expr);                                                                        \
        fwd_relu = false;                                                                                    \
        return r_;                                                                                           \
    } while (0)
kiln_status kiln_onednn_conv2d_relu(const kiln_op_args *a) { WITH_RELU(conv_run(KILN_ONEDNN_CONV_FWD, a, "kiln_conv2d_relu")); }
size_t kiln_onednn_conv2d_relu_workspace(const kiln_op_args *a) { WITH_RELU(conv_workspace(KILN_ONEDNN_CONV_FWD, a)); }
bool kiln_onednn_conv2d_relu_supports(const kiln_op_args *a) { WITH_RELU(conv_supports(KILN_ONEDNN_CONV_FWD, a)); }
void kiln_onednn_conv2d_relu_layout(const kiln_op_args *a, kiln_layout *out) {
    fwd_relu = true;
    conv_out_layout(KILN_ONEDNN_CONV_FWD, a, out);
    fwd_relu = false;
}

void kiln_onednn_conv2d_pool_mode(bool on, int64_t window, float *y, int64_t *ix) {
    fwd_pool.on = on, fwd_pool.window = on ? window : 0, fwd_pool.y = on ? y : NULL, fwd_pool.ix = on ? ix : NULL;
    if (!on) fwd_pool.go = fwd_pool.wy = NULL, fwd_pool.wix = NULL, fwd_pool.part = NULL;
}
void kiln_onednn_conv2d_grad_weight_pool_inputs(const float *go, const float *y, const int64_t *ix, double *part) {
    fwd_pool.go = go, fwd_pool.wy = y, fwd_pool.wix = ix, fwd_pool.part = part;
}
/* Whether the pass's plan pools: forward (Winograd into a blocked output, the small-channel
 * forward into nChw8c), weight gradient (the small-channel one on an nChw8c gradient). */
static bool plan_pools(kiln_onednn_kind kind, const kiln_op_args *a) {
    conv_plan plan;
    bool ok;
    if (conv_prepare(kind, a, &plan, &ok) != KILN_OK) {
        kiln_error_clear();
        return false;
    }
    if (!ok || plan.relu) return false;
    const kiln_smallc_shape *sc = &plan.sc_shape;
    if (kind == KILN_ONEDNN_CONV_BWD_WEIGHTS)
        return plan.smallc && plan.sc_pass == KILN_SMALLC_BWD_WEIGHTS && sc->yb == 8 && sc->oh >= 2 && sc->ow >= 2;
    return (plan.wino && plan.wino_shape.yb) || (plan.smallc && plan.sc_pass == KILN_SMALLC_FWD && sc->yb == 8);
}
bool kiln_onednn_conv2d_grad_weight_pools(const kiln_op_args *a) { return plan_pools(KILN_ONEDNN_CONV_BWD_WEIGHTS, a); }
bool kiln_onednn_conv2d_pools(const kiln_op_args *a) { return plan_pools(KILN_ONEDNN_CONV_FWD, a); }

bool kiln_onednn_conv2d_nhwc_out(const kiln_op_args *a) {
    conv_plan plan;
    bool ok;
    if (conv_prepare(KILN_ONEDNN_CONV_FWD, a, &plan, &ok) != KILN_OK) {
        kiln_error_clear();
        return false;
    }
    if (!ok || plan.wino || plan.smallc || !plan.reorder[2] || plan.conv_key_v[K_RELU]) return false;
    const dnnl_memory_desc_t *chosen = NULL;
    const kiln_strided *y = &a->out[0];
    dnnl_dims_t dims = {y->shape[0], y->shape[1], y->shape[2], y->shape[3]};
    dnnl_memory_desc_t nhwc;
    if (y->ndim != 4 || dnnl_memory_get_memory_desc(plan.conv->mem[2], &chosen) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&nhwc, 4, dims, kiln_onednn_conv_dt(plan.conv_key_v), dnnl_nhwc) != dnnl_success)
        return false;
    return dnnl_memory_desc_equal(&nhwc, chosen) != 0;
}

kiln_status kiln_onednn_conv2d_nhwc(const kiln_op_args *a, const void **nhwc) {
    native_out.on = true, native_out.out = NULL;
    kiln_status st = conv_run(KILN_ONEDNN_CONV_FWD, a, "kiln_conv2d");
    native_out.on = false;
    *nhwc = native_out.out;
    return st;
}

/* ---- bf16 input gradients as forward convolutions ------------------------------------- */

/* The input gradient of a stride-1 convolution is the forward convolution
 * of grad_out with the weight flipped in space and with its two channel
 * axes swapped (W'[c][o][kh][kw] = W[o][c][KH-1-kh][KW-1-kw]), padded by
 * K - 1 - p. In bf16 on AMX, oneDNN's backward-data kernels (jit:
 * avx512_core_amx_bf16) took 2.5-3.0 ms for the bench CNN's conv3 and 1.6-2.0
 * for conv2 at batch 128, its forward (brgconv) 1.3 and 1.0 for the same
 * work; the flipped weight is small (conv3's: 74k values) and made in the
 * workspace every call, as autocast's bf16 weight is new every step. */
typedef struct dgrad_fwd {
    kiln_op_attrs attrs; /* the padding K - 1 - p, no pooling window */
    kiln_op_args fwd;    /* (grad_out, flipped weight) -> grad_input */
    size_t w_bytes;      /* the flipped weight, at the front of the workspace */
} dgrad_fwd;

static bool dgrad_fwd_of(const kiln_op_args *a, dgrad_fwd *d) {
    const kiln_strided *g = &a->in[0], *w = &a->in[1], *dx = &a->out[0];
    if (g->dtype != KILN_BF16 || w->dtype != KILN_BF16 || dx->dtype != KILN_BF16 || w->ndim != 4 ||
        w->layout != KILN_LAYOUT_STRIDED || !kiln_onednn_is_contiguous(w))
        return false;
    kiln_conv_geom cg = kiln_conv_geom_of(a->attrs);
    if (cg.groups != 1) return false;
    for (int i = 0; i < 2; i++)
        if (cg.stride[i] != 1 || cg.dilation[i] != 1 || cg.padding[i] > w->shape[2 + i] - 1) return false;
    memset(d, 0, sizeof *d);
    d->attrs = *a->attrs;
    d->attrs.kernel[0] = d->attrs.kernel[1] = 0, d->attrs.n_ints = 0;
    for (int i = 0; i < 2; i++) d->attrs.padding[i] = w->shape[2 + i] - 1 - cg.padding[i];
    kiln_strided wf = *w;
    wf.shape[0] = w->shape[1], wf.shape[1] = w->shape[0];
    wf.strides[3] = 1, wf.strides[2] = wf.shape[3], wf.strides[1] = wf.shape[2] * wf.shape[3];
    wf.strides[0] = wf.shape[1] * wf.strides[1];
    d->w_bytes = align_up((size_t)(w->shape[0] * w->shape[1] * w->shape[2] * w->shape[3]) * sizeof(uint16_t));
    bool ws = a->workspace != NULL;
    wf.data = ws ? a->workspace : NULL;
    d->fwd = *a;
    d->fwd.n_in = 2, d->fwd.n_out = 1, d->fwd.attrs = &d->attrs, d->fwd.prepared = NULL;
    d->fwd.in[1] = wf;
    d->fwd.out[0] = *dx;
    d->fwd.workspace = ws ? (char *)a->workspace + d->w_bytes : NULL;
    d->fwd.workspace_bytes = ws && a->workspace_bytes > d->w_bytes ? a->workspace_bytes - d->w_bytes : 0;
    return g->ndim == 4 && dx->ndim == 4 && g->shape[1] == w->shape[0] && dx->shape[1] == w->shape[1];
}

/* The forward route where it applies and oneDNN's forward takes it. */
static bool dgrad_fwd_applies(const kiln_op_args *a, dgrad_fwd *d) {
    return dgrad_fwd_of(a, d) && conv_supports(KILN_ONEDNN_CONV_FWD, &d->fwd);
}

/* The flipped, channel-swapped weight into the workspace, then the forward's plan. */
static kiln_status dgrad_fwd_run(const kiln_op_args *a, dgrad_fwd *d, const conv_plan *plan) {
    const kiln_strided *w = &a->in[1];
    const int64_t O = w->shape[0], C = w->shape[1], KH = w->shape[2], KW = w->shape[3];
    const uint16_t *src = w->data;
    uint16_t *dst = d->fwd.in[1].data;
    for (int64_t o = 0; o < O; o++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t kh = 0; kh < KH; kh++)
                for (int64_t kw = 0; kw < KW; kw++)
                    dst[((c * O + o) * KH + kh) * KW + kw] =
                        src[((o * C + c) * KH + KH - 1 - kh) * KW + KW - 1 - kw];
    return conv_execute(KILN_ONEDNN_CONV_FWD, &d->fwd, plan);
}

kiln_status kiln_onednn_conv2d_grad_input(const kiln_op_args *a) {
    dgrad_fwd d;
    conv_plan plan;
    bool ok = false;
    /* one plan lookup: the forward's, taken when it builds, as dgrad_fwd_applies would */
    if (dgrad_fwd_of(a, &d) && conv_prepare(KILN_ONEDNN_CONV_FWD, &d.fwd, &plan, &ok) == KILN_OK && ok)
        return dgrad_fwd_run(a, &d, &plan);
    return conv_run(KILN_ONEDNN_CONV_BWD_DATA, a, "kiln_conv2d_grad_input");
}
size_t kiln_onednn_conv2d_grad_input_workspace(const kiln_op_args *a) {
    dgrad_fwd d;
    if (dgrad_fwd_applies(a, &d)) return d.w_bytes + conv_workspace(KILN_ONEDNN_CONV_FWD, &d.fwd);
    return conv_workspace(KILN_ONEDNN_CONV_BWD_DATA, a);
}
bool kiln_onednn_conv2d_grad_input_supports(const kiln_op_args *a) {
    dgrad_fwd d;
    return dgrad_fwd_applies(a, &d) || conv_supports(KILN_ONEDNN_CONV_BWD_DATA, a);
}

kiln_status kiln_onednn_conv2d_grad_weight(const kiln_op_args *a) {
    return conv_run(KILN_ONEDNN_CONV_BWD_WEIGHTS, a, "kiln_conv2d_grad_weight");
}
size_t kiln_onednn_conv2d_grad_weight_workspace(const kiln_op_args *a) {
    return conv_workspace(KILN_ONEDNN_CONV_BWD_WEIGHTS, a);
}
bool kiln_onednn_conv2d_grad_weight_supports(const kiln_op_args *a) {
    return conv_supports(KILN_ONEDNN_CONV_BWD_WEIGHTS, a);
}

#else
typedef int kiln_onednn_conv_unused; /* ISO C: a translation unit is not empty */
#endif

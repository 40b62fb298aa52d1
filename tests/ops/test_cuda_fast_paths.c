/* The CUDA library fast paths (src/kernels/cuda/cuda_fast.h) against the
 * hand-written CUDA kernels, on cuda:0. Each case runs an op through the
 * dispatcher twice from the same host data: with the CUDA fast table (the
 * run must reach the fast entry, and its library call must not fall back)
 * and with it cleared (the hand-written kernel). The outputs, and for batch
 * norm in training the running statistics it updates, must agree within
 * the dtype's tolerance, relative to the reference's largest magnitude:
 *   f32 1e-4 (5e-4 for convolutions: cuDNN's FFT and Winograd algorithms
 *   round differently; 4e-3 for the TF32 GEMM), f16 1e-2, bf16 4e-2 (one or two output ulps: both
 *   sides accumulate in f32 or wider, then round to the dtype).
 * Forward and backward ops (conv2d_grad_input, conv2d_grad_weight,
 * avg_pool2d_backward, batch_norm_backward) are cases of their own, each in
 * f32, f16 and bf16. The convolutions run in the three autotuner modes
 * (default, kiln_set_cudnn_benchmark(true), kiln_set_deterministic(true));
 * the test prints the tuner's picks and checks that a fresh tuner reads
 * them back from its cache file and times nothing.
 *
 * Skips (exit 77, with the reason) without a CUDA driver or device, in the
 * emulation build (no cuBLASLt, no cuDNN: no fast table) and in builds
 * without CUDA. Built in every build; scripts/gpu-check.sh runs it on a
 * GPU, where it is the comparison the issue asks for. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/autotune.h"
#include "ops/op_registry.h"
#include "test_util.h"

#if defined(KILN_WITH_CUDA) && !defined(KILN_CUDA_EMULATION)
#include "kernels/cuda/cuda_fast.h"
#include "ops/cuda_tables.h"
#define HAVE_FAST_TABLE 1
#endif

#ifdef HAVE_FAST_TABLE

#define MAX_IN 5

typedef struct fast_case {
    const char *name;
    kiln_op_id op;
    int n_in, n_out;
    kiln_shape in[MAX_IN];
    bool absent[MAX_IN];
    bool param_f32[MAX_IN]; /* per-channel batch-norm tensors: f32 whatever the data dtype */
    bool positive[MAX_IN];  /* values in [0.5, 1.5] (variances, invstd) */
    kiln_op_attrs attrs;
    bool cudnn; /* needs the cuDNN entries */
    bool conv;
    bool inplace_stats; /* compare inputs 3 and 4 after the run (running statistics) */
    double tol;         /* > 0: this tolerance instead of the dtype's */
} fast_case;

static bool have_cudnn;

/* Deterministic values: case, input and element keyed. */
static float value(int input, int64_t i, bool positive) {
    uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(input * 40503u + 17u);
    h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
    float u = (float)(h & 0xffffff) / (float)0x1000000; /* [0, 1) */
    return positive ? 0.5f + u : 2.0f * u - 1.0f;
}

static int64_t numel_of(kiln_shape s) {
    int64_t n = 1;
    for (int i = 0; i < s.ndim; i++) n *= s.d[i];
    return n;
}

/* An f32 host copy of t (NULL on failure, reported). */
static float *host_f32(kiln_tensor *t) {
    kiln_tensor *c = kiln_to(t, KILN_CPU, KILN_F32, 0);
    CHECK_MSG(c != NULL, "copy to host: %s", kiln_error_message());
    if (!c) return NULL;
    int64_t n = kiln_numel(c);
    float *buf = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (buf && kiln_to_host(c, buf, sizeof(float) * (size_t)n) != KILN_OK) {
        CHECK_MSG(false, "kiln_to_host: %s", kiln_error_message());
        free(buf);
        buf = NULL;
    }
    kiln_release(c);
    return buf;
}

typedef struct run_result {
    float *v[KILN_OP_MAX_OUT + 2];
    int64_t n[KILN_OP_MAX_OUT + 2];
    int count;
} run_result;

static void result_free(run_result *r) {
    for (int i = 0; i < r->count; i++) free(r->v[i]);
    memset(r, 0, sizeof *r);
}

/* Runs the case once on cuda:0 in dtype; outputs (and updated statistics) into r. */
static bool run_case(const fast_case *c, kiln_dtype dtype, run_result *r) {
    memset(r, 0, sizeof *r);
    kiln_tensor *in[MAX_IN] = {NULL};
    bool ok = true;
    for (int i = 0; i < c->n_in && ok; i++) {
        if (c->absent[i]) continue;
        int64_t n = numel_of(c->in[i]);
        float *vals = malloc(sizeof(float) * (size_t)(n ? n : 1));
        for (int64_t k = 0; k < n; k++) vals[k] = value(i, k, c->positive[i]);
        kiln_tensor *h = kiln_from_data(c->in[i], KILN_F32, KILN_CPU, vals);
        free(vals);
        in[i] = h ? kiln_to(h, KILN_CUDA(0), c->param_f32[i] ? KILN_F32 : dtype, 0) : NULL;
        if (h) kiln_release(h);
        ok = in[i] != NULL;
        CHECK_MSG(ok, "%s: input %d: %s", c->name, i, kiln_error_message());
    }
    kiln_tensor *out[KILN_OP_MAX_OUT] = {NULL};
    kiln_op_attrs attrs = c->attrs;
    if (ok) {
        kiln_status st = kiln_dispatch(c->op, c->n_in, in, &attrs, KILN_CUDA(0), out);
        CHECK_MSG(st == KILN_OK, "%s (%s): %s", c->name, kiln_dtype_name(dtype), kiln_error_message());
        ok = st == KILN_OK;
    }
    if (ok) {
        for (int i = 0; i < c->n_out; i++) {
            if (!out[i]) continue;
            r->n[r->count] = kiln_numel(out[i]);
            r->v[r->count++] = host_f32(out[i]);
        }
        if (c->inplace_stats)
            for (int i = 3; i < 5; i++) {
                r->n[r->count] = kiln_numel(in[i]);
                r->v[r->count++] = host_f32(in[i]);
            }
        for (int i = 0; i < r->count; i++) ok = ok && r->v[i];
    }
    for (int i = 0; i < KILN_OP_MAX_OUT; i++)
        if (out[i]) kiln_release(out[i]);
    for (int i = 0; i < MAX_IN; i++)
        if (in[i]) kiln_release(in[i]);
    return ok;
}

static void fast_on(void) { kiln_ops_register_fast_kernels(KILN_DEVICE_CUDA, kiln_cuda_fast_op_kernels()); }
static void fast_off(void) { kiln_ops_clear_fast_kernels(KILN_DEVICE_CUDA); }

static double tolerance(const fast_case *c, kiln_dtype dtype) {
    if (c->tol > 0) return c->tol;
    if (dtype == KILN_F16) return 1e-2;
    if (dtype == KILN_BF16) return 4e-2;
    return c->conv ? 5e-4 : 1e-4;
}

static void check_case(const fast_case *c, kiln_dtype dtype, const char *mode) {
    if (c->cudnn && !have_cudnn) return;
    run_result fast, ref;
    uint64_t runs0 = kiln_ops_fast_runs(c->op), falls0 = kiln_cuda_fast_fallbacks(c->op);
    fast_on();
    bool ok = run_case(c, dtype, &fast);
    uint64_t runs = kiln_ops_fast_runs(c->op) - runs0, falls = kiln_cuda_fast_fallbacks(c->op) - falls0;
    fast_off();
    ok = run_case(c, dtype, &ref) && ok;
    fast_on();
    const char *dn = kiln_dtype_name(dtype);
    CHECK_MSG(runs == 1, "%s %s %s: the fast table's entry ran %llu times (its supports fn declined?)",
              c->name, dn, mode, (unsigned long long)runs);
    CHECK_MSG(falls == 0, "%s %s %s: the library call failed and fell back to the hand-written kernel",
              c->name, dn, mode);
    if (ok) {
        CHECK_MSG(fast.count == ref.count, "%s: %d outputs vs %d", c->name, fast.count, ref.count);
        double tol = tolerance(c, dtype);
        for (int o = 0; o < fast.count && o < ref.count; o++) {
            double scale = 0, worst = 0;
            int64_t at = -1;
            for (int64_t i = 0; i < ref.n[o]; i++) scale = fmax(scale, fabs(ref.v[o][i]));
            for (int64_t i = 0; i < ref.n[o]; i++) {
                double d = fabs((double)fast.v[o][i] - (double)ref.v[o][i]);
                if (!(d <= worst)) worst = d, at = i; /* NaN counts as worst */
            }
            double rel = worst / (scale > 0 ? scale : 1);
            CHECK_MSG(rel <= tol,
                      "%s %s %s: output %d differs: element %lld: fast %g, hand-written %g (%.3g of "
                      "the largest magnitude %g; tolerance %g)",
                      c->name, dn, mode, o, (long long)at, at >= 0 ? fast.v[o][at] : 0.0,
                      at >= 0 ? ref.v[o][at] : 0.0, rel, scale, tol);
            printf("  %-34s %-4s %-13s out %d: max diff %.3g of %.3g (%s)\n", c->name, dn, mode, o, worst,
                   scale, rel <= tol ? "ok" : "FAIL");
        }
    }
    result_free(&fast);
    result_free(&ref);
}

#define S(...) KILN_SHAPE(__VA_ARGS__)

static fast_case conv_attrs(fast_case c, int64_t stride, int64_t pad, int64_t dil, int64_t groups) {
    c.attrs.stride[0] = c.attrs.stride[1] = stride;
    c.attrs.padding[0] = c.attrs.padding[1] = pad;
    c.attrs.dilation[0] = c.attrs.dilation[1] = dil;
    c.attrs.groups = groups;
    c.cudnn = c.conv = true;
    return c;
}

static fast_case with_ints(fast_case c, int64_t a, int64_t b, int64_t d, int64_t e) {
    c.attrs.ints[0] = a, c.attrs.ints[1] = b, c.attrs.ints[2] = d, c.attrs.ints[3] = e;
    c.attrs.n_ints = 4;
    return c;
}

static fast_case pool_attrs(fast_case c, int64_t k, int64_t s, int64_t p, bool include_pad) {
    c.attrs.kernel[0] = c.attrs.kernel[1] = k;
    c.attrs.stride[0] = c.attrs.stride[1] = s;
    c.attrs.padding[0] = c.attrs.padding[1] = p;
    c.attrs.count_include_pad = include_pad;
    c.cudnn = true;
    return c;
}

static void run_all(void) {
    static const kiln_dtype dtypes[] = {KILN_F32, KILN_F16, KILN_BF16};
    fast_case gemm[] = {
        {.name = "mm 64x96 @ 96x80", .op = KILN_OP_MM, .n_in = 2, .n_out = 1, .in = {S(64, 96), S(96, 80)}},
        {.name = "mm 33x17 @ 17x45", .op = KILN_OP_MM, .n_in = 2, .n_out = 1, .in = {S(33, 17), S(17, 45)}},
        {.name = "bmm 4x33x17 @ 4x17x45",
         .op = KILN_OP_BMM,
         .n_in = 2,
         .n_out = 1,
         .in = {S(4, 33, 17), S(4, 17, 45)}},
        {.name = "linear 2x30x64 -> 48 + bias",
         .op = KILN_OP_LINEAR,
         .n_in = 3,
         .n_out = 1,
         .in = {S(2, 30, 64), S(48, 64), S(48)}},
        {.name = "linear 31x64 -> 40, no bias",
         .op = KILN_OP_LINEAR,
         .n_in = 3,
         .n_out = 1,
         .in = {S(31, 64), S(40, 64), S(40)},
         .absent = {false, false, true}},
        {.name = "linear_act 16x4x4x4 -> 40 relu",
         .op = KILN_OP_LINEAR_ACT,
         .n_in = 3,
         .n_out = 1,
         .in = {S(16, 4, 4, 4), S(40, 64), S(40)},
         .attrs = {.flag = 1}},
    };
    fast_case base_conv = {.name = "conv2d 4x8x15x15 k3 p1",
                           .op = KILN_OP_CONV2D,
                           .n_in = 3,
                           .n_out = 1,
                           .in = {S(4, 8, 15, 15), S(16, 8, 3, 3), S(16)}};
    fast_case conv[7];
    conv[0] = conv_attrs(base_conv, 1, 1, 1, 1);
    conv[1] = conv_attrs(base_conv, 2, 1, 1, 2);
    conv[1].name = "conv2d s2 groups 2, no bias";
    conv[1].in[1] = S(16, 4, 3, 3);
    conv[1].absent[2] = true;
    conv[6] = conv_attrs(base_conv, 1, 1, 1, 1);
    conv[6].name = "conv2d_relu 4x8x15x15 k3 p1";
    conv[6].op = KILN_OP_CONV2D_RELU;
    conv[2] = with_ints(conv_attrs((fast_case){.name = "conv2d_grad_input k3 p1",
                                               .op = KILN_OP_CONV2D_GRAD_INPUT,
                                               .n_in = 2,
                                               .n_out = 1,
                                               .in = {S(4, 16, 15, 15), S(16, 8, 3, 3)}},
                                   1, 1, 1, 1),
                        4, 8, 15, 15);
    conv[3] = with_ints(conv_attrs((fast_case){.name = "conv2d_grad_weight k3 p1",
                                               .op = KILN_OP_CONV2D_GRAD_WEIGHT,
                                               .n_in = 2,
                                               .n_out = 1,
                                               .in = {S(4, 16, 15, 15), S(4, 8, 15, 15)}},
                                   1, 1, 1, 1),
                        16, 8, 3, 3);
    conv[4] = with_ints(conv_attrs((fast_case){.name = "conv2d_grad_input s2 d2",
                                               .op = KILN_OP_CONV2D_GRAD_INPUT,
                                               .n_in = 2,
                                               .n_out = 1,
                                               .in = {S(2, 16, 7, 7), S(16, 8, 3, 3)}},
                                   2, 1, 2, 1),
                        2, 8, 15, 15);
    conv[5] = with_ints(conv_attrs((fast_case){.name = "conv2d_grad_weight s2 d2",
                                               .op = KILN_OP_CONV2D_GRAD_WEIGHT,
                                               .n_in = 2,
                                               .n_out = 1,
                                               .in = {S(2, 16, 7, 7), S(2, 8, 15, 15)}},
                                   2, 1, 2, 1),
                        16, 8, 3, 3);
    fast_case other[6];
    other[0] = pool_attrs((fast_case){.name = "avg_pool2d k3 s2 p1 incl-pad",
                                      .op = KILN_OP_AVG_POOL2D,
                                      .n_in = 1,
                                      .n_out = 1,
                                      .in = {S(4, 8, 15, 15)}},
                          3, 2, 1, true);
    other[1] = pool_attrs((fast_case){.name = "avg_pool2d k3 s2 p1 excl-pad",
                                      .op = KILN_OP_AVG_POOL2D,
                                      .n_in = 1,
                                      .n_out = 1,
                                      .in = {S(4, 8, 15, 15)}},
                          3, 2, 1, false);
    other[2] = with_ints(pool_attrs((fast_case){.name = "avg_pool2d_backward k3 s2 p1 excl-pad",
                                                .op = KILN_OP_AVG_POOL2D_BACKWARD,
                                                .n_in = 1,
                                                .n_out = 1,
                                                .in = {S(4, 8, 8, 8)}},
                                    3, 2, 1, false),
                         4, 8, 15, 15);
    fast_case bn = {.name = "batch_norm training 8x16x7x7",
                    .op = KILN_OP_BATCH_NORM,
                    .n_in = 5,
                    .n_out = 3,
                    .in = {S(8, 16, 7, 7), S(16), S(16), S(16), S(16)},
                    .param_f32 = {false, true, true, true, true},
                    .positive = {false, false, false, false, true},
                    .attrs = {.training = true, .momentum = 0.1, .eps = 1e-5},
                    .cudnn = true,
                    .inplace_stats = true};
    other[3] = bn;
    other[4] = bn;
    other[4].name = "batch_norm eval 8x16x7x7";
    other[4].attrs.training = false;
    other[4].inplace_stats = false;
    other[5] = (fast_case){.name = "batch_norm_backward training",
                           .op = KILN_OP_BATCH_NORM_BACKWARD,
                           .n_in = 5,
                           .n_out = 3,
                           .in = {S(8, 16, 7, 7), S(8, 16, 7, 7), S(16), S(16), S(16)},
                           .param_f32 = {false, false, true, true, true},
                           .positive = {false, false, false, false, true},
                           .attrs = {.training = true, .eps = 1e-5},
                           .cudnn = true};

    for (int d = 0; d < 3; d++) {
        for (size_t i = 0; i < sizeof gemm / sizeof gemm[0]; i++) check_case(&gemm[i], dtypes[d], "default");
        for (size_t i = 0; i < sizeof other / sizeof other[0]; i++)
            check_case(&other[i], dtypes[d], "default");
        static const char *modes[] = {"default", "benchmark", "deterministic"};
        for (int m = 0; m < 3; m++) {
            kiln_set_cudnn_benchmark(m == 1);
            kiln_set_deterministic(m == 2);
            for (size_t i = 0; i < sizeof conv / sizeof conv[0]; i++)
                check_case(&conv[i], dtypes[d], modes[m]);
        }
        kiln_set_cudnn_benchmark(false);
        kiln_set_deterministic(false);
    }
    /* TF32 allowed: f32 GEMMs and convolutions within TF32's 10-bit mantissa. */
    kiln_set_allow_tf32(true);
    fast_case tf = gemm[0];
    tf.name = "mm 64x96 @ 96x80 (tf32)";
    tf.tol = 4e-3; /* TF32 rounds each input to 10 mantissa bits: ~2^-11 per product, K = 96 */
    check_case(&tf, KILN_F32, "tf32");
    kiln_set_allow_tf32(false);

    if (!have_cudnn) return;
    /* The tuner's picks, then a fresh tuner answers from the cache file. */
    kiln_autotuner *t = kiln_autotune_global();
    char *text = t ? kiln_autotune_serialize(t) : NULL;
    printf("autotuner picks (the cache file's entries):\n%s", text ? text : "(none)\n");
    free(text);
    kiln_autotune_stats s;
    kiln_autotune_stats_get(t, &s);
    CHECK_MSG(s.tunings > 0 && s.saves > 0, "benchmark mode timed %lld configurations, saved %lld times",
              (long long)s.tunings, (long long)s.saves);
    kiln_autotune_global_free();
    kiln_set_cudnn_benchmark(true);
    for (size_t i = 0; i < sizeof conv / sizeof conv[0]; i++) check_case(&conv[i], KILN_F32, "cached");
    kiln_set_cudnn_benchmark(false);
    t = kiln_autotune_global();
    kiln_autotune_stats_get(t, &s);
    CHECK_MSG(s.loaded > 0 && s.tunings == 0 && s.timed_runs == 0,
              "a fresh tuner: %lld entries loaded, %lld configurations timed (want >0 and 0)",
              (long long)s.loaded, (long long)s.tunings);
}

int main(void) {
    char cache[] = "/tmp/kiln_test_cuda_fast_XXXXXX";
    int fd = mkstemp(cache);
    if (fd >= 0) close(fd), remove(cache); /* the tuner writes it */
    setenv("KILN_AUTOTUNE_CACHE", cache, 1);
    if (kiln_init() != KILN_OK) {
        printf("kiln_init: %s\n", kiln_error_message());
        return 1;
    }
    if (kiln_device_count(KILN_DEVICE_CUDA) < 1) {
        kiln_shutdown();
        kt_skip("no CUDA device visible (no driver or no GPU): the cuBLASLt and cuDNN paths cannot run here");
    }
    have_cudnn = strstr(kiln_build_options(), "cudnn=on") != NULL;
    printf("CUDA fast paths vs the hand-written kernels on cuda:0 (%s; cuBLASLt %zu)%s\n",
           kiln_build_options(), kiln_cublaslt_version(),
           have_cudnn ? "" : "; cuDNN not built: its cases are not run");
    run_all();
    remove(cache);
    kiln_shutdown();
    return kt_finish();
}

#else

int main(void) {
    kt_skip(
#if defined(KILN_CUDA_EMULATION)
        "the emulation build has no cuBLASLt or cuDNN, so no CUDA fast table to compare"
#else
        "this build has no CUDA backend (configure with -DKILN_WITH_CUDA=ON on a machine with nvcc)"
#endif
    );
    return 0;
}
#endif

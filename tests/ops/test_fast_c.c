/* The plain-C fast CPU kernels (src/kernels/cpu/fast/) against the
 * reference kernels. Each configuration runs once with the fast tables
 * (and must reach the fast kernel where it supports the arguments) and once
 * with them cleared.
 *   max pooling: bit for bit: forward values and indices, and the input
 *     gradient of the backward, on odd sizes, padding, ceil mode, 3-d
 *     inputs, ties, NaN and -inf;
 *   relu and its backward: bit for bit, with NaN, +-0 and +-inf;
 *   sum: every (A, K, B) pattern, within 2 f32 ulps per element (both
 *     accumulate in double; the fast kernel in another order). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"
#include "ops/op_registry.h"
#include "test_util.h"

typedef struct pool_run {
    float *y, *dx;
    int64_t *idx;
    int64_t ny, nx;
} pool_run;

static void free_run(pool_run *r) {
    free(r->y);
    free(r->dx);
    free(r->idx);
}

/* x holds the values in `vals` (n of them); grad is fixed per output index. */
static bool run_pool(kiln_shape shape, const float *vals, const kiln_pool2d_opts *o, pool_run *r) {
    memset(r, 0, sizeof *r);
    kiln_scope_begin();
    kiln_tensor *x = kiln_from_data(shape, KILN_F32, KILN_CPU, vals);
    CHECK_OK(kiln_set_requires_grad(x, true));
    kiln_tensor *idx = NULL;
    kiln_tensor *y = kiln_max_pool2d(x, o, &idx);
    CHECK_MSG(y && idx, "max_pool2d: %s", kiln_error_message());
    bool ok = y && idx;
    if (ok) {
        r->ny = kiln_numel(y);
        r->nx = kiln_numel(x);
        float *g = malloc(sizeof(float) * (size_t)r->ny);
        for (int64_t i = 0; i < r->ny; i++) g[i] = (float)(0.25 + 0.5 * (double)((i * 37) % 11)) * (i % 2 ? -1.f : 1.f);
        kiln_tensor *gt = kiln_from_data(kiln_shape_of(y), KILN_F32, KILN_CPU, g);
        free(g);
        CHECK_OK(kiln_backward(y, gt, false));
        r->y = malloc(sizeof(float) * (size_t)r->ny);
        r->idx = malloc(sizeof(int64_t) * (size_t)r->ny);
        r->dx = malloc(sizeof(float) * (size_t)r->nx);
        CHECK_OK(kiln_to_host(y, r->y, sizeof(float) * (size_t)r->ny));
        CHECK_OK(kiln_to_host(idx, r->idx, sizeof(int64_t) * (size_t)r->ny));
        CHECK_OK(kiln_to_host(kiln_grad(x), r->dx, sizeof(float) * (size_t)r->nx));
        kiln_release(idx);
    }
    kiln_scope_end();
    return ok;
}

/* The fast tables off, then back on. */
static void reference_only(void) { kiln_ops_clear_fast_kernels(KILN_DEVICE_CPU); }
static void restore_tables(void) {
    kiln_shutdown();
    CHECK_OK(kiln_init());
}

static void check_config(const char *name, kiln_shape shape, kiln_pool2d_opts o, int special, bool fast_backward) {
    int64_t n = 1;
    for (int i = 0; i < shape.ndim; i++) n *= shape.d[i];
    float *vals = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) vals[i] = (float)(((i * 7919) % 7) - 3) / 8.0f; /* seven values: many ties */
    if (special && n > 5) vals[3] = NAN, vals[6] = NAN, vals[n - 2] = -INFINITY, vals[n / 2] = INFINITY;
    if (special && n > 200) /* a window starting at -inf; two NaNs in one window (the last wins) */
        vals[2 * shape.d[shape.ndim - 1] + 4] = -INFINITY, vals[shape.d[shape.ndim - 1] + 2] = NAN;

    uint64_t f0 = kiln_ops_fast_runs(KILN_OP_MAX_POOL2D), b0 = kiln_ops_fast_runs(KILN_OP_MAX_POOL2D_BACKWARD);
    pool_run fast, ref;
    bool ok = run_pool(shape, vals, &o, &fast);
    uint64_t f1 = kiln_ops_fast_runs(KILN_OP_MAX_POOL2D), b1 = kiln_ops_fast_runs(KILN_OP_MAX_POOL2D_BACKWARD);
    CHECK_MSG(f1 > f0, "%s: the fast forward did not run", name);
    CHECK_MSG((b1 > b0) == fast_backward, "%s: the fast backward %s", name,
              fast_backward ? "did not run" : "ran on overlapping windows");

    reference_only();
    ok = run_pool(shape, vals, &o, &ref) && ok;
    restore_tables();
    if (ok) {
        CHECK_MSG(!memcmp(fast.y, ref.y, sizeof(float) * (size_t)fast.ny), "%s: forward values differ", name);
        CHECK_MSG(!memcmp(fast.idx, ref.idx, sizeof(int64_t) * (size_t)fast.ny), "%s: indices differ", name);
        CHECK_MSG(!memcmp(fast.dx, ref.dx, sizeof(float) * (size_t)fast.nx), "%s: input gradients differ", name);
    }
    free_run(&fast);
    free_run(&ref);
    free(vals);
}

static float *values(int64_t n, int special) {
    float *v = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) v[i] = (float)(((i * 7919) % 23) - 11) / 4.0f + (float)(i % 5) * 1e-3f;
    if (special && n > 8) v[1] = NAN, v[2] = -0.0f, v[3] = 0.0f, v[4] = INFINITY, v[5] = -INFINITY;
    return v;
}

/* relu forward and backward (through autograd) on a contiguous f32 tensor. */
static void run_relu(kiln_shape s, const float *x, float *y, float *dx) {
    int64_t n = 1;
    for (int i = 0; i < s.ndim; i++) n *= s.d[i];
    kiln_scope_begin();
    kiln_tensor *t = kiln_from_data(s, KILN_F32, KILN_CPU, x);
    CHECK_OK(kiln_set_requires_grad(t, true));
    kiln_tensor *r = kiln_relu(t);
    float *g = values(n, 0);
    CHECK_OK(kiln_backward(r, kiln_from_data(s, KILN_F32, KILN_CPU, g), false));
    free(g);
    CHECK_OK(kiln_to_host(r, y, sizeof(float) * (size_t)n));
    CHECK_OK(kiln_to_host(kiln_grad(t), dx, sizeof(float) * (size_t)n));
    kiln_scope_end();
}

static void check_relu(kiln_shape s) {
    int64_t n = 1;
    for (int i = 0; i < s.ndim; i++) n *= s.d[i];
    float *x = values(n, 1), *y[2], *dx[2];
    for (int k = 0; k < 2; k++) y[k] = malloc(sizeof(float) * (size_t)n), dx[k] = malloc(sizeof(float) * (size_t)n);
    uint64_t f0 = kiln_ops_fast_runs(KILN_OP_RELU), b0 = kiln_ops_fast_runs(KILN_OP_RELU_BACKWARD);
    run_relu(s, x, y[0], dx[0]);
    CHECK_MSG(kiln_ops_fast_runs(KILN_OP_RELU) > f0, "relu %lld: the fast kernel did not run", (long long)n);
    CHECK_MSG(kiln_ops_fast_runs(KILN_OP_RELU_BACKWARD) > b0, "relu_backward %lld: the fast kernel did not run",
              (long long)n);
    reference_only();
    run_relu(s, x, y[1], dx[1]);
    restore_tables();
    CHECK_MSG(!memcmp(y[0], y[1], sizeof(float) * (size_t)n), "relu %lld: values differ", (long long)n);
    CHECK_MSG(!memcmp(dx[0], dx[1], sizeof(float) * (size_t)n), "relu_backward %lld: values differ", (long long)n);
    for (int k = 0; k < 2; k++) free(y[k]), free(dx[k]);
    free(x);
}

static void run_sum(kiln_shape s, const float *x, int n_dims, const int *dims, bool keepdim, float *out,
                    int64_t *n_out) {
    kiln_scope_begin();
    kiln_tensor *r = kiln_sum(kiln_from_data(s, KILN_F32, KILN_CPU, x), n_dims, dims, keepdim);
    CHECK_MSG(r != NULL, "sum: %s", kiln_error_message());
    if (r) {
        *n_out = kiln_numel(r);
        CHECK_OK(kiln_to_host(r, out, sizeof(float) * (size_t)*n_out));
    }
    kiln_scope_end();
}

static void check_sum(const char *name, kiln_shape s, int n_dims, const int *dims, bool keepdim) {
    int64_t n = 1;
    for (int i = 0; i < s.ndim; i++) n *= s.d[i];
    float *x = values(n, 0), *o[2];
    o[0] = calloc((size_t)n, sizeof(float)), o[1] = calloc((size_t)n, sizeof(float));
    int64_t m[2] = {0, 0};
    uint64_t f0 = kiln_ops_fast_runs(KILN_OP_SUM);
    run_sum(s, x, n_dims, dims, keepdim, o[0], &m[0]);
    CHECK_MSG(kiln_ops_fast_runs(KILN_OP_SUM) > f0, "sum %s: the fast kernel did not run", name);
    reference_only();
    run_sum(s, x, n_dims, dims, keepdim, o[1], &m[1]);
    restore_tables();
    CHECK_MSG(m[0] == m[1] && m[0] > 0, "sum %s: %lld vs %lld outputs", name, (long long)m[0], (long long)m[1]);
    for (int64_t i = 0; i < m[0] && m[0] == m[1]; i++) {
        double d = fabs((double)o[0][i] - (double)o[1][i]);
        double ulp = fabs((double)nextafterf(o[1][i], INFINITY) - (double)o[1][i]);
        if (d > 2 * ulp) {
            CHECK_MSG(false, "sum %s: element %lld is %.9g, the reference %.9g", name, (long long)i, o[0][i], o[1][i]);
            break;
        }
    }
    free(o[0]), free(o[1]), free(x);
}

static kiln_pool2d_opts pool(int64_t k, int64_t s, int64_t p, bool ceil_mode) {
    kiln_pool2d_opts o = kiln_pool2d_defaults(k);
    o.stride[0] = o.stride[1] = s;
    o.padding[0] = o.padding[1] = p;
    o.ceil_mode = ceil_mode;
    return o;
}

int main(void) {
    if (getenv("KILN_CPU_KERNELS") && strcmp(getenv("KILN_CPU_KERNELS"), "fast"))
        kt_skip("KILN_CPU_KERNELS selects the reference kernels only");
    CHECK_OK(kiln_init());
    check_config("2x3x7x9 k2 s2", KILN_SHAPE(2, 3, 7, 9), pool(2, 2, 0, false), 0, true);
    check_config("2x3x7x9 k2 s2 ceil", KILN_SHAPE(2, 3, 7, 9), pool(2, 2, 0, true), 1, true);
    check_config("1x2x5x6 k2 s3 p1", KILN_SHAPE(1, 2, 5, 6), pool(2, 3, 1, false), 1, true);
    check_config("3x8x8 3-d k2", KILN_SHAPE(3, 8, 8), pool(2, 2, 0, false), 0, true);
    check_config("2x4x28x28 k2 (tutorial)", KILN_SHAPE(2, 4, 28, 28), pool(2, 2, 0, false), 1, true);
    check_config("2x3x9x7 k3 s2 p1 ceil (overlap)", KILN_SHAPE(2, 3, 9, 7), pool(3, 2, 1, true), 1, false);
    check_relu(KILN_SHAPE(3, 5, 7));
    check_relu(KILN_SHAPE(64, 33, 31)); /* large enough for the parallel loop */
    check_sum("all", KILN_SHAPE(5, 7, 9), 0, NULL, false);
    check_sum("rows 1000x37", KILN_SHAPE(1000, 37), 1, (int[]){1}, false);
    check_sum("columns 37x1000 keepdim", KILN_SHAPE(37, 1000), 1, (int[]){0}, true);
    check_sum("conv bias 8x16x13x11", KILN_SHAPE(8, 16, 13, 11), 3, (int[]){0, 2, 3}, false);
    check_sum("conv bias 64x32x30x30 (parallel)", KILN_SHAPE(64, 32, 30, 30), 3, (int[]){0, -1, 2}, false);
    check_sum("middle with size-1 dims", KILN_SHAPE(1, 6, 1, 5, 4), 2, (int[]){1, 4}, true);
    kiln_shutdown();
    return kt_finish();
}

/* The plain-C fast max pooling (src/kernels/cpu/fast/pool_fast.c) against
 * the reference kernels, bit for bit: forward values and indices, and the
 * input gradient of the backward, on odd sizes, padding, ceil mode, 3-d
 * inputs, ties, NaN and -inf. Each configuration runs once with the fast
 * tables (and must have reached the fast kernel where it supports the
 * arguments) and once with the fast tables cleared. */
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

    kiln_ops_clear_fast_kernels(KILN_DEVICE_CPU);
    ok = run_pool(shape, vals, &o, &ref) && ok;
    kiln_shutdown(); /* back to the default tables */
    CHECK_OK(kiln_init());
    if (ok) {
        CHECK_MSG(!memcmp(fast.y, ref.y, sizeof(float) * (size_t)fast.ny), "%s: forward values differ", name);
        CHECK_MSG(!memcmp(fast.idx, ref.idx, sizeof(int64_t) * (size_t)fast.ny), "%s: indices differ", name);
        CHECK_MSG(!memcmp(fast.dx, ref.dx, sizeof(float) * (size_t)fast.nx), "%s: input gradients differ", name);
    }
    free_run(&fast);
    free_run(&ref);
    free(vals);
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
    kiln_shutdown();
    return kt_finish();
}

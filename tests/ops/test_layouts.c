/* Opaque layouts (kiln/tensor.h, KILN_LAYOUT_NCHW16C): chains of ops
 * across blocked and strided tensors give the values of the reference
 * kernels; views, host reads, copies, in-place ops and ops without a
 * blocked kernel convert a blocked tensor to strided in place (values and
 * version kept, views alias it); kiln_set_cpu_layouts(false) keeps every
 * result strided; meta plans the same layouts as the CPU.
 *
 * Blocked tensors come from the convolution (oneDNN builds) and, so the
 * layout machinery is tested in every build, from the internal reorder. */
#include "../test_util.h"
#include "kernels/kernels.h"
#include "ops/op_registry.h"
#include "tensor/tensor_internal.h"
#ifdef KILN_WITH_ONEDNN
#include "kernels/cpu/fast/gemm_avx2.h"
#endif

static float *host_values(kiln_tensor *t) {
    int64_t n = kiln_numel(t);
    float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
    CHECK_OK(kiln_to_host(t, v, sizeof(float) * (size_t)n));
    return v;
}

/* The values of t's gradient (kiln_grad returns a new reference). */
static float *grad_values(kiln_tensor *t) {
    kiln_tensor *g = kiln_grad(t);
    float *v = g ? host_values(g) : NULL;
    kiln_release(g);
    return v;
}

/* Deterministic values with ties and signs. */
static kiln_tensor *pattern(kiln_shape s, int salt) {
    int64_t n = 1;
    for (int i = 0; i < s.ndim; i++) n *= s.d[i];
    float *v = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) v[i] = (float)((((i + salt) * 7919) % 23) - 11) / 8.0f;
    kiln_tensor *t = kiln_from_data(s, KILN_F32, KILN_CPU, v);
    free(v);
    return t;
}

/* A blocked copy of a contiguous strided f32 (N, C, H, W), C % 16 == 0. */
static kiln_tensor *blocked_copy(kiln_tensor *src) {
    kiln_tensor *b = kiln_empty(kiln_shape_of(src), KILN_F32, KILN_CPU);
    kiln_cpu_reorder_nchw16c(kiln_data_ptr(b), kiln_data_ptr(src), 4, kiln_shape_of(src).d, true);
    kiln_tensor_set_layout(b, KILN_LAYOUT_NCHW16C);
    return b;
}

static double max_rel_diff(const float *a, const float *b, int64_t n) {
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]) / (1.0 + fabs((double)b[i]));
        if (d > worst || d != d) worst = d != d ? INFINITY : d;
    }
    return worst;
}

static void test_reorder_roundtrip(void) {
    kiln_tensor *x = pattern(KILN_SHAPE(3, 32, 5, 7), 1);
    kiln_tensor *b = blocked_copy(x);
    CHECK(kiln_layout_of(b) == KILN_LAYOUT_NCHW16C);
    uint64_t version = kiln_tensor_version(b);
    float *want = host_values(x), *got = host_values(b); /* converts b */
    CHECK(kiln_layout_of(b) == KILN_LAYOUT_STRIDED);
    CHECK(kiln_tensor_version(b) == version);
    CHECK(!memcmp(want, got, sizeof(float) * (size_t)kiln_numel(x)));
    CHECK(!strcmp(kiln_layout_name(KILN_LAYOUT_NCHW16C), "nChw16c"));
    CHECK(!strcmp(kiln_layout_name(KILN_LAYOUT_STRIDED), "strided"));
    free(want), free(got);
    kiln_release(x), kiln_release(b);
}

/* Pooling, ReLU and their gradients on a blocked input against the same
 * ops on the strided input: forward values, indices and gradients. */
static void pool_case(kiln_shape s, bool grad_strided) {
    kiln_tensor *x = pattern(s, 3), *xb = blocked_copy(x);
    CHECK_OK(kiln_set_requires_grad(x, true));
    CHECK_OK(kiln_set_requires_grad(xb, true));
    kiln_pool2d_opts po = kiln_pool2d_defaults(2);
    kiln_tensor *ix = NULL, *ixb = NULL;
    kiln_tensor *r = kiln_relu(x), *rb = kiln_relu(xb);
    CHECK(kiln_layout_of(rb) == KILN_LAYOUT_NCHW16C);
    kiln_tensor *y = kiln_max_pool2d(r, &po, &ix), *yb = kiln_max_pool2d(rb, &po, &ixb);
    CHECK(kiln_layout_of(yb) == KILN_LAYOUT_NCHW16C && kiln_layout_of(ixb) == KILN_LAYOUT_NCHW16C);
    /* A weighted sum, so every gradient differs; the weights strided. */
    kiln_tensor *wgt = pattern(kiln_shape_of(y), 5);
    kiln_tensor *yw = kiln_mul(y, wgt);
    kiln_tensor *ybw = NULL;
    if (grad_strided) {
        /* a view forces yb strided: its gradient then arrives strided */
        kiln_tensor *flat = kiln_flatten(yb, 1, -1);
        CHECK(kiln_layout_of(yb) == KILN_LAYOUT_STRIDED);
        kiln_tensor *wf = kiln_flatten(wgt, 1, -1);
        ybw = kiln_mul(flat, wf);
        kiln_release(flat), kiln_release(wf);
    } else {
        ybw = kiln_mul(yb, wgt); /* mul has no blocked kernel: yb converts */
    }
    kiln_tensor *l = kiln_sum(yw, 0, NULL, false), *lb = kiln_sum(ybw, 0, NULL, false);
    CHECK_OK(kiln_backward(l, NULL, false));
    CHECK_OK(kiln_backward(lb, NULL, false));
    int64_t n = kiln_numel(y), nx = kiln_numel(x);
    float *a = host_values(y), *b = host_values(yb), *ga = grad_values(x), *gb = grad_values(xb);
    CHECK_MSG(!memcmp(a, b, sizeof(float) * (size_t)n), "pool forward differs on blocked input");
    CHECK_MSG(!memcmp(ga, gb, sizeof(float) * (size_t)nx), "pool/relu gradient differs on blocked input (%s grad)",
              grad_strided ? "strided" : "blocked");
    int64_t *ia = malloc(sizeof(int64_t) * (size_t)n), *ib = malloc(sizeof(int64_t) * (size_t)n);
    CHECK_OK(kiln_to_host(ix, ia, sizeof(int64_t) * (size_t)n));
    CHECK_OK(kiln_to_host(ixb, ib, sizeof(int64_t) * (size_t)n));
    CHECK_MSG(!memcmp(ia, ib, sizeof(int64_t) * (size_t)n), "pool indices differ on blocked input");
    free(a), free(b), free(ga), free(gb), free(ia), free(ib);
    kiln_tensor *ts[] = {x, xb, ix, ixb, r, rb, y, yb, wgt, yw, ybw, l, lb};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) kiln_release(ts[i]);
}

static void test_pool_relu(void) {
    pool_case(KILN_SHAPE(2, 32, 8, 8), false);
    pool_case(KILN_SHAPE(2, 32, 8, 8), true);
    pool_case(KILN_SHAPE(3, 16, 7, 9), false); /* odd sizes: uncovered row and column */
    pool_case(KILN_SHAPE(1, 48, 5, 5), true);
}

/* The bias-gradient sum over (N, H, W) of a blocked tensor. */
static void test_sum(void) {
    kiln_tensor *x = pattern(KILN_SHAPE(3, 32, 5, 6), 7), *xb = blocked_copy(x);
    static const int dims[3] = {0, 2, 3};
    kiln_tensor *s = kiln_sum(x, 3, dims, false), *sb = kiln_sum(xb, 3, dims, false);
    CHECK(kiln_layout_of(xb) == KILN_LAYOUT_NCHW16C); /* read as it is */
    float *a = host_values(s), *b = host_values(sb);
    CHECK_MSG(max_rel_diff(b, a, 32) <= 1e-6, "blocked channel sums differ: %g", max_rel_diff(b, a, 32));
    free(a), free(b);
    /* another reduction takes the strided path */
    kiln_tensor *t = kiln_sum(xb, 1, (int[]){1}, false);
    CHECK(kiln_layout_of(xb) == KILN_LAYOUT_STRIDED);
    kiln_tensor *tr = kiln_sum(x, 1, (int[]){1}, false);
    float *c = host_values(t), *d = host_values(tr);
    CHECK(!memcmp(c, d, sizeof(float) * (size_t)kiln_numel(t)));
    free(c), free(d);
    kiln_release(x), kiln_release(xb), kiln_release(s), kiln_release(sb), kiln_release(t), kiln_release(tr);
}

/* Batch norm (training, then eval) and its backward on a blocked input
 * against the same on the strided input: values within the fast kernels'
 * summation-order tolerance, output in the input's layout. */
static void bn_case(bool training) {
    kiln_tensor *x = pattern(KILN_SHAPE(3, 32, 5, 6), 17), *xb = blocked_copy(x);
    kiln_tensor *w[2], *b[2], *rm[2], *rv[2], *y[2], *l[2];
    kiln_tensor *xs[2] = {x, xb};
    for (int k = 0; k < 2; k++) {
        w[k] = pattern(KILN_SHAPE(32), 3), b[k] = pattern(KILN_SHAPE(32), 4);
        rm[k] = kiln_zeros(KILN_SHAPE(32), KILN_F32, KILN_CPU), rv[k] = kiln_ones(KILN_SHAPE(32), KILN_F32, KILN_CPU);
        CHECK_OK(kiln_set_requires_grad(xs[k], true));
        CHECK_OK(kiln_set_requires_grad(w[k], true));
        y[k] = kiln_batch_norm(xs[k], w[k], b[k], rm[k], rv[k], training, 0.1, 1e-5);
        CHECK(y[k] != NULL);
        kiln_tensor *wgt = pattern(kiln_shape_of(y[k]), 9);
        kiln_tensor *p = kiln_mul(y[k], wgt); /* converts y[1] */
        l[k] = kiln_sum(p, 0, NULL, false);
        CHECK_OK(kiln_backward(l[k], NULL, false));
        kiln_release(wgt), kiln_release(p);
    }
    int64_t n = kiln_numel(x);
    float *ya = host_values(y[0]), *yb = host_values(y[1]), *ga = grad_values(x), *gb = grad_values(xb);
    float *wa = grad_values(w[0]), *wb = grad_values(w[1]), *ma = host_values(rm[0]), *mb = host_values(rm[1]);
    CHECK_MSG(max_rel_diff(yb, ya, n) <= 1e-5, "batch norm (%s) on a blocked input: %g", training ? "train" : "eval",
              max_rel_diff(yb, ya, n));
    CHECK_MSG(max_rel_diff(gb, ga, n) <= 1e-4, "batch norm input gradient on a blocked input: %g",
              max_rel_diff(gb, ga, n));
    CHECK_MSG(max_rel_diff(wb, wa, 32) <= 1e-4, "batch norm weight gradient on a blocked input: %g",
              max_rel_diff(wb, wa, 32));
    CHECK_MSG(max_rel_diff(mb, ma, 32) <= 1e-6, "running mean on a blocked input: %g", max_rel_diff(mb, ma, 32));
    free(ya), free(yb), free(ga), free(gb), free(wa), free(wb), free(ma), free(mb);
    for (int k = 0; k < 2; k++) {
        kiln_release(w[k]), kiln_release(b[k]), kiln_release(rm[k]), kiln_release(rv[k]);
        kiln_release(y[k]), kiln_release(l[k]);
    }
    kiln_release(x), kiln_release(xb);
}

static void test_batch_norm(void) {
    /* the fast kernel keeps the layout */
    kiln_tensor *x = pattern(KILN_SHAPE(2, 16, 3, 3), 21), *xb = blocked_copy(x);
    kiln_tensor *rm = kiln_zeros(KILN_SHAPE(16), KILN_F32, KILN_CPU), *rv = kiln_ones(KILN_SHAPE(16), KILN_F32, KILN_CPU);
    kiln_tensor *y = kiln_batch_norm(xb, NULL, NULL, rm, rv, true, 0.1, 1e-5);
    CHECK(y && kiln_layout_of(y) == KILN_LAYOUT_NCHW16C);
    kiln_release(x), kiln_release(xb), kiln_release(rm), kiln_release(rv), kiln_release(y);
    bn_case(true);
    bn_case(false);
}

/* Views alias the converted storage; in-place ops; copies; mixed inputs. */
static void test_views_and_writes(void) {
    kiln_tensor *x = pattern(KILN_SHAPE(2, 16, 3, 4), 11), *xb = blocked_copy(x);
    kiln_tensor *handle = kiln_detach(xb); /* same geometry: shares the blocked storage */
    CHECK(kiln_layout_of(handle) == KILN_LAYOUT_NCHW16C);
    kiln_tensor *v = kiln_narrow(xb, 1, 2, 3); /* a view: converts the storage for every handle */
    CHECK(kiln_layout_of(xb) == KILN_LAYOUT_STRIDED && kiln_layout_of(handle) == KILN_LAYOUT_STRIDED);
    CHECK(kiln_shares_storage(v, xb));
    float fives[2 * 3 * 12];
    for (int i = 0; i < 2 * 3 * 12; i++) fives[i] = 5.0f;
    kiln_tensor *five = kiln_from_data(KILN_SHAPE(2, 3, 3, 4), KILN_F32, KILN_CPU, fives);
    CHECK_OK(kiln_copy_(v, five, 0));
    kiln_release(five);
    float *got = host_values(handle), *want = host_values(x);
    for (int64_t n = 0; n < 2; n++)
        for (int64_t c = 2; c < 5; c++)
            for (int64_t i = 0; i < 12; i++) want[(n * 16 + c) * 12 + i] = 5.0f;
    CHECK_MSG(!memcmp(got, want, sizeof(float) * 2 * 16 * 12), "a write through a view is not seen by the tensor");
    free(got), free(want);

    /* copy_ into and out of blocked tensors; dtype conversion */
    kiln_tensor *yb = blocked_copy(x), *z = kiln_zeros(KILN_SHAPE(2, 16, 3, 4), KILN_F32, KILN_CPU);
    CHECK_OK(kiln_copy_(z, yb, 0));
    kiln_tensor *d = kiln_to(yb, KILN_CPU, KILN_F64, 0);
    double *dv = malloc(sizeof(double) * 2 * 16 * 12);
    CHECK_OK(kiln_to_host(d, dv, sizeof(double) * 2 * 16 * 12));
    float *xv = host_values(x), *zv = host_values(z);
    CHECK(!memcmp(xv, zv, sizeof(float) * 2 * 16 * 12));
    bool same = true;
    for (int i = 0; i < 2 * 16 * 12; i++) same &= dv[i] == (double)xv[i];
    CHECK_MSG(same, "kiln_to f64 of a blocked tensor");
    free(dv), free(zv);

    /* an op with a blocked and a strided input (add's blocked kernel wants one layout) */
    kiln_tensor *wb = blocked_copy(x), *s = kiln_add(wb, x);
    float *sv = host_values(s);
    bool twice = true;
    for (int i = 0; i < 2 * 16 * 12; i++) twice &= sv[i] == 2 * xv[i];
    CHECK_MSG(twice, "add of a blocked and a strided tensor");
    CHECK(kiln_layout_of(s) == KILN_LAYOUT_STRIDED);
    free(sv);

    /* an in-place op on a blocked tensor */
    kiln_tensor *ib = blocked_copy(x);
    uint64_t v0 = kiln_tensor_version(ib);
    kiln_tensor *same_ib = kiln_relu_(ib);
    CHECK(same_ib == ib && kiln_tensor_version(ib) == v0 + 1);
    float *iv = host_values(ib);
    bool relu_ok = true;
    for (int i = 0; i < 2 * 16 * 12; i++) relu_ok &= iv[i] == (xv[i] > 0 ? xv[i] : 0.0f);
    CHECK_MSG(relu_ok, "in-place relu on a blocked tensor");
    free(iv), free(xv);
    kiln_release(same_ib);
    kiln_tensor *ts[] = {x, xb, handle, v, yb, z, d, wb, s, ib};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) kiln_release(ts[i]);
}

/* Sums and in-place ReLU of blocked tensors stay blocked (one layout in,
 * the same out) with the strided values; gradients through them match. */
static void add_case(kiln_shape shape) {
    kiln_tensor *a = pattern(shape, 21), *b = pattern(shape, 22);
    kiln_tensor *ab = blocked_copy(a), *bb = blocked_copy(b);
    CHECK_OK(kiln_set_requires_grad(a, true));
    CHECK_OK(kiln_set_requires_grad(b, true));
    CHECK_OK(kiln_set_requires_grad(ab, true));
    CHECK_OK(kiln_set_requires_grad(bb, true));
    kiln_tensor *s = kiln_add(a, b), *sb = kiln_add(ab, bb);
    CHECK_MSG(kiln_layout_of(sb) == KILN_LAYOUT_NCHW16C, "add of two blocked tensors gave %s",
              kiln_layout_name(kiln_layout_of(sb)));
    CHECK(kiln_layout_of(ab) == KILN_LAYOUT_NCHW16C && kiln_layout_of(bb) == KILN_LAYOUT_NCHW16C);
    /* in place on a non-leaf: u = s + a, u += b, relu_(u) */
    kiln_tensor *u = kiln_add(s, a), *ub = kiln_add(sb, ab);
    CHECK(kiln_layout_of(ub) == KILN_LAYOUT_NCHW16C);
    kiln_tensor *w = kiln_add_(u, b), *wb = kiln_add_(ub, bb);
    CHECK(w == u && wb == ub && kiln_layout_of(ub) == KILN_LAYOUT_NCHW16C);
    kiln_tensor *r = kiln_relu_(u), *rb = kiln_relu_(ub);
    CHECK(kiln_layout_of(ub) == KILN_LAYOUT_NCHW16C);
    int64_t n = kiln_numel(a);
    float *want = host_values(u), *got = host_values(ub);
    CHECK_MSG(!memcmp(want, got, sizeof(float) * (size_t)n), "relu(a + b + a + b) differs on blocked tensors");
    free(want), free(got);
    kiln_tensor *wgt = pattern(shape, 23);
    kiln_tensor *l = kiln_sum(kiln_mul(u, wgt), 0, NULL, false), *lb = kiln_sum(kiln_mul(ub, wgt), 0, NULL, false);
    CHECK_OK(kiln_backward(l, NULL, false));
    CHECK_OK(kiln_backward(lb, NULL, false));
    float *ga = grad_values(a), *gab = grad_values(ab), *gb = grad_values(b), *gbb = grad_values(bb);
    CHECK_MSG(!memcmp(ga, gab, sizeof(float) * (size_t)n) && !memcmp(gb, gbb, sizeof(float) * (size_t)n),
              "gradients through blocked add/add_/relu_ differ");
    free(ga), free(gab), free(gb), free(gbb);
    kiln_tensor *ts[] = {a, b, ab, bb, s, sb, u, ub, w, wb, r, rb, wgt, l, lb};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) kiln_release(ts[i]);
}

static void test_add(void) {
    kiln_scope_begin();
    add_case(KILN_SHAPE(2, 32, 5, 7));
    add_case(KILN_SHAPE(3, 16, 1, 1));
    /* broadcasting and mixed layouts take the strided path, same values */
    kiln_tensor *a = pattern(KILN_SHAPE(2, 16, 3, 3), 31), *ab = blocked_copy(a);
    kiln_tensor *c = pattern(KILN_SHAPE(1, 16, 1, 1), 32);
    kiln_tensor *s = kiln_add(ab, c), *s0 = kiln_add(a, c);
    float *x = host_values(s), *y = host_values(s0);
    CHECK_MSG(x && y && !memcmp(x, y, sizeof(float) * 288), "broadcast add of a blocked tensor");
    free(x), free(y);
    kiln_scope_end();
}

/* kiln_data_ptr hands out the strided bytes. */
static void test_data_ptr(void) {
    kiln_tensor *x = pattern(KILN_SHAPE(1, 16, 2, 3), 13), *xb = blocked_copy(x);
    const float *p = kiln_data_ptr(xb), *q = kiln_data_ptr(x);
    CHECK(p && kiln_layout_of(xb) == KILN_LAYOUT_STRIDED);
    CHECK(p && !memcmp(p, q, sizeof(float) * 96));
    kiln_release(x), kiln_release(xb);
}

/* A convolution chain (oneDNN builds): conv -> relu -> pool -> conv -> loss
 * with blocked activations against the reference kernels, forward and
 * every gradient; with layouts off every result is strided. */
typedef struct chain_out {
    float *loss, *gw1, *gw2, *gb2, *gx;
    kiln_layout conv_layout, pool_layout;
} chain_out;

static void run_chain(chain_out *o) {
    kiln_manual_seed(5);
    kiln_tensor *x = kiln_randn(KILN_SHAPE(3, 5, 11, 9), KILN_F32, KILN_CPU);
    kiln_tensor *w1 = kiln_randn(KILN_SHAPE(32, 5, 3, 3), KILN_F32, KILN_CPU);
    kiln_tensor *w2 = kiln_randn(KILN_SHAPE(16, 32, 3, 3), KILN_F32, KILN_CPU);
    kiln_tensor *b2 = kiln_randn(KILN_SHAPE(16), KILN_F32, KILN_CPU);
    kiln_tensor *ps[] = {x, w1, w2, b2};
    for (int i = 0; i < 4; i++) CHECK_OK(kiln_set_requires_grad(ps[i], true));
    kiln_conv2d_opts co = {.stride = {1, 1}, .padding = {1, 1}, .dilation = {1, 1}, .groups = 1};
    kiln_pool2d_opts po = kiln_pool2d_defaults(2);
    kiln_scope_begin();
    kiln_tensor *h = kiln_conv2d(x, w1, NULL, &co);
    o->conv_layout = kiln_layout_of(h);
    h = kiln_relu(h);
    h = kiln_max_pool2d(h, &po, NULL);
    o->pool_layout = kiln_layout_of(h);
    h = kiln_conv2d(h, w2, b2, &co);
    h = kiln_relu(h);
    kiln_tensor *loss = kiln_mean(kiln_mul(h, h), 0, NULL, false);
    CHECK_OK(kiln_backward(loss, NULL, false));
    o->loss = host_values(loss);
    CHECK_OK(kiln_scope_end());
    o->gw1 = grad_values(w1), o->gw2 = grad_values(w2);
    o->gb2 = grad_values(b2), o->gx = grad_values(x);
    for (int i = 0; i < 4; i++) kiln_release(ps[i]);
}

static void free_chain(chain_out *o) { free(o->loss), free(o->gw1), free(o->gw2), free(o->gb2), free(o->gx); }

static void test_conv_chain(void) {
    chain_out fast, off, ref;
    run_chain(&fast);
    /* nChw16c with AVX-512, nChw8c with AVX2 */
    if (!kiln_layout_block(fast.conv_layout)) {
        printf("conv chain: the convolution gives strided results in this build (no oneDNN, or neither AVX2 nor "
               "AVX-512): blocked conv path not tested here\n");
        free_chain(&fast);
        return;
    }
    CHECK_MSG(fast.pool_layout == fast.conv_layout, "conv chain: the pooling's layout %d, the convolution's %d",
              (int)fast.pool_layout, (int)fast.conv_layout);
    kiln_set_cpu_layouts(false);
    run_chain(&off);
    kiln_set_cpu_layouts(true);
    CHECK(off.conv_layout == KILN_LAYOUT_STRIDED && off.pool_layout == KILN_LAYOUT_STRIDED);
    kiln_ops_clear_fast_kernels(KILN_DEVICE_CPU);
    run_chain(&ref);
    kiln_shutdown();
    CHECK_OK(kiln_init());
    const struct {
        const char *name;
        float *a, *b, *c;
        int64_t n;
    } cmp[] = {{"loss", fast.loss, off.loss, ref.loss, 1},     {"grad w1", fast.gw1, off.gw1, ref.gw1, 32 * 5 * 9},
               {"grad w2", fast.gw2, off.gw2, ref.gw2, 16 * 32 * 9}, {"grad b2", fast.gb2, off.gb2, ref.gb2, 16},
               {"grad x", fast.gx, off.gx, ref.gx, 3 * 5 * 11 * 9}};
    for (size_t i = 0; i < sizeof cmp / sizeof *cmp; i++) {
        double e1 = max_rel_diff(cmp[i].a, cmp[i].c, cmp[i].n), e2 = max_rel_diff(cmp[i].b, cmp[i].c, cmp[i].n);
        CHECK_MSG(e1 <= 1e-4, "%s: blocked layouts vs reference kernels %g", cmp[i].name, e1);
        CHECK_MSG(e2 <= 1e-4, "%s: layouts off vs reference kernels %g", cmp[i].name, e2);
    }
    free_chain(&fast), free_chain(&off), free_chain(&ref);
}

/* Prepared copies (kernels/op_args.h): the oneDNN convolution keeps its
 * weights in its own layout and linear_act keeps the weight permuted to a
 * blocked input's order, both with the weight tensor; a write to the
 * weight (version bump) must refresh them. Checked against the same op
 * on a fresh weight tensor (no copy yet) with the same values. */
static void test_prepared(void) {
    kiln_conv2d_opts co = {.stride = {1, 1}, .padding = {1, 1}, .dilation = {1, 1}, .groups = 1};
    kiln_tensor *x = pattern(KILN_SHAPE(2, 16, 6, 6), 31), *xb = blocked_copy(x);
    kiln_tensor *w = pattern(KILN_SHAPE(32, 16, 3, 3), 32), *w2 = pattern(KILN_SHAPE(32, 16, 3, 3), 33);
    kiln_tensor *y1 = kiln_conv2d(xb, w, NULL, &co);
    CHECK_OK(kiln_copy_(w, w2, 0)); /* new values, version bumped */
    kiln_tensor *y2 = kiln_conv2d(xb, w, NULL, &co), *y3 = kiln_conv2d(xb, w2, NULL, &co);
    int64_t n = kiln_numel(y2);
    float *a = host_values(y1), *b = host_values(y2), *c = host_values(y3);
    CHECK_MSG(!memcmp(b, c, sizeof(float) * (size_t)n), "conv after a weight update: stale prepared weights");
    CHECK(memcmp(a, b, sizeof(float) * (size_t)n) != 0);
    free(a), free(b), free(c);

    /* linear_act on a blocked input: permuted weights (10 outputs: oneDNN's
     * matmul; 24: on AVX2 CPUs Kiln's product on the weight transposed in
     * the input's column order), refreshed after a write to the weight */
    kiln_tensor *p = pattern(KILN_SHAPE(4, 32, 3, 3), 34), *pb = blocked_copy(p);
    for (int64_t O = 10; O <= 24; O += 14) {
        kiln_tensor *lw = pattern(KILN_SHAPE(O, 288), 35), *lw2 = pattern(KILN_SHAPE(O, 288), 36);
        kiln_tensor *lb = pattern(KILN_SHAPE(O), 37);
        for (int round = 0; round < 2; round++) {
            if (round) CHECK_OK(kiln_copy_(lw, lw2, 0));
            kiln_tensor *u = kiln_linear_act(pb, lw, lb, KILN_ACT_RELU), *v = kiln_linear_act(p, lw, lb, KILN_ACT_RELU);
            CHECK(u && v);
            if (u && v) {
                float *uv = host_values(u), *vv = host_values(v);
                double d = max_rel_diff(uv, vv, 4 * O);
                CHECK_MSG(d <= 1e-5, "linear_act (%lld outputs) on a blocked input, round %d: %g", (long long)O,
                          round, d);
                free(uv), free(vv);
            }
            kiln_release(u), kiln_release(v);
        }
        kiln_release(lw), kiln_release(lw2), kiln_release(lb);
    }
    /* 70 rows (from 64 on AVX2 CPUs Kiln's product gathers W^T per call,
     * no copy) against the 4 rows above, called twice so the second call
     * has the (lazy) prepared copy: the same chains, so the first 4 rows
     * have the same bits, blocked and plain */
    kiln_tensor *q = pattern(KILN_SHAPE(70, 32, 3, 3), 34), *qb = blocked_copy(q);
    kiln_tensor *lw = pattern(KILN_SHAPE(24, 288), 35), *lb = pattern(KILN_SHAPE(24), 37);
    kiln_release(kiln_linear_act(pb, lw, lb, KILN_ACT_RELU));
    kiln_release(kiln_linear_act(p, lw, lb, KILN_ACT_RELU));
    kiln_tensor *rows[4] = {kiln_linear_act(pb, lw, lb, KILN_ACT_RELU), kiln_linear_act(p, lw, lb, KILN_ACT_RELU),
                            kiln_linear_act(qb, lw, lb, KILN_ACT_RELU), kiln_linear_act(q, lw, lb, KILN_ACT_RELU)};
    CHECK(rows[0] && rows[1] && rows[2] && rows[3]);
    if (rows[0] && rows[1] && rows[2] && rows[3]) {
        float *r[4];
        for (int i = 0; i < 4; i++) r[i] = host_values(rows[i]);
        CHECK_MSG(!memcmp(r[0], r[2], sizeof(float) * 4 * 24), "linear_act on a blocked input: 70 rows' first 4 differ");
        CHECK_MSG(!memcmp(r[1], r[3], sizeof(float) * 4 * 24), "linear_act on a plain input: 70 rows' first 4 differ");
        double d = max_rel_diff(r[2], r[3], 70 * 24);
        CHECK_MSG(d <= 1e-5, "linear_act (70 rows) on a blocked input: %g", d);
        for (int i = 0; i < 4; i++) free(r[i]);
    }
    for (int i = 0; i < 4; i++) kiln_release(rows[i]);
    kiln_release(q), kiln_release(qb), kiln_release(lw), kiln_release(lb);
    kiln_tensor *ts[] = {x, xb, w, w2, y1, y2, y3, p, pb};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) kiln_release(ts[i]);
}

/* linear_act's copy of W^T on AVX2 CPUs is lazy (kernels/op_args.h): the
 * first call with a weight gathers from it, a second call at the same
 * version makes the copy, a call after a write to the weight gathers again
 * (no refill) and keeps the block, the next one refills it; every call
 * gives the same bits. Seen by the bytes left allocated after each call
 * (its result released) and the count of fills; elsewhere (oneDNN's
 * matmul, whose copy is made at once; no copy at all) the check follows
 * what runs there. */
static void test_prepared_lazy(void) {
    kiln_tensor *x = pattern(KILN_SHAPE(4, 32, 3, 3), 41), *xb = blocked_copy(x);
    kiln_tensor *b = pattern(KILN_SHAPE(24), 44);
    bool lazy = false;
#ifdef KILN_WITH_ONEDNN
    lazy = kiln_cpu_avx2_kernels_default();
#endif
    const int64_t bytes = 24 * 288 * (int64_t)sizeof(float), out_bytes = 4 * 24 * (int64_t)sizeof(float);
    for (int blocked = 0; blocked < 2; blocked++) {
        const char *what = blocked ? "blocked" : "plain";
        kiln_tensor *w = pattern(KILN_SHAPE(24, 288), 42), *w2 = pattern(KILN_SHAPE(24, 288), 43);
        float *v[4] = {NULL};
        int64_t kept[4], fills[4]; /* bytes left allocated by each call (its result released), copies filled */
        for (int call = 0; call < 4; call++) {
            if (call == 2) CHECK_OK(kiln_copy_(w, w2, 0)); /* the optimizer's write: version bumped */
            int64_t before = (int64_t)kiln_memory_allocated(KILN_CPU), f0 = kiln_tensor_prepared_fills();
            kiln_tensor *y = kiln_linear_act(blocked ? xb : x, w, b, KILN_ACT_NONE);
            CHECK(y != NULL);
            if (y) v[call] = host_values(y);
            kiln_release(y);
            kept[call] = (int64_t)kiln_memory_allocated(KILN_CPU) - before;
            fills[call] = kiln_tensor_prepared_fills() - f0;
        }
        if (lazy) {
            CHECK_MSG(kept[0] == 0 && fills[0] == 0,
                      "linear_act (%s x): a new weight's first call kept %lld bytes and filled %lld copies, not lazy",
                      what, (long long)kept[0], (long long)fills[0]);
            CHECK_MSG(kept[1] >= bytes && fills[1] == 1,
                      "linear_act (%s x): the second call at one version kept %lld bytes (the copy: %lld) and "
                      "filled %lld copies", what, (long long)kept[1], (long long)bytes, (long long)fills[1]);
            CHECK_MSG(kept[2] == 0 && fills[2] == 0,
                      "linear_act (%s x): the call after a write to the weight kept %lld bytes and filled %lld "
                      "copies: it should gather and keep the block", what, (long long)kept[2], (long long)fills[2]);
            CHECK_MSG(kept[3] == 0 && fills[3] == 1,
                      "linear_act (%s x): the next call kept %lld bytes and filled %lld copies: it should refill "
                      "the block", what, (long long)kept[3], (long long)fills[3]);
        } else {
            CHECK_MSG(kept[1] == 0 && kept[2] == 0 && kept[3] == 0,
                      "linear_act (%s x): a copy made at once (or none) changed the bytes kept after its first call "
                      "(%lld, %lld, %lld)", what, (long long)kept[1], (long long)kept[2], (long long)kept[3]);
        }
        if (v[0] && v[1] && v[2] && v[3]) {
            CHECK_MSG(!memcmp(v[0], v[1], (size_t)out_bytes), "linear_act (%s x): gathered and copied W^T differ",
                      what);
            CHECK_MSG(!memcmp(v[2], v[3], (size_t)out_bytes),
                      "linear_act (%s x) after the write: gathered and copied W^T differ", what);
            CHECK_MSG(memcmp(v[1], v[2], (size_t)out_bytes) != 0, "linear_act (%s x): the write changed nothing",
                      what);
        }
        for (int i = 0; i < 4; i++) free(v[i]);
        kiln_release(w), kiln_release(w2);
    }
    kiln_release(x), kiln_release(xb), kiln_release(b);
}

/* Meta gives results the layouts the CPU would (so plans match). */
static void test_meta(void) {
    kiln_tensor *x = kiln_empty(KILN_SHAPE(2, 3, 8, 8), KILN_F32, KILN_META);
    kiln_tensor *w = kiln_empty(KILN_SHAPE(32, 3, 3, 3), KILN_F32, KILN_META);
    kiln_tensor *xc = kiln_zeros(KILN_SHAPE(2, 3, 8, 8), KILN_F32, KILN_CPU);
    kiln_tensor *wc = kiln_zeros(KILN_SHAPE(32, 3, 3, 3), KILN_F32, KILN_CPU);
    kiln_conv2d_opts co = {.stride = {1, 1}, .padding = {1, 1}, .dilation = {1, 1}, .groups = 1};
    kiln_tensor *y = kiln_conv2d(x, w, NULL, &co), *yc = kiln_conv2d(xc, wc, NULL, &co);
    CHECK(y && yc && kiln_layout_of(y) == kiln_layout_of(yc));
    kiln_tensor *v = y ? kiln_flatten(y, 1, -1) : NULL; /* converts on meta without touching memory */
    CHECK(v && kiln_layout_of(y) == KILN_LAYOUT_STRIDED);
    kiln_tensor *ts[] = {x, w, xc, wc, y, yc, v};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) kiln_release(ts[i]);
}

int main(void) {
    if (kiln_init()) return 1;
    kiln_set_cpu_layouts(true);
    test_reorder_roundtrip();
    test_pool_relu();
    test_sum();
    test_add();
    test_batch_norm();
    test_views_and_writes();
    test_data_ptr();
    test_conv_chain();
    test_prepared();
    test_prepared_lazy();
    test_meta();
    kiln_shutdown();
    return kt_finish();
}

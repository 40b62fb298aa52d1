/* Elementwise semantics the harness's random cases do not reach: type
 * promotion, the public dropout (its draw, mask statistics and a backward
 * that reuses the mask), gradients at kinks and boundaries (abs, relu,
 * clamp, pow at 0), exact i64 arithmetic, extreme activations, the meta
 * device, the views' inference functions and kiln_sum_to_shape. */
#include "autograd/backward_util.h"
#include "ops/op_infer.h"
#include "tensor/scope.h"
#include "test_util.h"

static const kiln_device cpu = {KILN_DEVICE_CPU, 0};

static kiln_tensor *vec(int n, const double *v, kiln_dtype dt) {
    kiln_tensor *d = kiln_from_data(KILN_SHAPE(n), KILN_F64, cpu, v);
    kiln_tensor *t = kiln_to(d, cpu, dt, 0);
    kiln_release(d);
    return t;
}

static void host(kiln_tensor *t, double *out) {
    kiln_tensor *d = kiln_to(t, cpu, KILN_F64, 0);
    CHECK_OK(kiln_to_host(d, out, sizeof(double) * (size_t)kiln_numel(d)));
    kiln_release(d);
}

static void test_promotion(void) {
    CHECK(kiln_promote_types(KILN_F16, KILN_BF16) == KILN_F32);
    CHECK(kiln_promote_types(KILN_BOOL, KILN_U8) == KILN_U8);
    CHECK(kiln_promote_types(KILN_U8, KILN_I32) == KILN_I32);
    CHECK(kiln_promote_types(KILN_I64, KILN_F16) == KILN_F16);
    CHECK(kiln_promote_types(KILN_F32, KILN_F64) == KILN_F64);
    CHECK(kiln_promote_types(KILN_BF16, KILN_F32) == KILN_F32);
    /* a 0-dim operand of the same category does not widen (torch.result_type) */
    kiln_tensor *a = kiln_ones(KILN_SHAPE(3), KILN_I32, cpu), *s = kiln_full(KILN_SHAPE(), 2, KILN_I64, cpu);
    kiln_tensor *r = kiln_add(a, s);
    CHECK(r && kiln_dtype_of(r) == KILN_I32);
    kiln_tensor *q = kiln_div(a, a); /* true division */
    CHECK(q && kiln_dtype_of(q) == KILN_F32);
    kiln_tensor *b = kiln_ones(KILN_SHAPE(3), KILN_BOOL, cpu), *bs = kiln_add_scalar(b, 2);
    CHECK(bs && kiln_dtype_of(bs) == KILN_I64);
    kiln_release(a), kiln_release(s), kiln_release(r), kiln_release(q), kiln_release(b), kiln_release(bs);
}

static void test_dropout(void) {
    enum { N = 4000 };
    kiln_manual_seed(7);
    kiln_tensor *x = kiln_ones(KILN_SHAPE(N), KILN_F32, cpu);
    CHECK_OK(kiln_set_requires_grad(x, true));
    kiln_tensor *y = kiln_dropout(x, 0.25, true);
    kiln_tensor *y2 = kiln_dropout(x, 0.25, true);
    static double v[N], v2[N], g[N];
    host(y, v);
    host(y2, v2);
    int zeros = 0, bad = 0, same = 0;
    for (int i = 0; i < N; i++) {
        zeros += v[i] == 0;
        bad += v[i] != 0 && fabs(v[i] - 1 / 0.75) > 1e-6;
        same += (v[i] == 0) == (v2[i] == 0);
    }
    CHECK_MSG(zeros > 850 && zeros < 1150, "%d of %d dropped at p = 0.25", zeros, N);
    CHECK_EQ_I(bad, 0);
    CHECK_MSG(same < N - 100, "two draws gave nearly the same mask (%d equal)", same);
    kiln_tensor *ones = kiln_ones(KILN_SHAPE(N), KILN_F32, cpu);
    CHECK_OK(kiln_backward(y, ones, false));
    kiln_tensor *gx = kiln_grad(x);
    CHECK(gx != NULL);
    if (gx) {
        host(gx, g);
        int diff = 0;
        for (int i = 0; i < N; i++) diff += fabs(g[i] - v[i]) > 1e-6;
        CHECK_EQ_I(diff, 0); /* the backward applies the same mask and scale */
    }
    kiln_tensor *id = kiln_dropout(x, 0.5, false);
    CHECK(id && kiln_shares_storage(id, x));
    kiln_tensor *all = kiln_dropout(x, 1.0, true);
    host(all, v);
    int nz = 0;
    for (int i = 0; i < N; i++) nz += v[i] != 0;
    CHECK_EQ_I(nz, 0);
    CHECK_NULL_ERR(kiln_dropout(x, 1.5, true), "not a probability");
    kiln_release(x), kiln_release(y), kiln_release(y2), kiln_release(ones), kiln_release(gx);
    kiln_release(id), kiln_release(all);
}

/* The gradient of sum(f(x)) w.r.t. x, into g. */
static void grad_of(kiln_tensor *(*f)(kiln_tensor *), int n, const double *xv, double *g) {
    kiln_scope_begin();
    kiln_tensor *x = vec(n, xv, KILN_F64);
    kiln_set_requires_grad(x, true);
    kiln_tensor *y = f(x);
    kiln_tensor *ones = kiln_ones(kiln_shape_of(y), KILN_F64, cpu);
    CHECK_OK(kiln_backward(y, ones, false));
    kiln_tensor *gx = kiln_grad(x);
    CHECK(gx != NULL);
    if (gx) host(gx, g);
    kiln_scope_end();
}

static kiln_tensor *f_abs(kiln_tensor *x) { return kiln_abs(x); }
static kiln_tensor *f_relu(kiln_tensor *x) { return kiln_relu(x); }
static kiln_tensor *f_clamp(kiln_tensor *x) { return kiln_clamp(x, -1, 1); }
static kiln_tensor *f_pow2(kiln_tensor *x) {
    kiln_tensor *e = kiln_full(KILN_SHAPE(3), 2, KILN_F64, cpu);
    kiln_tensor *r = kiln_pow(x, e);
    kiln_release(e);
    return r;
}

static void test_kinks(void) {
    double x[3] = {-1, 0, 1}, g[3];
    grad_of(f_abs, 3, x, g);
    CHECK(g[0] == -1 && g[1] == 0 && g[2] == 1);
    grad_of(f_relu, 3, x, g);
    CHECK(g[0] == 0 && g[1] == 0 && g[2] == 1);
    double xc[3] = {-1, 0.5, 1.5};
    grad_of(f_clamp, 3, xc, g); /* bounds inclusive */
    CHECK(g[0] == 1 && g[1] == 1 && g[2] == 0);
    double xp[3] = {0, 2, -3};
    grad_of(f_pow2, 3, xp, g);
    CHECK(g[0] == 0 && g[1] == 4 && g[2] == -6);
    /* pow's exponent gradient at a base of 0 with b >= 0 is 0, not NaN */
    kiln_scope_begin();
    kiln_tensor *a = kiln_zeros(KILN_SHAPE(2), KILN_F64, cpu);
    double bv[2] = {0, 2};
    kiln_tensor *b = vec(2, bv, KILN_F64);
    kiln_set_requires_grad(a, true), kiln_set_requires_grad(b, true);
    kiln_tensor *y = kiln_pow(a, b);
    CHECK_OK(kiln_backward(y, kiln_ones(KILN_SHAPE(2), KILN_F64, cpu), false));
    double ga[2], gb[2];
    host(kiln_grad(a), ga);
    host(kiln_grad(b), gb);
    CHECK(ga[0] == 0 && ga[1] == 0 && gb[0] == 0 && gb[1] == 0);
    kiln_scope_end();
}

static void test_exact_and_extreme(void) {
    kiln_scope_begin();
    int64_t big[2] = {(int64_t)1 << 60, -((int64_t)1 << 61)};
    kiln_tensor *a = kiln_from_data(KILN_SHAPE(2), KILN_I64, cpu, big);
    kiln_tensor *s = kiln_add_scalar(a, 1);
    int64_t got[2];
    CHECK_OK(kiln_to_host(s, got, sizeof got));
    CHECK(got[0] == ((int64_t)1 << 60) + 1 && got[1] == -((int64_t)1 << 61) + 1);
    double xv[4] = {-1000, 1000, -50, 50}, v[4];
    kiln_tensor *x = vec(4, xv, KILN_F32);
    host(kiln_sigmoid(x), v);
    CHECK(v[0] == 0 && v[1] == 1 && isfinite(v[2]) && isfinite(v[3]));
    host(kiln_silu(x), v);
    CHECK(v[0] == 0 && v[1] == 1000);
    host(kiln_gelu(x, false), v);
    CHECK(v[0] == 0 && v[1] == 1000);
    host(kiln_gelu(x, true), v);
    CHECK(v[0] == 0 && v[1] == 1000);
    kiln_scope_end();
}

static void test_meta_and_infer(void) {
    kiln_scope_begin();
    kiln_device meta = {KILN_DEVICE_META, 0};
    kiln_tensor *a = kiln_empty(KILN_SHAPE(3, 1), KILN_F16, meta),
                *b = kiln_empty(KILN_SHAPE(4), KILN_F32, meta);
    kiln_tensor *c = kiln_mul(a, b);
    CHECK(c && kiln_ndim(c) == 2 && kiln_size(c, 0) == 3 && kiln_size(c, 1) == 4 &&
          kiln_dtype_of(c) == KILN_F32);
    kiln_tensor *d = kiln_dropout(c, 0.5, true);
    CHECK(d && kiln_numel(d) == 12);
    kiln_tensor *t = kiln_empty(KILN_SHAPE(3, 4), KILN_F32, meta);
    kiln_meta m;
    kiln_dtype idt[1] = {KILN_F32};
    kiln_op_attrs at = {.n_ints = 2, .ints = {-1, 6}};
    CHECK_OK(kiln_infer_view("view", &at, 1, &t, &m, idt));
    CHECK(m.ndim == 2 && m.shape[0] == 2 && m.shape[1] == 6);
    kiln_op_attrs pa = {.n_dims = 2, .dims = {-1, 0}};
    CHECK_OK(kiln_infer_permute("permute", &pa, 1, &t, &m, idt));
    CHECK(m.shape[0] == 4 && m.shape[1] == 3);
    kiln_op_attrs na = {.n_dims = 1, .dims = {1}, .n_ints = 2, .ints = {1, 2}};
    CHECK_OK(kiln_infer_narrow("narrow", &na, 1, &t, &m, idt));
    CHECK(m.shape[0] == 3 && m.shape[1] == 2);
    kiln_tensor *col = kiln_empty(KILN_SHAPE(3, 1), KILN_F32, meta);
    kiln_op_attrs ea = {.n_ints = 3, .ints = {2, -1, 5}};
    CHECK_OK(kiln_infer_expand("expand", &ea, 1, &col, &m, idt));
    CHECK(m.ndim == 3 && m.shape[0] == 2 && m.shape[1] == 3 && m.shape[2] == 5);
    kiln_op_attrs bad = {.n_ints = 2, .ints = {5, 5}};
    CHECK_FAILS(kiln_infer_view("view", &bad, 1, &t, &m, idt), KILN_ERR_INVALID_ARGUMENT, "elements");
    kiln_scope_end();
}

static void test_sum_to_shape(void) {
    kiln_scope_begin();
    kiln_tensor *g = kiln_arange(0, 24, 1, KILN_F64, cpu);
    kiln_tensor *g3 = kiln_reshape(g, KILN_SHAPE(2, 3, 4));
    kiln_meta target = {.dtype = KILN_F32, .ndim = 2, .shape = {3, 1}};
    kiln_api_enter(); /* library helpers: keep their results out of the scope */
    kiln_tensor *s = kiln_sum_to_shape(g3, &target);
    kiln_api_leave();
    CHECK(s && kiln_ndim(s) == 2 && kiln_size(s, 0) == 3 && kiln_size(s, 1) == 1 &&
          kiln_dtype_of(s) == KILN_F32);
    double v[3];
    if (s) host(s, v);
    /* row r of the 3 sums over batch b and column c of 12b + 4r + c */
    CHECK(s && v[0] == 60 && v[1] == 92 && v[2] == 124);
    kiln_release(s);
    kiln_scope_end();
}

int main(void) {
    CHECK_OK(kiln_init());
    test_promotion();
    test_dropout();
    test_kinks();
    test_exact_and_extreme();
    test_meta_and_infer();
    test_sum_to_shape();
    kiln_shutdown();
    return kt_finish();
}

/* The op harness tested on itself: a correct case passes; a forward result
 * with one element off by 1e-3 relative fails, and so does a gradient off
 * the same way, an integer result off by one, a NaN, a kernel that writes
 * past (or before) its output or into its input, a kernel that leaves an
 * output element unwritten, and an expected error that does not come.
 * The cases copy their input (kiln_contiguous of a transposed view: a real
 * copy, differentiable through the COPY op) so that they depend on no op
 * group. FAIL lines printed while this runs are the expected failures. */
#include "ops/harness.c"
#include "test_util.h"

/* ---- runs ------------------------------------------------------------------------ */

static kiln_tensor *st_run_copy(kh_run *r) { return kiln_contiguous(r->in[0]); }

static void st_ref_copy(kh_ref *r) {
    double *y = kh_out(r, 0, r->shape[0], 0);
    for (int64_t i = 0; i < kh_numel(r->shape[0]); i++) y[i] = r->in[0][i];
}

/* A fresh copy with the element of largest magnitude scaled by (1 + 1e-3)
 * (i32: plus one). CPU only. */
static kiln_tensor *st_run_perturbed(kh_run *r) {
    kiln_tensor *y = kiln_to(r->in[0], r->device, kiln_dtype_of(r->in[0]), KILN_COPY);
    if (!y) return NULL;
    int64_t n = kiln_numel(y), w = 0;
    void *p = kiln_data_ptr(y);
    kiln_dtype dt = kiln_dtype_of(y);
    for (int64_t i = 1; i < n; i++)
        if (fabs(kh_load(p, dt, i)) > fabs(kh_load(p, dt, w))) w = i;
    double v = kh_load(p, dt, w);
    kh_store(p, dt, w, dt == KILN_I32 ? v + 1 : v * (1 + 1e-3));
    return y;
}

static kiln_tensor *st_run_nan(kh_run *r) {
    kiln_tensor *y = kiln_to(r->in[0], r->device, kiln_dtype_of(r->in[0]), KILN_COPY);
    if (y) kh_store(kiln_data_ptr(y), kiln_dtype_of(y), 1, NAN);
    return y;
}

static void st_ref_nan(kh_ref *r) {
    st_ref_copy(r);
    r->out[0][1] = NAN; /* NaN never passes, even where the reference has one */
}

/* The gradient flowing into the input, with its largest element scaled by
 * (1 + 1e-3). */
static kiln_tensor *st_bad_grad_hook(kiln_tensor *grad, void *user) {
    (void)user;
    kiln_tensor *g = kiln_to(grad, KILN_CPU, kiln_dtype_of(grad), KILN_COPY);
    if (!g) return NULL;
    double *p = kiln_data_ptr(g);
    int64_t n = kiln_numel(g), w = 0;
    for (int64_t i = 1; i < n; i++)
        if (fabs(p[i]) > fabs(p[w])) w = i;
    p[w] *= 1 + 1e-3;
    return g;
}

static kiln_tensor *st_run_bad_grad(kh_run *r) {
    if (kiln_requires_grad(r->in[0])) kiln_register_hook(r->in[0], st_bad_grad_hook, NULL);
    return kiln_contiguous(r->in[0]);
}

static kiln_tensor *st_run_bad_view(kh_run *r) { return kiln_view(r->in[0], KILN_SHAPE(7, 7)); }

/* ---- kernels for the COPY op --------------------------------------------------- */

static kiln_status st_kernel_copy(const kiln_op_args *a) {
    size_t es = kiln_dtype_size(a->out[0].dtype);
    int64_t n = 1;
    for (int i = 0; i < a->out[0].ndim; i++) n *= a->out[0].shape[i];
    memcpy(a->out[0].data, a->in[0].data, es * (size_t)n); /* inputs arrive contiguous */
    return KILN_OK;
}

static kiln_status st_kernel_past_end(const kiln_op_args *a) {
    st_kernel_copy(a);
    size_t es = kiln_dtype_size(a->out[0].dtype);
    int64_t n = 1;
    for (int i = 0; i < a->out[0].ndim; i++) n *= a->out[0].shape[i];
    memset((char *)a->out[0].data + es * (size_t)n, 0, 1); /* one byte too far */
    return KILN_OK;
}

static kiln_status st_kernel_before(const kiln_op_args *a) {
    st_kernel_copy(a);
    ((char *)a->out[0].data)[-1] = 0;
    return KILN_OK;
}

static kiln_status st_kernel_writes_input(const kiln_op_args *a) {
    st_kernel_copy(a);
    memset(a->in[0].data, 0, 1);
    return KILN_OK;
}

static kiln_status st_kernel_skips_one(const kiln_op_args *a) {
    size_t es = kiln_dtype_size(a->out[0].dtype);
    int64_t n = 1;
    for (int i = 0; i < a->out[0].ndim; i++) n *= a->out[0].shape[i];
    memcpy(a->out[0].data, a->in[0].data, es * (size_t)(n - 1)); /* the last element stays 0xFF.. */
    return KILN_OK;
}

static const kiln_op_kernel st_k_copy = {st_kernel_copy, NULL, KILN_DT_ALL};
static const kiln_op_kernel st_k_past_end = {st_kernel_past_end, NULL, KILN_DT_ALL};
static const kiln_op_kernel st_k_before = {st_kernel_before, NULL, KILN_DT_ALL};
static const kiln_op_kernel st_k_writes_input = {st_kernel_writes_input, NULL, KILN_DT_ALL};
static const kiln_op_kernel st_k_skips_one = {st_kernel_skips_one, NULL, KILN_DT_ALL};

/* ---- cases ------------------------------------------------------------------- */

#define ST_IN_T                                                                                              \
    { .shape = KILN_SHAPE(4, 5), .fill = KH_NORMAL, .layout = KH_TRANSPOSED, .grad = true }
#define ST_F (KILN_DT(KILN_F32) | KILN_DT(KILN_F64))

static const kh_case st_good[] = {
    {.name = "selftest_copy",
     .params = "4x5 T",
     .dtypes = KH_FLOAT,
     .n_in = 1,
     .in = {ST_IN_T},
     .op = KH_OP(KILN_OP_COPY),
     .kernel = &st_k_copy,
     .run = st_run_copy,
     .reference = st_ref_copy},
    {.name = "selftest_copy",
     .params = "3x7 strided",
     .dtypes = KH_FLOAT,
     .n_in = 1,
     .in = {{.shape = KILN_SHAPE(3, 7), .fill = KH_AWAY, .layout = KH_STRIDED, .grad = true}},
     .run = st_run_copy,
     .reference = st_ref_copy},
    {.name = "selftest_copy",
     .params = "i32 index",
     .dtypes = KILN_DT(KILN_I32) | KILN_DT(KILN_I64),
     .n_in = 1,
     .in = {{.shape = KILN_SHAPE(2, 9), .fill = KH_INDEX, .lo = -5, .hi = 5, .layout = KH_TRANSPOSED}},
     .run = st_run_copy,
     .reference = st_ref_copy},
    {.name = "selftest_view",
     .params = "bad shape",
     .dtypes = KILN_DT(KILN_F32),
     .n_in = 1,
     .in = {ST_IN_T},
     .run = st_run_bad_view,
     .expect_error = "kiln_view"},
};

static const kh_case st_bad[] = {
    {.name = "selftest_perturbed",
     .params = "forward f64/f32",
     .dtypes = ST_F,
     .n_in = 1,
     .in = {{.shape = KILN_SHAPE(4, 5), .fill = KH_NORMAL}},
     .run = st_run_perturbed,
     .reference = st_ref_copy},
    {.name = "selftest_perturbed",
     .params = "forward i32",
     .dtypes = KILN_DT(KILN_I32),
     .n_in = 1,
     .in = {{.shape = KILN_SHAPE(4, 5), .fill = KH_INDEX, .lo = -9, .hi = 9}},
     .run = st_run_perturbed,
     .reference = st_ref_copy},
    {.name = "selftest_perturbed",
     .params = "gradient",
     .dtypes = KILN_DT(KILN_F64),
     .n_in = 1,
     .in = {ST_IN_T},
     .run = st_run_bad_grad,
     .reference = st_ref_copy},
    {.name = "selftest_nan",
     .params = "nan",
     .dtypes = ST_F,
     .n_in = 1,
     .in = {{.shape = KILN_SHAPE(4, 5)}},
     .run = st_run_nan,
     .reference = st_ref_nan},
    {.name = "selftest_guard",
     .params = "past end",
     .dtypes = ST_F,
     .n_in = 1,
     .in = {ST_IN_T},
     .op = KH_OP(KILN_OP_COPY),
     .kernel = &st_k_past_end,
     .run = st_run_copy,
     .reference = st_ref_copy},
    {.name = "selftest_guard",
     .params = "before",
     .dtypes = ST_F,
     .n_in = 1,
     .in = {ST_IN_T},
     .op = KH_OP(KILN_OP_COPY),
     .kernel = &st_k_before,
     .run = st_run_copy,
     .reference = st_ref_copy},
    {.name = "selftest_guard",
     .params = "writes input",
     .dtypes = ST_F,
     .n_in = 1,
     .in = {ST_IN_T},
     .op = KH_OP(KILN_OP_COPY),
     .kernel = &st_k_writes_input,
     .run = st_run_copy,
     .reference = st_ref_copy},
    {.name = "selftest_guard",
     .params = "skips one",
     .dtypes = ST_F,
     .n_in = 1,
     .in = {ST_IN_T},
     .op = KH_OP(KILN_OP_COPY),
     .kernel = &st_k_skips_one,
     .run = st_run_copy,
     .reference = st_ref_copy},
    {.name = "selftest_view",
     .params = "error expected",
     .dtypes = KILN_DT(KILN_F32),
     .n_in = 1,
     .in = {ST_IN_T},
     .run = st_run_copy,
     .expect_error = "kiln_view"},
};

/* The helpers the cases' references rely on. */
static void test_helpers(void) {
    kiln_shape s;
    CHECK(kh_broadcast(KILN_SHAPE(3, 1, 5), KILN_SHAPE(4, 1), &s));
    CHECK(s.ndim == 3 && s.d[0] == 3 && s.d[1] == 4 && s.d[2] == 5);
    CHECK(!kh_broadcast(KILN_SHAPE(3), KILN_SHAPE(4), &s));
    /* element (2, 3, 4) of [3, 4, 5] reads (3, 0) of [4, 1] */
    CHECK_EQ_I(kh_bcast_index(KILN_SHAPE(3, 4, 5), 2 * 20 + 3 * 5 + 4, KILN_SHAPE(4, 1)), 3);
    int64_t idx[3];
    kh_unravel(KILN_SHAPE(3, 4, 5), 59, idx);
    CHECK(idx[0] == 2 && idx[1] == 3 && idx[2] == 4);
    CHECK_EQ_I(kh_ravel(KILN_SHAPE(3, 4, 5), idx), 59);
    double a[2] = {1, 0}, b[2] = {1, 0}, c[2] = {NAN, 0};
    CHECK(kh_rel_err(a, b, 2) == 0);
    CHECK(isinf(kh_rel_err(c, c, 2)));
    /* Inputs are deterministic and rounded to the dtype. */
    double *u = kh_gen_input(&st_good[0], 0, KILN_BF16), *v = kh_gen_input(&st_good[0], 0, KILN_BF16);
    CHECK(memcmp(u, v, 20 * sizeof(double)) == 0);
    for (int i = 0; i < 20; i++) CHECK(u[i] == kh_round_to(KILN_BF16, u[i]));
    free(u);
    free(v);
    CHECK(kh_tol_forward(KILN_F64) < kh_tol_forward(KILN_F32) && kh_tol_forward(KILN_I64) == 0);
}

int main(void) {
    CHECK_OK(kiln_init());
    test_helpers();
    for (int i = 0; i < KH_COUNT(st_good); i++) {
        char id[256];
        CHECK_MSG(kh_run_case(&st_good[i], KILN_CPU) == 0, "a correct case failed: %s",
                  kh_case_id(&st_good[i], id, sizeof id));
    }
    fprintf(stderr, "---- the FAIL lines below are expected ----\n");
    for (int i = 0; i < KH_COUNT(st_bad); i++) {
        char id[256];
        CHECK_MSG(kh_run_case(&st_bad[i], KILN_CPU) != 0, "the harness passed a broken case: %s",
                  kh_case_id(&st_bad[i], id, sizeof id));
    }
    fprintf(stderr, "---- end of expected FAIL lines ----\n");
    kiln_shutdown();
    return kt_finish();
}

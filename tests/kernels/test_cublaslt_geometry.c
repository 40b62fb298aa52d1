/* The cuBLASLt GEMM path's mapping of mm, bmm, linear and linear_act onto
 * one cublasLtMatmul (kiln_cublaslt_geometry_of, gemm_cublaslt_cublas.c),
 * checked on the CPU: for each case, strided f32 host views are built, the
 * column-major product cuBLASLt is documented to compute is evaluated from
 * the mapped geometry (D[i + j*ldd + b*stride_d] = sum_k op(A)(i,k) *
 * op(B)(k,j) + bias[i], relu), and compared with the row-major result the
 * op defines, read through the output view. Covers plain and transposed
 * operands, batch strides, linear's leading dims, linear_act's flattened
 * dims, bias and relu; and the views the entry must decline. No GPU and no
 * cuBLASLt call: this runs wherever the real CUDA build does (skipped in
 * other builds). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ops/op_registry.h"
#include "test_util.h"

#if defined(KILN_WITH_CUDA) && !defined(KILN_CUDA_EMULATION)
#include "kernels/cuda/cuda_fast.h"

/* A strided f32 view over its own buffer of `span` floats. */
static kiln_strided view(float *buf, int ndim, const int64_t *shape, const int64_t *strides) {
    kiln_strided v;
    memset(&v, 0, sizeof v);
    v.data = buf, v.dtype = KILN_F32, v.ndim = ndim;
    for (int i = 0; i < ndim; i++) v.shape[i] = shape[i], v.strides[i] = strides[i];
    return v;
}

static float *filled(int64_t n, int seed) {
    float *b = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) b[i] = (float)((i * 7 + seed * 13) % 11) - 5.0f;
    return b;
}

static float at(const kiln_strided *v, const int64_t *idx) {
    int64_t off = 0;
    for (int i = 0; i < v->ndim; i++) off += idx[i] * v->strides[i];
    return ((const float *)v->data)[off];
}

/* cuBLASLt's product from the geometry, into the output buffer. */
static void lt_product(const kiln_cublaslt_geometry *g) {
    const float *A = g->a, *B = g->b, *bias = g->bias;
    float *D = g->d;
    for (int64_t b = 0; b < g->batch; b++)
        for (int64_t j = 0; j < g->n; j++)
            for (int64_t i = 0; i < g->m; i++) {
                double s = 0;
                for (int64_t k = 0; k < g->k; k++) {
                    double av = g->trans_a ? A[b * g->stride_a + k + i * g->lda]
                                           : A[b * g->stride_a + i + k * g->lda];
                    double bv = g->trans_b ? B[b * g->stride_b + j + k * g->ldb]
                                           : B[b * g->stride_b + k + j * g->ldb];
                    s += av * bv;
                }
                if (bias) s += bias[i];
                if (g->relu && s < 0) s = 0;
                D[b * g->stride_d + i + j * g->ldd] = (float)s;
            }
}

static kiln_op_args args_of(int n_in, const kiln_strided *in, const kiln_strided *out,
                            const kiln_op_attrs *attrs) {
    kiln_op_args a;
    memset(&a, 0, sizeof a);
    a.n_in = n_in, a.n_out = 1, a.attrs = attrs;
    for (int i = 0; i < n_in; i++) a.in[i] = in[i];
    a.out[0] = *out;
    return a;
}

/* Row-major expectation: out[b, r, c] = sum_k X[b, r, k] W[b, k, c] (+ bias[c]) (relu). */
typedef float (*x_at_fn)(const kiln_op_args *a, int64_t b, int64_t r, int64_t k);
typedef float (*w_at_fn)(const kiln_op_args *a, int64_t b, int64_t k, int64_t c);
typedef float *(*y_ptr_fn)(const kiln_op_args *a, int64_t b, int64_t r, int64_t c);

static float mm_x(const kiln_op_args *a, int64_t b, int64_t r, int64_t k) {
    (void)b;
    int64_t i[2] = {r, k};
    return at(&a->in[0], i);
}
static float mm_w(const kiln_op_args *a, int64_t b, int64_t k, int64_t c) {
    (void)b;
    int64_t i[2] = {k, c};
    return at(&a->in[1], i);
}
static float *mm_y(const kiln_op_args *a, int64_t b, int64_t r, int64_t c) {
    (void)b;
    return (float *)a->out[0].data + r * a->out[0].strides[0] + c * a->out[0].strides[1];
}
static float bmm_x(const kiln_op_args *a, int64_t b, int64_t r, int64_t k) {
    int64_t i[3] = {b, r, k};
    return at(&a->in[0], i);
}
static float bmm_w(const kiln_op_args *a, int64_t b, int64_t k, int64_t c) {
    int64_t i[3] = {b, k, c};
    return at(&a->in[1], i);
}
static float *bmm_y(const kiln_op_args *a, int64_t b, int64_t r, int64_t c) {
    const kiln_strided *y = &a->out[0];
    return (float *)y->data + b * y->strides[0] + r * y->strides[1] + c * y->strides[2];
}
/* linear: x (d0, d1, K) rows r = d0 * D1 + d1; W (N, K). */
static float lin_x(const kiln_op_args *a, int64_t b, int64_t r, int64_t k) {
    (void)b;
    const kiln_strided *x = &a->in[0];
    int64_t d1 = x->shape[1];
    int64_t i[3] = {r / d1, r % d1, k};
    return at(x, i);
}
static float lin_w(const kiln_op_args *a, int64_t b, int64_t k, int64_t c) {
    (void)b;
    int64_t i[2] = {c, k};
    return at(&a->in[1], i);
}
static float *lin_y(const kiln_op_args *a, int64_t b, int64_t r, int64_t c) {
    (void)b;
    const kiln_strided *y = &a->out[0];
    int64_t d1 = y->shape[1];
    return (float *)y->data + (r / d1) * y->strides[0] + (r % d1) * y->strides[1] + c * y->strides[2];
}
/* linear_act: x (N, c, h, w) flattened from dim 1. */
static float act_x(const kiln_op_args *a, int64_t b, int64_t r, int64_t k) {
    (void)b;
    const kiln_strided *x = &a->in[0];
    int64_t h = x->shape[2], w = x->shape[3];
    int64_t i[4] = {r, k / (h * w), (k / w) % h, k % w};
    return at(x, i);
}

static void check(const char *name, kiln_cublaslt_gemm op, kiln_op_args *a, int64_t batch, int64_t rows,
                  int64_t cols, int64_t K, x_at_fn xf, w_at_fn wf, y_ptr_fn yf, const float *bias,
                  bool relu) {
    kiln_cublaslt_geometry g;
    bool ok = kiln_cublaslt_geometry_of(op, a, &g);
    CHECK_MSG(ok, "%s: the cuBLASLt entry declined it", name);
    if (!ok) return;
    lt_product(&g);
    double worst = 0;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++) s += (double)xf(a, b, r, k) * (double)wf(a, b, k, c);
                if (bias) s += bias[c];
                if (relu && s < 0) s = 0;
                double d = fabs(s - *yf(a, b, r, c));
                if (d > worst) worst = d;
            }
    CHECK_MSG(worst == 0, "%s: the mapped product differs from the op's by %g", name, worst);
}

static void test_mm(void) {
    kiln_op_attrs attrs;
    memset(&attrs, 0, sizeof attrs);
    const int64_t M = 5, K = 7, N = 3;
    float *x = filled(M * K, 1), *w = filled(K * N, 2), *y = calloc((size_t)(M * N * 2), sizeof(float));
    /* plain */
    kiln_strided in[2] = {view(x, 2, (int64_t[]){M, K}, (int64_t[]){K, 1}),
                          view(w, 2, (int64_t[]){K, N}, (int64_t[]){N, 1})};
    kiln_strided out = view(y, 2, (int64_t[]){M, N}, (int64_t[]){N, 1});
    kiln_op_args a = args_of(2, in, &out, &attrs);
    check("mm plain", KILN_CUBLASLT_MM, &a, 1, M, N, K, mm_x, mm_w, mm_y, NULL, false);
    /* both operands transposed views (x^T of a (K, M) buffer, w^T of (N, K)) */
    in[0] = view(x, 2, (int64_t[]){M, K}, (int64_t[]){1, M});
    in[1] = view(w, 2, (int64_t[]){K, N}, (int64_t[]){1, K});
    a = args_of(2, in, &out, &attrs);
    check("mm transposed operands", KILN_CUBLASLT_MM, &a, 1, M, N, K, mm_x, mm_w, mm_y, NULL, false);
    /* padded leading dims: rows of x 9 apart, of y 4 apart */
    float *xp = filled(M * 9, 3), *yp = calloc((size_t)(M * 4), sizeof(float));
    in[0] = view(xp, 2, (int64_t[]){M, K}, (int64_t[]){9, 1});
    in[1] = view(w, 2, (int64_t[]){K, N}, (int64_t[]){N, 1});
    kiln_strided outp = view(yp, 2, (int64_t[]){M, N}, (int64_t[]){4, 1});
    a = args_of(2, in, &outp, &attrs);
    check("mm padded rows", KILN_CUBLASLT_MM, &a, 1, M, N, K, mm_x, mm_w, mm_y, NULL, false);
    /* declined: an operand with no unit stride; an output transposed */
    kiln_cublaslt_geometry g;
    in[0] = view(xp, 2, (int64_t[]){M, 3}, (int64_t[]){9, 2});
    in[1] = view(w, 2, (int64_t[]){3, N}, (int64_t[]){N, 1});
    a = args_of(2, in, &out, &attrs);
    CHECK_MSG(!kiln_cublaslt_geometry_of(KILN_CUBLASLT_MM, &a, &g),
              "mm with a stride-2 operand must be declined");
    in[0] = view(x, 2, (int64_t[]){M, K}, (int64_t[]){K, 1});
    in[1] = view(w, 2, (int64_t[]){K, N}, (int64_t[]){N, 1});
    kiln_strided outt = view(y, 2, (int64_t[]){M, N}, (int64_t[]){1, M});
    a = args_of(2, in, &outt, &attrs);
    CHECK_MSG(!kiln_cublaslt_geometry_of(KILN_CUBLASLT_MM, &a, &g),
              "mm into a transposed output must be declined");
    kiln_strided zero = view(y, 2, (int64_t[]){M, 0}, (int64_t[]){0, 1});
    in[1] = view(w, 2, (int64_t[]){K, 0}, (int64_t[]){0, 1});
    a = args_of(2, in, &zero, &attrs);
    CHECK_MSG(!kiln_cublaslt_geometry_of(KILN_CUBLASLT_MM, &a, &g), "an empty mm must be declined");
    free(x), free(w), free(y), free(xp), free(yp);
}

static void test_bmm(void) {
    kiln_op_attrs attrs;
    memset(&attrs, 0, sizeof attrs);
    const int64_t B = 3, M = 4, K = 6, N = 5;
    float *x = filled(B * M * K, 4), *w = filled(B * K * N, 5),
          *y = calloc((size_t)(B * M * N), sizeof(float));
    kiln_strided in[2] = {view(x, 3, (int64_t[]){B, M, K}, (int64_t[]){M * K, K, 1}),
                          view(w, 3, (int64_t[]){B, K, N}, (int64_t[]){K * N, N, 1})};
    kiln_strided out = view(y, 3, (int64_t[]){B, M, N}, (int64_t[]){M * N, N, 1});
    kiln_op_args a = args_of(2, in, &out, &attrs);
    check("bmm plain", KILN_CUBLASLT_BMM, &a, B, M, N, K, bmm_x, bmm_w, bmm_y, NULL, false);
    /* w broadcast over the batch (stride 0), x transposed per batch */
    in[0] = view(x, 3, (int64_t[]){B, M, K}, (int64_t[]){M * K, 1, M});
    in[1] = view(w, 3, (int64_t[]){B, K, N}, (int64_t[]){0, N, 1});
    a = args_of(2, in, &out, &attrs);
    check("bmm broadcast w, transposed x", KILN_CUBLASLT_BMM, &a, B, M, N, K, bmm_x, bmm_w, bmm_y, NULL,
          false);
    free(x), free(w), free(y);
}

static void test_linear(void) {
    kiln_op_attrs attrs;
    memset(&attrs, 0, sizeof attrs);
    const int64_t D0 = 2, D1 = 3, K = 5, N = 4;
    float *x = filled(D0 * D1 * K, 6), *w = filled(N * K, 7), *b = filled(N, 8);
    float *y = calloc((size_t)(D0 * D1 * N), sizeof(float));
    kiln_strided in[3] = {view(x, 3, (int64_t[]){D0, D1, K}, (int64_t[]){D1 * K, K, 1}),
                          view(w, 2, (int64_t[]){N, K}, (int64_t[]){K, 1}),
                          view(b, 1, (int64_t[]){N}, (int64_t[]){1})};
    kiln_strided out = view(y, 3, (int64_t[]){D0, D1, N}, (int64_t[]){D1 * N, N, 1});
    kiln_op_args a = args_of(3, in, &out, &attrs);
    check("linear 3-d + bias", KILN_CUBLASLT_LINEAR, &a, 1, D0 * D1, N, K, lin_x, lin_w, lin_y, b, false);
    in[2].ndim = -1; /* no bias */
    a = args_of(3, in, &out, &attrs);
    check("linear 3-d, no bias", KILN_CUBLASLT_LINEAR, &a, 1, D0 * D1, N, K, lin_x, lin_w, lin_y, NULL,
          false);
    /* leading dims that do not merge (x's dim 0 padded): declined */
    float *xp = filled(D0 * 20, 9);
    in[0] = view(xp, 3, (int64_t[]){D0, D1, K}, (int64_t[]){20, K, 1});
    a = args_of(3, in, &out, &attrs);
    kiln_cublaslt_geometry g;
    CHECK_MSG(!kiln_cublaslt_geometry_of(KILN_CUBLASLT_LINEAR, &a, &g),
              "linear with unmergeable leading dims must be declined");
    free(x), free(w), free(b), free(y), free(xp);
}

static void test_linear_act(void) {
    kiln_op_attrs attrs;
    memset(&attrs, 0, sizeof attrs);
    attrs.flag = 1;
    const int64_t Nb = 3, C = 2, H = 2, W = 3, K = C * H * W, O = 4;
    float *x = filled(Nb * K, 10), *w = filled(O * K, 11), *b = filled(O, 12),
          *y = calloc((size_t)(Nb * O), sizeof(float));
    kiln_strided in[3] = {view(x, 4, (int64_t[]){Nb, C, H, W}, (int64_t[]){K, H * W, W, 1}),
                          view(w, 2, (int64_t[]){O, K}, (int64_t[]){K, 1}),
                          view(b, 1, (int64_t[]){O}, (int64_t[]){1})};
    kiln_strided out = view(y, 2, (int64_t[]){Nb, O}, (int64_t[]){O, 1});
    kiln_op_args a = args_of(3, in, &out, &attrs);
    check("linear_act relu + bias", KILN_CUBLASLT_LINEAR_ACT, &a, 1, Nb, O, K, act_x, lin_w, mm_y, b, true);
    attrs.flag = 0;
    in[2].ndim = -1;
    a = args_of(3, in, &out, &attrs);
    check("linear_act none, no bias", KILN_CUBLASLT_LINEAR_ACT, &a, 1, Nb, O, K, act_x, lin_w, mm_y, NULL,
          false);
    free(x), free(w), free(b), free(y);
}

int main(void) {
    test_mm();
    test_bmm();
    test_linear();
    test_linear_act();
    return kt_finish();
}

#else
int main(void) {
    kt_skip("the cuBLASLt path exists only in the real CUDA build (-DKILN_WITH_CUDA=ON)");
    return 0;
}
#endif

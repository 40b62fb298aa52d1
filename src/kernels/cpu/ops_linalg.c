/* CPU reference kernels for mm, bmm and linear, on any strides.
 *
 * mm/bmm use the i-k-j loop order with one output row accumulated in a
 * double workspace row (m doubles), so the innermost loop walks rows of b
 * and of the accumulator; f32 and f64 have typed loops, f16/bf16 go
 * through the generic element loads. linear is a dot product per output
 * element: x's rows and W's rows both run along `in`. linear_act is the
 * same dot product with x (N, d1, ...) read as (N, K) through a table of
 * the K inner offsets (its workspace), then its activation. */
#include "kernels/cpu/reduce_access.h"
#include "kernels/cpu/reduce_kernels.h"

typedef struct mat {
    const char *data; /* element 0 */
    kiln_dtype dtype;
    int64_t rs, cs; /* row / column strides in elements */
} mat;

/* c (n, m) = a (n, k) @ b (k, m); acc holds m doubles. */
static void matmul_2d(mat a, mat b, mat c, int64_t n, int64_t k, int64_t m, double *acc) {
    for (int64_t i = 0; i < n; i++) {
        for (int64_t j = 0; j < m; j++) acc[j] = 0;
        if (a.dtype == KILN_F32) {
            const float *ap = (const float *)a.data, *bp = (const float *)b.data;
            for (int64_t p = 0; p < k; p++) {
                double av = ap[i * a.rs + p * a.cs];
                const float *brow = bp + p * b.rs;
                for (int64_t j = 0; j < m; j++) acc[j] += av * brow[j * b.cs];
            }
        } else if (a.dtype == KILN_F64) {
            const double *ap = (const double *)a.data, *bp = (const double *)b.data;
            for (int64_t p = 0; p < k; p++) {
                double av = ap[i * a.rs + p * a.cs];
                const double *brow = bp + p * b.rs;
                for (int64_t j = 0; j < m; j++) acc[j] += av * brow[j * b.cs];
            }
        } else {
            for (int64_t p = 0; p < k; p++) {
                double av = kiln_cpu_ld_f(a.data, a.dtype, i * a.rs + p * a.cs);
                for (int64_t j = 0; j < m; j++) acc[j] += av * kiln_cpu_ld_f(b.data, b.dtype, p * b.rs + j * b.cs);
            }
        }
        for (int64_t j = 0; j < m; j++) kiln_cpu_st_f((void *)c.data, c.dtype, i * c.rs + j * c.cs, acc[j]);
    }
}

static mat mat_of(const kiln_strided *s, int row_dim, int64_t batch_offset) {
    mat r = {(const char *)s->data + (size_t)batch_offset * kiln_cpu_elem_size(s->dtype), s->dtype,
             s->strides[row_dim], s->strides[row_dim + 1]};
    return r;
}

size_t kiln_cpu_mm_workspace(const kiln_op_args *a) {
    const kiln_strided *c = &a->out[0];
    return (size_t)(c->ndim >= 1 ? c->shape[c->ndim - 1] : 1) * sizeof(double);
}

kiln_status kiln_cpu_mm(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *w = &a->in[1], *c = &a->out[0];
    matmul_2d(mat_of(x, 0, 0), mat_of(w, 0, 0), mat_of(c, 0, 0), x->shape[0], x->shape[1], w->shape[1],
              (double *)a->workspace);
    return KILN_OK;
}

kiln_status kiln_cpu_bmm(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *w = &a->in[1], *c = &a->out[0];
    for (int64_t bi = 0; bi < c->shape[0]; bi++)
        matmul_2d(mat_of(x, 1, bi * x->strides[0]), mat_of(w, 1, bi * w->strides[0]),
                  mat_of(c, 1, bi * c->strides[0]), x->shape[1], x->shape[2], w->shape[2],
                  (double *)a->workspace);
    return KILN_OK;
}

/* y[r, o] = sum_i x[r, i] * W[o, i] + b[o] over the leading positions r of
 * x (..., in) (none for a 1-D x). */
kiln_status kiln_cpu_linear(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *w = &a->in[1], *b = &a->in[2], *y = &a->out[0];
    int lead = x->ndim - 1;
    int64_t in_f = x->shape[lead], out_f = w->shape[0];
    int64_t xs = x->strides[lead], ys = y->strides[lead], w0 = w->strides[0], w1 = w->strides[1];
    rk_iter it;
    memset(&it, 0, sizeof it);
    it.n = lead;
    for (int d = 0; d < lead; d++) {
        it.shape[d] = x->shape[d];
        it.stride[0][d] = x->strides[d];
        it.stride[1][d] = y->strides[d];
    }
    int64_t rows = rk_iter_count(&it);
    bool f32 = x->dtype == KILN_F32, f64 = x->dtype == KILN_F64;
    for (int64_t r = 0; r < rows; r++, rk_iter_next(&it)) {
        for (int64_t o = 0; o < out_f; o++) {
            double s = b->ndim < 0 ? 0 : kiln_cpu_ld_f(b->data, b->dtype, o * b->strides[0]);
            if (f32) {
                const float *xp = (const float *)x->data + it.off[0], *wp = (const float *)w->data + o * w0;
                for (int64_t i = 0; i < in_f; i++) s += (double)xp[i * xs] * wp[i * w1];
            } else if (f64) {
                const double *xp = (const double *)x->data + it.off[0],
                             *wp = (const double *)w->data + o * w0;
                for (int64_t i = 0; i < in_f; i++) s += xp[i * xs] * wp[i * w1];
            } else {
                for (int64_t i = 0; i < in_f; i++)
                    s += kiln_cpu_ld_f(x->data, x->dtype, it.off[0] + i * xs) *
                         kiln_cpu_ld_f(w->data, w->dtype, o * w0 + i * w1);
            }
            kiln_cpu_st_f(y->data, y->dtype, it.off[1] + o * ys, s);
        }
    }
    return KILN_OK;
}

size_t kiln_cpu_linear_act_workspace(const kiln_op_args *a) {
    return (size_t)(a->in[1].shape[1] > 0 ? a->in[1].shape[1] : 1) * sizeof(int64_t);
}

/* y[n, o] = act(b[o] + sum_k x_flat[n, k] * W[o, k]), summed as linear's
 * kernel sums (so relu(linear(flatten(x))) gives these bits); relu keeps
 * NaN, and rounding to y's dtype commutes with it. */
kiln_status kiln_cpu_linear_act(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *w = &a->in[1], *b = &a->in[2], *y = &a->out[0];
    int64_t N = x->shape[0], K = w->shape[1], O = w->shape[0];
    int64_t w0 = w->strides[0], w1 = w->strides[1];
    int64_t *koff = a->workspace; /* x's offset of flat inner index k */
    {
        int64_t idx[KILN_MAX_DIMS] = {0};
        int inner = x->ndim - 1;
        for (int64_t k = 0; k < K; k++) {
            int64_t off = 0;
            for (int d = 0; d < inner; d++) off += idx[d] * x->strides[d + 1];
            koff[k] = off;
            for (int d = inner - 1; d >= 0; d--) {
                if (++idx[d] < x->shape[d + 1]) break;
                idx[d] = 0;
            }
        }
    }
    /* x's dims 1.. with one stride (a contiguous x): k * ks, as linear reads it */
    int64_t ks = K > 1 ? koff[1] : 1;
    bool affine = true;
    for (int64_t k = 0; k < K && affine; k++) affine = koff[k] == k * ks;
    bool relu = a->attrs->flag == 1;
    bool f32 = x->dtype == KILN_F32, f64 = x->dtype == KILN_F64;
    for (int64_t n = 0; n < N; n++) {
        int64_t xr = n * x->strides[0];
        for (int64_t o = 0; o < O; o++) {
            double s = b->ndim < 0 ? 0 : kiln_cpu_ld_f(b->data, b->dtype, o * b->strides[0]);
            if (f32 && affine) {
                const float *xp = (const float *)x->data + xr, *wp = (const float *)w->data + o * w0;
                for (int64_t k = 0; k < K; k++) s += (double)xp[k * ks] * wp[k * w1];
            } else if (f32) {
                const float *xp = (const float *)x->data + xr, *wp = (const float *)w->data + o * w0;
                for (int64_t k = 0; k < K; k++) s += (double)xp[koff[k]] * wp[k * w1];
            } else if (f64) {
                const double *xp = (const double *)x->data + xr, *wp = (const double *)w->data + o * w0;
                for (int64_t k = 0; k < K; k++) s += xp[koff[k]] * wp[k * w1];
            } else {
                for (int64_t k = 0; k < K; k++)
                    s += kiln_cpu_ld_f(x->data, x->dtype, xr + koff[k]) *
                         kiln_cpu_ld_f(w->data, w->dtype, o * w0 + k * w1);
            }
            if (relu && !(s > 0 || s != s)) s = 0;
            kiln_cpu_st_f(y->data, y->dtype, n * y->strides[0] + o * y->strides[1], s);
        }
    }
    return KILN_OK;
}

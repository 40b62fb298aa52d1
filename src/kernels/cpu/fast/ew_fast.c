/* Fast CPU ReLU, ReLU backward and addition for f32 on contiguous tensors
 * of one shape (no broadcasting), in place or not: one flat loop the compiler vectorises, split
 * over OpenMP threads for large tensors. Same values as the reference
 * kernels, bit for bit: relu(x) = x if x > 0 or x is NaN, else +0 (NaN
 * passes through, as in PyTorch); the backward passes g where the saved
 * output is > 0 (a NaN output passes nothing), else 0; a + b is one f32
 * addition per element. Elementwise over the bytes, so any one layout
 * (kiln/tensor.h) works when every tensor has it: the output takes it. */
#include "kernels/cpu/fast/fast_kernels.h"

/* Below this many elements one thread does it: a parallel region costs
 * a few microseconds. */
#define KILN_FAST_PARALLEL_MIN 32768

static bool flat_f32(const kiln_strided *t, int64_t *n) {
    if (t->dtype != KILN_F32) return false;
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != expect) return false;
        expect *= t->shape[i];
    }
    *n = expect;
    return true;
}

static bool same_shape(const kiln_strided *a, const kiln_strided *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

bool kiln_fast_relu_supports(const kiln_op_args *a) {
    int64_t n, m;
    return flat_f32(&a->in[0], &n) && flat_f32(&a->out[0], &m) && same_shape(&a->in[0], &a->out[0]);
}

/* Chunks of this many elements are the unit of work between threads. */
#define CHUNK 16384

/* out = f(a, b) elementwise over n elements (b may be unused). */
typedef void (*span_fn)(const float *a, const float *b, float *out, int64_t n);

/* f over n elements in chunks of CHUNK, split over OpenMP threads for
 * large n (the same chunks in place or not: an element is read before the
 * same element is written). */
static void chunked(span_fn f, const float *a, const float *b, float *out, int64_t n) {
    const int64_t chunks = (n + CHUNK - 1) / CHUNK;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (n >= KILN_FAST_PARALLEL_MIN)
#endif
    for (int64_t c = 0; c < chunks; c++) {
        int64_t i0 = c * CHUNK, len = n - i0 < CHUNK ? n - i0 : CHUNK;
        f(a + i0, b ? b + i0 : NULL, out + i0, len);
    }
}

/* The spans, with restrict (separate buffers, vectorised per ISA) and
 * without (an output that is one of the inputs). */
KILN_SIMD_CLONES static void relu_span(const float *restrict x, const float *unused, float *restrict y, int64_t n) {
    (void)unused;
    for (int64_t i = 0; i < n; i++) y[i] = x[i] > 0.0f || x[i] != x[i] ? x[i] : 0.0f;
}
static void relu_span_alias(const float *x, const float *unused, float *y, int64_t n) {
    (void)unused;
    for (int64_t i = 0; i < n; i++) y[i] = x[i] > 0.0f || x[i] != x[i] ? x[i] : 0.0f;
}
/* g loaded unconditionally, so the loop vectorises */
KILN_SIMD_CLONES static void relu_backward_span(const float *restrict g, const float *restrict t, float *restrict dx,
                                                int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i];
        dx[i] = t[i] > 0.0f ? gi : 0.0f;
    }
}
static void relu_backward_span_alias(const float *g, const float *t, float *dx, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i];
        dx[i] = t[i] > 0.0f ? gi : 0.0f;
    }
}
KILN_SIMD_CLONES static void add_span(const float *restrict x, const float *restrict y, float *restrict z, int64_t n) {
    for (int64_t i = 0; i < n; i++) z[i] = x[i] + y[i];
}
static void add_span_alias(const float *x, const float *y, float *z, int64_t n) {
    for (int64_t i = 0; i < n; i++) z[i] = x[i] + y[i];
}

kiln_status kiln_fast_relu(const kiln_op_args *a) {
    const float *x = a->in[0].data;
    float *y = a->out[0].data;
    int64_t n = 0;
    flat_f32(&a->out[0], &n);
    chunked(x == y ? relu_span_alias : relu_span, x, NULL, y, n); /* x == y: relu_ */
    return KILN_OK;
}

bool kiln_fast_relu_backward_supports(const kiln_op_args *a) {
    int64_t n[3];
    /* elementwise over the bytes: both inputs in one layout (the output takes it) */
    return flat_f32(&a->in[0], &n[0]) && flat_f32(&a->in[1], &n[1]) && flat_f32(&a->out[0], &n[2]) &&
           same_shape(&a->in[0], &a->out[0]) && same_shape(&a->in[1], &a->out[0]) &&
           a->in[0].layout == a->in[1].layout;
}

kiln_status kiln_fast_relu_backward(const kiln_op_args *a) {
    const float *g = a->in[0].data, *t = a->in[1].data;
    float *dx = a->out[0].data;
    int64_t n = 0;
    flat_f32(&a->out[0], &n);
    chunked(dx == g || dx == t ? relu_backward_span_alias : relu_backward_span, g, t, dx, n);
    return KILN_OK;
}

bool kiln_fast_add_supports(const kiln_op_args *a) {
    int64_t n[3];
    return flat_f32(&a->in[0], &n[0]) && flat_f32(&a->in[1], &n[1]) && flat_f32(&a->out[0], &n[2]) &&
           same_shape(&a->in[0], &a->out[0]) && same_shape(&a->in[1], &a->out[0]) &&
           a->in[0].layout == a->in[1].layout;
}

/* z = x + y; z may be x or y (add_, or a donated input). */
kiln_status kiln_fast_add(const kiln_op_args *a) {
    const float *x = a->in[0].data, *y = a->in[1].data;
    float *z = a->out[0].data;
    int64_t n = 0;
    flat_f32(&a->out[0], &n);
    chunked(z == x || z == y ? add_span_alias : add_span, x, y, z, n);
    return KILN_OK;
}

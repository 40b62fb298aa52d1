/* oneDNN matmul for mm (M, K) @ (K, N), bmm (B, M, K) @ (B, K, N) and
 * linear x (..., K) @ weight (N, K)^T + bias (N), f32. Operands are
 * described to oneDNN with their strides, so transposed views run without
 * a copy; a matrix must be row-major (column stride 1) or column-major
 * (row stride 1), and linear's leading dims must collapse into one. */
#ifdef KILN_WITH_ONEDNN
#include <string.h>

#include "kernels/cpu/fast/gemm_avx2.h"
#include "kernels/cpu/onednn/onednn_internal.h"
#include "kernels/kernels.h"

typedef enum { MM_PLAIN, MM_BATCHED, MM_LINEAR } mm_kind;

/* One operand as oneDNN sees it: ndims 2 (rows, cols) or 3 (B, rows, cols). */
typedef struct mm_operand {
    int64_t dims[3], strides[3];
} mm_operand;

/* Key layout: ndims, then dims and strides of src, weights, dst, then bias
 * and the dtype (0 f32, 1 bf16). */
enum { K_NDIMS = 0, K_OPS = 1, K_BIAS = K_OPS + 18, K_DT };

/* Strides of size-1 dims carry no information: choose ones that keep the
 * matrix plain, then check it is row- or column-major. */
static bool plain_matrix(int64_t rows, int64_t cols, int64_t *rs, int64_t *cs) {
    if (rows <= 0 || cols <= 0) return false;
    if (rows == 1) *rs = *cs == 1 ? cols : 1;
    if (cols == 1) *cs = *rs == 1 ? rows : 1;
    return (*cs == 1 && *rs >= cols) || (*rs == 1 && *cs >= rows);
}

static bool set_operand(mm_operand *o, int64_t batch, int64_t bstride, int64_t rows, int64_t cols, int64_t rs,
                        int64_t cs, bool batched) {
    if (!plain_matrix(rows, cols, &rs, &cs)) return false;
    int d = 0;
    if (batched) {
        if (batch <= 0 || bstride < 0) return false;
        o->dims[0] = batch;
        o->strides[0] = batch == 1 ? (rows - 1) * rs + (cols - 1) * cs + 1 : bstride;
        d = 1;
    }
    o->dims[d] = rows, o->strides[d] = rs;
    o->dims[d + 1] = cols, o->strides[d + 1] = cs;
    return true;
}

/* x (..., K) as a (rows, K) matrix: the leading dims must collapse. */
static bool flat_operand(const kiln_strided *x, mm_operand *o) {
    if (x->ndim < 1) return false;
    int64_t rows = 1, rs = 0, expect = -1;
    for (int i = x->ndim - 2; i >= 0; i--) {
        if (x->shape[i] == 1) continue;
        if (expect >= 0 && x->strides[i] != expect) return false;
        if (expect < 0) rs = x->strides[i];
        expect = x->strides[i] * x->shape[i];
        rows *= x->shape[i];
    }
    return set_operand(o, 1, 0, rows, x->shape[x->ndim - 1], rows == 1 ? 0 : rs, x->strides[x->ndim - 1],
                       false);
}

static bool all_f32(const kiln_op_args *a) {
    if (a->out[0].dtype != KILN_F32) return false;
    for (int i = 0; i < a->n_in; i++)
        if (a->in[i].ndim >= 0 && a->in[i].dtype != KILN_F32) return false;
    return true;
}

/* All bf16 (autocast's products: oneDNN's bf16 kernels, AMX or AVX512-BF16
 * where the CPU has them; declined where oneDNN has none). */
static bool all_bf16(const kiln_op_args *a) {
    if (a->out[0].dtype != KILN_BF16) return false;
    for (int i = 0; i < a->n_in; i++)
        if (a->in[i].ndim >= 0 && a->in[i].dtype != KILN_BF16) return false;
    return true;
}

static bool mm_key(mm_kind kind, const kiln_op_args *a, kiln_onednn_key *key) {
    bool bf16 = all_bf16(a);
    if (!bf16 && !all_f32(a)) return false;
    mm_operand o[3];
    memset(o, 0, sizeof o);
    const kiln_strided *x = &a->in[0], *w = &a->in[1], *y = &a->out[0];
    bool bias = false;
    int ndims = 2;
    if (kind == MM_PLAIN) {
        if (x->ndim != 2 || w->ndim != 2 || y->ndim != 2) return false;
        if (!set_operand(&o[0], 1, 0, x->shape[0], x->shape[1], x->strides[0], x->strides[1], false) ||
            !set_operand(&o[1], 1, 0, w->shape[0], w->shape[1], w->strides[0], w->strides[1], false) ||
            !set_operand(&o[2], 1, 0, y->shape[0], y->shape[1], y->strides[0], y->strides[1], false))
            return false;
    } else if (kind == MM_BATCHED) {
        ndims = 3;
        if (x->ndim != 3 || w->ndim != 3 || y->ndim != 3) return false;
        const kiln_strided *t[3] = {x, w, y};
        for (int i = 0; i < 3; i++)
            if (!set_operand(&o[i], t[i]->shape[0], t[i]->strides[0], t[i]->shape[1], t[i]->shape[2],
                             t[i]->strides[1], t[i]->strides[2], true))
                return false;
    } else {
        const kiln_strided *b = a->n_in > 2 && a->in[2].ndim >= 0 ? &a->in[2] : NULL;
        if (w->ndim != 2 || !flat_operand(x, &o[0]) || !flat_operand(y, &o[2])) return false;
        /* weight (N, K) read as its transpose (K, N) */
        if (!set_operand(&o[1], 1, 0, w->shape[1], w->shape[0], w->strides[1], w->strides[0], false))
            return false;
        if (b && (b->ndim != 1 || (b->shape[0] > 1 && b->strides[0] != 1))) return false;
        bias = b != NULL;
    }
    memset(key, 0, sizeof *key);
    key->kind = KILN_ONEDNN_MATMUL;
    key->v[K_NDIMS] = ndims;
    for (int i = 0; i < 3; i++) {
        memcpy(&key->v[K_OPS + 6 * i], o[i].dims, sizeof o[i].dims);
        memcpy(&key->v[K_OPS + 6 * i + 3], o[i].strides, sizeof o[i].strides);
    }
    key->v[K_BIAS] = bias;
    key->v[K_DT] = bf16;
    return true;
}

static kiln_status build_matmul(const kiln_onednn_key *key, const_dnnl_primitive_attr_t attr,
                                dnnl_engine_t engine, dnnl_primitive_desc_t *pd) {
    int nd = (int)key->v[K_NDIMS];
    dnnl_data_type_t dt = key->v[K_DT] ? dnnl_bf16 : dnnl_f32;
    dnnl_memory_desc_t md[3], bias;
    for (int i = 0; i < 3; i++) {
        dnnl_dims_t dims, strides;
        memcpy(dims, &key->v[K_OPS + 6 * i], sizeof(int64_t) * 3);
        memcpy(strides, &key->v[K_OPS + 6 * i + 3], sizeof(int64_t) * 3);
        KILN_DNNL_CHECK(dnnl_memory_desc_init_by_strides(&md[i], nd, dims, dt, strides));
    }
    if (key->v[K_BIAS]) { /* (1, N), broadcast over the rows */
        int64_t n = md[2].dims[nd - 1];
        dnnl_dims_t dims = {1, n}, strides = {n, 1};
        KILN_DNNL_CHECK(dnnl_memory_desc_init_by_strides(&bias, 2, dims, dt, strides));
    }
    dnnl_matmul_desc_t d;
    KILN_DNNL_CHECK(dnnl_matmul_desc_init(&d, &md[0], &md[1], key->v[K_BIAS] ? &bias : NULL, &md[2]));
    KILN_DNNL_CHECK(dnnl_primitive_desc_create(pd, &d, attr, engine, NULL));
    return KILN_OK;
}

static const int mm_args[] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};

/* The cached primitive in *p; NULL (not an error) when not covered. */
static kiln_status mm_prepare(mm_kind kind, const kiln_op_args *a, kiln_onednn_prim **p) {
    *p = NULL;
    kiln_onednn_key key;
    if (!mm_key(kind, a, &key)) return KILN_OK;
    return kiln_onednn_get(&key, build_matmul, key.v[K_BIAS] ? 4 : 3, mm_args, p);
}

/* mm on an AVX2 CPU (kiln_cpu_avx2_kernels_default), when the right operand and the
 * output are row-major and at least 16 columns wide: Kiln's micro-kernel
 * (kernels/cpu/fast/gemm_avx2.c) instead of oneDNN's matmul, which ran the
 * fully-connected layers' backward products at 35-55% of the FMA peak here
 * (docs/performance.md, "The fully-connected layers' backward"). The left
 * operand may have any strides (backward's transposed views). */
static bool avx2_mm(const kiln_op_args *a) {
    if (!kiln_cpu_avx2_kernels_default() || !all_f32(a)) return false;
    const kiln_strided *x = &a->in[0], *w = &a->in[1], *y = &a->out[0];
    if (x->ndim != 2 || w->ndim != 2 || y->ndim != 2 || y->shape[1] < 16 || x->shape[1] < 1) return false;
    if (w->strides[1] != 1 || y->strides[1] != 1 || w->strides[0] < w->shape[1] || y->strides[0] < y->shape[1])
        return false;
    /* the output is written while the inputs are read: no overlap */
    const char *yb = y->data, *ye = yb + sizeof(float) * (size_t)((y->shape[0] - 1) * y->strides[0] + y->shape[1]);
    for (int i = 0; i < 2; i++) {
        const kiln_strided *t = &a->in[i];
        const char *tb = t->data;
        size_t span = sizeof(float) * (size_t)((t->shape[0] - 1) * t->strides[0] + (t->shape[1] - 1) * t->strides[1] + 1);
        if (tb < ye && yb < tb + span) return false;
    }
    return x->strides[0] >= 0 && x->strides[1] >= 0;
}

static kiln_status mm_run(mm_kind kind, const kiln_op_args *a, const char *op) {
    if (kind == MM_PLAIN && a->in[0].data && avx2_mm(a)) {
        const kiln_strided *x = &a->in[0], *w = &a->in[1], *y = &a->out[0];
        kiln_cpu_gemm_avx2_parallel(y->shape[0], y->shape[1], x->shape[1], x->data, x->strides[0], x->strides[1],
                                    w->data, w->strides[0], y->data, y->strides[0], false);
        return KILN_OK;
    }
    kiln_onednn_prim *p;
    KILN_TRY(mm_prepare(kind, a, &p));
    if (!p)
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "%s: the oneDNN kernel was given arguments it declines",
                          op);
    void *data[4] = {a->in[0].data, a->in[1].data, a->out[0].data, a->n_in > 2 ? a->in[2].data : NULL};
    return kiln_onednn_execute(p, data, a->workspace, a->workspace_bytes);
}

static size_t mm_workspace(mm_kind kind, const kiln_op_args *a) {
    kiln_onednn_prim *p;
    return mm_prepare(kind, a, &p) == KILN_OK && p ? p->scratch_bytes : 0;
}

static bool mm_supports(mm_kind kind, const kiln_op_args *a) {
    kiln_onednn_prim *p;
    return mm_prepare(kind, a, &p) == KILN_OK && p;
}

kiln_status kiln_onednn_mm(const kiln_op_args *a) { return mm_run(MM_PLAIN, a, "kiln_mm"); }
kiln_status kiln_onednn_bmm(const kiln_op_args *a) { return mm_run(MM_BATCHED, a, "kiln_bmm"); }
kiln_status kiln_onednn_linear(const kiln_op_args *a) { return mm_run(MM_LINEAR, a, "kiln_linear"); }
size_t kiln_onednn_mm_workspace(const kiln_op_args *a) { return mm_workspace(MM_PLAIN, a); }
size_t kiln_onednn_bmm_workspace(const kiln_op_args *a) { return mm_workspace(MM_BATCHED, a); }
size_t kiln_onednn_linear_workspace(const kiln_op_args *a) { return mm_workspace(MM_LINEAR, a); }
bool kiln_onednn_mm_supports(const kiln_op_args *a) { return mm_supports(MM_PLAIN, a); }
bool kiln_onednn_bmm_supports(const kiln_op_args *a) { return mm_supports(MM_BATCHED, a); }
bool kiln_onednn_linear_supports(const kiln_op_args *a) { return mm_supports(MM_LINEAR, a); }

/* ---- linear_act: (flatten +) linear + bias + ReLU ------------------------------------ */

/* x (N, *) read as (N, K): a contiguous strided x is used in place, a
 * blocked (nChw16c, nChw8c) x is first reordered to NCHW into the workspace (1 MiB for the
 * tutorial CNN's fc1 input, a fraction of the matmul's time). Then the
 * oneDNN linear, then ReLU over the (N, O) result when attrs.flag is 1. */
#define ALIGN_UP(n) (((n) + 63) / 64 * 64)

static bool linear_act_view(const kiln_op_args *a, void *x2d, kiln_op_args *b) {
    const kiln_strided *x = &a->in[0];
    if (x->ndim < 2 || (x->dtype != KILN_F32 && x->dtype != KILN_BF16) || (a->attrs->flag != 0 && a->attrs->flag != 1))
        return false;
    bool blocked = kiln_layout_block(x->layout) != 0;
    if (blocked && x->dtype != KILN_F32) return false;
    if (!blocked && (x->layout != KILN_LAYOUT_STRIDED || !kiln_onednn_is_contiguous(x))) return false;
    int64_t k = 1;
    for (int i = 1; i < x->ndim; i++) k *= x->shape[i];
    *b = *a;
    kiln_strided v = *x;
    v.ndim = 2, v.shape[0] = x->shape[0], v.shape[1] = k, v.strides[0] = k, v.strides[1] = 1;
    v.layout = KILN_LAYOUT_STRIDED;
    if (blocked) v.data = x2d;
    b->in[0] = v;
    return true;
}

static size_t x_bytes(const kiln_op_args *a) {
    if (!kiln_layout_block(a->in[0].layout)) return 0;
    size_t n = 1;
    for (int i = 0; i < a->in[0].ndim; i++) n *= (size_t)a->in[0].shape[i];
    return ALIGN_UP(n * sizeof(float));
}

static void linear_act_relu(const kiln_op_args *a) {
    if (a->attrs->flag != 1) return;
    int64_t n = a->out[0].shape[0] * a->out[0].shape[1];
    if (a->out[0].dtype == KILN_BF16) { /* the sign bit set and not a NaN: max(y, 0) is +0 */
        uint16_t *y = a->out[0].data;
        for (int64_t i = 0; i < n; i++)
            if ((y[i] & 0x8000u) && (y[i] & 0x7fffu) <= 0x7f80u) y[i] = 0;
        return;
    }
    float *y = a->out[0].data;
    for (int64_t i = 0; i < n; i++) y[i] = y[i] > 0.0f || y[i] != y[i] ? y[i] : 0.0f;
}

bool kiln_onednn_linear_act_supports(const kiln_op_args *a) {
    kiln_op_args b;
    return linear_act_view(a, NULL, &b) && mm_supports(MM_LINEAR, &b);
}

static bool avx2_linear(const kiln_op_args *a);

size_t kiln_onednn_linear_act_workspace(const kiln_op_args *a) {
    kiln_op_args b;
    if (avx2_linear(a)) /* for gathering (also where no prepared copy came): a blocked x's column order */
        return kiln_layout_block(a->in[0].layout) ? (size_t)a->in[1].shape[1] * sizeof(int64_t) : 0;
    if (!linear_act_view(a, NULL, &b)) return 0;
    return x_bytes(a) + mm_workspace(MM_LINEAR, &b);
}

void kiln_onednn_linear_act_layout(const kiln_op_args *a, kiln_layout *out) {
    (void)a;
    out[0] = KILN_LAYOUT_STRIDED;
}

/* On an AVX2 CPU (kiln_cpu_avx2_kernels_default), for an output at least 16 wide: Kiln's
 * micro-kernel (kernels/cpu/fast/gemm_avx2.c) on B = W^T with its rows in
 * x's column order (flat_column): y = bias + x . W^T, each element one
 * chain of fused multiply-adds after the bias. oneDNN's matmul ran fc1's
 * forward at 82-94 GFLOP/s here (the bench CNN's 128 x 2048 x 512 in 3.3
 * ms), besides a permuted copy of the weight per version. B comes one of
 * two ways, the same values in the same order (the same bits):
 *   - a prepared copy below LINEAR_GATHER_ROWS rows, where the product is
 *     too short to pay for gathering W^T per call (fc1 of the main job's
 *     model, no update between calls: 1 row 50 us against 160 gathering,
 *     8 rows 100 against 195, 32 rows 250 against 350). The copy is lazy
 *     (kernels/op_args.h): made once two calls in a row see the same
 *     weight, so a training step, whose optimizer moves the weight between
 *     calls, gathers instead of refilling 4 MB per step (the bench CNN's
 *     fc1 at batch 8: the refill was 14% of the step's CPU time);
 *   - gathered from W into the product's panels per call, from
 *     LINEAR_GATHER_ROWS rows (kiln_cpu_gemm_avx2_parallel_wt, the column
 *     order a table in the workspace): at 128 rows both take about 0.9 ms
 *     with the weight unchanged, and in training, where the optimizer
 *     moves the weight every step, the refill (2.4 MB written and read
 *     back) took 1.80-1.94 ms of fc1's forward in the main job's step
 *     against 1.53-1.64 gathering (AMD EPYC Zen 3, 2 threads). */
#define LINEAR_GATHER_ROWS 64
static bool avx2_linear(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *w = &a->in[1], *y = &a->out[0];
    const kiln_strided *b = a->n_in > 2 && a->in[2].ndim >= 0 ? &a->in[2] : NULL;
    if (!kiln_cpu_avx2_kernels_default() || w->ndim != 2 || w->dtype != KILN_F32 || w->shape[0] < 16 ||
        w->layout != KILN_LAYOUT_STRIDED || !kiln_onednn_is_contiguous(w) || y->ndim != 2 || y->dtype != KILN_F32 ||
        y->layout != KILN_LAYOUT_STRIDED || !kiln_onednn_is_contiguous(y) || y->shape[1] != w->shape[0])
        return false;
    if (b && (b->ndim != 1 || b->dtype != KILN_F32 || b->layout != KILN_LAYOUT_STRIDED || !kiln_onednn_is_contiguous(b)))
        return false;
    int64_t k = 1;
    for (int i = 1; i < x->ndim; i++) k *= x->shape[i];
    bool blocked = kiln_layout_block(x->layout) != 0;
    return x->ndim >= 2 && x->dtype == KILN_F32 && k == w->shape[1] && y->shape[0] == x->shape[0] &&
           (blocked ? x->ndim == 4 : x->layout == KILN_LAYOUT_STRIDED && kiln_onednn_is_contiguous(x));
}

static bool avx2_linear_gathers(const kiln_op_args *a) { return a->in[0].shape[0] >= LINEAR_GATHER_ROWS; }

/* Column f of x's flat row as a column of the flat NCHW row: f itself, or
 * for nChw<B>c the column (c, h, w) that sits at ((c / B) * HW + h * W + w)
 * * B + c % B in the blocked row. Both prepared copies below follow it. */
static int64_t flat_column(const kiln_strided *x, int64_t f) {
    const int64_t B = kiln_layout_block(x->layout);
    if (!B || x->ndim != 4) return f;
    const int64_t HW = x->shape[2] * x->shape[3], cb = f / (HW * B), i = f / B % HW, cr = f % B;
    return (cb * B + cr) * HW + i;
}

/* The prepared copy: W^T for Kiln's product below LINEAR_GATHER_ROWS
 * rows, lazy (none from there: it gathers), else (oneDNN's matmul on a
 * blocked x) W with its columns in x's order (flat_column). */
void kiln_onednn_linear_act_prepare(const kiln_op_args *a, kiln_op_prepare *p) {
    p->input = -1;
    const kiln_strided *x = &a->in[0], *w = &a->in[1];
    const int block = kiln_layout_block(x->layout);
    if (avx2_linear(a)) {
        if (avx2_linear_gathers(a)) return;
        p->input = 1; /* W^T, rows in x's column order */
        p->key = 0x6c696e7432000000ULL ^ ((uint64_t)block << 52) ^ ((uint64_t)(x->ndim == 4 ? x->shape[1] : 0) << 36) ^
                 ((uint64_t)(x->ndim == 4 ? x->shape[2] * x->shape[3] : 0) << 20) ^ (uint64_t)w->shape[1];
        p->bytes = (size_t)(w->shape[0] * w->shape[1]) * sizeof(float);
        p->lazy = true;
        return;
    }
    if (!block || x->ndim != 4 || w->ndim != 2 || w->dtype != KILN_F32 || !kiln_onednn_is_contiguous(w))
        return;
    p->input = 1;
    /* which blocked geometry the columns follow */
    p->key = 0x6c696e6163740000ULL ^ ((uint64_t)block << 60) ^ ((uint64_t)x->shape[1] << 40) ^
             ((uint64_t)x->shape[2] << 20) ^ (uint64_t)x->shape[3];
    p->bytes = (size_t)(w->shape[0] * w->shape[1]) * sizeof(float);
}

kiln_status kiln_onednn_linear_act_fill(const kiln_op_args *a, void *dst) {
    const kiln_strided *x = &a->in[0], *w = &a->in[1];
    if (avx2_linear(a)) {
        /* dst[f][n] = W[n][column f of x's row], eight rows f at a time:
         * each row of dst written in order, each row of W read eight
         * columns at a time. 0.57 ms for fc1's 512 x 1152 weight on one
         * thread, 0.29 on two (AMD EPYC Zen 3; 8 x 8 tiles gathered and
         * transposed in registers took as long). */
        const int64_t N = w->shape[0], K = w->shape[1];
        const float *src = w->data;
        float *out = dst;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (N * K >= 65536)
#endif
        for (int64_t f0 = 0; f0 < K; f0 += 8) {
            int64_t fe = f0 + 8 < K ? f0 + 8 : K, col[8];
            for (int64_t f = f0; f < fe; f++) col[f - f0] = flat_column(x, f);
            for (int64_t n = 0; n < N; n++)
                for (int64_t f = f0; f < fe; f++) out[f * N + n] = src[n * K + col[f - f0]];
        }
        return KILN_OK;
    }
    const int64_t O = w->shape[0], K = w->shape[1], C = x->shape[1], HW = x->shape[2] * x->shape[3];
    if (K != C * HW || !kiln_layout_block(x->layout))
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "kiln_linear_act: weight columns do not match x");
    const float *src = w->data;
    float *out = dst;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (O * K >= 65536)
#endif
    for (int64_t f0 = 0; f0 < K; f0 += 8) { /* dst[o][f] = W[o][column f of x's row], as above untransposed */
        int64_t fe = f0 + 8 < K ? f0 + 8 : K, col[8];
        for (int64_t f = f0; f < fe; f++) col[f - f0] = flat_column(x, f);
        for (int64_t o = 0; o < O; o++)
            for (int64_t f = f0; f < fe; f++) out[o * K + f] = src[o * K + col[f - f0]];
    }
    return KILN_OK;
}

kiln_status kiln_onednn_linear_act(const kiln_op_args *a) {
    kiln_op_args b;
    if (avx2_linear(a)) { /* y = bias, then += x . W^T */
        const int64_t M = a->out[0].shape[0], N = a->out[0].shape[1], K = a->in[1].shape[1];
        const float *bias = a->n_in > 2 && a->in[2].ndim >= 0 ? a->in[2].data : NULL;
        float *y = a->out[0].data;
        int64_t *wcol = NULL;
        if (!a->prepared && kiln_layout_block(a->in[0].layout)) {
            if (a->workspace_bytes < (size_t)K * sizeof(int64_t))
                return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "kiln_linear_act: workspace of %zu bytes, it needs %zu",
                                  a->workspace_bytes, (size_t)K * sizeof(int64_t));
            wcol = a->workspace;
            for (int64_t f = 0; f < K; f++) wcol[f] = flat_column(&a->in[0], f);
        }
        for (int64_t i = 0; i < M; i++) {
            if (bias) memcpy(y + i * N, bias, sizeof(float) * (size_t)N);
            else memset(y + i * N, 0, sizeof(float) * (size_t)N);
        }
        if (a->prepared) kiln_cpu_gemm_avx2_parallel(M, N, K, a->in[0].data, K, 1, a->prepared, N, y, N, true);
        else kiln_cpu_gemm_avx2_parallel_wt(M, N, K, a->in[0].data, K, 1, a->in[1].data, K, wcol, y, N, true);
        linear_act_relu(a);
        return KILN_OK;
    }
    if (a->prepared && kiln_layout_block(a->in[0].layout)) {
        /* permuted weights: the matmul reads the blocked x as a flat (N, K) matrix */
        if (!linear_act_view(a, a->in[0].data, &b))
            return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "kiln_linear_act: the oneDNN kernel was given arguments it declines");
        b.in[1].data = (void *)a->prepared;
        b.prepared = NULL;
        KILN_TRY(mm_run(MM_LINEAR, &b, "kiln_linear_act"));
        linear_act_relu(a);
        return KILN_OK;
    }
    size_t xb = x_bytes(a);
    if (!linear_act_view(a, a->workspace, &b) || a->workspace_bytes < xb)
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "kiln_linear_act: the oneDNN kernel was given arguments it declines");
    if (xb)
        kiln_cpu_reorder_blocked(a->workspace, a->in[0].data, sizeof(float), a->in[0].shape,
                                 kiln_layout_block(a->in[0].layout), false);
    b.workspace = xb ? (char *)a->workspace + xb : a->workspace;
    b.workspace_bytes = a->workspace_bytes - xb;
    KILN_TRY(mm_run(MM_LINEAR, &b, "kiln_linear_act"));
    linear_act_relu(a);
    return KILN_OK;
}

#else
typedef int kiln_onednn_matmul_unused; /* ISO C: a translation unit is not empty */
#endif

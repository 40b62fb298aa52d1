/* CPU kernels of the tensor layer: strided copy with dtype conversion
 * (every pair of the 8 dtypes), fill, arange and the random fills.
 *
 * Conversions follow PyTorch on the CPU:
 *   - to f16/bf16 through f32, rounding to nearest even (base/half.c);
 *   - float to integer truncates toward zero. Out-of-range values would be
 *     undefined behaviour in C, so they are made defined first: NaN becomes
 *     0, i32 and i64 saturate at their limits, and u8 takes the truncated
 *     value (saturated to i64) modulo 256, which is what PyTorch's CPU
 *     kernels give for values in range of i32 (-1.0 -> 255);
 *   - integer to integer wraps modulo 2^bits; anything to bool is x != 0
 *     (NaN is true); bool bytes other than 0 are read as true.
 *
 * Iteration: size-1 dims are dropped and neighbouring dims that are
 * contiguous with each other in both tensors are merged, so a copy runs as
 * few long rows as the layouts allow; each row is one call of a
 * per-dtype-pair inner loop over byte strides. */
#include <math.h>
#include <string.h>

#include "base/philox.h"
#include "kernels/kernels.h"

/* ---- Element loads and stores -------------------------------------------------------
 * Floating dtypes load as double, integer dtypes as int64; each dtype has
 * a store from either. memcpy keeps unaligned host buffers (kiln_to_host
 * targets) well-defined. */

#define DEFINE_LOAD_RAW(name, ctype)                                                                         \
    static inline ctype name(const char *p) {                                                                \
        ctype v;                                                                                             \
        memcpy(&v, p, sizeof v);                                                                             \
        return v;                                                                                            \
    }
DEFINE_LOAD_RAW(raw_float, float)
DEFINE_LOAD_RAW(raw_double, double)
DEFINE_LOAD_RAW(raw_u16, uint16_t)
DEFINE_LOAD_RAW(raw_i32, int32_t)
DEFINE_LOAD_RAW(raw_i64, int64_t)
DEFINE_LOAD_RAW(raw_u8, uint8_t)
#define STORE(ctype, p, value)                                                                               \
    do {                                                                                                     \
        ctype v_ = (value);                                                                                  \
        memcpy((p), &v_, sizeof v_);                                                                         \
    } while (0)

static inline double load_f32(const char *p) { return raw_float(p); }
static inline double load_f16(const char *p) { return kiln_f16_to_f32(raw_u16(p)); }
static inline double load_bf16(const char *p) { return kiln_bf16_to_f32(raw_u16(p)); }
static inline double load_f64(const char *p) { return raw_double(p); }
static inline int64_t load_i32(const char *p) { return raw_i32(p); }
static inline int64_t load_i64(const char *p) { return raw_i64(p); }
static inline int64_t load_u8(const char *p) { return raw_u8(p); }
static inline int64_t load_b8(const char *p) { return raw_u8(p) != 0; }

/* Truncation toward zero made total: NaN -> 0, saturation at the limits.
 * 2^63 is exact in double; -2^63 is representable and converts as is. */
static inline int64_t f_to_i64(double x) {
    if (x != x) return 0;
    if (x >= 9223372036854775808.0) return INT64_MAX;
    if (x < -9223372036854775808.0) return INT64_MIN;
    return (int64_t)x;
}
static inline int32_t f_to_i32(double x) {
    if (x != x) return 0;
    if (x >= 2147483648.0) return INT32_MAX;
    if (x <= -2147483649.0) return INT32_MIN;
    return (int32_t)x;
}

static inline void store_f32_flt(char *p, double x) { STORE(float, p, (float)x); }
static inline void store_f16_flt(char *p, double x) { STORE(uint16_t, p, kiln_f32_to_f16((float)x)); }
static inline void store_bf16_flt(char *p, double x) { STORE(uint16_t, p, kiln_f32_to_bf16((float)x)); }
static inline void store_f64_flt(char *p, double x) { STORE(double, p, x); }
static inline void store_i32_flt(char *p, double x) { STORE(int32_t, p, f_to_i32(x)); }
static inline void store_i64_flt(char *p, double x) { STORE(int64_t, p, f_to_i64(x)); }
static inline void store_u8_flt(char *p, double x) { STORE(uint8_t, p, (uint8_t)(uint64_t)f_to_i64(x)); }
static inline void store_b8_flt(char *p, double x) { STORE(uint8_t, p, x != 0.0); }

static inline void store_f32_int(char *p, int64_t v) { STORE(float, p, (float)v); }
static inline void store_f16_int(char *p, int64_t v) { STORE(uint16_t, p, kiln_f32_to_f16((float)v)); }
static inline void store_bf16_int(char *p, int64_t v) { STORE(uint16_t, p, kiln_f32_to_bf16((float)v)); }
static inline void store_f64_int(char *p, int64_t v) { STORE(double, p, (double)v); }
static inline void store_i32_int(char *p, int64_t v) { STORE(int32_t, p, (int32_t)(uint32_t)(uint64_t)v); }
static inline void store_i64_int(char *p, int64_t v) { STORE(int64_t, p, v); }
static inline void store_u8_int(char *p, int64_t v) { STORE(uint8_t, p, (uint8_t)(uint64_t)v); }
static inline void store_b8_int(char *p, int64_t v) { STORE(uint8_t, p, v != 0); }

/* ---- The 64 conversion loops ---------------------------------------------------------
 * Dtype tokens in kiln_dtype order; `b8` stands for bool (a macro name). */

typedef void (*row_fn)(char *dst, int64_t dst_step, const char *src, int64_t src_step, int64_t n);

#define FOR_EACH_DST(M, s, k)                                                                                \
    M(s, k, f32) M(s, k, f16) M(s, k, bf16) M(s, k, f64) M(s, k, i32) M(s, k, i64) M(s, k, u8) M(s, k, b8)
#define FOR_EACH_SRC(M)                                                                                      \
    M(f32, flt) M(f16, flt) M(bf16, flt) M(f64, flt) M(i32, int) M(i64, int) M(u8, int) M(b8, int)

#define DEFINE_PAIR(s, k, d)                                                                                 \
    static void copy_##s##_##d(char *dst, int64_t ds, const char *src, int64_t ss, int64_t n) {              \
        for (int64_t i = 0; i < n; i++) store_##d##_##k(dst + i * ds, load_##s(src + i * ss));               \
    }
#define DEFINE_ROW(s, k) FOR_EACH_DST(DEFINE_PAIR, s, k)
FOR_EACH_SRC(DEFINE_ROW)

#define PAIR_NAME(s, k, d) copy_##s##_##d,
#define ROW_NAMES(s, k)    {FOR_EACH_DST(PAIR_NAME, s, k)},
static const row_fn copy_rows[KILN_DTYPE_COUNT][KILN_DTYPE_COUNT] = {FOR_EACH_SRC(ROW_NAMES)};

typedef void (*store_flt_fn)(char *p, double x);
#define STORE_NAME(s, k) store_##s##_flt,
static const store_flt_fn store_flt[KILN_DTYPE_COUNT] = {FOR_EACH_SRC(STORE_NAME)};

static const size_t elem_size[KILN_DTYPE_COUNT] = {4, 2, 2, 8, 4, 8, 1, 1};

/* ---- Strided iteration ------------------------------------------------------------------ */

typedef struct row_plan {
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    int64_t dst_step[KILN_MAX_DIMS]; /* bytes */
    int64_t src_step[KILN_MAX_DIMS]; /* bytes */
} row_plan;

/* Drop size-1 dims and merge dim i into i+1 when both tensors step over
 * dim i exactly as a contiguous block of dim i+1. `src` may be NULL. */
static bool plan_rows(const kiln_strided *dst, const kiln_strided *src, row_plan *p) {
    size_t de = elem_size[dst->dtype], se = src ? elem_size[src->dtype] : 0;
    p->ndim = 0;
    for (int i = 0; i < dst->ndim; i++) {
        if (dst->shape[i] == 0) return false; /* nothing to do */
        if (dst->shape[i] == 1) continue;
        int j = p->ndim;
        int64_t ds = dst->strides[i] * (int64_t)de, ss = src ? src->strides[i] * (int64_t)se : 0;
        if (j > 0 && p->dst_step[j - 1] == ds * dst->shape[i] && p->src_step[j - 1] == ss * dst->shape[i]) {
            p->shape[j - 1] *= dst->shape[i];
            p->dst_step[j - 1] = ds;
            p->src_step[j - 1] = ss;
            continue;
        }
        p->shape[j] = dst->shape[i];
        p->dst_step[j] = ds;
        p->src_step[j] = ss;
        p->ndim++;
    }
    if (p->ndim == 0) { /* a single element */
        p->ndim = 1;
        p->shape[0] = 1;
        p->dst_step[0] = (int64_t)de;
        p->src_step[0] = (int64_t)se;
    }
    return true;
}

/* Calls visit(ctx, dst_row, src_row, n, dst_step, src_step) once per row of
 * the innermost merged dim, in row-major order. */
typedef void (*row_visit)(void *ctx, char *dst, const char *src, int64_t n, int64_t ds, int64_t ss);

static void for_each_row(const row_plan *p, char *dst, const char *src, row_visit visit, void *ctx) {
    int last = p->ndim - 1;
    int64_t index[KILN_MAX_DIMS] = {0};
    for (;;) {
        visit(ctx, dst, src, p->shape[last], p->dst_step[last], p->src_step[last]);
        int d = last - 1;
        for (; d >= 0; d--) {
            dst += p->dst_step[d];
            src += p->src_step[d];
            if (++index[d] < p->shape[d]) break;
            dst -= p->dst_step[d] * p->shape[d];
            src -= p->src_step[d] * p->shape[d];
            index[d] = 0;
        }
        if (d < 0) return;
    }
}

/* ---- copy_strided ----------------------------------------------------------------------------- */

/* A function pointer cannot travel as void *, so it rides in a struct. */
typedef struct copy_ctx {
    row_fn row;
} copy_ctx;

static void visit_copy(void *ctx, char *dst, const char *src, int64_t n, int64_t ds, int64_t ss) {
    ((const copy_ctx *)ctx)->row(dst, ds, src, ss, n);
}

static void visit_memcpy(void *ctx, char *dst, const char *src, int64_t n, int64_t ds, int64_t ss) {
    (void)ss;
    size_t es = *(const size_t *)ctx;
    if ((size_t)ds == es && (size_t)ss == es) {
        memcpy(dst, src, (size_t)n * es);
        return;
    }
    for (int64_t i = 0; i < n; i++) memcpy(dst + i * ds, src + i * ss, es);
}

/* One dense run between f32 and f16/bf16: base/half.c's bulk forms (F16C
 * when the CPU has it; the same bits as the scalar forms). False when the
 * layout or alignment does not allow it. */
static bool bulk_half_copy(const row_plan *p, const kiln_strided *dst, const kiln_strided *src) {
    kiln_dtype s = src->dtype, d = dst->dtype;
    size_t n = (size_t)p->shape[0];
    bool dense =
        p->ndim == 1 && p->dst_step[0] == (int64_t)elem_size[d] && p->src_step[0] == (int64_t)elem_size[s];
    bool aligned = (uintptr_t)dst->data % elem_size[d] == 0 && (uintptr_t)src->data % elem_size[s] == 0;
    if (!dense || !aligned) return false;
    if (s == KILN_F32 && d == KILN_F16)
        kiln_f32_to_f16_n(src->data, dst->data, n);
    else if (s == KILN_F16 && d == KILN_F32)
        kiln_f16_to_f32_n(src->data, dst->data, n);
    else if (s == KILN_F32 && d == KILN_BF16)
        kiln_f32_to_bf16_n(src->data, dst->data, n);
    else if (s == KILN_BF16 && d == KILN_F32)
        kiln_bf16_to_f32_n(src->data, dst->data, n);
    else
        return false;
    return true;
}

static kiln_status cpu_copy_strided(const kiln_strided *dst, const kiln_strided *src, void *stream) {
    (void)stream;
    row_plan p;
    if (!plan_rows(dst, src, &p)) return KILN_OK;
    if (bulk_half_copy(&p, dst, src)) return KILN_OK;
    if (dst->dtype == src->dtype) {
        size_t es = elem_size[dst->dtype];
        for_each_row(&p, dst->data, src->data, visit_memcpy, &es);
        return KILN_OK;
    }
    copy_ctx c = {copy_rows[src->dtype][dst->dtype]};
    for_each_row(&p, dst->data, src->data, visit_copy, &c);
    return KILN_OK;
}

/* ---- fill, arange, random ---------------------------------------------------------------- */

typedef struct fill_ctx {
    unsigned char pattern[8];
    size_t size;
} fill_ctx;

static void visit_fill(void *ctx, char *dst, const char *src, int64_t n, int64_t ds, int64_t ss) {
    (void)src, (void)ss;
    const fill_ctx *c = ctx;
    if (c->size == 1 && ds == 1) {
        memset(dst, c->pattern[0], (size_t)n);
        return;
    }
    for (int64_t i = 0; i < n; i++) memcpy(dst + i * ds, c->pattern, c->size);
}

static kiln_status cpu_fill(const kiln_strided *dst, double value, void *stream) {
    (void)stream;
    row_plan p;
    if (!plan_rows(dst, NULL, &p)) return KILN_OK;
    fill_ctx c = {.size = elem_size[dst->dtype]};
    store_flt[dst->dtype]((char *)c.pattern, value);
    for_each_row(&p, dst->data, NULL, visit_fill, &c);
    return KILN_OK;
}

static kiln_status cpu_arange(void *dst, kiln_dtype dtype, int64_t n, double start, double step,
                              void *stream) {
    (void)stream;
    char *d = dst;
    size_t es = elem_size[dtype];
    for (int64_t i = 0; i < n; i++) store_flt[dtype](d + (size_t)i * es, start + (double)i * step);
    return KILN_OK;
}

/* f16 and bf16 round a uniform just below 1 up to 1.0; the range is
 * [0, 1), so such values become the largest value below 1 instead. */
static void store_uniform(char *p, kiln_dtype dtype, float u) {
    if (dtype == KILN_F16) {
        uint16_t h = kiln_f32_to_f16(u);
        STORE(uint16_t, p, h == 0x3C00 ? (uint16_t)0x3BFF : h);
    } else if (dtype == KILN_BF16) {
        uint16_t b = kiln_f32_to_bf16(u);
        STORE(uint16_t, p, b == 0x3F80 ? (uint16_t)0x3F7F : b);
    } else {
        store_flt[dtype](p, u);
    }
}

/* Word i of the draw is word i % 4 of Philox block offset + i / 4: one
 * block per four elements. */
static kiln_status cpu_rand_uniform(void *dst, kiln_dtype dtype, int64_t n, kiln_rng rng, void *stream) {
    (void)stream;
    char *d = dst;
    size_t es = elem_size[dtype];
    for (int64_t base = 0; base < n; base += 4) {
        uint32_t w[4];
        kiln_philox_stream_block(rng.seed, rng.subsequence, rng.offset + (uint64_t)base / 4, w);
        for (int64_t j = 0; j < 4 && base + j < n; j++)
            store_uniform(d + (size_t)(base + j) * es, dtype, kiln_philox_uniform(w[j]));
    }
    return KILN_OK;
}

/* Element i uses words 2i and 2i+1: two elements per Philox block. */
static kiln_status cpu_rand_normal(void *dst, kiln_dtype dtype, int64_t n, kiln_rng rng, void *stream) {
    (void)stream;
    char *d = dst;
    size_t es = elem_size[dtype];
    for (int64_t base = 0; base < n; base += 2) {
        uint32_t w[4];
        kiln_philox_stream_block(rng.seed, rng.subsequence, rng.offset + (uint64_t)base / 2, w);
        store_flt[dtype](d + (size_t)base * es, kiln_philox_normal(w[0], w[1]));
        if (base + 1 < n) store_flt[dtype](d + (size_t)(base + 1) * es, kiln_philox_normal(w[2], w[3]));
    }
    return KILN_OK;
}

static const kiln_tensor_kernels cpu_tensor_kernels = {
    .copy_strided = cpu_copy_strided,
    .fill = cpu_fill,
    .arange = cpu_arange,
    .rand_uniform = cpu_rand_uniform,
    .rand_normal = cpu_rand_normal,
};

const kiln_tensor_kernels *kiln_cpu_tensor_kernels(void) { return &cpu_tensor_kernels; }

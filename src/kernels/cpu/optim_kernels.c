/* CPU fused optimizer updates (kernels/optim_kernels.h) for f32 and f64.
 * Each element follows the op-by-op path of src/optim/optimizer.c: the
 * elementwise CPU kernels compute in double and store in the tensor dtype,
 * so every step below is a double operation followed by R(), the rounding
 * to the dtype that storing a tensor does. Parallel over OpenMP threads
 * for large tensors (elements are independent, so the result does not
 * depend on the thread count). */
#include <math.h>

#include "base/error.h"
#include "kernels/cpu/fast/fast_kernels.h"
#include "kernels/optim_kernels.h"

#define OPTIM_PARALLEL_MIN 65536

/* A parallel loop over elements where the build has OpenMP. */
#ifdef _OPENMP
#define OPTIM_PARALLEL_FOR _Pragma("omp parallel for schedule(static) if (s->n >= OPTIM_PARALLEL_MIN)")
/* The same, or-ing each thread's `bad` into the loop's. */
#define OPTIM_PARALLEL_FOR_BAD                                                                               \
    _Pragma("omp parallel for schedule(static) reduction(|| : bad) if (s->n >= OPTIM_PARALLEL_MIN)")
#else
#define OPTIM_PARALLEL_FOR
#define OPTIM_PARALLEL_FOR_BAD
#endif

#define R32(x) ((double)(float)(x))
#define R64(x) (x)

/* ADAM_BODY(T, R): the update of element i; T the storage type. */
#define ADAM_BODY(T, R)                                                                                      \
    do {                                                                                                     \
        T *p = s->p, *m = s->m, *v = s->v, *vmax = s->vmax;                                                  \
        const T *gp = s->g;                                                                                  \
        const double w = 1.0 - s->beta1, inv_bc2 = 1.0 / s->bc2_sqrt, keep = 1.0 - s->lr * s->weight_decay;  \
        OPTIM_PARALLEL_FOR                                                                                   \
        for (int64_t i = 0; i < s->n; i++) {                                                                 \
            double g = gp[i], pi = p[i], mi = m[i], vi = v[i];                                               \
            if (s->maximize) g = -g;                                                                         \
            if (s->weight_decay != 0) {                                                                      \
                if (s->adamw)                                                                                \
                    pi = R(pi * keep);                                                                       \
                else                                                                                         \
                    g = R(g + R(pi * s->weight_decay));                                                      \
            }                                                                                                \
            double d = R(g - mi);                                                                            \
            mi = w < 0.5 ? R(mi + R(d * w)) : R(g - R(d * (1.0 - w)));                                       \
            vi = R(R(vi * s->beta2) + R(R(g * (1.0 - s->beta2)) * g));                                       \
            double second = vi;                                                                              \
            if (s->amsgrad) {                                                                                \
                double vm = vmax[i];                                                                         \
                second = vm > vi ? vm : vi;                                                                  \
                vmax[i] = (T)second;                                                                         \
            }                                                                                                \
            double denom = R(R(R(sqrt(second)) * inv_bc2) + s->eps);                                         \
            pi = R(pi + R(R(mi / denom) * -s->step_size));                                                   \
            p[i] = (T)pi, m[i] = (T)mi, v[i] = (T)vi;                                                        \
        }                                                                                                    \
    } while (0)

#define SGD_BODY(T, R)                                                                                       \
    do {                                                                                                     \
        T *p = s->p, *buf = s->buf;                                                                          \
        const T *gp = s->g;                                                                                  \
        OPTIM_PARALLEL_FOR                                                                                   \
        for (int64_t i = 0; i < s->n; i++) {                                                                 \
            double g = gp[i], pi = p[i];                                                                     \
            if (s->maximize) g = -g;                                                                         \
            if (s->weight_decay != 0) g = R(g + R(pi * s->weight_decay));                                    \
            if (buf) {                                                                                       \
                double b = s->first ? g : R(R((double)buf[i] * s->momentum) + R(g * (1.0 - s->dampening)));  \
                buf[i] = (T)b;                                                                               \
                g = s->nesterov ? R(g + R(b * s->momentum)) : b;                                             \
            }                                                                                                \
            p[i] = (T)R(pi + R(g * -s->lr));                                                                 \
        }                                                                                                    \
    } while (0)

/* The f32 Adam/AdamW update without amsgrad (the common case) as a
 * branch-free span: the same operations and roundings as ADAM_BODY, in the
 * same order, with the weight-decay mode a compile-time constant and the
 * lerp's two forms computed and selected, so the loop vectorises.
 * Bit-identical to ADAM_BODY(float, R32) element by element: an operation
 * whose operands are both floats (the differences, sums, the product
 * R32(g * omb2) * g, the square root and the division) is done in float,
 * because rounding the double result to float gives the float operation's
 * result exactly (double has 53 >= 2 * 24 + 2 bits: Figueroa, "When is
 * double rounding innocuous?", 1995); products with the double constants
 * (w, b2, inv_bc2, eps, the step) stay in double, then round. In float the
 * square root and the division take 8 lanes and a fraction of double's
 * latency: 1.15M parameters took 2.0-3.1 ms a step, 1.4 with them in float
 * (AMD EPYC Zen 3, 2 threads). */
typedef struct adam_consts {
    double w, one_minus_w, beta2, one_minus_beta2, inv_bc2, eps, neg_step, keep, wd;
    bool w_small;
} adam_consts;

#define F32(x) ((float)(x))
/* Three passes over blocks of ADAM_BLOCK elements (the block's moments
 * and denominators stay in L1 between them): the moments, the
 * denominators, then the parameters. In one pass each element was one
 * chain of about 20 dependent operations (the square root, the division
 * and six conversions to double and back among them), longer than the FP
 * scheduler holds two iterations of, so the loop ran at the chain's
 * latency: 1.15M parameters took 1.4-1.5 ms a step on 2 threads (AMD EPYC
 * Zen 3), 1.0-1.1 ms in three passes (two passes: 1.25; four: no better
 * than three). Each element sees the same operations in the same order:
 * the same bits. */
#define ADAM_BLOCK 512
#define ADAM_SPAN(NAME, WD_MODE)                                                                             \
    KILN_SIMD_CLONES static void NAME(float *restrict p, float *restrict m, float *restrict v,             \
                                      const float *restrict gp, int64_t n, const adam_consts *c) {          \
        const double w = c->w, omw = c->one_minus_w, b2 = c->beta2, omb2 = c->one_minus_beta2;            \
        const double inv_bc2 = c->inv_bc2, eps = c->eps, neg_step = c->neg_step, keep = c->keep, wd = c->wd; \
        const bool w_small = c->w_small;                                                                   \
        float den[ADAM_BLOCK];                                                                             \
        for (int64_t i0 = 0; i0 < n; i0 += ADAM_BLOCK) {                                                   \
            const int64_t len = n - i0 < ADAM_BLOCK ? n - i0 : ADAM_BLOCK;                                 \
            float *restrict pb = p + i0, *restrict mb = m + i0, *restrict vb = v + i0;                     \
            const float *restrict gb = gp + i0;                                                            \
            for (int64_t i = 0; i < len; i++) {                                                            \
                float g = gb[i], mi = mb[i], vi = vb[i];                                                   \
                if (WD_MODE == 2) g = g + F32((double)pb[i] * wd);                                         \
                float d = g - mi;                                                                          \
                float lo = mi + F32((double)d * w), hi = g - F32((double)d * omw);                         \
                mi = w_small ? lo : hi;                                                                    \
                vi = F32((double)vi * b2) + F32((double)g * omb2) * g;                                     \
                mb[i] = mi, vb[i] = vi;                                                                    \
            }                                                                                              \
            for (int64_t i = 0; i < len; i++)                                                              \
                den[i] = F32((double)F32((double)sqrtf(vb[i]) * inv_bc2) + eps);                           \
            for (int64_t i = 0; i < len; i++) {                                                            \
                float pi = pb[i];                                                                          \
                if (WD_MODE == 1) pi = F32((double)pi * keep);                                             \
                pb[i] = pi + F32((double)(mb[i] / den[i]) * neg_step);                                     \
            }                                                                                              \
        }                                                                                                  \
    }

ADAM_SPAN(adam_span_plain, 0)
ADAM_SPAN(adam_span_adamw, 1)
ADAM_SPAN(adam_span_l2, 2)

#define ADAM_CHUNK 16384

static void cpu_adam_f32_fast(const kiln_adam_step *s) {
    adam_consts c = {.w = 1.0 - s->beta1,
                     .one_minus_w = 1.0 - (1.0 - s->beta1),
                     .beta2 = s->beta2,
                     .one_minus_beta2 = 1.0 - s->beta2,
                     .inv_bc2 = 1.0 / s->bc2_sqrt,
                     .eps = s->eps,
                     .neg_step = -s->step_size,
                     .keep = 1.0 - s->lr * s->weight_decay,
                     .wd = s->weight_decay,
                     .w_small = 1.0 - s->beta1 < 0.5};
    int mode = s->weight_decay == 0 ? 0 : s->adamw ? 1 : 2;
    float *p = s->p, *m = s->m, *v = s->v;
    const float *g = s->g;
    const int64_t n = s->n, chunks = (n + ADAM_CHUNK - 1) / ADAM_CHUNK;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (n >= OPTIM_PARALLEL_MIN)
#endif
    for (int64_t k = 0; k < chunks; k++) {
        int64_t i0 = k * ADAM_CHUNK, len = n - i0 < ADAM_CHUNK ? n - i0 : ADAM_CHUNK;
        if (mode == 0) adam_span_plain(p + i0, m + i0, v + i0, g + i0, len, &c);
        else if (mode == 1) adam_span_adamw(p + i0, m + i0, v + i0, g + i0, len, &c);
        else adam_span_l2(p + i0, m + i0, v + i0, g + i0, len, &c);
    }
}

static kiln_status cpu_adam_one(const kiln_adam_step *s) {
    /* the span reads and writes through restrict pointers: distinct buffers only */
    if (s->dtype == KILN_F32 && !s->amsgrad && !s->maximize && s->p != s->g && s->m != s->g && s->v != s->g &&
        s->p != s->m && s->p != s->v && s->m != s->v) {
        cpu_adam_f32_fast(s);
        return KILN_OK;
    }
    if (s->dtype == KILN_F32)
        ADAM_BODY(float, R32);
    else if (s->dtype == KILN_F64)
        ADAM_BODY(double, R64);
    else
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, NULL, "fused Adam: dtype %s is not covered",
                          kiln_dtype_name(s->dtype));
    return KILN_OK;
}

static kiln_status cpu_sgd_one(const kiln_sgd_step *s) {
    if (s->dtype == KILN_F32)
        SGD_BODY(float, R32);
    else if (s->dtype == KILN_F64)
        SGD_BODY(double, R64);
    else
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, NULL, "fused SGD: dtype %s is not covered",
                          kiln_dtype_name(s->dtype));
    return KILN_OK;
}

/* The graph-safe inputs (optim_kernels.h) are host memory on the CPU. */
static kiln_status cpu_adam(const kiln_adam_step *s, int n, void *stream) {
    (void)stream;
    for (int k = 0; k < n; k++) {
        if (s[k].found_inf && *s[k].found_inf != 0.0f) continue;
        kiln_adam_step t = s[k];
        if (t.scalars) t.lr = t.scalars[0], t.step_size = t.scalars[1], t.bc2_sqrt = t.scalars[2];
        KILN_TRY(cpu_adam_one(&t));
    }
    return KILN_OK;
}

static kiln_status cpu_sgd(const kiln_sgd_step *s, int n, void *stream) {
    (void)stream;
    for (int k = 0; k < n; k++) {
        if (s[k].found_inf && *s[k].found_inf != 0.0f) continue;
        kiln_sgd_step t = s[k];
        if (t.lr_dev) t.lr = *t.lr_dev;
        KILN_TRY(cpu_sgd_one(&t));
    }
    return KILN_OK;
}

/* UNSCALE_BODY(T, R): s's gradient times *inv; bad is set by a result
 * that is not finite. */
#define UNSCALE_BODY(T, R)                                                                                   \
    do {                                                                                                     \
        T *g = s->g;                                                                                         \
        const double inv = (double)*s->inv;                                                                  \
        OPTIM_PARALLEL_FOR_BAD                                                                               \
        for (int64_t i = 0; i < s->n; i++) {                                                                 \
            double r = R((double)g[i] * inv);                                                                \
            g[i] = (T)r;                                                                                     \
            bad = bad || !isfinite(r);                                                                       \
        }                                                                                                    \
    } while (0)

static kiln_status cpu_unscale(const kiln_unscale_step *st, int n, void *stream) {
    (void)stream;
    for (int k = 0; k < n; k++) {
        const kiln_unscale_step *s = &st[k];
        bool bad = false;
        if (s->dtype == KILN_F32)
            UNSCALE_BODY(float, R32);
        else if (s->dtype == KILN_F64)
            UNSCALE_BODY(double, R64);
        else
            return KILN_RAISE(KILN_ERR_UNSUPPORTED, NULL, "fused unscale: dtype %s is not covered",
                              kiln_dtype_name(s->dtype));
        if (bad) *s->found = 1.0f;
    }
    return KILN_OK;
}

static const kiln_optim_kernels cpu_table = {
    .dtypes = (1u << KILN_F32) | (1u << KILN_F64),
    .adam = cpu_adam,
    .sgd = cpu_sgd,
    .unscale = cpu_unscale,
};

const kiln_optim_kernels *kiln_cpu_optim_kernels(void) { return &cpu_table; }

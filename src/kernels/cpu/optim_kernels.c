/* CPU fused optimizer updates (kernels/optim_kernels.h) for f32 and f64.
 * Each element follows the op-by-op path of src/optim/optimizer.c: the
 * elementwise CPU kernels compute in double and store in the tensor dtype,
 * so every step below is a double operation followed by R(), the rounding
 * to the dtype that storing a tensor does. Parallel over OpenMP threads
 * for large tensors (elements are independent, so the result does not
 * depend on the thread count). */
#include <math.h>

#include "base/error.h"
#include "kernels/optim_kernels.h"

#define OPTIM_PARALLEL_MIN 65536

/* A parallel loop over elements where the build has OpenMP. */
#ifdef _OPENMP
#define OPTIM_PARALLEL_FOR _Pragma("omp parallel for schedule(static) if (s->n >= OPTIM_PARALLEL_MIN)")
#else
#define OPTIM_PARALLEL_FOR
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

static kiln_status cpu_adam_one(const kiln_adam_step *s) {
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

static kiln_status cpu_adam(const kiln_adam_step *s, int n, void *stream) {
    (void)stream;
    for (int k = 0; k < n; k++) KILN_TRY(cpu_adam_one(&s[k]));
    return KILN_OK;
}

static kiln_status cpu_sgd(const kiln_sgd_step *s, int n, void *stream) {
    (void)stream;
    for (int k = 0; k < n; k++) KILN_TRY(cpu_sgd_one(&s[k]));
    return KILN_OK;
}

static const kiln_optim_kernels cpu_table = {
    .dtypes = (1u << KILN_F32) | (1u << KILN_F64),
    .adam = cpu_adam,
    .sgd = cpu_sgd,
};

const kiln_optim_kernels *kiln_cpu_optim_kernels(void) { return &cpu_table; }

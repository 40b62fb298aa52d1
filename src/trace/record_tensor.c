/* The recorders beside the dispatcher's: the tensor layer's own kernels
 * (fills, copies, arange, random draws: kiln_ones for backward's seed
 * gradient, kiln_zeros, kiln_to within a device) and the fused optimizer
 * launches, which run below or beside the dispatcher. Each records a step
 * and then runs the real kernel, so the traced call's results are the
 * eager ones. */
#include <string.h>

#include "base/error.h"
#include "kernels/kernels.h"
#include "kernels/optim_kernels.h"
#include "optim/optim_internal.h"
#include "trace/trace_internal.h"

/* The recording of this thread (one kiln_trace at a time per thread). */
static _Thread_local trace_recording *active;

static const kiln_tensor_kernels *real_table(kiln_device_type type) { return kiln_tensor_kernels_builtin(type); }

static kiln_status tensor_step(kiln_device_type type, int kind, void *stream, trace_step **s, int *idx) {
    trace_recording *r = active;
    kiln_device d = r->have_device ? r->p->device : (kiln_device){type, 0};
    if (d.type != type)
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "trace the part on each device separately",
                          "kiln_trace: the call does tensor-layer work on a second device type");
    if (type == KILN_DEVICE_CUDA && !r->have_device)
        return KILN_RAISE(
            KILN_ERR_UNSUPPORTED, "start the traced call with an op",
            "kiln_trace: the call's first kernel is tensor-layer work on a CUDA device, whose index "
            "the trace cannot know");
    KILN_TRY(kiln_trace_step_device(r, d, stream));
    KILN_TRY(kiln_trace_new_step(r, s, idx));
    (*s)->kind = kind;
    (*s)->op = KILN_OP_COUNT;
    return KILN_OK;
}

static kiln_status view_out(trace_step *s, int idx, const kiln_strided *dst) {
    s->args.n_out = 1;
    s->args.out[0] = *dst;
    return kiln_trace_classify(active, NULL, dst->data, idx, true, &s->out[0]);
}

#define DEFINE_RECORDERS(suffix, TYPE)                                                                       \
    static kiln_status fill_##suffix(const kiln_strided *dst, double value, void *stream) {                  \
        trace_step *s;                                                                                       \
        int idx;                                                                                             \
        KILN_TRY(tensor_step(TYPE, TRACE_STEP_FILL, stream, &s, &idx));                                      \
        s->attrs.scalar[0] = value;                                                                          \
        KILN_TRY(view_out(s, idx, dst));                                                                     \
        return real_table(TYPE)->fill(dst, value, stream);                                                   \
    }                                                                                                        \
    static kiln_status copy_##suffix(const kiln_strided *dst, const kiln_strided *src, void *stream) {       \
        trace_step *s;                                                                                       \
        int idx;                                                                                             \
        KILN_TRY(tensor_step(TYPE, TRACE_STEP_COPY, stream, &s, &idx));                                      \
        s->args.n_in = 1;                                                                                    \
        s->args.in[0] = *src;                                                                                \
        KILN_TRY(kiln_trace_classify(active, NULL, src->data, idx, false, &s->in[0]));                       \
        KILN_TRY(view_out(s, idx, dst));                                                                     \
        return real_table(TYPE)->copy_strided(dst, src, stream);                                             \
    }                                                                                                        \
    static kiln_status arange_##suffix(void *dst, kiln_dtype dtype, int64_t n, double start, double step,    \
                                       void *stream) {                                                       \
        trace_step *s;                                                                                       \
        int idx;                                                                                             \
        KILN_TRY(tensor_step(TYPE, TRACE_STEP_ARANGE, stream, &s, &idx));                                    \
        s->attrs.scalar[0] = start, s->attrs.scalar[1] = step, s->attrs.dtype = dtype, s->n = n;             \
        kiln_strided v = {.data = dst, .dtype = dtype, .ndim = 1, .shape = {n}, .strides = {1}};             \
        KILN_TRY(view_out(s, idx, &v));                                                                      \
        return real_table(TYPE)->arange(dst, dtype, n, start, step, stream);                                 \
    }                                                                                                        \
    static kiln_status rand_##suffix(void *dst, kiln_dtype dtype, int64_t n, kiln_rng rng, void *stream,     \
                                     bool normal) {                                                          \
        trace_step *s;                                                                                       \
        int idx;                                                                                             \
        KILN_TRY(tensor_step(TYPE, TRACE_STEP_RAND, stream, &s, &idx));                                      \
        s->attrs.flag = normal, s->attrs.dtype = dtype, s->n = n;                                            \
        KILN_TRY(kiln_trace_draw(active, active->p->device, rng, &s->draw));                                 \
        kiln_strided v = {.data = dst, .dtype = dtype, .ndim = 1, .shape = {n}, .strides = {1}};             \
        KILN_TRY(view_out(s, idx, &v));                                                                      \
        return normal ? real_table(TYPE)->rand_normal(dst, dtype, n, rng, stream)                            \
                      : real_table(TYPE)->rand_uniform(dst, dtype, n, rng, stream);                          \
    }                                                                                                        \
    static kiln_status uniform_##suffix(void *dst, kiln_dtype dtype, int64_t n, kiln_rng rng,                \
                                        void *stream) {                                                      \
        return rand_##suffix(dst, dtype, n, rng, stream, false);                                             \
    }                                                                                                        \
    static kiln_status normal_##suffix(void *dst, kiln_dtype dtype, int64_t n, kiln_rng rng, void *stream) { \
        return rand_##suffix(dst, dtype, n, rng, stream, true);                                              \
    }                                                                                                        \
    static const kiln_tensor_kernels recording_##suffix = {copy_##suffix, fill_##suffix, arange_##suffix,    \
                                                           uniform_##suffix, normal_##suffix};

DEFINE_RECORDERS(cpu, KILN_DEVICE_CPU)
#ifdef KILN_WITH_CUDA
DEFINE_RECORDERS(cuda, KILN_DEVICE_CUDA)
#endif

static const kiln_tensor_kernels *recording_table(kiln_device_type type) {
    switch (type) {
    case KILN_DEVICE_CPU:
        return &recording_cpu;
#ifdef KILN_WITH_CUDA
    case KILN_DEVICE_CUDA:
        return &recording_cuda;
#endif
    default:
        return NULL;
    }
}

static kiln_status record_optim(void *ctx, kiln_optimizer *o, const kiln_optim_kernels *k, bool adam,
                                const int *idx, kiln_tensor *const *grads, const kiln_adam_step *as,
                                const kiln_sgd_step *ss, int n, void *stream) {
    trace_recording *r = ctx;
    kiln_device d = kiln_get_device(o->params[idx[0]]);
    KILN_TRY(kiln_trace_step_device(r, d, stream));
    trace_step *s;
    int si;
    KILN_TRY(kiln_trace_new_step(r, &s, &si));
    s->kind = TRACE_STEP_OPTIM;
    s->op = KILN_OP_COUNT;
    trace_optim *t = KILN_CALLOC(1, sizeof *t);
    if (!t) return kiln_error_last()->status;
    s->optim = t;
    t->o = o, t->k = k, t->adam = adam, t->n = n;
    const float *found = kiln_optim_found_inf(&t->skipped);
    if (found) {
        t->has_found = true;
        KILN_TRY(kiln_trace_classify(r, NULL, found, si, false, &t->found));
    }
    t->as = adam ? KILN_CALLOC((size_t)n, sizeof *t->as) : NULL;
    t->ss = adam ? NULL : KILN_CALLOC((size_t)n, sizeof *t->ss);
    if (adam ? !t->as : !t->ss) return kiln_error_last()->status;
    for (int u = 0; u < n; u++) {
        int i = idx[u];
        t->idx[u] = i;
        kiln_tensor *p = o->params[i];
        if (adam) {
            t->as[u] = as[u];
            KILN_TRY(kiln_trace_classify(r, p, as[u].p, si, false, &t->ref[u][0]));
            KILN_TRY(kiln_trace_classify(r, grads[u], as[u].g, si, false, &t->ref[u][1]));
            KILN_TRY(kiln_trace_classify(r, o->state[0][i], as[u].m, si, false, &t->ref[u][2]));
            KILN_TRY(kiln_trace_classify(r, o->state[1][i], as[u].v, si, false, &t->ref[u][3]));
            if (as[u].vmax)
                KILN_TRY(kiln_trace_classify(r, o->state[2][i], as[u].vmax, si, false, &t->ref[u][4]));
        } else {
            t->ss[u] = ss[u];
            KILN_TRY(kiln_trace_classify(r, p, ss[u].p, si, false, &t->ref[u][0]));
            KILN_TRY(kiln_trace_classify(r, grads[u], ss[u].g, si, false, &t->ref[u][1]));
            if (ss[u].buf)
                KILN_TRY(kiln_trace_classify(r, o->state[0][i], ss[u].buf, si, false, &t->ref[u][2]));
            if (ss[u].first)
                return KILN_RAISE(
                    KILN_ERR_UNSUPPORTED, "run one eager step before kiln_trace",
                    "kiln_trace: SGD's first momentum step is traced; the replay would repeat it");
        }
        for (int j = 0; j < 5; j++)
            if (j != 1 && t->ref[u][j].kind == TRACE_REF_BUFFER)
                return KILN_RAISE(
                    KILN_ERR_UNSUPPORTED, "run one eager step before kiln_trace (a warm-up)",
                    "kiln_trace: the optimizer's state for parameter %d was created by the traced "
                    "call; a replay would start it again each step",
                    i);
    }
    return KILN_OK;
}

void kiln_trace_extra_recorders(trace_recording *r) {
    active = r;
    kiln_tensor_kernels_set_override(r ? recording_table : NULL);
    kiln_optim_set_recorder(r ? record_optim : NULL, r);
}

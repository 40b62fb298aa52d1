/* kiln_program_run: the recorded kernels called straight from the list.
 * Before anything runs, the guards: the inputs as traced, grad mode and
 * autocast as traced, every tensor used in place still on the storage and
 * block it had. Then each step's data pointers are patched (arena offset,
 * input or in-place tensor, plus the recorded offset) and its kernel
 * runs; a kernel with a prepared weight copy gets it from the storage's
 * cache, refilled only when the weight changed (an optimizer step). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/kernels.h"
#include "kernels/optim_kernels.h"
#include "kiln/amp.h"
#include "kiln/autograd.h"
#include "optim/optim_internal.h"
#include "runtime/backend.h"
#include "runtime/runtime_internal.h"
#include "tensor/tensor_internal.h"
#include "trace/trace_internal.h"

#define RETRACE "trace the call again (retrace) with the new setting"

static const char *op_name(kiln_op_id op) {
    const kiln_op_info *info = kiln_op_info_get(op);
    return info ? info->name : "reorder";
}

static kiln_status check_input(const kiln_program *p, int i, const kiln_tensor *t) {
    const trace_input_guard *g = &p->inputs[i];
    KILN_TRY(kiln_tensor_check(t, "kiln_program_run"));
    char a[96], b[96];
    if (t->ndim != g->ndim || memcmp(t->shape, g->shape, sizeof(int64_t) * (size_t)g->ndim))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, RETRACE,
                          "kiln_program_run: input %d has shape %s, traced with %s", i,
                          kiln_shape_format(t->ndim, t->shape, a, sizeof a),
                          kiln_shape_format(g->ndim, g->shape, b, sizeof b));
    if (t->dtype != g->dtype)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, RETRACE,
                          "kiln_program_run: input %d is %s, traced with %s", i, kiln_dtype_name(t->dtype),
                          kiln_dtype_name(g->dtype));
    if (!kiln_device_equal(t->storage->device, g->device))
        return KILN_RAISE(
            KILN_ERR_INVALID_ARGUMENT, RETRACE, "kiln_program_run: input %d is on %s, traced on %s", i,
            kiln_device_str(t->storage->device, a, sizeof a), kiln_device_str(g->device, b, sizeof b));
    if (memcmp(t->strides, g->strides, sizeof(int64_t) * (size_t)g->ndim) ||
        kiln_layout_of(t) != KILN_LAYOUT_STRIDED)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                          "pass a tensor laid out as the traced one (kiln_contiguous), or " RETRACE,
                          "kiln_program_run: input %d has strides %s, traced with %s", i,
                          kiln_shape_format(t->ndim, t->strides, a, sizeof a),
                          kiln_shape_format(g->ndim, g->strides, b, sizeof b));
    return KILN_OK;
}

static kiln_status check_externals(const kiln_program *p);

static kiln_status check_guards(const kiln_program *p, int n_inputs, kiln_tensor *const *inputs) {
    if (n_inputs != p->n_inputs || (n_inputs && !inputs))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass the inputs the call was traced with",
                          "kiln_program_run: %d inputs given, the program was traced with %d", n_inputs,
                          p->n_inputs);
    for (int i = 0; i < n_inputs; i++) KILN_TRY(check_input(p, i, inputs[i]));
    if (p->loaded) return check_externals(p);
    if (kiln_is_grad_enabled() != p->grad_enabled)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, RETRACE,
                          "kiln_program_run: grad mode is %s, traced with it %s",
                          p->grad_enabled ? "off" : "on", p->grad_enabled ? "on" : "off");
    bool ac = kiln_autocast_enabled(p->device.type);
    if (ac != p->autocast || (ac && kiln_autocast_dtype(p->device.type) != p->autocast_dtype))
        return KILN_RAISE(
            KILN_ERR_INVALID_ARGUMENT, RETRACE, "kiln_program_run: autocast is %s%s, traced with it %s%s",
            ac ? "on in " : "off", ac ? kiln_dtype_name(kiln_autocast_dtype(p->device.type)) : "",
            p->autocast ? "on in " : "off", p->autocast ? kiln_dtype_name(p->autocast_dtype) : "");
    return check_externals(p);
}

static kiln_status check_externals(const kiln_program *p) {
    for (int i = 0; i < p->n_ext; i++) {
        const trace_external *e = &p->ext[i];
        if (e->t->storage != e->storage || e->t->storage->base != e->base ||
            kiln_layout_of(e->t) != KILN_LAYOUT_STRIDED) {
            char s[96];
            return KILN_RAISE(
                KILN_ERR_INVALID_ARGUMENT, RETRACE,
                "kiln_program_run: the tensor %s first used by step %d (%s) has new storage since the "
                "trace (moved, reloaded by swapping, or converted): the program would use the old one",
                kiln_shape_format(e->t->ndim, e->t->shape, s, sizeof s), e->first_step,
                op_name(p->steps[e->first_step].op));
        }
    }
    return KILN_OK;
}

/* The first run: the arena (one allocation) and the output tensors. */
static kiln_status materialise(kiln_program *p) {
    p->base = KILN_CALLOC((size_t)p->n_buffers + 1, sizeof *p->base);
    p->outputs = KILN_CALLOC((size_t)p->n_outputs, sizeof *p->outputs);
    p->in_data = KILN_CALLOC((size_t)p->n_inputs + 1, sizeof *p->in_data);
    p->rng_now = KILN_CALLOC((size_t)p->n_draws + 1, sizeof *p->rng_now);
    if (!p->base || !p->outputs || !p->in_data || !p->rng_now) return kiln_error_last()->status;
    p->run_stream = p->stream;
    if (p->arena_bytes) KILN_TRY(kiln_memory_alloc(p->device, p->arena_bytes, NULL, &p->arena));
    for (int i = 0; i < p->n_outputs; i++) {
        p->outputs[i] =
            kiln_tensor_alloc("kiln_program_run", p->out_shape[i], p->out_dtype[i], p->device, false);
        if (!p->outputs[i]) return kiln_error_last()->status;
    }
    for (int i = 0; i < p->n_buffers; i++) {
        const trace_buffer *b = &p->buffers[i];
        p->base[i] = b->output >= 0 ? p->outputs[b->output]->storage->base : (char *)p->arena + b->offset;
    }
    return KILN_OK;
}

static inline void *resolve(const kiln_program *p, trace_ref r) {
    switch (r.kind) {
    case TRACE_REF_BUFFER:
        return (char *)p->base[r.index] + r.offset;
    case TRACE_REF_INPUT:
        return (char *)p->in_data[r.index] + r.offset;
    case TRACE_REF_EXTERNAL:
        return (char *)p->ext[r.index].t->storage->base + r.offset;
    default:
        return NULL;
    }
}

typedef struct fill_ctx {
    const kiln_op_kernel *k;
    const kiln_op_args *args;
} fill_ctx;

static kiln_status fill_prepared(void *ctx, void *dst) {
    const fill_ctx *f = ctx;
    return f->k->fill(f->args, dst);
}

int kiln_trace_layout_block(kiln_layout layout) {
    if (layout == KILN_LAYOUT_NCHW16C) return 16;
    if ((int)layout == (int)KILN_LAYOUT_NCHW16C + 1 && (int)layout < (int)KILN_LAYOUT_COUNT) return 8;
    return 0;
}

#define UNBLOCK(T)                                                                                           \
    do {                                                                                                     \
        const T *in = src; /* (N, C/block, H, W, block) */                                                   \
        T *out = dst;      /* (N, C, H, W) */                                                                \
        for (int64_t i = 0; i < n; i++)                                                                      \
            for (int64_t cb = 0; cb < c / block; cb++) {                                                     \
                const T *blk = in + (i * c + cb * block) * hw;                                               \
                for (int64_t k = 0; k < block; k++) {                                                        \
                    T *row = out + (i * c + cb * block + k) * hw;                                            \
                    for (int64_t x = 0; x < hw; x++) row[x] = blk[x * block + k];                            \
                }                                                                                            \
            }                                                                                                \
    } while (0)

void kiln_trace_unblock(void *dst, const void *src, size_t elem, const int64_t *shape, int block) {
    const int64_t n = shape[0], c = shape[1], hw = shape[2] * shape[3];
    switch (elem) {
    case 1:
        UNBLOCK(uint8_t);
        break;
    case 2:
        UNBLOCK(uint16_t);
        break;
    case 4:
        UNBLOCK(uint32_t);
        break;
    default:
        UNBLOCK(uint64_t);
        break;
    }
}

/* Update u of a fused optimizer launch as recorded, with this run's pointers. */
static void optim_args(const kiln_program *p, const trace_optim *t, int u, kiln_adam_step *as,
                       kiln_sgd_step *ss) {
    if (t->adam) {
        kiln_adam_step *a = &as[u];
        *a = t->as[u];
        a->p = resolve(p, t->ref[u][0]), a->g = resolve(p, t->ref[u][1]);
        a->m = resolve(p, t->ref[u][2]), a->v = resolve(p, t->ref[u][3]);
        a->vmax = a->vmax ? resolve(p, t->ref[u][4]) : NULL;
    } else {
        kiln_sgd_step *g = &ss[u];
        *g = t->ss[u];
        g->p = resolve(p, t->ref[u][0]), g->g = resolve(p, t->ref[u][1]);
        g->buf = g->buf ? resolve(p, t->ref[u][2]) : NULL;
    }
    if (t->has_found) {
        const float *f = resolve(p, t->found);
        if (t->adam)
            as[u].found_inf = f;
        else
            ss[u].found_inf = f;
    }
}

kiln_status kiln_trace_settle_found(kiln_program *p) {
    const kiln_backend *be = NULL;
    kiln_optimizer *counted[8];
    int n_counted = 0;
    for (int i = 0; i < p->n_steps; i++) {
        trace_optim *t = p->steps[i].optim;
        if (p->steps[i].kind != TRACE_STEP_OPTIM || !t || !t->has_found) continue;
        float v = 0;
        const void *f = resolve(p, t->found);
        if (p->device.type == KILN_DEVICE_CPU) {
            memcpy(&v, f, sizeof v);
        } else {
            if (!be && !(be = kiln_backend_for(p->device))) return kiln_error_last()->status;
            KILN_TRY(be->copy(KILN_COPY_D2H, p->device.index, p->device.index, &v, f, sizeof v, p->stream, false));
        }
        if (v == 0) continue;
        kiln_optim_unstep(t->o, t->idx, t->n);
        bool seen = false;
        for (int k = 0; k < n_counted; k++) seen = seen || counted[k] == t->o;
        if (!seen && t->skipped) (*t->skipped)++;
        if (!seen && n_counted < 8) counted[n_counted++] = t->o;
    }
    return KILN_OK;
}

/* A fused optimizer launch with this run's pointers, lr and step counts
 * (Adam's bias corrections computed as adam_update computes them). In a
 * CUDA graph's capture the kernel reads lr and the bias corrections from
 * the graph's parameter block (no step counted: capturing runs nothing);
 * its per-replay host pass counts the steps and writes the values there,
 * 3 words an Adam update ({lr, step_size, bc2_sqrt}), 1 an SGD one. */
static kiln_status run_optim(kiln_program *p, trace_optim *t) {
    kiln_optimizer *o = t->o;
    kiln_adam_step as[KILN_OPTIM_MULTI];
    kiln_sgd_step ss[KILN_OPTIM_MULTI];
    if (p->run_mode == TRACE_RUN_CAPTURE) {
        const double *block = (const double *)kiln_trace_graph_params(p) + t->word;
        for (int u = 0; u < t->n; u++) {
            optim_args(p, t, u, as, ss);
            if (t->adam)
                as[u].scalars = block + 3 * u;
            else
                ss[u].lr_dev = block + u;
        }
        return t->adam ? t->k->adam(as, t->n, p->run_stream) : t->k->sgd(ss, t->n, p->run_stream);
    }
    double *host = p->run_mode == TRACE_RUN_HOST ? kiln_trace_graph_host_params(p) + t->word : NULL;
    for (int u = 0; u < t->n; u++) {
        int i = t->idx[u];
        int64_t step = ++o->steps[i];
        double *v = host ? host + (t->adam ? 3 * u : u) : NULL;
        if (t->adam) {
            const kiln_adam_step *r = &t->as[u];
            double bc1 = 1.0 - pow(r->beta1, (double)step), bc2 = 1.0 - pow(r->beta2, (double)step);
            if (v) {
                v[0] = o->lr, v[1] = o->lr / bc1, v[2] = sqrt(bc2);
            } else {
                optim_args(p, t, u, as, ss);
                as[u].lr = o->lr, as[u].step_size = o->lr / bc1, as[u].bc2_sqrt = sqrt(bc2);
            }
        } else if (v) {
            v[0] = o->lr;
        } else {
            optim_args(p, t, u, as, ss);
            ss[u].lr = o->lr;
        }
        kiln_tensor_bump_version(o->params[i]);
        for (int k = 0; k < KILN_OPTIM_STATES; k++)
            if (o->state[k][i]) kiln_tensor_bump_version(o->state[k][i]);
    }
    if (host) return KILN_OK;
    return t->adam ? t->k->adam(as, t->n, p->stream) : t->k->sgd(ss, t->n, p->stream);
}

static kiln_status run_tensor_step(kiln_program *p, trace_step *s) {
    const kiln_tensor_kernels *k = kiln_tensor_kernels_for(p->device.type);
    kiln_op_args *a = &s->args;
    a->out[0].data = resolve(p, s->out[0]);
    switch (s->kind) {
    case TRACE_STEP_FILL:
        return k->fill(&a->out[0], s->attrs.scalar[0], p->run_stream);
    case TRACE_STEP_COPY:
        a->in[0].data = resolve(p, s->in[0]);
        return k->copy_strided(&a->out[0], &a->in[0], p->run_stream);
    case TRACE_STEP_ARANGE:
        return k->arange(a->out[0].data, s->attrs.dtype, s->n, s->attrs.scalar[0], s->attrs.scalar[1],
                         p->run_stream);
    default: {
        kiln_rng rng = p->rng_now[s->draw];
        return s->attrs.flag ? k->rand_normal(a->out[0].data, s->attrs.dtype, s->n, rng, p->stream)
                             : k->rand_uniform(a->out[0].data, s->attrs.dtype, s->n, rng, p->stream);
    }
    }
}

kiln_status kiln_trace_run_step(kiln_program *p, trace_step *s) {
    kiln_op_args *a = &s->args;
    if (p->run_mode == TRACE_RUN_HOST) return s->kind == TRACE_STEP_OPTIM ? run_optim(p, s->optim) : KILN_OK;
    switch (s->kind) {
    case TRACE_STEP_KERNEL:
        break;
    case TRACE_STEP_REORDER:
        kiln_trace_unblock(resolve(p, s->out[0]), resolve(p, s->in[0]), s->elem, s->shape, s->block);
        return KILN_OK;
    case TRACE_STEP_OPTIM:
        return run_optim(p, s->optim);
    default:
        return run_tensor_step(p, s);
    }
    if (s->draw >= 0) s->attrs.rng = p->rng_now[s->draw];
    /* capturing: the draw's position is the graph's per-replay input */
    s->attrs.rng_dev =
        s->draw >= 0 && p->run_mode == TRACE_RUN_CAPTURE ? kiln_trace_graph_draw(p, s->draw) : NULL;
    for (int i = 0; i < a->n_in; i++)
        if (a->in[i].ndim >= 0) a->in[i].data = resolve(p, s->in[i]);
    for (int i = 0; i < a->n_out; i++) a->out[i].data = resolve(p, s->out[i]);
    if (a->workspace_bytes) a->workspace = resolve(p, s->ws);
    if (s->prep_external >= 0) {
        fill_ctx f = {s->k, a};
        void *copy = NULL;
        KILN_TRY(kiln_tensor_prepared(p->ext[s->prep_external].t, s->prep_key, s->prep_bytes, s->prep_lazy,
                                      fill_prepared, &f, &copy));
        a->prepared = copy;
    }
    void *recorded = a->stream;
    if (p->run_mode == TRACE_RUN_CAPTURE) a->stream = p->run_stream;
    kiln_status st = s->k->run(a);
    a->stream = recorded;
    s->attrs.rng_dev = NULL;
    return st;
}

kiln_status kiln_program_run(kiln_program *p, int n_inputs, kiln_tensor *const *inputs, int n_outputs,
                             kiln_tensor **outputs) {
    if (!p) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_program_run: program is NULL");
    if (n_outputs != p->n_outputs || !outputs)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass room for the traced call's outputs",
                          "kiln_program_run: %d outputs asked for, the program has %d", n_outputs,
                          p->n_outputs);
    KILN_TRY(check_guards(p, n_inputs, inputs));
    if (!p->base) KILN_TRY(materialise(p));
    if (p->device.type == KILN_DEVICE_CUDA) {
        KILN_TRY(kiln_trace_graph_run(p, inputs));
        KILN_TRY(kiln_trace_settle_found(p));
        for (int i = 0; i < n_outputs; i++) outputs[i] = kiln_retain(p->outputs[i]);
        return KILN_OK;
    }
    for (int i = 0; i < n_inputs; i++)
        p->in_data[i] =
            (char *)inputs[i]->storage->base + inputs[i]->offset * (int64_t)kiln_dtype_size(inputs[i]->dtype);
    /* Fresh numbers each run: the draws take the generator's position now,
     * in the order the eager call reserved them. */
    for (int i = 0; i < p->n_draws; i++)
        p->rng_now[i] = kiln_device_rng_reserve(p->device, p->draws[i].words);
    for (int i = 0; i < p->n_steps; i++) {
        kiln_status st = kiln_trace_run_step(p, &p->steps[i]);
        if (st) return st;
    }
    KILN_TRY(kiln_trace_settle_found(p));
    for (int i = 0; i < n_outputs; i++) outputs[i] = kiln_retain(p->outputs[i]);
    return KILN_OK;
}

kiln_status kiln_program_stats_get(const kiln_program *p, kiln_program_stats *out) {
    if (!p || !out)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_program_stats_get: NULL argument");
    *out = (kiln_program_stats){.n_steps = p->n_steps,
                                .n_buffers = p->n_buffers,
                                .n_external = p->n_ext,
                                .arena_bytes = p->arena_bytes,
                                .unplanned_bytes = kiln_trace_unplanned_bytes(p)};
    return KILN_OK;
}

kiln_status kiln_program_input_info(const kiln_program *p, int i, kiln_shape *shape, kiln_dtype *dtype) {
    if (!p || i < 0 || i >= p->n_inputs)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_program_input_info: no input %d", i);
    if (shape) {
        shape->ndim = p->inputs[i].ndim;
        memcpy(shape->d, p->inputs[i].shape, sizeof(int64_t) * (size_t)shape->ndim);
    }
    if (dtype) *dtype = p->inputs[i].dtype;
    return KILN_OK;
}

static const char *ref_kind(int k) {
    static const char *names[] = {"-", "arena", "input", "tensor"};
    return k >= 0 && k < 4 ? names[k] : "?";
}

void kiln_program_print(const kiln_program *p, FILE *f) {
    if (!p || !f) return;
    for (int i = 0; i < p->n_steps; i++) {
        const trace_step *s = &p->steps[i];
        static const char *kinds[] = {"", "reorder", "fill", "copy", "arange", "random", "optimizer"};
        fprintf(f, "step %d: %s%s", i, s->kind == TRACE_STEP_KERNEL ? op_name(s->op) : kinds[s->kind],
                s->fast ? " (fast)" : "");
        if (s->kind == TRACE_STEP_OPTIM) {
            fprintf(f, " %s x%d\n", s->optim->adam ? "adam" : "sgd", s->optim->n);
            continue;
        }
        int n_in = s->kind == TRACE_STEP_REORDER ? 1 : s->args.n_in,
            n_out = s->kind == TRACE_STEP_REORDER ? 1 : s->args.n_out;
        for (int j = 0; j < n_in; j++) {
            if (s->kind == TRACE_STEP_KERNEL && s->args.in[j].ndim < 0) continue;
            char sh[96];
            fprintf(f, " in%d=%s%s", j, ref_kind(s->in[j].kind),
                    s->kind == TRACE_STEP_KERNEL
                        ? kiln_shape_format(s->args.in[j].ndim, s->args.in[j].shape, sh, sizeof sh)
                        : "");
        }
        for (int j = 0; j < n_out; j++) fprintf(f, " out%d=%s", j, ref_kind(s->out[j].kind));
        if (s->args.workspace_bytes) fprintf(f, " ws=%zu", s->args.workspace_bytes);
        if (s->prep_external >= 0) fprintf(f, " prepared(in%d)", s->prep_input);
        fputc('\n', f);
    }
}

void kiln_program_free(kiln_program *p) {
    if (!p) return;
    kiln_trace_graph_free(p);
    if (p->arena) kiln_memory_free(p->device, p->arena);
    for (int i = 0; p->outputs && i < p->n_outputs; i++)
        if (p->outputs[i]) kiln_tensor_drop(p->outputs[i]);
    for (int i = 0; i < p->n_ext; i++) {
        if (p->ext[i].t) kiln_tensor_drop(p->ext[i].t);
        free(p->ext[i].name);
    }
    for (int i = 0; i < p->n_steps; i++)
        if (p->steps[i].optim) {
            free(p->steps[i].optim->as), free(p->steps[i].optim->ss);
            free(p->steps[i].optim);
        }
    free(p->draws), free(p->rng_now);
    free(p->steps), free(p->buffers), free(p->ext), free(p->inputs), free(p->outputs);
    free(p->out_shape), free(p->out_dtype), free(p->base), free(p->in_data);
    free(p);
}

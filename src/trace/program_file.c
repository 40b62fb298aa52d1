/* Saved inference programs: one safetensors file holding the tensors the
 * program uses in place (weights, running statistics, constants), named
 * as the model's state dict names them, and the program's description,
 * a JSON document in the header's __metadata__ under "kiln.program"
 * (docs/trace.md: format and version). Doubles are written as C99 hex
 * floats ("%a") so that every bit, inf and nan included, comes back. */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/error.h"
#include "io/safetensors_internal.h"
#include "kiln/io.h"
#include "kiln/nn.h"
#include "tensor/tensor_internal.h"
#include "trace/trace_internal.h"

static cJSON *ints(const int64_t *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)v[i]));
    return a;
}

static cJSON *hexf(double v) {
    char buf[64];
    snprintf(buf, sizeof buf, "%a", v);
    return cJSON_CreateString(buf);
}

static cJSON *ref_json(trace_ref r) {
    int64_t v[3] = {r.kind, r.index, r.offset};
    return ints(v, 3);
}

static cJSON *view_json(const kiln_strided *v, trace_ref r) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "r", ref_json(r));
    cJSON_AddStringToObject(o, "t", kiln_dtype_name(v->dtype));
    cJSON_AddItemToObject(o, "s", ints(v->shape, v->ndim));
    cJSON_AddItemToObject(o, "st", ints(v->strides, v->ndim));
    cJSON_AddNumberToObject(o, "l", v->layout);
    return o;
}

static cJSON *attrs_json(const kiln_op_attrs *a) {
    cJSON *o = cJSON_CreateObject();
    cJSON *sc = cJSON_CreateArray();
    for (int i = 0; i < 3; i++) cJSON_AddItemToArray(sc, hexf(a->scalar[i]));
    cJSON_AddItemToObject(o, "scalar", sc);
    cJSON_AddNumberToObject(o, "flag", a->flag);
    int64_t dims[KILN_MAX_DIMS];
    for (int i = 0; i < a->n_dims && i < KILN_MAX_DIMS; i++) dims[i] = a->dims[i];
    cJSON_AddItemToObject(o, "dims", ints(dims, a->n_dims));
    cJSON_AddBoolToObject(o, "keepdim", a->keepdim);
    cJSON_AddItemToObject(o, "ints", ints(a->ints, a->n_ints));
    cJSON_AddItemToObject(o, "kernel", ints(a->kernel, 2));
    cJSON_AddItemToObject(o, "stride", ints(a->stride, 2));
    cJSON_AddItemToObject(o, "padding", ints(a->padding, 2));
    cJSON_AddItemToObject(o, "dilation", ints(a->dilation, 2));
    cJSON_AddNumberToObject(o, "groups", (double)a->groups);
    cJSON_AddBoolToObject(o, "ceil_mode", a->ceil_mode);
    cJSON_AddBoolToObject(o, "count_include_pad", a->count_include_pad);
    cJSON_AddNumberToObject(o, "reduction", a->reduction);
    cJSON_AddNumberToObject(o, "ignore_index", (double)a->ignore_index);
    cJSON_AddItemToObject(o, "label_smoothing", hexf(a->label_smoothing));
    cJSON_AddBoolToObject(o, "training", a->training);
    cJSON_AddItemToObject(o, "momentum", hexf(a->momentum));
    cJSON_AddItemToObject(o, "eps", hexf(a->eps));
    cJSON_AddStringToObject(o, "dtype", kiln_dtype_name(a->dtype));
    return o;
}

static cJSON *step_json(const trace_step *s) {
    static const char *kinds[] = {"kernel", "reorder", "fill", "copy", "arange", "rand"};
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "k", kinds[s->kind]);
    const kiln_op_args *a = &s->args;
    switch (s->kind) {
    case TRACE_STEP_KERNEL: {
        cJSON_AddStringToObject(o, "op", kiln_op_info_get(s->op)->name);
        cJSON_AddBoolToObject(o, "fast", s->fast);
        cJSON_AddItemToObject(o, "attrs", attrs_json(&s->attrs));
        cJSON *in = cJSON_AddArrayToObject(o, "in"), *meta = cJSON_AddArrayToObject(o, "in_meta");
        for (int i = 0; i < a->n_in; i++) {
            cJSON_AddItemToArray(in, a->in[i].ndim < 0 ? cJSON_CreateNull() : view_json(&a->in[i], s->in[i]));
            if (s->in_ndim[i] < 0) {
                cJSON_AddItemToArray(meta, cJSON_CreateNull());
                continue;
            }
            cJSON *m = cJSON_CreateArray();
            cJSON_AddItemToArray(m, cJSON_CreateString(kiln_dtype_name(s->in_dtype[i])));
            cJSON_AddItemToArray(m, ints(s->in_shape[i], s->in_ndim[i]));
            cJSON_AddItemToArray(meta, m);
        }
        cJSON *out = cJSON_AddArrayToObject(o, "out");
        for (int i = 0; i < a->n_out; i++) cJSON_AddItemToArray(out, view_json(&a->out[i], s->out[i]));
        cJSON_AddNumberToObject(o, "ws_bytes", (double)a->workspace_bytes);
        if (a->workspace_bytes) cJSON_AddItemToObject(o, "ws", ref_json(s->ws));
        cJSON_AddBoolToObject(o, "prepared", s->prep_external >= 0);
        cJSON_AddNumberToObject(o, "draw", s->draw);
        break;
    }
    case TRACE_STEP_REORDER:
        cJSON_AddItemToObject(o, "in", ref_json(s->in[0]));
        cJSON_AddItemToObject(o, "out", ref_json(s->out[0]));
        cJSON_AddNumberToObject(o, "elem", (double)s->elem);
        cJSON_AddNumberToObject(o, "block", s->block);
        cJSON_AddItemToObject(o, "shape", ints(s->shape, 4));
        break;
    case TRACE_STEP_COPY:
        cJSON_AddItemToObject(o, "in", view_json(&a->in[0], s->in[0])); /* fall through */
    default:
        cJSON_AddItemToObject(o, "out", view_json(&a->out[0], s->out[0]));
        cJSON_AddItemToObject(o, "value", hexf(s->attrs.scalar[0]));
        cJSON_AddItemToObject(o, "step", hexf(s->attrs.scalar[1]));
        cJSON_AddStringToObject(o, "t", kiln_dtype_name(s->attrs.dtype));
        cJSON_AddNumberToObject(o, "n", (double)s->n);
        cJSON_AddNumberToObject(o, "normal", s->attrs.flag);
        cJSON_AddNumberToObject(o, "draw", s->draw);
        break;
    }
    return o;
}

static cJSON *program_json(const kiln_program *p, char **names) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "format", KILN_PROGRAM_FORMAT);
    cJSON_AddNumberToObject(o, "version", KILN_PROGRAM_VERSION);
    cJSON_AddStringToObject(o, "device", "cpu");
    cJSON_AddNumberToObject(o, "arena_bytes", (double)p->arena_bytes);
    cJSON *in = cJSON_AddArrayToObject(o, "inputs");
    for (int i = 0; i < p->n_inputs; i++) {
        cJSON *g = cJSON_CreateObject();
        cJSON_AddStringToObject(g, "dtype", kiln_dtype_name(p->inputs[i].dtype));
        cJSON_AddItemToObject(g, "shape", ints(p->inputs[i].shape, p->inputs[i].ndim));
        cJSON_AddItemToObject(g, "strides", ints(p->inputs[i].strides, p->inputs[i].ndim));
        cJSON_AddItemToArray(in, g);
    }
    cJSON *out = cJSON_AddArrayToObject(o, "outputs");
    for (int i = 0; i < p->n_outputs; i++) {
        cJSON *g = cJSON_CreateObject();
        cJSON_AddStringToObject(g, "dtype", kiln_dtype_name(p->out_dtype[i]));
        cJSON_AddItemToObject(g, "shape", ints(p->out_shape[i].d, p->out_shape[i].ndim));
        cJSON_AddItemToArray(out, g);
    }
    cJSON *bufs = cJSON_AddArrayToObject(o, "buffers");
    for (int i = 0; i < p->n_buffers; i++) {
        int64_t v[3] = {(int64_t)p->buffers[i].bytes, (int64_t)p->buffers[i].offset, p->buffers[i].output};
        cJSON_AddItemToArray(bufs, ints(v, 3));
    }
    cJSON *ext = cJSON_AddArrayToObject(o, "externals");
    for (int i = 0; i < p->n_ext; i++) {
        const kiln_tensor *t = p->ext[i].t;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", names[i]);
        cJSON_AddStringToObject(e, "dtype", kiln_dtype_name(t->dtype));
        cJSON_AddItemToObject(e, "shape", ints(t->shape, t->ndim));
        cJSON_AddItemToArray(ext, e);
    }
    cJSON *draws = cJSON_AddArrayToObject(o, "draws");
    for (int i = 0; i < p->n_draws; i++)
        cJSON_AddItemToArray(draws, cJSON_CreateNumber((double)p->draws[i].words));
    cJSON *steps = cJSON_AddArrayToObject(o, "steps");
    for (int i = 0; i < p->n_steps; i++) cJSON_AddItemToArray(steps, step_json(&p->steps[i]));
    return o;
}

/* Each tensor used in place: named from m's state dict when it is there,
 * else "const.N"; whole, contiguous storages only. */
static kiln_status name_externals(const kiln_program *p, kiln_module *m, char **names) {
    kiln_named_tensor *sd = NULL;
    int n_sd = 0;
    if (m) KILN_TRY(kiln_module_state_dict(m, &sd, &n_sd));
    kiln_status st = KILN_OK;
    for (int i = 0; i < p->n_ext && !st; i++) {
        const kiln_tensor *t = p->ext[i].t;
        if (t->offset || !kiln_is_contiguous(t) || kiln_layout_of(t) != KILN_LAYOUT_STRIDED ||
            (size_t)kiln_numel(t) * kiln_dtype_size(t->dtype) != t->storage->nbytes) {
            st = KILN_RAISE(KILN_ERR_UNSUPPORTED, "trace with whole, contiguous weights",
                            "kiln_program_save: tensor %d used in place is a view of a larger storage", i);
            break;
        }
        char buf[64];
        const char *name = NULL;
        for (int j = 0; j < n_sd && !name; j++)
            if (sd[j].tensor->storage == t->storage) name = sd[j].name;
        if (!name) snprintf(buf, sizeof buf, "const.%d", i), name = buf;
        names[i] = strdup(name);
        if (!names[i]) st = KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "kiln_program_save: out of host memory");
    }
    free(sd);
    return st;
}

kiln_status kiln_program_save(const kiln_program *p, const char *path, kiln_module *names_from) {
    if (!p || !path) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_program_save: NULL argument");
    if (p->device.type != KILN_DEVICE_CPU)
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "trace the model on the CPU to save it",
                          "kiln_program_save: only CPU programs are saved (this one runs on another device)");
    for (int i = 0; i < p->n_steps; i++)
        if (p->steps[i].kind == TRACE_STEP_OPTIM || p->steps[i].kind == TRACE_STEP_RAND ||
            p->steps[i].draw >= 0)
            return KILN_RAISE(
                KILN_ERR_UNSUPPORTED, "trace an inference forward (eval mode) to save it",
                "kiln_program_save: step %d is an optimizer update or a random draw; saved programs "
                "are inference programs",
                i);
    char **names = KILN_CALLOC((size_t)p->n_ext + 1, sizeof *names);
    kiln_named_tensor *items = KILN_CALLOC((size_t)p->n_ext + 1, sizeof *items);
    kiln_status st = names && items ? name_externals(p, names_from, names) : kiln_error_last()->status;
    cJSON *doc = st ? NULL : program_json(p, names);
    char *text = doc ? cJSON_PrintUnformatted(doc) : NULL;
    if (!st && !text) st = KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "kiln_program_save: out of host memory");
    if (!st) {
        for (int i = 0; i < p->n_ext; i++)
            items[i] = (kiln_named_tensor){.name = names[i], .tensor = p->ext[i].t};
        const char *meta[2] = {"kiln.program", text};
        st = kiln_st_write(path, items, p->n_ext, meta, 1);
    }
    cJSON_free(text);
    cJSON_Delete(doc);
    for (int i = 0; names && i < p->n_ext; i++) free(names[i]);
    free(names), free(items);
    return st;
}

kiln_status kiln_program_load(const char *path, kiln_program **out) {
    if (!path || !out) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_program_load: NULL argument");
    *out = NULL;
    kiln_safetensors *f = NULL;
    KILN_TRY(kiln_safetensors_open(path, &f));
    const char *text = kiln_safetensors_metadata(f, "kiln.program");
    kiln_program *p = NULL;
    kiln_status st = text
                         ? kiln_program_parse(path, text, strlen(text), &p)
                         : KILN_RAISE(KILN_ERR_IO, "write it with kiln export --traced",
                                      "%s: not a Kiln program (no kiln.program entry in its metadata)", path);
    for (int i = 0; !st && i < p->n_ext; i++) {
        trace_external *e = &p->ext[i];
        kiln_dtype dt;
        kiln_shape shape;
        st = kiln_safetensors_tensor_info(f, e->name, &dt, &shape);
        if (!st && (dt != e->dtype || shape.ndim != e->shape.ndim ||
                    memcmp(shape.d, e->shape.d, sizeof(int64_t) * (size_t)shape.ndim)))
            st = KILN_RAISE(KILN_ERR_IO, "export the program again",
                            "%s: tensor '%s' is %s of another shape than "
                            "the program uses",
                            path, e->name, kiln_dtype_name(dt));
        if (!st) {
            e->t = kiln_safetensors_get(f, e->name, (kiln_device){KILN_DEVICE_CPU, 0});
            if (!e->t) st = kiln_error_last()->status;
        }
        if (!st) e->storage = e->t->storage, e->base = e->t->storage->base;
    }
    kiln_safetensors_close(f);
    if (st) {
        kiln_program_free(p);
        return st;
    }
    *out = p;
    return KILN_OK;
}

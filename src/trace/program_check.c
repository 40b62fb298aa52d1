/* Reading a saved program's description (docs/trace.md) and validating
 * all of it before anything runs: the description is untrusted input.
 *
 * Every number is bounded before use. Every view's extent (the furthest
 * byte its shape and strides reach) must lie inside what its reference
 * names: an arena buffer, a program input (never written), or a tensor
 * from the file. Each kernel step is re-derived in this build: the op's
 * shape inference run on meta tensors of the recorded input shapes must
 * give the recorded outputs, the kernel the dispatcher would pick for the
 * recorded views must be the recorded kind (fast or reference) and take
 * the recorded layouts, and its workspace must be the recorded size. So a
 * kernel only ever sees the arguments it would see eagerly, on memory
 * that exists. */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/checked.h"
#include "base/error.h"
#include "diag/json.h"
#include "tensor/tensor_internal.h"
#include "trace/trace_internal.h"

#define FIX       "export the program again with kiln export --traced"
#define MAX_BYTES (INT64_C(1) << 40)
#define MAX_COUNT (1 << 20)

/* Elements of a shape whose dims are each at most 2^31 (checked on read),
 * saturating at INT64_MAX. */
static int64_t shape_numel(kiln_shape s) {
    int64_t n = 1;
    for (int i = 0; i < s.ndim; i++)
        if (!kiln_checked_mul_i64(n, s.d[i], &n)) return INT64_MAX;
    return n;
}

typedef struct parser {
    const char *file;
    kiln_program *p;
    int step; /* the step being read, for errors; -1: none */
} parser;

static kiln_status bad(const parser *ps, const char *what) {
    if (ps->step >= 0)
        return KILN_RAISE(KILN_ERR_IO, FIX, "%s: bad Kiln program: step %d: %s", ps->file, ps->step, what);
    return KILN_RAISE(KILN_ERR_IO, FIX, "%s: bad Kiln program: %s", ps->file, what);
}

/* An integer-valued number in [lo, hi]. */
static bool get_int(const cJSON *v, int64_t lo, int64_t hi, int64_t *out) {
    double d;
    if (!kiln_json_number(v, &d) || d < (double)lo || d > (double)hi || d != (double)(int64_t)d) return false;
    *out = (int64_t)d;
    return true;
}

static bool int_array(const cJSON *a, int max, int64_t lo, int64_t hi, int64_t *out, int *n) {
    if (!cJSON_IsArray(a)) return false;
    int k = cJSON_GetArraySize(a);
    if (k > max) return false;
    const cJSON *v;
    int i = 0;
    cJSON_ArrayForEach(v, a) if (!get_int(v, lo, hi, &out[i++])) return false;
    *n = k;
    return true;
}

static bool get_dtype(const cJSON *v, kiln_dtype *out) {
    const char *s = kiln_json_string(v, NULL);
    return s && kiln_dtype_parse(s, out) == KILN_OK;
}

/* A C99 hex float ("%a"), inf and nan included. */
static bool get_double(const cJSON *v, double *out) {
    const char *s = kiln_json_string(v, NULL);
    if (!s || !*s || strlen(s) > 40) return false;
    char *end;
    *out = strtod(s, &end);
    return *end == '\0';
}

static bool get_bool(const cJSON *v, bool *out) {
    if (!cJSON_IsBool(v)) return false;
    *out = cJSON_IsTrue(v);
    return true;
}

static kiln_status parse_ref(const parser *ps, const cJSON *a, trace_ref *r) {
    int64_t v[3];
    int n;
    if (!int_array(a, 3, 0, MAX_BYTES, v, &n) || n != 3 || v[0] > TRACE_REF_EXTERNAL || v[1] > MAX_COUNT)
        return bad(ps, "a reference is not [kind 0..3, index, offset]");
    *r = (trace_ref){.kind = (int32_t)v[0], .index = (int32_t)v[1], .offset = v[2]};
    return KILN_OK;
}

/* The bytes a view reaches from its data pointer (0 for no elements). */
static bool view_extent(const kiln_strided *v, int64_t *bytes) {
    int64_t last = 0;
    for (int i = 0; i < v->ndim; i++) {
        if (v->shape[i] == 0) {
            *bytes = 0;
            return true;
        }
        int64_t d;
        if (!kiln_checked_mul_i64(v->shape[i] - 1, v->strides[i], &d) ||
            !kiln_checked_add_i64(last, d, &last))
            return false;
    }
    return kiln_checked_mul_i64(last + 1, (int64_t)kiln_dtype_size(v->dtype), bytes);
}

static int64_t input_extent(const trace_input_guard *g) {
    kiln_strided v = {.dtype = g->dtype, .ndim = g->ndim};
    memcpy(v.shape, g->shape, sizeof v.shape);
    memcpy(v.strides, g->strides, sizeof v.strides);
    int64_t e = -1;
    return view_extent(&v, &e) ? e : -1;
}

/* That [offset, offset + extent) lies inside what r names. */
static kiln_status check_ref(const parser *ps, trace_ref r, int64_t extent, bool write) {
    const kiln_program *p = ps->p;
    int64_t size = -1;
    switch (r.kind) {
    case TRACE_REF_NONE:
        return extent == 0 ? KILN_OK : bad(ps, "a view with elements has no memory");
    case TRACE_REF_BUFFER:
        if (r.index < p->n_buffers) size = (int64_t)p->buffers[r.index].bytes;
        break;
    case TRACE_REF_INPUT:
        if (write) return bad(ps, "a step writes a program input");
        if (r.index < p->n_inputs) size = input_extent(&p->inputs[r.index]);
        break;
    default:
        if (r.index < p->n_ext)
            size = shape_numel(p->ext[r.index].shape) *
                   (int64_t)kiln_dtype_size(p->ext[r.index].dtype); /* bounded on read */
        break;
    }
    if (size < 0) return bad(ps, "a reference names a buffer, input or tensor that does not exist");
    if (extent > size || r.offset > size - extent) return bad(ps, "a view reaches past the memory it names");
    return KILN_OK;
}

static kiln_status parse_view(const parser *ps, const cJSON *o, kiln_strided *v, trace_ref *r) {
    memset(v, 0, sizeof *v);
    int n_st = 0;
    int64_t layout;
    if (!cJSON_IsObject(o) || !get_dtype(kiln_json_get(o, "t"), &v->dtype) ||
        !int_array(kiln_json_get(o, "s"), KILN_MAX_DIMS, 0, INT64_C(1) << 31, v->shape, &v->ndim) ||
        !int_array(kiln_json_get(o, "st"), KILN_MAX_DIMS, 0, INT64_C(1) << 40, v->strides, &n_st) ||
        n_st != v->ndim || !get_int(kiln_json_get(o, "l"), 0, KILN_LAYOUT_COUNT - 1, &layout))
        return bad(ps, "a view is not {r, t, s, st, l} with a dtype, a shape, its strides and a layout");
    v->layout = (kiln_layout)layout;
    int block = kiln_trace_layout_block(v->layout);
    if (v->layout != KILN_LAYOUT_STRIDED && (!block || v->ndim != 4 || v->shape[1] % block))
        return bad(ps, "a blocked view that is not 4-D with channels a multiple of its block");
    return parse_ref(ps, kiln_json_get(o, "r"), r);
}

static kiln_status parse_attrs(const parser *ps, const cJSON *o, kiln_op_attrs *a) {
    memset(a, 0, sizeof *a);
    const cJSON *sc = kiln_json_get(o, "scalar");
    int64_t dims[KILN_MAX_DIMS] = {0}, flag = 0, groups = 0, red = 0, ign = 0, two[2] = {0, 0};
    int n = 0, k = 0;
    bool ok = cJSON_IsObject(o) && cJSON_GetArraySize(sc) == 3;
    for (int i = 0; ok && i < 3; i++) ok = get_double(kiln_json_at(sc, i), &a->scalar[i]);
    ok =
        ok && get_int(kiln_json_get(o, "flag"), INT32_MIN, INT32_MAX, &flag) &&
        int_array(kiln_json_get(o, "dims"), KILN_MAX_DIMS, -KILN_MAX_DIMS, KILN_MAX_DIMS, dims, &a->n_dims) &&
        get_bool(kiln_json_get(o, "keepdim"), &a->keepdim) &&
        int_array(kiln_json_get(o, "ints"), KILN_MAX_DIMS * 2, -(INT64_C(1) << 40), INT64_C(1) << 40, a->ints,
                  &a->n_ints);
    static const char *pairs[] = {"kernel", "stride", "padding", "dilation"};
    int64_t *dst[] = {a->kernel, a->stride, a->padding, a->dilation};
    for (int i = 0; ok && i < 4; i++) {
        ok = int_array(kiln_json_get(o, pairs[i]), 2, 0, INT64_C(1) << 30, two, &k) && k == 2;
        if (ok) dst[i][0] = two[0], dst[i][1] = two[1];
    }
    ok = ok && get_int(kiln_json_get(o, "groups"), 0, INT64_C(1) << 30, &groups) &&
         get_bool(kiln_json_get(o, "ceil_mode"), &a->ceil_mode) &&
         get_bool(kiln_json_get(o, "count_include_pad"), &a->count_include_pad) &&
         get_int(kiln_json_get(o, "reduction"), 0, KILN_REDUCTION_SUM, &red) &&
         get_int(kiln_json_get(o, "ignore_index"), -(INT64_C(1) << 53), INT64_C(1) << 53, &ign) &&
         get_double(kiln_json_get(o, "label_smoothing"), &a->label_smoothing) &&
         get_bool(kiln_json_get(o, "training"), &a->training) &&
         get_double(kiln_json_get(o, "momentum"), &a->momentum) &&
         get_double(kiln_json_get(o, "eps"), &a->eps) && get_dtype(kiln_json_get(o, "dtype"), &a->dtype);
    if (!ok) return bad(ps, "the op's attributes are missing or out of range");
    (void)n;
    for (int i = 0; i < a->n_dims; i++) a->dims[i] = (int)dims[i];
    a->flag = (int)flag, a->groups = groups, a->reduction = (kiln_reduction)red, a->ignore_index = ign;
    return KILN_OK;
}

static int op_by_name(const char *name) {
    for (int i = 0; name && i < KILN_OP_COUNT; i++) {
        const kiln_op_info *info = kiln_op_info_get((kiln_op_id)i);
        if (info && !strcmp(info->name, name)) return i;
    }
    return -1;
}

/* The op's shape inference on meta tensors of the recorded input shapes
 * must give the recorded outputs, and ask for no cast. */
static kiln_status check_inference(const parser *ps, trace_step *s, const kiln_op_info *info) {
    kiln_tensor *in[KILN_OP_MAX_IN] = {NULL};
    kiln_meta meta[KILN_OP_MAX_OUT];
    kiln_dtype want[KILN_OP_MAX_IN];
    memset(meta, 0, sizeof meta);
    kiln_status st = KILN_OK;
    kiln_device meta_dev = {KILN_DEVICE_META, 0};
    for (int i = 0; i < s->args.n_in && !st; i++) {
        if (s->in_ndim[i] < 0) continue;
        kiln_shape sh = {.ndim = s->in_ndim[i]};
        memcpy(sh.d, s->in_shape[i], sizeof(int64_t) * (size_t)sh.ndim);
        in[i] = kiln_empty(sh, s->in_dtype[i], meta_dev);
        if (!in[i]) st = kiln_error_last()->status;
        want[i] = s->in_dtype[i];
    }
    char fn[64];
    snprintf(fn, sizeof fn, "kiln_%s", info->name);
    if (!st && !info->infer) st = bad(ps, "the op has no shape inference in this build");
    if (!st && info->infer(fn, &s->attrs, s->args.n_in, in, meta, want)) st = bad(ps, kiln_error_message());
    for (int i = 0; i < s->args.n_in && !st; i++)
        if (in[i] && want[i] != s->in_dtype[i]) st = bad(ps, "an input has a dtype the op would cast");
    for (int i = 0; i < s->args.n_out && !st; i++) {
        const kiln_strided *o = &s->args.out[i];
        if (o->dtype != meta[i].dtype || o->ndim != meta[i].ndim ||
            memcmp(o->shape, meta[i].shape, sizeof(int64_t) * (size_t)o->ndim))
            st = bad(ps, "an output's shape or dtype is not what the op's inference gives");
    }
    for (int i = 0; i < s->args.n_in && !st; i++) {
        const kiln_strided *v = &s->args.in[i];
        if ((v->ndim < 0) != (s->in_ndim[i] < 0) || (v->ndim >= 0 && v->dtype != s->in_dtype[i])) {
            st = bad(ps, "an input view does not match the input it stands for");
            break;
        }
        if (v->ndim < 0) continue;
        bool bcast = (info->flags & OPF_BROADCAST) && v->layout == KILN_LAYOUT_STRIDED;
        int nd = s->in_ndim[i], lead = v->ndim - nd;
        if (!bcast && (v->ndim != nd || memcmp(v->shape, s->in_shape[i], sizeof(int64_t) * (size_t)nd)))
            st = bad(ps, "an input view's shape is not the input's");
        if (bcast && (lead < 0 || v->ndim != meta[0].ndim ||
                      memcmp(v->shape, meta[0].shape, sizeof(int64_t) * (size_t)v->ndim)))
            st = bad(ps, "a broadcast input view does not have the output's shape");
        for (int d = 0; bcast && !st && d < v->ndim; d++)
            if ((d < lead || s->in_shape[i][d - lead] != v->shape[d]) && v->strides[d] != 0)
                st = bad(ps, "a broadcast dimension's stride is not 0");
    }
    for (int i = 0; i < s->args.n_in; i++) kiln_release(in[i]);
    return st;
}

/* The kernel this build picks for the views must be the recorded kind and
 * take the recorded layouts; its workspace and prepared copy are derived. */
static kiln_status check_kernel(const parser *ps, trace_step *s, bool fast) {
    kiln_op_args *a = &s->args;
    a->attrs = &s->attrs;
    kiln_dtype dt = a->n_out ? a->out[0].dtype : KILN_F32;
    bool got_fast = false;
    const kiln_op_kernel *k = kiln_ops_select_kernel(KILN_DEVICE_CPU, s->op, dt, a, &got_fast);
    if (!k || !k->run || !(k->dtypes & KILN_DT(dt)) || got_fast != fast)
        return bad(ps,
                   fast ? "this build has not the fast kernel the program was traced with (a build without "
                          "oneDNN, or other CPU kernels)"
                        : "this build picks another kernel for the step than the one recorded");
    bool opaque = false;
    for (int i = 0; i < a->n_in; i++) opaque |= a->in[i].ndim >= 0 && a->in[i].layout != KILN_LAYOUT_STRIDED;
    kiln_layout lay[KILN_OP_MAX_OUT] = {KILN_LAYOUT_STRIDED};
    if (opaque && !k->layout) return bad(ps, "a kernel without opaque layouts is given one");
    kiln_op_args probe = *a;
    for (int i = 0; i < a->n_out; i++) {
        probe.out[i].layout = KILN_LAYOUT_STRIDED;
        kiln_contiguous_strides(probe.out[i].ndim, probe.out[i].shape, probe.out[i].strides);
    }
    if (k->layout) k->layout(&probe, lay);
    for (int i = 0; i < a->n_out; i++)
        if (lay[i] != a->out[i].layout) return bad(ps, "an output's layout is not the one its kernel picks");
    size_t ws = k->workspace ? k->workspace(a) : 0;
    if (ws != a->workspace_bytes) return bad(ps, "the kernel's workspace is not the recorded size");
    if (ws) KILN_TRY(check_ref(ps, s->ws, (int64_t)ws, true));
    if (ws && s->ws.kind != TRACE_REF_BUFFER) return bad(ps, "a workspace outside the arena");
    s->k = k, s->fast = fast;
    return KILN_OK;
}

static kiln_status parse_prepared(const parser *ps, trace_step *s, bool recorded) {
    kiln_op_prepare pr = {.input = -1};
    if (s->k->prepare && s->k->fill) s->k->prepare(&s->args, &pr);
    bool has = pr.input >= 0 && pr.bytes > 0;
    if (has != recorded) return bad(ps, "the kernel's prepared weight copy is not as recorded");
    if (!has) return KILN_OK;
    if (pr.input >= s->args.n_in || s->in[pr.input].kind != TRACE_REF_EXTERNAL ||
        pr.bytes > (size_t)MAX_BYTES)
        return bad(ps, "a prepared copy of a tensor that is not from the file");
    s->prep_external = s->in[pr.input].index, s->prep_input = pr.input;
    s->prep_key = pr.key, s->prep_bytes = pr.bytes, s->prep_lazy = pr.lazy;
    return KILN_OK;
}

static kiln_status parse_kernel_step(parser *ps, const cJSON *o, trace_step *s) {
    int op = op_by_name(kiln_json_string(kiln_json_get(o, "op"), NULL));
    if (op < 0) return bad(ps, "unknown op (a newer Kiln wrote it?)");
    const kiln_op_info *info = kiln_op_info_get((kiln_op_id)op);
    s->op = (kiln_op_id)op;
    const cJSON *in = kiln_json_get(o, "in"), *meta = kiln_json_get(o, "in_meta"),
                *out = kiln_json_get(o, "out");
    int n_in = cJSON_GetArraySize(in), n_out = cJSON_GetArraySize(out);
    bool variadic = info->flags & OPF_VARIADIC;
    if (!cJSON_IsArray(in) || !cJSON_IsArray(meta) || !cJSON_IsArray(out) ||
        cJSON_GetArraySize(meta) != n_in || (variadic ? n_in < 1 || n_in > info->n_in : n_in != info->n_in) ||
        n_out != info->n_out || n_in > KILN_OP_MAX_IN || n_out > KILN_OP_MAX_OUT)
        return bad(ps, "the op's inputs and outputs are not as many as it takes");
    bool fast = false, prepared = false;
    int64_t ws_bytes, draw;
    if (!get_bool(kiln_json_get(o, "fast"), &fast) || !get_bool(kiln_json_get(o, "prepared"), &prepared) ||
        !get_int(kiln_json_get(o, "ws_bytes"), 0, MAX_BYTES, &ws_bytes) ||
        !get_int(kiln_json_get(o, "draw"), -1, -1, &draw))
        return bad(
            ps, "fast, prepared, ws_bytes or draw is missing or out of range (saved programs draw nothing)");
    KILN_TRY(parse_attrs(ps, kiln_json_get(o, "attrs"), &s->attrs));
    s->args.n_in = n_in, s->args.n_out = n_out, s->args.workspace_bytes = (size_t)ws_bytes;
    for (int i = 0; i < n_in; i++) {
        const cJSON *v = kiln_json_at(in, i), *m = kiln_json_at(meta, i);
        s->in_ndim[i] = -1;
        s->args.in[i].ndim = -1;
        if (cJSON_IsNull(v) != cJSON_IsNull(m))
            return bad(ps, "an input is present in one list, absent in the other");
        if (cJSON_IsNull(v)) {
            if (variadic || !(i >= 1 && i <= 4 && (info->flags & OPF_OPTIONAL(i))))
                return bad(ps, "a required input is absent");
            continue;
        }
        int nd = 0;
        if (cJSON_GetArraySize(m) != 2 || !get_dtype(kiln_json_at(m, 0), &s->in_dtype[i]) ||
            !int_array(kiln_json_at(m, 1), KILN_MAX_DIMS, 0, INT64_C(1) << 31, s->in_shape[i], &nd))
            return bad(ps, "an input's [dtype, shape] is malformed");
        s->in_ndim[i] = nd;
        KILN_TRY(parse_view(ps, v, &s->args.in[i], &s->in[i]));
    }
    for (int i = 0; i < n_out; i++)
        KILN_TRY(parse_view(ps, kiln_json_at(out, i), &s->args.out[i], &s->out[i]));
    if (ws_bytes) KILN_TRY(parse_ref(ps, kiln_json_get(o, "ws"), &s->ws));
    KILN_TRY(check_inference(ps, s, info));
    for (int i = 0; i < n_in; i++) {
        int64_t e;
        if (s->args.in[i].ndim < 0) continue;
        if (!view_extent(&s->args.in[i], &e)) return bad(ps, "a view's extent overflows");
        KILN_TRY(check_ref(ps, s->in[i], e, false));
    }
    for (int i = 0; i < n_out; i++) {
        int64_t e;
        if (!view_extent(&s->args.out[i], &e)) return bad(ps, "a view's extent overflows");
        KILN_TRY(check_ref(ps, s->out[i], e, true));
    }
    KILN_TRY(check_kernel(ps, s, fast));
    return parse_prepared(ps, s, prepared);
}

static kiln_status parse_tensor_step(parser *ps, const cJSON *o, trace_step *s, const char *kind) {
    int64_t e, n, normal, draw;
    if (!strcmp(kind, "reorder")) {
        int64_t elem, block, shape[4];
        int nd = 0;
        s->kind = TRACE_STEP_REORDER;
        KILN_TRY(parse_ref(ps, kiln_json_get(o, "in"), &s->in[0]));
        KILN_TRY(parse_ref(ps, kiln_json_get(o, "out"), &s->out[0]));
        if (!get_int(kiln_json_get(o, "elem"), 1, 8, &elem) || (elem & (elem - 1)) ||
            !get_int(kiln_json_get(o, "block"), 8, 16, &block) || (block != 8 && block != 16) ||
            !int_array(kiln_json_get(o, "shape"), 4, 1, INT64_C(1) << 31, shape, &nd) || nd != 4 ||
            shape[1] % block || s->in[0].kind != TRACE_REF_BUFFER || s->out[0].kind != TRACE_REF_BUFFER)
            return bad(ps, "a layout conversion that is not (N, C, H, W) of 1, 2, 4 or 8-byte elements, "
                           "blocks of 8 or 16 channels "
                           "dividing C, buffer to buffer");
        s->elem = (size_t)elem;
        s->block = (int)block;
        memcpy(s->shape, shape, sizeof s->shape);
        int64_t bytes = elem;
        for (int i = 0; i < 4; i++)
            if (!kiln_checked_mul_i64(bytes, shape[i], &bytes))
                return bad(ps, "a conversion's size overflows");
        KILN_TRY(check_ref(ps, s->in[0], bytes, false));
        return check_ref(ps, s->out[0], bytes, true);
    }
    s->kind = !strcmp(kind, "fill")     ? TRACE_STEP_FILL
              : !strcmp(kind, "copy")   ? TRACE_STEP_COPY
              : !strcmp(kind, "arange") ? TRACE_STEP_ARANGE
                                        : -1;
    if (s->kind < 0)
        return bad(ps, "unknown step kind (saved programs hold kernel, reorder, fill, copy, arange)");
    KILN_TRY(parse_view(ps, kiln_json_get(o, "out"), &s->args.out[0], &s->out[0]));
    s->args.n_out = 1;
    if (s->args.out[0].layout != KILN_LAYOUT_STRIDED)
        return bad(ps, "a tensor-layer step on an opaque layout");
    if (!get_double(kiln_json_get(o, "value"), &s->attrs.scalar[0]) ||
        !get_double(kiln_json_get(o, "step"), &s->attrs.scalar[1]) ||
        !get_dtype(kiln_json_get(o, "t"), &s->attrs.dtype) ||
        !get_int(kiln_json_get(o, "n"), 0, INT64_C(1) << 40, &n) ||
        !get_int(kiln_json_get(o, "normal"), 0, 1, &normal) ||
        !get_int(kiln_json_get(o, "draw"), -1, -1, &draw))
        return bad(ps, "a tensor-layer step's value, step, t, n, normal or draw is missing or out of range");
    s->n = n;
    if (s->kind == TRACE_STEP_ARANGE) {
        const kiln_strided *v = &s->args.out[0];
        if (v->ndim != 1 || v->shape[0] != n || v->strides[0] != 1 || v->dtype != s->attrs.dtype)
            return bad(ps, "an arange whose view is not n contiguous elements of its dtype");
    }
    if (s->kind == TRACE_STEP_COPY) {
        KILN_TRY(parse_view(ps, kiln_json_get(o, "in"), &s->args.in[0], &s->in[0]));
        s->args.n_in = 1;
        const kiln_strided *a = &s->args.in[0], *b = &s->args.out[0];
        if (a->layout != KILN_LAYOUT_STRIDED || a->ndim != b->ndim ||
            memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim))
            return bad(ps, "a copy between views of two shapes");
        if (!view_extent(a, &e)) return bad(ps, "a view's extent overflows");
        KILN_TRY(check_ref(ps, s->in[0], e, false));
    }
    if (!view_extent(&s->args.out[0], &e)) return bad(ps, "a view's extent overflows");
    return check_ref(ps, s->out[0], e, true);
}

static kiln_status parse_header(parser *ps, const cJSON *root) {
    kiln_program *p = ps->p;
    int64_t version, arena;
    const cJSON *in = kiln_json_get(root, "inputs"), *out = kiln_json_get(root, "outputs");
    const char *format = kiln_json_string(kiln_json_get(root, "format"), NULL);
    if (!format || strcmp(format, KILN_PROGRAM_FORMAT)) return bad(ps, "format is not \"kiln.program\"");
    if (!get_int(kiln_json_get(root, "version"), 1, 1 << 20, &version) || version != KILN_PROGRAM_VERSION)
        return KILN_RAISE(KILN_ERR_IO,
                          "export it again with this Kiln, or run it with the Kiln that wrote it",
                          "%s: Kiln program version %lld; this Kiln reads version %d", ps->file,
                          (long long)kiln_json_int(kiln_json_get(root, "version"), -1), KILN_PROGRAM_VERSION);
    const char *dev = kiln_json_string(kiln_json_get(root, "device"), NULL);
    if (!dev || strcmp(dev, "cpu")) return bad(ps, "device is not \"cpu\"");
    if (!get_int(kiln_json_get(root, "arena_bytes"), 0, MAX_BYTES, &arena))
        return bad(ps, "arena_bytes out of range");
    p->arena_bytes = (size_t)arena;
    int ni = cJSON_GetArraySize(in), no = cJSON_GetArraySize(out);
    if (!cJSON_IsArray(in) || !cJSON_IsArray(out) || ni < 0 || ni > 64 || no < 1 || no > 64)
        return bad(ps, "inputs must be 0..64 and outputs 1..64");
    p->n_inputs = ni, p->n_outputs = no;
    p->inputs = KILN_CALLOC((size_t)ni + 1, sizeof *p->inputs);
    p->out_shape = KILN_CALLOC((size_t)no, sizeof *p->out_shape);
    p->out_dtype = KILN_CALLOC((size_t)no, sizeof *p->out_dtype);
    if (!p->inputs || !p->out_shape || !p->out_dtype) return kiln_error_last()->status;
    for (int i = 0; i < ni; i++) {
        const cJSON *g = kiln_json_at(in, i);
        trace_input_guard *t = &p->inputs[i];
        int ns = 0;
        t->device = (kiln_device){KILN_DEVICE_CPU, 0};
        if (!get_dtype(kiln_json_get(g, "dtype"), &t->dtype) ||
            !int_array(kiln_json_get(g, "shape"), KILN_MAX_DIMS, 0, INT64_C(1) << 31, t->shape, &t->ndim) ||
            !int_array(kiln_json_get(g, "strides"), KILN_MAX_DIMS, 0, INT64_C(1) << 40, t->strides, &ns) ||
            ns != t->ndim || input_extent(t) < 0)
            return bad(ps, "an input is not {dtype, shape, strides}");
    }
    for (int i = 0; i < no; i++) {
        const cJSON *g = kiln_json_at(out, i);
        int nd = 0;
        if (!get_dtype(kiln_json_get(g, "dtype"), &p->out_dtype[i]) ||
            !int_array(kiln_json_get(g, "shape"), KILN_MAX_DIMS, 0, INT64_C(1) << 31, p->out_shape[i].d, &nd))
            return bad(ps, "an output is not {dtype, shape}");
        p->out_shape[i].ndim = nd;
    }
    return KILN_OK;
}

static kiln_status parse_buffers(parser *ps, const cJSON *bufs) {
    kiln_program *p = ps->p;
    int n = cJSON_GetArraySize(bufs);
    if (!cJSON_IsArray(bufs) || n > MAX_COUNT)
        return bad(ps, "buffers is not a list of [bytes, offset, output]");
    p->buffers = KILN_CALLOC((size_t)n + 1, sizeof *p->buffers);
    if (!p->buffers) return kiln_error_last()->status;
    p->n_buffers = n;
    bool seen[64] = {false};
    const cJSON *b;
    int i = 0;
    cJSON_ArrayForEach(b, bufs) {
        int64_t v[3];
        int k = 0;
        if (!int_array(b, 3, -1, MAX_BYTES, v, &k) || k != 3 || v[0] < 0 || v[1] < 0 || v[2] >= p->n_outputs)
            return bad(ps, "a buffer is not [bytes, offset, output]");
        trace_buffer *t = &p->buffers[i++];
        *t = (trace_buffer){.bytes = (size_t)v[0], .offset = (size_t)v[1], .output = (int)v[2]};
        if (t->output >= 0) {
            int64_t want;
            if (!kiln_checked_mul_i64(shape_numel(p->out_shape[t->output]),
                                      (int64_t)kiln_dtype_size(p->out_dtype[t->output]), &want))
                want = -1;
            if (seen[t->output] || want != v[0])
                return bad(ps, "an output buffer repeats or is not its output's size");
            seen[t->output] = true;
        } else if (t->offset % 512 || t->bytes > p->arena_bytes || t->offset > p->arena_bytes - t->bytes) {
            return bad(ps, "a buffer lies outside the arena or off its alignment");
        }
    }
    for (int o = 0; o < p->n_outputs; o++)
        if (!seen[o]) return bad(ps, "an output has no buffer");
    return KILN_OK;
}

static kiln_status parse_externals(parser *ps, const cJSON *ext) {
    kiln_program *p = ps->p;
    int n = cJSON_GetArraySize(ext);
    if (!cJSON_IsArray(ext) || n > 65536) return bad(ps, "externals is not a list");
    p->ext = KILN_CALLOC((size_t)n + 1, sizeof *p->ext);
    if (!p->ext) return kiln_error_last()->status;
    const cJSON *e;
    cJSON_ArrayForEach(e, ext) {
        trace_external *t = &p->ext[p->n_ext];
        const char *name = kiln_json_string(kiln_json_get(e, "name"), NULL);
        int nd = 0;
        if (!name || !*name || strlen(name) > 1024 || !get_dtype(kiln_json_get(e, "dtype"), &t->dtype) ||
            !int_array(kiln_json_get(e, "shape"), KILN_MAX_DIMS, 0, INT64_C(1) << 31, t->shape.d, &nd))
            return bad(ps, "an external is not {name, dtype, shape}");
        t->shape.ndim = nd;
        if (shape_numel(t->shape) > (INT64_C(1) << 36)) return bad(ps, "an external is too large");
        for (int j = 0; j < p->n_ext; j++)
            if (!strcmp(p->ext[j].name, name)) return bad(ps, "two externals have one name");
        t->name = strdup(name);
        if (!t->name)
            return KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "kiln_program_load: out of host memory");
        p->n_ext++;
    }
    return KILN_OK;
}

static kiln_status parse_steps(parser *ps, const cJSON *steps) {
    kiln_program *p = ps->p;
    int n = cJSON_GetArraySize(steps);
    if (!cJSON_IsArray(steps) || n < 1 || n > MAX_COUNT) return bad(ps, "steps is not a list of 1 or more");
    p->steps = KILN_CALLOC((size_t)n, sizeof *p->steps);
    if (!p->steps) return kiln_error_last()->status;
    const cJSON *o;
    cJSON_ArrayForEach(o, steps) {
        ps->step = p->n_steps;
        trace_step *s = &p->steps[p->n_steps++];
        s->prep_external = -1, s->draw = -1;
        const char *kind = kiln_json_string(kiln_json_get(o, "k"), NULL);
        if (!cJSON_IsObject(o) || !kind) return bad(ps, "a step is not an object with a kind");
        if (!strcmp(kind, "kernel")) {
            s->kind = TRACE_STEP_KERNEL;
            KILN_TRY(parse_kernel_step(ps, o, s));
        } else {
            s->op = KILN_OP_COUNT;
            KILN_TRY(parse_tensor_step(ps, o, s, kind));
        }
        for (int i = 0; i < KILN_OP_MAX_IN; i++)
            if (s->in[i].kind == TRACE_REF_EXTERNAL && !p->ext[s->in[i].index].first_step)
                p->ext[s->in[i].index].first_step = ps->step;
    }
    ps->step = -1;
    return KILN_OK;
}

kiln_status kiln_program_parse(const char *file, const char *text, size_t len, kiln_program **out) {
    *out = NULL;
    char err[128];
    cJSON *root = kiln_json_parse(text, len, err, sizeof err);
    if (!root) return KILN_RAISE(KILN_ERR_IO, FIX, "%s: bad Kiln program: %s", file, err);
    kiln_program *p = KILN_CALLOC(1, sizeof *p);
    if (!p) {
        cJSON_Delete(root);
        return kiln_error_last()->status;
    }
    parser ps = {.file = file, .p = p, .step = -1};
    p->loaded = true;
    p->device = (kiln_device){KILN_DEVICE_CPU, 0};
    kiln_status st = cJSON_IsObject(root) ? parse_header(&ps, root) : bad(&ps, "not a JSON object");
    if (!st) st = parse_buffers(&ps, kiln_json_get(root, "buffers"));
    if (!st) st = parse_externals(&ps, kiln_json_get(root, "externals"));
    if (!st && cJSON_GetArraySize(kiln_json_get(root, "draws")) != 0)
        st = bad(&ps, "a saved program draws nothing");
    if (!st) st = parse_steps(&ps, kiln_json_get(root, "steps"));
    if (!st) st = kiln_tensor_kernel_stream(p->device, &p->stream);
    cJSON_Delete(root);
    if (st) {
        kiln_program_free(p);
        return st;
    }
    *out = p;
    return KILN_OK;
}

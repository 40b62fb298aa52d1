/* kiln_trace: runs a call once with the dispatcher's recorder and the
 * memory observer installed on this thread, and writes down each kernel
 * with every data pointer it saw expressed as (block the call allocated |
 * program input | tensor used in place) + offset.
 *
 * Blocks come from the memory observer: every kiln_memory_alloc of the
 * call is a block, live until its kiln_memory_free (the allocator may hand
 * the same address out again later: that is a new block). A recorded
 * kernel reading a block no recorded kernel has written means work the
 * dispatcher did not see produced it (a tensor-layer copy or fill): the
 * replay could not reproduce it, so the trace is refused there. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kiln/amp.h"
#include "kiln/autograd.h"
#include "optim/optim_internal.h"
#include "runtime/counters.h"
#include "runtime/runtime_internal.h"
#include "tensor/tensor_internal.h"
#include "trace/trace_internal.h"

typedef trace_recording recording;

#define GROW(arr, n, cap) ((n) < (cap) ? KILN_OK : grow_array((void **)&(arr), &(cap), sizeof *(arr)))

static kiln_status grow_array(void **arr, int *cap, size_t elem) {
    int nc = *cap ? *cap * 2 : 64;
    void *n = KILN_REALLOC(*arr, (size_t)nc * elem);
    if (!n) return kiln_error_last()->status;
    *arr = n, *cap = nc;
    return KILN_OK;
}

static void memory_event(void *ctx, kiln_device device, void *ptr, size_t bytes, bool alloc) {
    recording *r = ctx;
    if (!alloc) {
        int a = r->last_alloc;
        r->last_alloc = -1;
        for (int i = r->n_blocks - 1; i >= 0; i--)
            if (r->blocks[i].live && r->blocks[i].base == ptr) {
                r->blocks[i].live = false;
                if (a >= 0 && a != i && r->blocks[a].live && r->blocks[a].bytes == r->blocks[i].bytes)
                    r->blocks[a].converted_from = i;
                return;
            }
        return;
    }
    if (r->failed) return;
    if (GROW(r->blocks, r->n_blocks, r->cap_blocks)) {
        r->failed = kiln_error_last()->status;
        return;
    }
    r->last_alloc = r->n_blocks;
    r->blocks[r->n_blocks++] = (trace_block){
        .device = device, .base = ptr, .bytes = bytes, .live = true, .buffer = -1, .converted_from = -1};
}

/* The newest block holding [p, p + 1): live ones, or, for a block just
 * freed by a layout conversion, dead ones too. -1: none. */
static int find_block(const recording *r, const void *ptr, bool allow_dead) {
    const char *c = ptr;
    for (int i = r->n_blocks - 1; i >= 0; i--) {
        const trace_block *b = &r->blocks[i];
        if ((b->live || allow_dead) && c >= b->base && c < b->base + (b->bytes ? b->bytes : 1)) return i;
    }
    return -1;
}

/* The buffer of block bi, made on its first use; -1 with the error set
 * when out of memory. */
static int block_buffer(recording *r, int bi, int step) {
    trace_block *b = &r->blocks[bi];
    kiln_program *p = r->p;
    if (b->buffer < 0) {
        if (GROW(p->buffers, p->n_buffers, p->cap_buffers)) return -1;
        p->buffers[p->n_buffers] =
            (trace_buffer){.bytes = b->bytes, .first = step, .last = step, .output = -1};
        b->buffer = p->n_buffers++;
    }
    trace_buffer *tb = &p->buffers[b->buffer];
    if (step > tb->last) tb->last = step;
    return b->buffer;
}

static kiln_status external_index(recording *r, kiln_tensor *t, int step, int *out) {
    kiln_program *p = r->p;
    for (int i = 0; i < p->n_ext; i++)
        if (p->ext[i].storage == t->storage) {
            *out = i;
            return KILN_OK;
        }
    KILN_TRY(GROW(p->ext, p->n_ext, p->cap_ext));
    p->ext[p->n_ext] = (trace_external){
        .t = kiln_retain(t), .storage = t->storage, .base = t->storage->base, .first_step = step};
    *out = p->n_ext++;
    return KILN_OK;
}

static const char *op_name(kiln_op_id op) {
    const kiln_op_info *info = kiln_op_info_get(op);
    return info ? info->name : "?";
}

static const char *step_name(const trace_step *s) {
    static const char *names[] = {"",       "layout conversion", "fill",          "copy",
                                  "arange", "random draw",       "optimizer step"};
    return s->kind == TRACE_STEP_KERNEL ? op_name(s->op) : names[s->kind];
}

/* Where pointer `data` of tensor t (NULL t: a raw block such as the
 * workspace) lies, for step `step`; `write` marks the buffer written, a
 * read of a buffer not yet written is refused. */
kiln_status kiln_trace_classify(recording *r, const kiln_tensor *t, const void *data, int step, bool write,
                                trace_ref *ref) {
    kiln_program *p = r->p;
    *ref = (trace_ref){.kind = TRACE_REF_NONE};
    if (!data) return KILN_OK;
    int bi = find_block(r, data, false);
    if (bi >= 0) {
        if (!kiln_device_equal(r->blocks[bi].device, p->device))
            return KILN_RAISE(KILN_ERR_UNSUPPORTED, "trace the part on each device separately",
                              "kiln_trace: step %d (%s) uses a second device", step,
                              step_name(&p->steps[step]));
        int b = block_buffer(r, bi, step);
        if (b < 0) return kiln_error_last()->status;
        trace_buffer *tb = &p->buffers[b];
        if (!write && !tb->written)
            return KILN_RAISE(
                KILN_ERR_UNSUPPORTED,
                "do that work before kiln_trace (a warm-up step), or with ops instead of direct writes",
                "kiln_trace: step %d (%s) reads a tensor the traced call allocated but that no traced "
                "kernel wrote: work outside the dispatcher (a tensor-layer fill, copy or layout "
                "conversion) made it, and a replay could not",
                step, step_name(&p->steps[step]));
        if (write) tb->written = true;
        *ref = (trace_ref){
            .kind = TRACE_REF_BUFFER, .index = b, .offset = (const char *)data - r->blocks[bi].base};
        return KILN_OK;
    }
    for (int i = 0; i < p->n_inputs; i++) {
        const kiln_tensor *in = r->inputs[i];
        const char *lo = in->storage->base;
        if (t ? in->storage != t->storage
              : !(lo && (const char *)data >= lo && (const char *)data < lo + in->storage->nbytes))
            continue;
        if (write)
            return KILN_RAISE(KILN_ERR_UNSUPPORTED,
                              "clone the input inside the traced call before writing it",
                              "kiln_trace: step %d (%s) writes program input %d in place", step,
                              step_name(&p->steps[step]), i);
        const char *d0 = (const char *)in->storage->base + in->offset * (int64_t)kiln_dtype_size(in->dtype);
        *ref = (trace_ref){.kind = TRACE_REF_INPUT, .index = i, .offset = (const char *)data - d0};
        return KILN_OK;
    }
    for (int i = 0; !t && i < p->n_ext; i++) {
        /* Raw pointers (tensor-layer work) into a tensor a dispatched op
         * has used already. */
        const kiln_storage *st = p->ext[i].t->storage;
        const char *lo = st->base;
        if (lo && (const char *)data >= lo && (const char *)data < lo + st->nbytes) {
            *ref = (trace_ref){.kind = TRACE_REF_EXTERNAL, .index = i, .offset = (const char *)data - lo};
            return KILN_OK;
        }
    }
    if (!t)
        return KILN_RAISE(
            KILN_ERR_UNSUPPORTED,
            "use that tensor in a dispatched op first, do the work before kiln_trace, and read "
            "values on the host only after the replay",
            "kiln_trace: step %d (%s) %s memory the trace does not know: a tensor that existed before "
            "the call, used outside the dispatcher, or the host (kiln_item, a copy to the host), "
            "which a replay cannot follow",
            step, step_name(&p->steps[step]), write ? "writes" : "reads");
    if (!kiln_device_equal(t->storage->device, p->device))
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "trace the part on each device separately",
                          "kiln_trace: step %d (%s) uses a tensor on a second device", step,
                          step_name(&p->steps[step]));
    int e;
    KILN_TRY(external_index(r, (kiln_tensor *)t, step, &e));
    *ref = (trace_ref){.kind = TRACE_REF_EXTERNAL,
                       .index = e,
                       .offset = (const char *)data - (const char *)t->storage->base};
    return KILN_OK;
}

kiln_status kiln_trace_new_step(recording *r, trace_step **out, int *index) {
    kiln_program *p = r->p;
    KILN_TRY(GROW(p->steps, p->n_steps, p->cap_steps));
    trace_step *s = &p->steps[p->n_steps];
    memset(s, 0, sizeof *s);
    s->prep_external = -1;
    s->draw = -1;
    *index = p->n_steps++;
    *out = s;
    return KILN_OK;
}

kiln_status kiln_trace_draw(recording *r, kiln_device device, kiln_rng rng, int *out) {
    kiln_program *p = r->p;
    for (int i = 0; i < p->n_draws; i++)
        if (!memcmp(&p->draws[i].recorded, &rng, sizeof rng)) {
            *out = i;
            return KILN_OK;
        }
    /* The draw was reserved just before its kernel: the generator has
     * moved past it by exactly its size. */
    kiln_rng now = kiln_device_rng_reserve(device, 0);
    if (now.seed != rng.seed || now.subsequence != rng.subsequence || now.offset < rng.offset)
        return KILN_RAISE(KILN_ERR_UNSUPPORTED,
                          "draw random numbers inside the traced call, from the device generator",
                          "kiln_trace: a random op uses numbers drawn outside the traced call");
    KILN_TRY(GROW(p->draws, p->n_draws, p->cap_draws));
    p->draws[p->n_draws] = (trace_draw){.recorded = rng, .words = (now.offset - rng.offset) * 4};
    *out = p->n_draws++;
    return KILN_OK;
}

kiln_status kiln_trace_step_device(recording *r, kiln_device d, void *stream) {
    if (!r->have_device) {
        r->p->device = d, r->p->stream = stream, r->have_device = true;
        return KILN_OK;
    }
    if (!kiln_device_equal(d, r->p->device)) {
        char a[32], b[32];
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "trace the part on each device separately",
                          "kiln_trace: the call runs kernels on %s and on %s; a program runs on one device",
                          kiln_device_str(r->p->device, a, sizeof a), kiln_device_str(d, b, sizeof b));
    }
    if (stream != r->p->stream)
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "run the traced call on one stream",
                          "kiln_trace: the call runs kernels on two streams of one device");
    return KILN_OK;
}

static kiln_status emit_reorder(recording *r, int from_block, const kiln_tensor *t, const int64_t *shape,
                                int block);

/* An input the tensor layer converted to strided outside the dispatcher
 * (a view of a blocked activation): its block was allocated, and the
 * blocked one it copies freed, with no kernel between. Recorded as the
 * conversion, so the replay makes it too. */
static kiln_status infer_conversion(recording *r, const kiln_tensor *t) {
    if (!t || !t->storage->base) return KILN_OK;
    int bi = find_block(r, t->storage->base, false);
    if (bi < 0 || r->blocks[bi].converted_from < 0) return KILN_OK;
    if (r->blocks[bi].buffer >= 0 && r->p->buffers[r->blocks[bi].buffer].written) return KILN_OK;
    const trace_block *src = &r->blocks[r->blocks[bi].converted_from];
    if (src->buffer < 0 || !r->p->buffers[src->buffer].written) return KILN_OK;
    const trace_buffer *sb = &r->p->buffers[src->buffer];
    int block = kiln_trace_layout_block((kiln_layout)sb->layout);
    int64_t n = sb->shape4[0] * sb->shape4[1] * sb->shape4[2] * sb->shape4[3];
    if (!block || sb->shape4[1] % block || (size_t)n * kiln_dtype_size(t->dtype) != t->storage->nbytes ||
        t->storage->nbytes != src->bytes)
        return KILN_OK;
    return emit_reorder(r, r->blocks[bi].converted_from, t, sb->shape4, block);
}

static kiln_status record_kernel(void *ctx, const kiln_op_call *c, const kiln_op_kernel *k, bool fast,
                                 const kiln_op_args *args) {
    recording *r = ctx;
    KILN_TRY(kiln_trace_step_device(r, c->device, args->stream));
    for (int i = 0; i < args->n_in; i++) KILN_TRY(infer_conversion(r, c->in[i]));
    trace_step *s;
    int idx;
    KILN_TRY(kiln_trace_new_step(r, &s, &idx));
    s->kind = TRACE_STEP_KERNEL;
    s->op = c->op, s->k = k, s->fast = fast;
    s->args = *args;
    s->attrs = *args->attrs;
    if (c->op == KILN_OP_DROPOUT || c->op == KILN_OP_RANDPERM)
        KILN_TRY(kiln_trace_draw(r, c->device, args->attrs->rng, &s->draw));
    for (int i = 0; i < args->n_in; i++) {
        s->in_ndim[i] = c->in[i] ? c->in[i]->ndim : -1;
        if (c->in[i]) {
            s->in_dtype[i] = c->in[i]->dtype;
            memcpy(s->in_shape[i], c->in[i]->shape, sizeof s->in_shape[i]);
        }
        if (args->in[i].ndim >= 0)
            KILN_TRY(kiln_trace_classify(r, c->in[i], args->in[i].data, idx, false, &s->in[i]));
    }
    for (int i = 0; i < args->n_out; i++) {
        KILN_TRY(kiln_trace_classify(r, c->out[i], args->out[i].data, idx, true, &s->out[i]));
        if (s->out[i].kind == TRACE_REF_BUFFER) {
            trace_buffer *tb = &r->p->buffers[s->out[i].index];
            tb->layout = args->out[i].layout;
            if (args->out[i].ndim == 4) memcpy(tb->shape4, args->out[i].shape, sizeof tb->shape4);
        }
    }
    if (args->workspace) {
        KILN_TRY(kiln_trace_classify(r, NULL, args->workspace, idx, true, &s->ws));
    }
    /* A lazy copy may not have been made for this call (the weight moved
     * since the last one): the replay asks for it on each run all the same. */
    kiln_op_prepare pr = {.input = -1};
    if (k->prepare && k->fill) k->prepare(args, &pr);
    if (args->prepared || (pr.lazy && pr.input >= 0 && pr.bytes > 0)) {
        if (pr.input < 0 || pr.input >= c->n_in || s->in[pr.input].kind != TRACE_REF_EXTERNAL)
            return KILN_RAISE(KILN_ERR_UNSUPPORTED,
                              "trace with the weights as tensors that exist before the call",
                              "kiln_trace: step %d (%s) keeps a prepared copy of a tensor the call made", idx,
                              op_name(c->op));
        s->prep_external = s->in[pr.input].index;
        s->prep_input = pr.input, s->prep_key = pr.key, s->prep_bytes = pr.bytes, s->prep_lazy = pr.lazy;
    }
    return KILN_OK;
}

static kiln_status record_reorder(void *ctx, const kiln_tensor *t, const void *old_base,
                                  kiln_layout old_layout) {
    recording *r = ctx;
    int block = kiln_trace_layout_block(old_layout);
    if (t->storage->device.type != KILN_DEVICE_CPU || !block || t->ndim != 4 || t->shape[1] % block)
        return KILN_RAISE(
            KILN_ERR_UNSUPPORTED, "report this: the trace replays the CPU's nChw16c and nChw8c conversions",
            "kiln_trace: a layout conversion it cannot replay (%s, layout %d, %d dims)",
            t->storage->device.type == KILN_DEVICE_CPU ? "cpu" : "not cpu", (int)old_layout, t->ndim);
    KILN_TRY(kiln_trace_step_device(r, t->storage->device, r->have_device ? r->p->stream : NULL));
    int bi = find_block(r, old_base, true);
    if (bi < 0) {
        /* A tensor from before the call converted in place: its storage now
         * holds a block the call allocated, which later steps read. */
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "make the tensors the call reads strided before tracing it",
                          "kiln_trace: the call converts a tensor it did not make from nChw16c to strided");
    }
    return emit_reorder(r, bi, t, t->shape, block);
}

/* A conversion of block from_block (blocked, `block` channels) into t's
 * storage (strided). */
static kiln_status emit_reorder(recording *r, int from_block, const kiln_tensor *t, const int64_t *shape,
                                int block) {
    trace_step *s;
    int idx;
    KILN_TRY(kiln_trace_new_step(r, &s, &idx));
    s->kind = TRACE_STEP_REORDER;
    s->op = KILN_OP_COUNT;
    s->elem = kiln_dtype_size(t->dtype);
    s->block = block;
    memcpy(s->shape, shape, sizeof s->shape);
    int b = block_buffer(r, from_block, idx);
    if (b < 0) return kiln_error_last()->status;
    if (!r->p->buffers[b].written)
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "do that work before kiln_trace",
                          "kiln_trace: step %d converts a block no traced kernel wrote", idx);
    s->in[0] = (trace_ref){.kind = TRACE_REF_BUFFER, .index = b};
    KILN_TRY(kiln_trace_classify(r, NULL, t->storage->base, idx, true, &s->out[0]));
    return KILN_OK;
}

static kiln_status check_inputs(int n_inputs, kiln_tensor *const *inputs, kiln_program *p) {
    p->inputs = KILN_CALLOC((size_t)(n_inputs ? n_inputs : 1), sizeof *p->inputs);
    if (!p->inputs) return kiln_error_last()->status;
    for (int i = 0; i < n_inputs; i++) {
        KILN_TRY(kiln_tensor_check(inputs[i], "kiln_trace"));
        const kiln_tensor *t = inputs[i];
        if (kiln_layout_of(t) != KILN_LAYOUT_STRIDED)
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass kiln_contiguous(input)",
                              "kiln_trace: input %d is in an opaque layout", i);
        trace_input_guard *g = &p->inputs[i];
        g->dtype = t->dtype, g->device = t->storage->device, g->ndim = t->ndim;
        memcpy(g->shape, t->shape, sizeof g->shape);
        memcpy(g->strides, t->strides, sizeof g->strides);
    }
    return KILN_OK;
}

/* The call's outputs: contiguous tensors over blocks it allocated, which
 * become the program's own output tensors. */
static kiln_status bind_outputs(recording *r, int n_outputs, kiln_tensor **outs) {
    kiln_program *p = r->p;
    p->out_shape = KILN_CALLOC((size_t)n_outputs + 1, sizeof *p->out_shape);
    p->out_dtype = KILN_CALLOC((size_t)n_outputs + 1, sizeof *p->out_dtype);
    if (!p->out_shape || !p->out_dtype) return kiln_error_last()->status;
    for (int i = 0; i < n_outputs; i++) {
        kiln_tensor *t = outs[i];
        KILN_TRY(kiln_tensor_check(t, "kiln_trace (the traced call's output)"));
        int bi = t->storage->base ? find_block(r, t->storage->base, false) : -1;
        int b = bi >= 0 ? r->blocks[bi].buffer : -1;
        if (b < 0 || t->offset != 0 || !kiln_is_contiguous(t) || kiln_layout_of(t) != KILN_LAYOUT_STRIDED ||
            (size_t)kiln_numel(t) * kiln_dtype_size(t->dtype) != p->buffers[b].bytes)
            return KILN_RAISE(
                KILN_ERR_UNSUPPORTED,
                "return a result a traced kernel computed (a copy, kiln_to(x, device, dtype, KILN_COPY), for "
                "an input or a parameter)",
                "kiln_trace: output %d is not a contiguous tensor of its own that a traced kernel wrote", i);
        if (p->buffers[b].output >= 0)
            return KILN_RAISE(KILN_ERR_UNSUPPORTED, "return each result once",
                              "kiln_trace: outputs %d and %d are the same tensor", p->buffers[b].output, i);
        p->buffers[b].output = i;
        p->buffers[b].last = p->n_steps;
        p->out_shape[i] = kiln_shape_of(t);
        p->out_dtype[i] = t->dtype;
    }
    return KILN_OK;
}

kiln_status kiln_trace(kiln_trace_fn fn, void *user, int n_inputs, kiln_tensor *const *inputs, int n_outputs,
                       kiln_tensor **eager_outputs, kiln_program **out) {
    if (!out) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_trace: out is NULL");
    *out = NULL;
    if (!fn || n_inputs < 0 || n_inputs > 64 || n_outputs < 1 || n_outputs > 64 || (n_inputs && !inputs))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass fn, 0..64 inputs and 1..64 outputs",
                          "kiln_trace: bad arguments (fn %s, %d inputs, %d outputs)", fn ? "set" : "NULL",
                          n_inputs, n_outputs);
    kiln_program *p = KILN_CALLOC(1, sizeof *p);
    if (!p) return kiln_error_last()->status;
    p->n_inputs = n_inputs, p->n_outputs = n_outputs;
    recording r = {.p = p, .inputs = inputs, .last_alloc = -1};
    kiln_tensor *outs[64] = {NULL};
    kiln_status st = check_inputs(n_inputs, inputs, p);
    if (!st) {
        p->grad_enabled = kiln_is_grad_enabled();
        p->device = n_inputs ? inputs[0]->storage->device : (kiln_device){KILN_DEVICE_CPU, 0};
        p->autocast = kiln_autocast_enabled(p->device.type);
        p->autocast_dtype = kiln_autocast_dtype(p->device.type);
        uint64_t before[KILN_COUNTER_COUNT], after[KILN_COUNTER_COUNT];
        kiln_dispatch_recorder rec = {.ctx = &r, .kernel = record_kernel, .reorder = record_reorder};
        kiln_memory_observer mo = {.ctx = &r, .event = memory_event};
        kiln_counters_read(before);
        const kiln_dispatch_recorder *old_rec = kiln_dispatch_set_recorder(&rec);
        const kiln_memory_observer *old_mo = kiln_memory_set_observer(&mo);
        kiln_trace_extra_recorders(&r);
        st = fn(user, inputs, outs);
        kiln_trace_extra_recorders(NULL);
        kiln_memory_set_observer(old_mo);
        kiln_dispatch_set_recorder(old_rec);
        kiln_counters_read(after);
        /* A grad scaler's step under the trace: its flag read now, after
         * the call, as each replay reads it after the run. */
        kiln_status settled = kiln_optim_settle_found();
        if (!st && r.failed) st = r.failed;
        if (!st && settled) st = settled;
        if (!st && after[KILN_COUNTER_HOST_SYNCS] != before[KILN_COUNTER_HOST_SYNCS])
            st = KILN_RAISE(
                KILN_ERR_UNSUPPORTED,
                "move host reads (kiln_item, copies to the host) out of the traced call",
                "kiln_trace: the call synchronised the host with the device %llu time(s); a replay "
                "cannot follow what the host decided from the values read",
                (unsigned long long)(after[KILN_COUNTER_HOST_SYNCS] - before[KILN_COUNTER_HOST_SYNCS]));
        if (!st && !p->n_steps)
            st = KILN_RAISE(KILN_ERR_UNSUPPORTED, "trace a call that computes something",
                            "kiln_trace: the call ran no kernel");
        if (!st) st = bind_outputs(&r, n_outputs, outs);
    }
    if (!st) st = kiln_trace_plan_memory(p);
    free(r.blocks);
    for (int i = 0; i < n_outputs; i++) {
        if (eager_outputs && !st)
            eager_outputs[i] = outs[i];
        else if (outs[i])
            kiln_release(outs[i]);
    }
    if (st) {
        kiln_program_free(p);
        return st;
    }
    for (int i = 0; i < p->n_steps; i++) p->steps[i].args.attrs = &p->steps[i].attrs;
    *out = p;
    return KILN_OK;
}

/* A replay on CUDA is one CUDA graph.
 *
 * The first kiln_program_run on a CUDA program (after the guards, the arena
 * and the outputs) checks that every step can be captured, allocates what
 * the graph reads that changes between replays, and captures the steps on
 * a stream of its own (the legacy default stream cannot be captured) into
 * a graph. The backend's capture begin first makes what the captured
 * kernels would otherwise make at their first use on that stream, which a
 * capture forbids (CUDA: the cuBLASLt handle and the stream's persistent
 * GEMM workspace; the stream's destruction gives the workspace back). Each
 * run then, on the program's stream, in order:
 *
 *   1. copies every input into the program's static copy of it (device to
 *      device, async): the graph was captured reading those, as PyTorch's
 *      graphs read their static inputs;
 *   2. writes this run's per-run values into host staging and copies them
 *      with one async copy into the parameter block on the device: each
 *      random draw's generator position (seed, subsequence, offset: 3
 *      words, reserved from the device generator as eager would, in order)
 *      and each fused optimizer update's scalars (Adam: lr, lr / (1 -
 *      beta1^t), sqrt(1 - beta2^t); SGD: lr), the step counts advanced on
 *      the host as the eager replay advances them. The captured kernels
 *      read these when they run (op_args.h rng_dev, optim_kernels.h
 *      scalars): PyTorch's graph-safe generator and capturable Adam;
 *   3. launches the graph.
 *
 * The staging is pinned memory in two slots used in turn, each with an
 * event recorded after its copy; before a slot is rewritten the host waits
 * for that event, i.e. for the copy two runs back (which itself waited for
 * the graph before it): the host may run up to two replays ahead of the
 * device. Nothing else blocks, and nothing is allocated after the first run.
 *
 * Refused before the capture, naming the step: work that runs on the host
 * (a blocked-layout conversion), a random draw whose kernel takes its
 * position by value (a graph would draw the same numbers every replay:
 * only dropout reads it from the device), and a kernel whose prepared
 * weight copy the host refreshes when the weight changes. A kernel whose
 * launch fails during the capture (it synchronises, allocates or copies
 * from pageable memory) is reported with its step and op, and the capture
 * is abandoned; so is a library fast path that failed there and left the
 * capture invalidated (the fast table runs no stand-in kernel on it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "runtime/backend.h"
#include "runtime/runtime_internal.h"
#include "tensor/tensor_internal.h"
#include "trace/trace_internal.h"

#define GRAPH_HINT                                                                                           \
    "run that work outside the traced call (before or after kiln_program_run), or trace it on the CPU"

typedef struct trace_graph {
    const kiln_backend *be;
    int index;
    void *exec;           /* the instantiated graph (backend handle) */
    void *capture_stream; /* the stream it was captured on */
    void *statics;        /* device: the inputs' static copies, then the parameter block */
    size_t *in_offset, *in_bytes;
    size_t params_offset;
    size_t n_words; /* 8-byte words of the parameter block */
    void *staging[2];
    void *event[2];
    bool pending[2];
    int slot;    /* the staging slot of this run's values */
    bool failed; /* capture failed: every later run reports it again */
} trace_graph;

const void *kiln_trace_graph_params(const kiln_program *p) {
    return (const char *)p->graph->statics + p->graph->params_offset;
}

double *kiln_trace_graph_host_params(const kiln_program *p) { return p->graph->staging[p->graph->slot]; }

const kiln_rng *kiln_trace_graph_draw(const kiln_program *p, int d) {
    return (const kiln_rng *)((const uint64_t *)kiln_trace_graph_params(p) + 3 * (size_t)d);
}

static const char *step_name(const trace_step *s) {
    if (s->kind == TRACE_STEP_KERNEL) {
        const kiln_op_info *info = kiln_op_info_get(s->op);
        return info ? info->name : "kernel";
    }
    static const char *kinds[] = {"",       "layout conversion", "fill",          "copy",
                                  "arange", "random fill",       "optimizer step"};
    return s->kind > 0 && s->kind <= TRACE_STEP_OPTIM ? kinds[s->kind] : "step";
}

/* What the graph cannot replay, found before anything is captured. */
static kiln_status check_capturable(const kiln_program *p) {
    for (int i = 0; i < p->n_steps; i++) {
        const trace_step *s = &p->steps[i];
        const char *why = NULL;
        if (s->kind == TRACE_STEP_REORDER)
            why = "it runs on the host";
        else if (s->kind == TRACE_STEP_RAND)
            why = "its kernel takes the generator position by value, so every replay would draw the same "
                  "numbers";
        else if (s->kind == TRACE_STEP_KERNEL && s->draw >= 0 && s->op != KILN_OP_DROPOUT)
            why = "its kernel takes the generator position by value, so every replay would draw the same "
                  "numbers (only dropout reads it from the device)";
        else if (s->kind == TRACE_STEP_KERNEL && s->prep_external >= 0)
            why = "its kernel keeps a prepared copy of a weight that the host refreshes when the weight "
                  "changes";
        if (why)
            return KILN_RAISE(KILN_ERR_UNSUPPORTED, GRAPH_HINT,
                              "kiln_program_run: step %d (%s) cannot be captured into a CUDA graph: %s", i,
                              step_name(s), why);
    }
    return KILN_OK;
}

/* The bytes from an input's first element to one past its last. */
static kiln_status input_extent(const trace_input_guard *g, int i, size_t *out) {
    size_t elems = 1;
    for (int d = 0; d < g->ndim; d++) {
        if (g->shape[d] == 0) {
            *out = 0;
            return KILN_OK;
        }
        if (g->strides[d] < 0)
            return KILN_RAISE(KILN_ERR_UNSUPPORTED,
                              "pass a contiguous input (kiln_contiguous) and trace again",
                              "kiln_program_run: input %d has a negative stride; a CUDA graph's static copy "
                              "cannot hold it",
                              i);
        elems += (size_t)(g->shape[d] - 1) * (size_t)g->strides[d];
    }
    *out = elems * kiln_dtype_size(g->dtype);
    return KILN_OK;
}

static size_t align_up(size_t n) { return (n + 255) & ~(size_t)255; }

/* The static inputs, the parameter block (its words handed out: draws
 * first, then each optimizer launch's), the staging and its events. */
static kiln_status graph_alloc(kiln_program *p, trace_graph *g) {
    g->in_offset = KILN_CALLOC((size_t)p->n_inputs + 1, sizeof *g->in_offset);
    g->in_bytes = KILN_CALLOC((size_t)p->n_inputs + 1, sizeof *g->in_bytes);
    if (!g->in_offset || !g->in_bytes) return kiln_error_last()->status;
    size_t total = 0;
    for (int i = 0; i < p->n_inputs; i++) {
        KILN_TRY(input_extent(&p->inputs[i], i, &g->in_bytes[i]));
        g->in_offset[i] = total;
        total = align_up(total + g->in_bytes[i]);
    }
    g->n_words = 3 * (size_t)p->n_draws;
    for (int i = 0; i < p->n_steps; i++) {
        trace_optim *t = p->steps[i].optim;
        if (p->steps[i].kind != TRACE_STEP_OPTIM || !t) continue;
        t->word = g->n_words;
        g->n_words += (size_t)t->n * (t->adam ? 3 : 1);
    }
    g->params_offset = total;
    total += g->n_words * 8;
    if (total) KILN_TRY(kiln_memory_alloc(p->device, total, NULL, &g->statics));
    if (!g->n_words) return KILN_OK;
    for (int k = 0; k < 2; k++) {
        KILN_TRY(g->be->host_alloc(g->n_words * 8, &g->staging[k]));
        KILN_TRY(g->be->event_create(g->index, 0, &g->event[k]));
    }
    return KILN_OK;
}

/* The steps queued on the capture stream, each reading the static inputs
 * and the parameter block. */
static kiln_status graph_capture(kiln_program *p, trace_graph *g) {
    KILN_TRY(g->be->stream_create(g->index, 0, &g->capture_stream));
    for (int i = 0; i < p->n_inputs; i++) p->in_data[i] = (char *)g->statics + g->in_offset[i];
    kiln_status begin = g->be->graph_capture_begin(g->index, g->capture_stream);
    if (begin) {
        char cause[768];
        snprintf(cause, sizeof cause, "%s", kiln_error_message());
        return kiln_error_raise(begin, __FILE__, __LINE__, NULL,
                                "kiln_program_run: the CUDA graph capture of the program could not begin: %s",
                                cause);
    }
    p->run_mode = TRACE_RUN_CAPTURE;
    p->run_stream = g->capture_stream;
    kiln_status st = KILN_OK;
    int at = 0;
    char why[768] = "";
    for (; at < p->n_steps && st == KILN_OK; at++) st = kiln_trace_run_step(p, &p->steps[at]);
    if (st) snprintf(why, sizeof why, "%s", kiln_error_message());
    p->run_mode = TRACE_RUN_EAGER;
    p->run_stream = p->stream;
    kiln_status end = g->be->graph_capture_end(g->index, g->capture_stream, &g->exec);
    if (st)
        return kiln_error_raise(st, __FILE__, __LINE__, GRAPH_HINT,
                                "kiln_program_run: step %d (%s) cannot be captured into a CUDA graph: %s",
                                at - 1, step_name(&p->steps[at - 1]), why);
    if (end) {
        snprintf(why, sizeof why, "%s", kiln_error_message());
        return kiln_error_raise(end, __FILE__, __LINE__, GRAPH_HINT,
                                "kiln_program_run: the CUDA graph capture of the program failed: %s", why);
    }
    return KILN_OK;
}

static kiln_status graph_setup(kiln_program *p) {
    const kiln_backend *be = kiln_backend_for(p->device);
    if (!be) return kiln_error_last()->status;
    if (!be->graph_capture_begin || !be->graph_capture_end || !be->graph_launch || !be->graph_destroy ||
        !be->host_alloc)
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, NULL, "kiln_program_run: the %s backend has no graphs",
                          be->name);
    KILN_TRY(check_capturable(p));
    trace_graph *g = KILN_CALLOC(1, sizeof *g);
    if (!g) return kiln_error_last()->status;
    g->be = be;
    g->index = p->device.index;
    p->graph = g;
    kiln_status st = graph_alloc(p, g);
    if (!st) st = graph_capture(p, g);
    if (st) g->failed = true;
    return st;
}

/* The host pass: draws reserved in order, optimizer steps counted, their
 * values written to this run's staging slot. */
static kiln_status write_params(kiln_program *p, trace_graph *g) {
    if (g->pending[g->slot]) KILN_TRY(g->be->event_synchronize(g->index, g->event[g->slot]));
    g->pending[g->slot] = false;
    uint64_t *w = g->staging[g->slot];
    for (int i = 0; i < p->n_draws; i++) {
        kiln_rng r = kiln_device_rng_reserve(p->device, p->draws[i].words);
        w[3 * i] = r.seed, w[3 * i + 1] = r.subsequence, w[3 * i + 2] = r.offset;
    }
    p->run_mode = TRACE_RUN_HOST;
    kiln_status st = KILN_OK;
    for (int i = 0; i < p->n_steps && !st; i++)
        if (p->steps[i].kind == TRACE_STEP_OPTIM) st = kiln_trace_run_step(p, &p->steps[i]);
    p->run_mode = TRACE_RUN_EAGER;
    KILN_TRY(st);
    void *dev = (char *)g->statics + g->params_offset;
    KILN_TRY(g->be->copy(KILN_COPY_H2D, g->index, g->index, dev, w, g->n_words * 8, p->stream, true));
    KILN_TRY(g->be->event_record(g->index, g->event[g->slot], p->stream));
    g->pending[g->slot] = true;
    g->slot ^= 1;
    return KILN_OK;
}

kiln_status kiln_trace_graph_run(kiln_program *p, kiln_tensor *const *inputs) {
    if (p->graph && p->graph->failed)
        return KILN_RAISE(KILN_ERR_STATE, "trace the call again (retrace) once the step can be captured",
                          "kiln_program_run: this program's CUDA graph capture failed on its first run");
    if (!p->graph) KILN_TRY(graph_setup(p));
    trace_graph *g = p->graph;
    for (int i = 0; i < p->n_inputs; i++) {
        const kiln_tensor *t = inputs[i];
        const char *src = (const char *)t->storage->base + t->offset * (int64_t)kiln_dtype_size(t->dtype);
        if (g->in_bytes[i])
            KILN_TRY(g->be->copy(KILN_COPY_D2D, g->index, g->index, (char *)g->statics + g->in_offset[i], src,
                                 g->in_bytes[i], p->stream, true));
    }
    if (g->n_words) KILN_TRY(write_params(p, g));
    return g->be->graph_launch(g->index, g->exec, p->stream);
}

void kiln_trace_graph_free(kiln_program *p) {
    trace_graph *g = p->graph;
    if (!g) return;
    if (g->exec) g->be->graph_destroy(g->index, g->exec);
    for (int k = 0; k < 2; k++) {
        if (g->event[k]) g->be->event_destroy(g->index, g->event[k]);
        if (g->staging[k]) g->be->host_free(g->staging[k]);
    }
    if (g->capture_stream) g->be->stream_destroy(g->index, g->capture_stream);
    if (g->statics) kiln_memory_free(p->device, g->statics);
    free(g->in_offset), free(g->in_bytes);
    free(g);
    p->graph = NULL;
}

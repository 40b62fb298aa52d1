/* The static memory plan of a traced program: every block the traced call
 * allocated and a step used becomes an offset in one arena. A block is
 * live from the step that first uses it to the step that last uses it
 * (outputs are not planned: they are the program's own tensors). Blocks
 * are placed in order of first use at the lowest offset where they do not
 * overlap any placed block whose interval meets theirs: first fit on the
 * interval graph. O(n^2) in the number of blocks, at trace time only. */
#include <stdlib.h>

#include "base/error.h"
#include "trace/trace_internal.h"

/* Every offset is a multiple of this: the caching allocator's block
 * alignment, which the kernels (oneDNN, vector loads) may rely on. */
#define TRACE_ARENA_ALIGN 512

typedef struct placed {
    size_t lo, hi;
} placed;

static int cmp_placed(const void *a, const void *b) {
    const placed *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static size_t align_up(size_t n) {
    return (n + TRACE_ARENA_ALIGN - 1) / TRACE_ARENA_ALIGN * TRACE_ARENA_ALIGN;
}

kiln_status kiln_trace_plan_memory(kiln_program *p) {
    /* Buffers are numbered in order of first use already (recording). */
    placed *busy = KILN_CALLOC((size_t)p->n_buffers + 1, sizeof *busy);
    if (!busy) return kiln_error_last()->status;
    /* A grad scaler's found-inf flag is read after the run
     * (kiln_trace_settle_found): it lives to the end. */
    for (int i = 0; i < p->n_steps; i++) {
        const trace_optim *t = p->steps[i].optim;
        if (p->steps[i].kind == TRACE_STEP_OPTIM && t && t->has_found && t->found.kind == TRACE_REF_BUFFER)
            p->buffers[t->found.index].last = p->n_steps;
    }
    size_t total = 0;
    for (int i = 0; i < p->n_buffers; i++) {
        trace_buffer *b = &p->buffers[i];
        if (b->output >= 0) continue;
        int n = 0;
        for (int j = 0; j < i; j++) {
            const trace_buffer *o = &p->buffers[j];
            if (o->output >= 0 || o->last < b->first || o->first > b->last) continue;
            busy[n++] = (placed){o->offset, o->offset + align_up(o->bytes)};
        }
        qsort(busy, (size_t)n, sizeof *busy, cmp_placed);
        size_t at = 0, need = align_up(b->bytes);
        for (int k = 0; k < n; k++) {
            if (busy[k].lo >= at + need) break;
            if (busy[k].hi > at) at = busy[k].hi;
        }
        b->offset = at;
        if (at + need > total) total = at + need;
    }
    free(busy);
    p->arena_bytes = total;
    return KILN_OK;
}

size_t kiln_trace_unplanned_bytes(const kiln_program *p) {
    size_t n = 0;
    for (int i = 0; i < p->n_buffers; i++)
        if (p->buffers[i].output < 0) n += align_up(p->buffers[i].bytes);
    return n;
}

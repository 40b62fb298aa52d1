/* libFuzzer target for saved programs' descriptions (the kiln.program
 * metadata of a kiln export --traced file, docs/trace.md): the input is
 * the JSON text. kiln_program_parse must refuse it with an error or
 * accept a program all of whose views lie inside the memory they name;
 * an accepted program whose inputs are contiguous and whose memory is
 * small is then run on zero-filled inputs and tensors, so that AddressSanitizer
 * sees every byte each kernel touches. Errors are the expected outcome for
 * almost every input. Seeds: tests/fuzz/corpus/program (the tutorial CNN
 * 1x28x28 at batch 1, a small MLP); tokens: tests/fuzz/dict/program.dict. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"
#include "tensor/tensor_internal.h"
#include "trace/trace_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define RUN_LIMIT (INT64_C(16) << 20) /* bytes of arena, inputs and tensors a run may take */

static bool contiguous(const trace_input_guard *g) {
    int64_t st[KILN_MAX_DIMS];
    kiln_contiguous_strides(g->ndim, g->shape, st);
    return !memcmp(st, g->strides, sizeof(int64_t) * (size_t)g->ndim);
}

/* Zero tensors for the program's externals and inputs, then one run. */
static void run(kiln_program *p) {
    int64_t total = (int64_t)p->arena_bytes;
    for (int i = 0; i < p->n_ext; i++) {
        int64_t n = 1;
        for (int d = 0; d < p->ext[i].shape.ndim; d++) n *= p->ext[i].shape.d[d];
        total += n * (int64_t)kiln_dtype_size(p->ext[i].dtype);
    }
    for (int i = 0; i < p->n_inputs; i++) {
        if (!contiguous(&p->inputs[i])) return;
        int64_t n = 1;
        for (int d = 0; d < p->inputs[i].ndim; d++) n *= p->inputs[i].shape[d];
        total += n * (int64_t)kiln_dtype_size(p->inputs[i].dtype);
    }
    if (total > RUN_LIMIT) return;
    kiln_device cpu = {KILN_DEVICE_CPU, 0};
    for (int i = 0; i < p->n_ext; i++) {
        trace_external *e = &p->ext[i];
        e->t = kiln_zeros(e->shape, e->dtype, cpu);
        if (!e->t) return;
        e->storage = e->t->storage, e->base = e->t->storage->base;
    }
    kiln_tensor *in[64] = {NULL}, *out[64] = {NULL};
    bool ok = true;
    for (int i = 0; i < p->n_inputs && ok; i++) {
        kiln_shape s = {.ndim = p->inputs[i].ndim};
        memcpy(s.d, p->inputs[i].shape, sizeof(int64_t) * (size_t)s.ndim);
        ok = (in[i] = kiln_zeros(s, p->inputs[i].dtype, cpu)) != NULL;
    }
    if (ok && kiln_program_run(p, p->n_inputs, in, p->n_outputs, out) == KILN_OK)
        for (int i = 0; i < p->n_outputs; i++) kiln_release(out[i]);
    for (int i = 0; i < p->n_inputs; i++) kiln_release(in[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static bool ready;
    if (!ready) {
        if (kiln_init()) abort();
        kiln_log_set_level(KILN_LOG_ERROR);
        ready = true;
    }
    kiln_program *p = NULL;
    if (kiln_program_parse("fuzz.kiln", (const char *)data, size, &p) != KILN_OK) {
        if (p) abort(); /* an error leaves nothing behind */
        return 0;
    }
    run(p);
    kiln_program_free(p);
    return 0;
}

/* libFuzzer target for the model-spec parser and the layers it builds:
 * the input is the spec text. It is checked first (kiln_model_spec_check,
 * nothing built), then parsed within a small parameter and activation
 * budget and, when it fits, run forward on one tiny image, so that
 *   - checking and building agree (status, message and counts),
 *   - the parameters built are the ones counted,
 *   - the inferred shapes hold against the layers' own checks: a spec the
 *     parser accepts must run (abort otherwise).
 * The budget keeps each run to a few milliseconds; the parser alone is
 * fuzz_model_spec_parse, which reaches 10^7 executions. This one is given
 * a time budget in scripts/full-check.sh instead. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* 2^14 parameters and 2^12 values per sample: a few KiB per model. */
enum { MAX_PARAMETERS = 1 << 14, MAX_ACTIVATION = 1 << 12 };

static void parse_and_run(const uint8_t *data, size_t size, int64_t c, int64_t h, int64_t w) {
    const char *text = (const char *)data;
    kiln_model_spec_budget bc = {.max_parameters = MAX_PARAMETERS, .max_activation = MAX_ACTIVATION}, bb = bc;
    kiln_status sc = kiln_model_spec_check(text, size, "fuzz.txt", c, h, w, &bc);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", sc == KILN_OK ? "" : kiln_error_message());
    kiln_module *m = NULL;
    kiln_status sb = kiln_model_spec_parse_limited(text, size, "fuzz.txt", c, h, w, &bb, &m);
    if ((sb == KILN_OK) != (m != NULL)) abort(); /* failure must leave *out NULL */
    if (sb != KILN_ERR_OUT_OF_MEMORY) {
        if (sc != sb) abort(); /* checking and building disagree */
        if (sb != KILN_OK && strcmp(msg, kiln_error_message()) != 0) abort();
        if (bc.parameters != bb.parameters || bc.largest_activation != bb.largest_activation) abort();
    }
    if (!m) return;
    if (kiln_module_num_parameters(m) != bb.parameters) abort(); /* the budget counts what is built */
    /* A conv's im2col holds C_in*k*k (<= parameters) by OH*OW (<= the
     * largest activation) values: run the models where that is small. */
    if (bb.parameters * bb.largest_activation > (1 << 22)) {
        kiln_module_free(m);
        return;
    }
    kiln_scope_begin();
    kiln_module_train(m, false);
    kiln_tensor *x = kiln_zeros(KILN_SHAPE(1, c, h, w), KILN_F32, KILN_CPU);
    if (!kiln_module_forward(m, x)) abort(); /* inferred shapes disagree with the layers */
    kiln_scope_end();
    kiln_module_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static bool ready;
    if (!ready) {
        if (kiln_init() != KILN_OK) abort();
        ready = true;
    }
    if (size > 4096) return 0;
    parse_and_run(data, size, 1, 8, 8);
    parse_and_run(data, size, 3, 5, 7);
    return 0;
}

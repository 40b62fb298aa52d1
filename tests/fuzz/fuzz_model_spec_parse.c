/* libFuzzer target for the model-spec parser alone: the input is the spec
 * text, checked with kiln_model_spec_check (every check and count of the
 * parser, no module built, no tensor allocated) for three input shapes,
 * with and without a budget. Thousands of times faster than building
 * (fuzz_model_spec), so it reaches the 10^7 executions of
 * scripts/full-check.sh. Errors are the expected outcome for almost every
 * input; crashes, sanitizer reports (UBSan: the shape arithmetic on
 * numbers up to 2^30) and broken invariants (abort) are findings. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "kiln/kiln.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const uint8_t *data, size_t size, int64_t c, int64_t h, int64_t w) {
    const char *text = (const char *)data;
    kiln_model_spec_budget open = {0};
    kiln_status st = kiln_model_spec_check(text, size, "fuzz.txt", c, h, w, &open);
    /* Counts saturate, never wrap. */
    if (open.parameters < 0 || open.largest_activation < 0) abort();
    /* A budget at exactly what the spec needs accepts it; one below the
     * need refuses it, naming the limit's count. */
    if (st == KILN_OK && open.parameters > 0 && open.parameters < INT64_MAX) {
        kiln_model_spec_budget at = {.max_parameters = open.parameters, .max_activation = open.largest_activation};
        if (kiln_model_spec_check(text, size, "fuzz.txt", c, h, w, &at) != KILN_OK) abort();
        if (at.parameters != open.parameters || at.largest_activation != open.largest_activation) abort();
        /* One below the need; a spec of one parameter has no such limit (0 means none). */
        if (open.parameters > 1) {
            kiln_model_spec_budget below = {.max_parameters = open.parameters - 1};
            if (kiln_model_spec_check(text, size, "fuzz.txt", c, h, w, &below) == KILN_OK) abort();
            if (below.parameters <= below.max_parameters) abort(); /* the refused count passes the limit */
        }
    }
    /* The message names the spec and has a line, or the whole-spec error. */
    if (st != KILN_OK && !kiln_error_message()[0]) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1 << 16)) return 0;
    check(data, size, 1, 8, 8);
    check(data, size, 3, 32, 32);
    check(data, size, 1073741824, 1, 1073741824); /* the largest input sizes a spec may have */
    return 0;
}

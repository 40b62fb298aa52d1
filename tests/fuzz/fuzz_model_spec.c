/* libFuzzer target for the model-spec parser. The input is the spec text;
 * it is parsed for two input shapes (a small and a CIFAR-sized image), and
 * a module that parses is run forward once on a tiny batch, so the inferred
 * shapes are held against the layers' own checks: a spec the parser
 * accepts must run (abort otherwise). Errors are the expected outcome for
 * almost every input; crashes, sanitizer reports and leaks are findings. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "kiln/kiln.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void parse_and_run(const uint8_t *data, size_t size, int64_t c, int64_t h, int64_t w) {
    kiln_module *m = NULL;
    /* A budget keeps every accepted model fast to build (a spec may ask for
     * billions of parameters: refused before allocating, its line named). */
    kiln_model_spec_budget b = {.max_parameters = 1 << 22, .max_activation = 1 << 20};
    if (kiln_model_spec_parse_limited((const char *)data, size, "fuzz.txt", c, h, w, &b, &m) != KILN_OK) {
        if (m) abort(); /* failure must leave *out NULL */
        return;
    }
    if (kiln_module_num_parameters(m) != b.parameters) abort(); /* the budget counts what is built */
    /* Forward only small models: the fuzzer is after parser bugs, not slow
     * convs. A conv's im2col holds C_in*k*k (<= parameters) by OH*OW (<= the
     * largest activation) values per image. */
    if (b.parameters <= (1 << 16) && b.parameters * b.largest_activation <= (1 << 24)) {
        kiln_scope_begin();
        kiln_module_train(m, false);
        kiln_tensor *x = kiln_zeros(KILN_SHAPE(1, c, h, w), KILN_F32, KILN_CPU);
        if (!kiln_module_forward(m, x)) abort(); /* inferred shapes disagree with the layers */
        kiln_scope_end();
    }
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

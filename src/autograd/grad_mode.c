/* Grad mode: a small per-thread stack of on/off, so no_grad regions nest
 * and an enable_grad inside a no_grad works. */
#include "autograd/autograd_internal.h"
#include "base/error.h"

#define GRAD_MODE_DEPTH 64

static _Thread_local bool mode_stack[GRAD_MODE_DEPTH];
static _Thread_local int mode_depth;

bool kiln_is_grad_enabled(void) { return mode_depth == 0 ? true : mode_stack[mode_depth - 1]; }

static void push(bool on) {
    /* Past the depth limit the mode still changes; only the restore of the
     * deepest levels is lost, which a KILN_ASSERT would turn into a crash. */
    if (mode_depth < GRAD_MODE_DEPTH) mode_stack[mode_depth++] = on;
    else mode_stack[GRAD_MODE_DEPTH - 1] = on;
}

void kiln_no_grad_begin(void) { push(false); }
void kiln_enable_grad_begin(void) { push(true); }

kiln_status kiln_grad_mode_end(void) {
    if (mode_depth == 0)
        return KILN_RAISE(KILN_ERR_STATE, "pair every kiln_no_grad_begin / kiln_enable_grad_begin with one end",
                          "kiln_grad_mode_end: no grad mode region is open");
    mode_depth--;
    return KILN_OK;
}

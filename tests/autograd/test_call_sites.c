/* Call sites recorded for nested calls (kiln_site_mark / kiln_site_done
 * in kiln/tensor.h): in `kiln_sum(kiln_module_forward(m, x), ...)` the sum
 * and the ops the forward runs each name their own line (before, the
 * forward took the sum's mark and the sum was recorded at (unknown):0); a
 * call without a macro nested in a macro call's arguments takes that
 * call's line; a lone call without a macro has no site.
 *
 * The ops a custom module's forward runs are recorded at the forward's
 * call site; the forward here keeps a reference to its result so the
 * test can read that site. A macro call spanning lines gets the line of
 * its name (GCC) or of its closing parenthesis (Clang): outer sites are
 * checked against both. */
#include "test_util.h"

static kiln_tensor *inner_result;

static kiln_tensor *square_forward(kiln_module *m, kiln_tensor *x, void *user) {
    (void)m, (void)user;
    kiln_tensor *y = kiln_mul(x, x);
    kiln_release(inner_result);
    inner_result = y ? kiln_retain(y) : NULL;
    return y;
}

static bool site_is(const kiln_tensor *t, int first, int last) {
    int line = -1;
    const char *file = t ? kiln_grad_fn_site(t, &line) : "(no tensor)";
    bool ok = strstr(file, "test_call_sites.c") && (line == first || line == last);
    if (!ok) fprintf(stderr, "site %s:%d, wanted this file at line %d or %d\n", file, line, first, last);
    return ok;
}

static kiln_tensor *leaf3(void) {
    double v[3] = {1, -2, 3};
    kiln_tensor *t = kiln_from_data(KILN_SHAPE(3), KILN_F64, KILN_CPU, v);
    CHECK_OK(kiln_set_requires_grad(t, true));
    return t;
}

static void test_sum_of_forward(void) {
    kiln_scope_begin();
    kiln_module *m = kiln_nn_custom("Square", square_forward, NULL);
    kiln_tensor *x = leaf3();
    int line = __LINE__ + 1;
    kiln_tensor *loss = kiln_sum(
        kiln_module_forward(m, x),
        0, NULL, false);
    CHECK(loss != NULL);
    CHECK(site_is(loss, line, line + 2));
    CHECK(site_is(inner_result, line + 1, line + 1));
    /* On one line: both name it. */
    line = __LINE__ + 1;
    kiln_tensor *loss2 = kiln_sum(kiln_module_forward(m, x), 0, NULL, false);
    CHECK(site_is(loss2, line, line));
    CHECK(site_is(inner_result, line, line));
    kiln_module_free(m);
    CHECK_OK(kiln_scope_end());
    /* After the scope: at depth 0 a release would take the scope's
     * registration of the same tensor rather than this reference. */
    kiln_release(inner_result);
    inner_result = NULL;
}

static void test_nested_ops(void) {
    kiln_scope_begin();
    kiln_tensor *a = leaf3();
    /* Three levels of macro calls, each on its own line. */
    int line = __LINE__ + 1;
    kiln_tensor *outer = kiln_mean(
        kiln_exp(
            kiln_mul(a, a)),
        0, NULL, false);
    CHECK(site_is(outer, line, line + 3));
    /* A call without a macro (kiln_reshape, a view) inside a macro call's
     * arguments takes that call's line and leaves the next call its own. */
    line = __LINE__ + 1;
    kiln_tensor *s = kiln_sum(
        kiln_reshape(a, KILN_SHAPE(3, 1)),
        0, NULL, false);
    CHECK(site_is(s, line, line + 2));
    kiln_tensor *t = kiln_neg(a);
    CHECK(site_is(t, __LINE__ - 1, __LINE__ - 1));
    /* A lone call without a macro has no site (no mark was left behind). */
    kiln_tensor *r = kiln_reshape(a, KILN_SHAPE(1, 3));
    int l = -1;
    CHECK(strcmp(kiln_grad_fn_site(r, &l), "(unknown)") == 0 && l == 0);
    CHECK_OK(kiln_scope_end());
}

int main(void) {
    CHECK_OK(kiln_init());
    test_sum_of_forward();
    test_nested_ops();
    kiln_shutdown();
    return kt_finish();
}

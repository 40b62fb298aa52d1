/* The backward engine's error path: when a node's backward fails after
 * filling some inputs' gradients, or an input's accumulation fails and a
 * later input is a node, every gradient is dropped exactly once and the
 * error comes back from kiln_backward (before the fix the gradient for a
 * later node input was dropped twice: a use after free under ASan). The
 * node under test is an internal function node (kiln_node_record_fn, what
 * gradient checkpointing records) over a leaf `a` and a non-leaf `y`. */
#include "autograd/autograd_internal.h"
#include "base/error.h"
#include "test_util.h"

typedef enum { FILL_THEN_FAIL, WRONG_SHAPE_FOR_LEAF, SUCCEED } backward_mode;

/* The gradients the function's backward hands out: ones for each input,
 * of the leaf's shape (3) or, in WRONG_SHAPE_FOR_LEAF, of shape (4) for
 * input 0, which the leaf's accumulation into its (3) .grad refuses. */
static kiln_status test_backward(kiln_node *n, kiln_tensor **grad_out, kiln_tensor **grad_in) {
    (void)grad_out;
    backward_mode mode = *(backward_mode *)n->fn_state;
    for (int i = 0; i < n->n_in; i++) {
        int64_t len = mode == WRONG_SHAPE_FOR_LEAF && i == 0 ? 4 : 3;
        grad_in[i] = kiln_ones(KILN_SHAPE(len), KILN_F64, KILN_CPU);
        if (!grad_in[i]) return kiln_error_last()->status;
    }
    if (mode == FILL_THEN_FAIL)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "test_backward: failing after filling %d gradients",
                          n->n_in);
    return KILN_OK;
}

static void state_free(void *state) { free(state); }

static const kiln_node_fn test_fn = {"test_fn", "test_fn_backward", test_backward, state_free};

static double grad_sum(kiln_tensor *t) {
    kiln_tensor *g = kiln_grad(t);
    double v = NAN;
    kiln_tensor *s = g ? kiln_sum(g, 0, NULL, false) : NULL;
    if (s) kiln_item(s, &v);
    kiln_release(s);
    kiln_release(g);
    return v;
}

/* loss = sum(f(a, y)), y = b * 2; returns kiln_backward's status and
 * leaves the leaves' gradient sums in *da, *db. */
static kiln_status run(backward_mode mode, bool leaf_has_grad, double *da, double *db) {
    kiln_scope_begin();
    double v[3] = {1, 2, 3};
    kiln_tensor *a = kiln_from_data(KILN_SHAPE(3), KILN_F64, KILN_CPU, v);
    kiln_tensor *b = kiln_from_data(KILN_SHAPE(3), KILN_F64, KILN_CPU, v);
    CHECK_OK(kiln_set_requires_grad(a, true));
    CHECK_OK(kiln_set_requires_grad(b, true));
    if (leaf_has_grad) CHECK_OK(kiln_set_grad(a, kiln_zeros(KILN_SHAPE(3), KILN_F64, KILN_CPU)));
    kiln_tensor *y = kiln_mul_scalar(b, 2.0);
    kiln_tensor *out = kiln_zeros(KILN_SHAPE(3), KILN_F64, KILN_CPU);
    backward_mode *state = malloc(sizeof *state);
    *state = mode;
    CHECK_OK(kiln_node_record_fn(&test_fn, state, 2, (kiln_tensor *[]){a, y}, 1, &out, KILN_CPU));
    kiln_tensor *loss = kiln_sum(out, 0, NULL, false);
    kiln_error_clear();
    kiln_status st = kiln_backward(loss, NULL, false);
    *da = grad_sum(a);
    *db = grad_sum(b);
    CHECK_OK(kiln_scope_end());
    return st;
}

static void test_formula_fails_after_filling(void) {
    double da, db;
    CHECK_FAILS(run(FILL_THEN_FAIL, false, &da, &db), KILN_ERR_INVALID_ARGUMENT, "failing after filling 2");
    CHECK(isnan(da) && isnan(db)); /* no gradient reached either leaf */
}

static void test_leaf_accumulation_fails_before_a_node(void) {
    double da, db;
    CHECK_FAILS(run(WRONG_SHAPE_FOR_LEAF, true, &da, &db), KILN_ERR_INVALID_ARGUMENT, "shape");
    CHECK(da == 0.0); /* .grad as it was */
    CHECK(isnan(db)); /* y's node never ran */
}

/* The same graph with a backward that succeeds: the gradients arrive. */
static void test_function_node_succeeds(void) {
    double da, db;
    CHECK_OK(run(SUCCEED, false, &da, &db));
    CHECK(da == 3.0 && db == 6.0);
}

int main(void) {
    CHECK_OK(kiln_init());
    test_function_node_succeeds();
    test_formula_fails_after_filling();
    test_leaf_accumulation_fails_before_a_node();
    kiln_shutdown();
    return kt_finish();
}

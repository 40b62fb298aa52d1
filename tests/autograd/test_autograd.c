/* The autograd engine: accumulation, graph release, version counters, grad
 * mode, detach, hooks (leaf, non-leaf, post-accumulate), call sites. */
#include "test_util.h"

static double value_at(kiln_tensor *t, int64_t i) {
    kiln_tensor *flat = kiln_reshape(t, KILN_SHAPE(-1));
    kiln_tensor *one = kiln_narrow(flat, 0, i, 1);
    double v = NAN;
    kiln_item(one, &v);
    kiln_release(one);
    kiln_release(flat);
    return v;
}

static kiln_tensor *leaf(const double *v, int64_t n) {
    kiln_tensor *t = kiln_from_data(KILN_SHAPE(n), KILN_F64, KILN_CPU, v);
    kiln_set_requires_grad(t, true);
    return t;
}

static void test_chain_and_accumulation(void) {
    kiln_scope_begin();
    double xv[3] = {1, 2, 3}, wv[3] = {0.5, -1, 2};
    kiln_tensor *x = leaf(xv, 3), *w = leaf(wv, 3);
    /* loss = sum(x * w + x) -> dx = w + 1, dw = x */
    kiln_tensor *loss = kiln_sum(kiln_add(kiln_mul(x, w), x), 0, NULL, false);
    CHECK(loss != NULL);
    CHECK(kiln_grad_fn_name(loss) && strcmp(kiln_grad_fn_name(loss), "sum") == 0);
    int line = 0;
    const char *file = kiln_grad_fn_site(loss, &line);
    CHECK_MSG(strstr(file, "test_autograd.c") && line > 0, "site %s:%d", file, line);
    CHECK_OK(kiln_backward(loss, NULL, true));
    kiln_tensor *gx = kiln_grad(x), *gw = kiln_grad(w);
    for (int i = 0; i < 3; i++) {
        CHECK(value_at(gx, i) == wv[i] + 1);
        CHECK(value_at(gw, i) == xv[i]);
    }
    /* A second backward (graph retained) accumulates into .grad. */
    CHECK_OK(kiln_backward(loss, NULL, false));
    kiln_tensor *gx2 = kiln_grad(x);
    for (int i = 0; i < 3; i++) CHECK(value_at(gx2, i) == 2 * (wv[i] + 1));
    /* The graph is now freed: a third backward is an error naming the fix. */
    CHECK_FAILS(kiln_backward(loss, NULL, false), KILN_ERR_STATE, "retain_graph");
    CHECK_OK(kiln_set_grad(x, NULL));
    CHECK(kiln_grad(x) == NULL);
    kiln_scope_end();
}

static void test_version_counter(void) {
    kiln_scope_begin();
    double v[2] = {1, 2};
    kiln_tensor *x = leaf(v, 2);
    kiln_tensor *y = kiln_mul_scalar(x, 2.0); /* non-leaf */
    kiln_tensor *z = kiln_mul(y, y);           /* saves y */
    kiln_tensor *one = kiln_ones(KILN_SHAPE(2), KILN_F64, KILN_CPU);
    kiln_no_grad_begin();
    CHECK(kiln_add_(y, one) != NULL); /* modifies a saved tensor */
    kiln_grad_mode_end();
    CHECK_FAILS(kiln_backward(kiln_sum(z, 0, NULL, false), NULL, false), KILN_ERR_STATE, "modified in place");
    /* In place on a leaf that requires grad is refused before it happens. */
    CHECK_NULL_ERR(kiln_add_(x, one), "leaf tensor that requires grad");
    CHECK(value_at(x, 0) == 1.0);
    kiln_scope_end();
}

static void test_grad_mode_and_detach(void) {
    kiln_scope_begin();
    double v[2] = {1, 2};
    kiln_tensor *x = leaf(v, 2);
    CHECK(kiln_is_grad_enabled());
    kiln_no_grad_begin();
    CHECK(!kiln_is_grad_enabled());
    kiln_tensor *a = kiln_mul(x, x);
    CHECK(!kiln_requires_grad(a) && kiln_grad_fn_name(a) == NULL);
    kiln_enable_grad_begin();
    kiln_tensor *b = kiln_mul(x, x);
    CHECK(kiln_requires_grad(b));
    CHECK_OK(kiln_grad_mode_end());
    CHECK_OK(kiln_grad_mode_end());
    CHECK(kiln_is_grad_enabled());
    CHECK_FAILS(kiln_grad_mode_end(), KILN_ERR_STATE, "no grad mode region");
    kiln_tensor *d = kiln_detach(b);
    CHECK(!kiln_requires_grad(d) && kiln_is_leaf(d) && kiln_shares_storage(d, b));
    kiln_tensor *i = kiln_zeros(KILN_SHAPE(2), KILN_I64, KILN_CPU);
    CHECK_FAILS(kiln_set_requires_grad(i, true), KILN_ERR_INVALID_ARGUMENT, "floating");
    CHECK_FAILS(kiln_set_requires_grad(b, true), KILN_ERR_INVALID_ARGUMENT, "leaves");
    CHECK_FAILS(kiln_backward(d, NULL, false), KILN_ERR_INVALID_ARGUMENT, "does not require grad");
    CHECK_FAILS(kiln_backward(b, NULL, false), KILN_ERR_INVALID_ARGUMENT, "one-element");
    kiln_scope_end();
}

typedef struct hook_log {
    int calls[4];
    int order[8];
    int n;
} hook_log;

static hook_log hlog;

static kiln_tensor *double_it(kiln_tensor *g, void *user) {
    (void)user;
    hlog.calls[0]++;
    hlog.order[hlog.n++] = 0;
    return kiln_mul_scalar(g, 2.0);
}

static kiln_tensor *observe(kiln_tensor *g, void *user) {
    (void)g;
    hlog.calls[(int)(intptr_t)user]++;
    hlog.order[hlog.n++] = (int)(intptr_t)user;
    return NULL;
}

static void post(kiln_tensor *leaf_t, void *user) {
    hlog.calls[3]++;
    hlog.order[hlog.n++] = 3;
    kiln_tensor *g = kiln_grad(leaf_t);
    /* Post-accumulate: .grad already holds this backward's contribution. */
    CHECK(g != NULL && value_at(g, 0) == *(double *)user);
    kiln_release(g);
}

static void test_hooks(void) {
    kiln_scope_begin();
    memset(&hlog, 0, sizeof hlog);
    double v[2] = {3, 4};
    kiln_tensor *x = leaf(v, 2);
    kiln_tensor *y = kiln_mul_scalar(x, 5.0);
    CHECK_OK(kiln_register_hook(y, double_it, NULL));            /* non-leaf: doubles dL/dy */
    CHECK_OK(kiln_register_hook(x, observe, (void *)(intptr_t)1)); /* leaf: sees dL/dx */
    double expected = 10.0;                                      /* 1 * 2 (hook) * 5 */
    CHECK_OK(kiln_register_post_accumulate_hook(x, post, &expected));
    CHECK_FAILS(kiln_register_post_accumulate_hook(y, post, &expected), KILN_ERR_INVALID_ARGUMENT, "not a leaf");
    CHECK_OK(kiln_backward(kiln_sum(y, 0, NULL, false), NULL, false));
    CHECK_EQ_I(hlog.calls[0], 1);
    CHECK_EQ_I(hlog.calls[1], 1);
    CHECK_EQ_I(hlog.calls[3], 1);
    CHECK(hlog.n == 3 && hlog.order[0] == 0 && hlog.order[1] == 1 && hlog.order[2] == 3);
    kiln_tensor *g = kiln_grad(x);
    CHECK(value_at(g, 1) == 10.0);
    kiln_scope_end();
}

static void test_views_and_devices(void) {
    kiln_scope_begin();
    double v[6] = {1, 2, 3, 4, 5, 6};
    kiln_tensor *x = kiln_from_data(KILN_SHAPE(2, 3), KILN_F64, KILN_CPU, v);
    kiln_set_requires_grad(x, true);
    /* Gradients flow through views: transpose, narrow, expand, reshape. */
    kiln_tensor *t = kiln_transpose(x, 0, 1);             /* (3, 2) */
    kiln_tensor *n = kiln_narrow(t, 0, 1, 2);             /* rows 1..2 of t: x[:, 1:3]^T */
    kiln_tensor *e = kiln_expand(kiln_unsqueeze(n, 0), KILN_SHAPE(3, 2, 2));
    kiln_tensor *loss = kiln_sum(kiln_reshape(e, KILN_SHAPE(-1)), 0, NULL, false);
    CHECK_OK(kiln_backward(loss, NULL, false));
    kiln_tensor *g = kiln_grad(x);
    double want[6] = {0, 3, 3, 0, 3, 3};
    for (int i = 0; i < 6; i++) CHECK_MSG(value_at(g, i) == want[i], "grad[%d] = %g", i, value_at(g, i));
    /* One device per op, or an error naming both devices, with kiln_to in
     * the hint (and only there). */
    kiln_tensor *m = kiln_zeros(KILN_SHAPE(2, 3), KILN_F64, KILN_META);
    CHECK_NULL_ERR(kiln_add(x, m), "input 0 is on cpu but input 1 is on meta");
    CHECK(strstr(kiln_error_last()->hint, "kiln_to") && !strstr(kiln_error_message(), "kiln_to"));
    kiln_scope_end();
}

static void test_meta_backward(void) {
    /* A graph on meta records and runs backward without data. */
    kiln_scope_begin();
    kiln_tensor *x = kiln_zeros(KILN_SHAPE(4, 5), KILN_F32, KILN_META);
    kiln_set_requires_grad(x, true);
    kiln_tensor *loss = kiln_sum(kiln_mul(x, x), 0, NULL, false);
    CHECK(loss != NULL);
    CHECK_OK(kiln_backward(loss, kiln_ones(KILN_SHAPE(), KILN_F32, KILN_META), false));
    kiln_tensor *g = kiln_grad(x);
    CHECK(g && kiln_size(g, 0) == 4 && kiln_size(g, 1) == 5 && kiln_get_device(g).type == KILN_DEVICE_META);
    kiln_scope_end();
}

int main(void) {
    if (kiln_init()) return 1;
    test_chain_and_accumulation();
    test_version_counter();
    test_grad_mode_and_detach();
    test_hooks();
    test_views_and_devices();
    test_meta_backward();
    kiln_shutdown();
    return kt_finish();
}

/* The backward's gradient buffers: a gradient the engine alone holds is
 * written over in place (ReLU's backward, the sum of two branches), never
 * one that someone else can still see (the caller's grad_output, a hook's
 * copy, another branch, another leaf's .grad); two leaves never end up
 * sharing one .grad buffer. Values are checked against the formulas, and
 * the allocator's counts show the reuse. */
#include "test_util.h"

static float *host(kiln_tensor *t) {
    int64_t n = kiln_numel(t);
    float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (v && kiln_to_host(t, v, sizeof(float) * (size_t)n)) {
        free(v);
        v = NULL;
    }
    return v;
}

/* Values -1.5, -0.5, 0.5, 1.5, ... repeating: half of them negative. */
static kiln_tensor *pattern(int64_t n, float scale) {
    float *v = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) v[i] = scale * ((float)(i % 4) - 1.5f);
    kiln_tensor *t = kiln_from_data(KILN_SHAPE(n), KILN_F32, KILN_CPU, v);
    free(v);
    return t;
}

static bool all_equal(kiln_tensor *t, const float *want, int64_t n) {
    float *got = host(t);
    bool ok = got != NULL;
    for (int64_t i = 0; ok && i < n; i++) ok = got[i] == want[i];
    free(got);
    return ok;
}

/* Blocks of at least 1 MiB the allocator handed out so far. */
static int64_t large_allocations(void) {
    kiln_memory_stats s;
    CHECK_OK(kiln_memory_stats_get(KILN_CPU, &s));
    return s.allocation[KILN_POOL_LARGE].allocated;
}

/* A chain of ReLUs: the gradient the engine creates (ones) travels down
 * the chain in one buffer; the values are the mask of every positive
 * output. */
static void test_relu_chain_reuses(void) {
    kiln_scope_begin();
    const int64_t n = 1 << 20; /* 4 MiB per tensor */
    kiln_tensor *x = pattern(n, 1.0f);
    CHECK_OK(kiln_set_requires_grad(x, true));
    kiln_tensor *h = kiln_relu(x);
    for (int i = 0; i < 7; i++) {
        kiln_tensor *next = kiln_relu(h);
        kiln_release(h);
        h = next;
    }
    kiln_tensor *s = kiln_sum(h, 0, NULL, false);
    int64_t before = large_allocations();
    CHECK_OK(kiln_backward(s, NULL, false));
    int64_t during = large_allocations() - before;
    /* the sum's expanded gradient, then every ReLU writes into it; the
     * leaf takes that buffer as .grad */
    printf("large blocks allocated by the backward of 8 ReLUs: %lld\n", (long long)during);
    CHECK_MSG(during <= 2, "the backward of 8 ReLUs allocated %lld large blocks (want at most 2)", (long long)during);
    float *want = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) want[i] = (float)(i % 4) - 1.5f > 0 ? 1.0f : 0.0f;
    kiln_tensor *g = kiln_grad(x);
    CHECK_MSG(g && all_equal(g, want, n), "ReLU chain gradient wrong");
    free(want);
    kiln_release(g);
    kiln_scope_end();
}

/* The caller's grad_output is read, never written. */
static void test_grad_output_untouched(void) {
    kiln_scope_begin();
    const int64_t n = 1 << 18;
    kiln_tensor *x = pattern(n, 1.0f), *go = pattern(n, 3.0f);
    CHECK_OK(kiln_set_requires_grad(x, true));
    kiln_tensor *y = kiln_relu(x);
    float *before = host(go);
    CHECK_OK(kiln_backward(y, go, false));
    CHECK_MSG(all_equal(go, before, n), "kiln_backward wrote into the caller's grad_output");
    float *want = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) want[i] = (float)(i % 4) - 1.5f > 0 ? before[i] : 0.0f;
    kiln_tensor *g = kiln_grad(x);
    CHECK_MSG(g && all_equal(g, want, n), "gradient through ReLU wrong");
    free(before);
    free(want);
    kiln_release(g);
    kiln_scope_end();
}

/* A hook that keeps (a reference to) the gradient it saw. */
static kiln_tensor *kept;
static kiln_tensor *keep_hook(kiln_tensor *grad, void *user) {
    (void)user;
    kept = kiln_retain(grad);
    return NULL;
}

/* A gradient a hook holds on to is not written over by the next ReLU. */
static void test_hooked_gradient_untouched(void) {
    kiln_scope_begin();
    const int64_t n = 1 << 18;
    kiln_tensor *x = pattern(n, 1.0f);
    CHECK_OK(kiln_set_requires_grad(x, true));
    kiln_tensor *h = kiln_relu(x);
    kiln_tensor *y = kiln_mul_scalar(h, 2.0);
    CHECK_OK(kiln_register_hook(h, keep_hook, NULL));
    kiln_tensor *s = kiln_sum(y, 0, NULL, false);
    CHECK_OK(kiln_backward(s, NULL, false));
    float *twos = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) twos[i] = 2.0f;
    CHECK_MSG(kept && all_equal(kept, twos, n), "the gradient a hook kept was overwritten");
    kiln_release(kept);
    kept = NULL;
    free(twos);
    kiln_scope_end();
}

/* z = a + b: both leaves get the one gradient; they must not share a
 * buffer (an in-place change to one .grad must not show in the other). */
static void test_sum_leaves_do_not_share(void) {
    kiln_scope_begin();
    const int64_t n = 1 << 18;
    kiln_tensor *a = pattern(n, 1.0f), *b = pattern(n, 2.0f);
    CHECK_OK(kiln_set_requires_grad(a, true));
    CHECK_OK(kiln_set_requires_grad(b, true));
    kiln_tensor *z = kiln_add(a, b);
    kiln_tensor *w = pattern(n, 0.5f);
    kiln_tensor *s = kiln_sum(kiln_mul(z, w), 0, NULL, false);
    CHECK_OK(kiln_backward(s, NULL, false));
    kiln_tensor *ga = kiln_grad(a), *gb = kiln_grad(b);
    CHECK(ga && gb);
    if (ga && gb) {
        CHECK_MSG(kiln_data_ptr(ga) != kiln_data_ptr(gb), "two leaves share one .grad buffer");
        float *wv = host(w);
        CHECK_MSG(all_equal(ga, wv, n) && all_equal(gb, wv, n), "a + b: gradients wrong");
        kiln_tensor *r = kiln_add_(ga, ga); /* ga doubled in place */
        kiln_release(r);
        CHECK_MSG(all_equal(gb, wv, n), "doubling a.grad in place changed b.grad");
        free(wv);
    }
    kiln_release(ga);
    kiln_release(gb);
    kiln_scope_end();
}

/* x used by two branches, one of which also reaches x directly:
 * the accumulations (some in place, some not) give the formula's value. */
static void test_branch_accumulation(void) {
    kiln_scope_begin();
    const int64_t n = 1 << 18;
    kiln_tensor *x = pattern(n, 1.0f);
    CHECK_OK(kiln_set_requires_grad(x, true));
    /* y = relu(x) + (x + x) * 3: dy/dx = [x > 0] + 6 */
    kiln_tensor *r = kiln_relu(x);
    kiln_tensor *d = kiln_add(x, x);
    kiln_tensor *t = kiln_mul_scalar(d, 3.0);
    kiln_tensor *y = kiln_add(r, t);
    kiln_tensor *s = kiln_sum(y, 0, NULL, false);
    CHECK_OK(kiln_backward(s, NULL, false));
    float *want = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) want[i] = ((float)(i % 4) - 1.5f > 0 ? 1.0f : 0.0f) + 6.0f;
    kiln_tensor *g = kiln_grad(x);
    CHECK_MSG(g && all_equal(g, want, n), "branch accumulation gives the wrong gradient");
    /* a second backward accumulates into the existing .grad */
    kiln_tensor *y2 = kiln_relu(x);
    kiln_tensor *s2 = kiln_sum(y2, 0, NULL, false);
    CHECK_OK(kiln_backward(s2, NULL, false));
    for (int64_t i = 0; i < n; i++) want[i] += (float)(i % 4) - 1.5f > 0 ? 1.0f : 0.0f;
    kiln_tensor *g2 = kiln_grad(x);
    CHECK_MSG(g2 && all_equal(g2, want, n), "second backward did not accumulate");
    CHECK_MSG(g && g2 && kiln_data_ptr(g) == kiln_data_ptr(g2), ".grad was replaced instead of accumulated into");
    free(want);
    kiln_release(g);
    kiln_release(g2);
    kiln_scope_end();
}

/* A residual block whose body ends in a ReLU (which saves its output):
 * the block's sum must not be written into that output. */
static void test_residual_saved_output(void) {
    kiln_scope_begin();
    kiln_module *m = NULL;
    kiln_manual_seed(5);
    CHECK_OK(kiln_model_spec_parse("residual {\n  conv 4 k3 p1\n  relu\n}\nflatten\nlinear 3\n", "res", 4, 5, 5, &m));
    kiln_tensor *x = kiln_randn(KILN_SHAPE(2, 4, 5, 5), KILN_F32, KILN_CPU);
    kiln_tensor *out = kiln_module_forward(m, x);
    kiln_tensor *s = out ? kiln_sum(out, 0, NULL, false) : NULL;
    CHECK(s != NULL);
    if (s) CHECK_OK(kiln_backward(s, NULL, false));
    kiln_module_free(m);
    kiln_scope_end();
}

int main(void) {
    if (kiln_init()) return 1;
    test_relu_chain_reuses();
    test_grad_output_untouched();
    test_hooked_gradient_untouched();
    test_sum_leaves_do_not_share();
    test_branch_accumulation();
    test_residual_saved_output();
    kiln_shutdown();
    return kt_finish();
}

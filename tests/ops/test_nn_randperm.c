/* randperm (a permutation, reproducible from the seed, the same words on
 * every backend), batch norm's running statistics switch (momentum < 0:
 * no update), and the stack/flatten composites' shapes on meta. */
#include "test_util.h"

static void read_i64(kiln_tensor *t, int64_t *out, int64_t n) {
    CHECK_OK(kiln_to_host(t, out, sizeof(int64_t) * (size_t)n));
}

static void test_randperm(void) {
    enum { N = 50 };
    int64_t a[N], b[N], c[N];
    kiln_manual_seed(7);
    kiln_tensor *p = kiln_randperm(N, KILN_CPU);
    CHECK(p && kiln_dtype_of(p) == KILN_I64 && kiln_numel(p) == N);
    read_i64(p, a, N);
    int seen[N] = {0};
    for (int i = 0; i < N; i++) {
        CHECK(a[i] >= 0 && a[i] < N);
        if (a[i] >= 0 && a[i] < N) seen[a[i]]++;
    }
    for (int i = 0; i < N; i++) CHECK_MSG(seen[i] == 1, "value %d appears %d times", i, seen[i]);
    kiln_tensor *q = kiln_randperm(N, KILN_CPU);
    read_i64(q, b, N);
    CHECK(memcmp(a, b, sizeof a) != 0); /* the next draw differs */
    kiln_manual_seed(7);
    kiln_tensor *r = kiln_randperm(N, KILN_CPU);
    read_i64(r, c, N);
    CHECK(memcmp(a, c, sizeof a) == 0); /* same seed, same permutation */
    kiln_tensor *e = kiln_randperm(0, KILN_CPU);
    CHECK(e && kiln_numel(e) == 0);
    CHECK_NULL_ERR(kiln_randperm(-1, KILN_CPU), "n is -1");
    kiln_device meta = {KILN_DEVICE_META, 0};
    kiln_tensor *m = kiln_randperm(9, meta);
    CHECK(m && kiln_numel(m) == 9);
    kiln_release(p), kiln_release(q), kiln_release(r), kiln_release(e), kiln_release(m);
}

static void test_batch_norm_no_update(void) {
    kiln_manual_seed(1);
    kiln_tensor *x = kiln_randn(KILN_SHAPE(4, 2, 3), KILN_F32, KILN_CPU);
    kiln_tensor *rm = kiln_zeros(KILN_SHAPE(2), KILN_F32, KILN_CPU);
    kiln_tensor *rv = kiln_ones(KILN_SHAPE(2), KILN_F32, KILN_CPU);
    kiln_tensor *y = kiln_batch_norm(x, NULL, NULL, rm, rv, true, -1.0, 1e-5);
    CHECK(y != NULL);
    float m[2], v[2];
    CHECK_OK(kiln_to_host(rm, m, sizeof m));
    CHECK_OK(kiln_to_host(rv, v, sizeof v));
    CHECK(m[0] == 0.0f && m[1] == 0.0f && v[0] == 1.0f && v[1] == 1.0f);
    kiln_tensor *y2 = kiln_batch_norm(x, NULL, NULL, rm, rv, true, 0.5, 1e-5);
    CHECK_OK(kiln_to_host(rm, m, sizeof m));
    CHECK(m[0] != 0.0f && m[1] != 0.0f);
    CHECK_NULL_ERR(kiln_batch_norm(x, NULL, NULL, NULL, NULL, false, 0.1, 1e-5), "running statistics");
    kiln_release(x), kiln_release(rm), kiln_release(rv), kiln_release(y), kiln_release(y2);
}

static void test_meta_shapes(void) {
    kiln_device meta = {KILN_DEVICE_META, 0};
    kiln_tensor *x = kiln_empty(KILN_SHAPE(128, 1, 28, 28), KILN_F32, meta);
    kiln_tensor *w = kiln_empty(KILN_SHAPE(32, 1, 3, 3), KILN_F32, meta);
    kiln_conv2d_opts o = {.padding = {1, 1}};
    kiln_tensor *y = kiln_conv2d(x, w, NULL, &o);
    CHECK(y && kiln_size(y, 0) == 128 && kiln_size(y, 1) == 32 && kiln_size(y, 2) == 28);
    kiln_pool2d_opts po = kiln_pool2d_defaults(2);
    kiln_tensor *idx = NULL;
    kiln_tensor *p = kiln_max_pool2d(y, &po, &idx);
    CHECK(p && kiln_size(p, 2) == 14 && idx && kiln_dtype_of(idx) == KILN_I64);
    kiln_tensor *f = kiln_flatten(p, 1, -1);
    CHECK(f && kiln_ndim(f) == 2 && kiln_size(f, 1) == 32 * 14 * 14);
    kiln_tensor *parts[2] = {f, f};
    kiln_tensor *s = kiln_stack(2, parts, 0);
    CHECK(s && kiln_ndim(s) == 3 && kiln_size(s, 0) == 2);
    kiln_release(x), kiln_release(w), kiln_release(y), kiln_release(p), kiln_release(idx);
    kiln_release(f), kiln_release(s);
}

int main(void) {
    if (kiln_init()) return 1;
    test_randperm();
    test_batch_norm_no_update();
    test_meta_shapes();
    kiln_shutdown();
    return kt_finish();
}

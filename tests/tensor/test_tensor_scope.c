/* Scopes: what a scope owns is released at its end (memory returns to its
 * start value), references held by a library holder survive, kiln_keep
 * moves ownership outwards, an early kiln_release is not repeated at scope
 * end, scopes nest, and library-internal public calls never register. */
#include <pthread.h>

#include "tensor/scope.h"
#include "tensor/tensor_internal.h"
#include "test_util.h"

static size_t cpu_bytes(void) { return kiln_memory_allocated(KILN_CPU); }

static kiln_tensor *make(void) { return kiln_ones(KILN_SHAPE(256), KILN_F32, KILN_CPU); }

static void test_scope_releases(void) {
    size_t start = cpu_bytes();
    CHECK_EQ_I(kiln_scope_depth(), 0);
    kiln_scope_begin();
    CHECK_EQ_I(kiln_scope_depth(), 1);
    kiln_tensor *a = make();
    kiln_tensor *b = kiln_view(a, KILN_SHAPE(16, 16));
    kiln_tensor *c = kiln_to(b, KILN_CPU, KILN_F64, 0);
    kiln_tensor *d = kiln_reshape(kiln_transpose(c, 0, 1), KILN_SHAPE(-1)); /* a copy, and a view inline */
    CHECK(a && b && c && d);
    CHECK(cpu_bytes() > start);
    CHECK_OK(kiln_scope_end());
    CHECK_EQ_I(kiln_scope_depth(), 0);
    CHECK_EQ_I(cpu_bytes(), start);
}

static void test_holder_survives(void) {
    size_t start = cpu_bytes();
    kiln_tensor *holder;
    kiln_scope_begin();
    kiln_tensor *t = make();
    holder = kiln_retain(t); /* the library's own reference */
    CHECK_EQ_I(kiln_refcount(t), 2);
    CHECK_OK(kiln_scope_end());
    CHECK_EQ_I(kiln_refcount(holder), 1);
    double v;
    kiln_tensor *first = kiln_narrow(holder, 0, 0, 1);
    CHECK_OK(kiln_item(first, &v));
    CHECK(v == 1.0);
    kiln_release(first);
    CHECK(cpu_bytes() > start);
    CHECK_OK(kiln_release(holder));
    CHECK_EQ_I(cpu_bytes(), start);
}

static void test_keep(void) {
    size_t start = cpu_bytes();
    kiln_scope_begin();                    /* outer */
    kiln_scope_begin();                    /* inner */
    kiln_tensor *kept = kiln_keep(make()); /* moves to outer */
    kiln_tensor *dropped = make();         /* stays in inner */
    size_t one = cpu_bytes() - start;
    CHECK_OK(kiln_scope_end()); /* inner */
    CHECK_EQ_I(kiln_refcount(kept), 1);
    CHECK_EQ_I(cpu_bytes() - start, one / 2);
    (void)dropped;
    CHECK_OK(kiln_scope_end()); /* outer releases kept */
    CHECK_EQ_I(cpu_bytes(), start);

    /* With no enclosing scope, kiln_keep hands the reference to the caller. */
    kiln_scope_begin();
    kiln_tensor *mine = kiln_keep(make());
    CHECK_OK(kiln_scope_end());
    CHECK_EQ_I(kiln_refcount(mine), 1);
    CHECK_OK(kiln_release(mine));
    CHECK_EQ_I(cpu_bytes(), start);
    /* Outside any scope kiln_keep is the identity. */
    kiln_tensor *t = make();
    CHECK(kiln_keep(t) == t);
    CHECK(kiln_keep(NULL) == NULL);
    kiln_release(t);
}

static void test_early_release(void) {
    size_t start = cpu_bytes();
    kiln_scope_begin();
    kiln_tensor *t = make();
    CHECK_OK(kiln_release(t)); /* unregisters: the scope will not release it again */
    CHECK_EQ_I(cpu_bytes(), start);
    /* The same handle registered twice (kiln_contiguous of a contiguous
     * tensor returns it with one more reference). */
    kiln_tensor *u = make();
    kiln_tensor *same = kiln_contiguous(u);
    CHECK(same == u);
    CHECK_EQ_I(kiln_refcount(u), 2);
    CHECK_OK(kiln_release(same));
    CHECK_EQ_I(kiln_refcount(u), 1);
    /* A view outlives the release of its base. */
    kiln_tensor *base = make();
    kiln_tensor *view = kiln_view(base, KILN_SHAPE(2, 128));
    CHECK_OK(kiln_release(base));
    double v;
    kiln_tensor *e = kiln_narrow(kiln_narrow(view, 0, 1, 1), 1, 127, 1);
    CHECK_OK(kiln_item(e, &v));
    CHECK(v == 1.0);
    CHECK_OK(kiln_scope_end()); /* u, view, e and the inner narrow: no double release */
    CHECK_EQ_I(cpu_bytes(), start);
    if (kiln_debug_handles()) CHECK_EQ_I(kiln_handle_live_count(), 0); /* every record freed */
}

static void test_nesting(void) {
    size_t start = cpu_bytes();
    kiln_scope_begin();
    kiln_tensor *outer = make();
    size_t one = cpu_bytes() - start;
    for (int step = 0; step < 3; step++) {
        kiln_scope_begin();
        kiln_tensor *x = make();
        kiln_tensor *y = kiln_to(x, KILN_CPU, KILN_F64, 0);
        CHECK(y != NULL);
        CHECK_EQ_I(kiln_scope_depth(), 2);
        if (step == 1) CHECK_OK(kiln_release(outer)); /* registered in the outer scope */
        CHECK_OK(kiln_scope_end());
        CHECK_EQ_I(cpu_bytes() - start, step == 0 ? one : 0);
    }
    CHECK_OK(kiln_scope_end());
    CHECK_EQ_I(cpu_bytes(), start);
    CHECK_FAILS(kiln_scope_end(), KILN_ERR_STATE, "no scope is open");
}

/* A stand-in for a library function (a module forward): its internal
 * calls run at depth > 0 and never register; only its result does. */
static kiln_tensor *library_forward(kiln_tensor *x) {
    kiln_api_enter();
    kiln_tensor *tmp = kiln_to(x, KILN_CPU, KILN_F64, 0);
    kiln_tensor *tr = kiln_transpose(tmp, 0, 1);
    kiln_tensor *out = kiln_contiguous(tr);
    kiln_tensor_drop(tr);
    kiln_tensor_drop(tmp);
    return kiln_api_return(out);
}

static void test_outermost_rule(void) {
    size_t start = cpu_bytes();
    kiln_scope_begin();
    kiln_tensor *x = kiln_ones(KILN_SHAPE(8, 8), KILN_F32, KILN_CPU);
    kiln_tensor *y = library_forward(x);
    CHECK(y != NULL && kiln_refcount(y) == 1);
    CHECK_EQ_I(kiln_api_depth(), 0);
    CHECK_OK(kiln_scope_end()); /* x and y only: the intermediates are already gone */
    CHECK_EQ_I(cpu_bytes(), start);

    /* A result made at depth > 0 is the library's, not the scope's. */
    kiln_scope_begin();
    kiln_api_enter();
    kiln_tensor *held = make();
    kiln_api_leave();
    CHECK_OK(kiln_scope_end());
    CHECK_EQ_I(kiln_refcount(held), 1);
    CHECK_OK(kiln_tensor_drop(held));
    CHECK_EQ_I(cpu_bytes(), start);
}

/* Library code releasing its own reference (depth > 0) must leave the
 * user's registration of the same handle alone. */
static void test_library_release_keeps_registration(void) {
    size_t start = cpu_bytes();
    kiln_scope_begin();
    kiln_tensor *t = make(); /* registered */
    kiln_api_enter();
    kiln_tensor *held = kiln_retain(t);
    CHECK_OK(kiln_release(held));
    kiln_api_leave();
    CHECK_EQ_I(kiln_refcount(t), 1);
    CHECK_OK(kiln_scope_end()); /* still releases t */
    CHECK_EQ_I(cpu_bytes(), start);
}

/* Scopes are per thread; references to one shared tensor are counted
 * atomically across threads. */
static void *worker(void *arg) {
    kiln_tensor *shared = arg;
    for (int i = 0; i < 500; i++) {
        kiln_scope_begin();
        kiln_tensor *mine = kiln_retain(shared);
        kiln_tensor *v = kiln_view(shared, KILN_SHAPE(16, 16));
        kiln_tensor *c = kiln_to(v, KILN_CPU, KILN_F16, 0);
        (void)c;
        kiln_release(mine);
        if (kiln_scope_end()) return (void *)1;
    }
    return NULL;
}

static void test_threads(void) {
    size_t start = cpu_bytes();
    kiln_tensor *shared = make();
    pthread_t th[4];
    for (int i = 0; i < 4; i++) CHECK(pthread_create(&th[i], NULL, worker, shared) == 0);
    for (int i = 0; i < 4; i++) {
        void *ret = NULL;
        pthread_join(th[i], &ret);
        CHECK(ret == NULL);
    }
    CHECK_EQ_I(kiln_refcount(shared), 1);
    CHECK_OK(kiln_release(shared));
    CHECK_EQ_I(cpu_bytes(), start);
}

int main(void) {
    if (kiln_init()) return 1;
    test_scope_releases();
    test_holder_survives();
    test_keep();
    test_early_release();
    test_nesting();
    test_outermost_rule();
    test_library_release_keeps_registration();
    test_threads();
    kiln_shutdown();
    return kt_finish();
}

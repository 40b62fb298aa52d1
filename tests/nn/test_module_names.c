/* Module member names (src/nn/module.c's hash index, issue 20): adding n
 * members costs O(n) bucket probes, not the O(n^2) name comparisons of
 * the linear scan it replaced; names stay unique across parameters,
 * buffers and children; every lookup (kiln_module_child, the state dict's
 * dotted keys, load_state_dict's key matching) finds exactly its member,
 * after the index has grown many times, and never one whose name merely
 * starts alike ("29" against "299"). */
#include "nn/module_internal.h"
#include "nn/nn_test_util.c"

static kiln_tensor *scalar(double v) { return kt_tensor(KILN_SHAPE(1), KILN_F32, &v); }

static kiln_tensor *identity(kiln_module *m, kiln_tensor *x, void *user) {
    (void)m, (void)user;
    return kiln_retain(x);
}

/* A Sequential of 200,000 children: the first 10 of a 2^20-line spec's
 * worth of layers. The linear scan made this 2 * 10^10 comparisons; the
 * index looks at under 4 buckets per name at a load of at most one half,
 * growth included. */
static void test_many_children_linear(void) {
    enum { N = 200000 };
    kiln_module *seq = kiln_nn_sequential(0, NULL);
    CHECK(seq != NULL);
    if (!seq) return;
    kiln_status st = KILN_OK;
    for (int i = 0; i < N && st == KILN_OK; i++) st = kiln_nn_sequential_append(seq, kiln_nn_relu());
    CHECK_OK(st);
    CHECK_EQ_I(kiln_module_num_children(seq), N);
    int64_t probes = kiln_module_name_probes(seq);
    CHECK_MSG(probes <= 4LL * N, "%lld bucket probes for %d children: not linear", (long long)probes, N);
    /* Every child by name is the child at that index. */
    int wrong = 0;
    for (int i = 0; i < N; i++) {
        char name[16];
        snprintf(name, sizeof name, "%d", i);
        if (kiln_module_child(seq, name) != kiln_module_child_at(seq, i, NULL)) wrong++;
    }
    CHECK_EQ_I(wrong, 0);
    CHECK_FAILS(kiln_module_add_child(seq, "123456", kiln_nn_relu()), KILN_ERR_INVALID_ARGUMENT,
                "Sequential already has a member named '123456'");
    CHECK_EQ_I(kiln_module_num_children(seq), N); /* the refused child was freed, not added */
    kiln_error_clear();
    CHECK(kiln_module_child(seq, "200000") == NULL && strstr(kiln_error_message(), "no child named '200000'"));
    kiln_module_free(seq);
}

/* One namespace for parameters, buffers and children, as in PyTorch:
 * each name is refused as any other kind, after the index has grown. */
static void test_unique_across_kinds(void) {
    kiln_module *m = kiln_nn_custom("Mixed", identity, NULL);
    CHECK(m != NULL);
    if (!m) return;
    enum { K = 300 };
    char name[32];
    for (int i = 0; i < K; i++) {
        kiln_tensor *t = scalar(i);
        snprintf(name, sizeof name, "p%d", i);
        CHECK_OK(kiln_module_add_parameter(m, name, t));
        snprintf(name, sizeof name, "b%d", i);
        CHECK_OK(kiln_module_add_buffer(m, name, t));
        kiln_release(t);
        snprintf(name, sizeof name, "c%d", i);
        CHECK_OK(kiln_module_add_child(m, name, kiln_nn_linear(1, 1, true)));
    }
    kiln_tensor *t = scalar(0);
    static const char *const taken[] = {"p0", "p299", "b17", "b299", "c0", "c150"};
    for (size_t i = 0; i < sizeof taken / sizeof taken[0]; i++) {
        CHECK_FAILS(kiln_module_add_parameter(m, taken[i], t), KILN_ERR_INVALID_ARGUMENT, "already has a member");
        CHECK_FAILS(kiln_module_add_buffer(m, taken[i], t), KILN_ERR_INVALID_ARGUMENT, "already has a member");
        CHECK_FAILS(kiln_module_add_child(m, taken[i], kiln_nn_relu()), KILN_ERR_INVALID_ARGUMENT,
                    "already has a member");
    }
    /* Free names are still free after the refusals. */
    CHECK_OK(kiln_module_add_buffer(m, "p300", t));
    CHECK_OK(kiln_module_add_child(m, "b300", kiln_nn_relu()));
    kiln_release(t);
    /* Each name finds its own member and only as its kind. */
    for (int i = 0; i < K; i += 37) {
        snprintf(name, sizeof name, "p%d", i);
        kiln_tensor *p = kiln_module_own_tensor(m, name);
        CHECK(p != NULL && kiln_requires_grad(p));
        double *v = kt_values(p);
        CHECK(v && v[0] == i);
        free(v);
        snprintf(name, sizeof name, "b%d", i);
        CHECK(kiln_module_own_tensor(m, name) != NULL);
        kiln_error_clear();
        CHECK(kiln_module_child(m, name) == NULL); /* a buffer is not a child */
        snprintf(name, sizeof name, "c%d", i);
        CHECK(kiln_module_own_tensor(m, name) == NULL); /* a child is not a tensor */
        CHECK(kiln_module_child(m, name) == kiln_module_child_at(m, i, NULL));
    }
    kiln_named_tensor *items = NULL;
    int n = 0;
    CHECK_OK(kiln_module_state_dict(m, &items, &n));
    CHECK_EQ_I(n, K + K + 1 + 2 * K); /* p*, b* and p300, each child's weight and bias */
    free(items);
    kiln_module_free(m);
}

/* Dotted keys take each part by its length: "29.weight" is child 29,
 * never child 290..299, and "2999.weight" names what is missing. */
static void test_dotted_keys(void) {
    enum { N = 300 };
    kiln_module *seq = kiln_nn_sequential(0, NULL);
    CHECK(seq != NULL);
    if (!seq) return;
    for (int i = 0; i < N; i++) CHECK_OK(kiln_nn_sequential_append(seq, kiln_nn_linear(1, 1, false)));
    for (int i = 0; i < N; i++) {
        kiln_tensor *v = scalar(i);
        char key[32];
        snprintf(key, sizeof key, "%d.weight", i);
        kiln_tensor *w = kiln_reshape(v, KILN_SHAPE(1, 1));
        CHECK_OK(kiln_module_state_set(seq, key, w));
        kiln_release(w);
        kiln_release(v);
    }
    static const int probe[] = {2, 29, 290, 299, 0, 100};
    for (size_t i = 0; i < sizeof probe / sizeof probe[0]; i++) {
        char key[32];
        snprintf(key, sizeof key, "%d.weight", probe[i]);
        kiln_tensor *w = kiln_module_state_get(seq, key);
        double *v = kt_values(w);
        CHECK_MSG(v && v[0] == probe[i], "%s is %g", key, v ? v[0] : -1.0);
        free(v);
        kiln_release(w);
    }
    CHECK_NULL_ERR(kiln_module_state_get(seq, "2999.weight"), "no parameter or buffer named '2999.weight'");
    CHECK_NULL_ERR(kiln_module_state_get(seq, "29.bias"), "no parameter or buffer named '29.bias'");
    CHECK_NULL_ERR(kiln_module_state_get(seq, "2.weight.x"), "'2.weight.x'");
    CHECK_NULL_ERR(kiln_module_state_get(seq, ".weight"), "'.weight'");
    kiln_module_free(seq);
}

/* load_state_dict matches keys by hash: a state dict of one model loads
 * into another of the same shape, and a missing or an unexpected key is
 * named however many keys there are. */
static void test_load_state_dict_keys(void) {
    enum { N = 2000 };
    kiln_module *a = kiln_nn_sequential(0, NULL), *b = kiln_nn_sequential(0, NULL);
    CHECK(a && b);
    if (!a || !b) {
        kiln_module_free(a);
        kiln_module_free(b);
        return;
    }
    for (int i = 0; i < N; i++) {
        CHECK_OK(kiln_nn_sequential_append(a, kiln_nn_linear(1, 1, true)));
        CHECK_OK(kiln_nn_sequential_append(b, kiln_nn_linear(1, 1, true)));
    }
    kiln_named_tensor *items = NULL;
    int n = 0;
    CHECK_OK(kiln_module_state_dict(a, &items, &n));
    CHECK_EQ_I(n, 2 * N);
    CHECK_OK(kiln_module_load_state_dict(b, items, n, true, NULL));
    /* b's 1999th bias now is a's. */
    kiln_tensor *x = kiln_module_state_get(a, "1999.bias"), *y = kiln_module_state_get(b, "1999.bias");
    double *vx = kt_values(x), *vy = kt_values(y);
    CHECK(vx && vy && vx[0] == vy[0]);
    free(vx);
    free(vy);
    kiln_release(x);
    kiln_release(y);
    /* One key renamed: it is both missing and unexpected, and only it. */
    const char *saved = items[2 * 1234 + 1].name;
    items[2 * 1234 + 1].name = "12340.bias";
    kiln_incompatible_keys k = {0};
    CHECK_FAILS(kiln_module_load_state_dict(b, items, n, true, &k), KILN_ERR_INVALID_ARGUMENT,
                "1 missing key ('1234.bias') and 1 unexpected key ('12340.bias')");
    CHECK(k.n_missing == 1 && k.n_unexpected == 1);
    kiln_incompatible_keys_free(&k);
    items[2 * 1234 + 1].name = saved;
    free(items);
    kiln_module_free(a);
    kiln_module_free(b);
}

int main(void) {
    if (kiln_init() != KILN_OK) return 1;
    test_many_children_linear();
    test_unique_across_kinds();
    test_dotted_keys();
    test_load_state_dict_keys();
    kiln_shutdown();
    return kt_finish();
}

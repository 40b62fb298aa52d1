/* The graph-retention detector: a training loop that accumulates its loss
 * with `total = kiln_add(total, loss)` (the tutorials' `total_loss += loss`)
 * must be reported with that exact line; the same loop accumulating
 * kiln_item(loss) into a double must report nothing. */
#include "test_util.h"

#define STEPS 6

static int leak_line;

typedef struct loop_result {
    bool leaking;
    int first_leak_step;
    kiln_leak_report report; /* the last report that said leaking (or the last one) */
    double total;
} loop_result;

/* A linear model y = x w + b on random data, trained by SGD for STEPS steps,
 * each step in its own scope. */
static loop_result train(bool leak) {
    loop_result res = {.first_leak_step = -1};
    kiln_manual_seed(7);
    kiln_scope_begin(); /* owns the model and, when leaking, the totals kept from each step */
    kiln_tensor *w = kiln_randn(KILN_SHAPE(4, 1), KILN_F32, KILN_CPU);
    kiln_tensor *b = kiln_zeros(KILN_SHAPE(1), KILN_F32, KILN_CPU);
    CHECK_OK(kiln_set_requires_grad(w, true));
    CHECK_OK(kiln_set_requires_grad(b, true));
    kiln_tensor *params[2] = {w, b};
    kiln_sgd_opts opts = kiln_sgd_defaults(0.05);
    kiln_optimizer *opt = kiln_sgd(params, 2, &opts);
    CHECK(opt != NULL);
    kiln_tensor *total = kiln_zeros(KILN_SHAPE(), KILN_F32, KILN_CPU);
    CHECK_OK(kiln_leak_check_begin(3));
    for (int step = 0; step < STEPS; step++) {
        kiln_scope_begin();
        kiln_tensor *x = kiln_randn(KILN_SHAPE(8, 4), KILN_F32, KILN_CPU);
        kiln_tensor *y = kiln_randn(KILN_SHAPE(8, 1), KILN_F32, KILN_CPU);
        kiln_tensor *pred = kiln_add(kiln_mm(x, w), b);
        kiln_tensor *loss = kiln_mse_loss(pred, y, KILN_LOSS_MEAN);
        CHECK_OK(kiln_optimizer_zero_grad(opt, true));
        CHECK_OK(kiln_backward(loss, NULL, false));
        CHECK_OK(kiln_optimizer_step(opt));
        if (leak) {
            leak_line = __LINE__ + 1;
            total = kiln_add(total, loss);
            kiln_keep(total);
        } else {
            double v = 0;
            CHECK_OK(kiln_item(loss, &v));
            res.total += v;
        }
        CHECK_OK(kiln_scope_end());
        kiln_leak_report r;
        CHECK_OK(kiln_leak_check_step(&r));
        if (r.leaking || !res.leaking) res.report = r;
        if (r.leaking && !res.leaking) res.first_leak_step = step;
        res.leaking |= r.leaking;
    }
    kiln_leak_check_end();
    kiln_optimizer_free(opt);
    CHECK_OK(kiln_scope_end());
    return res;
}

static void test_planted_leak(void) {
    loop_result r = train(true);
    CHECK_MSG(r.leaking, "the accumulated total was not reported");
    /* Growth at boundaries 2, 3 and 4 makes three in a row. */
    CHECK_EQ_I(r.first_leak_step, 3);
    CHECK(r.report.n_sites >= 1);
    if (r.report.n_sites < 1) return;
    const kiln_leak_site *s = &r.report.sites[0];
    CHECK_MSG(s->line == leak_line, "reported line %d, planted at %d", s->line, leak_line);
    CHECK_MSG(s->file && strcmp(s->file, __FILE__) == 0, "reported file %s", s->file ? s->file : "(null)");
    CHECK(s->op && strcmp(s->op, "add") == 0);
    CHECK_EQ_I(s->roots, 1);
    CHECK(s->nodes > STEPS); /* every step's graph hangs off the one root */
    CHECK(s->node_growth > 0);
    CHECK(s->node_bytes > 0);
    CHECK(r.report.nodes_per_step >= 3); /* add + mm + add + mse at least */
    CHECK(r.report.pattern && strstr(r.report.pattern, "kiln_item or kiln_detach"));
    char *text = kiln_leak_report_format(&r.report);
    CHECK(text != NULL);
    if (text) {
        char where[256];
        snprintf(where, sizeof where, "%s:%d", __FILE__, leak_line);
        CHECK_MSG(strstr(text, where) != NULL, "report does not name %s:\n%s", where, text);
        CHECK(strstr(text, "accumulated across steps") != NULL);
        printf("%s", text);
    }
    free(text);
}

static void test_clean_loop(void) {
    loop_result r = train(false);
    CHECK_MSG(!r.leaking, "a clean loop was reported (%d sites)", r.report.n_sites);
    CHECK_EQ_I(r.report.n_sites, 0);
    CHECK_EQ_I(r.report.live_nodes, 0);
    CHECK(r.total > 0);
}

static void test_errors(void) {
    kiln_leak_report r;
    CHECK_FAILS(kiln_leak_check_step(&r), KILN_ERR_STATE, "kiln_leak_check_begin");
    CHECK_FAILS(kiln_leak_check_begin(-1), KILN_ERR_INVALID_ARGUMENT, "window");
}

int main(void) {
    CHECK_OK(kiln_init());
    test_errors();
    test_clean_loop();
    test_planted_leak();
    kiln_shutdown();
    return kt_finish();
}

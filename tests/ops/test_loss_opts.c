/* Loss options (kiln/ops.h): a zero-initialised kiln_loss_opts is
 * PyTorch's defaults (reduction mean, ignore_index -100), the same as
 * kiln_loss_defaults() and as NULL; KILN_LOSS_SUM / KILN_LOSS_NONE stay
 * explicit; an ignore_index is used only with has_ignore_index, so a
 * zeroed struct does not ignore class 0. Values are checked against a
 * cross entropy computed here. */
#include "test_util.h"

#define N 4
#define C 3

static const double logits_v[N * C] = {0.5, -1.0, 2.0, 1.5, 0.25, -0.75, -2.0, 0.0, 1.0, 3.0, 2.5, -1.5};

/* -log softmax(logits[i])[t]. */
static double sample_loss(int i, int t) {
    double mx = logits_v[i * C], sum = 0;
    for (int c = 1; c < C; c++) mx = fmax(mx, logits_v[i * C + c]);
    for (int c = 0; c < C; c++) sum += exp(logits_v[i * C + c] - mx);
    return -(logits_v[i * C + t] - mx - log(sum));
}

static double value(kiln_tensor *t) {
    double v = NAN;
    if (!t || kiln_item(t, &v)) fprintf(stderr, "value: %s\n", kiln_error_message());
    return v;
}

static bool close(double a, double b) { return fabs(a - b) <= 1e-12 * (1 + fabs(b)); }

static void test_zeroed_opts_are_the_defaults(void) {
    kiln_scope_begin();
    int64_t tv[N] = {0, 2, 1, 0};
    kiln_tensor *x = kiln_from_data(KILN_SHAPE(N, C), KILN_F64, KILN_CPU, logits_v);
    kiln_tensor *t = kiln_from_data(KILN_SHAPE(N), KILN_I64, KILN_CPU, tv);
    double want = 0;
    for (int i = 0; i < N; i++) want += sample_loss(i, (int)tv[i]) / N;
    kiln_loss_opts zero = {0}, defaults = kiln_loss_defaults();
    CHECK(zero.reduction == KILN_LOSS_MEAN);
    double got_zero = value(kiln_cross_entropy(x, t, &zero));
    CHECK_MSG(close(got_zero, want), "zeroed opts: %.17g, want the mean %.17g", got_zero, want);
    CHECK(close(value(kiln_cross_entropy(x, t, &defaults)), want));
    CHECK(close(value(kiln_cross_entropy(x, t, NULL)), want));
    CHECK(close(value(kiln_nll_loss(kiln_log_softmax(x, 1), t, &zero)), want));
    /* Explicit reductions. */
    kiln_loss_opts sum = {.reduction = KILN_LOSS_SUM};
    CHECK(close(value(kiln_cross_entropy(x, t, &sum)), want * N));
    kiln_loss_opts none = {.reduction = KILN_LOSS_NONE};
    kiln_tensor *each = kiln_cross_entropy(x, t, &none);
    CHECK(each && kiln_ndim(each) == 1 && kiln_size(each, 0) == N);
    double ev[N] = {0};
    CHECK_OK(kiln_to_host(each, ev, sizeof ev));
    for (int i = 0; i < N; i++) CHECK(close(ev[i], sample_loss(i, (int)tv[i])));
    kiln_loss_opts bad = {.reduction = (kiln_loss_reduction)7};
    CHECK_NULL_ERR(kiln_cross_entropy(x, t, &bad), "unknown reduction 7");
    /* mse_loss takes the enum alone: 0 is the mean too. */
    kiln_tensor *zeros = kiln_zeros(KILN_SHAPE(N, C), KILN_F64, KILN_CPU);
    double sq = 0;
    for (int i = 0; i < N * C; i++) sq += logits_v[i] * logits_v[i] / (N * C);
    CHECK(close(value(kiln_mse_loss(x, zeros, (kiln_loss_reduction)0)), sq));
    CHECK_OK(kiln_scope_end());
}

static void test_ignore_index(void) {
    kiln_scope_begin();
    int64_t tv[N] = {0, -100, 1, 0};
    kiln_tensor *x = kiln_from_data(KILN_SHAPE(N, C), KILN_F64, KILN_CPU, logits_v);
    kiln_tensor *t = kiln_from_data(KILN_SHAPE(N), KILN_I64, KILN_CPU, tv);
    /* Zeroed: -100 ignored (PyTorch's default), class 0 kept. */
    double want = (sample_loss(0, 0) + sample_loss(2, 1) + sample_loss(3, 0)) / 3;
    CHECK(close(value(kiln_cross_entropy(x, t, &(kiln_loss_opts){0})), want));
    CHECK(close(value(kiln_cross_entropy(x, t, NULL)), want));
    /* Class 0 ignored on request: -100 is then an out-of-range class. */
    int64_t tv2[N] = {0, 2, 1, 0};
    kiln_tensor *t2 = kiln_from_data(KILN_SHAPE(N), KILN_I64, KILN_CPU, tv2);
    kiln_loss_opts skip0 = {.has_ignore_index = true, .ignore_index = 0};
    double want2 = (sample_loss(1, 2) + sample_loss(2, 1)) / 2;
    CHECK(close(value(kiln_cross_entropy(x, t2, &skip0)), want2));
    /* Starting from the defaults and changing ignore_index works too. */
    kiln_loss_opts from_defaults = kiln_loss_defaults();
    from_defaults.ignore_index = 0;
    CHECK(close(value(kiln_cross_entropy(x, t2, &from_defaults)), want2));
    CHECK_OK(kiln_scope_end());
}

int main(void) {
    CHECK_OK(kiln_init());
    test_zeroed_opts_are_the_defaults();
    test_ignore_index();
    kiln_shutdown();
    return kt_finish();
}

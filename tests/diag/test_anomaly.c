/* Anomaly mode: a planted log(0) is reported naming kiln_log and this
 * file's line; an infinity produced inside backward (d sqrt(x)/dx at 0)
 * names the backward op and the forward call; an f16 overflow is reported
 * and values near the f16 limit warn once per site; with the mode off
 * nothing is checked. */
#include "test_util.h"

static char last_warning[1024];
static int n_warnings;

static void capture(kiln_log_level level, const char *message, void *user) {
    (void)user;
    if (level == KILN_LOG_WARN && strstr(message, "f16")) {
        n_warnings++;
        snprintf(last_warning, sizeof last_warning, "%s", message);
    }
}

static kiln_tensor *vec(const float *v, int64_t n, bool requires_grad) {
    kiln_tensor *t = kiln_from_data(KILN_SHAPE(n), KILN_F32, KILN_CPU, v);
    if (requires_grad) CHECK_OK(kiln_set_requires_grad(t, true));
    return t;
}

static bool names_line(const char *text, int line) {
    char where[256];
    snprintf(where, sizeof where, "%s:%d", __FILE__, line);
    return strstr(text, where) != NULL;
}

static void test_log_of_zero(void) {
    kiln_scope_begin();
    const float v[4] = {0, 1, 2, 3};
    kiln_tensor *x = vec(v, 4, false);
    kiln_anomaly_clear();
    kiln_error_clear();
    int line = __LINE__ + 1;
    kiln_tensor *y = kiln_log(x);
    CHECK_MSG(y == NULL, "log(0) was not reported");
    printf("reported: %s\n", kiln_error_message());
    CHECK_EQ_I(kiln_error_last()->status, KILN_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(kiln_error_message(), "kiln_log") != NULL, "%s", kiln_error_message());
    CHECK_MSG(names_line(kiln_error_message(), line), "line %d not in: %s", line, kiln_error_message());
    CHECK_MSG(strstr(kiln_error_message(), "min 0, max 3") != NULL, "input range missing: %s",
              kiln_error_message());
    kiln_anomaly_report r;
    kiln_anomaly_last(&r);
    CHECK(r.found);
    CHECK(strcmp(r.op, "log") == 0);
    CHECK(r.backward_of[0] == '\0');
    CHECK_EQ_I(r.line, line);
    CHECK_EQ_I(r.n_neg_inf, 1);
    CHECK_EQ_I(r.n_nan, 0);
    CHECK_EQ_I(r.n_in, 1);
    CHECK(r.in[0].present && r.in[0].min == 0.0 && r.in[0].max == 3.0 && r.in[0].n_nan == 0);
    CHECK_OK(kiln_scope_end());
}

static void test_backward_infinity(void) {
    kiln_scope_begin();
    const float v[2] = {0, 4};
    kiln_tensor *x = vec(v, 2, true);
    int line = __LINE__ + 1;
    kiln_tensor *s = kiln_sqrt(x);
    CHECK(s != NULL); /* sqrt(0) = 0 is fine going forward */
    kiln_tensor *l = kiln_sum(s, 0, NULL, false);
    kiln_anomaly_clear();
    kiln_status st = kiln_backward(l, NULL, false);
    CHECK_EQ_I(st, KILN_ERR_INVALID_ARGUMENT);
    printf("reported: %s\n", kiln_error_message());
    CHECK_MSG(strstr(kiln_error_message(), "backward of kiln_sqrt") != NULL, "%s", kiln_error_message());
    CHECK_MSG(names_line(kiln_error_message(), line), "line %d not in: %s", line, kiln_error_message());
    kiln_anomaly_report r;
    kiln_anomaly_last(&r);
    CHECK(r.found);
    CHECK_MSG(strcmp(r.backward_of, "sqrt") == 0, "backward_of '%s'", r.backward_of);
    CHECK_MSG(strcmp(r.op, "div") == 0, "op '%s'", r.op); /* grad / (2 sqrt(x)) */
    CHECK_EQ_I(r.line, line);
    CHECK_EQ_I(r.n_pos_inf, 1);
    CHECK_OK(kiln_scope_end());
}

static void test_f16(void) {
    kiln_scope_begin();
    /* 245 * 245 = 60025: finite in f16 but above 90% of 65504: a warning,
     * once for the site however often it runs. */
    kiln_tensor *a = kiln_full(KILN_SHAPE(3), 245.0, KILN_F16, KILN_CPU);
    n_warnings = 0;
    int warn_line = 0, line = 0;
    for (int i = 0; i < 3; i++) {
        warn_line = __LINE__ + 1;
        kiln_tensor *p = kiln_mul(a, a);
        CHECK(p != NULL);
    }
    CHECK_EQ_I(n_warnings, 1);
    CHECK_MSG(names_line(last_warning, warn_line), "warning: %s", last_warning);
    CHECK(strstr(last_warning, "kiln_mul") != NULL);
    /* 300 * 300 = 90000 overflows f16 to inf: an error. */
    kiln_tensor *big = kiln_full(KILN_SHAPE(3), 300.0, KILN_F16, KILN_CPU);
    kiln_anomaly_clear();
    line = __LINE__ + 1;
    kiln_tensor *q = kiln_mul(big, big);
    CHECK(q == NULL);
    CHECK_MSG(names_line(kiln_error_message(), line), "%s", kiln_error_message());
    CHECK_MSG(strstr(kiln_error_last()->hint, "overflowed f16") != NULL, "hint: %s", kiln_error_last()->hint);
    kiln_anomaly_report r;
    kiln_anomaly_last(&r);
    CHECK(r.found && r.f16_overflow);
    CHECK_EQ_I(r.n_pos_inf, 3);
    CHECK(r.in[0].max == 300.0);
    CHECK_OK(kiln_scope_end());
}

static void test_off(void) {
    kiln_set_detect_anomaly(false);
    CHECK(!kiln_is_anomaly_enabled());
    kiln_scope_begin();
    const float v[2] = {0, 1};
    kiln_tensor *x = vec(v, 2, false);
    kiln_anomaly_clear();
    kiln_tensor *y = kiln_log(x);
    CHECK_MSG(y != NULL, "with anomaly mode off log(0) must succeed: %s", kiln_error_message());
    double first = 0;
    if (y) CHECK_OK(kiln_item(kiln_narrow(y, 0, 0, 1), &first));
    CHECK(isinf(first) && first < 0);
    kiln_anomaly_report r;
    kiln_anomaly_last(&r);
    CHECK(!r.found);
    CHECK_OK(kiln_scope_end());
}

int main(void) {
    CHECK_OK(kiln_init());
    kiln_log_set_sink(capture, NULL);
    kiln_set_detect_anomaly(true);
    CHECK(kiln_is_anomaly_enabled());
    test_log_of_zero();
    test_backward_infinity();
    test_f16();
    test_off();
    kiln_log_set_sink(NULL, NULL);
    kiln_shutdown();
    return kt_finish();
}

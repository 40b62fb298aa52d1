/* The reduce group's harness cases (tests/ops/cases_reduce.c), plus what
 * finite differences cannot check: max/min share the gradient evenly among
 * tied elements (as torch.amax), and norm's gradient at 0 is 0. */
#include "ops/cases_reduce.c"
#include "ops/harness.c"

/* d/dx of sum(op(x)) for a 1-D f64 x; expects `want`. */
static int reduce_check_grad(const char *what, kiln_tensor *(*op)(kiln_tensor *), const double *x,
                             const double *want, int64_t n) {
    int fails = 0;
    kiln_scope_begin();
    kiln_tensor *t = kiln_from_data(KILN_SHAPE(n), KILN_F64, (kiln_device){KILN_DEVICE_CPU, 0}, x);
    kiln_set_requires_grad(t, true);
    kiln_tensor *y = op(t);
    kiln_tensor *l = y ? kiln_sum(y, 0, NULL, false) : NULL;
    double got[16] = {0};
    kiln_tensor *g = NULL;
    if (!l || kiln_backward(l, NULL, false) || !(g = kiln_grad(t)) ||
        kiln_to_host(g, got, sizeof(double) * (size_t)n)) {
        fprintf(stderr, "FAIL %s: %s\n", what, kiln_error_message());
        fails = 1;
    }
    for (int64_t i = 0; !fails && i < n; i++)
        if (fabs(got[i] - want[i]) > 1e-12) {
            fprintf(stderr, "FAIL %s: gradient element %lld is %g, expected %g\n", what, (long long)i, got[i],
                    want[i]);
            fails = 1;
        }
    kiln_scope_end();
    if (!fails) printf("ok   %s\n", what);
    return fails;
}

static kiln_tensor *reduce_max_all(kiln_tensor *t) { return kiln_max(t, 0, NULL, false); }
static kiln_tensor *reduce_min_all(kiln_tensor *t) { return kiln_min(t, 0, NULL, false); }
static kiln_tensor *reduce_norm2_all(kiln_tensor *t) { return kiln_norm(t, 2, 0, NULL, false); }
static kiln_tensor *reduce_norm3_all(kiln_tensor *t) { return kiln_norm(t, 3, 0, NULL, false); }

int main(int argc, char **argv) {
    int fails = kh_main(argc, argv, reduce_cases, KH_COUNT(reduce_cases));
    if (argc > 1 || getenv("KILN_OPS_FILTER")) return fails;
    if (kiln_init()) return 1;
    fails |= reduce_check_grad("max ties share the gradient", reduce_max_all, (double[]){1, 3, 3, 2},
                               (double[]){0, 0.5, 0.5, 0}, 4);
    fails |= reduce_check_grad("min ties share the gradient", reduce_min_all, (double[]){-1, 3, -1, -1, 2},
                               (double[]){1.0 / 3, 0, 1.0 / 3, 1.0 / 3, 0}, 5);
    fails |=
        reduce_check_grad("norm p2 at zero", reduce_norm2_all, (double[]){0, 0, 0}, (double[]){0, 0, 0}, 3);
    fails |= reduce_check_grad("norm p3 at zero", reduce_norm3_all, (double[]){0, 0}, (double[]){0, 0}, 2);
    kiln_shutdown();
    return fails;
}

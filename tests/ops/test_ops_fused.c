/* The fused ops' cases (cases_fused.c) on the harness: float64 references,
 * finite-difference gradients, guard-byte kernel checks, every backend.
 * cases_fused.c builds its references on cases_nn.c's conv2d and pooling
 * references, so both are included (nn_cases itself runs in test_ops_nn). */
#include "ops/cases_nn.c"
/* after cases_nn.c, whose references it uses */
#include "ops/cases_fused.c"
#include "ops/harness.c"

int main(int argc, char **argv) {
    (void)nn_cases;
    return kh_main(argc, argv, fused_cases, KH_COUNT(fused_cases));
}

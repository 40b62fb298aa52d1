/* The elementwise group's harness cases (tests/ops/cases_elementwise.c). */
#include "ops/cases_elementwise.c"
#include "ops/harness.c"

int main(int argc, char **argv) {
    return kh_main(argc, argv, elementwise_cases, KH_COUNT(elementwise_cases));
}

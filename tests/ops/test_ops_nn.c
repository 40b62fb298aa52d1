/* The nn group's op cases (cases_nn.c) on the harness. */
#include "ops/cases_nn.c"
#include "ops/harness.c"

int main(int argc, char **argv) { return kh_main(argc, argv, nn_cases, KH_COUNT(nn_cases)); }

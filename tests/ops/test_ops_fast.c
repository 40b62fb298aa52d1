/* The op harness on the fast CPU kernels (oneDNN): the conv2d, conv2d
 * gradient, mm, bmm, matmul and linear cases of the nn and reduce groups,
 * plus contiguous variants the fast kernels take (most group cases use
 * transposed or strided views, which the fast kernels decline so the
 * reference kernels run them). f32 runs through oneDNN, held to the
 * harness's f32 threshold (1e-5 normwise); other dtypes and the f64
 * gradient checks run on the reference kernels (linear's mm-based backward
 * runs mm through oneDNN). Afterwards every fast
 * kernel must have run at least once (kiln_ops_fast_runs), so a fast table
 * that silently declines everything fails. Skips (77) in builds without
 * oneDNN. The same cases on the reference kernels only: test_ops_nn and
 * test_ops_reduce under KILN_CPU_KERNELS=reference (tests/CMakeLists.txt). */
#include <stdlib.h>
#include <string.h>

#include "ops/cases_nn.c"
#include "ops/cases_reduce.c"
#include "ops/harness.c"

static const kh_case fast_cases[] = {
    {.name = "conv2d",
     .params = "2x3x6x5 w4x3x3x3 bias p1 contig",
     .dtypes = KH_FLOAT,
     .n_in = 3,
     .in = {NN_X(2, 3, 6, 5), NN_X(4, 3, 3, 3), NN_X(4)},
     .attrs = NN_CONV(1, 1, 1, 1, 1, 1, 1),
     .op = KH_OP(KILN_OP_CONV2D),
     .run = nn_run_conv2d,
     .reference = nn_ref_conv2d},
    {.name = "conv2d",
     .params = "1x4x7x7 w6x2x2x3 groups2 s2 p1,2 d2,1 bias contig",
     .dtypes = KH_FLOAT,
     .n_in = 3,
     .in = {NN_X(1, 4, 7, 7), NN_X(6, 2, 2, 3), NN_X(6)},
     .attrs = NN_CONV(2, 2, 1, 2, 2, 1, 2),
     .op = KH_OP(KILN_OP_CONV2D),
     .run = nn_run_conv2d,
     .reference = nn_ref_conv2d},
    {.name = "conv2d",
     .params = "2x5x5x4 w3x5x1x2 s2,1 nobias contig",
     .dtypes = KH_FLOAT,
     .n_in = 3,
     .in = {NN_X(2, 5, 5, 4), NN_X(3, 5, 1, 2), NN_ABSENT},
     .attrs = NN_CONV(2, 1, 0, 0, 1, 1, 1),
     .op = KH_OP(KILN_OP_CONV2D),
     .run = nn_run_conv2d,
     .reference = nn_ref_conv2d},
    {.name = "conv2d_grad_input",
     .params = "g2x4x5x3 w4x3x3x2 s1,2 p1,0 -> 2x3x5x6 contig",
     .dtypes = KH_FLOAT,
     .n_in = 2,
     .in = {NN_NG(KH_CONTIG, 2, 4, 5, 3), NN_NG(KH_CONTIG, 4, 3, 3, 2)},
     .attrs = {.stride = {1, 2},
               .padding = {1, 0},
               .dilation = {1, 1},
               .groups = 1,
               .ints = {2, 3, 5, 6},
               .n_ints = 4},
     .op = KH_OP(KILN_OP_CONV2D_GRAD_INPUT),
     .run = nn_run_conv_grad_input,
     .reference = nn_ref_conv_grad_input},
    {.name = "conv2d_grad_input",
     .params = "g1x6x4x5 w6x2x2x3 groups2 s2 p1,2 d2,1 -> 1x4x7x7 contig",
     .dtypes = KH_FLOAT,
     .n_in = 2,
     .in = {NN_NG(KH_CONTIG, 1, 6, 4, 5), NN_NG(KH_CONTIG, 6, 2, 2, 3)},
     .attrs = {.stride = {2, 2},
               .padding = {1, 2},
               .dilation = {2, 1},
               .groups = 2,
               .ints = {1, 4, 7, 7},
               .n_ints = 4},
     .op = KH_OP(KILN_OP_CONV2D_GRAD_INPUT),
     .run = nn_run_conv_grad_input,
     .reference = nn_ref_conv_grad_input},
    {.name = "conv2d_grad_weight",
     .params = "g1x6x4x5 x1x4x7x7 groups2 s2 p1,2 d2,1 -> 6x2x2x3 contig",
     .dtypes = KH_FLOAT,
     .n_in = 2,
     .in = {NN_NG(KH_CONTIG, 1, 6, 4, 5), NN_NG(KH_CONTIG, 1, 4, 7, 7)},
     .attrs = {.stride = {2, 2},
               .padding = {1, 2},
               .dilation = {2, 1},
               .groups = 2,
               .ints = {6, 2, 2, 3},
               .n_ints = 4},
     .op = KH_OP(KILN_OP_CONV2D_GRAD_WEIGHT),
     .run = nn_run_conv_grad_weight,
     .reference = nn_ref_conv_grad_weight},
    {.name = "conv2d_grad_weight",
     .params = "g2x4x5x3 x2x3x5x6 s1,2 p1,0 -> 4x3x3x2 contig",
     .dtypes = KH_FLOAT,
     .n_in = 2,
     .in = {NN_NG(KH_CONTIG, 2, 4, 5, 3), NN_NG(KH_CONTIG, 2, 3, 5, 6)},
     .attrs = {.stride = {1, 2},
               .padding = {1, 0},
               .dilation = {1, 1},
               .groups = 1,
               .ints = {4, 3, 3, 2},
               .n_ints = 4},
     .op = KH_OP(KILN_OP_CONV2D_GRAD_WEIGHT),
     .run = nn_run_conv_grad_weight,
     .reference = nn_ref_conv_grad_weight},
    {.name = "mm",
     .params = "3x4T@4x5T fast",
     .dtypes = KH_FLOAT,
     .n_in = 2,
     .in = {REDUCE_X(KILN_SHAPE(3, 4), .layout = KH_TRANSPOSED),
            REDUCE_X(KILN_SHAPE(4, 5), .layout = KH_TRANSPOSED)},
     .op = KH_OP(KILN_OP_MM),
     .run = reduce_run_mm,
     .reference = reduce_ref_matmul},
    {.name = "bmm",
     .params = "2x3x4T@2x4x5 fast",
     .dtypes = KH_FLOAT,
     .n_in = 2,
     .in = {REDUCE_X(KILN_SHAPE(2, 3, 4), .layout = KH_TRANSPOSED), REDUCE_X(KILN_SHAPE(2, 4, 5))},
     .op = KH_OP(KILN_OP_BMM),
     .run = reduce_run_bmm,
     .reference = reduce_ref_matmul},
    {.name = "linear",
     .params = "3x4 W2x4T b2 fast",
     .dtypes = KH_FLOAT,
     .n_in = 3,
     .in = {REDUCE_X(KILN_SHAPE(3, 4)), REDUCE_X(KILN_SHAPE(2, 4), .layout = KH_TRANSPOSED),
            REDUCE_X(KILN_SHAPE(2))},
     .op = KH_OP(KILN_OP_LINEAR),
     .run = reduce_run_linear,
     .reference = reduce_ref_linear},
};

static const char *const fast_op_names[] = {
    "conv2d", "conv2d_grad_input", "conv2d_grad_weight", "mm", "bmm", "matmul", "linear"};

static bool fast_covers(const kh_case *c) {
    for (size_t i = 0; i < sizeof fast_op_names / sizeof fast_op_names[0]; i++)
        if (!strcmp(c->name, fast_op_names[i])) return true;
    return false;
}

#define FAST_MAX_CASES 128

int main(int argc, char **argv) {
#ifndef KILN_WITH_ONEDNN
    (void)argc, (void)argv;
    printf("skipped: this build has no fast CPU kernels (KILN_WITH_ONEDNN is off)\n");
    return 77;
#else
    setenv("KILN_CPU_KERNELS", "fast", 1); /* the reference-only setting would make this test meaningless */
    static kh_case cases[FAST_MAX_CASES];
    int n = 0;
    for (int i = 0; i < KH_COUNT(nn_cases); i++)
        if (fast_covers(&nn_cases[i]) && n < FAST_MAX_CASES) cases[n++] = nn_cases[i];
    for (int i = 0; i < KH_COUNT(reduce_cases); i++)
        if (fast_covers(&reduce_cases[i]) && n < FAST_MAX_CASES) cases[n++] = reduce_cases[i];
    for (int i = 0; i < KH_COUNT(fast_cases); i++)
        if (n < FAST_MAX_CASES) cases[n++] = fast_cases[i];
    int fails = kh_main(argc, argv, cases, n);
    if (argc > 1 || getenv("KILN_OPS_FILTER")) return fails;
    static const kiln_op_id ops[] = {KILN_OP_CONV2D, KILN_OP_CONV2D_GRAD_INPUT, KILN_OP_CONV2D_GRAD_WEIGHT,
                                     KILN_OP_MM, KILN_OP_BMM}; /* LINEAR: cpu_fast_table.c */
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        uint64_t runs = kiln_ops_fast_runs(ops[i]);
        printf("%s %s: the fast kernel ran %llu times\n", runs ? "ok  " : "FAIL",
               kiln_op_info_get(ops[i])->name, (unsigned long long)runs);
        fails |= runs == 0;
    }
    return fails;
#endif
}

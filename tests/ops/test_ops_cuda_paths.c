/* Harness cases with shapes big enough to take the CUDA kernels' other code
 * paths (src/kernels/cuda/ops_*.cu), which the small cases of
 * cases_reduce.c never reach: block-per-output and chunked two-pass
 * reductions, long and strided softmax rows, chunked loss sums, multi-tile
 * GEMMs with ragged edges and a linear whose leading dims do not merge,
 * dropout past one Philox block per thread. They run on every device the
 * harness runs (the CPU too), against the float64 references of the
 * group's cases; forward only (finite differences over thousands of
 * elements would be slow, and cases_reduce.c checks the gradients).
 *
 * Then, on cuda:0 when this build has it: the reductions, softmax and GEMM
 * repeat bit for bit (no floating-point atomics), and with cuda:1 too the
 * kernels run on the device that owns their output and agree with cuda:0. */
#include "ops/cases_elementwise.c"
#include "ops/cases_reduce.c"
#include "ops/harness.c"

#define PATHS_X(sh, ...)                                                                                     \
    { .shape = sh, __VA_ARGS__ }
#define PATHS_INTS (KILN_DT(KILN_I32) | KILN_DT(KILN_I64) | KILN_DT(KILN_U8))

/* softmax_backward / log_softmax_backward (grad, out) along attrs.dims[0]:
 * gx = y * (g - sum(g * y)), or g - exp(y) * sum(g). */
static void paths_ref_softmax_grad(kh_ref *r, bool log_form) {
    kiln_shape s = r->shape[0];
    double *gx = kh_out(r, 0, s, 0);
    int nd = s.ndim, dim = ((r->attrs->dims[0] % nd) + nd) % nd;
    int64_t len = s.d[dim], inner = 1, outer = 1;
    for (int d = dim + 1; d < nd; d++) inner *= s.d[d];
    for (int d = 0; d < dim; d++) outer *= s.d[d];
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            int64_t base = o * len * inner + i;
            const double *g = r->in[0] + base, *y = r->in[1] + base;
            double sum = 0;
            for (int64_t j = 0; j < len; j++) sum += log_form ? g[j * inner] : g[j * inner] * y[j * inner];
            for (int64_t j = 0; j < len; j++)
                gx[base + j * inner] =
                    log_form ? g[j * inner] - exp(y[j * inner]) * sum : y[j * inner] * (g[j * inner] - sum);
        }
}
static void paths_ref_softmax_backward(kh_ref *r) { paths_ref_softmax_grad(r, false); }
static void paths_ref_log_softmax_backward(kh_ref *r) { paths_ref_softmax_grad(r, true); }
static kiln_tensor *paths_run_softmax_backward(kh_run *r) {
    kiln_op_attrs at = *r->attrs;
    return kiln_dispatch_public(KILN_OP_SOFTMAX_BACKWARD, 2, (kiln_tensor *[]){r->in[0], r->in[1]}, &at,
                                NULL);
}
static kiln_tensor *paths_run_log_softmax_backward(kh_run *r) {
    kiln_op_attrs at = *r->attrs;
    return kiln_dispatch_public(KILN_OP_LOG_SOFTMAX_BACKWARD, 2, (kiln_tensor *[]){r->in[0], r->in[1]}, &at,
                                NULL);
}

static const kh_case paths_cases[] = {
    /* reductions: block per output (one chunk), chunked with a second pass,
     * thread per output along a contiguous kept dim */
    {.name = "sum",
     .params = "paths 3x5000 dim1",
     .dtypes = KH_FLOAT | PATHS_INTS,
     .n_in = 1,
     .in = {PATHS_X(KILN_SHAPE(3, 5000))},
     .attrs = {.n_dims = 1, .dims = {1}},
     .run = reduce_run_sum,
     .reference = reduce_ref_sum},
    {.name = "sum",
     .params = "paths 40000 all S",
     .dtypes = KH_FLOAT | PATHS_INTS,
     .n_in = 1,
     .in = {PATHS_X(KILN_SHAPE(40000), .layout = KH_STRIDED)},
     .run = reduce_run_sum,
     .reference = reduce_ref_sum},
    {.name = "sum",
     .params = "paths 260x50 dim0 T",
     .dtypes = KH_FLOAT,
     .n_in = 1,
     .in = {PATHS_X(KILN_SHAPE(260, 50), .layout = KH_TRANSPOSED)},
     .attrs = {.n_dims = 1, .dims = {0}},
     .run = reduce_run_sum,
     .reference = reduce_ref_sum},
    {.name = "sum",
     .params = "paths 300x40 dim1 keepdim",
     .dtypes = KH_FLOAT,
     .n_in = 1,
     .in = {PATHS_X(KILN_SHAPE(300, 40))},
     .attrs = {.n_dims = 1, .dims = {1}, .keepdim = true},
     .run = reduce_run_sum,
     .reference = reduce_ref_sum},
    {.name = "sum",
     .params = "paths 40x9000 dim0",
     .dtypes = KH_FLOAT | PATHS_INTS,
     .n_in = 1,
     .in = {PATHS_X(KILN_SHAPE(40, 9000))},
     .attrs = {.n_dims = 1, .dims = {0}},
     .run = reduce_run_sum,
     .reference = reduce_ref_sum},
    {.name = "sum",
     .params = "paths 7x3x2000 dims(0,2) T",
     .dtypes = KH_FLOAT,
     .n_in = 1,
     .in = {PATHS_X(KILN_SHAPE(7, 3, 2000), .layout = KH_TRANSPOSED)},
     .attrs = {.n_dims = 2, .dims = {0, 2}},
     .run = reduce_run_sum,
     .reference = reduce_ref_sum},
    {.name = "mean",
     .params = "paths 5x7000 dim1 S",
     .dtypes = KH_FLOAT,
     .n_in = 1,
     .in = {PATHS_X(KILN_SHAPE(5, 7000), .layout = KH_STRIDED)},
     .attrs = {.n_dims = 1, .dims = {1}},
     .run = reduce_run_mean,
     .reference = reduce_ref_mean},
    {.name = "mean",
     .params = "paths 50000 all",
     .dtypes = KH_FLOAT,
     .n_in = 1,
     .in = {PATHS_X(KILN_SHAPE(50000))},
     .run = reduce_run_mean,
     .reference = reduce_ref_mean},
    {.name = "max",
     .params = "paths 3x3000 dim1",
     .dtypes = KH_FLOAT | PATHS_INTS,
     .n_in = 1,
     .in = {PATHS_X(KILN_SHAPE(3, 3000), .fill = KH_DISTINCT)},
     .attrs = {.n_dims = 1, .dims = {1}},
     .run = reduce_run_max,
     .reference = reduce_ref_max},
    {.name = "min",
     .params = "paths 45000 all T",
     .dtypes = KH_FLOAT | PATHS_INTS,
     .n_in = 1,
     .in = {PATHS_X(KILN_SHAPE(150, 300), .fill = KH_DISTINCT, .layout = KH_TRANSPOSED)},
     .run = reduce_run_min,
     .reference = reduce_ref_min},
    {.name = "argmax",
     .params = "paths 2x5000 dim1",
     .dtypes = KH_FLOAT | PATHS_INTS,
     .n_in = 1,
     .in = {PATHS_X(KILN_SHAPE(2, 5000), .fill = KH_UNIFORM, .lo = -3, .hi = 3)},
     .attrs = {.n_dims = 1, .dims = {1}},
     .run = reduce_run_argmax,
     .reference = reduce_ref_argmax},
    {.name = "argmax",
     .params = "paths 50000 flat ties",
     .dtypes = KH_FLOAT | PATHS_INTS,
     .n_in = 1,
     .in = {PATHS_X(KILN_SHAPE(50000), .fill = KH_UNIFORM, .lo = -100, .hi = 100)},
     .attrs = {.n_dims = 1, .dims = {0}},
     .run = reduce_run_argmax,
     .reference = reduce_ref_argmax},
    {.name = "argmax",
     .params = "paths 300x40 dim1",
     .dtypes = KH_FLOAT,
     .n_in = 1,
     .in = {PATHS_X(KILN_SHAPE(300, 40), .fill = KH_UNIFORM, .lo = -3, .hi = 3)},
     .attrs = {.n_dims = 1, .dims = {1}},
     .run = reduce_run_argmax,
     .reference = reduce_ref_argmax},
    {.name = "norm",
     .params = "paths p2 3x4000 dim1",
     .dtypes = KH_FLOAT,
     .n_in = 1,
     .in = {PATHS_X(KILN_SHAPE(3, 4000))},
     .attrs = {.scalar = {2}, .n_dims = 1, .dims = {1}},
     .run = reduce_run_norm,
     .reference = reduce_ref_norm},
    {.name = "norm",
     .params = "paths pinf 20000 all",
     .dtypes = KH_FLOAT,
     .n_in = 1,
     .in = {PATHS_X(KILN_SHAPE(20000))},
     .attrs = {.scalar = {INFINITY}},
     .run = reduce_run_norm,
     .reference = reduce_ref_norm},
    {.name = "norm",
     .params = "paths p1.5 30000 all S",
     .dtypes = KH_FLOAT,
     .n_in = 1,
     .in = {PATHS_X(KILN_SHAPE(30000), .layout = KH_STRIDED)},
     .attrs = {.scalar = {1.5}},
     .run = reduce_run_norm,
     .reference = reduce_ref_norm},
    /* softmax rows longer than a block, and strided rows */
    {.name = "softmax",
     .params = "paths 4x1000 dim1",
     .dtypes = KH_FLOAT,
     .n_in = 1,
     .in = {PATHS_X(KILN_SHAPE(4, 1000))},
     .attrs = {.n_dims = 1, .dims = {1}},
     .run = reduce_run_softmax,
     .reference = reduce_ref_softmax},
    {.name = "log_softmax",
     .params = "paths 1000x3 dim0 T",
     .dtypes = KH_FLOAT,
     .n_in = 1,
     .in = {PATHS_X(KILN_SHAPE(1000, 3), .layout = KH_TRANSPOSED)},
     .attrs = {.n_dims = 1, .dims = {0}},
     .run = reduce_run_log_softmax,
     .reference = reduce_ref_log_softmax},
    {.name = "softmax_backward",
     .params = "paths 3x700 dim1",
     .dtypes = KH_FLOAT,
     .n_in = 2,
     .in = {PATHS_X(KILN_SHAPE(3, 700)), PATHS_X(KILN_SHAPE(3, 700), .fill = KH_UNIFORM, .lo = 0, .hi = 1)},
     .attrs = {.n_dims = 1, .dims = {1}},
     .op = KH_OP(KILN_OP_SOFTMAX_BACKWARD),
     .run = paths_run_softmax_backward,
     .reference = paths_ref_softmax_backward},
    {.name = "softmax_backward",
     .params = "paths 9x6 dim0 T",
     .dtypes = KH_FLOAT,
     .n_in = 2,
     .in = {PATHS_X(KILN_SHAPE(9, 6), .layout = KH_TRANSPOSED),
            PATHS_X(KILN_SHAPE(9, 6), .fill = KH_UNIFORM, .lo = 0, .hi = 1)},
     .attrs = {.n_dims = 1, .dims = {0}},
     .op = KH_OP(KILN_OP_SOFTMAX_BACKWARD),
     .run = paths_run_softmax_backward,
     .reference = paths_ref_softmax_backward},
    {.name = "log_softmax_backward",
     .params = "paths 300x2x2 dim0 S",
     .dtypes = KH_FLOAT,
     .n_in = 2,
     .in = {PATHS_X(KILN_SHAPE(300, 2, 2), .layout = KH_STRIDED),
            PATHS_X(KILN_SHAPE(300, 2, 2), .fill = KH_UNIFORM, .lo = -3, .hi = 0)},
     .attrs = {.n_dims = 1, .dims = {0}},
     .op = KH_OP(KILN_OP_LOG_SOFTMAX_BACKWARD),
     .run = paths_run_log_softmax_backward,
     .reference = paths_ref_log_softmax_backward},
    {.name = "log_softmax_backward",
     .params = "paths 5x7 dim-1",
     .dtypes = KH_FLOAT,
     .n_in = 2,
     .in = {PATHS_X(KILN_SHAPE(5, 7)), PATHS_X(KILN_SHAPE(5, 7), .fill = KH_UNIFORM, .lo = -3, .hi = 0)},
     .attrs = {.n_dims = 1, .dims = {-1}},
     .op = KH_OP(KILN_OP_LOG_SOFTMAX_BACKWARD),
     .run = paths_run_log_softmax_backward,
     .reference = paths_ref_log_softmax_backward},
    /* losses summed over more than one chunk of positions */
    {.name = "nll_loss",
     .params = "paths 5000x3 weight ignore1 mean",
     .dtypes = KH_FLOAT,
     .n_in = 3,
     .in = {PATHS_X(KILN_SHAPE(5000, 3)),
            REDUCE_TARGET(KILN_SHAPE(5000), 0, 3),
            {.shape = KILN_SHAPE(3), .fill = KH_POSITIVE}},
     .attrs = {.reduction = KILN_REDUCTION_MEAN, .ignore_index = 1},
     .run = reduce_run_nll_loss,
     .reference = reduce_ref_nll_loss},
    {.name = "cross_entropy",
     .params = "paths smooth0.1 4500x4 sum",
     .dtypes = KH_FLOAT,
     .n_in = 3,
     .in = {PATHS_X(KILN_SHAPE(4500, 4)), REDUCE_TARGET(KILN_SHAPE(4500), 0, 4), {.absent = true}},
     .attrs = {.reduction = KILN_REDUCTION_SUM, .ignore_index = -100, .label_smoothing = 0.1},
     .run = reduce_run_cross_entropy,
     .reference = reduce_ref_cross_entropy},
    {.name = "mse_loss",
     .params = "paths 100x50 mean T",
     .dtypes = KH_FLOAT,
     .n_in = 2,
     .in = {PATHS_X(KILN_SHAPE(100, 50), .layout = KH_TRANSPOSED), PATHS_X(KILN_SHAPE(100, 50))},
     .attrs = {.reduction = KILN_REDUCTION_MEAN},
     .run = reduce_run_mse_loss,
     .reference = reduce_ref_mse_loss},
    /* GEMM: several tiles, ragged edges, transposed and strided operands */
    {.name = "mm",
     .params = "paths 70x130@130x67",
     .dtypes = KH_FLOAT,
     .n_in = 2,
     .in = {PATHS_X(KILN_SHAPE(70, 130)), PATHS_X(KILN_SHAPE(130, 67))},
     .run = reduce_run_mm,
     .reference = reduce_ref_matmul},
    {.name = "mm",
     .params = "paths 65x17T@17x129S",
     .dtypes = KH_FLOAT,
     .n_in = 2,
     .in = {PATHS_X(KILN_SHAPE(65, 17), .layout = KH_TRANSPOSED),
            PATHS_X(KILN_SHAPE(17, 129), .layout = KH_STRIDED)},
     .run = reduce_run_mm,
     .reference = reduce_ref_matmul},
    {.name = "bmm",
     .params = "paths 3x65x20T@3x20x66",
     .dtypes = KH_FLOAT,
     .n_in = 2,
     .in = {PATHS_X(KILN_SHAPE(3, 65, 20), .layout = KH_TRANSPOSED), PATHS_X(KILN_SHAPE(3, 20, 66))},
     .run = reduce_run_bmm,
     .reference = reduce_ref_matmul},
    {.name = "linear",
     .params = "paths 3x2x33T W70x33 b70",
     .dtypes = KH_FLOAT,
     .n_in = 3,
     .in = {PATHS_X(KILN_SHAPE(3, 2, 33), .layout = KH_TRANSPOSED), PATHS_X(KILN_SHAPE(70, 33)),
            PATHS_X(KILN_SHAPE(70))},
     .run = reduce_run_linear,
     .reference = reduce_ref_linear},
    /* dropout over several Philox blocks per thread row, odd size */
    {.name = "dropout",
     .params = "paths p=0.4 37x101 T",
     .dtypes = KH_FLOAT,
     .n_in = 1,
     .in = {PATHS_X(KILN_SHAPE(37, 101), .layout = KH_TRANSPOSED)},
     .attrs = {.scalar = {0.4}, .rng = {99, 5, 11}},
     .run = elementwise_run_dropout,
     .reference = elementwise_ref_dropout},
};

#ifdef KILN_WITH_CUDA
/* f(x) on cuda:0 and f(x) on `other` (cuda:0 again, or cuda:1) must give
 * the same bytes. */
static int paths_repeat(const char *what, kiln_tensor *(*f)(kiln_tensor *), kiln_dtype dt, kiln_shape s,
                        kiln_device other) {
    int fails = 0;
    kiln_scope_begin();
    int64_t n = kh_numel(s);
    float *v = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) v[i] = (float)sin((double)i * 0.37) * (float)(1 + i % 7);
    kiln_tensor *x0 = kiln_from_data(s, KILN_F32, KILN_CUDA(0), v);
    kiln_tensor *x1 = kiln_from_data(s, KILN_F32, other, v);
    x0 = x0 ? kiln_to(x0, KILN_CUDA(0), dt, 0) : NULL;
    x1 = x1 ? kiln_to(x1, other, dt, 0) : NULL;
    kiln_tensor *a = x0 ? f(x0) : NULL, *b = x1 ? f(x1) : NULL;
    size_t bytes = a ? (size_t)kiln_numel(a) * kiln_dtype_size(kiln_dtype_of(a)) : 0;
    unsigned char *ha = malloc(bytes + 1), *hb = malloc(bytes + 1);
    if (!a || !b || kiln_to_host(a, ha, bytes) || kiln_to_host(b, hb, bytes)) {
        fprintf(stderr, "FAIL %s: %s\n", what, kiln_error_message());
        fails = 1;
    } else if (memcmp(ha, hb, bytes) != 0) {
        fprintf(stderr, "FAIL %s: the two runs differ\n", what);
        fails = 1;
    }
    free(v);
    free(ha);
    free(hb);
    kiln_scope_end();
    if (!fails) printf("ok   %s\n", what);
    return fails;
}

static kiln_tensor *paths_sum_all(kiln_tensor *x) { return kiln_sum(x, 0, NULL, false); }
static kiln_tensor *paths_sum_dim0(kiln_tensor *x) { return kiln_sum(x, 1, (int[]){0}, false); }
static kiln_tensor *paths_norm_all(kiln_tensor *x) { return kiln_norm(x, 2, 0, NULL, false); }
static kiln_tensor *paths_softmax(kiln_tensor *x) { return kiln_softmax(x, 1); }
static kiln_tensor *paths_mm(kiln_tensor *x) { return kiln_mm(x, kiln_transpose(x, 0, 1)); }
static kiln_tensor *paths_argmax(kiln_tensor *x) { return kiln_argmax(x, 1, false); }
static kiln_tensor *paths_gelu(kiln_tensor *x) { return kiln_gelu(x, false); }
#endif

int main(int argc, char **argv) {
    (void)reduce_cases;
    (void)elementwise_cases;
    int fails = kh_main(argc, argv, paths_cases, KH_COUNT(paths_cases));
#ifdef KILN_WITH_CUDA
    if (argc > 1 || getenv("KILN_OPS_FILTER")) return fails;
    if (kiln_init()) return 1;
    if (kiln_device_is_available(KILN_CUDA(0))) {
        kiln_device c0 = KILN_CUDA(0);
        fails |= paths_repeat("cuda sum of 60000 f32 repeats bit for bit", paths_sum_all, KILN_F32,
                              KILN_SHAPE(60000), c0);
        fails |= paths_repeat("cuda sum of 60000 bf16 repeats bit for bit", paths_sum_all, KILN_BF16,
                              KILN_SHAPE(60000), c0);
        fails |= paths_repeat("cuda sum over dim 0 of 3000x7 repeats", paths_sum_dim0, KILN_F32,
                              KILN_SHAPE(3000, 7), c0);
        fails |=
            paths_repeat("cuda norm of 100000 f64 repeats", paths_norm_all, KILN_F64, KILN_SHAPE(100000), c0);
        fails |=
            paths_repeat("cuda softmax of 8x3000 repeats", paths_softmax, KILN_F32, KILN_SHAPE(8, 3000), c0);
        fails |= paths_repeat("cuda mm of 100x300 repeats", paths_mm, KILN_F32, KILN_SHAPE(100, 300), c0);
    }
    /* The kernels run on the device that owns their output, on its stream. */
    if (kiln_device_is_available(KILN_CUDA(0)) && kiln_device_is_available(KILN_CUDA(1))) {
        kiln_device c1 = KILN_CUDA(1);
        fails |= paths_repeat("cuda:1 sum equals cuda:0", paths_sum_all, KILN_F32, KILN_SHAPE(30000), c1);
        fails |= paths_repeat("cuda:1 argmax equals cuda:0", paths_argmax, KILN_F16, KILN_SHAPE(40, 70), c1);
        fails |=
            paths_repeat("cuda:1 softmax equals cuda:0", paths_softmax, KILN_F64, KILN_SHAPE(5, 300), c1);
        fails |= paths_repeat("cuda:1 mm equals cuda:0", paths_mm, KILN_BF16, KILN_SHAPE(70, 40), c1);
        fails |= paths_repeat("cuda:1 gelu equals cuda:0", paths_gelu, KILN_F32, KILN_SHAPE(33, 17), c1);
    }
    kiln_shutdown();
#endif
    return fails;
}

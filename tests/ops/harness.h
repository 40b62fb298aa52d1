/* The op test harness: a table of cases, each one op and one parameter set,
 * checked against a float64 reference written as plain loops, with
 * gradients checked against central finite differences.
 *
 * ---- Writing cases (tests/ops/cases_<group>.c) --------------------------------------
 *
 *   static kiln_tensor *elementwise_run_add(kh_run *r) {
 *       return kiln_add(r->in[0], r->in[1]);             // public API, new reference
 *   }
 *   static void elementwise_ref_add(kh_ref *r) {
 *       kiln_shape s;
 *       kh_broadcast(r->shape[0], r->shape[1], &s);       // NumPy broadcasting
 *       double *y = kh_out(r, 0, s, 0);                  // output 0: shape, run dtype
 *       for (int64_t i = 0; i < kh_numel(s); i++)
 *           y[i] = r->in[0][kh_bcast_index(s, i, r->shape[0])] + r->in[1][kh_bcast_index(s, i, r->shape[1])];
 *   }
 *   static const kh_case elementwise_cases[] = {
 *       {.name = "add", .params = "3x5+1x5 T", .dtypes = KH_FLOAT | KILN_DT(KILN_I32),
 *        .n_in = 2,
 *        .in = {{.shape = KILN_SHAPE(3, 5), .fill = KH_NORMAL, .layout = KH_TRANSPOSED, .grad = true},
 *               {.shape = KILN_SHAPE(1, 5), .fill = KH_NORMAL, .grad = true}},
 *        .op = KH_OP(KILN_OP_ADD), .run = elementwise_run_add, .reference = elementwise_ref_add},
 *   };
 *
 * and tests/ops/test_ops_<group>.c:
 *
 *   #include "ops/harness.c"
 *   #include "ops/cases_elementwise.c"
 *   int main(int argc, char **argv) {
 *       return kh_main(argc, argv, elementwise_cases, KH_COUNT(elementwise_cases));
 *   }
 *
 * NAMING RULE: every file-scope name in cases_<group>.c starts with
 * `<group>_` (elementwise_run_add, reduce_cases, nn_ref_conv2d, ...): the
 * oracle test (test_ops_oracle.c) includes every cases file into one
 * translation unit. Keep shapes small (gradient checks run two forwards
 * per input element; aim for < ~300 elements per grad input).
 *
 * ---- What the harness does with a case ---------------------------------------------
 *
 * For each device (CPU; later every compiled backend) and each dtype in
 * `dtypes`:
 *  1. Inputs: values from a fixed seed (derived from name + params + input
 *     index), per input `fill`; stored in the input's dtype (`as`: 0 means
 *     the run dtype, except KH_BOOL which defaults to bool); the reference
 *     receives exactly the stored values (after rounding to f16/bf16/int)
 *     as contiguous row-major double arrays.
 *  2. Forward: run() on the public API; out[0] and any auxiliary outputs
 *     the reference produced (r->aux[k-1] <-> kh_out(r, k, ...)) must have
 *     the reference's shape and dtype; values are compared by normwise
 *     relative error ||a-b|| / ||b|| against kh_tol_forward(dtype) (one
 *     table per dtype, see harness.c); integer/bool outputs must match
 *     exactly; NaN never passes. Inputs must be unchanged after the run.
 *  3. Kernel check with guard bytes (cases with .op set): the CPU kernel of
 *     that op is called directly on buffers the harness mallocs itself,
 *     guard regions before and after each input, output and workspace;
 *     shapes from the op's infer function, inputs cast to the dtypes infer
 *     asks for and broadcast as the dispatcher does. Guards must survive and
 *     the outputs must match the reference as in 2. With .op set, the
 *     case's inputs must be the op's inputs in ops.def order (NULL = absent
 *     optional input) and .attrs exactly what the public function passes.
 *  4. Backward (once per device, in float64, when any input has .grad):
 *     L = sum(out0 * R) for a fixed random R; kiln_backward(out0, R, false)
 *     then kiln_grad(input) for each .grad input is compared with central
 *     finite differences (eps 1e-6) of L through run(), threshold
 *     KH_TOL_GRAD. A NULL gradient counts as zeros.
 *
 * Each run() call happens inside a kiln scope; the harness keeps only the
 * returned tensor and r->aux, so run() may leave intermediates unreleased.
 * run() must not modify its inputs (clone first for in-place ops).
 *
 * Filtering: argv[1] or env KILN_OPS_FILTER: only cases whose id
 * "name params" contains that substring run. Failures print one line
 * each to stderr ("FAIL id [cpu f16]: what, how far off"). */
#ifndef KILN_TESTS_OPS_HARNESS_H
#define KILN_TESTS_OPS_HARNESS_H

#include <math.h> /* for the cases' references, whatever the include order */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"
#include "ops/op_registry.h"

#define KH_MAX_IN   8 /* inputs per case */
#define KH_MAX_OUT  4 /* out[0] + up to 3 auxiliary outputs */
#define KH_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* A fixed dtype for an input or an output (0 means the run's dtype). */
#define KH_AS(dtype) ((int)(dtype) + 1)
/* Name the op for the kernel-level guard-byte check (0 = public path only). */
#define KH_OP(id) ((int)(id) + 1)

#define KH_FLOAT KILN_DT_FLOAT /* f32 | f64 | f16 | bf16 */

typedef enum kh_fill {
    KH_NORMAL = 0, /* N(0, 1) */
    KH_POSITIVE,   /* uniform [0.5, 2): log, sqrt, rsqrt, pow bases, divisors */
    KH_UNIFORM,    /* uniform [lo, hi); [-1, 1) when lo == hi */
    KH_AWAY,       /* +-[0.5, 1.5), random sign: away from kinks at 0 (abs, relu) */
    KH_INDEX,      /* integers uniform in [lo, hi) (class indices, gather indices) */
    KH_BOOL,       /* 0 / 1 with probability 1/2 (stored as bool unless `as`) */
    KH_DISTINCT,   /* a shuffled set of distinct values k/8, k = -n/2.. (no ties: max, argmax, pools) */
    KH_SPECIAL,    /* normal values with NaN, +inf, -inf mixed in (isfinite) */
} kh_fill;

typedef enum kh_layout {
    KH_CONTIG = 0, /* contiguous */
    KH_TRANSPOSED, /* a transposed view (last two dims swapped in memory); 1-D: as KH_STRIDED */
    KH_STRIDED,    /* every other element of a bigger buffer (last-dim stride 2, offset 1),
                    * the gaps filled with NaN (floats) so a stride bug shows */
} kh_layout;

typedef struct kh_input {
    kiln_shape shape;
    kh_fill fill;
    double lo, hi; /* KH_UNIFORM / KH_INDEX range */
    int as;        /* 0: run dtype (bool for KH_BOOL); KH_AS(KILN_I64) etc. fixes it */
    kh_layout layout;
    bool grad;   /* check the gradient w.r.t. this input */
    bool absent; /* pass NULL (an optional input) */
} kh_input;

struct kh_case;

/* What run() gets. */
typedef struct kh_run {
    const struct kh_case *c;
    const kiln_op_attrs *attrs; /* &c->attrs */
    kiln_device device;
    kiln_dtype dtype; /* this run's dtype */
    int n_in;
    kiln_tensor *in[KH_MAX_IN]; /* borrowed; NULL where absent */
    /* Set by run() for auxiliary outputs 1..: new references (e.g. the
     * indices of max_pool2d). Released by the harness. */
    kiln_tensor *aux[KH_MAX_OUT - 1];
} kh_run;

/* Computes out[0] through the public API: a new reference, or NULL with
 * kiln's error set. */
typedef kiln_tensor *(*kh_run_fn)(kh_run *r);

/* What reference() gets. */
typedef struct kh_ref {
    const struct kh_case *c;
    const kiln_op_attrs *attrs; /* &c->attrs */
    kiln_dtype dtype;           /* the run's dtype (values are already rounded to it) */
    int n_in;
    const double *in[KH_MAX_IN]; /* contiguous row-major values; NULL where absent */
    kiln_shape shape[KH_MAX_IN];
    kiln_dtype in_dtype[KH_MAX_IN];
    /* Filled by kh_out; read by the harness. */
    double *out[KH_MAX_OUT];
    kiln_shape out_shape[KH_MAX_OUT];
    kiln_dtype out_dtype[KH_MAX_OUT];
} kh_ref;

/* Computes the expected outputs in float64 with plain loops, through
 * kh_out. Outputs it does not create are not compared. */
typedef void (*kh_ref_fn)(kh_ref *r);

/* Declare output k (0 = what run returns, k >= 1 = r->aux[k-1]) with its
 * expected shape and dtype (0 = the run dtype, KH_AS(KILN_BOOL), ...);
 * returns a zeroed array of numel doubles to fill (owned by the harness). */
double *kh_out(kh_ref *r, int k, kiln_shape shape, int as);

typedef struct kh_case {
    const char *name; /* the op, as in the public API: "add", "cross_entropy" (the oracle maps it to torch) */
    const char *params; /* the parameter set, short: "3x5+1x5 T"; "name params" is the case's id:
                         * filters match it, it seeds the inputs, the oracle keys on it, so it must
                         * be unique across all groups (kh_main fails duplicates) */
    unsigned dtypes;    /* KILN_DT(...) mask of dtypes to run (KH_FLOAT for float ops) */
    int n_in;
    kh_input in[KH_MAX_IN];
    kiln_op_attrs attrs; /* op parameters, read by run and reference (and the kernel check) */
    int op;              /* KH_OP(KILN_OP_X): also run the CPU kernel with guard bytes */
    kh_run_fn run;
    kh_ref_fn reference;
    /* Not NULL: run() must fail with an error message containing this
     * (no reference, no gradients). */
    const char *expect_error;
    /* With expect_error: the error depends on input values (a class index
     * out of range), which a device kernel cannot check without blocking the
     * host. Only the CPU must raise it; other devices must return a result
     * whose output 0 holds a NaN (the kernels' way of flagging it). */
    bool value_error;
    /* Self-test only: use this kernel instead of the registered CPU one. */
    const kiln_op_kernel *kernel;
} kh_case;

/* ---- Thresholds (documented in harness.c) -------------------------------------------- */
double kh_tol_forward(kiln_dtype dtype);
#define KH_TOL_GRAD 1e-6 /* float64 analytic vs central differences, normwise */
#define KH_FD_EPS   1e-6

/* ---- Running --------------------------------------------------------------------------- */

/* Runs every case matching the filter on every device; prints one line per
 * case and a summary. Returns 0 when all pass, 1 otherwise. Calls kiln_init
 * and kiln_shutdown. */
int kh_main(int argc, char **argv, const kh_case *cases, int n_cases);
/* One case on one device (every dtype it claims, kernel check, backward).
 * Returns 0 on pass, 1 on failure (printed to stderr). kiln_init first. */
int kh_run_case(const kh_case *c, kiln_device device);
/* The case's id "name params" into buf; returns buf. */
const char *kh_case_id(const kh_case *c, char *buf, size_t size);

/* ---- Helpers for references --------------------------------------------------------- */
int64_t kh_numel(kiln_shape s);
/* NumPy broadcast of a and b; false if incompatible. */
bool kh_broadcast(kiln_shape a, kiln_shape b, kiln_shape *out);
/* The flat index into a tensor of shape `in` that broadcasts to element
 * `flat` (row-major) of shape `out`. */
int64_t kh_bcast_index(kiln_shape out, int64_t flat, kiln_shape in);
/* Row-major flat index <-> multi-index. */
void kh_unravel(kiln_shape s, int64_t flat, int64_t *idx);
int64_t kh_ravel(kiln_shape s, const int64_t *idx);

/* ---- Internals shared with the self-test and the oracle test ---------------------- */

/* Input i's values for this case and dtype (what the reference sees), as
 * generated: n = numel of the shape. Caller frees. NULL if absent. */
double *kh_gen_input(const kh_case *c, int i, kiln_dtype dtype);
/* The fixed random R of out0 with `n` elements. Caller frees. */
double *kh_gen_r(const kh_case *c, int64_t n);
/* Normwise relative error ||a-b|| / ||b|| (||a|| when ||b|| is 0); +inf if
 * any NaN in a or b. */
double kh_rel_err(const double *a, const double *b, int64_t n);

#endif

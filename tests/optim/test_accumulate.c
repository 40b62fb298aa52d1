/* Gradient accumulation (kiln_accumulate_backward, what `kiln train
 * --accum` runs): one optimizer step over a batch split into uneven
 * micro-batches equals one full-batch step — parameters normwise within
 * 1e-6 over the whole model without BatchNorm — because each
 * micro-batch's mean loss is weighted by its share of the samples. The
 * naive weighting (1/N per micro-batch) is measurably different, so the
 * test can fail. With BatchNorm the micro-batches normalise with their own
 * statistics; that difference is measured and printed (docs/training.md). */
#include <math.h>

#include "test_util.h"

#define B 10

static const char plain[] = "conv 3 k3 p1\nrelu\nmaxpool 2\nflatten\nlinear 6\nrelu\nlinear 4\n";
static const char with_bn[] = "conv 3 k3 p1\nbatchnorm\nrelu\nmaxpool 2\nflatten\nlinear 4\n";

typedef struct net {
    kiln_module *m;
    kiln_optimizer *opt;
    kiln_tensor **params;
    int n;
} net;

static net make(const char *spec) {
    net r = {0};
    kiln_manual_seed(7);
    CHECK_OK(kiln_model_spec_parse(spec, "acc.txt", 1, 6, 6, &r.m));
    CHECK_OK(kiln_module_parameters(r.m, &r.params, &r.n));
    kiln_sgd_opts o = kiln_sgd_defaults(0.5);
    o.momentum = 0.9;
    r.opt = kiln_sgd(r.params, r.n, &o);
    CHECK(r.opt != NULL);
    return r;
}

static void drop(net *r) {
    kiln_optimizer_free(r->opt);
    free(r->params);
    kiln_module_free(r->m);
}

/* A fixed batch: x (B, 1, 6, 6), y (B). */
static void batch(kiln_tensor **x, kiln_tensor **y) {
    float xs[B * 36];
    int64_t ys[B];
    for (int i = 0; i < B * 36; i++) xs[i] = sinf((float)i * 0.37f) + 0.1f * (float)(i % 5);
    for (int i = 0; i < B; i++) ys[i] = (i * 3 + 1) % 4;
    *x = kiln_from_data(KILN_SHAPE(B, 1, 6, 6), KILN_F32, KILN_CPU, xs);
    *y = kiln_from_data(KILN_SHAPE(B), KILN_I64, KILN_CPU, ys);
}

/* One step with `parts` micro-batches; *loss and *hits from the call. */
static void step(net *r, int parts, double *loss, double *hits) {
    kiln_scope_begin();
    kiln_tensor *x, *y, *l = NULL, *c = NULL;
    batch(&x, &y);
    CHECK_OK(kiln_optimizer_zero_grad(r->opt, true));
    CHECK_OK(kiln_accumulate_backward(r->m, x, y, parts, NULL, &l, &c));
    CHECK_OK(kiln_optimizer_step(r->opt));
    CHECK_OK(kiln_item(l, loss));
    CHECK_OK(kiln_item(c, hits));
    kiln_scope_end();
}

/* The naive accumulation: every micro-batch's mean loss divided by the
 * number of micro-batches, whatever its size. */
static void naive_step(net *r, int parts) {
    kiln_scope_begin();
    kiln_tensor *x, *y;
    batch(&x, &y);
    CHECK_OK(kiln_optimizer_zero_grad(r->opt, true));
    for (int k = 0; k < parts; k++) {
        int64_t lo = B * k / parts, hi = B * (k + 1) / parts;
        kiln_tensor *l = kiln_cross_entropy(kiln_module_forward(r->m, kiln_narrow(x, 0, lo, hi - lo)),
                                            kiln_narrow(y, 0, lo, hi - lo), NULL);
        CHECK_OK(kiln_backward(kiln_mul_scalar(l, 1.0 / parts), NULL, false));
    }
    CHECK_OK(kiln_optimizer_step(r->opt));
    kiln_scope_end();
}

/* sqrt(sum over all parameters of (a - b)^2) and of a^2. */
static double param_distance(net *a, net *b, double *norm_a) {
    double d2 = 0, a2 = 0;
    for (int i = 0; i < a->n; i++) {
        int64_t n = kiln_numel(a->params[i]);
        float *p = malloc((size_t)n * sizeof *p), *q = malloc((size_t)n * sizeof *q);
        CHECK_OK(kiln_to_host(a->params[i], p, (size_t)n * sizeof *p));
        CHECK_OK(kiln_to_host(b->params[i], q, (size_t)n * sizeof *q));
        for (int64_t j = 0; j < n; j++) {
            d2 += ((double)p[j] - q[j]) * ((double)p[j] - q[j]);
            a2 += (double)p[j] * p[j];
        }
        free(p);
        free(q);
    }
    if (norm_a) *norm_a = sqrt(a2);
    return sqrt(d2);
}

static void test_equals_full_batch(void) {
    net full = make(plain);
    double loss_full, hits_full;
    step(&full, 1, &loss_full, &hits_full);
    step(&full, 1, &loss_full, &hits_full); /* a second step exercises the momentum buffers too */
    /* 10 = 3 + 3 + 4 and 2 + 3 + 2 + 3: uneven splits. */
    for (int parts = 3; parts <= 4; parts++) {
        net acc = make(plain);
        double loss, hits;
        step(&acc, parts, &loss, &hits);
        step(&acc, parts, &loss, &hits);
        double norm = 0, d = param_distance(&full, &acc, &norm);
        printf("accum %d micro-batches: |params - full-batch params| = %.3g (|params| = %.3g)\n", parts, d, norm);
        CHECK_MSG(d <= 1e-6, "%d micro-batches: normwise difference %.3g > 1e-6", parts, d);
        CHECK_MSG(fabs(loss - loss_full) <= 1e-6, "loss %.9g vs full batch %.9g", loss, loss_full);
        CHECK_EQ_I((int64_t)hits, (int64_t)hits_full);
        drop(&acc);

        net naive = make(plain);
        naive_step(&naive, parts);
        naive_step(&naive, parts);
        double dn = param_distance(&full, &naive, NULL);
        printf("naive 1/%d weighting: |params - full-batch params| = %.3g\n", parts, dn);
        CHECK_MSG(dn > 1e-4, "the naive weighting should differ (%.3g)", dn);
        drop(&naive);
    }
    drop(&full);
}

static void test_batchnorm_difference(void) {
    net full = make(with_bn), acc = make(with_bn);
    double l, h;
    step(&full, 1, &l, &h);
    step(&acc, 3, &l, &h);
    double norm = 0, d = param_distance(&full, &acc, &norm);
    printf("BatchNorm, 3 micro-batches: |params - full-batch params| = %.3g (|params| = %.3g): per-micro-batch "
           "statistics\n",
           d, norm);
    CHECK_MSG(d > 1e-6, "BatchNorm with micro-batches should differ from the full batch (%.3g)", d);
    CHECK(d < 0.1 * norm);
    drop(&full);
    drop(&acc);
}

static void test_errors(void) {
    net r = make(plain);
    kiln_scope_begin();
    kiln_tensor *x, *y;
    batch(&x, &y);
    kiln_loss_opts sum = kiln_loss_defaults();
    sum.reduction = KILN_LOSS_SUM;
    CHECK_FAILS(kiln_accumulate_backward(r.m, x, y, 2, &sum, NULL, NULL), KILN_ERR_INVALID_ARGUMENT, "mean");
    kiln_tensor *y3 = kiln_narrow(y, 0, 0, 3);
    CHECK_FAILS(kiln_accumulate_backward(r.m, x, y3, 2, NULL, NULL, NULL), KILN_ERR_INVALID_ARGUMENT,
                "same batch size");
    /* More micro-batches than samples: one sample each. */
    CHECK_OK(kiln_accumulate_backward(r.m, x, y, 100, NULL, NULL, NULL));
    kiln_scope_end();
    drop(&r);
}

int main(void) {
    if (kiln_init()) return 1;
    test_equals_full_batch();
    test_batchnorm_difference();
    test_errors();
    kiln_shutdown();
    return kt_finish();
}

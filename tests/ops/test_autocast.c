/* Autocast on the CPU with bf16 (PyTorch's CPU default): the precision
 * classes (mm/linear/conv in bf16; softmax, log_softmax, losses, sum in
 * f32; cat promotes; relu as-is), f64 and in-place ops untouched, nesting
 * and disabled regions, the per-region weight-cast cache (reuse, version
 * keying, cleared at the outermost end), backward with autocast off and
 * gradients in each input's dtype, BatchNorm parameters in f32 under
 * autocast and after kiln_module_to_dtype(BF16) in training and eval. */
#include "ops/autocast.h"
#include "test_util.h"

#define DT(t) kiln_dtype_of(t)

static kiln_tensor *randn(kiln_shape s, uint64_t seed) {
    kiln_manual_seed(seed);
    return kiln_randn(s, KILN_F32, KILN_CPU);
}

/* max |a - b| / max |b| over two same-shaped tensors (any floating dtype). */
static double rel_diff(kiln_tensor *a, kiln_tensor *b) {
    kiln_tensor *a32 = kiln_cast(a, KILN_F64), *b32 = kiln_cast(b, KILN_F64);
    int64_t n = kiln_numel(b);
    double *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    kiln_to_host(a32, x, (size_t)n * sizeof *x);
    kiln_to_host(b32, y, (size_t)n * sizeof *y);
    double d = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs(x[i] - y[i]));
        m = fmax(m, fabs(y[i]));
    }
    free(x);
    free(y);
    kiln_release(a32);
    kiln_release(b32);
    return m > 0 ? d / m : d;
}

static void test_classes(void) {
    kiln_scope_begin();
    kiln_tensor *a = randn(KILN_SHAPE(8, 16), 1), *b = randn(KILN_SHAPE(16, 4), 2);
    kiln_tensor *ref = kiln_mm(a, b);
    CHECK(!kiln_autocast_enabled(KILN_DEVICE_CPU));
    CHECK_OK(kiln_autocast_begin(KILN_DEVICE_CPU, KILN_BF16));
    CHECK(kiln_autocast_enabled(KILN_DEVICE_CPU) && kiln_autocast_dtype(KILN_DEVICE_CPU) == KILN_BF16);
    CHECK(!kiln_autocast_enabled(KILN_DEVICE_CUDA));
    kiln_tensor *mm = kiln_mm(a, b);
    CHECK_EQ_I(DT(mm), KILN_BF16);
    CHECK_MSG(rel_diff(mm, ref) < 2e-2, "bf16 mm differs from f32 by %g", rel_diff(mm, ref));
    CHECK_EQ_I(DT(kiln_softmax(mm, 1)), KILN_F32);
    CHECK_EQ_I(DT(kiln_log_softmax(mm, 1)), KILN_F32);
    CHECK_EQ_I(DT(kiln_sum(mm, 0, NULL, false)), KILN_F32);
    CHECK_EQ_I(DT(kiln_mean(mm, 0, NULL, false)), KILN_F32);
    CHECK_EQ_I(DT(kiln_exp(mm)), KILN_F32);
    CHECK_EQ_I(DT(kiln_relu(mm)), KILN_BF16); /* as-is */
    CHECK_EQ_I(DT(kiln_relu(a)), KILN_F32);
    kiln_tensor *y = kiln_zeros(KILN_SHAPE(8), KILN_I64, KILN_CPU);
    kiln_tensor *ce = kiln_cross_entropy(mm, y, NULL);
    CHECK_EQ_I(DT(ce), KILN_F32);
    kiln_tensor *pair[2] = {mm, ref};
    CHECK_EQ_I(DT(kiln_cat(2, pair, 0)), KILN_F32); /* promote: bf16 + f32 -> f32 */
    kiln_tensor *w = randn(KILN_SHAPE(5, 16), 3);
    CHECK_EQ_I(DT(kiln_linear(a, w, NULL)), KILN_BF16);
    kiln_tensor *img = randn(KILN_SHAPE(2, 3, 6, 6), 4), *k = randn(KILN_SHAPE(4, 3, 3, 3), 5);
    CHECK_EQ_I(DT(kiln_conv2d(img, k, NULL, NULL)), KILN_BF16);
    /* f64 stays f64; in-place ops are not cast. */
    kiln_tensor *d = kiln_cast(a, KILN_F64), *e = kiln_cast(b, KILN_F64);
    CHECK_EQ_I(DT(kiln_mm(d, e)), KILN_F64);
    kiln_tensor *acc = kiln_zeros(KILN_SHAPE(8, 16), KILN_F32, KILN_CPU);
    CHECK_EQ_I(DT(kiln_add_(acc, a)), KILN_F32);

    /* Nesting: an inner f32 region turns autocast off, its end restores it. */
    CHECK_OK(kiln_autocast_begin(KILN_DEVICE_CPU, KILN_F32));
    CHECK_EQ_I(DT(kiln_mm(a, b)), KILN_F32);
    CHECK_OK(kiln_autocast_begin(KILN_DEVICE_CPU, KILN_BF16));
    CHECK_EQ_I(DT(kiln_mm(a, b)), KILN_BF16);
    CHECK_OK(kiln_autocast_end());
    CHECK_EQ_I(DT(kiln_mm(a, b)), KILN_F32);
    CHECK_OK(kiln_autocast_end());
    /* A region for another device type leaves CPU ops alone. */
    CHECK_OK(kiln_autocast_begin(KILN_DEVICE_CUDA, KILN_F16));
    CHECK_EQ_I(DT(kiln_mm(a, b)), KILN_BF16);
    CHECK_OK(kiln_autocast_end());
    CHECK_OK(kiln_autocast_end());
    CHECK_EQ_I(DT(kiln_mm(a, b)), KILN_F32);
    CHECK_FAILS(kiln_autocast_end(), KILN_ERR_STATE, "no autocast region is open");
    CHECK_FAILS(kiln_autocast_begin(KILN_DEVICE_CPU, KILN_I32), KILN_ERR_INVALID_ARGUMENT, "not an autocast dtype");
    kiln_scope_end();
}

/* Weights (f32 leaves that require grad) are cast once per region. */
static void test_cache(void) {
    kiln_scope_begin();
    kiln_tensor *x = randn(KILN_SHAPE(4, 8), 6), *w = randn(KILN_SHAPE(3, 8), 7);
    CHECK_OK(kiln_set_requires_grad(w, true));
    size_t entries = 0;
    uint64_t hits0 = 0, hits = 0;
    kiln_autocast_cache_stats(&entries, &hits0);
    CHECK_OK(kiln_autocast_begin(KILN_DEVICE_CPU, KILN_BF16));
    kiln_tensor *y1 = kiln_linear(x, w, NULL);
    kiln_tensor *y2 = kiln_linear(x, w, NULL);
    kiln_autocast_cache_stats(&entries, &hits);
    CHECK_EQ_I(entries, 1); /* x does not require grad: not cached */
    CHECK_EQ_I(hits - hits0, 1);
    CHECK(rel_diff(y1, y2) == 0);
    /* Both uses accumulate into w's gradient through the one cached cast. */
    kiln_tensor *loss = kiln_add(kiln_sum(y1, 0, NULL, false), kiln_sum(y2, 0, NULL, false));
    /* Inside the region, backward runs with autocast off and returns. */
    CHECK_OK(kiln_backward(loss, NULL, false));
    CHECK(kiln_autocast_enabled(KILN_DEVICE_CPU));
    kiln_tensor *g = kiln_grad(w);
    CHECK(g && DT(g) == KILN_F32);
    CHECK_OK(kiln_autocast_end());
    /* d loss / d w = 2 * (sum of x's rows) in every row: bf16 rounding only. */
    kiln_tensor *ones = kiln_ones(KILN_SHAPE(3, 4), KILN_F32, KILN_CPU);
    kiln_tensor *want = kiln_mul_scalar(kiln_mm(ones, x), 2.0);
    CHECK_MSG(rel_diff(g, want) < 1e-2, "weight gradient differs by %g", rel_diff(g, want));
    /* A write to w bumps its version: the next use casts again. */
    CHECK_OK(kiln_autocast_begin(KILN_DEVICE_CPU, KILN_BF16));
    kiln_linear(x, w, NULL);
    kiln_autocast_cache_stats(&entries, NULL);
    CHECK_EQ_I(entries, 1);
    kiln_no_grad_begin();
    kiln_release(kiln_mul_(w, kiln_full(KILN_SHAPE(3, 8), 0.5, KILN_F32, KILN_CPU)));
    kiln_grad_mode_end();
    kiln_linear(x, w, NULL);
    kiln_autocast_cache_stats(&entries, &hits);
    CHECK_EQ_I(entries, 2);
    /* Under no_grad a separate entry (its cast has no graph). */
    kiln_no_grad_begin();
    kiln_linear(x, w, NULL);
    kiln_grad_mode_end();
    kiln_autocast_cache_stats(&entries, NULL);
    CHECK_EQ_I(entries, 3);
    CHECK_OK(kiln_autocast_end());
    kiln_autocast_cache_stats(&entries, NULL);
    CHECK_EQ_I(entries, 0);
    kiln_scope_end();
}

/* Gradient accumulation inside one region (kiln train --accum N --amp):
 * each micro-batch's forward reuses the cached weight cast, and each
 * backward goes through its graph again. A cast saves nothing, so the
 * second backward is allowed (PyTorch's rule; it once failed with "the
 * graph of kiln_cast was already freed"), and w's gradient is the sum of
 * both micro-batches'. A node that saved tensors still refuses a second
 * backward. */
static void test_cache_across_backwards(void) {
    kiln_scope_begin();
    kiln_tensor *x1 = randn(KILN_SHAPE(4, 8), 16), *x2 = randn(KILN_SHAPE(5, 8), 17), *w = randn(KILN_SHAPE(3, 8), 18);
    CHECK_OK(kiln_set_requires_grad(w, true));
    CHECK_OK(kiln_autocast_begin(KILN_DEVICE_CPU, KILN_BF16));
    CHECK_OK(kiln_backward(kiln_sum(kiln_linear(x1, w, NULL), 0, NULL, false), NULL, false));
    kiln_status st = kiln_backward(kiln_sum(kiln_linear(x2, w, NULL), 0, NULL, false), NULL, false);
    CHECK_MSG(st == KILN_OK, "second micro-batch's backward: %s", kiln_error_message());
    size_t entries = 0;
    kiln_autocast_cache_stats(&entries, NULL);
    CHECK_EQ_I(entries, 1);
    CHECK_OK(kiln_autocast_end());
    /* d/dw of sum(x1 w^T) + sum(x2 w^T): every row is the sum of all rows of x1 and x2. */
    kiln_tensor *want = kiln_add(kiln_mm(kiln_ones(KILN_SHAPE(3, 4), KILN_F32, KILN_CPU), x1),
                                 kiln_mm(kiln_ones(KILN_SHAPE(3, 5), KILN_F32, KILN_CPU), x2));
    kiln_tensor *g = kiln_grad(w);
    CHECK(g != NULL);
    if (g) CHECK_MSG(rel_diff(g, want) < 1e-2, "accumulated weight gradient differs by %g", rel_diff(g, want));
    /* A graph whose nodes saved tensors is still spent after one backward. */
    kiln_tensor *y = kiln_sum(kiln_mul(w, w), 0, NULL, false);
    CHECK_OK(kiln_backward(y, NULL, false));
    CHECK_FAILS(kiln_backward(y, NULL, false), KILN_ERR_STATE, "already freed");
    kiln_scope_end();
}

/* Backward outside the region: every gradient has its input's dtype, and
 * the values match the f32 computation to bf16 precision. */
static void test_backward_dtypes(void) {
    kiln_scope_begin();
    kiln_tensor *x = randn(KILN_SHAPE(6, 10), 8), *w = randn(KILN_SHAPE(4, 10), 9), *bias = randn(KILN_SHAPE(4), 10);
    kiln_tensor *xb = kiln_cast(x, KILN_BF16);
    CHECK_OK(kiln_set_requires_grad(w, true));
    CHECK_OK(kiln_set_requires_grad(bias, true));
    CHECK_OK(kiln_set_requires_grad(xb, true));
    kiln_tensor *y = kiln_zeros(KILN_SHAPE(6), KILN_I64, KILN_CPU);
    CHECK_OK(kiln_autocast_begin(KILN_DEVICE_CPU, KILN_BF16));
    kiln_tensor *logits = kiln_linear(xb, w, bias);
    CHECK_EQ_I(DT(logits), KILN_BF16);
    kiln_tensor *loss = kiln_cross_entropy(logits, y, NULL);
    CHECK_OK(kiln_autocast_end());
    CHECK_EQ_I(DT(loss), KILN_F32);
    CHECK_OK(kiln_backward(loss, NULL, false));
    kiln_tensor *gw = kiln_grad(w), *gb = kiln_grad(bias), *gx = kiln_grad(xb);
    CHECK(gw && gb && gx);
    if (gw && gb && gx) {
        CHECK_EQ_I(DT(gw), KILN_F32);
        CHECK_EQ_I(DT(gb), KILN_F32);
        CHECK_EQ_I(DT(gx), KILN_BF16);
    }
    /* The f32 reference. */
    kiln_tensor *w2 = kiln_to(w, KILN_CPU, KILN_F32, KILN_COPY), *b2 = kiln_to(bias, KILN_CPU, KILN_F32, KILN_COPY);
    kiln_tensor *x2 = kiln_cast(xb, KILN_F32);
    kiln_set_requires_grad(w2, true);
    kiln_set_requires_grad(b2, true);
    CHECK_OK(kiln_backward(kiln_cross_entropy(kiln_linear(x2, w2, b2), y, NULL), NULL, false));
    CHECK_MSG(rel_diff(gw, kiln_grad(w2)) < 3e-2, "gw rel diff %g", rel_diff(gw, kiln_grad(w2)));
    CHECK_MSG(rel_diff(gb, kiln_grad(b2)) < 3e-2, "gb rel diff %g", rel_diff(gb, kiln_grad(b2)));
    kiln_scope_end();
}

/* BatchNorm stays f32 under autocast and after a wholesale bf16 conversion. */
static void test_batch_norm_f32(void) {
    kiln_scope_begin();
    kiln_module *conv = kiln_nn_conv2d(3, 4, 3, 1, 1, 1, 1, true), *bn = kiln_nn_batch_norm2d(4, 1e-5, 0.1, true, true);
    kiln_tensor *x = randn(KILN_SHAPE(2, 3, 5, 5), 11);
    CHECK_OK(kiln_autocast_begin(KILN_DEVICE_CPU, KILN_BF16));
    kiln_tensor *h = kiln_module_forward(conv, x);
    CHECK(h && DT(h) == KILN_BF16);
    kiln_tensor *o = h ? kiln_module_forward(bn, h) : NULL;
    CHECK(o && DT(o) == KILN_BF16);
    CHECK_OK(kiln_autocast_end());
    kiln_tensor *rm = kiln_module_state_get(bn, "running_mean"), *bw = kiln_module_state_get(bn, "weight");
    CHECK(rm && DT(rm) == KILN_F32 && bw && DT(bw) == KILN_F32);
    if (o) CHECK_OK(kiln_backward(kiln_sum(o, 0, NULL, false), NULL, false));
    kiln_tensor *gbw = kiln_grad(bw);
    CHECK(gbw && DT(gbw) == KILN_F32);

    /* .to(bf16) wholesale: conv bf16, BatchNorm f32; train and eval run. */
    CHECK_OK(kiln_module_to_dtype(conv, KILN_BF16));
    CHECK_OK(kiln_module_to_dtype(bn, KILN_BF16));
    kiln_tensor *cw = kiln_module_state_get(conv, "weight");
    CHECK(cw && DT(cw) == KILN_BF16);
    kiln_tensor *rv = kiln_module_state_get(bn, "running_var"), *bw2 = kiln_module_state_get(bn, "weight");
    CHECK(rv && DT(rv) == KILN_F32 && bw2 && DT(bw2) == KILN_F32);
    kiln_tensor *xb = kiln_cast(x, KILN_BF16);
    for (int train = 1; train >= 0; train--) {
        kiln_module_train(bn, train);
        kiln_tensor *hb = kiln_module_forward(conv, xb);
        kiln_tensor *ob = hb ? kiln_module_forward(bn, hb) : NULL;
        CHECK_MSG(ob && DT(ob) == KILN_BF16, "bf16 model, %s mode: %s", train ? "train" : "eval", kiln_error_message());
        if (ob && train) CHECK_OK(kiln_backward(kiln_sum(ob, 0, NULL, false), NULL, false));
    }
    kiln_tensor *g2 = kiln_grad(bw2);
    CHECK(g2 && DT(g2) == KILN_F32);
    kiln_scope_end();
    kiln_module_free(conv);
    kiln_module_free(bn);
}

/* The same wholesale conversion to f16 (the tutorials' .half()), and back. */
static void test_half_model(void) {
    kiln_scope_begin();
    kiln_module *bn = kiln_nn_batch_norm2d(3, 1e-5, 0.1, true, true);
    kiln_tensor *x = randn(KILN_SHAPE(4, 3, 4, 4), 12);
    kiln_tensor *ref = kiln_module_forward(bn, x); /* f32, training */
    CHECK_OK(kiln_module_to_dtype(bn, KILN_F16));
    kiln_tensor *w = kiln_module_state_get(bn, "weight"), *rm = kiln_module_state_get(bn, "running_mean");
    CHECK(w && DT(w) == KILN_F32 && rm && DT(rm) == KILN_F32);
    kiln_tensor *xh = kiln_cast(x, KILN_F16);
    for (int train = 1; train >= 0; train--) {
        kiln_module_train(bn, train);
        kiln_tensor *o = kiln_module_forward(bn, xh);
        CHECK_MSG(o && DT(o) == KILN_F16, "f16 model, %s mode: %s", train ? "train" : "eval", kiln_error_message());
        /* Training normalises with the batch statistics: f32's result to f16 rounding. */
        if (o && train) CHECK_MSG(rel_diff(o, ref) < 2e-3, "f16 batch norm differs by %g", rel_diff(o, ref));
    }
    CHECK_OK(kiln_module_to_dtype(bn, KILN_F32));
    kiln_tensor *w32 = kiln_module_state_get(bn, "weight");
    CHECK(w32 && DT(w32) == KILN_F32);
    kiln_scope_end();
    kiln_module_free(bn);
}

/* An f16 (or bf16) model given an f32 batch outside autocast is an error
 * naming both dtypes, as in PyTorch (it used to run silently in f32); under
 * autocast the same call runs in the lower dtype; matching dtypes run. */
static void test_layer_dtype_mismatch(void) {
    kiln_scope_begin();
    kiln_tensor *x = randn(KILN_SHAPE(2, 3, 5, 5), 21), *x2 = randn(KILN_SHAPE(2, 7), 22);
    kiln_tensor *w = kiln_cast(randn(KILN_SHAPE(4, 3, 3, 3), 23), KILN_F16);
    kiln_tensor *lw = kiln_cast(randn(KILN_SHAPE(6, 7), 24), KILN_BF16);
    kiln_tensor *lb32 = randn(KILN_SHAPE(6), 25);
    CHECK_NULL_ERR(kiln_conv2d(x, w, NULL, NULL), "the input is f32 but the weight is f16");
    CHECK_NULL_ERR(kiln_linear(x2, lw, NULL), "the input is f32 but the weight is bf16");
    CHECK_NULL_ERR(kiln_linear(kiln_cast(x2, KILN_BF16), lw, lb32), "the input is bf16 but the bias is f32");
    CHECK(strstr(kiln_error_last()->hint, "kiln_autocast_begin") != NULL);
    kiln_tensor *ok = kiln_conv2d(kiln_cast(x, KILN_F16), w, NULL, NULL);
    CHECK_MSG(ok && DT(ok) == KILN_F16, "f16 conv: %s", kiln_error_message());
    CHECK_OK(kiln_autocast_begin(KILN_DEVICE_CPU, KILN_BF16));
    kiln_tensor *ac = kiln_linear(x2, lw, lb32);
    CHECK_OK(kiln_autocast_end());
    CHECK_MSG(ac && DT(ac) == KILN_BF16, "linear under autocast: %s", kiln_error_message());
    kiln_scope_end();
}

int main(void) {
    if (kiln_init()) return 1;
    test_classes();
    test_cache();
    test_cache_across_backwards();
    test_backward_dtypes();
    test_batch_norm_f32();
    test_half_model();
    test_layer_dtype_mismatch();
    kiln_shutdown();
    return kt_finish();
}

/* Gradient checkpointing: kiln_checkpoint and Sequential segments give the
 * gradients of the plain forward (dropout and BatchNorm on, running
 * statistics updated once), replay the generator, lower the allocator's
 * peak, and refuse bad use with clear errors. */
#include "kiln/amp.h"
#include "test_util.h"

/* ---- Helpers ------------------------------------------------------------------------------ */

static float *host(kiln_tensor *t) {
    int64_t n = kiln_numel(t);
    float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
    kiln_tensor *c = kiln_to(t, KILN_CPU, KILN_F32, 0);
    if (!v || !c || kiln_to_host(c, v, sizeof(float) * (size_t)n)) {
        free(v);
        v = NULL;
    }
    kiln_release(c);
    return v;
}

/* Largest |a - b| (INFINITY when shapes differ or a read fails). */
static double max_diff(kiln_tensor *a, kiln_tensor *b) {
    if (!a || !b || kiln_numel(a) != kiln_numel(b)) return INFINITY;
    float *x = host(a), *y = host(b);
    double d = x && y ? 0 : INFINITY;
    for (int64_t i = 0; x && y && i < kiln_numel(a); i++) d = fmax(d, fabs((double)x[i] - (double)y[i]));
    free(x);
    free(y);
    return d;
}

static const char *SPEC = "conv 8 k3 p1\n"
                          "batchnorm\n"
                          "relu\n"
                          "dropout 0.3\n"
                          "residual {\n"
                          "  conv 8 k3 p1 nobias\n"
                          "  batchnorm\n"
                          "  relu\n"
                          "  conv 8 k3 p1 nobias\n"
                          "  batchnorm\n"
                          "}\n"
                          "conv 16 k3 p1 s2\n"
                          "batchnorm\n"
                          "relu\n"
                          "dropout 0.5\n"
                          "adaptiveavgpool 1\n"
                          "flatten\n"
                          "linear 10\n";

static kiln_module *make_model(void) {
    kiln_manual_seed(42);
    kiln_module *m = NULL;
    CHECK_OK(kiln_model_spec_parse(SPEC, "test", 3, 12, 12, &m));
    return m;
}

typedef struct step_result {
    double loss;
    float after_rand; /* a draw after the step: the generator's position */
} step_result;

/* Forward under a bf16 autocast region (the recompute must run in it too). */
static bool use_autocast;

/* One training step (forward, cross-entropy, backward) with the
 * generator at seed 7; gradients stay in the parameters. */
static step_result train_step(kiln_module *m, kiln_tensor *x, kiln_tensor *y) {
    step_result r = {NAN, NAN};
    kiln_scope_begin();
    kiln_manual_seed(7);
    if (use_autocast) CHECK_OK(kiln_autocast_begin(KILN_DEVICE_CPU, KILN_BF16));
    kiln_tensor *logits = kiln_module_forward(m, x);
    kiln_tensor *loss = logits ? kiln_cross_entropy(logits, y, NULL) : NULL;
    if (use_autocast) CHECK_OK(kiln_autocast_end());
    if (use_autocast && logits) CHECK_MSG(kiln_dtype_of(logits) == KILN_BF16, "autocast did not make bf16 logits");
    CHECK(loss != NULL);
    if (loss) {
        CHECK_OK(kiln_backward(loss, NULL, false));
        double v = NAN;
        CHECK_OK(kiln_item(loss, &v));
        r.loss = v;
    }
    kiln_tensor *u = kiln_rand(KILN_SHAPE(1), KILN_F32, KILN_CPU);
    float *h = u ? host(u) : NULL;
    if (h) r.after_rand = h[0];
    free(h);
    kiln_scope_end();
    return r;
}

static void batch(kiln_tensor **x, kiln_tensor **y, int64_t n, int64_t hw) {
    kiln_manual_seed(3);
    *x = kiln_randn(KILN_SHAPE(n, 3, hw, hw), KILN_F32, KILN_CPU);
    int64_t labels[64];
    for (int64_t i = 0; i < n && i < 64; i++) labels[i] = (i * 7) % 10;
    *y = kiln_from_data(KILN_SHAPE(n), KILN_I64, KILN_CPU, labels);
}

/* ---- Sequential segments: identical gradients and statistics ------------------------ */

static void compare_models(kiln_module *a, kiln_module *b) {
    kiln_named_tensor *sa = NULL, *sb = NULL;
    int na = 0, nb = 0;
    CHECK_OK(kiln_module_state_dict(a, &sa, &na));
    CHECK_OK(kiln_module_state_dict(b, &sb, &nb));
    CHECK_EQ_I(na, nb);
    int grads = 0;
    for (int i = 0; i < na && i < nb; i++) {
        kiln_tensor *ta = sa[i].tensor, *tb = sb[i].tensor;
        if (kiln_dtype_is_floating(kiln_dtype_of(ta))) {
            CHECK_MSG(max_diff(ta, tb) == 0, "%s differs by %g", sa[i].name, max_diff(ta, tb));
        } else { /* num_batches_tracked: updated once per forward, not again by the recompute */
            double va = -1, vb = -2;
            CHECK_OK(kiln_item(ta, &va));
            CHECK_OK(kiln_item(tb, &vb));
            CHECK_MSG(va == 1 && vb == 1, "%s: %g and %g (want 1)", sa[i].name, va, vb);
        }
        if (!kiln_requires_grad(ta)) continue;
        kiln_tensor *ga = kiln_grad(ta), *gb = kiln_grad(tb);
        CHECK_MSG(ga && gb, "%s: gradient missing (plain %p, checkpointed %p)", sa[i].name, (void *)ga, (void *)gb);
        if (ga && gb) {
            double d = max_diff(ga, gb);
            CHECK_MSG(d == 0, "%s: gradients differ by %g", sa[i].name, d);
            grads++;
        }
        kiln_release(ga);
        kiln_release(gb);
    }
    CHECK_MSG(grads >= 12, "only %d gradients compared", grads);
    free(sa);
    free(sb);
}

static void test_sequential_identical(int segments) {
    kiln_scope_begin();
    kiln_module *plain = make_model(), *ckpt = make_model();
    CHECK_OK(kiln_nn_sequential_set_checkpoint(ckpt, segments));
    CHECK_EQ_I(kiln_nn_sequential_checkpoint_segments(ckpt), segments);
    kiln_tensor *x, *y;
    batch(&x, &y, 6, 12);
    step_result r0 = train_step(plain, x, y);
    step_result r1 = train_step(ckpt, x, y);
    CHECK_MSG(r0.loss == r1.loss, "segments %d: loss %.9g vs %.9g", segments, r0.loss, r1.loss);
    CHECK_MSG(r0.after_rand == r1.after_rand, "segments %d: generator left at a different place (%g vs %g)",
              segments, r0.after_rand, r1.after_rand);
    compare_models(plain, ckpt);
    kiln_module_free(plain);
    kiln_module_free(ckpt);
    kiln_scope_end();
}

/* Dropout really draws (the check above would pass trivially without it):
 * a step with another seed gives another loss. */
static void test_dropout_draws(void) {
    kiln_scope_begin();
    kiln_module *m = make_model();
    CHECK_OK(kiln_nn_sequential_set_checkpoint(m, 3));
    kiln_tensor *x, *y;
    batch(&x, &y, 6, 12);
    step_result a = train_step(m, x, y);
    kiln_module_free(m);
    m = make_model();
    CHECK_OK(kiln_nn_sequential_set_checkpoint(m, 3));
    kiln_manual_seed(8);
    kiln_tensor *logits = kiln_module_forward(m, x);
    kiln_tensor *loss = kiln_cross_entropy(logits, y, NULL);
    double v = NAN;
    CHECK_OK(kiln_item(loss, &v));
    CHECK_MSG(v != a.loss, "seed 8 and seed 7 give the same loss %g: dropout is not drawing", v);
    kiln_module_free(m);
    kiln_scope_end();
}

/* ---- The functional form ------------------------------------------------------------------ */

typedef struct fn_ctx {
    kiln_tensor *w; /* a parameter the function uses */
    int calls, recomputing_calls;
    bool inner_checkpoint;
} fn_ctx;

/* out0 = tanh(a * w) + b, out1 = dropout(a * b, 0.5) (b may not require grad). */
static kiln_status body(fn_ctx *c, kiln_tensor *a, kiln_tensor *b, kiln_tensor **out) {
    kiln_tensor *aw = kiln_mul(a, c->w);
    kiln_tensor *t = aw ? kiln_tanh(aw) : NULL;
    out[0] = t ? kiln_add(t, b) : NULL;
    kiln_tensor *ab = kiln_mul(a, b);
    out[1] = ab ? kiln_dropout(ab, 0.5, true) : NULL;
    kiln_release(aw);
    kiln_release(t);
    kiln_release(ab);
    return out[0] && out[1] ? KILN_OK : kiln_error_last()->status;
}

static kiln_status two_outputs(void *ctx, int n_in, kiln_tensor *const *in, int n_out, kiln_tensor **out) {
    fn_ctx *c = ctx;
    c->calls++;
    c->recomputing_calls += kiln_checkpoint_recomputing();
    if (n_in != 2 || n_out != 2) return KILN_ERR_INVALID_ARGUMENT;
    return body(c, in[0], in[1], out);
}

static kiln_status inner_half(void *ctx, int n_in, kiln_tensor *const *in, int n_out, kiln_tensor **out) {
    (void)n_in, (void)n_out;
    fn_ctx *c = ctx;
    kiln_tensor *aw = kiln_mul(in[0], c->w);
    out[0] = aw ? kiln_tanh(aw) : NULL;
    kiln_release(aw);
    return out[0] ? KILN_OK : kiln_error_last()->status;
}

/* The same function with its first half in a nested checkpoint. */
static kiln_status nested(void *ctx, int n_in, kiln_tensor *const *in, int n_out, kiln_tensor **out) {
    (void)n_in, (void)n_out;
    fn_ctx *c = ctx;
    c->calls++;
    kiln_tensor *t = NULL;
    kiln_status st = kiln_checkpoint(inner_half, c, 1, in, 1, &t);
    if (st) return st;
    out[0] = kiln_add(t, in[1]);
    kiln_tensor *ab = kiln_mul(in[0], in[1]);
    out[1] = ab ? kiln_dropout(ab, 0.5, true) : NULL;
    kiln_release(t);
    kiln_release(ab);
    return out[0] && out[1] ? KILN_OK : kiln_error_last()->status;
}

/* loss = sum(out0 * out0) + sum(out1 * 3) */
static kiln_tensor *loss_of(kiln_tensor **out) {
    kiln_tensor *sq = kiln_mul(out[0], out[0]);
    kiln_tensor *s0 = kiln_sum(sq, 0, NULL, false);
    kiln_tensor *s1 = kiln_sum(kiln_mul_scalar(out[1], 3.0), 0, NULL, false);
    return kiln_add(s0, s1);
}

static void run_functional(kiln_checkpoint_fn fn, bool b_requires_grad, const char *what) {
    kiln_scope_begin();
    kiln_manual_seed(11);
    kiln_tensor *a = kiln_randn(KILN_SHAPE(4, 5), KILN_F32, KILN_CPU);
    kiln_tensor *b = kiln_randn(KILN_SHAPE(4, 5), KILN_F32, KILN_CPU);
    kiln_tensor *w = kiln_randn(KILN_SHAPE(5), KILN_F32, KILN_CPU);
    CHECK_OK(kiln_set_requires_grad(a, true));
    CHECK_OK(kiln_set_requires_grad(b, b_requires_grad));
    CHECK_OK(kiln_set_requires_grad(w, true));
    fn_ctx c = {.w = w};
    /* Reference: the plain function. */
    kiln_tensor *ref[2] = {NULL, NULL};
    kiln_manual_seed(5);
    CHECK_OK(body(&c, a, b, ref));
    kiln_tensor *l0 = loss_of(ref);
    CHECK_OK(kiln_backward(l0, NULL, false));
    kiln_tensor *ga0 = kiln_grad(a), *gb0 = kiln_grad(b), *gw0 = kiln_grad(w);
    CHECK_OK(kiln_zero_grad(a, true));
    CHECK_OK(kiln_zero_grad(b, true));
    CHECK_OK(kiln_zero_grad(w, true));
    /* Checkpointed. */
    kiln_tensor *in[2] = {a, b}, *out[2] = {NULL, NULL};
    kiln_manual_seed(5);
    c.calls = 0;
    CHECK_OK(kiln_checkpoint(fn, &c, 2, in, 2, out));
    CHECK_MSG(c.calls == 1 && c.recomputing_calls == 0, "%s: forward ran fn %d times", what, c.calls);
    CHECK(out[0] && kiln_grad_fn_name(out[0]) && !strcmp(kiln_grad_fn_name(out[0]), "checkpoint"));
    CHECK_MSG(max_diff(out[0], ref[0]) == 0 && max_diff(out[1], ref[1]) == 0, "%s: forward values differ", what);
    kiln_tensor *l1 = loss_of(out);
    CHECK_OK(kiln_backward(l1, NULL, false));
    CHECK_MSG(c.calls == 2, "%s: backward did not recompute once (%d calls)", what, c.calls);
    if (fn == two_outputs) CHECK_MSG(c.recomputing_calls == 1, "%s: the recompute flag was not set", what);
    CHECK(!kiln_checkpoint_recomputing());
    kiln_tensor *ga1 = kiln_grad(a), *gb1 = kiln_grad(b), *gw1 = kiln_grad(w);
    CHECK_MSG(max_diff(ga0, ga1) == 0, "%s: grad a differs by %g", what, max_diff(ga0, ga1));
    CHECK_MSG(max_diff(gw0, gw1) == 0, "%s: grad w (a parameter inside fn) differs by %g", what, max_diff(gw0, gw1));
    if (b_requires_grad) CHECK_MSG(max_diff(gb0, gb1) == 0, "%s: grad b differs by %g", what, max_diff(gb0, gb1));
    else CHECK_MSG(!gb0 && !gb1, "%s: b does not require grad but got one", what);
    /* Backward twice through a freed checkpoint: the engine's clear error. */
    CHECK_FAILS(kiln_backward(l1, NULL, false), KILN_ERR_STATE, "checkpoint");
    kiln_scope_end();
}

/* Only a parameter inside fn requires grad (the first segment of a model):
 * the output still carries the graph. */
static void test_param_only(void) {
    kiln_scope_begin();
    kiln_manual_seed(1);
    kiln_tensor *a = kiln_randn(KILN_SHAPE(3, 5), KILN_F32, KILN_CPU);
    kiln_tensor *w = kiln_randn(KILN_SHAPE(5), KILN_F32, KILN_CPU);
    CHECK_OK(kiln_set_requires_grad(w, true));
    fn_ctx c = {.w = w};
    kiln_tensor *out = NULL;
    CHECK_OK(kiln_checkpoint(inner_half, &c, 1, &a, 1, &out));
    CHECK(out && kiln_requires_grad(out));
    CHECK_OK(kiln_backward(kiln_sum(out, 0, NULL, false), NULL, false));
    kiln_tensor *gw = kiln_grad(w);
    CHECK_MSG(gw != NULL, "the parameter used inside fn got no gradient");
    CHECK(kiln_grad(a) == NULL);
    /* Nothing requires grad: a plain call, no node. */
    CHECK_OK(kiln_set_requires_grad(w, false));
    kiln_tensor *plain = NULL;
    CHECK_OK(kiln_checkpoint(inner_half, &c, 1, &a, 1, &plain));
    CHECK(plain && !kiln_requires_grad(plain));
    /* Grad mode off: a plain call too. */
    CHECK_OK(kiln_set_requires_grad(w, true));
    kiln_no_grad_begin();
    CHECK_OK(kiln_checkpoint(inner_half, &c, 1, &a, 1, &plain));
    CHECK(plain && !kiln_requires_grad(plain));
    CHECK_OK(kiln_grad_mode_end());
    kiln_scope_end();
}

/* ---- Errors --------------------------------------------------------------------------------- */

static kiln_status returns_null(void *ctx, int n_in, kiln_tensor *const *in, int n_out, kiln_tensor **out) {
    (void)ctx, (void)n_in, (void)in, (void)n_out, (void)out;
    return KILN_OK;
}

static kiln_status writes_input(void *ctx, int n_in, kiln_tensor *const *in, int n_out, kiln_tensor **out) {
    (void)ctx, (void)n_in, (void)n_out;
    kiln_tensor *r = kiln_relu_(in[0]);
    kiln_release(r);
    out[0] = kiln_mul_scalar(in[0], 1.0);
    return out[0] ? KILN_OK : kiln_error_last()->status;
}

static kiln_status fails(void *ctx, int n_in, kiln_tensor *const *in, int n_out, kiln_tensor **out) {
    (void)ctx, (void)n_in, (void)n_out;
    out[0] = kiln_reshape(in[0], KILN_SHAPE(7)); /* 3 elements: fails */
    return out[0] ? KILN_OK : kiln_error_last()->status;
}

static void test_errors(void) {
    kiln_scope_begin();
    kiln_tensor *a = kiln_ones(KILN_SHAPE(3), KILN_F32, KILN_CPU);
    CHECK_OK(kiln_set_requires_grad(a, true));
    kiln_tensor *out[5] = {NULL};
    kiln_tensor *many[17];
    for (int i = 0; i < 17; i++) many[i] = a;
    CHECK_FAILS(kiln_checkpoint(NULL, NULL, 1, &a, 1, out), KILN_ERR_INVALID_ARGUMENT, "fn is NULL");
    CHECK_FAILS(kiln_checkpoint(returns_null, NULL, 1, &a, 0, out), KILN_ERR_INVALID_ARGUMENT, "0 outputs");
    CHECK_FAILS(kiln_checkpoint(returns_null, NULL, 1, &a, 5, out), KILN_ERR_INVALID_ARGUMENT, "5 outputs");
    CHECK_FAILS(kiln_checkpoint(returns_null, NULL, 17, many, 1, out), KILN_ERR_INVALID_ARGUMENT, "17 inputs");
    CHECK_FAILS(kiln_checkpoint(returns_null, NULL, 1, &a, 1, out), KILN_ERR_INVALID_ARGUMENT, "output 0 is NULL");
    CHECK(out[0] == NULL);
    CHECK_FAILS(kiln_checkpoint(fails, NULL, 1, &a, 1, out), KILN_ERR_INVALID_ARGUMENT, "reshape");
    kiln_tensor *b = kiln_ones(KILN_SHAPE(3), KILN_F32, KILN_CPU); /* no grad: in-place is allowed by autograd */
    CHECK_FAILS(kiln_checkpoint(writes_input, NULL, 1, &b, 1, out), KILN_ERR_INVALID_ARGUMENT, "in place");
    /* An input written in place after the forward: the recompute would see
     * other values, so the backward refuses. */
    kiln_tensor *c = kiln_ones(KILN_SHAPE(3), KILN_F32, KILN_CPU);
    kiln_tensor *w = kiln_ones(KILN_SHAPE(3), KILN_F32, KILN_CPU);
    kiln_tensor *w2 = kiln_ones(KILN_SHAPE(3), KILN_F32, KILN_CPU);
    CHECK_OK(kiln_set_requires_grad(w, true));
    fn_ctx fc = {.w = w};
    CHECK_OK(kiln_checkpoint(inner_half, &fc, 1, &c, 1, out));
    kiln_tensor *loss = kiln_sum(out[0], 0, NULL, false);
    kiln_release(kiln_add_(c, w2));
    CHECK_FAILS(kiln_backward(loss, NULL, false), KILN_ERR_STATE, "modified in place");
    /* Sequential segments. */
    kiln_module *lin = kiln_nn_linear(3, 3, true);
    CHECK_FAILS(kiln_nn_sequential_set_checkpoint(lin, 2), KILN_ERR_INVALID_ARGUMENT, "not a Sequential");
    kiln_module_free(lin);
    kiln_module *m = make_model();
    CHECK_FAILS(kiln_nn_sequential_set_checkpoint(m, 40), KILN_ERR_INVALID_ARGUMENT, "40 segments");
    CHECK_FAILS(kiln_nn_sequential_set_checkpoint(m, -1), KILN_ERR_INVALID_ARGUMENT, "-1 segments");
    CHECK_OK(kiln_nn_sequential_set_checkpoint(m, 1)); /* 1: off */
    CHECK_EQ_I(kiln_nn_sequential_checkpoint_segments(m), 0);
    kiln_module_free(m);
    kiln_scope_end();
}

/* ---- Segments placed by memory ------------------------------------------------------------ */

/* Planned on a 2-sample batch: gradients, losses, running statistics and
 * the generator's position are those of the plain step (the measuring
 * forward updates no statistics and draws nothing for good); a segment
 * that is one residual block may have its body split in 2, no other body. */
static void test_by_memory_identical(int segments) {
    kiln_scope_begin();
    kiln_module *plain = make_model(), *ckpt = make_model();
    kiln_manual_seed(11);
    kiln_tensor *sample = kiln_randn(KILN_SHAPE(2, 3, 12, 12), KILN_F32, KILN_CPU);
    int64_t bytes[32] = {0};
    int n = kiln_module_num_children(ckpt);
    CHECK_OK(kiln_nn_sequential_checkpoint_by_memory(ckpt, sample, segments, bytes));
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += bytes[i];
    CHECK_MSG(bytes[0] > 0 && total > 0, "segments %d: no memory measured (first layer %lld, total %lld)", segments,
              (long long)bytes[0], (long long)total);
    int start[64];
    int count = kiln_nn_sequential_checkpoint_starts(ckpt, start, 64);
    CHECK_MSG(count >= 2 && count <= segments && start[0] == 0, "segments %d: %d placed", segments, count);
    for (int k = 0; k < count; k++) {
        int end = k + 1 < count ? start[k + 1] : n;
        if (k > 0) CHECK_MSG(start[k] > start[k - 1], "segment starts not increasing");
        for (int i = start[k]; i < end; i++) {
            kiln_module *body = kiln_module_child(kiln_module_child_at(ckpt, i, NULL), "body");
            if (!body) continue;
            /* split only as a checkpointed segment of its own (when that keeps less) */
            bool may = end - start[k] == 1 && k + 1 < count;
            int got = kiln_nn_sequential_checkpoint_segments(body);
            CHECK_MSG(got == 0 || (may && got == 2), "segments %d: layer %d's body in %d segments", segments, i,
                      got);
        }
    }
    kiln_tensor *x, *y;
    batch(&x, &y, 6, 12);
    step_result r0 = train_step(plain, x, y);
    step_result r1 = train_step(ckpt, x, y);
    CHECK_MSG(r0.loss == r1.loss, "by memory, %d segments: loss %.9g vs %.9g", segments, r0.loss, r1.loss);
    CHECK_MSG(r0.after_rand == r1.after_rand, "by memory, %d segments: generator at a different place", segments);
    compare_models(plain, ckpt); /* num_batches_tracked 1: the probe did not count */
    /* off again: no body stays checkpointed */
    CHECK_OK(kiln_nn_sequential_checkpoint_by_memory(ckpt, sample, 0, NULL));
    CHECK_EQ_I(kiln_nn_sequential_checkpoint_segments(ckpt), 0);
    for (int i = 0; i < n; i++) {
        kiln_module *body = kiln_module_child(kiln_module_child_at(ckpt, i, NULL), "body");
        if (body) CHECK_EQ_I(kiln_nn_sequential_checkpoint_segments(body), 0);
    }
    kiln_module_free(plain);
    kiln_module_free(ckpt);
    kiln_scope_end();
}

/* The bytes each layer keeps, as the placement measures them, are the
 * same for a fresh model and for one that has run: a kernel's prepared
 * weight copy (made on the first call, or on the second for a lazy one:
 * linear_act's W^T on AVX2 CPUs, kernels/op_args.h) is no layer's. */
static void test_by_memory_measures_no_copy(void) {
    static const char *spec = "conv 8 k3 p1\nrelu\nmaxpool 2\nflatten\nlinear 32\nrelu\nlinear 10\n";
    kiln_scope_begin();
    kiln_manual_seed(3);
    kiln_module *fresh = NULL, *ran = NULL;
    CHECK_OK(kiln_model_spec_parse(spec, "test", 1, 12, 12, &fresh));
    CHECK_OK(kiln_model_spec_parse(spec, "test", 1, 12, 12, &ran));
    kiln_tensor *sample = kiln_randn(KILN_SHAPE(2, 1, 12, 12), KILN_F32, KILN_CPU);
    if (fresh && ran && sample) {
        kiln_no_grad_begin();
        for (int i = 0; i < 2; i++) kiln_release(kiln_module_forward(ran, sample));
        kiln_grad_mode_end();
        int n = kiln_module_num_children(fresh);
        int64_t a[16] = {0}, b[16] = {0}, c[16] = {0};
        CHECK_OK(kiln_nn_sequential_checkpoint_by_memory(fresh, sample, 2, a));
        CHECK_OK(kiln_nn_sequential_checkpoint_by_memory(fresh, sample, 2, b)); /* now it has run */
        CHECK_OK(kiln_nn_sequential_checkpoint_by_memory(ran, sample, 2, c));
        for (int i = 0; i < n && i < 16; i++) {
            CHECK_MSG(a[i] == b[i], "layer %d: %lld bytes measured on a fresh model, %lld once it has run", i,
                      (long long)a[i], (long long)b[i]);
            CHECK_MSG(a[i] == c[i], "layer %d: %lld bytes measured on a fresh model, %lld after two forwards", i,
                      (long long)a[i], (long long)c[i]);
        }
    }
    kiln_module_free(fresh);
    kiln_module_free(ran);
    kiln_scope_end();
}

/* Explicit segment starts, and what they refuse. */
static void test_starts(void) {
    kiln_scope_begin();
    kiln_module *plain = make_model(), *ckpt = make_model();
    const int good[] = {0, 4, 5};
    CHECK_OK(kiln_nn_sequential_set_checkpoint_starts(ckpt, 3, good));
    int got[8];
    CHECK_EQ_I(kiln_nn_sequential_checkpoint_starts(ckpt, got, 8), 3);
    CHECK(got[0] == 0 && got[1] == 4 && got[2] == 5);
    kiln_tensor *x, *y;
    batch(&x, &y, 6, 12);
    step_result r0 = train_step(plain, x, y);
    step_result r1 = train_step(ckpt, x, y);
    CHECK_MSG(r0.loss == r1.loss, "starts 0,4,5: loss %.9g vs %.9g", r0.loss, r1.loss);
    compare_models(plain, ckpt);
    static const struct {
        int count, starts[3];
        const char *says;
    } bad[] = {{2, {1, 4}, "must start at 0"}, {3, {0, 5, 4}, "starts at child 4"}, {2, {0, 99}, "starts at child 99"}};
    for (size_t i = 0; i < 3; i++) {
        CHECK_MSG(kiln_nn_sequential_set_checkpoint_starts(ckpt, bad[i].count, bad[i].starts) ==
                      KILN_ERR_INVALID_ARGUMENT,
                  "bad starts %zu accepted", i);
        CHECK_MSG(strstr(kiln_error_message(), bad[i].says), "error for bad starts %zu: %s", i, kiln_error_message());
    }
    /* the first layers of a fused run: a Sequential of conv, relu */
    kiln_module *cr = NULL;
    CHECK_OK(kiln_model_spec_parse("conv 4 k3 p1\nrelu\nflatten\nlinear 2\n", "cr", 3, 4, 4, &cr));
    const int split[] = {0, 1};
    CHECK_MSG(kiln_nn_sequential_set_checkpoint_starts(cr, 2, split) == KILN_ERR_INVALID_ARGUMENT,
              "a start inside conv+relu accepted");
    CHECK_MSG(strstr(kiln_error_message(), "fused op"), "error: %s", kiln_error_message());
    CHECK_OK(kiln_nn_sequential_set_checkpoint_starts(cr, 0, NULL));
    CHECK_EQ_I(kiln_nn_sequential_checkpoint_segments(cr), 0);
    CHECK_MSG(kiln_nn_sequential_checkpoint_by_memory(kiln_module_child_at(cr, 0, NULL), x, 2, NULL) ==
                  KILN_ERR_INVALID_ARGUMENT,
              "by_memory on a Conv2d accepted");
    kiln_module_free(cr);
    kiln_module_free(plain);
    kiln_module_free(ckpt);
    kiln_scope_end();
}

/* ---- Memory: the allocator's peak shows the saving --------------------------------------- */

static int64_t step_peak(kiln_module *m, kiln_tensor *x, kiln_tensor *y) {
    CHECK_OK(kiln_module_zero_grad(m, true));
    CHECK_OK(kiln_memory_reset_peak(KILN_CPU));
    kiln_memory_stats s0, s1;
    CHECK_OK(kiln_memory_stats_get(KILN_CPU, &s0));
    train_step(m, x, y);
    CHECK_OK(kiln_memory_stats_get(KILN_CPU, &s1));
    return s1.allocated_bytes[KILN_POOL_ALL].peak - s0.allocated_bytes[KILN_POOL_ALL].current;
}

static void test_peak_memory(void) {
    kiln_scope_begin();
    /* Ten conv-bn-relu blocks: activations dominate the step. */
    char deep[512] = "";
    for (int i = 0; i < 10; i++) strcat(deep, "conv 16 k3 p1\nbatchnorm\nrelu\n");
    strcat(deep, "adaptiveavgpool 1\nflatten\nlinear 10\n");
    kiln_module *m = NULL;
    kiln_manual_seed(1);
    CHECK_OK(kiln_model_spec_parse(deep, "deep", 3, 32, 32, &m));
    kiln_tensor *x, *y;
    batch(&x, &y, 16, 32);
    step_peak(m, x, y); /* warm-up */
    int64_t plain = step_peak(m, x, y);
    CHECK_OK(kiln_nn_sequential_set_checkpoint(m, 5));
    int64_t ckpt = step_peak(m, x, y);
    printf("peak above the step's start: plain %.2f MiB, 5 segments %.2f MiB (%.0f%%)\n", plain / 1048576.0,
           ckpt / 1048576.0, 100.0 * (double)ckpt / (double)plain);
    CHECK_MSG(plain > 0 && ckpt > 0 && ckpt < plain * 6 / 10, "checkpointed peak %lld is not below 60%% of %lld",
              (long long)ckpt, (long long)plain);
    kiln_module_free(m);
    kiln_scope_end();
}

/* A small ResNet (a stem and three stages of one block, as
 * models/resnet_small_cifar10.txt but narrower): 4 segments placed by
 * memory, with the lone blocks' bodies split, cut the step's peak above
 * its start (activations and gradients) below 70% of the plain one. */
static void test_resnet_peak(void) {
    kiln_scope_begin();
    const char *spec = "conv 16 k3 p1 nobias\nbatchnorm\nrelu\n"
                       "residual {\n conv 16 k3 p1 nobias\n batchnorm\n relu\n conv 16 k3 p1 nobias\n batchnorm\n}\n"
                       "residual {\n conv 32 k3 p1 s2 nobias\n batchnorm\n relu\n conv 32 k3 p1 nobias\n batchnorm\n}\n"
                       "residual {\n conv 64 k3 p1 s2 nobias\n batchnorm\n relu\n conv 64 k3 p1 nobias\n batchnorm\n}\n"
                       "adaptiveavgpool 1\nflatten\nlinear 10\n";
    kiln_module *m = NULL;
    kiln_manual_seed(2);
    CHECK_OK(kiln_model_spec_parse(spec, "resnet", 3, 32, 32, &m));
    kiln_tensor *x, *y;
    batch(&x, &y, 32, 32);
    kiln_tensor *sample = kiln_randn(KILN_SHAPE(2, 3, 32, 32), KILN_F32, KILN_CPU);
    step_peak(m, x, y); /* warm-up */
    int64_t plain = step_peak(m, x, y);
    CHECK_OK(kiln_nn_sequential_checkpoint_by_memory(m, sample, 4, NULL));
    int start[8];
    int count = kiln_nn_sequential_checkpoint_starts(m, start, 8);
    step_peak(m, x, y);
    int64_t ckpt = step_peak(m, x, y);
    printf("small ResNet: %d segments placed by memory (starts %d %d %d %d): peak %.2f MiB vs plain %.2f MiB (%.0f%%)\n",
           count, start[0], count > 1 ? start[1] : -1, count > 2 ? start[2] : -1, count > 3 ? start[3] : -1,
           ckpt / 1048576.0, plain / 1048576.0, 100.0 * (double)ckpt / (double)plain);
    CHECK_MSG(plain > 0 && ckpt > 0 && ckpt < plain * 7 / 10, "checkpointed ResNet peak %lld is not below 70%% of %lld",
              (long long)ckpt, (long long)plain);
    kiln_module_free(m);
    kiln_scope_end();
}

/* One training step's allocated peak above its start on `dev`. */
static int64_t device_step_peak(kiln_module *m, kiln_tensor *x, kiln_tensor *y, kiln_device dev) {
    CHECK_OK(kiln_module_zero_grad(m, true));
    CHECK_OK(kiln_memory_reset_peak(dev));
    kiln_memory_stats s0, s1;
    CHECK_OK(kiln_memory_stats_get(dev, &s0));
    kiln_scope_begin();
    kiln_tensor *loss = kiln_cross_entropy(kiln_module_forward(m, x), y, NULL);
    CHECK_MSG(loss != NULL, "forward: %s", kiln_error_message());
    if (loss) CHECK_OK(kiln_backward(loss, NULL, false));
    kiln_scope_end();
    CHECK_OK(kiln_memory_stats_get(dev, &s1));
    return s1.allocated_bytes[KILN_POOL_ALL].peak - s0.allocated_bytes[KILN_POOL_ALL].current;
}

/* models/resnet_small_cifar10.txt on dev, 4 segments placed by memory:
 * the stem, block 1, block 2, and block 3 with the head; the bodies of
 * blocks 1 and 2 split (a lone checkpointed residual block whose recompute
 * keeps less so), block 3's not (the last segment is not recomputed).
 * Returns the model, its bodies in body[]. */
static kiln_module *resnet_placed(kiln_device dev, kiln_module **body) {
    char path[4096];
    snprintf(path, sizeof path, "%s/models/resnet_small_cifar10.txt", KILN_SOURCE_DIR);
    kiln_device before = kiln_current_device();
    CHECK_OK(kiln_set_device(dev));
    kiln_module *m = NULL;
    kiln_manual_seed(5);
    CHECK_OK(kiln_model_spec_load(path, 3, 32, 32, &m));
    kiln_tensor *sample = kiln_zeros(KILN_SHAPE(2, 3, 32, 32), KILN_F32, dev);
    if (m) CHECK_OK(kiln_nn_sequential_checkpoint_by_memory(m, sample, 4, NULL));
    kiln_release(sample);
    CHECK_OK(kiln_set_device(before));
    if (!m) return NULL;
    int start[8], segs[9] = {0};
    int count = kiln_nn_sequential_checkpoint_starts(m, start, 8);
    for (int i = 0; i < 9; i++) {
        body[i] = kiln_module_child(kiln_module_child_at(m, i, NULL), "body");
        segs[i] = body[i] ? kiln_nn_sequential_checkpoint_segments(body[i]) : 0;
    }
    CHECK_MSG(count == 4 && start[0] == 0 && start[1] == 3 && start[2] == 4 && start[3] == 5,
              "ResNet, 4 segments by memory: %d starting at %d %d %d %d", count, start[0], start[1], start[2],
              start[3]);
    CHECK_MSG(segs[3] == 2 && segs[4] == 2 && segs[5] == 0,
              "ResNet, 4 segments: the blocks' bodies in %d, %d and %d segments (want 2, 2, 0)", segs[3], segs[4],
              segs[5]);
    return m;
}

/* That placement's gradients and loss are the plain step's bit for bit,
 * with block 2's body split and whole (CPU, batch 8); and on meta (the
 * plan's allocator, exact against the CPU's: tests/plan) at batch 512,
 * splitting block 2's body lowers the step's peak by at least a quarter
 * of a block-1 activation (the plan: 720.8 -> 658.6 MiB, docs/memory.md). */
static void test_resnet_split_bodies(void) {
    kiln_scope_begin();
    char path[4096];
    snprintf(path, sizeof path, "%s/models/resnet_small_cifar10.txt", KILN_SOURCE_DIR);
    kiln_module *plain = NULL, *body[9] = {NULL};
    kiln_manual_seed(5);
    CHECK_OK(kiln_model_spec_load(path, 3, 32, 32, &plain));
    kiln_module *ckpt = resnet_placed(KILN_CPU, body);
    if (!plain || !ckpt) return;
    kiln_tensor *x, *y;
    batch(&x, &y, 8, 32);
    for (int round = 0; round < 2; round++) {
        if (round == 1 && body[4]) CHECK_OK(kiln_nn_sequential_set_checkpoint(body[4], 0));
        CHECK_OK(kiln_module_zero_grad(plain, true));
        CHECK_OK(kiln_module_zero_grad(ckpt, true));
        step_result r0 = train_step(plain, x, y), r1 = train_step(ckpt, x, y);
        const char *what = round ? "whole" : "split";
        CHECK_MSG(r0.loss == r1.loss, "ResNet, block 2's body %s: loss %.9g vs %.9g", what, r0.loss, r1.loss);
        kiln_named_tensor *pa = NULL, *pb = NULL;
        int na = 0, nb = 0;
        CHECK_OK(kiln_module_named_parameters(plain, &pa, &na));
        CHECK_OK(kiln_module_named_parameters(ckpt, &pb, &nb));
        CHECK_MSG(na == nb && na >= 20, "ResNet: %d and %d parameters", na, nb);
        for (int i = 0; i < na && i < nb; i++) {
            kiln_tensor *ga = kiln_grad(pa[i].tensor), *gb = kiln_grad(pb[i].tensor);
            double d = max_diff(ga, gb);
            CHECK_MSG(d == 0, "ResNet, block 2's body %s: %s's gradient differs by %g", what, pa[i].name, d);
            kiln_release(ga);
            kiln_release(gb);
        }
        free(pa);
        free(pb);
    }
    kiln_module_free(plain);
    kiln_module_free(ckpt);

    /* The peak at batch 512, on meta */
    kiln_module *m = resnet_placed(KILN_META, body);
    kiln_tensor *mx = kiln_empty(KILN_SHAPE(512, 3, 32, 32), KILN_F32, KILN_META);
    kiln_tensor *my = kiln_empty(KILN_SHAPE(512), KILN_I64, KILN_META);
    int64_t peak[2] = {0, 0};
    for (int round = 0; m && round < 2; round++) {
        if (round == 1 && body[4]) CHECK_OK(kiln_nn_sequential_set_checkpoint(body[4], 0));
        device_step_peak(m, mx, my, KILN_META); /* the first makes the kernels' weight copies */
        peak[round] = device_step_peak(m, mx, my, KILN_META);
    }
    const int64_t block1 = 512 * 64 * 32 * 32 * (int64_t)sizeof(float);
    printf("ResNet at batch 512 (meta), 4 segments: peak %.1f MiB with block 2's body split, %.1f MiB whole\n",
           peak[0] / 1048576.0, peak[1] / 1048576.0);
    CHECK_MSG(peak[0] > 0 && peak[0] <= peak[1] - block1 / 4,
              "ResNet: splitting block 2's body lowered the planned peak by %lld bytes, want at least %lld",
              (long long)(peak[1] - peak[0]), (long long)(block1 / 4));
    kiln_module_free(m);
    kiln_scope_end();
}

int main(void) {
    if (kiln_init()) return 1;
    test_sequential_identical(2);
    test_sequential_identical(3);
    test_sequential_identical(7);
    use_autocast = true; /* the autocast state of the forward is replayed */
    test_sequential_identical(3);
    use_autocast = false;
    test_dropout_draws();
    run_functional(two_outputs, true, "two outputs");
    run_functional(two_outputs, false, "b without grad");
    run_functional(nested, true, "nested");
    test_param_only();
    test_errors();
    test_peak_memory();
    test_by_memory_identical(2);
    test_by_memory_identical(3);
    test_by_memory_identical(4);
    test_by_memory_measures_no_copy();
    test_starts();
    test_resnet_peak();
    test_resnet_split_bodies();
    kiln_shutdown();
    return kt_finish();
}

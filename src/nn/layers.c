/* The built-in layers: constructors with PyTorch's default initialisation
 * and forwards written with public ops.
 *
 * Forwards run inside kiln_module_forward's entered API region, so the
 * results of the public calls they make are never scope-registered; they
 * drop their intermediates with kiln_tensor_drop as soon as the next op
 * has taken what it needs (autograd nodes hold their own references). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "nn/module_internal.h"
#include "tensor/scope.h"
#include "tensor/tensor_internal.h"

/* ---- Initialisation ------------------------------------------------------------------------ */

/* U(-bound, bound) in f32 on the current device: kiln_rand scaled and
 * shifted, so kiln_manual_seed reproduces it on every backend. */
static kiln_tensor *uniform(kiln_shape shape, double bound) {
    kiln_tensor *u = kiln_rand(shape, KILN_F32, kiln_current_device());
    if (!u) return NULL;
    kiln_tensor *s = kiln_mul_scalar(u, 2.0 * bound);
    kiln_tensor_drop(u);
    if (!s) return NULL;
    kiln_tensor *w = kiln_add_scalar(s, -bound);
    kiln_tensor_drop(s);
    return w;
}

/* Register a fresh tensor (the module takes the reference) as a parameter
 * or buffer; on failure the tensor is dropped and the module freed. */
static kiln_status adopt(kiln_module *m, const char *name, kiln_tensor *t, bool param) {
    kiln_status st = t ? (param ? kiln_module_add_parameter(m, name, t) : kiln_module_add_buffer(m, name, t))
                       : kiln_error_last()->status;
    kiln_tensor_drop(t);
    return st;
}

/* kaiming_uniform_(w, a=sqrt(5)) and the bias rule of nn.Conv2d / nn.Linear. */
static kiln_status init_weight_bias(kiln_module *m, kiln_shape wshape, int64_t fan_in, int64_t out, bool bias) {
    double a = sqrt(5.0);
    double gain = sqrt(2.0 / (1.0 + a * a));
    double wbound = fan_in > 0 ? gain * sqrt(3.0 / (double)fan_in) : 0.0;
    KILN_TRY(adopt(m, "weight", uniform(wshape, wbound), true));
    if (bias) {
        double bbound = fan_in > 0 ? 1.0 / sqrt((double)fan_in) : 0.0;
        KILN_TRY(adopt(m, "bias", uniform(KILN_SHAPE(out), bbound), true));
    }
    return KILN_OK;
}

/* Constructors run their tensor calls in an entered region and hand back
 * the module, or NULL (module freed) when `st` failed. */
static kiln_module *finish(kiln_module *m, kiln_status st) {
    kiln_api_leave();
    if (st) {
        kiln_module_free(m);
        return NULL;
    }
    return m;
}

static bool check_positive(const char *fn, const char *what, int64_t v) {
    if (v > 0) return true;
    KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "%s: %s must be positive, got %lld", fn, what, (long long)v);
    return false;
}

/* ---- Forwards -------------------------------------------------------------------------------- */

static kiln_tensor *conv2d_forward(kiln_module *m, kiln_tensor *x) {
    return kiln_conv2d(x, kiln_module_own_tensor(m, "weight"), kiln_module_own_tensor(m, "bias"), &m->cfg.conv);
}

static kiln_tensor *linear_forward(kiln_module *m, kiln_tensor *x) {
    return kiln_linear(x, kiln_module_own_tensor(m, "weight"), kiln_module_own_tensor(m, "bias"));
}

static kiln_tensor *batch_norm_forward(kiln_module *m, kiln_tensor *x) {
    kiln_tensor *rm = kiln_module_own_tensor(m, "running_mean");
    kiln_tensor *rv = kiln_module_own_tensor(m, "running_var");
    /* PyTorch's bn_training: batch statistics in training, or always when
     * there are no running statistics. */
    bool use_batch = m->training || !rm;
    /* A checkpoint's recompute normalises with the batch statistics again
     * but must not update the running ones a second time. */
    bool update = m->training && rm && !kiln_checkpoint_recomputing();
    kiln_tensor *y = kiln_batch_norm(x, kiln_module_own_tensor(m, "weight"), kiln_module_own_tensor(m, "bias"),
                                     use_batch && !update ? NULL : rm, use_batch && !update ? NULL : rv, use_batch,
                                     m->cfg.momentum, m->cfg.eps);
    if (y && update) {
        kiln_tensor *nbt = kiln_module_own_tensor(m, "num_batches_tracked");
        kiln_no_grad_begin();
        kiln_tensor *inc = kiln_add_scalar(nbt, 1.0);
        kiln_status st = inc ? kiln_copy_(nbt, inc, 0) : kiln_error_last()->status;
        kiln_grad_mode_end();
        kiln_tensor_drop(inc);
        if (st) {
            kiln_tensor_drop(y);
            return NULL;
        }
    }
    return y;
}

static kiln_tensor *relu_forward(kiln_module *m, kiln_tensor *x) {
    (void)m;
    return kiln_relu(x);
}
static kiln_tensor *gelu_forward(kiln_module *m, kiln_tensor *x) { return kiln_gelu(x, m->cfg.approximate); }
static kiln_tensor *silu_forward(kiln_module *m, kiln_tensor *x) {
    (void)m;
    return kiln_silu(x);
}
static kiln_tensor *sigmoid_forward(kiln_module *m, kiln_tensor *x) {
    (void)m;
    return kiln_sigmoid(x);
}
static kiln_tensor *tanh_forward(kiln_module *m, kiln_tensor *x) {
    (void)m;
    return kiln_tanh(x);
}
static kiln_tensor *max_pool_forward(kiln_module *m, kiln_tensor *x) { return kiln_max_pool2d(x, &m->cfg.pool, NULL); }
static kiln_tensor *avg_pool_forward(kiln_module *m, kiln_tensor *x) { return kiln_avg_pool2d(x, &m->cfg.pool); }
static kiln_tensor *adaptive_avg_pool_forward(kiln_module *m, kiln_tensor *x) {
    return kiln_adaptive_avg_pool2d(x, m->cfg.out_hw[0], m->cfg.out_hw[1]);
}
static kiln_tensor *dropout_forward(kiln_module *m, kiln_tensor *x) { return kiln_dropout(x, m->cfg.p, m->training); }
static kiln_tensor *flatten_forward(kiln_module *m, kiln_tensor *x) {
    return kiln_flatten(x, m->cfg.start_dim, m->cfg.end_dim);
}

static kiln_tensor *sequential_forward(kiln_module *m, kiln_tensor *x) {
    if (m->cfg.place_stages > 0) return kiln_nn_placed_forward(m, x);
    if (m->cfg.checkpoint_segments > 1 && kiln_is_grad_enabled()) return kiln_sequential_checkpoint_forward(m, x);
    return kiln_nn_sequential_run(m, 0, m->children.n, x);
}

/* relu(a + b), dropping a and b. */
/* relu(a + b), taking both references. When this call holds the only
 * reference to a (the block's branch output, which no op saved for its
 * backward) and no broadcast is involved, the sum and the ReLU are written
 * into a in place (kiln_add_, kiln_relu_: autograd records them as such),
 * so a block needs no second buffer of its output's size. */
static kiln_tensor *add_relu(kiln_tensor *a, kiln_tensor *b) {
    if (!a || !b) {
        if (a) kiln_tensor_drop(a);
        if (b) kiln_tensor_drop(b);
        return NULL;
    }
    kiln_shape sa = kiln_shape_of(a), sb = kiln_shape_of(b);
    bool in_place = a != b && kiln_tensor_sole_owner(a) && !(kiln_is_leaf(a) && kiln_requires_grad(a)) && sa.ndim == sb.ndim &&
                    !memcmp(sa.d, sb.d, sizeof(int64_t) * (size_t)sa.ndim) && kiln_dtype_of(a) == kiln_dtype_of(b);
    kiln_tensor *s = in_place ? kiln_add_(a, b) : kiln_add(a, b);
    kiln_tensor_drop(a);
    kiln_tensor_drop(b);
    if (!s) return NULL;
    kiln_tensor *y = in_place ? kiln_relu_(s) : kiln_relu(s);
    kiln_tensor_drop(s);
    return y;
}

/* forward of the named child, dropping `in` when drop_in. */
static kiln_tensor *run_child(kiln_module *m, const char *name, kiln_tensor *in, bool drop_in) {
    kiln_tensor *y = in ? kiln_module_forward(kiln_module_child(m, name), in) : NULL;
    if (drop_in) kiln_tensor_drop(in);
    return y;
}

static kiln_tensor *basic_block_forward(kiln_module *m, kiln_tensor *x) {
    kiln_tensor *h = run_child(m, "conv1", x, false);
    h = run_child(m, "bn1", h, true);
    kiln_tensor *r = h ? kiln_relu(h) : NULL;
    kiln_tensor_drop(h);
    h = run_child(m, "conv2", r, true);
    h = run_child(m, "bn2", h, true);
    if (!h) return NULL;
    return add_relu(h, run_child(m, "shortcut", x, false));
}

static kiln_tensor *residual_forward(kiln_module *m, kiln_tensor *x) {
    kiln_tensor *h = run_child(m, "body", x, false);
    if (!h) return NULL;
    return add_relu(h, run_child(m, "shortcut", x, false));
}

/* ---- Constructors ------------------------------------------------------------------------------ */

kiln_module *kiln_nn_conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride,
                            int64_t padding, int64_t dilation, int64_t groups, bool bias) {
    const char *fn = "kiln_nn_conv2d";
    /* 0 is the default, as in kiln_conv2d_opts: PyTorch's 1 for each. */
    if (stride == 0) stride = 1;
    if (dilation == 0) dilation = 1;
    if (groups == 0) groups = 1;
    if (!check_positive(fn, "in_channels", in_channels) || !check_positive(fn, "out_channels", out_channels) ||
        !check_positive(fn, "kernel", kernel) || !check_positive(fn, "stride", stride) ||
        !check_positive(fn, "dilation", dilation) || !check_positive(fn, "groups", groups))
        return NULL;
    if (padding < 0 || in_channels % groups || out_channels % groups) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "groups must divide both channel counts; padding >= 0",
                   "%s: in_channels %lld, out_channels %lld, groups %lld, padding %lld", fn, (long long)in_channels,
                   (long long)out_channels, (long long)groups, (long long)padding);
        return NULL;
    }
    kiln_module *m = kiln_module_new("Conv2d", conv2d_forward);
    if (!m) return NULL;
    m->cfg.conv = (kiln_conv2d_opts){
        .stride = {stride, stride}, .padding = {padding, padding}, .dilation = {dilation, dilation}, .groups = groups};
    kiln_api_enter();
    int64_t cin = in_channels / groups;
    kiln_status st =
        init_weight_bias(m, KILN_SHAPE(out_channels, cin, kernel, kernel), cin * kernel * kernel, out_channels, bias);
    return finish(m, st);
}

kiln_module *kiln_nn_linear(int64_t in_features, int64_t out_features, bool bias) {
    if (!check_positive("kiln_nn_linear", "in_features", in_features) ||
        !check_positive("kiln_nn_linear", "out_features", out_features))
        return NULL;
    kiln_module *m = kiln_module_new("Linear", linear_forward);
    if (!m) return NULL;
    kiln_api_enter();
    return finish(m, init_weight_bias(m, KILN_SHAPE(out_features, in_features), in_features, out_features, bias));
}

kiln_module *kiln_nn_batch_norm2d(int64_t num_features, double eps, double momentum, bool affine,
                                  bool track_running_stats) {
    if (!check_positive("kiln_nn_batch_norm2d", "num_features", num_features)) return NULL;
    /* 0 is the default (PyTorch's); a negative momentum keeps the running
     * statistics as they are, as kiln_batch_norm's does. */
    if (eps == 0) eps = KILN_NN_BN_EPS_DEFAULT;
    if (momentum == 0) momentum = KILN_NN_BN_MOMENTUM_DEFAULT;
    if (!(eps > 0) || !(momentum <= 1)) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                   "pass 0 for PyTorch's defaults (eps 1e-5, momentum 0.1), a negative momentum to keep the running "
                   "statistics fixed",
                   "kiln_nn_batch_norm2d: eps %g must be >= 0 and momentum %g at most 1", eps, momentum);
        return NULL;
    }
    kiln_module *m = kiln_module_new("BatchNorm2d", batch_norm_forward);
    if (!m) return NULL;
    m->keep_f32 = true;
    m->cfg.eps = eps;
    m->cfg.momentum = momentum;
    kiln_api_enter();
    kiln_device dev = kiln_current_device();
    kiln_shape c = KILN_SHAPE(num_features);
    kiln_status st = KILN_OK;
    if (affine) {
        st = adopt(m, "weight", kiln_ones(c, KILN_F32, dev), true);
        if (!st) st = adopt(m, "bias", kiln_zeros(c, KILN_F32, dev), true);
    }
    if (!st && track_running_stats) {
        st = adopt(m, "running_mean", kiln_zeros(c, KILN_F32, dev), false);
        if (!st) st = adopt(m, "running_var", kiln_ones(c, KILN_F32, dev), false);
        if (!st) st = adopt(m, "num_batches_tracked", kiln_zeros(KILN_SHAPE(), KILN_I64, dev), false);
    }
    return finish(m, st);
}

kiln_module *kiln_nn_relu(void) { return kiln_module_new("ReLU", relu_forward); }
kiln_module *kiln_nn_silu(void) { return kiln_module_new("SiLU", silu_forward); }
kiln_module *kiln_nn_sigmoid(void) { return kiln_module_new("Sigmoid", sigmoid_forward); }
kiln_module *kiln_nn_tanh(void) { return kiln_module_new("Tanh", tanh_forward); }

kiln_module *kiln_nn_gelu(bool approximate_tanh) {
    kiln_module *m = kiln_module_new("GELU", gelu_forward);
    if (m) m->cfg.approximate = approximate_tanh;
    return m;
}

static kiln_module *pool(const char *kind, kiln_layer_forward fwd, int64_t kernel, int64_t stride, int64_t padding) {
    if (!check_positive(kind, "kernel", kernel)) return NULL;
    if (stride < 0 || padding < 0 || 2 * padding > kernel) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "padding must be at most half the kernel; stride 0 means kernel",
                   "%s: kernel %lld, stride %lld, padding %lld", kind, (long long)kernel, (long long)stride,
                   (long long)padding);
        return NULL;
    }
    kiln_module *m = kiln_module_new(kind, fwd);
    if (!m) return NULL;
    m->cfg.pool = kiln_pool2d_defaults(kernel);
    m->cfg.pool.stride[0] = m->cfg.pool.stride[1] = stride ? stride : kernel;
    m->cfg.pool.padding[0] = m->cfg.pool.padding[1] = padding;
    return m;
}

kiln_module *kiln_nn_max_pool2d(int64_t kernel, int64_t stride, int64_t padding) {
    return pool("MaxPool2d", max_pool_forward, kernel, stride, padding);
}

kiln_module *kiln_nn_avg_pool2d(int64_t kernel, int64_t stride, int64_t padding) {
    return pool("AvgPool2d", avg_pool_forward, kernel, stride, padding);
}

kiln_module *kiln_nn_adaptive_avg_pool2d(int64_t out_h, int64_t out_w) {
    if (!check_positive("kiln_nn_adaptive_avg_pool2d", "out_h", out_h) ||
        !check_positive("kiln_nn_adaptive_avg_pool2d", "out_w", out_w))
        return NULL;
    kiln_module *m = kiln_module_new("AdaptiveAvgPool2d", adaptive_avg_pool_forward);
    if (m) {
        m->cfg.out_hw[0] = out_h;
        m->cfg.out_hw[1] = out_w;
    }
    return m;
}

kiln_module *kiln_nn_dropout(double p) {
    if (!(p >= 0 && p <= 1)) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_nn_dropout: p must be in [0, 1], got %g", p);
        return NULL;
    }
    kiln_module *m = kiln_module_new("Dropout", dropout_forward);
    if (m) m->cfg.p = p;
    return m;
}

kiln_module *kiln_nn_flatten(int start_dim, int end_dim) {
    kiln_module *m = kiln_module_new("Flatten", flatten_forward);
    if (m) {
        m->cfg.start_dim = start_dim;
        m->cfg.end_dim = end_dim;
    }
    return m;
}

kiln_module *kiln_nn_sequential(int n, kiln_module *const *modules) {
    kiln_module *m = kiln_module_new("Sequential", sequential_forward);
    kiln_status st = m ? KILN_OK : KILN_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < n; i++) {
        if (st) {
            kiln_module_free(modules[i]);
            continue;
        }
        st = kiln_nn_sequential_append(m, modules[i]);
    }
    if (st) {
        kiln_module_free(m);
        return NULL;
    }
    return m;
}

kiln_status kiln_nn_sequential_append(kiln_module *seq, kiln_module *child) {
    if (!seq || seq->forward != sequential_forward) {
        kiln_module_free(child);
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "create it with kiln_nn_sequential",
                          "kiln_nn_sequential_append: the module is not a Sequential");
    }
    char name[24];
    snprintf(name, sizeof name, "%d", seq->children.n);
    return kiln_module_add_child(seq, name, child);
}

kiln_module *kiln_nn_basic_block(int64_t in_channels, int64_t out_channels, int64_t stride) {
    if (!check_positive("kiln_nn_basic_block", "stride", stride)) return NULL;
    kiln_module *m = kiln_module_new("BasicBlock", basic_block_forward);
    if (!m) return NULL;
    kiln_status st = kiln_module_add_child(m, "conv1", kiln_nn_conv2d(in_channels, out_channels, 3, stride, 1, 1, 1, false));
    if (!st) st = kiln_module_add_child(m, "bn1", kiln_nn_batch_norm2d(out_channels, 1e-5, 0.1, true, true));
    if (!st) st = kiln_module_add_child(m, "conv2", kiln_nn_conv2d(out_channels, out_channels, 3, 1, 1, 1, 1, false));
    if (!st) st = kiln_module_add_child(m, "bn2", kiln_nn_batch_norm2d(out_channels, 1e-5, 0.1, true, true));
    if (!st) {
        kiln_module *sc = kiln_nn_sequential(0, NULL);
        if (sc && (stride != 1 || in_channels != out_channels)) {
            st = kiln_nn_sequential_append(sc, kiln_nn_conv2d(in_channels, out_channels, 1, stride, 0, 1, 1, false));
            if (!st) st = kiln_nn_sequential_append(sc, kiln_nn_batch_norm2d(out_channels, 1e-5, 0.1, true, true));
        }
        if (st) kiln_module_free(sc);
        else st = kiln_module_add_child(m, "shortcut", sc);
    }
    if (st) {
        kiln_module_free(m);
        return NULL;
    }
    return m;
}

kiln_module *kiln_nn_residual(kiln_module *body, kiln_module *shortcut) {
    kiln_module *m = kiln_module_new("Residual", residual_forward);
    if (!shortcut) shortcut = kiln_nn_sequential(0, NULL);
    kiln_status st = m ? kiln_module_add_child(m, "body", body) : (kiln_module_free(body), KILN_ERR_OUT_OF_MEMORY);
    if (m && !st) st = kiln_module_add_child(m, "shortcut", shortcut);
    else kiln_module_free(shortcut);
    if (st) {
        kiln_module_free(m);
        return NULL;
    }
    return m;
}

kiln_module *kiln_nn_custom(const char *kind, kiln_module_forward_fn forward, void *user) {
    if (!forward) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_nn_custom: forward is NULL");
        return NULL;
    }
    const char *k = kind ? kind : "Module";
    char *copy = KILN_MALLOC(strlen(k) + 1);
    if (!copy) return NULL;
    strcpy(copy, k);
    kiln_module *m = kiln_module_new(copy, NULL);
    if (!m) {
        free(copy);
        return NULL;
    }
    m->kind_owned = true;
    m->user_forward = forward;
    m->user = user;
    return m;
}

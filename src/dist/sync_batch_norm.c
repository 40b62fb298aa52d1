/* SyncBatchNorm2d: BatchNorm whose training statistics are those of the
 * union of the ranks' batches (PyTorch's nn.SyncBatchNorm).
 *
 * Forward (training): each rank sums x and x^2 per channel and counts its
 * elements; one all-reduce of [sum (C), sum of squares (C), count] gives
 * the union's mean and biased variance, with which every rank normalises;
 * the running statistics are updated from them (the variance unbiased),
 * so they are the same on every rank. The output carries a function node
 * (autograd_internal.h) whose backward all-reduces [sum dy, sum dy*x_hat]
 * per channel and gives
 *   dx     = weight * invstd * (dy - sum_dy / M - x_hat * sum_dy_xhat / M)
 *   dweight = this rank's sum dy*x_hat,  dbias = this rank's sum dy
 * (M the union's count): dx is the gradient of the sum of the ranks'
 * losses, and DDP's average of the parameters' gradients then gives one
 * process's gradient on the union batch. Every rank's backward calls that
 * all-reduce in the same order, interleaved with DDP's bucket all-reduces
 * on the same group (MPI orders collectives per communicator).
 * Eval: kiln_batch_norm with the running statistics. */
#include <stdio.h>
#include <stdlib.h>

#include "autograd/autograd_internal.h"
#include "base/error.h"
#include "dist/dist_internal.h"
#include "tensor/scope.h"

typedef struct sbn_config {
    kiln_dist_group *group;
    double eps, momentum;
    struct sbn_config *next;
} sbn_config;

/* Every layer's configuration, freed by kiln_dist_shutdown (kiln_nn_custom
 * does not free its user pointer; the layers cannot outlive the world). */
static sbn_config *sbn_all;

void kiln_dist_sync_bn_free_all(void) {
    while (sbn_all) {
        sbn_config *n = sbn_all->next;
        free(sbn_all);
        sbn_all = n;
    }
}

typedef struct sbn_state {
    sbn_config *cfg;
    kiln_tensor *xhat, *invstd, *weight; /* (N,C,H,W), (1,C,1,1), (1,C,1,1); own refs */
    double count;                        /* the union's elements per channel */
} sbn_state;

static void sbn_free_state(void *p) {
    sbn_state *s = p;
    if (!s) return;
    kiln_release(s->xhat), kiln_release(s->invstd), kiln_release(s->weight);
    free(s);
}

static const int sbn_dims[3] = {0, 2, 3};

/* [a (C), b (C)] all-reduced (sum) over the group, as one tensor (2C). */
static kiln_tensor *reduce_pair(kiln_dist_group *g, kiln_tensor *a, kiln_tensor *b, kiln_tensor *extra) {
    kiln_tensor *parts[3] = {a, b, extra};
    kiln_tensor *cat = kiln_cat(extra ? 3 : 2, parts, 0);
    if (!cat) return NULL;
    if (kiln_dist_all_reduce(g, cat, KILN_DIST_SUM, NULL)) {
        kiln_release(cat);
        return NULL;
    }
    return cat;
}

static kiln_status sbn_backward(kiln_node *n, kiln_tensor **grad_out, kiln_tensor **grad_in) {
    sbn_state *s = n->fn_state;
    kiln_tensor *dy = grad_out[0];
    if (!dy) return KILN_OK;
    int64_t c = kiln_shape_of(s->invstd).d[1];
    kiln_no_grad_begin();
    kiln_status st = KILN_OK;
    kiln_tensor *dyx = kiln_mul(dy, s->xhat);
    kiln_tensor *sum_dy = kiln_sum(dy, 3, sbn_dims, false);
    kiln_tensor *sum_dyx = dyx ? kiln_sum(dyx, 3, sbn_dims, false) : NULL;
    kiln_tensor *all = NULL, *mean_dy = NULL, *mean_dyx = NULL, *t1 = NULL, *t2 = NULL, *t3 = NULL,
                *scale = NULL;
    if (!sum_dy || !sum_dyx) st = kiln_error_last()->status;
    if (!st && n->needs_grad[0]) {
        all = reduce_pair(s->cfg->group, sum_dy, sum_dyx, NULL);
        kiln_tensor *a = all ? kiln_narrow(all, 0, 0, c) : NULL, *b = all ? kiln_narrow(all, 0, c, c) : NULL;
        kiln_tensor *av = a ? kiln_view(a, KILN_SHAPE(1, c, 1, 1)) : NULL;
        kiln_tensor *bv = b ? kiln_view(b, KILN_SHAPE(1, c, 1, 1)) : NULL;
        mean_dy = av ? kiln_mul_scalar(av, 1.0 / s->count) : NULL;
        mean_dyx = bv ? kiln_mul_scalar(bv, 1.0 / s->count) : NULL;
        kiln_release(a), kiln_release(b), kiln_release(av), kiln_release(bv);
        t1 = mean_dyx ? kiln_mul(s->xhat, mean_dyx) : NULL; /* x_hat * mean(dy x_hat) */
        t2 = t1 && mean_dy ? kiln_sub(dy, mean_dy) : NULL;  /* dy - mean(dy) */
        t3 = t2 ? kiln_sub(t2, t1) : NULL;
        scale = t3 ? kiln_mul(s->weight, s->invstd) : NULL; /* weight * invstd */
        grad_in[0] = scale ? kiln_mul(t3, scale) : NULL;
        if (!grad_in[0]) st = kiln_error_last()->status;
    }
    if (!st && n->needs_grad[1]) grad_in[1] = kiln_retain(sum_dyx);
    if (!st && n->needs_grad[2]) grad_in[2] = kiln_retain(sum_dy);
    kiln_release(dyx), kiln_release(sum_dy), kiln_release(sum_dyx), kiln_release(all), kiln_release(mean_dy);
    kiln_release(mean_dyx), kiln_release(t1), kiln_release(t2), kiln_release(t3), kiln_release(scale);
    kiln_status end = kiln_grad_mode_end();
    return st ? st : end;
}

static const kiln_node_fn sbn_node = {"sync_batch_norm", "sync_batch_norm_backward", sbn_backward,
                                      sbn_free_state};

/* running = (1 - momentum) running + momentum * batch, in place. */
static kiln_status blend(kiln_tensor *running, kiln_tensor *batch, double momentum) {
    kiln_tensor *a = kiln_mul_scalar(running, 1.0 - momentum), *b = kiln_mul_scalar(batch, momentum);
    kiln_tensor *sum = a && b ? kiln_add(a, b) : NULL;
    kiln_status st = sum ? kiln_copy_(running, sum, 0) : kiln_error_last()->status;
    kiln_release(a), kiln_release(b), kiln_release(sum);
    return st;
}

/* The layer's weight, bias, running_mean, running_var, num_batches_tracked. */
typedef struct sbn_tensors {
    kiln_tensor *w, *bias, *rm, *rv, *nbt;
} sbn_tensors;

static kiln_tensor *sbn_train(const sbn_tensors *p, sbn_config *cfg, kiln_tensor *x) {
    kiln_tensor *w = p->w, *bias = p->bias, *rm = p->rm, *rv = p->rv, *nbt = p->nbt;
    kiln_shape xs = kiln_shape_of(x);
    int64_t c = xs.d[1];
    kiln_shape cs = KILN_SHAPE(1, c, 1, 1);
    kiln_no_grad_begin();
    kiln_tensor *x2 = kiln_mul(x, x);
    kiln_tensor *s1 = kiln_sum(x, 3, sbn_dims, false), *s2 = x2 ? kiln_sum(x2, 3, sbn_dims, false) : NULL;
    kiln_tensor *cnt =
        kiln_full(KILN_SHAPE(1), (double)(xs.d[0] * xs.d[2] * xs.d[3]), kiln_dtype_of(x), kiln_get_device(x));
    kiln_tensor *all = s1 && s2 && cnt ? reduce_pair(cfg->group, s1, s2, cnt) : NULL;
    double count = 0;
    kiln_tensor *tail = all ? kiln_narrow(all, 0, 2 * c, 1) : NULL;
    kiln_status st = tail ? kiln_item(tail, &count) : kiln_error_last()->status;
    if (!st && count < 2)
        st = KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give the ranks more than one value per channel in all",
                        "SyncBatchNorm2d: %g value(s) per channel over all ranks", count);
    kiln_tensor *mean = NULL, *ex2 = NULL, *var = NULL, *sq = NULL, *invstd = NULL, *xc = NULL, *xhat = NULL;
    kiln_tensor *y0 = NULL, *y = NULL, *wv = NULL, *bv = NULL, *unb = NULL, *mean_c = NULL;
    if (!st) {
        kiln_tensor *a = kiln_narrow(all, 0, 0, c), *b = kiln_narrow(all, 0, c, c);
        mean = a ? kiln_mul_scalar(a, 1.0 / count) : NULL;
        ex2 = b ? kiln_mul_scalar(b, 1.0 / count) : NULL;
        kiln_release(a), kiln_release(b);
        sq = mean ? kiln_mul(mean, mean) : NULL;
        var = sq && ex2 ? kiln_sub(ex2, sq) : NULL;
        kiln_tensor *ve = var ? kiln_add_scalar(var, cfg->eps) : NULL;
        kiln_tensor *r = ve ? kiln_rsqrt(ve) : NULL;
        invstd = r ? kiln_view(r, cs) : NULL;
        kiln_release(ve), kiln_release(r);
        mean_c = mean ? kiln_view(mean, cs) : NULL;
        xc = mean_c ? kiln_sub(x, mean_c) : NULL;
        xhat = xc && invstd ? kiln_mul(xc, invstd) : NULL;
        wv = kiln_view(w, cs), bv = kiln_view(bias, cs);
        y0 = xhat && wv ? kiln_mul(xhat, wv) : NULL;
        y = y0 && bv ? kiln_add(y0, bv) : NULL;
        if (!y) st = kiln_error_last()->status;
    }
    if (!st && cfg->momentum >= 0 && rm && rv) {
        unb = kiln_mul_scalar(var, count / (count - 1));
        st = unb ? blend(rm, mean, cfg->momentum) : kiln_error_last()->status;
        if (!st) st = blend(rv, unb, cfg->momentum);
        if (!st && nbt) {
            kiln_tensor *one = kiln_add_scalar(nbt, 1);
            st = one ? kiln_copy_(nbt, one, 0) : kiln_error_last()->status;
            kiln_release(one);
        }
    }
    kiln_status end = kiln_grad_mode_end();
    if (!st) st = end;
    sbn_state *s = NULL;
    if (!st) {
        s = KILN_CALLOC(1, sizeof *s);
        if (!s) st = KILN_ERR_OUT_OF_MEMORY;
    }
    if (!st) {
        s->cfg = cfg, s->count = count;
        s->xhat = kiln_retain(xhat), s->invstd = kiln_retain(invstd), s->weight = kiln_retain(wv);
        kiln_tensor *in[3] = {x, w, bias};
        st = kiln_node_record_fn(&sbn_node, s, 3, in, 1, &y, kiln_get_device(x));
    }
    kiln_release(x2), kiln_release(s1), kiln_release(s2), kiln_release(cnt), kiln_release(all),
        kiln_release(tail);
    kiln_release(mean), kiln_release(ex2), kiln_release(var), kiln_release(sq), kiln_release(invstd);
    kiln_release(xc), kiln_release(xhat), kiln_release(y0), kiln_release(wv), kiln_release(bv),
        kiln_release(unb);
    kiln_release(mean_c);
    if (st) {
        kiln_release(y);
        return NULL;
    }
    return y;
}

static kiln_tensor *sbn_forward(kiln_module *m, kiln_tensor *x, void *user) {
    sbn_config *cfg = user;
    kiln_shape xs = kiln_shape_of(x);
    sbn_tensors p = {kiln_module_state_get(m, "weight"), kiln_module_state_get(m, "bias"),
                     kiln_module_state_get(m, "running_mean"), kiln_module_state_get(m, "running_var"),
                     kiln_module_state_get(m, "num_batches_tracked")};
    kiln_tensor *y = NULL;
    if (!p.w || !p.bias || !p.rm || !p.rv || !p.nbt) {
        /* the error names the key */
    } else if (xs.ndim != 4 || xs.d[1] != kiln_numel(p.w)) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give (N, C, H, W) with the layer's C",
                   "SyncBatchNorm2d: input of %d dims with %lld channels for a layer of %lld", xs.ndim,
                   (long long)(xs.ndim > 1 ? xs.d[1] : 0), (long long)kiln_numel(p.w));
    } else if (!kiln_module_is_training(m)) {
        y = kiln_batch_norm(x, p.w, p.bias, p.rm, p.rv, false, cfg->momentum, cfg->eps);
    } else {
        y = sbn_train(&p, cfg, x);
    }
    kiln_release(p.w), kiln_release(p.bias), kiln_release(p.rm), kiln_release(p.rv), kiln_release(p.nbt);
    return y;
}

kiln_module *kiln_nn_sync_batch_norm2d(int64_t num_features, double eps, double momentum,
                                       kiln_dist_group *g) {
    if (num_features < 1 || !g || !(eps > 0)) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                   "give num_features >= 1, eps > 0 and the group from kiln_dist_init",
                   "kiln_nn_sync_batch_norm2d: num_features %lld, eps %g, group %s", (long long)num_features,
                   eps, g ? "given" : "NULL");
        return NULL;
    }
    sbn_config *cfg = KILN_CALLOC(1, sizeof *cfg);
    if (!cfg) return NULL;
    *cfg = (sbn_config){g, eps, momentum, sbn_all};
    sbn_all = cfg;
    kiln_module *m = kiln_nn_custom("SyncBatchNorm2d", sbn_forward, cfg);
    if (!m) return NULL;
    kiln_api_enter();
    kiln_tensor *t[5] = {kiln_ones(KILN_SHAPE(num_features), KILN_F32, KILN_CPU),
                         kiln_zeros(KILN_SHAPE(num_features), KILN_F32, KILN_CPU),
                         kiln_zeros(KILN_SHAPE(num_features), KILN_F32, KILN_CPU),
                         kiln_ones(KILN_SHAPE(num_features), KILN_F32, KILN_CPU),
                         kiln_zeros(KILN_SHAPE(), KILN_I64, KILN_CPU)};
    static const char *const names[5] = {"weight", "bias", "running_mean", "running_var",
                                         "num_batches_tracked"};
    kiln_status st = KILN_OK;
    for (int i = 0; i < 5; i++) {
        if (!st && !t[i]) st = kiln_error_last()->status;
        if (!st)
            st = i < 2 ? kiln_module_add_parameter(m, names[i], t[i])
                       : kiln_module_add_buffer(m, names[i], t[i]);
        kiln_release(t[i]);
    }
    kiln_api_leave();
    if (st) {
        kiln_module_free(m);
        return NULL;
    }
    return m;
}

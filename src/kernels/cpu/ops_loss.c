/* CPU reference kernels for nll_loss (with PyTorch's label smoothing), its
 * backward, and mse_loss.
 *
 * nll_loss over positions i of the target (N, d...), class dim 1 of
 * log_probs (N, C, d...) (dim 0 for a (C) input with a 0-dim target),
 * w = weight or ones, eps = label smoothing:
 *
 *   loss_i = (1 - eps) * w[t_i] * (-lp[i, t_i]) + eps / C * sum_c w[c] * (-lp[i, c])
 *   W      = sum of w[t_i] over positions whose target is not ignore_index
 *
 * ignored positions contribute 0 to both; reduction none writes loss_i,
 * sum writes sum_i loss_i, mean writes sum_i loss_i / W (PyTorch divides
 * the smoothing term by the same W). out[1] is W. */
#include "base/error.h"
#include "kernels/cpu/reduce_access.h"
#include "kernels/cpu/reduce_kernels.h"

typedef struct nll_layout {
    rk_iter pos; /* over the target: off[0] target, off[1] log_probs, off[2] per-position tensor */
    int64_t n_pos;
    int64_t classes, class_stride;
} nll_layout;

/* pos_strides: the strides of the tensor walked with the target (loss for
 * reduction none, grad for its backward), or NULL for a 0-dim one. */
static void nll_layout_make(nll_layout *l, const kiln_strided *lp, const kiln_strided *target,
                            const int64_t *pos_strides) {
    memset(l, 0, sizeof *l);
    int cdim = lp->ndim == 1 ? 0 : 1;
    l->classes = lp->shape[cdim];
    l->class_stride = lp->strides[cdim];
    l->pos.n = target->ndim;
    for (int d = 0; d < target->ndim; d++) {
        l->pos.shape[d] = target->shape[d];
        l->pos.stride[0][d] = target->strides[d];
        l->pos.stride[1][d] = lp->strides[d == 0 ? 0 : d + 1];
        l->pos.stride[2][d] = pos_strides ? pos_strides[d] : 0;
    }
    l->n_pos = rk_iter_count(&l->pos);
}

static kiln_status bad_target(int64_t t, int64_t classes, int64_t ignore) {
    return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                      "targets are class indices in [0, C); mark padding with ignore_index",
                      "kiln_nll_loss: target %lld is out of range for %lld classes (ignore_index is %lld)",
                      (long long)t, (long long)classes, (long long)ignore);
}

static double class_weight(const kiln_strided *w, int64_t c) {
    return w->ndim < 0 ? 1.0 : kiln_cpu_ld_f(w->data, w->dtype, c * w->strides[0]);
}

kiln_status kiln_cpu_nll_loss(const kiln_op_args *a) {
    const kiln_strided *lp = &a->in[0], *tg = &a->in[1], *w = &a->in[2];
    const kiln_strided *loss = &a->out[0], *total = &a->out[1];
    const kiln_op_attrs *at = a->attrs;
    bool none = at->reduction == KILN_REDUCTION_NONE;
    double eps = at->label_smoothing;
    nll_layout l;
    nll_layout_make(&l, lp, tg, none ? loss->strides : NULL);
    double sum = 0, wsum = 0;
    for (int64_t i = 0; i < l.n_pos; i++, rk_iter_next(&l.pos)) {
        int64_t t = ((const int64_t *)tg->data)[l.pos.off[0]];
        double li = 0;
        if (t != at->ignore_index) {
            if (t < 0 || t >= l.classes) return bad_target(t, l.classes, at->ignore_index);
            double wt = class_weight(w, t);
            li = -wt * kiln_cpu_ld_f(lp->data, lp->dtype, l.pos.off[1] + t * l.class_stride);
            if (eps != 0) {
                double s = 0;
                for (int64_t c = 0; c < l.classes; c++)
                    s -= class_weight(w, c) * kiln_cpu_ld_f(lp->data, lp->dtype, l.pos.off[1] + c * l.class_stride);
                li = (1 - eps) * li + eps / (double)l.classes * s;
            }
            wsum += wt;
        }
        if (none) kiln_cpu_st_f(loss->data, loss->dtype, l.pos.off[2], li);
        sum += li;
    }
    if (!none) kiln_cpu_st_f(loss->data, loss->dtype, 0, at->reduction == KILN_REDUCTION_MEAN ? sum / wsum : sum);
    kiln_cpu_st_f(total->data, total->dtype, 0, wsum);
    return KILN_OK;
}

/* (grad, target, weight, total_weight) -> d loss / d log_probs:
 *   gx[i, c] = -scale_i * ((1 - eps) * w[t_i] * [c == t_i] + eps / C * w[c])
 * with scale_i = grad_i (none), grad (sum) or grad / W (mean); 0 where
 * the target is ignored. */
kiln_status kiln_cpu_nll_loss_backward(const kiln_op_args *a) {
    const kiln_strided *g = &a->in[0], *tg = &a->in[1], *w = &a->in[2], *tw = &a->in[3];
    const kiln_strided *gx = &a->out[0];
    const kiln_op_attrs *at = a->attrs;
    bool none = at->reduction == KILN_REDUCTION_NONE;
    double eps = at->label_smoothing;
    nll_layout l;
    nll_layout_make(&l, gx, tg, none ? g->strides : NULL);
    double div = at->reduction == KILN_REDUCTION_MEAN ? kiln_cpu_ld_f(tw->data, tw->dtype, 0) : 1.0;
    for (int64_t i = 0; i < l.n_pos; i++, rk_iter_next(&l.pos)) {
        int64_t t = ((const int64_t *)tg->data)[l.pos.off[0]];
        bool ignored = t == at->ignore_index;
        if (!ignored && (t < 0 || t >= l.classes)) return bad_target(t, l.classes, at->ignore_index);
        double scale = ignored ? 0 : kiln_cpu_ld_f(g->data, g->dtype, l.pos.off[2]) / div;
        for (int64_t c = 0; c < l.classes; c++) {
            double v = 0;
            if (!ignored) {
                v = eps / (double)l.classes * class_weight(w, c);
                if (c == t) v += (1 - eps) * class_weight(w, t);
                v *= -scale;
            }
            kiln_cpu_st_f(gx->data, gx->dtype, l.pos.off[1] + c * l.class_stride, v);
        }
    }
    return KILN_OK;
}

/* (input, target) of one shape: (x - t)^2 elementwise, summed or averaged. */
kiln_status kiln_cpu_mse_loss(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *t = &a->in[1], *y = &a->out[0];
    bool none = a->attrs->reduction == KILN_REDUCTION_NONE;
    rk_iter it;
    memset(&it, 0, sizeof it);
    it.n = x->ndim;
    for (int d = 0; d < x->ndim; d++) {
        it.shape[d] = x->shape[d];
        it.stride[0][d] = x->strides[d];
        it.stride[1][d] = t->strides[d];
        it.stride[2][d] = none ? y->strides[d] : 0;
    }
    int64_t n = rk_iter_count(&it);
    double sum = 0;
    for (int64_t i = 0; i < n; i++, rk_iter_next(&it)) {
        double d = kiln_cpu_ld_f(x->data, x->dtype, it.off[0]) - kiln_cpu_ld_f(t->data, t->dtype, it.off[1]);
        if (none) kiln_cpu_st_f(y->data, y->dtype, it.off[2], d * d);
        sum += d * d;
    }
    if (!none)
        kiln_cpu_st_f(y->data, y->dtype, 0, a->attrs->reduction == KILN_REDUCTION_MEAN ? sum / (double)n : sum);
    return KILN_OK;
}

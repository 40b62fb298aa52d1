/* CPU reference kernels for softmax and log_softmax along attrs.dims[0],
 * and their backward kernels. Numerically stable: the row maximum is
 * subtracted before exponentiating; sums are in double.
 *
 *   softmax      y = exp(x - m) / s,        s = sum exp(x - m)
 *   log_softmax  y = x - m - log(s)
 *   softmax backward      gx = y * (g - sum(g * y))
 *   log_softmax backward  gx = g - exp(y) * sum(g) */
#include "kernels/cpu/reduce_access.h"
#include "kernels/cpu/reduce_kernels.h"

static kiln_status softmax_forward(const kiln_op_args *a, bool log_form) {
    const kiln_strided *x = &a->in[0], *y = &a->out[0];
    rk_rows r;
    rk_rows_make(&r, x->ndim, x->shape, a->attrs->dims[0], x->strides, y->strides, NULL);
    int64_t rows = rk_iter_count(&r.outer);
    for (int64_t i = 0; i < rows; i++, rk_iter_next(&r.outer)) {
        int64_t xo = r.outer.off[0], yo = r.outer.off[1];
        double m = -INFINITY;
        for (int64_t j = 0; j < r.len; j++) {
            double v = kiln_cpu_ld_f(x->data, x->dtype, xo + j * r.step[0]);
            if (v > m || isnan(v)) m = v;
        }
        /* A row of -inf (every class masked) gives NaN, as in PyTorch. */
        double s = 0;
        for (int64_t j = 0; j < r.len; j++) s += exp(kiln_cpu_ld_f(x->data, x->dtype, xo + j * r.step[0]) - m);
        double ls = log(s);
        for (int64_t j = 0; j < r.len; j++) {
            double v = kiln_cpu_ld_f(x->data, x->dtype, xo + j * r.step[0]) - m;
            kiln_cpu_st_f(y->data, y->dtype, yo + j * r.step[1], log_form ? v - ls : exp(v) / s);
        }
    }
    return KILN_OK;
}

kiln_status kiln_cpu_softmax(const kiln_op_args *a) { return softmax_forward(a, false); }
kiln_status kiln_cpu_log_softmax(const kiln_op_args *a) { return softmax_forward(a, true); }

static kiln_status softmax_backward(const kiln_op_args *a, bool log_form) {
    const kiln_strided *g = &a->in[0], *y = &a->in[1], *gx = &a->out[0];
    rk_rows r;
    rk_rows_make(&r, gx->ndim, gx->shape, a->attrs->dims[0], g->strides, y->strides, gx->strides);
    int64_t rows = rk_iter_count(&r.outer);
    for (int64_t i = 0; i < rows; i++, rk_iter_next(&r.outer)) {
        int64_t go = r.outer.off[0], yo = r.outer.off[1], oo = r.outer.off[2];
        double s = 0;
        for (int64_t j = 0; j < r.len; j++) {
            double gv = kiln_cpu_ld_f(g->data, g->dtype, go + j * r.step[0]);
            s += log_form ? gv : gv * kiln_cpu_ld_f(y->data, y->dtype, yo + j * r.step[1]);
        }
        for (int64_t j = 0; j < r.len; j++) {
            double gv = kiln_cpu_ld_f(g->data, g->dtype, go + j * r.step[0]);
            double yv = kiln_cpu_ld_f(y->data, y->dtype, yo + j * r.step[1]);
            kiln_cpu_st_f(gx->data, gx->dtype, oo + j * r.step[2], log_form ? gv - exp(yv) * s : yv * (gv - s));
        }
    }
    return KILN_OK;
}

kiln_status kiln_cpu_softmax_backward(const kiln_op_args *a) { return softmax_backward(a, false); }
kiln_status kiln_cpu_log_softmax_backward(const kiln_op_args *a) { return softmax_backward(a, true); }

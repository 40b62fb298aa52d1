/* CPU reference kernels for sum, mean, amax, amin, argmax and norm over
 * attrs.dims (n_dims 0: every dim), keepdim. Floating inputs accumulate in
 * double; integer sums accumulate in int64 (their output is i64). Inference
 * has checked the dims and refused empty max/min/argmax reductions. */
#include "kernels/cpu/reduce_access.h"
#include "kernels/cpu/reduce_kernels.h"

kiln_status kiln_cpu_sum(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *y = &a->out[0];
    rk_plan p;
    rk_plan_make(&p, x, y, a->attrs);
    bool exact = !kiln_cpu_is_float(x->dtype);
    for (int64_t o = 0; o < p.n_out; o++, rk_iter_next(&p.outer)) {
        if (exact) {
            int64_t s = 0;
            for (int64_t r = 0; r < p.n_red; r++, rk_iter_next(&p.inner))
                s += kiln_cpu_ld_i(x->data, x->dtype, p.outer.off[0] + p.inner.off[0]);
            kiln_cpu_st_i(y->data, y->dtype, p.outer.off[1], s);
        } else {
            double s = 0;
            for (int64_t r = 0; r < p.n_red; r++, rk_iter_next(&p.inner))
                s += kiln_cpu_ld_f(x->data, x->dtype, p.outer.off[0] + p.inner.off[0]);
            kiln_cpu_st_f(y->data, y->dtype, p.outer.off[1], s);
        }
    }
    return KILN_OK;
}

kiln_status kiln_cpu_mean(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *y = &a->out[0];
    rk_plan p;
    rk_plan_make(&p, x, y, a->attrs);
    for (int64_t o = 0; o < p.n_out; o++, rk_iter_next(&p.outer)) {
        double s = 0;
        for (int64_t r = 0; r < p.n_red; r++, rk_iter_next(&p.inner))
            s += kiln_cpu_ld_f(x->data, x->dtype, p.outer.off[0] + p.inner.off[0]);
        kiln_cpu_st_f(y->data, y->dtype, p.outer.off[1], p.n_red ? s / (double)p.n_red : NAN);
    }
    return KILN_OK;
}

/* max (sign 1) or min (sign -1); a NaN anywhere makes the result NaN. */
static kiln_status extreme(const kiln_op_args *a, int sign) {
    const kiln_strided *x = &a->in[0], *y = &a->out[0];
    rk_plan p;
    rk_plan_make(&p, x, y, a->attrs);
    bool exact = !kiln_cpu_is_float(x->dtype);
    for (int64_t o = 0; o < p.n_out; o++, rk_iter_next(&p.outer)) {
        if (exact) {
            int64_t best = 0;
            for (int64_t r = 0; r < p.n_red; r++, rk_iter_next(&p.inner)) {
                int64_t v = kiln_cpu_ld_i(x->data, x->dtype, p.outer.off[0] + p.inner.off[0]);
                if (r == 0 || (sign > 0 ? v > best : v < best)) best = v;
            }
            kiln_cpu_st_i(y->data, y->dtype, p.outer.off[1], best);
        } else {
            double best = 0;
            for (int64_t r = 0; r < p.n_red; r++, rk_iter_next(&p.inner)) {
                double v = kiln_cpu_ld_f(x->data, x->dtype, p.outer.off[0] + p.inner.off[0]);
                if (r == 0 || isnan(v) || (!isnan(best) && (sign > 0 ? v > best : v < best))) best = v;
            }
            kiln_cpu_st_f(y->data, y->dtype, p.outer.off[1], best);
        }
    }
    return KILN_OK;
}

kiln_status kiln_cpu_amax(const kiln_op_args *a) { return extreme(a, 1); }
kiln_status kiln_cpu_amin(const kiln_op_args *a) { return extreme(a, -1); }

/* The flat row-major index (within the reduced dims) of the first maximum;
 * a NaN counts as the maximum, as in PyTorch. */
kiln_status kiln_cpu_argmax(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *y = &a->out[0];
    rk_plan p;
    rk_plan_make(&p, x, y, a->attrs);
    bool exact = !kiln_cpu_is_float(x->dtype);
    for (int64_t o = 0; o < p.n_out; o++, rk_iter_next(&p.outer)) {
        int64_t at = 0;
        if (exact) {
            int64_t best = 0;
            for (int64_t r = 0; r < p.n_red; r++, rk_iter_next(&p.inner)) {
                int64_t v = kiln_cpu_ld_i(x->data, x->dtype, p.outer.off[0] + p.inner.off[0]);
                if (r == 0 || v > best) best = v, at = r;
            }
        } else {
            double best = 0;
            for (int64_t r = 0; r < p.n_red; r++, rk_iter_next(&p.inner)) {
                double v = kiln_cpu_ld_f(x->data, x->dtype, p.outer.off[0] + p.inner.off[0]);
                if (r == 0 || (!isnan(best) && (isnan(v) || v > best))) best = v, at = r;
            }
        }
        ((int64_t *)y->data)[p.outer.off[1]] = at;
    }
    return KILN_OK;
}

/* p-norm: p = inf / -inf are max / min of |x|, p = 0 counts non-zeros. */
kiln_status kiln_cpu_norm(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *y = &a->out[0];
    double pn = a->attrs->scalar[0];
    rk_plan p;
    rk_plan_make(&p, x, y, a->attrs);
    for (int64_t o = 0; o < p.n_out; o++, rk_iter_next(&p.outer)) {
        double acc = isinf(pn) && pn < 0 ? INFINITY : 0;
        for (int64_t r = 0; r < p.n_red; r++, rk_iter_next(&p.inner)) {
            double v = fabs(kiln_cpu_ld_f(x->data, x->dtype, p.outer.off[0] + p.inner.off[0]));
            if (isnan(v))
                acc = NAN;
            else if (isnan(acc))
                continue;
            else if (isinf(pn))
                acc = pn > 0 ? fmax(acc, v) : fmin(acc, v);
            else if (pn == 0)
                acc += v != 0;
            else if (pn == 1)
                acc += v;
            else if (pn == 2)
                acc += v * v;
            else
                acc += pow(v, pn);
        }
        double res = acc;
        if (!isinf(pn) && pn != 0 && pn != 1) res = pn == 2 ? sqrt(acc) : pow(acc, 1.0 / pn);
        kiln_cpu_st_f(y->data, y->dtype, p.outer.off[1], res);
    }
    return KILN_OK;
}

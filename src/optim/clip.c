/* torch.nn.utils.clip_grad_norm_: the norm of all gradients together,
 * computed on the device with public ops, then one host synchronisation
 * to read it; gradients are scaled in place when it exceeds max_norm. */
#include <math.h>

#include "base/error.h"
#include "kiln/optim.h"
#include "tensor/scope.h"
#include "tensor/tensor_internal.h"

/* The norm of one gradient in `acc` dtype: max|g| for inf, else ||g||_p. */
static kiln_tensor *grad_norm(kiln_tensor *g, double p, kiln_dtype acc) {
    kiln_tensor *n;
    if (isinf(p)) {
        kiln_tensor *a = kiln_abs(g);
        n = a ? kiln_max(a, 0, NULL, false) : NULL;
        kiln_tensor_drop(a);
    } else {
        n = kiln_norm(g, p, 0, NULL, false);
    }
    if (!n || kiln_dtype_of(n) == acc) return n;
    kiln_tensor *c = kiln_cast(n, acc);
    kiln_tensor_drop(n);
    return c;
}

/* acc (consumed) combined with the norm n (consumed): max for inf, else
 * acc + n^p. */
static kiln_tensor *combine(kiln_tensor *acc, kiln_tensor *n, double p) {
    kiln_tensor *term = n, *r = NULL;
    if (!isinf(p) && n) {
        term = kiln_pow_scalar(n, p);
        kiln_tensor_drop(n);
    }
    if (!acc) return term;
    if (!term) {
        kiln_tensor_drop(acc);
        return NULL;
    }
    if (isinf(p)) {
        kiln_tensor *gt = kiln_gt(acc, term);
        r = gt ? kiln_where(gt, acc, term) : NULL;
        kiln_tensor_drop(gt);
    } else {
        r = kiln_add(acc, term);
    }
    kiln_tensor_drop(acc);
    kiln_tensor_drop(term);
    return r;
}

static kiln_status clip_body(kiln_tensor *const *params, int n, double max_norm, double p, double *total) {
    kiln_tensor *acc = NULL;
    kiln_dtype acc_dtype = KILN_F64;
    int with_grad = 0;
    for (int i = 0; i < n; i++) {
        kiln_tensor *g = kiln_grad(params[i]);
        if (!g) continue;
        if (kiln_dtype_of(g) != KILN_F64) acc_dtype = KILN_F32;
        kiln_tensor_drop(g);
        with_grad++;
    }
    *total = 0.0;
    if (!with_grad) return KILN_OK;
    for (int i = 0; i < n; i++) {
        kiln_tensor *g = kiln_grad(params[i]);
        if (!g) continue;
        acc = combine(acc, grad_norm(g, p, acc_dtype), p);
        kiln_tensor_drop(g);
        if (!acc) return kiln_error_last()->status;
    }
    if (!isinf(p)) {
        kiln_tensor *t = kiln_pow_scalar(acc, 1.0 / p);
        kiln_tensor_drop(acc);
        if (!t) return kiln_error_last()->status;
        acc = t;
    }
    kiln_status st = kiln_item(acc, total);
    kiln_tensor_drop(acc);
    KILN_TRY(st);
    double coef = max_norm / (*total + 1e-6);
    if (!(coef < 1.0)) return KILN_OK; /* PyTorch multiplies by min(coef, 1): 1 changes nothing */
    for (int i = 0; i < n; i++) {
        kiln_tensor *g = kiln_grad(params[i]);
        if (!g) continue;
        kiln_tensor *s = kiln_mul_scalar(g, coef);
        st = s ? kiln_copy_(g, s, 0) : kiln_error_last()->status;
        kiln_tensor_drop(s);
        kiln_tensor_drop(g);
        KILN_TRY(st);
    }
    return KILN_OK;
}

double kiln_clip_grad_norm(kiln_tensor *const *params, int n, double max_norm, double norm_type) {
    if (n < 0 || (n > 0 && !params) || !(max_norm >= 0) || !(norm_type >= 1)) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "norm_type >= 1 (2 or INFINITY usually), max_norm >= 0",
                   "kiln_clip_grad_norm: %d tensors, max_norm %g, norm_type %g", n, max_norm, norm_type);
        return -1.0;
    }
    double total = 0.0;
    kiln_api_enter();
    kiln_no_grad_begin();
    kiln_status st = clip_body(params, n, max_norm, norm_type, &total);
    kiln_grad_mode_end();
    kiln_api_leave();
    return st ? -1.0 : total;
}

/* kiln_accumulate_backward: the forward/backward half of a step with
 * gradient accumulation over micro-batches (kiln/optim.h). One function
 * for `kiln train --accum` and for the tests that hold it to the
 * full-batch gradient. */
#include "base/error.h"
#include "kiln/amp.h"
#include "kiln/autograd.h"
#include "kiln/nn.h"
#include "kiln/optim.h"
#include "tensor/scope.h"
#include "tensor/tensor_internal.h"

/* Micro-batch [lo, hi): forward, weighted loss, backward. *sum (a detached
 * running total of the weighted losses, or NULL) is replaced. */
static kiln_status micro_step(kiln_module *m, kiln_tensor *x, kiln_tensor *y, int64_t lo, int64_t hi, int64_t b,
                              const kiln_loss_opts *opts, kiln_grad_scaler *scaler, kiln_tensor **sum,
                              kiln_tensor **correct) {
    bool whole = lo == 0 && hi == b;
    kiln_tensor *xs = whole ? kiln_retain(x) : kiln_narrow(x, 0, lo, hi - lo);
    kiln_tensor *ys = whole ? kiln_retain(y) : kiln_narrow(y, 0, lo, hi - lo);
    kiln_tensor *logits = xs && ys ? kiln_module_forward(m, xs) : NULL;
    kiln_tensor *l = logits ? kiln_cross_entropy(logits, ys, opts) : NULL;
    kiln_tensor *scaled = l && !whole ? kiln_mul_scalar(l, (double)(hi - lo) / (double)b) : l ? kiln_retain(l) : NULL;
    /* With a loss scaler, backward starts from the scaled loss; the sum stays unscaled. */
    kiln_tensor *root = scaled && scaler ? kiln_grad_scaler_scale(scaler, scaled) : scaled ? kiln_retain(scaled) : NULL;
    kiln_status st = root ? kiln_backward(root, NULL, false) : kiln_error_last()->status;
    if (root) kiln_tensor_drop(root);
    if (st == KILN_OK && sum) {
        kiln_tensor *d = kiln_detach(scaled);
        kiln_tensor *total = !d ? NULL : *sum ? kiln_add(*sum, d) : kiln_retain(d);
        if (!total) st = kiln_error_last()->status;
        kiln_tensor_drop(d);
        kiln_tensor_drop(*sum);
        *sum = total;
    }
    if (st == KILN_OK && correct) {
        kiln_no_grad_begin();
        kiln_tensor *am = kiln_argmax(logits, 1, false);
        kiln_tensor *hit = am ? kiln_eq(am, ys) : NULL;
        kiln_tensor *n = hit ? kiln_sum(hit, 0, NULL, false) : NULL;
        kiln_tensor *total = !n ? NULL : *correct ? kiln_add(*correct, n) : kiln_retain(n);
        kiln_grad_mode_end();
        if (!total) st = kiln_error_last()->status;
        kiln_tensor_drop(am);
        kiln_tensor_drop(hit);
        kiln_tensor_drop(n);
        kiln_tensor_drop(*correct);
        *correct = total;
    }
    kiln_tensor_drop(scaled);
    kiln_tensor_drop(l);
    kiln_tensor_drop(logits);
    kiln_tensor_drop(ys);
    kiln_tensor_drop(xs);
    return st;
}

kiln_status kiln_accumulate_backward(kiln_module *m, kiln_tensor *x, kiln_tensor *y, int micro_batches,
                                     const kiln_loss_opts *opts, kiln_tensor **loss, kiln_tensor **correct) {
    return kiln_accumulate_backward_scaled(m, x, y, micro_batches, opts, NULL, loss, correct);
}

kiln_status kiln_accumulate_backward_scaled(kiln_module *m, kiln_tensor *x, kiln_tensor *y, int micro_batches,
                                            const kiln_loss_opts *opts, kiln_grad_scaler *scaler, kiln_tensor **loss,
                                            kiln_tensor **correct) {
    if (loss) *loss = NULL;
    if (correct) *correct = NULL;
    if (!m || !x || !y)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_accumulate_backward: NULL module, x or y");
    kiln_loss_opts lo = opts ? *opts : kiln_loss_defaults();
    if (lo.reduction != KILN_LOSS_MEAN)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use the mean reduction (kiln_loss_defaults)",
                          "kiln_accumulate_backward: the loss reduction must be mean");
    int64_t b = kiln_numel(x) ? kiln_size(x, 0) : 0;
    if (b < 1 || kiln_size(y, 0) != b)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL,
                          "kiln_accumulate_backward: x and y need the same batch size >= 1 (x %lld, y %lld)",
                          (long long)b, (long long)kiln_size(y, 0));
    int64_t parts = micro_batches < 1 ? 1 : micro_batches > b ? b : micro_batches;
    kiln_api_enter();
    kiln_tensor *sum = NULL, *hits = NULL;
    kiln_status st = KILN_OK;
    for (int64_t k = 0; k < parts && st == KILN_OK; k++)
        st = micro_step(m, x, y, b * k / parts, b * (k + 1) / parts, b, &lo, scaler, loss ? &sum : NULL,
                        correct ? &hits : NULL);
    if (st != KILN_OK) {
        kiln_tensor_drop(sum);
        kiln_tensor_drop(hits);
        kiln_api_leave();
        return st;
    }
    /* Hand each result to the caller's scope: kiln_api_return registers
     * it when the depth comes back to 0. */
    kiln_api_leave();
    if (loss) {
        kiln_api_enter();
        *loss = kiln_api_return(sum);
        if (!*loss) st = kiln_error_last()->status;
    }
    if (correct) {
        kiln_api_enter();
        *correct = kiln_api_return(hits);
        if (!*correct) st = kiln_error_last()->status;
    }
    return st;
}

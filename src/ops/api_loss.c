/* Public loss functions (include/kiln/ops.h): nll_loss and mse_loss go
 * through the dispatcher; cross_entropy is log_softmax over the class dim
 * followed by nll_loss (which applies the label smoothing). */
#include "base/error.h"
#include "kiln/ops.h"
#include "ops/op_registry.h"
#include "tensor/scope.h"
#include "tensor/tensor_internal.h"

kiln_loss_opts kiln_loss_defaults(void) {
    kiln_loss_opts o = {.reduction = KILN_LOSS_MEAN,
                        .has_ignore_index = true,
                        .ignore_index = KILN_LOSS_IGNORE_INDEX_DEFAULT,
                        .label_smoothing = 0,
                        .weight = NULL};
    return o;
}

/* The public enum and the kernels' enum are mapped by name, not by value. */
static bool map_reduction(const char *fn, kiln_loss_reduction r, kiln_reduction *out) {
    switch (r) {
    case KILN_LOSS_MEAN:
        *out = KILN_REDUCTION_MEAN;
        return true;
    case KILN_LOSS_SUM:
        *out = KILN_REDUCTION_SUM;
        return true;
    case KILN_LOSS_NONE:
        *out = KILN_REDUCTION_NONE;
        return true;
    }
    KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use KILN_LOSS_MEAN, KILN_LOSS_SUM or KILN_LOSS_NONE",
               "%s: unknown reduction %d", fn, (int)r);
    return false;
}

static kiln_tensor *nll(const char *fn, kiln_tensor *log_probs, kiln_tensor *target,
                        const kiln_loss_opts *opts) {
    kiln_loss_opts o = opts ? *opts : kiln_loss_defaults();
    kiln_op_attrs at = {.ignore_index = o.has_ignore_index ? o.ignore_index : KILN_LOSS_IGNORE_INDEX_DEFAULT,
                        .label_smoothing = o.label_smoothing};
    if (!map_reduction(fn, o.reduction, &at.reduction)) return NULL;
    return kiln_dispatch_public(KILN_OP_NLL_LOSS, 3, (kiln_tensor *[]){log_probs, target, o.weight}, &at,
                                NULL);
}

kiln_tensor *(kiln_nll_loss)(kiln_tensor *log_probs, kiln_tensor *target, const kiln_loss_opts *opts) {
    return nll("kiln_nll_loss", log_probs, target, opts);
}

kiln_tensor *(kiln_cross_entropy)(kiln_tensor *logits, kiln_tensor *target, const kiln_loss_opts *opts) {
    kiln_api_enter();
    if (kiln_tensor_check(logits, "kiln_cross_entropy")) return kiln_api_return(NULL);
    /* Class dim 1 for (N, C, d...), 0 for an unbatched (C) input. */
    kiln_tensor *lp = kiln_log_softmax(logits, kiln_ndim(logits) == 1 ? 0 : 1);
    if (!lp) return kiln_api_return(NULL);
    kiln_tensor *loss = nll("kiln_cross_entropy", lp, target, opts);
    kiln_tensor_drop(lp);
    return kiln_api_return(loss);
}

kiln_tensor *(kiln_mse_loss)(kiln_tensor *input, kiln_tensor *target, kiln_loss_reduction reduction) {
    kiln_op_attrs at = {0};
    if (!map_reduction("kiln_mse_loss", reduction, &at.reduction)) return NULL;
    return kiln_dispatch_public(KILN_OP_MSE_LOSS, 2, (kiln_tensor *[]){input, target}, &at, NULL);
}

/* The dataset interface and its two built-in kinds: the image sets the file
 * readers decode (one buffer, read-only after open) and the in-memory
 * tensor dataset. Every kind is a table of callbacks, so the loader sees
 * one shape whatever the data is, and `get` of the built-in kinds only
 * reads memory nobody writes after creation: it is safe from any number
 * of threads without a lock. */
#include <stdlib.h>
#include <string.h>

#include "base/checked.h"
#include "base/error.h"
#include "data/readers.h"
#include "tensor/scope.h"
#include "tensor/tensor_internal.h"

struct kiln_dataset {
    kiln_dataset_ops ops;
    void *ctx;
    kiln_sample_info info;
};

size_t kiln_sample_bytes(kiln_sample_info info) {
    if (info.channels <= 0 || info.height <= 0 || info.width <= 0 || (unsigned)info.dtype >= KILN_DTYPE_COUNT)
        return 0;
    size_t n;
    if (!kiln_checked_mul_size((size_t)info.channels, (size_t)info.height, &n) ||
        !kiln_checked_mul_size(n, (size_t)info.width, &n) ||
        !kiln_checked_mul_size(n, kiln_dtype_size(info.dtype), &n))
        return 0;
    return n;
}

kiln_status kiln_dataset_create(const kiln_dataset_ops *ops, void *ctx, kiln_sample_info info,
                                kiln_dataset **out) {
    if (!out) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_dataset_create: out is NULL");
    *out = NULL;
    if (!ops || !ops->length || !ops->get)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                          "fill in ops->length and ops->get (ops->free may be NULL)",
                          "kiln_dataset_create: %s", !ops ? "ops is NULL" : "a required callback is NULL");
    if (kiln_sample_bytes(info) == 0)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "channels, height and width must be at least 1",
                          "kiln_dataset_create: sample of %d x %d x %d %s is not a valid shape",
                          info.channels, info.height, info.width,
                          (unsigned)info.dtype < KILN_DTYPE_COUNT ? kiln_dtype_name(info.dtype)
                                                                  : "(bad dtype)");
    if (info.num_classes < 1)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "labels are in [0, num_classes): use at least 1",
                          "kiln_dataset_create: num_classes %d", info.num_classes);
    kiln_dataset *ds = KILN_CALLOC(1, sizeof *ds);
    if (!ds) return KILN_ERR_OUT_OF_MEMORY;
    ds->ops = *ops;
    ds->ctx = ctx;
    ds->info = info;
    *out = ds;
    return KILN_OK;
}

void kiln_dataset_free(kiln_dataset *ds) {
    if (!ds) return;
    if (ds->ops.free) ds->ops.free(ds->ctx);
    free(ds);
}

int64_t kiln_dataset_length(const kiln_dataset *ds) { return ds ? ds->ops.length(ds->ctx) : 0; }

kiln_sample_info kiln_dataset_info(const kiln_dataset *ds) {
    if (ds) return ds->info;
    kiln_sample_info none;
    memset(&none, 0, sizeof none);
    return none;
}

kiln_status kiln_dataset_get(const kiln_dataset *ds, int64_t index, void *dst, int64_t *label) {
    if (!ds || !dst)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_dataset_get: %s is NULL", ds ? "dst" : "ds");
    int64_t n = ds->ops.length(ds->ctx);
    if (index < 0 || index >= n)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL,
                          "kiln_dataset_get: index %lld is out of range for a dataset of %lld samples",
                          (long long)index, (long long)n);
    int64_t scratch = -1;
    int64_t *lab = label ? label : &scratch;
    KILN_TRY(ds->ops.get(ds->ctx, index, dst, lab));
    if (*lab < 0 || *lab >= ds->info.num_classes)
        return KILN_RAISE(KILN_ERR_STATE, "the dataset's get callback must return labels in [0, num_classes)",
                          "kiln_dataset_get: sample %lld has label %lld: expected 0..%d", (long long)index,
                          (long long)*lab, ds->info.num_classes - 1);
    return KILN_OK;
}

/* ---- Image sets (what the file readers decode) ------------------------------- */

void kiln_image_set_free(kiln_image_set *set) {
    if (!set) return;
    free(set->buffer);
    memset(set, 0, sizeof *set);
}

static int64_t image_set_length(void *ctx) { return ((const kiln_image_set *)ctx)->count; }

static kiln_status image_set_get(void *ctx, int64_t index, void *dst, int64_t *label) {
    const kiln_image_set *s = ctx;
    size_t bytes = (size_t)s->channels * (size_t)s->height * (size_t)s->width;
    memcpy(dst, s->images + (size_t)index * bytes, bytes);
    *label = s->labels[index];
    return KILN_OK;
}

static void image_set_free(void *ctx) {
    kiln_image_set_free(ctx);
    free(ctx);
}

kiln_status kiln_dataset_from_image_set(kiln_image_set *set, kiln_dataset **out) {
    static const kiln_dataset_ops ops = {image_set_length, image_set_get, image_set_free};
    kiln_image_set *held = KILN_MALLOC(sizeof *held);
    if (!held) {
        kiln_image_set_free(set);
        return KILN_ERR_OUT_OF_MEMORY;
    }
    *held = *set;
    memset(set, 0, sizeof *set);
    kiln_sample_info info = {KILN_U8, held->channels, held->height, held->width, held->num_classes};
    kiln_status st = kiln_dataset_create(&ops, held, info, out);
    if (st != KILN_OK) image_set_free(held);
    return st;
}

/* ---- The in-memory tensor dataset --------------------------------------------- */

typedef struct tensor_dataset {
    kiln_tensor *data;   /* (N, C, H, W), contiguous CPU; our reference */
    kiln_tensor *labels; /* (N) i64 CPU; our reference */
    size_t sample_bytes;
} tensor_dataset;

static int64_t tensor_dataset_length(void *ctx) { return kiln_size(((const tensor_dataset *)ctx)->data, 0); }

static kiln_status tensor_dataset_get(void *ctx, int64_t index, void *dst, int64_t *label) {
    const tensor_dataset *t = ctx;
    memcpy(dst, (const char *)kiln_data_ptr(t->data) + (size_t)index * t->sample_bytes, t->sample_bytes);
    *label = ((const int64_t *)kiln_data_ptr(t->labels))[index * kiln_stride(t->labels, 0)];
    return KILN_OK;
}

static void tensor_dataset_free(void *ctx) {
    tensor_dataset *t = ctx;
    if (!t) return;
    kiln_tensor_drop(t->data);
    kiln_tensor_drop(t->labels);
    free(t);
}

/* Argument checks for kiln_dataset_from_tensors; fills the sample shape. */
static kiln_status tensor_dataset_check(kiln_tensor *data, kiln_tensor *labels, int num_classes,
                                        kiln_sample_info *info) {
    static const char fn[] = "kiln_dataset_from_tensors";
    KILN_TRY(kiln_tensor_check(data, fn));
    KILN_TRY(kiln_tensor_check(labels, fn));
    if (kiln_get_device(data).type != KILN_DEVICE_CPU || kiln_get_device(labels).type != KILN_DEVICE_CPU ||
        kiln_layout_of(data) != KILN_LAYOUT_STRIDED || kiln_layout_of(labels) != KILN_LAYOUT_STRIDED)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "move them with kiln_to(t, KILN_CPU, dtype, 0)",
                          "%s: data and labels must be strided CPU tensors", fn);
    int nd = kiln_ndim(data);
    if (nd < 2 || nd > 4 || kiln_numel(data) == 0)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass data shaped (N, C, H, W), (N, H, W) or (N, D)",
                          "%s: data has %d dimensions and %lld elements", fn, nd,
                          (long long)kiln_numel(data));
    if (kiln_ndim(labels) != 1 || kiln_dtype_of(labels) != KILN_I64 ||
        kiln_size(labels, 0) != kiln_size(data, 0))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass labels as an i64 tensor of shape (N)",
                          "%s: labels must be 1-D i64 with %lld entries (one per sample)", fn,
                          (long long)kiln_size(data, 0));
    if (num_classes < 1)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "%s: num_classes %d: expected at least 1", fn,
                          num_classes);
    const int64_t *l = kiln_data_ptr(labels);
    int64_t stride = kiln_stride(labels, 0);
    for (int64_t i = 0; i < kiln_size(labels, 0); i++)
        if (l[i * stride] < 0 || l[i * stride] >= num_classes)
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "%s: labels[%lld] is %lld: expected 0..%d", fn,
                              (long long)i, (long long)l[i * stride], num_classes - 1);
    /* (N, D) is D channels of 1x1; (N, H, W) one channel. */
    info->dtype = kiln_dtype_of(data);
    info->channels = nd == 4 ? (int)kiln_size(data, 1) : nd == 2 ? (int)kiln_size(data, 1) : 1;
    info->height = nd == 2 ? 1 : (int)kiln_size(data, nd - 2);
    info->width = nd == 2 ? 1 : (int)kiln_size(data, nd - 1);
    info->num_classes = num_classes;
    return KILN_OK;
}

kiln_status kiln_dataset_from_tensors(kiln_tensor *data, kiln_tensor *labels, int num_classes,
                                      kiln_dataset **out) {
    if (!out) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_dataset_from_tensors: out is NULL");
    *out = NULL;
    kiln_sample_info info;
    KILN_TRY(tensor_dataset_check(data, labels, num_classes, &info));
    tensor_dataset *t = KILN_CALLOC(1, sizeof *t);
    if (!t) return KILN_ERR_OUT_OF_MEMORY;
    /* A strided view becomes one contiguous copy here, so get is a memcpy.
     * Entered as a library call: the copy must not join the user's scope. */
    kiln_api_enter();
    t->data = kiln_is_contiguous(data) ? kiln_retain(data) : kiln_contiguous(data);
    t->labels = kiln_retain(labels);
    kiln_api_leave();
    t->sample_bytes = kiln_sample_bytes(info);
    if (!t->data || !t->labels) {
        tensor_dataset_free(t);
        return kiln_error_last()->status != KILN_OK ? kiln_error_last()->status : KILN_ERR_INTERNAL;
    }
    kiln_dataset_ops ops = {tensor_dataset_length, tensor_dataset_get, tensor_dataset_free};
    kiln_status st = kiln_dataset_create(&ops, t, info, out);
    if (st != KILN_OK) tensor_dataset_free(t);
    return st;
}

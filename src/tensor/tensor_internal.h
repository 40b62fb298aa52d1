/* The tensor layer's internals, shared by its files and by the layers above
 * (ops, autograd): the storage and tensor records, shape helpers, the
 * bridge to kernels, and reference dropping that never touches scopes. */
#ifndef KILN_SRC_TENSOR_TENSOR_INTERNAL_H
#define KILN_SRC_TENSOR_TENSOR_INTERNAL_H

#include <stdatomic.h>

#include "kernels/kernels.h"
#include "kernels/op_args.h"
#include "kiln/tensor.h"

/* Bytes of one device's memory, shared by every view of it. The version
 * counter lives here, so all views of a storage see each other's writes. */
typedef struct kiln_storage {
    atomic_int refcount;
    kiln_device device;
    void *base; /* NULL when nbytes is 0; a fake address on meta */
    size_t nbytes;
    kiln_stream *stream; /* the stream the block was allocated on */
    bool pinned;         /* from kiln_pinned_alloc, freed with kiln_pinned_free */
    atomic_uint_fast64_t version;
    /* How the bytes are arranged (kiln/tensor.h). An opaque layout lives on
     * the storage, not the handle: every handle on a storage in an opaque
     * layout has the full contiguous geometry (any other view converts the
     * storage to strided first), so a conversion is seen by all of them. */
    kiln_layout layout;
    /* Kernels' prepared copies of this storage's values (kernels/op_args.h,
     * kiln_op_prepare), freed with it. */
    struct kiln_prepared *prepared;
} kiln_storage;

#define KILN_TENSOR_MAGIC 0x4B494C4EU /* "KILN" */
#define KILN_TENSOR_DEAD  0xDEADBEEFU /* written just before the record is freed */

struct kiln_tensor {
    uint32_t magic;
    atomic_int refcount;
    kiln_storage *storage;
    kiln_dtype dtype;
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    int64_t strides[KILN_MAX_DIMS]; /* in elements */
    int64_t offset;                 /* in elements, from storage->base */
    /* Owned by the autograd layer (NULL until it attaches something); freed
     * through the hook below when the tensor dies. */
    void *autograd;
    bool requires_grad;
};

/* ---- Shapes ------------------------------------------------------------------------ */

/* "[2, 3]" ("[]" for a scalar) into buf; returns buf. */
const char *kiln_shape_format(int ndim, const int64_t *d, char *buf, size_t size);
/* Check ndim in 0..KILN_MAX_DIMS, sizes >= 0, and that numel * elemsize
 * fits in int64. Errors name `fn`, the shape and the way out. */
kiln_status kiln_shape_check(const char *fn, kiln_shape shape, kiln_dtype dtype, int64_t *numel);
/* Row-major strides of a shape (size-0 and size-1 dims get the stride a
 * contiguous tensor would have with them counted as 1). */
void kiln_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides);
/* Wrap a possibly negative dim into [0, ndim); false when out of range. */
bool kiln_wrap_dim(int dim, int ndim, int *out);

/* ---- Records ----------------------------------------------------------------------- */

/* Validates a tensor argument (NULL, magic, and in debug builds that the
 * handle is live), raising an error that names `fn`. */
kiln_status kiln_tensor_check(const kiln_tensor *t, const char *fn);
/* A new contiguous tensor with fresh, uninitialised storage on `device`.
 * Never registers with a scope. pinned: CPU memory from the pinned pool. */
kiln_tensor *kiln_tensor_alloc(const char *fn, kiln_shape shape, kiln_dtype dtype, kiln_device device,
                               bool pinned);
/* A new handle on t's storage with the given geometry. Never registers. */
kiln_tensor *kiln_tensor_alias(kiln_tensor *t, int ndim, const int64_t *shape, const int64_t *strides,
                               int64_t offset);
/* Drop one reference without looking at scopes: how library code releases
 * the references it holds (see scope.h). */
kiln_status kiln_tensor_drop(kiln_tensor *t);
/* True when the caller's reference is the only way to reach t's values:
 * one reference to t, one to its storage (nothing saved it for backward,
 * no view or prepared copy shares it). */
static inline bool kiln_tensor_sole_owner(const kiln_tensor *t) {
    return atomic_load(&t->refcount) == 1 && atomic_load(&t->storage->refcount) == 1;
}
/* Mark an in-place write to t's storage. */
void kiln_tensor_bump_version(kiln_tensor *t);
/* Exchange the data of a and b (storage, dtype, shape, strides, offset),
 * keeping each handle's identity, references and autograd record: how
 * kiln_module_to moves a parameter in place, as PyTorch's `param.data =`,
 * so an optimizer created before the move keeps working. */
void kiln_tensor_swap_data(kiln_tensor *a, kiln_tensor *b);
/* The kernel-side description of t into *out (data pointer with the offset
 * applied; NULL data on meta), always strided: a tensor in an opaque layout
 * is converted first (kiln_tensor_ensure_strided). The conversion allocates
 * a new block, so it can fail (out of memory): the error is set and
 * returned, *out is left as it was. */
kiln_status kiln_tensor_strided(const kiln_tensor *t, kiln_strided *out);
/* The description as it is, opaque layout included (the dispatcher's view
 * for kernels that declare they take opaque layouts). */
kiln_strided kiln_tensor_kernel_view(const kiln_tensor *t);
/* Converts t's storage to the strided layout in place (a new block from
 * the caching allocator, the reorder, the old block freed), keeping the
 * values and the version counter. No-op when it is strided already. Not
 * thread-safe against other users of the same tensor (no tensor is). */
kiln_status kiln_tensor_ensure_strided(const kiln_tensor *t);
/* The prepared copy `key` of t's values (kernels/op_args.h,
 * kiln_op_prepare): `bytes` from the caching allocator of t's device, kept
 * with t's storage and freed with it. fill(ctx, dst) runs when the copy is
 * new or t's storage has been written since it was last filled. *out is
 * the copy. A lazy copy (kiln_op_prepare.lazy) is filled only when the
 * previous call saw the same version; *out is NULL until then (its block,
 * once made, is kept for the next fill). */
kiln_status kiln_tensor_prepared(const kiln_tensor *t, uint64_t key, size_t bytes, bool lazy,
                                 kiln_status (*fill)(void *ctx, void *dst), void *ctx, void **out);
/* How many times kiln_tensor_prepared has filled a copy in this process
 * (for tests: a weight the optimizer moves between calls refills no lazy copy). */
int64_t kiln_tensor_prepared_fills(void);
/* Marks a freshly allocated, contiguous result as holding `layout` (the
 * dispatcher, for kernels that chose one). */
void kiln_tensor_set_layout(kiln_tensor *t, kiln_layout layout);
/* The backend handle of the current stream of `device`, for kernels; NULL
 * with an error when the device is unavailable. */
kiln_status kiln_tensor_kernel_stream(kiln_device device, void **handle);

/* Called with a dying tensor whose `autograd` is not NULL; the autograd
 * layer registers it at kiln_init. NULL: nothing to free. */
typedef void (*kiln_autograd_free_hook)(kiln_tensor *t);
void kiln_tensor_set_autograd_free_hook(kiln_autograd_free_hook hook);

/* Views and dense copies made by the tensor layer's public functions are
 * reported to autograd through this hook, so gradients flow through them.
 * `out` is a fresh result; the hook returns it (possibly with a node
 * attached) or NULL with an error (out dropped). attrs: VIEW - (none, the
 * input's shape is in the node), PERMUTE - dims, NARROW - dims[0] and
 * ints[0] (start), EXPAND/COPY - none. */
typedef enum kiln_view_kind {
    KILN_VIEW_KIND_VIEW = 0,
    KILN_VIEW_KIND_PERMUTE,
    KILN_VIEW_KIND_NARROW,
    KILN_VIEW_KIND_EXPAND,
    KILN_VIEW_KIND_COPY,
} kiln_view_kind;
typedef kiln_tensor *(*kiln_view_hook)(kiln_view_kind kind, kiln_tensor *in, kiln_tensor *out,
                                        const kiln_op_attrs *attrs);
void kiln_tensor_set_view_hook(kiln_view_hook hook);
/* `out`, a copy of `in` (another device, another dtype, or a clone),
 * reported to autograd as KILN_VIEW_KIND_COPY: its backward returns the
 * gradient to in's device and dtype. Consumes `out` (NULL on error). */
kiln_tensor *kiln_tensor_recorded_copy(kiln_tensor *in, kiln_tensor *out);

/* ---- Debug handle tracking (handles.c) -------------------------------------------
 * In KILN_DEBUG_HANDLES builds every live tensor record is in a set, so a
 * release of a dead handle is detected without touching its memory. In
 * other builds these are no-ops and kiln_handle_is_live returns true. */
kiln_status kiln_handle_add(const kiln_tensor *t);
void kiln_handle_remove(const kiln_tensor *t);
bool kiln_handle_is_live(const kiln_tensor *t);
/* Tensors alive right now (debug builds; -1 otherwise). */
int64_t kiln_handle_live_count(void);
/* Frees the set (kiln_shutdown). */
void kiln_handles_shutdown(void);

/* Called by kiln_shutdown: frees the tensor layer's process-wide state. */
void kiln_tensor_layer_shutdown(void);

#endif

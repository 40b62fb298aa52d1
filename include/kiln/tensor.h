/* Kiln tensors: dtypes, shapes and strides, views, creation, copies, scopes.
 *
 * Ownership: every function returning `kiln_tensor *` returns a NEW
 * reference that the caller releases with kiln_release (or leaves to the
 * enclosing scope, see kiln_scope_begin). NULL means failure; the reason is
 * in kiln_error_last(). Functions taking a `const kiln_tensor *` or
 * `kiln_tensor *` borrow it.
 *
 * Synchronisation: creation, views and device-side copies are queued on the
 * current stream of the tensor's device and do not block the host, unless a
 * comment says so. Copies to or from host memory that is not pinned block
 * (they are synchronous, as in CUDA). */
#ifndef KILN_TENSOR_H
#define KILN_TENSOR_H

#include "kiln/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kiln_dtype {
    KILN_F32 = 0,
    KILN_F16,
    KILN_BF16,
    KILN_F64,
    KILN_I32,
    KILN_I64,
    KILN_U8,
    KILN_BOOL,
    KILN_DTYPE_COUNT
} kiln_dtype;

/* Bytes per element; 0 for an invalid dtype. */
size_t kiln_dtype_size(kiln_dtype dtype);
/* "f32", "f16", ...; "invalid" for a bad value. */
const char *kiln_dtype_name(kiln_dtype dtype);
/* Parse "f32"/"float32"/"float", "f16"/"float16"/"half", "bf16"/"bfloat16",
 * "f64"/"float64"/"double", "i32"/"int32"/"int", "i64"/"int64"/"long",
 * "u8"/"uint8", "bool". */
kiln_status kiln_dtype_parse(const char *text, kiln_dtype *out);
bool kiln_dtype_is_floating(kiln_dtype dtype);

/* How a tensor's bytes are arranged. Users always see `strided`: shape and
 * strides mean what they say. The fast CPU backend may give an op's result
 * an opaque layout, so that consecutive layers pass it on without
 * reordering; such a tensor converts itself to `strided` (once, in place,
 * keeping its values and version) as soon as anything needs the strided
 * form: a view, kiln_data_ptr, a copy to another device or dtype, saving,
 * or an op whose kernel does not take the layout. kiln_layout_of says
 * which layout a tensor is in right now; kiln_set_cpu_layouts turns the
 * opaque layouts off. */
typedef enum kiln_layout {
    KILN_LAYOUT_STRIDED = 0, /* shape + strides, what users see */
    /* oneDNN's nChw16c: a 4-D f32 (N, C, H, W) with C a multiple of 16,
     * stored as (N, C/16, H, W, 16). Same bytes as the strided tensor. */
    KILN_LAYOUT_NCHW16C,
    /* oneDNN's nChw8c, what its AVX2 convolutions take: C a multiple of 8,
     * stored as (N, C/8, H, W, 8). */
    KILN_LAYOUT_NCHW8C,
    KILN_LAYOUT_COUNT
} kiln_layout;

/* "strided", "nChw16c"; "invalid" for a bad value. */
const char *kiln_layout_name(kiln_layout layout);

#define KILN_MAX_DIMS 8

typedef struct kiln_shape {
    int ndim;
    int64_t d[KILN_MAX_DIMS];
} kiln_shape;

/* KILN_SHAPE(2, 3) is a 2x3 shape; KILN_SHAPE() a scalar (0-dim) shape. */
#define KILN_SHAPE(...)                                                                        \
    ((kiln_shape){.ndim = (int)(sizeof((int64_t[]){0, ##__VA_ARGS__}) / sizeof(int64_t)) - 1, \
                  .d = {__VA_ARGS__}})

typedef struct kiln_tensor kiln_tensor;

/* ---- Creation (new references) -------------------------------------------- */

/* Uninitialised contiguous tensor from the device's caching allocator, on
 * the device's current stream. Zero-size shapes are valid and allocate
 * nothing; meta tensors get simulated memory (statistics, no data).
 * Errors: negative sizes, ndim outside 0..8, numel * dtype size past 2^63
 * bytes (KILN_ERR_INVALID_ARGUMENT); a missing device (KILN_ERR_DEVICE);
 * out of memory (KILN_ERR_OUT_OF_MEMORY). The same holds for every
 * creation function below. */
kiln_tensor *kiln_empty(kiln_shape shape, kiln_dtype dtype, kiln_device device);
kiln_tensor *kiln_zeros(kiln_shape shape, kiln_dtype dtype, kiln_device device);
kiln_tensor *kiln_ones(kiln_shape shape, kiln_dtype dtype, kiln_device device);
kiln_tensor *kiln_full(kiln_shape shape, double value, kiln_dtype dtype, kiln_device device);
/* 1-D [start, end) with `step` (numel = ceil((end-start)/step)). */
kiln_tensor *kiln_arange(double start, double end, double step, kiln_dtype dtype,
                         kiln_device device);
/* Uniform [0,1) and standard normal, drawn from the device's generator
 * (kiln_manual_seed): the same values on every backend. Floating dtypes.
 * Values are drawn in f32 and converted; an f16/bf16 uniform that would
 * round up to 1.0 becomes the largest value below 1. */
kiln_tensor *kiln_rand(kiln_shape shape, kiln_dtype dtype, kiln_device device);
kiln_tensor *kiln_randn(kiln_shape shape, kiln_dtype dtype, kiln_device device);
/* Copy `numel * dtype size` bytes of contiguous host data into a new tensor.
 * Blocks until the data has been read (the caller may reuse `data`). */
kiln_tensor *kiln_from_data(kiln_shape shape, kiln_dtype dtype, kiln_device device,
                            const void *data);
/* Pinned CPU tensor (page-locked when CUDA is present): the source of
 * asynchronous host-to-device copies. */
kiln_tensor *kiln_empty_pinned(kiln_shape shape, kiln_dtype dtype);
/* Variants that take dtype and device from `like`. */
kiln_tensor *kiln_new_empty(const kiln_tensor *like, kiln_shape shape);
kiln_tensor *kiln_new_zeros(const kiln_tensor *like, kiln_shape shape);
kiln_tensor *kiln_new_ones(const kiln_tensor *like, kiln_shape shape);
kiln_tensor *kiln_new_full(const kiln_tensor *like, kiln_shape shape, double value);

/* Seed every device's generator (per-device streams are split from it). */
void kiln_manual_seed(uint64_t seed);

/* Call sites. kiln_site_mark records the caller's file:line for the public
 * call it brackets, kiln_site_done (given that call's result, returned as
 * is) ends the bracket: the public headers' macros expand `kiln_add(a, b)`
 * to `(kiln_site_mark(__FILE__, __LINE__), kiln_site_done(kiln_add(a, b)))`.
 * An outermost public call on this thread takes the innermost bracket still
 * open as its site, so in `kiln_sum(kiln_module_forward(m, x), ...)` each
 * call gets its own line, and a call without a macro inside another's
 * arguments gets the enclosing call's line. Both are ignored inside the
 * library (a user's callback run by it keeps the user's outer site).
 * Autograd nodes, the memory history and anomaly reports store the site so
 * diagnostics can name the user's line. Neither call blocks or fails. */
void kiln_site_mark(const char *file, int line);
kiln_tensor *kiln_site_done(kiln_tensor *result);

/* ---- References ---------------------------------------------------------------- */

/* A new reference to the same tensor. Never registered with a scope: the
 * caller owns it (this is how holders keep a tensor past a scope). NULL if
 * t is NULL or not live. */
kiln_tensor *kiln_retain(kiln_tensor *t);
/* Drop one reference (the C form of `del`). If it was registered with a
 * scope it is unregistered (one registration of this handle, innermost
 * scope first), so the scope does not release it again. Releasing NULL is
 * a no-op. Releasing a dead tensor is reported as KILN_ERR_STATE without
 * touching memory in debug and sanitizer builds (kiln_debug_handles());
 * release builds check a magic word, which catches most double releases
 * but is not guaranteed to. */
kiln_status kiln_release(kiln_tensor *t);

/* ---- Scopes ----------------------------------------------------------------------- */

/* Open a scope on this thread. Until the matching kiln_scope_end, every
 * reference returned to the user by an outermost public call is owned by
 * the scope and released at its end. Calls the library makes internally
 * never register, nor do kiln_retain and kiln_keep. Scopes nest and are
 * per thread: release a scoped tensor on the thread that owns the scope. */
void kiln_scope_begin(void);
/* Release the references the innermost scope owns. Fails with
 * KILN_ERR_STATE if no scope is open. */
kiln_status kiln_scope_end(void);
/* Move one reference to `t` from the innermost scope to the enclosing one
 * (or to the caller if there is none). A t the innermost scope does not
 * hold is left alone. Returns t. */
kiln_tensor *kiln_keep(kiln_tensor *t);
/* Depth of this thread's scope stack. */
int kiln_scope_depth(void);

/* ---- Properties (borrowed tensor, no blocking) ------------------------------
 * A NULL tensor gives 0 / false / NULL (kiln_dtype_of: KILN_DTYPE_COUNT). */

int kiln_ndim(const kiln_tensor *t);
/* Size of dim (negative counts from the end); -1 on a bad dim. */
int64_t kiln_size(const kiln_tensor *t, int dim);
/* Stride of dim in elements; -1 on a bad dim. */
int64_t kiln_stride(const kiln_tensor *t, int dim);
kiln_shape kiln_shape_of(const kiln_tensor *t);
int64_t kiln_numel(const kiln_tensor *t);
kiln_dtype kiln_dtype_of(const kiln_tensor *t);
kiln_layout kiln_layout_of(const kiln_tensor *t);
kiln_device kiln_get_device(const kiln_tensor *t);
int64_t kiln_storage_offset(const kiln_tensor *t);
bool kiln_is_contiguous(const kiln_tensor *t);
bool kiln_is_pinned(const kiln_tensor *t);
/* True when a and b share storage. */
bool kiln_shares_storage(const kiln_tensor *a, const kiln_tensor *b);
/* Version counter of the storage (bumped by every in-place write). */
uint64_t kiln_tensor_version(const kiln_tensor *t);
/* Device address of element 0 (NULL for meta and for zero-size tensors).
 * Borrowed; valid while t is. A tensor in an opaque layout is converted to
 * strided first (NULL with an error if that fails), so the address always
 * holds the strided bytes. Writes through it bypass the version counter
 * (as in PyTorch): kernels' cached conversions of the tensor (the CPU
 * convolutions' blocked weights) would not see them; write with kiln_copy_
 * (or an in-place op) instead, or make a new tensor. */
void *kiln_data_ptr(const kiln_tensor *t);
/* References held on the handle t (views are other handles and are not
 * counted); for tests and leak hunts. */
int kiln_refcount(const kiln_tensor *t);

/* ---- Views (share storage; new references) ------------------------------------ */

/* New shape with the same numel; one dim may be -1. Fails when the strides
 * cannot express it (use kiln_reshape). */
kiln_tensor *kiln_view(kiln_tensor *t, kiln_shape shape);
/* A view when possible, else a contiguous copy. */
kiln_tensor *kiln_reshape(kiln_tensor *t, kiln_shape shape);
kiln_tensor *kiln_permute(kiln_tensor *t, int ndim, const int *dims);
kiln_tensor *kiln_transpose(kiln_tensor *t, int dim0, int dim1);
kiln_tensor *kiln_narrow(kiln_tensor *t, int dim, int64_t start, int64_t length);
/* Broadcast size-1 dims (stride 0); -1 keeps a dim; new leading dims allowed. */
kiln_tensor *kiln_expand(kiln_tensor *t, kiln_shape shape);
/* Remove dim if its size is 1 (else a view with the same shape). */
kiln_tensor *kiln_squeeze(kiln_tensor *t, int dim);
kiln_tensor *kiln_unsqueeze(kiln_tensor *t, int dim);
/* t itself (a new reference to the same handle) if contiguous, else a
 * contiguous copy on t's device. */
kiln_tensor *kiln_contiguous(kiln_tensor *t);

/* ---- Copies ------------------------------------------------------------------------ */

enum {
    KILN_NON_BLOCKING = 1u << 0, /* async when the source or destination is pinned */
    KILN_COPY = 1u << 1,         /* always copy, even to the same device and dtype */
};

/* `t` on `device` as `dtype`. Same device and dtype without KILN_COPY:
 * a new reference to t, no copy. Otherwise a new contiguous tensor.
 * KILN_NON_BLOCKING is asynchronous only between pinned host memory and a
 * device with streams (as in PyTorch, a non-blocking copy from CUDA to the
 * CPU lands in pinned memory); otherwise the copy blocks the host until
 * done. A meta source cannot be copied to a real device.
 * Differentiable, as PyTorch's .to(): when t requires grad (and grad mode
 * is on) the copy is recorded, and backward returns its gradient to t's
 * device and dtype; a peer copy (cuda:0 <-> cuda:1), forward or backward,
 * is ordered against both devices' current streams. A model split across
 * devices thus backpropagates through the kiln_to between its parts. */
kiln_tensor *kiln_to(kiln_tensor *t, kiln_device device, kiln_dtype dtype, unsigned flags);
/* Copy src into dst elementwise (shapes must match; src may broadcast to
 * dst; dtypes convert: float -> integer truncates toward zero, NaN gives 0,
 * i32/i64 saturate, u8 wraps modulo 256; -> bool is x != 0). src and dst
 * may overlap. dst may not be an expanded view (several elements at one
 * address). Into meta: no data moves; from meta into a real tensor: an
 * error. Bumps dst's version. Blocking rules as kiln_to. */
kiln_status kiln_copy_(kiln_tensor *dst, const kiln_tensor *src, unsigned flags);
/* Copy t's elements, in row-major order and t's dtype, to host memory
 * `dst` of exactly numel * dtype size bytes. Blocks (host
 * synchronisation). Meta tensors have no data: an error. */
kiln_status kiln_to_host(const kiln_tensor *t, void *dst, size_t size);
/* The single element of a 1-element tensor as a double. Blocks: a host
 * synchronisation, counted by the profiler. */
kiln_status kiln_item(const kiln_tensor *t, double *out);
/* Keep t's memory from being reused before work queued on `stream` up to
 * t's release has finished (for tensors used on a second stream). Pinned
 * tensors record on the pinned pool. Does not block. */
kiln_status kiln_record_stream(kiln_tensor *t, kiln_stream *stream);

#ifdef __cplusplus
}
#endif
#endif /* KILN_TENSOR_H */

/* Shared machinery of the oneDNN kernels (compiled with KILN_WITH_ONEDNN):
 * one CPU engine and stream created lazily, a primitive cache keyed by the
 * full shape/parameter tuple, and a checked-call macro.
 *
 * Primitives are created once per key with a user scratchpad
 * (dnnl_scratchpad_mode_user): the scratch memory is the kernel's
 * workspace, which the dispatcher takes from Kiln's caching allocator, so
 * it shows in the memory statistics. A cached primitive keeps its memory
 * objects and only swaps their data handles per call: after the first
 * call with a shape, running it allocates nothing. */
#ifndef KILN_SRC_KERNELS_CPU_ONEDNN_ONEDNN_INTERNAL_H
#define KILN_SRC_KERNELS_CPU_ONEDNN_ONEDNN_INTERNAL_H

#ifdef KILN_WITH_ONEDNN
#include <oneapi/dnnl/dnnl.h>

#include "base/error.h"
#include "kernels/cpu/onednn/onednn_kernels.h"
#include "kernels/op_args.h"

/* Checks a dnnl call: on failure raises KILN_ERR_UNSUPPORTED (the call is
 * valid but oneDNN has no implementation) or KILN_ERR_INTERNAL, naming the
 * call and oneDNN's status, and returns it from the enclosing function. */
#define KILN_DNNL_CHECK(call)                                                                                \
    do {                                                                                                     \
        dnnl_status_t dnnl_st_ = (call);                                                                     \
        if (dnnl_st_ != dnnl_success)                                                                        \
            return KILN_RAISE(dnnl_st_ == dnnl_unimplemented ? KILN_ERR_UNSUPPORTED : KILN_ERR_INTERNAL,     \
                              "run with KILN_CPU_KERNELS=reference to use the portable kernels",             \
                              "oneDNN: %s failed: %s", #call, kiln_onednn_status_name(dnnl_st_));            \
    } while (0)

const char *kiln_onednn_status_name(dnnl_status_t st);

typedef enum kiln_onednn_kind {
    KILN_ONEDNN_CONV_FWD = 1,
    KILN_ONEDNN_CONV_BWD_DATA,
    KILN_ONEDNN_CONV_BWD_WEIGHTS,
    KILN_ONEDNN_MATMUL,
    KILN_ONEDNN_CONV_REORDER, /* a layout reorder around a blocked convolution */
} kiln_onednn_kind;

/* A primitive's identity. Builders memset it to zero before filling it, so
 * keys compare (and hash) bytewise. */
#define KILN_ONEDNN_KEY_LEN 40
typedef struct kiln_onednn_key {
    int64_t kind;
    int64_t v[KILN_ONEDNN_KEY_LEN];
} kiln_onednn_key;

#define KILN_ONEDNN_MAX_ARGS 6

/* A cached primitive with one memory object per execution argument (in
 * the order the builder listed them; the scratchpad, if any, is extra). */
typedef struct kiln_onednn_prim {
    dnnl_primitive_t prim;
    int n_args;
    int arg_ids[KILN_ONEDNN_MAX_ARGS];
    dnnl_memory_t mem[KILN_ONEDNN_MAX_ARGS];
    dnnl_memory_t scratch; /* NULL when scratch_bytes == 0 */
    size_t scratch_bytes;
} kiln_onednn_prim;

/* Creates the primitive descriptor for key (attr carries the user
 * scratchpad mode; pass it to dnnl_primitive_desc_create). */
typedef kiln_status (*kiln_onednn_build_fn)(const kiln_onednn_key *key, const_dnnl_primitive_attr_t attr,
                                            dnnl_engine_t engine, dnnl_primitive_desc_t *pd);

/* The cached primitive for key, built on first use with `build` and the
 * `n_args` argument ids (their memory descriptors are queried from the
 * primitive descriptor). A key whose build failed stays failed: later
 * calls return the same status and message without retrying. */
kiln_status kiln_onednn_get(const kiln_onednn_key *key, kiln_onednn_build_fn build, int n_args,
                            const int *arg_ids, kiln_onednn_prim **out);

/* Runs p on the shared stream with data[i] the buffer of arg_ids[i] and
 * `workspace` (workspace_bytes >= p->scratch_bytes) as scratchpad; blocks
 * until done. Calls from several threads are serialised (they share the
 * memory objects and the stream). */
kiln_status kiln_onednn_execute(kiln_onednn_prim *p, void *const *data, void *workspace,
                                size_t workspace_bytes);

/* True when the view has no zero-sized dims and row-major strides
 * (the strides of size-1 dims are ignored). */
bool kiln_onednn_is_contiguous(const kiln_strided *s);

/* The CPU in the autotuner's terms (kernels/autotune.h, the provider's
 * callbacks of those names): the device (its name and OpenMP thread count)
 * and oneDNN's version for the keys; the workspace the CPU allocator can
 * surely give, and its allocation and release. */
void kiln_onednn_tune_identity(void *self, void *ctx, char *device, size_t device_size, char *versions,
                               size_t versions_size);
size_t kiln_onednn_tune_workspace_limit(void *self, void *ctx);
kiln_status kiln_onednn_tune_workspace_alloc(void *self, void *ctx, size_t bytes, void **ptr);
void kiln_onednn_tune_workspace_free(void *self, void *ctx, void *ptr);

#endif
#endif

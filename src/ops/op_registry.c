/* The op information table generated from ops.def, and the per-backend
 * kernel tables. */
#include <stdatomic.h>

#include "ops/op_backward.h"
#include "ops/op_infer.h"
#include "ops/op_registry.h"

#define kiln_NONE NULL
#define ASIS KILN_PREC_ASIS
#define LOWER KILN_PREC_LOWER
#define F32 KILN_PREC_F32
#define PROMOTE KILN_PREC_PROMOTE

static const kiln_op_info op_infos[KILN_OP_COUNT] = {
#define KILN_OP(ID, nm, nin, nout, prec, fl, sv, inf, bw)                                          \
    [KILN_OP_##ID] = {.name = #nm,                                                                 \
                      .n_in = nin,                                                                 \
                      .n_out = nout,                                                               \
                      .precision = prec,                                                           \
                      .flags = (fl),                                                               \
                      .save = (sv),                                                                \
                      .infer = kiln_##inf,                                                         \
                      .backward = kiln_##bw},
#include "ops/ops.def"
#undef KILN_OP
};

const kiln_op_info *kiln_op_info_get(kiln_op_id op) {
    return (unsigned)op < KILN_OP_COUNT ? &op_infos[op] : NULL;
}

const char *kiln_precision_name(kiln_precision p) {
    switch (p) {
    case KILN_PREC_LOWER: return "lower precision";
    case KILN_PREC_F32: return "f32";
    case KILN_PREC_PROMOTE: return "promote";
    default: return "as-is";
    }
}

static _Atomic(const kiln_op_kernel *) kernel_tables[KILN_DEVICE_TYPE_COUNT];

void kiln_ops_register_kernels(kiln_device_type type, const kiln_op_kernel *table) {
    if ((unsigned)type < KILN_DEVICE_TYPE_COUNT) atomic_store(&kernel_tables[type], table);
}

const kiln_op_kernel *kiln_ops_kernel(kiln_device_type type, kiln_op_id op) {
    if ((unsigned)type >= KILN_DEVICE_TYPE_COUNT || (unsigned)op >= KILN_OP_COUNT) return NULL;
    const kiln_op_kernel *t = atomic_load(&kernel_tables[type]);
    if (!t || !t[op].run) return NULL;
    return &t[op];
}

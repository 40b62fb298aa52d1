/* The op information table generated from ops.def, and the per-backend
 * kernel tables. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
                      .backward = kiln_##bw,                                               \
                      .backward_name = #bw},
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

static const char *flag_text(unsigned f, char *buf, size_t size) {
    static const struct {
        unsigned bit;
        const char *name;
    } names[] = {{OPF_BROADCAST, "broadcast"}, {OPF_VIEW, "view"},         {OPF_INPLACE, "in place"},
                 {OPF_VARIADIC, "variadic"},   {OPF_CREATION, "creation"}, {OPF_NONDIFF, "no gradient"}};
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (!(f & names[i].bit)) continue;
        size_t used = strlen(buf);
        snprintf(buf + used, size - used, "%s%s", used ? ", " : "", names[i].name);
    }
    return buf;
}

char *kiln_ops_markdown(void) {
    size_t cap = 64 * 1024, used = 0;
    char *out = malloc(cap);
    if (!out) return NULL;
    used += (size_t)snprintf(out + used, cap - used,
                             "| op | inputs | outputs | autocast class | backward | notes |\n"
                             "|---|---|---|---|---|---|\n");
    for (int i = 0; i < KILN_OP_COUNT; i++) {
        const kiln_op_info *o = &op_infos[i];
        char flags[128];
        const char *bw = (o->flags & OPF_NONDIFF) ? "none" : o->backward_name;
        used += (size_t)snprintf(out + used, cap - used, "| `%s` | %d | %d | %s | %s | %s |\n", o->name, o->n_in,
                                 o->n_out, kiln_precision_name(o->precision), bw, flag_text(o->flags, flags, sizeof flags));
        if (used >= cap) break;
    }
    return out;
}

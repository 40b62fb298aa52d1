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

/* Written only from kiln_init (under its mutex) while no op runs; read by
 * every dispatch. The count is published after the slot it covers. */
static _Atomic(const kiln_op_kernel *) fast_tables[KILN_DEVICE_TYPE_COUNT][KILN_OPS_MAX_FAST_TABLES];
static atomic_int n_fast_tables[KILN_DEVICE_TYPE_COUNT];
static _Atomic uint64_t fast_runs[KILN_OP_COUNT];

void kiln_ops_register_fast_kernels(kiln_device_type type, const kiln_op_kernel *table) {
    if ((unsigned)type >= KILN_DEVICE_TYPE_COUNT || !table) return;
    int n = atomic_load(&n_fast_tables[type]);
    for (int i = 0; i < n; i++)
        if (atomic_load(&fast_tables[type][i]) == table) return;
    if (n >= KILN_OPS_MAX_FAST_TABLES) return;
    atomic_store(&fast_tables[type][n], table);
    atomic_store(&n_fast_tables[type], n + 1);
}

void kiln_ops_clear_fast_kernels(kiln_device_type type) {
    if ((unsigned)type < KILN_DEVICE_TYPE_COUNT) atomic_store(&n_fast_tables[type], 0);
}

int kiln_ops_fast_table_count(kiln_device_type type) {
    return (unsigned)type < KILN_DEVICE_TYPE_COUNT ? atomic_load(&n_fast_tables[type]) : 0;
}

bool kiln_ops_fast_covers(kiln_device_type type, kiln_op_id op, kiln_dtype dtype) {
    if ((unsigned)op >= KILN_OP_COUNT) return false;
    int n = kiln_ops_fast_table_count(type);
    for (int i = 0; i < n; i++) {
        const kiln_op_kernel *k = &atomic_load(&fast_tables[type][i])[op];
        if (k->run && (k->dtypes & KILN_DT(dtype))) return true;
    }
    return false;
}

const kiln_op_kernel *kiln_ops_select_kernel(kiln_device_type type, kiln_op_id op, kiln_dtype dtype,
                                             const kiln_op_args *args, bool *fast) {
    *fast = false;
    if ((unsigned)type >= KILN_DEVICE_TYPE_COUNT || (unsigned)op >= KILN_OP_COUNT) return NULL;
    int n = atomic_load(&n_fast_tables[type]);
    /* Kernels without a layout fn are not asked about opaque layouts. */
    bool opaque = false;
    for (int i = 0; i < args->n_in; i++) opaque |= args->in[i].ndim >= 0 && args->in[i].layout != KILN_LAYOUT_STRIDED;
    for (int i = 0; i < n; i++) {
        const kiln_op_kernel *k = &atomic_load(&fast_tables[type][i])[op];
        if (!k->run || !(k->dtypes & KILN_DT(dtype))) continue;
        if (opaque && !k->layout) continue;
        if (k->supports && !k->supports(args)) continue;
        *fast = true;
        return k;
    }
    return kiln_ops_kernel(type, op);
}

uint64_t kiln_ops_fast_runs(kiln_op_id op) {
    return (unsigned)op < KILN_OP_COUNT ? atomic_load(&fast_runs[op]) : 0;
}

void kiln_ops_count_fast_run(kiln_op_id op) {
    if ((unsigned)op < KILN_OP_COUNT) atomic_fetch_add(&fast_runs[op], 1);
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

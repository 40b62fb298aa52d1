/* Every op in ops.def is complete: an inference function (the meta device
 * needs it), a backward unless OPF_NONDIFF, and on every compiled backend a
 * kernel unless OPF_VIEW, whose dtype mask covers what the op must handle:
 * the four float dtypes for ops with float results, bool for comparisons,
 * i64 for index results, and the integer dtypes for the ops PyTorch runs
 * on integers. Fails listing everything missing; it stays strict. */
#include <stdio.h>

#include "ops/op_registry.h"
#include "test_util.h"

/* Ops whose result is not floating (out[0]'s dtype, which the mask is of). */
static uint32_t result_mask(kiln_op_id op) {
    switch (op) {
    case KILN_OP_EQ:
    case KILN_OP_NE:
    case KILN_OP_LT:
    case KILN_OP_LE:
    case KILN_OP_GT:
    case KILN_OP_GE:
    case KILN_OP_ISFINITE:
        return KILN_DT(KILN_BOOL);
    case KILN_OP_ARGMAX:
    case KILN_OP_RANDPERM:
        return KILN_DT(KILN_I64);
    /* Conversions and copies handle every dtype. */
    case KILN_OP_CAST:
    case KILN_OP_COPY:
        return KILN_DT_ALL;
    /* Ops PyTorch runs on integer tensors too. */
    case KILN_OP_ADD:
    case KILN_OP_SUB:
    case KILN_OP_MUL:
    case KILN_OP_NEG:
    case KILN_OP_ABS:
    case KILN_OP_CLAMP:
    case KILN_OP_WHERE:
    case KILN_OP_AMAX:
    case KILN_OP_AMIN:
    case KILN_OP_CAT:
    case KILN_OP_GATHER:
    case KILN_OP_PAD:
    case KILN_OP_FLIP:
        return KILN_DT_FLOAT | KILN_DT_INT;
    default:
        return KILN_DT_FLOAT;
    }
}

static const char *dtypes_missing(uint32_t have, uint32_t want, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = 0;
    for (int d = 0; d < KILN_DTYPE_COUNT; d++)
        if ((want & KILN_DT(d)) && !(have & KILN_DT(d)) && used < size)
            used += (size_t)snprintf(buf + used, size - used, "%s%s", used ? " " : "",
                                     kiln_dtype_name((kiln_dtype)d));
    return buf;
}

/* Kernels of one backend. The CUDA backend adds its line to main. */
static int check_backend(kiln_device_type type, const char *backend) {
    int missing = 0;
    for (int op = 0; op < KILN_OP_COUNT; op++) {
        const kiln_op_info *info = kiln_op_info_get((kiln_op_id)op);
        if (info->flags & OPF_VIEW) continue;
        const kiln_op_kernel *k = kiln_ops_kernel(type, (kiln_op_id)op);
        if (!k || !k->run) {
            fprintf(stderr, "missing: %s kernel for %s\n", backend, info->name);
            missing++;
            continue;
        }
        char buf[128];
        uint32_t want = result_mask((kiln_op_id)op);
        if ((k->dtypes & want) != want) {
            fprintf(stderr, "missing: %s kernel for %s lacks dtypes %s\n", backend, info->name,
                    dtypes_missing(k->dtypes, want, buf, sizeof buf));
            missing++;
        }
    }
    return missing;
}

int main(void) {
    CHECK_OK(kiln_init());
    int missing = 0;
    for (int op = 0; op < KILN_OP_COUNT; op++) {
        const kiln_op_info *info = kiln_op_info_get((kiln_op_id)op);
        CHECK(info != NULL && info->name != NULL);
        if (!info) continue;
        if (!info->infer) {
            fprintf(stderr, "missing: infer function for %s\n", info->name);
            missing++;
        }
        if (!(info->flags & OPF_NONDIFF) && !info->backward) {
            fprintf(stderr, "missing: backward for %s\n", info->name);
            missing++;
        }
        if ((info->flags & OPF_NONDIFF) && info->backward) {
            fprintf(stderr, "inconsistent: %s is OPF_NONDIFF but has a backward\n", info->name);
            missing++;
        }
    }
    missing += check_backend(KILN_DEVICE_CPU, "cpu");
#ifdef KILN_WITH_CUDA
    missing += check_backend(KILN_DEVICE_CUDA, "cuda");
#endif
    int views = 0, nondiff = 0;
    for (int op = 0; op < KILN_OP_COUNT; op++) {
        views += (kiln_op_info_get((kiln_op_id)op)->flags & OPF_VIEW) != 0;
        nondiff += (kiln_op_info_get((kiln_op_id)op)->flags & OPF_NONDIFF) != 0;
    }
    printf("%d ops (%d views without kernels, %d without gradients), %d pieces missing\n", (int)KILN_OP_COUNT,
           views, nondiff, missing);
    CHECK_MSG(missing == 0, "%d pieces missing (listed above)", missing);
    kiln_shutdown();
    return kt_finish();
}

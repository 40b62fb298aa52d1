/* The public view of the kernel tables kiln_init put in force
 * (include/kiln/ops.h, "Kernels in force"): tools and checkpoints ask
 * here instead of reading the registry. */
#include <string.h>

#include "kiln/ops.h"
#include "ops/op_registry.h"

const char *kiln_kernels_in_force(kiln_device_type type) {
    return kiln_ops_fast_table_count(type) > 0 ? "fast" : "reference";
}

bool kiln_kernels_fast_covers(kiln_device_type type, const char *op, kiln_dtype dtype) {
    if (!op) return false;
    for (int id = 0; id < KILN_OP_COUNT; id++)
        if (strcmp(kiln_op_info_get((kiln_op_id)id)->name, op) == 0)
            return kiln_ops_fast_covers(type, (kiln_op_id)id, dtype);
    return false;
}

/* The elementwise group's entries of the CPU kernel table. View rows
 * (VIEW, PERMUTE, NARROW, EXPAND) have no kernel: the tensor layer makes
 * the view. */
#include "kernels/cpu/ops_elementwise.h"
#include "ops/cpu_tables.h"

void kiln_cpu_fill_elementwise(kiln_op_kernel *table) {
#define FILL(ID, name, dtypes) table[KILN_OP_##ID] = (kiln_op_kernel){kiln_cpu_ew_##name, NULL, (dtypes)};
    KILN_CPU_EW_KERNELS(FILL)
#undef FILL
}

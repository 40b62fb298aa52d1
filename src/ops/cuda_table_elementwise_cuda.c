/* The elementwise group's rows of the CUDA reference kernel table
 * (kernels/cuda/ops_elementwise.cu). View rows have no kernel: the tensor
 * layer makes the view. */
#include "kernels/cuda/cuda_ops.h"
#include "ops/cuda_tables.h"

void kiln_cuda_fill_elementwise(kiln_op_kernel *table) {
#define FILL(ID, name, dtypes) table[KILN_OP_##ID] = (kiln_op_kernel){kiln_cuda_ew_##name, NULL, (dtypes)};
    KILN_CUDA_EW_KERNELS(FILL)
#undef FILL
}

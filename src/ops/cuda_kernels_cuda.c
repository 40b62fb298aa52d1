/* The CUDA reference kernel table (compiled only with the CUDA backend, real
 * or emulated): assembled from the op groups' rows (cuda_table_*_cuda.c),
 * which point at the kernels of src/kernels/cuda/ops_*.cu. */
#include <pthread.h>

#include "ops/cuda_tables.h"

static kiln_op_kernel cuda_table[KILN_OP_COUNT];
static pthread_once_t cuda_table_once = PTHREAD_ONCE_INIT;

static void build_cuda_table(void) {
    kiln_cuda_fill_elementwise(cuda_table);
    kiln_cuda_fill_reduce(cuda_table);
    kiln_cuda_fill_nn(cuda_table);
}

const kiln_op_kernel *kiln_cuda_op_kernels(void) {
    pthread_once(&cuda_table_once, build_cuda_table);
    return cuda_table;
}

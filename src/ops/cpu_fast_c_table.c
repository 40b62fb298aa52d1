/* The plain-C fast CPU kernel table (kernels/cpu/fast/): f32 kernels on
 * contiguous tensors that need no library, consulted after the oneDNN
 * table and before the reference kernels. Built in every configuration. */
#include <pthread.h>

#include "kernels/cpu/fast/fast_kernels.h"
#include "ops/cpu_tables.h"

#define F32 KILN_DT(KILN_F32)

static kiln_op_kernel fast_c_table[KILN_OP_COUNT];
static pthread_once_t fast_c_table_once = PTHREAD_ONCE_INIT;

static void build_fast_c_table(void) {
    fast_c_table[KILN_OP_MAX_POOL2D] = (kiln_op_kernel){kiln_fast_max_pool2d, NULL, F32, kiln_fast_max_pool2d_supports};
    fast_c_table[KILN_OP_MAX_POOL2D_BACKWARD] =
        (kiln_op_kernel){kiln_fast_max_pool2d_backward, NULL, F32, kiln_fast_max_pool2d_backward_supports};
    fast_c_table[KILN_OP_RELU] = (kiln_op_kernel){kiln_fast_relu, NULL, F32, kiln_fast_relu_supports};
    fast_c_table[KILN_OP_RELU_BACKWARD] =
        (kiln_op_kernel){kiln_fast_relu_backward, NULL, F32, kiln_fast_relu_backward_supports};
    fast_c_table[KILN_OP_SUM] = (kiln_op_kernel){kiln_fast_sum, kiln_fast_sum_workspace, F32, kiln_fast_sum_supports};
}

const kiln_op_kernel *kiln_cpu_fast_c_op_kernels(void) {
    pthread_once(&fast_c_table_once, build_fast_c_table);
    return fast_c_table;
}

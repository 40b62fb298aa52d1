/* The CPU reference kernel table. */
#include <pthread.h>

#include "ops/cpu_tables.h"

static kiln_op_kernel cpu_table[KILN_OP_COUNT];
static pthread_once_t cpu_table_once = PTHREAD_ONCE_INIT;

static void build_cpu_table(void) {
    kiln_cpu_fill_elementwise(cpu_table);
    kiln_cpu_fill_reduce(cpu_table);
    kiln_cpu_fill_nn(cpu_table);
}

const kiln_op_kernel *kiln_cpu_op_kernels(void) {
    pthread_once(&cpu_table_once, build_cpu_table);
    return cpu_table;
}

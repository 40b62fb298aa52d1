/* The fast CPU kernel table: oneDNN convolution and matmul for f32 and bf16
 * (kernels/cpu/onednn/); the convolutions take and give nChw16c
 * activations (kiln/tensor.h). Entries decline what they do not cover through
 * their supports fn, and the dispatcher then runs the reference kernel;
 * ops without an entry always run the reference kernel. */
#include <pthread.h>

#include "ops/cpu_tables.h"

#ifdef KILN_WITH_ONEDNN
#include "kernels/cpu/onednn/onednn_kernels.h"

/* bf16: autocast's convolutions and products, on oneDNN's bf16 kernels (AMX
 * or AVX512-BF16 where the CPU has them); a shape oneDNN has no bf16 kernel
 * for is declined by the supports fn and runs the reference kernel */
#define LOW (KILN_DT(KILN_F32) | KILN_DT(KILN_BF16))

static kiln_op_kernel fast_table[KILN_OP_COUNT];
static pthread_once_t fast_table_once = PTHREAD_ONCE_INIT;

static void build_fast_table(void) {
    fast_table[KILN_OP_CONV2D] =
        (kiln_op_kernel){kiln_onednn_conv2d,        kiln_onednn_conv2d_workspace, LOW, kiln_onednn_conv2d_supports,
                         kiln_onednn_conv2d_layout, kiln_onednn_conv2d_prepare,  kiln_onednn_conv2d_fill};
    fast_table[KILN_OP_CONV2D_GRAD_INPUT] =
        (kiln_op_kernel){kiln_onednn_conv2d_grad_input, kiln_onednn_conv2d_grad_input_workspace, LOW,
                         kiln_onednn_conv2d_grad_input_supports, kiln_onednn_conv2d_grad_input_layout,
                         kiln_onednn_conv2d_grad_input_prepare, kiln_onednn_conv2d_grad_input_fill};
    fast_table[KILN_OP_CONV2D_GRAD_WEIGHT] =
        (kiln_op_kernel){kiln_onednn_conv2d_grad_weight, kiln_onednn_conv2d_grad_weight_workspace, LOW,
                         kiln_onednn_conv2d_grad_weight_supports, kiln_onednn_conv2d_grad_weight_layout};
    fast_table[KILN_OP_CONV2D_RELU] =
        (kiln_op_kernel){kiln_onednn_conv2d_relu, kiln_onednn_conv2d_relu_workspace, LOW,
                         kiln_onednn_conv2d_relu_supports, kiln_onednn_conv2d_relu_layout,
                         kiln_onednn_conv2d_relu_prepare, kiln_onednn_conv2d_relu_fill};
    fast_table[KILN_OP_CONV2D_RELU_MAX_POOL2D] = (kiln_op_kernel){
        kiln_onednn_conv2d_relu_max_pool2d,         kiln_onednn_conv2d_relu_max_pool2d_workspace, LOW,
        kiln_onednn_conv2d_relu_max_pool2d_supports, kiln_onednn_conv2d_relu_max_pool2d_layout,
        kiln_onednn_conv2d_relu_max_pool2d_prepare,  kiln_onednn_conv2d_relu_max_pool2d_fill};
    fast_table[KILN_OP_CONV2D_RELU_MAX_POOL2D_GRAD_WEIGHT] = (kiln_op_kernel){
        kiln_onednn_conv2d_relu_max_pool2d_grad_weight,         kiln_onednn_conv2d_relu_max_pool2d_grad_weight_workspace,
        LOW,
        kiln_onednn_conv2d_relu_max_pool2d_grad_weight_supports, kiln_onednn_conv2d_relu_max_pool2d_grad_weight_layout};
    fast_table[KILN_OP_LINEAR_ACT] = (kiln_op_kernel){kiln_onednn_linear_act,         kiln_onednn_linear_act_workspace,
                                                      LOW,                            kiln_onednn_linear_act_supports,
                                                      kiln_onednn_linear_act_layout,  kiln_onednn_linear_act_prepare,
                                                      kiln_onednn_linear_act_fill};
    fast_table[KILN_OP_MM] =
        (kiln_op_kernel){kiln_onednn_mm, kiln_onednn_mm_workspace, LOW, kiln_onednn_mm_supports};
    fast_table[KILN_OP_BMM] =
        (kiln_op_kernel){kiln_onednn_bmm, kiln_onednn_bmm_workspace, LOW, kiln_onednn_bmm_supports};
    fast_table[KILN_OP_LINEAR] =
        (kiln_op_kernel){kiln_onednn_linear, kiln_onednn_linear_workspace, LOW, kiln_onednn_linear_supports};
}

const kiln_op_kernel *kiln_cpu_fast_op_kernels(void) {
    pthread_once(&fast_table_once, build_fast_table);
    return fast_table;
}

void kiln_cpu_fast_kernels_shutdown(void) { kiln_onednn_shutdown(); }

#else
const kiln_op_kernel *kiln_cpu_fast_op_kernels(void) { return NULL; }
void kiln_cpu_fast_kernels_shutdown(void) {}
#endif

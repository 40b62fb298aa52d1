/* CUDA kernels of the nn op group (cuda_ops.h). Ops not yet set here have
 * no CUDA kernel: the dispatcher raises KILN_ERR_UNSUPPORTED naming the op
 * and the device. */
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_ops.h"
#include "ops/op_registry.h"

extern "C" void kiln_cuda_fill_nn(kiln_op_kernel *table) { (void)table; }

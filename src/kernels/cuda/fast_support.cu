/* Small kernels the library fast paths (cuda_fast.h) need around a library
 * call: the eval-mode batch-norm statistics the op reports besides y. Built
 * in both CUDA builds like every .cu file (the emulation build runs no
 * library path, but keeps the kernel compiling and launchable). */
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_fast.h"

namespace {

__global__ void bn_eval_stats_kernel(const float *rm, const float *rv, double eps, float *mean_out,
                                     float *invstd_out, int64_t channels) {
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < channels;
         c += (int64_t)gridDim.x * blockDim.x) {
        mean_out[c] = rm[c];
        invstd_out[c] = (float)(1.0 / sqrt((double)rv[c] + eps));
    }
}

} // namespace

extern "C" kiln_status kiln_cuda_bn_eval_stats(const float *running_mean, const float *running_var,
                                               double eps, float *mean_out, float *invstd_out,
                                               int64_t channels, void *stream, int device) {
    if (channels <= 0) return KILN_OK;
    KILN_LAUNCH(bn_eval_stats_kernel, kiln_cuda::grid_for(channels), kiln_cuda::kThreads, 0, stream,
                running_mean, running_var, eps, mean_out, invstd_out, channels);
    KILN_LAUNCH_CHECK(device, "batch_norm eval statistics (bn_eval_stats_kernel)");
    return KILN_OK;
}

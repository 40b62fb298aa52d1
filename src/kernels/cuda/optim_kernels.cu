/* CUDA fused optimizer updates (kernels/optim_kernels.h) for f32 and f64:
 * the arithmetic of the CPU kernels (kernels/cpu/optim_kernels.c), each
 * intermediate computed in double and rounded to the dtype where the
 * op-by-op path stores a tensor. The CUDA elementwise kernels compute f32
 * add/sub/mul/div/sqrt in float, which rounds the same as double followed
 * by a rounding to float, and the scalar ops in double, so fused and
 * op-by-op updates agree bit for bit on this backend too. One grid-stride
 * loop over the elements, enqueued on the stream; nothing blocks. */
#include "kernels/cuda/cuda_common.h"
#include "kernels/optim_kernels.h"

namespace {

template <class T> __device__ inline double rnd(double x) { return (double)(T)x; }

template <class T> __global__ void adam_kernel(kiln_adam_step s) {
    T *p = (T *)s.p, *m = (T *)s.m, *v = (T *)s.v, *vmax = (T *)s.vmax;
    const T *gp = (const T *)s.g;
    const double w = 1.0 - s.beta1, inv_bc2 = 1.0 / s.bc2_sqrt, keep = 1.0 - s.lr * s.weight_decay;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < s.n; i += (int64_t)gridDim.x * blockDim.x) {
        double g = (double)gp[i], pi = (double)p[i], mi = (double)m[i], vi = (double)v[i];
        if (s.maximize) g = -g;
        if (s.weight_decay != 0) {
            if (s.adamw)
                pi = rnd<T>(pi * keep);
            else
                g = rnd<T>(g + rnd<T>(pi * s.weight_decay));
        }
        double d = rnd<T>(g - mi);
        mi = w < 0.5 ? rnd<T>(mi + rnd<T>(d * w)) : rnd<T>(g - rnd<T>(d * (1.0 - w)));
        vi = rnd<T>(rnd<T>(vi * s.beta2) + rnd<T>(rnd<T>(g * (1.0 - s.beta2)) * g));
        double second = vi;
        if (s.amsgrad) {
            double vm = (double)vmax[i];
            second = vm > vi ? vm : vi;
            vmax[i] = (T)second;
        }
        double denom = rnd<T>(rnd<T>(rnd<T>(sqrt(second)) * inv_bc2) + s.eps);
        pi = rnd<T>(pi + rnd<T>(rnd<T>(mi / denom) * -s.step_size));
        p[i] = (T)pi;
        m[i] = (T)mi;
        v[i] = (T)vi;
    }
}

template <class T> __global__ void sgd_kernel(kiln_sgd_step s) {
    T *p = (T *)s.p, *buf = (T *)s.buf;
    const T *gp = (const T *)s.g;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < s.n; i += (int64_t)gridDim.x * blockDim.x) {
        double g = (double)gp[i], pi = (double)p[i];
        if (s.maximize) g = -g;
        if (s.weight_decay != 0) g = rnd<T>(g + rnd<T>(pi * s.weight_decay));
        if (buf) {
            double b = s.first ? g : rnd<T>(rnd<T>((double)buf[i] * s.momentum) + rnd<T>(g * (1.0 - s.dampening)));
            buf[i] = (T)b;
            g = s.nesterov ? rnd<T>(g + rnd<T>(b * s.momentum)) : b;
        }
        p[i] = (T)rnd<T>(pi + rnd<T>(g * -s.lr));
    }
}

kiln_status cuda_adam(const kiln_adam_step *s, void *stream) {
    if (s->n == 0) return KILN_OK;
    kiln_cuda::device_guard guard;
    KILN_TRY(guard.enter(s->p));
    if (s->dtype == KILN_F32)
        KILN_LAUNCH(adam_kernel<float>, kiln_cuda::grid_for(s->n), kiln_cuda::kThreads, 0, stream, *s);
    else if (s->dtype == KILN_F64)
        KILN_LAUNCH(adam_kernel<double>, kiln_cuda::grid_for(s->n), kiln_cuda::kThreads, 0, stream, *s);
    else
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, NULL, "fused Adam: dtype %s is not covered",
                          kiln_dtype_name(s->dtype));
    KILN_LAUNCH_CHECK(guard.device, "adam_kernel");
    return KILN_OK;
}

kiln_status cuda_sgd(const kiln_sgd_step *s, void *stream) {
    if (s->n == 0) return KILN_OK;
    kiln_cuda::device_guard guard;
    KILN_TRY(guard.enter(s->p));
    if (s->dtype == KILN_F32)
        KILN_LAUNCH(sgd_kernel<float>, kiln_cuda::grid_for(s->n), kiln_cuda::kThreads, 0, stream, *s);
    else if (s->dtype == KILN_F64)
        KILN_LAUNCH(sgd_kernel<double>, kiln_cuda::grid_for(s->n), kiln_cuda::kThreads, 0, stream, *s);
    else
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, NULL, "fused SGD: dtype %s is not covered",
                          kiln_dtype_name(s->dtype));
    KILN_LAUNCH_CHECK(guard.device, "sgd_kernel");
    return KILN_OK;
}

const kiln_optim_kernels cuda_table = {
    (1u << KILN_F32) | (1u << KILN_F64),
    cuda_adam,
    cuda_sgd,
};

} // namespace

extern "C" const kiln_optim_kernels *kiln_cuda_optim_kernels(void) { return &cuda_table; }

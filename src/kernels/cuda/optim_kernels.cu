/* CUDA fused optimizer updates (kernels/optim_kernels.h) for f32 and f64:
 * the arithmetic of the CPU kernels (kernels/cpu/optim_kernels.c), each
 * intermediate computed in double and rounded to the dtype where the
 * op-by-op path stores a tensor. The CUDA elementwise kernels compute f32
 * add/sub/mul/div/sqrt in float, which rounds the same as double followed
 * by a rounding to float, and the scalar ops in double, so fused and
 * op-by-op updates agree bit for bit on this backend too. One launch
 * updates a batch of up to KILN_OPTIM_MULTI parameters (passed by value):
 * blockIdx.y picks the parameter, a grid-stride loop over blockIdx.x
 * covers its elements. Enqueued on the stream; nothing blocks. */
#include "kernels/cuda/cuda_common.h"
#include "kernels/optim_kernels.h"

namespace {

template <class T> __device__ inline double rnd(double x) { return (double)(T)x; }

/* Every product through mul_rn: nvcc would otherwise contract p + g * -lr
 * and the like into fmas, which in f64 (where rnd rounds nothing) give
 * other last bits than the CPU kernels, compiled with -ffp-contract=off
 * (docs/cuda.md, "What the emulator cannot catch"). */
using kiln_cuda::mul_rn;

template <class S> struct batch {
    S s[KILN_OPTIM_MULTI];
};

template <class T> __device__ void adam_one(const kiln_adam_step &s) {
    T *p = (T *)s.p, *m = (T *)s.m, *v = (T *)s.v, *vmax = (T *)s.vmax;
    const T *gp = (const T *)s.g;
    const double w = 1.0 - s.beta1, inv_bc2 = 1.0 / s.bc2_sqrt, keep = 1.0 - mul_rn(s.lr, s.weight_decay);
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < s.n; i += (int64_t)gridDim.x * blockDim.x) {
        double g = (double)gp[i], pi = (double)p[i], mi = (double)m[i], vi = (double)v[i];
        if (s.maximize) g = -g;
        if (s.weight_decay != 0) {
            if (s.adamw)
                pi = rnd<T>(mul_rn(pi, keep));
            else
                g = rnd<T>(g + rnd<T>(mul_rn(pi, s.weight_decay)));
        }
        double d = rnd<T>(g - mi);
        mi = w < 0.5 ? rnd<T>(mi + rnd<T>(mul_rn(d, w))) : rnd<T>(g - rnd<T>(mul_rn(d, 1.0 - w)));
        vi = rnd<T>(rnd<T>(mul_rn(vi, s.beta2)) + rnd<T>(mul_rn(rnd<T>(mul_rn(g, 1.0 - s.beta2)), g)));
        double second = vi;
        if (s.amsgrad) {
            double vm = (double)vmax[i];
            second = vm > vi ? vm : vi;
            vmax[i] = (T)second;
        }
        double denom = rnd<T>(rnd<T>(mul_rn(rnd<T>(sqrt(second)), inv_bc2)) + s.eps);
        pi = rnd<T>(pi + rnd<T>(mul_rn(rnd<T>(mi / denom), -s.step_size)));
        p[i] = (T)pi;
        m[i] = (T)mi;
        v[i] = (T)vi;
    }
}

template <class T> __device__ void sgd_one(const kiln_sgd_step &s) {
    T *p = (T *)s.p, *buf = (T *)s.buf;
    const T *gp = (const T *)s.g;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < s.n; i += (int64_t)gridDim.x * blockDim.x) {
        double g = (double)gp[i], pi = (double)p[i];
        if (s.maximize) g = -g;
        if (s.weight_decay != 0) g = rnd<T>(g + rnd<T>(mul_rn(pi, s.weight_decay)));
        if (buf) {
            double b = s.first ? g
                               : rnd<T>(rnd<T>(mul_rn((double)buf[i], s.momentum)) +
                                        rnd<T>(mul_rn(g, 1.0 - s.dampening)));
            buf[i] = (T)b;
            g = s.nesterov ? rnd<T>(g + rnd<T>(mul_rn(b, s.momentum))) : b;
        }
        p[i] = (T)rnd<T>(pi + rnd<T>(mul_rn(g, -s.lr)));
    }
}

/* The graph-safe inputs (optim_kernels.h): a set found-inf flag skips the
 * update; device scalars replace the launch's. */
__global__ void adam_kernel(batch<kiln_adam_step> b) {
    kiln_adam_step s = b.s[blockIdx.y];
    if (s.found_inf && *s.found_inf != 0.0f) return;
    if (s.scalars) s.lr = s.scalars[0], s.step_size = s.scalars[1], s.bc2_sqrt = s.scalars[2];
    if (s.dtype == KILN_F32)
        adam_one<float>(s);
    else
        adam_one<double>(s);
}

__global__ void sgd_kernel(batch<kiln_sgd_step> b) {
    kiln_sgd_step s = b.s[blockIdx.y];
    if (s.found_inf && *s.found_inf != 0.0f) return;
    if (s.lr_dev) s.lr = *s.lr_dev;
    if (s.dtype == KILN_F32)
        sgd_one<float>(s);
    else
        sgd_one<double>(s);
}

/* The grad scaler's unscale: a product and a finiteness test per element;
 * every thread that meets a non-finite result stores the same 1. */
template <class T> __device__ void unscale_one(const kiln_unscale_step &s) {
    T *g = (T *)s.g;
    const double inv = (double)*s.inv;
    bool bad = false;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < s.n; i += (int64_t)gridDim.x * blockDim.x) {
        double r = rnd<T>(mul_rn((double)g[i], inv));
        g[i] = (T)r;
        bad = bad || !isfinite(r);
    }
    if (bad) *s.found = 1.0f;
}

__global__ void unscale_kernel(batch<kiln_unscale_step> b) {
    const kiln_unscale_step &s = b.s[blockIdx.y];
    if (s.dtype == KILN_F32)
        unscale_one<float>(s);
    else
        unscale_one<double>(s);
}

/* The tensor whose device runs the batch. */
inline const void *first_data(const kiln_adam_step &s) { return s.p; }
inline const void *first_data(const kiln_sgd_step &s) { return s.p; }
inline const void *first_data(const kiln_unscale_step &s) { return s.g; }

/* One launch of kernel over the batch s[0..n): checks it, makes the device
 * of its first tensor current; the grid's x covers the largest tensor, y
 * the batch's entries. */
template <class S>
kiln_status launch(void (*kernel)(batch<S>), const char *kernel_name, const char *what, const S *s, int n,
                   void *stream) {
    if (n < 1 || n > KILN_OPTIM_MULTI)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "fused %s: %d updates in one batch (1..%d)", what, n,
                          KILN_OPTIM_MULTI);
    batch<S> b;
    int64_t most = 0;
    for (int k = 0; k < n; k++) {
        if (s[k].dtype != KILN_F32 && s[k].dtype != KILN_F64)
            return KILN_RAISE(KILN_ERR_UNSUPPORTED, NULL, "fused %s: dtype %s is not covered", what,
                              kiln_dtype_name(s[k].dtype));
        if (s[k].n > most) most = s[k].n;
        b.s[k] = s[k];
    }
    kiln_cuda::device_guard guard;
    KILN_TRY(guard.enter(first_data(s[0])));
    dim3 grid(kiln_cuda::grid_for(most), (unsigned)n, 1);
    KILN_LAUNCH(kernel, grid, kiln_cuda::kThreads, 0, stream, b);
    KILN_LAUNCH_CHECK(guard.device, kernel_name);
    return KILN_OK;
}

kiln_status cuda_adam(const kiln_adam_step *s, int n, void *stream) {
    return launch(adam_kernel, "adam_kernel", "Adam", s, n, stream);
}

kiln_status cuda_sgd(const kiln_sgd_step *s, int n, void *stream) {
    return launch(sgd_kernel, "sgd_kernel", "SGD", s, n, stream);
}

kiln_status cuda_unscale(const kiln_unscale_step *s, int n, void *stream) {
    return launch(unscale_kernel, "unscale_kernel", "unscale", s, n, stream);
}

const kiln_optim_kernels cuda_table = {
    (1u << KILN_F32) | (1u << KILN_F64),
    cuda_adam,
    cuda_sgd,
    cuda_unscale,
};

} // namespace

extern "C" const kiln_optim_kernels *kiln_cuda_optim_kernels(void) { return &cuda_table; }

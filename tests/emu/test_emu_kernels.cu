/* The CUDA emulator's device side: warp shuffles and votes with CUDA's
 * lane rules, block barriers with non-power-of-two blocks, atomics across
 * concurrently running blocks, dynamic shared memory, launch validation
 * (configuration, host pointers, memory of another device), and deadlock
 * detection (in a child process, which must abort with the message).
 *
 * Inputs are non-uniform (lane-dependent) so that a shuffle returning the
 * wrong lane's value shows. Expected values are computed on the host by
 * CUDA's documented rules, independently of the emulator's code. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "emu/emu_test_util.h"

/* A lane-dependent, non-monotone value. */
static inline KILN_HD int input_of(int i) { return (i * 37 + 11) % 101 - 50; }

/* ---- Shuffles -------------------------------------------------------------------- */

enum { SHFL_IDX = 0, SHFL_UP, SHFL_DOWN, SHFL_XOR };

__global__ void shfl_kernel(int *out, int kind, int arg, int width, int n) {
    int t = (int)threadIdx.x;
    if (t >= n) return;
    int v = input_of(t);
    int r = 0;
    switch (kind) {
    case SHFL_IDX:
        r = __shfl_sync(0xFFFFFFFFu, v, arg, width);
        break;
    case SHFL_UP:
        r = __shfl_up_sync(0xFFFFFFFFu, v, (unsigned)arg, width);
        break;
    case SHFL_DOWN:
        r = __shfl_down_sync(0xFFFFFFFFu, v, (unsigned)arg, width);
        break;
    default:
        r = __shfl_xor_sync(0xFFFFFFFFu, v, arg, width);
        break;
    }
    out[t] = r;
}

/* CUDA's rule (PTX shfl.sync with CUDA's clamp operands): lanes are
 * grouped in segments of `width`; idx reads lane (srcLane mod width) of the
 * segment; up/down read lane -/+ delta if it stays in the segment, else
 * keep their value; xor reads lane ^ mask unless that is above the
 * segment's last lane. */
static int shfl_expected(int kind, int thread, int arg, int width) {
    int lane = thread % 32;
    int base = lane / width * width;
    int src = lane;
    switch (kind) {
    case SHFL_IDX:
        src = base + arg % width;
        break;
    case SHFL_UP:
        src = lane - arg >= base ? lane - arg : lane;
        break;
    case SHFL_DOWN:
        src = lane + arg < base + width ? lane + arg : lane;
        break;
    default:
        /* PTX shfl.bfly: only the upper clamp applies (j <= maxLane), so
         * a lane may read below its segment. */
        src = (lane ^ arg) < base + width ? (lane ^ arg) : lane;
        break;
    }
    return input_of(thread - lane + src);
}

static void test_shuffles(void) {
    const int n = 64; /* two warps */
    int *d;
    CUDA_OK(cudaMalloc((void **)&d, n * sizeof(int)));
    const char *names[] = {"idx", "up", "down", "xor"};
    int widths[] = {32, 16, 8};
    int args[] = {0, 1, 3, 5, 7, 13};
    for (int kind = 0; kind < 4; kind++)
        for (int w : widths)
            for (int a : args) {
                KILN_LAUNCH(shfl_kernel, 1, n, 0, 0, d, kind, a, w, n);
                CUDA_OK(cudaGetLastError());
                int h[64];
                CUDA_OK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
                int bad = -1;
                for (int t = 0; t < n; t++)
                    if (h[t] != shfl_expected(kind, t, a, w)) {
                        bad = t;
                        break;
                    }
                EXPECT(bad < 0, "shfl %s width %d arg %d: thread %d got %d, want %d", names[kind], w, a, bad,
                       bad >= 0 ? h[bad] : 0, bad >= 0 ? shfl_expected(kind, bad, a, w) : 0);
            }
    CUDA_OK(cudaFree(d));
}

/* Warp-shuffle sum of doubles (8-byte values) down to lane 0 of each warp. */
__global__ void warp_sum_kernel(double *out, const double *in) {
    int t = (int)threadIdx.x;
    double v = in[blockIdx.x * blockDim.x + t];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xFFFFFFFFu, v, off);
    if ((t & 31) == 0) out[blockIdx.x * (blockDim.x / 32) + t / 32] = v;
}

static void test_warp_sum(void) {
    const int blocks = 3, threads = 128, n = blocks * threads;
    double h[n], *din, *dout;
    for (int i = 0; i < n; i++) h[i] = input_of(i) * 0.25;
    CUDA_OK(cudaMalloc((void **)&din, sizeof h));
    CUDA_OK(cudaMalloc((void **)&dout, n / 32 * sizeof(double)));
    CUDA_OK(cudaMemcpy(din, h, sizeof h, cudaMemcpyHostToDevice));
    KILN_LAUNCH(warp_sum_kernel, blocks, threads, 0, 0, dout, din);
    CUDA_OK(cudaGetLastError());
    double got[n / 32];
    CUDA_OK(cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost));
    for (int w = 0; w < n / 32; w++) {
        double want = 0;
        for (int l = 0; l < 32; l++) want += h[w * 32 + l];
        EXPECT(got[w] == want, "warp %d sum %g, want %g", w, got[w], want);
    }
    CUDA_OK(cudaFree(din));
    CUDA_OK(cudaFree(dout));
}

/* A partial last warp: reading a lane that does not exist gives all-ones
 * bits (NaN), never a plausible value. */
__global__ void partial_warp_kernel(float *out) {
    float v = (float)threadIdx.x;
    out[threadIdx.x] = __shfl_down_sync(0xFFFFFFFFu, v, 8);
}

static void test_partial_warp(void) {
    float *d, h[40];
    CUDA_OK(cudaMalloc((void **)&d, sizeof h));
    KILN_LAUNCH(partial_warp_kernel, 1, 40, 0, 0, d);
    CUDA_OK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    EXPECT(h[0] == 8.0f && h[23] == 31.0f, "full warp lanes: %g %g", h[0], h[23]);
    EXPECT(h[24] == h[24] && h[24] == 24.0f, "lane 24 keeps its own value (out of range): %g", h[24]);
    EXPECT(h[32] != h[32], "lane 0 of the partial warp read lane 8, which does not exist: got %g, want NaN", h[32]);
    EXPECT(h[39] != h[39], "lane 7 of the partial warp read lane 15, which does not exist: %g", h[39]);
    CUDA_OK(cudaFree(d));
}

__global__ void vote_kernel(unsigned *out, int n) {
    int t = (int)threadIdx.x;
    if (t >= n) return;
    int pred = input_of(t) > 0;
    unsigned b = __ballot_sync(__activemask(), pred);
    int any = __any_sync(__activemask(), t == 5);
    int all = __all_sync(__activemask(), t < 1000);
    int all2 = __all_sync(__activemask(), pred);
    out[t * 4 + 0] = b;
    out[t * 4 + 1] = (unsigned)any;
    out[t * 4 + 2] = (unsigned)all;
    out[t * 4 + 3] = (unsigned)all2;
}

static void test_votes(void) {
    const int n = 45;
    unsigned *d, h[n * 4];
    CUDA_OK(cudaMalloc((void **)&d, sizeof h));
    KILN_LAUNCH(vote_kernel, 1, 64, 0, 0, d, n);
    CUDA_OK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    for (int t = 0; t < n; t++) {
        int warp = t / 32;
        unsigned want = 0;
        for (int l = 0; l < 32 && warp * 32 + l < n; l++)
            if (input_of(warp * 32 + l) > 0) want |= 1u << l;
        EXPECT(h[t * 4] == want, "ballot thread %d: 0x%08x want 0x%08x", t, h[t * 4], want);
        EXPECT(h[t * 4 + 1] == (warp == 0 ? 1u : 0u), "any thread %d", t);
        EXPECT(h[t * 4 + 2] == 1u, "all thread %d", t);
        EXPECT(h[t * 4 + 3] == 0u, "all(pred) thread %d", t);
    }
    CUDA_OK(cudaFree(d));
}

/* ---- Block reduction with __syncthreads ----------------------------------------- */

__global__ void block_sum_kernel(long long *out, const int *in, int n) {
    KILN_DYNAMIC_SHARED(long long, partial);
    int t = (int)threadIdx.x;
    long long acc = 0;
    for (int i = (int)blockIdx.x * (int)blockDim.x + t; i < n; i += (int)(gridDim.x * blockDim.x)) acc += in[i];
    partial[t] = acc;
    __syncthreads();
    /* Tree over a block of any size: fold the part above the largest power
     * of two first. */
    int p = 1;
    while (p * 2 <= (int)blockDim.x) p *= 2;
    if (t + p < (int)blockDim.x) partial[t] += partial[t + p];
    __syncthreads();
    for (int s = p / 2; s > 0; s >>= 1) {
        if (t < s) partial[t] += partial[t + s];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = partial[0];
    int cnt = __syncthreads_count(t % 3 == 0);
    if (t == 0 && cnt != ((int)blockDim.x + 2) / 3) out[blockIdx.x] = -999999;
}

static void test_block_reduction(void) {
    const int n = 100003;
    int *h = (int *)malloc(n * sizeof(int)), *d;
    long long want = 0;
    for (int i = 0; i < n; i++) {
        h[i] = input_of(i) * (i % 7 + 1);
        want += h[i];
    }
    CUDA_OK(cudaMalloc((void **)&d, n * sizeof(int)));
    CUDA_OK(cudaMemcpy(d, h, n * sizeof(int), cudaMemcpyHostToDevice));
    int sizes[] = {1, 7, 33, 100, 255, 333, 1000, 1024};
    for (int bs : sizes) {
        int blocks = 5;
        long long *dout, got[5];
        CUDA_OK(cudaMalloc((void **)&dout, sizeof got));
        KILN_LAUNCH(block_sum_kernel, blocks, bs, bs * sizeof(long long), 0, dout, d, n);
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost));
        long long sum = 0;
        for (int b = 0; b < blocks; b++) sum += got[b];
        EXPECT(sum == want, "block size %d: sum %lld want %lld", bs, sum, want);
        CUDA_OK(cudaFree(dout));
    }
    CUDA_OK(cudaFree(d));
    free(h);
}

/* 2-D blocks: threadIdx.y/z and the linear thread order. */
__global__ void index_kernel(int *out) {
    int bt = (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
    int b = (int)(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
    int threads = (int)(blockDim.x * blockDim.y * blockDim.z);
    out[b * threads + bt] = b * 10000 + bt;
}

static void test_indices(void) {
    dim3 grid(3, 2, 2), block(5, 3, 2);
    int n = 12 * 30, *d;
    CUDA_OK(cudaMalloc((void **)&d, n * sizeof(int)));
    CUDA_OK(cudaMemset(d, 0xFF, n * sizeof(int)));
    KILN_LAUNCH(index_kernel, grid, block, 0, 0, d);
    int *h = (int *)malloc(n * sizeof(int));
    CUDA_OK(cudaMemcpy(h, d, n * sizeof(int), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (h[i] != (i / 30) * 10000 + i % 30) bad++;
    EXPECT(bad == 0, "%d of %d thread indices wrong", bad, n);
    free(h);
    CUDA_OK(cudaFree(d));
}

/* ---- Atomics across blocks (blocks run on several host threads) ------------------- */

__global__ void atomics_kernel(float *fsum, double *dsum, int *isum, unsigned long long *usum, int *imax, int *imin,
                               unsigned *cas_count, int n) {
    for (int i = (int)(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += (int)(gridDim.x * blockDim.x)) {
        int v = input_of(i);
        atomicAdd(fsum, (float)(v & 7));
        atomicAdd(dsum, v * 0.5);
        atomicAdd(isum, v);
        atomicAdd(usum, (unsigned long long)(i + 1));
        atomicMax(imax, v * (i % 13));
        atomicMin(imin, v * (i % 11));
        unsigned old = *cas_count, assumed;
        do {
            assumed = old;
            old = atomicCAS(cas_count, assumed, assumed + 1);
        } while (old != assumed);
    }
}

static void test_atomics(void) {
    const int n = 200000;
    float *f;
    double *dd;
    int *is, *mx, *mn;
    unsigned long long *us;
    unsigned *cas;
    CUDA_OK(cudaMalloc((void **)&f, sizeof *f));
    CUDA_OK(cudaMalloc((void **)&dd, sizeof *dd));
    CUDA_OK(cudaMalloc((void **)&is, sizeof *is));
    CUDA_OK(cudaMalloc((void **)&us, sizeof *us));
    CUDA_OK(cudaMalloc((void **)&mx, sizeof *mx));
    CUDA_OK(cudaMalloc((void **)&mn, sizeof *mn));
    CUDA_OK(cudaMalloc((void **)&cas, sizeof *cas));
    CUDA_OK(cudaMemset(f, 0, sizeof *f));
    CUDA_OK(cudaMemset(dd, 0, sizeof *dd));
    CUDA_OK(cudaMemset(is, 0, sizeof *is));
    CUDA_OK(cudaMemset(us, 0, sizeof *us));
    CUDA_OK(cudaMemset(cas, 0, sizeof *cas));
    int lo = -1000000, hi = 1000000;
    CUDA_OK(cudaMemcpy(mx, &lo, sizeof lo, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(mn, &hi, sizeof hi, cudaMemcpyHostToDevice));
    KILN_LAUNCH(atomics_kernel, 37, 128, 0, 0, f, dd, is, us, mx, mn, cas, n);
    CUDA_OK(cudaGetLastError());
    float hf;
    double hd;
    int hi_sum, hmax, hmin;
    unsigned long long hus;
    unsigned hcas;
    CUDA_OK(cudaMemcpy(&hf, f, sizeof hf, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(&hd, dd, sizeof hd, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(&hi_sum, is, sizeof hi_sum, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(&hus, us, sizeof hus, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(&hmax, mx, sizeof hmax, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(&hmin, mn, sizeof hmin, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(&hcas, cas, sizeof hcas, cudaMemcpyDeviceToHost));
    double wf = 0, wd = 0;
    long long wi = 0;
    int wmax = lo, wmin = hi;
    for (int i = 0; i < n; i++) {
        int v = input_of(i);
        wf += v & 7;
        wd += v * 0.5;
        wi += v;
        if (v * (i % 13) > wmax) wmax = v * (i % 13);
        if (v * (i % 11) < wmin) wmin = v * (i % 11);
    }
    /* Sums of small integers: exact in float and double whatever the order. */
    EXPECT(hf == (float)wf, "float atomicAdd %g want %g", hf, wf);
    EXPECT(hd == wd, "double atomicAdd %g want %g", hd, wd);
    EXPECT(hi_sum == (int)wi, "int atomicAdd %d want %lld", hi_sum, wi);
    EXPECT(hus == (unsigned long long)n * (n + 1) / 2, "ull atomicAdd %llu", hus);
    EXPECT(hmax == wmax && hmin == wmin, "atomicMax %d (%d) atomicMin %d (%d)", hmax, wmax, hmin, wmin);
    EXPECT(hcas == (unsigned)n, "atomicCAS loop counted %u of %d", hcas, n);
    kiln_emu_stats st;
    kiln_emu_get_stats(&st);
    EXPECT(st.blocks > 0 && st.launches > 0, "stats");
    cudaFree(f), cudaFree(dd), cudaFree(is), cudaFree(us), cudaFree(mx), cudaFree(mn), cudaFree(cas);
}

/* ---- Launch validation ---------------------------------------------------------------- */

__global__ void touch_kernel(float *p, int n) {
    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) p[i] += 1.0f;
}

static void test_launch_errors(void) {
    float *d;
    CUDA_OK(cudaMalloc((void **)&d, 64 * sizeof(float)));
    (void)kiln_emu_error_detail();
    KILN_LAUNCH(touch_kernel, 1, 1025, 0, 0, d, 64);
    EXPECT(cudaGetLastError() == cudaErrorInvalidConfiguration, "1025 threads a block");
    EXPECT(strstr(kiln_emu_error_detail(), "touch_kernel") != NULL, "detail names the kernel");
    KILN_LAUNCH(touch_kernel, dim3(1, 0, 1), 32, 0, 0, d, 64);
    EXPECT(cudaGetLastError() == cudaErrorInvalidConfiguration, "zero grid dimension");
    KILN_LAUNCH(touch_kernel, 1, dim3(2, 2, 65), 0, 0, d, 64);
    EXPECT(cudaGetLastError() == cudaErrorInvalidConfiguration, "block.z 65");
    KILN_LAUNCH(touch_kernel, 1, 32, 49 * 1024, 0, d, 64);
    EXPECT(cudaGetLastError() == cudaErrorInvalidValue, "49 KiB of shared memory without opting in");
    EXPECT(cudaGetLastError() == cudaSuccess, "cudaGetLastError resets");
    CUDA_OK(cudaFuncSetAttribute(touch_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024));
    KILN_LAUNCH(touch_kernel, 1, 32, 49 * 1024, 0, d, 64);
    EXPECT(cudaGetLastError() == cudaSuccess, "49 KiB after opting in");

    /* A host pointer as a kernel argument fails the launch, naming it. */
    float host[64];
    (void)kiln_emu_error_detail();
    KILN_LAUNCH(touch_kernel, 1, 64, 0, 0, host, 64);
    EXPECT(cudaGetLastError() == cudaErrorInvalidValue, "host pointer argument");
    const char *msg = kiln_emu_error_detail();
    EXPECT(strstr(msg, "touch_kernel") && strstr(msg, "argument 0") && strstr(msg, "host memory"),
           "message names kernel and argument: '%s'", msg);
    /* Through Kiln's check, the same becomes a Kiln error with the detail. */
    KILN_LAUNCH(touch_kernel, 1, 64, 0, 0, host, 64);
    kiln_status st = kiln_cuda_check_at((int)cudaGetLastError(), "touch_kernel<<<>>>", 0, __FILE__, __LINE__);
    EXPECT(st == KILN_ERR_DEVICE && strstr(kiln_error_message(), "argument 0"), "Kiln error: %s",
           kiln_error_message());

    /* Memory of another device needs peer access. */
    int n = 0;
    CUDA_OK(cudaGetDeviceCount(&n));
    if (n >= 2) {
        float *d1;
        CUDA_OK(cudaSetDevice(1));
        CUDA_OK(cudaMalloc((void **)&d1, 64 * sizeof(float)));
        CUDA_OK(cudaSetDevice(0));
        KILN_LAUNCH(touch_kernel, 1, 64, 0, 0, d1, 64);
        EXPECT(cudaGetLastError() == cudaErrorInvalidValue, "cuda:1 memory on cuda:0 without peer access");
        EXPECT(strstr(kiln_emu_error_detail(), "peer access") != NULL, "detail mentions peer access");
        CUDA_OK(cudaDeviceEnablePeerAccess(1, 0));
        EXPECT(cudaDeviceEnablePeerAccess(1, 0) == cudaErrorPeerAccessAlreadyEnabled, "enabled twice");
        (void)cudaGetLastError();
        KILN_LAUNCH(touch_kernel, 1, 64, 0, 0, d1, 64);
        EXPECT(cudaGetLastError() == cudaSuccess, "with peer access");
        /* A stream of cuda:1 while cuda:0 is current. */
        cudaStream_t s1;
        CUDA_OK(cudaSetDevice(1));
        CUDA_OK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
        CUDA_OK(cudaSetDevice(0));
        KILN_LAUNCH(touch_kernel, 1, 64, 0, s1, d, 64);
        EXPECT(cudaGetLastError() == cudaErrorInvalidResourceHandle, "stream of another device");
        (void)kiln_emu_error_detail();
        CUDA_OK(cudaStreamDestroy(s1));
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaFree(d1));
    }
    /* Copies past the end of an allocation are refused. */
    float big[65];
    EXPECT(cudaMemcpy(d, big, sizeof big, cudaMemcpyHostToDevice) == cudaErrorInvalidValue, "overrun copy");
    EXPECT(strstr(kiln_emu_error_detail(), "past the end") != NULL, "overrun detail");
    EXPECT(cudaMemcpy(big, host, 4, cudaMemcpyHostToDevice) == cudaErrorInvalidValue, "H2D to host memory");
    (void)cudaGetLastError();
    (void)kiln_emu_error_detail();
    CUDA_OK(cudaFree(d));
}

/* ---- Deadlocks abort with a message (in a child process) ------------------------------ */

__global__ void divergent_barrier_kernel(int *p) {
    if (threadIdx.x < 16) {
        __syncthreads();
        p[threadIdx.x] = 1;
    } else {
        p[threadIdx.x] = 2;
        __syncthreads();
    }
}

__global__ void warp_vs_block_kernel(int *p) {
    int v = (int)threadIdx.x;
    if (threadIdx.x == 3) {
        __syncthreads();
    } else {
        v = __shfl_xor_sync(0xFFFFFFFFu, v, 1);
    }
    p[threadIdx.x] = v;
}

/* The child's part: launch the deadlocking kernel; the emulator must abort. */
static int child_main(int which) {
    int *d;
    if (cudaMalloc((void **)&d, 64 * sizeof(int)) != cudaSuccess) return 3;
    if (which == 0)
        KILN_LAUNCH(divergent_barrier_kernel, 1, 32, 0, 0, d);
    else
        KILN_LAUNCH(warp_vs_block_kernel, 1, 32, 0, 0, d);
    cudaDeviceSynchronize();
    return 0; /* not reached if the emulator aborts */
}

/* Runs this program again as `--child which` (a fresh process: a forked
 * copy would have no stream workers); returns its stderr and whether it
 * aborted. */
static bool run_child(int which, char *err, size_t size) {
    int fds[2];
    if (pipe(fds) != 0) return false;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        char arg[8];
        snprintf(arg, sizeof arg, "%d", which);
        execl("/proc/self/exe", "test_emu_kernels", "--child", arg, (char *)NULL);
        _exit(4);
    }
    close(fds[1]);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < size && (r = read(fds[0], err + got, size - 1 - got)) > 0) got += (size_t)r;
    err[got] = 0;
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

static void test_deadlocks(void) {
    char err[4096];
    bool aborted = run_child(0, err, sizeof err);
    EXPECT(aborted, "divergent __syncthreads must abort");
    EXPECT(strstr(err, "divergent __syncthreads") && strstr(err, "divergent_barrier_kernel") &&
               strstr(err, "block (0,0,0)"),
           "message: %s", err);
    aborted = run_child(1, err, sizeof err);
    EXPECT(aborted, "a warp shuffle waiting for a lane at __syncthreads must abort");
    EXPECT(strstr(err, "deadlock") && strstr(err, "warp_vs_block_kernel") && strstr(err, "thread (3,0,0)"),
           "message: %s", err);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--child")) return child_main(atoi(argv[2]));
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        printf("SKIPPED: no emulated CUDA device (KILN_CUDA_EMU_DEVICES=0)\n");
        return 77;
    }
    test_shuffles();
    test_warp_sum();
    test_partial_warp();
    test_votes();
    test_block_reduction();
    test_indices();
    test_atomics();
    test_launch_errors();
    test_deadlocks();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

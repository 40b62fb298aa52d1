/* The CUDA emulator's runtime API: devices and properties, memory capacity
 * and pointer attributes, asynchronous streams (a held stream is really
 * not done; events complete later; timing), the legacy default stream's
 * ordering with blocking streams, pageable copies completing before they
 * return, error names, and the __half / __nv_bfloat16 conversions against
 * Kiln's own (src/base/half.c), bit for bit over all of f16 and a sweep of
 * f32 values (round to nearest even, subnormals, overflow). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu/emu_test_util.h"

__global__ void add_kernel(float *p, float v, int n) {
    for (int i = (int)(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += (int)(gridDim.x * blockDim.x))
        p[i] += v;
}

static void test_devices(void) {
    int n = 0;
    CUDA_OK(cudaGetDeviceCount(&n));
    EXPECT(n == 3, "KILN_CUDA_EMU_DEVICES=3 (set by main) gives %d devices", n);
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 1));
    EXPECT(!strcmp(prop.name, "Kiln CUDA emulator") && prop.major == 8 && prop.minor == 0, "%s %d.%d", prop.name,
           prop.major, prop.minor);
    EXPECT(prop.totalGlobalMem == (size_t)64 << 20, "KILN_CUDA_EMU_MEMORY=64MiB: %zu", prop.totalGlobalMem);
    EXPECT(cudaGetDeviceProperties(&prop, 3) == cudaErrorInvalidDevice, "device 3 of 3");
    EXPECT(cudaSetDevice(5) == cudaErrorInvalidDevice, "set device 5");
    EXPECT(cudaGetLastError() == cudaErrorInvalidDevice && cudaGetLastError() == cudaSuccess, "last error resets");
    int least = 1, greatest = 1;
    CUDA_OK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    EXPECT(least == 0 && greatest < 0, "priority range %d %d", least, greatest);
    EXPECT(!strcmp(cudaGetErrorName(cudaErrorMemoryAllocation), "cudaErrorMemoryAllocation"), "name");
    EXPECT(!strcmp(cudaGetErrorString(cudaErrorNotReady), "device not ready"), "string");
}

static void test_memory(void) {
    CUDA_OK(cudaSetDevice(2));
    size_t free_b = 0, total = 0;
    CUDA_OK(cudaMemGetInfo(&free_b, &total));
    EXPECT(total == (size_t)64 << 20 && free_b == total, "fresh device: %zu of %zu free", free_b, total);
    void *a = nullptr, *b = nullptr;
    CUDA_OK(cudaMalloc(&a, (size_t)40 << 20));
    EXPECT(cudaMalloc(&b, (size_t)30 << 20) == cudaErrorMemoryAllocation, "beyond capacity");
    (void)cudaGetLastError();
    CUDA_OK(cudaMemGetInfo(&free_b, &total));
    EXPECT(free_b == (size_t)24 << 20, "free after 40 MiB: %zu", free_b);
    cudaPointerAttributes attr;
    CUDA_OK(cudaPointerGetAttributes(&attr, (char *)a + 1000));
    EXPECT(attr.type == cudaMemoryTypeDevice && attr.device == 2, "interior pointer of cuda:2: type %d device %d",
           (int)attr.type, attr.device);
    int stack_var = 0;
    CUDA_OK(cudaPointerGetAttributes(&attr, &stack_var));
    EXPECT(attr.type == cudaMemoryTypeUnregistered, "host pointer");
    void *pinned = nullptr;
    CUDA_OK(cudaHostAlloc(&pinned, 1000, cudaHostAllocPortable));
    CUDA_OK(cudaPointerGetAttributes(&attr, pinned));
    EXPECT(attr.type == cudaMemoryTypeHost, "pinned pointer");
    EXPECT(cudaFree(&stack_var) == cudaErrorInvalidValue, "cudaFree of a host pointer");
    EXPECT(cudaFree((char *)a + 8) == cudaErrorInvalidValue, "cudaFree of an interior pointer");
    (void)cudaGetLastError();
    (void)kiln_emu_error_detail();
    CUDA_OK(cudaFree(a));
    CUDA_OK(cudaFreeHost(pinned));
    CUDA_OK(cudaMemGetInfo(&free_b, &total));
    EXPECT(free_b == total, "all free again");
    CUDA_OK(cudaSetDevice(0));
}

static void test_async_streams(void) {
    const int n = 10007;
    float *d, *pinned;
    CUDA_OK(cudaMalloc((void **)&d, n * sizeof(float)));
    CUDA_OK(cudaHostAlloc((void **)&pinned, n * sizeof(float), 0));
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, -1));
    int prio = 0;
    CUDA_OK(cudaStreamGetPriority(s, &prio));
    EXPECT(prio == -1, "priority %d", prio);
    cudaEvent_t start, end, plain;
    CUDA_OK(cudaEventCreate(&start));
    CUDA_OK(cudaEventCreate(&end));
    CUDA_OK(cudaEventCreateWithFlags(&plain, cudaEventDisableTiming));
    EXPECT(cudaEventQuery(plain) == cudaSuccess, "a never-recorded event is complete");
    CUDA_OK(kiln_emu_hold_stream(s, true));
    CUDA_OK(cudaMemsetAsync(d, 0, n * sizeof(float), s));
    CUDA_OK(cudaEventRecord(start, s));
    KILN_LAUNCH(add_kernel, 7, 96, 0, s, d, 1.5f, n);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaEventRecord(end, s));
    CUDA_OK(cudaEventRecord(plain, s));
    CUDA_OK(cudaMemcpyAsync(pinned, d, n * sizeof(float), cudaMemcpyDeviceToHost, s));
    EXPECT(cudaStreamQuery(s) == cudaErrorNotReady, "held stream has work");
    EXPECT(cudaEventQuery(end) == cudaErrorNotReady, "its event is not complete");
    float ms = 0;
    EXPECT(cudaEventElapsedTime(&ms, start, end) == cudaErrorNotReady, "elapsed time before completion");
    EXPECT(cudaGetLastError() == cudaErrorNotReady, "elapsed-time error recorded");
    CUDA_OK(kiln_emu_hold_stream(s, false));
    CUDA_OK(cudaStreamSynchronize(s));
    EXPECT(cudaStreamQuery(s) == cudaSuccess && cudaEventQuery(end) == cudaSuccess, "done after synchronize");
    CUDA_OK(cudaEventElapsedTime(&ms, start, end));
    EXPECT(ms >= 0, "elapsed %g ms", ms);
    EXPECT(cudaEventElapsedTime(&ms, start, plain) == cudaErrorInvalidResourceHandle, "no timing");
    (void)cudaGetLastError();
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (pinned[i] != 1.5f) bad++;
    EXPECT(bad == 0, "%d elements wrong after memset + kernel + async D2H", bad);

    /* A pageable copy completes before the call returns, even on a held
     * stream's device: it is queued on the given stream, so release first. */
    float host[16];
    for (int i = 0; i < 16; i++) host[i] = (float)i;
    CUDA_OK(cudaMemcpyAsync(d, host, sizeof host, cudaMemcpyHostToDevice, s));
    for (int i = 0; i < 16; i++) host[i] = -1.0f; /* the copy has already read it */
    CUDA_OK(cudaMemcpy(pinned, d, sizeof host, cudaMemcpyDeviceToHost));
    EXPECT(pinned[3] == 3.0f && pinned[15] == 15.0f, "pageable H2D copied before returning: %g", pinned[3]);

    /* Legacy default stream vs a blocking stream: work on the legacy stream
     * waits for work queued earlier on the blocking stream. */
    cudaStream_t blocking;
    CUDA_OK(cudaStreamCreate(&blocking));
    CUDA_OK(kiln_emu_hold_stream(blocking, true));
    CUDA_OK(cudaMemsetAsync(d, 0, n * sizeof(float), blocking));
    KILN_LAUNCH(add_kernel, 3, 128, 0, cudaStreamLegacy, d, 2.0f, n); /* must run after the memset */
    EXPECT(cudaStreamQuery(cudaStreamLegacy) == cudaErrorNotReady, "legacy stream waits for the blocking stream");
    CUDA_OK(kiln_emu_hold_stream(blocking, false));
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(pinned, d, n * sizeof(float), cudaMemcpyDeviceToHost));
    EXPECT(pinned[0] == 2.0f && pinned[n - 1] == 2.0f, "ordered: %g %g", pinned[0], pinned[n - 1]);

    CUDA_OK(cudaEventDestroy(start));
    CUDA_OK(cudaEventDestroy(end));
    CUDA_OK(cudaEventDestroy(plain));
    EXPECT(cudaEventQuery(plain) == cudaErrorInvalidResourceHandle, "destroyed event");
    CUDA_OK(cudaStreamDestroy(s));
    CUDA_OK(cudaStreamDestroy(blocking));
    EXPECT(cudaStreamQuery(s) == cudaErrorInvalidResourceHandle, "destroyed stream");
    (void)cudaGetLastError();
    CUDA_OK(cudaFree(d));
    CUDA_OK(cudaFreeHost(pinned));
}

/* Cross-device event wait: cuda:1's stream waits for an event of cuda:0. */
static void test_cross_device_wait(void) {
    const int n = 5000;
    float *d0, *d1, h[n];
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(cudaMalloc((void **)&d0, sizeof h));
    cudaStream_t s0, s1;
    CUDA_OK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
    cudaEvent_t e0;
    CUDA_OK(cudaEventCreateWithFlags(&e0, cudaEventDisableTiming));
    CUDA_OK(cudaSetDevice(1));
    CUDA_OK(cudaMalloc((void **)&d1, sizeof h));
    CUDA_OK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(kiln_emu_hold_stream(s0, true));
    CUDA_OK(cudaMemsetAsync(d0, 0, sizeof h, s0));
    KILN_LAUNCH(add_kernel, 4, 64, 0, s0, d0, 4.0f, n);
    CUDA_OK(cudaEventRecord(e0, s0));
    EXPECT(cudaEventRecord(e0, s1) == cudaErrorInvalidResourceHandle, "event of cuda:0 on a cuda:1 stream");
    (void)cudaGetLastError();
    (void)kiln_emu_error_detail();
    CUDA_OK(cudaStreamWaitEvent(s1, e0, 0));
    CUDA_OK(cudaMemcpyPeerAsync(d1, 1, d0, 0, sizeof h, s1));
    EXPECT(cudaStreamQuery(s1) == cudaErrorNotReady, "cuda:1 waits for cuda:0's held work");
    CUDA_OK(kiln_emu_hold_stream(s0, false));
    CUDA_OK(cudaStreamSynchronize(s1));
    CUDA_OK(cudaMemcpy(h, d1, sizeof h, cudaMemcpyDeviceToHost));
    EXPECT(h[0] == 4.0f && h[n - 1] == 4.0f, "peer copy after the wait: %g %g", h[0], h[n - 1]);
    EXPECT(cudaMemcpyPeerAsync(d1, 0, d0, 0, sizeof h, s1) == cudaErrorInvalidValue, "wrong device for dst");
    (void)cudaGetLastError();
    (void)kiln_emu_error_detail();
    CUDA_OK(cudaStreamDestroy(s0));
    CUDA_OK(cudaStreamDestroy(s1));
    CUDA_OK(cudaEventDestroy(e0));
    CUDA_OK(cudaFree(d0));
    CUDA_OK(cudaFree(d1));
}

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Bit-for-bit against src/base/half.c for non-NaN values (NaN payloads are
 * handled by the kernels themselves, as CUDA gives one canonical NaN). */
static void test_half_conversions(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF)) continue;
        float a = __half2float(__ushort_as_half((unsigned short)h));
        float b = kiln_f16_to_f32((uint16_t)h);
        if (bits_of(a) != bits_of(b)) bad++;
    }
    EXPECT(bad == 0, "%d f16 -> f32 differences", bad);
    bad = 0;
    int bad_bf = 0;
    uint64_t count = 0;
    /* Every 7919th f32 bit pattern plus the values around f16's edges. */
    for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 7919) {
        float f = float_of((uint32_t)u);
        if (f != f) continue;
        count++;
        if (__half_as_ushort(__float2half_rn(f)) != kiln_f32_to_f16(f)) bad++;
        if (__bfloat16_as_ushort(__float2bfloat16_rn(f)) != kiln_f32_to_bf16(f)) bad_bf++;
    }
    const float edges[] = {65504.0f, 65519.99f, 65520.0f, 65536.0f, 5.9604645e-8f, 2.9802322e-8f, 2.9802326e-8f,
                           6.1035156e-5f, 6.1035152e-5f, 1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, -0.0f, 1e-30f};
    for (float f : edges)
        for (int sign = 0; sign < 2; sign++) {
            float v = sign ? -f : f;
            if (__half_as_ushort(__float2half_rn(v)) != kiln_f32_to_f16(v)) bad++;
            if (__bfloat16_as_ushort(__float2bfloat16_rn(v)) != kiln_f32_to_bf16(v)) bad_bf++;
        }
    EXPECT(bad == 0, "%d f32 -> f16 differences in %llu values", bad, (unsigned long long)count);
    EXPECT(bad_bf == 0, "%d f32 -> bf16 differences", bad_bf);
    EXPECT(__half_as_ushort(__float2half_rn(NAN)) == 0x7FFF, "CUDA's canonical half NaN");
    __half x = __float2half(1.5f), y = __float2half(2.25f);
    EXPECT((float)__hadd(x, y) == 3.75f && (float)__hmul(x, y) == 3.375f, "half arithmetic");
}

int main(void) {
    setenv("KILN_CUDA_EMU_DEVICES", "3", 1);
    setenv("KILN_CUDA_EMU_MEMORY", "64MiB", 1);
    setenv("KILN_CUDA_EMU_QUIET", "1", 1);
    test_devices();
    test_memory();
    test_async_streams();
    test_cross_device_wait();
    test_half_conversions();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

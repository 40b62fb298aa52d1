/* A training step in steady state allocates no memory: after the first
 * steps (primitive creation, the optimizer's state, the caching
 * allocator's segments), further steps of the tutorial CNN (forward,
 * cross-entropy, backward, fused Adam, zero_grad) make no raw allocation —
 * checked two ways:
 *   - the CPU caching allocator's statistics: num_device_alloc and the
 *     segment count do not move;
 *   - a malloc-counting interposer (this file defines malloc, calloc,
 *     realloc, posix_memalign, aligned_alloc and memalign over glibc's
 *     __libc_* entry points), so nothing allocates data buffers behind the
 *     allocator's back (oneDNN, OpenMP, a kernel's temporaries). Requests
 *     of 4 KiB and more count; smaller ones are the host-side records every
 *     step creates and frees (tensor handles, graph nodes — as PyTorch's),
 *     which the test reports but does not forbid.
 * The interposer cannot sit beside a sanitizer's own malloc: sanitizer
 * builds skip the malloc half and keep the statistics half. */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <stdatomic.h>

#include "../test_util.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif

#define BIG 4096

static atomic_bool counting;

#if !defined(SANITIZED) && defined(__GLIBC__)
#define INTERPOSED 1
static atomic_long big_allocs, small_allocs;
static atomic_long biggest;
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
void *memalign(size_t align, size_t n); /* glibc's malloc.h declares it; not included here */

static void note(size_t bytes) {
    if (!atomic_load_explicit(&counting, memory_order_relaxed)) return;
    if (bytes >= BIG) {
        atomic_fetch_add(&big_allocs, 1);
        long b = atomic_load(&biggest);
        while ((long)bytes > b && !atomic_compare_exchange_weak(&biggest, &b, (long)bytes)) {
        }
    } else {
        atomic_fetch_add(&small_allocs, 1);
    }
}

void *malloc(size_t n) {
    note(n);
    return __libc_malloc(n);
}
void *calloc(size_t a, size_t b) {
    note(a * b);
    return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n) {
    note(n);
    return __libc_realloc(p, n);
}
void *memalign(size_t align, size_t n) {
    note(n);
    return __libc_memalign(align, n);
}
void *aligned_alloc(size_t align, size_t n) {
    note(n);
    return __libc_memalign(align, n);
}
/* oneDNN's f32 matmul on a CPU without AVX-512 is its gemm:jit driver,
 * which packs the operands into buffers it posix_memaligns itself on each
 * large call (no scratchpad hook reaches them). Those are told apart by
 * the caller's library and, on such a CPU only, reported and allowed. */
static atomic_long dnnl_gemm_allocs;
int posix_memalign(void **out, size_t align, size_t n) {
    Dl_info info;
    if (n >= BIG && atomic_load_explicit(&counting, memory_order_relaxed) &&
        dladdr(__builtin_return_address(0), &info) && info.dli_fname && strstr(info.dli_fname, "libdnnl"))
        atomic_fetch_add(&dnnl_gemm_allocs, 1);
    note(n);
    void *p = __libc_memalign(align, n);
    if (!p) return 12; /* ENOMEM */
    *out = p;
    return 0;
}
#endif

static kiln_status one_step(kiln_module *m, kiln_optimizer *o, kiln_tensor *x, kiln_tensor *y) {
    kiln_scope_begin();
    kiln_loss_opts lo = kiln_loss_defaults();
    kiln_tensor *logits = kiln_module_forward(m, x);
    kiln_tensor *loss = logits ? kiln_cross_entropy(logits, y, &lo) : NULL;
    kiln_status st = loss ? kiln_backward(loss, NULL, false) : kiln_error_last()->status;
    if (!st) st = kiln_optimizer_step(o);
    if (!st) st = kiln_optimizer_zero_grad(o, true);
    kiln_status end = kiln_scope_end();
    return st ? st : end;
}

int main(void) {
    if (kiln_init()) return 1;
    kiln_module *m = NULL;
    const char *spec = KILN_SOURCE_DIR "/models/tutorial_cnn_28x28x1.txt";
    CHECK_OK(kiln_model_spec_load(spec, 1, 28, 28, &m));
    if (!m) return kt_finish();
    kiln_manual_seed(3);
    kiln_tensor *x = kiln_randn(KILN_SHAPE(32, 1, 28, 28), KILN_F32, KILN_CPU);
    int64_t labels[32];
    for (int i = 0; i < 32; i++) labels[i] = i % 10;
    kiln_tensor *y = kiln_from_data(KILN_SHAPE(32), KILN_I64, KILN_CPU, labels);
    kiln_tensor **ps = NULL;
    int n = 0;
    CHECK_OK(kiln_module_parameters(m, &ps, &n));
    kiln_optimizer *o = kiln_adam(ps, n, NULL);
    free(ps);
    for (int i = 0; i < 3; i++) CHECK_OK(one_step(m, o, x, y)); /* warm-up */
    kiln_memory_stats before, after;
    CHECK_OK(kiln_memory_stats_get(KILN_CPU, &before));
    atomic_store(&counting, true);
    const int steps = 4;
    for (int i = 0; i < steps; i++) CHECK_OK(one_step(m, o, x, y));
    atomic_store(&counting, false);
    CHECK_OK(kiln_memory_stats_get(KILN_CPU, &after));
    printf("steady state, %d steps: %lld raw allocations by the caching allocator, segments %lld -> %lld\n", steps,
           (long long)(after.num_device_alloc - before.num_device_alloc),
           (long long)before.segment[KILN_POOL_ALL].current, (long long)after.segment[KILN_POOL_ALL].current);
    CHECK_MSG(after.num_device_alloc == before.num_device_alloc, "the caching allocator made %lld raw allocations",
              (long long)(after.num_device_alloc - before.num_device_alloc));
    CHECK(after.segment[KILN_POOL_ALL].current == before.segment[KILN_POOL_ALL].current);
#ifdef INTERPOSED
    printf("malloc family: %ld calls of >= %d bytes (largest %ld), %ld smaller (host-side records)\n",
           atomic_load(&big_allocs), BIG, atomic_load(&biggest), atomic_load(&small_allocs));
    long big = atomic_load(&big_allocs), gemm = atomic_load(&dnnl_gemm_allocs);
    __builtin_cpu_init();
    bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    if (!avx512 && gemm) {
        printf("of which %ld are oneDNN's gemm:jit packing buffers (this CPU has no AVX-512): allowed here\n", gemm);
        big -= gemm;
    }
    CHECK_MSG(big == 0, "%ld allocations of >= %d bytes behind the allocator's back (largest %ld)", big, BIG,
              atomic_load(&biggest));
    CHECK(atomic_load(&small_allocs) > 0); /* the interposer is in the path at all */
#else
    printf("sanitizer build: the malloc interposer is left out (the sanitizer owns malloc)\n");
#endif
    kiln_optimizer_free(o);
    kiln_module_free(m);
    kiln_release(x);
    kiln_release(y);
    kiln_shutdown();
    return kt_finish();
}

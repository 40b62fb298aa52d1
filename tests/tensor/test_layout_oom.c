/* Converting a tensor in an opaque layout (nChw16c) back to strided
 * allocates a new block; when that allocation fails (here: the CPU
 * allocator's limit, kiln_memory_set_limit) the error comes back from
 * every path that converts — kiln_tensor_strided itself, the fused
 * optimizer step, anomaly mode's scan of an op's output, kiln_to_host,
 * kiln_copy_ — instead of aborting, and the tensor keeps its layout and
 * values, so the same call succeeds once memory is there. */
#include "../test_util.h"
#include "kernels/kernels.h"
#include "tensor/tensor_internal.h"

/* (1, 64, 256, 256) f32: 16 MiB, over the 10 MiB up to which the
 * allocator packs blocks into shared 20 MiB segments: each tensor has a
 * segment of its own, so a limit at what is reserved leaves no room. */
#define N 1
#define C 64
#define H 256
#define W 256

static kiln_tensor *pattern(int salt) {
    int64_t n = (int64_t)N * C * H * W;
    float *v = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) v[i] = (float)((((i + salt) * 7919) % 23) - 11) / 8.0f;
    kiln_tensor *t = kiln_from_data(KILN_SHAPE(N, C, H, W), KILN_F32, KILN_CPU, v);
    free(v);
    return t;
}

/* A blocked copy of a contiguous strided f32 (N, C, H, W). */
static kiln_tensor *blocked_copy(kiln_tensor *src) {
    kiln_tensor *b = kiln_empty(kiln_shape_of(src), KILN_F32, KILN_CPU);
    kiln_cpu_reorder_nchw16c(kiln_data_ptr(b), kiln_data_ptr(src), 4, kiln_shape_of(src).d, true);
    kiln_tensor_set_layout(b, KILN_LAYOUT_NCHW16C);
    return b;
}

/* No new segment may be reserved from here on (plus `spare` bytes). */
static void cap_memory(size_t spare) {
    CHECK_OK(kiln_empty_cache(KILN_CPU));
    CHECK_OK(kiln_memory_set_limit(KILN_CPU, kiln_memory_reserved(KILN_CPU) + spare));
}

static void uncap_memory(void) { CHECK_OK(kiln_memory_set_limit(KILN_CPU, 0)); }

static bool same_values(kiln_tensor *a, kiln_tensor *b) {
    size_t bytes = sizeof(float) * (size_t)kiln_numel(a);
    float *va = malloc(bytes), *vb = malloc(bytes);
    bool same = !kiln_to_host(a, va, bytes) && !kiln_to_host(b, vb, bytes) && !memcmp(va, vb, bytes);
    free(va), free(vb);
    return same;
}

static void test_strided_reports(void) {
    kiln_tensor *x = pattern(1), *b = blocked_copy(x);
    cap_memory(0);
    kiln_strided view = {.ndim = -7};
    CHECK_FAILS(kiln_tensor_strided(b, &view), KILN_ERR_OUT_OF_MEMORY, "out of memory");
    CHECK(view.ndim == -7); /* left as it was */
    CHECK(kiln_layout_of(b) == KILN_LAYOUT_NCHW16C);
    size_t bytes = sizeof(float) * (size_t)kiln_numel(b);
    float *host = malloc(bytes);
    CHECK_FAILS(kiln_to_host(b, host, bytes), KILN_ERR_OUT_OF_MEMORY, "out of memory");
    CHECK_FAILS(kiln_copy_(x, b, 0), KILN_ERR_OUT_OF_MEMORY, "out of memory");
    uncap_memory();
    CHECK_OK(kiln_tensor_strided(b, &view));
    CHECK(view.ndim == 4 && view.layout == KILN_LAYOUT_STRIDED && view.data == kiln_data_ptr(b));
    CHECK(same_values(x, b));
    free(host);
    kiln_release(x), kiln_release(b);
}

/* A parameter left in nChw16c reaches the fused update, which reads flat
 * memory: the step converts it, and reports running out of memory. */
static void test_optimizer_step_reports(bool adam) {
    kiln_tensor *x = pattern(2), *p = blocked_copy(x), *g = pattern(3);
    CHECK_OK(kiln_set_requires_grad(p, true));
    CHECK_OK(kiln_set_grad(p, g));
    kiln_adam_opts ao = kiln_adam_defaults();
    kiln_sgd_opts so = kiln_sgd_defaults(0.1);
    kiln_optimizer *o = adam ? kiln_adam(&p, 1, &ao) : kiln_sgd(&p, 1, &so);
    CHECK(o != NULL);
    /* Adam's state (two 16 MiB zeros) fits; the conversion does not. */
    cap_memory(adam ? (size_t)2 * N * C * H * W * sizeof(float) : 0);
    CHECK_FAILS(kiln_optimizer_step(o), KILN_ERR_OUT_OF_MEMORY, "out of memory");
    CHECK(kiln_layout_of(p) == KILN_LAYOUT_NCHW16C);
    uncap_memory();
    CHECK_OK(kiln_optimizer_step(o));
    CHECK(kiln_layout_of(p) == KILN_LAYOUT_STRIDED);
    kiln_optimizer_free(o);
    kiln_release(x), kiln_release(p), kiln_release(g);
}

/* Anomaly mode scans each op's outputs; the sum of two blocked tensors is
 * blocked, so the scan converts it. Room for the output, none for the
 * conversion: the op fails with the allocator's error. */
static void test_anomaly_scan_reports(void) {
    kiln_tensor *x = pattern(4), *a = blocked_copy(x), *b = blocked_copy(x);
    kiln_set_detect_anomaly(true);
    cap_memory((size_t)N * C * H * W * sizeof(float));
    CHECK_NULL_ERR(kiln_add(a, b), "out of memory");
    uncap_memory();
    kiln_tensor *s = kiln_add(a, b);
    CHECK_MSG(s != NULL, "%s", kiln_error_message());
    kiln_set_detect_anomaly(false);
    kiln_release(s), kiln_release(x), kiln_release(a), kiln_release(b);
}

int main(void) {
    CHECK_OK(kiln_init());
    test_strided_reports();
    test_optimizer_step_reports(false);
    test_optimizer_step_reports(true);
    test_anomaly_scan_reports();
    kiln_shutdown();
    return kt_finish();
}

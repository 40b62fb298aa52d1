/* kiln_to is differentiable, as PyTorch's .to(): the gradient of a copy to
 * another dtype or device returns to the source's dtype and device.
 *   - on the CPU: f32 -> f64, f32 -> f16 -> f32, a KILN_COPY clone, an
 *     integer target (no gradient), no_grad (nothing recorded);
 *   - with CUDA devices (the emulation build's cuda:0 and cuda:1, or a GPU):
 *     cpu -> cuda:0 and a two-layer model split over cuda:0 and cuda:1,
 *     compared with the same model on the CPU (f32 tolerance);
 *   - the peer copy waits for the source device's stream: with the source's
 *     stream held back (emulation only), a copy that did not wait would read
 *     the source before it is written;
 *   - the backward copy is ordered the same way: the gradient computed on a
 *     held stream of the destination device returns to the source device
 *     only once written;
 *   - both sides stay alive: the source, dropped while the copy is still
 *     queued on a held stream, is not handed to a new tensor that
 *     overwrites it before the copy has read it (the source's stream waits
 *     for the copy, which is what record_stream would otherwise do).
 * The CPU part runs everywhere; the device parts skip visibly without one. */
#include <stdbool.h>

#include "runtime/runtime_internal.h"
#include "test_util.h"
#ifdef KILN_CUDA_EMULATION
#include "emu/kiln_emu_api.h"
#endif

/* Every element of t (any device, any float dtype) as doubles on the host. */
static void host_values(kiln_tensor *t, double *out, int64_t n) {
    kiln_tensor *h = kiln_to(t, KILN_CPU, KILN_F64, 0);
    CHECK(h != NULL && kiln_numel(h) == n);
    if (h) CHECK_OK(kiln_to_host(h, out, (size_t)n * sizeof(double)));
    kiln_release(h);
}

static kiln_tensor *leaf_f32(const float *v, int64_t rows, int64_t cols, kiln_device dev) {
    kiln_tensor *host = kiln_from_data(KILN_SHAPE(rows, cols), KILN_F32, KILN_CPU, v);
    kiln_tensor *t = kiln_to(host, dev, KILN_F32, KILN_COPY);
    kiln_release(host);
    CHECK_OK(kiln_set_requires_grad(t, true));
    return t;
}

/* loss = sum(y * y * c) for y = to(x, dtype): dx = 2 c x, in x's dtype. */
static void test_dtype_round_trips(void) {
    kiln_scope_begin();
    float xv[6] = {0.5f, -1.25f, 2.0f, 3.5f, -0.75f, 1.0f};
    kiln_tensor *x = leaf_f32(xv, 2, 3, KILN_CPU);
    kiln_tensor *y = kiln_to(x, KILN_CPU, KILN_F64, 0);
    CHECK(kiln_requires_grad(y));
    kiln_tensor *c = kiln_full(KILN_SHAPE(2, 3), 3.0, KILN_F64, KILN_CPU);
    CHECK_OK(kiln_backward(kiln_sum(kiln_mul(kiln_mul(y, y), c), 0, NULL, false), NULL, false));
    kiln_tensor *g = kiln_grad(x);
    CHECK(g && kiln_dtype_of(g) == KILN_F32);
    double gv[6];
    host_values(g, gv, 6);
    for (int i = 0; i < 6; i++) CHECK_MSG(gv[i] == 6.0 * xv[i], "f64 copy: grad[%d] %g, want %g", i, gv[i], 6.0 * xv[i]);

    /* f32 -> f16 -> f32 (values exact in f16): the gradient passes both. */
    CHECK_OK(kiln_set_grad(x, NULL));
    kiln_tensor *h = kiln_to(kiln_to(x, KILN_CPU, KILN_F16, 0), KILN_CPU, KILN_F32, 0);
    CHECK_OK(kiln_backward(kiln_sum(kiln_mul(h, h), 0, NULL, false), NULL, false));
    g = kiln_grad(x);
    CHECK(g && kiln_dtype_of(g) == KILN_F32);
    host_values(g, gv, 6);
    for (int i = 0; i < 6; i++) CHECK_MSG(gv[i] == 2.0 * xv[i], "f16 round trip: grad[%d] %g", i, gv[i]);

    /* A clone (KILN_COPY, same device and dtype) is differentiable too. */
    CHECK_OK(kiln_set_grad(x, NULL));
    kiln_tensor *cl = kiln_to(x, KILN_CPU, KILN_F32, KILN_COPY);
    CHECK_OK(kiln_backward(kiln_sum(kiln_mul_scalar(cl, 4.0), 0, NULL, false), NULL, false));
    host_values(kiln_grad(x), gv, 6);
    for (int i = 0; i < 6; i++) CHECK(gv[i] == 4.0);

    /* An integer copy carries no gradient; under no_grad nothing is recorded. */
    kiln_tensor *ints = kiln_to(x, KILN_CPU, KILN_I64, 0);
    CHECK(ints && !kiln_requires_grad(ints));
    kiln_no_grad_begin();
    kiln_tensor *ng = kiln_to(x, KILN_CPU, KILN_F64, 0);
    kiln_grad_mode_end();
    CHECK(ng && !kiln_requires_grad(ng));
    kiln_scope_end();
}

/* out = relu(x @ w1) @ w2 with w1 and x on d0 and w2 on d1 (a kiln_to
 * between them); returns loss = sum(out^2) computed on d1. */
static kiln_tensor *split_forward(kiln_tensor *x, kiln_tensor *w1, kiln_tensor *w2, kiln_device d1) {
    kiln_tensor *hid = kiln_relu(kiln_matmul(x, w1));
    kiln_tensor *moved = kiln_to(hid, d1, KILN_F32, 0);
    kiln_tensor *out = kiln_matmul(moved, w2);
    return kiln_sum(kiln_mul(out, out), 0, NULL, false);
}

enum { B = 5, I = 7, H = 6, O = 3 }; /* odd sizes */

/* The gradients of w1, w2 and x for the model split over (d0, d1), as
 * doubles: w1 then w2 then x. */
static void split_grads(kiln_device d0, kiln_device d1, const float *xv, const float *w1v, const float *w2v,
                        double *g) {
    kiln_scope_begin();
    kiln_tensor *x = leaf_f32(xv, B, I, d0), *w1 = leaf_f32(w1v, I, H, d0), *w2 = leaf_f32(w2v, H, O, d1);
    CHECK_OK(kiln_backward(split_forward(x, w1, w2, d1), NULL, false));
    kiln_tensor *gw1 = kiln_grad(w1), *gw2 = kiln_grad(w2), *gx = kiln_grad(x);
    CHECK_MSG(gw1 && gw2 && gx, "a part of the split model got no gradient");
    if (gw1 && gw2 && gx) {
        CHECK(kiln_device_equal(kiln_get_device(gw1), d0) && kiln_device_equal(kiln_get_device(gx), d0));
        CHECK(kiln_device_equal(kiln_get_device(gw2), d1));
        host_values(gw1, g, I * H);
        host_values(gw2, g + I * H, H * O);
        host_values(gx, g + I * H + H * O, B * I);
    }
    kiln_scope_end();
}

static void fill(float *v, int n, unsigned seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        v[i] = (float)((int)(seed >> 16 & 0xff) - 128) / 97.0f;
    }
}

static void test_split_model(kiln_device d0, kiln_device d1) {
    float xv[B * I], w1v[I * H], w2v[H * O];
    fill(xv, B * I, 1), fill(w1v, I * H, 2), fill(w2v, H * O, 3);
    enum { N = I * H + H * O + B * I };
    double want[N], got[N];
    split_grads(KILN_CPU, KILN_CPU, xv, w1v, w2v, want);
    split_grads(d0, d1, xv, w1v, w2v, got);
    double err = 0, norm = 0;
    for (int i = 0; i < N; i++) err += (got[i] - want[i]) * (got[i] - want[i]), norm += want[i] * want[i];
    char a[32], b[32];
    CHECK_MSG(norm > 0 && sqrt(err / norm) < 1e-5, "split over %s/%s: relative gradient error %g",
              kiln_device_str(d0, a, sizeof a), kiln_device_str(d1, b, sizeof b), sqrt(err / (norm > 0 ? norm : 1)));
}

#ifdef KILN_CUDA_EMULATION
/* src (on d0) is filled by a kernel on a held side stream of d0, made
 * d0's current stream, then copied to d1; the copy must wait for that
 * stream, so after the release the copy holds the value. A copy that
 * skipped the wait reads the old contents (zeros). */
static void test_peer_copy_waits(kiln_device d0, kiln_device d1) {
    kiln_scope_begin();
    enum { N = 4099 };
    kiln_tensor *src = kiln_zeros(KILN_SHAPE(N), KILN_F32, d0);
    kiln_tensor *val = kiln_full(KILN_SHAPE(N), 2.5, KILN_F32, d0);
    CHECK_OK(kiln_device_synchronize(d0));
    kiln_stream *side = NULL;
    CHECK_OK(kiln_stream_create(d0, 0, &side));
    kiln_tensor *dst = NULL;
    if (side) {
        kiln_stream_guard g = kiln_stream_guard_begin(side);
        CHECK(kiln_emu_hold_stream((cudaStream_t)kiln_stream_handle(side), true) == cudaSuccess);
        CHECK_OK(kiln_copy_(src, val, 0)); /* queued on the held stream */
        dst = kiln_to(src, d1, KILN_F32, 0);
        CHECK(kiln_emu_hold_stream((cudaStream_t)kiln_stream_handle(side), false) == cudaSuccess);
        kiln_stream_guard_end(&g);
    }
    double v[N];
    host_values(dst, v, N);
    int wrong = 0;
    for (int i = 0; i < N; i++) wrong += v[i] != 2.5;
    CHECK_MSG(wrong == 0, "%d of %d elements copied before the source was written", wrong, N);
    CHECK_OK(kiln_device_synchronize(d0));
    if (side) CHECK_OK(kiln_stream_destroy(side));
    kiln_scope_end();
}

/* w (leaf on d0) -> y = to(w, d1); loss = sum(y * c) on d1, computed and
 * backpropagated with a held side stream current on d1. The backward copy
 * of dy = c to d0 must wait for that stream: after the release, w.grad is
 * c. A backward copy that skipped the wait reads dy before it is written. */
static void test_backward_copy_waits(kiln_device d0, kiln_device d1) {
    kiln_scope_begin();
    enum { R = 3, C = 1367 };
    static float wv[R * C], cv[R * C];
    for (int i = 0; i < R * C; i++) wv[i] = (float)(i % 7) - 3.0f, cv[i] = 0.25f * (float)(i % 5) + 0.5f;
    kiln_tensor *w = leaf_f32(wv, R, C, d0);
    kiln_tensor *c = kiln_to(kiln_from_data(KILN_SHAPE(R, C), KILN_F32, KILN_CPU, cv), d1, KILN_F32, 0);
    CHECK_OK(kiln_device_synchronize(d0));
    CHECK_OK(kiln_device_synchronize(d1));
    kiln_stream *side = NULL;
    CHECK_OK(kiln_stream_create(d1, 0, &side));
    if (side) {
        kiln_stream_guard g = kiln_stream_guard_begin(side);
        CHECK(kiln_emu_hold_stream((cudaStream_t)kiln_stream_handle(side), true) == cudaSuccess);
        kiln_tensor *y = kiln_to(w, d1, KILN_F32, 0);
        kiln_tensor *loss = kiln_sum(kiln_mul(y, c), 0, NULL, false);
        CHECK_OK(kiln_backward(loss, NULL, false));
        CHECK(kiln_emu_hold_stream((cudaStream_t)kiln_stream_handle(side), false) == cudaSuccess);
        kiln_stream_guard_end(&g);
    }
    static double gv[R * C];
    kiln_tensor *gw = kiln_grad(w);
    CHECK(gw && kiln_device_equal(kiln_get_device(gw), d0));
    if (gw) host_values(gw, gv, R * C);
    int wrong = 0;
    for (int i = 0; gw && i < R * C; i++) wrong += gv[i] != cv[i];
    CHECK_MSG(wrong == 0, "backward copy: %d of %d gradient elements read before they were written", wrong, R * C);
    CHECK_OK(kiln_device_synchronize(d1));
    if (side) CHECK_OK(kiln_stream_destroy(side));
    kiln_scope_end();
}

/* src on d0 is copied to d1 on a held stream of d1, then dropped; a new
 * tensor of the same size on d0 (which the caching allocator may place in
 * src's block) is filled at once. The copy, released afterwards, must read
 * src's values, not the fill. */
static void test_copy_keeps_source(kiln_device d0, kiln_device d1) {
    kiln_scope_begin();
    enum { N = 6151 };
    kiln_tensor *src = kiln_full(KILN_SHAPE(N), 1.5, KILN_F32, d0);
    CHECK_OK(kiln_device_synchronize(d0));
    kiln_stream *side = NULL;
    CHECK_OK(kiln_stream_create(d1, 0, &side));
    kiln_tensor *dst = NULL;
    if (side) {
        kiln_stream_guard g = kiln_stream_guard_begin(side);
        CHECK(kiln_emu_hold_stream((cudaStream_t)kiln_stream_handle(side), true) == cudaSuccess);
        dst = kiln_to(src, d1, KILN_F32, 0);
        kiln_release(src);
        kiln_tensor *reuse = kiln_full(KILN_SHAPE(N), -4.0, KILN_F32, d0);
        CHECK(reuse != NULL);
        CHECK(kiln_emu_hold_stream((cudaStream_t)kiln_stream_handle(side), false) == cudaSuccess);
        kiln_stream_guard_end(&g);
        CHECK_OK(kiln_stream_wait_stream(kiln_current_stream(d1), side)); /* dst is read on d1's default stream */
    }
    static double v[N];
    if (dst) host_values(dst, v, N);
    int wrong = 0;
    for (int i = 0; dst && i < N; i++) wrong += v[i] != 1.5;
    CHECK_MSG(wrong == 0, "cuda:%d -> cuda:%d: %d of %d elements of the copy read after the source's memory was reused",
              d0.index, d1.index, wrong, N);
    CHECK_OK(kiln_device_synchronize(d0));
    if (side) CHECK_OK(kiln_stream_destroy(side));
    kiln_scope_end();
}
#endif

int main(void) {
    CHECK_OK(kiln_init());
    test_dtype_round_trips();
    int n = kiln_device_count(KILN_DEVICE_CUDA);
    if (n < 1) {
        printf("SKIPPED the device parts: no CUDA device (the CPU part ran)\n");
        kiln_shutdown();
        return kt_finish();
    }
    kiln_device c0 = {KILN_DEVICE_CUDA, 0}, c1 = {KILN_DEVICE_CUDA, 1};
    test_split_model(KILN_CPU, c0);
    test_split_model(c0, KILN_CPU);
    if (n >= 2) {
        test_split_model(c0, c1);
        test_split_model(c1, c0);
#ifdef KILN_CUDA_EMULATION
        test_peer_copy_waits(c0, c1);
        test_peer_copy_waits(c1, c0);
        test_backward_copy_waits(c0, c1);
        test_backward_copy_waits(c1, c0);
        test_copy_keeps_source(c0, c1);
        test_copy_keeps_source(c1, c0);
#endif
    } else {
        printf("SKIPPED the cuda:0/cuda:1 parts: one CUDA device\n");
    }
    kiln_shutdown();
    return kt_finish();
}

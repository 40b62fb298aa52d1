/* The host side of a training step on emulated cuda:0 (issue 22, "The GPU
 * on paper"; docs/cuda.md, "Host calls per step"): every CUDA runtime call
 * Kiln makes is counted (src/emu/count/), and a steady-state step of the
 * tutorial CNN (forward, cross-entropy, backward, Adam) makes kernel
 * launches, each followed by its launch check (cudaGetLastError), and no
 * other call: no pointer query, no device switch, no synchronisation, no
 * allocation, no event or stream call. The launches per step stay under a
 * recorded ceiling. Work on a device other than the thread's current one
 * pays exactly a switch and a restore.
 *
 * Emulation build only (tests/CMakeLists.txt registers it there): the
 * counts exist only where the runtime is the emulator. */
#include "emu/count/emu_call_counts.h"
#include "emu/include/cuda_runtime_api.h"
#include "emu/kiln_emu_api.h"
#include "test_util.h"

#define WARMUP 3 /* the first steps allocate, create Adam's state, fill the caches */
#define STEPS  2
#define BATCH  4

/* Kernel launches per training step of the tutorial CNN: 35 when this test
 * was written (docs/cuda.md, "Host calls per step"). The ceiling leaves
 * room for a few more (a kernel split in two, a cast) and fails when a
 * change adds a launch per layer or per parameter: the CNN has 10
 * parameters, so an Adam step that launched once per parameter instead of
 * once for all of them would add 9. */
#define LAUNCH_CEILING 40

typedef struct cnn {
    kiln_module *m;
    kiln_optimizer *opt;
    kiln_tensor *x, *y;
} cnn;

static kiln_status train_step(cnn *c) {
    kiln_scope_begin();
    kiln_tensor *logits = kiln_module_forward(c->m, c->x);
    kiln_tensor *loss = logits ? kiln_cross_entropy(logits, c->y, NULL) : NULL;
    kiln_status st = loss ? KILN_OK : kiln_error_last()->status;
    if (!st) st = kiln_optimizer_zero_grad(c->opt, true);
    if (!st) st = kiln_backward(loss, NULL, false);
    if (!st) st = kiln_optimizer_step(c->opt);
    kiln_status end = kiln_scope_end();
    return st ? st : end;
}

static bool make_cnn(cnn *c, kiln_device device) {
    char path[1024];
    snprintf(path, sizeof path, "%s/models/tutorial_cnn_32x32x3.txt", KILN_SOURCE_DIR);
    kiln_manual_seed(7);
    CHECK_OK(kiln_model_spec_load(path, 3, 32, 32, &c->m));
    if (!c->m) return false;
    CHECK_OK(kiln_module_to(c->m, device));
    kiln_tensor **params = NULL;
    int n = 0;
    CHECK_OK(kiln_module_parameters(c->m, &params, &n));
    c->opt = kiln_adam(params, n, NULL);
    free(params);
    c->x = kiln_randn(KILN_SHAPE(BATCH, 3, 32, 32), KILN_F32, device);
    kiln_tensor *labels = kiln_empty(KILN_SHAPE(BATCH), KILN_I64, KILN_CPU);
    if (labels) {
        int64_t *l = kiln_data_ptr(labels);
        for (int i = 0; i < BATCH; i++) l[i] = (i * 7) % 10;
        c->y = kiln_to(labels, device, KILN_I64, 0);
    }
    kiln_release(labels);
    CHECK(c->opt && c->x && c->y);
    return c->opt && c->x && c->y;
}

static void free_cnn(cnn *c) {
    kiln_optimizer_free(c->opt);
    kiln_module_free(c->m);
    kiln_release(c->x);
    kiln_release(c->y);
}

/* Prints the calls made (per step when steps > 1), sorted as counted. */
static void print_counts(const char *what, const unsigned long long *n, int steps) {
    printf("%s:", what);
    for (int i = 0; i < KILN_EMU_CALL_COUNT; i++)
        if (n[i]) printf(" %s %.1f", kiln_emu_call_name(i), (double)n[i] / steps);
    printf("\n");
}

static void check_steady_state(kiln_device cuda0) {
    cnn c = {0};
    if (!make_cnn(&c, cuda0)) {
        free_cnn(&c);
        return;
    }
    for (int i = 0; i < WARMUP; i++) CHECK_OK(train_step(&c));
    CHECK_OK(kiln_device_synchronize(cuda0));
    kiln_emu_stats before, after;
    kiln_emu_get_stats(&before);
    kiln_emu_call_counts_reset();
    for (int i = 0; i < STEPS; i++) CHECK_OK(train_step(&c));
    unsigned long long n[KILN_EMU_CALL_COUNT];
    kiln_emu_call_counts_get(n); /* before the synchronisation below, which is not the steps' */
    CHECK_OK(kiln_device_synchronize(cuda0));
    kiln_emu_get_stats(&after);
    print_counts("calls per training step", n, STEPS);

    unsigned long long launches = n[KILN_EMU_CALL_kernel_launch];
    CHECK(launches > 0);
    /* Kiln's count of launches is the emulator's count of kernels run. */
    CHECK_EQ_I(after.launches - before.launches, launches);
    CHECK_MSG(launches <= (unsigned long long)LAUNCH_CEILING * STEPS,
              "%.1f kernel launches per step, ceiling %d: a change added launches (update the ceiling "
              "and docs/cuda.md's table only if that is what it meant to do)",
              (double)launches / STEPS, LAUNCH_CEILING);
    /* Every launch is followed by its launch check, and nothing else calls it. */
    CHECK_EQ_I(n[KILN_EMU_CALL_cudaGetLastError], launches);
    for (int i = 0; i < KILN_EMU_CALL_COUNT; i++) {
        if (i == KILN_EMU_CALL_kernel_launch || i == KILN_EMU_CALL_cudaGetLastError) continue;
        CHECK_MSG(n[i] == 0, "%s: %llu calls in %d steady-state training steps (expected none)",
                  kiln_emu_call_name(i), n[i], STEPS);
    }
    free_cnn(&c);
}

/* An op on cuda:1 from a thread whose current device is cuda:0: one
 * switch there and one back, no pointer query, the right answer. */
static void check_other_device(void) {
    kiln_device cuda1 = KILN_CUDA(1);
    if (!kiln_device_is_available(cuda1)) return;
    kiln_tensor *a = kiln_full(KILN_SHAPE(5), 2.0, KILN_F32, cuda1);
    kiln_tensor *b = kiln_full(KILN_SHAPE(5), 3.0, KILN_F32, cuda1);
    CHECK(a && b);
    kiln_release(a && b ? kiln_add(a, b) : NULL); /* warm: the output's block is cached after this */
    kiln_emu_call_counts_reset();
    kiln_tensor *s = a && b ? kiln_add(a, b) : NULL;
    unsigned long long n[KILN_EMU_CALL_COUNT];
    kiln_emu_call_counts_get(n);
    print_counts("calls of one add on cuda:1", n, 1);
    CHECK(s != NULL);
    CHECK_EQ_I(n[KILN_EMU_CALL_kernel_launch], 1);
    CHECK_EQ_I(n[KILN_EMU_CALL_cudaSetDevice], 2);
    CHECK_EQ_I(n[KILN_EMU_CALL_cudaGetDevice], 0);
    CHECK_EQ_I(n[KILN_EMU_CALL_cudaPointerGetAttributes], 0);
    kiln_tensor *h = s ? kiln_to(s, KILN_CPU, KILN_F32, 0) : NULL;
    CHECK(h != NULL);
    if (h)
        for (int i = 0; i < 5; i++) CHECK(((const float *)kiln_data_ptr(h))[i] == 5.0f);
    kiln_release(h);
    kiln_release(s);
    kiln_release(a);
    kiln_release(b);
}

/* Code that changes the device behind Kiln's back (cudaSetDevice of its
 * own) and then says so (kiln_cuda_forget_current_device): Kiln reads the
 * device once more and switches back to the tensor's device for its
 * launch, and the caller's device is current again afterwards. */
static void check_forget(void) {
    kiln_device cuda0 = KILN_CUDA(0), cuda1 = KILN_CUDA(1);
    if (!kiln_device_is_available(cuda1)) return;
    kiln_tensor *a = kiln_full(KILN_SHAPE(5), 2.0, KILN_F32, cuda0);
    kiln_tensor *b = kiln_full(KILN_SHAPE(5), 3.0, KILN_F32, cuda0);
    CHECK(a && b);
    kiln_release(a && b ? kiln_add(a, b) : NULL); /* warm */
    CHECK(cudaSetDevice(1) == cudaSuccess);       /* the caller's own CUDA code */
    kiln_cuda_forget_current_device();
    kiln_emu_call_counts_reset();
    kiln_tensor *s = a && b ? kiln_add(a, b) : NULL;
    unsigned long long n[KILN_EMU_CALL_COUNT];
    kiln_emu_call_counts_get(n);
    print_counts("calls of one add on cuda:0 after the caller's cudaSetDevice(1)", n, 1);
    CHECK(s != NULL);
    CHECK_EQ_I(n[KILN_EMU_CALL_cudaGetDevice], 1); /* the copy read again */
    CHECK_EQ_I(n[KILN_EMU_CALL_cudaSetDevice], 2); /* to cuda:0 for the launch, back to cuda:1 */
    int current = -1;
    CHECK(cudaGetDevice(&current) == cudaSuccess && current == 1);
    kiln_tensor *h = s ? kiln_to(s, KILN_CPU, KILN_F32, 0) : NULL;
    CHECK(h != NULL);
    if (h)
        for (int i = 0; i < 5; i++) CHECK(((const float *)kiln_data_ptr(h))[i] == 5.0f);
    CHECK(cudaSetDevice(0) == cudaSuccess);
    kiln_cuda_forget_current_device();
    kiln_release(h);
    kiln_release(s);
    kiln_release(a);
    kiln_release(b);
}

int main(void) {
    if (kiln_init()) return 1;
    kiln_device cuda0 = KILN_CUDA(0);
    if (!kiln_device_is_available(cuda0)) {
        kiln_shutdown();
        kt_skip("no emulated cuda:0 (KILN_CUDA_EMU_DEVICES=0)");
    }
    check_steady_state(cuda0);
    check_other_device();
    check_forget();
    kiln_shutdown();
    return kt_finish();
}

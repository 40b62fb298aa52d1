/* The CUDA switches the tutorials teach (include/kiln/runtime.h):
 *  - kiln_set_cudnn_enabled / KILN_CUDNN=0 (torch.backends.cudnn.enabled):
 *    the environment is read at first use; disabled, a convolution and a
 *    batch norm on cuda:0 run Kiln's own kernels (no fast-table run), with
 *    the CPU's values. With cuDNN built (kiln_build_options() says
 *    cudnn=on, and the CUDA fast table has the cuDNN rows: both are asked
 *    and must agree) enabling it takes the cuDNN kernels; without it (the
 *    emulation build) Kiln's kernels run either way, which is checked too.
 *  - kiln_set_launch_blocking (CUDA_LAUNCH_BLOCKING=1): in the emulation
 *    build a kernel made to fault (kiln_emu_inject_fault) is reported by
 *    the op that launched it when the switch is on, and only later, by a
 *    call that waits, when it is off.
 * The switch checks run everywhere; the device checks exit 77 without a
 * CUDA device. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ops/op_registry.h"
#include "runtime/runtime_internal.h"
#include "test_util.h"
#ifdef KILN_CUDA_EMULATION
#include "emu/kiln_emu_api.h"
#endif

/* max |conv(x) on dev - conv(x) on the CPU| and the fast-table runs it took. */
static double conv_on(kiln_device dev, uint64_t *fast_runs) {
    kiln_scope_begin();
    kiln_manual_seed(3);
    kiln_tensor *x = kiln_randn(KILN_SHAPE(2, 3, 8, 8), KILN_F32, KILN_CPU);
    kiln_tensor *w = kiln_randn(KILN_SHAPE(4, 3, 3, 3), KILN_F32, KILN_CPU);
    kiln_conv2d_opts o = {.padding = {1, 1}};
    kiln_tensor *ref = kiln_conv2d(x, w, NULL, &o);
    uint64_t before = kiln_ops_fast_runs(KILN_OP_CONV2D);
    kiln_tensor *y = kiln_conv2d(kiln_to(x, dev, KILN_F32, 0), kiln_to(w, dev, KILN_F32, 0), NULL, &o);
    *fast_runs = kiln_ops_fast_runs(KILN_OP_CONV2D) - before;
    kiln_tensor *d =
        y ? kiln_max(kiln_abs(kiln_sub(kiln_to(y, KILN_CPU, KILN_F32, 0), ref)), 0, NULL, false) : NULL;
    double m = -1;
    CHECK(d != NULL);
    if (d) CHECK_OK(kiln_item(d, &m));
    kiln_scope_end();
    return m;
}

/* Whether conv2d on cuda:0 has a cuDNN kernel to take, asked two ways that
 * must agree: the build options (lower case: "cudnn=on") and the CUDA fast
 * table in force, which has a conv2d row only with cuDNN. The emulation
 * build registers no fast table (and has no cuDNN); the module build's
 * comes from libkiln_cuda.so; KILN_CUDA_KERNELS=reference leaves it out. */
static bool cudnn_in_force(void) {
    bool said = strstr(kiln_build_options(), "cudnn=on") != NULL;
    bool table = kiln_kernels_fast_covers(KILN_DEVICE_CUDA, "conv2d", KILN_F32);
    if (strcmp(kiln_kernels_in_force(KILN_DEVICE_CUDA), "fast") == 0)
        CHECK_MSG(said == table, "kiln_build_options() says '%s', but the CUDA fast table %s a conv2d row",
                  kiln_build_options(), table ? "has" : "has no");
    return table;
}

static void test_cudnn_switch(kiln_device dev) {
    bool built = cudnn_in_force();
    uint64_t runs = 99;
    kiln_set_cudnn_enabled(false);
    double err = conv_on(dev, &runs);
    CHECK_MSG(err >= 0 && err < 1e-4, "cuDNN off: conv2d differs from the CPU by %g", err);
    CHECK_MSG(runs == 0, "cuDNN off: conv2d took the fast table %llu times", (unsigned long long)runs);
    kiln_set_cudnn_enabled(true);
    err = conv_on(dev, &runs);
    CHECK_MSG(err >= 0 && err < 1e-4, "cuDNN on: conv2d differs from the CPU by %g", err);
    if (built)
        CHECK_MSG(runs == 1, "cuDNN on (built): conv2d ran cuDNN %llu times", (unsigned long long)runs);
    else
        CHECK_MSG(runs == 0, "no cuDNN kernel in force, yet conv2d took a fast path %llu times",
                  (unsigned long long)runs);
    printf("cuDNN switch (%s): off -> Kiln's conv2d kernel; on -> %s\n", kiln_build_options(),
           built ? "cuDNN" : "Kiln's too (no cuDNN kernel in force)");
}

#ifdef KILN_CUDA_EMULATION
static void test_launch_blocking(kiln_device dev) {
    kiln_scope_begin();
    kiln_tensor *a = kiln_ones(KILN_SHAPE(1000), KILN_F32, dev);
    kiln_tensor *b = kiln_ones(KILN_SHAPE(1000), KILN_F32, dev);
    CHECK_OK(kiln_device_synchronize(dev));
    /* On: the faulting kernel's op is named at once. */
    kiln_set_launch_blocking(true);
    kiln_tensor *ok = kiln_mul(a, b);
    double v = 0;
    CHECK(ok != NULL);
    CHECK_OK(kiln_item(kiln_sum(ok, 0, NULL, false), &v));
    CHECK(v == 1000);
    kiln_emu_inject_fault("");
    CHECK_NULL_ERR(kiln_mul(a, b), "KILN_LAUNCH_BLOCKING: op mul: kernel");
    CHECK(strstr(kiln_error_message(), "cudaErrorLaunchFailure") != NULL);
    kiln_emu_inject_fault(NULL);
    /* Off: the launch returns; the fault surfaces at the next wait, which
     * names no op. */
    kiln_set_launch_blocking(false);
    kiln_emu_inject_fault("");
    /* The stream is held so that the fault cannot land before the launch
     * returns (on a GPU it lands whenever the kernel runs). */
    cudaStream_t s = (cudaStream_t)kiln_stream_handle(kiln_current_stream(dev));
    CHECK(kiln_emu_hold_stream(s, true) == cudaSuccess);
    kiln_tensor *late = kiln_mul(a, b);
    CHECK_MSG(late != NULL, "without launch blocking the launch failed: %s", kiln_error_message());
    CHECK(kiln_emu_hold_stream(s, false) == cudaSuccess);
    kiln_error_clear();
    kiln_status st = kiln_device_synchronize(dev);
    CHECK(st != KILN_OK);
    printf("without launch blocking the fault surfaces at the synchronize: %s\n", kiln_error_message());
    CHECK_MSG(!strstr(kiln_error_message(), "op mul"), "without launch blocking: '%s'", kiln_error_message());
    kiln_emu_inject_fault(NULL);
    kiln_error_clear();
    kiln_scope_end();
    CHECK_OK(kiln_device_synchronize(dev));
    printf("launch blocking: a faulting kernel is named by its op (mul) when on, surfaces later when off\n");
}
#endif

int main(void) {
    /* Read at first use: the environment decides before any setter. */
    setenv("KILN_CUDNN", "0", 1);
    unsetenv("KILN_LAUNCH_BLOCKING");
    if (kiln_init()) return 1;
    CHECK(!kiln_is_cudnn_enabled());
    CHECK(!kiln_is_launch_blocking());
    kiln_set_cudnn_enabled(true);
    CHECK(kiln_is_cudnn_enabled());
    kiln_set_launch_blocking(true);
    CHECK(kiln_is_launch_blocking());
    kiln_set_launch_blocking(false);
    if (kiln_device_count(KILN_DEVICE_CUDA) == 0) {
        char why[512];
        snprintf(why, sizeof why, "no CUDA device: %s (the switches themselves passed: %d checks)",
                 kiln_device_absent_reason(KILN_DEVICE_CUDA), kt_passed_);
        kiln_shutdown();
        if (kt_failed_) return kt_finish();
        kt_skip(why);
    }
    kiln_device dev = KILN_CUDA(0);
    test_cudnn_switch(dev);
#ifdef KILN_CUDA_EMULATION
    test_launch_blocking(dev);
#endif
    kiln_shutdown();
    return kt_finish();
}

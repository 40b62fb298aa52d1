/* KILN_DEVICE sets the default device (kiln_default_device, and so
 * kiln_current_device and where modules and loaders go): cpu always; with
 * CUDA devices (the emulation build's, or a GPU) cuda:1 and plain "cuda";
 * an unknown or unavailable device makes kiln_init fail naming the
 * variable. Unset, an emulated device is never the default. */
#include <stdlib.h>

#include "test_util.h"

static kiln_status init_with(const char *value) {
    kiln_shutdown();
    if (value) setenv("KILN_DEVICE", value, 1);
    else unsetenv("KILN_DEVICE");
    kiln_error_clear();
    return kiln_init();
}

int main(void) {
    CHECK_OK(init_with("cpu"));
    CHECK(kiln_default_device().type == KILN_DEVICE_CPU && kiln_current_device().type == KILN_DEVICE_CPU);
    CHECK_FAILS(init_with("gpu"), KILN_ERR_INVALID_ARGUMENT, "KILN_DEVICE='gpu'");
    CHECK_FAILS(init_with("cuda:63"), KILN_ERR_INVALID_ARGUMENT, "KILN_DEVICE='cuda:63'");
    CHECK_OK(init_with(NULL));
    int n = kiln_device_count(KILN_DEVICE_CUDA);
    /* Unset: the first real GPU, where there is one, else the CPU; the
     * emulator's devices never. */
#ifdef KILN_CUDA_EMULATION
    CHECK(kiln_default_device().type == KILN_DEVICE_CPU);
#else
    if (n >= 1) {
        CHECK(kiln_default_device().type == KILN_DEVICE_CUDA && kiln_default_device().index == 0);
        kiln_module *lin = kiln_nn_linear(3, 2, true); /* created on the current device */
        kiln_tensor *w = kiln_module_state_get(lin, "weight");
        CHECK(w && kiln_device_equal(kiln_get_device(w), KILN_CUDA(0)));
        kiln_release(w);
        kiln_module_free(lin);
    } else {
        CHECK(kiln_default_device().type == KILN_DEVICE_CPU);
    }
#endif
    if (n >= 2) {
        CHECK_OK(init_with("cuda:1"));
        kiln_device d = kiln_default_device();
        CHECK(d.type == KILN_DEVICE_CUDA && d.index == 1);
        kiln_module *lin = kiln_nn_linear(3, 2, true); /* created on the current device */
        kiln_tensor *w = kiln_module_state_get(lin, "weight");
        CHECK(w && kiln_device_equal(kiln_get_device(w), d));
        kiln_release(w);
        kiln_module_free(lin);
        CHECK(kiln_device_equal(kiln_loader_opts_default().device, d));
        CHECK_OK(init_with("cuda"));
        CHECK(kiln_default_device().type == KILN_DEVICE_CUDA && kiln_default_device().index == 0);
        CHECK_OK(init_with(NULL));
    } else {
        printf("SKIPPED the cuda part: fewer than two CUDA devices (the cpu and error parts ran)\n");
    }
    kiln_shutdown();
    return kt_finish();
}

/* Trace and replay on cuda:0 (emulated in the emulation build, which the
 * emu tier runs; skipped where the build sees no CUDA device): inference
 * replays of the tutorial CNN and the small ResNet, replayed Adam training
 * steps of the CNN in f32 and under autocast f16, each bit-identical to
 * eager twins on the same device, no allocator call per replay (the
 * ResNet's training step is checked on the CPU: emulated, it takes
 * minutes). */
#include "trace/trace_test_util.h"

int main(void) {
    if (kiln_init()) return 1;
    kiln_device cuda0 = {KILN_DEVICE_CUDA, 0};
    if (!kiln_device_is_available(cuda0)) {
        kiln_shutdown();
        kt_skip("no cuda:0 device (real or emulated) in this build");
    }
    /* Bit-identical to eager holds between run-to-run deterministic
     * kernels: on a GPU cuDNN's default backward convolutions may use
     * atomics (on the H100 the replayed and the eager training steps
     * differed, inference did not), so the comparison runs as under
     * torch.use_deterministic_algorithms. No effect in the emulator. */
    kiln_set_deterministic(true);
    tt_replays = 3;
    tt_check_infer("tutorial_cnn_32x32x3.txt", cuda0);
    tt_check_infer("resnet_small_cifar10.txt", cuda0);
    tt_check_train("tutorial_cnn_32x32x3.txt", cuda0, KILN_F32);
    tt_check_train("tutorial_cnn_32x32x3.txt", cuda0, KILN_F16);
    kiln_shutdown();
    return kt_finish();
}

/* The public queries of the kernel tables in force (kiln/ops.h) and of the
 * CUDA facts (kiln/runtime.h), which the tools use instead of the internal
 * registry and backend headers: "fast" by default on the CPU and
 * "reference" after kiln_init under KILN_CPU_KERNELS=reference; which ops
 * and dtypes the fast tables cover, checked against the registry; the
 * CUDA queries answer in every build. */
#include <stdlib.h>

#include "ops/op_registry.h"
#include "test_util.h"

static void test_fast_by_default(void) {
    CHECK(strcmp(kiln_kernels_in_force(KILN_DEVICE_CPU), "fast") == 0);
    CHECK(strcmp(kiln_kernels_in_force(KILN_DEVICE_META), "reference") == 0);
    CHECK(strcmp(kiln_kernels_in_force((kiln_device_type)99), "reference") == 0);
    /* The plain-C table runs relu in f32 in every build; oneDNN conv2d. */
    CHECK(kiln_kernels_fast_covers(KILN_DEVICE_CPU, "relu", KILN_F32));
#ifdef KILN_WITH_ONEDNN
    CHECK(kiln_kernels_fast_covers(KILN_DEVICE_CPU, "conv2d", KILN_F32));
    CHECK(kiln_kernels_fast_covers(KILN_DEVICE_CPU, "mm", KILN_F32));
#endif
    CHECK(!kiln_kernels_fast_covers(KILN_DEVICE_CPU, "relu", KILN_I64));
    CHECK(!kiln_kernels_fast_covers(KILN_DEVICE_CPU, "no_such_op", KILN_F32));
    CHECK(!kiln_kernels_fast_covers(KILN_DEVICE_CPU, NULL, KILN_F32));
    CHECK(!kiln_kernels_fast_covers(KILN_DEVICE_META, "relu", KILN_F32));
    /* By name as the registry answers by id, for every op and dtype. */
    int agree = 0;
    for (int op = 0; op < KILN_OP_COUNT; op++)
        for (int dt = 0; dt < KILN_DTYPE_COUNT; dt++)
            agree += kiln_kernels_fast_covers(KILN_DEVICE_CPU, kiln_op_info_get((kiln_op_id)op)->name,
                                              (kiln_dtype)dt) ==
                     kiln_ops_fast_covers(KILN_DEVICE_CPU, (kiln_op_id)op, (kiln_dtype)dt);
    CHECK_EQ_I(agree, KILN_OP_COUNT * KILN_DTYPE_COUNT);
}

static void test_reference_when_asked(void) {
    kiln_shutdown();
    setenv("KILN_CPU_KERNELS", "reference", 1);
    CHECK_OK(kiln_init());
    CHECK(strcmp(kiln_kernels_in_force(KILN_DEVICE_CPU), "reference") == 0);
    CHECK(!kiln_kernels_fast_covers(KILN_DEVICE_CPU, "relu", KILN_F32));
    kiln_shutdown();
    unsetenv("KILN_CPU_KERNELS");
    CHECK_OK(kiln_init());
    CHECK(strcmp(kiln_kernels_in_force(KILN_DEVICE_CPU), "fast") == 0);
}

static void test_cuda_facts(void) {
    int driver = -1, runtime = -1;
    CHECK_OK(kiln_cuda_versions(&driver, &runtime));
    CHECK_OK(kiln_cuda_versions(NULL, NULL));
    char buf[256];
    int major = -1, minor = -1;
#ifdef KILN_WITH_CUDA
    CHECK(driver >= 0 && runtime > 0);
    if (kiln_device_count(KILN_DEVICE_CUDA) > 0 && kiln_cuda_device_properties(0, buf, sizeof buf) == KILN_OK &&
        strncmp(buf, "compute capability", 18) == 0) {
        CHECK_OK(kiln_cuda_capability(0, &major, &minor));
        CHECK(major >= 3 && minor >= 0);
    }
    CHECK_FAILS(kiln_cuda_capability(4096, &major, &minor), KILN_ERR_DEVICE, "4096");
#else
    CHECK(driver == 0 && runtime == 0);
    CHECK_FAILS(kiln_cuda_device_properties(0, buf, sizeof buf), KILN_ERR_UNSUPPORTED, "no CUDA backend");
    CHECK(buf[0] == '\0');
    CHECK_FAILS(kiln_cuda_capability(0, &major, &minor), KILN_ERR_UNSUPPORTED, "KILN_WITH_CUDA");
    CHECK(major == -1 && minor == -1);
#endif
}

int main(void) {
    unsetenv("KILN_CPU_KERNELS");
    CHECK_OK(kiln_init());
    test_fast_by_default();
    test_reference_when_asked();
    test_cuda_facts();
    kiln_shutdown();
    return kt_finish();
}

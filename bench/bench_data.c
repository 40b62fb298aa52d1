/* Data shared by the benchmarks. */
#include "bench.h"

/* A CIFAR-sized u8 dataset (N, 3, 32, 32) of xorshift noise with labels
 * i % 10: the same bytes on every run, no file needed. NULL on failure. */
kiln_dataset *kiln_bench_synthetic_cifar(int64_t n) {
    kiln_tensor *data = kiln_empty(KILN_SHAPE(n, 3, 32, 32), KILN_U8, KILN_CPU); /* (N, 3, 32, 32) */
    kiln_tensor *labels = kiln_empty(KILN_SHAPE(n), KILN_I64, KILN_CPU);         /* (N) */
    kiln_dataset *ds = NULL;
    if (data && labels) {
        uint8_t *px = kiln_data_ptr(data);
        int64_t *lab = kiln_data_ptr(labels);
        uint64_t s = 0x9E3779B97F4A7C15ull;
        for (int64_t i = 0; i < n * 3 * 32 * 32; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            px[i] = (uint8_t)(s >> 56);
        }
        for (int64_t i = 0; i < n; i++) lab[i] = i % 10;
        if (kiln_dataset_from_tensors(data, labels, 10, &ds)) ds = NULL;
    }
    kiln_release(data);
    kiln_release(labels);
    return ds;
}

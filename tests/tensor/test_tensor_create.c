/* Tensor creation: every creation function, every dtype, exact values,
 * properties of new tensors, the generator's reproducibility, new_*,
 * pinned and meta tensors, and the dtype helpers. */
#include <stdint.h>

#include "runtime/runtime_internal.h"
#include "test_util.h"

/* Elements of a CPU tensor as doubles, through kiln_to(f64) + kiln_to_host. */
static void read_f64(kiln_tensor *t, double *out, int64_t n) {
    kiln_tensor *d = kiln_to(t, KILN_CPU, KILN_F64, 0);
    CHECK(d != NULL);
    if (!d) return;
    CHECK_OK(kiln_to_host(d, out, (size_t)n * sizeof(double)));
    kiln_release(d);
}

static void test_dtypes(void) {
    static const size_t sizes[KILN_DTYPE_COUNT] = {4, 2, 2, 8, 4, 8, 1, 1};
    static const char *names[KILN_DTYPE_COUNT] = {"f32", "f16", "bf16", "f64", "i32", "i64", "u8", "bool"};
    for (int d = 0; d < KILN_DTYPE_COUNT; d++) {
        CHECK_EQ_I(kiln_dtype_size((kiln_dtype)d), sizes[d]);
        CHECK(strcmp(kiln_dtype_name((kiln_dtype)d), names[d]) == 0);
        kiln_dtype parsed;
        CHECK_OK(kiln_dtype_parse(names[d], &parsed));
        CHECK_EQ_I(parsed, d);
        CHECK(kiln_dtype_is_floating((kiln_dtype)d) == (d <= KILN_F64));
    }
    kiln_dtype p;
    CHECK_OK(kiln_dtype_parse("float", &p));
    CHECK_EQ_I(p, KILN_F32);
    CHECK_OK(kiln_dtype_parse("half", &p));
    CHECK_EQ_I(p, KILN_F16);
    CHECK_OK(kiln_dtype_parse("double", &p));
    CHECK_EQ_I(p, KILN_F64);
    CHECK_OK(kiln_dtype_parse("long", &p));
    CHECK_EQ_I(p, KILN_I64);
    CHECK_FAILS(kiln_dtype_parse("f128", &p), KILN_ERR_INVALID_ARGUMENT, "f128");
    CHECK_EQ_I(kiln_dtype_size(KILN_DTYPE_COUNT), 0);
    CHECK(strcmp(kiln_dtype_name((kiln_dtype)99), "invalid") == 0);
}

static void test_empty_properties(void) {
    kiln_tensor *t = kiln_empty(KILN_SHAPE(2, 3, 4), KILN_F32, KILN_CPU);
    CHECK(t != NULL);
    CHECK_EQ_I(kiln_ndim(t), 3);
    CHECK_EQ_I(kiln_size(t, 0), 2);
    CHECK_EQ_I(kiln_size(t, -1), 4);
    CHECK_EQ_I(kiln_size(t, 3), -1);
    CHECK_EQ_I(kiln_stride(t, 0), 12);
    CHECK_EQ_I(kiln_stride(t, 1), 4);
    CHECK_EQ_I(kiln_stride(t, 2), 1);
    CHECK_EQ_I(kiln_numel(t), 24);
    CHECK_EQ_I(kiln_dtype_of(t), KILN_F32);
    CHECK_EQ_I(kiln_layout_of(t), KILN_LAYOUT_STRIDED);
    CHECK(kiln_device_equal(kiln_get_device(t), KILN_CPU));
    CHECK_EQ_I(kiln_storage_offset(t), 0);
    CHECK(kiln_is_contiguous(t));
    CHECK(!kiln_is_pinned(t));
    CHECK(kiln_data_ptr(t) != NULL);
    CHECK_EQ_I(kiln_refcount(t), 1);
    CHECK_EQ_I(kiln_tensor_version(t), 0);
    kiln_shape s = kiln_shape_of(t);
    CHECK(s.ndim == 3 && s.d[0] == 2 && s.d[1] == 3 && s.d[2] == 4);
    CHECK(kiln_memory_allocated(KILN_CPU) >= 24 * sizeof(float));
    CHECK_OK(kiln_release(t));

    /* A scalar has one element and no dims; a zero-size tensor no memory. */
    kiln_tensor *sc = kiln_full(KILN_SHAPE(), 3.5, KILN_F64, KILN_CPU);
    CHECK_EQ_I(kiln_ndim(sc), 0);
    CHECK_EQ_I(kiln_numel(sc), 1);
    double v = 0;
    CHECK_OK(kiln_item(sc, &v));
    CHECK(v == 3.5);
    kiln_release(sc);
    size_t before = kiln_memory_allocated(KILN_CPU);
    kiln_tensor *z = kiln_zeros(KILN_SHAPE(0, 3), KILN_F32, KILN_CPU);
    CHECK(z != NULL);
    CHECK_EQ_I(kiln_numel(z), 0);
    CHECK(kiln_data_ptr(z) == NULL);
    CHECK(kiln_is_contiguous(z));
    CHECK_EQ_I(kiln_memory_allocated(KILN_CPU), before);
    CHECK_OK(kiln_to_host(z, NULL, 0));
    kiln_release(z);
}

static void test_fills_every_dtype(void) {
    for (int d = 0; d < KILN_DTYPE_COUNT; d++) {
        kiln_dtype dt = (kiln_dtype)d;
        kiln_tensor *z = kiln_zeros(KILN_SHAPE(3, 5), dt, KILN_CPU);
        kiln_tensor *o = kiln_ones(KILN_SHAPE(3, 5), dt, KILN_CPU);
        kiln_tensor *f = kiln_full(KILN_SHAPE(7), 2.75, dt, KILN_CPU);
        double vz[15], vo[15], vf[7];
        read_f64(z, vz, 15);
        read_f64(o, vo, 15);
        read_f64(f, vf, 7);
        /* 2.75: exact in every float dtype, truncated to 2 in integers, true as bool. */
        double want_f = dt == KILN_BOOL ? 1.0 : kiln_dtype_is_floating(dt) ? 2.75 : 2.0;
        int bad = 0;
        for (int i = 0; i < 15; i++) bad += vz[i] != 0.0 || vo[i] != 1.0;
        for (int i = 0; i < 7; i++) bad += vf[i] != want_f;
        CHECK_MSG(bad == 0, "dtype %s: %d wrong values", kiln_dtype_name(dt), bad);
        kiln_release(z);
        kiln_release(o);
        kiln_release(f);
    }
    /* Conversions of the fill value: rounding in f16/bf16, -1 to u8 wraps. */
    kiln_tensor *h = kiln_full(KILN_SHAPE(1), 0.1, KILN_F16, KILN_CPU);
    uint16_t bits;
    CHECK_OK(kiln_to_host(h, &bits, 2));
    CHECK_EQ_I(bits, 0x2E66); /* nearest f16 to 0.1 */
    kiln_release(h);
    kiln_tensor *b = kiln_full(KILN_SHAPE(1), 0.1, KILN_BF16, KILN_CPU);
    CHECK_OK(kiln_to_host(b, &bits, 2));
    CHECK_EQ_I(bits, 0x3DCD); /* nearest bf16 to 0.1 */
    kiln_release(b);
    kiln_tensor *u = kiln_full(KILN_SHAPE(1), -1.0, KILN_U8, KILN_CPU);
    uint8_t byte;
    CHECK_OK(kiln_to_host(u, &byte, 1));
    CHECK_EQ_I(byte, 255);
    kiln_release(u);
}

static void test_arange(void) {
    kiln_tensor *a = kiln_arange(0, 5, 1, KILN_F32, KILN_CPU);
    float f[5];
    CHECK_EQ_I(kiln_numel(a), 5);
    CHECK_OK(kiln_to_host(a, f, sizeof f));
    CHECK(f[0] == 0 && f[1] == 1 && f[4] == 4);
    kiln_release(a);

    kiln_tensor *b = kiln_arange(1, 2, 0.25, KILN_F64, KILN_CPU);
    double d[4];
    CHECK_EQ_I(kiln_numel(b), 4);
    CHECK_OK(kiln_to_host(b, d, sizeof d));
    CHECK(d[0] == 1.0 && d[1] == 1.25 && d[2] == 1.5 && d[3] == 1.75);
    kiln_release(b);

    kiln_tensor *c = kiln_arange(5, 0, -2, KILN_I64, KILN_CPU);
    int64_t i[3];
    CHECK_EQ_I(kiln_numel(c), 3);
    CHECK_OK(kiln_to_host(c, i, sizeof i));
    CHECK(i[0] == 5 && i[1] == 3 && i[2] == 1);
    kiln_release(c);

    kiln_tensor *e = kiln_arange(0, 1, 0.3, KILN_F32, KILN_CPU); /* ceil(1/0.3) = 4 */
    CHECK_EQ_I(kiln_numel(e), 4);
    kiln_release(e);
    kiln_tensor *empty = kiln_arange(3, 3, 1, KILN_I32, KILN_CPU);
    CHECK_EQ_I(kiln_numel(empty), 0);
    kiln_release(empty);

    CHECK_NULL_ERR(kiln_arange(0, 5, 0, KILN_F32, KILN_CPU), "kiln_arange");
    CHECK_NULL_ERR(kiln_arange(0, 5, -1, KILN_F32, KILN_CPU), "step");
    CHECK_NULL_ERR(kiln_arange(0, NAN, 1, KILN_F32, KILN_CPU), "kiln_arange");
}

static void test_random(void) {
    enum { N = 4099 }; /* not a multiple of the 4-word Philox block */
    static float a[N], b[N], c[N];
    kiln_manual_seed(42);
    kiln_rng start = kiln_device_rng_reserve(KILN_CPU, 0); /* where the next draw begins */
    kiln_tensor *r = kiln_rand(KILN_SHAPE(N), KILN_F32, KILN_CPU);
    CHECK_OK(kiln_to_host(r, a, sizeof a));
    int bad = 0, out_of_range = 0;
    for (int i = 0; i < N; i++) {
        bad += a[i] != kiln_rng_u32_to_uniform(kiln_rng_u32_at(&start, (uint64_t)i));
        out_of_range += !(a[i] >= 0.0f && a[i] < 1.0f);
    }
    CHECK_EQ_I(bad, 0);
    CHECK_EQ_I(out_of_range, 0);
    kiln_release(r);

    /* The same seed gives the same numbers; the next draw different ones. */
    kiln_manual_seed(42);
    r = kiln_rand(KILN_SHAPE(N), KILN_F32, KILN_CPU);
    kiln_tensor *r2 = kiln_rand(KILN_SHAPE(N), KILN_F32, KILN_CPU);
    CHECK_OK(kiln_to_host(r, b, sizeof b));
    CHECK_OK(kiln_to_host(r2, c, sizeof c));
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(memcmp(a, c, sizeof a) != 0);
    kiln_release(r);
    kiln_release(r2);
    kiln_manual_seed(43);
    r = kiln_rand(KILN_SHAPE(N), KILN_F32, KILN_CPU);
    CHECK_OK(kiln_to_host(r, b, sizeof b));
    CHECK(memcmp(a, b, sizeof a) != 0);
    kiln_release(r);

    /* Normal: element i from words 2i, 2i+1; loose moments. */
    kiln_manual_seed(7);
    start = kiln_device_rng_reserve(KILN_CPU, 0);
    kiln_tensor *n = kiln_randn(KILN_SHAPE(N), KILN_F32, KILN_CPU);
    CHECK_OK(kiln_to_host(n, a, sizeof a));
    double sum = 0, sq = 0;
    bad = 0;
    for (int i = 0; i < N; i++) {
        bad += a[i] != kiln_rng_normal_at(&start, (uint64_t)i);
        sum += a[i];
        sq += (double)a[i] * a[i];
    }
    CHECK_EQ_I(bad, 0);
    double mean = sum / N, var = sq / N - mean * mean;
    CHECK_MSG(fabs(mean) < 0.1 && fabs(var - 1.0) < 0.1, "mean %g var %g", mean, var);
    kiln_release(n);

    /* Other float dtypes hold the f32 draw converted; f16/bf16 stay below 1. */
    kiln_manual_seed(42);
    kiln_tensor *d64 = kiln_rand(KILN_SHAPE(N), KILN_F64, KILN_CPU);
    static double dv[N];
    CHECK_OK(kiln_to_host(d64, dv, sizeof dv));
    kiln_release(d64);
    kiln_manual_seed(42);
    kiln_tensor *f32 = kiln_rand(KILN_SHAPE(N), KILN_F32, KILN_CPU);
    CHECK_OK(kiln_to_host(f32, a, sizeof a));
    bad = 0;
    for (int i = 0; i < N; i++) bad += dv[i] != (double)a[i];
    CHECK_EQ_I(bad, 0);
    kiln_release(f32);
    for (int d = KILN_F16; d <= KILN_BF16; d++) {
        kiln_tensor *h = kiln_rand(KILN_SHAPE(20000), (kiln_dtype)d, KILN_CPU);
        static double hv[20000];
        read_f64(h, hv, 20000);
        int bad_range = 0;
        for (int i = 0; i < 20000; i++) bad_range += !(hv[i] >= 0.0 && hv[i] < 1.0);
        CHECK_MSG(bad_range == 0, "%s: %d values outside [0, 1)", kiln_dtype_name((kiln_dtype)d), bad_range);
        kiln_release(h);
    }

    CHECK_NULL_ERR(kiln_rand(KILN_SHAPE(3), KILN_I32, KILN_CPU), "not floating point");
    CHECK_NULL_ERR(kiln_randn(KILN_SHAPE(3), KILN_BOOL, KILN_CPU), "not floating point");
}

static void test_from_data(void) {
    const float src[6] = {1, -2, 3.5f, 4, 5, 6e10f};
    kiln_tensor *t = kiln_from_data(KILN_SHAPE(2, 3), KILN_F32, KILN_CPU, src);
    float back[6];
    CHECK_OK(kiln_to_host(t, back, sizeof back));
    CHECK(memcmp(src, back, sizeof src) == 0);
    CHECK(memcmp(kiln_data_ptr(t), src, sizeof src) == 0);
    kiln_release(t);

    const int64_t big[2] = {INT64_MAX, INT64_MIN};
    kiln_tensor *i = kiln_from_data(KILN_SHAPE(2), KILN_I64, KILN_CPU, big);
    int64_t ib[2];
    CHECK_OK(kiln_to_host(i, ib, sizeof ib));
    CHECK(ib[0] == INT64_MAX && ib[1] == INT64_MIN);
    kiln_release(i);

    CHECK_NULL_ERR(kiln_from_data(KILN_SHAPE(2), KILN_F32, KILN_CPU, NULL), "data is NULL");
    kiln_tensor *none = kiln_from_data(KILN_SHAPE(0), KILN_F32, KILN_CPU, NULL);
    CHECK(none != NULL);
    kiln_release(none);
}

static void test_pinned(void) {
    kiln_tensor *p = kiln_empty_pinned(KILN_SHAPE(64, 64), KILN_F32);
    CHECK(p != NULL);
    CHECK(kiln_is_pinned(p));
    CHECK(kiln_device_equal(kiln_get_device(p), KILN_CPU));
    CHECK(kiln_is_pinned_ptr(kiln_data_ptr(p)));
    kiln_tensor *o = kiln_ones(KILN_SHAPE(64, 64), KILN_F32, KILN_CPU);
    CHECK(!kiln_is_pinned(o));
    CHECK(!kiln_is_pinned_ptr(kiln_data_ptr(o)));
    CHECK_OK(kiln_copy_(p, o, KILN_NON_BLOCKING));
    double v;
    kiln_tensor *flat = kiln_view(p, KILN_SHAPE(-1));
    kiln_tensor *last = kiln_narrow(flat, 0, 4095, 1);
    CHECK(kiln_is_pinned(last)); /* views share the pinned storage */
    CHECK_OK(kiln_item(last, &v));
    CHECK(v == 1.0);
    kiln_release(last);
    kiln_release(flat);
    kiln_release(o);
    kiln_release(p);
}

static void test_new_like(void) {
    kiln_tensor *like = kiln_zeros(KILN_SHAPE(2), KILN_F16, KILN_CPU);
    kiln_tensor *e = kiln_new_empty(like, KILN_SHAPE(3, 3));
    kiln_tensor *z = kiln_new_zeros(like, KILN_SHAPE(4));
    kiln_tensor *o = kiln_new_ones(like, KILN_SHAPE(4));
    kiln_tensor *f = kiln_new_full(like, KILN_SHAPE(2, 2), -0.5);
    kiln_tensor *all[4] = {e, z, o, f};
    for (int i = 0; i < 4; i++) {
        CHECK(all[i] != NULL);
        CHECK_EQ_I(kiln_dtype_of(all[i]), KILN_F16);
        CHECK(kiln_device_equal(kiln_get_device(all[i]), KILN_CPU));
    }
    CHECK_EQ_I(kiln_numel(e), 9);
    double v[4];
    read_f64(z, v, 4);
    CHECK(v[0] == 0 && v[3] == 0);
    read_f64(o, v, 4);
    CHECK(v[0] == 1 && v[3] == 1);
    read_f64(f, v, 4);
    CHECK(v[0] == -0.5 && v[3] == -0.5);
    for (int i = 0; i < 4; i++) kiln_release(all[i]);
    kiln_release(like);

    kiln_tensor *m = kiln_empty(KILN_SHAPE(5), KILN_I32, KILN_META);
    kiln_tensor *mz = kiln_new_zeros(m, KILN_SHAPE(8, 8));
    CHECK(kiln_device_equal(kiln_get_device(mz), KILN_META));
    CHECK_EQ_I(kiln_dtype_of(mz), KILN_I32);
    kiln_release(mz);
    kiln_release(m);
    CHECK_NULL_ERR(kiln_new_zeros(NULL, KILN_SHAPE(1)), "NULL");
}

static void test_meta_creation(void) {
    size_t before = kiln_memory_allocated(KILN_META);
    kiln_tensor *m = kiln_randn(KILN_SHAPE(1024, 1024), KILN_F32, KILN_META);
    CHECK(m != NULL);
    CHECK_EQ_I(kiln_numel(m), 1024 * 1024);
    CHECK(kiln_data_ptr(m) == NULL);
    CHECK(kiln_memory_allocated(KILN_META) >= before + 4u * 1024 * 1024);
    kiln_tensor *ones = kiln_ones(KILN_SHAPE(3), KILN_F32, KILN_META);
    kiln_tensor *ar = kiln_arange(0, 100, 1, KILN_I64, KILN_META);
    CHECK_EQ_I(kiln_numel(ar), 100);
    kiln_release(ar);
    kiln_release(ones);
    kiln_release(m);
    CHECK_EQ_I(kiln_memory_allocated(KILN_META), before);
}

int main(void) {
    if (kiln_init()) {
        fprintf(stderr, "kiln_init: %s\n", kiln_error_message());
        return 1;
    }
    size_t start = kiln_memory_allocated(KILN_CPU);
    test_dtypes();
    test_empty_properties();
    test_fills_every_dtype();
    test_arange();
    test_random();
    test_from_data();
    test_pinned();
    test_new_like();
    test_meta_creation();
    CHECK_EQ_I(kiln_memory_allocated(KILN_CPU), start);
    kiln_shutdown();
    return kt_finish();
}

/* kiln_to, kiln_copy_, kiln_to_host, kiln_item, kiln_record_stream: exact
 * dtype conversions (f16/bf16 rounding, float -> int truncation and its
 * edge cases), same-device returns, forced copies, broadcasting and
 * non-contiguous copies, pinned and meta tensors, the version counter. */
#include <stdint.h>

#include "test_util.h"

static kiln_tensor *from_f32(int n, const float *v) {
    return kiln_from_data(KILN_SHAPE(n), KILN_F32, KILN_CPU, v);
}

/* Raw element bytes of t converted to `dtype`. */
static void to_bytes(kiln_tensor *t, kiln_dtype dtype, void *out) {
    kiln_tensor *c = kiln_to(t, KILN_CPU, dtype, 0);
    CHECK(c != NULL);
    if (!c) return;
    CHECK_OK(kiln_to_host(c, out, (size_t)kiln_numel(c) * kiln_dtype_size(dtype)));
    kiln_release(c);
}

static void test_float_to_half(void) {
    const float one = 1.0f;
    const float v[] = {0.1f, -2.5f, 65520.0f, one + 0x1p-11f, one + 3 * 0x1p-11f, 1e-8f, -0.0f, 0x1p-24f};
    /* f16: 65520 is halfway to 65536 and rounds (to even) to infinity;
     * 1 + 2^-11 ties to 1.0, 1 + 3*2^-11 ties up to 1 + 2^-9; 2^-24 is the
     * smallest subnormal; 1e-8 rounds to zero. */
    const uint16_t want_h[] = {0x2E66, 0xC100, 0x7C00, 0x3C00, 0x3C02, 0x0000, 0x8000, 0x0001};
    kiln_tensor *t = from_f32(8, v);
    uint16_t h[8];
    to_bytes(t, KILN_F16, h);
    for (int i = 0; i < 8; i++) CHECK_MSG(h[i] == want_h[i], "f16[%d] = %04x, want %04x", i, h[i], want_h[i]);
    kiln_release(t);

    const float w[] = {0.1f, one + 0x1p-8f, one + 3 * 0x1p-8f, 3.4e38f, -1.0f};
    /* bf16: 1 + 2^-8 ties to 1.0, 1 + 3*2^-8 ties up to 1 + 2^-6; 3.4e38
     * rounds past bf16's largest finite value to infinity. */
    const uint16_t want_b[] = {0x3DCD, 0x3F80, 0x3F82, 0x7F80, 0xBF80};
    t = from_f32(5, w);
    to_bytes(t, KILN_BF16, h);
    for (int i = 0; i < 5; i++)
        CHECK_MSG(h[i] == want_b[i], "bf16[%d] = %04x, want %04x", i, h[i], want_b[i]);
    kiln_release(t);

    /* And back: f16 0x3C01 is exactly 1 + 2^-10. */
    kiln_tensor *hb = kiln_from_data(KILN_SHAPE(2), KILN_F16, KILN_CPU, (const uint16_t[]){0x3C01, 0xFC00});
    double d[2];
    to_bytes(hb, KILN_F64, d);
    CHECK(d[0] == 1.0009765625 && isinf(d[1]) && d[1] < 0);
    kiln_release(hb);
}

/* Dense f32 <-> f16/bf16 runs take the bulk (F16C) path, strided ones the
 * per-element path: both must give the same bits. */
static void test_bulk_matches_strided(void) {
    enum { N = 64 };
    kiln_manual_seed(3);
    kiln_tensor *r = kiln_randn(KILN_SHAPE(N, N), KILN_F32, KILN_CPU);
    kiln_tensor *big = kiln_full(KILN_SHAPE(N, N), 5000.0, KILN_F32, KILN_CPU);
    static float rv[N * N], bv[N * N];
    CHECK_OK(kiln_to_host(r, rv, sizeof rv));
    CHECK_OK(kiln_to_host(big, bv, sizeof bv));
    for (int i = 0; i < N * N; i++) rv[i] *= bv[i] * (i % 3 == 0 ? 1e-6f : 1.0f); /* normals, subnormals */
    kiln_tensor *a = kiln_from_data(KILN_SHAPE(N, N), KILN_F32, KILN_CPU, rv);
    kiln_tensor *at = kiln_transpose(a, 0, 1);
    int bad = 0;
    for (int d = KILN_F16; d <= KILN_BF16; d++) {
        kiln_tensor *dense = kiln_to(a, KILN_CPU, (kiln_dtype)d, 0);
        kiln_tensor *strided = kiln_to(at, KILN_CPU, (kiln_dtype)d, 0);
        static uint16_t dv[N * N], sv[N * N];
        CHECK_OK(kiln_to_host(dense, dv, sizeof dv));
        CHECK_OK(kiln_to_host(strided, sv, sizeof sv));
        for (int i = 0; i < N; i++)
            for (int j = 0; j < N; j++) bad += dv[i * N + j] != sv[j * N + i];
        /* And back to f32, dense and strided. */
        kiln_tensor *back_dense = kiln_to(dense, KILN_CPU, KILN_F32, 0);
        kiln_tensor *st = kiln_transpose(strided, 0, 1);
        kiln_tensor *back_strided = kiln_to(st, KILN_CPU, KILN_F32, 0);
        static float f1[N * N], f2[N * N];
        CHECK_OK(kiln_to_host(back_dense, f1, sizeof f1));
        CHECK_OK(kiln_to_host(back_strided, f2, sizeof f2));
        bad += memcmp(f1, f2, sizeof f1) != 0;
        kiln_tensor *all[] = {back_strided, st, back_dense, strided, dense};
        for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) kiln_release(all[k]);
    }
    CHECK_EQ_I(bad, 0);
    kiln_release(at);
    kiln_release(a);
    kiln_release(big);
    kiln_release(r);
}

static void test_float_to_int(void) {
    const float v[] = {3.99f, -3.99f, 300.7f, NAN, 1e20f, -1e20f, 0.0f, -0.5f};
    kiln_tensor *t = from_f32(8, v);
    int32_t i32[8];
    to_bytes(t, KILN_I32, i32);
    const int32_t want32[] = {3, -3, 300, 0, INT32_MAX, INT32_MIN, 0, 0};
    for (int i = 0; i < 8; i++) CHECK_MSG(i32[i] == want32[i], "i32[%d] = %d, want %d", i, i32[i], want32[i]);
    int64_t i64[8];
    to_bytes(t, KILN_I64, i64);
    const int64_t want64[] = {3, -3, 300, 0, INT64_MAX, INT64_MIN, 0, 0};
    for (int i = 0; i < 8; i++) CHECK_MSG(i64[i] == want64[i], "i64[%d] = %lld", i, (long long)i64[i]);
    uint8_t u8[8];
    to_bytes(t, KILN_U8, u8);
    /* Truncated, then modulo 256: 300 -> 44, -3 -> 253. */
    CHECK(u8[0] == 3 && u8[1] == 253 && u8[2] == 44 && u8[3] == 0 && u8[6] == 0 && u8[7] == 0);
    uint8_t b[8];
    to_bytes(t, KILN_BOOL, b);
    const uint8_t want_b[] = {1, 1, 1, 1, 1, 1, 0, 1}; /* NaN is true */
    CHECK(memcmp(b, want_b, 8) == 0);
    kiln_release(t);
}

static void test_int_conversions(void) {
    const int64_t v[] = {16777217, -1, ((int64_t)1 << 32) + 5, 257, 0};
    kiln_tensor *t = kiln_from_data(KILN_SHAPE(5), KILN_I64, KILN_CPU, v);
    float f[5];
    to_bytes(t, KILN_F32, f);
    CHECK(f[0] == 16777216.0f && f[1] == -1.0f); /* 2^24 + 1 rounds to even */
    int32_t i[5];
    to_bytes(t, KILN_I32, i);
    CHECK(i[0] == 16777217 && i[1] == -1 && i[2] == 5 && i[3] == 257); /* wraps modulo 2^32 */
    uint8_t u[5];
    to_bytes(t, KILN_U8, u);
    CHECK(u[1] == 255 && u[2] == 5 && u[3] == 1 && u[4] == 0);
    uint8_t b[5];
    to_bytes(t, KILN_BOOL, b);
    CHECK(b[0] == 1 && b[1] == 1 && b[4] == 0);
    kiln_release(t);
    kiln_tensor *bt = kiln_from_data(KILN_SHAPE(3), KILN_BOOL, KILN_CPU, (const uint8_t[]){0, 1, 7});
    int32_t bi[3];
    to_bytes(bt, KILN_I32, bi);
    CHECK(bi[0] == 0 && bi[1] == 1 && bi[2] == 1); /* a nonzero byte reads as true */
    kiln_release(bt);
}

/* Every one of the 64 dtype pairs carries 0..5 exactly (bool: 0/1). */
static void test_all_pairs(void) {
    int bad = 0;
    for (int s = 0; s < KILN_DTYPE_COUNT; s++) {
        kiln_tensor *a = kiln_arange(0, 6, 1, (kiln_dtype)s, KILN_CPU);
        for (int d = 0; d < KILN_DTYPE_COUNT; d++) {
            kiln_tensor *c = kiln_to(a, KILN_CPU, (kiln_dtype)d, 0);
            double back[6];
            to_bytes(c, KILN_F64, back);
            for (int i = 0; i < 6; i++) {
                /* arange in bool is 0, 1, 1, ...; anything to bool is x != 0 */
                double want = (s == KILN_BOOL || d == KILN_BOOL) ? (i != 0) : i;
                if (back[i] != want) {
                    bad++;
                    fprintf(stderr, "%s -> %s: [%d] = %g, want %g\n", kiln_dtype_name((kiln_dtype)s),
                            kiln_dtype_name((kiln_dtype)d), i, back[i], want);
                }
            }
            kiln_release(c);
        }
        kiln_release(a);
    }
    CHECK_EQ_I(bad, 0);
}

static void test_to_same_and_forced(void) {
    kiln_tensor *t = kiln_ones(KILN_SHAPE(4), KILN_F32, KILN_CPU);
    kiln_tensor *same = kiln_to(t, KILN_CPU, KILN_F32, 0);
    CHECK(same == t);
    CHECK_EQ_I(kiln_refcount(t), 2);
    kiln_release(same);
    CHECK_EQ_I(kiln_refcount(t), 1);
    kiln_tensor *copy = kiln_to(t, KILN_CPU, KILN_F32, KILN_COPY);
    CHECK(copy != t && !kiln_shares_storage(copy, t));
    CHECK(memcmp(kiln_data_ptr(copy), kiln_data_ptr(t), 16) == 0);
    kiln_release(copy);
    kiln_tensor *other = kiln_to(t, KILN_CPU, KILN_F64, 0);
    CHECK(other != t && kiln_dtype_of(other) == KILN_F64);
    kiln_release(other);
    kiln_release(t);
}

static void test_copy_broadcast_strided(void) {
    /* dst: a transposed (4, 3) view of a (3, 4) tensor; src (3,) broadcast. */
    kiln_tensor *base = kiln_zeros(KILN_SHAPE(3, 4), KILN_F64, KILN_CPU);
    kiln_tensor *dst = kiln_transpose(base, 0, 1);
    kiln_tensor *src = kiln_from_data(KILN_SHAPE(3), KILN_F32, KILN_CPU, (const float[]){1, 2, 3});
    CHECK_OK(kiln_copy_(dst, src, 0));
    double got[12];
    CHECK_OK(kiln_to_host(base, got, sizeof got));
    int bad = 0;
    for (int i = 0; i < 12; i++) bad += got[i] != (double)(i / 4 + 1); /* base[r][c] = r + 1 */
    CHECK_EQ_I(bad, 0);

    /* Non-contiguous source: every other column of a (2, 6) tensor. */
    kiln_tensor *wide = kiln_arange(0, 12, 1, KILN_I32, KILN_CPU);
    kiln_tensor *w2 = kiln_view(wide, KILN_SHAPE(2, 3, 2));
    kiln_tensor *even = kiln_narrow(w2, 2, 0, 1); /* (2, 3, 1) strides (6, 2, 1) */
    kiln_tensor *even2 = kiln_squeeze(even, 2);   /* (2, 3) values 0 2 4 / 6 8 10 */
    kiln_tensor *out = kiln_empty(KILN_SHAPE(2, 3), KILN_F32, KILN_CPU);
    CHECK_OK(kiln_copy_(out, even2, 0));
    float f[6];
    CHECK_OK(kiln_to_host(out, f, sizeof f));
    CHECK(f[0] == 0 && f[1] == 2 && f[2] == 4 && f[3] == 6 && f[5] == 10);
    /* to_host gathers a non-contiguous tensor in row-major order. */
    int32_t iv[6];
    CHECK_OK(kiln_to_host(even2, iv, sizeof iv));
    CHECK(iv[0] == 0 && iv[1] == 2 && iv[4] == 8 && iv[5] == 10);

    /* Shapes that neither match nor broadcast: both are named. */
    kiln_tensor *four = kiln_zeros(KILN_SHAPE(4), KILN_F32, KILN_CPU);
    CHECK_FAILS(kiln_copy_(out, four, 0), KILN_ERR_INVALID_ARGUMENT, "[4]");
    CHECK(strstr(kiln_error_message(), "[2, 3]") != NULL);
    /* An expanded tensor cannot be written. */
    kiln_tensor *exp = kiln_expand(four, KILN_SHAPE(2, 4));
    kiln_tensor *two4 = kiln_ones(KILN_SHAPE(2, 4), KILN_F32, KILN_CPU);
    CHECK_FAILS(kiln_copy_(exp, two4, 0), KILN_ERR_INVALID_ARGUMENT, "expanded");

    /* Overlap: copying a square matrix's transpose into itself. */
    kiln_tensor *sq = kiln_arange(0, 9, 1, KILN_F32, KILN_CPU);
    kiln_tensor *m = kiln_view(sq, KILN_SHAPE(3, 3));
    kiln_tensor *mt = kiln_transpose(m, 0, 1);
    CHECK_OK(kiln_copy_(m, mt, 0));
    float mv[9];
    CHECK_OK(kiln_to_host(m, mv, sizeof mv));
    bad = 0;
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 3; c++) bad += mv[r * 3 + c] != (float)(c * 3 + r);
    CHECK_EQ_I(bad, 0);
    CHECK_OK(kiln_copy_(m, m, 0)); /* the same view: nothing to do */

    kiln_tensor *all[] = {mt, m, sq, two4, exp, four, out, even2, even, w2, wide, src, dst, base};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_release(all[i]);
}

static void test_to_host_and_item(void) {
    kiln_tensor *t = kiln_ones(KILN_SHAPE(2, 2), KILN_F32, KILN_CPU);
    float buf[4];
    CHECK_FAILS(kiln_to_host(t, buf, 12), KILN_ERR_INVALID_ARGUMENT, "12 bytes");
    CHECK(strstr(kiln_error_message(), "16 bytes") != NULL);
    double v;
    CHECK_FAILS(kiln_item(t, &v), KILN_ERR_INVALID_ARGUMENT, "[2, 2]");
    const double vals[] = {-2.5, 0.5, 1.5, 3.0, -7.0, 1e12, 200.0, 1.0};
    for (int d = 0; d < KILN_DTYPE_COUNT; d++) {
        kiln_tensor *s = kiln_full(KILN_SHAPE(1, 1), vals[d], (kiln_dtype)d, KILN_CPU);
        CHECK_OK(kiln_item(s, &v));
        CHECK_MSG(v == vals[d], "item of %s = %g", kiln_dtype_name((kiln_dtype)d), v);
        kiln_release(s);
    }
    kiln_release(t);
}

static void test_pinned_copies(void) {
    kiln_tensor *src = kiln_arange(0, 256, 1, KILN_F32, KILN_CPU);
    kiln_tensor *pin = kiln_empty_pinned(KILN_SHAPE(256), KILN_F32);
    CHECK_OK(kiln_copy_(pin, src, KILN_NON_BLOCKING));
    CHECK(memcmp(kiln_data_ptr(pin), kiln_data_ptr(src), 256 * sizeof(float)) == 0);
    kiln_tensor *back = kiln_to(pin, KILN_CPU, KILN_F16, KILN_NON_BLOCKING);
    double v;
    kiln_tensor *last = kiln_narrow(back, 0, 255, 1);
    CHECK_OK(kiln_item(last, &v));
    CHECK(v == 255.0);
    kiln_stream *s = NULL;
    CHECK_OK(kiln_stream_create(KILN_CPU, 0, &s));
    CHECK_OK(kiln_record_stream(pin, s));
    CHECK_OK(kiln_record_stream(src, s));
    kiln_tensor *empty = kiln_empty(KILN_SHAPE(0), KILN_F32, KILN_CPU);
    CHECK_OK(kiln_record_stream(empty, s));
    CHECK_FAILS(kiln_record_stream(src, NULL), KILN_ERR_INVALID_ARGUMENT, "stream");
    kiln_tensor *all[] = {empty, last, back, pin, src};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_release(all[i]);
    CHECK_OK(kiln_stream_synchronize(s));
    CHECK_OK(kiln_stream_destroy(s));
}

static void test_meta(void) {
    size_t before = kiln_memory_allocated(KILN_META);
    kiln_tensor *real = kiln_ones(KILN_SHAPE(16, 16), KILN_F32, KILN_CPU);
    kiln_tensor *m = kiln_to(real, KILN_META, KILN_F16, 0);
    CHECK(m != NULL);
    CHECK(kiln_device_equal(kiln_get_device(m), KILN_META));
    CHECK_EQ_I(kiln_dtype_of(m), KILN_F16);
    CHECK_EQ_I(kiln_numel(m), 256);
    CHECK(kiln_data_ptr(m) == NULL);
    CHECK(kiln_memory_allocated(KILN_META) > before);
    uint64_t v0 = kiln_tensor_version(m);
    CHECK_OK(kiln_copy_(m, real, 0)); /* real -> meta: shapes only */
    CHECK(kiln_tensor_version(m) == v0 + 1);
    kiln_tensor *m2 = kiln_empty(KILN_SHAPE(16), KILN_F32, KILN_META);
    CHECK_OK(kiln_copy_(m, m2, 0)); /* meta -> meta broadcast: fine */
    CHECK_FAILS(kiln_copy_(real, m, 0), KILN_ERR_INVALID_ARGUMENT, "meta tensors have no data");
    CHECK_NULL_ERR(kiln_to(m, KILN_CPU, KILN_F32, 0), "meta tensors have no data");
    uint16_t h[256];
    CHECK_FAILS(kiln_to_host(m, h, sizeof h), KILN_ERR_INVALID_ARGUMENT, "meta tensors have no data");
    kiln_tensor *view = kiln_transpose(m, 0, 1);
    CHECK(view != NULL && kiln_stride(view, 0) == 1);
    kiln_tensor *mc = kiln_contiguous(view); /* a copy on meta: no data touched */
    CHECK(mc != NULL && kiln_is_contiguous(mc));
    kiln_tensor *all[] = {mc, view, m2, m, real};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_release(all[i]);
    CHECK_EQ_I(kiln_memory_allocated(KILN_META), before);
}

static void test_versions(void) {
    kiln_tensor *t = kiln_zeros(KILN_SHAPE(4), KILN_F32, KILN_CPU);
    kiln_tensor *v = kiln_view(t, KILN_SHAPE(2, 2));
    kiln_tensor *o = kiln_ones(KILN_SHAPE(2, 2), KILN_F32, KILN_CPU);
    CHECK_EQ_I(kiln_tensor_version(t), 0);
    CHECK_OK(kiln_copy_(v, o, 0));
    CHECK_EQ_I(kiln_tensor_version(t), 1);
    CHECK_EQ_I(kiln_tensor_version(v), 1);
    CHECK_EQ_I(kiln_tensor_version(o), 0); /* the source is not written */
    CHECK_OK(kiln_copy_(t, kiln_view(o, KILN_SHAPE(4)), 0));
    CHECK_EQ_I(kiln_tensor_version(v), 2);
    kiln_tensor *c = kiln_to(t, KILN_CPU, KILN_F32, KILN_COPY);
    CHECK_EQ_I(kiln_tensor_version(c), 1); /* its own storage, written once by the copy */
    kiln_release(c);
    kiln_release(o);
    kiln_release(v);
    kiln_release(t);
}

int main(void) {
    if (kiln_init()) return 1;
    size_t start = kiln_memory_allocated(KILN_CPU);
    kiln_scope_begin(); /* catches the views made inline in the calls above */
    test_float_to_half();
    test_bulk_matches_strided();
    test_float_to_int();
    test_int_conversions();
    test_all_pairs();
    test_to_same_and_forced();
    test_copy_broadcast_strided();
    test_to_host_and_item();
    test_pinned_copies();
    test_meta();
    test_versions();
    CHECK_OK(kiln_scope_end());
    CHECK_EQ_I(kiln_memory_allocated(KILN_CPU), start);
    kiln_shutdown();
    return kt_finish();
}

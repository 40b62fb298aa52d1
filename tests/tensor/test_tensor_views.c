/* Views: every view op with exact shapes, strides and offsets, storage
 * sharing, writes through views, view on incompatible strides failing with
 * both shapes named, reshape copying then, contiguous. */
#include <stdint.h>

#include "test_util.h"

static bool geometry(const kiln_tensor *t, kiln_shape shape, const int64_t *strides, int64_t offset) {
    if (kiln_ndim(t) != shape.ndim || kiln_storage_offset(t) != offset) return false;
    for (int i = 0; i < shape.ndim; i++)
        if (kiln_size(t, i) != shape.d[i] || kiln_stride(t, i) != strides[i]) return false;
    return true;
}

#define GEOM(t, shape, offset, ...) geometry((t), shape, (const int64_t[]){0, ##__VA_ARGS__} + 1, (offset))

/* 0, 1, 2, ... as f32 in the given shape. */
static kiln_tensor *iota(kiln_shape shape) {
    int64_t n = 1;
    for (int i = 0; i < shape.ndim; i++) n *= shape.d[i];
    kiln_tensor *a = kiln_arange(0, (double)n, 1, KILN_F32, KILN_CPU);
    kiln_tensor *v = kiln_view(a, shape);
    kiln_release(a);
    return v;
}

static void read_f32(const kiln_tensor *t, float *out) {
    CHECK_OK(kiln_to_host(t, out, (size_t)kiln_numel(t) * sizeof(float)));
}

static void test_view_and_reshape(void) {
    kiln_tensor *t = iota(KILN_SHAPE(2, 3, 4));
    CHECK(GEOM(t, KILN_SHAPE(2, 3, 4), 0, 12, 4, 1));
    kiln_tensor *v = kiln_view(t, KILN_SHAPE(6, -1));
    CHECK(GEOM(v, KILN_SHAPE(6, 4), 0, 4, 1));
    CHECK(kiln_shares_storage(t, v));
    CHECK(kiln_data_ptr(v) == kiln_data_ptr(t));
    kiln_tensor *s = kiln_view(t, KILN_SHAPE());
    CHECK(s == NULL); /* 24 elements do not fit a scalar */
    kiln_tensor *one = kiln_view(v, KILN_SHAPE(1, 24, 1));
    CHECK(GEOM(one, KILN_SHAPE(1, 24, 1), 0, 24, 1, 1));
    kiln_release(one);

    /* Views of a transposed tensor: splitting a dim works, merging across
     * the transposed dims does not. */
    kiln_tensor *tt = kiln_transpose(v, 0, 1); /* (4, 6) strides (1, 4) */
    CHECK(GEOM(tt, KILN_SHAPE(4, 6), 0, 1, 4));
    CHECK(!kiln_is_contiguous(tt));
    kiln_tensor *split = kiln_view(tt, KILN_SHAPE(2, 2, 2, 3));
    CHECK(GEOM(split, KILN_SHAPE(2, 2, 2, 3), 0, 2, 1, 12, 4));
    kiln_release(split);
    kiln_error_clear();
    kiln_tensor *bad = kiln_view(tt, KILN_SHAPE(24));
    CHECK(bad == NULL);
    CHECK(kiln_error_last()->status == KILN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(kiln_error_message(), "[4, 6]") != NULL);
    CHECK(strstr(kiln_error_message(), "[24]") != NULL);
    CHECK(strstr(kiln_error_last()->hint, "kiln_reshape") != NULL);

    /* reshape: a view when possible, a copy otherwise. */
    kiln_tensor *r1 = kiln_reshape(tt, KILN_SHAPE(2, 2, 6));
    CHECK(kiln_shares_storage(r1, t));
    CHECK(GEOM(r1, KILN_SHAPE(2, 2, 6), 0, 2, 1, 4));
    kiln_tensor *r2 = kiln_reshape(tt, KILN_SHAPE(24));
    CHECK(r2 != NULL);
    CHECK(!kiln_shares_storage(r2, t));
    CHECK(kiln_is_contiguous(r2));
    float got[24];
    read_f32(r2, got);
    int wrong = 0;
    for (int i = 0; i < 24; i++) wrong += got[i] != (float)((i % 6) * 4 + i / 6); /* tt[i/6][i%6] */
    CHECK_EQ_I(wrong, 0);
    kiln_release(r1);
    kiln_release(r2);
    kiln_release(tt);
    kiln_release(v);

    /* Scalars and size-1 dims. */
    kiln_tensor *sc = kiln_full(KILN_SHAPE(), 5, KILN_F32, KILN_CPU);
    kiln_tensor *sv = kiln_view(sc, KILN_SHAPE(1, 1));
    CHECK(GEOM(sv, KILN_SHAPE(1, 1), 0, 1, 1));
    kiln_tensor *back = kiln_view(sv, KILN_SHAPE());
    CHECK(back != NULL && kiln_ndim(back) == 0);
    kiln_release(back);
    kiln_release(sv);
    kiln_release(sc);
    CHECK_NULL_ERR(kiln_view(t, KILN_SHAPE(5, -1)), "[5, -1]");
    CHECK_NULL_ERR(kiln_view(t, KILN_SHAPE(-1, -1)), "kiln_view");
    kiln_release(t);
}

static void test_permute_transpose(void) {
    kiln_tensor *t = iota(KILN_SHAPE(2, 3, 4));
    kiln_tensor *p = kiln_permute(t, 3, (const int[]){2, 0, 1});
    CHECK(GEOM(p, KILN_SHAPE(4, 2, 3), 0, 1, 12, 4));
    CHECK(kiln_shares_storage(p, t));
    float got[24];
    read_f32(p, got); /* p[a][b][c] = t[b][c][a] = b*12 + c*4 + a */
    int wrong = 0;
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 2; b++)
            for (int c = 0; c < 3; c++) wrong += got[a * 6 + b * 3 + c] != (float)(b * 12 + c * 4 + a);
    CHECK_EQ_I(wrong, 0);
    kiln_tensor *neg = kiln_permute(t, 3, (const int[]){-1, -3, -2});
    CHECK(GEOM(neg, KILN_SHAPE(4, 2, 3), 0, 1, 12, 4));
    kiln_release(neg);
    kiln_release(p);
    kiln_tensor *tr = kiln_transpose(t, -1, 0);
    CHECK(GEOM(tr, KILN_SHAPE(4, 3, 2), 0, 1, 4, 12));
    kiln_release(tr);
    kiln_tensor *same = kiln_transpose(t, 1, 1);
    CHECK(GEOM(same, KILN_SHAPE(2, 3, 4), 0, 12, 4, 1));
    kiln_release(same);
    kiln_release(t);
}

static void test_narrow(void) {
    kiln_tensor *t = iota(KILN_SHAPE(4, 5));
    kiln_tensor *n = kiln_narrow(t, 1, 1, 3);
    CHECK(GEOM(n, KILN_SHAPE(4, 3), 1, 5, 1));
    CHECK(!kiln_is_contiguous(n));
    CHECK(kiln_data_ptr(n) == (float *)kiln_data_ptr(t) + 1);
    float got[12];
    read_f32(n, got);
    CHECK(got[0] == 1 && got[2] == 3 && got[3] == 6 && got[11] == 18);
    kiln_tensor *nn = kiln_narrow(n, 0, 2, 2);
    CHECK(GEOM(nn, KILN_SHAPE(2, 3), 11, 5, 1));
    kiln_tensor *neg = kiln_narrow(t, -1, -2, 2); /* start counts from the end */
    CHECK(GEOM(neg, KILN_SHAPE(4, 2), 3, 5, 1));
    kiln_tensor *empty = kiln_narrow(t, 0, 4, 0);
    CHECK(empty != NULL && kiln_numel(empty) == 0);
    kiln_release(empty);
    kiln_release(neg);
    kiln_release(nn);
    kiln_release(n);
    kiln_release(t);
}

static void test_expand(void) {
    kiln_tensor *t = iota(KILN_SHAPE(3, 1));
    kiln_tensor *e = kiln_expand(t, KILN_SHAPE(2, 3, 4));
    CHECK(GEOM(e, KILN_SHAPE(2, 3, 4), 0, 0, 1, 0));
    CHECK(kiln_shares_storage(e, t));
    float got[24];
    read_f32(e, got);
    int wrong = 0;
    for (int i = 0; i < 24; i++) wrong += got[i] != (float)((i / 4) % 3);
    CHECK_EQ_I(wrong, 0);
    kiln_tensor *keep = kiln_expand(t, KILN_SHAPE(-1, 5));
    CHECK(GEOM(keep, KILN_SHAPE(3, 5), 0, 1, 0));
    CHECK_NULL_ERR(kiln_expand(t, KILN_SHAPE(4, 4)), "[3, 1]");
    CHECK_NULL_ERR(kiln_expand(t, KILN_SHAPE(5)), "kiln_expand");
    CHECK_NULL_ERR(kiln_expand(t, KILN_SHAPE(-1, 3, 1)), "kiln_expand");
    kiln_release(keep);
    kiln_release(e);
    kiln_release(t);
}

static void test_squeeze_unsqueeze(void) {
    kiln_tensor *t = iota(KILN_SHAPE(2, 1, 3));
    kiln_tensor *s = kiln_squeeze(t, 1);
    CHECK(GEOM(s, KILN_SHAPE(2, 3), 0, 3, 1));
    kiln_tensor *s2 = kiln_squeeze(t, -3); /* size 2: unchanged */
    CHECK(GEOM(s2, KILN_SHAPE(2, 1, 3), 0, 3, 3, 1));
    CHECK(s2 != t && kiln_shares_storage(s2, t));
    kiln_tensor *u0 = kiln_unsqueeze(s, 0);
    CHECK(GEOM(u0, KILN_SHAPE(1, 2, 3), 0, 6, 3, 1));
    kiln_tensor *u1 = kiln_unsqueeze(s, 1);
    CHECK(GEOM(u1, KILN_SHAPE(2, 1, 3), 0, 3, 3, 1));
    kiln_tensor *ul = kiln_unsqueeze(s, -1);
    CHECK(GEOM(ul, KILN_SHAPE(2, 3, 1), 0, 3, 1, 1));
    kiln_tensor *sc = kiln_full(KILN_SHAPE(), 1, KILN_F32, KILN_CPU);
    kiln_tensor *us = kiln_unsqueeze(sc, 0);
    CHECK(GEOM(us, KILN_SHAPE(1), 0, 1));
    kiln_tensor *ss = kiln_squeeze(us, 0);
    CHECK(ss && kiln_ndim(ss) == 0);
    kiln_tensor *sss = kiln_squeeze(sc, -1); /* a scalar squeezes to itself */
    CHECK(sss && kiln_ndim(sss) == 0);
    kiln_tensor *all[] = {s, s2, u0, u1, ul, sc, us, ss, sss, t};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_release(all[i]);
}

static void test_writes_through_views(void) {
    kiln_tensor *t = kiln_zeros(KILN_SHAPE(3, 4), KILN_F32, KILN_CPU);
    uint64_t v0 = kiln_tensor_version(t);
    kiln_tensor *col = kiln_narrow(t, 1, 2, 1); /* (3, 1) column 2 */
    kiln_tensor *sevens = kiln_full(KILN_SHAPE(1), 7, KILN_F32, KILN_CPU);
    CHECK_OK(kiln_copy_(col, sevens, 0));    /* broadcast into a strided view */
    CHECK(kiln_tensor_version(t) == v0 + 1); /* the version is shared by views */
    CHECK(kiln_tensor_version(col) == kiln_tensor_version(t));
    float got[12];
    read_f32(t, got);
    int wrong = 0;
    for (int i = 0; i < 12; i++) wrong += got[i] != (i % 4 == 2 ? 7.0f : 0.0f);
    CHECK_EQ_I(wrong, 0);
    kiln_tensor *tr = kiln_transpose(t, 0, 1);
    kiln_tensor *row = kiln_narrow(tr, 0, 0, 1); /* column 0 of t, through the transpose */
    kiln_tensor *src = kiln_from_data(KILN_SHAPE(1, 3), KILN_F32, KILN_CPU, (const float[]){1, 2, 3});
    CHECK_OK(kiln_copy_(row, src, 0));
    read_f32(t, got);
    CHECK(got[0] == 1 && got[4] == 2 && got[8] == 3 && got[2] == 7);
    kiln_tensor *all[] = {src, row, tr, sevens, col, t};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_release(all[i]);
}

static void test_contiguous(void) {
    kiln_tensor *t = iota(KILN_SHAPE(3, 4));
    kiln_tensor *c = kiln_contiguous(t);
    CHECK(c == t); /* already contiguous: the same handle, one more reference */
    CHECK_EQ_I(kiln_refcount(t), 2);
    kiln_release(c);
    kiln_tensor *tr = kiln_transpose(t, 0, 1);
    kiln_tensor *ct = kiln_contiguous(tr);
    CHECK(ct != tr && !kiln_shares_storage(ct, t));
    CHECK(GEOM(ct, KILN_SHAPE(4, 3), 0, 3, 1));
    float got[12];
    CHECK(memcpy(got, kiln_data_ptr(ct), sizeof got) != NULL);
    CHECK(got[0] == 0 && got[1] == 4 && got[2] == 8 && got[3] == 1);
    /* Size-1 dims do not constrain strides. */
    kiln_tensor *n = kiln_narrow(t, 0, 1, 1);
    CHECK(kiln_is_contiguous(n));
    kiln_tensor *all[] = {n, ct, tr, t};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_release(all[i]);
}

int main(void) {
    if (kiln_init()) return 1;
    size_t start = kiln_memory_allocated(KILN_CPU);
    test_view_and_reshape();
    test_permute_transpose();
    test_narrow();
    test_expand();
    test_squeeze_unsqueeze();
    test_writes_through_views();
    test_contiguous();
    CHECK_EQ_I(kiln_memory_allocated(KILN_CPU), start);
    kiln_shutdown();
    return kt_finish();
}

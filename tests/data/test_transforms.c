/* Transforms against a straightforward reference: pad (zero or reflect)
 * into an explicit padded image, crop, flip, normalise in double, cut out,
 * one step after another. The random parameters are not recomputed from
 * the RNG: for each sample the test searches every candidate (crop
 * offsets, flip, cutout centre) for the one whose reference output matches,
 * then checks the distribution of what it found (every offset used, flip
 * frequency near p, cutout squares clipped at the borders). */
#include "kiln/data.h"
#include "test_util.h"

enum { C = 3, H = 7, W = 9 };

typedef struct params {
    int oy, ox, flip, cy, cx; /* cy < 0: no cutout */
} params;

/* Reference: explicit padded image, then crop, flip, normalise, cutout. */
static void reference(const kiln_transform_opts *o, const uint8_t *img, params p, double *out) {
    int pad = o->crop_padding, PH = H + 2 * pad, PW = W + 2 * pad;
    static double padded[C][H + 16][W + 16];
    for (int c = 0; c < C; c++)
        for (int py = 0; py < PH; py++)
            for (int px = 0; px < PW; px++) {
                int sy = py - pad, sx = px - pad;
                bool inside = sy >= 0 && sy < H && sx >= 0 && sx < W;
                if (!inside && o->pad_mode == KILN_PAD_ZERO) {
                    padded[c][py][px] = 0.0;
                    continue;
                }
                if (sy < 0) sy = -sy;
                if (sy >= H) sy = 2 * (H - 1) - sy;
                if (sx < 0) sx = -sx;
                if (sx >= W) sx = 2 * (W - 1) - sx;
                padded[c][py][px] = img[(c * H + sy) * W + sx];
            }
    int lo = o->cutout / 2;
    for (int c = 0; c < C; c++)
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++) {
                int cx_ = p.flip ? W - 1 - x : x;
                double v = padded[c][y + p.oy][cx_ + p.ox] / 255.0;
                if (o->normalize) v = (v - o->mean[c]) / o->std[c];
                if (p.cy >= 0 && y >= p.cy - lo && y < p.cy - lo + o->cutout && x >= p.cx - lo &&
                    x < p.cx - lo + o->cutout)
                    v = 0.0;
                out[(c * H + y) * W + x] = v;
            }
}

static bool close_to(const float *got, const double *want) {
    for (int i = 0; i < C * H * W; i++)
        if (fabs(got[i] - want[i]) > 1e-5 * (1.0 + fabs(want[i]))) return false;
    return true;
}

/* The candidate parameters that reproduce `got`; false if none does. */
static bool find_params(const kiln_transform_opts *o, const uint8_t *img, const float *got, params *found) {
    static double want[C * H * W];
    int n_off = 2 * o->crop_padding + 1;
    for (int oy = 0; oy < n_off; oy++)
        for (int ox = 0; ox < n_off; ox++)
            for (int flip = 0; flip < 2; flip++)
                for (int cy = o->cutout ? 0 : -1; cy < (o->cutout ? H : 0); cy++)
                    for (int cx = o->cutout ? 0 : -1; cx < (o->cutout ? W : 0); cx++) {
                        params p = {oy, ox, flip, cy, cx};
                        reference(o, img, p, want);
                        if (close_to(got, want)) {
                            *found = p;
                            return true;
                        }
                    }
    return false;
}

static void random_image(uint8_t *img, uint32_t salt) {
    for (int i = 0; i < C * H * W; i++) img[i] = (uint8_t)((i * 37u + salt * 101u + (i * i) % 13u) & 255u);
}

static const kiln_sample_info info_u8 = {KILN_U8, C, H, W, 10};

static void test_plain_conversion(void) {
    kiln_transform_opts o = kiln_transform_opts_default();
    CHECK_OK(kiln_transform_check(&o, info_u8));
    uint8_t img[C * H * W];
    float out[C * H * W];
    random_image(img, 1);
    kiln_transform_apply(&o, info_u8, img, out, 0, 0, 0);
    bool ok = true;
    for (int i = 0; i < C * H * W; i++) ok &= fabsf(out[i] - img[i] / 255.0f) < 1e-6f;
    CHECK(ok);
    /* f32 samples are taken as they are (no /255). */
    kiln_sample_info info_f32 = {KILN_F32, C, H, W, 10};
    float src[C * H * W];
    for (int i = 0; i < C * H * W; i++) src[i] = (float)i * 0.5f - 3.0f;
    o.normalize = true;
    for (int c = 0; c < C; c++) o.mean[c] = 0.25f * c, o.std[c] = 1.5f + c;
    kiln_transform_apply(&o, info_f32, src, out, 0, 0, 0);
    ok = true;
    for (int i = 0; i < C * H * W; i++) {
        int c = i / (H * W);
        ok &= fabsf(out[i] - (src[i] - o.mean[c]) / o.std[c]) < 1e-5f;
    }
    CHECK(ok);
}

static void run_search(const char *what, kiln_transform_opts o, int samples, bool check_flip_rate) {
    uint8_t img[C * H * W];
    float out[C * H * W];
    int n_off = 2 * o.crop_padding + 1;
    int seen_oy[16] = {0}, seen_ox[16] = {0}, flips = 0, matched = 0, border_cut = 0;
    for (int i = 0; i < samples; i++) {
        random_image(img, (uint32_t)i);
        kiln_transform_apply(&o, info_u8, img, out, 42, 3, i);
        params p;
        if (!find_params(&o, img, out, &p)) continue;
        matched++;
        seen_oy[p.oy]++;
        seen_ox[p.ox]++;
        flips += p.flip;
        if (p.cy >= 0 && (p.cy - o.cutout / 2 < 0 || p.cx - o.cutout / 2 < 0 ||
                          p.cy - o.cutout / 2 + o.cutout > H || p.cx - o.cutout / 2 + o.cutout > W))
            border_cut++;
    }
    CHECK_MSG(matched == samples, "%s: %d of %d samples match a reference", what, matched, samples);
    bool all_offsets = true;
    for (int k = 0; k < n_off; k++) all_offsets &= seen_oy[k] > 0 && seen_ox[k] > 0;
    CHECK_MSG(all_offsets, "%s: some crop offset never drawn", what);
    if (check_flip_rate) {
        double rate = (double)flips / samples;
        CHECK_MSG(fabs(rate - o.flip_p) < 0.1, "%s: flip rate %.3f for p %.2f", what, rate, (double)o.flip_p);
    }
    if (o.cutout) CHECK_MSG(border_cut > 0, "%s: no cutout square was clipped at a border", what);
}

static void test_crop_flip_zero(void) {
    kiln_transform_opts o = kiln_transform_opts_default();
    o.crop_padding = 2;
    o.pad_mode = KILN_PAD_ZERO;
    o.flip_p = 0.5f;
    o.normalize = true;
    for (int c = 0; c < C; c++) o.mean[c] = 0.4f + 0.05f * c, o.std[c] = 0.2f + 0.03f * c;
    CHECK_OK(kiln_transform_check(&o, info_u8));
    run_search("zero pad", o, 300, true);
}

static void test_crop_reflect(void) {
    kiln_transform_opts o = kiln_transform_opts_default();
    o.crop_padding = 4; /* > H/2: reflection reaches deep into the image */
    o.pad_mode = KILN_PAD_REFLECT;
    o.flip_p = 0.25f;
    CHECK_OK(kiln_transform_check(&o, info_u8));
    run_search("reflect pad", o, 400, true);
}

static void test_cutout_borders(void) {
    kiln_transform_opts o = kiln_transform_opts_default();
    o.cutout = 4;
    o.normalize = true;
    for (int c = 0; c < C; c++) o.mean[c] = 0.5f, o.std[c] = 0.25f;
    CHECK_OK(kiln_transform_check(&o, info_u8));
    run_search("cutout", o, 200, false);
    o.cutout = 5; /* odd side */
    o.crop_padding = 1;
    o.pad_mode = KILN_PAD_REFLECT;
    o.flip_p = 0.5f;
    run_search("cutout odd + crop", o, 100, false);
}

static void test_alternating_flip(void) {
    kiln_transform_opts o = kiln_transform_opts_default();
    o.alternating_flip = true;
    uint8_t img[C * H * W];
    float out[C * H * W];
    int flipped_e0 = 0, n = 400;
    bool alternates = true, matched = true;
    for (int i = 0; i < n; i++) {
        random_image(img, (uint32_t)i);
        int prev = -1;
        for (int e = 0; e < 4; e++) {
            kiln_transform_apply(&o, info_u8, img, out, 7, e, i);
            params p;
            if (!find_params(&o, img, out, &p)) {
                matched = false;
                break;
            }
            if (prev >= 0) alternates &= p.flip != prev;
            if (e == 0) flipped_e0 += p.flip;
            prev = p.flip;
        }
    }
    CHECK(matched);
    CHECK_MSG(alternates, "alternating flip did not alternate between epochs");
    CHECK_MSG(flipped_e0 > n / 4 && flipped_e0 < 3 * n / 4, "%d of %d flipped in epoch 0", flipped_e0, n);
}

static void test_reproducible(void) {
    kiln_transform_opts o = kiln_transform_opts_default();
    o.crop_padding = 3;
    o.flip_p = 0.5f;
    o.cutout = 3;
    uint8_t img[C * H * W];
    float a[C * H * W], b[C * H * W];
    random_image(img, 9);
    int differ_epoch = 0, differ_seed = 0;
    for (int i = 0; i < 50; i++) {
        kiln_transform_apply(&o, info_u8, img, a, 1, 5, i);
        kiln_transform_apply(&o, info_u8, img, b, 1, 5, i);
        CHECK(memcmp(a, b, sizeof a) == 0);
        kiln_transform_apply(&o, info_u8, img, b, 1, 6, i);
        differ_epoch += memcmp(a, b, sizeof a) != 0;
        kiln_transform_apply(&o, info_u8, img, b, 2, 5, i);
        differ_seed += memcmp(a, b, sizeof a) != 0;
    }
    CHECK_MSG(differ_epoch > 40, "only %d of 50 samples change with the epoch", differ_epoch);
    CHECK_MSG(differ_seed > 40, "only %d of 50 samples change with the seed", differ_seed);
}

static void test_bad_options(void) {
    kiln_transform_opts o = kiln_transform_opts_default();
    o.crop_padding = 7;
    o.pad_mode = KILN_PAD_REFLECT;
    CHECK_FAILS(kiln_transform_check(&o, info_u8), KILN_ERR_INVALID_ARGUMENT, "reflect padding 7");
    o = kiln_transform_opts_default();
    o.normalize = true;
    o.std[1] = 0.0f;
    CHECK_FAILS(kiln_transform_check(&o, info_u8), KILN_ERR_INVALID_ARGUMENT, "channel 1");
    o = kiln_transform_opts_default();
    o.flip_p = 1.5f;
    CHECK_FAILS(kiln_transform_check(&o, info_u8), KILN_ERR_INVALID_ARGUMENT, "flip_p 1.5");
    kiln_sample_info bad = {KILN_I64, 1, 2, 2, 2};
    o = kiln_transform_opts_default();
    CHECK_FAILS(kiln_transform_check(&o, bad), KILN_ERR_INVALID_ARGUMENT, "i64");
}

int main(void) {
    CHECK_OK(kiln_init());
    test_plain_conversion();
    test_crop_flip_zero();
    test_crop_reflect();
    test_cutout_borders();
    test_alternating_flip();
    test_reproducible();
    test_bad_options();
    kiln_shutdown();
    return kt_finish();
}

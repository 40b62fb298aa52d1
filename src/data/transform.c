/* Per-sample image transforms of include/kiln/data.h, fused into one pass.
 *
 * For output pixel (c, y, x) of a (C, H, W) sample the pipeline is
 *     x'  = flip ? W-1-x : x                    (horizontal flip)
 *     sy  = y + oy - pad, sx = x' + ox - pad     (crop from the padded image)
 *     raw = src[c, sy, sx], or the padding value (zero or reflected)
 *     out = (raw * scale - mean[c]) / std[c]     (u8 -> f32 and normalise)
 *     out = 0 inside the cutout square
 * which equals running pad+crop, flip, to-tensor, normalise and cutout one
 * after another (torchvision's order), without the intermediate images.
 *
 * Random draws: the words of the stream keyed by (seed, "XFRM", epoch,
 * index) are used in a fixed order (crop y, crop x, flip, cutout y, cutout
 * x), so a sample's transform depends on nothing else. */
#include <math.h>
#include <string.h>

#include "base/error.h"
#include "data/transform_internal.h"

/* Domain tags keep the transform and alternating-flip streams apart from
 * each other and from the loader's permutation stream. */
#define XFRM_TAG 0x5846524DULL /* "XFRM" */
#define ALTF_TAG 0x414C5446ULL /* "ALTF" */

enum { WORD_CROP_Y = 0, WORD_CROP_X, WORD_FLIP, WORD_CUT_Y, WORD_CUT_X };

kiln_transform_opts kiln_transform_opts_default(void) {
    kiln_transform_opts o;
    memset(&o, 0, sizeof o);
    o.scale_u8 = true;
    for (int c = 0; c < KILN_TRANSFORM_MAX_CHANNELS; c++) o.std[c] = 1.0f;
    return o;
}

kiln_status kiln_transform_check(const kiln_transform_opts *opts, kiln_sample_info info) {
    if (!opts) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_transform_check: opts is NULL");
    if (info.dtype != KILN_U8 && info.dtype != KILN_F32)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "store samples as u8 or f32",
                          "transforms: samples of dtype %s are not supported (u8 or f32)",
                          kiln_dtype_name(info.dtype));
    if (info.channels <= 0 || info.height <= 0 || info.width <= 0)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "transforms: sample shape (%d, %d, %d) is empty",
                          info.channels, info.height, info.width);
    if (opts->normalize) {
        if (info.channels > KILN_TRANSFORM_MAX_CHANNELS)
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                              "normalise after loading instead (kiln_sub, kiln_div)",
                              "transforms: normalize supports up to %d channels; samples have %d",
                              KILN_TRANSFORM_MAX_CHANNELS, info.channels);
        for (int c = 0; c < info.channels; c++)
            if (!(opts->std[c] != 0.0f) || !isfinite(opts->std[c]) || !isfinite(opts->mean[c]))
                return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                                  "give every channel a finite mean and nonzero std",
                                  "transforms: channel %d has mean %g, std %g", c, (double)opts->mean[c],
                                  (double)opts->std[c]);
    }
    int pad = opts->crop_padding;
    if (pad < 0)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "transforms: crop_padding %d is negative", pad);
    if (opts->pad_mode != KILN_PAD_ZERO && opts->pad_mode != KILN_PAD_REFLECT)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use KILN_PAD_ZERO or KILN_PAD_REFLECT",
                          "transforms: pad_mode %d is not a kiln_pad_mode", (int)opts->pad_mode);
    if (opts->pad_mode == KILN_PAD_REFLECT && pad > 0 && (pad >= info.height || pad >= info.width))
        return KILN_RAISE(
            KILN_ERR_INVALID_ARGUMENT, "use a smaller padding or KILN_PAD_ZERO",
            "transforms: reflect padding %d needs images larger than the padding; samples are %dx%d", pad,
            info.height, info.width);
    if (!(opts->flip_p >= 0.0f && opts->flip_p <= 1.0f))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "transforms: flip_p %g is outside [0, 1]",
                          (double)opts->flip_p);
    if (opts->cutout < 0)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "transforms: cutout %d is negative", opts->cutout);
    return KILN_OK;
}

/* A uniform integer in [0, n) from one 32-bit word (multiply-shift; bias
 * below n / 2^32, immaterial for image sizes). */
static int64_t uniform_below(uint32_t word, int64_t n) {
    return (int64_t)(((uint64_t)word * (uint64_t)n) >> 32);
}

int transform_source_coord(int p, int pad, int n, kiln_pad_mode mode) {
    int s = p - pad;
    if (s >= 0 && s < n) return s;
    if (mode == KILN_PAD_ZERO) return -1;
    return s < 0 ? -s : 2 * (n - 1) - s;
}

transform_plan transform_plan_sample(const kiln_transform_opts *o, kiln_sample_info info, uint64_t seed,
                                     int64_t epoch, int64_t index) {
    kiln_rng base = kiln_rng_make(seed);
    kiln_rng r =
        kiln_rng_split(kiln_rng_split(kiln_rng_split(base, XFRM_TAG), (uint64_t)epoch), (uint64_t)index);
    transform_plan p = {0};
    int pad = o->crop_padding;
    if (pad > 0) {
        p.oy = (int)uniform_below(kiln_rng_u32_at(&r, WORD_CROP_Y), 2 * pad + 1);
        p.ox = (int)uniform_below(kiln_rng_u32_at(&r, WORD_CROP_X), 2 * pad + 1);
    }
    if (o->flip_p > 0.0f) p.flip = kiln_rng_u32_to_uniform(kiln_rng_u32_at(&r, WORD_FLIP)) < o->flip_p;
    if (o->alternating_flip) {
        kiln_rng alt = kiln_rng_split(base, ALTF_TAG);
        uint32_t bit = kiln_rng_u32_at(&alt, (uint64_t)index) & 1u;
        /* Composes with the random flip, so both together flip iff exactly one says so. */
        p.flip ^= ((uint64_t)epoch + bit) & 1u;
    }
    if (o->cutout > 0) {
        int cy = (int)uniform_below(kiln_rng_u32_at(&r, WORD_CUT_Y), info.height);
        int cx = (int)uniform_below(kiln_rng_u32_at(&r, WORD_CUT_X), info.width);
        int lo = o->cutout / 2, hi = o->cutout - lo; /* square [c - lo, c + hi) */
        p.cy0 = cy - lo < 0 ? 0 : cy - lo;
        p.cy1 = cy + hi > info.height ? info.height : cy + hi;
        p.cx0 = cx - lo < 0 ? 0 : cx - lo;
        p.cx1 = cx + hi > info.width ? info.width : cx + hi;
    }
    return p;
}

static float read_raw(kiln_sample_info info, const void *src, size_t at) {
    return info.dtype == KILN_U8 ? (float)((const uint8_t *)src)[at] : ((const float *)src)[at];
}

void kiln_transform_apply(const kiln_transform_opts *o, kiln_sample_info info, const void *src, float *dst,
                          uint64_t seed, int64_t epoch, int64_t index) {
    const int C = info.channels, H = info.height, W = info.width, pad = o->crop_padding;
    transform_plan p = transform_plan_sample(o, info, seed, epoch, index);
    float scale = (info.dtype == KILN_U8 && o->scale_u8) ? 1.0f / 255.0f : 1.0f;
    for (int c = 0; c < C; c++) {
        /* (raw * scale - mean) / std as raw * mul + add: one fma per pixel. */
        float mul = scale, add = 0.0f;
        if (o->normalize) {
            mul = scale / o->std[c];
            add = -o->mean[c] / o->std[c];
        }
        size_t plane = (size_t)c * H * W;
        for (int y = 0; y < H; y++) {
            float *out = dst + plane + (size_t)y * W;
            int sy = pad > 0 ? transform_source_coord(y + p.oy, pad, H, o->pad_mode) : y;
            for (int x = 0; x < W; x++) {
                int xf = p.flip ? W - 1 - x : x;
                int sx = pad > 0 ? transform_source_coord(xf + p.ox, pad, W, o->pad_mode) : xf;
                float raw = (sy < 0 || sx < 0) ? 0.0f : read_raw(info, src, plane + (size_t)sy * W + sx);
                out[x] = raw * mul + add;
            }
            if (y >= p.cy0 && y < p.cy1)
                for (int x = p.cx0; x < p.cx1; x++) out[x] = 0.0f;
        }
    }
}

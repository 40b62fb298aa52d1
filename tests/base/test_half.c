/* f16/bf16 <-> f32 conversion against independent references.
 *
 * References: (1) an exact search in double over the sorted non-negative
 * bit patterns of the format (nearest value, ties to the even pattern,
 * overflow past max + half an ulp to infinity), written without any of the
 * library's bit tricks; (2) for f16, GCC's _Float16 where the compiler has
 * it. Every f16 pattern is checked exhaustively; f32 inputs are sampled:
 * every representable value, every halfway point and its neighbours, random
 * bit patterns and hand-picked boundaries. The bulk forms (F16C when the
 * CPU has it) must give the same bits as the scalar forms for all of it. */
#include <float.h>
#include <stdint.h>

#include "test_util.h"

static uint32_t bits_of(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

static float float_of(uint32_t b) {
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static uint32_t next_random(void) { /* xorshift64*: independent of the library's RNG */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}

/* ---- The exact reference, in double ------------------------------------ */

typedef struct format {
    int mantissa_bits; /* 10 for f16, 7 for bf16 */
    int bias;          /* 15, 127 */
    uint32_t inf;      /* 0x7C00, 0x7F80 */
} format;

static const format F16 = {10, 15, 0x7C00};
static const format BF16 = {7, 127, 0x7F80};

/* The value of a non-negative pattern up to and including `inf`, where inf
 * is taken as 2^(emax+1): the point past which rounding overflows. */
static double pattern_value(format f, uint32_t p) {
    uint32_t e = p >> f.mantissa_bits;
    uint32_t m = p & ((1u << f.mantissa_bits) - 1);
    if (e == 0) return ldexp((double)m, 1 - f.bias - f.mantissa_bits);
    return ldexp((double)((1u << f.mantissa_bits) + m), (int)e - f.bias - f.mantissa_bits);
}

/* Round a finite f32 to the format by searching the patterns. */
static uint16_t reference_round(format f, float x) {
    double ax = fabs((double)x);
    uint32_t sign = signbit(x) ? 0x8000u : 0;
    uint32_t lo = 0, hi = f.inf; /* invariant: value(lo) <= ax; find the largest such lo */
    if (ax >= pattern_value(f, f.inf)) return (uint16_t)(sign | f.inf);
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (pattern_value(f, mid) <= ax)
            lo = mid;
        else
            hi = mid;
    }
    double below = ax - pattern_value(f, lo), above = pattern_value(f, lo + 1) - ax;
    uint32_t p = lo;
    if (above < below || (above == below && (lo & 1))) p = lo + 1;
    return (uint16_t)(sign | p);
}

static int is_f16_nan(uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x3FF); }
static int is_bf16_nan(uint16_t h) { return (h & 0x7F80) == 0x7F80 && (h & 0x7F); }

/* ---- f16 -> f32, exhaustive ------------------------------------------------- */

static void test_f16_to_f32_exhaustive(void) {
    static uint16_t all[65536];
    static float bulk[65536];
    int bad_value = 0, bad_round_trip = 0, bad_nan = 0, bad_bulk = 0, bad_gcc = 0;
    for (uint32_t h = 0; h < 65536; h++) all[h] = (uint16_t)h;
    kiln_f16_to_f32_n(all, bulk, 65536);
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kiln_f16_to_f32((uint16_t)h);
        uint32_t fb = bits_of(f);
        if (is_f16_nan((uint16_t)h)) {
            /* Quiet, same sign, payload kept in the top mantissa bits. */
            uint32_t want = ((h & 0x8000u) << 16) | 0x7FC00000u | ((h & 0x3FFu) << 13);
            if (!isnan(f) || fb != want) bad_nan++;
            if (!is_f16_nan(kiln_f32_to_f16(f))) bad_nan++;
        } else {
            uint32_t e = (h >> 10) & 0x1F;
            double want = e == 0x1F ? INFINITY : pattern_value(F16, h & 0x7FFF);
            if (h & 0x8000) want = -want;
            if ((double)f != want || (signbit(f) != 0) != ((h & 0x8000) != 0)) bad_value++;
            if (kiln_f32_to_f16(f) != h) bad_round_trip++;
        }
        if (bits_of(bulk[h]) != fb) bad_bulk++;
#ifdef __FLT16_MAX__
        _Float16 g;
        memcpy(&g, &all[h], sizeof g);
        if (bits_of((float)g) != fb) bad_gcc++;
#endif
    }
    CHECK_EQ_I(bad_value, 0);
    CHECK_EQ_I(bad_round_trip, 0);
    CHECK_EQ_I(bad_nan, 0);
    CHECK_EQ_I(bad_bulk, 0);
    CHECK_EQ_I(bad_gcc, 0);

    /* Tails and unaligned starts of the bulk form (8-lane body + scalar tail). */
    for (size_t start = 0; start < 9; start++) {
        for (size_t n = 0; n < 21; n++) {
            float out[32];
            int bad = 0;
            kiln_f16_to_f32_n(all + 0x3BF0 + start, out, n);
            for (size_t i = 0; i < n; i++)
                bad += bits_of(out[i]) != bits_of(kiln_f16_to_f32(all[0x3BF0 + start + i]));
            CHECK_MSG(bad == 0, "bulk f16->f32 start %zu n %zu", start, n);
        }
    }
}

/* ---- f32 -> f16, sampled ----------------------------------------------------- */

typedef struct sample_set {
    float *values;
    size_t count, capacity;
} sample_set;

static void add(sample_set *s, uint32_t bits) {
    if (s->count == s->capacity) {
        s->capacity = s->capacity ? 2 * s->capacity : 4096;
        s->values = realloc(s->values, s->capacity * sizeof *s->values);
        if (!s->values) {
            fprintf(stderr, "out of host memory\n");
            abort();
        }
    }
    s->values[s->count++] = float_of(bits);
}

/* Both signs of every value, every halfway point between neighbours (exact
 * in f32) and the f32 values one ulp either side of it. */
static void add_format_boundaries(sample_set *s, format f) {
    for (uint32_t p = 0; p < f.inf; p++) {
        double mid = (pattern_value(f, p) + pattern_value(f, p + 1)) / 2;
        uint32_t v = bits_of((float)pattern_value(f, p)), m = bits_of((float)mid);
        for (int negative = 0; negative < 2; negative++) {
            uint32_t sign = negative ? 0x80000000u : 0;
            add(s, sign | v);
            add(s, sign | m);
            add(s, sign | (m + 1));
            if (m > 0) add(s, sign | (m - 1));
        }
    }
}

static void add_specials(sample_set *s) {
    static const uint32_t specials[] = {
        0x00000000, 0x80000000, 0x7F800000, 0xFF800000, /* zeros, infinities */
        0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, /* quiet and signalling NaNs */
        0x7FA00000, 0x7FFFFFFF, 0x7F802000, 0x7F801FFF, 0x7FBFFFFF,
        0xFFFFFFFF, 0x00000001, 0x80000001, 0x007FFFFF, 0x00800000, /* f32 subnormals, FLT_MIN */
        0x7F7FFFFF, 0xFF7FFFFF,                                     /* FLT_MAX */
        0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FF001,             /* 65504, just below/at/above 65520 */
        0x47800000, 0x4F000000,                                     /* 65536, 2^31 */
        0x33000000, 0x33000001, 0x32FFFFFF, 0x33800000,             /* 2^-25 (tie to 0), 2^-24 */
        0x33C00000, 0x34200000, 0x387FC000, 0x387FE000,             /* 1.5*2^-24, 2.5*2^-24, subnormal top */
        0x387FF000, 0x38800000, 0x38801000, 0x3F800000,             /* tie into 2^-14, 2^-14, 1 */
        0x3F801000, 0x3F803000, 0x3F800FFF, 0x3F801001,             /* ties to even at 1 */
        0x7F7F8000, 0x7F7F7FFF, 0x7F7F0000,                         /* near bf16's overflow */
    };
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) {
        add(s, specials[i]);
        add(s, specials[i] ^ 0x80000000u);
    }
    for (int i = 0; i < 1000000; i++) add(s, next_random());
    /* Random values concentrated in the f16 range, where most rounding
     * decisions are made. */
    for (int i = 0; i < 200000; i++) add(s, 0x30000000u + next_random() % 0x18000000u);
}

static void test_f32_to_f16_sampled(void) {
    sample_set s = {0};
    add_format_boundaries(&s, F16);
    add_specials(&s);
    uint16_t *bulk = malloc(s.count * sizeof *bulk);
    CHECK(bulk != NULL);
    if (!bulk) return;
    kiln_f32_to_f16_n(s.values, bulk, s.count);
    int bad_ref = 0, bad_nan = 0, bad_bulk = 0, bad_gcc = 0;
    for (size_t i = 0; i < s.count; i++) {
        float x = s.values[i];
        uint16_t h = kiln_f32_to_f16(x);
        if (isnan(x)) {
            uint32_t b = bits_of(x);
            uint16_t want = (uint16_t)(((b >> 16) & 0x8000u) | 0x7E00u | ((b >> 13) & 0x3FFu));
            if (!is_f16_nan(h) || h != want) bad_nan++;
        } else if (h != reference_round(F16, x)) {
            if (bad_ref++ < 5)
                fprintf(stderr, "f32 %08x -> f16 %04x, reference %04x\n", bits_of(x), h,
                        reference_round(F16, x));
        }
        if (bulk[i] != h) bad_bulk++;
#ifdef __FLT16_MAX__
        _Float16 g = (_Float16)x;
        uint16_t gb;
        memcpy(&gb, &g, sizeof gb);
        if (gb != h) bad_gcc++;
#endif
    }
    printf("f32->f16: %zu samples\n", s.count);
    CHECK_EQ_I(bad_ref, 0);
    CHECK_EQ_I(bad_nan, 0);
    CHECK_EQ_I(bad_bulk, 0);
    CHECK_EQ_I(bad_gcc, 0);

    for (size_t start = 0; start < 9; start++) {
        for (size_t n = 0; n < 21; n++) {
            uint16_t out[32];
            int bad = 0;
            kiln_f32_to_f16_n(s.values + start, out, n);
            for (size_t i = 0; i < n; i++) bad += out[i] != kiln_f32_to_f16(s.values[start + i]);
            CHECK_MSG(bad == 0, "bulk f32->f16 start %zu n %zu", start, n);
        }
    }
    free(bulk);
    free(s.values);
}

/* ---- bfloat16 ------------------------------------------------------------------ */

static void test_bf16(void) {
    /* bf16 -> f32: all patterns, exact. */
    static uint16_t all[65536];
    static float widened[65536];
    int bad_widen = 0, bad_round_trip = 0, bad_bulk = 0;
    for (uint32_t p = 0; p < 65536; p++) all[p] = (uint16_t)p;
    kiln_bf16_to_f32_n(all, widened, 65536);
    for (uint32_t p = 0; p < 65536; p++) {
        float f = kiln_bf16_to_f32((uint16_t)p);
        if (bits_of(widened[p]) != bits_of(f)) bad_bulk++;
        if (is_bf16_nan((uint16_t)p)) {
            if (!isnan(f) || !is_bf16_nan(kiln_f32_to_bf16(f))) bad_widen++;
            continue;
        }
        double want = (p & 0x7FFF) == 0x7F80 ? INFINITY : pattern_value(BF16, p & 0x7FFF);
        if (p & 0x8000) want = -want;
        if ((double)f != want || (signbit(f) != 0) != ((p & 0x8000) != 0)) bad_widen++;
        if (kiln_f32_to_bf16(f) != p) bad_round_trip++;
    }
    CHECK_EQ_I(bad_widen, 0);
    CHECK_EQ_I(bad_round_trip, 0);
    CHECK_EQ_I(bad_bulk, 0);

    /* f32 -> bf16: every halfway point (ties), neighbours, random patterns. */
    sample_set s = {0};
    add_format_boundaries(&s, BF16);
    add_specials(&s);
    uint16_t *bulk = malloc(s.count * sizeof *bulk);
    CHECK(bulk != NULL);
    if (!bulk) return;
    kiln_f32_to_bf16_n(s.values, bulk, s.count);
    int bad_ref = 0, bad_nan = 0;
    bad_bulk = 0;
    for (size_t i = 0; i < s.count; i++) {
        float x = s.values[i];
        uint16_t h = kiln_f32_to_bf16(x);
        if (isnan(x)) {
            /* Quiet NaN of the same sign; never rounded into infinity. */
            uint32_t b = bits_of(x);
            if (!is_bf16_nan(h) || !(h & 0x40) || (h & 0x8000) != ((b >> 16) & 0x8000)) bad_nan++;
        } else if (h != reference_round(BF16, x)) {
            if (bad_ref++ < 5)
                fprintf(stderr, "f32 %08x -> bf16 %04x, reference %04x\n", bits_of(x), h,
                        reference_round(BF16, x));
        }
        if (bulk[i] != h) bad_bulk++;
    }
    printf("f32->bf16: %zu samples\n", s.count);
    CHECK_EQ_I(bad_ref, 0);
    CHECK_EQ_I(bad_nan, 0);
    CHECK_EQ_I(bad_bulk, 0);
    free(bulk);
    free(s.values);
}

/* ---- Named values a reader can check by eye ------------------------------- */

static void test_named_values(void) {
    CHECK_EQ_I(kiln_f32_to_f16(1.0f), 0x3C00);
    CHECK_EQ_I(kiln_f32_to_f16(-2.0f), 0xC000);
    CHECK_EQ_I(kiln_f32_to_f16(65504.0f), 0x7BFF);
    CHECK_EQ_I(kiln_f32_to_f16(65519.0f), 0x7BFF);
    CHECK_EQ_I(kiln_f32_to_f16(65520.0f), 0x7C00); /* halfway to 2^16: ties to even = inf */
    CHECK_EQ_I(kiln_f32_to_f16(1e10f), 0x7C00);
    CHECK_EQ_I(kiln_f32_to_f16(-INFINITY), 0xFC00);
    CHECK_EQ_I(kiln_f32_to_f16(5.9604644775390625e-8f), 0x0001);  /* 2^-24 */
    CHECK_EQ_I(kiln_f32_to_f16(2.98023223876953125e-8f), 0x0000); /* 2^-25: tie to even 0 */
    CHECK_EQ_I(kiln_f32_to_f16(-0.0f), 0x8000);
    CHECK(is_f16_nan(kiln_f32_to_f16(NAN)));
    CHECK(kiln_f16_to_f32(0x3555) == 0.333251953125f);
    CHECK(kiln_f16_to_f32(0x0001) == 5.9604644775390625e-8f);
    CHECK(isinf(kiln_f16_to_f32(0x7C00)));

    CHECK_EQ_I(kiln_f32_to_bf16(1.0f), 0x3F80);
    CHECK_EQ_I(kiln_f32_to_bf16(float_of(0x3F808000)), 0x3F80); /* tie, even stays */
    CHECK_EQ_I(kiln_f32_to_bf16(float_of(0x3F818000)), 0x3F82); /* tie, odd rounds up */
    CHECK_EQ_I(kiln_f32_to_bf16(FLT_MAX), 0x7F80);              /* rounds past max: inf */
    CHECK_EQ_I(kiln_f32_to_bf16(float_of(0x7F800001)), 0x7FC0); /* low-payload sNaN: qNaN */
    CHECK_EQ_I(kiln_f32_to_bf16(float_of(0xFF80FFFF)), 0xFFC0);
    CHECK(kiln_bf16_to_f32(0x4049) == 3.140625f);
}

/* The kernel's view of the CPU, independent of CPUID as the library reads it. */
static bool cpuinfo_has_flag(const char *flag) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return false;
    char line[8192];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5) != 0) continue;
        char *save = NULL;
        for (char *tok = strtok_r(strchr(line, ':') + 1, " \n", &save); tok; tok = strtok_r(NULL, " \n", &save))
            if (strcmp(tok, flag) == 0) found = true;
        break;
    }
    fclose(f);
    return found;
}

static void test_cpu_feature(void) {
#if defined(__x86_64__)
    CHECK(kiln_cpu_has_f16c() == (cpuinfo_has_flag("f16c") && cpuinfo_has_flag("avx")));
#endif
    printf("bulk f16 conversion: %s\n", kiln_cpu_has_f16c() ? "F16C" : "scalar");
}

int main(void) {
    test_cpu_feature();
    test_named_values();
    test_f16_to_f32_exhaustive();
    test_f32_to_f16_sampled();
    test_bf16();
    return kt_finish();
}

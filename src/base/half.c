/* IEEE binary16 and bfloat16 <-> f32 conversion.
 *
 * The scalar forms are integer arithmetic on the bit patterns, so they do
 * not depend on the FPU's rounding mode or on DAZ/FTZ. The bulk f16 forms
 * use F16C when the CPU has it and fall back to the scalar forms; both give
 * the same bits for every input, NaNs included: the scalar forms copy what
 * F16C does with a NaN (set the quiet bit, keep the payload's top bits), and
 * tests/base/test_half.c checks all 65 536 f16 patterns against F16C. */
#include <string.h>

#include "kiln/base.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define KILN_HALF_X86 1
#else
#define KILN_HALF_X86 0
#endif

static uint32_t f32_bits(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

static float f32_from_bits(uint32_t bits) {
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* ---- binary16 ------------------------------------------------------------ */

/* |x| below 2^-14 (a binary16 subnormal or zero): the 24-bit significand
 * shifted into units of 2^-24, rounded to nearest even by hand. `e` is the
 * f32 biased exponent (at most 112). A carry out of the top mantissa bit
 * lands on 0x400, the smallest normal, which is the right answer. */
static uint16_t f16_subnormal(uint32_t abs_bits) {
    uint32_t e = abs_bits >> 23;
    if (e < 102) return 0; /* below 2^-25: rounds to zero */
    uint32_t significand = (abs_bits & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126 - e; /* 14 .. 24 */
    uint32_t result = significand >> shift;
    uint32_t rest = significand & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (result & 1))) result++;
    return (uint16_t)result;
}

uint16_t kiln_f32_to_f16(float value) {
    uint32_t bits = f32_bits(value);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    uint32_t abs_bits = bits & 0x7FFFFFFFu;
    if (abs_bits > 0x7F800000u) /* NaN: quiet it, keep the payload's top 9 bits (as F16C) */
        return (uint16_t)(sign | 0x7E00u | ((abs_bits >> 13) & 0x3FFu));
    if (abs_bits >= 0x477FF000u) /* >= 65520, halfway past 65504: infinity (inf included) */
        return (uint16_t)(sign | 0x7C00u);
    if (abs_bits < 0x38800000u) /* below 2^-14 */
        return (uint16_t)(sign | f16_subnormal(abs_bits));
    /* Normal: rebias the exponent by 127 - 15 and round the 13 dropped bits
     * to nearest even: adding 0xFFF plus the kept LSB carries exactly when
     * the dropped part is above half, or half with an odd kept part. The
     * carry may ripple into the exponent, which is the correct rounding. */
    uint32_t odd = (abs_bits >> 13) & 1u;
    abs_bits = abs_bits - 0x38000000u + 0xFFFu + odd;
    return (uint16_t)(sign | (abs_bits >> 13));
}

float kiln_f16_to_f32(uint16_t half) {
    uint32_t sign = (uint32_t)(half & 0x8000u) << 16;
    uint32_t exponent = (half >> 10) & 0x1Fu;
    uint32_t mantissa = half & 0x3FFu;
    if (exponent == 0x1F) {
        if (mantissa == 0) return f32_from_bits(sign | 0x7F800000u);
        /* NaN: quieted, payload kept, as vcvtph2ps does. */
        return f32_from_bits(sign | 0x7FC00000u | (mantissa << 13));
    }
    if (exponent == 0) {
        if (mantissa == 0) return f32_from_bits(sign);
        /* Subnormal m * 2^-24: normalise so the leading 1 becomes implicit. */
        int lead = 31 - __builtin_clz(mantissa); /* 0 .. 9 */
        uint32_t f32_exponent = (uint32_t)(lead + 103);
        uint32_t f32_mantissa = (mantissa << (23 - lead)) & 0x7FFFFFu;
        return f32_from_bits(sign | (f32_exponent << 23) | f32_mantissa);
    }
    return f32_from_bits(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

/* ---- bfloat16 ------------------------------------------------------------ */

uint16_t kiln_f32_to_bf16(float value) {
    uint32_t bits = f32_bits(value);
    /* A NaN must not round: a payload in the low 16 bits only would round
     * into infinity or the next NaN. Keep the top bits and make it quiet. */
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((bits >> 16) | 0x0040u);
    /* Round to nearest even on the 16 dropped bits; a carry out of the
     * largest finite value gives infinity, as it should. */
    bits += 0x7FFFu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

float kiln_bf16_to_f32(uint16_t bits) { return f32_from_bits((uint32_t)bits << 16); }

/* ---- Bulk forms ------------------------------------------------------------ */

#if KILN_HALF_X86
/* vcvtps2ph with an explicit round-to-nearest-even immediate, so MXCSR's
 * rounding mode does not matter. 8 lanes per instruction; the tail goes to
 * the scalar form, which gives the same bits. */
__attribute__((target("avx,f16c"))) static void f32_to_f16_f16c(const float *src, uint16_t *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(void *)(dst + i), h);
    }
    for (; i < n; i++) dst[i] = kiln_f32_to_f16(src[i]);
}

__attribute__((target("avx,f16c"))) static void f16_to_f32_f16c(const uint16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(src + i));
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
    for (; i < n; i++) dst[i] = kiln_f16_to_f32(src[i]);
}
#endif

/* Read CPUID directly (clang 14 has no __builtin_cpu_supports("f16c")):
 * F16C is leaf 1 ECX bit 29; the 256-bit forms above also need AVX (ECX bit
 * 28) and an OS that saves YMM state (OSXSAVE, ECX bit 27, and XCR0 bits 1
 * and 2). Cached: CPUID is slow under virtualisation. */
static int f16c_state = -1;

static bool detect_f16c(void) {
#if KILN_HALF_X86
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
    const unsigned need = (1u << 27) | (1u << 28) | (1u << 29);
    if ((ecx & need) != need) return false;
    unsigned xcr0_lo, xcr0_hi;
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    (void)xcr0_hi;
    return (xcr0_lo & 6u) == 6u;
#else
    return false;
#endif
}

bool kiln_cpu_has_f16c(void) {
    int s = __atomic_load_n(&f16c_state, __ATOMIC_RELAXED);
    if (s < 0) {
        s = detect_f16c() ? 1 : 0;
        __atomic_store_n(&f16c_state, s, __ATOMIC_RELAXED);
    }
    return s == 1;
}

void kiln_f32_to_f16_n(const float *src, uint16_t *dst, size_t n) {
#if KILN_HALF_X86
    if (kiln_cpu_has_f16c()) {
        f32_to_f16_f16c(src, dst, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) dst[i] = kiln_f32_to_f16(src[i]);
}

void kiln_f16_to_f32_n(const uint16_t *src, float *dst, size_t n) {
#if KILN_HALF_X86
    if (kiln_cpu_has_f16c()) {
        f16_to_f32_f16c(src, dst, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) dst[i] = kiln_f16_to_f32(src[i]);
}

/* bfloat16 needs no special instructions: the scalar forms are a few
 * integer operations without data-dependent branches except the NaN test,
 * which the compiler turns into a select. (AVX512-BF16's vcvtneps2bf16 is
 * not used: it flushes subnormals to zero, so it would not match.) */
/* kiln_f32_to_bf16's arithmetic with a select for NaN instead of a
 * branch, so the loop vectorises (autocast casts every weight and input
 * each step: fc1's 1M weights took 3-4 ms a forward one at a time), for
 * the widest vectors the CPU has; the same bits. */
#if KILN_HALF_X86 && (defined(__GNUC__) || defined(__clang__)) && !defined(__SANITIZE_THREAD__)
#if defined(__has_feature)
#if !__has_feature(thread_sanitizer)
#define KILN_HALF_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#else
#define KILN_HALF_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef KILN_HALF_CLONES
#define KILN_HALF_CLONES
#endif

/* The clones are static: clang 14 resolves target_clones of an external
 * function only within its own object (a static library's users saw no
 * definition). */
KILN_HALF_CLONES static void f32_to_bf16_run(const float *src, uint16_t *dst, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &src[i], sizeof bits);
        uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16, quiet = (bits >> 16) | 0x0040u;
        dst[i] = (uint16_t)((bits & 0x7FFFFFFFu) > 0x7F800000u ? quiet : rounded);
    }
}

KILN_HALF_CLONES static void bf16_to_f32_run(const uint16_t *src, float *dst, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)src[i] << 16;
        memcpy(&dst[i], &bits, sizeof bits);
    }
}

void kiln_f32_to_bf16_n(const float *src, uint16_t *dst, size_t n) { f32_to_bf16_run(src, dst, n); }
void kiln_bf16_to_f32_n(const uint16_t *src, float *dst, size_t n) { bf16_to_f32_run(src, dst, n); }

/* Kiln CUDA emulator: __half and its conversions, with CUDA's semantics
 * (round to nearest even; float -> half NaN gives 0x7FFF, overflow gives
 * infinity). Arithmetic goes through float, as the hardware's f16 ops
 * round the exact result once, which float holds exactly for + - * of two
 * halves. C++ only. */
#ifndef KILN_EMU_CUDA_FP16_H
#define KILN_EMU_CUDA_FP16_H
#ifdef __cplusplus

#include <stdint.h>
#include <string.h>

namespace kiln_emu_detail {
inline uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
inline float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* float -> binary16, round to nearest even. */
inline unsigned short float_to_half_rn(float f) {
    uint32_t x = f2u(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u) return 0x7FFFu; /* NaN: CUDA's canonical half NaN */
    if (ax >= 0x47800000u) {             /* >= 65536 (after rounding always inf) */
        return (unsigned short)(sign | 0x7C00u);
    }
    if (ax >= 0x38800000u) { /* normal half range (>= 2^-14) */
        uint32_t mant = ax & 0x7FFFFFu;
        uint32_t exp = (ax >> 23) - 127 + 15;
        uint32_t h = (exp << 10) | (mant >> 13);
        uint32_t rest = mant & 0x1FFFu;
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++; /* may carry into inf: correct */
        return (unsigned short)(sign | h);
    }
    if (ax < 0x33000000u) return (unsigned short)sign; /* < 2^-25: rounds to zero */
    /* Subnormal half: value = m * 2^-24. */
    uint32_t exp = ax >> 23;
    uint32_t mant = (ax & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126 - exp; /* 14 + (113 - exp) - 1 ... */
    /* ax = mant * 2^(exp-150); want mant * 2^(exp-150+24) = mant >> (126 - exp) */
    uint32_t h = mant >> shift;
    uint32_t rest = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (h & 1u))) h++;
    return (unsigned short)(sign | h);
}
inline float half_to_float(unsigned short h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t mant = h & 0x3FFu;
    if (exp == 0x1F) return u2f(sign | 0x7F800000u | (mant << 13));
    if (exp == 0) {
        if (mant == 0) return u2f(sign);
        float v = (float)mant * 5.9604644775390625e-8f; /* 2^-24, exact */
        return sign ? -v : v;
    }
    return u2f(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}
} // namespace kiln_emu_detail

struct __half_raw {
    unsigned short x;
};

struct __half {
    unsigned short __x;
    __half() = default;
    __half(const __half_raw &r) : __x(r.x) {}
    __half(float f) : __x(kiln_emu_detail::float_to_half_rn(f)) {}
    __half(double d) : __x(kiln_emu_detail::float_to_half_rn((float)d)) {}
    __half(int i) : __x(kiln_emu_detail::float_to_half_rn((float)i)) {}
    operator float() const { return kiln_emu_detail::half_to_float(__x); }
    operator __half_raw() const { return __half_raw{__x}; }
    __half &operator=(float f) {
        __x = kiln_emu_detail::float_to_half_rn(f);
        return *this;
    }
    __half &operator+=(const __half &o) { return *this = (float)*this + (float)o; }
    __half &operator-=(const __half &o) { return *this = (float)*this - (float)o; }
    __half &operator*=(const __half &o) { return *this = (float)*this * (float)o; }
    __half &operator/=(const __half &o) { return *this = (float)*this / (float)o; }
};

struct __half2 {
    __half x, y;
};

inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline float __half2float(__half h) { return (float)h; }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline short __half_as_short(__half h) { return (short)h.__x; }
inline __half __ushort_as_half(unsigned short u) { return __half(__half_raw{u}); }
inline __half __short_as_half(short s) { return __half(__half_raw{(unsigned short)s}); }
inline __half2 __float2half2_rn(float f) { return __half2{__half(f), __half(f)}; }
inline __half2 __floats2half2_rn(float a, float b) { return __half2{__half(a), __half(b)}; }
inline __half2 __halves2half2(__half a, __half b) { return __half2{a, b}; }
inline float __low2float(__half2 h) { return (float)h.x; }
inline float __high2float(__half2 h) { return (float)h.y; }
inline __half __low2half(__half2 h) { return h.x; }
inline __half __high2half(__half2 h) { return h.y; }
inline __half __hadd(__half a, __half b) { return __half((float)a + (float)b); }
inline __half __hsub(__half a, __half b) { return __half((float)a - (float)b); }
inline __half __hmul(__half a, __half b) { return __half((float)a * (float)b); }
inline __half __hdiv(__half a, __half b) { return __half((float)a / (float)b); }
inline __half __hneg(__half a) { return __ushort_as_half((unsigned short)(a.__x ^ 0x8000u)); }
inline __half __habs(__half a) { return __ushort_as_half((unsigned short)(a.__x & 0x7FFFu)); }
inline __half __hfma(__half a, __half b, __half c) {
    return __half((float)((double)(float)a * (double)(float)b + (double)(float)c));
}
inline bool __hisnan(__half a) { return (a.__x & 0x7FFFu) > 0x7C00u; }
inline bool __hisinf(__half a) { return (a.__x & 0x7FFFu) == 0x7C00u; }
inline bool __heq(__half a, __half b) { return (float)a == (float)b; }
inline bool __hne(__half a, __half b) { return (float)a != (float)b; }
inline bool __hlt(__half a, __half b) { return (float)a < (float)b; }
inline bool __hle(__half a, __half b) { return (float)a <= (float)b; }
inline bool __hgt(__half a, __half b) { return (float)a > (float)b; }
inline bool __hge(__half a, __half b) { return (float)a >= (float)b; }
inline __half __hmax(__half a, __half b) { return (float)a >= (float)b || __hisnan(b) ? a : b; }
inline __half __hmin(__half a, __half b) { return (float)a <= (float)b || __hisnan(b) ? a : b; }

#endif /* __cplusplus */
#endif

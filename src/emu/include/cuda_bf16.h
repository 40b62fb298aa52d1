/* Kiln CUDA emulator: __nv_bfloat16 and its conversions, with CUDA's
 * semantics (round to nearest even; NaN -> 0x7FFF). C++ only. */
#ifndef KILN_EMU_CUDA_BF16_H
#define KILN_EMU_CUDA_BF16_H
#ifdef __cplusplus

#include "cuda_fp16.h"

namespace kiln_emu_detail {
inline unsigned short float_to_bf16_rn(float f) {
    uint32_t u = f2u(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFFu;
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
inline float bf16_to_float(unsigned short b) { return u2f((uint32_t)b << 16); }
} // namespace kiln_emu_detail

struct __nv_bfloat16_raw {
    unsigned short x;
};

struct __nv_bfloat16 {
    unsigned short __x;
    __nv_bfloat16() = default;
    __nv_bfloat16(const __nv_bfloat16_raw &r) : __x(r.x) {}
    __nv_bfloat16(float f) : __x(kiln_emu_detail::float_to_bf16_rn(f)) {}
    __nv_bfloat16(double d) : __x(kiln_emu_detail::float_to_bf16_rn((float)d)) {}
    __nv_bfloat16(int i) : __x(kiln_emu_detail::float_to_bf16_rn((float)i)) {}
    operator float() const { return kiln_emu_detail::bf16_to_float(__x); }
    operator __nv_bfloat16_raw() const { return __nv_bfloat16_raw{__x}; }
    __nv_bfloat16 &operator=(float f) {
        __x = kiln_emu_detail::float_to_bf16_rn(f);
        return *this;
    }
    __nv_bfloat16 &operator+=(const __nv_bfloat16 &o) { return *this = (float)*this + (float)o; }
    __nv_bfloat16 &operator-=(const __nv_bfloat16 &o) { return *this = (float)*this - (float)o; }
    __nv_bfloat16 &operator*=(const __nv_bfloat16 &o) { return *this = (float)*this * (float)o; }
    __nv_bfloat16 &operator/=(const __nv_bfloat16 &o) { return *this = (float)*this / (float)o; }
};

struct __nv_bfloat162 {
    __nv_bfloat16 x, y;
};

inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rz(float f) {
    return __nv_bfloat16(__nv_bfloat16_raw{(unsigned short)(kiln_emu_detail::f2u(f) >> 16)});
}
inline float __bfloat162float(__nv_bfloat16 b) { return (float)b; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline short __bfloat16_as_short(__nv_bfloat16 b) { return (short)b.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16(__nv_bfloat16_raw{u}); }
inline __nv_bfloat16 __short_as_bfloat16(short s) {
    return __nv_bfloat16(__nv_bfloat16_raw{(unsigned short)s});
}
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
    return __nv_bfloat162{__nv_bfloat16(a), __nv_bfloat16(b)};
}
inline float __low2float(__nv_bfloat162 h) { return (float)h.x; }
inline float __high2float(__nv_bfloat162 h) { return (float)h.y; }
inline bool __hisnan(__nv_bfloat16 a) { return (a.__x & 0x7FFFu) > 0x7F80u; }
inline bool __hisinf(__nv_bfloat16 a) { return (a.__x & 0x7FFFu) == 0x7F80u; }
inline __nv_bfloat16 __hadd(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat16((float)a + (float)b); }
inline __nv_bfloat16 __hsub(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat16((float)a - (float)b); }
inline __nv_bfloat16 __hmul(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat16((float)a * (float)b); }
inline __nv_bfloat16 __hdiv(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat16((float)a / (float)b); }
inline __nv_bfloat16 __hneg(__nv_bfloat16 a) {
    return __ushort_as_bfloat16((unsigned short)(a.__x ^ 0x8000u));
}

#endif /* __cplusplus */
#endif

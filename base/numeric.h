/* Scalar number formats: IEEE half and bfloat16 conversions, element loads by dtype.
 * Header-only, shared by the interpreter, the CPU reference and the tools. */
#ifndef KPT_BASE_NUMERIC_H
#define KPT_BASE_NUMERIC_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <kpt/tensor.h>

static inline float kpt_f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static inline uint32_t kpt_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static inline float kpt_bf16_to_f32(uint16_t h)
{
    return kpt_f32_from_bits((uint32_t)h << 16);
}

/* Round to nearest even; NaN stays NaN (quiet). */
static inline uint16_t kpt_f32_to_bf16(float f)
{
    uint32_t u = kpt_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static inline float kpt_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    int exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0x1f)
        return kpt_f32_from_bits(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        float v = ldexpf((float)man, -24); /* subnormal or zero */
        return sign ? -v : v;
    }
    return kpt_f32_from_bits(sign | (uint32_t)(exp - 15 + 127) << 23 | man << 13);
}

/* Round to nearest even, overflow to infinity, NaN stays NaN. */
static inline uint16_t kpt_f32_to_f16(float f)
{
    uint32_t u = kpt_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return sign | 0x7e00;
    if (a >= 0x477ff000u) /* rounds to >= 65520: infinity */
        return sign | 0x7c00;
    if (a < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        float v = kpt_f32_from_bits(a);
        /* scaling by 2^24 puts the half subnormal unit at 1; rintf rounds to nearest even */
        return sign | (uint16_t)rintf(v * 16777216.0f);
    }
    uint32_t exp = (a >> 23) - 127 + 15;
    uint32_t man = a & 0x7fffffu;
    uint32_t h = exp << 10 | man >> 13;
    uint32_t rest = man & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1)))
        h++; /* may carry into the exponent, which is correct */
    return sign | (uint16_t)h;
}

/* Reads element `i` (an element offset) of a buffer of the given dtype as a double. */
static inline double kpt_load_as_double(const void *data, kpt_dtype dtype, int64_t i)
{
    switch (dtype) {
    case KPT_DTYPE_F16: return kpt_f16_to_f32(((const uint16_t *)data)[i]);
    case KPT_DTYPE_BF16: return kpt_bf16_to_f32(((const uint16_t *)data)[i]);
    case KPT_DTYPE_F32: return ((const float *)data)[i];
    case KPT_DTYPE_F64: return ((const double *)data)[i];
    case KPT_DTYPE_I32: return ((const int32_t *)data)[i];
    case KPT_DTYPE_BOOL: return ((const uint8_t *)data)[i] != 0;
    default: return 0;
    }
}

/* Writes a double to element `i` of a float buffer, rounding to the dtype. */
static inline void kpt_store_double(void *data, kpt_dtype dtype, int64_t i, double v)
{
    switch (dtype) {
    case KPT_DTYPE_F16: ((uint16_t *)data)[i] = kpt_f32_to_f16((float)v); break;
    case KPT_DTYPE_BF16: ((uint16_t *)data)[i] = kpt_f32_to_bf16((float)v); break;
    case KPT_DTYPE_F32: ((float *)data)[i] = (float)v; break;
    case KPT_DTYPE_F64: ((double *)data)[i] = v; break;
    case KPT_DTYPE_I32: ((int32_t *)data)[i] = (int32_t)v; break;
    case KPT_DTYPE_BOOL: ((uint8_t *)data)[i] = v != 0; break;
    default: break;
    }
}

#endif

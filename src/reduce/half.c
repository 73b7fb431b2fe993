/* half.c - scalar float16 and bfloat16 conversions: the reference the vector code in reduce.c matches bit for bit.
 *
 * float16 (IEEE binary16): 1 sign, 5 exponent (bias 15), 10 mantissa bits.
 * bfloat16: the upper half of a float32 (1 sign, 8 exponent, 7 mantissa bits).
 *
 * Both directions use integer arithmetic only, so the result does not depend on the
 * floating-point environment (rounding mode, flush-to-zero, denormals-are-zero). The
 * rules follow what x86's F16C instructions do, so that the scalar tail of a buffer and
 * its vector body agree on every bit:
 *   - float16 -> float32 is exact; a NaN keeps its sign and payload and becomes quiet.
 *   - float32 -> float16 rounds to nearest, ties to even; magnitudes from 65520 up become
 *     infinity; results below 2^-14 become subnormals (or zero); a NaN keeps its sign and
 *     the top 10 bits of its payload and becomes quiet.
 *   - bfloat16 -> float32 is a shift (a signaling NaN stays signaling, as with any copy).
 *   - float32 -> bfloat16 rounds to nearest even, overflowing to infinity; a NaN keeps
 *     its sign and the top 7 bits of its payload and becomes quiet, so it cannot turn
 *     into an infinity by truncation. */
#include "reduce.h"

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

float kolo__f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu; /* exponent and mantissa */
    if (em >= 0x7c00u) {       /* infinity, or NaN made quiet */
        uint32_t quiet = em > 0x7c00u ? 0x00400000u : 0;
        return f32_from_bits(sign | 0x7f800000u | quiet | ((em & 0x3ffu) << 13));
    }
    if (em >= 0x0400u) /* normal: rebias the exponent from 15 to 127 */
        return f32_from_bits(sign | ((em << 13) + (112u << 23)));
    if (em == 0) return f32_from_bits(sign);
    /* subnormal: em * 2^-24, normalized so that the leading 1 lands on bit 10 */
    uint32_t e = 113; /* float32 exponent of 2^-14 */
    while (!(em & 0x0400u)) {
        em <<= 1;
        e--;
    }
    return f32_from_bits(sign | (e << 23) | ((em & 0x3ffu) << 13));
}

uint16_t kolo__f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* 65520 and up round to infinity (as does infinity) */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* normal in float16: rebias, then round away 13 bits */
        uint32_t b = a - (112u << 23);
        return (uint16_t)(sign | ((b + 0x0fffu + ((b >> 13) & 1u)) >> 13));
    }
    uint32_t e = a >> 23;
    if (e < 102) /* below 2^-25: rounds to zero (float32 subnormals included) */
        return (uint16_t)sign;
    /* subnormal in float16: count units of 2^-24, rounding the rest to even */
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e; /* 14 .. 24 */
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}

float kolo__bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

uint16_t kolo__f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

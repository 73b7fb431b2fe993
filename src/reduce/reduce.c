/* reduce.c - the element kernels under every collective: combine, scale and convert buffers, vectorized per CPU.
 *
 * Every kernel is written once, as a macro over GCC/clang vector extensions, and built
 * three times:
 *   generic    16-byte vectors: SSE2 on any x86-64, NEON/ASIMD on arm64, whatever the
 *              target has elsewhere
 *   avx2+f16c  32-byte vectors; float16 converted by F16C (vcvtph2ps / vcvtps2ph)
 *   avx512     64-byte vectors (AVX-512 F+BW+DQ+VL); float16 by the zmm forms
 * and two more tables: avx512+fp16, which is avx512's with float16 sums and products done in
 * float16 itself (AVX512-FP16), and avx512+f16c, avx512's with avx2+f16c's float16 kernels
 * (for AMD Zen 4; both below). The x86 builds carry __attribute__((target)), so
 * the library is compiled for baseline x86-64 and runs anywhere; the first call asks the CPU
 * what it has (which also checks that the OS saves the wide registers) and keeps a pointer to
 * the best table of kernels.
 *
 * Why vector extensions rather than plain loops left to the auto-vectorizer: at -O2 (the
 * build's level) GCC 12 only vectorizes loops whose trip count it knows, so a plain loop
 * over `count` stays scalar. Vector types make the width explicit at every optimization
 * level, and the bodies read like the scalar loops they replace.
 *
 * Each main loop iteration loads two vectors from each input, combines them and stores
 * two, through may_alias unaligned vector types. No pointer is `restrict`: dst may be
 * exactly a or b (allreduce accumulates in place), and since every iteration reads its
 * inputs before it writes those same bytes, that aliasing is correct as written. The
 * last count % lanes elements go through a scalar loop, except for float16/bfloat16,
 * whose tail is padded into a stack buffer and goes through the same vector code.
 *
 * Results are bit-identical across the builds: every operation is elementwise,
 * in the same operand order, with no reassociation and no contraction into FMA; the
 * float16 conversions of the generic build reproduce F16C exactly (in the default
 * rounding mode, which every float sum here assumes anyway), and bfloat16 rounding is
 * integer code everywhere. The one thing left open is which payload a sum or product of
 * two NaNs keeps; it is a NaN either way.
 *
 * Floating MIN/MAX propagate NaN: if a[i] is NaN the result is a[i], else if b[i] is NaN
 * it is b[i]; when a[i] and b[i] compare equal (-0 and +0) the result is b[i]. */
#include "reduce.h"

#include <assert.h>
#include <stdatomic.h>

#if !defined(__GNUC__)
#error "kolo's reduce kernels need the vector extensions of GCC or clang"
#endif

#if defined(__x86_64__) || defined(__i386__)
#define KOLO_REDUCE_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

/* ---- Vector types ---------------------------------------------------------------
 * v<bytes>_<elem> is a vector of that many bytes; the _u form may sit at any address
 * and alias anything, and is the only one ever dereferenced. */
#define VEC_TYPE(W, N, T)                                                                           \
    typedef T v##W##_##N __attribute__((vector_size(W)));                                           \
    typedef T v##W##_##N##_u __attribute__((vector_size(W), aligned(1), may_alias));
#define VEC_TYPES(W)                                                                                \
    VEC_TYPE(W, u8, uint8_t)                                                                        \
    VEC_TYPE(W, i8, int8_t)                                                                         \
    VEC_TYPE(W, u16, uint16_t)                                                                      \
    VEC_TYPE(W, i16, int16_t)                                                                       \
    VEC_TYPE(W, u32, uint32_t)                                                                      \
    VEC_TYPE(W, i32, int32_t)                                                                       \
    VEC_TYPE(W, u64, uint64_t)                                                                      \
    VEC_TYPE(W, i64, int64_t)                                                                       \
    VEC_TYPE(W, f32, float)                                                                         \
    VEC_TYPE(W, f64, double)
VEC_TYPES(16)
VEC_TYPES(32)
VEC_TYPES(64)
VEC_TYPE(8, u16, uint16_t) /* four float16 lanes, widened to v16_f32 */

/* Function attributes of each build. */
#define ATTR_generic
#if defined(KOLO_REDUCE_X86)
#define ATTR_avx2 __attribute__((target("avx2,f16c")))
#define ATTR_avx512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))
#endif

/* ---- Scalar operations (the tails, and the definition of every op) ----------------
 * Signed SUM and PRODUCT run on the unsigned type of the same width: two's complement
 * wrap-around without C's signed-overflow undefined behaviour, and the same bits. */
static inline uint8_t s_sum_u8(uint8_t x, uint8_t y) { return (uint8_t)(x + y); }
static inline uint16_t s_sum_u16(uint16_t x, uint16_t y) { return (uint16_t)(x + y); }
static inline uint32_t s_sum_u32(uint32_t x, uint32_t y) { return x + y; }
static inline uint64_t s_sum_u64(uint64_t x, uint64_t y) { return x + y; }
static inline float s_sum_f32(float x, float y) { return x + y; }
static inline double s_sum_f64(double x, double y) { return x + y; }

static inline uint8_t s_prod_u8(uint8_t x, uint8_t y) { return (uint8_t)((uint32_t)x * y); }
static inline uint16_t s_prod_u16(uint16_t x, uint16_t y) { return (uint16_t)((uint32_t)x * y); }
static inline uint32_t s_prod_u32(uint32_t x, uint32_t y) { return x * y; }
static inline uint64_t s_prod_u64(uint64_t x, uint64_t y) { return x * y; }
static inline float s_prod_f32(float x, float y) { return x * y; }
static inline double s_prod_f64(double x, double y) { return x * y; }

#define S_MINMAX(N, T)                                                                              \
    static inline T s_min_##N(T x, T y) { return x < y ? x : y; }                                  \
    static inline T s_max_##N(T x, T y) { return x > y ? x : y; }
S_MINMAX(u8, uint8_t)
S_MINMAX(i8, int8_t)
S_MINMAX(u16, uint16_t)
S_MINMAX(i16, int16_t)
S_MINMAX(i32, int32_t)
S_MINMAX(i64, int64_t)
/* x != x: NaN in a wins, then NaN in b (x < y is false when either is NaN). */
static inline float s_min_f32(float x, float y) { return (x < y || x != x) ? x : y; }
static inline float s_max_f32(float x, float y) { return (x > y || x != x) ? x : y; }
static inline double s_min_f64(double x, double y) { return (x < y || x != x) ? x : y; }
static inline double s_max_f64(double x, double y) { return (x > y || x != x) ? x : y; }

static inline uint8_t s_or_b8(uint8_t x, uint8_t y) { return (uint8_t)((x | y) != 0); }
static inline uint8_t s_and_b8(uint8_t x, uint8_t y) { return (uint8_t)(x != 0 && y != 0); }

/* ---- Vector operations -----------------------------------------------------------
 * Written over x and y of type VT (VI: the signed integer vector of the same shape, for
 * float masks). A comparison yields an all-ones/all-zeros lane mask. */
#define ISEL(m, p, q) (((VT)(m) & (p)) | (~(VT)(m) & (q)))
#define FSEL(m, p, q) ((VT)(((VI)(m) & (VI)(p)) | (~(VI)(m) & (VI)(q))))
#define V_SUM (x + y)
#define V_PROD (x * y)
#define V_IMIN ISEL(x < y, x, y)
#define V_IMAX ISEL(x > y, x, y)
#define V_FMIN FSEL((x < y) | (x != x), x, y)
#define V_FMAX FSEL((x > y) | (x != x), x, y)
#define V_OR ((VT)((x | y) != 0) & 1)
#define V_AND ((VT)((x != 0) & (y != 0)) & 1)

/* dst[i] = a[i] OP b[i] on W-byte vectors of element N (type T; IN: the signed integer
 * element of the same width), two vectors per iteration, then one, then a scalar tail. */
#define BIN(ISA, W, NAME, T, N, IN, EXPR, SOP)                                                      \
    ATTR_##ISA static void NAME##_##ISA(void *dv, const void *av, const void *bv, size_t n)          \
    {                                                                                               \
        typedef v##W##_##N VT;                                                                      \
        typedef v##W##_##N##_u VTU;                                                                 \
        typedef v##W##_##IN VI;                                                                     \
        T *d = dv;                                                                                  \
        const T *a = av, *b = bv;                                                                   \
        const size_t lanes = W / sizeof(T);                                                         \
        size_t i = 0;                                                                               \
        for (; i + 2 * lanes <= n; i += 2 * lanes) {                                                \
            VT x = *(const VTU *)(a + i), y = *(const VTU *)(b + i);                                \
            VT r0 = (EXPR);                                                                         \
            x = *(const VTU *)(a + i + lanes);                                                      \
            y = *(const VTU *)(b + i + lanes);                                                      \
            *(VTU *)(d + i) = r0;                                                                   \
            *(VTU *)(d + i + lanes) = (EXPR);                                                       \
        }                                                                                           \
        if (i + lanes <= n) {                                                                       \
            VT x = *(const VTU *)(a + i), y = *(const VTU *)(b + i);                                \
            *(VTU *)(d + i) = (EXPR);                                                               \
            i += lanes;                                                                             \
        }                                                                                           \
        for (; i < n; i++) d[i] = SOP(a[i], b[i]);                                                  \
        (void)sizeof(VI);                                                                           \
    }

/* dst[i] = src[i] * factor in the type's own precision (T, vector VT). */
#define SCALE(ISA, W, NAME, T, N)                                                                   \
    ATTR_##ISA static void NAME##_##ISA(void *dv, const void *sv, size_t n, double factor)          \
    {                                                                                               \
        typedef v##W##_##N VT;                                                                      \
        typedef v##W##_##N##_u VTU;                                                                 \
        T *d = dv;                                                                                  \
        const T *s = sv;                                                                            \
        const T f = (T)factor;                                                                      \
        const size_t lanes = W / sizeof(T);                                                         \
        size_t i = 0;                                                                               \
        for (; i + lanes <= n; i += lanes) {                                                        \
            VT x = *(const VTU *)(s + i);                                                           \
            *(VTU *)(d + i) = x * f;                                                                \
        }                                                                                           \
        for (; i < n; i++) d[i] = s[i] * f;                                                         \
    }

/* dst[i] = (a[i] + b[i]) * factor in the type's own precision: the sum rounded to T, then the
 * product (no contraction: there is no fused add-multiply), the same bits as BIN's sum then SCALE. */
#define SUMSCALE(ISA, W, NAME, T, N)                                                                \
    ATTR_##ISA static void NAME##_##ISA(void *dv, const void *av, const void *bv, size_t n, double factor) \
    {                                                                                               \
        typedef v##W##_##N VT;                                                                      \
        typedef v##W##_##N##_u VTU;                                                                 \
        T *d = dv;                                                                                  \
        const T *a = av, *b = bv;                                                                   \
        const T f = (T)factor;                                                                      \
        const size_t lanes = W / sizeof(T);                                                         \
        size_t i = 0;                                                                               \
        for (; i + 2 * lanes <= n; i += 2 * lanes) {                                                \
            VT r0 = *(const VTU *)(a + i) + *(const VTU *)(b + i);                                  \
            VT r1 = *(const VTU *)(a + i + lanes) + *(const VTU *)(b + i + lanes);                  \
            *(VTU *)(d + i) = r0 * f;                                                               \
            *(VTU *)(d + i + lanes) = r1 * f;                                                       \
        }                                                                                           \
        for (; i + lanes <= n; i += lanes) {                                                        \
            VT r = *(const VTU *)(a + i) + *(const VTU *)(b + i);                                   \
            *(VTU *)(d + i) = r * f;                                                                \
        }                                                                                           \
        for (; i < n; i++) {                                                                        \
            T s = a[i] + b[i];                                                                      \
            d[i] = s * f;                                                                           \
        }                                                                                           \
    }

/* ---- float16 and bfloat16 ------------------------------------------------------------
 * LD2(p, &lo, &hi) widens 2 * lanes halves at p into two float32 vectors; ST2(p, lo, hi)
 * rounds two float32 vectors back into 2 * lanes halves at p. The kernels below run the
 * float32 operation between the two. Tails are padded to 2 * lanes on the stack. */
#define HBIN(ISA, W, NAME, LD2, ST2, EXPR)                                                          \
    ATTR_##ISA static void NAME##_##ISA(void *dv, const void *av, const void *bv, size_t n)          \
    {                                                                                               \
        typedef v##W##_f32 VT;                                                                      \
        typedef v##W##_i32 VI;                                                                      \
        uint16_t *d = dv;                                                                           \
        const uint16_t *a = av, *b = bv;                                                            \
        const size_t step = W / 2;                                                                  \
        size_t i = 0;                                                                               \
        VT a0, a1, b0, b1, x, y, r0;                                                                \
        for (; i + step <= n; i += step) {                                                          \
            LD2(a + i, &a0, &a1);                                                                   \
            LD2(b + i, &b0, &b1);                                                                   \
            x = a0, y = b0, r0 = (EXPR);                                                            \
            x = a1, y = b1;                                                                         \
            ST2(d + i, r0, (EXPR));                                                                 \
        }                                                                                           \
        if (i < n) {                                                                                \
            uint16_t ta[W / 2] = {0}, tb[W / 2] = {0};                                              \
            memcpy(ta, a + i, (n - i) * 2);                                                         \
            memcpy(tb, b + i, (n - i) * 2);                                                         \
            LD2(ta, &a0, &a1);                                                                      \
            LD2(tb, &b0, &b1);                                                                      \
            x = a0, y = b0, r0 = (EXPR);                                                            \
            x = a1, y = b1;                                                                         \
            ST2(ta, r0, (EXPR));                                                                    \
            memcpy(d + i, ta, (n - i) * 2);                                                         \
        }                                                                                           \
        (void)sizeof(VI);                                                                           \
    }

#define HSCALE(ISA, W, NAME, LD2, ST2)                                                              \
    ATTR_##ISA static void NAME##_##ISA(void *dv, const void *sv, size_t n, double factor)          \
    {                                                                                               \
        uint16_t *d = dv;                                                                           \
        const uint16_t *s = sv;                                                                     \
        const float f = (float)factor;                                                              \
        const size_t step = W / 2;                                                                  \
        size_t i = 0;                                                                               \
        v##W##_f32 lo, hi;                                                                          \
        for (; i + step <= n; i += step) {                                                          \
            LD2(s + i, &lo, &hi);                                                                   \
            ST2(d + i, lo * f, hi * f);                                                             \
        }                                                                                           \
        if (i < n) {                                                                                \
            uint16_t t[W / 2] = {0};                                                                \
            memcpy(t, s + i, (n - i) * 2);                                                          \
            LD2(t, &lo, &hi);                                                                       \
            ST2(t, lo * f, hi * f);                                                                 \
            memcpy(d + i, t, (n - i) * 2);                                                          \
        }                                                                                           \
    }

#define TO_F32(ISA, W, NAME, LD2)                                                                   \
    ATTR_##ISA static void NAME##_##ISA(float *d, const uint16_t *s, size_t n)                      \
    {                                                                                               \
        typedef v##W##_f32_u VTU;                                                                   \
        const size_t step = W / 2;                                                                  \
        size_t i = 0;                                                                               \
        v##W##_f32 lo, hi;                                                                          \
        for (; i + step <= n; i += step) {                                                          \
            LD2(s + i, &lo, &hi);                                                                   \
            *(VTU *)(d + i) = lo;                                                                   \
            *(VTU *)(d + i + step / 2) = hi;                                                        \
        }                                                                                           \
        if (i < n) {                                                                                \
            uint16_t t[W / 2] = {0};                                                                \
            float r[W / 2];                                                                         \
            memcpy(t, s + i, (n - i) * 2);                                                          \
            LD2(t, &lo, &hi);                                                                       \
            *(VTU *)r = lo;                                                                         \
            *(VTU *)(r + step / 2) = hi;                                                            \
            memcpy(d + i, r, (n - i) * 4);                                                          \
        }                                                                                           \
    }

#define FROM_F32(ISA, W, NAME, ST2)                                                                 \
    ATTR_##ISA static void NAME##_##ISA(uint16_t *d, const float *s, size_t n)                      \
    {                                                                                               \
        typedef v##W##_f32_u VTU;                                                                   \
        const size_t step = W / 2;                                                                  \
        size_t i = 0;                                                                               \
        for (; i + step <= n; i += step)                                                            \
            ST2(d + i, *(const VTU *)(s + i), *(const VTU *)(s + i + step / 2));                    \
        if (i < n) {                                                                                \
            float t[W / 2] = {0};                                                                   \
            uint16_t r[W / 2];                                                                      \
            memcpy(t, s + i, (n - i) * 4);                                                          \
            ST2(r, *(const VTU *)t, *(const VTU *)(t + step / 2));                                  \
            memcpy(d + i, r, (n - i) * 2);                                                          \
        }                                                                                           \
    }

/* ---- Conversions, generic build (four lanes per vector) --------------------------------
 * float16 -> float32 (exact in any floating-point environment): a normal or special
 * number gets its exponent and mantissa moved into place with the exponent rebiased by
 * 224 too many, then a multiply by 2^-112 corrects it; that multiply is exact and leaves
 * infinities infinite and makes NaNs quiet, as F16C does. A subnormal m * 2^-24 is
 * planted in the mantissa of 0.5 and 0.5 subtracted, exactly.
 * float32 -> float16 lets the float adder round: adding |f| * 4 to a power of two chosen
 * from f's exponent (at least 2) leaves exactly the kept bits of f, rounded to nearest
 * even, in the sum's mantissa; magnitudes at or above 65520 reach infinity through the
 * first multiply. This needs the default rounding mode, as does every float sum here.
 * (After Marat Dukhan's FP16 library.) NaNs keep the top 10 bits of their payload and
 * become quiet, as with F16C. */
static inline v16_f32 f16_widen(v16_u32 h)
{
    v16_u32 w = h << 16;
    v16_u32 two_w = w + w;
    v16_f32 normal = (v16_f32)((two_w >> 4) + (0xe0u << 23)) * 0x1p-112f;
    v16_f32 subnormal = (v16_f32)((two_w >> 17) | 0x3f000000u) - 0.5f;
    v16_u32 is_sub = (v16_u32)((v16_i32)(h & 0x7fffu) < 0x400);
    v16_u32 r = (is_sub & (v16_u32)subnormal) | (~is_sub & (v16_u32)normal);
    return (v16_f32)((w & 0x80000000u) | r);
}

static inline v16_u32 f16_narrow(v16_f32 f)
{
    /* compares are on signed lanes (SSE2 has no unsigned ones); arithmetic on unsigned */
    v16_u32 w = (v16_u32)f;
    v16_i32 abs = (v16_i32)(w & 0x7fffffffu);
    v16_i32 exp = abs & 0x7f800000;
    v16_i32 small = exp < 0x38800000;
    exp = (small & 0x38800000) | (~small & exp);
    v16_f32 base = ((v16_f32)abs * 0x1p+112f) * 0x1p-110f;
    v16_u32 bits = (v16_u32)((v16_f32)((v16_u32)exp + 0x07800000u) + base);
    v16_u32 num = ((bits >> 13) & 0x7c00u) + (bits & 0x0fffu);
    v16_u32 nan = 0x7e00u | ((w >> 13) & 0x3ffu);
    v16_u32 is_nan = (v16_u32)(abs > 0x7f800000);
    return ((w >> 16) & 0x8000u) | (is_nan & nan) | (~is_nan & num);
}

/* bfloat16: a shift one way; the other way adds 0x7fff plus the lowest kept bit (round to
 * nearest even, carrying into the exponent up to infinity) and keeps NaN a quiet NaN. */
static inline v16_f32 bf16_widen(v16_u32 h) { return (v16_f32)(h << 16); }

static inline v16_u32 bf16_narrow(v16_f32 f)
{
    v16_u32 u = (v16_u32)f;
    v16_u32 r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    v16_u32 is_nan = (v16_u32)(f != f);
    return (is_nan & ((u >> 16) | 0x40u)) | (~is_nan & r);
}

#define GENERIC_LD2_ST2(T)                                                                          \
    static inline void T##_ld2_generic(const uint16_t *p, v16_f32 *lo, v16_f32 *hi)                \
    {                                                                                               \
        *lo = T##_widen(__builtin_convertvector(*(const v8_u16_u *)p, v16_u32));                    \
        *hi = T##_widen(__builtin_convertvector(*(const v8_u16_u *)(p + 4), v16_u32));              \
    }                                                                                               \
    static inline void T##_st2_generic(uint16_t *p, v16_f32 lo, v16_f32 hi)                         \
    {                                                                                               \
        *(v8_u16_u *)p = __builtin_convertvector(T##_narrow(lo), v8_u16);                           \
        *(v8_u16_u *)(p + 4) = __builtin_convertvector(T##_narrow(hi), v8_u16);                     \
    }
GENERIC_LD2_ST2(f16)
GENERIC_LD2_ST2(bf16)
#define bf16_ld2e_generic bf16_ld2_generic
#define bf16_st2e_generic bf16_st2_generic

#if defined(KOLO_REDUCE_X86)
/* ---- Conversions, AVX2 + F16C and AVX-512 -------------------------------------------------
 * float16 through vcvtph2ps / vcvtps2ph; the immediate rounding mode makes vcvtps2ph round
 * to nearest even whatever MXCSR says. bfloat16 as in the generic build, with the
 * narrowing done by packing the upper halves of the 32-bit lanes. */
ATTR_avx2 static inline void f16_ld2_avx2(const uint16_t *p, v32_f32 *lo, v32_f32 *hi)
{
    *lo = (v32_f32)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
    *hi = (v32_f32)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 8)));
}
ATTR_avx2 static inline void f16_st2_avx2(uint16_t *p, v32_f32 lo, v32_f32 hi)
{
    _mm_storeu_si128((__m128i *)(void *)p, _mm256_cvtps_ph((__m256)lo, _MM_FROUND_TO_NEAREST_INT));
    _mm_storeu_si128((__m128i *)(void *)(p + 8), _mm256_cvtps_ph((__m256)hi, _MM_FROUND_TO_NEAREST_INT));
}
ATTR_avx2 static inline void bf16_ld2_avx2(const uint16_t *p, v32_f32 *lo, v32_f32 *hi)
{
    __m256i a = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
    __m256i b = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p + 8)));
    *lo = (v32_f32)_mm256_slli_epi32(a, 16);
    *hi = (v32_f32)_mm256_slli_epi32(b, 16);
}
/* The bfloat16 of each lane, in the lane's low 16 bits. */
ATTR_avx2 static inline __m256i bf16_round_avx2(v32_f32 f)
{
    __m256i u = (__m256i)f;
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    __m256i quiet = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps((__m256)f, (__m256)f, _CMP_UNORD_Q));
    return _mm256_srli_epi32(_mm256_blendv_epi8(r, quiet, nan), 16);
}
ATTR_avx2 static inline void bf16_st2_avx2(uint16_t *p, v32_f32 lo, v32_f32 hi)
{
    /* packus works within 128-bit lanes: 0-3 8-11 4-7 12-15; the permute restores order */
    __m256i packed = _mm256_packus_epi32(bf16_round_avx2(lo), bf16_round_avx2(hi));
    _mm256_storeu_si256((__m256i *)(void *)p, _mm256_permute4x64_epi64(packed, 0xd8));
}

/* Elementwise kernels need not keep the order inside a group of 16, only undo it: these
 * widen with one unpack per vector (lanes 0-3 8-11, then 4-7 12-15) and pack straight back. */
ATTR_avx2 static inline void bf16_ld2e_avx2(const uint16_t *p, v32_f32 *lo, v32_f32 *hi)
{
    __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)p);
    *lo = (v32_f32)_mm256_unpacklo_epi16(_mm256_setzero_si256(), h);
    *hi = (v32_f32)_mm256_unpackhi_epi16(_mm256_setzero_si256(), h);
}
ATTR_avx2 static inline void bf16_st2e_avx2(uint16_t *p, v32_f32 lo, v32_f32 hi)
{
    __m256i packed = _mm256_packus_epi32(bf16_round_avx2(lo), bf16_round_avx2(hi));
    _mm256_storeu_si256((__m256i *)(void *)p, packed);
}

ATTR_avx512 static inline void f16_ld2_avx512(const uint16_t *p, v64_f32 *lo, v64_f32 *hi)
{
    *lo = (v64_f32)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p));
    *hi = (v64_f32)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p + 16)));
}
ATTR_avx512 static inline void f16_st2_avx512(uint16_t *p, v64_f32 lo, v64_f32 hi)
{
    _mm256_storeu_si256((__m256i *)(void *)p, _mm512_cvtps_ph((__m512)lo, _MM_FROUND_TO_NEAREST_INT));
    _mm256_storeu_si256((__m256i *)(void *)(p + 16),
                        _mm512_cvtps_ph((__m512)hi, _MM_FROUND_TO_NEAREST_INT));
}
ATTR_avx512 static inline void bf16_ld2_avx512(const uint16_t *p, v64_f32 *lo, v64_f32 *hi)
{
    __m512i a = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)p));
    __m512i b = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(p + 16)));
    *lo = (v64_f32)_mm512_slli_epi32(a, 16);
    *hi = (v64_f32)_mm512_slli_epi32(b, 16);
}
ATTR_avx512 static inline __m512i bf16_round_avx512(v64_f32 f)
{
    __m512i u = (__m512i)f;
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    __mmask16 nan = _mm512_cmp_ps_mask((__m512)f, (__m512)f, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x00400000));
    return _mm512_srli_epi32(r, 16);
}
ATTR_avx512 static inline void bf16_st2_avx512(uint16_t *p, v64_f32 lo, v64_f32 hi)
{
    /* packus works within 128-bit lanes; the permute puts the qwords back in order */
    __m512i packed = _mm512_packus_epi32(bf16_round_avx512(lo), bf16_round_avx512(hi));
    __m512i order = _mm512_set_epi64(7, 5, 3, 1, 6, 4, 2, 0);
    _mm512_storeu_si512((void *)p, _mm512_permutexvar_epi64(order, packed));
}
ATTR_avx512 static inline void bf16_ld2e_avx512(const uint16_t *p, v64_f32 *lo, v64_f32 *hi)
{
    __m512i h = _mm512_loadu_si512((const void *)p);
    *lo = (v64_f32)_mm512_unpacklo_epi16(_mm512_setzero_si512(), h);
    *hi = (v64_f32)_mm512_unpackhi_epi16(_mm512_setzero_si512(), h);
}
ATTR_avx512 static inline void bf16_st2e_avx512(uint16_t *p, v64_f32 lo, v64_f32 hi)
{
    __m512i packed = _mm512_packus_epi32(bf16_round_avx512(lo), bf16_round_avx512(hi));
    _mm512_storeu_si512((void *)p, packed);
}
#endif

/* ---- Copies: around the cache, and through it where memcpy would crawl ------------------
 * A plain store to a line that is not in cache first reads the line from memory, so a large
 * memcpy moves three bytes per byte copied; non-temporal stores move two. Each build stores
 * whole 64-byte lines with its widest vectors once the destination is aligned: on this
 * project's VM (Sapphire Rapids, 2 threads copying 32 MiB each at once) 64-byte stores took
 * 2.36 ms where 16-byte ones took 2.50 (glibc's memcpy 3.7), and a 256 KiB block reduced in
 * 4 KiB pieces streamed out one by one ran 4.6 ms with 64-byte stores, 6.2 with 16-byte ones.
 *
 * Copies through the cache, where memcpy would crawl:
 * glibc's memcpy copies with `rep movsb` from about 2 KiB up to about the second-level cache's
 * size on CPUs with fast short REP MOVSB (AMD from Zen 3, recent Intel). On this project's Zen 4
 * VM that instruction copies at 3.5 GB/s instead of 50-57 when the destination lies 1-15 bytes
 * past the source modulo 4096 (the CPU takes the two for overlapping), and at 29-48 for some
 * other distances under 64; a loop of 64-byte loads and stores does not care: 8 KiB-512 KiB,
 * the destination 4 bytes past the source, memcpy 3.5-3.6 GB/s, the loop 49-59; 2 MiB and up
 * memcpy leaves `rep movsb` and both run alike. Such distances come with tensors packed end to
 * end in a fusion buffer or buffers at odd offsets; kolo__copy takes the loop for them only. */
#if defined(KOLO_REDUCE_X86)
/* Both copies below: 64 bytes a step with the build's widest vectors, loaded unaligned and stored
 * with _mm*_KIND_si*: `stream` (non-temporal, the destination aligned to a line first) or
 * `storeu`; the tail (and the head) through memcpy. */
#define LINE_generic(KIND)                                                                          \
    {                                                                                               \
        __m128i a = _mm_loadu_si128((const __m128i *)(const void *)s);                              \
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(s + 16));                       \
        __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(s + 32));                       \
        __m128i e = _mm_loadu_si128((const __m128i *)(const void *)(s + 48));                       \
        _mm_##KIND##_si128((__m128i *)(void *)d, a);                                                \
        _mm_##KIND##_si128((__m128i *)(void *)(d + 16), b);                                         \
        _mm_##KIND##_si128((__m128i *)(void *)(d + 32), c);                                         \
        _mm_##KIND##_si128((__m128i *)(void *)(d + 48), e);                                         \
    }
#define LINE_avx2(KIND)                                                                             \
    {                                                                                               \
        __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)s);                           \
        __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(s + 32));                    \
        _mm256_##KIND##_si256((__m256i *)(void *)d, a);                                             \
        _mm256_##KIND##_si256((__m256i *)(void *)(d + 32), b);                                      \
    }
#define LINE_avx512(KIND) { _mm512_##KIND##_si512((void *)d, _mm512_loadu_si512((const void *)s)); }
#define LINE_COPY(NAME, ISA, KIND, ALIGN)                                                           \
    ATTR_##ISA static void NAME##_##ISA(void *dst, const void *src, size_t n)                       \
    {                                                                                               \
        char *d = dst;                                                                              \
        const char *s = src;                                                                        \
        size_t head = ALIGN ? KOLO_MIN((64 - ((uintptr_t)d & 63)) & 63, n) : 0;                     \
        memcpy(d, s, head);                                                                         \
        d += head, s += head, n -= head;                                                            \
        for (; n >= 64; n -= 64, d += 64, s += 64) LINE_##ISA(KIND)                                 \
        memcpy(d, s, n);                                                                            \
    }
LINE_COPY(stream_copy, generic, stream, 1)
LINE_COPY(stream_copy, avx2, stream, 1)
LINE_COPY(stream_copy, avx512, stream, 1)
LINE_COPY(copy, generic, storeu, 0)
LINE_COPY(copy, avx2, storeu, 0)
LINE_COPY(copy, avx512, storeu, 0)
#else
static void stream_copy_generic(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
static void copy_generic(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
#endif

/* ---- Kernel tables ------------------------------------------------------------------ */
typedef void (*bin_fn)(void *dst, const void *a, const void *b, size_t n);
typedef void (*scale_fn)(void *dst, const void *src, size_t n, double factor);
typedef void (*sum_scale_fn)(void *dst, const void *a, const void *b, size_t n, double factor);
typedef void (*to_f32_fn)(float *dst, const uint16_t *src, size_t n);
typedef void (*from_f32_fn)(uint16_t *dst, const float *src, size_t n);

enum { SLOT_SUM, SLOT_MIN, SLOT_MAX, SLOT_PROD, SLOT_COUNT };

typedef struct kset {
    const char *name;
    bin_fn bin[KOLO_DTYPE_COUNT][SLOT_COUNT];
    scale_fn scale[4]; /* float16, bfloat16, float32, float64: dtype - KOLO_FLOAT16 */
    sum_scale_fn sum_scale[2]; /* float32, float64: dtype - KOLO_FLOAT32 */
    to_f32_fn f16_to_f32, bf16_to_f32;
    from_f32_fn f32_to_f16, f32_to_bf16;
    void (*stream_copy)(void *dst, const void *src, size_t n);
    void (*copy)(void *dst, const void *src, size_t n);
} kset;

/* The table of one build's kernels, kset_VAR: ISA's, except float16's: its sum and product are
 * given, its other kernels are F16's (the avx512+fp16 build is avx512's with those two native,
 * avx512+f16c is avx512's with every float16 kernel avx2+f16c's); and bfloat16's, those that
 * round to bfloat16 BF16's (avx512+f16c+bf16: avx512+f16c's with AVX512-BF16's rounding). */
#define KSET(VAR, ISA, F16, BF16, NAME, SUM_F16, PROD_F16)                                          \
    static const kset kset_##VAR = {                                                                \
        .name = NAME,                                                                               \
        .bin =                                                                                      \
            {                                                                                       \
                [KOLO_UINT8] = {sum_u8_##ISA, min_u8_##ISA, max_u8_##ISA, prod_u8_##ISA},           \
                [KOLO_INT8] = {sum_u8_##ISA, min_i8_##ISA, max_i8_##ISA, prod_u8_##ISA},            \
                [KOLO_UINT16] = {sum_u16_##ISA, min_u16_##ISA, max_u16_##ISA, prod_u16_##ISA},      \
                [KOLO_INT16] = {sum_u16_##ISA, min_i16_##ISA, max_i16_##ISA, prod_u16_##ISA},       \
                [KOLO_INT32] = {sum_u32_##ISA, min_i32_##ISA, max_i32_##ISA, prod_u32_##ISA},       \
                [KOLO_INT64] = {sum_u64_##ISA, min_i64_##ISA, max_i64_##ISA, prod_u64_##ISA},       \
                [KOLO_FLOAT16] = {SUM_F16, min_f16_##F16, max_f16_##F16, PROD_F16},                   \
                [KOLO_BFLOAT16] = {sum_bf16_##BF16, min_bf16_##BF16, max_bf16_##BF16, prod_bf16_##BF16}, \
                [KOLO_FLOAT32] = {sum_f32_##ISA, min_f32_##ISA, max_f32_##ISA, prod_f32_##ISA},     \
                [KOLO_FLOAT64] = {sum_f64_##ISA, min_f64_##ISA, max_f64_##ISA, prod_f64_##ISA},     \
                [KOLO_BOOL] = {or_b8_##ISA, and_b8_##ISA, or_b8_##ISA, and_b8_##ISA},               \
            },                                                                                      \
        .scale = {scale_f16_##F16, scale_bf16_##BF16, scale_f32_##ISA, scale_f64_##ISA},            \
        .sum_scale = {sum_scale_f32_##ISA, sum_scale_f64_##ISA},                                    \
        .f16_to_f32 = f16_to_f32_##F16,                                                             \
        .bf16_to_f32 = bf16_to_f32_##ISA,                                                           \
        .f32_to_f16 = f32_to_f16_##F16,                                                             \
        .f32_to_bf16 = f32_to_bf16_##BF16,                                                          \
        .stream_copy = stream_copy_##ISA,                                                           \
        .copy = copy_##ISA,                                                                         \
    };

/* Every kernel of one build, and its table. W: vector bytes. */
#define KERNELS(ISA, W, NAME)                                                                       \
    BIN(ISA, W, sum_u8, uint8_t, u8, i8, V_SUM, s_sum_u8)                                           \
    BIN(ISA, W, sum_u16, uint16_t, u16, i16, V_SUM, s_sum_u16)                                      \
    BIN(ISA, W, sum_u32, uint32_t, u32, i32, V_SUM, s_sum_u32)                                      \
    BIN(ISA, W, sum_u64, uint64_t, u64, i64, V_SUM, s_sum_u64)                                      \
    BIN(ISA, W, sum_f32, float, f32, i32, V_SUM, s_sum_f32)                                         \
    BIN(ISA, W, sum_f64, double, f64, i64, V_SUM, s_sum_f64)                                        \
    BIN(ISA, W, prod_u8, uint8_t, u8, i8, V_PROD, s_prod_u8)                                        \
    BIN(ISA, W, prod_u16, uint16_t, u16, i16, V_PROD, s_prod_u16)                                   \
    BIN(ISA, W, prod_u32, uint32_t, u32, i32, V_PROD, s_prod_u32)                                   \
    BIN(ISA, W, prod_u64, uint64_t, u64, i64, V_PROD, s_prod_u64)                                   \
    BIN(ISA, W, prod_f32, float, f32, i32, V_PROD, s_prod_f32)                                      \
    BIN(ISA, W, prod_f64, double, f64, i64, V_PROD, s_prod_f64)                                     \
    BIN(ISA, W, min_u8, uint8_t, u8, i8, V_IMIN, s_min_u8)                                          \
    BIN(ISA, W, min_i8, int8_t, i8, i8, V_IMIN, s_min_i8)                                           \
    BIN(ISA, W, min_u16, uint16_t, u16, i16, V_IMIN, s_min_u16)                                     \
    BIN(ISA, W, min_i16, int16_t, i16, i16, V_IMIN, s_min_i16)                                      \
    BIN(ISA, W, min_i32, int32_t, i32, i32, V_IMIN, s_min_i32)                                      \
    BIN(ISA, W, min_i64, int64_t, i64, i64, V_IMIN, s_min_i64)                                      \
    BIN(ISA, W, min_f32, float, f32, i32, V_FMIN, s_min_f32)                                        \
    BIN(ISA, W, min_f64, double, f64, i64, V_FMIN, s_min_f64)                                       \
    BIN(ISA, W, max_u8, uint8_t, u8, i8, V_IMAX, s_max_u8)                                          \
    BIN(ISA, W, max_i8, int8_t, i8, i8, V_IMAX, s_max_i8)                                           \
    BIN(ISA, W, max_u16, uint16_t, u16, i16, V_IMAX, s_max_u16)                                     \
    BIN(ISA, W, max_i16, int16_t, i16, i16, V_IMAX, s_max_i16)                                      \
    BIN(ISA, W, max_i32, int32_t, i32, i32, V_IMAX, s_max_i32)                                      \
    BIN(ISA, W, max_i64, int64_t, i64, i64, V_IMAX, s_max_i64)                                      \
    BIN(ISA, W, max_f32, float, f32, i32, V_FMAX, s_max_f32)                                        \
    BIN(ISA, W, max_f64, double, f64, i64, V_FMAX, s_max_f64)                                       \
    BIN(ISA, W, or_b8, uint8_t, u8, i8, V_OR, s_or_b8)                                              \
    BIN(ISA, W, and_b8, uint8_t, u8, i8, V_AND, s_and_b8)                                           \
    HBIN(ISA, W, sum_f16, f16_ld2_##ISA, f16_st2_##ISA, V_SUM)                                   \
    HBIN(ISA, W, min_f16, f16_ld2_##ISA, f16_st2_##ISA, V_FMIN)                                  \
    HBIN(ISA, W, max_f16, f16_ld2_##ISA, f16_st2_##ISA, V_FMAX)                                  \
    HBIN(ISA, W, prod_f16, f16_ld2_##ISA, f16_st2_##ISA, V_PROD)                                 \
    HBIN(ISA, W, sum_bf16, bf16_ld2e_##ISA, bf16_st2e_##ISA, V_SUM)                              \
    HBIN(ISA, W, min_bf16, bf16_ld2e_##ISA, bf16_st2e_##ISA, V_FMIN)                             \
    HBIN(ISA, W, max_bf16, bf16_ld2e_##ISA, bf16_st2e_##ISA, V_FMAX)                             \
    HBIN(ISA, W, prod_bf16, bf16_ld2e_##ISA, bf16_st2e_##ISA, V_PROD)                            \
    SCALE(ISA, W, scale_f32, float, f32)                                                            \
    SCALE(ISA, W, scale_f64, double, f64)                                                           \
    HSCALE(ISA, W, scale_f16, f16_ld2_##ISA, f16_st2_##ISA)                                      \
    HSCALE(ISA, W, scale_bf16, bf16_ld2e_##ISA, bf16_st2e_##ISA)                                 \
    SUMSCALE(ISA, W, sum_scale_f32, float, f32)                                                     \
    SUMSCALE(ISA, W, sum_scale_f64, double, f64)                                                    \
    TO_F32(ISA, W, f16_to_f32, f16_ld2_##ISA)                                                      \
    TO_F32(ISA, W, bf16_to_f32, bf16_ld2_##ISA)                                                    \
    FROM_F32(ISA, W, f32_to_f16, f16_st2_##ISA)                                                   \
    FROM_F32(ISA, W, f32_to_bf16, bf16_st2_##ISA)                                                 \
    KSET(ISA, ISA, ISA, ISA, NAME, sum_f16_##ISA, prod_f16_##ISA)

KERNELS(generic, 16, "generic")
#if defined(KOLO_REDUCE_X86)
KERNELS(avx2, 32, "avx2+f16c")
KERNELS(avx512, 64, "avx512")

/* ---- avx512+f16c: avx512's kernels, float16's avx2+f16c's (AMD Zen 4)
 * Zen 4 runs each 512-bit operation as two 256-bit halves, and its zmm float16 conversions cost
 * more than two ymm ones: measured on a Zen 4 VM (EPYC, family 25 model 17), one core, 64 KiB
 * buffers in cache, GB/s of one input: float16 sum 21.6 with the zmm kernels against 26.4 with
 * the ymm ones, product 24.9 against 33.6, max 18.4 against 18.7 (bfloat16, with no conversion
 * instruction, is faster in zmm: sum 16.3 against 15.4; float32 36.0 against 38.3). Chosen on
 * that family only (best(), below): on Intel's cores without AVX512-FP16 a zmm conversion is
 * one full-width operation, and Zen 5's 512-bit datapath is not measured yet. */
KSET(avx512f16c, avx512, avx2, avx512, "avx512+f16c", sum_f16_avx2, prod_f16_avx2)
#endif

/* ---- avx512+f16c+bf16: avx512+f16c's kernels, rounding to bfloat16 by AVX512-BF16 (Zen 4)
 * The avx512 kernels round each float32 lane to bfloat16 in seven integer operations (the
 * nearest, ties to even, NaNs made quiet); VCVTNE2PS2BF16 rounds 32 lanes in one, with the same
 * rule and the same NaN bits, but it reads a subnormal float32 as zero where the reference keeps
 * it (a bfloat16 subnormal, or the smallest normal). So a pair of vectors holding a subnormal
 * lane takes the integer rounding: the results are the same bits as every other build's. The
 * instruction writes the second operand's lanes first; the elementwise kernels' loads (one
 * unpack per vector: lanes 0-3 8-11 ..., then 4-7 12-15 ...) are put back in order by one word
 * permute (widening the loads in order instead, with no permute, gained half as much). Zen 4 VM
 * (EPYC, family 25 model 17), one core, buffers in cache, GB/s of one input: bfloat16 sum 64 KiB
 * 17.2-18.5 against 12.3-13.1 with the integer rounding, 256 KiB 24.9-28.2 against 17.3-17.5; a
 * 2-rank allreduce of 256 KiB-4 MiB went from 0.90-0.95x float32's byte rate to 0.98-1.01x
 * (docs/performance.md). Chosen where the CPU has AVX512-BF16 and the avx512+f16c build is
 * chosen (Zen 4): on Intel's cores not measured yet. Built where the compiler knows the
 * instruction set (GCC 10, clang 9 and later). */
#if defined(KOLO_REDUCE_X86) && (defined(__clang__) ? __clang_major__ >= 9 : __GNUC__ >= 10)
#define KOLO_REDUCE_BF16 1
#define ATTR_avx512bf16 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))
/* Some lane of lo or hi is a subnormal float32. */
ATTR_avx512bf16 static inline bool bf16_subnormal_avx512bf16(v64_f32 lo, v64_f32 hi)
{
    return (_mm512_fpclass_ps_mask((__m512)lo, 0x20) | _mm512_fpclass_ps_mask((__m512)hi, 0x20)) != 0;
}
ATTR_avx512bf16 static inline void bf16_st2_avx512bf16(uint16_t *p, v64_f32 lo, v64_f32 hi)
{
    if (KOLO_UNLIKELY(bf16_subnormal_avx512bf16(lo, hi))) {
        bf16_st2_avx512(p, lo, hi);
        return;
    }
    _mm512_storeu_si512((void *)p, (__m512i)_mm512_cvtne2ps_pbh((__m512)hi, (__m512)lo));
}
/* Where each word of bf16_ld2e_avx512's order lies after the conversion (lo's lanes, then hi's). */
static const uint16_t bf16_unorder[32] __attribute__((aligned(64))) = {
    0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23,
    8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31,
};
ATTR_avx512bf16 static inline void bf16_st2e_avx512bf16(uint16_t *p, v64_f32 lo, v64_f32 hi)
{
    if (KOLO_UNLIKELY(bf16_subnormal_avx512bf16(lo, hi))) {
        bf16_st2e_avx512(p, lo, hi);
        return;
    }
    __m512i r = (__m512i)_mm512_cvtne2ps_pbh((__m512)hi, (__m512)lo);
    _mm512_storeu_si512((void *)p, _mm512_permutexvar_epi16(_mm512_load_si512((const void *)bf16_unorder), r));
}
HBIN(avx512bf16, 64, sum_bf16, bf16_ld2e_avx512, bf16_st2e_avx512bf16, V_SUM)
HBIN(avx512bf16, 64, min_bf16, bf16_ld2e_avx512, bf16_st2e_avx512bf16, V_FMIN)
HBIN(avx512bf16, 64, max_bf16, bf16_ld2e_avx512, bf16_st2e_avx512bf16, V_FMAX)
HBIN(avx512bf16, 64, prod_bf16, bf16_ld2e_avx512, bf16_st2e_avx512bf16, V_PROD)
HSCALE(avx512bf16, 64, scale_bf16, bf16_ld2e_avx512, bf16_st2e_avx512bf16)
FROM_F32(avx512bf16, 64, f32_to_bf16, bf16_st2_avx512bf16)
KSET(avx512f16cbf16, avx512, avx2, avx512bf16, "avx512+f16c+bf16", sum_f16_avx2, prod_f16_avx2)

/* CPUID.(EAX=7,ECX=1):EAX.AVX512_BF16 (asked together with AVX-512, whose check also covers the OS
 * saving the zmm registers) */
static bool has_avx512bf16(void)
{
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
}
#endif

/* ---- avx512+fp16: float16 sums and products in float16 itself (AVX512-FP16, Sapphire Rapids on)
 * The F16C kernels widen both inputs, operate in float32 and round back: four conversions per
 * operation, each a two-uop instruction on the same port, which made a float16 allreduce slower
 * per byte than float32's. vaddph/vmulph do it in one. The results are the same bits: the exact
 * sum or product of two float16 values rounded once to float16 equals it rounded first to
 * float32 then to float16, since float32's 24 significand bits are at least 2 * 11 + 2 (double
 * rounding is then harmless for +, -, *, /); the product is even exact in float32. Subnormals
 * are computed in full (the FP16 instructions ignore DAZ and FTZ, as F16C's conversions do; the
 * test sets both), and
 * a NaN operand propagates by the same x86 rule (the first NaN operand, made quiet). MIN and MAX
 * stay on the avx512 kernels, whose NaN rule is not the instructions'. Built where the compiler
 * knows _Float16 and the instruction set (GCC 12, clang 15 and later). */
#if defined(KOLO_REDUCE_X86) && defined(__FLT16_MAX__) && (!defined(__clang__) || __clang_major__ >= 15)
#define KOLO_REDUCE_FP16 1
#define ATTR_avx512fp16 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512fp16")))
VEC_TYPE(64, f16, _Float16)
static inline _Float16 s_sum_f16(_Float16 x, _Float16 y) { return x + y; }
static inline _Float16 s_prod_f16(_Float16 x, _Float16 y) { return x * y; }
BIN(avx512fp16, 64, sum_f16, _Float16, f16, i16, V_SUM, s_sum_f16)
BIN(avx512fp16, 64, prod_f16, _Float16, f16, i16, V_PROD, s_prod_f16)
KSET(avx512fp16, avx512, avx512, avx512, "avx512+fp16", sum_f16_avx512fp16, prod_f16_avx512fp16)
#endif

/* ---- Choosing a build ------------------------------------------------------------------
 * Chosen once, by a constructor while the process is still single-threaded (so libgcc's
 * CPU probe is never raced); should a kernel run before constructors, ks() chooses then.
 * The choice is a pure function of the CPU, so any two choosers store the same pointer,
 * and the tables themselves are constant data. */
static _Atomic(const kset *) active;

#if defined(KOLO_REDUCE_X86)
/* CPUID.1:ECX.F16C (clang's __builtin_cpu_supports does not know "f16c"). Only asked
 * together with AVX2, whose check also covers the OS saving the ymm registers. */
static bool has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

static const kset *supported(const char *name)
{
    if (strcmp(name, kset_generic.name) == 0) return &kset_generic;
#if defined(KOLO_REDUCE_X86)
    __builtin_cpu_init(); /* needed if we run before libgcc's own constructor */
#if defined(KOLO_REDUCE_FP16)
    if (strcmp(name, kset_avx512fp16.name) == 0)
        return supported(kset_avx512.name) && __builtin_cpu_supports("avx512fp16") ? &kset_avx512fp16 : NULL;
#endif
#if defined(KOLO_REDUCE_BF16)
    if (strcmp(name, kset_avx512f16cbf16.name) == 0)
        return supported(kset_avx512f16c.name) && has_avx512bf16() ? &kset_avx512f16cbf16 : NULL;
#endif
    if (strcmp(name, kset_avx512f16c.name) == 0)
        return supported(kset_avx512.name) && supported(kset_avx2.name) ? &kset_avx512f16c : NULL;
    if (strcmp(name, kset_avx512.name) == 0)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")
                   ? &kset_avx512
                   : NULL;
    if (strcmp(name, kset_avx2.name) == 0)
        return __builtin_cpu_supports("avx2") && has_f16c() ? &kset_avx2 : NULL;
#endif
    return NULL;
}

#if defined(KOLO_REDUCE_X86)
/* AMD family 19h with AVX-512: Zen 4, whose 512-bit operations are two 256-bit halves. */
static bool zen4(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d) || b != 0x68747541u || d != 0x69746e65u || c != 0x444d4163u)
        return false; /* "AuthenticAMD" */
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    unsigned family = (a >> 8) & 0xf;
    if (family == 0xf) family += (a >> 20) & 0xff;
    return family == 0x19;
}
#endif

static const kset *best(void)
{
    static const char *const order[] = {"avx512+fp16", "avx512+f16c+bf16", "avx512+f16c", "avx512", "avx2+f16c",
                                        "generic"};
    for (size_t i = 0; i < KOLO_ARRAY_SIZE(order); i++) {
        const kset *k = supported(order[i]);
#if defined(KOLO_REDUCE_X86)
        if (k && strncmp(k->name, "avx512+f16c", 11) == 0 && !zen4()) continue; /* faster on Zen 4 only (above) */
#endif
        if (k) return k;
    }
    return &kset_generic;
}

static inline const kset *ks(void)
{
    const kset *k = atomic_load_explicit(&active, memory_order_relaxed);
    if (KOLO_UNLIKELY(!k)) {
        k = best();
        atomic_store_explicit(&active, k, memory_order_relaxed);
    }
    return k;
}

__attribute__((constructor)) static void choose_at_load(void) { (void)ks(); }

const char *kolo__reduce_isa(void) { return ks()->name; }

bool kolo__reduce_set_isa(const char *name)
{
    const kset *k = name ? supported(name) : best();
    if (!k) return false;
    atomic_store_explicit(&active, k, memory_order_relaxed);
    return true;
}

/* ---- Entry points ------------------------------------------------------------------------ */
bool kolo__op_valid(kolo_dtype_t dtype, kolo_op_t op)
{
    if ((unsigned)dtype >= KOLO_DTYPE_COUNT || (unsigned)op >= KOLO_OP_COUNT) return false;
    if (op == KOLO_ADASUM) /* not an element kernel: coll/adasum.c */
        return dtype == KOLO_FLOAT16 || dtype == KOLO_BFLOAT16 || dtype == KOLO_FLOAT32 || dtype == KOLO_FLOAT64;
    return !(dtype == KOLO_BOOL && op == KOLO_AVERAGE);
}

static int slot_of(kolo_op_t op)
{
    switch (op) {
    case KOLO_SUM:
    case KOLO_AVERAGE: return SLOT_SUM;
    case KOLO_MIN: return SLOT_MIN;
    case KOLO_MAX: return SLOT_MAX;
    case KOLO_PRODUCT: return SLOT_PROD;
    default: return -1;
    }
}

static size_t elem_size(kolo_dtype_t dtype)
{
    static const unsigned char size[KOLO_DTYPE_COUNT] = {
        [KOLO_UINT8] = 1, [KOLO_INT8] = 1,     [KOLO_UINT16] = 2,   [KOLO_INT16] = 2,
        [KOLO_INT32] = 4, [KOLO_INT64] = 8,    [KOLO_FLOAT16] = 2,  [KOLO_BFLOAT16] = 2,
        [KOLO_FLOAT32] = 4, [KOLO_FLOAT64] = 8, [KOLO_BOOL] = 1,
    };
    return (unsigned)dtype < KOLO_DTYPE_COUNT ? size[dtype] : 0;
}

void kolo__reduce(void *dst, const void *a, const void *b, size_t count, kolo_dtype_t dtype,
                  kolo_op_t op)
{
    int slot = slot_of(op);
    assert(slot >= 0 && elem_size(dtype) > 0);
    if (count == 0 || slot < 0 || elem_size(dtype) == 0) return;
    ks()->bin[dtype][slot](dst, a, b, count);
}

/* Integer scaling: (double)v * factor, truncated toward zero and clamped to [lo, hi]
 * (both exact doubles); NaN gives 0. */
static double clamp_trunc(double r, double lo, double hi)
{
    if (r != r) return 0;
    if (r <= lo) return lo;
    if (r >= hi) return hi;
    return r;
}

#define SCALE_INT(T, LO, HI)                                                                        \
    do {                                                                                            \
        T *d = dst;                                                                                 \
        const T *s = src;                                                                           \
        for (size_t i = 0; i < count; i++)                                                          \
            d[i] = (T)clamp_trunc((double)s[i] * factor, (double)(LO), (double)(HI));               \
    } while (0)

void kolo__scale(void *dst, const void *src, size_t count, kolo_dtype_t dtype, double factor)
{
    size_t es = elem_size(dtype);
    assert(es > 0);
    if (count == 0 || es == 0) return;
    if (factor == 1.0 || dtype == KOLO_BOOL) {
        if (dst != src) memcpy(dst, src, count * es);
        return;
    }
    switch (dtype) {
    case KOLO_UINT8: SCALE_INT(uint8_t, 0, UINT8_MAX); break;
    case KOLO_INT8: SCALE_INT(int8_t, INT8_MIN, INT8_MAX); break;
    case KOLO_UINT16: SCALE_INT(uint16_t, 0, UINT16_MAX); break;
    case KOLO_INT16: SCALE_INT(int16_t, INT16_MIN, INT16_MAX); break;
    case KOLO_INT32: SCALE_INT(int32_t, INT32_MIN, INT32_MAX); break;
    case KOLO_INT64: {
        /* INT64_MAX is not a double: everything from 2^63 up saturates. */
        int64_t *d = dst;
        const int64_t *s = src;
        for (size_t i = 0; i < count; i++) {
            double r = (double)s[i] * factor;
            if (r != r) d[i] = 0;
            else if (r >= 0x1p63) d[i] = INT64_MAX;
            else if (r <= -0x1p63) d[i] = INT64_MIN;
            else d[i] = (int64_t)r;
        }
        break;
    }
    case KOLO_FLOAT16:
    case KOLO_BFLOAT16:
    case KOLO_FLOAT32:
    case KOLO_FLOAT64: ks()->scale[dtype - KOLO_FLOAT16](dst, src, count, factor); break;
    default: break;
    }
}

/* One pass where it pays: float32 and float64 sums. Zen 4 VM (EPYC, family 25 model 17), one core,
 * 1 KiB pieces in the first-level cache as the collectives finish them, ns per KiB (best of 20
 * rounds, two runs): float32 sum 30-37, sum then scale 40-63, in one pass 31-37. The half types
 * take the two passes: their kernels are bound by the conversions (F16C's are two-uop
 * instructions there), and one pass that keeps the two passes' bits must round the sum and widen
 * it back in registers, as many conversions as the two passes make: float16 72-84 against 64-78,
 * bfloat16 83-91 against 65-88. Nor does skipping that rounding where it cannot matter: with a
 * power-of-two factor, rounding commutes with the multiply wherever sum and product stay normal,
 * but a test of that per vector (a range compare of every lane, a branch to the rounding) cost
 * more than the four conversions it saved, even on data that never took the branch: float16 87-106
 * against 63-82. Rounding the sum only once would save two conversions of five, and change the
 * results. */
void kolo__reduce_scale(void *dst, const void *a, const void *b, size_t count, kolo_dtype_t dtype, kolo_op_t op,
                        double factor)
{
    if ((dtype == KOLO_FLOAT32 || dtype == KOLO_FLOAT64) && slot_of(op) == SLOT_SUM && factor != 1.0) {
        if (count) ks()->sum_scale[dtype - KOLO_FLOAT32](dst, a, b, count, factor);
        return;
    }
    kolo__reduce(dst, a, b, count, dtype, op);
    kolo__scale(dst, dst, count, dtype, factor);
}

#define DIVIDE_INT(T, D)                                                                            \
    do {                                                                                            \
        T *p = buf;                                                                                 \
        for (size_t i = 0; i < count; i++) p[i] = (T)(p[i] / (D));                                  \
    } while (0)

void kolo__divide(void *buf, size_t count, kolo_dtype_t dtype, int n)
{
    assert(n > 0);
    if (count == 0 || n <= 1) return; /* n <= 0 is a caller bug; leave the data alone */
    switch (dtype) {
    case KOLO_UINT8: DIVIDE_INT(uint8_t, n); break;
    case KOLO_INT8: DIVIDE_INT(int8_t, n); break;
    case KOLO_UINT16: DIVIDE_INT(uint16_t, n); break;
    case KOLO_INT16: DIVIDE_INT(int16_t, n); break;
    case KOLO_INT32: DIVIDE_INT(int32_t, n); break;
    case KOLO_INT64: DIVIDE_INT(int64_t, (int64_t)n); break;
    case KOLO_FLOAT16:
    case KOLO_BFLOAT16:
    case KOLO_FLOAT32:
    case KOLO_FLOAT64: kolo__scale(buf, buf, count, dtype, 1.0 / n); break;
    default: break; /* BOOL: unchanged */
    }
}

void kolo__f16_to_f32_n(float *dst, const uint16_t *src, size_t n)
{
    if (n) ks()->f16_to_f32(dst, src, n);
}
void kolo__f32_to_f16_n(uint16_t *dst, const float *src, size_t n)
{
    if (n) ks()->f32_to_f16(dst, src, n);
}
void kolo__bf16_to_f32_n(float *dst, const uint16_t *src, size_t n)
{
    if (n) ks()->bf16_to_f32(dst, src, n);
}
void kolo__f32_to_bf16_n(uint16_t *dst, const float *src, size_t n)
{
    if (n) ks()->f32_to_bf16(dst, src, n);
}

void kolo__stream_copy(void *dst, const void *src, size_t n)
{
    if (n) ks()->stream_copy(dst, src, n);
}

#define COPY_LOOP_MIN 2048 /* below, memcpy does not use `rep movsb` */

void kolo__copy(void *dst, const void *src, size_t n)
{
    if (!n) return;
    size_t past = ((uintptr_t)dst - (uintptr_t)src) & 4095;
    if (n >= COPY_LOOP_MIN && past - 1 < 63) ks()->copy(dst, src, n);
    else memcpy(dst, src, n);
}

void kolo__stream_fence(void)
{
#if defined(__x86_64__)
    _mm_sfence();
#endif
}

/* test_reduce.c - the element kernels against scalar references written here: every dtype, op
 * and vector build; float16/bfloat16 conversions; scaling, saturation and exact integer division.
 *
 * The references are deliberately written another way than src/reduce: float16 values are
 * computed with ldexp and rounded by searching the float16 number line, bfloat16 rounding
 * compares distances in double. Every test that touches a kernel runs once per vector build
 * this CPU can run (generic, avx2+f16c, avx512, avx512+f16c, avx512+f16c+bf16, avx512+fp16), so the
 * builds are checked against the same expectations and therefore against each other. */
#include "kt.h"

#include "../src/reduce/reduce.h"

#include <math.h>
#include <stdint.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

static const char *const isas[] = {"generic", "avx2+f16c", "avx512", "avx512+f16c", "avx512+f16c+bf16", "avx512+fp16"};

/* Runs body once for every vector build this machine supports. */
#define FOR_EACH_ISA(name)                                                                          \
    for (size_t isa_i_ = 0; isa_i_ < KOLO_ARRAY_SIZE(isas); isa_i_++)                               \
        for (const char *name = isas[isa_i_]; name && kolo__reduce_set_isa(name); name = NULL)

static uint64_t rng_state;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint64_t dbits(double f)
{
    uint64_t u;
    memcpy(&u, &f, 8);
    return u;
}

/* ---- Reference conversions ---- */

/* The value of a finite float16, exactly. */
static double ref_h_value(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

static uint32_t ref_h2f_bits(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    if ((h & 0x7c00) == 0x7c00) {
        if (h & 0x3ff) return sign | 0x7fc00000u | (uint32_t)(h & 0x3ff) << 13; /* quiet NaN */
        return sign | 0x7f800000u;
    }
    return fbits((float)ref_h_value(h));
}

/* Nearest float16 (ties to even) to a double that is not NaN, by binary search over the
 * positive finite halves. */
static uint16_t ref_d2h(double d)
{
    uint16_t sign = signbit(d) ? 0x8000 : 0;
    double x = fabs(d);
    if (x >= 65520.0) return (uint16_t)(sign | 0x7c00);
    unsigned lo = 0, hi = 0x7bff; /* largest h with value <= x */
    while (lo < hi) {
        unsigned mid = (lo + hi + 1) / 2;
        if (ref_h_value((uint16_t)mid) <= x) lo = mid;
        else hi = mid - 1;
    }
    double vlo = ref_h_value((uint16_t)lo);
    double vhi = lo == 0x7bff ? 65536.0 : ref_h_value((uint16_t)(lo + 1));
    unsigned r;
    if (x - vlo < vhi - x) r = lo;
    else if (x - vlo > vhi - x) r = lo + 1;
    else r = (lo & 1) ? lo + 1 : lo;
    return (uint16_t)(sign | r);
}

static uint16_t ref_f2h(float f)
{
    uint32_t u = fbits(f);
    if (isnan(f)) return (uint16_t)(((u >> 16) & 0x8000) | 0x7e00 | ((u >> 13) & 0x3ff));
    return ref_d2h((double)f);
}

static float ref_bf2f(uint16_t h) { return bitsf((uint32_t)h << 16); }

static uint16_t ref_f2bf(float f)
{
    uint32_t u = fbits(f);
    if (isnan(f)) return (uint16_t)((u >> 16) | 0x40);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1); /* truncation and the next one out */
    double x = fabs((double)f);
    double vlo = fabs((double)ref_bf2f(lo));
    double vhi = (hi & 0x7fff) == 0x7f80 ? ldexp(1, 128) : fabs((double)ref_bf2f(hi));
    if (x - vlo < vhi - x) return lo;
    if (x - vlo > vhi - x) return hi;
    return (lo & 1) ? hi : lo;
}

/* ---- Reference element operation ---- */

static size_t esize(kolo_dtype_t t)
{
    switch (t) {
    case KOLO_UINT8: case KOLO_INT8: case KOLO_BOOL: return 1;
    case KOLO_UINT16: case KOLO_INT16: case KOLO_FLOAT16: case KOLO_BFLOAT16: return 2;
    case KOLO_INT32: case KOLO_FLOAT32: return 4;
    default: return 8;
    }
}

static float ref_fop(kolo_op_t op, float x, float y)
{
    switch (op) {
    case KOLO_SUM: case KOLO_AVERAGE: return x + y;
    case KOLO_PRODUCT: return x * y;
    case KOLO_MIN: return isnan(x) ? x : isnan(y) ? y : x < y ? x : y;
    default: return isnan(x) ? x : isnan(y) ? y : x > y ? x : y;
    }
}
static double ref_dop(kolo_op_t op, double x, double y)
{
    switch (op) {
    case KOLO_SUM: case KOLO_AVERAGE: return x + y;
    case KOLO_PRODUCT: return x * y;
    case KOLO_MIN: return isnan(x) ? x : isnan(y) ? y : x < y ? x : y;
    default: return isnan(x) ? x : isnan(y) ? y : x > y ? x : y;
    }
}

/* Integer ops on values widened to int64 (signed types) or uint64; SUM and PRODUCT wrap
 * when the caller truncates the result to the type. */
static int64_t ref_iop(kolo_op_t op, int64_t x, int64_t y)
{
    switch (op) {
    case KOLO_SUM: case KOLO_AVERAGE: return (int64_t)((uint64_t)x + (uint64_t)y);
    case KOLO_PRODUCT: return (int64_t)((uint64_t)x * (uint64_t)y);
    case KOLO_MIN: return x < y ? x : y;
    default: return x > y ? x : y;
    }
}

static void ref_elem(kolo_dtype_t t, kolo_op_t op, const void *a, const void *b, size_t i, void *out)
{
    switch (t) {
    case KOLO_UINT8: ((uint8_t *)out)[i] = (uint8_t)ref_iop(op, ((const uint8_t *)a)[i], ((const uint8_t *)b)[i]); break;
    case KOLO_INT8: ((int8_t *)out)[i] = (int8_t)ref_iop(op, ((const int8_t *)a)[i], ((const int8_t *)b)[i]); break;
    case KOLO_UINT16: ((uint16_t *)out)[i] = (uint16_t)ref_iop(op, ((const uint16_t *)a)[i], ((const uint16_t *)b)[i]); break;
    case KOLO_INT16: ((int16_t *)out)[i] = (int16_t)ref_iop(op, ((const int16_t *)a)[i], ((const int16_t *)b)[i]); break;
    case KOLO_INT32: ((int32_t *)out)[i] = (int32_t)ref_iop(op, ((const int32_t *)a)[i], ((const int32_t *)b)[i]); break;
    case KOLO_INT64: ((int64_t *)out)[i] = ref_iop(op, ((const int64_t *)a)[i], ((const int64_t *)b)[i]); break;
    case KOLO_FLOAT32: ((float *)out)[i] = ref_fop(op, ((const float *)a)[i], ((const float *)b)[i]); break;
    case KOLO_FLOAT64: ((double *)out)[i] = ref_dop(op, ((const double *)a)[i], ((const double *)b)[i]); break;
    case KOLO_FLOAT16: {
        float x = bitsf(ref_h2f_bits(((const uint16_t *)a)[i])), y = bitsf(ref_h2f_bits(((const uint16_t *)b)[i]));
        ((uint16_t *)out)[i] = ref_f2h(ref_fop(op, x, y));
        break;
    }
    case KOLO_BFLOAT16: {
        float x = ref_bf2f(((const uint16_t *)a)[i]), y = ref_bf2f(((const uint16_t *)b)[i]);
        ((uint16_t *)out)[i] = ref_f2bf(ref_fop(op, x, y));
        break;
    }
    case KOLO_BOOL: {
        int x = ((const uint8_t *)a)[i] != 0, y = ((const uint8_t *)b)[i] != 0;
        int any = op == KOLO_SUM || op == KOLO_MAX;
        ((uint8_t *)out)[i] = (uint8_t)(any ? (x | y) : (x & y));
        break;
    }
    default: break;
    }
}

static bool elem_is_nan(kolo_dtype_t t, const void *p, size_t i)
{
    switch (t) {
    case KOLO_FLOAT16: return (((const uint16_t *)p)[i] & 0x7fff) > 0x7c00;
    case KOLO_BFLOAT16: return (((const uint16_t *)p)[i] & 0x7fff) > 0x7f80;
    case KOLO_FLOAT32: return isnan(((const float *)p)[i]);
    case KOLO_FLOAT64: return isnan(((const double *)p)[i]);
    default: return false;
    }
}

/* Test data: integers are random bits (so SUM and PRODUCT wrap); floats are mostly
 * moderate random values with zeros, infinities, NaNs (quiet and signaling, both signs)
 * and subnormals sprinkled in; bools are random bytes, not only 0/1. */
static void fill(kolo_dtype_t t, void *buf, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rnd();
        unsigned pick = (unsigned)(r >> 56) % 16;
        switch (t) {
        case KOLO_FLOAT32: {
            static const uint32_t special[] = {0, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                               0x7f800001u, 0xffc12345u, 0x00000001u, 0x807fffffu,
                                               0x7f7fffffu};
            float v = (float)((int64_t)(r & 0xfffff) - 0x80000) / 1024.0f;
            uint32_t u = pick < KOLO_ARRAY_SIZE(special) && (r & 0x100000) ? special[pick] : fbits(v);
            memcpy((char *)buf + 4 * i, &u, 4);
            break;
        }
        case KOLO_FLOAT64: {
            static const uint64_t special[] = {0, 0x8000000000000000ull, 0x7ff0000000000000ull,
                                               0xfff0000000000000ull, 0x7ff8000000000000ull,
                                               0x7ff0000000000001ull, 0x0000000000000001ull};
            double v = (double)((int64_t)(r & 0xfffffff) - 0x8000000) / 4096.0;
            uint64_t u = pick < KOLO_ARRAY_SIZE(special) && (r & 0x10000000) ? special[pick] : dbits(v);
            memcpy((char *)buf + 8 * i, &u, 8);
            break;
        }
        case KOLO_FLOAT16: {
            static const uint16_t special[] = {0, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0x7c01,
                                               0xfd55, 0x0001, 0x83ff, 0x7bff};
            /* exponents 0..30 only (plus specials) so that sums and products also land in
             * the subnormal and overflow ranges */
            uint16_t h = (uint16_t)(r & 0xffff);
            if ((h & 0x7c00) == 0x7c00) h ^= 0x4000;
            if (pick < KOLO_ARRAY_SIZE(special) && (r & 0x10000)) h = special[pick];
            ((uint16_t *)buf)[i] = h;
            break;
        }
        case KOLO_BFLOAT16: {
            static const uint16_t special[] = {0, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0x7f81,
                                               0xffa5, 0x0001, 0x807f, 0x7f7f};
            /* exponent near 127 mostly, so that sums round; specials sometimes */
            uint16_t h = (uint16_t)(((r & 0x8000) | (0x3f00 + ((r >> 16) & 0x1ff)) | (r & 0x7f)) & 0xffff);
            if (pick < KOLO_ARRAY_SIZE(special) && (r & 0x10000)) h = special[pick];
            ((uint16_t *)buf)[i] = h;
            break;
        }
        case KOLO_BOOL: {
            static const uint8_t v[] = {0, 1, 0, 1, 2, 255, 0x80, 0};
            ((uint8_t *)buf)[i] = v[r % 8];
            break;
        }
        default: memcpy((char *)buf + esize(t) * i, &r, esize(t)); break;
        }
    }
}

/* ---- Tests ---- */

KT_TEST(reduce_op_valid, 5)
{
    for (int t = 0; t < KOLO_DTYPE_COUNT; t++)
        for (int o = 0; o < KOLO_OP_COUNT; o++)
            KT_EQ(kolo__op_valid((kolo_dtype_t)t, (kolo_op_t)o),
                  o == KOLO_ADASUM ? (t == KOLO_FLOAT16 || t == KOLO_BFLOAT16 || t == KOLO_FLOAT32 || t == KOLO_FLOAT64)
                                   : !(t == KOLO_BOOL && o == KOLO_AVERAGE));
    KT_ASSERT(!kolo__op_valid(KOLO_DTYPE_COUNT, KOLO_SUM));
    KT_ASSERT(!kolo__op_valid(KOLO_FLOAT32, KOLO_OP_COUNT));
    KT_ASSERT(!kolo__op_valid((kolo_dtype_t)-1, KOLO_SUM));
}

KT_TEST(reduce_isa_selection, 5)
{
    const char *best = kolo__reduce_isa();
    int known = 0;
    for (size_t i = 0; i < KOLO_ARRAY_SIZE(isas); i++) known += strcmp(best, isas[i]) == 0;
    KT_ASSERTF(known == 1, "unknown isa '%s'", best);
    KT_ASSERT(kolo__reduce_set_isa("generic"));
    KT_CONTAINS(kolo__reduce_isa(), "generic");
    KT_ASSERT(!kolo__reduce_set_isa("sse9"));
    KT_CONTAINS(kolo__reduce_isa(), "generic"); /* a failed switch changes nothing */
    KT_ASSERT(kolo__reduce_set_isa(NULL));
    KT_ASSERT(strcmp(kolo__reduce_isa(), best) == 0);
    int runs = 0;
    FOR_EACH_ISA(name) {
        KT_ASSERT(strcmp(kolo__reduce_isa(), name) == 0);
        runs++;
    }
    KT_ASSERT(runs >= 1);
    printf("  vector builds on this machine: %d, default %s\n", runs, best);
    /* avx512+f16c is the default exactly on AMD family 25 (Zen 4) without AVX512-FP16, with
     * +bf16 where it has AVX512-BF16, and a CPU with AVX2 and F16C never gets generic: read here
     * from /proc/cpuinfo rather than from CPUID as the library does */
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[4096];
        bool amd = false, fam25 = false, avx512 = false, fp16 = false, bf16 = false, avx2 = false;
        while (fgets(line, sizeof(line), f) && strncmp(line, "\n", 1) != 0) {
            if (strncmp(line, "vendor_id", 9) == 0) amd = strstr(line, "AuthenticAMD") != NULL;
            if (strncmp(line, "cpu family", 10) == 0) fam25 = strchr(line, ':') && atoi(strchr(line, ':') + 1) == 25;
            if (strncmp(line, "flags", 5) == 0) {
                avx512 = strstr(line, " avx512bw") && strstr(line, " avx512dq") && strstr(line, " avx512vl");
                fp16 = strstr(line, " avx512_fp16") != NULL;
                bf16 = strstr(line, " avx512_bf16") != NULL;
                avx2 = strstr(line, " avx2") && strstr(line, " f16c");
            }
        }
        fclose(f);
        bool zen4 = amd && fam25 && avx512 && !fp16;
        KT_ASSERTF(zen4 == (strncmp(best, "avx512+f16c", 11) == 0), "default %s on a CPU that is%s Zen 4", best,
                   zen4 ? "" : " not");
        KT_ASSERTF(!avx2 || strcmp(best, "generic") != 0, "default generic on a CPU with AVX2 and F16C");
        if (zen4)
            KT_ASSERTF(bf16 == (strcmp(best, "avx512+f16c+bf16") == 0), "default %s on a Zen 4 %s AVX512-BF16", best,
                       bf16 ? "with" : "without");
    }
}

/* Every float16 bit pattern: widening matches the reference; narrowing gives the pattern
 * back (a NaN comes back quiet); the bulk functions agree with the scalar ones. */
KT_TEST(reduce_f16_all_patterns, 10)
{
    static uint16_t h[65536], back[65536];
    static float f[65536];
    for (unsigned i = 0; i < 65536; i++) {
        h[i] = (uint16_t)i;
        uint32_t want = ref_h2f_bits((uint16_t)i);
        uint32_t got = fbits(kolo__f16_to_f32((uint16_t)i));
        KT_ASSERTF(got == want, "f16 %04x -> %08x, want %08x", i, got, want);
        bool nan = (i & 0x7fff) > 0x7c00;
        uint16_t rt = kolo__f32_to_f16(bitsf(got));
        KT_ASSERTF(rt == (nan ? (i | 0x200) : i), "f16 %04x round trip gives %04x", i, rt);
    }
    KT_EQ(fbits(kolo__f16_to_f32(0x3c00)), fbits(1.0f));
    KT_EQ(fbits(kolo__f16_to_f32(0x0001)), fbits(0x1p-24f));
    KT_EQ(fbits(kolo__f16_to_f32(0x7bff)), fbits(65504.0f));
    KT_EQ(fbits(kolo__f16_to_f32(0xfc00)), fbits(-INFINITY));
    FOR_EACH_ISA(name) {
        for (size_t len = 0; len <= 40; len += 13) { /* tails: no write past the end */
            float g[48];
            for (int k = 0; k < 48; k++) g[k] = -7.0f;
            kolo__f16_to_f32_n(g, h + 0x3c00, len);
            for (size_t k = 0; k < 48; k++)
                KT_ASSERT(k < len ? g[k] == kolo__f16_to_f32((uint16_t)(0x3c00 + k)) : g[k] == -7.0f);
        }
        kolo__f16_to_f32_n(f, h, 65536);
        for (unsigned i = 0; i < 65536; i++)
            KT_ASSERTF(fbits(f[i]) == ref_h2f_bits((uint16_t)i), "%s: f16 %04x -> %08x", name, i, fbits(f[i]));
        memset(back, 0, sizeof(back));
        kolo__f32_to_f16_n(back, f, 65536);
        for (unsigned i = 0; i < 65536; i++) {
            bool nan = (i & 0x7fff) > 0x7c00;
            KT_ASSERTF(back[i] == (nan ? (i | 0x200) : i), "%s: round trip %04x -> %04x", name, i, back[i]);
        }
    }
}

/* x86: flush-to-zero and denormals-are-zero on (1) or off (0), as a program (TensorFlow, say)
 * may leave them. float16 results must not depend on them. */
#if defined(__x86_64__) || defined(__i386__)
#define FTZ_MODES 2
static void set_ftz_daz(int on)
{
    unsigned csr = _mm_getcsr() & ~0x8040u; /* FTZ is bit 15, DAZ bit 6 */
    _mm_setcsr(on ? csr | 0x8040u : csr);
}
#else
#define FTZ_MODES 1
static void set_ftz_daz(int on) { (void)on; }
#endif

/* float16 SUM and PRODUCT of every float16 value with 40 others (specials, subnormals, both
 * ends of the range, random), against the exact result (in double, where sums and products of
 * two halves are exact) rounded once. The widening builds round twice (float32, then float16),
 * avx512+fp16 once in float16 itself: both must give these bits, with flush-to-zero and
 * denormals-are-zero off and on. NaN in gives NaN out. */
KT_TEST(reduce_f16_sum_product_rounded_once, 30)
{
    enum { NB = 40 };
    static uint16_t a[65536], b[65536], want[2][65536], got[65536];
    uint16_t bs[NB] = {0x0000, 0x8000, 0x3c00, 0xbc00, 0x0001, 0x8001, 0x03ff, 0x0400, 0x0401, 0x7bff,
                       0xfbff, 0x7c00, 0xfc00, 0x7e00, 0x3c01, 0x3bff, 0x1400, 0x5bff, 0x7800, 0x0200};
    rng_state = 0x5eed0f16u;
    for (int j = 20; j < NB; j++) bs[j] = (uint16_t)(rnd() & 0xffff);
    for (unsigned i = 0; i < 65536; i++) a[i] = (uint16_t)i;
    static const kolo_op_t ops[2] = {KOLO_SUM, KOLO_PRODUCT};
    for (int j = 0; j < NB; j++) {
        for (unsigned i = 0; i < 65536; i++) b[i] = bs[j];
        double y = (double)bitsf(ref_h2f_bits(bs[j])); /* infinities too */
        for (unsigned i = 0; i < 65536; i++) {
            double x = (double)bitsf(ref_h2f_bits((uint16_t)i));
            for (int o = 0; o < 2; o++) {
                double r = o ? x * y : x + y;
                bool nan = elem_is_nan(KOLO_FLOAT16, a, i) || elem_is_nan(KOLO_FLOAT16, b, i) || isnan(r);
                want[o][i] = nan ? 0x7e00 : ref_d2h(r);
            }
        }
        for (int ftz = 0; ftz < FTZ_MODES; ftz++) {
            set_ftz_daz(ftz);
            FOR_EACH_ISA(name) {
                for (int o = 0; o < 2; o++) {
                    kolo__reduce(got, a, b, 65536, KOLO_FLOAT16, ops[o]);
                    for (unsigned i = 0; i < 65536; i++) {
                        bool ok = want[o][i] == 0x7e00 ? elem_is_nan(KOLO_FLOAT16, got, i) : got[i] == want[o][i];
                        KT_ASSERTF(ok, "%s%s: %04x %s %04x gave %04x, want %04x", name, ftz ? " (FTZ+DAZ)" : "", i,
                                   o ? "*" : "+", bs[j], got[i], want[o][i]);
                    }
                }
            }
            set_ftz_daz(0);
        }
    }
}

/* Narrowing float32 -> float16 at every rounding boundary: each half's value, the exact
 * midpoint to the next half (ties go to the even mantissa), and one float32 ulp either
 * side of it; both signs; then a million random float32 bit patterns. */
KT_TEST(reduce_f16_rounding, 10)
{
    enum { N = 0x7c00 * 8 };
    static float in[N];
    static uint16_t want[N], got[N];
    size_t n = 0;
    for (unsigned h = 0; h < 0x7c00; h++) {
        double v = ref_h_value((uint16_t)h);
        double next = h == 0x7bff ? 65536.0 : ref_h_value((uint16_t)(h + 1));
        float mid = (float)((v + next) / 2); /* exact in float32 */
        float c[4] = {(float)v, mid, nextafterf(mid, 0), nextafterf(mid, INFINITY)};
        for (int k = 0; k < 4; k++) {
            in[n++] = c[k];
            in[n++] = -c[k];
        }
    }
    KT_EQ(n, N);
    for (size_t i = 0; i < n; i++) {
        want[i] = ref_f2h(in[i]);
        uint16_t s = kolo__f32_to_f16(in[i]);
        KT_ASSERTF(s == want[i], "f32 %08x (%a) -> %04x, want %04x", fbits(in[i]), (double)in[i], s, want[i]);
    }
    /* known answers, independent of the reference */
    KT_EQ(kolo__f32_to_f16(1.0f), 0x3c00);
    KT_EQ(kolo__f32_to_f16(1.0f + 0x1p-11f), 0x3c00);           /* tie, even stays */
    KT_EQ(kolo__f32_to_f16(1.0f + 0x1p-10f + 0x1p-11f), 0x3c02); /* tie, odd goes up */
    KT_EQ(kolo__f32_to_f16(65504.0f), 0x7bff);
    KT_EQ(kolo__f32_to_f16(65519.99f), 0x7bff);
    KT_EQ(kolo__f32_to_f16(65520.0f), 0x7c00); /* overflow to infinity */
    KT_EQ(kolo__f32_to_f16(-1e30f), 0xfc00);
    KT_EQ(kolo__f32_to_f16(0x1p-24f), 0x0001);
    KT_EQ(kolo__f32_to_f16(0x1p-25f), 0x0000);          /* tie with 0: even */
    KT_EQ(kolo__f32_to_f16(0x1.000002p-25f), 0x0001);
    KT_EQ(kolo__f32_to_f16(0x1.8p-24f), 0x0002);        /* 1.5 units: tie, to even 2 */
    KT_EQ(kolo__f32_to_f16(0x1.ffcp-15f), 0x0400);      /* 1023.5 units: up into the normals */
    KT_EQ(kolo__f32_to_f16(0x1.ff8p-15f), 0x03ff);      /* 1023 units: largest subnormal */
    KT_EQ(kolo__f32_to_f16(-0x1p-149f), 0x8000);        /* float32 subnormal: -0 */
    KT_EQ(kolo__f32_to_f16(bitsf(0x7f800001u)), 0x7e00); /* NaN stays NaN, never infinity */
    KT_EQ(kolo__f32_to_f16(bitsf(0x7fbfffffu)), 0x7fff);
    KT_EQ(kolo__f32_to_f16(bitsf(0xffc00000u)), 0xfe00);
    KT_EQ(kolo__f32_to_f16(INFINITY), 0x7c00);
    FOR_EACH_ISA(name) {
        memset(got, 0, sizeof(got));
        kolo__f32_to_f16_n(got, in, n);
        for (size_t i = 0; i < n; i++)
            KT_ASSERTF(got[i] == want[i], "%s: f32 %08x -> %04x, want %04x", name, fbits(in[i]), got[i], want[i]);
    }
    /* random bit patterns */
    rng_state = 0x1234567;
    enum { R = 1 << 20 };
    static float rin[R];
    static uint16_t rs[R], rv[R];
    for (size_t i = 0; i < R; i++) {
        uint32_t u = (uint32_t)rnd();
        if (i & 1) u = (u & 0x8fffffffu) | 0x30000000u; /* half the patterns near float16's range */
        rin[i] = bitsf(u);
        rs[i] = kolo__f32_to_f16(rin[i]);
        uint16_t w = ref_f2h(rin[i]);
        KT_ASSERTF(rs[i] == w, "f32 %08x -> %04x, want %04x", u, rs[i], w);
    }
    FOR_EACH_ISA(name) {
        kolo__f32_to_f16_n(rv, rin, R);
        KT_ASSERTF(memcmp(rv, rs, sizeof(rs)) == 0, "%s: bulk f32 -> f16 differs from scalar", name);
    }
}

KT_TEST(reduce_bf16_conversions, 10)
{
    static uint16_t h[65536], back[65536];
    static float f[65536];
    for (unsigned i = 0; i < 65536; i++) {
        h[i] = (uint16_t)i;
        KT_EQ(fbits(kolo__bf16_to_f32((uint16_t)i)), (uint32_t)i << 16);
        bool nan = (i & 0x7fff) > 0x7f80;
        uint16_t rt = kolo__f32_to_bf16(kolo__bf16_to_f32((uint16_t)i));
        KT_ASSERTF(rt == (nan ? (i | 0x40) : i), "bf16 %04x round trip gives %04x", i, rt);
    }
    KT_EQ(kolo__f32_to_bf16(bitsf(0x3f808000u)), 0x3f80); /* tie, even stays */
    KT_EQ(kolo__f32_to_bf16(bitsf(0x3f818000u)), 0x3f82); /* tie, odd goes up */
    KT_EQ(kolo__f32_to_bf16(bitsf(0x3f808001u)), 0x3f81);
    KT_EQ(kolo__f32_to_bf16(bitsf(0x7f7fffffu)), 0x7f80); /* FLT_MAX overflows to infinity */
    KT_EQ(kolo__f32_to_bf16(bitsf(0xff7f8000u)), 0xff80);
    KT_EQ(kolo__f32_to_bf16(bitsf(0x7f800001u)), 0x7fc0); /* NaN stays NaN */
    KT_EQ(kolo__f32_to_bf16(bitsf(0xffffffffu)), 0xffff); /* and does not carry into the sign */
    KT_EQ(kolo__f32_to_bf16(bitsf(0x00008000u)), 0x0000); /* subnormal tie to even */
    KT_EQ(kolo__f32_to_bf16(bitsf(0x00018000u)), 0x0002);
    enum { R = 1 << 20 };
    static float rin[R];
    static uint16_t rs[R], rv[R];
    rng_state = 0xbf16;
    for (size_t i = 0; i < R; i++) {
        uint32_t u = (uint32_t)rnd();
        if (i % 4 == 1) u = (u & 0xffff0000u) | 0x8000u; /* exact ties */
        if (i % 4 == 2) u |= 0x7f800000u;                 /* infinities and NaNs */
        rin[i] = bitsf(u);
        rs[i] = kolo__f32_to_bf16(rin[i]);
        uint16_t w = ref_f2bf(rin[i]);
        KT_ASSERTF(rs[i] == w, "f32 %08x -> bf16 %04x, want %04x", u, rs[i], w);
    }
    FOR_EACH_ISA(name) {
        kolo__bf16_to_f32_n(f, h, 65536);
        for (unsigned i = 0; i < 65536; i++) KT_EQ(fbits(f[i]), (uint32_t)i << 16);
        kolo__f32_to_bf16_n(back, f, 65536);
        for (unsigned i = 0; i < 65536; i++) {
            bool nan = (i & 0x7fff) > 0x7f80;
            KT_ASSERTF(back[i] == (nan ? (i | 0x40) : i), "%s: bf16 round trip %04x -> %04x", name, i, back[i]);
        }
        kolo__f32_to_bf16_n(rv, rin, R - 5); /* odd length: the tail too */
        KT_ASSERTF(memcmp(rv, rs, (R - 5) * 2) == 0, "%s: bulk f32 -> bf16 differs from scalar", name);
    }
}

/* Every dtype x op, against ref_elem, at lengths that hit every tail and the unrolled
 * body, misaligned, with dst separate, dst == a, dst == b and dst == a == b, checking
 * that nothing past the end is written. */
KT_TEST(reduce_all_dtypes_ops, 20)
{
    static const size_t lens[] = {0, 1, 2, 7, 15, 33, 64, 127, 1003, 4099};
    enum { MAXN = 4099, PAD = 64 };
    static unsigned char a[(MAXN + PAD) * 8], b[(MAXN + PAD) * 8], d[(MAXN + PAD) * 8];
    static unsigned char want[(MAXN + PAD) * 8], a0[(MAXN + PAD) * 8], b0[(MAXN + PAD) * 8];
    long checked = 0;
    FOR_EACH_ISA(name) {
        rng_state = 0xfeedbeef;
        for (int t = 0; t < KOLO_DTYPE_COUNT; t++)
            for (int o = 0; o < KOLO_OP_COUNT; o++) {
                kolo_dtype_t dt = (kolo_dtype_t)t;
                kolo_op_t op = (kolo_op_t)o;
                if (!kolo__op_valid(dt, op) || op == KOLO_ADASUM) continue; /* adasum: test_adasum.c */
                size_t es = esize(dt);
                for (size_t li = 0; li < KOLO_ARRAY_SIZE(lens); li++)
                    for (int alias = 0; alias < 4; alias++) {
                        size_t n = lens[li], off = es * (1 + li % 3); /* misaligned starts */
                        fill(dt, a0, n + 1);
                        fill(dt, b0, n + 1);
                        if (alias == 3) memcpy(b0, a0, (n + 1) * es);
                        for (size_t i = 0; i < n; i++) ref_elem(dt, op, a0, b0, i, want);
                        memset(a, 0xa5, sizeof(a));
                        memset(b, 0x5a, sizeof(b));
                        memset(d, 0x3c, sizeof(d));
                        memcpy(a + off, a0, n * es);
                        memcpy(b + off, b0, n * es);
                        unsigned char *pa = a + off, *pb = b + off, *pd = d + off;
                        if (alias == 1) pd = pa;
                        if (alias == 2) pd = pb;
                        if (alias == 3) pd = pb = pa;
                        kolo__reduce(pd, pa, pb, n, dt, op);
                        for (size_t i = 0; i < n; i++) {
                            const unsigned char *g = pd + i * es, *w = want + i * es;
                            if (memcmp(g, w, es) == 0) continue;
                            /* which NaN a sum or product of two NaNs keeps is not specified */
                            bool arith = op == KOLO_SUM || op == KOLO_AVERAGE || op == KOLO_PRODUCT;
                            if (arith && elem_is_nan(dt, pd, i) && elem_is_nan(dt, want, i)) continue;
                            unsigned long long gv = 0, wv = 0, av = 0, bv = 0;
                            memcpy(&gv, g, es);
                            memcpy(&wv, w, es);
                            memcpy(&av, a0 + i * es, es);
                            memcpy(&bv, b0 + i * es, es);
                            kt_fail(__FILE__, __LINE__,
                                    "%s: %s %s n=%zu alias=%d [%zu]: %llx op %llx = %llx, want %llx", name,
                                    kolo_dtype_name(dt), kolo_op_name(op), n, alias, i, av, bv, gv, wv);
                        }
                        /* nothing outside [off, off + n) changed */
                        unsigned char *buf = alias == 0 ? d : alias == 2 ? b : a;
                        unsigned char fillc = alias == 0 ? 0x3c : alias == 2 ? 0x5a : 0xa5;
                        for (size_t k = 0; k < off; k++) KT_EQ(buf[k], fillc);
                        for (size_t k = off + n * es; k < off + n * es + PAD; k++) KT_EQ(buf[k], fillc);
                        /* the inputs that are not dst are untouched */
                        if (alias != 1 && alias != 3) KT_ASSERT(memcmp(pa, a0, n * es) == 0);
                        if (alias != 2 && alias != 3) KT_ASSERT(memcmp(pb, b0, n * es) == 0);
                        checked += (long)n;
                    }
            }
    }
    KT_ASSERT(checked > 0);
}

/* Known answers that do not depend on the reference code above. */
KT_TEST(reduce_known_values, 5)
{
    FOR_EACH_ISA(name) {
        /* float16: 1+1, overflow at the 65520 tie, subnormal sum, ties to even, NaN */
        uint16_t ha[6] = {0x3c00, 0x7bff, 0x0001, 0x3c00, 0x3c01, 0x7e00};
        uint16_t hb[6] = {0x3c00, 0x4c00, 0x0001, 0x1000, 0x1000, 0x3c00};
        uint16_t hw[6] = {0x4000, 0x7c00, 0x0002, 0x3c00, 0x3c02, 0x7e00};
        uint16_t hd[6];
        kolo__reduce(hd, ha, hb, 6, KOLO_FLOAT16, KOLO_SUM);
        for (int i = 0; i < 6; i++) KT_ASSERTF(hd[i] == hw[i], "%s f16 [%d] %04x want %04x", name, i, hd[i], hw[i]);
        /* 65504 + 15 stays finite */
        uint16_t h15 = 0x4b80, hr;
        kolo__reduce(&hr, &ha[1], &h15, 1, KOLO_FLOAT16, KOLO_SUM);
        KT_EQ(hr, 0x7bff);
        /* min/max: NaN propagates from either side; -0 vs +0 gives b */
        uint16_t ma[4] = {0x7e01, 0x3c00, 0x8000, 0x0000}, mb[4] = {0x3c00, 0xfe02, 0x0000, 0x8000};
        kolo__reduce(hd, ma, mb, 4, KOLO_FLOAT16, KOLO_MIN);
        KT_EQ(hd[0], 0x7e01);
        KT_EQ(hd[1], 0xfe02);
        KT_EQ(hd[2], 0x0000);
        KT_EQ(hd[3], 0x8000);
        /* bfloat16: 1 + 2^-8 is a tie (stays 1), 1+2^-7 + 2^-8 goes up */
        uint16_t ba[2] = {0x3f80, 0x3f81}, bb[2] = {0x3b80, 0x3b80};
        kolo__reduce(hd, ba, bb, 2, KOLO_BFLOAT16, KOLO_SUM);
        KT_EQ(hd[0], 0x3f80);
        KT_EQ(hd[1], 0x3f82);
        /* float32 NaN handling in min/max */
        float fa[3] = {NAN, 1.0f, 2.0f}, fb[3] = {1.0f, NAN, 3.0f}, fd[3];
        kolo__reduce(fd, fa, fb, 3, KOLO_FLOAT32, KOLO_MAX);
        KT_ASSERT(isnan(fd[0]) && isnan(fd[1]) && fd[2] == 3.0f);
        /* integer wrap-around */
        int8_t ia[3] = {127, -128, 100}, ib[3] = {1, -1, 3}, id[3];
        kolo__reduce(id, ia, ib, 3, KOLO_INT8, KOLO_SUM);
        KT_EQ(id[0], -128);
        KT_EQ(id[1], 127);
        KT_EQ(id[2], 103);
        kolo__reduce(id, ia, ib, 3, KOLO_INT8, KOLO_PRODUCT);
        KT_EQ(id[0], 127);
        KT_EQ(id[1], -128);
        KT_EQ(id[2], 44); /* 300 mod 256 */
        uint16_t ua = 65535, ub = 65535, ud;
        kolo__reduce(&ud, &ua, &ub, 1, KOLO_UINT16, KOLO_PRODUCT);
        KT_EQ(ud, 1);
        int64_t la[2] = {INT64_MAX, INT64_MIN}, lb[2] = {INT64_MIN, 2}, ld[2];
        kolo__reduce(ld, la, lb, 2, KOLO_INT64, KOLO_MIN);
        KT_ASSERT(ld[0] == INT64_MIN && ld[1] == INT64_MIN);
        kolo__reduce(ld, la, lb, 2, KOLO_INT64, KOLO_SUM);
        KT_ASSERT(ld[0] == -1 && ld[1] == INT64_MIN + 2);
    }
}

/* BOOL: SUM and MAX are OR, MIN and PRODUCT are AND; any non-zero byte is true; the
 * result is always 0 or 1. */
KT_TEST(reduce_bool, 5)
{
    FOR_EACH_ISA(name) {
        uint8_t a[40], b[40], d[40];
        static const uint8_t v[5] = {0, 1, 2, 0x80, 0xff};
        for (int i = 0; i < 40; i++) {
            a[i] = v[i % 5];
            b[i] = v[(i / 5) % 5];
        }
        static const kolo_op_t ops[4] = {KOLO_SUM, KOLO_MAX, KOLO_MIN, KOLO_PRODUCT};
        for (int k = 0; k < 4; k++) {
            kolo__reduce(d, a, b, 40, KOLO_BOOL, ops[k]);
            for (int i = 0; i < 40; i++) {
                int x = a[i] != 0, y = b[i] != 0;
                int w = k < 2 ? (x || y) : (x && y);
                KT_ASSERTF(d[i] == w, "%s %s %u,%u -> %u", name, kolo_op_name(ops[k]), a[i], b[i], d[i]);
            }
        }
    }
}

/* A big buffer gives the same bits on every build (the main loop, not only tails). */
KT_TEST(reduce_builds_agree_on_big_buffers, 10)
{
    enum { N = (1 << 20) + 13 };
    static float a[N], b[N], d[N], first[N];
    static uint16_t ha[N], hb[N], hd[N], hfirst[N], ba[N], bb[N], bd[N], bfirst[N];
    rng_state = 42;
    fill(KOLO_FLOAT32, a, N);
    fill(KOLO_FLOAT32, b, N);
    fill(KOLO_FLOAT16, ha, N);
    fill(KOLO_FLOAT16, hb, N);
    fill(KOLO_BFLOAT16, ba, N);
    fill(KOLO_BFLOAT16, bb, N);
    int runs = 0;
    FOR_EACH_ISA(name) {
        kolo__reduce(d, a, b, N, KOLO_FLOAT32, KOLO_PRODUCT);
        kolo__reduce(hd, ha, hb, N, KOLO_FLOAT16, KOLO_SUM);
        kolo__reduce(bd, ba, bb, N, KOLO_BFLOAT16, KOLO_SUM);
        if (runs++ == 0) {
            memcpy(first, d, sizeof(d));
            memcpy(hfirst, hd, sizeof(hd));
            memcpy(bfirst, bd, sizeof(bd));
            continue;
        }
        for (size_t i = 0; i < N; i++) {
            KT_ASSERTF(fbits(d[i]) == fbits(first[i]) || (isnan(d[i]) && isnan(first[i])), "%s f32 [%zu]", name, i);
            KT_ASSERTF(hd[i] == hfirst[i] || ((hd[i] & 0x7fff) > 0x7c00 && (hfirst[i] & 0x7fff) > 0x7c00),
                       "%s f16 [%zu]: %04x vs %04x", name, i, hd[i], hfirst[i]);
            KT_ASSERTF(bd[i] == bfirst[i] || ((bd[i] & 0x7fff) > 0x7f80 && (bfirst[i] & 0x7fff) > 0x7f80),
                       "%s bf16 [%zu]: %04x vs %04x", name, i, bd[i], bfirst[i]);
        }
    }
}

/* Floating scale: own precision, every build, tails, in place; 1.0 copies bits exactly. */
KT_TEST(reduce_scale_float, 10)
{
    enum { N = 1003 };
    static float f[N], fd[N];
    static double g[N], gd[N];
    static uint16_t h[N], hd[N], bh[N], bd[N];
    rng_state = 7;
    fill(KOLO_FLOAT32, f, N);
    fill(KOLO_FLOAT64, g, N);
    fill(KOLO_FLOAT16, h, N);
    fill(KOLO_BFLOAT16, bh, N);
    static const double factors[] = {0.5, 0.1, -3.0, 1e-30, 1e30, 1.0 / 3};
    FOR_EACH_ISA(name) {
        for (size_t k = 0; k < KOLO_ARRAY_SIZE(factors); k++) {
            double fac = factors[k];
            float ff = (float)fac;
            size_t n = N - k; /* different tails */
            kolo__scale(fd, f, n, KOLO_FLOAT32, fac);
            kolo__scale(gd, g, n, KOLO_FLOAT64, fac);
            kolo__scale(hd, h, n, KOLO_FLOAT16, fac);
            kolo__scale(bd, bh, n, KOLO_BFLOAT16, fac);
            for (size_t i = 0; i < n; i++) {
                float wf = f[i] * ff;
                double wg = g[i] * fac;
                uint16_t wh = ref_f2h(bitsf(ref_h2f_bits(h[i])) * ff);
                uint16_t wb = ref_f2bf(ref_bf2f(bh[i]) * ff);
                KT_ASSERTF(fbits(fd[i]) == fbits(wf) || (isnan(fd[i]) && isnan(wf)), "%s f32 [%zu]", name, i);
                KT_ASSERTF(dbits(gd[i]) == dbits(wg) || (isnan(gd[i]) && isnan(wg)), "%s f64 [%zu]", name, i);
                KT_ASSERTF(hd[i] == wh, "%s f16 %04x * %g = %04x, want %04x", name, h[i], fac, hd[i], wh);
                KT_ASSERTF(bd[i] == wb, "%s bf16 %04x * %g = %04x, want %04x", name, bh[i], fac, bd[i], wb);
            }
        }
        /* in place */
        memcpy(hd, h, sizeof(h));
        kolo__scale(hd, hd, N, KOLO_FLOAT16, 0.25);
        for (size_t i = 0; i < N; i++) KT_EQ(hd[i], ref_f2h(bitsf(ref_h2f_bits(h[i])) * 0.25f));
        /* 1.0 is a copy: signaling NaNs and payloads survive, in place nothing changes */
        uint16_t snan[3] = {0x7c01, 0xfd55, 0x7f81}, out[3] = {0};
        kolo__scale(out, snan, 3, KOLO_FLOAT16, 1.0);
        KT_ASSERT(memcmp(out, snan, sizeof(out)) == 0);
        kolo__scale(out, snan, 3, KOLO_BFLOAT16, 1.0);
        KT_ASSERT(memcmp(out, snan, sizeof(out)) == 0);
        uint32_t fsnan = 0x7f800001u, fo = 0;
        kolo__scale(&fo, &fsnan, 1, KOLO_FLOAT32, 1.0);
        KT_EQ(fo, 0x7f800001u);
        kolo__scale(&fsnan, &fsnan, 1, KOLO_FLOAT32, 1.0);
        KT_EQ(fsnan, 0x7f800001u);
    }
}

/* kolo__reduce_scale gives what the two passes give, bit for bit (a NaN may keep either payload),
 * for every floating type and build, at every tail, in place on either input and with
 * flush-to-zero on; other ops and types take the two passes. The half types round the sum before
 * the multiply, as a stored sum is rounded. */
KT_TEST(reduce_scale_fused_matches_two_passes, 20)
{
    enum { N = 1003 };
    static const kolo_dtype_t types[] = {KOLO_FLOAT16, KOLO_BFLOAT16, KOLO_FLOAT32, KOLO_FLOAT64};
    static const double factors[] = {0.5, 1.0 / 3, -3.0, 1e-30, 1e30, 1.0};
    static uint64_t a[N], b[N], want[N], got[N];
    FOR_EACH_ISA(name) {
        for (int ftz = 0; ftz < FTZ_MODES; ftz++) {
            set_ftz_daz(ftz);
            for (size_t ti = 0; ti < KOLO_ARRAY_SIZE(types); ti++) {
                kolo_dtype_t t = types[ti];
                size_t es = esize(t);
                rng_state = 11 + (uint64_t)ti;
                fill(t, a, N);
                fill(t, b, N);
                for (size_t k = 0; k < KOLO_ARRAY_SIZE(factors); k++) {
                    for (int o = 0; o < 2; o++) {
                        kolo_op_t op = o ? KOLO_AVERAGE : KOLO_SUM;
                        for (int where = 0; where < 3; where++) { /* apart, onto a, onto b */
                            size_t n = N - 3 * k - (size_t)where;
                            kolo__reduce(want, a, b, n, t, op);
                            kolo__scale(want, want, n, t, factors[k]);
                            const void *x = a, *y = b;
                            if (where) {
                                memcpy(got, where == 1 ? a : b, n * es);
                                if (where == 1) x = got;
                                else y = got;
                            }
                            kolo__reduce_scale(got, x, y, n, t, op, factors[k]);
                            for (size_t i = 0; i < n; i++) {
                                bool same = memcmp((char *)got + i * es, (char *)want + i * es, es) == 0;
                                KT_ASSERTF(same || (elem_is_nan(t, got, i) && elem_is_nan(t, want, i)),
                                           "%s %s %s * %g (%s, ftz %d): element %zu differs", name,
                                           kolo_dtype_name(t), kolo_op_name(op), factors[k],
                                           where ? (where == 1 ? "onto a" : "onto b") : "apart", ftz, i);
                            }
                        }
                    }
                }
            }
            set_ftz_daz(0);
        }
        /* the sum rounds first: 1 + 2^-11 is a tie that float16 rounds to 1, so 3, where the
         * unrounded sum times 3 would round up to 3.002; bfloat16's 1 + 2^-8 likewise */
        uint16_t h[2] = {0x3c00, 0x1000}, r = 0;
        kolo__reduce_scale(&r, &h[0], &h[1], 1, KOLO_FLOAT16, KOLO_SUM, 3.0);
        KT_EQ(r, 0x4200);
        uint16_t bf[2] = {0x3f80, 0x3b80};
        kolo__reduce_scale(&r, &bf[0], &bf[1], 1, KOLO_BFLOAT16, KOLO_AVERAGE, 3.0);
        KT_EQ(r, 0x4040);
        /* other ops and types: the two passes */
        float fa[3] = {1, -2, 5}, fb[3] = {4, -1, 3}, fr[3];
        kolo__reduce_scale(fr, fa, fb, 3, KOLO_FLOAT32, KOLO_MAX, 0.5);
        KT_ASSERT(fr[0] == 2 && fr[1] == -0.5f && fr[2] == 2.5f);
        int32_t ia[2] = {7, -7}, ib[2] = {2, 2}, ir[2];
        kolo__reduce_scale(ir, ia, ib, 2, KOLO_INT32, KOLO_SUM, 0.5);
        KT_ASSERT(ir[0] == 4 && ir[1] == -2);
    }
    KT_ASSERT(kolo__reduce_set_isa(NULL));
}

/* Integer scale: (double)v * factor truncated toward zero, saturating at the type's range. */
KT_TEST(reduce_scale_int_saturates, 5)
{
    int8_t i8[7] = {100, -100, 127, -128, 3, -3, 0}, o8[7];
    kolo__scale(o8, i8, 7, KOLO_INT8, 2.0);
    static const int8_t w8a[7] = {127, -128, 127, -128, 6, -6, 0};
    KT_ASSERT(memcmp(o8, w8a, 7) == 0);
    kolo__scale(o8, i8, 7, KOLO_INT8, -1.5);
    static const int8_t w8b[7] = {-128, 127, -128, 127, -4, 4, 0};
    KT_ASSERT(memcmp(o8, w8b, 7) == 0);
    kolo__scale(o8, i8, 7, KOLO_INT8, 0.5); /* 1.5 -> 1, -1.5 -> -1: toward zero */
    static const int8_t w8c[7] = {50, -50, 63, -64, 1, -1, 0};
    KT_ASSERT(memcmp(o8, w8c, 7) == 0);

    uint8_t u8[3] = {200, 255, 7}, p8[3];
    kolo__scale(p8, u8, 3, KOLO_UINT8, 2.0);
    KT_ASSERT(p8[0] == 255 && p8[1] == 255 && p8[2] == 14);
    kolo__scale(p8, u8, 3, KOLO_UINT8, -1.0);
    KT_ASSERT(p8[0] == 0 && p8[1] == 0 && p8[2] == 0);
    kolo__scale(p8, u8, 3, KOLO_UINT8, 0.999);
    KT_ASSERT(p8[0] == 199 && p8[1] == 254 && p8[2] == 6);

    uint16_t u16 = 40000, p16;
    kolo__scale(&p16, &u16, 1, KOLO_UINT16, 2.0);
    KT_EQ(p16, 65535);
    int16_t i16 = -20000, o16;
    kolo__scale(&o16, &i16, 1, KOLO_INT16, 2.0);
    KT_EQ(o16, -32768);

    int32_t i32[4] = {2000000000, -2000000000, 7, -7}, o32[4];
    kolo__scale(o32, i32, 4, KOLO_INT32, 2.0);
    KT_ASSERT(o32[0] == INT32_MAX && o32[1] == INT32_MIN && o32[2] == 14 && o32[3] == -14);
    kolo__scale(o32, i32, 4, KOLO_INT32, -0.5);
    KT_ASSERT(o32[0] == -1000000000 && o32[1] == 1000000000 && o32[2] == -3 && o32[3] == 3);
    kolo__scale(o32, i32, 4, KOLO_INT32, NAN);
    KT_ASSERT(o32[0] == 0 && o32[3] == 0);
    kolo__scale(o32, i32, 4, KOLO_INT32, INFINITY);
    KT_ASSERT(o32[0] == INT32_MAX && o32[1] == INT32_MIN);

    int64_t i64[5] = {INT64_MAX, INT64_MIN, INT64_C(1) << 62, -(INT64_C(1) << 62), 0}, o64[5];
    kolo__scale(o64, i64, 5, KOLO_INT64, 2.0);
    KT_ASSERT(o64[0] == INT64_MAX && o64[1] == INT64_MIN && o64[2] == INT64_MAX && o64[3] == INT64_MIN && o64[4] == 0);
    kolo__scale(o64, i64, 5, KOLO_INT64, 1.5);
    KT_ASSERT(o64[2] == INT64_C(0x6000000000000000) && o64[3] == -INT64_C(0x6000000000000000));
    kolo__scale(o64, i64, 5, KOLO_INT64, INFINITY); /* 0 * inf is NaN: 0 */
    KT_ASSERT(o64[0] == INT64_MAX && o64[1] == INT64_MIN && o64[4] == 0);

    /* 1.0 copies: no trip through double for int64 */
    int64_t big[2] = {(INT64_C(1) << 53) + 1, INT64_MAX - 1}, cb[2];
    kolo__scale(cb, big, 2, KOLO_INT64, 1.0);
    KT_ASSERT(cb[0] == big[0] && cb[1] == big[1]);
    kolo__scale(big, big, 2, KOLO_INT64, 1.0);
    KT_ASSERT(big[0] == (INT64_C(1) << 53) + 1);

    /* BOOL is left alone by any factor */
    uint8_t bo[3] = {0, 1, 1}, bd[3] = {9, 9, 9};
    kolo__scale(bd, bo, 3, KOLO_BOOL, 0.0);
    KT_ASSERT(bd[0] == 0 && bd[1] == 1 && bd[2] == 1);

    /* in place, with a length that is not a multiple of anything */
    int16_t ip[1001];
    for (int i = 0; i < 1001; i++) ip[i] = (int16_t)(i * 37 - 18000);
    kolo__scale(ip, ip, 1001, KOLO_INT16, 3.0);
    for (int i = 0; i < 1001; i++) {
        double w = (i * 37 - 18000) * 3.0;
        int16_t want = w >= 32767 ? 32767 : w <= -32768 ? -32768 : (int16_t)w;
        KT_EQ(ip[i], want);
    }
}

/* Integer divide is C's truncating division, exactly (int64 without double). */
KT_TEST(reduce_divide, 5)
{
    int64_t l[6] = {INT64_MAX, INT64_MIN, ((INT64_C(1) << 53) + 1) * 3, -7, 7, -(INT64_C(1) << 62) - 1};
    int64_t lw[6];
    for (int i = 0; i < 6; i++) lw[i] = l[i] / 3;
    kolo__divide(l, 6, KOLO_INT64, 3);
    for (int i = 0; i < 6; i++) KT_ASSERTF(l[i] == lw[i], "[%d] %lld want %lld", i, (long long)l[i], (long long)lw[i]);
    KT_EQ(l[0], INT64_C(3074457345618258602));
    KT_EQ(l[2], (INT64_C(1) << 53) + 1);
    KT_EQ(l[3], -2);

    rng_state = 99;
    for (int t = KOLO_UINT8; t <= KOLO_INT64; t++) {
        kolo_dtype_t dt = (kolo_dtype_t)t;
        unsigned char buf[1003 * 8], orig[1003 * 8];
        fill(dt, orig, 1003);
        for (int n = 1; n <= 9; n += 4) {
            memcpy(buf, orig, sizeof(buf));
            kolo__divide(buf, 1003, dt, n);
            for (size_t i = 0; i < 1003; i++) {
                long long v = 0, got = 0;
                switch (dt) {
                case KOLO_UINT8: v = orig[i]; got = buf[i]; break;
                case KOLO_INT8: v = ((int8_t *)orig)[i]; got = ((int8_t *)buf)[i]; break;
                case KOLO_UINT16: v = ((uint16_t *)orig)[i]; got = ((uint16_t *)buf)[i]; break;
                case KOLO_INT16: v = ((int16_t *)orig)[i]; got = ((int16_t *)buf)[i]; break;
                case KOLO_INT32: v = ((int32_t *)orig)[i]; got = ((int32_t *)buf)[i]; break;
                default: v = ((int64_t *)orig)[i]; got = ((int64_t *)buf)[i]; break;
                }
                KT_ASSERTF(got == v / n, "%s %lld / %d = %lld", kolo_dtype_name(dt), v, n, got);
            }
        }
    }
    /* floats multiply by 1/n; bool is unchanged */
    FOR_EACH_ISA(name) {
        float f[5] = {1, 2, 3, -8, 0.5f};
        kolo__divide(f, 5, KOLO_FLOAT32, 4);
        KT_ASSERT(f[0] == 0.25f && f[1] == 0.5f && f[2] == 0.75f && f[3] == -2 && f[4] == 0.125f);
        uint16_t h[3] = {0x4400, 0xc000, 0x3c00}; /* 4, -2, 1 */
        kolo__divide(h, 3, KOLO_FLOAT16, 2);
        KT_ASSERT(h[0] == 0x4000 && h[1] == 0xbc00 && h[2] == 0x3800);
        uint16_t bh[2] = {0x4080, 0x3f80}; /* 4, 1 */
        kolo__divide(bh, 2, KOLO_BFLOAT16, 4);
        KT_ASSERT(bh[0] == 0x3f80 && bh[1] == 0x3e80);
        double g[2] = {3, -9};
        kolo__divide(g, 2, KOLO_FLOAT64, 3);
        KT_ASSERT(g[0] == 3 * (1.0 / 3) && g[1] == -9 * (1.0 / 3));
    }
    uint8_t b[3] = {0, 1, 1};
    kolo__divide(b, 3, KOLO_BOOL, 2);
    KT_ASSERT(b[0] == 0 && b[1] == 1 && b[2] == 1);
    int32_t one[2] = {-5, 5};
    kolo__divide(one, 2, KOLO_INT32, 1);
    KT_ASSERT(one[0] == -5 && one[1] == 5);
}

/* kolo__copy in every build: for destinations 0-130 bytes past the source modulo 4096 (1-63 take
 * the vector loop from 2 KiB) and lengths around the loop's threshold and its 64-byte steps, the
 * bytes are memcpy's and nothing outside the destination is touched. */
KT_TEST(reduce_copy_every_distance, 20)
{
    enum { MAX = 9000, PAD = 64, SPAN = 2 * 4096 + MAX + 3 * PAD };
    static unsigned char arena[2 * SPAN], want[SPAN];
    unsigned char *src = arena, *dst = arena + SPAN; /* SPAN is not a multiple of 4096: every distance occurs */
    rng_state = 91;
    for (size_t i = 0; i < SPAN; i++) src[i] = (unsigned char)rnd();
    static const size_t lens[] = {1, 63, 2047, 2048, 2049, 2111, 4096, MAX};
    FOR_EACH_ISA(isa) {
        for (size_t past = 0; past <= 130; past += past < 70 ? 1 : 20)
            for (size_t li = 0; li < KOLO_ARRAY_SIZE(lens); li++) {
                size_t n = lens[li], so = (size_t)rnd() % 64;
                /* the destination's offset in dst with (dst + d) - (src + so) = past modulo 4096 */
                size_t d = (so + past + 2 * 4096 - PAD - ((uintptr_t)dst - (uintptr_t)src) % 4096) % 4096 + PAD;
                KT_EQ(((uintptr_t)(dst + d) - (uintptr_t)(src + so)) % 4096, past);
                memset(dst, 0xA5, SPAN);
                memcpy(want, dst, SPAN);
                memcpy(want + d, src + so, n);
                kolo__copy(dst + d, src + so, n);
                KT_ASSERTF(memcmp(dst, want, SPAN) == 0, "%s: copy of %zu bytes, destination %zu past the source, differs",
                           isa, n, past);
            }
    }
    KT_ASSERT(kolo__reduce_set_isa(NULL));
}

/* The streamed copy of every build: any alignment of either end and any length gives memcpy's
 * bytes, and nothing outside the destination is touched. */
KT_TEST(reduce_stream_copy_every_alignment, 10)
{
    enum { MAX = 1000, PAD = 64 };
    static unsigned char src[MAX + PAD], dst[MAX + 2 * PAD], want[MAX + 2 * PAD];
    rng_state = 77;
    for (size_t i = 0; i < sizeof src; i++) src[i] = (unsigned char)rnd();
    static const size_t lens[] = {0, 1, 15, 63, 64, 65, 127, 128, 200, 511, 777, MAX};
    FOR_EACH_ISA(isa) {
        for (size_t so = 0; so < 64; so += 7)
            for (size_t dof = 0; dof < 64; dof += 5)
                for (size_t li = 0; li < KOLO_ARRAY_SIZE(lens); li++) {
                    size_t n = lens[li];
                    memset(dst, 0xA5, sizeof dst);
                    memcpy(want, dst, sizeof dst);
                    memcpy(want + PAD + dof, src + so, n);
                    kolo__stream_copy(dst + PAD + dof, src + so, n);
                    kolo__stream_fence();
                    KT_ASSERTF(memcmp(dst, want, sizeof dst) == 0,
                               "%s: stream copy of %zu bytes from offset %zu to %zu differs", isa, n, so, dof);
                }
    }
    KT_ASSERT(kolo__reduce_set_isa(NULL));
}

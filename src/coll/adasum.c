/* adasum.c - Adasum: adaptive summation of the members' gradients (Maleki et al., 2021).
 *
 * Two vectors combine as a (+) b = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b: their sum
 * when they are orthogonal, their average when they are equal, something between otherwise (a
 * zero vector, whose coefficient is taken as 1, is the neutral element). The operation is not
 * associative, so the order of combination is part of the result: a binary tree over the members,
 * the same on every host and every run.
 *
 * The tree runs as vector-halving, distance-doubling (the shape Horovod's MPI Adasum has):
 * at level l (distance d = 2^l) members v and v ^ d hold the same range of their two subtrees'
 * results; the lower keeps the first half of the range and sends the second, the higher the
 * reverse, so each combines the half it kept. The coefficients need the dot products over whole
 * tensors, whose pieces now lie on the 2d members of the block (v >> (l + 1) alike): each member
 * computes a.b, |a|^2, |b|^2 of its piece per tensor (in double), and the block sums them by
 * recursive doubling (x + y is exactly y + x, so every member of the block gets the same bits and
 * uses the same coefficients). After log2(n) levels every member holds 1/n of the result, and the
 * levels run backwards with doubling ranges to give everyone all of it: each element was computed
 * once, on one member, so all members hold the same bits. Bytes moved per member: the buffer's
 * size each way, as in the ring. Members beyond the largest power of two p2 first hand their
 * buffer to a partner (2i to 2i + 1, i < n - p2), which combines the two (2i's as a) and takes
 * part; it hands the result back at the end. Horovod refuses such counts.
 *
 * Buffers of at most KOLO_SMALL_ALLREDUCE_MAX bytes on at most 8 members take one round trip
 * instead of 2 log2(n) + 1: every member sends its vector to every other and runs the same tree
 * itself, on the same bits in the same order, so all get the same result.
 *
 * Several tensors in one buffer (the engine's fusion) are combined each as its own vector (the
 * algorithm's intent: one gradient per layer), with one dot-product exchange per level for all.
 *
 * Arithmetic: float16 and bfloat16 are converted to float32 and back, float32 and float64 are
 * combined in their own type, read where the caller has them; dot products and the combination of
 * each element are computed in double. Adasum is homogeneous (inputs all scaled by s: the same
 * coefficients, the result scaled by s), so prescale and postscale both multiply the result.
 *
 * Cost (2 ranks, this 2-vCPU VM, malloc'd float32, time against a Sum allreduce of the same
 * buffer, medians of 3 interleaved kolo-bench launches): 2.1-2.3x at 4-64 KiB (compute and
 * copies around one exchange), 1.3-1.5x at 256 KiB-4 MiB, 1.9x at 16 and 64 MiB (38 ms against
 * 20: the sum reads the other rank's buffer directly, Adasum moves the halves twice and reads
 * them twice more for the dot products and the combination). 3 and 4 ranks on the 2 cores:
 * 1.5-1.8x at 1 and 16 MiB. */
#include "coll.h"

#include "../reduce/reduce.h"

#include <assert.h>

#define MAX_LEVELS 31

typedef struct job {
    kolo__mesh *m;
    const kolo__group *g;
    bool dbl;             /* working type double (float64) or float */
    char *w;              /* the working buffer: total elements of the working type */
    char *in;             /* where a partner's part is received */
    size_t ws;            /* working element size */
    const size_t *start;  /* start[t] .. start[t + 1]: tensor t */
    size_t nt;
    double *dots;         /* 3 per tensor: a.b, |a|^2, |b|^2 */
    double *peer_dots;
    int extra;            /* members 0 .. 2 * extra - 1 pair up before the tree */
} job;

static int member_of(const job *j, int v) { return v < j->extra ? 2 * v + 1 : v + j->extra; }

/* The tensors overlapping [lo, hi): t in [*t0, *t1). */
static void tensors_in(const job *j, size_t lo, size_t hi, size_t *t0, size_t *t1)
{
    size_t a = 0, b = j->nt;
    while (a < b) { /* the first tensor that ends after lo */
        size_t mid = a + (b - a) / 2;
        if (j->start[mid + 1] <= lo) a = mid + 1;
        else b = mid;
    }
    size_t e = a;
    while (e < j->nt && j->start[e] < hi) e++;
    *t0 = a;
    *t1 = e;
}

/* The kernels: a.b, |a|^2, |b|^2 of n elements, and out = ca a + cb b, in double. Written once with
 * GCC's vector extensions and compiled twice, plain and for AVX2 (chosen when the reduce kernels
 * run AVX2 or better: kolo__reduce_isa), doing the same operations lane by lane: the dot products
 * in eight lanes of doubles (two vectors of four, so that two additions are in flight), element i
 * in lane i % 8, the tail in lane 0, the lanes summed ((0 + 4) + (1 + 5)) + ((2 + 6) + (3 + 7)); no
 * fused multiply-add. So both give the same bits, and a job whose hosts differ in vector units
 * still combines alike. Pieces are computed by one member each and the block sums the pieces'
 * figures, so the order here only has to be the same from run to run. */
typedef double v4d __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));

#define ADASUM_KERNELS(ISA, ATTR)                                                                   \
    ATTR static double lanes_sum_##ISA(const v4d *x, const v4d *y)                                 \
    { /* by pointer: a vector argument by value changes the ABI without AVX (-Wpsabi) */          \
        v4d s = *x + *y;                                                                           \
        return (s[0] + s[1]) + (s[2] + s[3]);                                                      \
    }                                                                                              \
    ATTR static void dots_f32_##ISA(const float *a, const float *b, size_t n, double d[3])        \
    {                                                                                              \
        v4d ab0 = {0, 0, 0, 0}, ab1 = ab0, aa0 = ab0, aa1 = ab0, bb0 = ab0, bb1 = ab0;             \
        size_t i = 0;                                                                              \
        for (; i + 8 <= n; i += 8) {                                                               \
            v4f xf0, yf0, xf1, yf1;                                                                \
            memcpy(&xf0, a + i, sizeof(xf0));                                                      \
            memcpy(&xf1, a + i + 4, sizeof(xf1));                                                  \
            memcpy(&yf0, b + i, sizeof(yf0));                                                      \
            memcpy(&yf1, b + i + 4, sizeof(yf1));                                                  \
            v4d x0 = __builtin_convertvector(xf0, v4d), y0 = __builtin_convertvector(yf0, v4d);    \
            v4d x1 = __builtin_convertvector(xf1, v4d), y1 = __builtin_convertvector(yf1, v4d);    \
            ab0 += x0 * y0;                                                                        \
            ab1 += x1 * y1;                                                                        \
            aa0 += x0 * x0;                                                                        \
            aa1 += x1 * x1;                                                                        \
            bb0 += y0 * y0;                                                                        \
            bb1 += y1 * y1;                                                                        \
        }                                                                                          \
        for (; i < n; i++) {                                                                       \
            double x = a[i], y = b[i];                                                             \
            ab0[0] += x * y;                                                                       \
            aa0[0] += x * x;                                                                       \
            bb0[0] += y * y;                                                                       \
        }                                                                                          \
        d[0] = lanes_sum_##ISA(&ab0, &ab1);                                                          \
        d[1] = lanes_sum_##ISA(&aa0, &aa1);                                                          \
        d[2] = lanes_sum_##ISA(&bb0, &bb1);                                                          \
    }                                                                                              \
    ATTR static void dots_f64_##ISA(const double *a, const double *b, size_t n, double d[3])      \
    {                                                                                              \
        v4d ab0 = {0, 0, 0, 0}, ab1 = ab0, aa0 = ab0, aa1 = ab0, bb0 = ab0, bb1 = ab0;             \
        size_t i = 0;                                                                              \
        for (; i + 8 <= n; i += 8) {                                                               \
            v4d x0, y0, x1, y1;                                                                    \
            memcpy(&x0, a + i, sizeof(x0));                                                        \
            memcpy(&x1, a + i + 4, sizeof(x1));                                                    \
            memcpy(&y0, b + i, sizeof(y0));                                                        \
            memcpy(&y1, b + i + 4, sizeof(y1));                                                    \
            ab0 += x0 * y0;                                                                        \
            ab1 += x1 * y1;                                                                        \
            aa0 += x0 * x0;                                                                        \
            aa1 += x1 * x1;                                                                        \
            bb0 += y0 * y0;                                                                        \
            bb1 += y1 * y1;                                                                        \
        }                                                                                          \
        for (; i < n; i++) {                                                                       \
            ab0[0] += a[i] * b[i];                                                                 \
            aa0[0] += a[i] * a[i];                                                                 \
            bb0[0] += b[i] * b[i];                                                                 \
        }                                                                                          \
        d[0] = lanes_sum_##ISA(&ab0, &ab1);                                                          \
        d[1] = lanes_sum_##ISA(&aa0, &aa1);                                                          \
        d[2] = lanes_sum_##ISA(&bb0, &bb1);                                                          \
    }                                                                                              \
    ATTR static void axpby_f32_##ISA(float *o, const float *a, const float *b, size_t n, double ca, \
                                     double cb)                                                    \
    {                                                                                              \
        v4d va = {ca, ca, ca, ca}, vb = {cb, cb, cb, cb};                                          \
        size_t i = 0;                                                                              \
        for (; i + 4 <= n; i += 4) {                                                               \
            v4f xf, yf;                                                                            \
            memcpy(&xf, a + i, sizeof(xf));                                                        \
            memcpy(&yf, b + i, sizeof(yf));                                                        \
            v4d r = va * __builtin_convertvector(xf, v4d) + vb * __builtin_convertvector(yf, v4d); \
            v4f of = __builtin_convertvector(r, v4f);                                              \
            memcpy(o + i, &of, sizeof(of));                                                        \
        }                                                                                          \
        for (; i < n; i++) o[i] = (float)(ca * (double)a[i] + cb * (double)b[i]);                  \
    }                                                                                              \
    ATTR static void axpby_f64_##ISA(double *o, const double *a, const double *b, size_t n, double ca, \
                                     double cb)                                                    \
    {                                                                                              \
        v4d va = {ca, ca, ca, ca}, vb = {cb, cb, cb, cb};                                          \
        size_t i = 0;                                                                              \
        for (; i + 4 <= n; i += 4) {                                                               \
            v4d x, y;                                                                              \
            memcpy(&x, a + i, sizeof(x));                                                          \
            memcpy(&y, b + i, sizeof(y));                                                          \
            v4d r = va * x + vb * y;                                                               \
            memcpy(o + i, &r, sizeof(r));                                                          \
        }                                                                                          \
        for (; i < n; i++) o[i] = ca * a[i] + cb * b[i];                                           \
    }

ADASUM_KERNELS(generic, )
#if defined(__x86_64__) && defined(__GNUC__)
#define ADASUM_X86 1
ADASUM_KERNELS(avx2, __attribute__((target("avx2"))))
#endif

/* Whether to run the AVX2 kernels (read at each call: tests switch the ISA). */
static bool use_avx2(void)
{
#if defined(ADASUM_X86)
    return strcmp(kolo__reduce_isa(), "generic") != 0; /* every other set has AVX2 */
#else
    return false;
#endif
}

static void dots_f32(const float *a, const float *b, size_t n, double d[3])
{
#if defined(ADASUM_X86)
    if (use_avx2()) {
        dots_f32_avx2(a, b, n, d);
        return;
    }
#endif
    dots_f32_generic(a, b, n, d);
}

static void dots_f64(const double *a, const double *b, size_t n, double d[3])
{
#if defined(ADASUM_X86)
    if (use_avx2()) {
        dots_f64_avx2(a, b, n, d);
        return;
    }
#endif
    dots_f64_generic(a, b, n, d);
}

static void axpby_f32(float *o, const float *a, const float *b, size_t n, double ca, double cb)
{
#if defined(ADASUM_X86)
    if (use_avx2()) {
        axpby_f32_avx2(o, a, b, n, ca, cb);
        return;
    }
#endif
    axpby_f32_generic(o, a, b, n, ca, cb);
}

static void axpby_f64(double *o, const double *a, const double *b, size_t n, double ca, double cb)
{
#if defined(ADASUM_X86)
    if (use_avx2()) {
        axpby_f64_avx2(o, a, b, n, ca, cb);
        return;
    }
#endif
    axpby_f64_generic(o, a, b, n, ca, cb);
}

/* dots[t] over [lo, hi) for the tensors there (the rest zero): a at pa, b at pb, both indexed
 * from lo. */
static void piece_dots(job *j, const char *pa, const char *pb, size_t lo, size_t hi)
{
    memset(j->dots, 0, 3 * j->nt * sizeof(double));
    size_t t0, t1;
    tensors_in(j, lo, hi, &t0, &t1);
    for (size_t t = t0; t < t1; t++) {
        size_t s = KOLO_MAX(j->start[t], lo) - lo, e = KOLO_MIN(j->start[t + 1], hi) - lo;
        if (j->dbl)
            dots_f64((const double *)(const void *)pa + s, (const double *)(const void *)pb + s, e - s, j->dots + 3 * t);
        else
            dots_f32((const float *)(const void *)pa + s, (const float *)(const void *)pb + s, e - s, j->dots + 3 * t);
    }
}

/* out[lo, hi) = ca * a + cb * b with each tensor's coefficients from dots; a, b and out indexed
 * from lo (out may be a or b). */
static void combine(const job *j, char *out, const char *pa, const char *pb, size_t lo, size_t hi)
{
    size_t t0, t1;
    tensors_in(j, lo, hi, &t0, &t1);
    for (size_t t = t0; t < t1; t++) {
        double ab = j->dots[3 * t], aa = j->dots[3 * t + 1], bb = j->dots[3 * t + 2];
        double ca = aa > 0 ? 1.0 - ab / (2.0 * aa) : 1.0;
        double cb = bb > 0 ? 1.0 - ab / (2.0 * bb) : 1.0;
        size_t s = KOLO_MAX(j->start[t], lo) - lo, e = KOLO_MIN(j->start[t + 1], hi) - lo;
        if (j->dbl)
            axpby_f64((double *)(void *)out + s, (const double *)(const void *)pa + s,
                      (const double *)(const void *)pb + s, e - s, ca, cb);
        else
            axpby_f32((float *)(void *)out + s, (const float *)(const void *)pa + s,
                      (const float *)(const void *)pb + s, e - s, ca, cb);
    }
}

static int swap(const job *j, int v_partner, const void *mine, size_t mine_bytes, void *theirs, size_t their_bytes)
{
    kolo__xfer xs[2];
    kolo__xfer *ptrs[2] = {&xs[0], &xs[1]};
    int peer = kolo__g2w(j->g, member_of(j, v_partner));
    kolo__isend(j->m, peer, mine, mine_bytes, &xs[0]);
    kolo__irecv(j->m, peer, theirs, their_bytes, &xs[1]);
    return kolo__wait(j->m, ptrs, 2);
}

/* Sums dots over the 2 * d members of v's block at distance d (recursive doubling). */
static int block_sum(job *j, int v, int d)
{
    size_t bytes = 3 * j->nt * sizeof(double);
    for (int k = 1; k <= d; k <<= 1) {
        int st = swap(j, v ^ k, j->dots, bytes, j->peer_dots, bytes);
        if (st != KOLO_OK) return st;
        for (size_t i = 0; i < 3 * j->nt; i++) j->dots[i] += j->peer_dots[i];
    }
    return KOLO_OK;
}

/* The tree over the p2 virtual members, v being this member's index, starting from src (this
 * member's vector: w, or the caller's input, which is only read): on return w holds the whole
 * result. */
static int tree(job *j, int v, int p2, size_t total, const char *src)
{
    size_t lo = 0, hi = total, plo[MAX_LEVELS], phi[MAX_LEVELS];
    int levels = 0;
    for (int d = 1; d < p2; d <<= 1, levels++) {
        size_t mid = lo + (hi - lo) / 2;
        bool lower = (v & d) == 0;
        size_t keep_lo = lower ? lo : mid, keep_hi = lower ? mid : hi;
        size_t give_lo = lower ? mid : lo, give_hi = lower ? hi : mid;
        int st = swap(j, v ^ d, src + give_lo * j->ws, (give_hi - give_lo) * j->ws, j->in,
                      (keep_hi - keep_lo) * j->ws);
        if (st != KOLO_OK) return st;
        /* a: the lower subtree's vector, b: the higher's */
        const char *mine = src + keep_lo * j->ws;
        const char *pa = lower ? mine : j->in, *pb = lower ? j->in : mine;
        piece_dots(j, pa, pb, keep_lo, keep_hi);
        st = block_sum(j, v, d);
        if (st != KOLO_OK) return st;
        combine(j, j->w + keep_lo * j->ws, pa, pb, keep_lo, keep_hi);
        src = j->w;
        plo[levels] = lo;
        phi[levels] = hi;
        lo = keep_lo;
        hi = keep_hi;
    }
    for (int l = levels - 1; l >= 0; l--) { /* every member gets the whole result */
        int d = 1 << l;
        size_t mid = plo[l] + (phi[l] - plo[l]) / 2;
        bool lower = (v & d) == 0;
        size_t their_lo = lower ? mid : plo[l], their_hi = lower ? phi[l] : mid;
        int st = swap(j, v ^ d, j->w + lo * j->ws, (hi - lo) * j->ws, j->w + their_lo * j->ws,
                      (their_hi - their_lo) * j->ws);
        if (st != KOLO_OK) return st;
        lo = plo[l];
        hi = phi[l];
    }
    return KOLO_OK;
}

/* w = send in the working type */
static void to_work(char *w, const void *send, size_t total, kolo_dtype_t dtype)
{
    if (dtype == KOLO_FLOAT16) kolo__f16_to_f32_n((float *)(void *)w, send, total);
    else if (dtype == KOLO_BFLOAT16) kolo__bf16_to_f32_n((float *)(void *)w, send, total);
    else if (w != send && total) kolo__copy(w, send, total * kolo_dtype_size(dtype));
}

/* recv = scale * w, converted to the dtype (w may be recv). Adasum is homogeneous (scaling every
 * input by s leaves the coefficients alone and scales the result by s), so the prescale factor
 * is applied here with the postscale one, and the inputs are read where they are. */
static void from_work(void *recv, char *w, size_t total, kolo_dtype_t dtype, double scale)
{
    if (scale != 1.0) kolo__scale(w, w, total, dtype == KOLO_FLOAT64 ? KOLO_FLOAT64 : KOLO_FLOAT32, scale);
    if (dtype == KOLO_FLOAT16) kolo__f32_to_f16_n(recv, (const float *)(const void *)w, total);
    else if (dtype == KOLO_BFLOAT16) kolo__f32_to_bf16_n(recv, (const float *)(const void *)w, total);
    else if (w != recv && total) kolo__copy(recv, w, total * kolo_dtype_size(dtype));
}

/* out = a (+) b over the whole buffer, with dot products of whole tensors (out may be a) */
static void pair_whole(job *j, char *out, const char *a, const char *b, size_t total)
{
    piece_dots(j, a, b, 0, total);
    combine(j, out, a, b, 0, total);
}

/* Small buffers on at most SMALL_MEMBERS members: every member sends its vector to every other
 * and runs the whole tree itself, in the same order on the same bits, so all get the same
 * result: one round trip instead of 2 log2(n) + 1. */
#define SMALL_MEMBERS 8
static int adasum_small(job *j, const void *send, void *recv, size_t total, kolo_dtype_t dtype, double scale)
{
    int n = j->g->size, r = j->g->rank;
    size_t bytes = total * j->ws, stride = (bytes + 63) & ~(size_t)63;
    char *slots = kolo__coll_scratch(j->m, KOLO_SCRATCH_WORK, stride * (size_t)n);
    if (!slots) return KOLO_ERR_NO_MEMORY;
    to_work(slots + stride * (size_t)r, send, total, dtype);
    kolo__xfer xs[2 * SMALL_MEMBERS];
    kolo__xfer *ptrs[2 * SMALL_MEMBERS];
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (i == r) continue;
        kolo__isend(j->m, kolo__g2w(j->g, i), slots + stride * (size_t)r, bytes, &xs[k++]);
        kolo__irecv(j->m, kolo__g2w(j->g, i), slots + stride * (size_t)i, bytes, &xs[k++]);
    }
    for (int i = 0; i < k; i++) ptrs[i] = &xs[i];
    int st = kolo__wait(j->m, ptrs, k);
    if (st != KOLO_OK) return st;
    int p2 = n - j->extra;
    char *y[SMALL_MEMBERS];
    for (int v = 0; v < p2; v++) {
        y[v] = slots + stride * (size_t)(v < j->extra ? 2 * v : v + j->extra);
        if (v < j->extra) pair_whole(j, y[v], y[v], y[v] + stride, total);
    }
    /* the last pair writes float32 and float64 results straight into recv */
    bool half = dtype == KOLO_FLOAT16 || dtype == KOLO_BFLOAT16;
    for (int w = p2; w > 1; w /= 2)
        for (int i = 0; i < w / 2; i++) {
            char *out = w == 2 && !half ? recv : y[2 * i];
            pair_whole(j, out, y[2 * i], y[2 * i + 1], total);
            y[i] = out;
        }
    from_work(recv, y[0], total, dtype, scale);
    return KOLO_OK;
}

/* The tree for larger buffers: members beyond the largest power of two pair up first, then the
 * vector-halving levels. */
static int adasum_tree(job *j, const void *send, void *recv, size_t total, kolo_dtype_t dtype, double scale)
{
    kolo__mesh *m = j->m;
    const kolo__group *g = j->g;
    int r = g->rank, p2 = g->size - j->extra;
    bool folds = r < 2 * j->extra;
    /* the working buffer (recv itself unless the dtype is a half type) and room for what a
     * partner sends: half the buffer in the tree, all of it in the pairing. float32 and float64
     * inputs are read where they are (src); half types are converted first. */
    bool half = dtype == KOLO_FLOAT16 || dtype == KOLO_BFLOAT16;
    j->w = half ? kolo__coll_scratch(m, KOLO_SCRATCH_WORK, total * j->ws) : recv;
    j->in = kolo__coll_scratch(m, KOLO_SCRATCH_RING, (folds ? total : total / 2 + 1) * j->ws);
    if (!j->w || !j->in) return KOLO_ERR_NO_MEMORY;
    if (half) to_work(j->w, send, total, dtype);
    const char *src = half ? j->w : send;
    int st = KOLO_OK;
    size_t bytes = total * j->ws;
    kolo__xfer x;
    if (folds && r % 2 == 0) { /* hand over, get the result back */
        kolo__isend(m, kolo__g2w(g, r + 1), src, bytes, &x);
        st = kolo__wait1(m, &x);
        if (st == KOLO_OK) {
            kolo__irecv(m, kolo__g2w(g, r + 1), j->w, bytes, &x);
            st = kolo__wait1(m, &x);
        }
    } else {
        if (folds) { /* combine with member r - 1's vector, its as a */
            kolo__irecv(m, kolo__g2w(g, r - 1), j->in, bytes, &x);
            st = kolo__wait1(m, &x);
            if (st == KOLO_OK) {
                pair_whole(j, j->w, j->in, src, total);
                src = j->w;
            }
        }
        if (st == KOLO_OK) st = tree(j, folds ? r / 2 : r - j->extra, p2, total, src);
        if (st == KOLO_OK && folds) {
            kolo__isend(m, kolo__g2w(g, r - 1), j->w, bytes, &x);
            st = kolo__wait1(m, &x);
        }
    }
    if (st == KOLO_OK) from_work(recv, j->w, total, dtype, scale);
    return st;
}

int kolo__coll_adasum(kolo__mesh *m, const kolo__group *g, const void *send, void *recv, const size_t *counts,
                      size_t ntensor, kolo_dtype_t dtype, double pre, double post)
{
    if (dtype != KOLO_FLOAT16 && dtype != KOLO_BFLOAT16 && dtype != KOLO_FLOAT32 && dtype != KOLO_FLOAT64)
        return kolo__err(KOLO_ERR_INVALID_ARG, "adasum is defined for floating dtypes only, not %s",
                         kolo_dtype_name(dtype));
    int n = g->size;
    assert(n >= 1); /* the world or a process set kolo_process_set_add made, which refuses an empty one */
    size_t total = 0;
    for (size_t t = 0; t < ntensor; t++) total += counts[t];
    if (n == 1) { /* a world of one has no mesh */
        kolo__scale(recv, send, total, dtype, pre);
        kolo__scale(recv, recv, total, dtype, post);
        return KOLO_OK;
    }
    job j = {.m = m, .g = g, .dbl = dtype == KOLO_FLOAT64, .nt = ntensor};
    j.ws = j.dbl ? 8 : 4;
    int p2 = 1;
    while (p2 * 2 <= n) p2 *= 2;
    j.extra = n - p2;
    size_t *start = kolo__malloc((ntensor + 1) * sizeof(size_t));
    double *dots = kolo__malloc(6 * (ntensor ? ntensor : 1) * sizeof(double));
    if (!start || !dots) {
        kolo__free(start);
        kolo__free(dots);
        return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for an adasum of %zu tensors", ntensor);
    }
    start[0] = 0;
    for (size_t t = 0; t < ntensor; t++) start[t + 1] = start[t] + counts[t];
    j.start = start;
    j.dots = dots;
    j.peer_dots = dots + 3 * ntensor;
    int st = n <= SMALL_MEMBERS && total * kolo_dtype_size(dtype) <= kolo__coll_small_max()
                 ? adasum_small(&j, send, recv, total, dtype, pre * post)
                 : adasum_tree(&j, send, recv, total, dtype, pre * post);
    kolo__free(start);
    kolo__free(dots);
    return st;
}

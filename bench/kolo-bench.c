/* kolo-bench.c - collective benchmark with nccl-tests' flags, columns and bus-bandwidth factors.
 *
 *   kolo-bench allreduce -b 8 -e 128M -f 2 -n 20 -w 5 -c 1 -d float32 -o sum [-np 4]
 *
 * Runs under any launcher kolo supports (kolorun, mpirun, srun, torchrun); with -np N and no
 * launcher in the environment it forks N local ranks itself, with its own rendezvous store.
 * Per size it prints out-of-place and in-place time (average per iteration over -n iterations
 * after -w warm-ups, averaged across ranks), algbw = size / time and busbw = algbw * factor
 * (allreduce 2(n-1)/n; allgather, reducescatter, alltoall (n-1)/n; broadcast 1), and #wrong,
 * the elements that differ from the expected result (-c 1).
 */
#include "kolo.h"

#include "local_job.h"
#include "bench_mem.h"
#include "perf_ctl.h"

#include "../src/core/world.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum coll { ALLREDUCE, ALLGATHER, BROADCAST, REDUCESCATTER, ALLTOALL };
static const char *const coll_names[] = {"allreduce", "allgather", "broadcast", "reducescatter", "alltoall"};

typedef struct opts {
    enum coll coll;
    size_t minb, maxb, step;
    double factor;
    int iters, warmup, check, root, np, avg_mode, bind, mem; /* mem: MEM_* */
    int calls; /* --calls 1: print every timed call's time (the slowest rank's) after each size */
    double warm_ms; /* -W: warm up at the first size for at least this long */
    kolo_dtype_t dtype;
    kolo_op_t op;
    int vs;               /* --vs: 0 none, 1 another dtype, 2 the other buffer source */
    kolo_dtype_t vs_dtype;
} opts;

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0) return -1;
    switch (*end) {
    case 'k': case 'K': v *= 1024; end++; break;
    case 'm': case 'M': v *= 1024 * 1024; end++; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return -1;
    *out = (size_t)v;
    return 0;
}

static int parse_dtype(const char *s, kolo_dtype_t *d)
{
    static const struct { const char *name; kolo_dtype_t d; } t[] = {
        {"float32", KOLO_FLOAT32}, {"float", KOLO_FLOAT32}, {"f32", KOLO_FLOAT32}, {"float16", KOLO_FLOAT16},
        {"half", KOLO_FLOAT16}, {"f16", KOLO_FLOAT16}, {"bfloat16", KOLO_BFLOAT16}, {"bf16", KOLO_BFLOAT16},
        {"float64", KOLO_FLOAT64}, {"double", KOLO_FLOAT64}, {"int8", KOLO_INT8}, {"uint8", KOLO_UINT8},
        {"int16", KOLO_INT16}, {"uint16", KOLO_UINT16}, {"int32", KOLO_INT32}, {"int", KOLO_INT32},
        {"int64", KOLO_INT64}, {"bool", KOLO_BOOL}};
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
        if (strcmp(s, t[i].name) == 0) {
            *d = t[i].d;
            return 0;
        }
    return -1;
}

static int parse_op(const char *s, kolo_op_t *o)
{
    static const struct { const char *name; kolo_op_t o; } t[] = {
        {"sum", KOLO_SUM}, {"avg", KOLO_AVERAGE}, {"average", KOLO_AVERAGE}, {"min", KOLO_MIN},
        {"max", KOLO_MAX}, {"prod", KOLO_PRODUCT}, {"product", KOLO_PRODUCT}, {"adasum", KOLO_ADASUM}};
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
        if (strcmp(s, t[i].name) == 0) {
            *o = t[i].o;
            return 0;
        }
    return -1;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kolo-bench [allreduce|allgather|broadcast|reducescatter|alltoall] [flags]\n"
            "  -b SIZE   smallest size in bytes (K/M/G suffixes; default 8)\n"
            "  -e SIZE   largest size (default 64M)\n"
            "  -f N      multiply the size by N each step (default 2)\n"
            "  -i SIZE   add SIZE each step instead of multiplying\n"
            "  -n N      timed iterations per size (default 20)\n"
            "  -w N      warm-up iterations (default 5)\n"
            "  -W MS     before the sweep, also call at the first size until MS milliseconds have passed\n"
            "            (default 0): a machine that speeds up after its first moments of work then\n"
            "            meets the first timed size warm\n"
            "  -c 0|1    check results (default 1)\n"
            "  -d TYPE   float32 float16 bfloat16 float64 int8 uint8 int16 uint16 int32 int64 bool (default float32)\n"
            "  -o OP     sum avg min max prod adasum (default sum; adasum: allreduce of floating types,\n"
            "            every rank the same vector, which Adasum returns unchanged)\n"
            "  -r ROOT   broadcast root (default 0)\n"
            "  -a 0|1|2|3  time reported: rank 0's, the average (default), min or max across ranks\n"
            "  -np N     fork N local ranks (when no launcher started us)\n"
            "  --bind core|none  with -np: bind each rank to a CPU of its own, or with more ranks than\n"
            "            CPUs, neighbouring ranks in blocks to one CPU each (default core, as mpirun\n"
            "            does, and kolorun with more workers than CPUs; a launcher's ranks are left\n"
            "            as it placed them)\n"
            "  --mem malloc|kolo|thp  where the buffers come from (default malloc); kolo: kolo_mem_alloc,\n"
            "            which lets allreduce of 16 MiB and more read the other ranks' buffers directly;\n"
            "            thp: malloc'd memory in 2 MiB pages (madvise MADV_HUGEPAGE), as NumPy and PyTorch\n"
            "            (THP_MEM_ALLOC_ENABLE=1) hand over large arrays; prints how much the kernel gave\n"
            "  --vs TYPE|mem  paired mode: every iteration also runs the same bytes as TYPE (a dtype, in\n"
            "            the same buffers), or with the other buffer source (mem: kolo or thp against\n"
            "            malloc), call by call, and prints both medians and their ratio (out of place\n"
            "            only); for comparisons a drifting machine cannot skew\n"
            "  --calls 0|1  after each size's row, print every timed call's time in us, the slowest\n"
            "            rank's, on '# calls' lines (default 0): where a size's first calls cost more than\n"
            "            its later ones, the row's average hides it\n"
            "  --version print the library's build information\n");
}

/* value of element i on rank r: small integers, exact in every dtype for sums of a few ranks
 * (for adasum the same on every rank) */
static double val(int r, size_t i, kolo_op_t op)
{
    if (op == KOLO_ADASUM) r = 0;
    if (op == KOLO_PRODUCT) return ((i + (size_t)r) % 5 == 0) ? 2.0 : 1.0;
    return (double)((long)((i * 7 + (size_t)r * 3) % 11) - 5);
}

static void put(void *buf, size_t i, kolo_dtype_t d, double v);
static double get(const void *buf, size_t i, kolo_dtype_t d);

static bool is_float(kolo_dtype_t d)
{
    return d == KOLO_FLOAT16 || d == KOLO_BFLOAT16 || d == KOLO_FLOAT32 || d == KOLO_FLOAT64;
}

static double expect(int n, size_t i, kolo_op_t op, kolo_dtype_t d)
{
    double acc = val(0, i, op);
    for (int r = 1; r < n && op != KOLO_ADASUM; r++) {
        double v = val(r, i, op);
        switch (op) {
        case KOLO_SUM: case KOLO_AVERAGE: acc += v; break;
        case KOLO_MIN: acc = fmin(acc, v); break;
        case KOLO_MAX: acc = fmax(acc, v); break;
        case KOLO_PRODUCT: acc *= v; break;
        default: break;
        }
    }
    if (op == KOLO_AVERAGE) acc = is_float(d) ? acc / n : trunc(acc / n);
    if (d == KOLO_UINT8 || d == KOLO_UINT16) acc = fmod(acc + 65536.0 * 16, d == KOLO_UINT8 ? 256.0 : 65536.0);
    if (d == KOLO_BOOL) acc = acc != 0;
    return acc;
}

static uint16_t to_half(float f)
{
    /* exact for the small integers and halves the benchmark uses */
    if (f == 0) return 0;
    uint16_t sign = f < 0 ? 0x8000 : 0;
    float a = fabsf(f);
    int e = 0;
    while (a >= 2.0f) { a /= 2; e++; }
    while (a < 1.0f) { a *= 2; e--; }
    return (uint16_t)(sign | (uint16_t)((e + 15) << 10) | (uint16_t)((a - 1.0f) * 1024.0f + 0.5f));
}

static float from_half(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : ldexpf(1.0f + (float)m / 1024.0f, e - 15);
    return (h & 0x8000) ? -v : v;
}

static void put(void *buf, size_t i, kolo_dtype_t d, double v)
{
    switch (d) {
    case KOLO_UINT8: ((uint8_t *)buf)[i] = (uint8_t)((long)v & 255); break;
    case KOLO_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case KOLO_UINT16: ((uint16_t *)buf)[i] = (uint16_t)((long)v & 65535); break;
    case KOLO_INT16: ((int16_t *)buf)[i] = (int16_t)v; break;
    case KOLO_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case KOLO_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case KOLO_FLOAT16: ((uint16_t *)buf)[i] = to_half((float)v); break;
    case KOLO_BFLOAT16: {
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        ((uint16_t *)buf)[i] = (uint16_t)(u >> 16);
        break;
    }
    case KOLO_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case KOLO_FLOAT64: ((double *)buf)[i] = v; break;
    case KOLO_BOOL: ((uint8_t *)buf)[i] = v != 0; break;
    default: break;
    }
}

static double get(const void *buf, size_t i, kolo_dtype_t d)
{
    switch (d) {
    case KOLO_UINT8: return ((const uint8_t *)buf)[i];
    case KOLO_INT8: return ((const int8_t *)buf)[i];
    case KOLO_UINT16: return ((const uint16_t *)buf)[i];
    case KOLO_INT16: return ((const int16_t *)buf)[i];
    case KOLO_INT32: return ((const int32_t *)buf)[i];
    case KOLO_INT64: return (double)((const int64_t *)buf)[i];
    case KOLO_FLOAT16: return from_half(((const uint16_t *)buf)[i]);
    case KOLO_BFLOAT16: {
        uint32_t u = (uint32_t)((const uint16_t *)buf)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case KOLO_FLOAT32: return ((const float *)buf)[i];
    case KOLO_FLOAT64: return ((const double *)buf)[i];
    case KOLO_BOOL: return ((const uint8_t *)buf)[i];
    default: return 0;
    }
}

static bool close_enough(double got, double want, kolo_dtype_t d)
{
    double tol = (d == KOLO_FLOAT16 || d == KOLO_BFLOAT16) ? 1e-2 : 1e-6;
    return fabs(got - want) <= tol * fmax(1.0, fabs(want));
}

/* Where the buffers come from (--mem): malloc, kolo_mem_alloc, or malloc'd in huge pages. */
enum { MEM_MALLOC, MEM_KOLO, MEM_THP };
static const char *const mem_names[] = {"/malloc", "/kolo-mem", "/thp"};

static int parse_mem(const char *v, int *mem)
{
    for (int i = 0; i < 3; i++)
        if (!strcmp(v, mem_names[i] + 1) || (i == MEM_KOLO && !strcmp(v, "kolo"))) {
            *mem = i;
            return 0;
        }
    return 1;
}

static void *side_alloc(int mem, size_t n)
{
    if (mem == MEM_KOLO) return kolo_mem_alloc(n);
    if (mem == MEM_THP) return bench_alloc_huge(n);
    return aligned_alloc(64, n);
}

/* The buffers and dtype of one side of a measurement: the sweep has one, --vs two. */
typedef struct side {
    kolo_dtype_t dtype;
    size_t es;
    int mem; /* MEM_*: where its buffers come from */
    char *send, *recv;
} side;

typedef struct run {
    const opts *o;
    int n, r;
    size_t es;
    kolo_dtype_t dtype; /* the side in use: call, fill and check read these four */
    char *send, *recv;
    side sides[2];
} run;

static void use_side(run *R, int k)
{
    R->dtype = R->sides[k].dtype;
    R->es = R->sides[k].es;
    R->send = R->sides[k].send;
    R->recv = R->sides[k].recv;
}

/* one call of the collective at `bytes` (nccl-tests' size); in_place uses recv as both */
static int call(run *R, size_t bytes, int in_place)
{
    const opts *o = R->o;
    size_t es = R->es, n = (size_t)R->n;
    switch (o->coll) {
    case ALLREDUCE: {
        size_t count = bytes / es;
        return kolo_allreduce(in_place ? R->recv : R->send, R->recv, count, R->dtype, o->op, 1.0, 1.0, KOLO_WORLD);
    }
    case BROADCAST: return kolo_broadcast(R->recv, bytes / es, R->dtype, o->root, KOLO_WORLD);
    case ALLGATHER: {
        size_t count = bytes / es / n;
        const void *s = in_place ? R->recv + (size_t)R->r * count * es : R->send;
        return kolo_allgather(s, count, R->recv, NULL, R->dtype, KOLO_WORLD);
    }
    case REDUCESCATTER: {
        size_t rows = bytes / es / n * n;
        /* in place is not supported: both columns run out of place */
        return kolo_reducescatter(R->send, R->recv, rows, 1, R->dtype, o->op, 1.0, 1.0, KOLO_WORLD);
    }
    case ALLTOALL: {
        size_t count = bytes / es / n;
        size_t counts[1024];
        for (size_t i = 0; i < n; i++) counts[i] = count;
        return kolo_alltoall(R->send, counts, R->recv, counts, R->dtype, KOLO_WORLD);
    }
    }
    return KOLO_ERR_INVALID_ARG;
}

static void fill(run *R, size_t bytes, int in_place)
{
    const opts *o = R->o;
    size_t es = R->es, n = (size_t)R->n, elems = bytes / es;
    switch (o->coll) {
    case ALLREDUCE:
        for (size_t i = 0; i < elems; i++) put(in_place ? R->recv : R->send, i, R->dtype, val(R->r, i, o->op));
        break;
    case BROADCAST:
        for (size_t i = 0; i < elems; i++) put(R->recv, i, R->dtype, R->r == o->root ? val(o->root, i, KOLO_SUM) : 99);
        break;
    case ALLGATHER: {
        size_t count = elems / n;
        char *dst = in_place ? R->recv + (size_t)R->r * count * es : R->send;
        for (size_t i = 0; i < count; i++) put(dst, i, R->dtype, val(R->r, i, KOLO_SUM));
        break;
    }
    case REDUCESCATTER:
        for (size_t i = 0; i < elems / n * n; i++) put(R->send, i, R->dtype, val(R->r, i, o->op));
        break;
    case ALLTOALL:
        /* element j of the block for destination d carries (source, d, j) */
        for (size_t i = 0; i < elems / n * n; i++) put(R->send, i, R->dtype, val(R->r, i, KOLO_SUM));
        break;
    }
}

static long check(run *R, size_t bytes)
{
    const opts *o = R->o;
    size_t es = R->es, n = (size_t)R->n, elems = bytes / es;
    long wrong = 0;
    switch (o->coll) {
    case ALLREDUCE:
        for (size_t i = 0; i < elems; i++)
            if (!close_enough(get(R->recv, i, R->dtype), expect(R->n, i, o->op, R->dtype), R->dtype)) wrong++;
        break;
    case BROADCAST:
        for (size_t i = 0; i < elems; i++)
            if (!close_enough(get(R->recv, i, R->dtype), val(o->root, i, KOLO_SUM), R->dtype)) wrong++;
        break;
    case ALLGATHER: {
        size_t count = elems / n;
        for (size_t r = 0; r < n; r++)
            for (size_t i = 0; i < count; i++)
                if (!close_enough(get(R->recv, r * count + i, R->dtype), val((int)r, i, KOLO_SUM), R->dtype)) wrong++;
        break;
    }
    case REDUCESCATTER: {
        size_t count = elems / n, base = (size_t)R->r * count;
        for (size_t i = 0; i < count; i++)
            if (!close_enough(get(R->recv, i, R->dtype), expect(R->n, base + i, o->op, R->dtype), R->dtype)) wrong++;
        break;
    }
    case ALLTOALL: {
        size_t count = elems / n;
        for (size_t src = 0; src < n; src++)
            for (size_t j = 0; j < count; j++)
                if (!close_enough(get(R->recv, src * count + j, R->dtype),
                                  val((int)src, (size_t)R->r * count + j, KOLO_SUM), R->dtype))
                    wrong++;
        break;
    }
    }
    return wrong;
}

static double busbw_factor(enum coll c, int n)
{
    switch (c) {
    case ALLREDUCE: return 2.0 * (n - 1) / n;
    case BROADCAST: return 1.0;
    default: return (double)(n - 1) / n;
    }
}

/* time per iteration across ranks per -a */
static double reduce_time(double t, int mode)
{
    double in[1] = {t}, out[1];
    kolo_op_t op = mode == 2 ? KOLO_MIN : mode == 3 ? KOLO_MAX : KOLO_AVERAGE;
    if (mode == 0) {
        kolo_broadcast(in, 1, KOLO_FLOAT64, 0, KOLO_WORLD);
        return in[0];
    }
    if (kolo_allreduce(in, out, 1, KOLO_FLOAT64, op, 1.0, 1.0, KOLO_WORLD) != KOLO_OK) return t;
    return out[0];
}

static void fmt_num(char *buf, size_t cap, double v)
{
    if (v < 1e5) snprintf(buf, cap, "%.2f", v);
    else snprintf(buf, cap, "%.3g", v);
}

#define KOLO_MAX_ES(R) ((R).sides[0].es > (R).sides[1].es ? (R).sides[0].es : (R).sides[1].es)

static size_t next_size(const opts *o, size_t b)
{
    if (o->step) return b + o->step;
    size_t nb = (size_t)((double)b * o->factor);
    return nb > b ? nb : b + 1;
}

static void side_name(const run *R, int k, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s%s", kolo_dtype_name(R->sides[k].dtype),
             R->o->vs != 2 ? "" : mem_names[R->sides[k].mem]);
}

static void print_paired_header(const run *R)
{
    char a[32], b[32];
    side_name(R, 0, a, sizeof(a));
    side_name(R, 1, b, sizeof(b));
    printf("# paired: %s (A) against %s (B), out of place, same bytes%s. Every iteration times one call of\n"
           "# each, A first in the first half of the iterations and B in the second, each after a barrier;\n"
           "# a call's time is its slowest rank's, and each column is the median over the iterations.\n"
           "# B/A > 1: B moves the bytes faster.\n#\n", a, b,
           R->o->vs == 1 ? ", same buffers" : "");
    printf("#%11s %8s %16s %9s %7s %16s %9s %7s %6s %6s\n", "size", "redop", "A", "time", "busbw", "B", "time",
           "busbw", "B/A", "#wrong");
    printf("#%11s %8s %16s %9s %7s %16s %9s %7s %6s %6s\n", "(B)", "", "", "(us)", "(GB/s)", "", "(us)", "(GB/s)",
           "", "");
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* --vs: both sides at `bytes`, call by call (see print_paired_header). On a machine whose speed
 * drifts (a VM whose vCPUs move), separate launches compare different machines; two calls a few
 * milliseconds apart compare the code. Returns nonzero when a call failed. */
static int paired(run *R, size_t bytes, long *total_wrong)
{
    const opts *o = R->o;
    int iters = o->iters ? o->iters : 1, st = KOLO_OK;
    double *t = calloc(2 * (size_t)iters, sizeof(double));
    long wrong[2] = {0, 0};
    if (!t) {
        fprintf(stderr, "kolo-bench: no memory for %d timings\n", iters);
        return 1;
    }
    for (int k = 0; k < 2 && st == KOLO_OK; k++) {
        use_side(R, k);
        fill(R, bytes, 0);
        for (int w = 0; w < o->warmup && st == KOLO_OK; w++) st = call(R, bytes, 0);
        if (st == KOLO_OK && o->check) {
            fill(R, bytes, 0);
            st = call(R, bytes, 0);
            if (st == KOLO_OK) wrong[k] = check(R, bytes);
        }
    }
    if (R->sides[0].send == R->sides[1].send) {
        /* One set of buffers for both types (--vs TYPE): the timed calls read what the fill
         * of the wider type wrote (of two as wide, a floating one's): small integers, whose
         * low bits are zero in a floating type, so a narrower float reads zeros and normal
         * numbers, no subnormals (which some CPUs add slowly). */
        const side *s0 = &R->sides[0], *s1 = &R->sides[1];
        use_side(R, s1->es > s0->es || (s1->es == s0->es && is_float(s1->dtype) && !is_float(s0->dtype)));
        fill(R, bytes, 0);
    }
    /* A first through the first half of the iterations, B first through the second: neighbouring
     * calls are of different sides but at the one turn, so a probe of the library's choices, two
     * calls by the other way (src/coll/coll_util.c), times one of each, and each side runs as
     * many calls at either parity (the pair's ways are planned by call number mod 2). With the
     * order turning every iteration (A B, B A, ...) a probe could fall on two calls of one side:
     * float16 against float32, 10 iterations, 13 launches each alternated, read 0.85-1.01 (median
     * 0.93) in that order, 0.92-1.02 but one (median 0.99) in this; with either way pinned
     * (KOLO_SHM_CMA=0 or 1) 0.98-1.02. */
    for (int it = 0; it < iters && st == KOLO_OK; it++)
        for (int j = 0; j < 2 && st == KOLO_OK; j++) {
            int k = it < iters / 2 ? j : 1 - j;
            use_side(R, k);
            st = kolo_barrier(KOLO_WORLD);
            double t0 = now_us();
            if (st == KOLO_OK) st = call(R, bytes, 0);
            t[k * iters + it] = now_us() - t0;
        }
    if (st == KOLO_OK) st = kolo_allreduce(t, t, 2 * (size_t)iters, KOLO_FLOAT64, KOLO_MAX, 1.0, 1.0, KOLO_WORLD);
    long wl[2] = {wrong[0], wrong[1]};
    if (st == KOLO_OK) st = kolo_allreduce(wl, wrong, 2, KOLO_INT64, KOLO_SUM, 1.0, 1.0, KOLO_WORLD);
    use_side(R, 0);
    if (st != KOLO_OK) {
        fprintf(stderr, "kolo-bench: rank %d: %s failed at %zu bytes: %s\n", R->r, coll_names[o->coll], bytes,
                kolo_last_error());
        free(t);
        return 1;
    }
    *total_wrong += wrong[0] + wrong[1];
    if (R->r == 0) {
        double med[2];
        char name[2][32], tm[2][32], bw[2][32], w[16];
        for (int k = 0; k < 2; k++) {
            qsort(t + k * iters, (size_t)iters, sizeof(double), cmp_double);
            med[k] = iters % 2 ? t[k * iters + iters / 2] : (t[k * iters + iters / 2 - 1] + t[k * iters + iters / 2]) / 2;
            side_name(R, k, name[k], sizeof(name[k]));
            fmt_num(tm[k], sizeof(tm[k]), med[k]);
            fmt_num(bw[k], sizeof(bw[k]), (double)bytes / (med[k] * 1e3) * busbw_factor(o->coll, R->n));
        }
        if (o->check) snprintf(w, sizeof(w), "%ld", wrong[0] + wrong[1]);
        else snprintf(w, sizeof(w), "N/A");
        printf("%12zu %8s %16s %9s %7s %16s %9s %7s %6.3f %6s\n", bytes,
               (o->coll == ALLREDUCE || o->coll == REDUCESCATTER) ? kolo_op_name(o->op) : "none", name[0], tm[0],
               bw[0], name[1], tm[1], bw[1], med[0] / med[1], w);
    }
    free(t);
    return 0;
}

static int bench(const opts *o)
{
    int st = kolo_init();
    if (st != KOLO_OK) {
        fprintf(stderr, "kolo-bench: kolo_init failed: %s\n", kolo_last_error());
        return 1;
    }
    run R = {.o = o, .n = kolo_size(), .r = kolo_rank()};
    int n = R.n, me = R.r;
    if (o->coll == BROADCAST && (o->root < 0 || o->root >= n)) {
        if (me == 0) fprintf(stderr, "kolo-bench: root %d is not a rank (size %d)\n", o->root, n);
        kolo_shutdown();
        return 2;
    }
    int nsides = o->vs ? 2 : 1;
    R.sides[0] = (side){.dtype = o->dtype, .mem = o->mem};
    /* --vs mem: kolo_mem_alloc against malloc, huge pages against malloc */
    R.sides[1] = (side){.dtype = o->vs == 1 ? o->vs_dtype : o->dtype,
                        .mem = o->vs != 2 ? o->mem : o->mem == MEM_MALLOC ? MEM_KOLO : MEM_MALLOC};
    size_t cap = 0;
    for (int k = 0; k < nsides; k++) {
        side *sd = &R.sides[k];
        sd->es = kolo_dtype_size(sd->dtype);
        size_t need = o->maxb + 64 * (size_t)n * sd->es;
        if (need > cap) cap = need;
    }
    size_t alloc = (cap + 63) / 64 * 64;
    for (int k = 0; k < nsides; k++) {
        side *sd = &R.sides[k];
        if (k == 1 && o->vs == 1) {
            /* --vs TYPE: both types in the same buffers. Separate ones read 0.93-1.07 for
             * float32 against itself from launch to launch (one allocation's pages suit the
             * calls better than the other's), as much as the difference being measured. */
            sd->send = R.sides[0].send;
            sd->recv = R.sides[0].recv;
            continue;
        }
        sd->send = side_alloc(sd->mem, alloc);
        sd->recv = side_alloc(sd->mem, alloc);
        if (!sd->send || !sd->recv) {
            fprintf(stderr, "kolo-bench: cannot allocate %zu bytes%s%s\n", cap, sd->mem == MEM_KOLO ? ": " : "",
                    sd->mem == MEM_KOLO ? kolo_last_error() : "");
            return 1;
        }
        memset(sd->send, 0, cap);
        memset(sd->recv, 0, cap);
    }
    use_side(&R, 0);
    if (me == 0) {
        printf("# Collective test starting: kolo-bench %s\n", coll_names[o->coll]);
        printf("# nRanks %d minBytes %zu maxBytes %zu step: %g(%s) warmup iters: %d iters: %d validation: %d\n", n,
               o->minb, o->maxb, o->step ? (double)o->step : o->factor, o->step ? "bytes" : "factor", o->warmup,
               o->iters, o->check);
        printf("# %s\n", kolo_build_info());
        if (o->mem == MEM_KOLO) printf("# buffers from kolo_mem_alloc\n");
        /* --vs mem pairs thp with malloc, never the other way round */
        if (o->mem == MEM_THP) bench_huge_report(o->vs == 2 ? " of the thp side" : "");
        kolo__conn *c1 = n > 1 ? kolo__W.mesh[KOLO_CHANNEL_DIRECT]->conns[1] : NULL;
        int cma = kolo__shm_cma_state(c1);
        printf("# transport to rank 1: %s", n > 1 ? kolo_peer_transport(1) : "self");
        if (cma == 2) printf(" (ring copies or single-copy CMA from %zu KiB, whichever times faster)", kolo__shm_cma_threshold(c1) >> 10);
        else if (cma == 1) printf(" (single-copy CMA from %zu KiB)", kolo__shm_cma_threshold(c1) >> 10);
        else if (cma == 0) printf(" (ring copies)");
        printf("\n");
        cpu_set_t cpus;
        if (sched_getaffinity(0, sizeof(cpus), &cpus) == 0 && CPU_COUNT(&cpus) == 1)
            for (int c = 0; c < CPU_SETSIZE; c++)
                if (CPU_ISSET(c, &cpus)) printf("# rank 0 bound to cpu %d\n", c);
        printf("#\n");
        if (o->vs) {
            print_paired_header(&R);
            fflush(stdout);
        } else {
        printf("#%68s%31s\n", "out-of-place", "in-place");
        printf("#%11s %12s %8s %6s %6s %8s %7s %7s %6s %8s %7s %7s %6s\n", "size", "count", "type", "redop", "root",
               "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
        printf("#%11s %12s %8s %6s %6s %8s %7s %7s %6s %8s %7s %7s %6s\n", "(B)", "(elements)", "", "", "", "(us)",
               "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
        fflush(stdout);
        }
    }
    /* Warm up once before the sweep, as nccl-tests does: the first collectives pay for scratch
     * memory, first touches and the peers' arrival, which must not land on the smallest size. */
    for (int w = 0; w < 20 && st == KOLO_OK; w++) st = call(&R, KOLO_MIN(o->maxb, (size_t)1 << 20), 1);
    size_t unit = KOLO_MAX_ES(R) * ((o->coll == ALLREDUCE || o->coll == BROADCAST) ? 1 : (size_t)n);
    if (st == KOLO_OK && o->warm_ms > 0) { /* -W: at the first size, until some rank has spent warm_ms */
        size_t first = KOLO_MAX(o->minb / unit * unit, unit);
        double t0 = now_us();
        for (int done = 0; !done && st == KOLO_OK;) {
            st = call(&R, first, 0);
            done = (now_us() - t0) / 1e3 >= o->warm_ms;
            if (st == KOLO_OK) st = kolo_allreduce(&done, &done, 1, KOLO_INT32, KOLO_MAX, 1.0, 1.0, KOLO_WORLD);
        }
    }
    if (st == KOLO_OK) st = kolo_barrier(KOLO_WORLD);
    if (st != KOLO_OK) {
        fprintf(stderr, "kolo-bench: rank %d: warm-up failed: %s\n", me, kolo_last_error());
        kolo_shutdown();
        return 1;
    }
    long total_wrong = 0;
    /* --calls: the timed calls' times at the current size, out of place then in place */
    double *percall = o->calls && o->iters ? calloc(2 * (size_t)o->iters, sizeof(double)) : NULL;
    double bw_sum = 0;
    int bw_n = 0;
    int failed = 0;
    if (o->calls && o->iters && !percall) {
        fprintf(stderr, "kolo-bench: rank %d: no memory for %d timings per size\n", me, 2 * o->iters);
        failed = 1;
    }
    for (size_t b = o->minb; b <= o->maxb && !failed;) {
        if (o->vs) {
            size_t bytes = b / unit * unit;
            failed = paired(&R, bytes ? bytes : unit, &total_wrong);
            b = next_size(o, b);
            continue;
        }
        size_t bytes = b / unit * unit;
        if (bytes == 0) bytes = unit;
        double t[2];
        long wrong[2] = {0, 0};
        for (int ip = 0; ip < 2 && !failed; ip++) {
            double *pc = percall ? percall + (size_t)ip * (size_t)o->iters : NULL;
            fill(&R, bytes, ip);
            for (int w = 0; w < o->warmup; w++) {
                if ((st = call(&R, bytes, ip)) != KOLO_OK) break;
            }
            if (st == KOLO_OK) st = kolo_barrier(KOLO_WORLD);
            if (me == 0) bench_perf_ctl(1);
            double t0 = now_us();
            for (int it = 0; it < o->iters && st == KOLO_OK; it++) {
                double tc = pc ? now_us() : 0;
                st = call(&R, bytes, ip);
                if (pc) pc[it] = now_us() - tc;
            }
            t[ip] = (now_us() - t0) / (o->iters ? o->iters : 1);
            if (me == 0) bench_perf_ctl(0);
            if (st == KOLO_OK && pc) st = kolo_allreduce(pc, pc, (size_t)o->iters, KOLO_FLOAT64, KOLO_MAX, 1.0, 1.0, KOLO_WORLD);
            /* checked after the timed calls, as nccl-tests and mpi_coll_bench do: filling and
             * reading the buffers between the warm-up and the timed calls slowed the first few
             * timed calls 1.5-2.6x (bench/README.md); after a barrier, so that no rank fills while
             * rank 0 still has a profile sampling (bench_perf_ctl) */
            if (st == KOLO_OK && o->check) st = kolo_barrier(KOLO_WORLD);
            if (st == KOLO_OK && o->check) {
                fill(&R, bytes, ip);
                st = call(&R, bytes, ip);
                if (st == KOLO_OK) wrong[ip] = check(&R, bytes);
            }
            if (st != KOLO_OK) {
                fprintf(stderr, "kolo-bench: rank %d: %s failed at %zu bytes: %s\n", me, coll_names[o->coll], bytes,
                        kolo_last_error());
                failed = 1;
                break;
            }
            t[ip] = reduce_time(t[ip], o->avg_mode);
            long wl[1] = {wrong[ip]}, wsum[1];
            if (kolo_allreduce(wl, wsum, 1, KOLO_INT64, KOLO_SUM, 1.0, 1.0, KOLO_WORLD) == KOLO_OK) wrong[ip] = wsum[0];
        }
        if (failed) break;
        total_wrong += wrong[0] + wrong[1];
        if (me == 0) {
            char cols[2][3][32];
            for (int ip = 0; ip < 2; ip++) {
                double algbw = (double)bytes / (t[ip] * 1e3);
                double busbw = algbw * busbw_factor(o->coll, n);
                fmt_num(cols[ip][0], 32, t[ip]);
                fmt_num(cols[ip][1], 32, algbw);
                fmt_num(cols[ip][2], 32, busbw);
                bw_sum += busbw;
            }
            bw_n += 2;
            char root[16];
            snprintf(root, sizeof(root), "%d", o->coll == BROADCAST ? o->root : -1);
            char w0[16], w1[16];
            if (o->check) {
                snprintf(w0, sizeof(w0), "%ld", wrong[0]);
                snprintf(w1, sizeof(w1), "%ld", wrong[1]);
            } else {
                snprintf(w0, sizeof(w0), "N/A");
                snprintf(w1, sizeof(w1), "N/A");
            }
            printf("%12zu %12zu %8s %6s %6s %8s %7s %7s %6s %8s %7s %7s %6s\n", bytes, bytes / R.es,
                   kolo_dtype_name(o->dtype),
                   (o->coll == ALLREDUCE || o->coll == REDUCESCATTER) ? kolo_op_name(o->op) : "none", root, cols[0][0],
                   cols[0][1], cols[0][2], w0, cols[1][0], cols[1][1], cols[1][2], w1);
            for (int ip = 0; percall && ip < 2; ip++) {
                printf("# calls %zu %s:", bytes, ip ? "in-place" : "out-of-place");
                for (int it = 0; it < o->iters; it++) printf(" %.2f", percall[(size_t)ip * (size_t)o->iters + it]);
                printf("\n");
            }
            fflush(stdout);
        }
        b = next_size(o, b);
    }
    if (me == 0 && !failed) {
        printf("# Out of bounds values : %ld %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
        if (!o->vs) printf("# Avg bus bandwidth    : %g\n", bw_n ? bw_sum / bw_n : 0.0);
        if (n > 1 && kolo__shm_cma_state(kolo__W.mesh[KOLO_CHANNEL_DIRECT]->conns[1]) == 2) {
            uint64_t got[2];
            kolo__shm_large_received(kolo__W.mesh[KOLO_CHANNEL_DIRECT]->conns[1], got);
            printf("# Large messages from rank 1: %llu by ring copies, %llu single-copy\n", (unsigned long long)got[0],
                   (unsigned long long)got[1]);
        }
        printf("#\n# Collective test concluded: kolo-bench %s\n", coll_names[o->coll]);
    }
    kolo_shutdown();
    free(percall);
    for (int k = 0; k < nsides && !(k == 1 && o->vs == 1); k++) {
        side *sd = &R.sides[k];
        if (sd->mem == MEM_KOLO) {
            kolo_mem_free(sd->send);
            kolo_mem_free(sd->recv);
        } else {
            free(sd->send);
            free(sd->recv);
        }
    }
    return failed ? 1 : (total_wrong ? 3 : 0);
}

static int bench_rank(void *arg) { return bench(arg); }

int main(int argc, char **argv)
{
    opts o = {.coll = ALLREDUCE, .minb = 8, .maxb = 64u << 20, .factor = 2, .iters = 20, .warmup = 5, .check = 1, .bind = 1,
              .dtype = KOLO_FLOAT32, .op = KOLO_SUM, .avg_mode = 1};
    int i = 1;
    if (i < argc && argv[i][0] != '-') {
        int found = 0;
        for (int c = 0; c < 5; c++)
            if (strcmp(argv[i], coll_names[c]) == 0) {
                o.coll = (enum coll)c;
                found = 1;
            }
        if (!found) {
            fprintf(stderr, "kolo-bench: unknown collective '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
        i++;
    }
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--version")) {
            printf("%s\n", kolo_build_info());
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "kolo-bench: %s needs a value\n", a);
            return 2;
        }
        const char *v = argv[++i];
        char *end = NULL;
        int bad = 0;
        if (!strcmp(a, "-b")) bad = parse_size(v, &o.minb);
        else if (!strcmp(a, "-e")) bad = parse_size(v, &o.maxb);
        else if (!strcmp(a, "-i")) bad = parse_size(v, &o.step);
        else if (!strcmp(a, "-f")) o.factor = strtod(v, &end), bad = *end || o.factor <= 1.0;
        else if (!strcmp(a, "-n")) o.iters = (int)strtol(v, &end, 10), bad = *end || o.iters < 0;
        else if (!strcmp(a, "-w")) o.warmup = (int)strtol(v, &end, 10), bad = *end || o.warmup < 0;
        else if (!strcmp(a, "-W")) o.warm_ms = strtod(v, &end), bad = *end || !(o.warm_ms >= 0 && o.warm_ms <= 60000);
        else if (!strcmp(a, "-c")) o.check = (int)strtol(v, &end, 10), bad = *end;
        else if (!strcmp(a, "-r")) o.root = (int)strtol(v, &end, 10), bad = *end || o.root < 0;
        else if (!strcmp(a, "-a")) o.avg_mode = (int)strtol(v, &end, 10), bad = *end || o.avg_mode < 0 || o.avg_mode > 3;
        else if (!strcmp(a, "--bind")) o.bind = !strcmp(v, "core"), bad = !o.bind && strcmp(v, "none");
        else if (!strcmp(a, "--mem")) bad = parse_mem(v, &o.mem);
        else if (!strcmp(a, "-np")) o.np = (int)strtol(v, &end, 10), bad = *end || o.np < 1 || o.np > 256;
        else if (!strcmp(a, "-d")) bad = parse_dtype(v, &o.dtype);
        else if (!strcmp(a, "--vs")) {
            if (!strcmp(v, "mem")) o.vs = 2;
            else o.vs = 1, bad = parse_dtype(v, &o.vs_dtype);
        }
        else if (!strcmp(a, "-o")) bad = parse_op(v, &o.op);
        else if (!strcmp(a, "--calls")) o.calls = (int)strtol(v, &end, 10), bad = *end || o.calls < 0 || o.calls > 1;
        else {
            fprintf(stderr, "kolo-bench: unknown flag '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "kolo-bench: bad value '%s' for %s\n", v, a);
            return 2;
        }
    }
    if (o.calls && o.vs) {
        fprintf(stderr, "kolo-bench: --calls is for the sweep; paired mode (--vs) prints medians of its pairs\n");
        return 2;
    }
    if (o.minb > o.maxb) {
        fprintf(stderr, "kolo-bench: -b %zu is larger than -e %zu\n", o.minb, o.maxb);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    bool launched = getenv("KOLO_RANK") || getenv("HOROVOD_RANK") || getenv("RANK") ||
                    getenv("OMPI_COMM_WORLD_RANK") || getenv("PMI_RANK") || getenv("PMIX_RANK") || getenv("SLURM_PROCID");
    if (o.np > 1 && !launched) return bench_local_job(o.np, o.bind, "kolo-bench", bench_rank, &o);
    return bench(&o);
}

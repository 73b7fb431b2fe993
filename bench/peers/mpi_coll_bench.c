/*
 * mpi_coll_bench.c - a small collectives benchmark against mpi.h, printing nccl-tests' columns.
 *
 * It is the MPI peers' side of bench/compare.py: the same program is built with each MPI's own
 * compiler wrapper (mpicc.openmpi, mpicc.mpich) and prints the same rows as build/bin/kolo-bench:
 *
 *   size count type redop root | time algbw busbw #wrong (out-of-place) | the same (in-place)
 *
 * Usage:
 *   mpirun -np N mpi_coll_bench <coll>[,<coll>...] [-b 8] [-e 256M] [-f 2] [-n 20] [-w 5]
 *          [-c 1] [-d float32[,float16]] [-o sum] [-r 0] [-B bands] [-W ms]
 *
 *   coll   allreduce | allgather | broadcast | reducescatter | alltoall   (or "all")
 *   -B     a list of bands "lo:hi:iters:warmup[:factor],..." (sizes take K/M/G suffixes) that
 *          replaces -b/-e/-n/-w, so one launch runs several sweeps with fewer iterations (and
 *          optionally bigger steps) for big sizes.
 *   -W     before each collective's sweep, after the warm-up calls, keep calling at the first size
 *          until some rank has spent this many milliseconds (the ranks agree after every call): a
 *          machine that speeds up after its first moments of work meets the first timed size warm.
 *
 * time is the mean per-iteration time in microseconds over -n iterations after -w warmups, averaged
 * over ranks (nccl-tests' default -a 1). algbw = size / time (GB/s, 1e9); busbw = algbw times
 * 2(n-1)/n for allreduce, (n-1)/n for allgather, reducescatter and alltoall, 1 for broadcast.
 *
 * float16: MPI 3.1 has no half-precision type. float16 data is sent as a contiguous 2-byte type and
 * reduced with a user-defined commutative op (F16C conversions when the CPU has them). That is what
 * an application has to do, but it also keeps the MPI on its generic user-op path.
 *
 * Broadcast has a single buffer in MPI, so its out-of-place and in-place rows run the same call.
 */
#include <mpi.h>

#include "../bench_mem.h"
#include "../perf_ctl.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

enum coll { C_ALLREDUCE, C_ALLGATHER, C_BROADCAST, C_REDUCESCATTER, C_ALLTOALL, C_COUNT };
static const char *const coll_names[C_COUNT] = {
  "allreduce", "allgather", "broadcast", "reducescatter", "alltoall"
};

enum dtype { D_FLOAT32, D_FLOAT16 };

struct band {
  size_t lo, hi;
  int iters, warmup;
  double factor; /* 0: the -f factor */
};

#define MAX_BANDS 16

struct opts {
  int colls[C_COUNT];
  int ncolls;
  int dtypes[2];
  int ndtypes;
  struct band bands[MAX_BANDS];
  int nbands;
  double factor;
  int check;
  int root;
  double warm_ms;
  int calls; /* -C 1: every timed call's time (the slowest rank's) after each size */
  int huge;  /* -H 1: buffers in transparent huge pages (bench_mem.h), as kolo-bench --mem thp */
};

static int g_rank, g_size;
static MPI_Datatype g_half;   /* contiguous 2 bytes */
static MPI_Op g_half_sum;

/* ---------- half precision ---------- */

/* Exact for the small integers the check uses; rounds to nearest-even otherwise. */
static uint16_t f32_to_f16(float f)
{
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffffu;
  if (((x >> 23) & 0xff) == 0xff)
    return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
  if (exp >= 31)
    return (uint16_t)(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10)
      return (uint16_t)sign;
    mant |= 0x800000u;
    uint32_t shift = (uint32_t)(14 - exp);
    uint32_t h = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1)))
      h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((uint32_t)exp << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
    h++;
  return (uint16_t)(sign | h);
}

static float f16_to_f32(uint16_t h)
{
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {
      exp = 127 - 15 + 1;
      while (!(mant & 0x400u)) {
        mant <<= 1;
        exp--;
      }
      x = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  memcpy(&f, &x, 4);
  return f;
}

#if HAVE_X86
__attribute__((target("avx,f16c")))
static void half_sum_f16c(const uint16_t *in, uint16_t *inout, size_t n)
{
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(in + i)));
    __m256 b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(inout + i)));
    __m128i r = _mm256_cvtps_ph(_mm256_add_ps(a, b), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128((__m128i *)(void *)(inout + i), r);
  }
  for (; i < n; i++)
    inout[i] = f32_to_f16(f16_to_f32(in[i]) + f16_to_f32(inout[i]));
}
static int g_has_f16c;
#endif

static void half_sum(void *invec, void *inoutvec, int *len, MPI_Datatype *dt)
{
  (void)dt;
  const uint16_t *in = invec;
  uint16_t *inout = inoutvec;
  size_t n = (size_t)*len;
#if HAVE_X86
  if (g_has_f16c) {
    half_sum_f16c(in, inout, n);
    return;
  }
#endif
  for (size_t i = 0; i < n; i++)
    inout[i] = f32_to_f16(f16_to_f32(in[i]) + f16_to_f32(inout[i]));
}

/* ---------- data and checking ---------- */

/* Small integers: sums over up to 64 ranks stay exact in float16. */
static float pattern(int rank, size_t i)
{
  return (float)((i % 29u + (size_t)rank * 3u) % 16u);
}

static size_t type_size(int dt) { return dt == D_FLOAT16 ? 2 : 4; }

static void store(void *buf, int dt, size_t i, float v)
{
  if (dt == D_FLOAT16)
    ((uint16_t *)buf)[i] = f32_to_f16(v);
  else
    ((float *)buf)[i] = v;
}

/* What element i holds: rank r's input (r >= 0), or the sum of every rank's input (r < 0). */
static float expected_value(int r, size_t i)
{
  if (r >= 0)
    return pattern(r, i);
  float s = 0;
  for (int q = 0; q < g_size; q++)
    s += pattern(q, i);
  return s;
}

#define PERIOD 29u /* pattern() repeats every 29 elements */

/* Fills elements [0, count) of buf with expected_value(r, off + i): computes one stretch that is a
 * multiple of the period, then doubles it with memcpy, so big buffers fill at memory speed. */
static void fill(void *buf, int dt, size_t count, int r, size_t off)
{
  size_t ts = type_size(dt), head = count < PERIOD * 64 ? count : PERIOD * 64;
  for (size_t i = 0; i < head; i++)
    store(buf, dt, i, expected_value(r, off + i));
  for (size_t done = head; done < count;) {
    size_t n = done < count - done ? done : count - done;
    memcpy((char *)buf + done * ts, buf, n * ts);
    done += n;
  }
}

/* Number of elements of got[0, count) that differ from ref (bitwise: every value is exact). */
static long compare(const void *got, const void *ref, int dt, size_t count)
{
  size_t ts = type_size(dt);
  if (!memcmp(got, ref, count * ts))
    return 0;
  long wrong = 0;
  for (size_t i = 0; i < count; i++)
    wrong += memcmp((const char *)got + i * ts, (const char *)ref + i * ts, ts) != 0;
  return wrong;
}

/* ---------- one measurement ---------- */

struct sizes {
  size_t count;     /* nccl-tests' count: size / type size */
  size_t percount;  /* per-rank block for allgather/reducescatter/alltoall, = count otherwise */
  size_t bytes;     /* nccl-tests' size */
};

static struct sizes sizes_for(int c, int dt, size_t req)
{
  struct sizes s;
  size_t ts = type_size(dt);
  size_t count = req / ts;
  if (c == C_ALLGATHER || c == C_REDUCESCATTER || c == C_ALLTOALL) {
    s.percount = count / (size_t)g_size;
    s.count = s.percount * (size_t)g_size;
  } else {
    s.percount = count;
    s.count = count;
  }
  s.bytes = s.count * ts;
  return s;
}

static double bus_factor(int c)
{
  double n = g_size;
  switch (c) {
  case C_ALLREDUCE: return 2.0 * (n - 1) / n;
  case C_BROADCAST: return 1.0;
  default: return (n - 1) / n;
  }
}

static void run_once(int c, int dt, const struct sizes *s, void *sbuf, void *rbuf, int inplace,
                     int root)
{
  MPI_Datatype t = dt == D_FLOAT16 ? g_half : MPI_FLOAT;
  MPI_Op op = dt == D_FLOAT16 ? g_half_sum : MPI_SUM;
  int cnt = (int)s->count, per = (int)s->percount;
  switch (c) {
  case C_ALLREDUCE:
    MPI_Allreduce(inplace ? MPI_IN_PLACE : sbuf, rbuf, cnt, t, op, MPI_COMM_WORLD);
    break;
  case C_ALLGATHER:
    if (inplace)
      MPI_Allgather(MPI_IN_PLACE, 0, t, rbuf, per, t, MPI_COMM_WORLD);
    else
      MPI_Allgather(sbuf, per, t, rbuf, per, t, MPI_COMM_WORLD);
    break;
  case C_BROADCAST:
    MPI_Bcast(rbuf, cnt, t, root, MPI_COMM_WORLD);
    break;
  case C_REDUCESCATTER:
    if (inplace)
      MPI_Reduce_scatter_block(MPI_IN_PLACE, rbuf, per, t, op, MPI_COMM_WORLD);
    else
      MPI_Reduce_scatter_block(sbuf, rbuf, per, t, op, MPI_COMM_WORLD);
    break;
  case C_ALLTOALL:
    if (inplace)
      MPI_Alltoall(MPI_IN_PLACE, 0, t, rbuf, per, t, MPI_COMM_WORLD);
    else
      MPI_Alltoall(sbuf, per, t, rbuf, per, t, MPI_COMM_WORLD);
    break;
  default:
    break;
  }
}

/* Puts each rank's input where the call expects it. */
static void prepare(int c, int dt, const struct sizes *s, void *sbuf, void *rbuf, int inplace,
                    int root)
{
  size_t ts = type_size(dt);
  void *in = inplace ? rbuf : sbuf;
  switch (c) {
  case C_ALLREDUCE:
    fill(in, dt, s->count, g_rank, 0);
    break;
  case C_ALLGATHER:
    if (inplace)
      fill((char *)rbuf + (size_t)g_rank * s->percount * ts, dt, s->percount, g_rank, 0);
    else
      fill(sbuf, dt, s->percount, g_rank, 0);
    break;
  case C_BROADCAST:
    if (g_rank == root)
      fill(rbuf, dt, s->count, root, 0);
    else
      memset(rbuf, 0, s->bytes);
    break;
  case C_REDUCESCATTER:
  case C_ALLTOALL:
    fill(in, dt, s->count, g_rank, 0);
    break;
  default:
    break;
  }
}

/* Number of wrong elements in this rank's result rbuf; scratch (the send buffer, no longer
 * needed) receives the expected result. */
static long verify(int c, int dt, const struct sizes *s, const void *rbuf, void *scratch, int root)
{
  size_t per = s->percount, ts = type_size(dt);
  switch (c) {
  case C_ALLREDUCE:
    fill(scratch, dt, s->count, -1, 0);
    return compare(rbuf, scratch, dt, s->count);
  case C_ALLGATHER:
    for (int r = 0; r < g_size; r++)
      fill((char *)scratch + (size_t)r * per * ts, dt, per, r, 0);
    return compare(rbuf, scratch, dt, s->count);
  case C_BROADCAST:
    fill(scratch, dt, s->count, root, 0);
    return compare(rbuf, scratch, dt, s->count);
  case C_REDUCESCATTER:
    fill(scratch, dt, per, -1, (size_t)g_rank * per);
    return compare(rbuf, scratch, dt, per);
  case C_ALLTOALL: /* block r of my result is block g_rank of rank r's input */
    for (int r = 0; r < g_size; r++)
      fill((char *)scratch + (size_t)r * per * ts, dt, per, r, (size_t)g_rank * per);
    return compare(rbuf, scratch, dt, s->count);
  default:
    return 0;
  }
}

/* Runs warmup + timed iterations; returns the rank-averaged time per iteration (us) and, when
 * checking, the number of wrong elements summed over ranks in *wrong. */
static double measure(int c, int dt, const struct sizes *s, void *sbuf, void *rbuf, int inplace,
                      const struct opts *o, const struct band *b, long *wrong, double *percall)
{
  prepare(c, dt, s, sbuf, rbuf, inplace, o->root);
  for (int i = 0; i < b->warmup; i++)
    run_once(c, dt, s, sbuf, rbuf, inplace, o->root);
  MPI_Barrier(MPI_COMM_WORLD);
  int me;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  if (me == 0) bench_perf_ctl(1);
  double t0 = MPI_Wtime();
  for (int i = 0; i < b->iters; i++) {
    double tc = percall ? MPI_Wtime() : 0;
    run_once(c, dt, s, sbuf, rbuf, inplace, o->root);
    if (percall)
      percall[i] = (MPI_Wtime() - tc) * 1e6;
  }
  double t = (MPI_Wtime() - t0) / b->iters;
  if (me == 0) bench_perf_ctl(0);
  if (percall)
    MPI_Allreduce(MPI_IN_PLACE, percall, b->iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  double tsum = 0;
  MPI_Allreduce(&t, &tsum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  *wrong = -1;
  if (o->check) {
    prepare(c, dt, s, sbuf, rbuf, inplace, o->root);
    run_once(c, dt, s, sbuf, rbuf, inplace, o->root);
    long w = verify(c, dt, s, rbuf, sbuf, o->root), wsum = 0;
    MPI_Allreduce(&w, &wsum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    *wrong = wsum;
  }
  return tsum / g_size * 1e6;
}

static void fmt_time(char *out, size_t n, double us)
{
  if (us >= 10000.0)
    snprintf(out, n, "%7.0f", us);
  else if (us >= 100.0)
    snprintf(out, n, "%7.1f", us);
  else
    snprintf(out, n, "%7.2f", us);
}

static void fmt_wrong(char *out, size_t n, long w)
{
  if (w < 0)
    snprintf(out, n, "%6s", "N/A");
  else
    snprintf(out, n, "%6ld", w);
}

static void print_header(int c, int dt, const struct opts *o, const char *lib)
{
  if (g_rank)
    return;
  printf("# Collective test starting: %s\n", coll_names[c]);
  printf("# mpi_coll_bench (%s) nranks %d type %s", lib, g_size,
         dt == D_FLOAT16 ? "float16 (2-byte type + user op)" : "float32");
  printf(" validation: %d bands:", o->check);
  for (int i = 0; i < o->nbands; i++)
    printf(" %zu-%zu(n%d,w%d,f%g)", o->bands[i].lo, o->bands[i].hi, o->bands[i].iters,
           o->bands[i].warmup, o->bands[i].factor > 1.0 ? o->bands[i].factor : o->factor);
  printf("\n#\n");
  printf("#                                                              out-of-place"
         "                       in-place\n");
  printf("#       size         count      type   redop    root     time   algbw   busbw #wrong"
         "     time   algbw   busbw #wrong\n");
  printf("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)      "
         "      (us)  (GB/s)  (GB/s)\n");
  fflush(stdout);
}

/* Returns the sum of out-of-place busbw and the number of rows, for the footer. */
static int run_sweep(int c, int dt, const struct opts *o, void *sbuf, void *rbuf, double *bwsum,
                     int *rows)
{
  int errs = 0;
  size_t last = 0;
  for (int bi = 0; bi < o->nbands; bi++) {
    const struct band *b = &o->bands[bi];
    /* like nccl-tests: warm up at the largest, then at the smallest size before the sweep */
    struct sizes shi = sizes_for(c, dt, b->hi), slo = sizes_for(c, dt, b->lo);
    for (int i = 0; i < b->warmup && shi.percount > 0; i++)
      run_once(c, dt, &shi, sbuf, rbuf, 0, o->root);
    for (int i = 0; i < b->warmup && slo.percount > 0; i++)
      run_once(c, dt, &slo, sbuf, rbuf, 0, o->root);
    if (bi == 0 && o->warm_ms > 0 && slo.percount > 0) { /* -W */
      double t0 = MPI_Wtime();
      for (int done = 0; !done;) {
        run_once(c, dt, &slo, sbuf, rbuf, 0, o->root);
        int mine = (MPI_Wtime() - t0) * 1e3 >= o->warm_ms;
        MPI_Allreduce(&mine, &done, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
      }
    }
    for (size_t req = b->lo; req <= b->hi;) {
      struct sizes s = sizes_for(c, dt, req);
      if (req > last && s.percount > 0) { /* bands may overlap: no size twice */
        long w_oop, w_ip;
        double *pc = o->calls ? calloc(2 * (size_t)b->iters, sizeof(double)) : NULL;
        if (o->calls && !pc) {
          fprintf(stderr, "mpi_coll_bench: no memory for %d timings\n", 2 * b->iters);
          MPI_Abort(MPI_COMM_WORLD, 1);
        }
        double t_oop = measure(c, dt, &s, sbuf, rbuf, 0, o, b, &w_oop, pc);
        double t_ip = measure(c, dt, &s, sbuf, rbuf, 1, o, b, &w_ip, pc ? pc + b->iters : NULL);
        if (w_oop > 0 || w_ip > 0)
          errs++;
        if (g_rank == 0) {
          double alg_o = (double)s.bytes / 1e3 / t_oop, alg_i = (double)s.bytes / 1e3 / t_ip;
          double f = bus_factor(c);
          char to[32], ti[32], wo[32], wi[32];
          fmt_time(to, sizeof to, t_oop);
          fmt_time(ti, sizeof ti, t_ip);
          fmt_wrong(wo, sizeof wo, w_oop);
          fmt_wrong(wi, sizeof wi, w_ip);
          printf("%12zu  %12zu  %8s  %6s  %6d  %7s  %6.2f  %6.2f  %6s  %7s  %6.2f  %6.2f  %6s\n",
                 s.bytes, s.count, dt == D_FLOAT16 ? "float16" : "float32",
                 (c == C_ALLREDUCE || c == C_REDUCESCATTER) ? "sum" : "none",
                 c == C_BROADCAST ? o->root : -1, to, alg_o, alg_o * f, wo, ti, alg_i, alg_i * f,
                 wi);
          for (int ip = 0; pc && ip < 2; ip++) {
            printf("# calls %zu %s:", s.bytes, ip ? "in-place" : "out-of-place");
            for (int i = 0; i < b->iters; i++)
              printf(" %.2f", pc[(size_t)ip * b->iters + i]);
            printf("\n");
          }
          fflush(stdout);
          *bwsum += alg_o * f;
          (*rows)++;
        }
        free(pc);
      }
      last = req > last ? req : last;
      size_t next = (size_t)((double)req * (b->factor > 1.0 ? b->factor : o->factor));
      req = next > req ? next : req + 1;
    }
  }
  return errs;
}

/* ---------- options ---------- */

static size_t parse_size(const char *s)
{
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || v < 0) {
    fprintf(stderr, "mpi_coll_bench: bad size '%s'\n", s);
    exit(2);
  }
  switch (*end) {
  case 'k': case 'K': v *= 1024.0; break;
  case 'm': case 'M': v *= 1024.0 * 1024.0; break;
  case 'g': case 'G': v *= 1024.0 * 1024.0 * 1024.0; break;
  default: break;
  }
  return (size_t)v;
}

static void parse_bands(struct opts *o, const char *spec)
{
  char *copy = strdup(spec), *save = NULL;
  o->nbands = 0;
  for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char lo[64], hi[64];
    int it, wu;
    double f = 0;
    int got = sscanf(tok, "%63[^:]:%63[^:]:%d:%d:%lf", lo, hi, &it, &wu, &f);
    if (o->nbands == MAX_BANDS || got < 4 || it < 1 || wu < 0 || (got == 5 && f <= 1.0)) {
      fprintf(stderr, "mpi_coll_bench: bad band '%s' (want lo:hi:iters:warmup[:factor])\n", tok);
      exit(2);
    }
    o->bands[o->nbands++] = (struct band){parse_size(lo), parse_size(hi), it, wu, f};
  }
  free(copy);
}

static void usage(void)
{
  fprintf(stderr,
          "usage: mpi_coll_bench <coll>[,<coll>...]|all [-b minbytes] [-e maxbytes] [-f factor]\n"
          "       [-n iters] [-w warmup] [-c 0|1] [-d float32[,float16]] [-o sum] [-r root]\n"
          "       [-B lo:hi:iters:warmup[:factor],...] [-W ms] [-C 0|1] [-H 0|1]\n"
          "  -C 1: after each size's row, every timed call's time in us, the slowest rank's\n"
          "  -H 1: buffers in 2 MiB pages (madvise MADV_HUGEPAGE), as kolo-bench --mem thp\n");
  exit(2);
}

static void parse_opts(int argc, char **argv, struct opts *o)
{
  size_t lo = 8, hi = 256u << 20;
  int iters = 20, warmup = 5;
  const char *bands = NULL;
  memset(o, 0, sizeof *o);
  o->factor = 2;
  o->check = 1;
  o->dtypes[0] = D_FLOAT32;
  o->ndtypes = 1;
  if (argc < 2 || argv[1][0] == '-')
    usage();
  char *copy = strdup(argv[1]), *save = NULL;
  for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    int found = 0;
    for (int c = 0; c < C_COUNT; c++) {
      if (!strcmp(tok, "all") || !strcmp(tok, coll_names[c])) {
        o->colls[o->ncolls++] = c;
        found = 1;
      }
    }
    if (!found || o->ncolls > C_COUNT) {
      fprintf(stderr, "mpi_coll_bench: unknown collective '%s'\n", tok);
      exit(2);
    }
  }
  free(copy);
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i];
    if (a[0] != '-' || !a[1] || a[2] || i + 1 >= argc)
      usage();
    const char *v = argv[++i];
    switch (a[1]) {
    case 'b': lo = parse_size(v); break;
    case 'e': hi = parse_size(v); break;
    case 'f': o->factor = atof(v); break;
    case 'n': iters = atoi(v); break;
    case 'w': warmup = atoi(v); break;
    case 'c': o->check = atoi(v); break;
    case 'r': o->root = atoi(v); break;
    case 'B': bands = v; break;
    case 'W': o->warm_ms = atof(v); break;
    case 'C': o->calls = atoi(v); break;
    case 'H': o->huge = atoi(v); break;
    case 'o':
      if (strcmp(v, "sum")) {
        fprintf(stderr, "mpi_coll_bench: only -o sum is measured\n");
        exit(2);
      }
      break;
    case 'd': {
      o->ndtypes = 0;
      char *dc = strdup(v), *sv = NULL;
      for (char *tok = strtok_r(dc, ",", &sv); tok; tok = strtok_r(NULL, ",", &sv)) {
        if (o->ndtypes == 2)
          usage();
        if (!strcmp(tok, "float32") || !strcmp(tok, "float"))
          o->dtypes[o->ndtypes++] = D_FLOAT32;
        else if (!strcmp(tok, "float16") || !strcmp(tok, "half"))
          o->dtypes[o->ndtypes++] = D_FLOAT16;
        else {
          fprintf(stderr, "mpi_coll_bench: unknown type '%s'\n", tok);
          exit(2);
        }
      }
      free(dc);
      break;
    }
    default: usage();
    }
  }
  if (o->factor <= 1.0 || iters < 1 || warmup < 0 || !(o->warm_ms >= 0 && o->warm_ms <= 60000) || o->calls < 0 ||
      o->calls > 1 || o->huge < 0 || o->huge > 1)
    usage();
  if (bands)
    parse_bands(o, bands);
  else
    o->bands[o->nbands++] = (struct band){lo, hi, iters, warmup, 0};
}

int main(int argc, char **argv)
{
  struct opts o;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  parse_opts(argc, argv, &o);
  if (o.root < 0 || o.root >= g_size)
    o.root = 0;
#if HAVE_X86
  __builtin_cpu_init();
  g_has_f16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
#endif
  MPI_Type_contiguous(2, MPI_BYTE, &g_half);
  MPI_Type_commit(&g_half);
  MPI_Op_create(half_sum, 1, &g_half_sum);

  char lib[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(lib, &len);
  char *nl = strchr(lib, '\n');
  if (nl)
    *nl = 0;
  if (strlen(lib) > 60)
    lib[60] = 0;

  size_t maxb = 0;
  for (int i = 0; i < o.nbands; i++)
    if (o.bands[i].hi > maxb)
      maxb = o.bands[i].hi;
  maxb = (maxb + 64 + 63) / 64 * 64;
  /* As kolo-bench allocates (and PyTorch's CPU allocator): 64-byte aligned, which glibc puts 64
   * bytes into a page for large buffers. Where a buffer starts in its page matters to every
   * library's copies on some CPUs (REP MOVSB, see src/net/tcp.c, "filler"): both benchmarks
   * start theirs alike. */
  void *sbuf = o.huge ? bench_alloc_huge(maxb) : aligned_alloc(64, maxb);
  void *rbuf = o.huge ? bench_alloc_huge(maxb) : aligned_alloc(64, maxb);
  if (!sbuf || !rbuf) {
    fprintf(stderr, "mpi_coll_bench: out of memory for %zu-byte buffers\n", maxb);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  memset(sbuf, 0, maxb);
  memset(rbuf, 0, maxb);
  if (o.huge && g_rank == 0)
    bench_huge_report("");

  int errs = 0;
  for (int di = 0; di < o.ndtypes; di++) {
    for (int ci = 0; ci < o.ncolls; ci++) {
      double bwsum = 0;
      int rows = 0;
      print_header(o.colls[ci], o.dtypes[di], &o, lib);
      int e = run_sweep(o.colls[ci], o.dtypes[di], &o, sbuf, rbuf, &bwsum, &rows);
      errs += e;
      if (g_rank == 0) {
        printf("# Out of bounds values : %d %s\n", e, e ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %g\n#\n", rows ? bwsum / rows : 0.0);
        printf("# Collective test concluded: %s\n", coll_names[o.colls[ci]]);
        fflush(stdout);
      }
    }
  }
  free(sbuf);
  free(rbuf);
  MPI_Op_free(&g_half_sum);
  MPI_Type_free(&g_half);
  MPI_Finalize();
  return errs ? 1 : 0;
}

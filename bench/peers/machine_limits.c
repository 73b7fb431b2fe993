/*
 * machine_limits.c - what this machine's memory system and cores allow, for bench/compare.py.
 *
 * Measures, out of cache unless said:
 *   memcpy (glibc) and memcpy with non-temporal stores, 1 and 2 threads, GB/s copied;
 *   streaming float32 a[i] += b[i], 1 and 2 threads, GB/s of a;
 *   float32 c[i] = a[i] + b[i] with non-temporal stores (a reduction into a third buffer, as a
 *   collective reduces two ranks' inputs into an output), 1 and 2 threads, GB/s of c;
 *   memcpy and add in L2 (two 128 KiB buffers), 1 thread;
 *   8-byte one-way latency between 2 processes spinning on a shared-memory flag.
 * and derives the DRAM traffic rate used for the memory-traffic bound: the best, over the kernels,
 * of bytes read plus bytes written per second with all threads (memcpy: 2 x copied; add: 3 x a;
 * sum into c: 3 x c).
 *
 * Usage: machine_limits [-s MiB per thread buffer (default 256)] [-r repetitions (default 5)]
 *        machine_limits --ping   only the ping, its ends bound to cpus 0 and 1 (about 0.01 s)
 * Output: one "key value" line per figure (medians over repetitions), '#' lines are comments.
 */
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

enum kernel { K_MEMCPY, K_MEMCPY_NT, K_ADD, K_SUM_NT };

struct job {
  enum kernel k;
  char *src, *dst, *aux;
  size_t bytes;
  int reps;
  pthread_barrier_t *bar;
  double t0, t1;
};

static double now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#if HAVE_X86
__attribute__((target("avx")))
static void copy_nt(char *dst, const char *src, size_t n)
{
  size_t i = 0;
  /* buffers come from mmap, so they are page aligned */
  for (; i + 128 <= n; i += 128) {
    __m256i a = _mm256_load_si256((const __m256i *)(const void *)(src + i));
    __m256i b = _mm256_load_si256((const __m256i *)(const void *)(src + i + 32));
    __m256i c = _mm256_load_si256((const __m256i *)(const void *)(src + i + 64));
    __m256i d = _mm256_load_si256((const __m256i *)(const void *)(src + i + 96));
    _mm256_stream_si256((__m256i *)(void *)(dst + i), a);
    _mm256_stream_si256((__m256i *)(void *)(dst + i + 32), b);
    _mm256_stream_si256((__m256i *)(void *)(dst + i + 64), c);
    _mm256_stream_si256((__m256i *)(void *)(dst + i + 96), d);
  }
  _mm_sfence();
  memcpy(dst + i, src + i, n - i);
}
#else
static void copy_nt(char *dst, const char *src, size_t n) { memcpy(dst, src, n); }
#endif

#if HAVE_X86
__attribute__((target("avx")))
static void add_f32(float *restrict a, const float *restrict b, size_t n)
{
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (size_t k = 0; k < 32; k += 8)
      _mm256_store_ps(a + i + k, _mm256_add_ps(_mm256_load_ps(a + i + k),
                                               _mm256_load_ps(b + i + k)));
  }
  for (; i < n; i++)
    a[i] += b[i];
}
#else
static void add_f32(float *restrict a, const float *restrict b, size_t n)
{
  for (size_t i = 0; i < n; i++)
    a[i] += b[i];
}
#endif

#if HAVE_X86
__attribute__((target("avx")))
static void sum_nt_f32(float *restrict c, const float *restrict a, const float *restrict b, size_t n)
{
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (size_t k = 0; k < 32; k += 8)
      _mm256_stream_ps(c + i + k, _mm256_add_ps(_mm256_load_ps(a + i + k),
                                                _mm256_load_ps(b + i + k)));
  }
  _mm_sfence();
  for (; i < n; i++)
    c[i] = a[i] + b[i];
}
#else
static void sum_nt_f32(float *restrict c, const float *restrict a, const float *restrict b, size_t n)
{
  for (size_t i = 0; i < n; i++)
    c[i] = a[i] + b[i];
}
#endif

static void *worker(void *arg)
{
  struct job *j = arg;
  pthread_barrier_wait(j->bar);
  j->t0 = now();
  for (int r = 0; r < j->reps; r++) {
    switch (j->k) {
    case K_MEMCPY: memcpy(j->dst, j->src, j->bytes); break;
    case K_MEMCPY_NT: copy_nt(j->dst, j->src, j->bytes); break;
    case K_ADD: add_f32((float *)(void *)j->dst, (const float *)(const void *)j->src,
                        j->bytes / sizeof(float)); break;
    case K_SUM_NT: sum_nt_f32((float *)(void *)j->dst, (const float *)(const void *)j->src,
                              (const float *)(const void *)j->aux, j->bytes / sizeof(float)); break;
    }
  }
  j->t1 = now();
  return NULL;
}

static char *alloc(size_t bytes)
{
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("machine_limits: mmap");
    exit(1);
  }
  memset(p, 1, bytes); /* fault the pages in; also makes the floats small finite values */
  return p;
}

static int cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n)
{
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* GB/s (1e9) of `bytes` per thread per pass, over `threads` threads, median over `trials`. */
static double run_kernel(enum kernel k, int threads, size_t bytes, int inner, int trials,
                         char **src, char **dst, char **aux)
{
  double rates[64];
  if (trials > 64)
    trials = 64;
  for (int t = 0; t < trials; t++) {
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)threads);
    struct job jobs[8];
    pthread_t tid[8];
    for (int i = 0; i < threads; i++) {
      jobs[i] = (struct job){k, src[i], dst[i], aux[i], bytes, inner, &bar, 0, 0};
      if (i)
        pthread_create(&tid[i], NULL, worker, &jobs[i]);
    }
    worker(&jobs[0]);
    double t0 = jobs[0].t0, t1 = jobs[0].t1;
    for (int i = 1; i < threads; i++) {
      pthread_join(tid[i], NULL);
      if (jobs[i].t0 < t0)
        t0 = jobs[i].t0;
      if (jobs[i].t1 > t1)
        t1 = jobs[i].t1;
    }
    pthread_barrier_destroy(&bar);
    rates[t] = (double)bytes * inner * threads / (t1 - t0) / 1e9;
  }
  return median(rates, trials);
}

/* One-way latency (us) of an 8-byte message between two processes spinning on shared flags. */
static double shm_ping(int rounds, int trials, int bind_child)
{
  struct shared {
    _Alignas(64) volatile uint64_t ping;
    _Alignas(64) volatile uint64_t pong;
  };
  struct shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                           -1, 0);
  if (sh == MAP_FAILED) {
    perror("machine_limits: mmap shared");
    exit(1);
  }
  sh->ping = sh->pong = 0;
  uint64_t total = (uint64_t)rounds * (uint64_t)trials + 1;
  pid_t pid = fork();
  if (pid < 0) {
    perror("machine_limits: fork");
    exit(1);
  }
  if (pid == 0) {
    if (bind_child) {
      cpu_set_t other;
      CPU_ZERO(&other);
      CPU_SET(1, &other);
      (void)sched_setaffinity(0, sizeof(other), &other);
    }
    for (uint64_t i = 1; i <= total; i++) {
      while (__atomic_load_n(&sh->ping, __ATOMIC_ACQUIRE) != i)
        ;
      __atomic_store_n(&sh->pong, i, __ATOMIC_RELEASE);
    }
    _exit(0);
  }
  double lat[64];
  if (trials > 64)
    trials = 64;
  uint64_t seq = 0;
  /* first exchange: wait until the child runs */
  __atomic_store_n(&sh->ping, ++seq, __ATOMIC_RELEASE);
  while (__atomic_load_n(&sh->pong, __ATOMIC_ACQUIRE) != seq)
    ;
  for (int t = 0; t < trials; t++) {
    double t0 = now();
    for (int r = 0; r < rounds; r++) {
      __atomic_store_n(&sh->ping, ++seq, __ATOMIC_RELEASE);
      while (__atomic_load_n(&sh->pong, __ATOMIC_ACQUIRE) != seq)
        ;
    }
    lat[t] = (now() - t0) / rounds / 2 * 1e6;
  }
  waitpid(pid, NULL, 0);
  munmap(sh, sizeof *sh);
  return median(lat, trials);
}

int main(int argc, char **argv)
{
  size_t mib = 256;
  int reps = 5, ping_only = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--ping"))
      ping_only = 1;
    else if (!strcmp(argv[i], "-s") && i + 1 < argc)
      mib = (size_t)atol(argv[++i]);
    else if (!strcmp(argv[i], "-r") && i + 1 < argc)
      reps = atoi(argv[++i]);
    else
      mib = 0;
  }
  if (mib < 1 || reps < 1) {
    fprintf(stderr, "usage: machine_limits [-s MiB] [-r reps] [--ping]\n"
                    "  --ping  only the shared-memory ping between cpus 0 and 1, as benchmark ranks\n"
                    "          are placed (about 0.01 s): the harness runs it before every launch\n");
    return 2;
  }
  if (ping_only) {
    /* the two ends on cpus 0 and 1, where kolo-bench and mpirun put ranks 0 and 1 */
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(0, &one);
    int bound = sysconf(_SC_NPROCESSORS_ONLN) >= 2 && sched_setaffinity(0, sizeof(one), &one) == 0;
    printf("shm_ping_oneway_us %.3f\n", shm_ping(20000, 3, bound));
    return 0;
  }
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int maxthreads = ncpu >= 2 ? 2 : 1;
  size_t bytes = mib << 20;
  char *src[2], *dst[2], *aux[2];
  for (int i = 0; i < maxthreads; i++) {
    src[i] = alloc(bytes);
    dst[i] = alloc(bytes);
    aux[i] = alloc(bytes);
  }

  printf("# machine_limits: %ld online cpus, %zu MiB per thread and buffer, median of %d\n", ncpu,
         mib, reps);
  double best_traffic = 0;
  struct {
    const char *name;
    enum kernel k;
    double traffic_per_byte; /* bytes read + written per byte counted */
  } ks[] = {
    {"memcpy", K_MEMCPY, 2.0},
    {"memcpy_nt", K_MEMCPY_NT, 2.0},
    {"add_f32", K_ADD, 3.0},
    {"sum_nt_f32", K_SUM_NT, 3.0},
  };
  for (size_t k = 0; k < sizeof ks / sizeof ks[0]; k++) {
    for (int th = 1; th <= maxthreads; th++) {
      double r = run_kernel(ks[k].k, th, bytes, 1, reps, src, dst, aux);
      printf("%s_%dt_GBps %.2f\n", ks[k].name, th, r);
      fflush(stdout);
      if (r * ks[k].traffic_per_byte > best_traffic)
        best_traffic = r * ks[k].traffic_per_byte;
    }
  }
  size_t l2 = 128u << 10; /* source + destination fit in L2 */
  printf("memcpy_l2_1t_GBps %.2f\n",
         run_kernel(K_MEMCPY, 1, l2, (int)(bytes / l2 < 4096 ? 4096 : bytes / l2), reps, src,
                    dst, aux));
  printf("add_f32_l2_1t_GBps %.2f\n",
         run_kernel(K_ADD, 1, l2, (int)(bytes / l2 < 4096 ? 4096 : bytes / l2), reps, src, dst, aux));
  printf("# dram_traffic: best over the kernels above at %d thread(s) of bytes read + written per "
         "second (memcpy 2x, add and sum 3x)\n", maxthreads);
  printf("dram_traffic_GBps %.2f\n", best_traffic);
  printf("shm_ping_oneway_us %.3f\n", shm_ping(100000, reps, 0));
  for (int i = 0; i < maxthreads; i++) {
    munmap(src[i], bytes);
    munmap(dst[i], bytes);
    munmap(aux[i], bytes);
  }
  return 0;
}

/* kt.h - kolo's test harness: self-registering tests, each run by tests/runner.c in its own
 * process group with a timeout; helpers that fork a job's ranks on 127.0.0.1. */
#ifndef KOLO_KT_H
#define KOLO_KT_H

#include "kolo.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

typedef struct kt_test {
    const char *name;
    void (*fn)(void);
    int timeout_s;
    struct kt_test *next;
} kt_test;

void kt_register(kt_test *t);

/* KT_TEST(name, timeout_seconds) { ... }  -- the body runs in a fresh child process;
 * it passes if it returns (or exits 0), and fails on a failed assertion, a crash,
 * a non-zero exit, or the timeout. */
#define KT_TEST(name, timeout)                                                                     \
    static void kt_fn_##name(void);                                                                \
    static kt_test kt_t_##name = {#name, kt_fn_##name, timeout, NULL};                            \
    __attribute__((constructor)) static void kt_reg_##name(void) { kt_register(&kt_t_##name); }   \
    static void kt_fn_##name(void)

void kt_fail(const char *file, int line, const char *fmt, ...) __attribute__((noreturn, format(printf, 3, 4)));

#define KT_ASSERT(c)                                                                               \
    do {                                                                                           \
        if (!(c)) kt_fail(__FILE__, __LINE__, "assertion failed: %s", #c);                        \
    } while (0)
#define KT_ASSERTF(c, ...)                                                                         \
    do {                                                                                           \
        if (!(c)) kt_fail(__FILE__, __LINE__, __VA_ARGS__);                                        \
    } while (0)
#define KT_EQ(a, b)                                                                                \
    do {                                                                                           \
        long long kt_a = (long long)(a), kt_b = (long long)(b);                                    \
        if (kt_a != kt_b) kt_fail(__FILE__, __LINE__, "%s == %lld, expected %s == %lld", #a, kt_a, #b, kt_b); \
    } while (0)
/* a kolo call that must succeed; prints kolo_last_error() if not */
#define KT_OK(call)                                                                                \
    do {                                                                                           \
        int kt_s = (call);                                                                         \
        if (kt_s != 0) kt_fail(__FILE__, __LINE__, "%s -> %d (%s): %s", #call, kt_s, kolo_strerror(kt_s), kolo_last_error()); \
    } while (0)
/* a kolo call that must fail with `status` */
#define KT_STATUS(call, status)                                                                    \
    do {                                                                                           \
        int kt_s = (call);                                                                         \
        if (kt_s != (status)) kt_fail(__FILE__, __LINE__, "%s -> %d (%s), expected %d (%s); message: %s", #call, kt_s, kolo_strerror(kt_s), (int)(status), kolo_strerror(status), kolo_last_error()); \
    } while (0)
#define KT_CONTAINS(hay, needle)                                                                   \
    do {                                                                                           \
        const char *kt_h = (hay);                                                                  \
        if (!kt_h || !strstr(kt_h, (needle))) kt_fail(__FILE__, __LINE__, "'%s' does not contain '%s'", kt_h ? kt_h : "(null)", (needle)); \
    } while (0)

/* ---- Workers ----
 * KT_WORKER(name) { ... } defines a program the test binary runs as `kolo-tests --worker name
 * [args]` (e.g. under kolorun or mpirun); its body gets argc/argv from the name on (argv[0] is
 * the name) and returns the exit code. */
typedef struct kt_worker {
    const char *name;
    int (*fn)(int argc, char **argv);
    struct kt_worker *next;
} kt_worker;
void kt_register_worker(kt_worker *w);
#define KT_WORKER(name)                                                                            \
    static int kt_w_fn_##name(int argc, char **argv);                                              \
    static kt_worker kt_w_##name = {#name, kt_w_fn_##name, NULL};                                 \
    __attribute__((constructor)) static void kt_wreg_##name(void) { kt_register_worker(&kt_w_##name); } \
    static int kt_w_fn_##name(int argc, char **argv)

/* The build tree this test binary belongs to (e.g. "/work/main/build" or ".../build/asan"), so
 * tests can run kt_build_dir()/bin/kolorun. Also exported to children as KT_BUILD_DIR. */
const char *kt_build_dir(void);
/* Absolute path of this test binary (to run it as a worker). */
const char *kt_self(void);
/* The running test's own scratch directory; the runner removes it when the test ends. */
const char *kt_scratch(void);

/* ---- Multi-rank jobs ----
 * kt_job runs fn(rank, arg) in n forked processes that form one kolo job: the parent starts
 * a rendezvous store on 127.0.0.1 port 0 with a fresh secret and gives each child
 * KOLO_RANK, KOLO_SIZE, KOLO_RENDEZVOUS, KOLO_SECRET and KOLO_JOB_ID (fn calls kolo_init).
 * A child passes when fn returns (it then calls kolo_shutdown and exits 0).
 * opts may be NULL. Returns once every child has ended; status[r] gets each child's raw
 * wait status (when status is not NULL). The return value is the number of children that
 * did not exit 0. */
typedef struct kt_job_opts {
    const char *env[16];          /* "NAME=VALUE" set in every rank (NULL-terminated) */
    int tcp_only;                 /* set KOLO_TRANSPORT=tcp */
    int no_store;                 /* do not start a store (the test handles rendezvous) */
    void (*parent)(pid_t *pids, int n, void *arg); /* runs in the parent while ranks run */
} kt_job_opts;
int kt_job(int n, void (*fn)(int rank, void *arg), void *arg, const kt_job_opts *opts, int *status);

/* Rings write around the cache (and fuse their middle steps) from 16 MiB, as on a machine whose
 * last-level cache is at most 128 MiB (src/coll/coll_util.c, kolo__stream_min_local): tests of
 * that path call this in each rank before kolo_init, whatever this machine's cache. A value the
 * test's environment sets stays. */
static inline void kt_stream_from_16m(void) { setenv("KOLO_STREAM_MIN", "16M", 0); }

/* Runs a rendezvous store on 127.0.0.1 (port 0) in a child process and returns its pid (kill it
 * with SIGKILL). Tests that fork must not run the store as a thread of the forking process:
 * a child could inherit a lock (OpenSSL's) held by that thread and hang. */
pid_t kt_spawn_store(const char *secret, int *port);

/* Same job run once with shared memory and once over TCP (fails the test if any rank fails). */
void kt_job_both(int n, void (*fn)(int rank, void *arg), void *arg);

/* ---- Child processes with captured output ----
 * kt_proc_start runs argv (argv[0] a path) with stdout and stderr captured into growing buffers
 * (NUL-terminated; at most cap bytes each are kept). The test polls them with kt_proc_pump, waits
 * for a line with kt_proc_wait_for, and reaps with kt_proc_finish. */
typedef struct kt_proc {
    pid_t pid;
    int in, out, err; /* pipe ends; -1 once closed (in: only with stdin_pipe) */
    char *obuf, *ebuf;
    size_t olen, elen, cap;
    int status;
    int done;         /* reaped; status is valid */
    int own_group;
    double t0, t_end; /* start and reap times (kt_now) */
} kt_proc;

typedef struct kt_proc_opts {
    int stdin_pipe;               /* p->in writes to its stdin (else stdin is /dev/null) */
    int own_group;                /* in a process group of its own; a timeout kills the group */
    int (*child_setup)(void *arg); /* run in the child before exec (e.g. setns); non-zero: exit 98 */
    void *arg;
    size_t cap;                   /* bytes kept per stream; default 4 MiB */
} kt_proc_opts;

double kt_now(void);
/* The calling thread's CPU time, ns: what a check of a cost or of polling reads where the wall
 * clock would also count the time the thread was kept off its core (the test lanes share two). */
uint64_t kt_thread_cpu_ns(void);
/* Occurrences of needle in hay. */
int kt_count(const char *hay, const char *needle);
void kt_proc_start(kt_proc *p, const char *const *argv, const kt_proc_opts *o);
/* KT_TIMEOUT_SCALE (default 1, never less): sanitizer builds run slower, so every timeout is
 * stretched by it (the tests' own, and those of kt_proc_wait_for and kt_proc_finish). */
double kt_timeout_scale(void);
/* Reads what is there, waiting up to timeout_ms. */
void kt_proc_pump(kt_proc *p, int timeout_ms);
/* Pumps until stdout holds needle `count` times; fails the test on timeout or if the process
 * ends first, printing both streams. */
void kt_proc_wait_for(kt_proc *p, const char *needle, int count, double timeout);
/* Reads to the end and reaps; returns the exit code (128+N for a signal). Overstaying the
 * timeout kills it (its group with own_group) and fails the test. Closes p->in. */
int kt_proc_finish(kt_proc *p, double timeout);
void kt_proc_free(kt_proc *p);
/* kolorun's stderr of an elastic job whose worker 2 was busy outside kolo when the others gave up
 * on it (test_elastic.c, also run across hosts by test_multihost.c): it was not killed, and kolorun
 * waited for it by its CPU time unless its engine asked for the new round itself */
void kt_spared_busy_worker(const char *ebuf);

/* xorshift64: the tests' seeded sequences (s never 0) */
static inline uint64_t kt_rand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static inline bool kt_is_float(kolo_dtype_t d)
{
    return d == KOLO_FLOAT16 || d == KOLO_BFLOAT16 || d == KOLO_FLOAT32 || d == KOLO_FLOAT64;
}

/* Deterministic pseudo-random fill for test data. */
void kt_fill(void *buf, size_t count, kolo_dtype_t dtype, unsigned seed);
/* Element i of buf as a double, and v stored as element i (v must be exact in the dtype; for
 * float16, 0 or normal): decoded and encoded by the runner itself, not by kolo's conversions. */
double kt_get(const void *buf, size_t i, kolo_dtype_t d);
void kt_put(void *buf, size_t i, kolo_dtype_t d, double v);
/* KOLO_ADASUM's documented tree over n vectors x[r] (each start[nt] long, overwritten), computed
 * here in double, tensor by tensor (tensor t: start[t] .. start[t + 1]): members 2i and 2i+1
 * first for i < n - p2 (p2 the largest power of two <= n), then neighbours pairwise, level by
 * level. The result is in x[0]. n < 128. */
void kt_adasum_tree(double **x, int n, const size_t *start, size_t nt);
/* How near an Adasum result of dtype d must come to that tree, relative to the tensor's largest
 * value (the kernels combine in float or double; halves round once more). */
double kt_adasum_tolerance(kolo_dtype_t d);

#endif

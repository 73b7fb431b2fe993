/* wait-bench - what waiting for a straggler costs the ranks that wait.
 *
 *   wait-bench [-np N] [-s SECONDS] [-r ROUNDS] [-e]
 *
 * Rank 0 stands for a straggler: it sleeps SECONDS (3) before a barrier, while every other rank
 * waits in that barrier; with -e, before an allreduce of one float through the engine
 * (kolo_iallreduce, then kolo_request_wait), as a framework's step does. Each waiting rank
 * measures the CPU time (user + system) its process used during the wait (every thread: the
 * engine's too) and how many liveness checks its own thread's waits made (kolo__wait's test
 * counter; 0 with -e, where the engine's thread waits); rank 0 prints, per round, the CPU of all
 * waiting ranks together, that as a share of one core per waiting rank, and the mean checks per
 * waiting rank. What the waiting ranks use, a straggler
 * that computes cannot (with more ranks than cores, the waiters and the straggler share them).
 * Under any launcher (kolorun, mpirun, ...), or with -np N as a local job of N forked ranks. The
 * transport is the job's: KOLO_TRANSPORT=tcp for TCP. */
#include "kolo.h"

#include "../src/net/transport.h"
#include "local_job.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

typedef struct opts {
    int np, rounds;
    double secs;
    bool engine;
} opts;

static double cpu_s(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + (double)u.ru_stime.tv_sec +
           (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

static int fail(const char *what, int st)
{
    fprintf(stderr, "wait-bench: rank %d: %s: %s\n", kolo_rank(), what, kolo_last_error());
    return st;
}

static int run_rank(void *arg)
{
    const opts *o = arg;
    int st = kolo_init();
    if (st != KOLO_OK) return fail("kolo_init", st);
    int n = kolo_size(), me = kolo_rank();
    if (n < 2) {
        if (me == 0) fprintf(stderr, "wait-bench: needs 2 or more ranks\n");
        kolo_shutdown();
        return 2;
    }
    if (me == 0)
        printf("# wait-bench: %d ranks, rank 0 late by %.2f s, %d round(s), %s; %s\n", n, o->secs, o->rounds,
               o->engine ? "an allreduce through the engine" : "a barrier",
               kolo_peer_transport(1) ? kolo_peer_transport(1) : "?");
    for (int round = 0; round < o->rounds && st == KOLO_OK; round++) {
        st = kolo_barrier(KOLO_WORLD);
        if (st != KOLO_OK) return fail("kolo_barrier", st);
        uint64_t a[5] = {0}, b[5] = {0};
        kolo__wait_test_counts(a);
        double c0 = cpu_s();
        if (me == 0) usleep((useconds_t)(o->secs * 1e6));
        if (o->engine) {
            float one = 1, sum = 0;
            kolo_request_t *rq = NULL;
            kolo_shape_t scalar = {.ndim = 0};
            st = kolo_iallreduce("wait-bench", &one, &sum, KOLO_FLOAT32, &scalar, KOLO_SUM, 1, 1, NULL, &rq);
            if (st == KOLO_OK) st = kolo_request_wait(rq, -1);
            if (rq) kolo_request_release(rq);
            if (st != KOLO_OK) return fail("kolo_iallreduce", st);
            if (sum != (float)n) {
                fprintf(stderr, "wait-bench: rank %d: the allreduce gave %g, not %d\n", me, (double)sum, n);
                return 1;
            }
        } else {
            st = kolo_barrier(KOLO_WORLD);
            if (st != KOLO_OK) return fail("kolo_barrier", st);
        }
        kolo__wait_test_counts(b);
        double mine[2] = {me ? cpu_s() - c0 : 0, me ? (double)(b[4] - a[4]) : 0}, all[2] = {0, 0};
        st = kolo_allreduce(mine, all, 2, KOLO_FLOAT64, KOLO_SUM, 1, 1, KOLO_WORLD);
        if (st != KOLO_OK) return fail("kolo_allreduce", st);
        if (me == 0)
            printf("round %d: the %d waiting ranks used %.3f CPU s in %.2f s: %.2f %% of a core each; %.0f liveness "
                   "checks each\n",
                   round, n - 1, all[0], o->secs, 100.0 * all[0] / o->secs / (n - 1), all[1] / (n - 1));
        fflush(stdout);
    }
    kolo_shutdown();
    return 0;
}

int main(int argc, char **argv)
{
    opts o = {.np = 0, .rounds = 1, .secs = 3.0, .engine = false};
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "-np") && v) o.np = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-s") && v) o.secs = atof(argv[++i]);
        else if (!strcmp(argv[i], "-r") && v) o.rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-e")) o.engine = true;
        else {
            fprintf(stderr, "usage: wait-bench [-np N] [-s SECONDS] [-r ROUNDS] [-e]\n");
            return 2;
        }
    }
    if (!(o.secs > 0 && o.secs <= 3600) || o.rounds < 1 || o.np < 0) {
        fprintf(stderr, "wait-bench: -s must be above 0 (and at most 3600), -r at least 1, -np at least 2\n");
        return 2;
    }
    if (o.np) return bench_local_job(o.np, 0, "wait-bench", run_rank, &o);
    return run_rank(&o);
}

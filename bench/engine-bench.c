/* engine-bench.c - what the engine costs: a ResNet-50 step of 161 gradients through the engine
 * against one direct allreduce of the same bytes, and the negotiation cost of a cycle.
 *
 *   engine-bench [-np 2] [-n 15] [-w 3] [-s 200] [-v 1] [-t PATH [-T 1]] [-m 1] [-a 1] [-p 1]
 *
 * Forks -np local ranks (default 2) with its own rendezvous store, unless a launcher started
 * it. Per rank it holds ResNet-50's 161 parameter tensors (25,557,032 float32, torchvision's
 * shapes), and alternates, -n times after -w warm-ups:
 *   - an engine step: the 161 gradients submitted in backward order (kolo_iallreduce, in place,
 *     AVERAGE), then waited for;
 *   - a direct step: one kolo_allreduce of all 25.6 M floats at once (in place, AVERAGE).
 * With -a 1 both steps use KOLO_ADASUM instead (each of the step's tensors its own vector, the
 * direct step one vector of all): what a ResNet-50 step costs with Adasum.
 * With -t PATH every iteration runs two engine steps, one with the timeline on (each rank starts
 * it to PATH, rank r to PATH.r, before the step's barrier and stops it after the step, the stop's
 * final drain timed with the step) and one without, in alternating order: the median of the
 * per-iteration ratios is what the timeline costs, measured on the same machine state, which
 * separate launches on a shared VM are not. With -T K each of the two is a block of K steps (a
 * timeline started before the block and stopped after its last step, the stop timed with that
 * step) and the mean steps of the two blocks are paired: a job starts its timeline once, so
 * blocks measure the cost of a timeline that is running, and K = 1 adds a start and stop (a
 * writer thread, a file) to every step.
 * With -m 1 the gradients are one kolo_mem_alloc arena (as a framework binding may place them) and
 * the flat buffer of the direct step is kolo_mem_alloc memory too: buckets of more than 64 KiB are
 * then read and written by the other ranks directly, mapped (src/coll/direct.c), and so is the
 * direct step.
 * It prints the medians (each step's time its slowest rank's), their ratio, and, from -s steps of 161 one-element tensors (everything
 * cached, latency-bound), the average time of a world negotiation that exchanged no
 * descriptions (build, allgather of the fixed blobs, decide) and the time per tiny step.
 * With -p 1 (3 ranks or more) it times short steps (8 tensors of 256 floats, submitted, then
 * waited for in the order submitted: too few to hide what the engine does between steps) on the
 * world, then adds two process sets, {0, n-1} and {1, ..., n-1}, and times them on the world
 * beside the two sets, unused (what idle sets cost every cycle), and on {1, ..., n-1} while rank
 * 0, in no set, waits at a barrier (what a set pays for a rank outside it; src/engine/engine.c,
 * "Cycle timing" and "Idle sets"), and on a set of every rank (the same ranks as the world's
 * steps: what a set's own exchange after the world's costs).
 *
 * Built by make (build/bin/engine-bench).
 */
#include "kolo.h"

#include "local_job.h"
#include "perf_ctl.h"
#include "../src/engine/engine.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXT 200

typedef struct opts {
    int np, iters, warmup, small_steps, verbose;
    int shared; /* -m 1: the gradients (one arena) and the flat buffer from kolo_mem_alloc */
    const char *timeline; /* -t: pair every engine step with one that writes the timeline */
    int block;            /* -T: engine steps per timeline (and per block without one) */
    kolo_op_t op;         /* AVERAGE, or ADASUM with -a 1 */
    int psets;            /* -p 1: tiny steps beside idle process sets, and on one without rank 0 */
} opts;

/* Removes this rank's timeline file before a timeline starts on it again: a file truncated to
 * nothing and rewritten makes ext4 write it out when it is closed (its auto_da_alloc, against
 * losing a replaced file's data in a crash), which took 0.1-0.6 ms of each timed stop here. A run
 * writes its timeline once; this bench starts one every other step. */
static void unlink_timeline(const char *path, int rank)
{
    char p[4096];
    if (rank == 0) snprintf(p, sizeof(p), "%s", path);
    else snprintf(p, sizeof(p), "%s.%d", path, rank);
    unlink(p);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ResNet-50's parameters in forward order (torchvision): sizes and names. */
static int nt;
static size_t sizes[MAXT];
static char names[MAXT][48];

static void add(const char *name, size_t n)
{
    snprintf(names[nt], sizeof(names[nt]), "%s", name);
    sizes[nt++] = n;
}

static void conv_bn(const char *prefix, const char *conv, const char *bn, size_t cin, size_t cout, size_t k)
{
    char b[48];
    snprintf(b, sizeof(b), "%s%s.weight", prefix, conv);
    add(b, cin * cout * k * k);
    snprintf(b, sizeof(b), "%s%s.weight", prefix, bn);
    add(b, cout);
    snprintf(b, sizeof(b), "%s%s.bias", prefix, bn);
    add(b, cout);
}

static void resnet50(void)
{
    conv_bn("", "conv1", "bn1", 3, 64, 7);
    const int blocks[4] = {3, 4, 6, 3};
    size_t in = 64;
    for (int l = 0; l < 4; l++) {
        size_t planes = (size_t)64 << l;
        for (int b = 0; b < blocks[l]; b++) {
            char p[32];
            snprintf(p, sizeof(p), "layer%d.%d.", l + 1, b);
            conv_bn(p, "conv1", "bn1", in, planes, 1);
            conv_bn(p, "conv2", "bn2", planes, planes, 3);
            conv_bn(p, "conv3", "bn3", planes, planes * 4, 1);
            if (b == 0) conv_bn(p, "downsample.0", "downsample.1", in, planes * 4, 1);
            in = planes * 4;
        }
    }
    add("fc.weight", 2048 * 1000);
    add("fc.bias", 1000);
}

/* STEPS latency-bound steps on process set PSET: K tensors of W floats (named as the last K of
 * ResNet-50's), submitted in backward order, then waited for: in the order submitted with
 * IN_ORDER (as an optimizer's synchronize does), else the other way round; returns the seconds
 * they took, or -1 */
static double tiny_steps(int steps, int pset, int k, int w, bool in_order, kolo_request_t **reqs)
{
    float *tiny = calloc((size_t)nt * (size_t)w, sizeof(float));
    kolo_submit_opts_t so = {.process_set = pset};
    int rc = !tiny;
    double t0 = now_s();
    for (int step = 0; step < steps && !rc; step++) {
        for (int t = nt - 1; t >= nt - k; t--) {
            kolo_shape_t sh = {1, {w}};
            float *x = tiny + (size_t)t * (size_t)w;
            x[0] = 1;
            if (kolo_iallreduce(names[t], x, x, KOLO_FLOAT32, &sh, KOLO_SUM, 1, 1, &so, &reqs[t]) != KOLO_OK) rc = 1;
        }
        for (int i = 0; i < k; i++) {
            int t = in_order ? nt - 1 - i : nt - k + i;
            if (kolo_request_wait(reqs[t], -1) != KOLO_OK) rc = 1;
            kolo_request_release(reqs[t]);
        }
    }
    double took = now_s() - t0;
    free(tiny);
    return rc ? -1 : took;
}

/* -p 1: short steps on the world, then beside two idle sets, then on {1, ..., n-1} with rank 0
 * outside, then (the two sets removed) on a set of every rank; the seconds per step in each (the
 * slowest rank's), or -1 */
#define SHORT_STEP 8
#define SHORT_W 256
#define SET_STEPS 4
static int set_steps(int steps, kolo_request_t **reqs, double out[SET_STEPS])
{
    int n = kolo_size(), rank = kolo_rank(), a[2] = {0, n - 1}, b[64], all[64], ida, idb, idw;
    for (int i = 0; i < n; i++) all[i] = i;
    for (int i = 1; i < n; i++) b[i - 1] = i;
    kolo_barrier(KOLO_WORLD);
    double t[SET_STEPS] = {tiny_steps(steps, KOLO_WORLD, SHORT_STEP, SHORT_W, true, reqs), -1, 0, -1};
    if (kolo_process_set_add(a, 2, &ida) != KOLO_OK || kolo_process_set_add(b, n - 1, &idb) != KOLO_OK) return 1;
    kolo_barrier(KOLO_WORLD);
    t[1] = tiny_steps(steps, KOLO_WORLD, SHORT_STEP, SHORT_W, true, reqs);
    kolo_barrier(KOLO_WORLD);
    if (rank > 0) t[2] = tiny_steps(steps, idb, SHORT_STEP, SHORT_W, true, reqs);
    kolo_barrier(KOLO_WORLD);
    int rc = kolo_process_set_remove(ida) != KOLO_OK || kolo_process_set_remove(idb) != KOLO_OK;
    if (rc || kolo_process_set_add(all, n, &idw) != KOLO_OK) return 1;
    kolo_barrier(KOLO_WORLD);
    t[3] = tiny_steps(steps, idw, SHORT_STEP, SHORT_W, true, reqs);
    kolo_barrier(KOLO_WORLD);
    for (int i = 0; i < SET_STEPS; i++) t[i] = t[i] < 0 ? 1e30 : t[i] / steps;
    if (kolo_allreduce(t, out, SET_STEPS, KOLO_FLOAT64, KOLO_MAX, 1, 1, KOLO_WORLD) != KOLO_OK) return 1;
    for (int i = 0; i < SET_STEPS; i++) rc |= out[i] >= 1e30;
    if (kolo_process_set_remove(idw) != KOLO_OK) rc = 1;
    return rc;
}

static int run(const opts *o)
{
    if (kolo_init() != KOLO_OK) {
        fprintf(stderr, "engine-bench: %s\n", kolo_last_error());
        return 1;
    }
    int rank = kolo_rank(), n = kolo_size();
    if (o->psets && n < 3) {
        fprintf(stderr, "engine-bench: -p 1 needs 3 ranks or more (a set without rank 0, and rank 0)\n");
        kolo_shutdown();
        return 2;
    }
    resnet50();
    size_t total = 0, off[MAXT];
    for (int t = 0; t < nt; t++) {
        off[t] = total;
        total += sizes[t];
    }
    float *grads = o->shared ? kolo_mem_alloc(total * sizeof(float)) : malloc(total * sizeof(float));
    float *flat = o->shared ? kolo_mem_alloc(total * sizeof(float)) : malloc(total * sizeof(float));
    /* te, td and ton in one block, so that one allreduce gives the slowest rank's times */
    double *te = calloc(3 * (size_t)o->iters, sizeof(double)), *td = te ? te + o->iters : NULL;
    kolo_request_t *reqs[MAXT];
    if (!grads || !flat || !te || !td) return 1;
    for (size_t i = 0; i < total; i++) grads[i] = flat[i] = (float)(i % 1000) * 1e-3f;
    double *ton = te ? td + o->iters : NULL, *pair = calloc((size_t)o->iters, sizeof(double));
    if (!ton || !pair) return 1;
    int rc = 0;
    for (int it = -o->warmup; it < o->iters && !rc; it++) {
        /* one engine step, or with -t two blocks of -T steps (timeline off, and on: started before
         * the block, stopped after its last step), the order alternating; a block's mean step */
        double t_off = 0, t_on = 0;
        int block = o->timeline ? o->block : 1;
        for (int k = 0; k < (o->timeline ? 2 : 1) && !rc; k++) {
            bool on = o->timeline && ((it & 1) ^ k);
            if (on) unlink_timeline(o->timeline, rank);
            if (on && kolo_timeline_start(o->timeline, 0) != KOLO_OK) rc = 1;
            for (int j = 0; j < block && !rc; j++) {
                kolo_barrier(KOLO_WORLD);
                if (rank == 0 && it >= 0) bench_perf_ctl(1);
                double t0 = now_s();
                for (int t = nt - 1; t >= 0; t--) { /* backward order */
                    kolo_shape_t sh = {1, {(int64_t)sizes[t]}};
                    if (kolo_iallreduce(names[t], grads + off[t], grads + off[t], KOLO_FLOAT32, &sh, o->op, 1, 1,
                                        NULL, &reqs[t]) != KOLO_OK)
                        rc = 1;
                }
                for (int t = 0; t < nt; t++) {
                    if (kolo_request_wait(reqs[t], -1) != KOLO_OK) rc = 1;
                    kolo_request_release(reqs[t]);
                }
                if (on && j == block - 1 && kolo_timeline_stop() != KOLO_OK) rc = 1; /* its last drain counts */
                *(on ? &t_on : &t_off) += (now_s() - t0) / block;
                if (rank == 0 && it >= 0) bench_perf_ctl(0);
            }
        }
        kolo_barrier(KOLO_WORLD);
        double t1 = now_s();
        if (kolo_allreduce(flat, flat, total, KOLO_FLOAT32, o->op, 1, 1, KOLO_WORLD) != KOLO_OK) rc = 1;
        double t2 = now_s();
        if (it >= 0) {
            te[it] = t_off;
            td[it] = t2 - t1;
            ton[it] = t_on;
        }
        kolo_barrier(KOLO_WORLD);
    }
    /* a step takes as long as its slowest rank: rank 0 alone may finish a step early (4 ranks
     * across hosts, 3 on one and 1 on the other: its last round of recursive halving is over
     * shared memory while halves still cross the network; at 2 Gbit/s the direct step took rank 0
     * 481-538 ms and the slowest rank 689-714) */
    if (!rc && kolo_allreduce(te, te, 3 * (size_t)o->iters, KOLO_FLOAT64, KOLO_MAX, 1, 1, KOLO_WORLD) != KOLO_OK)
        rc = 1;
    for (int it = 0; it < o->iters; it++) pair[it] = te[it] > 0 ? ton[it] / te[it] : 0;
    if (rc) fprintf(stderr, "engine-bench: rank %d: %s\n", rank, kolo_last_error());
    /* latency-bound steps: everything cached, one float per tensor */
    uint64_t c0, ns0, l0, c1, ns1, l1;
    kolo__engine_negotiation_cost(&c0, &ns0, &l0);
    kolo_engine_stats_t s0, s1;
    kolo_engine_stats(&s0);
    double tiny = rc ? -1 : tiny_steps(o->small_steps, KOLO_WORLD, nt, 1, false, reqs);
    rc |= tiny < 0;
    kolo__engine_negotiation_cost(&c1, &ns1, &l1);
    kolo_engine_stats(&s1);
    double per_set[SET_STEPS] = {0};
    if (!rc && o->psets && set_steps(o->small_steps, reqs, per_set)) rc = 1;
    if (rank == 0 && o->verbose)
        for (int it = 0; it < o->iters; it++) printf("step %2d: engine %8.2f ms  direct %8.2f ms\n", it, te[it] * 1e3, td[it] * 1e3);
    if (rank == 0) {
        double me = median(te, o->iters), md = median(td, o->iters);
        printf("# engine-bench: %d ranks, ResNet-50 gradients: %d tensors, %zu float32 (%.1f MB), in %s%s\n", n, nt,
               total, (double)total * 4 / 1e6, o->shared ? "kolo_mem_alloc memory" : "malloc'd memory",
               o->op == KOLO_ADASUM ? "; op adasum" : "");
        printf("# %s\n", kolo_build_info());
        if (o->timeline && o->block > 1)
            printf("engine step (161 iallreduce, fused)   median %8.2f ms over %d blocks of %d steps\n", me * 1e3,
                   o->iters, o->block);
        else
            printf("engine step (161 iallreduce, fused)   median %8.2f ms over %d steps\n", me * 1e3, o->iters);
        printf("direct kolo_allreduce of same bytes   median %8.2f ms\n", md * 1e3);
        printf("ratio engine / direct                 %8.3f\n", me / md);
        if (o->timeline)
            printf("engine step with the timeline on      median %8.2f ms; paired on / off median %.3f over %d "
                   "%s\n",
                   median(ton, o->iters) * 1e3, median(pair, o->iters), o->iters,
                   o->block > 1 ? "pairs of blocks" : "steps");
        if (o->timeline && o->block > 1)
            printf("timeline blocks                       %d steps per timeline, a block's mean step paired\n",
                   o->block);
        double nc = c1 > c0 ? (double)(c1 - c0) : 1.0;
        printf("steady-state negotiation (cached)     %8.1f us per cycle, %.1f us of it local (%llu cycles)\n",
               (double)(ns1 - ns0) / nc * 1e-3, (double)(l1 - l0) / nc * 1e-3, (unsigned long long)(c1 - c0));
        printf("tiny step (161 x 1 float, cached)     %8.1f us per step; %.1f collectives and %.1f cache hits per "
               "step\n",
               tiny / o->small_steps * 1e6, (double)(s1.collectives - s0.collectives) / o->small_steps,
               (double)(s1.cache_hits - s0.cache_hits) / o->small_steps);
        if (o->psets) {
            printf("short step (%d x %d floats), world     %8.1f us per step\n", SHORT_STEP, SHORT_W, per_set[0] * 1e6);
            printf("short step beside 2 idle process sets %8.1f us per step\n", per_set[1] * 1e6);
            printf("short step on set {1..%d}, rank 0 idle %7.1f us per step\n", n - 1, per_set[2] * 1e6);
            printf("short step on a set of every rank     %8.1f us per step\n", per_set[3] * 1e6);
        }
    }
    if (o->shared) {
        kolo_mem_free(grads);
        kolo_mem_free(flat);
    } else {
        free(grads);
        free(flat);
    }
    free(te); /* td and ton with it */
    free(pair);
    kolo_shutdown();
    fflush(stdout);
    return rc;
}

/* -np N without a launcher: a store in a child process, N forked ranks (as kolo-bench does). */
static int run_rank(void *arg) { return run(arg); }

int main(int argc, char **argv)
{
    opts o = {.np = 2, .iters = 15, .warmup = 3, .small_steps = 200, .block = 1, .op = KOLO_AVERAGE};
    for (int i = 1; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "-np")) o.np = v;
        else if (!strcmp(argv[i], "-n")) o.iters = v;
        else if (!strcmp(argv[i], "-w")) o.warmup = v;
        else if (!strcmp(argv[i], "-s")) o.small_steps = v;
        else if (!strcmp(argv[i], "-v")) o.verbose = v;
        else if (!strcmp(argv[i], "-t") && *argv[i + 1]) o.timeline = argv[i + 1];
        else if (!strcmp(argv[i], "-m")) o.shared = v;
        else if (!strcmp(argv[i], "-T")) o.block = v;
        else if (!strcmp(argv[i], "-a")) o.op = v ? KOLO_ADASUM : KOLO_AVERAGE;
        else if (!strcmp(argv[i], "-p")) o.psets = v;
        else {
            fprintf(stderr, "usage: engine-bench [-np N] [-n iters] [-w warmup] [-s small_steps] [-v 1] "
                            "[-t PATH [-T K]] [-m 1] [-a 1] [-p 1]\n");
            return 2;
        }
    }
    if (o.np < 1 || o.np > 64 || o.iters < 1 || o.warmup < 0 || o.small_steps < 1 || o.block < 1 || o.block > 1000)
        return 2;
    if (o.psets && !getenv("KOLO_RANK") && o.np < 3) {
        fprintf(stderr, "engine-bench: -p 1 needs 3 ranks or more (a set without rank 0, and rank 0)\n");
        return 2;
    }
    if (getenv("KOLO_RANK") || o.np == 1) return run(&o);
    /* not bound: each rank has a background engine thread beside its main thread */
    return bench_local_job(o.np, 0, "engine-bench", run_rank, &o);
}

/* test_autotune.c - the engine's autotuner (KOLO_AUTOTUNE): its Bayesian optimisation on known
 * functions, and jobs that tune while training: every rank applies rank 0's values together,
 * results stay exact while the values change, the log says what was tried and kept, and a knob
 * the user set is left alone. */
#include "kt.h"

#include "../src/engine/internal.h"

#include <math.h>
#include <stdio.h>
#include <unistd.h>

#define WAIT_S 25.0

/* ---- the optimiser alone ---- */

static double peak2(const double *x) { return exp(-((x[0] - 0.7) * (x[0] - 0.7) + (x[1] - 0.25) * (x[1] - 0.25)) / 0.08); }
static double peak1(const double *x) { return 1.0 - 4.0 * (x[0] - 0.3) * (x[0] - 0.3); }

/* Samples n points (the first ones given), with noise of amplitude amp; returns the distance of
 * the kept point from the optimum at opt. */
static double optimise(int dim, double noise, double amp, double (*f)(const double *), const double *opt, int n)
{
    static const double seeds[4][2] = {{1.0, 0.18}, {0.06, 0.0}, {0.25, 0.53}, {0.5, 0.81}};
    kolo__bo b;
    kolo__bo_init(&b, dim, noise, 42);
    for (int i = 0; i < n; i++) {
        double x[2];
        if (i < 4) memcpy(x, seeds[i], sizeof(x));
        else kolo__bo_next(&b, x);
        for (int d = 0; d < dim; d++) KT_ASSERTF(x[d] >= 0 && x[d] <= 1, "sample %d outside [0, 1]: %g", i, x[d]);
        KT_OK(kolo__bo_add(&b, x, 100.0 * (f(x) + amp * sin(7.3 * i))));
    }
    int best = kolo__bo_best(&b);
    KT_ASSERT(best >= 0 && best < n);
    double d2 = 0;
    for (int d = 0; d < dim; d++) d2 += (b.x[best][d] - opt[d]) * (b.x[best][d] - opt[d]);
    return sqrt(d2);
}

KT_TEST(autotune_bayes_opt_finds_the_optimum, 30)
{
    const double o2[2] = {0.7, 0.25}, o1[1] = {0.3};
    /* the default noise (0.8) and a small one; noisy and exact scores */
    double a = optimise(2, 0.8, 0.03, peak2, o2, 20), c = optimise(2, 0.05, 0.0, peak2, o2, 20);
    double e = optimise(1, 0.8, 0.03, peak1, o1, 12);
    KT_ASSERTF(a < 0.15, "2-D, noise 0.8: the kept point is %.3f from the peak", a);
    KT_ASSERTF(c < 0.1, "2-D, exact: the kept point is %.3f from the peak", c);
    KT_ASSERTF(e < 0.1, "1-D: the kept point is %.3f from the peak", e);
    /* full and bad inputs */
    kolo__bo b;
    kolo__bo_init(&b, 2, 0.8, 1);
    KT_EQ(kolo__bo_best(&b), -1);
    double x[2] = {0.5, 0.5};
    KT_ASSERT(kolo__bo_add(&b, x, NAN) != 0);
    for (int i = 0; i < KOLO__BO_MAX; i++) KT_OK(kolo__bo_add(&b, x, i));
    KT_ASSERT(kolo__bo_add(&b, x, 1) != 0);
}

/* ---- jobs that tune ---- */

typedef struct at_arg {
    char log[512];
    int fixed_cycle; /* KOLO_CYCLE_TIME=2 on every rank */
} at_arg;

enum { TENSORS = 6, MAX_STEPS = 600 };

static void tune_job(int rank, void *argp)
{
    const at_arg *a = argp;
    setenv("KOLO_AUTOTUNE", "1", 1);
    setenv("KOLO_AUTOTUNE_STEPS_PER_SAMPLE", "2", 1);
    setenv("KOLO_AUTOTUNE_WARMUP_SAMPLES", "1", 1);
    setenv("KOLO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "6", 1);
    if (rank == 0) setenv("KOLO_AUTOTUNE_LOG", a->log, 1); /* only rank 0's counts */
    if (a->fixed_cycle) setenv("KOLO_CYCLE_TIME", "2", 1);
    KT_OK(kolo_init());
    int size = kolo_size();
    kolo_engine_params_t p;
    KT_OK(kolo_engine_params(&p));
    KT_EQ(p.autotune, KOLO_AUTOTUNE_TUNING);
    KT_EQ(p.samples, 0);
    size_t count[TENSORS];
    float *in[TENSORS], *out[TENSORS];
    for (int t = 0; t < TENSORS; t++) {
        count[t] = 10 + (size_t)t * 40000; /* up to ~800 KB: how they fuse depends on the threshold */
        in[t] = malloc(count[t] * sizeof(float));
        out[t] = malloc(count[t] * sizeof(float));
        KT_ASSERT(in[t] && out[t]);
    }
    size_t fusions[64];
    int nfusions = 0, done = 0, step = 0;
    for (; !done; step++) {
        KT_ASSERTF(step < MAX_STEPS, "rank %d: tuning not done after %d steps (%d scored)", rank, step, p.samples);
        kolo_request_t *r[TENSORS + 2];
        for (int t = 0; t < TENSORS; t++) {
            char name[32];
            snprintf(name, sizeof(name), "grad.%d", t);
            for (size_t i = 0; i < count[t]; i++) in[t][i] = (float)(rank + t + step % 7);
            kolo_shape_t sh = {.ndim = 1, .dims = {(int64_t)count[t]}};
            KT_OK(kolo_iallreduce(name, in[t], out[t], KOLO_FLOAT32, &sh, KOLO_SUM, 1, 1, NULL, &r[t]));
        }
        float loss[2] = {(float)rank, (float)step};
        kolo_shape_t lsh = {.ndim = 2, .dims = {1, 2}};
        KT_OK(kolo_iallgather("loss", loss, KOLO_FLOAT32, &lsh, NULL, &r[TENSORS]));
        /* stop together: when every rank has seen the tuning end */
        int32_t mine = p.autotune == KOLO_AUTOTUNE_DONE, all = 0;
        kolo_shape_t one = {.ndim = 1, .dims = {1}};
        KT_OK(kolo_iallreduce("tuned", &mine, &all, KOLO_INT32, &one, KOLO_MIN, 1, 1, NULL, &r[TENSORS + 1]));
        for (int t = 0; t < TENSORS + 2; t++) {
            int st = kolo_request_wait(r[t], WAIT_S);
            KT_ASSERTF(st == KOLO_OK, "step %d: %s: %s", step, kolo_request_name(r[t]), kolo_request_error(r[t]));
        }
        for (int t = 0; t < TENSORS; t++) {
            float want = (float)(size * (t + step % 7) + size * (size - 1) / 2);
            KT_ASSERTF(out[t][0] == want && out[t][count[t] - 1] == want, "step %d tensor %d: %g, expected %g",
                       step, t, out[t][count[t] - 1], want);
        }
        const void *g;
        kolo_shape_t gs;
        KT_OK(kolo_request_output(r[TENSORS], &g, &gs));
        KT_EQ(gs.dims[0], size);
        KT_ASSERT(((const float *)g)[2 * (size - 1)] == (float)(size - 1) && ((const float *)g)[1] == (float)step);
        for (int t = 0; t < TENSORS + 2; t++) kolo_request_release(r[t]);
        done = all;
        KT_OK(kolo_engine_params(&p));
        bool seen = false;
        for (int i = 0; i < nfusions; i++) seen |= fusions[i] == p.fusion_threshold;
        if (!seen && nfusions < 64) fusions[nfusions++] = p.fusion_threshold;
    }
    /* every rank ends on the same values, and saw them change on the way */
    KT_EQ(p.autotune, KOLO_AUTOTUNE_DONE);
    KT_EQ(p.samples, 6);
    KT_ASSERTF(nfusions >= 3, "rank %d saw %d fusion thresholds while tuning", rank, nfusions);
    int64_t mine3[3] = {llround(p.cycle_time_ms * 1000), (int64_t)p.fusion_threshold, p.samples};
    int64_t all3[3 * 8];
    size_t counts[8];
    for (int i = 0; i < size; i++) counts[i] = 3;
    KT_OK(kolo_allgather(mine3, 3, all3, counts, KOLO_INT64, 0));
    for (int i = 1; i < size; i++)
        KT_ASSERTF(!memcmp(&all3[0], &all3[3 * i], sizeof(mine3)), "rank %d ends on %lld us, %lld B; rank 0 on %lld, %lld",
                   i, (long long)all3[3 * i], (long long)all3[3 * i + 1], (long long)all3[0], (long long)all3[1]);
    KT_ASSERT(p.fusion_threshold <= 64u << 20);
    if (a->fixed_cycle) KT_ASSERTF(fabs(p.cycle_time_ms - 2) < 1e-9, "cycle %g, set to 2", p.cycle_time_ms);
    else KT_ASSERTF(p.cycle_time_ms >= 0.5 - 1e-6 && p.cycle_time_ms <= 25 + 1e-6, "cycle %g", p.cycle_time_ms);
    if (rank == 0) {
        /* the log: its header, the warm-up sample, six scored, the kept one */
        FILE *f = fopen(a->log, "r");
        KT_ASSERTF(f, "no autotune log at %s", a->log);
        char line[512];
        KT_ASSERT(fgets(line, sizeof(line), f));
        KT_CONTAINS(line, "sample,cycle_time_ms,fusion_threshold_mb,steps,seconds,bytes,score_mb_per_s,kind");
        /* the fixed points first: the defaults, then three spread over the ranges */
        static const double want[4][2] = {{1, 64}, {0.5, 4}, {4, 16}, {12, 32}};
        int rows = 0, scored = 0;
        double best_c = -1, best_f = -1;
        while (fgets(line, sizeof(line), f)) {
            int n;
            double c, fm, secs, bytes, score;
            int steps;
            char kind[32];
            KT_ASSERTF(sscanf(line, "%d,%lf,%lf,%d,%lf,%lf,%lf,%31s", &n, &c, &fm, &steps, &secs, &bytes, &score,
                              kind) == 8,
                       "log row: %s", line);
            rows++;
            if (a->fixed_cycle) KT_ASSERTF(c == 2.0, "the cycle time was set, yet a row has %g: %s", c, line);
            if (!strcmp(kind, "warmup")) {
                KT_ASSERTF(rows == 1 && c == (a->fixed_cycle ? 2 : 1) && fm == 64, "warm-up row: %s", line);
            } else if (!strcmp(kind, "sample")) {
                scored++;
                KT_EQ(n, scored);
                KT_EQ(steps, 2);
                KT_ASSERTF(secs > 0 && bytes > 0 && score > 0, "row without a measurement: %s", line);
                if (scored <= 4) {
                    KT_ASSERTF(fm == want[scored - 1][1], "sample %d at %g MiB: %s", scored, fm, line);
                    if (!a->fixed_cycle)
                        KT_ASSERTF(c == want[scored - 1][0], "sample %d at %g ms: %s", scored, c, line);
                }
            } else {
                KT_ASSERTF(!strcmp(kind, "best") && scored == 6 && n >= 1 && n <= 6, "last row: %s", line);
                best_c = c;
                best_f = fm;
            }
        }
        fclose(f);
        KT_EQ(rows, 8);
        KT_ASSERTF(fabs(best_c - p.cycle_time_ms) < 1e-3 && fabs(best_f - (double)p.fusion_threshold / 1048576) < 1e-3,
                   "the log keeps %g ms, %g MiB; the engine runs %g ms, %zu B", best_c, best_f, p.cycle_time_ms,
                   p.fusion_threshold);
    }
    for (int t = 0; t < TENSORS; t++) {
        free(in[t]);
        free(out[t]);
    }
    unsetenv("KOLO_CYCLE_TIME");
}

KT_TEST(autotune_ranks_apply_rank0s_values_together, 120)
{
    at_arg a = {.fixed_cycle = 0};
    snprintf(a.log, sizeof(a.log), "%s/autotune.csv", kt_scratch());
    KT_EQ(kt_job(3, tune_job, &a, NULL, NULL), 0);
}

KT_TEST(autotune_leaves_a_set_knob_alone, 120)
{
    at_arg a = {.fixed_cycle = 1};
    snprintf(a.log, sizeof(a.log), "%s/autotune.csv", kt_scratch());
    kt_job_opts o = {.tcp_only = 1};
    KT_EQ(kt_job(2, tune_job, &a, &o, NULL), 0);
}

/* Without KOLO_AUTOTUNE the values are the settings', and the call's errors are clear. */
static void params_plain(int rank, void *arg)
{
    (void)arg;
    kolo_engine_params_t p;
    KT_STATUS(kolo_engine_params(&p), KOLO_ERR_NOT_INITIALIZED);
    setenv("KOLO_FUSION_THRESHOLD", "3M", 1);
    if (rank == 1) setenv("KOLO_CYCLE_TIME", "7", 1); /* each rank's own; fusion is rank 0's */
    KT_OK(kolo_init());
    KT_STATUS(kolo_engine_params(NULL), KOLO_ERR_INVALID_ARG);
    KT_OK(kolo_engine_params(&p));
    KT_EQ(p.autotune, KOLO_AUTOTUNE_OFF);
    KT_EQ(p.samples, 0);
    KT_EQ(p.fusion_threshold, 3u << 20);
    KT_ASSERTF(fabs(p.cycle_time_ms - (rank == 1 ? 7 : 1)) < 1e-9, "rank %d: cycle %g", rank, p.cycle_time_ms);
    unsetenv("KOLO_CYCLE_TIME");
}

KT_TEST(autotune_off_reports_the_settings, 20) { KT_EQ(kt_job(2, params_plain, NULL, NULL, NULL), 0); }

/* Both knobs set: nothing to tune, the job runs on them. A log that cannot be written: tuning
 * goes on without it. */
static void nothing_to_tune(int rank, void *arg)
{
    (void)arg;
    setenv("KOLO_AUTOTUNE", "1", 1);
    setenv("KOLO_FUSION_THRESHOLD", "5M", 1);
    setenv("HOROVOD_CYCLE_TIME", "3", 1); /* Horovod's name counts as set */
    KT_OK(kolo_init());
    kolo_engine_params_t p;
    KT_OK(kolo_engine_params(&p));
    KT_EQ(p.autotune, KOLO_AUTOTUNE_DONE);
    KT_EQ(p.samples, 0);
    KT_EQ(p.fusion_threshold, 5u << 20);
    KT_ASSERTF(fabs(p.cycle_time_ms - 3) < 1e-9, "rank %d: cycle %g", rank, p.cycle_time_ms);
    kolo_shutdown();
    unsetenv("HOROVOD_CYCLE_TIME");
    setenv("KOLO_AUTOTUNE_LOG", "/nonexistent-dir/autotune.csv", 1);
    KT_OK(kolo_init());
    KT_OK(kolo_engine_params(&p));
    KT_EQ(p.autotune, KOLO_AUTOTUNE_TUNING);
    KT_EQ(p.fusion_threshold, 5u << 20);
}

KT_TEST(autotune_with_nothing_to_tune_or_no_log, 30) { KT_EQ(kt_job(2, nothing_to_tune, NULL, NULL, NULL), 0); }

/* Tuning while a process set runs its own collectives and ranks join after different numbers of
 * steps: the values change under all of it and every result stays exact. */
static void tune_sets_join(int rank, void *arg)
{
    (void)arg;
    setenv("KOLO_AUTOTUNE", "1", 1);
    setenv("KOLO_AUTOTUNE_STEPS_PER_SAMPLE", "1", 1);
    setenv("KOLO_AUTOTUNE_WARMUP_SAMPLES", "0", 1);
    setenv("KOLO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "5", 1);
    KT_OK(kolo_init());
    int n = kolo_size(), set = -1, members[2] = {0, 2};
    KT_OK(kolo_process_set_add(members, 2, &set));
    int steps = 30 + 5 * rank;
    enum { C = 70000 };
    float *g = malloc(C * sizeof(float)), *out = malloc(C * sizeof(float)), s_in[8], s_out[8];
    KT_ASSERT(g && out);
    kolo_submit_opts_t in_set = {.process_set = set};
    kolo_shape_t sh = {.ndim = 1, .dims = {C}}, sh8 = {.ndim = 1, .dims = {8}};
    for (int step = 0; step < steps; step++) {
        for (int i = 0; i < C; i++) g[i] = (float)(rank + 1);
        for (int i = 0; i < 8; i++) s_in[i] = (float)(rank + step);
        kolo_request_t *r, *rs = NULL;
        KT_OK(kolo_iallreduce("grad", g, out, KOLO_FLOAT32, &sh, KOLO_SUM, 1, 1, NULL, &r));
        if (rank != 1 && step < 30)
            KT_OK(kolo_iallreduce("set.stat", s_in, s_out, KOLO_FLOAT32, &sh8, KOLO_SUM, 1, 1, &in_set, &rs));
        KT_ASSERTF(kolo_request_wait(r, WAIT_S) == KOLO_OK, "step %d: %s", step, kolo_request_error(r));
        float want = 0;
        for (int q = 0; q < n; q++)
            if (30 + 5 * q > step) want += (float)(q + 1);
        KT_ASSERTF(out[0] == want && out[C - 1] == want, "rank %d step %d: %g, expected %g", rank, step, out[C - 1], want);
        kolo_request_release(r);
        if (rs) {
            KT_ASSERTF(kolo_request_wait(rs, WAIT_S) == KOLO_OK, "step %d: %s", step, kolo_request_error(rs));
            KT_ASSERTF(s_out[7] == (float)(0 + 2 + 2 * step), "rank %d step %d: set sum %g", rank, step, s_out[7]);
            kolo_request_release(rs);
        }
    }
    kolo_request_t *j;
    KT_OK(kolo_ijoin(NULL, &j));
    KT_ASSERTF(kolo_request_wait(j, WAIT_S) == KOLO_OK, "join: %s", kolo_request_error(j));
    kolo_request_release(j);
    kolo_engine_params_t p;
    KT_OK(kolo_engine_params(&p));
    KT_ASSERTF(p.samples >= 3, "rank %d: %d configurations scored in %d steps", rank, p.samples, steps);
    free(g);
    free(out);
}

KT_TEST(autotune_under_process_sets_and_join, 60) { KT_EQ(kt_job(3, tune_sets_join, NULL, NULL, NULL), 0); }

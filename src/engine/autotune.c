/* autotune.c - the engine's autotuner (KOLO_AUTOTUNE=1, kolorun --autotune, Horovod's
 * HOROVOD_AUTOTUNE): while the job trains, rank 0 tries fusion thresholds and cycle times, scores
 * each by the bytes the engine moved per second over a few training steps, chooses the next one
 * to try by Bayesian optimisation, and ends on the best.
 *
 * A sample. Training submits the same tensor names every step, so a step is counted by names:
 * a sample ends when some name has been executed KOLO_AUTOTUNE_STEPS_PER_SAMPLE times since the
 * sample began and comes again (that execution starts the next sample). Its score is the bytes
 * of every tensor the engine executed in it (each rank's own tensor: an allreduce's bytes, a
 * broadcast's, an allgather's input ...) divided by its wall time, compute included: a setting
 * that delays the gradients' exchange or stops it overlapping the backward pass shows as fewer
 * bytes per second. Rank 0 of the world times what it executes; every rank executes the same.
 *
 * The search. The first KOLO_AUTOTUNE_WARMUP_SAMPLES samples, at the start values, are not
 * scored (the first steps of a job are slow for reasons of their own). Then each sample scores
 * one configuration: first four fixed points, the defaults first (so the defaults are always
 * measured), then the point that maximises the expected improvement under a Gaussian process
 * fitted to the scores so far (squared-exponential kernel on the standardised scores; its length
 * and the noise added to its diagonal, at most KOLO_AUTOTUNE_GAUSSIAN_PROCESS_NOISE, chosen by
 * marginal likelihood: samples are noisy, so the model smooths them as much as they ask). After
 * KOLO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES configurations the job keeps the sampled one with the best
 * posterior mean (not the best single score, which favours a lucky sample), logs it, and stops
 * tuning. The fusion threshold ranges over 0-64 MiB, the cycle time over 0.5-25 ms on a log
 * scale (cycles of 1-100 ms, Horovod's range, cost a CPU job more than they can gain: kolo's
 * cycle already ends early when a thread waits, engine.c). A knob the user set
 * (KOLO_FUSION_THRESHOLD, KOLO_CYCLE_TIME or their Horovod names, or kolorun's options) is not
 * tuned.
 *
 * Agreement. Every rank must fuse the same responses the same way in a cycle, so rank 0's
 * values travel in its world-step header (negotiate.c), and every rank, rank 0 too, applies the
 * values of the header it has just gathered, in the same cycle. Tuning itself happens on rank
 * 0's engine thread after a cycle; nothing here runs on the others.
 *
 * Log. KOLO_AUTOTUNE_LOG names a CSV file rank 0 writes: one row per sample (warm-up ones
 * marked), then the chosen configuration. */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define W kolo__W
#define E kolo__E

/* ---- Bayesian optimisation over [0, 1]^dim ---- */

static uint64_t rng_next(uint64_t *s)
{
    /* xorshift64* */
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static double rng_unit(uint64_t *s) { return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }

void kolo__bo_init(kolo__bo *b, int dim, double noise, uint64_t seed)
{
    memset(b, 0, sizeof(*b));
    b->dim = dim < 1 ? 1 : dim > 2 ? 2 : dim;
    b->noise = noise > 1e-6 ? noise : 1e-6;
    b->rng = seed ? seed : 0x9E3779B97F4A7C15ull;
}

int kolo__bo_add(kolo__bo *b, const double *x, double y)
{
    if (b->n >= KOLO__BO_MAX || !isfinite(y)) return -1;
    for (int d = 0; d < b->dim; d++) b->x[b->n][d] = x[d] < 0 ? 0 : x[d] > 1 ? 1 : x[d];
    b->y[b->n++] = y;
    return 0;
}

/* A Gaussian process fitted to the samples: standardised scores, unit signal variance. */
typedef struct gp {
    int n, dim;
    double ls;                                /* kernel length */
    double mean, sd;                          /* of the scores */
    double L[KOLO__BO_MAX * KOLO__BO_MAX];    /* Cholesky factor of K + noise I */
    double alpha[KOLO__BO_MAX];               /* (K + noise I)^-1 z */
    const kolo__bo *b;
} gp;

static double kern(const double *a, const double *c, int dim, double ls)
{
    double d = 0;
    for (int i = 0; i < dim; i++) d += (a[i] - c[i]) * (a[i] - c[i]);
    return exp(-0.5 * d / (ls * ls));
}

/* L v = v in place (L lower triangular, n x n, row-major) */
static void solve_lower(const double *L, int n, double *v)
{
    for (int i = 0; i < n; i++) {
        double s = v[i];
        for (int k = 0; k < i; k++) s -= L[i * n + k] * v[k];
        v[i] = s / L[i * n + i];
    }
}

/* L^T v = v in place */
static void solve_upper_t(const double *L, int n, double *v)
{
    for (int i = n - 1; i >= 0; i--) {
        double s = v[i];
        for (int k = i + 1; k < n; k++) s -= L[k * n + i] * v[k];
        v[i] = s / L[i * n + i];
    }
}

/* Fits with kernel length ls; returns the log marginal likelihood (-HUGE_VAL if singular). */
static double gp_fit(gp *g, const kolo__bo *b, double ls)
{
    int n = b->n;
    g->n = n;
    g->dim = b->dim;
    g->ls = ls;
    g->b = b;
    double m = 0, v = 0;
    for (int i = 0; i < n; i++) m += b->y[i];
    m /= n;
    for (int i = 0; i < n; i++) v += (b->y[i] - m) * (b->y[i] - m);
    double sd = n > 1 ? sqrt(v / n) : 0;
    g->mean = m;
    g->sd = sd > 1e-12 * fabs(m) && sd > 0 ? sd : 1;
    double *L = g->L;
    for (int i = 0; i < n; i++)
        for (int j = 0; j <= i; j++) L[i * n + j] = kern(b->x[i], b->x[j], b->dim, ls) + (i == j ? b->noise : 0);
    for (int j = 0; j < n; j++) { /* Cholesky, lower, in place */
        double s = L[j * n + j];
        for (int k = 0; k < j; k++) s -= L[j * n + k] * L[j * n + k];
        if (!(s > 0)) return -HUGE_VAL;
        double d = sqrt(s);
        L[j * n + j] = d;
        for (int i = j + 1; i < n; i++) {
            double t = L[i * n + j];
            for (int k = 0; k < j; k++) t -= L[i * n + k] * L[j * n + k];
            L[i * n + j] = t / d;
        }
    }
    double logdet = 0, fit = 0;
    for (int i = 0; i < n; i++) {
        g->alpha[i] = (b->y[i] - g->mean) / g->sd;
        logdet += log(L[i * n + i]);
    }
    solve_lower(L, n, g->alpha);
    for (int i = 0; i < n; i++) fit += g->alpha[i] * g->alpha[i];
    solve_upper_t(L, n, g->alpha);
    return -0.5 * fit - logdet;
}

/* The kernel length and the noise that explain the samples best (largest marginal likelihood);
 * the noise at most b->noise. A fixed large noise makes the model too smooth to leave the first
 * good edge it finds (tried: with 0.8, Horovod's default, on a peak of width 0.2 sampled with 2 %
 * noise, 18 of 20 runs ended far from the peak; fitted, none did). */
static void gp_fit_best(gp *g, const kolo__bo *b)
{
    static const double lengths[] = {0.08, 0.12, 0.18, 0.27, 0.4, 0.6, 0.9};
    static const double noises[] = {0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30};
    static kolo__bo c; /* engine thread (and tests) only */
    c = *b;
    double best = -HUGE_VAL, best_ls = 0.27, best_noise = b->noise;
    for (size_t j = 0; j <= KOLO_ARRAY_SIZE(noises); j++) {
        if (j < KOLO_ARRAY_SIZE(noises) && noises[j] >= b->noise) continue;
        c.noise = j < KOLO_ARRAY_SIZE(noises) ? noises[j] : b->noise;
        for (size_t i = 0; i < KOLO_ARRAY_SIZE(lengths); i++) {
            double l = gp_fit(g, &c, lengths[i]);
            if (l > best) {
                best = l;
                best_ls = lengths[i];
                best_noise = c.noise;
            }
        }
    }
    c.noise = best_noise;
    gp_fit(g, &c, best_ls);
}

/* Posterior mean and standard deviation at x, in standardised units. */
static void gp_predict(const gp *g, const double *x, double *mu, double *sigma)
{
    double k[KOLO__BO_MAX];
    double m = 0;
    for (int i = 0; i < g->n; i++) {
        k[i] = kern(x, g->b->x[i], g->dim, g->ls);
        m += k[i] * g->alpha[i];
    }
    solve_lower(g->L, g->n, k);
    double v = 1;
    for (int i = 0; i < g->n; i++) v -= k[i] * k[i];
    *mu = m;
    *sigma = sqrt(v > 1e-12 ? v : 1e-12);
}

static double expected_improvement(const gp *g, const double *x, double best)
{
    double mu, s;
    gp_predict(g, x, &mu, &s);
    double imp = mu - best - 0.01, z = imp / s;
    double cdf = 0.5 * erfc(-z / sqrt(2.0)), pdf = exp(-0.5 * z * z) / sqrt(2.0 * M_PI);
    return imp * cdf + s * pdf;
}

int kolo__bo_best(const kolo__bo *b)
{
    if (b->n == 0) return -1;
    static gp g; /* engine thread (and tests) only: 32 KiB kept off the stack */
    gp_fit_best(&g, b);
    int best = 0;
    double best_mu = -HUGE_VAL;
    for (int i = 0; i < b->n; i++) {
        double mu, s;
        gp_predict(&g, b->x[i], &mu, &s);
        if (mu > best_mu) {
            best_mu = mu;
            best = i;
        }
    }
    return best;
}

void kolo__bo_next(kolo__bo *b, double *x)
{
    if (b->n == 0) {
        for (int d = 0; d < b->dim; d++) x[d] = rng_unit(&b->rng);
        return;
    }
    static gp g;
    gp_fit_best(&g, b);
    /* the incumbent: the best posterior mean at a sampled point (the scores are noisy) */
    double best = -HUGE_VAL;
    for (int i = 0; i < b->n; i++) {
        double mu, s;
        gp_predict(&g, b->x[i], &mu, &s);
        if (mu > best) best = mu;
    }
    /* candidates: a grid and as many random points */
    int grid = b->dim == 1 ? 257 : 33;
    int ngrid = b->dim == 1 ? grid : grid * grid;
    double top = -HUGE_VAL, c[2];
    for (int i = 0; i < 2 * ngrid; i++) {
        if (i < ngrid) {
            c[0] = (double)(i % grid) / (grid - 1);
            c[1] = (double)(i / grid) / (grid - 1);
        } else {
            c[0] = rng_unit(&b->rng);
            c[1] = rng_unit(&b->rng);
        }
        double ei = expected_improvement(&g, c, best);
        if (ei > top) {
            top = ei;
            memcpy(x, c, (size_t)b->dim * sizeof(double));
        }
    }
}

/* ---- the tuner (rank 0's engine thread) ---- */

#define FUSION_MAX_MIB 64.0
#define CYCLE_MIN_MS 0.5
#define CYCLE_MAX_MS 25.0
#define NAMES 4096 /* distinct tensor names counted per sample (a power of 2) */

/* The fixed points tried first, as (fusion MiB, cycle ms): the defaults, then a spread. */
static const double seeds[][2] = {{64, 1}, {4, 0.5}, {16, 4}, {32, 12}};

static struct {
    bool on;                  /* this rank tunes */
    bool tune_fusion, tune_cycle;
    int dim;
    int warmup_left, steps, max_samples;
    int scored;
    double x[2];              /* the configuration being measured */
    double default_score;     /* the first scored configuration's (the defaults), or -1 */
    double best_score;        /* the chosen configuration's sample */
    /* the sample in progress */
    uint64_t t0;              /* 0: starts at the next execution */
    double bytes;
    uint64_t hash[NAMES];
    uint32_t count[NAMES];
    int nnames;
    bool ended;               /* a sample ended in this cycle: tune after it */
    double score, seconds, sample_bytes;
    kolo__bo bo;
    FILE *log;
} T;

static double x_to_fusion_mib(double x) { return x * FUSION_MAX_MIB; }
static double x_to_cycle_ms(double x) { return CYCLE_MIN_MS * pow(CYCLE_MAX_MS / CYCLE_MIN_MS, x); }
static double fusion_to_x(double mib) { return mib / FUSION_MAX_MIB; }
static double cycle_to_x(double ms) { return log(ms / CYCLE_MIN_MS) / log(CYCLE_MAX_MS / CYCLE_MIN_MS); }

/* The engine values of a configuration x (the knobs not tuned keep theirs). */
static void apply_x(const double *x)
{
    int d = 0;
    if (T.tune_fusion) {
        size_t b = (size_t)(x_to_fusion_mib(x[d++]) * 1048576.0);
        E.fusion = b & ~(size_t)4095;
    }
    if (T.tune_cycle) E.cycle_s = x_to_cycle_ms(x[d]) * 1e-3;
}

static void seed_x(int i, double *x)
{
    int d = 0;
    if (T.tune_fusion) x[d++] = fusion_to_x(seeds[i][0]);
    if (T.tune_cycle) x[d] = cycle_to_x(seeds[i][1]);
}

uint32_t kolo__tune_word(void) { return (uint32_t)E.tune_state | (uint32_t)E.tune_samples << 8; }

/* What kolo_engine_params reports (user threads read it). Called every cycle when tuning is on:
 * the shared cache lines are written only when a value changed. */
static void publish(void)
{
    uint64_t f = (uint64_t)E.fusion, c = (uint64_t)llround(E.cycle_s * 1e9);
    uint32_t w = kolo__tune_word();
    if (atomic_load_explicit(&E.pub_fusion, memory_order_relaxed) != f) atomic_store(&E.pub_fusion, f);
    if (atomic_load_explicit(&E.pub_cycle_ns, memory_order_relaxed) != c) atomic_store(&E.pub_cycle_ns, c);
    if (atomic_load_explicit(&E.pub_state, memory_order_relaxed) != w) atomic_store(&E.pub_state, w);
}

void kolo__tune_start(void)
{
    memset(&T, 0, sizeof(T));
    E.tune_state = E.autotune;
    E.tune_samples = 0;
    if (E.rank == 0 && E.autotune == KOLO_AUTOTUNE_DONE)
        KOLO_WARN("KOLO_AUTOTUNE: KOLO_FUSION_THRESHOLD and KOLO_CYCLE_TIME are both set, so there is nothing to "
                  "tune; the engine keeps them");
    if (E.autotune != KOLO_AUTOTUNE_TUNING || E.rank != 0) {
        publish();
        return;
    }
    T.tune_fusion = !kolo__setting_is_set(KOLO_SET_FUSION_THRESHOLD);
    T.tune_cycle = !kolo__setting_is_set(KOLO_SET_CYCLE_TIME);
    T.dim = T.tune_fusion + T.tune_cycle;
    long w = kolo__setting_long(KOLO_SET_AUTOTUNE_WARMUP_SAMPLES);
    long s = kolo__setting_long(KOLO_SET_AUTOTUNE_STEPS_PER_SAMPLE);
    long m = kolo__setting_long(KOLO_SET_AUTOTUNE_BAYES_OPT_MAX_SAMPLES);
    double noise = kolo__setting_double(KOLO_SET_AUTOTUNE_GAUSSIAN_PROCESS_NOISE);
    if (w < 0 || w > 1000000) {
        KOLO_WARN("KOLO_AUTOTUNE_WARMUP_SAMPLES=%ld is not in 0..1000000; using 3", w);
        w = 3;
    }
    if (s < 1 || s > 1000000) {
        KOLO_WARN("KOLO_AUTOTUNE_STEPS_PER_SAMPLE=%ld is not in 1..1000000; using 10", s);
        s = 10;
    }
    if (m < 1 || m > KOLO__BO_MAX) {
        KOLO_WARN("KOLO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES=%ld is not in 1..%d; using 20", m, KOLO__BO_MAX);
        m = 20;
    }
    if (!(noise > 0) || noise > 1e6) {
        KOLO_WARN("KOLO_AUTOTUNE_GAUSSIAN_PROCESS_NOISE=%g is not a number > 0; using 0.8", noise);
        noise = 0.8;
    }
    T.warmup_left = (int)w;
    T.steps = (int)s;
    T.max_samples = (int)m;
    T.default_score = -1;
    kolo__bo_init(&T.bo, T.dim, noise, 0);
    seed_x(0, T.x);
    apply_x(T.x);
    const char *path = kolo__setting_str(KOLO_SET_AUTOTUNE_LOG);
    if (*path) {
        T.log = fopen(path, "we");
        if (!T.log)
            KOLO_WARN("KOLO_AUTOTUNE_LOG: cannot write '%s' (%s); tuning goes on without a log", path,
                      strerror(errno));
        else {
            fprintf(T.log, "sample,cycle_time_ms,fusion_threshold_mb,steps,seconds,bytes,score_mb_per_s,kind\n");
            fflush(T.log);
        }
    }
    KOLO_INFO("autotune: tuning %s%s%s: %d warm-up samples, then %d configurations of %d steps each",
              T.tune_fusion ? "the fusion threshold" : "", T.dim == 2 ? " and " : "",
              T.tune_cycle ? "the cycle time" : "", T.warmup_left, T.max_samples, T.steps);
    T.on = true;
    publish();
}

static void log_row(const char *kind, int sample, double seconds, double bytes, double score)
{
    if (!T.log) return;
    fprintf(T.log, "%d,%.3f,%.3f,%d,%.6f,%.0f,%.3f,%s\n", sample, E.cycle_s * 1e3, (double)E.fusion / 1048576.0,
            T.steps, seconds, bytes, score, kind);
    fflush(T.log);
}

static void say_result(void)
{
    char cyc[64] = "", fus[64] = "";
    if (T.tune_cycle) snprintf(cyc, sizeof(cyc), "KOLO_CYCLE_TIME=%.3g%s", E.cycle_s * 1e3, T.tune_fusion ? " " : "");
    if (T.tune_fusion) snprintf(fus, sizeof(fus), "KOLO_FUSION_THRESHOLD=%zuK", E.fusion / 1024);
    /* the chosen values are what the user asked for: shown unless warnings are silenced */
    if (kolo__log_level <= KOLO_LOG_WARNING)
        kolo__log(KOLO_LOG_INFO,
                  "autotune: done after %d configurations: %s%s, kept by the model of all samples (its sample "
                  "%.1f MB/s, the defaults' %.1f). Set these (or kolorun --cycle-time-ms / --fusion-threshold-mb) "
                  "to start a job there without tuning",
                  T.scored, cyc, fus, T.best_score, T.default_score);
}

static void finish(void)
{
    int best = kolo__bo_best(&T.bo);
    if (best >= 0) memcpy(T.x, T.bo.x[best], sizeof(T.x));
    apply_x(T.x);
    T.best_score = best >= 0 ? T.bo.y[best] : 0;
    log_row("best", best + 1, 0, 0, T.best_score);
    T.on = false;
    E.tune_state = KOLO_AUTOTUNE_DONE;
    say_result();
}

static void sample_start(uint64_t now)
{
    T.t0 = now;
    T.bytes = 0;
    memset(T.count, 0, sizeof(T.count));
    T.nnames = 0;
}

/* The sample's count of a name (hash h, never 0), or NULL when the table is full. */
static uint32_t *name_count(uint64_t h)
{
    uint32_t i = (uint32_t)h & (NAMES - 1);
    while (T.count[i] && T.hash[i] != h) i = (i + 1) & (NAMES - 1);
    if (!T.count[i]) {
        if (T.nnames >= NAMES * 3 / 4) return NULL;
        T.hash[i] = h;
        T.nnames++;
    }
    return &T.count[i];
}

void kolo__tune_observe(int pset, const kolo__resp *rp)
{
    if (!T.on || rp->d.kind == KOLO__JOIN || rp->d.kind == KOLO__BARRIER) return;
    uint64_t now = kolo__now_ns();
    if (!T.t0) sample_start(now);
    uint64_t h = kolo__hash(rp->name, pset) | 1;
    uint32_t *c = name_count(h);
    if (c && *c == (uint32_t)T.steps && !T.ended) {
        /* this name's steps are complete: the sample ends here, the next starts with it */
        T.seconds = (double)(now - T.t0) * 1e-9;
        T.sample_bytes = T.bytes;
        T.score = T.seconds > 0 ? T.bytes / T.seconds / 1e6 : 0;
        T.ended = true;
        sample_start(now);
        c = name_count(h);
    }
    if (c) (*c)++;
    size_t b = rp->d.kind == KOLO__ALLREDUCE ? rp->bytes
                                               : kolo__desc_count(&rp->d) * kolo_dtype_size((kolo_dtype_t)rp->d.dtype);
    T.bytes += (double)b;
}

void kolo__tune_after_cycle(void)
{
    if (!T.on || !T.ended) return;
    T.ended = false;
    if (T.warmup_left > 0) {
        T.warmup_left--;
        log_row("warmup", 0, T.seconds, T.sample_bytes, T.score);
        KOLO_DEBUG("autotune: warm-up sample, %.1f MB/s (%d more)", T.score, T.warmup_left);
        return;
    }
    T.scored++;
    E.tune_samples = T.scored;
    log_row("sample", T.scored, T.seconds, T.sample_bytes, T.score);
    KOLO_INFO("autotune: [%.3g ms, %.3g MiB] %.1f MB/s", E.cycle_s * 1e3, (double)E.fusion / 1048576.0, T.score);
    if (T.default_score < 0) T.default_score = T.score;
    kolo__bo_add(&T.bo, T.x, T.score);
    if (T.scored >= T.max_samples) {
        finish();
        return;
    }
    if (T.scored < (int)KOLO_ARRAY_SIZE(seeds)) seed_x(T.scored, T.x);
    else kolo__bo_next(&T.bo, T.x);
    apply_x(T.x);
    /* the new values apply from the next cycle on every rank: measure from there */
    T.t0 = 0;
}

void kolo__tune_stop(void)
{
    if (T.on && E.rank == 0 && T.scored > 0)
        KOLO_INFO("autotune: the engine stopped after %d of %d configurations, before tuning ended", T.scored,
                  T.max_samples);
    if (T.log) fclose(T.log);
    memset(&T, 0, sizeof(T));
}

/* Every rank: the values rank 0 sent in this cycle's world header. */
int kolo__tune_apply(uint64_t fusion, uint32_t cycle_us, uint32_t state)
{
    /* what rank 0 can send: KOLO_CYCLE_TIME is used below 1e6 ms (engine.c), a state is one of
     * three; any threshold is one (it only bounds what is fused) */
    if (cycle_us >= 1000000000u || (state & 0xff) > KOLO_AUTOTUNE_DONE)
        return kolo__err(KOLO_ERR_PROTOCOL, "rank 0 sent autotuned engine values no kolo sends: a cycle time of %u "
                         "us (below 10^9), state %u (at most %d); the message was garbled on its way", cycle_us,
                         state & 0xff, KOLO_AUTOTUNE_DONE);
    E.fusion = (size_t)fusion;
    E.cycle_s = cycle_us * 1e-6;
    if (E.rank != 0) {
        E.tune_state = (int)(state & 0xff);
        E.tune_samples = (int)(state >> 8);
    }
    publish();
    return KOLO_OK;
}

int kolo_engine_params(kolo_engine_params_t *out)
{
    if (!out) return kolo__err(KOLO_ERR_INVALID_ARG, "kolo_engine_params: out is NULL");
    pthread_mutex_lock(&E.lock);
    int running = E.running;
    pthread_mutex_unlock(&E.lock);
    if (!running) return kolo__err(KOLO_ERR_NOT_INITIALIZED, "kolo_engine_params: kolo is not initialized");
    memset(out, 0, sizeof(*out));
    out->fusion_threshold = (size_t)atomic_load(&E.pub_fusion);
    out->cycle_time_ms = (double)atomic_load(&E.pub_cycle_ns) * 1e-6;
    uint32_t st = atomic_load(&E.pub_state);
    out->autotune = (int)(st & 0xff);
    out->samples = (int)(st >> 8);
    return KOLO_OK;
}
